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
//! that keeps the ratio finite when the best is 0 ([`Term::floor`]: 1 cent, 1 Wh, 1 g, 10 ms — round trips within a metro area are alike — 1 GB). So `n` is 0 for
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
//! carbon); their weights above give the score shown in explanations. Explicit weights choose the lowest score.
//! `balanced` (from durable format 4, [`Rule::Knee`]) chooses among the candidates costing at most
//! [`BALANCED_MAX_PREMIUM`] more than the cheapest the lowest `cost/cost₀ + CO2/CO2₀` (+ the latency and data
//! terms as weighted above), with `cost₀`, `CO2₀` the cheapest candidate's: each term counts as a share of the
//! job's own cheapest bill and footprint, not by how much it varies across sites (in earlier formats it is the
//! weighted score, which let carbon, the term that varies most, decide). `{ carbon_price_usd_per_t = P }` chooses
//! the lowest `cost + P × CO2` (at `P = 0`, from durable format 9, exactly `cost`: its tie-breaks, no
//! deferral); `{ max_cost_premium = F }` is `balanced`'s rule at premium `F` (from durable
//! format 7; before, the least carbon within `1 + F` times the cheapest cost). A job without a policy gets
//! `latency` if it is an inference job, else `balanced`.
//!
//! ## Time
//! A job whose start window has not opened waits for it. A candidate on which the job, started now, would
//! finish after its deadline is rejected. A job with a deadline placed under `green`, `balanced` or a carbon policy may be
//! deferred: if a later whole hour (within the site's forecast, and early enough to meet the deadline) cuts the
//! run's mean grid intensity at the chosen site by at least 10%, the job waits for that hour.
//!
//! ## Spill-over
//! Owned sites first, then partner sites; cloud sites only when no owned or partner site can take the job now
//! and the job has waited its `max_wait_s`.

mod baseline;
mod defer;
mod filters;
mod indexed;
mod scan;
mod terms;

pub use baseline::Baseline;
pub use defer::{DEFER_HORIZON_H, DEFER_MIN_SAVING};
pub use filters::{fit_now, never_fits};
pub use terms::user_latency;
pub use terms::{
    Rule, Spent, Term, Terms, BALANCED_MAX_PREMIUM, BALANCED_MAX_PREMIUM_PER_JOB, KNEE_FORMAT,
    PREMIUM_KNEE_FORMAT, ZERO_PRICE_FORMAT,
};

use crate::index::SiteIndex;
use crate::latency::RttTable;
use crate::model::Site;
use crate::regions::Regions;
use crate::throughput::Throughput;
use crate::Millis;
use indexed::place_indexed;
use meridian_federation::{
    AcceleratorKind, BackendKind, DeviceShare, JobKind, JobSpec, ModelName, Policy, PoolName,
    SiteId, Tier, Weights,
};
use scan::place_over;
use std::collections::BTreeMap;
use std::fmt;

/// Expected run time when a job gives none, seconds.
pub const DEFAULT_DURATION_S: u64 = 3600;

/// Everything placement reads.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub sites: &'a BTreeMap<SiteId, Site>,
    pub rtt: &'a RttTable,
    pub regions: &'a Regions,
    pub throughput: &'a Throughput,
    /// Where present, only the sites it lists as having room are scored; the rest are counted as pruned.
    pub index: Option<&'a SiteIndex>,
    /// The durable format in force: it decides the rules a policy stands for ([`Rule::of`]), so that a journal
    /// replays under the rules it was written under.
    pub format: u32,
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
    pub capped: &'a [(SiteId, PoolName)],
    /// Rank by a simple baseline instead of the job's policy (the simulator's comparisons).
    pub baseline: Option<Baseline>,
    /// What the tenant's jobs under this job's premium rule have spent so far (rules without a premium ignore
    /// it; none = nothing yet).
    pub spent: Spent,
    /// The policy of the job's queue, for a job that names none.
    pub queue_policy: Option<&'a Policy>,
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
    /// The job asks for a backend (`run.adapter`) the site does not run.
    Backend {
        wants: BackendKind,
        has: BackendKind,
    },
    NoPoolOfKind(AcceleratorKind),
    ModelNotAllowed(ModelName),
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
    /// The job runs on spot capacity and the pool sells none.
    NoSpot,
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
            Reject::Backend { wants, has } => write!(
                f,
                "runs its work on backend {}, the job asks for {}",
                has.as_str(),
                wants.as_str()
            ),
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
            Reject::NoSpot => write!(f, "pool sells no spot capacity"),
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
    pub pool: Option<PoolName>,
    pub terms: Option<Terms>,
    pub reject: Option<Reject>,
}

/// The chosen site, pool and devices.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Choice {
    pub site: SiteId,
    pub pool: PoolName,
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
            Wait::NotBefore { at_ms } => {
                write!(f, "start window opens at {}", crate::utc(*at_ms))
            }
            Wait::Deferred {
                site,
                until_ms,
                now_g_per_kwh,
                then_g_per_kwh,
            } => write!(
                f,
                "deferred to {} for lower carbon at {site}: {then_g_per_kwh:.0} instead of {now_g_per_kwh:.0} gCO2e/kWh; the deadline still holds",
                crate::utc(*until_ms)
            ),
            Wait::Quota(why) => f.write_str(why),
            Wait::Budget { why, until_ms } => {
                write!(
                    f,
                    "held until the budget period ends at {}: {why}",
                    crate::utc(*until_ms)
                )
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
        // Their rules rank by money and carbon themselves ([`Rule`]); these weights give the score of the
        // other candidates in an explanation.
        Policy::CarbonPriceUsdPerT(_) | Policy::MaxCostPremium(_) => w(1.0, 0.0, 1.0, 0.0, 0.0),
    }
}

/// The policy a job is placed under: its own, else its queue's, else `latency` for inference and `balanced`
/// for other work.
pub fn policy_of(spec: &JobSpec, queue_policy: Option<&Policy>) -> Policy {
    spec.policy
        .clone()
        .or_else(|| queue_policy.cloned())
        .unwrap_or(match spec.kind {
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
