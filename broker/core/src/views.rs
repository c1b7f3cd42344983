//! Conversion of broker records into the API's wire views.

use super::latency::RttTable;
use super::model::{Job, Site};
use super::placement::{self, Decision, Terms};
use meridian_federation::{
    Amounts, CandidateView, ExplainView, JobView, PoolView, SiteView, TermsView,
};

fn amounts(t: &Terms) -> Amounts {
    Amounts {
        cost_micro_usd: t.cost_micro_usd,
        energy_wh: t.energy_wh,
        co2_g: t.co2_g,
    }
}

fn terms_view(t: &Terms) -> TermsView {
    TermsView {
        cost_micro_usd: t.cost_micro_usd,
        energy_wh: t.energy_wh,
        co2_g: t.co2_g,
        latency_ms: round2(t.latency_ms),
        data_bytes_moved: t.data_bytes_moved,
        score: if t.score.is_finite() {
            round4(t.score)
        } else {
            -1.0
        },
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

pub fn job_view(
    job: &Job,
    sites: &std::collections::BTreeMap<meridian_federation::SiteId, Site>,
    rtt: &RttTable,
) -> JobView {
    let site = job
        .assignment
        .as_ref()
        .map(|a| a.site.clone())
        .or_else(|| last_site(job));
    let user_rtt_ms = match (&site, job.spec.users.is_empty()) {
        (Some(s), false) => sites
            .get(s)
            .map(|s| round2(placement::user_latency(rtt, s, &job.spec))),
        _ => None,
    };
    JobView {
        job: job.id.clone(),
        tenant: job.spec.tenant.clone(),
        queue: job.spec.queue.clone(),
        name: job.spec.name.clone(),
        kind: job.spec.kind,
        phase: job.phase,
        attempt: job.attempt,
        site,
        pool: job
            .assignment
            .as_ref()
            .map(|a| a.pool.clone())
            .or_else(|| chosen(job.decision.as_deref()).map(|c| c.pool.clone())),
        why: job.why.clone(),
        submitted_at_ms: job.submitted_ms,
        started_at_ms: job.started_ms,
        finished_at_ms: job.finished_ms,
        exit_code: job.exit_code,
        estimate: job.estimate.as_deref().map(amounts),
        user_rtt_ms,
        metered: job.metered,
        runtime_ms: job.runtime_ms,
        checkpoint: job.checkpoint.clone(),
        unsatisfiable: job.phase == meridian_federation::JobPhase::Pending && job.unsatisfiable,
        archived: false,
    }
}

fn chosen(d: Option<&Decision>) -> Option<&placement::Choice> {
    match d.map(|d| &d.outcome) {
        Some(placement::Outcome::Place(c)) => Some(c),
        _ => None,
    }
}

/// The site a finished job last ran on.
fn last_site(job: &Job) -> Option<meridian_federation::SiteId> {
    if job.attempt == 0 {
        return None;
    }
    chosen(job.decision.as_deref()).map(|c| c.site.clone())
}

pub fn site_view(site: &Site) -> SiteView {
    SiteView {
        site: site.id().clone(),
        kind: site.info.kind,
        tier: site.tier(),
        up: site.up,
        draining: site.draining(),
        location: site.info.location,
        pue: site.info.pue,
        carbon_g_per_kwh: site.info.carbon.g_per_kwh,
        pools: site
            .pools
            .iter()
            .map(|p| PoolView {
                name: p.name.clone(),
                kind: p.kind,
                model: p.model.clone(),
                count: p.devices.len() as u32,
                free_milli: p.free_milli(),
                price_micro_usd_per_hour: p.price_micro_usd_per_hour,
            })
            .collect(),
        last_seen_ms: site.last_seen_ms,
        generation: site.generation,
    }
}

/// A job's explanation with the decision it was placed by (or, for a waiting job, the decision placement would
/// make now: see `Reactor::explain`).
pub fn explain_view(job: &Job) -> ExplainView {
    explain_with(job, job.decision.as_deref())
}

pub fn explain_with(job: &Job, decision: Option<&Decision>) -> ExplainView {
    let pruned = decision
        .map(|d| {
            d.pruned
                .iter()
                .map(|(reason, sites)| meridian_federation::PrunedView {
                    reason: reason.clone(),
                    sites: *sites,
                })
                .collect()
        })
        .unwrap_or_default();
    let (policy, decided_at_ms, candidates) = match decision {
        Some(d) => (
            d.policy.to_string(),
            Some(d.at_ms),
            d.candidates
                .iter()
                .map(|c| CandidateView {
                    site: c.site.clone(),
                    tier: c.tier,
                    pool: c.pool.clone(),
                    terms: c.terms.as_ref().map(terms_view),
                    rejected: c.reject.as_ref().map(ToString::to_string),
                    chosen: c.reject.is_none()
                        && chosen(Some(d)).is_some_and(|ch| {
                            ch.site == c.site && Some(&ch.pool) == c.pool.as_ref()
                        }),
                })
                .collect(),
        ),
        None => (
            placement::policy_of(&job.spec, None).name().to_owned(),
            None,
            Vec::new(),
        ),
    };
    ExplainView {
        job: job.id.clone(),
        phase: job.phase,
        why: job.why.clone(),
        policy,
        decided_at_ms,
        candidates,
        pruned,
        history: history(job),
    }
}

/// A job's history as lines, starting with its submission (which records of format 1 also hold as an entry).
fn history(job: &Job) -> Vec<String> {
    let submitted = job
        .history
        .first()
        .is_some_and(|(_, what)| what == "submitted");
    let first = (!submitted).then(|| format!("{} submitted", job.submitted_ms));
    first
        .into_iter()
        .chain(job.history.iter().map(|(t, what)| format!("{t} {what}")))
        .collect()
}
