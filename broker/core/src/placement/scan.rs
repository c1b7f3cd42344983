//! Placement by a scan of the given sites: every candidate judged, then the spill-over order of tiers, the
//! normalised scores, the policy's choice and a possible carbon deferral.

use super::baseline::baseline_key;
use super::defer::defer;
use super::filters::{judge_pool, site_reject, PoolJudgement};
use super::terms::{cheapest_egress, rank, PerTerm, Rule, Term, Terms};
use super::{
    policy_of, weights, Baseline, Candidate, Choice, Decision, Outcome, Reject, Request, View,
    Wait, DEFAULT_DURATION_S,
};
use crate::model::{Pool, Site};
use crate::Millis;
use meridian_federation::{DeviceShare, JobKind, JobSpec, Policy, SiteId, Tier};

pub(super) fn place_over<'s>(
    view: View<'s>,
    req: Request<'_>,
    now: Millis,
    sites: impl Iterator<Item = &'s Site>,
) -> Decision {
    let spec = req.spec;
    let named = policy_of(spec, req.queue_policy);
    let policy = super::terms::placed_by(named.clone(), view.format);
    if let Some(at_ms) = spec.window.start_after_ms.filter(|t| *t > now) {
        return Decision {
            at_ms: now,
            policy: req.baseline.map_or(named.name(), Baseline::name).into(),
            weights: weights(&policy),
            outcome: Outcome::Wait(Wait::NotBefore { at_ms }),
            candidates: Vec::new(),
            pruned: Vec::new(),
        };
    }
    let rule = Rule::of(&policy, view.format);
    let mut w = weights(&policy);
    if policy == Policy::Balanced && spec.kind != JobKind::Inference {
        // Batch and training work is not latency-bound: where its submitters sit does not matter.
        w.latency = 0.0;
    }
    let duration_ms = spec.duration_s.unwrap_or(DEFAULT_DURATION_S) * 1000;
    let egress = cheapest_egress(view.sites, spec);
    let mut candidates = Vec::new();
    // (candidate index, devices) of candidates that can take the job now.
    let mut ready: Vec<(usize, Vec<DeviceShare>)> = Vec::new();
    let mut nearest_miss: Option<(SiteId, String)> = None;

    for site in sites {
        let base = |pool: Option<&Pool>, reject: Reject| Candidate {
            site: site.id().clone(),
            tier: site.tier(),
            pool: pool.map(|p| p.name.clone()),
            terms: None,
            reject: Some(reject),
        };
        if let Some(r) = site_reject(view, site, spec) {
            if r.is_miss() {
                nearest_miss.get_or_insert_with(|| (site.id().clone(), r.to_string()));
            }
            candidates.push(base(None, r));
            continue;
        }
        let mut any_pool = false;
        for pool in site.pools.iter().filter(|p| p.kind == spec.resources.kind) {
            any_pool = true;
            match judge_pool(view, req, now, site, pool, duration_ms, &egress) {
                PoolJudgement::Rejected(r) => {
                    if r.is_miss() {
                        nearest_miss.get_or_insert_with(|| (site.id().clone(), r.to_string()));
                    }
                    candidates.push(base(Some(pool), r));
                }
                PoolJudgement::Ready(terms, devices) => {
                    ready.push((candidates.len(), devices));
                    candidates.push(Candidate {
                        terms: Some(terms),
                        reject: None,
                        ..base(Some(pool), Reject::Outscored)
                    });
                }
                PoolJudgement::Busy(terms) => candidates.push(Candidate {
                    terms: Some(terms),
                    ..base(
                        Some(pool),
                        Reject::Busy {
                            free_milli: pool.free_milli(),
                            needs_milli: spec.total_milli(),
                        },
                    )
                }),
            }
        }
        if !any_pool {
            let r = Reject::NoPoolOfKind(spec.resources.kind);
            nearest_miss.get_or_insert_with(|| (site.id().clone(), r.to_string()));
            candidates.push(base(None, r));
        }
    }

    let any_shape_fits = candidates.iter().any(|c| c.terms.is_some());
    // A model no pool has is named as such, not as one site's miss (looked up only when nothing fits).
    if !any_shape_fits && !spec.resources.models.is_empty() {
        if let Some(why) = no_such_model(view, spec, &candidates) {
            if let Some((_, miss)) = nearest_miss.as_mut() {
                *miss = why;
            }
        }
    }
    let tiers: Vec<Tier> = candidates.iter().map(|c| c.tier).collect();
    let tier_of = |i: usize| tiers[i];
    let first_ready_tier = ready.iter().map(|(i, _)| tier_of(*i)).min();
    let max_wait_ms = spec.max_wait_s * 1000;
    let (chosen_tier, burst_in_ms) = match first_ready_tier {
        Some(Tier::Cloud) if req.waited_ms < max_wait_ms => {
            (None, Some(max_wait_ms - req.waited_ms))
        }
        t => (t, None),
    };

    // Mark ready candidates outside the chosen tier.
    for (i, _) in &ready {
        let c = &mut candidates[*i];
        match (chosen_tier, burst_in_ms) {
            (Some(t), _) if c.tier != t => c.reject = Some(Reject::EarlierTierFirst(t)),
            (None, Some(ms)) => c.reject = Some(Reject::BurstHeld { remaining_ms: ms }),
            _ => {}
        }
    }

    let Some(tier) = chosen_tier else {
        let wait = if any_shape_fits {
            Wait::Busy { burst_in_ms }
        } else {
            Wait::NoSiteFits { nearest_miss }
        };
        return Decision {
            at_ms: now,
            policy: req.baseline.map_or(named.name(), Baseline::name).into(),
            weights: w,
            outcome: Outcome::Wait(wait),
            candidates,
            pruned: Vec::new(),
        };
    };

    // Normalise among the ready candidates of the chosen tier.
    let in_tier: Vec<&(usize, Vec<DeviceShare>)> =
        ready.iter().filter(|(i, _)| tier_of(*i) == tier).collect();
    let mut best = PerTerm::splat(f64::INFINITY);
    for (i, _) in &in_tier {
        if let Some(t) = &candidates[*i].terms {
            for term in Term::ALL {
                best.set(term, best.get(term).min(t.get(term)));
            }
        }
    }
    let ws = PerTerm::weights(&w);
    // The cheapest candidate: by cost, then carbon, then latency, the first in site-id order.
    let cheapest = in_tier
        .iter()
        .filter_map(|(i, _)| candidates[*i].terms.as_ref().map(Terms::values))
        .min_by(|a, b| {
            [Term::Cost, Term::Carbon, Term::Latency]
                .iter()
                .map(|t| a.get(*t).total_cmp(&b.get(*t)))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .unwrap_or(best);
    let mut winner: Option<(f64, usize, &Vec<DeviceShare>)> = None;
    let mut winner_key: Vec<f64> = Vec::new();
    for (i, devices) in in_tier {
        let base_key = req.baseline.map(|b| {
            baseline_key(
                view,
                &candidates[*i],
                b,
                candidates[*i].terms.as_ref().map_or(0.0, |t| t.latency_ms),
            )
        });
        let Some(t) = candidates[*i].terms.as_mut() else {
            continue;
        };
        let values = t.values();
        let (ranked, score) = rank(rule, &values, &best, &cheapest, &ws, &req.spent);
        t.score = score;
        let key: Vec<f64> = match req.baseline {
            Some(_) => base_key.clone().unwrap_or_default(),
            None => ranked,
        };
        // Candidates are visited in site-id order, so a strict `<` keeps the first of equal keys.
        let better =
            winner.is_none() || key.partial_cmp(&winner_key) == Some(std::cmp::Ordering::Less);
        if better {
            winner = Some((score, *i, devices));
            winner_key = key;
        }
    }
    for (i, _) in &ready {
        if tier_of(*i) == tier {
            candidates[*i].reject = Some(Reject::Outscored);
        }
    }
    let deferral = winner.as_ref().and_then(|(_, i, _)| {
        let c = &candidates[*i];
        let site = view.sites.get(&c.site)?;
        let pool = c.pool.as_ref().and_then(|p| site.pool(p))?;
        let weighs_carbon = req.baseline.is_none()
            && matches!(
                policy,
                Policy::Green
                    | Policy::Balanced
                    | Policy::CarbonPriceUsdPerT(_)
                    | Policy::MaxCostPremium(_)
            );
        let deadline = spec.window.deadline_ms.filter(|_| weighs_carbon)?;
        defer(
            site,
            view.throughput.runtime_ms(duration_ms, &pool.model),
            now,
            deadline,
        )
    });
    if let Some(wait) = deferral {
        return Decision {
            at_ms: now,
            policy: named.name().into(),
            weights: w,
            outcome: Outcome::Wait(wait),
            candidates,
            pruned: Vec::new(),
        };
    }
    let outcome = match winner {
        Some((_, i, devices)) => {
            let c = &mut candidates[i];
            c.reject = None;
            Outcome::Place(Choice {
                site: c.site.clone(),
                pool: c.pool.clone().unwrap_or_default(),
                tier,
                devices: devices.clone(),
                terms: c.terms.clone().unwrap_or_else(Terms::empty),
            })
        }
        None => Outcome::Wait(Wait::Busy { burst_in_ms: None }),
    };
    Decision {
        at_ms: now,
        policy: req.baseline.map_or(named.name(), Baseline::name).into(),
        weights: w,
        outcome,
        candidates,
        pruned: Vec::new(),
    }
}

/// When the job allows only models that no examined pool of its kind has: says so, with the models there are.
fn no_such_model(view: View<'_>, spec: &JobSpec, candidates: &[Candidate]) -> Option<String> {
    let mut seen = std::collections::BTreeSet::new();
    for c in candidates {
        let pool = c.pool.as_ref().and_then(|name| {
            view.sites
                .get(&c.site)?
                .pools
                .iter()
                .find(|p| &p.name == name)
        });
        if let Some(p) = pool.filter(|p| p.kind == spec.resources.kind) {
            if p.model_allowed(&spec.resources.models) {
                return None;
            }
            seen.insert(p.model.to_string());
        }
    }
    if seen.is_empty() {
        return None;
    }
    let asked: Vec<String> = spec
        .resources
        .models
        .iter()
        .map(ToString::to_string)
        .collect();
    let seen: Vec<String> = seen.into_iter().collect();
    Some(format!(
        "no pool examined has the model the job allows ({}): the pools have {}",
        asked.join(", "),
        seen.join(", ")
    ))
}
