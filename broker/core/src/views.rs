//! Conversion of broker records into the API's wire views.

use super::latency::RttTable;
use super::model::{Job, Site};
use super::placement::{self, Decision, Terms};
use meridian_federation::{
    Amounts, AttemptView, CandidateView, ExplainView, HistoryJob, HistoryRun, JobPhase, JobView,
    PoolView, SiteId, SiteView, TermsView, TimelineEvent, TimelineView,
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
        wait_reason: (job.phase == JobPhase::Pending)
            .then(|| crate::observe::wait_reason(job).to_owned()),
        users: job.spec.users.iter().map(|u| u.location).collect(),
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
        backend: site.info.backend,
        carbon_forecast: site.info.carbon.forecast.clone(),
        carbon_forecast_start_ms: site.info.carbon.forecast_start_ms,
        carbon_history: Vec::new(),
    }
}

/// A site's facts and pools as the broker knows them, every device free (a what-if starts from an empty
/// federation); power is the measured figure where the site reported one, as placement uses it.
pub fn federation_site(site: &Site) -> meridian_federation::FederationSite {
    use meridian_federation::{DeviceState, PoolAdvert, Sharing};
    meridian_federation::FederationSite {
        info: site.info.clone(),
        pools: site
            .pools
            .iter()
            .map(|p| PoolAdvert {
                name: p.name.clone(),
                kind: p.kind,
                vendor: p.vendor.clone(),
                model: p.model.clone(),
                memory_mib: p.memory_mib,
                count: p.devices.len() as u32,
                devices_per_node: p.devices_per_node,
                interconnect: Default::default(),
                power_watts: p.power_watts,
                measured_power_watts: None,
                sharing: Sharing {
                    milli: p.milli_sharing,
                    mig_profiles: p.mig_profiles.clone(),
                },
                price_micro_usd_per_hour: p.price_micro_usd_per_hour,
                spot_price_micro_usd_per_hour: p.spot_price_micro_usd_per_hour,
                devices: p
                    .devices
                    .iter()
                    .map(|d| DeviceState {
                        index: d.index,
                        healthy: d.healthy,
                        used_milli: 0,
                    })
                    .collect(),
            })
            .collect(),
        up: site.up,
    }
}

/// A job's explanation with the decision it was placed by (or, for a waiting job, the decision placement would
/// make now: see `Reactor::explain`).
pub fn explain_view(job: &Job) -> ExplainView {
    explain_with(job, job.decision.as_deref())
}

pub fn explain_with(job: &Job, decision: Option<&Decision>) -> ExplainView {
    let pruned: Vec<meridian_federation::PrunedView> = decision
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
        decided_by: decided_by(&candidates, &pruned),
        pruned,
        history: history(job),
        every_site_now: false,
        candidates,
    }
}

/// In words, what set the chosen candidate apart from the next best one it was weighed against: the term it
/// gains most on, relatively (price, carbon, latency to its users, data to move); what it gives up on the
/// others; and what kept the other sites out (each reason with its count). `None` when nothing was chosen.
pub fn decided_by(
    candidates: &[CandidateView],
    pruned: &[meridian_federation::PrunedView],
) -> Option<String> {
    let chosen = candidates.iter().find(|c| c.chosen)?;
    let terms = chosen.terms.as_ref()?;
    let mut out = String::new();
    // The others it was weighed against: scored, and passed over only for scoring worse.
    let outscored = placement::Reject::Outscored.to_string();
    let weighed = |c: &CandidateView| c.rejected.as_ref().is_none_or(|r| *r == outscored);
    let runner = candidates
        .iter()
        .filter(|c| !c.chosen && weighed(c))
        .filter_map(|c| c.terms.as_ref().map(|t| (c, t)))
        .min_by(|a, b| a.1.score.total_cmp(&b.1.score));
    match runner {
        None if pruned.is_empty() => out.push_str("the only candidate that could take it"),
        None => out.push_str(&format!(
            "the only candidate the site index let through ({} sites not scored; `explain --all` weighs every \
             site)",
            pruned.iter().map(|p| p.sites).sum::<usize>()
        )),
        Some((other, o)) => {
            let usd = |micro: u64| format!("${:.2}", micro as f64 / 1e6);
            let kg = |g: u64| format!("{:.3} kgCO2e", g as f64 / 1e3);
            let gb = |b: u64| format!("{:.1} GB", b as f64 / 1e9);
            // (name, relative gain, the gain in words, the loss in words)
            let rel = |mine: f64, theirs: f64| (theirs - mine) / mine.abs().max(theirs.abs()).max(1e-9);
            let terms_compared = [
                (
                    "price",
                    rel(terms.cost_micro_usd as f64, o.cost_micro_usd as f64),
                    format!("{} cheaper", usd(o.cost_micro_usd.saturating_sub(terms.cost_micro_usd))),
                    format!("{} dearer", usd(terms.cost_micro_usd.saturating_sub(o.cost_micro_usd))),
                ),
                (
                    "carbon",
                    rel(terms.co2_g as f64, o.co2_g as f64),
                    format!("{} less", kg(o.co2_g.saturating_sub(terms.co2_g))),
                    format!("{} more", kg(terms.co2_g.saturating_sub(o.co2_g))),
                ),
                (
                    "latency",
                    rel(terms.latency_ms, o.latency_ms),
                    format!("{:.0} ms nearer its users", o.latency_ms - terms.latency_ms),
                    format!("{:.0} ms farther from its users", terms.latency_ms - o.latency_ms),
                ),
                (
                    "data locality",
                    rel(terms.data_bytes_moved as f64, o.data_bytes_moved as f64),
                    format!(
                        "{} less data to move (egress)",
                        gb(o.data_bytes_moved.saturating_sub(terms.data_bytes_moved))
                    ),
                    format!(
                        "{} more data to move",
                        gb(terms.data_bytes_moved.saturating_sub(o.data_bytes_moved))
                    ),
                ),
            ];
            // Differences under half a per cent are ties, not reasons.
            let best = terms_compared
                .iter()
                .filter(|t| t.1 > 0.005)
                .max_by(|a, b| a.1.total_cmp(&b.1));
            match best {
                Some((name, _, gain, _)) => out.push_str(&format!(
                    "{name}: {gain} than {} ({}), the next best",
                    other.site,
                    other.tier.as_str()
                )),
                None if chosen.tier < other.tier => out.push_str(&format!(
                    "tier: {} capacity is used before {} ({} is no better on any term)",
                    chosen.tier.as_str(),
                    other.tier.as_str(),
                    other.site
                )),
                None => out.push_str(&format!(
                    "the score of its policy, against {} ({}), the next best",
                    other.site,
                    other.tier.as_str()
                )),
            }
            let given_up: Vec<&str> = terms_compared
                .iter()
                .filter(|t| t.1 < -0.005)
                .map(|t| t.3.as_str())
                .collect();
            if !given_up.is_empty() {
                out.push_str(&format!("; it is {}", given_up.join(", ")));
            }
        }
    }
    let mut kept_out: std::collections::BTreeMap<&str, usize> = Default::default();
    for c in candidates.iter().filter(|c| !c.chosen && !weighed(c)) {
        if let Some(r) = &c.rejected {
            *kept_out.entry(r.as_str()).or_default() += 1;
        }
    }
    if !kept_out.is_empty() {
        let reasons: Vec<String> = kept_out.iter().map(|(r, n)| format!("{r} ({n})")).collect();
        out.push_str(&format!("; kept out: {}", reasons.join(", ")));
    }
    Some(out)
}

/// A job as a capacity what-if replays it: its spec without the run spec (commands and environment are not
/// history), and how long each attempt ran.
pub fn history_job(job: &Job) -> HistoryJob {
    let mut spec = job.spec.clone();
    spec.run = Default::default();
    HistoryJob {
        job: job.id.clone(),
        phase: job.phase,
        submitted_ms: job.submitted_ms,
        spec,
        runs: job
            .runs
            .iter()
            .map(|r| HistoryRun {
                attempt: r.attempt,
                site: r.site.clone(),
                model: r.model.clone(),
                started_ms: r.started_ms,
                runtime_ms: r.runtime_ms,
                ended: r.metered,
            })
            .collect(),
    }
}

/// Attempts of `job` that may still be running at a site revoked while it held them: the site never reported
/// their end. The broker sent each a cancel when it revoked the site, and an honest agent obeys, but a
/// hostile one need not: a warning in words, per attempt, for explanations and timelines.
pub fn possibly_still_running(
    job: &Job,
    revoked: &std::collections::BTreeSet<SiteId>,
) -> Vec<(u32, SiteId, String)> {
    job.runs
        .iter()
        .filter(|r| revoked.contains(&r.site) && !r.metered)
        .filter(|r| {
            !(r.attempt == job.attempt
                && job.holds_devices()
                && job.assignment.as_ref().is_some_and(|a| a.site == r.site))
        })
        .map(|r| {
            (
                r.attempt,
                r.site.clone(),
                format!(
                    "attempt {} may still be running at site {}: the site was revoked while it held it and never \
                     reported its end (it was sent a cancel; a hostile site need not obey)",
                    r.attempt, r.site
                ),
            )
        })
        .collect()
}

/// How many candidates a timeline shows.
pub const TIMELINE_CANDIDATES: usize = 5;

/// A job's timeline (without the log tail, which the shell asks the site for): structured entries for its
/// submission, each attempt's offer, start and end, its finish and its current wait, with the broker's notes
/// (refusals, requeues, preemptions, cancels) between them, oldest first.
pub fn timeline(job: &Job) -> TimelineView {
    let ev =
        |at_ms: u64, event: &str, attempt: Option<u32>, site: Option<&SiteId>, detail: String| {
            TimelineEvent {
                at_ms,
                event: event.to_owned(),
                attempt,
                site: site.cloned(),
                detail,
            }
        };
    let mut events = vec![ev(
        job.submitted_ms,
        "submitted",
        None,
        None,
        format!(
            "{} job: {} × {:.3} {} device(s)",
            job.spec.kind.as_str(),
            job.spec.replicas.max(1),
            job.spec.resources.milli_per_replica() as f64 / 1000.0,
            job.spec.resources.kind.as_str(),
        ),
    )];
    for r in &job.runs {
        let a = Some(r.attempt);
        events.push(ev(
            r.offered_ms,
            "offered",
            a,
            Some(&r.site),
            format!(
                "pool {} ({}), {:.3} device(s)",
                r.pool,
                r.model,
                r.milli as f64 / 1000.0
            ),
        ));
        if let Some(s) = r.started_ms {
            events.push(ev(s, "started", a, Some(&r.site), String::new()));
        }
        if r.metered {
            let from = r.started_ms.unwrap_or(r.offered_ms);
            events.push(ev(
                from + r.runtime_ms,
                "ended",
                a,
                Some(&r.site),
                format!(
                    "ran {:.1} s: {:.4} USD, {} Wh, {} gCO2e",
                    r.runtime_ms as f64 / 1000.0,
                    r.amounts.cost_micro_usd as f64 / 1e6,
                    r.amounts.energy_wh,
                    r.amounts.co2_g
                ),
            ));
        }
    }
    // The notes the runs already say (offers and acceptances) are left out; the others are kept as written.
    let said = |what: &str| {
        what == "submitted"
            || what.starts_with("attempt ")
                && (what.contains(" offered to ") || what.contains(" accepted by "))
    };
    for (t, what) in job.history.iter().filter(|(_, w)| !said(w)) {
        events.push(ev(*t, "note", None, None, what.clone()));
    }
    if let (JobPhase::Pending, Some(d)) = (job.phase, job.decision.as_deref()) {
        if matches!(d.outcome, placement::Outcome::Wait(_)) {
            events.push(ev(d.at_ms, "waiting", None, None, job.why.clone()));
        }
    }
    if let Some(f) = job.finished_ms {
        let exit = job
            .exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        events.push(ev(
            f,
            "finished",
            Some(job.attempt).filter(|n| *n > 0),
            job.runs.last().map(|r| &r.site),
            format!("{}{exit}", job.phase.as_str()),
        ));
    }
    events.sort_by_key(|e| e.at_ms);
    let explain = explain_view(job);
    let mut candidates = explain.candidates;
    // The chosen first, then the scored by score, then the misses (kept in the decision's order).
    candidates.sort_by(|a, b| {
        let rank = |c: &CandidateView| match (&c.terms, c.chosen, &c.rejected) {
            (_, true, _) => (0, 0.0),
            (Some(t), _, None) => (1, t.score),
            (Some(t), _, Some(_)) => (2, t.score),
            (None, _, _) => (3, 0.0),
        };
        let (ra, sa) = rank(a);
        let (rb, sb) = rank(b);
        ra.cmp(&rb).then(sa.total_cmp(&sb))
    });
    candidates.truncate(TIMELINE_CANDIDATES);
    TimelineView {
        job: job.id.clone(),
        tenant: job.spec.tenant.clone(),
        phase: job.phase,
        why: job.why.clone(),
        exit_code: job.exit_code,
        events,
        attempts: job
            .runs
            .iter()
            .map(|r| AttemptView {
                attempt: r.attempt,
                site: r.site.clone(),
                pool: r.pool.clone(),
                model: r.model.clone(),
                milli: r.milli,
                offered_at_ms: r.offered_ms,
                started_at_ms: r.started_ms,
                runtime_ms: r.runtime_ms,
                metered: r.metered,
                amounts: r.amounts,
            })
            .collect(),
        policy: explain.policy,
        decided_at_ms: explain.decided_at_ms,
        candidates,
        log_tail: None,
        log_error: None,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use meridian_federation::Tier;

    fn candidate(
        site: &str,
        tier: Tier,
        usd: f64,
        co2_g: u64,
        gb: u64,
        chosen: bool,
    ) -> CandidateView {
        CandidateView {
            site: SiteId::new(site).unwrap(),
            tier,
            pool: Some("gpu".into()),
            terms: Some(TermsView {
                cost_micro_usd: (usd * 1e6) as u64,
                energy_wh: 1_000,
                co2_g,
                latency_ms: 10.0,
                data_bytes_moved: gb * 1_000_000_000,
                score: if chosen { 0.1 } else { 0.2 },
            }),
            rejected: None,
            chosen,
        }
    }

    #[test]
    fn the_deciding_term_is_named_with_what_the_choice_gives_up_and_what_kept_sites_out() {
        // Cheaper by a third, dirtier by a tenth: price decided, carbon given up.
        let mut c = vec![
            candidate("oregon", Tier::Owned, 2.0, 1_100, 0, true),
            candidate("paris", Tier::Partner, 3.0, 1_000, 0, false),
        ];
        c.push(CandidateView {
            rejected: Some("outside residency eu".into()),
            terms: None,
            ..candidate("virginia", Tier::Owned, 0.0, 0, 0, false)
        });
        c.push(CandidateView {
            rejected: Some("outside residency eu".into()),
            terms: None,
            ..candidate("ohio", Tier::Owned, 0.0, 0, 0, false)
        });
        assert_eq!(
            decided_by(&c, &[]).unwrap(),
            "price: $1.00 cheaper than paris (partner), the next best; it is 0.100 kgCO2e more; \
             kept out: outside residency eu (2)"
        );
        // Where the data is: 90 TB not moved outweighs a dearer price.
        let d = [
            candidate("virginia", Tier::Owned, 2.5, 1_000, 0, true),
            candidate("oregon", Tier::Owned, 2.0, 1_000, 90_000, false),
        ];
        let said = decided_by(&d, &[]).unwrap();
        assert!(
            said.starts_with("data locality: 90000.0 GB less data to move (egress) than oregon"),
            "{said}"
        );
        assert!(said.ends_with("; it is $0.50 dearer"), "{said}");
        // Equal on every term: the tier decided.
        let t = [
            candidate("own", Tier::Owned, 2.0, 1_000, 0, true),
            candidate("cloud", Tier::Cloud, 2.0, 1_000, 0, false),
        ];
        assert!(decided_by(&t, &[])
            .unwrap()
            .starts_with("tier: owned capacity is used before cloud"));
        // Alone, or nothing chosen.
        assert_eq!(
            decided_by(&t[..1], &[]).unwrap(),
            "the only candidate that could take it"
        );
        assert_eq!(decided_by(&t[1..], &[]), None);
        let pruned = [meridian_federation::PrunedView {
            reason: "no free capacity".into(),
            sites: 5,
        }];
        assert!(decided_by(&t[..1], &pruned)
            .unwrap()
            .starts_with("the only candidate the site index let through (5 sites not scored"));
    }
}
