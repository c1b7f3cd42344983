//! Placement through the site index: exact best-first searches that examine only the pools that can matter.

use super::filters::{judge_pool, site_reject, PoolJudgement};
use super::scan::place_over;
use super::terms::{rank, score, PerTerm, Rule, Term, Terms};
use super::{policy_of, weights, Decision, Outcome, Request, View, DEFAULT_DURATION_S};
use crate::index::{Objective, SiteIndex};
use crate::latency;
use crate::model::{Pool, Site};
use crate::Millis;
use meridian_federation::{JobKind, JobSpec, Policy, PoolName, SiteId, Tier};
use std::collections::HashMap;

/// Whether the job can run on this pool now, and its terms there if so. (Jobs with datasets take the full
/// scan, so there is no egress to price here.)
fn ready_terms(
    view: View<'_>,
    req: Request<'_>,
    now: Millis,
    site: &Site,
    pool: &Pool,
    duration_ms: u64,
) -> Option<Terms> {
    if site_reject(view, site, req.spec).is_some() {
        return None;
    }
    match judge_pool(view, req, now, site, pool, duration_ms, &HashMap::new()) {
        PoolJudgement::Ready(terms, _) => Some(terms),
        PoolJudgement::Busy(_) | PoolJudgement::Rejected(_) => None,
    }
}

/// Looks at one listed pool: records its site as examined and returns its terms if it can run the job now.
fn examine<'a>(
    view: View<'a>,
    req: Request<'_>,
    now: Millis,
    id: &'a SiteId,
    pool_name: &PoolName,
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) -> Option<Terms> {
    // The federation's own key: one text per site, so a site already examined is found by address.
    let (id, site) = view.sites.get_key_value(id)?;
    let pool = site.pool(pool_name)?;
    if !examined.iter().any(|e| std::ptr::eq(*e, id)) {
        examined.push(id);
    }
    ready_terms(view, req, now, site, pool, duration_ms)
}

/// The device-hours of the job's expected run (all its replicas).
fn device_hours(spec: &JobSpec, duration_ms: u64) -> f64 {
    spec.total_milli() as f64 / 1000.0 * duration_ms as f64 / 3_600_000.0
}

/// A whole-job lower bound from a per-device-hour one, with room for integer rounding.
fn whole_job(per_device_hour: f64, device_hours: f64) -> f64 {
    per_device_hour * device_hours * (1.0 - 1e-3) - 1.0
}

/// One best-first list of pools with room: (lower bound of the term, site, pool), ascending by the bound.
type List<'a> = Box<dyn Iterator<Item = (f64, &'a SiteId, &'a PoolName)> + 'a>;

/// The lists of a tier for the terms the search uses (cost, carbon, latency).
fn lists<'a>(
    view: View<'a>,
    spec: &'a JobSpec,
    index: &'a SiteIndex,
    tier: Tier,
    terms_used: &[Term],
    duration_ms: u64,
) -> Vec<(Term, List<'a>)> {
    let scale = device_hours(spec, duration_ms);
    let kind = spec.resources.kind;
    let mut out: Vec<(Term, List<'a>)> = Vec::new();
    for &term in terms_used {
        let list: List<'a> = match term {
            Term::Cost | Term::Carbon => {
                let objective = if term == Term::Cost {
                    Objective::Cost
                } else {
                    Objective::Carbon
                };
                Box::new(
                    index
                        .ordered(kind, tier, objective)
                        .map(move |(b, id, p)| (whole_job(b, scale), id, p)),
                )
            }
            _ => {
                let Some(reference) = spec
                    .users
                    .iter()
                    .max_by(|a, b| a.weight.total_cmp(&b.weight))
                else {
                    continue;
                };
                let reference = reference.location;
                let total: f64 = spec.users.iter().map(|u| u.weight).sum();
                // Triangle inequality: d(u, s) >= d(r, s) - d(r, u) for the reference user r.
                let spread: f64 = spec
                    .users
                    .iter()
                    .map(|u| u.weight * latency::distance_km(reference, u.location))
                    .sum::<f64>()
                    / total;
                let per_km = 2.0 * latency::ROUTE_FACTOR / latency::FIBRE_KM_PER_MS;
                let sites = view.sites;
                Box::new(
                    index
                        .nearest(kind, tier, crate::index::unit_vector(reference))
                        .map(move |(id, p)| {
                            let d = sites
                                .get(id)
                                .map_or(0.0, |s| latency::distance_km(reference, s.info.location));
                            (latency::BASE_RTT_MS + per_km * (d - spread) - 1e-6, id, p)
                        }),
                )
            }
        };
        out.push((term, list));
    }
    out
}

/// Walks one list and returns the exact minimum of `term` over the pools that can run the job now, stopping once
/// the bound passes it; every site looked at is added to `examined`.
fn best_of<'a>(
    view: View<'a>,
    req: Request<'_>,
    now: Millis,
    list: List<'a>,
    term: Term,
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) -> Option<f64> {
    let mut best: Option<f64> = None;
    for (lower, id, pool_name) in list {
        if best.is_some_and(|b| lower > b) {
            break;
        }
        if let Some(t) = examine(view, req, now, id, pool_name, duration_ms, examined) {
            let v = t.get(term);
            best = Some(best.map_or(v, |b| b.min(v)));
        }
    }
    best
}

/// Walks the cost list for the cheapest pool that can run the job now — by cost, then carbon, then latency, as
/// a rule with a premium counts "the cheapest" — and returns its terms; every site looked at is added to
/// `examined`.
fn cheapest_of<'a>(
    view: View<'a>,
    req: Request<'_>,
    now: Millis,
    list: List<'a>,
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) -> Option<PerTerm> {
    let key = |v: &PerTerm| [Term::Cost, Term::Carbon, Term::Latency].map(|t| v.get(t));
    let mut best: Option<PerTerm> = None;
    for (lower, id, pool_name) in list {
        if best.is_some_and(|b| lower > b.get(Term::Cost)) {
            break;
        }
        if let Some(t) = examine(view, req, now, id, pool_name, duration_ms, examined) {
            let v = t.values();
            if best.is_none_or(|b| key(&v) < key(&b)) {
                best = Some(v);
            }
        }
    }
    best
}

/// Placement through the index without scoring every site with room, where an exact search applies:
/// - `cost`, `green`, `latency`: walk the pools best-first by a lower bound of the policy's first term (cost and
///   carbon per reference device-hour; round trip from the users by the triangle inequality in an R-tree) and
///   stop once the bound passes the best exact value;
/// - `balanced` and weights on cost, carbon and latency: find each term's best the same way (the normalisation
///   needs them), then run the threshold algorithm over the three lists: the score only grows with each term,
///   so a pool not yet seen scores at least the score of the lists' current bounds, and the search stops when
///   the best exact score is below that;
/// - `balanced` and `max_cost_premium` (the knee rule): find the cheapest pool (its cost and carbon are the
///   units of the score) and each other term's best, then run the threshold algorithm with the knee score,
///   infinite for a pool over the premium limit: the score only grows with each term, so the search stops at
///   the first bound no pool within the limit can beat, instead of examining every pool within it.
///
/// The sites examined are then evaluated by `place_over`, in site-id order, so the decision and its
/// explanation are those of a full scan restricted to sites that can matter. Jobs with datasets, measured
/// user regions, a closed start window or a baseline ranking take the general path (`None`).
pub(super) fn place_indexed<'a>(
    view: View<'a>,
    req: Request<'a>,
    now: Millis,
    index: &'a SiteIndex,
) -> Option<Decision> {
    let spec = req.spec;
    let policy = super::terms::placed_by(policy_of(spec, req.queue_policy), view.format);
    if req.baseline.is_some()
        || !spec.datasets.is_empty()
        || spec.users.iter().any(|u| u.rtt_region.is_some())
        || spec.window.start_after_ms.is_some_and(|t| t > now)
    {
        return None;
    }
    let mut w = weights(&policy);
    if policy == Policy::Balanced && spec.kind != JobKind::Inference {
        w.latency = 0.0;
    }
    let rule = Rule::of(&policy, view.format);
    let premium = rule.premium();
    let knee = matches!(rule, Rule::Knee(_));
    let lexicographic_term = match policy {
        Policy::Cost => Some(Term::Cost),
        Policy::Green => Some(Term::Carbon),
        Policy::Latency => Some(Term::Latency),
        _ if knee => None,
        // Rules with a premium choose among the pools within it of the cheapest: found from the cost list.
        _ if premium.is_some() => Some(Term::Cost),
        _ => None,
    };
    if lexicographic_term.is_none() && w.energy > 0.0 {
        return None;
    }
    if lexicographic_term == Some(Term::Latency) && spec.users.is_empty() {
        return None;
    }
    let ws = PerTerm::weights(&w);
    let used: Vec<Term> = match lexicographic_term {
        Some(t) => vec![t],
        None if matches!(rule, Rule::CarbonPrice(_)) => vec![Term::Cost, Term::Carbon],
        None if knee => [Term::Cost, Term::Carbon, Term::Latency]
            .into_iter()
            .filter(|t| *t != Term::Latency || (ws.get(*t) > 0.0 && !spec.users.is_empty()))
            .collect(),
        None => [Term::Cost, Term::Carbon, Term::Latency]
            .into_iter()
            .filter(|t| ws.get(*t) > 0.0 && (*t != Term::Latency || !spec.users.is_empty()))
            .collect(),
    };
    if used.is_empty() {
        return None;
    }
    let duration_ms = spec.duration_s.unwrap_or(DEFAULT_DURATION_S) * 1000;
    let mut examined: Vec<&SiteId> = Vec::new();
    for tier in Tier::ALL {
        if tier == Tier::Cloud && req.waited_ms < spec.max_wait_s * 1000 {
            return None;
        }
        let mut best = PerTerm::splat(f64::NAN);
        let mut found = true;
        for (term, list) in lists(view, spec, index, tier, &used, duration_ms) {
            match best_of(view, req, now, list, term, duration_ms, &mut examined) {
                Some(b) => best.set(term, b),
                None => found = false,
            }
        }
        if !found {
            continue;
        }
        if knee {
            let cost_list = lists(view, spec, index, tier, &[Term::Cost], duration_ms);
            let Some(cheapest) = cost_list.into_iter().next().and_then(|(_, list)| {
                cheapest_of(view, req, now, list, duration_ms, &mut examined)
            }) else {
                continue;
            };
            let limit = req.spent.limit(rule, cheapest.get(Term::Cost));
            // The terms not searched are the same at every pool here (no data to move; no users, or latency
            // weighed at 0): their best is any finite value.
            let mut best = best;
            for t in Term::ALL {
                if best.get(t).is_nan() {
                    best.set(t, 0.0);
                }
            }
            let knee_score = |v: &PerTerm| -> f64 {
                if v.get(Term::Cost) <= limit {
                    rank(rule, v, &best, &cheapest, &ws, &req.spent).1
                } else {
                    f64::INFINITY
                }
            };
            // A pool whose cost cannot be within the limit is not worth examining when another list reaches it.
            let scale = device_hours(spec, duration_ms);
            let kind = spec.resources.kind;
            let over_limit = |id: &SiteId, pool: &PoolName| {
                index
                    .bound(kind, tier, Objective::Cost, id, pool)
                    .is_some_and(|b| whole_job(b, scale) > limit)
            };
            threshold_search(
                view,
                req,
                now,
                index,
                tier,
                &used,
                &knee_score,
                &over_limit,
                duration_ms,
                &mut examined,
            );
        } else if premium.is_some() {
            let limit = req.spent.limit(rule, best.get(Term::Cost));
            // Every pool whose cost may be within the premium of the cheapest is examined.
            for (term, list) in lists(view, spec, index, tier, &used, duration_ms) {
                for (lower, id, pool_name) in list {
                    if lower > limit {
                        break;
                    }
                    examine(view, req, now, id, pool_name, duration_ms, &mut examined);
                }
                debug_assert_eq!(term, Term::Cost);
            }
        } else if lexicographic_term.is_none() && used.len() > 1 {
            // Scores that never fall when a term grows: `cost + price × CO2`, or the weighted normalised score.
            let priced;
            let weighted;
            let score: &dyn Fn(&PerTerm) -> f64 = if let Rule::CarbonPrice(price) = rule {
                priced = move |v: &PerTerm| v.get(Term::Cost) + price * v.get(Term::Carbon);
                &priced
            } else {
                weighted = |v: &PerTerm| score(v, &best, &ws, &used);
                &weighted
            };
            threshold_search(
                view,
                req,
                now,
                index,
                tier,
                &used,
                score,
                &|_, _| false,
                duration_ms,
                &mut examined,
            );
        }
        examined.sort_unstable();
        let listed = examined.len();
        let mut d = place_over(
            view,
            req,
            now,
            examined.into_iter().filter_map(|id| view.sites.get(id)),
        );
        if !matches!(d.outcome, Outcome::Place(_)) {
            return None;
        }
        d.pruned = vec![(
            "not examined: their bounds show they cannot beat the chosen site".to_owned(),
            view.sites.len().saturating_sub(listed),
        )];
        d.pruned.retain(|(_, n)| *n > 0);
        return Some(d);
    }
    None
}

/// Fagin's threshold algorithm over the tier's lists for a score that never falls when a term grows; adds
/// every site it scores to `examined`. A pool `beyond` says cannot score finitely is passed over unexamined.
#[allow(clippy::too_many_arguments)]
fn threshold_search<'a>(
    view: View<'a>,
    req: Request<'a>,
    now: Millis,
    index: &'a SiteIndex,
    tier: Tier,
    used: &[Term],
    score: &dyn Fn(&PerTerm) -> f64,
    beyond: &dyn Fn(&SiteId, &PoolName) -> bool,
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) {
    // Bounds may be below 0 (a lower bound of a non-negative term); they count as 0.
    let score = |values: &PerTerm| -> f64 {
        let mut clamped = *values;
        for t in used {
            clamped.set(*t, values.get(*t).max(0.0));
        }
        score(&clamped)
    };
    let mut lists = lists(view, req.spec, index, tier, used, duration_ms);
    let mut frontier = PerTerm::splat(0.0);
    let mut best_score = f64::INFINITY;
    let mut seen: std::collections::BTreeSet<(&SiteId, &PoolName)> =
        std::collections::BTreeSet::new();
    loop {
        let mut advanced = false;
        for (term, list) in lists.iter_mut() {
            let Some((lower, id, pool_name)) = list.next() else {
                continue;
            };
            advanced = true;
            frontier.set(*term, lower);
            if !seen.insert((id, pool_name)) || beyond(id, pool_name) {
                continue;
            }
            if let Some(t) = examine(view, req, now, id, pool_name, duration_ms, examined) {
                best_score = best_score.min(score(&t.values()));
            }
        }
        if !advanced || best_score < score(&frontier) {
            return;
        }
    }
}
