//! Placement: filter sites by hard constraints, score the rest, choose within the spill-over order of tiers.
//!
//! Pure: `place(view, request, now)` reads plain data and returns a [`Decision`] that records, for every
//! candidate (a site and one of its pools), its score terms or the reason it was rejected.
//!
//! ## Terms
//! Device-hours are the job's expected duration (for the reference model) scaled by the pool model's relative
//! throughput ([`super::throughput`]).
//!
//! - **cost**: price × device-hours + egress for `prefer` datasets not at the site, at the lowest egress price
//!   among the sites that hold them (micro-USD);
//! - **energy**: power × device-hours × PUE (Wh); **carbon**: energy × mean grid intensity over the expected
//!   run, from the site's advertised forecast where it has one (gCO2e);
//! - **latency**: weighted mean round trip from the job's user populations (see [`super::latency`]);
//! - **data**: bytes of `prefer` datasets that would have to move to the site — the transfer time at a given
//!   link speed, in proportion; the money of the move is in the cost term.
//!
//! ## Normalisation
//! Each term `t` of a candidate is compared with the best value `b` of that term among the candidates that
//! can take the job now in the tier being chosen from: `n = (t + f) / (b + f) − 1`, where `f` is a small floor
//! that keeps the ratio finite when the best is 0 ([`FLOORS`]: 1 cent, 1 Wh, 1 g, 10 ms — round trips within a metro area are alike — 1 GB). So `n` is 0 for
//! the best candidate and 1 for one twice as bad. The score is `Σ weight × n`; the lowest score wins, ties go
//! to the site id that sorts first.
//!
//! ## Policies
//! | policy | cost | energy | carbon | latency | data |
//! | --- | --- | --- | --- | --- | --- |
//! | `latency` | 0.01 | 0 | 0 | 1 | 0 |
//! | `cost` | 1 | 0 | 0.01 | 0 | 0 |
//! | `green` | 0.01 | 0.2 | 1 | 0 | 0 |
//! | `balanced` | 1 | 0 | 1 | 1 (0 for non-inference jobs) | 0.5 |
//!
//! `latency`, `cost` and `green` are single-criterion: the candidate best on their first term wins and the
//! other terms only break exact ties (cost → carbon → latency; carbon → energy → cost; latency → cost →
//! carbon); their weights above give the score shown in explanations. `balanced` and explicit weights choose
//! the lowest score. A job without a policy gets `latency` if it is an inference job, else `balanced`.
//!
//! ## Time
//! A job whose start window has not opened waits for it. A candidate on which the job, started now, would
//! finish after its deadline is rejected. A job with a deadline placed under `green` or `balanced` may be
//! deferred: if a later whole hour (within the site's forecast, and early enough to meet the deadline) cuts the
//! run's mean grid intensity at the chosen site by at least 10%, the job waits for that hour.
//!
//! ## Spill-over
//! Owned sites first, then partner sites; cloud sites only when no owned or partner site can take the job now
//! and the job has waited its `max_wait_s`.

use super::index::{Objective, SiteIndex};
use super::latency::{self, RttTable};
use super::metering::{self, Rates};
use super::model::{Pool, Site};
use super::regions::Regions;
use super::throughput::Throughput;
use super::Millis;
use meridian_federation::{
    AcceleratorKind, DeviceShare, JobKind, JobSpec, Locality, Policy, SiteId, Tier, Weights,
};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Expected run time when a job gives none, seconds.
pub const DEFAULT_DURATION_S: u64 = 3600;

/// Floors of the normalisation, in each term's unit: cost (micro-USD), energy (Wh), carbon (g), latency (ms),
/// data (bytes).
pub const FLOORS: [f64; 5] = [10_000.0, 1.0, 1.0, 10.0, 1e9];

/// Everything placement reads.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub sites: &'a BTreeMap<SiteId, Site>,
    pub rtt: &'a RttTable,
    pub regions: &'a Regions,
    pub throughput: &'a Throughput,
    /// Where present, only the sites it lists as having room are scored; the rest are counted as pruned.
    pub index: Option<&'a SiteIndex>,
}

/// The job being placed and what the broker knows of its history.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub spec: &'a JobSpec,
    /// How long the job has waited for capacity.
    pub waited_ms: u64,
    /// Sites that refused this job recently.
    pub refused: &'a [SiteId],
    /// Pools (site, pool) where the job's queue has reached its per-site quota cap.
    pub capped: &'a [(SiteId, String)],
    /// Rank by a simple baseline instead of the job's policy (the simulator's comparisons).
    pub baseline: Option<Baseline>,
}

/// Single-axis rankings the simulator compares Meridian's policies against. They share every filter, the
/// capacity, queue and burst rules; only the ranking of the candidates that can run the job differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The first candidate that fits, in tier then site-id order.
    FifoFirstFit,
    /// The lowest round trip to the job's users.
    Nearest,
    /// The lowest list price per device-hour (ignoring run time on the model and egress).
    Cheapest,
    /// The lowest current grid intensity × PUE (ignoring forecasts, power and run time).
    Greenest,
}

impl Baseline {
    pub const ALL: [Baseline; 4] = [
        Baseline::FifoFirstFit,
        Baseline::Nearest,
        Baseline::Cheapest,
        Baseline::Greenest,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Baseline::FifoFirstFit => "fifo-first-fit",
            Baseline::Nearest => "nearest",
            Baseline::Cheapest => "cheapest",
            Baseline::Greenest => "greenest",
        }
    }

    pub fn parse(s: &str) -> Option<Baseline> {
        Baseline::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// The score terms of one candidate.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Terms {
    pub cost_micro_usd: u64,
    pub energy_wh: u64,
    pub co2_g: u64,
    pub latency_ms: f64,
    pub data_bytes_moved: u64,
    /// Weighted normalised score (lower is better); NaN until normalised (stored as null).
    #[serde(with = "super::nan_as_null")]
    pub score: f64,
}

impl Terms {
    fn values(&self) -> [f64; 5] {
        [
            self.cost_micro_usd as f64,
            self.energy_wh as f64,
            self.co2_g as f64,
            self.latency_ms,
            self.data_bytes_moved as f64,
        ]
    }
}

/// Why a candidate was not chosen.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Reject {
    SiteLost,
    Draining,
    TierNotAllowed(Tier),
    SiteNotAllowed,
    OutsideResidency(String),
    MissingDataset(String),
    NoPoolOfKind(AcceleratorKind),
    ModelNotAllowed(String),
    TooLittleMemory {
        has_mib: u64,
        needs_mib: u64,
    },
    TooFewDevices {
        has: usize,
        needs: u64,
    },
    NoMilliSharing,
    /// The pool does not offer this MIG-style profile.
    NoMigProfile(String),
    /// The job wants one interconnect domain and a node of this pool is too small.
    NodeTooSmall {
        per_node: u32,
        needs: u64,
    },
    PriceAboveCap {
        price: u64,
        cap: u64,
    },
    /// Started now on this model, the job would finish after its deadline.
    MissesDeadline {
        late_by_ms: u64,
    },
    RefusedRecently,
    /// The job's queue has reached its quota cap at this site.
    QueueCapped,
    /// Fits the job's shape but not its size right now.
    Busy {
        free_milli: u64,
        needs_milli: u64,
    },
    /// Could run it now, but a site of an earlier tier can.
    EarlierTierFirst(Tier),
    /// A cloud site, held back until the job has waited its `max_wait`.
    BurstHeld {
        remaining_ms: u64,
    },
    /// Scored, but another candidate scored better.
    Outscored,
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::SiteLost => write!(f, "site lost (no heartbeats)"),
            Reject::Draining => write!(f, "site draining"),
            Reject::TierNotAllowed(t) => write!(f, "tier {} not allowed by the job", t.as_str()),
            Reject::SiteNotAllowed => write!(f, "site not in the job's allowed sites"),
            Reject::OutsideResidency(r) => write!(f, "outside residency region {r}"),
            Reject::MissingDataset(d) => write!(f, "lacks required dataset {d}"),
            Reject::NoPoolOfKind(k) => write!(f, "no {} pool", k.as_str()),
            Reject::ModelNotAllowed(m) => write!(f, "model {m} not allowed"),
            Reject::TooLittleMemory { has_mib, needs_mib } => {
                write!(f, "{has_mib} MiB per device, needs {needs_mib}")
            }
            Reject::TooFewDevices { has, needs } => {
                write!(f, "{has} healthy devices, needs {needs}")
            }
            Reject::NoMilliSharing => write!(f, "pool does not share devices"),
            Reject::NoMigProfile(p) => write!(f, "no MIG profile {p}"),
            Reject::NodeTooSmall { per_node, needs } => {
                write!(
                    f,
                    "{per_node} devices per node, the job needs {needs} in one node"
                )
            }
            Reject::MissesDeadline { late_by_ms } => write!(
                f,
                "would finish {:.1} h after the deadline",
                *late_by_ms as f64 / 3_600_000.0
            ),
            Reject::PriceAboveCap { price, cap } => write!(
                f,
                "price {:.2} USD/h above cap {:.2}",
                *price as f64 / 1e6,
                *cap as f64 / 1e6
            ),
            Reject::RefusedRecently => write!(f, "refused or timed out an offer recently"),
            Reject::QueueCapped => write!(f, "the job's queue is at its quota cap at this site"),
            Reject::Busy {
                free_milli,
                needs_milli,
            } => write!(
                f,
                "busy: {:.3} devices free, needs {:.3}",
                *free_milli as f64 / 1000.0,
                *needs_milli as f64 / 1000.0
            ),
            Reject::EarlierTierFirst(t) => write!(f, "{} capacity is used first", t.as_str()),
            Reject::BurstHeld { remaining_ms } => write!(
                f,
                "cloud burst held for {:.1}s more (max_wait)",
                *remaining_ms as f64 / 1000.0
            ),
            Reject::Outscored => write!(f, "scored worse"),
        }
    }
}

/// One candidate of a decision.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    pub site: SiteId,
    pub tier: Tier,
    pub pool: Option<String>,
    pub terms: Option<Terms>,
    pub reject: Option<Reject>,
}

/// The chosen site, pool and devices.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Choice {
    pub site: SiteId,
    pub pool: String,
    pub tier: Tier,
    pub devices: Vec<DeviceShare>,
    pub terms: Terms,
}

/// Why a job waits.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Wait {
    /// No site could ever take the job as it stands; the nearest miss is named.
    NoSiteFits {
        nearest_miss: Option<(SiteId, String)>,
    },
    /// Sites that fit are busy; the job waits for capacity (and for `max_wait` before cloud burst).
    Busy { burst_in_ms: Option<u64> },
    /// The job's start window has not opened.
    NotBefore { at_ms: Millis },
    /// A deferrable job waits for a lower-carbon hour at the chosen site; its deadline still holds.
    Deferred {
        site: SiteId,
        until_ms: Millis,
        now_g_per_kwh: f64,
        then_g_per_kwh: f64,
    },
    /// A site could take the job now, but its queue's quota holds it (set by the reactor, not by `place`).
    Quota(String),
    /// Its tenant's budget holds it until the period ends (set by the reactor).
    Budget { why: String, until_ms: Millis },
}

impl Wait {
    /// When the job should be tried again even if nothing changes.
    pub fn retry_at(&self, now: Millis) -> Option<Millis> {
        match self {
            Wait::Busy {
                burst_in_ms: Some(ms),
            } => Some(now + ms),
            Wait::NotBefore { at_ms } => Some(*at_ms),
            Wait::Deferred { until_ms, .. } => Some(*until_ms),
            Wait::Budget { until_ms, .. } => Some(*until_ms),
            _ => None,
        }
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::NoSiteFits {
                nearest_miss: Some((s, why)),
            } => write!(f, "no site fits; nearest miss {s}: {why}"),
            Wait::NoSiteFits { nearest_miss: None } => write!(f, "no site fits; no sites known"),
            Wait::Busy {
                burst_in_ms: Some(ms),
            } => write!(
                f,
                "owned and partner sites busy; cloud burst allowed in {:.1}s",
                *ms as f64 / 1000.0
            ),
            Wait::Busy { burst_in_ms: None } => write!(f, "all sites that fit are busy"),
            Wait::NotBefore { at_ms } => write!(f, "start window opens at {at_ms}"),
            Wait::Deferred {
                site,
                until_ms,
                now_g_per_kwh,
                then_g_per_kwh,
            } => write!(
                f,
                "deferred to {until_ms} for lower carbon at {site}: {then_g_per_kwh:.0} instead of {now_g_per_kwh:.0} gCO2e/kWh; the deadline still holds"
            ),
            Wait::Quota(why) => f.write_str(why),
            Wait::Budget { why, until_ms } => {
                write!(f, "held until the budget period ends at {until_ms}: {why}")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    Place(Choice),
    Wait(Wait),
}

/// A placement decision with its explanation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Decision {
    pub at_ms: Millis,
    pub policy: std::borrow::Cow<'static, str>,
    pub weights: Weights,
    pub outcome: Outcome,
    pub candidates: Vec<Candidate>,
    /// Sites the index left out, by reason, with how many.
    pub pruned: Vec<(String, usize)>,
}

/// The weights a policy stands for (see the module docs).
pub fn weights(policy: &Policy) -> Weights {
    let w = |cost, energy, carbon, latency, data| Weights {
        cost,
        energy,
        carbon,
        latency,
        data,
    };
    match policy {
        Policy::Latency => w(0.01, 0.0, 0.0, 1.0, 0.0),
        Policy::Cost => w(1.0, 0.0, 0.01, 0.0, 0.0),
        Policy::Green => w(0.01, 0.2, 1.0, 0.0, 0.0),
        Policy::Balanced => w(1.0, 0.0, 1.0, 1.0, 0.5),
        Policy::Weights(x) => x.clone(),
    }
}

/// Term order of the single-criterion policies: the first term decides, the next ones only break ties
/// (indices into [`Terms::values`]: cost, energy, carbon, latency, data). `balanced` and explicit weights
/// choose by score.
fn lexicographic(policy: &Policy) -> Option<[usize; 3]> {
    match policy {
        Policy::Cost => Some([0, 2, 3]),
        Policy::Green => Some([2, 1, 0]),
        Policy::Latency => Some([3, 0, 2]),
        Policy::Balanced | Policy::Weights(_) => None,
    }
}

/// The policy a job is placed under.
pub fn policy_of(spec: &JobSpec) -> Policy {
    spec.policy.clone().unwrap_or(match spec.kind {
        JobKind::Inference => Policy::Latency,
        _ => Policy::Balanced,
    })
}

/// Places one job. Does no I/O and reads no clock.
///
/// With an index, only the sites it lists as having room now are evaluated; when none of them can take the
/// job, every site is evaluated so that the explanation of the wait is complete.
pub fn place(view: View<'_>, req: Request<'_>, now: Millis) -> Decision {
    if let Some(d) = view
        .index
        .and_then(|index| place_indexed(view, req, now, index))
    {
        return d;
    }
    if let Some(index) = view.index {
        let r = &req.spec.resources;
        let whole = if r.share().is_some() {
            0
        } else {
            r.count.saturating_mul(req.spec.replicas)
        };
        let ids = index.candidates(r.kind, whole, r.share());
        let listed = ids.len();
        let mut d = place_over(
            view,
            req,
            now,
            ids.into_iter().filter_map(|id| view.sites.get(id)),
        );
        if matches!(d.outcome, Outcome::Place(_)) {
            let of_kind = index.sites_of_kind(r.kind);
            d.pruned = vec![
                (
                    format!(
                        "no room in a {} pool now (lost, draining, busy or too small)",
                        r.kind.as_str()
                    ),
                    of_kind.saturating_sub(listed),
                ),
                (
                    format!("no {} pool", r.kind.as_str()),
                    view.sites.len().saturating_sub(of_kind),
                ),
            ];
            d.pruned.retain(|(_, n)| *n > 0);
            return d;
        }
    }
    place_over(view, req, now, view.sites.values())
}

/// Whether the job can run on this pool now, and its terms there if so.
fn ready_terms(
    view: View<'_>,
    req: Request<'_>,
    now: Millis,
    site: &Site,
    pool: &Pool,
    duration_ms: u64,
) -> Option<Terms> {
    let spec = req.spec;
    if site_reject(view, site, spec).is_some()
        || pool_reject(pool, spec).is_some()
        || req.refused.contains(site.id())
        || req
            .capped
            .iter()
            .any(|(s, p)| s == site.id() && p == &pool.name)
    {
        return None;
    }
    let runtime = view.throughput.runtime_ms(duration_ms, &pool.model);
    if spec.window.deadline_ms.is_some_and(|d| now + runtime > d) || fit_now(pool, spec).is_none() {
        return None;
    }
    Some(terms(
        view,
        site,
        pool,
        spec,
        &HashMap::new(),
        now,
        duration_ms,
    ))
}

/// Looks at one listed pool: records its site as examined and returns its terms if it can run the job now.
fn examine<'a>(
    view: View<'a>,
    req: Request<'_>,
    now: Millis,
    id: &'a SiteId,
    pool_name: &str,
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) -> Option<Terms> {
    let site = view.sites.get(id)?;
    let pool = site.pool(pool_name)?;
    if !examined.contains(&id) {
        examined.push(id);
    }
    ready_terms(view, req, now, site, pool, duration_ms)
}

/// One best-first list of pools with room: (lower bound of the term, site, pool), ascending by the bound.
type List<'a> = Box<dyn Iterator<Item = (f64, &'a SiteId, &'a str)> + 'a>;

/// The lists of a tier, per term index (0 cost, 2 carbon, 3 latency), for the terms the search uses.
fn lists<'a>(
    view: View<'a>,
    spec: &'a JobSpec,
    index: &'a SiteIndex,
    tier: Tier,
    terms_used: &[usize],
    duration_ms: u64,
) -> Vec<(usize, List<'a>)> {
    // A whole-job bound from a per-device-hour bound, with room for integer rounding.
    let scale = spec.total_milli() as f64 / 1000.0 * duration_ms as f64 / 3_600_000.0;
    let kind = spec.resources.kind;
    let mut out: Vec<(usize, List<'a>)> = Vec::new();
    for &term in terms_used {
        let list: List<'a> = match term {
            0 | 2 => {
                let objective = if term == 0 {
                    Objective::Cost
                } else {
                    Objective::Carbon
                };
                Box::new(
                    index
                        .ordered(kind, tier, objective)
                        .map(move |(b, id, p)| (b * scale * (1.0 - 1e-3) - 1.0, id, p)),
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
                        .nearest(kind, tier, super::index::unit_vector(reference))
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
    term: usize,
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) -> Option<f64> {
    let mut best: Option<f64> = None;
    for (lower, id, pool_name) in list {
        if best.is_some_and(|b| lower > b) {
            break;
        }
        if let Some(t) = examine(view, req, now, id, pool_name, duration_ms, examined) {
            let v = t.values()[term];
            best = Some(best.map_or(v, |b| b.min(v)));
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
///   the best exact score is below that.
///
/// The sites examined are then evaluated by `place_over`, in site-id order, so the decision and its
/// explanation are those of a full scan restricted to sites that can matter. Jobs with datasets, measured
/// user regions, a closed start window or a baseline ranking take the general path (`None`).
fn place_indexed<'a>(
    view: View<'a>,
    req: Request<'a>,
    now: Millis,
    index: &'a SiteIndex,
) -> Option<Decision> {
    let spec = req.spec;
    let policy = policy_of(spec);
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
    let lexicographic_term = match policy {
        Policy::Cost => Some(0),
        Policy::Green => Some(2),
        Policy::Latency => Some(3),
        _ => None,
    };
    if lexicographic_term.is_none() && w.energy > 0.0 {
        return None;
    }
    if lexicographic_term == Some(3) && spec.users.is_empty() {
        return None;
    }
    let ws = [w.cost, w.energy, w.carbon, w.latency, w.data];
    let used: Vec<usize> = match lexicographic_term {
        Some(t) => vec![t],
        None => [0usize, 2, 3]
            .into_iter()
            .filter(|t| ws[*t] > 0.0 && (*t != 3 || !spec.users.is_empty()))
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
        let mut best = [f64::NAN; 5];
        let mut found = true;
        for (term, list) in lists(view, spec, index, tier, &used, duration_ms) {
            match best_of(view, req, now, list, term, duration_ms, &mut examined) {
                Some(b) => best[term] = b,
                None => found = false,
            }
        }
        if !found {
            continue;
        }
        if lexicographic_term.is_none() && used.len() > 1 {
            threshold_search(
                view,
                req,
                now,
                index,
                tier,
                &used,
                &ws,
                &best,
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

/// Fagin's threshold algorithm over the tier's lists for a weighted score; adds every site it scores to
/// `examined`.
#[allow(clippy::too_many_arguments)]
fn threshold_search<'a>(
    view: View<'a>,
    req: Request<'a>,
    now: Millis,
    index: &'a SiteIndex,
    tier: Tier,
    used: &[usize],
    ws: &[f64; 5],
    best: &[f64; 5],
    duration_ms: u64,
    examined: &mut Vec<&'a SiteId>,
) {
    let score = |values: &[f64; 5], terms: &[usize]| -> f64 {
        terms
            .iter()
            .map(|&i| ws[i] * ((values[i].max(0.0) + FLOORS[i]) / (best[i] + FLOORS[i]) - 1.0))
            .sum()
    };
    let mut lists = lists(view, req.spec, index, tier, used, duration_ms);
    let mut frontier = [0.0f64; 5];
    let mut best_score = f64::INFINITY;
    let mut seen: std::collections::BTreeSet<(&SiteId, &str)> = std::collections::BTreeSet::new();
    loop {
        let mut advanced = false;
        for (term, list) in lists.iter_mut() {
            let Some((lower, id, pool_name)) = list.next() else {
                continue;
            };
            advanced = true;
            frontier[*term] = lower;
            if !seen.insert((id, pool_name)) {
                continue;
            }
            if let Some(t) = examine(view, req, now, id, pool_name, duration_ms, examined) {
                best_score = best_score.min(score(&t.values(), used));
            }
        }
        if !advanced || best_score < score(&frontier, used) {
            return;
        }
    }
}

fn place_over<'s>(
    view: View<'s>,
    req: Request<'_>,
    now: Millis,
    sites: impl Iterator<Item = &'s Site>,
) -> Decision {
    let spec = req.spec;
    let policy = policy_of(spec);
    if let Some(at_ms) = spec.window.start_after_ms.filter(|t| *t > now) {
        return Decision {
            at_ms: now,
            policy: req.baseline.map_or(policy.name(), Baseline::name).into(),
            weights: weights(&policy),
            outcome: Outcome::Wait(Wait::NotBefore { at_ms }),
            candidates: Vec::new(),
            pruned: Vec::new(),
        };
    }
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
            if nearest_miss.is_none() && !matches!(r, Reject::SiteLost | Reject::Draining) {
                nearest_miss = Some((site.id().clone(), r.to_string()));
            }
            candidates.push(base(None, r));
            continue;
        }
        let mut any_pool = false;
        for pool in site.pools.iter().filter(|p| p.kind == spec.resources.kind) {
            any_pool = true;
            if let Some(r) = pool_reject(pool, spec) {
                nearest_miss.get_or_insert_with(|| (site.id().clone(), r.to_string()));
                candidates.push(base(Some(pool), r));
                continue;
            }
            if let Some(deadline) = spec.window.deadline_ms {
                let finish = now + view.throughput.runtime_ms(duration_ms, &pool.model);
                if finish > deadline {
                    let r = Reject::MissesDeadline {
                        late_by_ms: finish - deadline,
                    };
                    nearest_miss.get_or_insert_with(|| (site.id().clone(), r.to_string()));
                    candidates.push(base(Some(pool), r));
                    continue;
                }
            }
            if req.refused.contains(site.id()) {
                candidates.push(base(Some(pool), Reject::RefusedRecently));
                continue;
            }
            if req
                .capped
                .iter()
                .any(|(s, p)| s == site.id() && p == &pool.name)
            {
                candidates.push(base(Some(pool), Reject::QueueCapped));
                continue;
            }
            let terms = terms(view, site, pool, spec, &egress, now, duration_ms);
            match fit_now(pool, spec) {
                Some(devices) => {
                    ready.push((candidates.len(), devices));
                    candidates.push(Candidate {
                        terms: Some(terms),
                        reject: None,
                        ..base(Some(pool), Reject::Outscored)
                    });
                }
                None => candidates.push(Candidate {
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
            policy: req.baseline.map_or(policy.name(), Baseline::name).into(),
            weights: w,
            outcome: Outcome::Wait(wait),
            candidates,
            pruned: Vec::new(),
        };
    };

    // Normalise among the ready candidates of the chosen tier.
    let in_tier: Vec<&(usize, Vec<DeviceShare>)> =
        ready.iter().filter(|(i, _)| tier_of(*i) == tier).collect();
    let mut best = [f64::INFINITY; 5];
    for (i, _) in &in_tier {
        if let Some(t) = &candidates[*i].terms {
            for (b, v) in best.iter_mut().zip(t.values()) {
                *b = b.min(v);
            }
        }
    }
    let ws = [w.cost, w.energy, w.carbon, w.latency, w.data];
    let order = lexicographic(&policy);
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
        let score: f64 = t
            .values()
            .iter()
            .zip(best)
            .zip(FLOORS)
            .zip(ws)
            .map(|(((v, b), f), w)| w * ((v + f) / (b + f) - 1.0))
            .sum();
        t.score = score;
        let values = t.values();
        let key: Vec<f64> = match (req.baseline, order) {
            (Some(_), _) => base_key.clone().unwrap_or_default(),
            (None, Some(o)) => o.iter().map(|k| values[*k]).collect(),
            (None, None) => vec![score],
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
        let pool = c.pool.as_deref().and_then(|p| site.pool(p))?;
        let weighs_carbon =
            req.baseline.is_none() && matches!(policy, Policy::Green | Policy::Balanced);
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
            policy: policy.name().into(),
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
                terms: c.terms.clone().unwrap_or_else(unreachable_terms),
            })
        }
        None => Outcome::Wait(Wait::Busy { burst_in_ms: None }),
    };
    Decision {
        at_ms: now,
        policy: req.baseline.map_or(policy.name(), Baseline::name).into(),
        weights: w,
        outcome,
        candidates,
        pruned: Vec::new(),
    }
}

/// Hours ahead a deferrable job looks for a cleaner start (the length of an advertised forecast).
pub const DEFER_HORIZON_H: u64 = 72;
/// A later start must cut the run's mean grid intensity by at least this share to be worth waiting for.
pub const DEFER_MIN_SAVING: f64 = 0.10;

/// The cleaner start for a deferrable run at `site`: the whole hour, up to [`DEFER_HORIZON_H`] ahead and no
/// later than `deadline − runtime`, whose forecast mean intensity over the run is lowest, if it beats starting
/// now by [`DEFER_MIN_SAVING`].
fn defer(site: &Site, runtime_ms: u64, now: Millis, deadline: Millis) -> Option<Wait> {
    const HOUR: u64 = 3_600_000;
    let latest = deadline.checked_sub(runtime_ms)?;
    let now_g = site.mean_intensity(now, runtime_ms);
    let mut best: Option<(Millis, f64)> = None;
    let mut t = now - now % HOUR + HOUR;
    while t <= latest && t <= now + DEFER_HORIZON_H * HOUR {
        let g = site.mean_intensity(t, runtime_ms);
        if best.is_none_or(|(_, b)| g < b) {
            best = Some((t, g));
        }
        t += HOUR;
    }
    let (until_ms, then_g) = best?;
    (then_g < now_g * (1.0 - DEFER_MIN_SAVING)).then(|| Wait::Deferred {
        site: site.id().clone(),
        until_ms,
        now_g_per_kwh: now_g,
        then_g_per_kwh: then_g,
    })
}

fn unreachable_terms() -> Terms {
    Terms {
        cost_micro_usd: 0,
        energy_wh: 0,
        co2_g: 0,
        latency_ms: 0.0,
        data_bytes_moved: 0,
        score: f64::NAN,
    }
}

/// The ranking key of a baseline (lower wins).
fn baseline_key(view: View<'_>, c: &Candidate, b: Baseline, latency_ms: f64) -> Vec<f64> {
    let site = view.sites.get(&c.site);
    let pool = site.and_then(|s| c.pool.as_deref().and_then(|p| s.pool(p)));
    match (b, site, pool) {
        (Baseline::FifoFirstFit, _, _) => vec![0.0],
        (Baseline::Nearest, _, _) => vec![latency_ms],
        (Baseline::Cheapest, _, Some(p)) => vec![p.price_micro_usd_per_hour as f64],
        (Baseline::Greenest, Some(s), _) => vec![f64::from(s.info.carbon.g_per_kwh) * s.info.pue],
        _ => vec![f64::INFINITY],
    }
}

/// Site-level hard constraints.
fn site_reject(view: View<'_>, site: &Site, spec: &JobSpec) -> Option<Reject> {
    let c = &spec.constraints;
    if !site.up {
        return Some(Reject::SiteLost);
    }
    if site.draining() {
        return Some(Reject::Draining);
    }
    if !c.tiers.is_empty() && !c.tiers.contains(&site.tier()) {
        return Some(Reject::TierNotAllowed(site.tier()));
    }
    if !c.sites.is_empty() && !c.sites.contains(site.id()) {
        return Some(Reject::SiteNotAllowed);
    }
    if let Some(region) = &c.residency {
        if view.regions.contains(region, site.info.location) != Some(true) {
            return Some(Reject::OutsideResidency(region.clone()));
        }
    }
    spec.datasets
        .iter()
        .find(|d| d.locality == Locality::Must && !site.holds_dataset(&d.name))
        .map(|d| Reject::MissingDataset(d.name.clone()))
}

/// Pool-level hard constraints (the job's shape, not the pool's current load).
fn pool_reject(pool: &Pool, spec: &JobSpec) -> Option<Reject> {
    let r = &spec.resources;
    if !pool.model_allowed(&r.models) {
        return Some(Reject::ModelNotAllowed(pool.model.clone()));
    }
    if let Some(need) = r.memory_mib {
        if pool.memory_mib < need {
            return Some(Reject::TooLittleMemory {
                has_mib: pool.memory_mib,
                needs_mib: need,
            });
        }
    }
    match &r.mig {
        Some(profile) if !pool.mig_profiles.iter().any(|p| p == profile) => {
            return Some(Reject::NoMigProfile(profile.clone()));
        }
        None if r.milli.is_some() && !pool.milli_sharing => return Some(Reject::NoMilliSharing),
        _ => {}
    }
    let needs_devices = match r.share() {
        Some(_) => 1,
        None => u64::from(r.count) * u64::from(spec.replicas),
    };
    if r.same_node && u64::from(pool.devices_per_node) < needs_devices {
        return Some(Reject::NodeTooSmall {
            per_node: pool.devices_per_node,
            needs: needs_devices,
        });
    }
    if (pool.healthy_devices() as u64) < needs_devices {
        return Some(Reject::TooFewDevices {
            has: pool.healthy_devices(),
            needs: needs_devices,
        });
    }
    if let Some(cap) = spec.constraints.price_cap_micro_usd_per_hour {
        if pool.price_micro_usd_per_hour > cap {
            return Some(Reject::PriceAboveCap {
                price: pool.price_micro_usd_per_hour,
                cap,
            });
        }
    }
    None
}

/// Devices for the job if the pool can take it now. Whole devices: the lowest-numbered free ones. Shares:
/// best fit, the device with the least free room that still holds the share, to keep whole devices free.
pub fn fit_now(pool: &Pool, spec: &JobSpec) -> Option<Vec<DeviceShare>> {
    if spec.resources.same_node {
        // The first node (in index order) that holds the whole job.
        let per = pool.devices_per_node.max(1) as usize;
        return pool
            .devices
            .chunks(per)
            .find_map(|node| fit_devices(node, spec));
    }
    fit_devices(&pool.devices, spec)
}

fn fit_devices(devices: &[super::model::Device], spec: &JobSpec) -> Option<Vec<DeviceShare>> {
    let r = &spec.resources;
    match r.share() {
        None => {
            let need = (r.count as usize) * (spec.replicas as usize);
            let devices: Vec<DeviceShare> = devices
                .iter()
                .filter(|d| d.free_milli() == 1000)
                .take(need)
                .map(|d| DeviceShare {
                    index: d.index,
                    milli: 1000,
                })
                .collect();
            (devices.len() == need).then_some(devices)
        }
        Some(share) => {
            let mut free: Vec<(u32, u32)> =
                devices.iter().map(|d| (d.index, d.free_milli())).collect();
            let mut out: Vec<DeviceShare> = Vec::new();
            for _ in 0..spec.replicas {
                let slot = free
                    .iter_mut()
                    .filter(|(_, f)| *f >= share)
                    .min_by_key(|(i, f)| (*f, *i))?;
                slot.1 -= share;
                match out.iter_mut().find(|d| d.index == slot.0) {
                    Some(d) => d.milli += share,
                    None => out.push(DeviceShare {
                        index: slot.0,
                        milli: share,
                    }),
                }
            }
            Some(out)
        }
    }
}

/// For each `prefer` dataset of the job, the lowest egress price (micro-USD per GB) among up sites holding it.
fn cheapest_egress(sites: &BTreeMap<SiteId, Site>, spec: &JobSpec) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    if spec.datasets.is_empty() {
        return out;
    }
    for need in &spec.datasets {
        let price = sites
            .values()
            .filter(|s| s.up && s.holds_dataset(&need.name))
            .map(|s| s.info.egress_micro_usd_per_gb)
            .min();
        if let Some(p) = price {
            out.insert(need.name.clone(), p);
        }
    }
    out
}

fn terms(
    view: View<'_>,
    site: &Site,
    pool: &Pool,
    spec: &JobSpec,
    egress: &HashMap<String, u64>,
    now: Millis,
    duration_ms: u64,
) -> Terms {
    // The expected duration is for the reference model; this pool's model runs it faster or slower.
    let duration_ms = view.throughput.runtime_ms(duration_ms, &pool.model);
    let intensity = site.mean_intensity(now, duration_ms).round() as u32;
    let rates: Rates = site.rates(pool, intensity);
    let run = metering::amounts(&rates, spec.total_milli(), duration_ms);
    let mut data_bytes = 0u64;
    let mut egress_cost = 0u64;
    for need in spec
        .datasets
        .iter()
        .filter(|d| !site.holds_dataset(&d.name))
    {
        data_bytes = data_bytes.saturating_add(need.size_bytes);
        let per_gb = egress.get(&need.name).copied().unwrap_or(0);
        egress_cost = egress_cost.saturating_add(
            (u128::from(need.size_bytes) * u128::from(per_gb) / 1_000_000_000) as u64,
        );
    }
    Terms {
        cost_micro_usd: run.cost_micro_usd.saturating_add(egress_cost),
        energy_wh: run.energy_wh,
        co2_g: run.co2_g,
        latency_ms: user_latency(view.rtt, site, spec),
        data_bytes_moved: data_bytes,
        score: f64::NAN,
    }
}

/// Weighted mean round trip from the job's users to the site; 0 when the job names no users.
pub fn user_latency(rtt: &RttTable, site: &Site, spec: &JobSpec) -> f64 {
    let total: f64 = spec.users.iter().map(|u| u.weight).sum();
    if total <= 0.0 {
        return 0.0;
    }
    spec.users
        .iter()
        .map(|u| {
            u.weight
                * latency::rtt_ms(
                    rtt,
                    u.location,
                    u.rtt_region.as_deref(),
                    site.info.location,
                    site.info.rtt_region.as_deref(),
                )
        })
        .sum::<f64>()
        / total
}
