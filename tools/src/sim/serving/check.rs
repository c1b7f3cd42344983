//! An independent check of a serving run from its schedule (replicas and routes), the federation files and the
//! demand: it recomputes what it judges from the sites' own figures, not from the engine's offers.
//!
//! It finds: a pool holding more replicas than it has room for; a replica serving before it is ready or after
//! it stopped; a replica serving more than its throughput in a minute; a route longer than the SLO; a city
//! served more than it asked; served totals, cost, energy or carbon that differ from the report's.

use super::demand::DemandMatrix;
use super::engine::{Outcome, Replica};
use crate::sim::federation::SimFederation;
use meridian_core::latency::rtt_ms;
use meridian_core::model::Site;
use meridian_federation::{GeoPoint, ServiceSpec, SiteAdvert, WIRE_VERSION};
use std::collections::BTreeMap;

/// What the checker needs besides the outcome.
pub struct Inputs<'a> {
    pub fed: &'a SimFederation,
    pub spec: &'a ServiceSpec,
    pub cities: &'a [(GeoPoint, Option<String>)],
    pub demand: &'a DemandMatrix,
    pub start_ms: u64,
}

/// The totals a report states, which the checker recomputes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stated {
    pub served: f64,
    pub cost_usd: f64,
    pub energy_kwh: f64,
    pub co2_kg: f64,
}

/// A replica's figures, from its pool in the federation's files.
#[derive(Clone, Copy)]
struct Figures {
    site: usize,
    usd_per_hour: f64,
    kw: f64,
    capacity: f64,
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

/// Every problem found, each said in one line.
pub fn check(inp: &Inputs<'_>, out: &Outcome, stated: Stated) -> Vec<String> {
    let mut bad = Vec::new();
    let minutes = inp.demand.minutes;
    let share = inp.spec.resources.milli_per_replica().max(1);
    // Each replica's site, pool and figures from the federation's files.
    let mut per_replica: Vec<Option<Figures>> = Vec::new();
    for r in &out.replicas {
        let found = inp.fed.sites.iter().enumerate().find_map(|(si, s)| {
            (s.id == r.key.site)
                .then(|| s.pools.iter().find(|p| p.name == r.key.pool))
                .flatten()
                .map(|p| (si, p))
        });
        let Some((si, pool)) = found else {
            bad.push(format!("replica {}: no pool {}", r.id, r.key));
            per_replica.push(None);
            continue;
        };
        let price = if r.key.spot {
            pool.spot_price_micro_usd_per_hour
        } else {
            Some(pool.price_micro_usd_per_hour)
        };
        let Some(price) = price else {
            bad.push(format!(
                "replica {}: {} sells no spot capacity",
                r.id, r.key
            ));
            per_replica.push(None);
            continue;
        };
        let devices = share as f64 / 1000.0;
        let capacity = inp.spec.throughput.per_replica() * inp.fed.throughput.factor(&pool.model);
        let site = &inp.fed.sites[si];
        let kw = f64::from(pool.power_watts) * devices * site.info_at(inp.start_ms).pue / 1000.0;
        per_replica.push(Some(Figures {
            site: si,
            usd_per_hour: price as f64 / 1e6 * devices,
            kw,
            capacity,
        }));
    }
    // Room: replicas of one pool (on-demand and spot counted apart) at every minute.
    let mut slots: BTreeMap<(usize, String, bool), i64> = BTreeMap::new();
    for (r, fig) in out.replicas.iter().zip(&per_replica) {
        let Some(Figures { site: si, .. }) = fig else {
            continue;
        };
        let site = &inp.fed.sites[*si];
        let advert = SiteAdvert {
            v: WIRE_VERSION,
            site: site.info_at(inp.start_ms),
            pools: site.pools.clone(),
            generation: 1,
            draining: false,
            sent_at_ms: inp.start_ms,
        };
        let model = Site::from_advert(&advert, inp.start_ms);
        let room = model
            .pools
            .iter()
            .find(|p| p.name == r.key.pool)
            .map_or(0, |p| match inp.spec.resources.share() {
                Some(_) => p.healthy_devices() as i64 * (1000 / share as i64),
                None => p.healthy_devices() as i64 / i64::from(inp.spec.resources.count.max(1)),
            });
        slots.insert((*si, r.key.pool.to_string(), r.key.spot), room);
    }
    let mut changes: BTreeMap<(usize, String, bool), BTreeMap<usize, i64>> = BTreeMap::new();
    for (r, fig) in out.replicas.iter().zip(&per_replica) {
        let Some(Figures { site: si, .. }) = fig else {
            continue;
        };
        let at = changes
            .entry((*si, r.key.pool.to_string(), r.key.spot))
            .or_default();
        *at.entry(r.start_min).or_default() += 1;
        *at.entry(r.end_min.unwrap_or(minutes)).or_default() -= 1;
    }
    for (pool, at) in &changes {
        let room = slots.get(pool).copied().unwrap_or(0);
        let mut live = 0;
        for (m, d) in at {
            live += d;
            if live > room {
                bad.push(format!(
                    "pool {}/{} holds {live} replicas at minute {m}; it has room for {room}",
                    inp.fed.sites[pool.0].id, pool.1
                ));
                break;
            }
        }
    }
    // Routes.
    let mut load: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    let mut city_served: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    let mut served = 0.0;
    for route in &out.routes {
        let m = route.minute as usize;
        let Some(r) = out.replicas.get(route.replica as usize) else {
            bad.push(format!("route to replica {} that never was", route.replica));
            continue;
        };
        if !(r.ready_min <= m && r.start_min <= m && r.end_min.is_none_or(|e| m < e)) {
            bad.push(format!(
                "replica {} serves at minute {m} but is not ready then",
                r.id
            ));
        }
        if let (Some(Some(Figures { site: si, .. })), Some((loc, region))) =
            (per_replica.get(r.id), inp.cities.get(route.city as usize))
        {
            let info = inp.fed.sites[*si].info_at(inp.start_ms);
            let rtt = rtt_ms(
                &inp.fed.rtt,
                *loc,
                region.as_deref(),
                info.location,
                info.rtt_region.as_deref(),
            );
            if rtt > inp.spec.slo_ms {
                bad.push(format!(
                    "city {} is served by replica {} at {rtt:.1} ms, beyond the {} ms SLO",
                    route.city, r.id, inp.spec.slo_ms
                ));
            }
        }
        *load.entry((route.minute, route.replica)).or_default() += route.amount;
        *city_served.entry((route.minute, route.city)).or_default() += route.amount;
        served += route.amount;
    }
    for ((m, i), amount) in &load {
        if let Some(Some(Figures { capacity, .. })) = per_replica.get(*i as usize) {
            if *amount > capacity * 60.0 * (1.0 + 1e-9) {
                bad.push(format!(
                    "replica {i} serves {amount:.1} in minute {m}; its throughput is {:.1}",
                    capacity * 60.0
                ));
            }
        }
    }
    for ((m, c), amount) in &city_served {
        let asked = inp.demand.at(*m as usize, *c as usize);
        if *amount > asked * (1.0 + 1e-9) + 1e-9 {
            bad.push(format!(
                "city {c} is served {amount:.1} in minute {m}; it asked {asked:.1}"
            ));
        }
    }
    if !close(served, stated.served) {
        bad.push(format!(
            "the routes serve {served:.1}; the report says {:.1}",
            stated.served
        ));
    }
    // Money, energy and carbon from each replica's minutes.
    let (mut cost, mut kwh, mut g) = (0.0, 0.0, 0.0);
    for (r, fig) in out.replicas.iter().zip(&per_replica) {
        let Some(Figures {
            site: si,
            usd_per_hour: usd_h,
            kw,
            ..
        }) = fig
        else {
            continue;
        };
        for m in r.start_min..r.end_min.unwrap_or(minutes) {
            let t = inp.start_ms + m as u64 * 60_000;
            cost += usd_h / 60.0;
            kwh += kw / 60.0;
            g += kw / 60.0 * f64::from(inp.fed.sites[*si].intensity_at(t));
        }
    }
    for (what, mine, theirs) in [
        ("cost (USD)", cost, stated.cost_usd),
        ("energy (kWh)", kwh, stated.energy_kwh),
        ("carbon (kgCO2e)", g / 1000.0, stated.co2_kg),
    ] {
        if !close(mine, theirs) {
            bad.push(format!(
                "{what}: the replicas' minutes come to {mine:.3}; the report says {theirs:.3}"
            ));
        }
    }
    bad
}

/// The totals of an outcome, as the report states them.
pub fn stated(out: &Outcome) -> Stated {
    let sum = |f: fn(&Replica) -> f64| out.replicas.iter().map(f).sum::<f64>();
    Stated {
        served: out.served,
        cost_usd: sum(|r| r.cost_usd),
        energy_kwh: sum(|r| r.energy_kwh),
        co2_kg: sum(|r| r.co2_g) / 1000.0,
    }
}
