//! The main job: a local federation, a real workload from the public traces (or a small fallback kept in
//! `configs/`), a readable table of where each job ran and why, then shutdown.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use crate::client::Client;
use crate::data;
use crate::local::{LocalFederation, LocalOptions};
use anyhow::Context;
use meridian_federation::{
    AcceleratorKind, GeoPoint, JobId, JobKind, JobPhase, JobSpec, JobView, Policy, Resources,
    TenantId, UserLocation,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest compressed run of a batch job, seconds.
const MAX_RUN_S: f64 = 12.0;

/// One batch job of the workload, before compression.
#[derive(Clone, Debug, Deserialize)]
pub struct BatchItem {
    pub name: String,
    pub gpus: u32,
    /// Share of one GPU in milli-units, when below 1000.
    #[serde(default)]
    pub milli: Option<u32>,
    /// True duration, seconds.
    pub duration_s: u64,
}

/// One inference service of the workload.
#[derive(Clone, Debug, Deserialize)]
pub struct Service {
    pub name: String,
    /// User populations: city name, weight, and coordinates when the city list is not at hand.
    pub users: Vec<ServiceUsers>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ServiceUsers {
    pub city: String,
    pub weight: f64,
    pub lat: f64,
    pub lon: f64,
}

/// The fallback workload file (`configs/demo-workload.toml`).
#[derive(Clone, Debug, Deserialize)]
pub struct WorkloadFile {
    pub batch: Vec<BatchItem>,
    pub services: Vec<Service>,
}

/// Batch jobs from the Alibaba GPU trace: the first `n` GPU tasks that ran (they have a `scheduled_time`),
/// with duration `deletion_time − scheduled_time`.
pub fn trace_batch(path: &Path, n: usize) -> anyhow::Result<Vec<BatchItem>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.with_context(|| format!("{} row {}", path.display(), i + 2))?;
        let field = |k: usize| row.get(k).unwrap_or("").trim();
        let num_gpu: u32 = field(3).parse().unwrap_or(0);
        let milli: u32 = field(4).parse().unwrap_or(0);
        let (Ok(deleted), Ok(scheduled)) = (field(9).parse::<u64>(), field(10).parse::<u64>())
        else {
            continue;
        };
        if num_gpu == 0 || deleted <= scheduled {
            continue;
        }
        out.push(BatchItem {
            name: field(0).to_owned(),
            gpus: num_gpu,
            milli: (num_gpu == 1 && milli > 0 && milli < 1000).then_some(milli),
            duration_s: deleted - scheduled,
        });
        if out.len() == n {
            break;
        }
    }
    Ok(out)
}

/// City coordinates from the WonderNetwork server list, by the `name` column.
fn city_coords(path: &Path) -> anyhow::Result<std::collections::HashMap<String, GeoPoint>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = std::collections::HashMap::new();
    for row in reader.records().flatten() {
        let (Some(name), Some(lat), Some(lon)) = (row.get(1), row.get(8), row.get(9)) else {
            continue;
        };
        if let (Ok(lat), Ok(lon)) = (lat.parse(), lon.parse()) {
            out.insert(name.to_owned(), GeoPoint { lat, lon });
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct Row {
    job: JobId,
    name: String,
    kind: &'static str,
    site: String,
    policy: String,
    why: String,
    phase: &'static str,
    est_cost_usd: f64,
    est_kwh: f64,
    est_kg_co2e: f64,
    user_rtt_ms: Option<f64>,
    run_s: f64,
    metered_cost_usd: f64,
    metered_kwh: f64,
    metered_kg_co2e: f64,
}

#[derive(Serialize)]
struct Summary {
    source: String,
    compression_factor: f64,
    jobs: Vec<Row>,
    total_est_cost_usd: f64,
    total_est_kwh: f64,
    total_est_kg_co2e: f64,
    total_metered_cost_usd: f64,
    total_metered_kwh: f64,
    total_metered_kg_co2e: f64,
    batch_succeeded: usize,
    batch_total: usize,
}

#[derive(Debug, clap::Args)]
pub struct DemoOptions {
    #[arg(long, default_value = "configs/federation-demo.toml")]
    pub federation: PathBuf,
    /// Workload used when the shared trace data is absent (and for the inference services).
    #[arg(long, default_value = "configs/demo-workload.toml")]
    pub workload: PathBuf,
    /// Batch jobs taken from the trace.
    #[arg(long, default_value_t = 12)]
    pub jobs: usize,
    /// Print JSON (set from `--output json`).
    #[arg(skip)]
    pub json: bool,
}

fn spec(
    name: &str,
    kind: JobKind,
    resources: Resources,
    duration_s: u64,
    command: String,
) -> JobSpec {
    let tenant = TenantId::new("demo").unwrap_or_else(|_| unreachable!("valid literal id"));
    let mut s = JobSpec::new(tenant, format!("demo-{name}"), kind, resources, command);
    s.name = Some(name.to_owned());
    s.duration_s = Some(duration_s);
    s.max_wait_s = 30;
    s
}

pub async fn run(opts: DemoOptions) -> anyhow::Result<bool> {
    let started = Instant::now();
    let fallback: WorkloadFile = toml::from_str(
        &std::fs::read_to_string(&opts.workload)
            .with_context(|| format!("reading {}", opts.workload.display()))?,
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", opts.workload.display()))?;
    let trace = data::data_file(Path::new("alibaba-gpu-v2023/openb_pod_list_default.csv"))?;
    let cities = data::data_file(Path::new("wondernetwork-servers/servers-2020-07-19.csv"))?;
    let (source, batch) = match &trace {
        Some(p) => (
            format!("Alibaba GPU trace v2023 ({})", p.display()),
            trace_batch(p, opts.jobs)?,
        ),
        None => (
            format!("fallback workload ({})", opts.workload.display()),
            fallback.batch.clone(),
        ),
    };
    let coords = match &cities {
        Some(p) => city_coords(p)?,
        None => Default::default(),
    };
    let longest = batch.iter().map(|b| b.duration_s).max().unwrap_or(1) as f64;
    let factor = (longest / MAX_RUN_S).max(1.0).round();

    let fed = tokio::task::block_in_place(|| {
        LocalFederation::start(&opts.federation, LocalOptions::default())
    })?;
    let client = Client::of(&fed).await?;
    let want = fed.site_ids().len();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = client
            .sites()
            .await
            .map(|s| s.iter().filter(|s| s.up).count())
            .unwrap_or(0);
        if up == want {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {up} of {want} sites came up; logs in {}",
                fed.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !opts.json {
        println!(
            "Meridian demo: {want} sites up on {} (HTTP API {})",
            fed.nats_url(),
            fed.http
        );
        println!(
            "Workload: {} batch jobs from {source}; {} inference services",
            batch.len(),
            fallback.services.len()
        );
        println!(
            "Durations compressed by a factor of {factor:.0}: the longest task, {:.1} days, runs in {MAX_RUN_S:.0} s\n",
            longest / 86_400.0
        );
    }

    let mut ids = Vec::new();
    // Services first: they are long-lived and latency-bound, so they get the edge rooms near their users.
    for svc in &fallback.services {
        let users = svc
            .users
            .iter()
            .map(|u| UserLocation {
                name: Some(u.city.clone()),
                location: coords.get(&u.city).copied().unwrap_or(GeoPoint {
                    lat: u.lat,
                    lon: u.lon,
                }),
                weight: u.weight,
                rtt_region: None,
            })
            .collect();
        let mut s = spec(
            &svc.name,
            JobKind::Inference,
            Resources {
                kind: AcceleratorKind::Gpu,
                models: vec![],
                count: 0,
                milli: Some(500),
                memory_mib: None,
                model_memory_mib: Default::default(),
                same_node: false,
                mig: None,
            },
            3600,
            "echo serving on $MERIDIAN_SITE_ID; while true; do sleep 1; done".into(),
        );
        s.users = users;
        ids.push((client.submit(&s).await?.job, true));
    }

    let policies = [Policy::Balanced, Policy::Green, Policy::Cost];
    for (i, b) in batch.iter().enumerate() {
        let run_s = (b.duration_s as f64 / factor).max(1.0);
        let kind = match (b.milli, b.gpus) {
            (Some(_), _) => JobKind::Batch,
            (None, g) if g >= 4 => JobKind::Training,
            _ => JobKind::FineTune,
        };
        let resources = Resources {
            kind: AcceleratorKind::Gpu,
            models: vec![],
            count: if b.milli.is_some() { 0 } else { b.gpus },
            milli: b.milli,
            memory_mib: None,
            model_memory_mib: Default::default(),
            same_node: false,
            mig: None,
        };
        let mut s = spec(
            &b.name,
            kind,
            resources,
            b.duration_s,
            format!("echo \"$MERIDIAN_JOB_ID on $MERIDIAN_SITE_ID devices $MERIDIAN_DEVICES\"; sleep {run_s:.2}; echo done"),
        );
        s.policy = Some(policies[i % policies.len()].clone());
        ids.push((client.submit(&s).await?.job, false));
    }
    // Wait for the batch work to finish and the services to run.
    let deadline = Instant::now() + Duration::from_secs(90);
    let views = loop {
        let views = client.jobs().await?;
        let done = views.iter().all(|v| {
            let service = ids.iter().any(|(id, s)| *s && *id == v.job);
            if service {
                v.phase == JobPhase::Running
            } else {
                v.phase.is_terminal()
            }
        });
        if done || Instant::now() > deadline {
            break views;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut rows = Vec::new();
    for v in &views {
        let explain = client.explain(&v.job).await?;
        let scored = explain
            .candidates
            .iter()
            .filter(|c| c.terms.is_some())
            .count();
        let ruled_out: usize = explain.pruned.iter().map(|p| p.sites).sum();
        let why = match &v.site {
            Some(site) => {
                let tier = explain
                    .candidates
                    .iter()
                    .find(|c| c.chosen)
                    .map(|c| c.tier.as_str())
                    .unwrap_or("-");
                format!(
                    "{site} ({tier}): best by {}; {scored} scored, {ruled_out} ruled out by bounds",
                    explain.policy
                )
            }
            None => v.why.clone(),
        };
        rows.push(row(v, explain.policy, why, factor));
    }
    for (id, service) in &ids {
        if *service {
            let _ = client.cancel(id).await;
        }
    }
    let batch_total = ids.iter().filter(|(_, s)| !s).count();
    let batch_succeeded = views
        .iter()
        .filter(|v| ids.iter().any(|(id, s)| !s && *id == v.job) && v.phase == JobPhase::Succeeded)
        .count();
    let sum = |f: fn(&Row) -> f64| rows.iter().map(f).sum::<f64>();
    let summary = Summary {
        source,
        compression_factor: factor,
        total_est_cost_usd: sum(|r| r.est_cost_usd),
        total_est_kwh: sum(|r| r.est_kwh),
        total_est_kg_co2e: sum(|r| r.est_kg_co2e),
        total_metered_cost_usd: sum(|r| r.metered_cost_usd),
        total_metered_kwh: sum(|r| r.metered_kwh),
        total_metered_kg_co2e: sum(|r| r.metered_kg_co2e),
        batch_succeeded,
        batch_total,
        jobs: rows,
    };
    // Give the services a moment to stop before the federation goes down.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(client);
    tokio::task::block_in_place(|| drop(fed));
    if opts.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(&summary);
        println!(
            "\nBatch jobs succeeded: {}/{}. Finished in {:.1} s; federation stopped.",
            summary.batch_succeeded,
            summary.batch_total,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(summary.batch_succeeded == summary.batch_total)
}

fn row(v: &JobView, policy: String, why: String, factor: f64) -> Row {
    let usd = |micro: u64| micro as f64 / 1e6;
    let est = v.estimate.unwrap_or_default();
    Row {
        job: v.job.clone(),
        name: v.name.clone().unwrap_or_default(),
        kind: v.kind.as_str(),
        site: v
            .site
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "-".into()),
        policy,
        why,
        phase: v.phase.as_str(),
        est_cost_usd: usd(est.cost_micro_usd),
        est_kwh: est.energy_wh as f64 / 1000.0,
        est_kg_co2e: est.co2_g as f64 / 1000.0,
        user_rtt_ms: v.user_rtt_ms,
        run_s: v.runtime_ms as f64 / 1000.0,
        metered_cost_usd: usd(v.metered.cost_micro_usd) * factor,
        metered_kwh: v.metered.energy_wh as f64 / 1000.0 * factor,
        metered_kg_co2e: v.metered.co2_g as f64 / 1000.0 * factor,
    }
}

fn print_table(s: &Summary) {
    println!(
        "{:<9} {:<15} {:<10} {:<16} {:<10} {:>9} {:>8} {:>9} {:>7} {:>6} {:>10}  WHY",
        "JOB",
        "NAME",
        "KIND",
        "SITE",
        "STATE",
        "EST $",
        "EST kWh",
        "EST kgCO2",
        "RTT ms",
        "RUN s",
        "METERED $"
    );
    for r in &s.jobs {
        println!(
            "{:<9} {:<15} {:<10} {:<16} {:<10} {:>9.2} {:>8.1} {:>9.2} {:>7} {:>6.1} {:>10.2}  {}",
            r.job.as_str(),
            truncate(&r.name, 15),
            r.kind,
            r.site,
            r.phase,
            r.est_cost_usd,
            r.est_kwh,
            r.est_kg_co2e,
            r.user_rtt_ms
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into()),
            r.run_s,
            r.metered_cost_usd,
            r.why
        );
    }
    println!(
        "{:<63} {:>9.2} {:>8.1} {:>9.2} {:>7} {:>6} {:>10.2}",
        "TOTAL",
        s.total_est_cost_usd,
        s.total_est_kwh,
        s.total_est_kg_co2e,
        "",
        "",
        s.total_metered_cost_usd
    );
    println!(
        "\nEST columns are placement estimates for each job's full trace duration (inference: one hour).\n\
         RUN s is the metered wall-clock run; METERED $ is metered cost × the compression factor {:.0}.\n\
         The jobs are `sleep`s, which run no faster on faster GPUs, while estimates scale run time by the\n\
         throughput table (configs/throughput.toml): on H100 sites metered figures exceed estimates by that factor.\n\
         Metered for the compressed runs themselves: {:.1} Wh and {:.1} gCO2e. Inference services were cancelled at the end.",
        s.compression_factor, s.total_metered_kwh * 1000.0 / s.compression_factor, s.total_metered_kg_co2e * 1000.0 / s.compression_factor
    );
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('…')).collect()
    }
}
