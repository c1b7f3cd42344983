//! Message types of wire version 1: NATS payloads and HTTP API bodies.
//!
//! Each top-level message has a `v` field. Optional fields default so that senders may omit them; fields that
//! later versions add must be optional too, so that v1 readers keep working.

use crate::ids::{JobId, SiteId, TenantId};
use crate::names::{ModelName, PoolName, QueueName, ServiceName};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn v1() -> u32 {
    crate::WIRE_VERSION
}

fn one() -> u32 {
    1
}

// ---------------------------------------------------------------------------------------------------------------
// Sites and capacity

/// What kind of place a site is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SiteKind {
    Datacenter,
    Edge,
    Cloud,
}

/// Spill-over order: owned capacity first, then partners, then cloud. The derived order is that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Owned,
    Partner,
    Cloud,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Owned, Tier::Partner, Tier::Cloud];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Owned => "owned",
            Tier::Partner => "partner",
            Tier::Cloud => "cloud",
        }
    }
}

/// Accelerator class of a pool or a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceleratorKind {
    Gpu,
    Npu,
    Dpu,
    Cpu,
}

impl AcceleratorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AcceleratorKind::Gpu => "gpu",
            AcceleratorKind::Npu => "npu",
            AcceleratorKind::Dpu => "dpu",
            AcceleratorKind::Cpu => "cpu",
        }
    }
}

/// How the devices of one node talk to each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interconnect {
    #[default]
    Pcie,
    Nvlink,
    Infiniband,
    Roce,
}

/// A point on the globe, in degrees (WGS84).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GeoPoint {
    pub lat: f64,
    pub lon: f64,
}

/// A dataset held at a site.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub name: String,
    pub size_bytes: u64,
}

/// Grid carbon intensity at a site: the value now, and an optional hourly forecast.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Carbon {
    /// Grid intensity now, gCO2e per kWh.
    pub g_per_kwh: u32,
    /// Start of the first forecast hour, milliseconds since the Unix epoch.
    #[serde(default)]
    pub forecast_start_ms: u64,
    /// Hourly forecast values (gCO2e/kWh) from `forecast_start_ms`, at most [`MAX_FORECAST_HOURS`] of them.
    #[serde(default)]
    pub forecast: Vec<u32>,
}

/// Longest carbon forecast a site may advertise, in hours.
pub const MAX_FORECAST_HOURS: usize = 72;

/// Static facts about a site, sent in every advert.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteInfo {
    pub id: SiteId,
    pub kind: SiteKind,
    pub tier: Tier,
    pub location: GeoPoint,
    /// Free-form tags such as `eu`, `us-east`.
    #[serde(default)]
    pub region_tags: Vec<String>,
    /// The site's name in the measured round-trip table, when it has one (an Azure region id such as `eastus`).
    #[serde(default)]
    pub rtt_region: Option<String>,
    /// Power usage effectiveness (facility energy / IT energy), at least 1.0.
    pub pue: f64,
    pub carbon: Carbon,
    /// Energy tariff, micro-USD per kWh (informational; accelerator prices already include energy for owned sites).
    #[serde(default)]
    pub energy_micro_usd_per_kwh: u64,
    /// Price of moving data out of this site, micro-USD per GB.
    #[serde(default)]
    pub egress_micro_usd_per_gb: u64,
    #[serde(default)]
    pub datasets: Vec<Dataset>,
    /// How the site runs the work it accepts (absent from agents of earlier releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
}

/// How a site runs the attempts its agent accepts: its backend, named by a site file's `[backend] kind` and a
/// job's `run.adapter`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Each attempt runs as a process group on the agent's host, under a shim.
    #[default]
    #[serde(alias = "local")]
    Process,
    /// Attempts are accepted and reported running, and nothing is started (dry runs, measurements).
    Noop,
    /// Each attempt is a batch job of the site's Slurm cluster (`sbatch`), which picks the devices.
    Slurm,
    /// Each attempt runs on a cloud instance the agent creates through EC2's API for it (a burst region).
    Ec2,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Process,
        BackendKind::Noop,
        BackendKind::Slurm,
        BackendKind::Ec2,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Process => "process",
            BackendKind::Noop => "noop",
            BackendKind::Slurm => "slurm",
            BackendKind::Ec2 => "ec2",
        }
    }

    /// The backend a job's `run.adapter` names (`local`, the name of earlier releases, is `process`).
    pub fn named(name: &str) -> Option<BackendKind> {
        match name.to_ascii_lowercase().as_str() {
            "process" | "local" => Some(BackendKind::Process),
            "noop" => Some(BackendKind::Noop),
            "slurm" => Some(BackendKind::Slurm),
            "ec2" => Some(BackendKind::Ec2),
            _ => None,
        }
    }

    /// Whether it runs a container image (`run.image`): none of this release's backends does.
    pub fn runs_images(self) -> bool {
        false
    }
}

/// Fractional use a pool allows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sharing {
    /// Whether a device may be split into milli-shares (1/1000 of a device).
    #[serde(default)]
    pub milli: bool,
    /// MIG-style profiles the devices can be partitioned into, e.g. `1g.10gb`.
    #[serde(default)]
    pub mig_profiles: Vec<String>,
}

/// One device of a pool, as the agent sees it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    pub index: u32,
    pub healthy: bool,
    /// Milli-units of this device in use (0..=1000).
    pub used_milli: u32,
}

impl DeviceState {
    /// Devices `0..count`, all healthy and free.
    pub fn all_free(count: u32) -> Vec<DeviceState> {
        (0..count)
            .map(|index| DeviceState {
                index,
                healthy: true,
                used_milli: 0,
            })
            .collect()
    }
}

/// One pool of identical accelerators at a site.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolAdvert {
    /// Pool name, unique within the site.
    pub name: PoolName,
    pub kind: AcceleratorKind,
    pub vendor: String,
    pub model: ModelName,
    /// Memory per device, MiB.
    pub memory_mib: u64,
    pub count: u32,
    #[serde(default = "one")]
    pub devices_per_node: u32,
    #[serde(default)]
    pub interconnect: Interconnect,
    /// Rated power per device, watts.
    pub power_watts: u32,
    /// Measured power per device, watts, where a probe reports it.
    #[serde(default)]
    pub measured_power_watts: Option<u32>,
    #[serde(default)]
    pub sharing: Sharing,
    /// Price of one device for one hour, micro-USD (on-demand for cloud; internal rate for owned).
    pub price_micro_usd_per_hour: u64,
    #[serde(default)]
    pub spot_price_micro_usd_per_hour: Option<u64>,
    /// Per-device state; its length equals `count`.
    pub devices: Vec<DeviceState>,
}

impl PoolAdvert {
    /// Milli-units free on healthy devices.
    pub fn free_milli(&self) -> u64 {
        self.devices
            .iter()
            .filter(|d| d.healthy)
            .map(|d| u64::from(1000u32.saturating_sub(d.used_milli)))
            .sum()
    }
}

/// A site's capacity advert: inventory plus free capacity, sent at start, on change and periodically.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteAdvert {
    #[serde(default = "v1")]
    pub v: u32,
    pub site: SiteInfo,
    pub pools: Vec<PoolAdvert>,
    /// Increases with every change of inventory or free capacity.
    pub generation: u64,
    /// The site takes no new work (its running work finishes).
    #[serde(default)]
    pub draining: bool,
    pub sent_at_ms: u64,
}

/// A job attempt: the pair that agents use to recognise repeated offers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptRef {
    pub job: JobId,
    pub attempt: u32,
}

/// Liveness signal from a site, with the attempts it is running.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    #[serde(default = "v1")]
    pub v: u32,
    pub site: SiteId,
    pub seq: u64,
    pub sent_at_ms: u64,
    /// Generation of the site's latest advert.
    pub generation: u64,
    /// The attempts running here (left empty by a site holding more than [`INVENTORY_LIST_MAX`]: the
    /// inventory's digest stands for them).
    #[serde(default)]
    pub running: Vec<AttemptRef>,
    /// What the agent holds, for the broker to reconcile with what it believes runs here.
    #[serde(default)]
    pub inventory: Option<Inventory>,
}

/// What an agent measures of its devices, sent periodically on `meridian.v1.site.<S>.metrics`: the broker
/// re-exports it on its own `/metrics` with a `site` label, so no site needs a listener of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteMetrics {
    #[serde(default = "v1")]
    pub v: u32,
    pub site: SiteId,
    pub sent_at_ms: u64,
    pub devices: Vec<DeviceMetrics>,
}

/// One device as its agent sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceMetrics {
    pub pool: PoolName,
    pub index: u32,
    /// Milli-units of the device the agent has given to jobs (0..=1000).
    pub allocated_milli: u32,
    /// Busy fraction (0..=1) as NVML reads it, where it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// Power draw, watts, as NVML reads it, where it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<f64>,
}

/// Where an agent's set of attempts stands: `epoch` counts the agent's starts (kept on disk), `seq` the changes
/// of the set since. Marks compare in that order, so a later mark saw every change an earlier one did.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct InventoryMark {
    pub epoch: u64,
    pub seq: u64,
}

/// The attempts an agent holds — running ones, and ended ones whose last status the broker has not
/// acknowledged yet — as of `mark`. The list is sent when it is short (at most [`INVENTORY_LIST_MAX`]);
/// otherwise its count and digest ([`inventory_digest`]), and the broker asks for the list
/// ([`InventoryRequest`]) when they differ from what it expects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub mark: InventoryMark,
    pub count: u32,
    pub digest: u64,
    #[serde(default)]
    pub attempts: Option<Vec<AttemptRef>>,
}

/// The longest attempt list a heartbeat carries.
pub const INVENTORY_LIST_MAX: usize = 256;

/// The digest of a set of attempts: FNV-1a 64 over `job:attempt` lines in order (a checksum to notice a
/// difference, not a security measure).
pub fn inventory_digest<'a>(attempts: impl IntoIterator<Item = &'a AttemptRef>) -> u64 {
    use std::hash::Hasher;
    let mut sorted: Vec<&AttemptRef> = attempts.into_iter().collect();
    sorted.sort();
    let mut h = fnv::FnvHasher::default();
    for a in sorted {
        h.write(format!("{}:{}\n", a.job, a.attempt).as_bytes());
    }
    h.finish()
}

/// Broker → agent, request: "send your whole inventory", answered with an [`Inventory`] listing every attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryRequest {
    #[serde(default = "v1")]
    pub v: u32,
}

/// Broker → agents: "send me your advert now" (after a broker restart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrokerHello {
    #[serde(default = "v1")]
    pub v: u32,
    pub sent_at_ms: u64,
}

// ---------------------------------------------------------------------------------------------------------------
// Jobs

/// What a job is for; inference jobs are services that run until cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobKind {
    Training,
    FineTune,
    Batch,
    Inference,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Training => "training",
            JobKind::FineTune => "fine-tune",
            JobKind::Batch => "batch",
            JobKind::Inference => "inference",
        }
    }
}

/// Accelerators one replica needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub kind: AcceleratorKind,
    /// Allowed device models (case-insensitive); empty means any.
    #[serde(default)]
    pub models: Vec<ModelName>,
    /// Whole devices per replica (0 when `milli` is set).
    #[serde(default)]
    pub count: u32,
    /// A share of one device in milli-units (1..=999), instead of whole devices.
    #[serde(default)]
    pub milli: Option<u32>,
    /// Minimum memory per device, MiB.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Minimum memory per device, MiB, for pools of one of the listed models only (`{"V100": 32768}`: a V100
    /// must have 32 GiB; the other models in `models` are not held to it). Each key is one of `models`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_memory_mib: BTreeMap<ModelName, u64>,
    /// All devices of the job (every replica) in one interconnect domain: one node of the pool
    /// (`devices_per_node` consecutive device indices).
    #[serde(default)]
    pub same_node: bool,
    /// A MIG-style slice of one device, by profile name `<slices>g.<memory>gb` (for example `1g.10gb`), from the
    /// pool's `sharing.mig_profiles`; it takes `slices / 7` of the device. Instead of `count` and `milli`.
    #[serde(default)]
    pub mig: Option<String>,
}

impl Resources {
    /// `count` whole devices of `kind`, any model.
    pub fn whole(kind: AcceleratorKind, count: u32) -> Self {
        Resources {
            kind,
            models: vec![],
            count,
            milli: None,
            memory_mib: None,
            model_memory_mib: BTreeMap::new(),
            same_node: false,
            mig: None,
        }
    }

    /// A share of one device of `kind`, in milli-units.
    pub fn shared(kind: AcceleratorKind, milli: u32) -> Self {
        Resources {
            milli: Some(milli),
            count: 0,
            ..Resources::whole(kind, 0)
        }
    }

    /// Demand in milli-devices for one replica.
    pub fn milli_per_replica(&self) -> u64 {
        if let Some(m) = self.mig.as_deref().and_then(mig_milli) {
            return u64::from(m);
        }
        match self.milli {
            Some(m) => u64::from(m),
            None => u64::from(self.count) * 1000,
        }
    }

    /// The share of one device the job asks for, if it asks for a share (a milli-share or a MIG slice).
    pub fn share(&self) -> Option<u32> {
        self.mig.as_deref().and_then(mig_milli).or(self.milli)
    }
}

/// Compute slices of a whole device in MIG-style partitioning (seven on A100/H100-class GPUs).
pub const MIG_SLICES: u32 = 7;

/// The milli-share of a MIG-style profile `<slices>g.<memory>gb`: `ceil(slices × 1000 / 7)`; `None` when the
/// name is not of that form or asks for more than a device.
pub fn mig_milli(profile: &str) -> Option<u32> {
    let (slices, memory) = profile.split_once("g.")?;
    let slices: u32 = slices.parse().ok()?;
    memory.strip_suffix("gb")?.parse::<u32>().ok()?;
    (1..=MIG_SLICES)
        .contains(&slices)
        .then(|| (slices * 1000).div_ceil(MIG_SLICES))
}

/// Whether a dataset must be at the site or is only preferred there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Locality {
    Must,
    #[default]
    Prefer,
}

/// A dataset a job reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetNeed {
    pub name: String,
    pub size_bytes: u64,
    #[serde(default)]
    pub locality: Locality,
}

/// A population of users the job serves, for latency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserLocation {
    #[serde(default)]
    pub name: Option<String>,
    pub location: GeoPoint,
    /// Relative share of the job's users here (> 0).
    #[serde(default = "unit_weight")]
    pub weight: f64,
    /// The nearest region of the measured round-trip table, where known.
    #[serde(default)]
    pub rtt_region: Option<String>,
}

fn unit_weight() -> f64 {
    1.0
}

/// Hard constraints on where a job may run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// Name of a residency region (a GeoJSON polygon known to the broker, e.g. `eu`).
    #[serde(default)]
    pub residency: Option<String>,
    /// Allowed tiers; empty means all.
    #[serde(default)]
    pub tiers: Vec<Tier>,
    /// Allowed sites; empty means all.
    #[serde(default)]
    pub sites: Vec<SiteId>,
    /// Highest acceptable price per device-hour, micro-USD.
    #[serde(default)]
    pub price_cap_micro_usd_per_hour: Option<u64>,
}

/// Relative weights of the placement terms. Each term is normalised against the best candidate (see the
/// broker's placement module), so weights compare like with like.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    #[serde(default)]
    pub cost: f64,
    #[serde(default)]
    pub energy: f64,
    #[serde(default)]
    pub carbon: f64,
    #[serde(default)]
    pub latency: f64,
    #[serde(default)]
    pub data: f64,
}

/// A named placement policy, explicit weights, or a stated trade-off between money and carbon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Latency,
    Cost,
    Green,
    Balanced,
    Weights(Weights),
    /// Carbon internalised at this price (USD per tonne CO2e): the lowest `cost + price × CO2` wins
    /// (`{ "carbon_price_usd_per_t": 190 }`).
    CarbonPriceUsdPerT(f64),
    /// The least-carbon placement costing at most `1 + premium` times the cheapest one
    /// (`{ "max_cost_premium": 0.05 }`).
    MaxCostPremium(f64),
}

impl Policy {
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Latency => "latency",
            Policy::Cost => "cost",
            Policy::Green => "green",
            Policy::Balanced => "balanced",
            Policy::Weights(_) => "weights",
            Policy::CarbonPriceUsdPerT(_) => "carbon-price",
            Policy::MaxCostPremium(_) => "max-cost-premium",
        }
    }

    /// The policy with its parameter, as a user writes it on the command line (`carbon-price=190`,
    /// `max-cost-premium=0.05`; the named policies by their name).
    pub fn label(&self) -> String {
        match self {
            Policy::CarbonPriceUsdPerT(p) => format!("carbon-price={p}"),
            Policy::MaxCostPremium(p) => format!("max-cost-premium={p}"),
            Policy::Weights(w) => format!(
                "weights=cost:{},energy:{},carbon:{},latency:{},data:{}",
                w.cost, w.energy, w.carbon, w.latency, w.data
            ),
            p => p.name().to_owned(),
        }
    }

    /// Reads what [`Policy::label`] writes (weights excepted): `cost`, `carbon-price=190`,
    /// `max-cost-premium=0.05`, … Errors say what is accepted.
    pub fn parse_label(s: &str) -> Result<Policy, crate::WireError> {
        let bad = |problem: String| crate::WireError::invalid("policy", problem);
        let number = |v: &str, what: &str| -> Result<f64, crate::WireError> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| bad(format!("{what} {v:?}: expected a number ≥ 0")))
        };
        let p = match s.split_once('=') {
            Some(("carbon-price", v)) => Policy::CarbonPriceUsdPerT(number(v, "carbon-price")?),
            Some(("max-cost-premium", v)) => Policy::MaxCostPremium(number(v, "max-cost-premium")?),
            None => match s {
                "latency" => Policy::Latency,
                "cost" => Policy::Cost,
                "green" => Policy::Green,
                "balanced" => Policy::Balanced,
                _ => {
                    return Err(bad(format!(
                        "unknown policy {s:?}; known: {KNOWN_POLICIES}"
                    )))
                }
            },
            Some(_) => {
                return Err(bad(format!(
                    "unknown policy {s:?}; known: {KNOWN_POLICIES}"
                )))
            }
        };
        p.problem().map_or(Ok(p), |(field, why)| {
            Err(crate::WireError::invalid(field, why))
        })
    }

    /// What is wrong with the policy's parameters (field, problem), if anything.
    pub fn problem(&self) -> Option<(String, String)> {
        let out_of = |field: &str, x: f64, hi: f64| {
            (!(x.is_finite() && (0.0..=hi).contains(&x)))
                .then(|| (field.to_owned(), format!("{x} is outside 0..={hi}")))
        };
        match self {
            Policy::CarbonPriceUsdPerT(p) => out_of("policy.carbon_price_usd_per_t", *p, 1e6),
            Policy::MaxCostPremium(p) => out_of("policy.max_cost_premium", *p, 100.0),
            _ => None,
        }
    }
}

/// The policies [`Policy::parse_label`] reads, as its errors list them.
const KNOWN_POLICIES: &str =
    "latency, cost, green, balanced, carbon-price=USD_PER_T, max-cost-premium=FRACTION";

/// A job's start window. A job with a deadline is deferrable: under the `green` and `balanced` policies it
/// may be held for a lower-carbon hour, as long as it still finishes by the deadline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Earliest start, ms since the Unix epoch.
    #[serde(default)]
    pub start_after_ms: Option<u64>,
    /// Latest finish, ms since the Unix epoch.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
}

/// What to run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// A shell command line, run with `sh -c`.
    pub command: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The backend the job must run on (a [`BackendKind`] name: `process`, `noop`); any site's when absent.
    /// Placement takes only sites that run it; a name no backend has is refused at submission.
    #[serde(default)]
    pub adapter: Option<String>,
    /// A container image. No backend of this release runs one, so a job naming one is refused at submission
    /// rather than run without it.
    #[serde(default)]
    pub image: Option<String>,
}

/// A job submission.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    #[serde(default = "v1")]
    pub v: u32,
    pub tenant: TenantId,
    /// Chosen by the client: a resubmission with the same key returns the first job.
    pub idempotency_key: String,
    #[serde(default)]
    pub name: Option<String>,
    pub kind: JobKind,
    #[serde(default)]
    pub queue: Option<QueueName>,
    #[serde(default)]
    pub priority: Option<String>,
    pub resources: Resources,
    /// Replicas, all placed on one site (a gang).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Expected run time, seconds (used for cost, energy and carbon estimates).
    #[serde(default)]
    pub duration_s: Option<u64>,
    /// How long the job may wait for owned or partner capacity before it bursts to the cloud tier (0 = at once).
    #[serde(default)]
    pub max_wait_s: u64,
    /// When the job may start and by when it must finish.
    #[serde(default)]
    pub window: Window,
    /// The service this job is a replica of (inference): replicas of one service of one tenant are scaled
    /// together.
    #[serde(default)]
    pub service: Option<ServiceName>,
    /// The job runs on spot capacity, at the pool's spot price, and only on pools that sell it; the site may
    /// take the capacity back at any time (the attempt is then interrupted). A service's autoscaler sets it on
    /// the replicas it places on spot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot: bool,
    /// The job can write checkpoints and resume from them.
    #[serde(default)]
    pub checkpointable: bool,
    #[serde(default)]
    pub constraints: Constraints,
    #[serde(default)]
    pub users: Vec<UserLocation>,
    #[serde(default)]
    pub datasets: Vec<DatasetNeed>,
    #[serde(default)]
    pub policy: Option<Policy>,
    pub run: RunSpec,
}

impl JobSpec {
    /// A spec with these essentials and every other field at its default: one replica, no expected duration,
    /// burst at once, no constraints, users, datasets or policy.
    pub fn new(
        tenant: TenantId,
        idempotency_key: impl Into<String>,
        kind: JobKind,
        resources: Resources,
        command: impl Into<String>,
    ) -> Self {
        JobSpec {
            v: crate::WIRE_VERSION,
            tenant,
            idempotency_key: idempotency_key.into(),
            name: None,
            kind,
            queue: None,
            priority: None,
            resources,
            replicas: 1,
            duration_s: None,
            max_wait_s: 0,
            window: Window::default(),
            service: None,
            spot: false,
            checkpointable: false,
            constraints: Constraints::default(),
            users: vec![],
            datasets: vec![],
            policy: None,
            run: RunSpec {
                command: command.into(),
                ..RunSpec::default()
            },
        }
    }

    /// Total demand in milli-devices over all replicas.
    pub fn total_milli(&self) -> u64 {
        self.resources.milli_per_replica() * u64::from(self.replicas)
    }
}

/// What one replica of a service serves on the reference model (the throughput table scales it for other
/// models): requests per second, or tokens per second. Exactly one is given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceThroughput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
}

impl ServiceThroughput {
    /// The figure given, whichever unit it is in.
    pub fn per_replica(&self) -> f64 {
        self.requests_per_s.or(self.tokens_per_s).unwrap_or(0.0)
    }

    /// The unit demand is counted in: `requests` or `tokens`.
    pub fn unit(&self) -> &'static str {
        if self.tokens_per_s.is_some() {
            "tokens"
        } else {
            "requests"
        }
    }
}

fn sixty() -> u64 {
    60
}

fn six_hundred() -> u64 {
    600
}

fn default_utilization() -> f64 {
    0.8
}

/// An inference service: replicas that the broker scales and places near its users' demand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceSpec {
    #[serde(default = "v1")]
    pub v: u32,
    pub name: ServiceName,
    pub tenant: TenantId,
    #[serde(default)]
    pub queue: Option<QueueName>,
    #[serde(default)]
    pub priority: Option<String>,
    /// What one replica takes (its models, devices or share, memory).
    pub resources: Resources,
    pub throughput: ServiceThroughput,
    /// Round trip from a user location to a replica's site, ms.
    pub slo_ms: f64,
    #[serde(default = "one")]
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// How long demand must stay above what the replicas serve before replicas are added, seconds.
    #[serde(default = "sixty")]
    pub scale_up_delay_s: u64,
    /// How long demand must stay below before replicas are removed, seconds.
    #[serde(default = "six_hundred")]
    pub scale_down_delay_s: u64,
    /// Each location's demand is the mean of its reports over this sliding window, seconds.
    #[serde(default = "sixty")]
    pub demand_window_s: u64,
    /// The share of a replica's throughput it is loaded to; the rest is headroom for bursts.
    #[serde(default = "default_utilization")]
    pub target_utilization: f64,
    /// cost, green, balanced (the default), latency, `{ carbon_price_usd_per_t = … }` or
    /// `{ max_cost_premium = … }`.
    #[serde(default)]
    pub policy: Option<Policy>,
    /// Replicas may run on spot capacity where a pool offers it.
    #[serde(default)]
    pub spot: bool,
    /// Residency, tiers, sites, price cap: as for a job.
    #[serde(default)]
    pub constraints: Constraints,
    /// What each replica runs.
    pub run: RunSpec,
}

impl ServiceSpec {
    /// The job a replica is: an inference job of the service's tenant, queue and priority, with its resources,
    /// constraints, policy and command, keyed by the service and a sequence number.
    pub fn replica_spec(&self, seq: u64) -> JobSpec {
        let mut spec = JobSpec::new(
            self.tenant.clone(),
            format!("service-{}-{seq}", self.name),
            JobKind::Inference,
            self.resources.clone(),
            self.run.command.clone(),
        );
        spec.name = Some(format!("{}-{seq}", self.name));
        spec.queue = self.queue.clone();
        spec.priority = self.priority.clone();
        spec.service = Some(self.name.clone());
        spec.constraints = self.constraints.clone();
        spec.policy = self.policy.clone();
        spec.run = self.run.clone();
        spec
    }
}

/// One device, or a share of it, assigned to a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceShare {
    pub index: u32,
    pub milli: u32,
}

/// Broker → agent: run this attempt of a job on these devices. Answered with an [`OfferReply`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
    pub site: SiteId,
    pub pool: PoolName,
    pub devices: Vec<DeviceShare>,
    pub spec: JobSpec,
    /// Latest checkpoint URI of an earlier attempt, given to the job as `MERIDIAN_RESUME_FROM`.
    #[serde(default)]
    pub resume_from: Option<String>,
}

/// The agent's answer to an offer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum OfferOutcome {
    Accepted,
    Rejected { reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferReply {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
    #[serde(flatten)]
    pub outcome: OfferOutcome,
    /// The agent's inventory mark once it accepted: any inventory from this mark on holds the attempt until its
    /// end is acknowledged.
    #[serde(default)]
    pub mark: Option<InventoryMark>,
}

/// Broker → agent: stop this attempt (its whole process group).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelAttempt {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
    pub reason: String,
}

/// Where an attempt stands, as its agent reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum AttemptState {
    Running,
    Succeeded {
        exit_code: i32,
    },
    /// The job's own command failed.
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
    Cancelled {
        reason: String,
    },
    /// The site stopped the attempt for a reason of its own (agent restart, device lost); the broker requeues.
    Interrupted {
        reason: String,
    },
}

impl AttemptState {
    pub fn is_terminal(&self) -> bool {
        !matches!(self, AttemptState::Running)
    }
}

/// Agent → broker: an attempt's state changed. Sent as a request; the broker answers with a [`StatusAck`], and
/// the agent repeats the update until it is acknowledged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
    pub site: SiteId,
    #[serde(flatten)]
    pub state: AttemptState,
    pub at_ms: u64,
    #[serde(default)]
    pub started_at_ms: Option<u64>,
    /// Wall-clock run time of the attempt so far, milliseconds.
    #[serde(default)]
    pub runtime_ms: Option<u64>,
    /// Latest checkpoint URI the job wrote.
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// The agent's inventory mark when it sent the update (see [`OfferReply::mark`]).
    #[serde(default)]
    pub mark: Option<InventoryMark>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusAck {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
}

/// Broker → agent: the last lines of an attempt's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsRequest {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
    #[serde(default = "default_log_lines")]
    pub lines: u32,
}

fn default_log_lines() -> u32 {
    50
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsReply {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    pub attempt: u32,
    pub site: SiteId,
    pub text: String,
}

// ---------------------------------------------------------------------------------------------------------------
// The API (NATS request-reply and HTTP share these bodies)

/// Stop `remove` replicas of a service: pending ones first, then cloud, partner and owned ones, the dearest
/// first within a tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleInRequest {
    #[serde(default = "v1")]
    pub v: u32,
    pub tenant: TenantId,
    pub service: ServiceName,
    pub remove: u32,
}

/// A service named by a caller: a tenant's token names its own tenant (or none); an administrator names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceRef {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub tenant: Option<TenantId>,
    /// Absent in a listing.
    #[serde(default)]
    pub name: Option<ServiceName>,
}

/// The demand of one user location, as a gateway measured it over its last interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationRate {
    /// The location's name (a city, a gateway): its window is kept under this name.
    pub name: String,
    pub location: GeoPoint,
    /// Its region in the measured round-trip table, when known.
    #[serde(default)]
    pub rtt_region: Option<String>,
    /// Demand per second, in the service's unit (requests, or tokens).
    pub per_s: f64,
}

/// A gateway's report of request rates per user location.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandReport {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub tenant: Option<TenantId>,
    pub service: ServiceName,
    pub locations: Vec<LocationRate>,
}

/// One replica of a service as `meridian service show` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceReplicaView {
    pub job: JobId,
    pub site: SiteId,
    pub pool: Option<PoolName>,
    /// On spot capacity (the site may take it back).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot: bool,
    /// `starting` (waiting, offered or accepted) or `running`.
    pub state: String,
    pub usd_per_hour: f64,
    pub co2_g_per_hour: f64,
    /// The demand the autoscaler's plan gives this replica's pool, per replica (unit per second).
    pub serves_per_s: f64,
}

/// A change the autoscaler made to a pool's replica count, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceChangeView {
    pub at_ms: u64,
    pub site: SiteId,
    pub pool: PoolName,
    /// On spot capacity (the site may take it back).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot: bool,
    pub from: u32,
    pub to: u32,
    pub why: String,
}

/// A service: its spec, replicas, the demand its autoscaler plans for and its recent changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceView {
    pub spec: ServiceSpec,
    pub replicas: Vec<ServiceReplicaView>,
    pub demand: Vec<LocationRate>,
    pub changes: Vec<ServiceChangeView>,
    /// Whether it serves: healthy, degraded (some pool backs off) or unhealthy (nothing runs and replicas
    /// keep exiting).
    #[serde(default)]
    pub health: ServiceHealth,
    /// Pools where replicas keep exiting, and how long the next start waits there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backoff: Vec<ServiceBackoffView>,
}

/// A service's health, from what its replicas do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceHealth {
    /// No pool backs off.
    #[default]
    Healthy,
    /// Replicas run, but at some pool they keep exiting.
    Degraded,
    /// No replica runs and replicas keep exiting.
    Unhealthy,
}

impl ServiceHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceHealth::Healthy => "healthy",
            ServiceHealth::Degraded => "degraded",
            ServiceHealth::Unhealthy => "unhealthy",
        }
    }
}

/// The crash-loop backoff of a service at one pool: replicas there exited by themselves this many times in a
/// row, the last as told, and no new one starts there before `next_start_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceBackoffView {
    pub site: SiteId,
    pub pool: PoolName,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot: bool,
    pub exits_in_a_row: u32,
    pub last_job: JobId,
    pub last_exit_code: Option<i32>,
    /// The site's words (`failed: exit code 127 on dc-a`).
    pub last_reason: String,
    pub last_exit_ms: u64,
    /// How long the last replica ran, in milliseconds.
    pub last_ran_ms: u64,
    pub next_start_ms: u64,
}

/// One pool a location may be routed to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteView {
    pub site: SiteId,
    pub pool: PoolName,
    /// On spot capacity (the site may take it back).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot: bool,
    pub replicas: u32,
    pub rtt_ms: f64,
    pub weight: f64,
}

/// A gateway's watch of a service's routing table, over NATS (its reply subject is where the changes go).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesWatchRequest {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub tenant: Option<TenantId>,
    pub name: ServiceName,
    /// How long changes are sent, seconds (1..=600); the gateway sends the request again to renew.
    #[serde(default = "routes_lease_s")]
    pub lease_s: u64,
}

fn routes_lease_s() -> u64 {
    60
}

/// One message of a routes watch: the table now (`seq` 1 is the reply to the watch request, then one per change,
/// numbered in order), and when the watch ends unless renewed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutesUpdate {
    pub seq: u64,
    pub until_ms: u64,
    pub routes: RoutesView,
}

/// The routing table of a service: per user location, the pools with running replicas within the SLO.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutesView {
    pub tenant: TenantId,
    pub service: ServiceName,
    pub locations: Vec<LocationRoutesView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocationRoutesView {
    pub location: String,
    pub routes: Vec<RouteView>,
}

/// Read (`toml` absent) or replace the broker's tenancy (queues, quotas, priority classes, budgets): an
/// administrator's call, with the token from the broker's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenancyRequest {
    #[serde(default = "v1")]
    pub v: u32,
    /// The token, for clients of the previous release; the `Authorization` header is the way now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default)]
    pub toml: Option<String>,
}

/// Read the journal's durable format, or upgrade it to the newest this broker knows (`upgrade`): an
/// administrator's call, made once every broker of the federation runs a release that reads the newer format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatRequest {
    #[serde(default = "v1")]
    pub v: u32,
    /// The token, for clients of the previous release; the `Authorization` header is the way now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default)]
    pub upgrade: bool,
    /// Set aside the journal message with this sequence, the one the broker cannot read (it then replays what
    /// follows and takes writes again). Only the message the broker names as unreadable can be set aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<u64>,
}

/// The journal's durable format in force, the newest the broker knows, and the message that keeps the broker
/// read-only, if one does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormatView {
    pub format: u32,
    pub newest: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<UnreadableView>,
}

/// A stored message the broker could not read (damaged, or written by something that is not a broker). In the
/// journal, until an administrator sets it aside, the broker answers reads and refuses every change; in the
/// audit or the ledger, a reader leaves it out and answers with the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreadableView {
    /// The message's sequence in its stream.
    pub seq: u64,
    pub reason: String,
}

/// The tenancy in force, as the text of a tenancy file (`None`: no quotas).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenancyView {
    pub toml: Option<String>,
}

/// Ask for the metering ledger: attempts offered in `[from_ms, to_ms)` (all when absent), of one tenant or all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub tenant: Option<TenantId>,
    #[serde(default)]
    pub from_ms: Option<u64>,
    #[serde(default)]
    pub to_ms: Option<u64>,
}

/// One line of a report: sums over the attempts (runs) it covers, in integer units.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportRow {
    /// The tenant, site or `kind:model` (or `total`).
    pub key: String,
    /// Jobs with at least one attempt in the row.
    pub jobs: u64,
    pub attempts: u64,
    /// Accelerator time: milli-devices × milliseconds (1 device-hour = 3,600,000,000).
    pub device_milli_ms: u64,
    pub cost_micro_usd: u64,
    /// Energy at the wall, PUE included.
    pub energy_wh: u64,
    pub co2_g: u64,
    /// Queue wait: from submission to the first start, summed over the row's jobs (each counted in the row
    /// of its first attempt).
    pub wait_ms: u64,
}

/// The metering ledger summed per tenant, per site and per accelerator model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportView {
    pub tenant: Option<TenantId>,
    pub from_ms: Option<u64>,
    pub to_ms: Option<u64>,
    pub by_tenant: Vec<ReportRow>,
    pub by_site: Vec<ReportRow>,
    pub by_model: Vec<ReportRow>,
    pub total: ReportRow,
    /// Messages of the ledger (`MERIDIAN_LEDGER`) that could not be read, left out of the figures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableView>,
}

/// Ask for the jobs submitted from `from_ms` on (all when absent), live and archived, with what a capacity
/// what-if replays of them: their specs and how long each attempt ran. An administrator's call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRequest {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub from_ms: Option<u64>,
}

/// The jobs a [`HistoryRequest`] asked for, oldest submission first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryView {
    /// The broker's clock when it answered (a running attempt has run until now).
    pub now_ms: u64,
    /// The tenancy (queues, quotas, priority classes, budgets) in force, as its file's text.
    pub tenancy_toml: Option<String>,
    pub jobs: Vec<HistoryJob>,
    /// The federation the broker places on now, for a what-if on it (`meridian plan` without a file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federation: Option<FederationView>,
}

/// The federation as a broker places on it: each site's facts and pools as last advertised (devices all free,
/// healthy as last told), and the tables the broker was started with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FederationView {
    pub sites: Vec<FederationSite>,
    /// Residency regions: name → outline (GeoJSON), as the broker read them.
    #[serde(default)]
    pub regions: std::collections::BTreeMap<String, String>,
    /// The measured round trips the broker places by, between a region where a site is (its `rtt_region`)
    /// and any region of the table.
    #[serde(default)]
    pub rtt: Vec<RttView>,
    /// The relative-throughput table of accelerator models (its TOML), if any.
    #[serde(default)]
    pub throughput_toml: Option<String>,
}

/// A measured round trip between two regions of the table, milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RttView {
    pub from: String,
    pub to: String,
    pub rtt_ms: f64,
}

/// One site of a [`FederationView`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FederationSite {
    pub info: SiteInfo,
    pub pools: Vec<PoolAdvert>,
    /// Whether the broker counts it up now (a lost or revoked site is left out of a what-if's today).
    pub up: bool,
}

/// One job of the history: its spec without its run spec (commands and environment stay out of it), and
/// its attempts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryJob {
    pub job: JobId,
    pub phase: JobPhase,
    pub submitted_ms: u64,
    pub spec: JobSpec,
    pub runs: Vec<HistoryRun>,
}

/// One attempt of a [`HistoryJob`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRun {
    pub attempt: u32,
    pub site: SiteId,
    pub model: ModelName,
    pub started_ms: Option<u64>,
    /// How long it ran, once it ended.
    pub runtime_ms: u64,
    /// Whether it has ended (its run time is final).
    pub ended: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleInReply {
    /// Replicas being stopped, in the order chosen.
    pub stopping: Vec<JobId>,
}

/// A request naming one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRef {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
}

/// Explain a job: the candidates of its placement, or with `all` every site of the federation as placement
/// weighs the job now (none left out by the index unscored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainRequest {
    #[serde(default = "v1")]
    pub v: u32,
    pub job: JobId,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// Drain a site (no new work; running work finishes), or undrain it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRequest {
    #[serde(default = "v1")]
    pub v: u32,
    pub site: SiteId,
    #[serde(default = "yes")]
    pub drain: bool,
}

fn yes() -> bool {
    true
}

/// Create an API token (an administrator's call). The reply holds the token itself, the one time it is shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCreateRequest {
    #[serde(default = "v1")]
    pub v: u32,
    /// The tenant it acts for (not for `admin`).
    #[serde(default)]
    pub tenant: Option<TenantId>,
    /// `admin`, `viewer`, or `submit`, `cancel`, `watch`, `report`, each optionally `:QUEUE,QUEUE`.
    pub roles: Vec<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// Valid for this long from now (default 90 days, at most 2 years).
    #[serde(default)]
    pub expires_in_s: Option<u64>,
}

/// Who a token speaks for: the answer to a dashboard's sign-in (`POST /v1/session`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// The token's id (`admin` for the broker's bootstrap token).
    pub who: String,
    pub tenant: Option<TenantId>,
    pub admin: bool,
}

/// What a broker is (`GET /v1/version`): its release, the wire version it speaks and the newest journal
/// format it writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionView {
    #[serde(default = "v1")]
    pub v: u32,
    pub version: String,
    pub wire: u32,
    pub format: u32,
}

/// A token as the API shows it: never the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub tenant: Option<TenantId>,
    pub roles: Vec<String>,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub created_by: String,
    pub revoked: bool,
}

/// The answer to a token's creation: the token (`mrd_<id>_<secret>`), shown this once, and its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCreated {
    pub token: String,
    pub view: TokenView,
}

/// Revoke an API token, by id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRevokeRequest {
    #[serde(default = "v1")]
    pub v: u32,
    pub id: String,
}

/// Revoke a site (it is lost now and nothing it sends is taken), or let it back in (`restore`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteRevokeRequest {
    #[serde(default = "v1")]
    pub v: u32,
    pub site: SiteId,
    #[serde(default)]
    pub restore: bool,
}

/// Read the audit trail (an administrator's call): entries from `since_ms`, optionally of one credential.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRequest {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub since_ms: Option<u64>,
    /// A credential id (a token id, `admin`, or `site:<id>`).
    #[serde(default)]
    pub who: Option<String>,
    /// The stream sequence to go on from (a page's `next`): oldest first, the entries after it.
    #[serde(default)]
    pub after_seq: Option<u64>,
    #[serde(default)]
    pub limit: Option<u32>,
    /// Newest first: the entries before `before_seq` (a page's `next`; from the newest when absent).
    #[serde(default)]
    pub newest_first: bool,
    #[serde(default)]
    pub before_seq: Option<u64>,
}

/// One audited action or refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at_ms: u64,
    /// The credential id: a token's id, `admin` (the broker's bootstrap token), `site:<id>`, or for a call
    /// without a valid token `nats:<identity>` (its NATS identity) or `anonymous` (over HTTP).
    pub who: String,
    /// What was done: `submit`, `cancel`, `drain`, `scale_in`, `tenancy`, `token_create`, `site_revoke`, ...
    pub action: String,
    /// What it was done to (a job, site, token, tenant), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `ok`, or why it was refused.
    pub outcome: String,
    /// Identical refusals within one interval are one entry with their count.
    #[serde(default = "one_u64", skip_serializing_if = "is_one")]
    pub count: u64,
    /// With `count` > 1: the last of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

fn one_u64() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

/// A page of the audit trail.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Messages of the trail (`MERIDIAN_AUDIT`) that could not be read, left out of this page.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableView>,
    /// The `after_seq` of the next page, when there may be more.
    pub next: Option<u64>,
}

/// An empty request (list calls).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {
    #[serde(default = "v1")]
    pub v: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitReply {
    pub job: JobId,
    /// False when the idempotency key matched an earlier submission.
    pub created: bool,
}

/// Where a job stands, as the broker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    Pending,
    Offered,
    Running,
    Cancelling,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobPhase {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobPhase::Succeeded | JobPhase::Failed | JobPhase::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Pending => "pending",
            JobPhase::Offered => "offered",
            JobPhase::Running => "running",
            JobPhase::Cancelling => "cancelling",
            JobPhase::Succeeded => "succeeded",
            JobPhase::Failed => "failed",
            JobPhase::Cancelled => "cancelled",
        }
    }
}

/// Amounts a placement expects or a run metered. Integers so that sums are exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amounts {
    pub cost_micro_usd: u64,
    pub energy_wh: u64,
    pub co2_g: u64,
}

/// Which jobs a listing covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobScope {
    /// Live jobs, then archived ones.
    #[default]
    All,
    Live,
    Archived,
}

/// List jobs a page at a time: live jobs by id, then archived jobs in the order they were archived (with
/// `newest_first`, live jobs newest first, then archived jobs the most recently archived first). Every filter is
/// optional; `cursor` is the `next` of the page before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobListRequest {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub cursor: Option<String>,
    /// Jobs per page (at most [`MAX_PAGE`]; a page also stops short of the message size limit).
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub scope: JobScope,
    #[serde(default)]
    pub tenant: Option<TenantId>,
    #[serde(default)]
    pub state: Option<JobPhase>,
    #[serde(default)]
    pub site: Option<SiteId>,
    /// Submitted at or after, ms since the Unix epoch.
    #[serde(default)]
    pub from_ms: Option<u64>,
    /// Submitted before.
    #[serde(default)]
    pub to_ms: Option<u64>,
    /// Newest first (a person's order); oldest first by default (a program's order, stable while jobs arrive).
    #[serde(default)]
    pub newest_first: bool,
    /// Only jobs whose id, name or `why` holds this text (case-insensitive).
    #[serde(default)]
    pub text: Option<String>,
}

impl JobListRequest {
    /// Whether a job of this tenant, state, site, submission time, id, name and `why` passes the filters.
    pub fn passes(&self, v: &JobView) -> bool {
        self.tenant.as_ref().is_none_or(|t| t == &v.tenant)
            && self.state.is_none_or(|p| p == v.phase)
            && self
                .site
                .as_ref()
                .is_none_or(|s| v.site.as_ref() == Some(s))
            && self.from_ms.is_none_or(|f| v.submitted_at_ms >= f)
            && self.to_ms.is_none_or(|t| v.submitted_at_ms < t)
            && self.text_matches(v.job.as_str(), v.name.as_deref(), &v.why)
    }

    /// Whether the text filter (if any) is in the id, the name or `why`.
    pub fn text_matches(&self, id: &str, name: Option<&str>, why: &str) -> bool {
        let Some(t) = self.text.as_deref().filter(|t| !t.is_empty()) else {
            return true;
        };
        let t = t.to_lowercase();
        [id, name.unwrap_or_default(), why]
            .iter()
            .any(|s| s.to_lowercase().contains(&t))
    }
}

impl Default for JobListRequest {
    /// Everything, from the first page.
    fn default() -> Self {
        JobListRequest {
            v: crate::WIRE_VERSION,
            cursor: None,
            limit: None,
            scope: JobScope::All,
            tenant: None,
            state: None,
            site: None,
            from_ms: None,
            to_ms: None,
            newest_first: false,
            text: None,
        }
    }
}

/// The most jobs one page holds.
pub const MAX_PAGE: u32 = 1000;

/// One page of jobs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// The cursor of the next page; absent on the last.
    #[serde(default)]
    pub next: Option<String>,
}

/// One job as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    pub job: JobId,
    pub tenant: TenantId,
    /// The queue the job named (permissions of queue-scoped tokens apply to it; `default` when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueName>,
    pub name: Option<String>,
    pub kind: JobKind,
    pub phase: JobPhase,
    pub attempt: u32,
    pub site: Option<SiteId>,
    pub pool: Option<PoolName>,
    /// Why the job is where it is: why it waits, or why its site was chosen.
    pub why: String,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// Expected amounts for the whole expected duration at the chosen site.
    pub estimate: Option<Amounts>,
    /// Mean round trip from the job's users to its site, milliseconds (estimate).
    pub user_rtt_ms: Option<f64>,
    /// Amounts metered from the finished attempts' run time.
    pub metered: Amounts,
    pub runtime_ms: u64,
    pub checkpoint: Option<String>,
    /// Waits because no site of the federation can run it as it stands (model, count, memory, residency…);
    /// sites that join later may. `why` says what the nearest miss lacks.
    #[serde(default)]
    pub unsatisfiable: bool,
    /// The job finished and was archived: it is read from the archive.
    #[serde(default)]
    pub archived: bool,
    /// Why a pending job waits, as the bounded label `meridian_pending_jobs` counts it by: `not_tried`,
    /// `requeued`, `no_site_fits`, `capacity`, `start_window`, `carbon_deferral`, `quota` or `budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_reason: Option<String>,
    /// Where the job's users are (the dashboard draws running jobs as flows from them to their site).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<GeoPoint>,
}

/// The state a site is in, as `meridian sites` and the `meridian_sites` metric count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SiteState {
    /// Heard from within the liveness timeout and taking work.
    Up,
    /// Up, but taking no new work (its agent or an operator drains it).
    Draining,
    /// Not heard from within the liveness timeout.
    Lost,
    /// Revoked by an operator: nothing it sends is taken.
    Revoked,
}

impl SiteState {
    pub const ALL: [SiteState; 4] = [
        SiteState::Up,
        SiteState::Draining,
        SiteState::Lost,
        SiteState::Revoked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SiteState::Up => "up",
            SiteState::Draining => "draining",
            SiteState::Lost => "lost",
            SiteState::Revoked => "revoked",
        }
    }
}

/// List sites by id, every one or only those in one state (`{"state": "lost"}`: which sites are down), a page at
/// a time where a federation has more than one answer holds: at most `limit` sites (at most [`MAX_PAGE`], and
/// fewer where they would not fit in one message) after the site `after`; an empty page is past the last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteListRequest {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(default)]
    pub state: Option<SiteState>,
    /// Only sites whose id sorts after this one.
    #[serde(default)]
    pub after: Option<SiteId>,
    /// At most this many sites (every one without it).
    #[serde(default)]
    pub limit: Option<u32>,
}

impl Default for SiteListRequest {
    fn default() -> Self {
        SiteListRequest {
            v: crate::WIRE_VERSION,
            state: None,
            after: None,
            limit: None,
        }
    }
}

/// The live work by queue: what `meridian queue` and the dashboard's queues and map read, counted over every live
/// job the caller may see (not a page of them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuesRequest {
    #[serde(default = "v1")]
    pub v: u32,
    /// Only this queue (a job that names no queue is counted under its tenant's name).
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub tenant: Option<TenantId>,
    /// How many waiting jobs of each queue to list, in the order they are tried (default 10, at most
    /// [`MAX_PAGE`]).
    #[serde(default)]
    pub head: Option<u32>,
}

impl Default for QueuesRequest {
    fn default() -> Self {
        QueuesRequest {
            v: crate::WIRE_VERSION,
            queue: None,
            tenant: None,
            head: None,
        }
    }
}

/// The live work by queue, by site and by where its users are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueuesView {
    pub queues: Vec<QueueView>,
    /// Running and offered jobs per site (sites with none left out).
    pub sites: Vec<SiteLoadView>,
    /// Running and offered jobs from their users' places to their sites, one line per place and site.
    pub flows: Vec<FlowView>,
}

/// One queue's live jobs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    /// The queue the jobs name, or their tenant's name for jobs that name none.
    pub queue: String,
    pub running: u64,
    pub offered: u64,
    pub pending: u64,
    /// Pending jobs by why they wait (the labels of `JobView::wait_reason`).
    pub reasons: std::collections::BTreeMap<String, u64>,
    /// The first waiting jobs, in the order the queue's jobs are tried: higher priority first, then oldest.
    pub waiting: Vec<QueuedJobView>,
}

/// A waiting job and its place in its queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueuedJobView {
    /// 1 is tried first.
    pub position: u64,
    pub job: JobId,
    pub tenant: TenantId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub priority: i32,
    /// Devices it asks for in all (milli-devices: 4 GPUs are 4000).
    pub milli: u64,
    pub submitted_at_ms: u64,
    pub wait_reason: String,
    pub why: String,
}

/// Running and offered jobs at one site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteLoadView {
    pub site: SiteId,
    pub running: u64,
    pub offered: u64,
}

/// Running and offered jobs whose users are at `from`, at `site`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowView {
    pub from: GeoPoint,
    pub site: SiteId,
    pub jobs: u64,
}

/// One site as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteView {
    pub site: SiteId,
    pub kind: SiteKind,
    pub tier: Tier,
    pub up: bool,
    pub draining: bool,
    pub location: GeoPoint,
    pub pue: f64,
    pub carbon_g_per_kwh: u32,
    pub pools: Vec<PoolView>,
    pub last_seen_ms: u64,
    pub generation: u64,
    /// How the site runs its work (absent for agents of earlier releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// The hourly grid-carbon forecast the site advertises (gCO2e/kWh, the first hour from
    /// `carbon_forecast_start_ms`), if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carbon_forecast: Vec<u32>,
    #[serde(default)]
    pub carbon_forecast_start_ms: u64,
    /// The intensities the broker keeps to meter the work running there, as `[from_ms, gCO2e/kWh]` steps,
    /// oldest first (back to the start of the oldest attempt still running there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carbon_history: Vec<(u64, u32)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolView {
    pub name: PoolName,
    pub kind: AcceleratorKind,
    pub model: ModelName,
    pub count: u32,
    /// Milli-devices free for new work, as the broker counts them.
    pub free_milli: u64,
    pub price_micro_usd_per_hour: u64,
}

/// Score terms of one candidate (site and pool) in a decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TermsView {
    pub cost_micro_usd: u64,
    pub energy_wh: u64,
    pub co2_g: u64,
    pub latency_ms: f64,
    pub data_bytes_moved: u64,
    /// Weighted, normalised score; lower is better, 0 is best on every term.
    pub score: f64,
}

/// A candidate in an explanation: scored, or rejected with a reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateView {
    pub site: SiteId,
    pub tier: Tier,
    pub pool: Option<PoolName>,
    pub terms: Option<TermsView>,
    pub rejected: Option<String>,
    pub chosen: bool,
}

/// A group of sites left out by the placement index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrunedView {
    pub reason: String,
    pub sites: usize,
}

/// A job's life, oldest first (`GET /v1/jobs/{id}/timeline`, `meridian timeline JOB`): every change with its
/// time, attempt and site; each attempt's placement, run time and metered amounts; the latest placement's top
/// candidates; and the end of the latest attempt's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineView {
    pub job: JobId,
    pub tenant: TenantId,
    pub phase: JobPhase,
    /// Why the job is where it is now.
    pub why: String,
    pub exit_code: Option<i32>,
    pub events: Vec<TimelineEvent>,
    pub attempts: Vec<AttemptView>,
    /// The latest placement decision: its policy, when it was made, its best candidates (the chosen one first,
    /// then the best scored, then the nearest misses).
    pub policy: String,
    pub decided_at_ms: Option<u64>,
    pub candidates: Vec<CandidateView>,
    /// The last lines of the latest attempt's log, as its site's agent has them.
    #[serde(default)]
    pub log_tail: Option<String>,
    /// Why there is no log tail (no attempt started, or the site did not answer).
    #[serde(default)]
    pub log_error: Option<String>,
}

/// One change in a job's life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    pub at_ms: u64,
    /// `submitted`, `offered`, `started`, `ended`, `waiting`, `finished`, or `note` (refusals, requeues,
    /// preemptions, cancels: what the broker noted, in words).
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteId>,
    pub detail: String,
}

/// One attempt of a job: where it was placed and what it used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: u32,
    pub site: SiteId,
    pub pool: PoolName,
    pub model: ModelName,
    /// Milli-devices held.
    pub milli: u64,
    pub offered_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub runtime_ms: u64,
    /// Whether its end was metered (`amounts` then hold what it used).
    pub metered: bool,
    pub amounts: Amounts,
}

/// Why a job is placed where it is, or why it waits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainView {
    pub job: JobId,
    pub phase: JobPhase,
    pub why: String,
    pub policy: String,
    pub decided_at_ms: Option<u64>,
    pub candidates: Vec<CandidateView>,
    /// Sites the placement index left out without scoring them, grouped by reason.
    #[serde(default)]
    pub pruned: Vec<PrunedView>,
    /// Notable events of the job, oldest first.
    pub history: Vec<String>,
    /// The candidates are every site of the federation as placement weighs the job now (`explain --all`), not
    /// those of the decision that placed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub every_site_now: bool,
    /// In words, what set the chosen candidate apart: the term it gains most on against the next best one
    /// (price, carbon, latency, data to move), what it gives up, and what kept the other sites out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

/// A reply of the NATS request-reply API: exactly one of `ok` and `error` is present.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiReply<T> {
    #[serde(default = "v1")]
    pub v: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::ErrorBody>,
}

impl<T> ApiReply<T> {
    pub fn ok(value: T) -> Self {
        Self {
            v: crate::WIRE_VERSION,
            ok: Some(value),
            error: None,
        }
    }

    pub fn err(error: crate::ErrorBody) -> Self {
        Self {
            v: crate::WIRE_VERSION,
            ok: None,
            error: Some(error),
        }
    }

    pub fn into_result(self) -> Result<T, crate::ErrorBody> {
        match (self.ok, self.error) {
            (_, Some(e)) => Err(e),
            (Some(v), None) => Ok(v),
            (None, None) => Err(crate::ErrorBody::new(
                crate::ErrorCode::Malformed,
                None,
                "reply has neither `ok` nor `error`",
            )),
        }
    }
}
