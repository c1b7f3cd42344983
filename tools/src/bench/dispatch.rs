//! `meridian bench dispatch`: jobs per second from submission to acceptance, through a real nats-server, the
//! real broker (durable journal on JetStream) and real agents.
//!
//! A local federation is started as `meridian up` does (its own nats-server on loopback, `meridian broker`,
//! one `meridian-agent` process per site) with agents on the no-op executor: they accept offers, report the
//! job running and start nothing, so the figure is the dispatch path alone. A client submits jobs one by one
//! through the NATS API, with a fixed number in flight. A job counts as dispatched when its agent's `running`
//! report (sent as the agent accepts the offer) is seen on NATS; its latency runs from its own submit to that
//! moment. In the same run, as the baseline, plain NATS request-reply through the same server with the same
//! number in flight and the same count and payload size. Then a second federation, with the process executor,
//! runs jobs that spawn `true`, for comparison with schedulers that start a process.
//!
//! The federation runs secured as `meridian up` runs it (TLS with client certificates, an NKey per process,
//! API tokens, JetStream encrypted at rest, the audit stream). What that costs is measured in the same run: the
//! same jobs through a federation started `--insecure`, and the ratio of the two.
#![allow(clippy::disallowed_methods)] // a benchmark: reads the clock

use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use meridian_broker::local::{LocalFederation, LocalOptions};
use meridian_federation::subjects::{self, api, SiteTopic};
use meridian_federation::{
    decode, encode, AcceleratorKind, AttemptState, JobId, JobKind, JobSpec, JobStatus, Resources,
    SubmitReply, TenantId,
};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, clap::Args)]
pub struct DispatchOptions {
    /// Jobs dispatched (and plain request-replies timed).
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// Agents on the no-op executor.
    #[arg(long, default_value_t = 50)]
    pub sites: usize,
    /// Submissions outstanding at once.
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// Jobs of the second run, which spawn `true` (0 skips it).
    #[arg(long, default_value_t = 1_000)]
    pub spawn_jobs: usize,
    /// Skip the baseline run without security (TLS, credentials, tokens, encryption at rest, audit).
    #[arg(long)]
    pub no_insecure_baseline: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DispatchFigures {
    pub jobs: usize,
    pub sites: usize,
    pub in_flight: usize,
    pub dispatches_per_s: f64,
    pub raw_nats_req_per_s: f64,
    pub ratio: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Journal batches the broker stored for the run (group commit: many steps per append).
    pub journal_appends: u64,
    /// After the run, the broker is killed (SIGKILL) and started again: the time it took to load its state
    /// (snapshot and journal), as it logs it, and the journal records it replayed beyond the snapshot.
    pub recovery_ms: Option<u64>,
    pub recovery_records: Option<u64>,
    /// The same jobs through a federation without security, run just before.
    pub insecure: Option<InsecureFigures>,
    pub spawn: Option<SpawnFigures>,
}

#[derive(Clone, Debug, Serialize)]
pub struct InsecureFigures {
    pub dispatches_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Dispatches per second secured over those without security.
    pub secured_ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpawnFigures {
    pub jobs: usize,
    pub dispatches_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Jobs per second from the first submit until every job has succeeded.
    pub completed_per_s: f64,
}

/// Writes `n` site files with enough devices for `slots` one-GPU jobs each, and a federation file.
fn write_federation(dir: &Path, n: usize, slots: usize) -> anyhow::Result<std::path::PathBuf> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("site-{i:03}.toml");
        let lat = -40.0 + 80.0 * (i as f64) / (n.max(2) - 1) as f64;
        let text = format!(
            "id = \"site-{i:03}\"\nkind = \"datacenter\"\ntier = \"owned\"\nlatitude = {lat:.3}\n\
             longitude = {:.3}\npue = 1.3\ncarbon_g_per_kwh = {}\negress_usd_per_gb = 0.05\n\n\
             [[pools]]\nname = \"gpu\"\nkind = \"gpu\"\nvendor = \"nvidia\"\nmodel = \"H100\"\n\
             memory_gib = 80\ncount = {slots}\npower_watts = 700\nprice_usd_per_hour = {:.2}\n",
            -120.0 + (i * 37 % 240) as f64,
            100 + (i * 53) % 400,
            2.0 + (i % 7) as f64 * 0.25,
        );
        std::fs::write(dir.join(&name), text)?;
        names.push(format!("{name:?}"));
    }
    let path = dir.join("federation.toml");
    std::fs::write(&path, format!("sites = [{}]\n", names.join(", ")))?;
    Ok(path)
}

async fn start(
    dir: &Path,
    sites: usize,
    slots: usize,
    executor: &str,
    insecure: bool,
) -> anyhow::Result<LocalFederation> {
    let file = write_federation(dir, sites, slots)?;
    let opts = LocalOptions {
        insecure,
        heartbeat_ms: 1_000,
        agent_args: vec!["--executor".into(), executor.into()],
        dir: Some(dir.join("run")),
        ..LocalOptions::default()
    };
    let fed = tokio::task::block_in_place(|| LocalFederation::start(&file, opts))?;
    let client = meridian_broker::client::Client::of(&fed).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = client
            .sites()
            .await
            .map_or(0, |s| s.iter().filter(|s| s.up).count());
        if up == sites {
            return Ok(fed);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {up} of {sites} sites came up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn spec(i: usize, command: &str) -> anyhow::Result<Vec<u8>> {
    let tenant = TenantId::new("bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let s = JobSpec::new(
        tenant,
        format!("bench-{i}"),
        JobKind::Batch,
        Resources::whole(AcceleratorKind::Gpu, 1),
        command,
    );
    Ok(encode(&s)?)
}

struct Run {
    per_s: f64,
    latencies_ms: Vec<f64>,
    /// Until every job has reached `until` (for the spawn run: succeeded).
    done_per_s: f64,
}

/// Submits `n` jobs with `in_flight` outstanding; waits until each is seen running (and, with
/// `until_succeeded`, succeeded).
async fn run_jobs(
    fed: &LocalFederation,
    n: usize,
    in_flight: usize,
    command: &str,
    until_succeeded: bool,
) -> anyhow::Result<Run> {
    // Statuses are watched with the broker's own identity: only brokers may read site subjects.
    let nats = fed
        .access_as("broker-1")
        .connect("meridian bench", Duration::from_secs(10))
        .await?;
    let client = meridian_broker::client::Client::of(fed).await?;
    let mut statuses = nats
        .subscribe(subjects::all_sites(SiteTopic::Status))
        .await?;
    nats.flush().await?;
    let running: Arc<Mutex<HashMap<JobId, Instant>>> = Arc::default();
    let succeeded: Arc<Mutex<HashMap<JobId, Instant>>> = Arc::default();
    let (r, s) = (running.clone(), succeeded.clone());
    let watcher = tokio::spawn(async move {
        while let Some(m) = statuses.next().await {
            let now = Instant::now();
            let Ok(st) = decode::<JobStatus>(&m.payload) else {
                continue;
            };
            let map = match st.state {
                AttemptState::Running => &r,
                AttemptState::Succeeded { .. } => &s,
                _ => continue,
            };
            if let Ok(mut map) = map.lock() {
                map.entry(st.job).or_insert(now);
            }
        }
    });

    let bodies: Vec<Bytes> = (0..n)
        .map(|i| spec(i, command).map(Bytes::from))
        .collect::<anyhow::Result<_>>()?;
    let bodies = Arc::new(bodies);
    let submitted: Arc<Mutex<HashMap<JobId, Instant>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..in_flight.max(1) {
        let (client, bodies, next, submitted) = (
            client.clone(),
            bodies.clone(),
            next.clone(),
            submitted.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else {
                    return Ok::<(), anyhow::Error>(());
                };
                let t = Instant::now();
                let r: SubmitReply = client
                    .raw(api::SUBMIT, body.clone())
                    .await
                    .map_err(|e| anyhow::anyhow!("submit {i}: {e}"))?;
                if let Ok(mut s) = submitted.lock() {
                    s.insert(r.job, t);
                }
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let target = if until_succeeded {
        &succeeded
    } else {
        &running
    };
    loop {
        let seen = target.lock().map_or(0, |m| m.len());
        if seen >= n {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {n} jobs were seen {}",
            if until_succeeded {
                "succeeded"
            } else {
                "running"
            }
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    watcher.abort();
    let submitted = submitted.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let running = running.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let succeeded = succeeded.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let last_running = running.values().max().copied().unwrap_or(started);
    let last_done = succeeded.values().max().copied().unwrap_or(last_running);
    let mut latencies_ms: Vec<f64> = submitted
        .iter()
        .filter_map(|(id, t)| {
            running
                .get(id)
                .map(|r| r.duration_since(*t).as_secs_f64() * 1e3)
        })
        .collect();
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Run {
        per_s: n as f64 / last_running.duration_since(started).as_secs_f64(),
        latencies_ms,
        done_per_s: n as f64 / last_done.duration_since(started).as_secs_f64(),
    })
}

/// Plain request-reply through the same server: an echo responder, `n` requests of `size` bytes with
/// `in_flight` outstanding.
///
/// The echo answers as a broker answers a site, within the permissions the federation gives: the requester
/// (a site's identity) may publish into the broker's inbox, the responder (the broker's identity) reads its
/// own inbox and answers into the site's. Its subject is outside the inbox subjects the broker's own
/// connection uses for its requests.
async fn raw_nats(
    responder: &meridian_runtime::access::Access,
    requester: &meridian_runtime::access::Access,
    n: usize,
    in_flight: usize,
    size: usize,
) -> anyhow::Result<f64> {
    let subject = format!(
        "{}.bench-echo",
        meridian_runtime::access::inbox_prefix(&responder.caller())
    );
    let echo_client = responder
        .connect("bench echo", Duration::from_secs(10))
        .await?;
    let mut sub = echo_client.subscribe(subject.clone()).await?;
    let responder = echo_client;
    responder.flush().await?;
    let echo = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Some(reply) = m.reply {
                let _ = responder.publish(reply, m.payload).await;
            }
        }
    });
    let client = requester.connect("bench", Duration::from_secs(10)).await?;
    let body = Bytes::from(vec![b'x'; size]);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..in_flight.max(1) {
        let (client, body, next, subject) =
            (client.clone(), body.clone(), next.clone(), subject.clone());
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                client.request(subject.clone(), body.clone()).await?;
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let per_s = n as f64 / started.elapsed().as_secs_f64();
    echo.abort();
    Ok(per_s)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

enum Scratch {
    Temp(tempfile::TempDir),
    Kept(std::path::PathBuf),
}

impl Scratch {
    fn path(&self) -> &Path {
        match self {
            Scratch::Temp(t) => t.path(),
            Scratch::Kept(p) => p,
        }
    }
}

/// From the last `recovered N jobs and M sites from [a snapshot and] K journal records (B batches) in T ms` line
/// of the broker's log: (T, K).
pub(super) fn last_recovery(log: &str) -> Option<(u64, u64)> {
    let line = log.lines().rfind(|l| l.contains("recovered "))?;
    let ms = line
        .rsplit(" in ")
        .next()?
        .trim()
        .trim_end_matches("ms")
        .trim()
        .parse()
        .ok()?;
    let records = line
        .split(" journal records")
        .next()?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()?;
    Some((ms, records))
}

/// Batches in the journal stream (each a group of steps stored with one append).
async fn journal_messages(access: &meridian_runtime::access::Access) -> anyhow::Result<u64> {
    let client = access.connect("bench", Duration::from_secs(10)).await?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(subjects::JOURNAL_STREAM).await?;
    Ok(stream.info().await?.state.messages)
}

pub async fn dispatch(opts: DispatchOptions) -> anyhow::Result<DispatchFigures> {
    // Logs and state go to a temporary folder, or are kept in `$MERIDIAN_BENCH_DIR`.
    let scratch = tempfile::Builder::new()
        .prefix("meridian-bench-")
        .tempdir()?;
    let scratch = match std::env::var_os("MERIDIAN_BENCH_DIR") {
        Some(dir) => Scratch::Kept(dir.into()),
        None => Scratch::Temp(scratch),
    };
    let slots = opts.jobs.div_ceil(opts.sites.max(1)) + 8;
    let insecure = if opts.no_insecure_baseline {
        None
    } else {
        let dir = scratch.path().join("insecure");
        std::fs::create_dir_all(&dir)?;
        let fed = start(&dir, opts.sites, slots, "noop", true)
            .await
            .context("starting the federation without security")?;
        let run = run_jobs(&fed, opts.jobs, opts.in_flight, "true", false).await?;
        tokio::task::block_in_place(|| drop(fed));
        Some(run)
    };
    let noop_dir = scratch.path().join("noop");
    std::fs::create_dir_all(&noop_dir)?;
    let fed = start(&noop_dir, opts.sites, slots, "noop", false)
        .await
        .context("starting the federation")?;
    // The broker's storage identity: only it reaches JetStream.
    let store = fed.access_as(&meridian_broker::creds::store_name("broker-1"));
    let before = journal_messages(&store).await?;
    let run = run_jobs(&fed, opts.jobs, opts.in_flight, "true", false).await?;
    let journal_appends = journal_messages(&store).await?.saturating_sub(before);
    let size = spec(0, "true")?.len();
    let raw = raw_nats(
        &fed.access_as("broker-1"),
        &fed.access_as("site-000"),
        opts.jobs,
        opts.in_flight,
        size,
    )
    .await?;
    let mut fed = fed;
    let recovery = tokio::task::block_in_place(|| -> anyhow::Result<Option<(u64, u64)>> {
        fed.restart_broker()?;
        Ok(last_recovery(&fed.broker_logs()))
    })?;
    tokio::task::block_in_place(|| drop(fed));

    let spawn = if opts.spawn_jobs > 0 {
        let dir = scratch.path().join("spawn");
        std::fs::create_dir_all(&dir)?;
        let per_site = opts.spawn_jobs.div_ceil(opts.sites.max(1)) + 8;
        let fed = start(&dir, opts.sites, per_site, "process", false)
            .await
            .context("starting the federation")?;
        let run = run_jobs(&fed, opts.spawn_jobs, opts.in_flight, "true", true).await?;
        tokio::task::block_in_place(|| drop(fed));
        Some(SpawnFigures {
            jobs: opts.spawn_jobs,
            dispatches_per_s: run.per_s,
            p50_ms: quantile(&run.latencies_ms, 0.5),
            p99_ms: quantile(&run.latencies_ms, 0.99),
            completed_per_s: run.done_per_s,
        })
    } else {
        None
    };
    Ok(DispatchFigures {
        jobs: opts.jobs,
        sites: opts.sites,
        in_flight: opts.in_flight,
        dispatches_per_s: run.per_s,
        raw_nats_req_per_s: raw,
        ratio: run.per_s / raw,
        p50_ms: quantile(&run.latencies_ms, 0.5),
        p99_ms: quantile(&run.latencies_ms, 0.99),
        journal_appends,
        recovery_ms: recovery.map(|r| r.0),
        recovery_records: recovery.map(|r| r.1),
        insecure: insecure.map(|i| InsecureFigures {
            dispatches_per_s: i.per_s,
            p50_ms: quantile(&i.latencies_ms, 0.5),
            p99_ms: quantile(&i.latencies_ms, 0.99),
            secured_ratio: run.per_s / i.per_s,
        }),
        spawn,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_recovery_line_is_read_with_or_without_a_snapshot() {
        let log = "x INFO recovered 3 jobs and 1 sites from 7 journal records (5 batches) in 12 ms\n\
                   y INFO recovered 9 jobs and 2 sites from a snapshot and 40 journal records (9 batches) in 81 ms\n";
        assert_eq!(super::last_recovery(log), Some((81, 40)));
        assert_eq!(super::last_recovery("nothing"), None);
    }
}
