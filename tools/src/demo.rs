//! The main job: a local federation, a real workload from the public traces (or a small fallback kept in
//! `configs/`), a readable table of where each job ran and why, then shutdown.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use anyhow::Context;
use meridian_broker::client::Client;
use meridian_broker::data;
use meridian_broker::local::{LocalFederation, LocalOptions};
use meridian_federation::{
    AcceleratorKind, GeoPoint, JobId, JobKind, JobPhase, JobSpec, JobView, Policy, QueueName,
    Resources, SiteId, TenantId, UserLocation,
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
    /// What the job is in the demo for: `batch` (the trace), `service`, `eu`, `interns` or `deadline`.
    role: &'static str,
    site: String,
    tier: String,
    policy: String,
    why: String,
    phase: &'static str,
    /// Why it waited, as the labels of `meridian_pending_jobs`, in the order first seen.
    waited_on: Vec<String>,
    wait_s: Option<f64>,
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
    /// What the run shows, one line per thing Meridian decided.
    decided: Decided,
    dashboard: String,
    total_est_cost_usd: f64,
    total_est_kwh: f64,
    total_est_kg_co2e: f64,
    total_metered_cost_usd: f64,
    total_metered_kwh: f64,
    total_metered_kg_co2e: f64,
    batch_succeeded: usize,
    batch_total: usize,
}

/// The demo's scenes, each as lines of the jobs that show it.
#[derive(Serialize, Default)]
struct Decided {
    /// Jobs that waited their max_wait with owned capacity full and ran on a cloud site.
    burst: Vec<String>,
    /// EU-resident jobs and where they ran.
    eu_residency: Vec<String>,
    /// The deadline job: deferred to a cleaner hour (or where it ran).
    deferred: Vec<String>,
    /// Inference services and where their replicas run, with their users' round trip.
    inference: Vec<String>,
    /// The interns' queue: its jobs waited on its quota.
    quota: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct DemoOptions {
    /// The federation file: relative to the working folder, else to the checkout.
    #[arg(long, default_value = "configs/demo/federation.toml")]
    pub federation: PathBuf,
    /// Workload used when the shared trace data is absent (and for the inference services).
    #[arg(long, default_value = "configs/demo-workload.toml")]
    pub workload: PathBuf,
    /// Batch jobs taken from the trace.
    #[arg(long, default_value_t = 12)]
    pub jobs: usize,
    /// Leave the federation up afterwards (services running, the deferred job waiting) to look at on the
    /// dashboard, until Ctrl-C or SIGTERM.
    #[arg(long)]
    pub keep: bool,
    /// Print JSON (set from `--output json`).
    #[arg(skip)]
    pub json: bool,
}

/// A demo job of the `demo` tenant: its expected duration is `duration_s`; it waits at most `MAX_WAIT_S` for
/// owned capacity before it may burst.
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
    s.max_wait_s = MAX_WAIT_S;
    s
}

fn gpus(count: u32, milli: Option<u32>) -> Resources {
    Resources {
        kind: AcceleratorKind::Gpu,
        models: vec![],
        count: if milli.is_some() { 0 } else { count },
        milli,
        memory_mib: None,
        model_memory_mib: Default::default(),
        same_node: false,
        mig: None,
    }
}

/// How long a demo job waits for owned capacity before it may burst to the cloud, seconds.
const MAX_WAIT_S: u64 = 3;
/// The site the deadline job is pinned to: its forecast has cleaner hours ahead.
const DEFER_SITE: &str = "dc-california";

/// The jobs that show residency, quotas and deferral, beside the trace's batch jobs.
fn scene_jobs(now_ms: u64) -> anyhow::Result<Vec<(&'static str, JobSpec)>> {
    let mut out = Vec::new();
    for i in 1..=2 {
        let mut s = spec(
            &format!("eu-etl-{i}"),
            JobKind::Batch,
            gpus(1, None),
            1800,
            "echo \"EU data on $MERIDIAN_SITE_ID\"; sleep 5".into(),
        );
        s.constraints.residency = Some("eu".into());
        out.push(("eu", s));
    }
    for i in 1..=3 {
        let mut s = spec(
            &format!("intern-{i}"),
            JobKind::FineTune,
            gpus(1, None),
            600,
            "echo \"intern run on $MERIDIAN_SITE_ID\"; sleep 4".into(),
        );
        s.queue = Some(QueueName::new("interns"));
        out.push(("interns", s));
    }
    let mut s = spec(
        "nightly-report",
        JobKind::Batch,
        gpus(1, None),
        3600,
        "echo report; sleep 2".into(),
    );
    s.policy = Some(Policy::Green);
    s.constraints.sites = vec![SiteId::new(DEFER_SITE)?];
    s.window.deadline_ms = Some(now_ms + 10 * 3_600_000);
    out.push(("deadline", s));
    Ok(out)
}

pub async fn run(opts: DemoOptions) -> anyhow::Result<bool> {
    let started = Instant::now();
    let fallback: WorkloadFile = toml::from_str(
        &std::fs::read_to_string(meridian_broker::local::resolve(&opts.workload))
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
    client.wait_for_sites(&fed, Duration::from_secs(30)).await?;
    if !opts.json {
        println!(
            "Meridian demo: {want} sites up on {} (HTTP API {})",
            fed.nats_url(),
            fed.http
        );
        println!("Dashboard: {}", fed.dashboard_address());
        println!(
            "Workload: {} batch jobs from {source}; {} inference services; 2 EU-resident jobs, 3 jobs in a \
             queue with a one-GPU quota, one job with a deadline",
            batch.len(),
            fallback.services.len()
        );
        println!(
            "Durations compressed by a factor of {factor:.0}: the longest task, {:.1} days, runs in {MAX_RUN_S:.0} s\n",
            longest / 86_400.0
        );
    }

    let mut ids: Vec<(JobId, &'static str)> = Vec::new();
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
            gpus(0, Some(500)),
            3600,
            "echo serving on $MERIDIAN_SITE_ID; while true; do sleep 1; done".into(),
        );
        s.users = users;
        s.policy = Some(Policy::Latency);
        ids.push((client.submit(&s).await?.job, "service"));
    }
    for (role, s) in scene_jobs(meridian_broker::service::now_ms())? {
        ids.push((client.submit(&s).await?.job, role));
    }
    let policies = [Policy::Balanced, Policy::Green, Policy::Cost];
    for (i, b) in batch.iter().enumerate() {
        let run_s = (b.duration_s as f64 / factor).max(1.0);
        let kind = match (b.milli, b.gpus) {
            (Some(_), _) => JobKind::Batch,
            (None, g) if g >= 4 => JobKind::Training,
            _ => JobKind::FineTune,
        };
        let mut s = spec(
            &b.name,
            kind,
            gpus(b.gpus, b.milli),
            b.duration_s,
            format!("echo \"$MERIDIAN_JOB_ID on $MERIDIAN_SITE_ID devices $MERIDIAN_DEVICES\"; sleep {run_s:.2}; echo done"),
        );
        s.policy = Some(policies[i % policies.len()].clone());
        ids.push((client.submit(&s).await?.job, "batch"));
    }
    let role_of = |id: &JobId| {
        ids.iter()
            .find(|(j, _)| j == id)
            .map_or("other", |(_, r)| *r)
    };
    // Until the batch and scene work is done (the deadline job deferred or done) and the services run,
    // noting why each job waits as it does.
    let mut waited: std::collections::BTreeMap<JobId, Vec<String>> = Default::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    let progress = crate::progress::Progress::runs(ids.len(), "the workload:");
    progress.start("jobs running, waiting or done as the broker placed them");
    let views = loop {
        let views = client.jobs().await?;
        for v in &views {
            if let Some(r) = &v.wait_reason {
                let seen = waited.entry(v.job.clone()).or_default();
                if !seen.contains(r) && r != "not_tried" {
                    seen.push(r.clone());
                }
            }
        }
        let settled = |v: &&JobView| match role_of(&v.job) {
            "service" => v.phase == JobPhase::Running,
            "deadline" => {
                v.phase.is_terminal() || v.wait_reason.as_deref() == Some("carbon_deferral")
            }
            _ => v.phase.is_terminal(),
        };
        let n = views.iter().filter(settled).count();
        progress.at(n, views.len());
        if n == views.len() || Instant::now() > deadline {
            drop(progress);
            break views;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let tiers: std::collections::BTreeMap<String, String> = client
        .sites()
        .await?
        .into_iter()
        .map(|s| (s.site.to_string(), s.tier.as_str().to_owned()))
        .collect();
    let mut rows = Vec::new();
    for v in &views {
        let explain = client.explain(&v.job).await?;
        let scored = explain
            .candidates
            .iter()
            .filter(|c| c.terms.is_some())
            .count();
        let ruled_out: usize = explain.pruned.iter().map(|p| p.sites).sum();
        let why = match (&v.site, v.phase) {
            (Some(site), p) if p != JobPhase::Pending => format!(
                "{site}: best by {}; {scored} scored, {ruled_out} ruled out by bounds",
                explain.policy
            ),
            _ => v.why.clone(),
        };
        let tier = v
            .site
            .as_ref()
            .and_then(|s| tiers.get(s.as_str()))
            .cloned()
            .unwrap_or_else(|| "-".into());
        let seen = waited.remove(&v.job).unwrap_or_default();
        // Only the trace's batch jobs run compressed.
        let role = role_of(&v.job);
        let scale = if role == "batch" { factor } else { 1.0 };
        rows.push(row(v, role, tier, explain.policy, why, seen, scale));
    }
    let decided = decided(&rows);
    let dashboard = fed.dashboard_address();
    let batch_total = rows.iter().filter(|r| r.role == "batch").count();
    let batch_succeeded = rows
        .iter()
        .filter(|r| r.role == "batch" && r.phase == JobPhase::Succeeded.as_str())
        .count();
    let scenes_ok = rows.iter().all(|r| match r.role {
        "eu" | "interns" => r.phase == JobPhase::Succeeded.as_str(),
        "deadline" => r.phase != JobPhase::Failed.as_str(),
        "service" => r.phase == JobPhase::Running.as_str(),
        _ => true,
    });
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
        decided,
        dashboard,
        jobs: rows,
    };
    if opts.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(&summary);
        print_decided(&summary.decided);
        println!(
            "\nBatch jobs succeeded: {}/{}. Ran in {:.1} s.",
            summary.batch_succeeded,
            summary.batch_total,
            started.elapsed().as_secs_f64()
        );
    }
    if opts.keep {
        if !opts.json {
            println!(
                "The federation stays up (services running, the deadline job waiting): dashboard {}\n\
                 Ctrl-C or SIGTERM stops it.",
                summary.dashboard
            );
        }
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = sigterm.recv() => {}
        }
    } else {
        for (id, role) in &ids {
            if matches!(*role, "service" | "deadline") {
                let _ = client.cancel(id).await;
            }
        }
        // Give the services a moment to stop before the federation goes down.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(client);
    tokio::task::block_in_place(|| drop(fed));
    if !opts.json {
        println!("Federation stopped.");
    }
    Ok(summary.batch_succeeded == summary.batch_total && scenes_ok)
}

/// What each scene of the run shows, from the jobs' rows.
fn decided(rows: &[Row]) -> Decided {
    let mut d = Decided::default();
    for r in rows {
        let wait = r
            .wait_s
            .map_or_else(|| "-".to_owned(), |w| format!("{w:.1} s"));
        match r.role {
            "service" => d.inference.push(format!(
                "{} → {} ({}), users' round trip {} ms",
                r.name,
                r.site,
                r.tier,
                r.user_rtt_ms
                    .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
            )),
            "eu" => d.eu_residency.push(format!(
                "{} (residency eu) → {} ({}), {}",
                r.name, r.site, r.tier, r.phase
            )),
            "deadline" => d.deferred.push(format!("{}: {}", r.name, r.why)),
            "interns" => d.quota.push(format!(
                "{} (queue interns, quota 1 GPU) waited {wait} on {} → {}",
                r.name,
                if r.waited_on.is_empty() {
                    "nothing".to_owned()
                } else {
                    r.waited_on.join(", ")
                },
                r.site
            )),
            _ => {}
        }
        if r.tier == "cloud" && r.role != "service" {
            d.burst.push(format!(
                "{} waited {wait} ({}) → {} (cloud)",
                r.name,
                if r.waited_on.is_empty() {
                    "no owned site fits it".to_owned()
                } else {
                    r.waited_on.join(", ")
                },
                r.site
            ));
        }
    }
    d
}

fn print_decided(d: &Decided) {
    println!("\nWhat Meridian decided:");
    let scenes: [(&str, &Vec<String>, &str); 5] = [
        (
            "Burst to the cloud",
            &d.burst,
            "no job burst: owned capacity sufficed",
        ),
        ("EU residency", &d.eu_residency, "no EU-resident job"),
        (
            "Deferred to a cleaner hour",
            &d.deferred,
            "no job with a deadline",
        ),
        ("Inference near its users", &d.inference, "no service"),
        ("Waiting on a quota", &d.quota, "no queue with a quota"),
    ];
    for (title, lines, none) in scenes {
        println!("  {title}:");
        if lines.is_empty() {
            println!("    {none}");
        }
        for l in lines {
            println!("    {l}");
        }
    }
}

fn row(
    v: &JobView,
    role: &'static str,
    tier: String,
    policy: String,
    why: String,
    waited_on: Vec<String>,
    factor: f64,
) -> Row {
    let usd = |micro: u64| micro as f64 / 1e6;
    let est = v.estimate.unwrap_or_default();
    Row {
        job: v.job.clone(),
        name: v.name.clone().unwrap_or_default(),
        kind: v.kind.as_str(),
        role,
        site: v
            .site
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "-".into()),
        tier,
        policy,
        why,
        phase: v.phase.as_str(),
        waited_on,
        wait_s: v
            .started_at_ms
            .map(|s| s.saturating_sub(v.submitted_at_ms) as f64 / 1000.0),
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
        "{:<9} {:<15} {:<8} {:<17} {:<10} {:>6} {:>9} {:>9} {:>7} {:>6} {:>10}  WHY",
        "JOB",
        "NAME",
        "ROLE",
        "SITE",
        "STATE",
        "WAIT s",
        "EST $",
        "EST kgCO2",
        "RTT ms",
        "RUN s",
        "METERED $"
    );
    for r in &s.jobs {
        println!(
            "{:<9} {:<15} {:<8} {:<17} {:<10} {:>6} {:>9.2} {:>9.2} {:>7} {:>6.1} {:>10.2}  {}",
            r.job.as_str(),
            truncate(&r.name, 15),
            r.role,
            r.site,
            r.phase,
            r.wait_s
                .map_or_else(|| "-".to_owned(), |w| format!("{w:.1}")),
            r.est_cost_usd,
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
        "{:<70} {:>9.2} {:>9.2} {:>7} {:>6} {:>10.2}",
        "TOTAL", s.total_est_cost_usd, s.total_est_kg_co2e, "", "", s.total_metered_cost_usd
    );
    println!(
        "\nEST columns are placement estimates for each job's full duration (inference: one hour). RUN s is the\n\
         metered wall-clock run; METERED $ is metered cost, × the compression factor {:.0} for the trace's batch\n\
         jobs. The jobs are `sleep`s, which run no faster on faster GPUs, while estimates scale run time by the\n\
         throughput table (configs/throughput.toml). Services and the deadline job are cancelled at the end\n\
         (unless --keep).",
        s.compression_factor
    );
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('…')).collect()
    }
}
