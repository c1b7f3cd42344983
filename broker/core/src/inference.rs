//! Replica planning for inference services: choose replica sites so that user populations are served within
//! a round-trip SLO at least cost, and size replica counts from the request rate.
//!
//! Greedy, largest population first: each population goes to a site that has room within the SLO — the
//! earliest tier first (owned, partner, then cloud), then the lowest price per replica, then the lowest round
//! trip; a population no site can serve within the SLO goes to the nearest site with room (a miss). A site's
//! replica count is `ceil(assigned requests per second / per-replica throughput)`.

use super::latency::RttTable;
use super::model::Site;
use super::placement::user_latency;
use meridian_federation::{GeoPoint, SiteId, Tier, UserLocation};
use std::collections::BTreeMap;

/// A user population of a service.
#[derive(Clone, Debug, PartialEq)]
pub struct Population {
    pub name: String,
    pub location: GeoPoint,
    pub rtt_region: Option<String>,
    /// Peak requests per second from here.
    pub demand_rps: f64,
}

/// Where each population is served and how many replicas each site runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaPlan {
    pub replicas: BTreeMap<SiteId, u32>,
    /// Per population (same order as the input): its site and round trip, or `None` if nothing had room.
    pub served_by: Vec<Option<(SiteId, f64)>>,
}

/// Plans replicas of one service. `milli_per_replica` is the GPU share one replica takes.
pub fn plan_replicas(
    sites: &BTreeMap<SiteId, Site>,
    rtt: &RttTable,
    pops: &[Population],
    slo_ms: f64,
    per_replica_rps: f64,
    milli_per_replica: u32,
) -> ReplicaPlan {
    let mut order: Vec<usize> = (0..pops.len()).collect();
    order.sort_by(|a, b| {
        pops[*b]
            .demand_rps
            .total_cmp(&pops[*a].demand_rps)
            .then(a.cmp(b))
    });
    // Free replica slots per site (GPU pools, healthy devices, whole shares).
    let mut room: BTreeMap<SiteId, u64> = sites
        .values()
        .filter(|s| s.up && !s.draining())
        .map(|s| {
            let slots: u64 = s
                .pools
                .iter()
                .filter(|p| p.kind == meridian_federation::AcceleratorKind::Gpu)
                .flat_map(|p| p.devices.iter())
                .map(|d| u64::from(d.free_milli() / milli_per_replica.max(1)))
                .sum();
            (s.id().clone(), slots)
        })
        .collect();
    let mut assigned_rps: BTreeMap<SiteId, f64> = BTreeMap::new();
    let mut plan = ReplicaPlan {
        replicas: BTreeMap::new(),
        served_by: vec![None; pops.len()],
    };
    for i in order {
        let p = &pops[i];
        let probe = meridian_federation::JobSpec {
            users: vec![UserLocation {
                name: None,
                location: p.location,
                weight: 1.0,
                rtt_region: p.rtt_region.clone(),
            }],
            ..probe_spec()
        };
        let mut options: Vec<(bool, Tier, u64, f64, SiteId)> = Vec::new();
        for s in sites.values() {
            let Some(free) = room.get(s.id()) else {
                continue;
            };
            let have = plan.replicas.get(s.id()).copied().unwrap_or(0);
            let after = assigned_rps.get(s.id()).copied().unwrap_or(0.0) + p.demand_rps;
            let need = (after / per_replica_rps).ceil().max(1.0) as u64;
            if need.saturating_sub(u64::from(have)) > *free {
                continue;
            }
            let price = s
                .pools
                .iter()
                .filter(|q| q.kind == meridian_federation::AcceleratorKind::Gpu)
                .map(|q| q.price_micro_usd_per_hour)
                .min()
                .unwrap_or(u64::MAX);
            let r = user_latency(rtt, s, &probe);
            options.push((r > slo_ms, s.tier(), price, r, s.id().clone()));
        }
        let best = options.into_iter().min_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| {
                    if a.0 {
                        a.3.total_cmp(&b.3)
                    } else {
                        a.1.cmp(&b.1)
                    }
                })
                .then(a.2.cmp(&b.2))
                .then(a.3.total_cmp(&b.3))
                .then(a.4.cmp(&b.4))
        });
        let Some((_, _, _, r, site)) = best else {
            continue;
        };
        let total = assigned_rps.entry(site.clone()).or_default();
        *total += p.demand_rps;
        let need = (*total / per_replica_rps).ceil().max(1.0) as u32;
        let have = plan.replicas.entry(site.clone()).or_default();
        if let Some(free) = room.get_mut(&site) {
            *free = free.saturating_sub(u64::from(need.saturating_sub(*have)));
        }
        *have = need;
        plan.served_by[i] = Some((site, r));
    }
    plan
}

fn probe_spec() -> meridian_federation::JobSpec {
    use meridian_federation::{AcceleratorKind, JobKind, JobSpec, Resources, TenantId};
    let tenant = TenantId::new("planner").unwrap_or_else(|_| unreachable!("literal id"));
    JobSpec::new(
        tenant,
        "probe",
        JobKind::Inference,
        Resources::whole(AcceleratorKind::Gpu, 1),
        "serve",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::site;

    fn sites(adverts: Vec<meridian_federation::SiteAdvert>) -> BTreeMap<SiteId, Site> {
        adverts
            .iter()
            .map(|a| (a.site.id.clone(), Site::from_advert(a, 0)))
            .collect()
    }

    fn pop(name: &str, lat: f64, lon: f64, rps: f64) -> Population {
        Population {
            name: name.into(),
            location: GeoPoint { lat, lon },
            rtt_region: None,
            demand_rps: rps,
        }
    }

    #[test]
    fn each_population_gets_the_cheapest_site_within_the_slo() {
        let s = sites(vec![
            site("edge-fra", Tier::Owned, 50.1, 8.7)
                .gpus("L4", 2, 0.7)
                .build(),
            site("dc-fra-dear", Tier::Owned, 50.0, 8.5)
                .gpus("A100", 8, 3.0)
                .build(),
            site("dc-us", Tier::Owned, 39.0, -77.5)
                .gpus("A100", 8, 1.0)
                .build(),
        ]);
        let pops = [
            pop("Frankfurt", 50.1, 8.7, 3.0),
            pop("NewYork", 40.7, -73.9, 5.0),
        ];
        let plan = plan_replicas(&s, &RttTable::default(), &pops, 50.0, 2.0, 1000);
        assert_eq!(
            plan.served_by[0].as_ref().map(|x| x.0.as_str()),
            Some("edge-fra")
        );
        assert_eq!(
            plan.served_by[1].as_ref().map(|x| x.0.as_str()),
            Some("dc-us")
        );
        assert_eq!(
            plan.replicas.get(&SiteId::new("edge-fra").unwrap()),
            Some(&2)
        );
        assert_eq!(plan.replicas.get(&SiteId::new("dc-us").unwrap()), Some(&3));
    }

    #[test]
    fn a_full_site_sends_the_population_to_the_next_within_the_slo() {
        let s = sites(vec![
            site("edge-fra", Tier::Owned, 50.1, 8.7)
                .gpus("L4", 1, 0.7)
                .build(),
            site("cloud-ams", Tier::Cloud, 52.4, 4.9)
                .gpus("A100", 8, 4.0)
                .build(),
        ]);
        let pops = [pop("Frankfurt", 50.1, 8.7, 5.0)];
        let plan = plan_replicas(&s, &RttTable::default(), &pops, 50.0, 2.0, 1000);
        let (site, rtt) = plan.served_by[0].clone().unwrap();
        assert_eq!(site.as_str(), "cloud-ams");
        assert!(rtt <= 50.0);
    }
}
