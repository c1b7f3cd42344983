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

/// Where a group of interchangeable replicas runs: one pool of one site, on-demand or spot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ReplicaKey {
    pub site: SiteId,
    pub pool: PoolName,
    pub spot: bool,
}

impl std::fmt::Display for ReplicaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.site, self.pool)?;
        if self.spot {
            write!(f, " (spot)")?;
        }
        Ok(())
    }
}

/// A pool that can run replicas of the service, with what one replica there costs and serves.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    pub key: ReplicaKey,
    pub tier: Tier,
    pub location: GeoPoint,
    pub rtt_region: Option<String>,
    /// The most replicas of this service the pool can hold, those it runs now included.
    pub room: u32,
    pub usd_per_hour: f64,
    /// Power drawn by one replica with the site's overhead: power × share × PUE, kW.
    pub kw: f64,
    /// Grams of CO2e per hour of one replica: `kw` × grid intensity.
    pub g_co2_per_hour: f64,
    /// Demand one replica here serves at full throughput, in the service's unit (requests/s or tokens/s).
    pub capacity: f64,
}

impl Offer {
    fn usd_per_unit(&self) -> f64 {
        self.usd_per_hour / self.capacity.max(1e-9)
    }

    fn g_per_unit(&self) -> f64 {
        self.g_co2_per_hour / self.capacity.max(1e-9)
    }
}

/// The offers of the sites in `view` for a replica whose job is `replica` and which serves `per_replica` (in the
/// service's unit) on the reference model: one per pool it can run on, and a second one at the spot price where
/// the pool has one and `spot` is allowed. `room` is what the pool holds in all (its healthy devices); the
/// caller takes off what other work uses. Grid intensity is the site's current figure.
pub fn offers(view: View<'_>, replica: &JobSpec, per_replica: f64, spot: bool) -> Vec<Offer> {
    let share = replica.resources.milli_per_replica().max(1);
    let mut out = Vec::new();
    for site in view.sites.values() {
        if !site.up || site.draining() {
            continue;
        }
        for pool in &site.pools {
            if never_fits(view, site, pool, replica).is_some() {
                continue;
            }
            let room: u64 = match replica.resources.share() {
                Some(_) => pool
                    .devices
                    .iter()
                    .filter(|d| d.healthy)
                    .map(|_| 1000 / share)
                    .sum(),
                None => pool.healthy_devices() as u64 / u64::from(replica.resources.count.max(1)),
            };
            if room == 0 {
                continue;
            }
            let devices = share as f64 / 1000.0;
            let kw = f64::from(pool.power_watts) * devices * site.info.pue / 1000.0;
            let g = kw * f64::from(site.info.carbon.g_per_kwh);
            let mut prices = vec![(false, pool.price_micro_usd_per_hour)];
            if let Some(p) = pool.spot_price_micro_usd_per_hour.filter(|_| spot) {
                prices.push((true, p));
            }
            for (is_spot, price) in prices {
                if replica
                    .constraints
                    .price_cap_micro_usd_per_hour
                    .is_some_and(|cap| price > cap)
                {
                    continue;
                }
                out.push(Offer {
                    key: ReplicaKey {
                        site: site.id().clone(),
                        pool: pool.name.clone(),
                        spot: is_spot,
                    },
                    tier: site.tier(),
                    location: site.info.location,
                    rtt_region: site.info.rtt_region.clone(),
                    room: u32::try_from(room).unwrap_or(u32::MAX),
                    usd_per_hour: price as f64 / 1e6 * devices,
                    kw,
                    g_co2_per_hour: g,
                    capacity: per_replica * view.throughput.factor(&pool.model),
                });
            }
        }
    }
    out
}

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

/// Where replicas should be now, and who each serves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    pub replicas: BTreeMap<ReplicaKey, u32>,
    /// Per location (input order): the offers (indices) within the SLO, best first.
    pub reach: Vec<Vec<usize>>,
    /// Per location: the offers serving it and the rate each takes.
    pub served: Vec<Vec<(usize, f64)>>,
    /// Per location: demand no offer could take (every one in reach was full).
    pub unserved: Vec<f64>,
    /// Per location: served outside the SLO, because no offer is within it.
    pub beyond_slo: Vec<bool>,
}

fn tier_rank(t: Tier) -> u8 {
    match t {
        Tier::Owned => 0,
        Tier::Partner => 1,
        Tier::Cloud => 2,
    }
}

/// An offer as a location sees it: its round trip and what a unit of throughput costs there (USD and grams).
#[derive(Clone, Copy, Debug)]
struct Cand {
    i: usize,
    rtt: f64,
    usd: f64,
    g: f64,
}

impl Cand {
    /// At the offer's own rates per unit of throughput.
    fn of(offers: &[Offer], i: usize, rtt: f64) -> Self {
        Cand {
            i,
            rtt,
            usd: offers[i].usd_per_unit(),
            g: offers[i].g_per_unit(),
        }
    }
}

/// The candidates, best first under `objective` (tier first).
fn preference(offers: &[Offer], within: &[Cand], objective: Objective) -> Vec<usize> {
    let mut out = Vec::with_capacity(within.len());
    for tier in Tier::ALL {
        let mut group: Vec<Cand> = within
            .iter()
            .copied()
            .filter(|c| offers[c.i].tier == tier)
            .collect();
        if group.is_empty() {
            continue;
        }
        let cheapest = group
            .iter()
            .min_by(|a, b| a.usd.total_cmp(&b.usd).then(a.g.total_cmp(&b.g)))
            .map(|c| (c.usd, c.g))
            .unwrap_or((1.0, 1.0));
        let key = |c: &Cand| -> [f64; 3] {
            let over = |p: f64| {
                if c.usd <= cheapest.0 * (1.0 + p) + 1e-12 {
                    0.0
                } else {
                    1.0
                }
            };
            match objective {
                Objective::Cost => [c.usd, c.g, c.rtt],
                Objective::Carbon => [c.g, c.usd, c.rtt],
                Objective::CarbonPrice(p) => [c.usd + p * c.g / 1e6, c.rtt, 0.0],
                Objective::Knee(p) => [
                    over(p),
                    c.usd / cheapest.0.max(1e-12) + c.g / cheapest.1.max(1e-12),
                    c.rtt,
                ],
                Objective::Latency => [c.rtt, c.usd, c.g],
            }
        };
        // Spot first where the service allows it (its offers exist only then), as a spot-first autoscaler
        // does: on-demand is the fallback.
        group.sort_by(|a, b| {
            let (ka, kb) = (key(a), key(b));
            let spot_first = offers[b.i].key.spot.cmp(&offers[a.i].key.spot);
            spot_first.then_with(|| {
                ka.iter()
                    .zip(kb.iter())
                    .map(|(x, y)| x.total_cmp(y))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(offers[a.i].key.cmp(&offers[b.i].key))
            })
        });
        out.extend(group.into_iter().map(|c| c.i));
    }
    out
}

/// How much better (under the objective, per unit served) an offer must be than one whose replicas run now for
/// new replicas to go there instead: without it, every small change of demand would move replicas between pools
/// of nearly the same worth, each move paying a replica's start-up.
pub const STICKINESS: f64 = 0.15;

/// The factor an offer's figures are counted at when `wanted` of its replicas are planned and `running` run:
/// 1 while the replicas planned are running ones, `1 + STICKINESS` beyond.
fn stickiness(running: u32, wanted: u32) -> f64 {
    if running >= wanted {
        1.0
    } else {
        1.0 + STICKINESS
    }
}

/// Adds `amount` of a location's demand to what offer `i` serves of it.
fn add_served(served: &mut Vec<(usize, f64)>, i: usize, amount: f64) {
    match served.iter_mut().find(|(j, _)| *j == i) {
        Some(entry) => entry.1 += amount,
        None => served.push((i, amount)),
    }
}

/// Where replicas should be for `demand` (see the module's description).
pub fn desired(
    offers: &[Offer],
    demand: &[LocationDemand],
    rtt: &RttTable,
    s: &Settings,
) -> Desired {
    desired_from(offers, demand, rtt, s, &BTreeMap::new())
}

/// [`desired`], given the replicas that run now (`running`, per key): new replicas go to an offer with running
/// replicas not yet wanted unless another is better by more than [`STICKINESS`].
pub fn desired_from(
    offers: &[Offer],
    demand: &[LocationDemand],
    rtt: &RttTable,
    s: &Settings,
    running: &BTreeMap<ReplicaKey, u32>,
) -> Desired {
    let util = s.utilization.clamp(0.05, 1.0);
    let n = demand.len();
    let mut out = Desired {
        replicas: BTreeMap::new(),
        reach: vec![Vec::new(); n],
        served: vec![Vec::new(); n],
        unserved: vec![0.0; n],
        beyond_slo: vec![false; n],
    };
    let mut rtts: Vec<Vec<f64>> = Vec::with_capacity(n);
    for (l, d) in demand.iter().enumerate() {
        let row: Vec<f64> = offers
            .iter()
            .map(|o| {
                rtt_ms(
                    rtt,
                    d.location,
                    d.rtt_region.as_deref(),
                    o.location,
                    o.rtt_region.as_deref(),
                )
            })
            .collect();
        let within: Vec<Cand> = row
            .iter()
            .enumerate()
            .filter(|(_, r)| **r <= s.slo_ms)
            .map(|(i, r)| Cand::of(offers, i, *r))
            .collect();
        out.reach[l] = preference(offers, &within, s.objective);
        rtts.push(row);
    }
    // Replicas wanted and demand assigned, per offer; a pool's on-demand and spot offers share its room.
    let pools = Pools::of(offers);
    let runs: Vec<u32> = offers
        .iter()
        .map(|o| running.get(&o.key).copied().unwrap_or(0))
        .collect();
    let mut count = vec![0u32; offers.len()];
    let mut load = vec![0.0f64; offers.len()];
    // The most constrained locations first, then the largest.
    let mut order: Vec<usize> = (0..n).filter(|l| demand[*l].rate > 0.0).collect();
    order.sort_by(|a, b| {
        out.reach[*a]
            .len()
            .cmp(&out.reach[*b].len())
            .then(demand[*b].rate.total_cmp(&demand[*a].rate))
            .then(a.cmp(b))
    });
    let spare = |i: usize, count: &[u32], load: &[f64]| {
        (f64::from(count[i]) * offers[i].capacity * util - load[i]).max(0.0)
    };
    for l in order {
        let mut left = demand[l].rate;
        let mut candidates = out.reach[l].clone();
        if candidates.is_empty() {
            // Nothing within the SLO: the nearest offer with room serves, outside it.
            out.beyond_slo[l] = true;
            let mut by_rtt: Vec<usize> = (0..offers.len()).collect();
            by_rtt.sort_by(|a, b| rtts[l][*a].total_cmp(&rtts[l][*b]).then(a.cmp(b)));
            candidates = by_rtt;
        }
        // Throughput already wanted elsewhere first, then new replicas at the best offers.
        for &i in &candidates {
            let take = spare(i, &count, &load).min(left);
            if take > 0.0 {
                load[i] += take;
                out.served[l].push((i, take));
                left -= take;
            }
        }
        // Then new replicas, an offer at a time: within the SLO, the best by its rates per unit of throughput,
        // those with running replicas not yet wanted counted [`STICKINESS`] better (and taken up to those);
        // outside it, the nearest.
        while left > 1e-12 {
            let open = |i: usize| offers[i].capacity > 0.0 && pools.free(i, &count) > 0;
            let next = if out.beyond_slo[l] {
                candidates.iter().copied().find(|i| open(*i))
            } else {
                let options: Vec<Cand> = candidates
                    .iter()
                    .copied()
                    .filter(|i| open(*i))
                    .map(|i| {
                        let c = Cand::of(offers, i, rtts[l][i]);
                        let f = stickiness(runs[i], count[i] + 1);
                        Cand {
                            usd: c.usd * f,
                            g: c.g * f,
                            ..c
                        }
                    })
                    .collect();
                preference(offers, &options, s.objective).first().copied()
            };
            let Some(i) = next else { break };
            let per = offers[i].capacity * util;
            let mut more = ((left / per).ceil() as u32).min(pools.free(i, &count));
            if runs[i] > count[i] && !out.beyond_slo[l] {
                more = more.min(runs[i] - count[i]);
            }
            count[i] += more;
            let take = spare(i, &count, &load).min(left);
            load[i] += take;
            left -= take;
            add_served(&mut out.served[l], i, take);
        }
        out.unserved[l] = left.max(0.0);
    }
    let mut packing = Packing {
        offers,
        pools: &pools,
        runs: &runs,
        reach: &out.reach,
        served: &mut out.served,
        count: &mut count,
        load: &mut load,
        util,
        objective: s.objective,
        removal_rank: positions(&removal_order(offers, s.objective)),
    };
    packing.consolidate();
    packing.right_size();
    packing.consolidate();
    clamp_total(offers, &pools, demand, &rtts, s, &mut count);
    for (i, c) in count.iter().enumerate() {
        if *c > 0 {
            *out.replicas.entry(offers[i].key.clone()).or_default() += c;
        }
    }
    out
}

/// Demand moved by [`Packing`]: (location, to offer, amount).
type Move = (usize, usize, f64);

/// The replicas wanted and the demand each serves, as placing location by location left them, and the two
/// passes that tighten them. Placing location by location leaves each pool's last replica part empty: where
/// other replicas wanted have spare throughput within the SLO of the locations a last replica serves, it is
/// given up ([`Packing::consolidate`]); where a small replica elsewhere within reach serves what a large one
/// would mostly idle for, for less under the objective, it takes its place ([`Packing::right_size`]). Demand
/// served outside the SLO stays where it is.
struct Packing<'a> {
    offers: &'a [Offer],
    pools: &'a Pools,
    /// Per offer: replicas running now.
    runs: &'a [u32],
    reach: &'a [Vec<usize>],
    served: &'a mut [Vec<(usize, f64)>],
    count: &'a mut [u32],
    load: &'a mut [f64],
    util: f64,
    objective: Objective,
    /// Per offer: its place in [`removal_order`].
    removal_rank: Vec<usize>,
}

impl Packing<'_> {
    fn per(&self, i: usize) -> f64 {
        self.offers[i].capacity * self.util
    }

    /// What offer `i`'s last replica serves: the load its other replicas could not hold.
    fn excess(&self, i: usize) -> f64 {
        self.load[i] - f64::from(self.count[i].saturating_sub(1)) * self.per(i)
    }

    fn spare(&self, j: usize) -> f64 {
        (f64::from(self.count[j]) * self.per(j) - self.load[j]).max(0.0)
    }

    /// The offers with replicas, the emptiest last replica first, then in removal order.
    fn emptiest_first(&self) -> Vec<usize> {
        let rank = &self.removal_rank;
        let mut order: Vec<usize> = (0..self.offers.len())
            .filter(|i| self.count[*i] > 0)
            .collect();
        order.sort_by(|a, b| {
            self.excess(*a)
                .total_cmp(&self.excess(*b))
                .then(rank[*a].cmp(&rank[*b]))
        });
        order
    }

    /// Gives up every last replica whose load fits in the spare throughput of the other replicas wanted.
    fn consolidate(&mut self) {
        loop {
            let mut dropped = false;
            for i in self.emptiest_first() {
                while self.count[i] > 0 {
                    let Some(moves) = self.moves(i, None) else {
                        break;
                    };
                    self.apply(i, &moves);
                    self.count[i] -= 1;
                    dropped = true;
                }
            }
            if !dropped {
                return;
            }
        }
    }

    /// Replaces last replicas by fewer-cost (under the objective) replicas of another offer within reach of the
    /// locations they serve, where that offer's spare and new replicas take the whole load.
    fn right_size(&mut self) {
        for i in self.emptiest_first() {
            if self.count[i] == 0 {
                continue;
            }
            let x = self.excess(i);
            let offers = self.offers;
            let here = &offers[i];
            let f = stickiness(self.runs[i], self.count[i]);
            // Only offers some location served by `i` reaches can take its load.
            let near: BTreeSet<usize> = self
                .served
                .iter()
                .zip(self.reach)
                .filter(|(by, _)| by.iter().any(|(j, _)| *j == i))
                .flat_map(|(_, reach)| reach.iter().copied())
                .collect();
            let mut options = vec![Cand {
                i,
                rtt: 0.0,
                usd: here.usd_per_hour * f,
                g: here.g_co2_per_hour * f,
            }];
            let mut adds: BTreeMap<usize, (u32, Vec<Move>)> = BTreeMap::new();
            for j in near {
                if j == i || self.per(j) <= 0.0 {
                    continue;
                }
                let k = ((x - self.spare(j)).max(0.0) / self.per(j) - 1e-9)
                    .ceil()
                    .max(0.0) as u32;
                let shares_pool = self.pools.of[j].contains(&i);
                let free = self.pools.free(j, self.count) + u32::from(shares_pool);
                if k == 0 || k > free {
                    continue;
                }
                let Some(moves) = self.moves(i, Some((j, f64::from(k) * self.per(j)))) else {
                    continue;
                };
                let o = &offers[j];
                let f = stickiness(self.runs[j], self.count[j] + k);
                options.push(Cand {
                    i: j,
                    rtt: 0.0,
                    usd: f64::from(k) * o.usd_per_hour * f,
                    g: f64::from(k) * o.g_co2_per_hour * f,
                });
                adds.insert(j, (k, moves));
            }
            let best = preference(offers, &options, self.objective)
                .first()
                .copied()
                .unwrap_or(i);
            if let Some((k, moves)) = adds.remove(&best) {
                self.count[best] += k;
                self.apply(i, &moves);
                self.count[i] -= 1;
            }
        }
    }

    /// The moves `(location, offer, amount)` that take offer `i`'s last replica's load: to the spare of the
    /// other replicas wanted within each location's reach, or, with `to = (j, extra)`, to offer `j` alone, with
    /// `extra` more throughput there. `None` if the load does not all fit.
    fn moves(&self, i: usize, to: Option<(usize, f64)>) -> Option<Vec<Move>> {
        let mut excess = self.excess(i);
        let mut moves = Vec::new();
        let mut taken: BTreeMap<usize, f64> = BTreeMap::new();
        for (l, by) in self.served.iter().enumerate() {
            if excess <= 1e-9 {
                break;
            }
            let Some(&(_, here)) = by.iter().find(|(j, _)| *j == i) else {
                continue;
            };
            if !self.reach[l].contains(&i) {
                continue;
            }
            let mut movable = here.min(excess);
            for &j in &self.reach[l] {
                if movable <= 1e-9 {
                    break;
                }
                let extra = match to {
                    Some((only, extra)) if only == j => extra,
                    Some(_) => continue,
                    None if j == i || self.count[j] == 0 => continue,
                    None => 0.0,
                };
                let already = taken.get(&j).copied().unwrap_or(0.0);
                let amount = (self.spare(j) + extra - already).min(movable);
                if amount > 1e-9 {
                    moves.push((l, j, amount));
                    *taken.entry(j).or_default() += amount;
                    movable -= amount;
                    excess -= amount;
                }
            }
        }
        (excess <= 1e-9).then_some(moves)
    }

    fn apply(&mut self, i: usize, moves: &[Move]) {
        for &(l, j, amount) in moves {
            self.load[i] -= amount;
            self.load[j] += amount;
            for (k, take) in self.served[l].iter_mut() {
                if *k == i {
                    *take -= amount;
                }
            }
            add_served(&mut self.served[l], j, amount);
            self.served[l].retain(|(_, take)| *take > 1e-12);
        }
    }
}

/// Which offers share a pool (its on-demand and spot offers): room is the pool's, whichever way it is sold.
struct Pools {
    /// Per offer: the offers of the same site and pool.
    of: Vec<Vec<usize>>,
    room: Vec<u32>,
}

impl Pools {
    fn of(offers: &[Offer]) -> Self {
        let mut by_pool: BTreeMap<(&SiteId, &PoolName), Vec<usize>> = BTreeMap::new();
        for (i, o) in offers.iter().enumerate() {
            by_pool
                .entry((&o.key.site, &o.key.pool))
                .or_default()
                .push(i);
        }
        Pools {
            of: offers
                .iter()
                .map(|o| by_pool[&(&o.key.site, &o.key.pool)].clone())
                .collect(),
            room: offers.iter().map(|o| o.room).collect(),
        }
    }

    /// Replicas offer `i`'s pool still has room for, given those wanted of each offer.
    fn free(&self, i: usize, count: &[u32]) -> u32 {
        let used: u32 = self.of[i].iter().map(|j| count[*j]).sum();
        self.room[i].saturating_sub(used)
    }
}

/// The order in which replicas are given up (first = first removed): cloud before partner before owned, spot
/// before on-demand, then the worst under the service's objective (per unit of throughput).
fn removal_order(offers: &[Offer], objective: Objective) -> Vec<usize> {
    let all: Vec<Cand> = (0..offers.len())
        .map(|i| Cand::of(offers, i, 0.0))
        .collect();
    let rank = positions(&preference(offers, &all, objective));
    let mut v: Vec<usize> = (0..offers.len()).collect();
    v.sort_by(|a, b| {
        let (x, y) = (&offers[*a], &offers[*b]);
        tier_rank(y.tier)
            .cmp(&tier_rank(x.tier))
            .then(y.key.spot.cmp(&x.key.spot))
            .then(rank[*b].cmp(&rank[*a]))
    });
    v
}

/// Per index, its place in `order` (a permutation of `0..order.len()`).
fn positions(order: &[usize]) -> Vec<usize> {
    let mut at = vec![0usize; order.len()];
    for (r, i) in order.iter().enumerate() {
        at[*i] = r;
    }
    at
}

/// Brings the total within `min_replicas..=max_replicas`: extra replicas go to the offers that reach the most
/// demand within the SLO (then tier and policy order); replicas over the maximum are given up in removal order.
fn clamp_total(
    offers: &[Offer],
    pools: &Pools,
    demand: &[LocationDemand],
    rtts: &[Vec<f64>],
    s: &Settings,
    count: &mut [u32],
) {
    let total: u32 = count.iter().sum();
    if total < s.min_replicas {
        // Offers ranked by the demand they reach within the SLO, then tier and policy order.
        let all: Vec<Cand> = (0..offers.len())
            .map(|i| Cand::of(offers, i, 0.0))
            .collect();
        let mut by_reach = preference(offers, &all, s.objective);
        let reached = |i: usize| -> f64 {
            demand
                .iter()
                .enumerate()
                .filter(|(l, _)| rtts[*l][i] <= s.slo_ms)
                .map(|(_, d)| d.rate)
                .sum()
        };
        by_reach.sort_by(|a, b| reached(*b).total_cmp(&reached(*a)));
        let mut need = s.min_replicas - total;
        for i in by_reach {
            let add = need.min(pools.free(i, count));
            count[i] += add;
            need -= add;
            if need == 0 {
                break;
            }
        }
    } else if total > s.max_replicas {
        let mut over = total - s.max_replicas;
        for i in removal_order(offers, s.objective) {
            let cut = over.min(count[i]);
            count[i] -= cut;
            over -= cut;
            if over == 0 {
                break;
            }
        }
    }
}

/// Replicas of one key as they are now: serving, and started but not serving yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Present {
    pub ready: u32,
    pub starting: u32,
}

impl Present {
    pub fn total(self) -> u32 {
        self.ready + self.starting
    }
}

/// Why a count changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Demand stayed above what the replicas serve for the whole scale-up delay.
    DemandRose,
    /// Demand stayed below for the whole scale-down delay.
    DemandFell,
    /// A location with demand had no replica within the SLO: covered at once.
    Uncovered,
}

/// One change of a key's replica count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub key: ReplicaKey,
    pub from: u32,
    pub to: u32,
    pub why: Why,
}

/// The demand one location has been seen at recently, and the level the scaler plans for.
#[derive(Clone, Debug, Default)]
struct Window {
    /// Rates as reported.
    raw: VecDeque<(Millis, f64)>,
    /// The mean over the demand window at each step.
    seen: VecDeque<(Millis, f64)>,
    planned: f64,
    /// The level planned for at each step of the last scale-down delay.
    plans: VecDeque<(Millis, f64)>,
    /// When the mean was last above zero.
    last_demand_ms: Option<Millis>,
}

/// The rate a location is planned for while it has had no demand for less than a scale-down delay: it stays
/// covered (a replica within the SLO is kept for it) without asking for throughput.
const COVER_RATE: f64 = 1e-6;

impl Window {
    /// The level seen over the whole of `[now - delay, now]`, by `pick` (min or max), or `None` if what was seen
    /// does not reach back that far.
    fn level(&self, now: Millis, delay: u64, pick: fn(f64, f64) -> f64) -> Option<f64> {
        let start = now.saturating_sub(delay);
        let first = self.seen.iter().rposition(|(t, _)| *t <= start)?;
        self.seen.iter().skip(first).map(|(_, r)| *r).reduce(pick)
    }
}

/// The hysteresis of one service. Per location: a location is planned for the lowest rate its sliding mean
/// kept over the whole scale-up delay when that is above its plan (a location seen with demand for the first
/// time at once, and a mean back at a level it held within the scale-down delay at once, up to that level), and
/// for its mean when that is below; one whose demand stopped stays covered for a scale-down delay (a replica
/// within the SLO is kept for it). Down, per service ([`Scaler::kept`]): replicas are kept beyond the plan only
/// while its total is below the most it wanted within the scale-down delay, and only where it wanted them then.
/// Holding what the service needed at once — not the sum of each location's own highest level — keeps fewer
/// replicas where several locations' demand peaks at different times, and lets a move stop the old replicas as
/// soon as the new ones serve. Soft state: a new scaler (after a restart or a takeover) removes nothing until it has seen a full
/// scale-down delay of demand.
#[derive(Clone, Debug, Default)]
pub struct Scaler {
    windows: BTreeMap<String, Window>,
    since: Option<Millis>,
    /// The plan at each step of the last scale-down delay: its total and its count per key.
    wanted: VecDeque<(Millis, u32, BTreeMap<ReplicaKey, u32>)>,
}

impl Scaler {
    /// The demand to plan for now, from what was just measured.
    fn planned(
        &mut self,
        now: Millis,
        measured: &[LocationDemand],
        s: &Settings,
    ) -> Vec<LocationDemand> {
        let keep_from = now.saturating_sub(s.up_delay_ms);
        let plans_from = now.saturating_sub(s.down_delay_ms);
        measured
            .iter()
            .map(|d| {
                let w = self.windows.entry(d.name.clone()).or_default();
                w.raw.push_back((now, d.rate.max(0.0)));
                while w.raw.front().is_some_and(|(t, _)| *t + s.window_ms <= now) {
                    w.raw.pop_front();
                }
                let mean = w.raw.iter().map(|(_, r)| r).sum::<f64>() / w.raw.len().max(1) as f64;
                w.seen.push_back((now, mean));
                while w.seen.len() > 1 && w.seen[1].0 <= keep_from {
                    w.seen.pop_front();
                }
                let up = w.level(now, s.up_delay_ms, f64::min);
                // Back at once to a level planned for within the scale-down delay: demand that returns is not
                // a spike.
                let recent = w.plans.iter().map(|(_, r)| *r).fold(0.0, f64::max);
                let back = mean.min(recent);
                w.planned = if w.planned <= 0.0 && mean > 0.0 {
                    mean
                } else if let Some(u) = up.filter(|u| *u > w.planned) {
                    u.max(back)
                } else if back > w.planned {
                    back
                } else {
                    w.planned.min(mean)
                };
                w.plans.push_back((now, w.planned));
                while w.plans.front().is_some_and(|(t, _)| *t < plans_from) {
                    w.plans.pop_front();
                }
                if mean > 0.0 {
                    w.last_demand_ms = Some(now);
                }
                let covered = w
                    .last_demand_ms
                    .is_some_and(|t| now.saturating_sub(t) < s.down_delay_ms);
                LocationDemand {
                    rate: if covered {
                        w.planned.max(COVER_RATE)
                    } else {
                        w.planned
                    },
                    ..d.clone()
                }
            })
            .collect()
    }

    /// Where replicas should be for the demand just measured, and the changes to make now given what runs.
    /// A count goes up at once; it goes down only when no location the pool reaches waits for a replica that is
    /// starting (make before break) and the scaler has seen a full scale-down delay.
    pub fn step(
        &mut self,
        now: Millis,
        offers: &[Offer],
        measured: &[LocationDemand],
        present: &BTreeMap<ReplicaKey, Present>,
        rtt: &RttTable,
        s: &Settings,
    ) -> (Desired, Vec<Change>) {
        let since = *self.since.get_or_insert(now);
        let planned = self.planned(now, measured, s);
        let running: BTreeMap<ReplicaKey, u32> = present
            .iter()
            .map(|(k, p)| (k.clone(), p.total()))
            .collect();
        let want = desired_from(offers, &planned, rtt, s, &running);
        // Keys serving a location that has demand and nothing within reach now.
        let mut urgent: BTreeSet<&ReplicaKey> = BTreeSet::new();
        for (l, reach) in want.reach.iter().enumerate() {
            let covered = reach
                .iter()
                .any(|i| present.get(&offers[*i].key).is_some_and(|p| p.total() > 0));
            if planned[l].rate > 0.0 && !covered {
                urgent.extend(want.served[l].iter().map(|(i, _)| &offers[*i].key));
            }
        }
        // Make before break, per neighbourhood: a pool gives up replicas only when no location it reaches is
        // waiting for a replica that is starting, or is about to start in this step.
        let starting = |i: &usize| {
            let key = &offers[*i].key;
            let have = present.get(key).copied().unwrap_or_default();
            have.starting > 0 || want.replicas.get(key).copied().unwrap_or(0) > have.total()
        };
        let mut held: BTreeSet<&ReplicaKey> = BTreeSet::new();
        for reach in &want.reach {
            if reach.iter().any(starting) {
                held.extend(reach.iter().map(|i| &offers[*i].key));
            }
        }
        let window_seen = now >= since + s.down_delay_ms;
        let keys: BTreeSet<&ReplicaKey> = present.keys().chain(want.replicas.keys()).collect();
        let kept = self.kept(now, offers, present, &want, s);
        let mut changes = Vec::new();
        for key in keys {
            let from = present.get(key).map_or(0, |p| p.total());
            let to = want.replicas.get(key).copied().unwrap_or(0);
            let to = if to < from {
                (to + kept.get(key).copied().unwrap_or(0))
                    .max(self.wanted_within(now, key, s.up_delay_ms))
                    .min(from)
            } else {
                to
            };
            let why = if to > from && urgent.contains(key) {
                Why::Uncovered
            } else if to > from {
                Why::DemandRose
            } else if to < from && window_seen && !held.contains(key) {
                Why::DemandFell
            } else {
                continue;
            };
            changes.push(Change {
                key: key.clone(),
                from,
                to,
                why,
            });
        }
        (want, changes)
    }

    /// The most replicas the plan wanted of `key` at any step of the last `delay`: a pool's count falls only to
    /// that, so a fall must hold as long as a rise must (a one-minute dip at one location, while another's
    /// demand keeps the service's total up, stops no replica that the next minute would start again).
    fn wanted_within(&self, now: Millis, key: &ReplicaKey, delay: u64) -> u32 {
        let from = now.saturating_sub(delay);
        self.wanted
            .iter()
            .filter(|(t, _, _)| *t >= from)
            .map(|(_, _, w)| w.get(key).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    /// Replicas kept beyond the plan, per key, because demand fell less than a scale-down delay ago: the plan's
    /// total now may fall short of the most it wanted at any step of the delay by at most that many, and each
    /// key keeps at most what the plan wanted of it over the delay (the best kept first, in reverse removal
    /// order). A move (the plan wants as many elsewhere) keeps nothing: the old replicas stop once the new ones
    /// serve. Before the scaler has seen a whole delay, every running replica is kept.
    fn kept(
        &mut self,
        now: Millis,
        offers: &[Offer],
        present: &BTreeMap<ReplicaKey, Present>,
        want: &Desired,
        s: &Settings,
    ) -> BTreeMap<ReplicaKey, u32> {
        let keep_from = now.saturating_sub(s.down_delay_ms);
        let total: u32 = want.replicas.values().sum();
        self.wanted.push_back((now, total, want.replicas.clone()));
        while self.wanted.len() > 1 && self.wanted[1].0 <= keep_from {
            self.wanted.pop_front();
        }
        let reaches_back = self.wanted.front().is_some_and(|(t, _, _)| *t <= keep_from);
        if !reaches_back {
            return present
                .iter()
                .map(|(k, p)| (k.clone(), p.total()))
                .collect();
        }
        let most_total = self.wanted.iter().map(|(_, t, _)| *t).max().unwrap_or(0);
        let mut allowance = most_total.saturating_sub(total);
        let mut kept = BTreeMap::new();
        if allowance == 0 {
            return kept;
        }
        for i in removal_order(offers, s.objective).into_iter().rev() {
            if allowance == 0 {
                break;
            }
            let key = &offers[i].key;
            let have = present.get(key).map_or(0, |p| p.total());
            let now_wanted = want.replicas.get(key).copied().unwrap_or(0);
            if have <= now_wanted {
                continue;
            }
            let most = self
                .wanted
                .iter()
                .map(|(_, _, w)| w.get(key).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            let keep = most.min(have).saturating_sub(now_wanted).min(allowance);
            if keep > 0 {
                kept.insert(key.clone(), keep);
                allowance -= keep;
            }
        }
        kept
    }
}

/// Replicas of one pool that a location may be routed to, with the share of its requests to send there.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteTo {
    pub key: ReplicaKey,
    pub replicas: u32,
    pub rtt_ms: f64,
    /// Shares of one location's routes add up to 1.
    pub weight: f64,
}

/// The routes of one location: every pool with ready replicas within the SLO.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocationRoutes {
    pub location: String,
    pub routes: Vec<RouteTo>,
}

/// The routing table a gateway or DNS follows: for each location, the pools with ready replicas within the SLO,
/// weighted by their spare capacity — a pool's ready throughput divided by the demand of all the locations that
/// can reach it, so that a pool many locations share gets a smaller share of each. A location with none in
/// reach gets an empty list (the gateway's fallback is its own).
pub fn routes(
    offers: &[Offer],
    ready: &BTreeMap<ReplicaKey, u32>,
    demand: &[LocationDemand],
    rtt: &RttTable,
    slo_ms: f64,
) -> Vec<LocationRoutes> {
    let live: Vec<(&Offer, u32)> = offers
        .iter()
        .filter_map(|o| ready.get(&o.key).filter(|n| **n > 0).map(|n| (o, *n)))
        .collect();
    let reach: Vec<Vec<(usize, f64)>> = demand
        .iter()
        .map(|d| {
            live.iter()
                .enumerate()
                .map(|(k, (o, _))| {
                    let r = rtt_ms(
                        rtt,
                        d.location,
                        d.rtt_region.as_deref(),
                        o.location,
                        o.rtt_region.as_deref(),
                    );
                    (k, r)
                })
                .filter(|(_, r)| *r <= slo_ms)
                .collect()
        })
        .collect();
    let mut sharing = vec![0.0f64; live.len()];
    for (l, near) in reach.iter().enumerate() {
        for (k, _) in near {
            sharing[*k] += demand[l].rate.max(1e-9);
        }
    }
    demand
        .iter()
        .zip(&reach)
        .map(|(d, near)| {
            let raw: Vec<f64> = near
                .iter()
                .map(|(k, _)| {
                    let (o, n) = live[*k];
                    f64::from(n) * o.capacity / sharing[*k].max(1e-9)
                })
                .collect();
            let total: f64 = raw.iter().sum::<f64>().max(1e-12);
            LocationRoutes {
                location: d.name.clone(),
                routes: near
                    .iter()
                    .zip(raw)
                    .map(|((k, r), w)| RouteTo {
                        key: live[*k].0.key.clone(),
                        replicas: live[*k].1,
                        rtt_ms: *r,
                        weight: w / total,
                    })
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(site: &str, tier: Tier, lon: f64, usd: f64, g: f64, room: u32) -> Offer {
        Offer {
            key: ReplicaKey {
                site: SiteId::new(site).unwrap_or_else(|_| unreachable!()),
                pool: PoolName::from("gpu"),
                spot: false,
            },
            tier,
            location: GeoPoint { lat: 40.0, lon },
            rtt_region: None,
            room,
            usd_per_hour: usd,
            kw: 1.0,
            g_co2_per_hour: g,
            capacity: 10.0,
        }
    }

    fn at(name: &str, lon: f64, rate: f64) -> LocationDemand {
        LocationDemand {
            name: name.to_owned(),
            location: GeoPoint { lat: 40.0, lon },
            rtt_region: None,
            rate,
        }
    }

    fn settings(objective: Objective) -> Settings {
        Settings {
            slo_ms: 40.0,
            min_replicas: 0,
            max_replicas: 1000,
            utilization: 1.0,
            objective,
            up_delay_ms: 60_000,
            down_delay_ms: 600_000,
            window_ms: 120_000,
        }
    }

    fn count(d: &Desired, site: &str) -> u32 {
        d.replicas
            .iter()
            .filter(|(k, _)| k.site.as_str() == site)
            .map(|(_, c)| *c)
            .sum()
    }

    fn spot(site: &str, lon: f64, usd: f64, g: f64, room: u32) -> Offer {
        let mut o = offer(site, Tier::Cloud, lon, usd, g, room);
        o.key.spot = true;
        o
    }

    #[test]
    fn spot_goes_first_within_a_tier_and_shares_its_pool_s_room_with_on_demand() {
        // Each cloud pool sells on-demand and spot from the same four devices.
        let offers = vec![
            offer("cloud-a", Tier::Cloud, -75.0, 3.0, 10.0, 4),
            spot("cloud-a", -75.0, 1.0, 10.0, 4),
            offer("cloud-b", Tier::Cloud, -75.5, 2.0, 10.0, 4),
            spot("cloud-b", -75.5, 1.5, 10.0, 4),
        ];
        let demand = vec![at("new-york", -74.0, 70.0)];
        for objective in [
            Objective::Cost,
            Objective::Carbon,
            Objective::Knee(BALANCED_PREMIUM),
        ] {
            let d = desired(&offers, &demand, &RttTable::default(), &settings(objective));
            let want = |i: usize| d.replicas.get(&offers[i].key).copied().unwrap_or(0);
            // Seven replicas: both pools' spot first (four, then three), no pool beyond its four devices.
            assert_eq!((want(1), want(3)), (4, 3), "{objective:?}");
            assert_eq!((want(0), want(2)), (0, 0), "{objective:?}");
        }
        // More than spot can hold: on-demand takes the rest, in the room spot leaves.
        let d = desired(
            &offers,
            &[at("new-york", -74.0, 100.0)],
            &RttTable::default(),
            &settings(Objective::Cost),
        );
        let want = |i: usize| d.replicas.get(&offers[i].key).copied().unwrap_or(0);
        assert_eq!(want(1) + want(3), 8);
        assert_eq!(want(0) + want(2), 0, "both pools are full of spot replicas");
        assert!(d.unserved[0] > 19.0);
    }

    #[test]
    fn each_location_is_served_within_the_slo_owned_first_then_by_policy() {
        let offers = vec![
            offer("cloud-east", Tier::Cloud, -75.0, 1.0, 100.0, 100),
            offer("dc-east-coal", Tier::Owned, -76.0, 2.0, 400.0, 3),
            offer("dc-east-hydro", Tier::Owned, -76.5, 2.1, 20.0, 100),
            offer("dc-west", Tier::Owned, -120.0, 1.0, 50.0, 100),
        ];
        let demand = vec![at("new-york", -74.0, 35.0), at("seattle", -122.0, 5.0)];
        let cost = desired(
            &offers,
            &demand,
            &RttTable::default(),
            &settings(Objective::Cost),
        );
        // The cheap cloud is dearer than owned capacity in tier order; the coal site is the cheapest owned one
        // and holds three replicas, the rest goes to the next owned one; Seattle is out of reach of the east.
        assert_eq!(count(&cost, "cloud-east"), 0);
        assert_eq!(count(&cost, "dc-east-coal"), 3);
        assert_eq!(count(&cost, "dc-east-hydro"), 1);
        assert_eq!(count(&cost, "dc-west"), 1);
        let green = desired(
            &offers,
            &demand,
            &RttTable::default(),
            &settings(Objective::Carbon),
        );
        assert_eq!(count(&green, "dc-east-hydro"), 4);
        assert_eq!(count(&green, "dc-east-coal"), 0);
        // Balanced: 5% dearer for 95% less carbon is worth it.
        let knee = desired(
            &offers,
            &demand,
            &RttTable::default(),
            &settings(Objective::Knee(BALANCED_PREMIUM)),
        );
        assert_eq!(count(&knee, "dc-east-hydro"), 4);
        assert!(knee.unserved.iter().all(|u| *u == 0.0));
        assert!(knee.beyond_slo.iter().all(|b| !b));
    }

    #[test]
    fn a_full_owned_tier_spills_to_the_cloud_and_an_unreachable_location_goes_to_the_nearest() {
        let offers = vec![
            offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 2),
            offer("cloud", Tier::Cloud, -77.0, 3.0, 10.0, 100),
        ];
        let demand = vec![at("east", -75.0, 45.0), at("tokyo", 139.0, 5.0)];
        let d = desired(
            &offers,
            &demand,
            &RttTable::default(),
            &settings(Objective::Cost),
        );
        assert_eq!(count(&d, "dc"), 2);
        assert_eq!(count(&d, "cloud"), 3);
        assert!(d.beyond_slo[1]);
        assert!(!d.beyond_slo[0]);
    }

    #[test]
    fn a_last_replica_whose_load_fits_in_the_spare_of_others_within_reach_is_given_up() {
        // Three owned pools in a row; Lyon reaches the first two, Milan the last two (checked below).
        let offers = vec![
            offer("dc-a", Tier::Owned, 0.0, 1.0, 10.0, 10),
            offer("dc-b", Tier::Owned, 3.0, 1.5, 10.0, 10),
            offer("dc-c", Tier::Owned, 6.0, 2.0, 10.0, 10),
        ];
        let demand = vec![at("lyon", 1.0, 5.0), at("milan", 5.0, 4.0)];
        let mut s = settings(Objective::Cost);
        s.slo_ms = crate::latency::estimate_rtt_ms(
            GeoPoint {
                lat: 40.0,
                lon: 0.0,
            },
            GeoPoint {
                lat: 40.0,
                lon: 3.5,
            },
        );
        let d = desired(&offers, &demand, &RttTable::default(), &s);
        assert_eq!(d.reach[0].len(), 2, "lyon reaches dc-a and dc-b");
        assert_eq!(d.reach[1].len(), 2, "milan reaches dc-b and dc-c");
        // Location by location, Lyon opens dc-a and Milan dc-b; dc-b's spare holds Lyon too, so one replica
        // serves both.
        assert_eq!(count(&d, "dc-a"), 0);
        assert_eq!(count(&d, "dc-b"), 1);
        assert_eq!(count(&d, "dc-c"), 0);
        let served: f64 = d.served.iter().flatten().map(|(_, r)| r).sum();
        assert!(
            (served - 9.0).abs() < 1e-9,
            "all demand still served: {served}"
        );
        assert!(d.served.iter().flatten().all(|(i, _)| *i == 1));
    }

    #[test]
    fn a_small_remainder_goes_to_a_small_replica_where_that_is_worth_less() {
        // A large replica (10/s for $9) is the cheaper per unit; a small one (2/s for $5) the cheaper whole.
        let mut small = offer("dc-small", Tier::Owned, -75.0, 5.0, 50.0, 10);
        small.capacity = 2.0;
        let offers = vec![offer("dc-big", Tier::Owned, -75.0, 9.0, 90.0, 10), small];
        for objective in [
            Objective::Cost,
            Objective::Carbon,
            Objective::Knee(BALANCED_PREMIUM),
        ] {
            let plan = |rate: f64| {
                let d = desired(
                    &offers,
                    &[at("new-york", -74.0, rate)],
                    &RttTable::default(),
                    &settings(objective),
                );
                assert!(d.unserved[0] < 1e-9, "{objective:?} at {rate}");
                (count(&d, "dc-big"), count(&d, "dc-small"))
            };
            assert_eq!(
                plan(1.0),
                (0, 1),
                "{objective:?}: one small replica, not a large one idle"
            );
            assert_eq!(
                plan(11.0),
                (1, 1),
                "{objective:?}: the remainder of one large replica"
            );
            assert_eq!(
                plan(15.0),
                (2, 0),
                "{objective:?}: three small ones would cost more than one large"
            );
        }
    }

    #[test]
    fn new_replicas_stay_where_replicas_run_unless_another_pool_is_markedly_better() {
        let plan = |usd_b: f64, running: &[(&str, u32)]| {
            let offers = vec![
                offer("dc-a", Tier::Owned, -75.0, 1.0, 10.0, 10),
                offer("dc-b", Tier::Owned, -75.5, usd_b, 10.0, 10),
            ];
            let running: BTreeMap<ReplicaKey, u32> = running
                .iter()
                .filter_map(|(site, n)| {
                    let key = offers
                        .iter()
                        .find(|o| o.key.site.as_str() == *site)?
                        .key
                        .clone();
                    Some((key, *n))
                })
                .collect();
            let d = desired_from(
                &offers,
                &[at("new-york", -74.0, 5.0)],
                &RttTable::default(),
                &settings(Objective::Cost),
                &running,
            );
            (count(&d, "dc-a"), count(&d, "dc-b"))
        };
        assert_eq!(plan(1.1, &[]), (1, 0), "nothing runs: the cheapest");
        assert_eq!(
            plan(1.1, &[("dc-b", 1)]),
            (0, 1),
            "10% dearer is no reason to move"
        );
        assert_eq!(plan(1.3, &[("dc-b", 1)]), (1, 0), "30% dearer is");
    }

    #[test]
    fn spare_throughput_of_a_wanted_replica_is_used_before_a_new_one() {
        let offers = vec![
            offer("a", Tier::Owned, -75.0, 1.0, 10.0, 10),
            offer("b", Tier::Owned, -76.0, 1.5, 10.0, 10),
        ];
        // Two nearby cities of 4 req/s each: one replica (10 req/s) of the cheaper site serves both.
        let demand = vec![at("x", -75.5, 4.0), at("y", -76.2, 4.0)];
        let d = desired(
            &offers,
            &demand,
            &RttTable::default(),
            &settings(Objective::Cost),
        );
        assert_eq!(d.replicas.values().sum::<u32>(), 1);
        assert_eq!(count(&d, "a"), 1);
    }

    #[test]
    fn the_total_stays_within_min_and_max_and_cloud_goes_first() {
        let offers = vec![
            offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 5),
            offer("cloud", Tier::Cloud, -77.0, 3.0, 10.0, 100),
        ];
        let mut s = settings(Objective::Cost);
        s.min_replicas = 2;
        let d = desired(&offers, &[], &RttTable::default(), &s);
        assert_eq!(count(&d, "dc"), 2);
        s.min_replicas = 0;
        s.max_replicas = 6;
        let d = desired(
            &offers,
            &[at("east", -75.0, 100.0)],
            &RttTable::default(),
            &s,
        );
        assert_eq!(count(&d, "dc"), 5);
        assert_eq!(count(&d, "cloud"), 1);
    }

    #[test]
    fn replicas_over_the_maximum_go_worst_first_under_the_service_s_objective() {
        // Two cloud pools within reach: one cheap on a dirty grid, one dear on a clean one.
        let offers = vec![
            offer("cheap", Tier::Cloud, -76.0, 1.0, 100.0, 3),
            offer("clean", Tier::Cloud, -77.0, 2.0, 10.0, 3),
        ];
        let demand = [at("east", -75.0, 48.0)];
        for (objective, kept) in [(Objective::Cost, "cheap"), (Objective::Carbon, "clean")] {
            let mut s = settings(objective);
            s.max_replicas = 3;
            let d = desired(&offers, &demand, &RttTable::default(), &s);
            assert_eq!(d.replicas.values().sum::<u32>(), 3, "{objective:?}");
            assert_eq!(count(&d, kept), 3, "{objective:?}: {:?}", d.replicas);
        }
    }

    fn present(pairs: &[(&Offer, u32, u32)]) -> BTreeMap<ReplicaKey, Present> {
        pairs
            .iter()
            .map(|(o, ready, starting)| {
                (
                    o.key.clone(),
                    Present {
                        ready: *ready,
                        starting: *starting,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn counts_follow_demand_only_after_their_delay_except_for_new_demand() {
        let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
        let s = settings(Objective::Cost);
        let rtt = RttTable::default();
        let mut scaler = Scaler::default();
        let mut step = |t: u64, rate: f64, p: &BTreeMap<ReplicaKey, Present>| {
            scaler
                .step(t, &offers, &[at("east", -75.0, rate)], p, &rtt, &s)
                .1
        };
        // First demand: planned for at once.
        let c = step(0, 25.0, &present(&[]));
        assert_eq!((c[0].to, c[0].why), (3, Why::Uncovered));
        // Demand doubles: nothing for a minute, then up to the level its sliding mean held over that minute.
        let three = present(&[(&offers[0], 3, 0)]);
        assert!(step(30_000, 55.0, &three).is_empty());
        assert!(step(60_000, 55.0, &three).is_empty());
        let c = step(90_000, 55.0, &three);
        assert_eq!((c[0].from, c[0].why), (3, Why::DemandRose));
        assert!(c[0].to > 3 && c[0].to < 6, "{c:?}");
        let part = present(&[(&offers[0], c[0].to, 0)]);
        for t in [120_000, 150_000] {
            step(t, 55.0, &part);
        }
        let c = step(180_000, 55.0, &part);
        assert_eq!((c[0].to, c[0].why), (6, Why::DemandRose));
        // Demand falls: nothing is removed before ten minutes of it, nor while a replica starts.
        let six = present(&[(&offers[0], 6, 0)]);
        let starting = present(&[(&offers[0], 5, 1)]);
        let mut removed = None;
        for t in (210_000..2_000_000).step_by(30_000) {
            if t >= 900_000 && removed.is_none() {
                assert!(step(t, 5.0, &starting).is_empty(), "at {t}, while starting");
            }
            let c = step(t, 5.0, &six);
            if let Some(c) = c.first() {
                assert_eq!((c.from, c.why), (6, Why::DemandFell));
                assert!(c.to < 6);
                removed = Some(t);
                break;
            }
        }
        let at = removed.expect("removed in the end");
        assert!(at >= 210_000 + 600_000, "removed at {at}");
        // Down to what the low demand needs once its mean has held for the delay.
        let c = step(at + 600_000, 5.0, &six);
        assert_eq!((c[0].from, c[0].to), (6, 1));
        // A spike is not followed at once.
        let one = present(&[(&offers[0], 1, 0)]);
        let base = at + 1_000_000;
        for t in (base..base + 700_000).step_by(30_000) {
            step(t, 5.0, &one);
        }
        assert!(step(base + 700_000, 90.0, &one).is_empty());
        assert!(step(base + 730_000, 5.0, &one).is_empty());
    }

    #[test]
    fn a_pool_keeps_what_its_locations_needed_together_not_the_sum_of_each_one_s_peak() {
        let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
        let s = settings(Objective::Cost);
        let rtt = RttTable::default();
        let mut scaler = Scaler::default();
        let mut step = |t: u64, a: f64, b: f64, p: &BTreeMap<ReplicaKey, Present>| {
            scaler
                .step(
                    t,
                    &offers,
                    &[at("east", -75.0, a), at("west", -77.0, b)],
                    p,
                    &rtt,
                    &s,
                )
                .1
        };
        let c = step(0, 45.0, 15.0, &present(&[]));
        assert_eq!(c[0].to, 6, "{c:?}");
        let six = present(&[(&offers[0], 6, 0)]);
        for t in (60_000..=1_200_000).step_by(60_000) {
            assert!(step(t, 45.0, 15.0, &six).is_empty(), "at {t}");
        }
        // The two locations swap their demand: the pool's six replicas still serve both, and no more are
        // started (the sum of each location's own peak would want ten) nor any stopped.
        for t in (1_260_000..=3_000_000).step_by(60_000) {
            let c = step(t, 15.0, 45.0, &six);
            assert!(c.is_empty(), "at {t}: {c:?}");
        }
        // Both fall for good: the pool gives its replicas up once the fall has held a whole scale-down delay,
        // down to the one replica the low demand needs.
        let mut count = 6;
        let mut first_removal = None;
        for t in (3_060_000..6_000_000).step_by(60_000) {
            if let Some(c) = step(t, 5.0, 5.0, &present(&[(&offers[0], count, 0)])).first() {
                assert_eq!((c.from, c.why), (count, Why::DemandFell));
                assert!(c.to < count, "{c:?}");
                first_removal.get_or_insert(t);
                count = c.to;
            }
        }
        let at = first_removal.expect("given up in the end");
        assert!(at >= 3_060_000 + 600_000, "given up at {at}");
        assert_eq!(count, 1);
    }

    #[test]
    fn a_location_whose_demand_pauses_keeps_a_replica_in_reach_for_a_scale_down_delay() {
        // Two pools an ocean apart, each the only one within the SLO of its city; the east is cheaper, so what
        // the service may keep while its demand falls goes to the east first.
        let offers = vec![
            offer("east", Tier::Owned, -75.0, 1.0, 10.0, 100),
            offer("west", Tier::Owned, 10.0, 2.0, 10.0, 100),
        ];
        let s = settings(Objective::Cost);
        let rtt = RttTable::default();
        let mut scaler = Scaler::default();
        let mut west = 0u32;
        let mut west_seen = None;
        for m in 0..40u64 {
            let t = m * 60_000;
            let (ny, fra) = match m {
                0..=11 => (45.0, 0.0),
                12 => (35.0, 5.0),
                _ => (35.0, 0.0),
            };
            if fra > 0.0 {
                west_seen = Some(t);
            }
            // The east's replicas stop slowly: all five still run.
            let now = present(&[(&offers[0], 5, 0), (&offers[1], west, 0)]);
            let (_, changes) = scaler.step(
                t,
                &offers,
                &[at("new-york", -74.0, ny), at("frankfurt", 9.0, fra)],
                &now,
                &rtt,
                &s,
            );
            if let Some(c) = changes.iter().find(|c| c.key == offers[1].key) {
                west = c.to;
            }
            if let Some(w) = west_seen.filter(|w| t < w + 600_000) {
                assert!(
                    west >= 1,
                    "minute {m}: Frankfurt had demand {} s ago and no replica",
                    (t - w) / 1000
                );
            }
        }
        assert!(west_seen.is_some());
        assert_eq!(west, 0, "given up in the end");
    }

    #[test]
    fn a_one_minute_dip_stops_no_replica_the_next_minute_would_restart() {
        // New York is served only from the east, Frankfurt only from the west. At minute 20 New York's demand dips
        // for one minute while Frankfurt's rises, so the service's total plan does not fall: only the east's does.
        let offers = vec![
            offer("east", Tier::Owned, -75.0, 1.0, 10.0, 100),
            offer("west", Tier::Owned, 10.0, 2.0, 10.0, 100),
        ];
        let s = Settings {
            window_ms: 60_000,
            ..settings(Objective::Cost)
        };
        let rtt = RttTable::default();
        let mut scaler = Scaler::default();
        let (mut east, mut west) = (0u32, 0u32);
        let mut east_counts = Vec::new();
        for m in 0..30u64 {
            let ny = if m == 20 { 20.0 } else { 50.0 };
            let fra = if m < 19 { 20.0 } else { 50.0 };
            let now = present(&[(&offers[0], east, 0), (&offers[1], west, 0)]);
            let (_, changes) = scaler.step(
                m * 60_000,
                &offers,
                &[at("new-york", -74.0, ny), at("frankfurt", 9.0, fra)],
                &now,
                &rtt,
                &s,
            );
            for c in &changes {
                if c.key == offers[0].key {
                    east = c.to;
                } else if c.key == offers[1].key {
                    west = c.to;
                }
            }
            east_counts.push(east);
        }
        assert_eq!(west, 5, "Frankfurt's rise is followed");
        assert!(
            east_counts[1..].iter().all(|c| *c == 5),
            "the east stopped replicas for a one-minute dip: {east_counts:?}"
        );
    }

    #[test]
    fn demand_back_at_a_level_planned_for_within_the_scale_down_delay_is_planned_for_at_once() {
        let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
        let s = settings(Objective::Cost);
        let rtt = RttTable::default();
        let mut scaler = Scaler::default();
        let five = present(&[(&offers[0], 5, 0)]);
        let mut want = |t: u64, rate: f64| {
            let (d, _) = scaler.step(t, &offers, &[at("east", -75.0, rate)], &five, &rtt, &s);
            d.replicas.get(&offers[0].key).copied().unwrap_or(0)
        };
        for t in (0..=600_000).step_by(60_000) {
            assert_eq!(want(t, 50.0), 5);
        }
        // A dip: the plan follows it down at once (the pool keeps its replicas for the scale-down delay).
        for t in (660_000..=900_000).step_by(60_000) {
            want(t, 20.0);
        }
        assert_eq!(want(960_000, 20.0), 2);
        // Back at 50: planned for at once, not after the scale-up delay.
        assert_eq!(
            want(1_020_000, 50.0),
            4,
            "the sliding mean is half-way back"
        );
        assert_eq!(want(1_080_000, 50.0), 5);
        // A level never planned for is a spike: followed only after the scale-up delay.
        assert_eq!(want(1_140_000, 90.0), 5);
    }

    #[test]
    fn a_new_scaler_removes_nothing_before_a_full_window() {
        let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
        let s = settings(Objective::Cost);
        let mut scaler = Scaler::default();
        let running = present(&[(&offers[0], 8, 0)]);
        let low = [at("east", -75.0, 5.0)];
        for t in (0..=600_000).step_by(60_000) {
            let (_, c) = scaler.step(
                1_000_000 + t,
                &offers,
                &low,
                &running,
                &RttTable::default(),
                &s,
            );
            assert_eq!(c.is_empty(), t < 600_000, "at {t}: {c:?}");
        }
    }

    #[test]
    fn a_move_starts_the_new_replicas_before_it_stops_the_old_ones() {
        let mut offers = vec![
            offer("east", Tier::Owned, -75.0, 1.0, 10.0, 100),
            offer("west", Tier::Owned, -80.0, 1.0, 100.0, 100),
        ];
        let s = settings(Objective::Carbon);
        let rtt = RttTable::default();
        let mut scaler = Scaler::default();
        let demand = [at("pittsburgh", -77.5, 30.0)];
        let (_, c) = scaler.step(0, &offers, &demand, &present(&[]), &rtt, &s);
        assert_eq!((c[0].key.site.as_str(), c[0].to), ("east", 3));
        // The east's grid gets dirty at the next hour: the replicas move west.
        offers[0].g_co2_per_hour = 1000.0;
        let east_only = present(&[(&offers[0], 3, 0)]);
        let (_, c) = scaler.step(3_600_000, &offers, &demand, &east_only, &rtt, &s);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(
            (c[0].key.site.as_str(), c[0].to, c[0].why),
            ("west", 3, Why::DemandRose)
        );
        // While the west starts, the east keeps its replicas.
        let starting = present(&[(&offers[0], 3, 0), (&offers[1], 0, 3)]);
        let (_, c) = scaler.step(3_660_000, &offers, &demand, &starting, &rtt, &s);
        assert!(c.is_empty(), "{c:?}");
        // Once the west serves, the east goes.
        let both = present(&[(&offers[0], 3, 0), (&offers[1], 3, 0)]);
        let (_, c) = scaler.step(3_720_000, &offers, &demand, &both, &rtt, &s);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].key.site.as_str(), c[0].to), ("east", 0));
    }

    #[test]
    fn routes_go_to_ready_replicas_within_the_slo_weighted_by_spare_capacity() {
        let offers = vec![
            offer("shared", Tier::Owned, -75.0, 1.0, 10.0, 100),
            offer("mine", Tier::Owned, -80.0, 1.0, 10.0, 100),
            offer("far", Tier::Owned, 10.0, 1.0, 10.0, 100),
        ];
        let ready: BTreeMap<ReplicaKey, u32> = [(&offers[0], 2), (&offers[1], 2), (&offers[2], 5)]
            .iter()
            .map(|(o, n)| (o.key.clone(), *n))
            .collect();
        // Two locations share "shared"; only the first reaches "mine".
        let demand = [
            at("a", -77.5, 10.0),
            at("b", -72.0, 10.0),
            at("tokyo", 139.0, 1.0),
        ];
        let table = routes(&offers, &ready, &demand, &RttTable::default(), 10.0);
        let a = &table[0].routes;
        assert_eq!(a.len(), 2);
        let w = |site: &str| {
            a.iter()
                .find(|r| r.key.site.as_str() == site)
                .map(|r| r.weight)
        };
        // "mine" serves a alone (20 of capacity for 10 of demand); "shared" splits its 20 over 20 of demand.
        assert!((w("mine").unwrap_or(0.0) - 2.0 / 3.0).abs() < 1e-9, "{a:?}");
        assert!((a.iter().map(|r| r.weight).sum::<f64>() - 1.0).abs() < 1e-9);
        assert_eq!(table[1].routes.len(), 1);
        assert_eq!(table[1].routes[0].key.site.as_str(), "shared");
        assert_eq!(table[1].routes[0].weight, 1.0);
        assert!(
            table[2].routes.is_empty(),
            "nothing within the SLO of Tokyo"
        );
        // A replica that is not ready is not routed to.
        let none: BTreeMap<ReplicaKey, u32> = BTreeMap::new();
        assert!(routes(&offers, &none, &demand, &RttTable::default(), 10.0)
            .iter()
            .all(|l| l.routes.is_empty()));
    }

    #[test]
    fn weights_are_refused_for_a_service() {
        let w = Policy::Weights(meridian_federation::Weights::default());
        assert!(Objective::of(&w).is_err());
        assert_eq!(
            Objective::of(&Policy::Balanced),
            Ok(Objective::Knee(BALANCED_PREMIUM))
        );
        assert_eq!(
            Objective::of(&Policy::MaxCostPremium(0.05)),
            Ok(Objective::Knee(0.05))
        );
    }
}
