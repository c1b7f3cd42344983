//! `meridian sim`: a trace-driven, discrete-event simulation of a federation that drives the broker's own
//! reactor and placement, compared across policies and baselines, judged by an independent checker.

pub mod bound;
pub mod checker;
pub mod engine;
pub mod federation;
pub mod plan;
pub mod serving;
pub mod trace;

use anyhow::Context;
use engine::{Ranking, SimJob};
use federation::SimFederation;
use meridian_core::autoscale::{desired, offers, LocationDemand, Objective, Settings};
use meridian_core::model::Site;
use meridian_core::placement::Baseline;
use meridian_federation::{
    AcceleratorKind, Constraints, GeoPoint, JobKind, JobSpec, ModelName, Policy, PoolName,
    Resources, RunSpec, SiteId, TenantId, UserLocation, WIRE_VERSION,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use trace::{city, SplitMix64, TraceTask, CITIES};

/// Settings of one `meridian sim` invocation.
#[derive(Clone, Debug, clap::Args)]
pub struct SimOptions {
    /// Alibaba GPU trace v2023 pod list (CSV). Not with --service.
    #[arg(long, required_unless_present = "service")]
    pub trace: Option<PathBuf>,
    /// Azure LLM inference trace (CSV): requests for one inference service.
    #[arg(long)]
    pub inference: Option<PathBuf>,
    /// The simulated federation (sites, pools, prices, carbon): relative to the working folder, else to the
    /// checkout.
    #[arg(long, default_value = "configs/sim/federation.toml")]
    pub federation: PathBuf,
    /// Run only these policies or baselines, comma-separated: latency, cost, green, balanced,
    /// carbon-price=USD_PER_T, max-cost-premium=FRACTION, fifo-first-fit, nearest, cheapest, greenest,
    /// cheapest-list-price, greenest-grid.
    #[arg(long)]
    pub policy: Option<String>,
    /// Also run the baselines fifo-first-fit, nearest, cheapest, greenest, cheapest-list-price, greenest-grid.
    #[arg(long)]
    pub baselines: bool,
    /// Also sweep the carbon price (0 to 12,800 USD/t) and report the cost–kgCO2e front, with where each run
    /// lands against it (and, with --plot, draw it).
    #[arg(long)]
    pub front: bool,
    /// Also solve the offline bound (a linear relaxation with hindsight, see docs/simulator.md) for money,
    /// for carbon and for each carbon price run, and report every run's ratio to it.
    #[arg(long)]
    pub bound: bool,
    /// Seed of the random draws (submitters' cities, users): the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Trace time 0 maps to this instant (UTC, `YYYY-MM-DDTHH:MMZ`).
    #[arg(long = "start", default_value = "2022-01-01T00:00Z", value_parser = parse_instant)]
    pub start_ms: u64,
    /// max_wait_s given to every trace job.
    #[arg(long, default_value_t = 600)]
    pub max_wait_s: u64,
    /// Use only the first N trace tasks.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Inference round-trip SLO, ms.
    #[arg(long, default_value_t = 50.0)]
    pub slo_ms: f64,
    /// Requests per second one inference replica (one GPU) serves.
    #[arg(long, default_value_t = 2.0)]
    pub replica_rps: f64,
    /// Queues, quotas and priority classes for the trace's tenants (`qos-ls`, `qos-be`, …), see
    /// configs/sim/tenancy.toml; adds per-tenant wait and share to the report.
    #[arg(long)]
    pub tenancy: Option<PathBuf>,
    /// Write an SVG chart of cost against kgCO2e per run.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write every attempt of every run as JSON lines (see docs/simulator.md, "Simulator schedule"); with --service,
    /// every replica and route (see "Serving simulation").
    #[arg(long)]
    pub schedule: Option<PathBuf>,
    /// An inference service file (TOML or JSON, as `meridian service deploy` takes): simulate its autoscaling
    /// against --demand instead of a batch trace.
    #[arg(long, conflicts_with = "trace")]
    pub service: Option<PathBuf>,
    /// The demand curve of --service: the Alibaba GenAI QPS CSV; default from the data folder.
    #[arg(long, requires = "service")]
    pub demand: Option<PathBuf>,
    /// The user cities the demand is spread over (WonderNetwork server list CSV); default from the data folder.
    #[arg(long)]
    pub cities: Option<PathBuf>,
    /// Days of demand (the curve's day repeated), with --service.
    #[arg(long, default_value_t = 7)]
    pub days: u32,
    /// The demand at the busiest minute is this many replicas of the reference model at full throughput.
    #[arg(long, default_value_t = 100)]
    pub peak_replicas: u32,
    /// Seconds from a replica's start until it serves.
    #[arg(long, default_value_t = 120)]
    pub startup_s: u64,
}

/// `YYYY-MM-DDTHH:MMZ` (UTC) → milliseconds since the Unix epoch.
pub fn parse_instant(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?}: expected YYYY-MM-DDTHH:MMZ");
    let (date, time) = s.trim_end_matches('Z').split_once('T').ok_or_else(bad)?;
    trace::parse_timestamp_ms(&format!("{date} {time}:00")).ok_or_else(bad)
}

/// One run's figures, as `--output json` prints them.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    pub policy: String,
    pub jobs: usize,
    pub cost_usd: f64,
    pub energy_kwh: f64,
    pub co2_kg: f64,
    pub wait_p50_s: f64,
    pub wait_p95_s: f64,
    pub slo_attainment: Option<f64>,
    pub mean_rtt_ms: Option<f64>,
    /// Inference requests that arrived when no replica was running.
    pub requests_without_replica: Option<usize>,
    pub cloud_gpu_hours_share: f64,
    pub fragmentation: f64,
    pub violations: usize,
    /// Jobs still waiting when the trace ended (never placed).
    pub unplaced: usize,
    /// Jobs no site of the federation can run (model, memory, count…), never placed: the figures above are over
    /// the other jobs.
    pub unplaceable: usize,
    /// Why they cannot run (the nearest miss), with how many jobs each.
    pub unplaceable_why: BTreeMap<String, usize>,
    /// Per tenant (with a tenancy): jobs' waits and share of the device-hours.
    pub tenants: Vec<TenantFigures>,
    /// With `--front`: the sweep points that beat this run on both cost and kgCO2e by more than 1%.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dominated_by: Vec<String>,
    /// With `--front`: the most this run's bill ran over the `cost` policy's for the same jobs, over every
    /// prefix of the jobs in submission order, as a fraction (see [`max_prefix_premium`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_prefix_premium: Option<f64>,
    /// With `--bound`: this run's money over the least money of the bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_over_bound: Option<f64>,
    /// With `--bound`: this run's kgCO2e over the least kgCO2e of the bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub co2_over_bound: Option<f64>,
    /// With `--bound`, for a `carbon-price=…` run: its `cost + price × CO2` over the bound's least for that
    /// price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective_over_bound: Option<f64>,
    /// With `--bound`: jobs this run started after their start window (or never), for which the bound does
    /// not bind it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outside_bound_window: Option<usize>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TenantFigures {
    pub tenant: String,
    pub jobs: usize,
    pub wait_p50_s: f64,
    pub wait_p95_s: f64,
    pub device_hours: f64,
    /// Share of all device-hours of the run.
    pub share: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SimReport {
    pub runs: Vec<RunReport>,
    /// Trace rows without `scheduled_time`: they never ran and are not submitted.
    pub never_ran: usize,
    /// Trace rows that ask for no GPU: not submitted.
    pub cpu_only: usize,
    pub inference_requests: usize,
    pub inference_replicas: usize,
    /// With `--front`: one point per carbon price of the sweep, cheapest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub front: Vec<FrontPoint>,
    /// With `--bound`: the offline bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<bound::BoundReport>,
}

/// One point of the cost–kgCO2e front: a run under `carbon-price=…`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FrontPoint {
    pub carbon_price_usd_per_t: f64,
    pub cost_usd: f64,
    pub co2_kg: f64,
    pub violations: usize,
    /// As [`RunReport::max_prefix_premium`].
    pub max_prefix_premium: f64,
    /// With `--bound`: as [`RunReport::objective_over_bound`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective_over_bound: Option<f64>,
}

/// What each job was billed in a run (micro-USD, all its attempts), by job index.
pub fn bills(jobs: usize, schedule: &[engine::ScheduleEntry]) -> Vec<u64> {
    let mut out = vec![0u64; jobs];
    for e in schedule {
        out[e.job] = out[e.job].saturating_add(e.metered.cost_micro_usd);
    }
    out
}

/// The most a run's bill ran over a reference run's for the same jobs, over every prefix of the jobs in
/// submission order: `max over k of Σ_{i≤k} run[i] / Σ_{i≤k} reference[i] − 1` (prefixes the reference billed
/// nothing for are skipped). A placement that holds a cost premium on the work submitted so far — all a broker
/// can know when it places — keeps this at most that premium over the reference; one that overspends early to
/// make it back later does not.
pub fn max_prefix_premium(order: &[usize], run: &[u64], reference: &[u64]) -> f64 {
    let (mut a, mut b) = (0u128, 0u128);
    let mut worst = f64::NEG_INFINITY;
    for &i in order {
        a += u128::from(run[i]);
        b += u128::from(reference[i]);
        if b > 0 {
            worst = worst.max(a as f64 / b as f64 - 1.0);
        }
    }
    if worst.is_finite() {
        worst
    } else {
        0.0
    }
}

/// The job spec a trace task becomes: its GPUs (or share), its duration on the reference model, and its
/// submitter's city as the user location.
pub fn trace_job_spec(
    t: &TraceTask,
    origin: usize,
    max_wait_s: u64,
    rtt_region: Option<String>,
) -> JobSpec {
    let (name, location) = city(origin);
    let (models, model_memory_mib) = trace::model_constraint(&t.models);
    JobSpec {
        v: WIRE_VERSION,
        tenant: TenantId::new(if t.qos.is_empty() {
            "trace".to_owned()
        } else {
            format!("qos-{}", t.qos.to_ascii_lowercase())
        })
        .unwrap_or_else(|_| TenantId::new("trace").unwrap_or_else(|_| unreachable!("literal id"))),
        idempotency_key: t.name.clone(),
        name: Some(t.name.clone()),
        kind: if t.gpus >= 2 {
            JobKind::Training
        } else {
            JobKind::Batch
        },
        queue: None,
        priority: None,
        resources: Resources {
            kind: AcceleratorKind::Gpu,
            models,
            count: if t.milli.is_some() { 0 } else { t.gpus },
            milli: t.milli,
            memory_mib: None,
            model_memory_mib,
            same_node: false,
            mig: None,
        },
        replicas: 1,
        duration_s: Some(t.duration_s),
        max_wait_s,
        window: Default::default(),
        service: None,
        spot: false,
        checkpointable: false,
        constraints: Constraints::default(),
        users: vec![UserLocation {
            name: Some(name.to_owned()),
            location,
            weight: 1.0,
            rtt_region,
        }],
        datasets: vec![],
        policy: None,
        run: RunSpec {
            command: format!("sleep {}", t.duration_s),
            ..RunSpec::default()
        },
    }
}

/// The jobs of a trace: each task with a submitter city drawn (seeded) from [`CITIES`] by weight.
pub fn trace_jobs(
    tasks: &[TraceTask],
    seed: u64,
    start_ms: u64,
    max_wait_s: u64,
    regions: &[(String, GeoPoint)],
) -> Vec<SimJob> {
    let mut rng = SplitMix64::new(seed);
    let weights: Vec<f64> = CITIES.iter().map(|c| c.1).collect();
    tasks
        .iter()
        .map(|t| {
            let origin = rng.weighted(&weights);
            (t, origin, nearest_region(regions, city(origin).1))
        })
        .map(|(t, origin, region)| SimJob {
            spec: trace_job_spec(t, origin, max_wait_s, region),
            arrival_ms: start_ms + t.arrival_s * 1000,
            reference_ms: t.duration_s * 1000,
            fixed_runtime: false,
            trace_models: t.models.clone(),
        })
        .collect()
}

/// Farthest a user may be from an Azure region to be mapped to it for the measured round-trip table, km.
pub const REGION_MAP_KM: f64 = 300.0;

/// Azure regions and their coordinates (`cloud-region-coords`), to map user cities onto the measured
/// round-trip table; empty where the data is absent (outside CI).
pub fn azure_regions() -> anyhow::Result<Vec<(String, GeoPoint)>> {
    let Some(path) = meridian_broker::data::data_file(std::path::Path::new(
        "cloud-region-coords/cloud_region_coords.csv",
    ))?
    else {
        return Ok(Vec::new());
    };
    let mut reader =
        csv::Reader::from_path(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for row in reader.records() {
        let row = row.with_context(|| format!("reading {}", path.display()))?;
        if row.get(0) != Some("azure") {
            continue;
        }
        let (Some(id), Some(lat), Some(lon)) = (row.get(1), row.get(4), row.get(5)) else {
            continue;
        };
        if let (Ok(lat), Ok(lon)) = (lat.parse(), lon.parse()) {
            out.push((id.to_owned(), GeoPoint { lat, lon }));
        }
    }
    Ok(out)
}

/// The nearest region within [`REGION_MAP_KM`] of `p`.
pub fn nearest_region(regions: &[(String, GeoPoint)], p: GeoPoint) -> Option<String> {
    regions
        .iter()
        .map(|(id, at)| (meridian_core::latency::distance_km(p, *at), id))
        .filter(|(d, _)| *d <= REGION_MAP_KM)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, id)| id.clone())
}

/// The carbon prices of the `--front` sweep, USD per tonne CO2e.
pub const FRONT_PRICES: [f64; 11] = [
    0.0, 25.0, 50.0, 100.0, 190.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0, 12800.0,
];

/// The rankings a run set compares.
pub fn rankings(policy: Option<&str>, baselines: bool) -> anyhow::Result<Vec<Ranking>> {
    let all = [
        Policy::Latency,
        Policy::Cost,
        Policy::Green,
        Policy::Balanced,
        Policy::CarbonPriceUsdPerT(190.0),
        Policy::MaxCostPremium(0.05),
    ];
    let mut out: Vec<Ranking> = match policy {
        None => all.into_iter().map(Ranking::Policy).collect(),
        Some(names) => names
            .split(',')
            .map(str::trim)
            .map(|name| match Baseline::parse(name) {
                Some(b) => Ok(Ranking::Baseline(b)),
                None => Policy::parse_label(name).map(Ranking::Policy).map_err(|e| {
                    anyhow::anyhow!(
                        "--policy: {e}; baselines: fifo-first-fit, nearest, cheapest, greenest, cheapest-list-price, greenest-grid"
                    )
                }),
            })
            .collect::<anyhow::Result<_>>()?,
    };
    if baselines {
        for b in Baseline::ALL {
            if !out.contains(&Ranking::Baseline(b)) {
                out.push(Ranking::Baseline(b));
            }
        }
    }
    Ok(out)
}

/// The inference workload: replica jobs and, per request, its time and the population it comes from.
struct Inference {
    replicas: Vec<SimJob>,
    /// Offset of each request from the trace's first, ms.
    times: Vec<u64>,
    /// Population of each request.
    origins: Vec<usize>,
    /// The populations' locations and measured-table regions.
    populations: Vec<LocationDemand>,
}

fn plan_inference(
    fed: &SimFederation,
    requests: &[u64],
    opts: &SimOptions,
    regions: &[(String, GeoPoint)],
) -> Inference {
    let mut rng = SplitMix64::new(opts.seed ^ 0x1f1f);
    let weights: Vec<f64> = CITIES.iter().map(|c| c.1).collect();
    let origins: Vec<usize> = requests.iter().map(|_| rng.weighted(&weights)).collect();
    // Size for the busiest minute.
    let mut per_minute: BTreeMap<u64, usize> = BTreeMap::new();
    for t in requests {
        *per_minute.entry(t / 60_000).or_default() += 1;
    }
    let peak_rps = per_minute.values().max().copied().unwrap_or(0) as f64 / 60.0;
    let total: f64 = weights.iter().sum();
    let pops: Vec<LocationDemand> = CITIES
        .iter()
        .enumerate()
        .map(|(i, (name, w, _, _))| LocationDemand {
            name: (*name).to_owned(),
            location: city(i).1,
            rtt_region: nearest_region(regions, city(i).1),
            rate: peak_rps * w / total,
        })
        .collect();
    let window_ms = requests.last().copied().unwrap_or(0) + 60_000;
    let mut replicas = Vec::new();
    for (site, count, users) in sized_replicas(fed, opts, &pops) {
        for r in 0..count {
            let mut spec = JobSpec::new(
                TenantId::new("inference").unwrap_or_else(|_| unreachable!("literal id")),
                format!("replica-{site}-{r}"),
                JobKind::Inference,
                Resources::whole(AcceleratorKind::Gpu, 1),
                "serve",
            );
            spec.name = Some(format!("llm-{site}-{r}"));
            spec.duration_s = Some(window_ms / 1000);
            // The plan sizes the service and says whom each replica is for; where it runs is the policy's
            // choice, like any job's.
            spec.users = users.clone();
            replicas.push(SimJob {
                spec,
                arrival_ms: opts.start_ms,
                reference_ms: window_ms,
                fixed_runtime: true,
                trace_models: Vec::new(),
            });
        }
    }
    Inference {
        replicas,
        times: requests.to_vec(),
        origins,
        populations: pops,
    }
}

/// The inference service sized for its peak as the services' autoscaler sizes a deployed service
/// ([`desired`]): every population served within the SLO by the owned sites first, then partner, then cloud,
/// and within a tier the cheapest per request; each replica loaded fully. Per site: its replicas and the
/// populations they are for, weighted by the rate each sends there.
fn sized_replicas(
    fed: &SimFederation,
    opts: &SimOptions,
    pops: &[LocationDemand],
) -> Vec<(SiteId, u32, Vec<UserLocation>)> {
    let sites: BTreeMap<SiteId, Site> = fed
        .sites
        .iter()
        .map(|s| {
            let advert = meridian_federation::SiteAdvert {
                v: WIRE_VERSION,
                site: s.info_at(opts.start_ms),
                pools: s.pools.clone(),
                generation: 1,
                draining: false,
                sent_at_ms: opts.start_ms,
            };
            (s.id.clone(), Site::from_advert(&advert, opts.start_ms))
        })
        .collect();
    let view = meridian_core::placement::View {
        sites: &sites,
        rtt: &fed.rtt,
        regions: &fed.regions,
        throughput: &fed.throughput,
        index: None,
        format: meridian_core::durable::FORMAT_VERSION,
    };
    let replica = JobSpec::new(
        TenantId::new("inference").unwrap_or_else(|_| unreachable!("literal id")),
        "replica",
        JobKind::Inference,
        Resources::whole(AcceleratorKind::Gpu, 1),
        "serve",
    );
    let offers = offers(view, &replica, opts.replica_rps, false);
    let settings = Settings {
        slo_ms: opts.slo_ms,
        min_replicas: 0,
        max_replicas: u32::MAX / 2,
        utilization: 1.0,
        objective: Objective::Cost,
        up_delay_ms: 0,
        down_delay_ms: 0,
        window_ms: 0,
    };
    let plan = desired(&offers, pops, &fed.rtt, &settings);
    let mut per_site: BTreeMap<SiteId, (u32, Vec<UserLocation>)> = BTreeMap::new();
    for (key, n) in &plan.replicas {
        per_site.entry(key.site.clone()).or_default().0 += n;
    }
    for (l, shares) in plan.served.iter().enumerate() {
        let mut at: BTreeMap<&SiteId, f64> = BTreeMap::new();
        for (i, rate) in shares {
            *at.entry(&offers[*i].key.site).or_default() += rate;
        }
        for (site, rate) in at {
            if let Some((_, users)) = per_site.get_mut(site) {
                users.push(UserLocation {
                    name: Some(pops[l].name.clone()),
                    location: pops[l].location,
                    weight: rate.max(1e-6),
                    rtt_region: pops[l].rtt_region.clone(),
                });
            }
        }
    }
    per_site
        .into_iter()
        .map(|(site, (n, users))| (site, n, users))
        .collect()
}

/// Each request against the replicas actually running when it arrives: served within the SLO when a running
/// replica within `slo_ms` of its population has throughput to spare in that second (`replica_rps` requests per
/// second each; the nearest first, then the next). Returns (share served within the SLO, mean round trip to the
/// nearest running replica, requests that found no replica running at all).
fn serve_requests(
    fed: &SimFederation,
    inf: &Inference,
    schedule: &[engine::ScheduleEntry],
    replica_count: usize,
    opts: &SimOptions,
) -> (f64, f64, usize) {
    let replicas: Vec<(&engine::ScheduleEntry, GeoPoint, Option<String>)> = schedule
        .iter()
        .filter(|e| e.job < replica_count)
        .filter_map(|e| {
            let info = fed.site(&e.site)?.info_at(opts.start_ms);
            Some((e, info.location, info.rtt_region))
        })
        .collect();
    let per_second = opts.replica_rps.max(0.0);
    let mut load: BTreeMap<(usize, u64), f64> = BTreeMap::new();
    let (mut ok, mut none, mut rtt_sum, mut rtt_n) = (0usize, 0usize, 0.0, 0usize);
    for (t, o) in inf.times.iter().zip(&inf.origins) {
        let at = opts.start_ms + t;
        let pop = &inf.populations[*o];
        let mut running: Vec<(f64, usize)> = replicas
            .iter()
            .enumerate()
            .filter(|(_, (e, _, _))| e.start_ms <= at && at < e.end_ms)
            .map(|(i, (_, loc, region))| {
                let rtt = meridian_core::latency::rtt_ms(
                    &fed.rtt,
                    pop.location,
                    pop.rtt_region.as_deref(),
                    *loc,
                    region.as_deref(),
                );
                (rtt, i)
            })
            .collect();
        running.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some(nearest) = running.first() else {
            none += 1;
            continue;
        };
        rtt_sum += nearest.0;
        rtt_n += 1;
        let second = at / 1000;
        if let Some((_, i)) = running
            .iter()
            .take_while(|(rtt, _)| *rtt <= opts.slo_ms)
            .find(|(_, i)| load.get(&(*i, second)).copied().unwrap_or(0.0) + 1.0 <= per_second)
        {
            *load.entry((*i, second)).or_default() += 1.0;
            ok += 1;
        }
    }
    let n = inf.times.len().max(1) as f64;
    (
        round(ok as f64 / n, 4),
        round(rtt_sum / rtt_n.max(1) as f64, 2),
        none,
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// A simulation's report, each run's schedule (by ranking name) and the jobs the schedules index.
pub type Simulated = (
    SimReport,
    Vec<(String, Vec<engine::ScheduleEntry>)>,
    Vec<SimJob>,
);

/// Runs every requested ranking over the same workload.
pub fn simulate(opts: &SimOptions) -> anyhow::Result<Simulated> {
    let fed = SimFederation::load(&opts.federation)?;
    let trace_path = opts
        .trace
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("--trace FILE is required (or --service with --demand)"))?;
    let text = std::fs::read_to_string(meridian_broker::local::resolve(trace_path))
        .with_context(|| format!("reading {}", trace_path.display()))?;
    let mut tr = trace::parse_alibaba(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", trace_path.display()))?;
    if let Some(n) = opts.limit {
        tr.tasks.truncate(n);
    }
    let requests = match &opts.inference {
        Some(p) => trace::parse_azure_llm(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
        None => Vec::new(),
    };
    let regions = azure_regions()?;
    let inference = (!requests.is_empty()).then(|| plan_inference(&fed, &requests, opts, &regions));
    let mut jobs: Vec<SimJob> = inference
        .as_ref()
        .map(|i| i.replicas.clone())
        .unwrap_or_default();
    let replica_count = jobs.len();
    jobs.extend(trace_jobs(
        &tr.tasks,
        opts.seed,
        opts.start_ms,
        opts.max_wait_s,
        &regions,
    ));
    let tenancy = match &opts.tenancy {
        Some(path) => {
            let text = std::fs::read_to_string(meridian_broker::local::resolve(path))
                .with_context(|| format!("reading {}", path.display()))?;
            let t = meridian_core::quota::Tenancy::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            // A tenant's jobs take the priority class named after it, where there is one.
            for j in &mut jobs {
                if t.priorities.contains_key(j.spec.tenant.as_str()) {
                    j.spec.priority = Some(j.spec.tenant.to_string());
                }
                t.queue_of(&j.spec.tenant, None).map_err(|e| {
                    anyhow::anyhow!("{}: no queue for the trace's jobs: {e}", path.display())
                })?;
            }
            Some(text)
        }
        None => None,
    };
    let run_one = |ranking: &Ranking| -> anyhow::Result<(RunReport, Vec<engine::ScheduleEntry>)> {
        let out = engine::run(&fed, &jobs, ranking, opts.start_ms, tenancy.as_deref())?;
        let checked = checker::check(&fed, &jobs, &out.schedule);
        let (slo, mean_rtt, no_replica) = match &inference {
            Some(inf) => {
                let (slo, rtt, none) =
                    serve_requests(&fed, inf, &out.schedule, replica_count, opts);
                (Some(slo), Some(rtt), Some(none))
            }
            None => (None, None, None),
        };
        let mut report = run_report(
            ranking.name(),
            jobs.len(),
            &checked,
            &out,
            tenancy.is_some(),
        );
        report.slo_attainment = slo;
        report.mean_rtt_ms = mean_rtt;
        report.requests_without_replica = no_replica;
        for v in checked.violations.iter().take(5) {
            tracing::warn!("{}: violation: {v}", ranking.name());
        }
        Ok((report, out.schedule))
    };
    let mut runs = Vec::new();
    let mut schedules = Vec::new();
    let rankings = rankings(opts.policy.as_deref(), opts.baselines)?;
    let progress = crate::progress::Progress::runs(
        rankings.len() + if opts.front { FRONT_PRICES.len() } else { 0 },
        &format!("simulating {} jobs:", jobs.len()),
    );
    for ranking in rankings {
        progress.start(&ranking.name());
        let (report, schedule) = run_one(&ranking)?;
        progress.done();
        schedules.push((ranking.name(), schedule));
        runs.push(report);
    }
    let mut front = Vec::new();
    if opts.front {
        // The `cost` policy's bill per job: what each run's premium over the work so far is counted against.
        let cost_name = Ranking::Policy(Policy::Cost).name();
        let reference = match schedules.iter().find(|(name, _)| *name == cost_name) {
            Some((_, schedule)) => bills(jobs.len(), schedule),
            None => bills(jobs.len(), &run_one(&Ranking::Policy(Policy::Cost))?.1),
        };
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by_key(|&i| (jobs[i].arrival_ms, i));
        let premium = |schedule: &[engine::ScheduleEntry]| {
            round(
                max_prefix_premium(&order, &bills(jobs.len(), schedule), &reference),
                4,
            )
        };
        for price in FRONT_PRICES {
            let ranking = Ranking::Policy(Policy::CarbonPriceUsdPerT(price));
            progress.start(&ranking.name());
            let (r, schedule) = run_one(&ranking)?;
            progress.done();
            front.push(FrontPoint {
                carbon_price_usd_per_t: price,
                cost_usd: r.cost_usd,
                co2_kg: r.co2_kg,
                violations: r.violations,
                max_prefix_premium: premium(&schedule),
                objective_over_bound: None,
            });
        }
        for (r, (_, schedule)) in runs.iter_mut().zip(&schedules) {
            r.dominated_by = front
                .iter()
                .filter(|p| p.cost_usd < 0.99 * r.cost_usd && p.co2_kg < 0.99 * r.co2_kg)
                .map(|p| format!("carbon-price={}", p.carbon_price_usd_per_t))
                .collect();
            r.max_prefix_premium = Some(premium(schedule));
        }
    }
    let bound = match opts.bound {
        true => Some(apply_bound(&fed, &jobs, &mut runs, &schedules, &mut front)?),
        false => None,
    };
    Ok((
        SimReport {
            runs,
            never_ran: tr.never_ran,
            cpu_only: tr.cpu_only,
            inference_requests: requests.len(),
            inference_replicas: replica_count,
            front,
            bound,
        },
        schedules,
        jobs,
    ))
}

/// Solves the offline bound for money, carbon and every carbon price among the runs and the front, and sets
/// each run's and front point's ratios to it.
fn apply_bound(
    fed: &SimFederation,
    jobs: &[SimJob],
    runs: &mut [RunReport],
    schedules: &[(String, Vec<engine::ScheduleEntry>)],
    front: &mut [FrontPoint],
) -> anyhow::Result<bound::BoundReport> {
    let relaxation = bound::relaxation(fed, jobs);
    let money = relaxation.solve(bound::Objective::Money)?;
    let carbon = relaxation.solve(bound::Objective::Carbon)?;
    let price_of = |name: &str| match Policy::parse_label(name) {
        Ok(Policy::CarbonPriceUsdPerT(p)) => Some(p),
        _ => None,
    };
    let mut prices: Vec<f64> = runs.iter().filter_map(|r| price_of(&r.policy)).collect();
    prices.extend(front.iter().map(|p| p.carbon_price_usd_per_t));
    prices.sort_by(f64::total_cmp);
    prices.dedup();
    let mut objectives = Vec::new();
    for price in prices {
        let o = relaxation.solve(bound::Objective::CarbonPrice(price))?;
        objectives.push(bound::ObjectiveBound {
            carbon_price_usd_per_t: price,
            objective_usd: round(o.objective, 2),
            cost_usd: round(o.cost_usd, 2),
            co2_kg: round(o.co2_kg, 1),
        });
    }
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| round(a / b, 4));
    let objective_ratio = |price: f64, cost: f64, co2: f64| {
        objectives
            .iter()
            .find(|o| o.carbon_price_usd_per_t == price)
            .and_then(|o| ratio(cost + price * co2 / 1000.0, o.objective_usd))
    };
    for (r, (_, schedule)) in runs.iter_mut().zip(schedules) {
        r.cost_over_bound = ratio(r.cost_usd, money.cost_usd);
        r.co2_over_bound = ratio(r.co2_kg, carbon.co2_kg);
        r.objective_over_bound =
            price_of(&r.policy).and_then(|p| objective_ratio(p, r.cost_usd, r.co2_kg));
        r.outside_bound_window = Some(bound::outside_window(fed, jobs, &relaxation, schedule));
    }
    for p in front.iter_mut() {
        p.objective_over_bound = objective_ratio(p.carbon_price_usd_per_t, p.cost_usd, p.co2_kg);
    }
    tracing::info!(
        "bound: {} jobs over {} days, {} objectives solved",
        relaxation.covered(),
        relaxation.days,
        objectives.len() + 2
    );
    Ok(bound::BoundReport {
        jobs: relaxation.covered(),
        days: relaxation.days,
        cost_usd: round(money.cost_usd, 2),
        co2_kg: round(carbon.co2_kg, 1),
        objectives,
    })
}

/// A run's figures from what the checker found and what the engine left unplaced (the inference figures are
/// the caller's).
pub fn run_report(
    name: String,
    jobs: usize,
    checked: &checker::Checked,
    out: &engine::SimOutput,
    tenants: bool,
) -> RunReport {
    let mut waits = checked.waits_s.clone();
    waits.sort_by(f64::total_cmp);
    RunReport {
        policy: name,
        jobs,
        cost_usd: round(checked.cost_usd, 2),
        energy_kwh: round(checked.energy_kwh, 1),
        co2_kg: round(checked.co2_kg, 1),
        wait_p50_s: round(percentile(&waits, 0.5), 1),
        wait_p95_s: round(percentile(&waits, 0.95), 1),
        slo_attainment: None,
        mean_rtt_ms: None,
        requests_without_replica: None,
        cloud_gpu_hours_share: round(
            if checked.device_hours > 0.0 {
                checked.cloud_device_hours / checked.device_hours
            } else {
                0.0
            },
            4,
        ),
        fragmentation: round(checked.fragmentation, 4),
        violations: checked.violations.len(),
        unplaced: out.unplaced.len(),
        unplaceable: out.unplaceable.len(),
        unplaceable_why: out
            .unplaceable
            .iter()
            .fold(BTreeMap::new(), |mut m, (_, why)| {
                *m.entry(why.clone()).or_default() += 1;
                m
            }),
        tenants: if tenants {
            checked
                .tenants
                .iter()
                .map(|(tenant, (waits, hours))| {
                    let mut w = waits.clone();
                    w.sort_by(f64::total_cmp);
                    TenantFigures {
                        tenant: tenant.clone(),
                        jobs: w.len(),
                        wait_p50_s: round(percentile(&w, 0.5), 1),
                        wait_p95_s: round(percentile(&w, 0.95), 1),
                        device_hours: round(*hours, 1),
                        share: round(
                            if checked.device_hours > 0.0 {
                                hours / checked.device_hours
                            } else {
                                0.0
                            },
                            4,
                        ),
                    }
                })
                .collect()
        } else {
            Vec::new()
        },
        dominated_by: Vec::new(),
        max_prefix_premium: None,
        cost_over_bound: None,
        co2_over_bound: None,
        objective_over_bound: None,
        outside_bound_window: None,
    }
}

/// The `--bound` section of the table: the bound's figures, then each run's ratios to them.
fn bound_table(b: &bound::BoundReport, r: &SimReport) -> String {
    let mut s = format!(
        "\nBOUND ({} jobs over {} days; no schedule starting each job in its window does better)\n  money {:.2} $   carbon {:.1} kg\n",
        b.jobs, b.days, b.cost_usd, b.co2_kg
    );
    for o in &b.objectives {
        s.push_str(&format!(
            "  carbon-price={:<14} cost + price x CO2 {:.2} $ ({:.2} $, {:.1} kg)\n",
            o.carbon_price_usd_per_t, o.objective_usd, o.cost_usd, o.co2_kg
        ));
    }
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.3}x")).unwrap_or_else(|| "-".into());
    s.push_str(&format!(
        "  {:<22} {:>10} {:>10} {:>10} {:>14}\n",
        "RUN", "COST/BOUND", "CO2/BOUND", "OBJ/BOUND", "OUTSIDE WINDOW"
    ));
    for x in &r.runs {
        s.push_str(&format!(
            "  {:<22} {:>10} {:>10} {:>10} {:>14}\n",
            x.policy,
            opt(x.cost_over_bound),
            opt(x.co2_over_bound),
            opt(x.objective_over_bound),
            x.outside_bound_window.unwrap_or(0)
        ));
    }
    for p in &r.front {
        s.push_str(&format!(
            "  {:<22} {:>10} {:>10} {:>10}\n",
            format!("carbon-price={}", p.carbon_price_usd_per_t),
            "",
            "",
            opt(p.objective_over_bound)
        ));
    }
    s
}

/// The report as an aligned table.
pub fn table(r: &SimReport) -> String {
    let mut s = format!(
        "{:<22} {:>6} {:>6} {:>12} {:>11} {:>10} {:>9} {:>10} {:>7} {:>8} {:>7} {:>6} {:>4}\n",
        "POLICY",
        "JOBS",
        "UNPL",
        "COST $",
        "ENERGY kWh",
        "CO2 kg",
        "WAIT p50",
        "WAIT p95",
        "SLO",
        "RTT ms",
        "CLOUD",
        "FRAG",
        "VIOL"
    );
    for x in &r.runs {
        let opt =
            |v: Option<f64>, d: usize| v.map(|v| format!("{v:.d$}")).unwrap_or_else(|| "-".into());
        s.push_str(&format!(
            "{:<22} {:>6} {:>6} {:>12.2} {:>11.1} {:>10.1} {:>9.1} {:>10.1} {:>7} {:>8} {:>7.4} {:>6.4} {:>4}\n",
            x.policy,
            x.jobs,
            x.unplaceable,
            x.cost_usd,
            x.energy_kwh,
            x.co2_kg,
            x.wait_p50_s,
            x.wait_p95_s,
            opt(x.slo_attainment, 4),
            opt(x.mean_rtt_ms, 1),
            x.cloud_gpu_hours_share,
            x.fragmentation,
            x.violations
        ));
        for t in &x.tenants {
            s.push_str(&format!(
                "  tenant {:<16} {:>6} jobs, wait p50 {:.1} s, p95 {:.1} s, {:.1} device-hours ({:.1}%)\n",
                t.tenant,
                t.jobs,
                t.wait_p50_s,
                t.wait_p95_s,
                t.device_hours,
                t.share * 100.0
            ));
        }
    }
    if !r.front.is_empty() {
        s.push_str(
            "\nFRONT (carbon price sweep)      COST $     CO2 kg  PREFIX PREMIUM  RUNS AT OR NEAR IT\n",
        );
        for p in &r.front {
            let near: Vec<&str> = r
                .runs
                .iter()
                .filter(|x| {
                    (x.cost_usd - p.cost_usd).abs() <= 0.01 * p.cost_usd
                        && (x.co2_kg - p.co2_kg).abs() <= 0.01 * p.co2_kg
                })
                .map(|x| x.policy.as_str())
                .collect();
            s.push_str(&format!(
                "  carbon-price={:<14} {:>10.2} {:>10.1}  {:>13.1}%  {}\n",
                p.carbon_price_usd_per_t,
                p.cost_usd,
                p.co2_kg,
                p.max_prefix_premium * 100.0,
                near.join(", ")
            ));
        }
        for x in &r.runs {
            s.push_str(&format!(
                "  {:<22} {}{}\n",
                x.policy,
                if x.dominated_by.is_empty() {
                    "on the front: no sweep point is cheaper and cleaner by more than 1%".to_owned()
                } else {
                    format!("beaten on both axes by {}", x.dominated_by.join(", "))
                },
                x.max_prefix_premium
                    .map(|p| format!("; prefix premium {:.1}%", p * 100.0))
                    .unwrap_or_default()
            ));
        }
        s.push_str(
            "  (prefix premium: the most a run's bill ran over `cost`'s for the same jobs, over every prefix of the\n   jobs in submission order)\n",
        );
    }
    if let Some(b) = &r.bound {
        s.push_str(&bound_table(b, r));
    }
    s.push_str(&format!(
        "\n{} trace rows never ran (no scheduled_time) and {} ask for no GPU: not submitted. Inference: {} requests, {} replicas.\n",
        r.never_ran, r.cpu_only, r.inference_requests, r.inference_replicas
    ));
    s
}

/// An SVG scatter of cost against kgCO2e, one labelled point per run.
pub fn plot_svg(r: &SimReport) -> String {
    let (w, h, m) = (640.0, 420.0, 60.0);
    let xs: Vec<f64> = r
        .runs
        .iter()
        .map(|x| x.cost_usd)
        .chain(r.front.iter().map(|p| p.cost_usd))
        .collect();
    let ys: Vec<f64> = r
        .runs
        .iter()
        .map(|x| x.co2_kg)
        .chain(r.front.iter().map(|p| p.co2_kg))
        .collect();
    let span = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let pad = ((hi - lo) * 0.1).max(1.0);
        (lo - pad, hi + pad)
    };
    let ((x0, x1), (y0, y1)) = (span(&xs), span(&ys));
    let px = |x: f64| m + (x - x0) / (x1 - x0) * (w - 2.0 * m);
    let py = |y: f64| h - m - (y - y0) / (y1 - y0) * (h - 2.0 * m);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">cost (USD) {x0:.0} – {x1:.0}</text>\n\
         <text x=\"15\" y=\"{}\" transform=\"rotate(-90 15 {})\" text-anchor=\"middle\">kgCO2e {y0:.0} – {y1:.0}</text>\n",
        h - m, w - m, h - m, h - m, w / 2.0, h - 20.0, h / 2.0, h / 2.0
    );
    if !r.front.is_empty() {
        let points: Vec<String> = r
            .front
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.cost_usd), py(p.co2_kg)))
            .collect();
        s.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>\n",
            points.join(" ")
        ));
        for p in &r.front {
            s.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#888\"><title>carbon-price={} USD/t</title></circle>\n",
                px(p.cost_usd),
                py(p.co2_kg),
                p.carbon_price_usd_per_t
            ));
        }
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#888\">front: carbon price 0 – 12,800 USD/t</text>\n",
            w - m - 230.0,
            m - 10.0
        ));
    }
    for x in &r.runs {
        let (cx, cy) = (px(x.cost_usd), py(x.co2_kg));
        s.push_str(&format!(
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"5\" fill=\"#2a6\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            cx + 8.0,
            cy - 6.0,
            x.policy
        ));
    }
    s.push_str("</svg>\n");
    s
}

/// One attempt of a run's schedule, as `--schedule` writes it (one JSON object per line).
#[derive(Serialize)]
struct ScheduleLine<'a> {
    policy: &'a str,
    /// The trace task's name.
    job: &'a str,
    job_id: &'a str,
    attempt: u32,
    site: &'a str,
    pool: &'a PoolName,
    model: &'a ModelName,
    devices: Vec<DeviceLine>,
    start_ms: u64,
    end_ms: u64,
    /// `finished` (ran to its end) or `preempted` (stopped to give quota back; the job ran again later).
    ended: &'static str,
    cost_micro_usd: u64,
    energy_wh: u64,
    co2_g: u64,
}

#[derive(Serialize)]
struct DeviceLine {
    index: u32,
    milli: u32,
}

/// Writes what the command line asked for beside the report: the SVG plot and the schedules.
pub fn write_outputs(opts: &SimOptions, sim: &Simulated) -> anyhow::Result<()> {
    let (report, schedules, jobs) = sim;
    if let Some(path) = &opts.plot {
        std::fs::write(path, plot_svg(report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &opts.schedule {
        let mut text = String::new();
        for (policy, entries) in schedules {
            for e in entries {
                let line = ScheduleLine {
                    policy,
                    job: jobs[e.job].spec.name.as_deref().unwrap_or(""),
                    job_id: e.job_id.as_str(),
                    attempt: e.attempt,
                    site: e.site.as_str(),
                    pool: &e.pool,
                    model: &e.model,
                    devices: e
                        .devices
                        .iter()
                        .map(|d| DeviceLine {
                            index: d.index,
                            milli: d.milli,
                        })
                        .collect(),
                    start_ms: e.start_ms,
                    end_ms: e.end_ms,
                    ended: if e.stopped { "preempted" } else { "finished" },
                    cost_micro_usd: e.metered.cost_micro_usd,
                    energy_wh: e.metered.energy_wh,
                    co2_g: e.metered.co2_g,
                };
                text.push_str(&serde_json::to_string(&line)?);
                text.push('\n');
            }
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::max_prefix_premium;

    /// A run that overspends on the first jobs and makes it back later has a low total premium but a high
    /// prefix premium; prefixes the reference billed nothing for are skipped; the order is submission order,
    /// not index order.
    #[test]
    fn the_prefix_premium_is_the_worst_overspend_on_the_work_so_far() {
        let reference = [100, 100, 100, 100];
        let early = [130, 100, 100, 70];
        assert!((max_prefix_premium(&[0, 1, 2, 3], &early, &reference) - 0.3).abs() < 1e-9);
        // The same bills with the cheap job submitted first: never over on any prefix ((70 + 130) / 200 = 1).
        assert!(max_prefix_premium(&[3, 0, 1, 2], &early, &reference).abs() < 1e-9);
        assert!((max_prefix_premium(&[0, 3, 1, 2], &early, &reference) - 0.3).abs() < 1e-9);
        let steady = [105, 105, 105, 105];
        assert!((max_prefix_premium(&[0, 1, 2, 3], &steady, &reference) - 0.05).abs() < 1e-9);
        assert_eq!(max_prefix_premium(&[0], &[5], &[0]), 0.0);
        assert!((max_prefix_premium(&[0, 1], &[5, 110], &[0, 100]) - 0.15).abs() < 1e-9);
    }
}
