//! The autoscaler of inference services: from the demand seen at each user location, how many replicas of a
//! service each site's pool should run, and when a change of that number is made.
//!
//! Two pure steps. [`desired`] says where replicas should be now: every location with demand is served by
//! offers (a site's pool, on-demand or spot) within the service's round-trip SLO — owned first, then partner,
//! then cloud, and within a tier by the service's policy (see [`Objective`]) — with each replica loaded to at
//! most the target utilisation; spare throughput of a replica already wanted is used before a new one is added.
//! A location no offer reaches within the SLO is served by the nearest offer with room (outside the SLO, and
//! said so). [`Scaler::step`] turns the desired counts into targets with the delays as hysteresis: up per
//! location (a location is planned for the lowest level its demand kept over the whole scale-up delay; new demand,
//! and demand back at a level planned for within the scale-down delay, at once), down per service (the replicas
//! stay while the plan's total is below the most it wanted within the scale-down delay, kept where the plan
//! wanted them; a move keeps nothing); a location left without any replica in reach is covered at once, and one
//! whose demand stopped stays covered for a scale-down delay; nothing is removed while a replica of the service
//! is still starting (make before break), nor before a full scale-down window of demand has been seen (after a
//! deployment, a restart or a takeover).

use crate::latency::{rtt_ms, RttTable};
use crate::placement::{never_fits, View};
use crate::Millis;
use meridian_federation::{GeoPoint, JobSpec, Policy, PoolName, SiteId, Tier};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The premium over a location's cheapest offer that `balanced` may spend for less carbon (as the job policy's
/// knee, [`crate::placement::BALANCED_MAX_PREMIUM`]).
pub const BALANCED_PREMIUM: f64 = crate::placement::BALANCED_MAX_PREMIUM;

mod deployed;
mod offers;
mod packing;
mod plan;
mod routes;
mod scaler;
#[cfg(test)]
mod tests;

pub use deployed::{
    settings, Autoscaler, Key as ServiceKey, EVERY_MS, SPOT_HOLD_MS, STALE_MS, STUCK_MS,
};
pub use offers::*;
use packing::*;
pub use plan::*;
pub use routes::*;
pub use scaler::*;

/// The demand of one user location over the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocationDemand {
    pub name: String,
    pub location: GeoPoint,
    pub rtt_region: Option<String>,
    /// Demand in the service's unit per second.
    pub rate: f64,
}

/// How a service chooses among the offers within its SLO, per unit of throughput, after the tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Objective {
    /// The lowest USD, then the least carbon.
    Cost,
    /// The least carbon, then the lowest USD.
    Carbon,
    /// The lowest `USD + price × tCO2e`.
    CarbonPrice(f64),
    /// `balanced` (premium [`BALANCED_PREMIUM`]) and `max_cost_premium` (its own): among the offers costing at
    /// most `1 + premium` times the location's cheapest, the lowest `cost / cost₀ + CO2 / CO2₀` (the cheapest
    /// offer's figures): a per cent of money against a per cent of carbon, as jobs under these policies are
    /// placed.
    Knee(f64),
    /// The nearest, then the lowest USD.
    Latency,
}

impl Objective {
    /// The objective of a policy. Explicit weights are for jobs; a service states a trade-off instead.
    pub fn of(policy: &Policy) -> Result<Self, String> {
        Ok(match policy {
            Policy::Cost => Objective::Cost,
            Policy::Green => Objective::Carbon,
            Policy::Balanced => Objective::Knee(BALANCED_PREMIUM),
            Policy::Latency => Objective::Latency,
            Policy::CarbonPriceUsdPerT(p) => Objective::CarbonPrice(*p),
            Policy::MaxCostPremium(p) => Objective::Knee(*p),
            Policy::Weights(_) => {
                return Err("a service takes cost, green, balanced, latency, \
                     carbon_price_usd_per_t or max_cost_premium, not weights"
                    .to_owned())
            }
        })
    }
}

/// A service's scaling settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub slo_ms: f64,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// The share of a replica's throughput it is loaded to (headroom for bursts), in (0, 1].
    pub utilization: f64,
    pub objective: Objective,
    pub up_delay_ms: u64,
    pub down_delay_ms: u64,
    /// Each location's demand is the mean of what was measured over this sliding window.
    pub window_ms: u64,
}
