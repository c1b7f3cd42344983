//! The serving simulator's clock: one step a minute. At each step the scaling rule under test sees the demand
//! of the minute before (the autoscaler's window), starts and stops replicas, and the minute's demand is served
//! by the replicas ready then: each city's requests as the routing table weights them, then, where those were
//! full, to the nearest other ready replicas within the SLO with throughput to spare; what finds none is missed.
//!
//! The service runs alone on the federation. A replica serves from `startup` minutes after it starts, and is
//! billed and metered (its pool's price, power × share × PUE, the site's grid intensity of the hour) from its
//! start to its stop. Replicas started at the first minute are ready at once (every run starts warm).

use super::demand::DemandMatrix;
use crate::sim::federation::SimFederation;
use meridian_core::autoscale::{
    desired, offers, routes, LocationDemand, Objective, Offer, Present, ReplicaKey, Scaler,
    Settings,
};
use meridian_core::durable::FORMAT_VERSION;
use meridian_core::latency::rtt_ms;
use meridian_core::model::Site;
use meridian_core::placement::View;
use meridian_federation::{JobSpec, ServiceSpec, SiteAdvert, SiteId, WIRE_VERSION};
use serde::Serialize;
use std::collections::BTreeMap;

const MINUTE_MS: u64 = 60_000;

/// How a run scales the service.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaling {
    /// Meridian's autoscaler under an objective.
    Autoscaler(Objective),
    /// Replicas planned once for each city's peak, never changed (the broker's behaviour before services).
    StaticPeak,
    /// SkyServe-style: a replica count from the rate over `target_qps_per_replica` (the reference throughput
    /// × the target utilisation), 300 s up and 1,200 s down delays, each new replica at the cheapest offer (price
    /// per unit of throughput), the dearest removed first. Global: one service over all cities, placing within
    /// the SLO of some city; per region: one service per user region, placing within the SLO of its cities.
    SkyServe { per_region: bool },
}

/// One replica's life.
#[derive(Clone, Debug, Serialize)]
pub struct Replica {
    pub id: usize,
    pub key: ReplicaKey,
    pub start_min: usize,
    pub ready_min: usize,
    /// The minute it stopped (it runs up to, not including, this minute); `None` if it ran to the end.
    pub end_min: Option<usize>,
    /// What it serves per second at full throughput, in the service's unit.
    pub capacity: f64,
    pub cost_usd: f64,
    pub energy_kwh: f64,
    pub co2_g: f64,
}

impl Replica {
    pub fn live_at(&self, m: usize) -> bool {
        self.start_min <= m && self.end_min.is_none_or(|e| m < e)
    }

    pub fn ready_at(&self, m: usize) -> bool {
        self.ready_min <= m && self.live_at(m)
    }
}

/// Demand of a city in a minute served by a replica.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Route {
    pub minute: u32,
    pub city: u32,
    pub replica: u32,
    pub amount: f64,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub replicas: Vec<Replica>,
    pub routes: Vec<Route>,
    pub demand: f64,
    pub served: f64,
    /// Demand of cities that had no ready replica within the SLO.
    pub unreached: f64,
    /// Demand that found the replicas within the SLO full.
    pub overflow: f64,
    /// Changes of a replica count (one per pool changed per step).
    pub scale_events: usize,
    pub peak_replicas: usize,
}

/// What every run of one simulation shares.
pub struct Ctx<'a> {
    pub fed: &'a SimFederation,
    pub spec: &'a ServiceSpec,
    pub replica: JobSpec,
    pub cities: Vec<LocationDemand>,
    pub demand: &'a DemandMatrix,
    pub start_ms: u64,
    pub startup_min: usize,
    pub settings: Settings,
    /// Round trip from each city to each site, by the site's index in `fed.sites`.
    pub rtt: Vec<Vec<f64>>,
    site_index: BTreeMap<SiteId, usize>,
}

impl<'a> Ctx<'a> {
    pub fn new(
        fed: &'a SimFederation,
        spec: &'a ServiceSpec,
        cities: Vec<LocationDemand>,
        demand: &'a DemandMatrix,
        start_ms: u64,
        startup_min: usize,
        settings: Settings,
    ) -> Self {
        let rtt = cities
            .iter()
            .map(|c| {
                fed.sites
                    .iter()
                    .map(|s| {
                        let info = s.info_at(start_ms);
                        rtt_ms(
                            &fed.rtt,
                            c.location,
                            c.rtt_region.as_deref(),
                            info.location,
                            info.rtt_region.as_deref(),
                        )
                    })
                    .collect()
            })
            .collect();
        Ctx {
            fed,
            spec,
            replica: spec.replica_spec(0),
            cities,
            demand,
            start_ms,
            startup_min,
            settings,
            rtt,
            site_index: fed
                .sites
                .iter()
                .enumerate()
                .map(|(i, s)| (s.id.clone(), i))
                .collect(),
        }
    }

    pub fn site_of(&self, key: &ReplicaKey) -> usize {
        self.site_index.get(&key.site).copied().unwrap_or(0)
    }

    /// The offers of the hour holding `t` (grid intensity changes by the hour).
    pub fn offers_at(&self, t: u64) -> Vec<Offer> {
        let sites: BTreeMap<SiteId, Site> = self
            .fed
            .sites
            .iter()
            .map(|s| {
                let advert = SiteAdvert {
                    v: WIRE_VERSION,
                    site: s.info_at(t),
                    pools: s.pools.clone(),
                    generation: 1,
                    draining: false,
                    sent_at_ms: t,
                };
                (s.id.clone(), Site::from_advert(&advert, t))
            })
            .collect();
        let view = View {
            sites: &sites,
            rtt: &self.fed.rtt,
            regions: &self.fed.regions,
            throughput: &self.fed.throughput,
            index: None,
            format: FORMAT_VERSION,
        };
        offers(
            view,
            &self.replica,
            self.spec.throughput.per_replica(),
            self.spec.spot,
        )
    }

    fn measured(&self, m: usize) -> Vec<LocationDemand> {
        let row = self.demand.minute(m);
        self.cities
            .iter()
            .zip(row)
            .map(|(c, amount)| LocationDemand {
                rate: amount / 60.0,
                ..c.clone()
            })
            .collect()
    }
}

/// The running state of one run.
struct Run<'c, 'a> {
    ctx: &'c Ctx<'a>,
    out: Outcome,
    live: Vec<usize>,
}

impl Run<'_, '_> {
    fn start(&mut self, offer: &Offer, m: usize) {
        let ready = if m == 0 { 0 } else { m + self.ctx.startup_min };
        let id = self.out.replicas.len();
        self.out.replicas.push(Replica {
            id,
            key: offer.key.clone(),
            start_min: m,
            ready_min: ready,
            end_min: None,
            capacity: offer.capacity,
            cost_usd: 0.0,
            energy_kwh: 0.0,
            co2_g: 0.0,
        });
        self.live.push(id);
    }

    /// Stops `n` replicas of `key`: those still starting first, then the newest.
    fn stop(&mut self, key: &ReplicaKey, n: u32, m: usize) {
        let mut of_key: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|i| &self.out.replicas[*i].key == key)
            .collect();
        of_key.sort_by_key(|i| {
            let r = &self.out.replicas[*i];
            (
                r.ready_at(m),
                std::cmp::Reverse(r.start_min),
                std::cmp::Reverse(*i),
            )
        });
        for i in of_key.into_iter().take(n as usize) {
            self.out.replicas[i].end_min = Some(m);
        }
        let replicas = &self.out.replicas;
        self.live.retain(|i| replicas[*i].end_min.is_none());
    }

    fn present(&self, m: usize) -> BTreeMap<ReplicaKey, Present> {
        let mut out: BTreeMap<ReplicaKey, Present> = BTreeMap::new();
        for i in &self.live {
            let r = &self.out.replicas[*i];
            let p = out.entry(r.key.clone()).or_default();
            if r.ready_at(m) {
                p.ready += 1;
            } else {
                p.starting += 1;
            }
        }
        out
    }

    /// Bills and meters the live replicas for minute `m`.
    fn meter(&mut self, offers: &[Offer], by_key: &BTreeMap<ReplicaKey, usize>) {
        for i in &self.live {
            let r = &mut self.out.replicas[*i];
            if let Some(o) = by_key.get(&r.key).map(|k| &offers[*k]) {
                r.cost_usd += o.usd_per_hour / 60.0;
                r.energy_kwh += o.kw / 60.0;
                r.co2_g += o.g_co2_per_hour / 60.0;
            }
        }
    }

    /// Serves minute `m`'s demand with the replicas ready then: each city's requests first as the routing
    /// table (built from the minute before's demand) weights them, then what found those replicas full to the
    /// nearest other replicas within the SLO with throughput to spare.
    fn serve(&mut self, m: usize, offers: &[Offer]) {
        let ctx = self.ctx;
        let ready: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|i| self.out.replicas[*i].ready_at(m))
            .collect();
        let mut spare: BTreeMap<usize, f64> = ready
            .iter()
            .map(|i| (*i, self.out.replicas[*i].capacity * 60.0))
            .collect();
        let mut by_key: BTreeMap<ReplicaKey, Vec<usize>> = BTreeMap::new();
        for i in &ready {
            by_key
                .entry(self.out.replicas[*i].key.clone())
                .or_default()
                .push(*i);
        }
        let counts: BTreeMap<ReplicaKey, u32> = by_key
            .iter()
            .map(|(k, v)| (k.clone(), v.len() as u32))
            .collect();
        let table = routes(
            offers,
            &counts,
            &ctx.measured(m.saturating_sub(1)),
            &ctx.fed.rtt,
            ctx.settings.slo_ms,
        );
        let row = ctx.demand.minute(m);
        let mut left: Vec<f64> = row.to_vec();
        let mut take = |out: &mut Outcome, c: usize, i: usize, want: f64, left: &mut f64| {
            let room = spare.get(&i).copied().unwrap_or(0.0);
            let amount = room.min(want).min(*left);
            if amount > 0.0 {
                spare.insert(i, room - amount);
                *left -= amount;
                out.served += amount;
                out.routes.push(Route {
                    minute: m as u32,
                    city: c as u32,
                    replica: i as u32,
                    amount,
                });
            }
            amount
        };
        for (c, lr) in table.iter().enumerate() {
            for r in &lr.routes {
                let mut share = row[c] * r.weight;
                for i in by_key.get(&r.key).into_iter().flatten() {
                    share -= take(&mut self.out, c, *i, share, &mut left[c]);
                    if share <= 0.0 {
                        break;
                    }
                }
            }
        }
        for c in (0..ctx.cities.len()).filter(|c| row[*c] > 0.0) {
            self.out.demand += row[c];
            let mut near: Vec<(f64, usize)> = ready
                .iter()
                .map(|i| (ctx.rtt[c][ctx.site_of(&self.out.replicas[*i].key)], *i))
                .filter(|(r, _)| *r <= ctx.settings.slo_ms)
                .collect();
            if near.is_empty() {
                self.out.unreached += left[c];
                continue;
            }
            near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for (_, i) in near {
                if left[c] <= 0.0 {
                    break;
                }
                let want = left[c];
                take(&mut self.out, c, i, want, &mut left[c]);
            }
            self.out.overflow += left[c].max(0.0);
        }
    }
}

/// A replica count held with SkyServe's delays: up to the lowest target of the last `up_ms`, down to the
/// highest of the last `down_ms`.
#[derive(Default)]
struct CountHistory(Vec<(u64, f64)>);

impl CountHistory {
    fn level(&self, now: u64, delay: u64, pick: fn(f64, f64) -> f64) -> Option<f64> {
        let start = now.saturating_sub(delay);
        let first = self.0.iter().rposition(|(t, _)| *t <= start)?;
        self.0[first..].iter().map(|(_, n)| *n).reduce(pick)
    }
}

/// Runs one scaling rule over the whole demand.
pub fn run(ctx: &Ctx<'_>, scaling: Scaling) -> Outcome {
    let mut run = Run {
        ctx,
        out: Outcome::default(),
        live: Vec::new(),
    };
    let mut scaler = Scaler::default();
    let mut groups = match scaling {
        Scaling::SkyServe { per_region } => sky_groups(ctx, per_region),
        _ => Vec::new(),
    };
    let mut offers = Vec::new();
    let mut by_key: BTreeMap<ReplicaKey, usize> = BTreeMap::new();
    let mut hour = u64::MAX;
    let s = &ctx.settings;
    for m in 0..ctx.demand.minutes {
        let t = ctx.start_ms + m as u64 * MINUTE_MS;
        if t / 3_600_000 != hour {
            hour = t / 3_600_000;
            offers = ctx.offers_at(t);
            by_key = offers
                .iter()
                .enumerate()
                .map(|(i, o)| (o.key.clone(), i))
                .collect();
        }
        let seen = ctx.measured(m.saturating_sub(1));
        match scaling {
            Scaling::Autoscaler(objective) => {
                let settings = Settings {
                    objective,
                    ..s.clone()
                };
                let present = run.present(m);
                let (_, changes) =
                    scaler.step(t, &offers, &seen, &present, &ctx.fed.rtt, &settings);
                run.out.scale_events += changes.len();
                for c in changes {
                    if c.to > c.from {
                        if let Some(o) = by_key.get(&c.key).map(|i| offers[*i].clone()) {
                            for _ in c.from..c.to {
                                run.start(&o, m);
                            }
                        }
                    } else {
                        run.stop(&c.key, c.from - c.to, m);
                    }
                }
            }
            Scaling::StaticPeak if m == 0 => {
                let peak: Vec<LocationDemand> = ctx
                    .cities
                    .iter()
                    .enumerate()
                    .map(|(c, l)| LocationDemand {
                        rate: (0..ctx.demand.minutes)
                            .map(|m| ctx.demand.at(m, c))
                            .fold(0.0, f64::max)
                            / 60.0,
                        ..l.clone()
                    })
                    .collect();
                let settings = Settings {
                    objective: Objective::Cost,
                    ..s.clone()
                };
                let plan = desired(&offers, &peak, &ctx.fed.rtt, &settings);
                for (key, n) in &plan.replicas {
                    if let Some(o) = by_key.get(key).map(|i| offers[*i].clone()) {
                        for _ in 0..*n {
                            run.start(&o, 0);
                        }
                    }
                }
                run.out.scale_events += plan.replicas.len();
            }
            Scaling::StaticPeak => {}
            Scaling::SkyServe { .. } => {
                for g in &mut groups {
                    skyserve_step(&mut run, g, &offers, &seen, m, t);
                }
            }
        }
        run.out.peak_replicas = run.out.peak_replicas.max(run.live.len());
        run.meter(&offers, &by_key);
        run.serve(m, &offers);
    }
    run.out
}

/// One SkyServe-style service: the cities whose rate it scales on and the offers it may place in.
struct SkyGroup {
    cities: Vec<usize>,
    /// Indices of `fed.sites` it may place in.
    sites: Vec<usize>,
    counts: CountHistory,
    replicas: Vec<usize>,
}

/// The SkyServe-style services of a run: one over every city (placing anywhere within the SLO of some city), or
/// one per cloud region of the federation, over the cities nearest to it (placing within the SLO of all of them,
/// or else of any): a deployment per region, each user routed to its nearest.
fn sky_groups(ctx: &Ctx<'_>, per_region: bool) -> Vec<SkyGroup> {
    let clouds: Vec<usize> = (0..ctx.fed.sites.len())
        .filter(|s| ctx.fed.sites[*s].file.tier == meridian_federation::Tier::Cloud)
        .collect();
    let mut by_region: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for c in 0..ctx.cities.len() {
        let key = if per_region {
            clouds
                .iter()
                .copied()
                .min_by(|a, b| ctx.rtt[c][*a].total_cmp(&ctx.rtt[c][*b]))
        } else {
            None
        };
        by_region.entry(key).or_default().push(c);
    }
    let slo = ctx.settings.slo_ms;
    by_region
        .into_values()
        .map(|cities| {
            let near = |all: bool| -> Vec<usize> {
                (0..ctx.fed.sites.len())
                    .filter(|s| {
                        let mut it = cities.iter().map(|c| ctx.rtt[*c][*s] <= slo);
                        if all {
                            it.all(|x| x)
                        } else {
                            it.any(|x| x)
                        }
                    })
                    .collect()
            };
            let mut sites = if per_region { near(true) } else { Vec::new() };
            if sites.is_empty() {
                sites = near(false);
            }
            SkyGroup {
                cities,
                sites,
                counts: CountHistory::default(),
                replicas: Vec::new(),
            }
        })
        .collect()
}

fn skyserve_step(
    run: &mut Run<'_, '_>,
    g: &mut SkyGroup,
    offers: &[Offer],
    seen: &[LocationDemand],
    m: usize,
    t: u64,
) {
    let ctx = run.ctx;
    let s = &ctx.settings;
    let replicas_live = &run.out.replicas;
    g.replicas.retain(|i| replicas_live[*i].end_min.is_none());
    let reference = ctx.spec.throughput.per_replica().max(1e-9);
    let total: f64 = g.cities.iter().map(|c| seen[*c].rate).sum();
    let floor = if total > 0.0 { 1.0 } else { 0.0 };
    let target = (total / (reference * s.utilization))
        .ceil()
        .max(floor)
        .min(f64::from(s.max_replicas));
    g.counts.0.push((t, target));
    let keep_from = t.saturating_sub(1_200_000);
    while g.counts.0.len() > 1 && g.counts.0[1].0 <= keep_from {
        g.counts.0.remove(0);
    }
    // Live capacity in replicas of the reference model.
    let units: f64 = g
        .replicas
        .iter()
        .map(|i| run.out.replicas[*i].capacity / reference)
        .sum();
    let starting = g.replicas.iter().any(|i| !run.out.replicas[*i].ready_at(m));
    let up = g.counts.level(t, 300_000, f64::min);
    let down = g.counts.level(t, 1_200_000, f64::max);
    let goal = if m == 0 {
        target
    } else if let Some(u) = up.filter(|u| *u > units + 1e-9) {
        u
    } else if let Some(d) = down.filter(|d| *d + 1.0 <= units && !starting) {
        d
    } else {
        return;
    };
    let per = |o: &Offer| o.usd_per_hour / o.capacity.max(1e-9);
    let mut units = units;
    if goal > units {
        // The cheapest per unit of throughput first, among the group's sites.
        let mut order: Vec<usize> = (0..offers.len())
            .filter(|i| g.sites.contains(&ctx.site_of(&offers[*i].key)))
            .collect();
        order.sort_by(|a, b| {
            per(&offers[*a])
                .total_cmp(&per(&offers[*b]))
                .then(offers[*a].key.cmp(&offers[*b].key))
        });
        let before = run.live.len();
        for i in order {
            let o = &offers[i];
            let mut here = run
                .live
                .iter()
                .filter(|r| run.out.replicas[**r].key == o.key)
                .count() as u32;
            while units + 1e-9 < goal && here < o.room {
                g.replicas.push(run.out.replicas.len());
                run.start(o, m);
                units += o.capacity / reference;
                here += 1;
            }
            if units + 1e-9 >= goal {
                break;
            }
        }
        run.out.scale_events += usize::from(run.live.len() != before);
    } else {
        // The dearest first, while what is left still meets the goal.
        let price = |r: &Replica| offers.iter().find(|o| o.key == r.key).map_or(f64::MAX, per);
        let mut dearest = g.replicas.clone();
        dearest.sort_by(|a, b| {
            price(&run.out.replicas[*b])
                .total_cmp(&price(&run.out.replicas[*a]))
                .then(b.cmp(a))
        });
        let mut stopped = false;
        for i in dearest {
            let u = run.out.replicas[i].capacity / reference;
            if units - u + 1e-9 >= goal {
                run.out.replicas[i].end_min = Some(m);
                units -= u;
                stopped = true;
            }
        }
        let replicas = &run.out.replicas;
        run.live.retain(|i| replicas[*i].end_min.is_none());
        g.replicas.retain(|i| replicas[*i].end_min.is_none());
        run.out.scale_events += usize::from(stopped);
    }
}
