//! `meridian bench queue`: how the broker copes with a deep queue.
//!
//! A local federation (nats-server, the durable broker, one agent on the no-op executor) whose one site is
//! full: its devices run jobs that never end. Jobs of a fixed spec (about 300 bytes of JSON) are then submitted
//! through the NATS API with a fixed number in flight, so every one of them waits. At each depth in `depths`
//! (0, 100,000 and 1,000,000 waiting jobs by default) the next `step` submissions are timed: submissions per
//! second, and the broker's CPU time per submission (from /proc). At the deepest queue: the broker's memory per
//! waiting job, and completions per second — running jobs are cancelled one after another, and each frees a
//! device that a waiting job takes. Then every waiting job is cancelled, so that all of them have finished; the
//! broker's memory is read again and the broker is killed and started again, and its recovery time is read
//! from its log.
#![allow(clippy::disallowed_methods)] // a benchmark: reads the clock

use bytes::Bytes;
use futures::StreamExt;
use meridian_broker::local::{LocalFederation, LocalOptions};
use meridian_federation::subjects::{self, api, SiteTopic};
use meridian_federation::{
    decode, encode, AcceleratorKind, AttemptState, JobId, JobKind, JobRef, JobSpec, JobStatus,
    Resources, SubmitReply, TenantId, WIRE_VERSION,
};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, clap::Args)]
pub struct QueueOptions {
    /// Queue depths at which submissions are timed, ascending (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [0usize, 100_000, 1_000_000])]
    pub depths: Vec<usize>,
    /// Submissions timed at each depth (and completions at the deepest).
    #[arg(long, default_value_t = 10_000)]
    pub step: usize,
    /// Devices of the one site (all busy with jobs that never end).
    #[arg(long, default_value_t = 64)]
    pub devices: usize,
    /// Submissions outstanding at once.
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// Keep the run's folder (logs) here.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            depths: vec![0, 100_000, 1_000_000],
            step: 10_000,
            devices: 64,
            in_flight: 256,
            dir: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct DepthFigures {
    /// Jobs waiting when the timed submissions began.
    pub waiting: usize,
    pub submissions_per_s: f64,
    /// Broker CPU (user + system) per submission, microseconds.
    pub broker_cpu_us_per_submission: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct QueueFigures {
    pub depths: Vec<DepthFigures>,
    /// The rate at the deepest queue over the rate at an empty one.
    pub deep_over_empty: f64,
    /// Waiting jobs when completions were timed.
    pub completions_waiting: usize,
    pub completions_per_s: f64,
    /// Broker resident memory per waiting job, bytes (deepest queue, over the memory with none waiting).
    pub rss_bytes_per_waiting_job: f64,
    /// Jobs that had finished when the memory and the recovery time below were read.
    pub finished: usize,
    /// Once they are all archived (the allocator may keep memory it no longer uses).
    pub rss_mib_after_finished: f64,
    /// The same after a restart: what the live state and its aggregates take.
    pub rss_mib_after_finished_and_restart: f64,
    /// Recovery after kill -9 with every job finished, as the broker logs it.
    pub recovery_ms_after_finished: Option<u64>,
    /// Recovery after kill -9 at the deepest queue.
    pub recovery_ms_at_deepest: Option<u64>,
}

pub(super) fn write_federation(dir: &Path, devices: usize) -> anyhow::Result<std::path::PathBuf> {
    let site = format!(
        "id = \"full\"\nkind = \"datacenter\"\ntier = \"owned\"\nlatitude = 45.6\nlongitude = -121.2\n\
         pue = 1.2\ncarbon_g_per_kwh = 80\negress_usd_per_gb = 0.05\n\n[[pools]]\nname = \"gpu\"\n\
         kind = \"gpu\"\nvendor = \"nvidia\"\nmodel = \"H100\"\nmemory_gib = 80\ncount = {devices}\n\
         power_watts = 700\nprice_usd_per_hour = 3.99\n"
    );
    std::fs::write(dir.join("full.toml"), site)?;
    let path = dir.join("federation.toml");
    std::fs::write(&path, "sites = [\"full.toml\"]\n")?;
    Ok(path)
}

/// A job of about 300 bytes of JSON.
fn spec(i: usize) -> anyhow::Result<Bytes> {
    let tenant = TenantId::new("bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut s = JobSpec::new(
        tenant,
        format!("queue-bench-{i:08}"),
        JobKind::Batch,
        Resources::whole(AcceleratorKind::Gpu, 1),
        "python3 train.py --epochs 3 --data s3://bench/shard",
    );
    s.name = Some(format!("bench-job-{i:08}"));
    s.duration_s = Some(3600);
    s.max_wait_s = 600;
    Ok(Bytes::from(encode(&s)?))
}

/// Resident memory of a process, bytes.
pub(super) fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// CPU time (user + system) of a process, seconds (Linux counts it in 1/100 s).
pub(super) fn cpu_s(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = after.split_whitespace().collect();
            let user: f64 = f.get(11)?.parse().ok()?;
            let system: f64 = f.get(12)?.parse().ok()?;
            Some((user + system) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Sends `n` requests (`body(i)` on `subject`) with `in_flight` outstanding; returns the replies' job ids.
async fn requests(
    client: &meridian_broker::client::Client,
    subject: &'static str,
    bodies: Vec<Bytes>,
    in_flight: usize,
) -> anyhow::Result<Vec<JobId>> {
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let out: Arc<Mutex<Vec<(usize, JobId)>>> = Arc::default();
    let mut workers = Vec::new();
    for _ in 0..in_flight.max(1) {
        let (client, bodies, next, out) =
            (client.clone(), bodies.clone(), next.clone(), out.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else {
                    return Ok::<(), anyhow::Error>(());
                };
                let job = if subject == api::SUBMIT {
                    client.raw::<SubmitReply>(subject, body.clone()).await?.job
                } else {
                    client
                        .raw::<meridian_federation::JobView>(subject, body.clone())
                        .await?
                        .job
                };
                if let Ok(mut o) = out.lock() {
                    o.push((i, job));
                }
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let mut out = std::mem::take(&mut *out.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, j)| j).collect())
}

fn job_refs(jobs: &[JobId]) -> anyhow::Result<Vec<Bytes>> {
    jobs.iter()
        .map(|j| {
            Ok(Bytes::from(encode(&JobRef {
                v: WIRE_VERSION,
                job: j.clone(),
            })?))
        })
        .collect()
}

/// Counts `running` reports per job (the no-op agent reports each accepted attempt running at once).
fn watch_running(mut statuses: async_nats::Subscriber) -> Arc<Mutex<Vec<JobId>>> {
    let seen: Arc<Mutex<Vec<JobId>>> = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        while let Some(m) = statuses.next().await {
            if let Ok(st) = decode::<JobStatus>(&m.payload) {
                if st.state == AttemptState::Running {
                    if let Ok(mut s) = s.lock() {
                        s.push(st.job);
                    }
                }
            }
        }
    });
    seen
}

async fn wait_running(seen: &Mutex<Vec<JobId>>, n: usize, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let have = seen.lock().map_or(0, |s| s.len());
        if have >= n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: {have} of {n} running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn queue(opts: QueueOptions) -> anyhow::Result<QueueFigures> {
    let scratch = tempfile::tempdir()?;
    let dir = opts
        .dir
        .clone()
        .unwrap_or_else(|| scratch.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let file = write_federation(&dir, opts.devices)?;
    let fed_opts = LocalOptions {
        heartbeat_ms: 1_000,
        agent_args: vec!["--executor".into(), "noop".into()],
        // Finished jobs move to the archive two seconds after they end.
        broker_args: vec!["--retention-ms".into(), "2000".into()],
        dir: Some(dir.join("run")),
        ..LocalOptions::default()
    };
    let mut fed = tokio::task::block_in_place(|| LocalFederation::start(&file, fed_opts))?;
    // Statuses are watched with the broker's own identity: only brokers may read site subjects.
    let nats = fed
        .access_as("broker-1")
        .connect("meridian bench", Duration::from_secs(10))
        .await?;
    let running = watch_running(
        nats.subscribe(subjects::all_sites(SiteTopic::Status))
            .await?,
    );
    nats.flush().await?;
    let client = meridian_broker::client::Client::of(&fed).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while client
        .sites()
        .await
        .map_or(0, |s| s.iter().filter(|s| s.up).count())
        < 1
    {
        anyhow::ensure!(Instant::now() < deadline, "the site did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = |fed: &LocalFederation| {
        fed.brokers
            .first()
            .and_then(|b| b.proc.as_ref())
            .and_then(|p| p.pid())
            .unwrap_or(0)
    };

    // Fill the site.
    let mut next = 0usize;
    let batch = |n: usize, next: &mut usize| -> anyhow::Result<Vec<Bytes>> {
        let b = (*next..*next + n).map(spec).collect();
        *next += n;
        b
    };
    let fill = batch(opts.devices, &mut next)?;
    let mut in_site = requests(&client, api::SUBMIT, fill, opts.in_flight).await?;
    wait_running(&running, opts.devices, "filling the site").await?;
    let rss_empty = rss(pid(&fed));

    let mut waiting: Vec<JobId> = Vec::new();
    let mut depths = Vec::new();
    for &depth in &opts.depths {
        while waiting.len() < depth {
            let n = (depth - waiting.len()).min(50_000);
            let bodies = batch(n, &mut next)?;
            waiting.extend(requests(&client, api::SUBMIT, bodies, opts.in_flight).await?);
        }
        let bodies = batch(opts.step, &mut next)?;
        let (cpu0, t0) = (cpu_s(pid(&fed)), Instant::now());
        waiting.extend(requests(&client, api::SUBMIT, bodies, opts.in_flight).await?);
        let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_s(pid(&fed)) - cpu0);
        depths.push(DepthFigures {
            waiting: depth,
            submissions_per_s: opts.step as f64 / secs,
            broker_cpu_us_per_submission: cpu * 1e6 / opts.step as f64,
        });
        tracing::info!("{:?}", depths.last());
    }
    let deepest = waiting.len();
    let rss_deep = rss(pid(&fed));

    // Completions: each cancel of a running job lets one waiting job in.
    let before = running.lock().map_or(0, |s| s.len());
    let mut done = 0usize;
    let t0 = Instant::now();
    while done < opts.step {
        let n = in_site.len().min(opts.step - done);
        let cancel: Vec<JobId> = in_site.drain(..n).collect();
        requests(&client, api::CANCEL, job_refs(&cancel)?, opts.in_flight).await?;
        done += n;
        wait_running(&running, before + done, "refilling").await?;
        let started: Vec<JobId> = running
            .lock()
            .map(|s| s[before + done - n..before + done].to_vec())
            .unwrap_or_default();
        waiting.retain(|j| !started.contains(j));
        in_site.extend(started);
    }
    let completions_per_s = done as f64 / t0.elapsed().as_secs_f64();

    let recovery_ms_at_deepest = tokio::task::block_in_place(|| -> anyhow::Result<Option<u64>> {
        fed.restart_broker()?;
        Ok(super::dispatch::last_recovery(&fed.broker_logs()).map(|r| r.0))
    })?;

    // Every waiting job finishes (cancelled while it waits), and moves to the archive.
    let finished = waiting.len() + done;
    requests(&client, api::CANCEL, job_refs(&waiting)?, opts.in_flight).await?;
    if let Some(last) = waiting.last() {
        let deadline = Instant::now() + Duration::from_secs(1800);
        while !client.job(last).await.is_ok_and(|v| v.archived) {
            anyhow::ensure!(Instant::now() < deadline, "finished jobs were not archived");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_finished = rss(pid(&fed));
    let recovery_ms_after_finished =
        tokio::task::block_in_place(|| -> anyhow::Result<Option<u64>> {
            fed.restart_broker()?;
            Ok(super::dispatch::last_recovery(&fed.broker_logs()).map(|r| r.0))
        })?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_restarted = rss(pid(&fed));
    let rate = |i: usize| {
        depths
            .get(i)
            .map_or(0.0, |d: &DepthFigures| d.submissions_per_s)
    };
    let figures = QueueFigures {
        deep_over_empty: rate(depths.len().saturating_sub(1)) / rate(0).max(1e-9),
        depths,
        completions_waiting: deepest,
        completions_per_s,
        rss_bytes_per_waiting_job: rss_deep.saturating_sub(rss_empty) as f64
            / deepest.max(1) as f64,
        finished,
        rss_mib_after_finished: rss_finished as f64 / (1024.0 * 1024.0),
        rss_mib_after_finished_and_restart: rss_restarted as f64 / (1024.0 * 1024.0),
        recovery_ms_after_finished,
        recovery_ms_at_deepest,
    };
    drop(fed);
    drop(scratch);
    Ok(figures)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_and_memory_of_this_process_are_read() {
        let me = std::process::id();
        assert!(super::rss(me) > 0);
        assert!(super::cpu_s(me) >= 0.0);
    }
}
