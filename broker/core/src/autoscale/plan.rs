//! Where replicas should be now ([`desired`]): each location served by the best offers within its SLO.

use super::*;

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

pub(super) fn tier_rank(t: Tier) -> u8 {
    match t {
        Tier::Owned => 0,
        Tier::Partner => 1,
        Tier::Cloud => 2,
    }
}

/// An offer as a location sees it: its round trip and what a unit of throughput costs there (USD and grams).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cand {
    pub(super) i: usize,
    pub(super) rtt: f64,
    pub(super) usd: f64,
    pub(super) g: f64,
}

impl Cand {
    /// At the offer's own rates per unit of throughput.
    pub(super) fn of(offers: &[Offer], i: usize, rtt: f64) -> Self {
        Cand {
            i,
            rtt,
            usd: offers[i].usd_per_unit(),
            g: offers[i].g_per_unit(),
        }
    }
}

/// The candidates, best first under `objective` (tier first).
pub(super) fn preference(offers: &[Offer], within: &[Cand], objective: Objective) -> Vec<usize> {
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
pub(super) fn stickiness(running: u32, wanted: u32) -> f64 {
    if running >= wanted {
        1.0
    } else {
        1.0 + STICKINESS
    }
}

/// Adds `amount` of a location's demand to what offer `i` serves of it.
pub(super) fn add_served(served: &mut Vec<(usize, f64)>, i: usize, amount: f64) {
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
