//! The broker's nouns: sites with their pools and devices as the broker counts them, and job records.

use super::metering::Rates;
use super::placement::{Decision, Terms};
use super::Millis;
use meridian_federation::{
    AcceleratorKind, Amounts, DeviceShare, JobId, JobPhase, JobSpec, ModelName, PoolAdvert,
    PoolName, SiteAdvert, SiteId, SiteInfo, Tier,
};

/// One device as the broker counts it: what the agent last reported in use, and what the broker has itself
/// assigned. The free share is the smaller of what both allow, so neither a late advert nor a fresh
/// reservation can make the broker over-commit.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Device {
    pub index: u32,
    pub healthy: bool,
    pub advert_used_milli: u32,
    pub reserved_milli: u32,
}

impl Device {
    pub fn free_milli(&self) -> u32 {
        if !self.healthy {
            return 0;
        }
        1000u32.saturating_sub(self.advert_used_milli.max(self.reserved_milli))
    }
}

/// A pool of identical accelerators at a site.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Pool {
    pub name: PoolName,
    pub kind: AcceleratorKind,
    pub vendor: String,
    pub model: ModelName,
    pub memory_mib: u64,
    pub power_watts: u32,
    pub price_micro_usd_per_hour: u64,
    /// The spot price, where the pool sells spot capacity (jobs that allow spot: a service's replicas). Kept
    /// in snapshots only where there is one, so a pool without spot reads and writes as in earlier formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_price_micro_usd_per_hour: Option<u64>,
    pub milli_sharing: bool,
    /// MIG-style profiles the devices can be sliced into.
    pub mig_profiles: Vec<String>,
    /// Devices per node: consecutive indices `[k × n, (k + 1) × n)` share one interconnect domain.
    pub devices_per_node: u32,
    pub devices: Vec<Device>,
}

impl Pool {
    /// The price per device-hour of on-demand capacity, or of spot capacity (`None` where the pool sells none).
    pub fn price_for(&self, spot: bool) -> Option<u64> {
        if spot {
            self.spot_price_micro_usd_per_hour
        } else {
            Some(self.price_micro_usd_per_hour)
        }
    }

    fn from_advert(p: &PoolAdvert) -> Self {
        Pool {
            name: p.name.clone(),
            kind: p.kind,
            vendor: p.vendor.clone(),
            model: p.model.clone(),
            memory_mib: p.memory_mib,
            power_watts: p.measured_power_watts.unwrap_or(p.power_watts),
            price_micro_usd_per_hour: p.price_micro_usd_per_hour,
            spot_price_micro_usd_per_hour: p.spot_price_micro_usd_per_hour,
            milli_sharing: p.sharing.milli,
            mig_profiles: p.sharing.mig_profiles.clone(),
            devices_per_node: p.devices_per_node.max(1),
            devices: p
                .devices
                .iter()
                .map(|d| Device {
                    index: d.index,
                    healthy: d.healthy,
                    advert_used_milli: d.used_milli,
                    reserved_milli: 0,
                })
                .collect(),
        }
    }

    pub fn healthy_devices(&self) -> usize {
        self.devices.iter().filter(|d| d.healthy).count()
    }

    pub fn free_milli(&self) -> u64 {
        self.devices.iter().map(|d| u64::from(d.free_milli())).sum()
    }

    /// Whether the model is among `allowed` (case-insensitive); an empty list allows every model.
    pub fn model_allowed(&self, allowed: &[ModelName]) -> bool {
        allowed.is_empty() || allowed.iter().any(|m| m.matches(self.model.as_str()))
    }

    fn device_mut(&mut self, index: u32) -> Option<&mut Device> {
        self.devices.iter_mut().find(|d| d.index == index)
    }
}

/// A site as the broker knows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Site {
    pub info: SiteInfo,
    pub pools: Vec<Pool>,
    pub generation: u64,
    pub last_seen_ms: Millis,
    /// False once heartbeats stopped for longer than the loss timeout.
    pub up: bool,
    /// When its whole inventory was last asked for (liveness, not journaled).
    #[serde(skip)]
    pub inventory_asked_ms: Millis,
    /// When its advert was last asked for (liveness, not journaled).
    #[serde(skip)]
    pub advert_asked_ms: Millis,
    /// Drain asked by the site itself in its advert.
    pub advert_draining: bool,
    /// Drain asked through the API.
    pub api_draining: bool,
    /// A print of its facts that decide whether a job can fit there at all (soft state).
    #[serde(skip)]
    pub facts: FactsPrint,
}

/// A print of a site's facts that decide whether a job can fit there at all: what it is and where, its prices,
/// carbon and datasets, its pools' models, sizes and prices and which devices are healthy — not what is reserved
/// or used. Soft state: neither snapshotted nor journaled, worked out again when a site is taken in or restored,
/// and left out of equality. What `reactor::aside` compares.
#[derive(Clone, Copy, Debug, Default)]
pub struct FactsPrint(pub u64);

impl PartialEq for FactsPrint {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Feeds formatted text into a hasher, so a print is made without building the text.
struct HashWriter<'a>(&'a mut std::collections::hash_map::DefaultHasher);

impl std::fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        use std::hash::Hasher;
        self.0.write(s.as_bytes());
        Ok(())
    }
}

impl Site {
    pub fn from_advert(a: &SiteAdvert, now: Millis) -> Self {
        Site {
            info: a.site.clone(),
            pools: a.pools.iter().map(Pool::from_advert).collect(),
            generation: a.generation,
            last_seen_ms: now,
            up: true,
            inventory_asked_ms: 0,
            advert_asked_ms: 0,
            advert_draining: a.draining,
            api_draining: false,
            facts: FactsPrint::default(),
        }
        .with_facts_print()
    }

    /// The site with its [`FactsPrint`] worked out.
    pub fn with_facts_print(mut self) -> Self {
        use std::fmt::Write;
        use std::hash::Hash;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // Debug text of plain data is stable within a build, which is as long as soft state lives. The grid's
        // carbon intensity, which moves by the hour, decides where a job goes, never whether it fits.
        let i = &self.info;
        let _ = write!(
            HashWriter(&mut h),
            "{:?}{:?}{:?}{:?}{:?}{:?}{}{}{}{:?}{:?}",
            i.id,
            i.kind,
            i.tier,
            i.location,
            i.region_tags,
            i.rtt_region,
            i.pue,
            i.energy_micro_usd_per_kwh,
            i.egress_micro_usd_per_gb,
            i.datasets,
            i.backend
        );
        for p in &self.pools {
            let _ = write!(
                HashWriter(&mut h),
                "{:?}{:?}{}{}{}{:?}{}{}{:?}{}",
                p.name,
                p.kind,
                p.vendor,
                p.model.as_str(),
                p.memory_mib,
                p.spot_price_micro_usd_per_hour,
                p.price_micro_usd_per_hour,
                p.milli_sharing,
                p.mig_profiles,
                p.devices_per_node
            );
            for d in &p.devices {
                (d.index, d.healthy).hash(&mut h);
            }
        }
        self.facts = FactsPrint(std::hash::Hasher::finish(&h));
        self
    }

    /// Whether an advert says nothing new: the same generation of the same facts, from a site that is up, with
    /// the spot prices known (a site restored from a snapshot of a format before spot lacks them, and takes
    /// them from its next advert).
    pub fn repeats(&self, a: &SiteAdvert) -> bool {
        self.up
            && self.generation == a.generation
            && self.info == a.site
            && self.pools.len() == a.pools.len()
            && self
                .pools
                .iter()
                .zip(&a.pools)
                .all(|(p, q)| p.spot_price_micro_usd_per_hour == q.spot_price_micro_usd_per_hour)
    }

    /// Whether an advert lists the same pools and devices (so reservations carry over).
    pub fn same_shape(&self, a: &SiteAdvert) -> bool {
        self.pools.len() == a.pools.len()
            && self.pools.iter().zip(&a.pools).all(|(p, q)| {
                p.name == q.name
                    && p.devices.len() == q.devices.len()
                    && p.devices
                        .iter()
                        .zip(&q.devices)
                        .all(|(d, e)| d.index == e.index)
            })
    }

    /// Takes a same-shape advert: new facts, health and reported use; the broker's reservations stay.
    pub fn refresh(&mut self, a: &SiteAdvert, now: Millis) {
        let fresh = Site::from_advert(a, now);
        for (p, q) in self.pools.iter_mut().zip(fresh.pools) {
            let reserved: Vec<u32> = p.devices.iter().map(|d| d.reserved_milli).collect();
            *p = q;
            for (d, r) in p.devices.iter_mut().zip(reserved) {
                d.reserved_milli = r;
            }
        }
        self.info = fresh.info;
        self.generation = fresh.generation;
        self.last_seen_ms = now;
        self.up = true;
        self.advert_draining = fresh.advert_draining;
        self.facts = fresh.facts;
    }

    pub fn id(&self) -> &SiteId {
        &self.info.id
    }

    pub fn tier(&self) -> Tier {
        self.info.tier
    }

    pub fn draining(&self) -> bool {
        self.advert_draining || self.api_draining
    }

    pub fn pool(&self, name: &PoolName) -> Option<&Pool> {
        self.pools.iter().find(|p| &p.name == name)
    }

    pub fn pool_mut(&mut self, name: &PoolName) -> Option<&mut Pool> {
        self.pools.iter_mut().find(|p| &p.name == name)
    }

    pub fn holds_dataset(&self, name: &str) -> bool {
        self.info.datasets.iter().any(|d| d.name == name)
    }

    /// Adds (`sign` = true) or removes a reservation of devices.
    pub fn apply_reservation(&mut self, pool: &PoolName, devices: &[DeviceShare], add: bool) {
        if let Some(p) = self.pool_mut(pool) {
            for share in devices {
                if let Some(d) = p.device_mut(share.index) {
                    d.reserved_milli = if add {
                        d.reserved_milli.saturating_add(share.milli)
                    } else {
                        d.reserved_milli.saturating_sub(share.milli)
                    };
                }
            }
        }
    }

    /// The rates of a pool here for on-demand capacity, or for spot capacity where the pool sells it (else its
    /// on-demand price, the dearer figure), with grid intensity `g_per_kwh`.
    pub fn rates(&self, pool: &Pool, spot: bool, g_per_kwh: u32) -> Rates {
        Rates {
            price_micro_usd_per_hour: pool
                .price_for(spot)
                .unwrap_or(pool.price_micro_usd_per_hour),
            power_watts: pool.power_watts,
            pue: self.info.pue,
            g_per_kwh,
        }
    }

    /// Mean grid intensity over `[now, now + duration_ms)`: the advertised hourly forecast where it covers
    /// that span, else the current value for the hours it does not cover.
    pub fn mean_intensity(&self, now: Millis, duration_ms: u64) -> f64 {
        let c = &self.info.carbon;
        if c.forecast.is_empty() || duration_ms == 0 {
            return f64::from(c.g_per_kwh);
        }
        let hour = 3_600_000u64;
        let mut t = now;
        let end = now.saturating_add(duration_ms);
        let mut sum = 0.0;
        while t < end {
            let step = (hour - (t % hour)).min(end - t);
            let value = if t >= c.forecast_start_ms {
                let i = ((t - c.forecast_start_ms) / hour) as usize;
                c.forecast.get(i).copied().unwrap_or(c.g_per_kwh)
            } else {
                c.g_per_kwh
            };
            sum += f64::from(value) * step as f64;
            t += step;
        }
        sum / duration_ms as f64
    }
}

/// Where a job's current attempt runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    pub site: SiteId,
    pub pool: PoolName,
    pub tier: Tier,
    pub devices: Vec<DeviceShare>,
}

/// One attempt of a job in the metering ledger: where it ran and what it used, in integer units.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub attempt: u32,
    pub site: SiteId,
    pub pool: PoolName,
    pub model: ModelName,
    /// Milli-devices held.
    pub milli: u64,
    pub offered_ms: Millis,
    /// When the agent first reported it running.
    pub started_ms: Option<Millis>,
    /// Run time reported when it ended (0 until then).
    pub runtime_ms: u64,
    /// Money, energy (PUE included) and carbon of the run, metered when it ended.
    pub amounts: Amounts,
    /// Whether its end was metered (each attempt is metered once).
    pub metered: bool,
}

/// A job as the broker records it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub phase: JobPhase,
    /// Number of the latest offer (0 before the first).
    pub attempt: u32,
    pub assignment: Option<Assignment>,
    pub submitted_ms: Millis,
    /// Since when the job waits for capacity (reset when it is requeued); `max_wait` counts from here.
    pub waiting_since_ms: Millis,
    pub offered_ms: Option<Millis>,
    pub started_ms: Option<Millis>,
    pub finished_ms: Option<Millis>,
    pub exit_code: Option<i32>,
    /// Why the job is where it is, in words.
    pub why: String,
    /// Boxed: most jobs in a deep queue have none, and a job record should stay small.
    pub decision: Option<Box<Decision>>,
    /// Sites that refused or timed out an offer, and until when they are skipped for this job.
    pub refused_until: Vec<(SiteId, Millis)>,
    /// Expected terms at the chosen site, from the decision.
    pub estimate: Option<Box<Terms>>,
    pub metered: Amounts,
    pub runtime_ms: u64,
    pub checkpoint: Option<String>,
    pub cancel_requested: bool,
    /// When a waiting job should be tried again even if nothing changes (its burst time).
    pub retry_at_ms: Option<Millis>,
    pub history: Vec<(Millis, String)>,
    /// Every attempt offered, in order: the metering ledger of this job.
    #[serde(default)]
    pub runs: Vec<Run>,
    /// It waits because no site of the federation can run it as it stands (sites that join may).
    #[serde(default)]
    pub unsatisfiable: bool,
    /// The site's inventory mark when it accepted the current attempt: an inventory from this mark on that
    /// omits the attempt means the site no longer has it.
    #[serde(default)]
    pub accepted: Option<meridian_federation::InventoryMark>,
    /// Why it waited at its last try (soft state: see [`WaitLabel`]).
    #[serde(skip)]
    pub waited_on: WaitLabel,
}

/// Why a waiting job waited at its last try, as a bounded label (`observe::wait_label`), for the views and the
/// metrics: a waiting job keeps no decision (see `Reactor::explain`). Soft state: neither snapshotted nor
/// journaled, and left out of equality (a restored broker knows it again when it next tries the job; until
/// then the job counts as not tried).
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitLabel(pub Option<&'static str>);

impl PartialEq for WaitLabel {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Job {
    pub fn new(id: JobId, spec: JobSpec, now: Millis) -> Self {
        Job {
            id,
            spec,
            phase: JobPhase::Pending,
            attempt: 0,
            assignment: None,
            submitted_ms: now,
            waiting_since_ms: now,
            offered_ms: None,
            started_ms: None,
            finished_ms: None,
            exit_code: None,
            why: "submitted".into(),
            decision: None,
            refused_until: Vec::new(),
            estimate: None,
            metered: Amounts::default(),
            runtime_ms: 0,
            checkpoint: None,
            cancel_requested: false,
            retry_at_ms: None,
            // "submitted" is implied by `submitted_ms` (and shown by the views): nothing to allocate for it.
            history: Vec::new(),
            runs: Vec::new(),
            unsatisfiable: false,
            accepted: None,
            waited_on: WaitLabel::default(),
        }
    }

    /// Whether the job holds devices at a site (offered, running or being cancelled there).
    pub fn holds_devices(&self) -> bool {
        matches!(
            self.phase,
            JobPhase::Offered | JobPhase::Running | JobPhase::Cancelling
        )
    }

    pub fn note(&mut self, now: Millis, what: impl Into<String>) {
        const MAX_HISTORY: usize = 200;
        if self.history.len() >= MAX_HISTORY {
            self.history.remove(1);
        }
        self.history.push((now, what.into()));
    }

    /// Sites this job skips at `now` because they refused it recently.
    pub fn refused_sites(&self, now: Millis) -> impl Iterator<Item = &SiteId> {
        self.refused_until
            .iter()
            .filter(move |(_, until)| *until > now)
            .map(|(s, _)| s)
    }
}
