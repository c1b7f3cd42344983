//! Packing demand onto replicas: moves between offers, pool limits, the order replicas leave in.

use super::*;

/// Demand moved by [`Packing`]: (location, to offer, amount).
pub(super) type Move = (usize, usize, f64);

/// The replicas wanted and the demand each serves, as placing location by location left them, and the two
/// passes that tighten them. Placing location by location leaves each pool's last replica part empty: where
/// other replicas wanted have spare throughput within the SLO of the locations a last replica serves, it is
/// given up ([`Packing::consolidate`]); where a small replica elsewhere within reach serves what a large one
/// would mostly idle for, for less under the objective, it takes its place ([`Packing::right_size`]). Demand
/// served outside the SLO stays where it is.
pub(super) struct Packing<'a> {
    pub(super) offers: &'a [Offer],
    pub(super) pools: &'a Pools,
    /// Per offer: replicas running now.
    pub(super) runs: &'a [u32],
    pub(super) reach: &'a [Vec<usize>],
    pub(super) served: &'a mut [Vec<(usize, f64)>],
    pub(super) count: &'a mut [u32],
    pub(super) load: &'a mut [f64],
    pub(super) util: f64,
    pub(super) objective: Objective,
    /// Per offer: its place in [`removal_order`].
    pub(super) removal_rank: Vec<usize>,
}

impl Packing<'_> {
    pub(super) fn per(&self, i: usize) -> f64 {
        self.offers[i].capacity * self.util
    }

    /// What offer `i`'s last replica serves: the load its other replicas could not hold.
    pub(super) fn excess(&self, i: usize) -> f64 {
        self.load[i] - f64::from(self.count[i].saturating_sub(1)) * self.per(i)
    }

    pub(super) fn spare(&self, j: usize) -> f64 {
        (f64::from(self.count[j]) * self.per(j) - self.load[j]).max(0.0)
    }

    /// The offers with replicas, the emptiest last replica first, then in removal order.
    pub(super) fn emptiest_first(&self) -> Vec<usize> {
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
    pub(super) fn consolidate(&mut self) {
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
    pub(super) fn right_size(&mut self) {
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
    pub(super) fn moves(&self, i: usize, to: Option<(usize, f64)>) -> Option<Vec<Move>> {
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

    pub(super) fn apply(&mut self, i: usize, moves: &[Move]) {
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
pub(super) struct Pools {
    /// Per offer: the offers of the same site and pool.
    pub(super) of: Vec<Vec<usize>>,
    pub(super) room: Vec<u32>,
}

impl Pools {
    pub(super) fn of(offers: &[Offer]) -> Self {
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
    pub(super) fn free(&self, i: usize, count: &[u32]) -> u32 {
        let used: u32 = self.of[i].iter().map(|j| count[*j]).sum();
        self.room[i].saturating_sub(used)
    }
}

/// The order in which replicas are given up (first = first removed): cloud before partner before owned, spot
/// before on-demand, then the worst under the service's objective (per unit of throughput).
pub(super) fn removal_order(offers: &[Offer], objective: Objective) -> Vec<usize> {
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
pub(super) fn positions(order: &[usize]) -> Vec<usize> {
    let mut at = vec![0usize; order.len()];
    for (r, i) in order.iter().enumerate() {
        at[*i] = r;
    }
    at
}

/// Brings the total within `min_replicas..=max_replicas`: extra replicas go to the offers that reach the most
/// demand within the SLO (then tier and policy order); replicas over the maximum are given up in removal order.
pub(super) fn clamp_total(
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
