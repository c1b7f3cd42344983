//! Benchmarks: `meridian bench dispatch` (see [`dispatch`]) and, here, `meridian bench placement`: decision
//! latency over a large synthetic federation, with the site index and, in the same run, by a plain scan of
//! every site.
//!
//! The federation is loaded the way a busy one is: each site has one or two pools (A100, H100, L4) of 8-64
//! devices, each device busy with probability 0.9, so that a job's candidates are a small part of the sites.
//! Requests mix 1, 2, 4 and 8 GPUs and milli-shares under all four policies, from users in random cities.
#![allow(clippy::disallowed_methods)] // a benchmark: reads the clock

pub mod adverts;
pub mod dispatch;
pub mod queue;

use crate::sim::trace::{city, SplitMix64, CITIES};
use meridian_core::index::SiteIndex;
use meridian_core::latency::RttTable;
use meridian_core::model::Site;
use meridian_core::placement::{place, Request, View};
use meridian_core::regions::Regions;
use meridian_core::throughput::Throughput;
use meridian_federation::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// A synthetic federation and requests for it.
pub struct Bench {
    pub sites: BTreeMap<SiteId, Site>,
    pub index: SiteIndex,
    pub jobs: Vec<JobSpec>,
    pub rtt: RttTable,
    pub regions: Regions,
    pub throughput: Throughput,
}

/// The policies the requests cycle through, by the name `p50_us_by_policy` and the micro-benchmark give them.
pub const POLICIES: [(&str, Policy); 6] = [
    ("latency", Policy::Latency),
    ("cost", Policy::Cost),
    ("green", Policy::Green),
    ("balanced", Policy::Balanced),
    ("carbon-price", Policy::CarbonPriceUsdPerT(190.0)),
    ("max-cost-premium", Policy::MaxCostPremium(0.05)),
];

const MODELS: [(&str, u64, u32, f64); 3] = [
    ("A100", 81_920, 400, 1.99),
    ("H100", 81_920, 700, 3.99),
    ("L4", 24_576, 72, 0.56),
];

impl Bench {
    pub fn new(n_sites: usize, n_jobs: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut sites = BTreeMap::new();
        for i in 0..n_sites {
            let advert = synthetic_advert(i, &mut rng);
            let site = Site::from_advert(&advert, 0);
            sites.insert(site.id().clone(), site);
        }
        let mut index = SiteIndex::default();
        for s in sites.values() {
            index.update(s, &Throughput::default());
        }
        let policies = POLICIES.map(|(_, p)| p);
        let jobs = (0..n_jobs)
            .map(|i| {
                let (count, milli) = match rng.next_u64() % 10 {
                    0..=4 => (1, None),
                    5 | 6 => (2, None),
                    7 => (4, None),
                    8 => (8, None),
                    _ => (0, Some(250)),
                };
                let (name, location) = city(rng.weighted(&CITIES.map(|c| c.1)));
                let tenant = TenantId::new("bench").unwrap_or_else(|_| unreachable!("valid id"));
                let resources = match milli {
                    Some(m) => Resources::shared(AcceleratorKind::Gpu, m),
                    None => Resources::whole(AcceleratorKind::Gpu, count),
                };
                let mut spec = JobSpec::new(
                    tenant,
                    format!("b{i}"),
                    JobKind::Training,
                    resources,
                    "true",
                );
                spec.duration_s = Some(3600);
                spec.users = vec![UserLocation {
                    name: Some(name.into()),
                    location,
                    weight: 1.0,
                    rtt_region: None,
                }];
                spec.policy = Some(policies[i % policies.len()].clone());
                spec
            })
            .collect();
        Bench {
            sites,
            index,
            jobs,
            rtt: RttTable::default(),
            regions: Regions::default(),
            throughput: Throughput::default(),
        }
    }

    /// One decision for job `i`, with or without the index; returns whether it placed the job.
    pub fn decide(&self, i: usize, indexed: bool) -> bool {
        let view = View {
            sites: &self.sites,
            rtt: &self.rtt,
            regions: &self.regions,
            throughput: &self.throughput,
            index: indexed.then_some(&self.index),
            format: meridian_core::durable::FORMAT_VERSION,
        };
        let d = place(
            view,
            Request {
                spec: &self.jobs[i % self.jobs.len()],
                waited_ms: 0,
                refused: &[],
                capped: &[],
                baseline: None,
                spent: Default::default(),
                queue_policy: None,
            },
            0,
        );
        matches!(d.outcome, meridian_core::placement::Outcome::Place(_))
    }
}

/// Site `i` of a synthetic federation: one or two pools (A100, H100, L4) of 8-64 devices, each device busy
/// with probability 0.9, in a random city of the trace's list.
pub fn synthetic_advert(i: usize, rng: &mut SplitMix64) -> SiteAdvert {
    let (_, at) = city(rng.weighted(&CITIES.map(|c| c.1)));
    let tier = Tier::ALL[(rng.next_u64() % 3) as usize];
    let pools = (0..1 + rng.next_u64() % 2)
        .map(|p| {
            let (model, mem, watts, price) = MODELS[(rng.next_u64() % 3) as usize];
            let count = 8 * (1 + (rng.next_u64() % 8) as u32);
            PoolAdvert {
                name: format!("p{p}").into(),
                kind: AcceleratorKind::Gpu,
                vendor: "nvidia".into(),
                model: model.into(),
                memory_mib: mem,
                count,
                devices_per_node: 8,
                interconnect: Interconnect::Nvlink,
                power_watts: watts,
                measured_power_watts: None,
                sharing: Sharing {
                    milli: true,
                    mig_profiles: vec![],
                },
                price_micro_usd_per_hour: (price * 1e6 * (0.8 + 0.4 * rng.next_f64())) as u64,
                spot_price_micro_usd_per_hour: None,
                devices: (0..count)
                    .map(|index| DeviceState {
                        index,
                        healthy: true,
                        used_milli: if rng.next_f64() < 0.9 { 1000 } else { 0 },
                    })
                    .collect(),
            }
        })
        .collect();
    SiteAdvert {
        v: WIRE_VERSION,
        site: SiteInfo {
            id: SiteId::new(format!("site-{i:05}")).unwrap_or_else(|_| unreachable!("valid id")),
            kind: SiteKind::Datacenter,
            tier,
            location: GeoPoint {
                lat: (at.lat + rng.next_f64() * 4.0 - 2.0).clamp(-89.0, 89.0),
                lon: (at.lon + rng.next_f64() * 4.0 - 2.0).clamp(-179.0, 179.0),
            },
            region_tags: vec![],
            rtt_region: None,
            pue: 1.1 + rng.next_f64() * 0.6,
            carbon: Carbon {
                g_per_kwh: (20.0 + rng.next_f64() * 600.0) as u32,
                ..Carbon::default()
            },
            energy_micro_usd_per_kwh: 0,
            egress_micro_usd_per_gb: 90_000,
            datasets: vec![],
            backend: None,
        },
        pools,
        generation: 1,
        draining: false,
        sent_at_ms: 0,
    }
}

#[derive(Serialize)]
pub struct PlacementFigures {
    pub sites: usize,
    pub decisions_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub full_scan_p50_us: f64,
    pub full_scan_p99_us: f64,
    /// Decisions the full-scan baseline timed: fewer than `decisions` at large
    /// federations, where each one reads every pool.
    pub full_scan_decisions: usize,
    pub placed_share: f64,
    /// p50 with the index, per policy, µs.
    pub p50_us_by_policy: BTreeMap<String, f64>,
}

/// The full scan costs time in proportion to the sites, so the baseline times
/// about 20 million site visits at most (every decision up to 10,000 sites at
/// the default 2,000 decisions), and never fewer than 100 decisions.
fn full_scan_decisions(n_sites: usize, decisions: usize) -> usize {
    (20_000_000 / n_sites.max(1)).max(100).min(decisions)
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

/// Times `decisions` decisions with the index and the same decisions by a full scan.
pub fn placement(n_sites: usize, decisions: usize) -> PlacementFigures {
    let b = Bench::new(n_sites, decisions, 42);
    let mut placed = 0usize;
    let mut times = Vec::with_capacity(decisions);
    let started = Instant::now();
    for i in 0..decisions {
        let t = Instant::now();
        placed += usize::from(b.decide(i, true));
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total = started.elapsed().as_secs_f64();
    let scan_decisions = full_scan_decisions(n_sites, decisions);
    let mut scan = Vec::with_capacity(scan_decisions);
    for i in 0..scan_decisions {
        let t = Instant::now();
        b.decide(i, false);
        scan.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut by_policy: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (i, t) in times.iter().enumerate() {
        let name = b.jobs[i % b.jobs.len()]
            .policy
            .as_ref()
            .map_or("default", Policy::name);
        by_policy.entry(name.to_owned()).or_default().push(*t);
    }
    let (p50, p99) = percentiles(times);
    let (s50, s99) = percentiles(scan);
    let r = |x: f64| (x * 100.0).round() / 100.0;
    PlacementFigures {
        sites: n_sites,
        decisions_per_s: (decisions as f64 / total).round(),
        p50_us: r(p50),
        p99_us: r(p99),
        full_scan_p50_us: r(s50),
        full_scan_p99_us: r(s99),
        full_scan_decisions: scan_decisions,
        placed_share: r(placed as f64 / decisions as f64),
        p50_us_by_policy: by_policy
            .into_iter()
            .map(|(k, v)| (k, r(percentiles(v).0)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::full_scan_decisions;

    #[test]
    fn the_full_scan_times_every_decision_up_to_ten_thousand_sites_and_fewer_beyond() {
        assert_eq!(full_scan_decisions(1_000, 2_000), 2_000);
        assert_eq!(full_scan_decisions(10_000, 2_000), 2_000);
        assert_eq!(full_scan_decisions(100_000, 2_000), 200);
        assert_eq!(full_scan_decisions(1_000_000, 2_000), 100);
        assert_eq!(full_scan_decisions(1_000_000, 50), 50);
        assert_eq!(full_scan_decisions(0, 10), 10);
    }
}
