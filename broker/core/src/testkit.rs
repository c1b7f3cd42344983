//! Builders for tests of the core: sites, jobs and a reactor driven step by step with invariant checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::journal::MemoryJournal;
use super::latency::RttTable;
use super::reactor::{Command, CoreConfig, Event, Reactor, Response};
use super::regions::{parse_geojson, Regions};
use super::Millis;
use meridian_federation::*;

/// A coarse box around central Europe, enough for residency tests.
pub const EU_BOX: &str =
    r#"{"type":"Polygon","coordinates":[[[-10,36],[30,36],[30,60],[-10,60],[-10,36]]]}"#;

pub fn regions() -> Regions {
    let mut r = Regions::default();
    if let Ok(area) = parse_geojson(EU_BOX) {
        r.insert("eu", area);
    }
    r
}

/// A site with one GPU pool.
#[derive(Clone, Debug)]
pub struct SiteBuilder {
    pub advert: SiteAdvert,
}

pub fn site(id: &str, tier: Tier, lat: f64, lon: f64) -> SiteBuilder {
    let kind = match tier {
        Tier::Cloud => SiteKind::Cloud,
        _ => SiteKind::Datacenter,
    };
    SiteBuilder {
        advert: SiteAdvert {
            v: 1,
            site: SiteInfo {
                id: SiteId::new(id).unwrap_or_else(|e| panic!("{e}")),
                kind,
                tier,
                location: GeoPoint { lat, lon },
                region_tags: vec![],
                rtt_region: None,
                pue: 1.2,
                carbon: Carbon {
                    g_per_kwh: 300,
                    ..Carbon::default()
                },
                energy_micro_usd_per_kwh: 0,
                egress_micro_usd_per_gb: 90_000,
                datasets: vec![],
                backend: None,
            },
            pools: vec![],
            generation: 1,
            draining: false,
            sent_at_ms: 0,
        },
    }
}

impl SiteBuilder {
    /// How the site runs its work, as its agent advertises it.
    pub fn backend(mut self, kind: meridian_federation::BackendKind) -> Self {
        self.advert.site.backend = Some(kind);
        self
    }

    pub fn gpus(mut self, model: &str, count: u32, price_usd: f64) -> Self {
        self.advert.pools.push(PoolAdvert {
            name: format!("p{}", self.advert.pools.len()).into(),
            kind: AcceleratorKind::Gpu,
            vendor: "nvidia".into(),
            model: model.into(),
            memory_mib: 81_920,
            count,
            devices_per_node: 8,
            interconnect: Interconnect::Nvlink,
            power_watts: 400,
            measured_power_watts: None,
            sharing: Sharing {
                milli: true,
                mig_profiles: vec![],
            },
            price_micro_usd_per_hour: (price_usd * 1e6) as u64,
            spot_price_micro_usd_per_hour: None,
            devices: DeviceState::all_free(count),
        });
        self
    }

    /// The last pool added also sells spot capacity at this price.
    pub fn spot(mut self, price_usd: f64) -> Self {
        if let Some(p) = self.advert.pools.last_mut() {
            p.spot_price_micro_usd_per_hour = Some((price_usd * 1e6) as u64);
        }
        self
    }

    pub fn carbon(mut self, g: u32) -> Self {
        self.advert.site.carbon.g_per_kwh = g;
        self
    }

    pub fn pue(mut self, pue: f64) -> Self {
        self.advert.site.pue = pue;
        self
    }

    pub fn dataset(mut self, name: &str, bytes: u64) -> Self {
        self.advert.site.datasets.push(Dataset {
            name: name.into(),
            size_bytes: bytes,
        });
        self
    }

    pub fn used(mut self, device: usize, milli: u32) -> Self {
        if let Some(p) = self.advert.pools.last_mut() {
            p.devices[device].used_milli = milli;
        }
        self
    }

    pub fn build(self) -> SiteAdvert {
        self.advert
    }
}

pub fn job(key: &str, gpus: u32) -> JobSpec {
    let tenant = TenantId::new("team-a").unwrap_or_else(|e| panic!("{e}"));
    let mut spec = JobSpec::new(
        tenant,
        key,
        JobKind::Training,
        Resources::whole(AcceleratorKind::Gpu, gpus),
        "true",
    );
    spec.name = Some(key.into());
    spec.duration_s = Some(3600);
    spec.policy = Some(Policy::Balanced);
    spec
}

/// A reactor driven by hand, with the clock under the test's control and invariants checked after each step.
pub struct TestEnv {
    pub reactor: Reactor<MemoryJournal>,
    pub now: Millis,
    pub sent: Vec<Command>,
}

impl TestEnv {
    pub fn new(sites: Vec<SiteAdvert>) -> Self {
        let mut env = TestEnv {
            reactor: Reactor::new(
                CoreConfig::default(),
                RttTable::default(),
                regions(),
                MemoryJournal::default(),
            ),
            now: 1_000_000,
            sent: Vec::new(),
        };
        for s in sites {
            env.step(Event::Advert(s));
        }
        env
    }

    pub fn step(&mut self, event: Event) -> Response {
        let quota = self.reactor.holders();
        let r = self
            .reactor
            .step(self.now, event)
            .unwrap_or_else(|e| panic!("step failed: {e}"));
        if let Err(e) = self
            .reactor
            .sanity_check()
            .and_then(|()| self.reactor.check_quota_step(&quota))
        {
            panic!("invariant broken: {e}");
        }
        self.sent.extend(self.reactor.take_outbox());
        r
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.step(Event::Tick);
    }

    pub fn submit(&mut self, spec: JobSpec) -> JobId {
        match self.step(Event::Submit(spec)) {
            Response::Submitted(r) => r.job,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Offers sent since the last call.
    pub fn take_offers(&mut self) -> Vec<Offer> {
        let mut offers = Vec::new();
        self.sent.retain(|c| match c {
            Command::Offer(o) => {
                offers.push(o.clone());
                false
            }
            _ => true,
        });
        offers
    }

    pub fn answer(&mut self, offer: &Offer, outcome: OfferOutcome) {
        self.step(Event::OfferAnswer {
            site: offer.site.clone(),
            job: offer.job.clone(),
            attempt: offer.attempt,
            outcome,
            mark: None,
        });
    }

    pub fn status(&mut self, offer: &Offer, state: AttemptState, runtime_ms: u64) {
        self.step(Event::Status(JobStatus {
            v: 1,
            job: offer.job.clone(),
            attempt: offer.attempt,
            site: offer.site.clone(),
            state,
            at_ms: self.now,
            started_at_ms: None,
            runtime_ms: Some(runtime_ms),
            checkpoint: None,
            mark: None,
        }));
    }

    pub fn heartbeat(&mut self, site: &str) {
        let site = SiteId::new(site).unwrap_or_else(|e| panic!("{e}"));
        self.step(Event::Heartbeat(Heartbeat {
            v: 1,
            site,
            seq: 0,
            sent_at_ms: self.now,
            generation: 1,
            running: vec![],
            inventory: None,
        }));
    }

    pub fn phase(&self, job: &JobId) -> JobPhase {
        self.reactor.state().jobs[job].phase
    }

    /// Sets the tenancy (queues, quotas, priority classes, budgets) from a tenancy file's text, as an
    /// administrator would.
    pub fn set_tenancy(&mut self, toml: &str) {
        self.step(Event::SetTenancy {
            toml: toml.to_owned(),
            from_file: false,
        });
    }
}
