//! `meridian sim --service FILE --demand FILE`: an inference service on the simulator's federation for `--days`
//! of a real demand curve, scaled by Meridian's autoscaler under each policy and by two baselines — replicas
//! planned once for each city's peak (the broker before services) and a SkyServe-style autoscaler — with every
//! run judged by an independent checker (see `check.rs`). The demand model's assumptions are in `demand.rs`.

pub mod check;
pub mod demand;
pub mod engine;

use super::federation::SimFederation;
use super::{nearest_region, SimOptions};
use anyhow::Context;
use demand::DemandMatrix;
use engine::{Ctx, Outcome, Scaling};
use meridian_core::autoscale::{LocationDemand, Objective, Settings};
use meridian_federation::{decode_strict, Policy, ServiceSpec};
use serde::Serialize;
use std::path::Path;

/// One run's figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ServingRun {
    pub policy: String,
    pub replica_hours: f64,
    pub cost_usd: f64,
    pub energy_kwh: f64,
    pub co2_kg: f64,
    /// Share of the demand served within the SLO by a replica with throughput to spare.
    pub slo_attainment: f64,
    /// Demand (requests, or tokens) of cities with no ready replica within the SLO at the time.
    pub without_replica: f64,
    /// Demand that found the replicas within the SLO full.
    pub overflow: f64,
    pub scale_events: usize,
    /// Replicas started: what a user pays for in start-up time and cold caches (a scale event may start many,
    /// or stop some).
    pub replica_starts: usize,
    pub peak_replicas: usize,
    /// Problems the independent checker found (0 = capacity, SLO and totals confirmed).
    pub violations: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ServingReport {
    pub service: String,
    /// `requests` or `tokens`: the unit demand and throughput are counted in.
    pub unit: String,
    pub days: u32,
    /// Cities the demand is spread over (those with a site within the SLO).
    pub cities: usize,
    /// Cities left out: no site of the federation is within the SLO of them.
    pub cities_out_of_reach: usize,
    /// Expected total rate at the busiest minute (unit per second) and the replicas of the reference model it
    /// takes at full throughput.
    pub peak_rate: f64,
    pub peak_reference_replicas: f64,
    pub demand_total: f64,
    pub runs: Vec<ServingRun>,
}

/// Reads a service file (TOML or JSON by extension), checked as the API checks it.
pub fn read_service(path: &Path) -> anyhow::Result<ServiceSpec> {
    let bytes = meridian_broker::client::read_job_file(path)?;
    decode_strict::<ServiceSpec>(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The file given with `flag`, else the data folder's `rel`; the error names both ways to give it.
fn data_or(
    given: &Option<std::path::PathBuf>,
    rel: &str,
    flag: &str,
) -> anyhow::Result<std::path::PathBuf> {
    match given {
        Some(p) => Ok(p.clone()),
        None => meridian_broker::data::data_file(Path::new(rel))?.ok_or_else(|| {
            anyhow::anyhow!(
                "{rel} is not in the data folder {} (set MERIDIAN_DATA to another): name the file with {flag}",
                meridian_broker::data::data_dir().display()
            )
        }),
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(meridian_broker::local::resolve(path))
        .with_context(|| format!("reading {}", path.display()))
}

/// Everything a serving simulation reads, loaded once.
pub struct Loaded {
    pub fed: SimFederation,
    pub spec: ServiceSpec,
    pub cities: Vec<LocationDemand>,
    pub out_of_reach: usize,
    pub demand: DemandMatrix,
    pub settings: Settings,
}

impl Loaded {
    /// The clock's context for runs starting at `start_ms`, replicas serving `startup_min` after they start.
    pub fn ctx(&self, start_ms: u64, startup_min: usize) -> Ctx<'_> {
        Ctx::new(
            &self.fed,
            &self.spec,
            self.cities.clone(),
            &self.demand,
            start_ms,
            startup_min,
            self.settings.clone(),
        )
    }

    /// The cities' locations and measured-table regions, as the checker takes them.
    pub fn city_points(&self) -> Vec<(meridian_federation::GeoPoint, Option<String>)> {
        self.cities
            .iter()
            .map(|c| (c.location, c.rtt_region.clone()))
            .collect()
    }
}

/// Loads the federation, the service, the cities within reach and the demand.
pub fn load(opts: &SimOptions) -> anyhow::Result<Loaded> {
    let fed = SimFederation::load(&opts.federation)?;
    let service = opts
        .service
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("--service is required here"))?;
    let spec = read_service(service)?;
    let curve_path = &data_or(&opts.demand, "alibaba-genai-qps-2026/qps.csv", "--demand")?;
    let curve = demand::parse_qps_curve(&read(curve_path)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", curve_path.display()))?;
    let cities_path = data_or(
        &opts.cities,
        "wondernetwork-servers/servers-2020-07-19.csv",
        "--cities",
    )?;
    let all = demand::parse_cities(&read(&cities_path)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", cities_path.display()))?;
    let regions = super::azure_regions()?;
    let sites: Vec<_> = fed.sites.iter().map(|s| s.info_at(opts.start_ms)).collect();
    let mut cities = Vec::new();
    for (name, location) in &all {
        let region = nearest_region(&regions, *location);
        let reach = sites.iter().any(|s| {
            meridian_core::latency::rtt_ms(
                &fed.rtt,
                *location,
                region.as_deref(),
                s.location,
                s.rtt_region.as_deref(),
            ) <= spec.slo_ms
        });
        if reach {
            cities.push(LocationDemand {
                name: name.clone(),
                location: *location,
                rtt_region: region,
                rate: 0.0,
            });
        }
    }
    if cities.is_empty() {
        anyhow::bail!(
            "no city of {} is within {} ms of a site of {}",
            cities_path.display(),
            spec.slo_ms,
            opts.federation.display()
        );
    }
    let tokens = match spec.throughput.tokens_per_s {
        Some(_) => {
            let p = data_or(
                &opts.inference,
                "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv",
                "--inference",
            )?;
            Some(
                demand::token_sizes(&read(&p)?)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            )
        }
        None => None,
    };
    let per_replica = spec.throughput.per_replica();
    let peak_rate = f64::from(opts.peak_replicas) * per_replica;
    let lons: Vec<f64> = cities.iter().map(|c| c.location.lon).collect();
    let demand = DemandMatrix::draw(
        &demand::day_shape(&curve),
        &lons,
        opts.days as usize,
        peak_rate,
        tokens,
        opts.seed,
    );
    let objective = Objective::of(spec.policy.as_ref().unwrap_or(&Policy::Balanced))
        .map_err(anyhow::Error::msg)?;
    let settings = Settings {
        slo_ms: spec.slo_ms,
        min_replicas: spec.min_replicas,
        max_replicas: spec.max_replicas,
        utilization: spec.target_utilization,
        objective,
        up_delay_ms: spec.scale_up_delay_s * 1000,
        down_delay_ms: spec.scale_down_delay_s * 1000,
        window_ms: spec.demand_window_s * 1000,
    };
    Ok(Loaded {
        out_of_reach: all.len() - cities.len(),
        fed,
        spec,
        cities,
        demand,
        settings,
    })
}

/// The runs a serving simulation compares: the autoscaler under the service's policy (or `--policy`'s), then
/// the two baselines.
pub fn scalings(
    spec: &ServiceSpec,
    policy: Option<&str>,
) -> anyhow::Result<Vec<(String, Scaling)>> {
    let policies: Vec<Policy> = match policy {
        Some(names) => names
            .split(',')
            .map(str::trim)
            .map(|n| Policy::parse_label(n).map_err(|e| anyhow::anyhow!("--policy: {e}")))
            .collect::<anyhow::Result<_>>()?,
        None => vec![spec.policy.clone().unwrap_or(Policy::Balanced)],
    };
    let mut out = Vec::new();
    for p in policies {
        let o = Objective::of(&p).map_err(|e| anyhow::anyhow!("--policy {}: {e}", p.label()))?;
        out.push((format!("meridian {}", p.label()), Scaling::Autoscaler(o)));
    }
    out.push(("static peak plan".to_owned(), Scaling::StaticPeak));
    out.push((
        "skyserve-style per region".to_owned(),
        Scaling::SkyServe { per_region: true },
    ));
    out.push((
        "skyserve-style global".to_owned(),
        Scaling::SkyServe { per_region: false },
    ));
    Ok(out)
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Runs every scaling over the same demand; returns the report and each run's outcome.
pub fn simulate(opts: &SimOptions) -> anyhow::Result<(ServingReport, Vec<(String, Outcome)>)> {
    let l = load(opts)?;
    let startup_min = opts.startup_s.div_ceil(60) as usize;
    let ctx = l.ctx(opts.start_ms, startup_min);
    let city_points = l.city_points();
    let inputs = check::Inputs {
        fed: &l.fed,
        spec: &l.spec,
        cities: &city_points,
        demand: &l.demand,
        start_ms: opts.start_ms,
    };
    let mut runs = Vec::new();
    let mut outcomes = Vec::new();
    let scalings = scalings(&l.spec, opts.policy.as_deref())?;
    let progress = crate::progress::Progress::runs(
        scalings.len(),
        &format!("simulating {} days of serving:", opts.days),
    );
    for (name, scaling) in scalings {
        progress.start(&name);
        let out = engine::run(&ctx, scaling);
        progress.done();
        let stated = check::stated(&out);
        let violations = check::check(&inputs, &out, stated);
        for v in violations.iter().take(5) {
            tracing::warn!(run = %name, "checker: {v}");
        }
        let replica_minutes: usize = out
            .replicas
            .iter()
            .map(|r| r.end_min.unwrap_or(l.demand.minutes) - r.start_min)
            .sum();
        runs.push(ServingRun {
            policy: name.clone(),
            replica_hours: round(replica_minutes as f64 / 60.0, 1),
            cost_usd: round(stated.cost_usd, 2),
            energy_kwh: round(stated.energy_kwh, 1),
            co2_kg: round(stated.co2_kg, 2),
            slo_attainment: round(out.served / out.demand.max(1e-12), 5),
            without_replica: round(out.unreached, 0),
            overflow: round(out.overflow, 0),
            scale_events: out.scale_events,
            replica_starts: out.replicas.len(),
            peak_replicas: out.peak_replicas,
            violations: violations.len(),
        });
        outcomes.push((name, out));
    }
    let report = ServingReport {
        service: l.spec.name.to_string(),
        unit: l.spec.throughput.unit().to_owned(),
        days: opts.days,
        cities: l.cities.len(),
        cities_out_of_reach: l.out_of_reach,
        peak_rate: round(l.demand.peak_rate, 2),
        peak_reference_replicas: round(l.demand.peak_rate / l.spec.throughput.per_replica(), 1),
        demand_total: round(l.demand.amount.iter().sum(), 0),
        runs,
    };
    Ok((report, outcomes))
}

/// The report as a table, with each run's cost and carbon against the static plan's and SkyServe's.
pub fn table(r: &ServingReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "service {} over {} day(s): {} cities within the SLO ({} out of reach, left out); peak {} {}/s = {} replicas of the reference model",
        r.service, r.days, r.cities, r.cities_out_of_reach, r.peak_rate, r.unit, r.peak_reference_replicas
    );
    let find = |name: &str| r.runs.iter().find(|x| x.policy == name);
    let (stat, sky) = (find("static peak plan"), find("skyserve-style per region"));
    let _ =
        writeln!(
        s,
        "{:<34} {:>10} {:>11} {:>10} {:>10} {:>8} {:>12} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>5}",
        "RUN", "REPL-H", "COST USD", "KWH", "KGCO2E", "SLO", "NO REPLICA", "EVENTS", "STARTS", "PEAK",
        "$/STATIC", "CO2/STAT", "$/SKY", "CO2/SKY", "VIOL"
    );
    let ratio = |a: f64, b: Option<f64>| match b {
        Some(b) if b > 0.0 => format!("{:.3}", a / b),
        _ => "-".to_owned(),
    };
    for x in &r.runs {
        let _ = writeln!(
            s,
            "{:<34} {:>10.1} {:>11.2} {:>10.1} {:>10.2} {:>8.4} {:>12.0} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>5}",
            x.policy,
            x.replica_hours,
            x.cost_usd,
            x.energy_kwh,
            x.co2_kg,
            x.slo_attainment,
            x.without_replica,
            x.scale_events,
            x.replica_starts,
            x.peak_replicas,
            ratio(x.cost_usd, stat.map(|v| v.cost_usd)),
            ratio(x.co2_kg, stat.map(|v| v.co2_kg)),
            ratio(x.cost_usd, sky.map(|v| v.cost_usd)),
            ratio(x.co2_kg, sky.map(|v| v.co2_kg)),
            x.violations
        );
    }
    let _ = writeln!(
        s,
        "SLO = share of the demand served within the SLO; NO REPLICA = demand with no ready replica in reach; VIOL = checker findings"
    );
    s
}

/// Writes the runs' replicas and routes as JSON lines (see docs/serving.md, "Serving simulation").
pub fn write_schedule(path: &Path, outcomes: &[(String, Outcome)]) -> anyhow::Result<()> {
    use std::io::Write;
    let file =
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    for (policy, out) in outcomes {
        for r in &out.replicas {
            let line = serde_json::json!({
                "policy": policy, "replica": r.id, "site": r.key.site, "pool": r.key.pool,
                "spot": r.key.spot, "start_min": r.start_min, "ready_min": r.ready_min,
                "end_min": r.end_min, "cost_usd": r.cost_usd, "energy_kwh": r.energy_kwh,
                "co2_g": r.co2_g,
            });
            writeln!(w, "{line}")?;
        }
        for route in &out.routes {
            let line = serde_json::json!({
                "policy": policy, "minute": route.minute, "city": route.city,
                "replica": route.replica, "amount": route.amount,
            });
            writeln!(w, "{line}")?;
        }
    }
    w.flush()?;
    Ok(())
}
