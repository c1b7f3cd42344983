//! The agent's async shell: one NATS connection, one loop that feeds the pure core, the local-process adapter
//! for execution, and a status sender that repeats each update until the broker acknowledges it, in order.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use crate::config::{NvmlMode, SiteFile};
use crate::core::AgentCore;
use crate::outbox::StatusOutbox;
use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use meridian_adapters::backend::{self, Backend, Found, Seen};
use meridian_adapters::probe::{group_into_pools, DeviceProbe, NvmlProbe};
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{
    decode, encode, inventory_digest, AttemptRef, AttemptState, BrokerHello, CancelAttempt,
    DeviceState, Heartbeat, Inventory, InventoryMark, JobId, JobStatus, LogsReply, LogsRequest,
    Offer, PoolAdvert, StatusAck, INVENTORY_LIST_MAX, WIRE_VERSION,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// What the command line decides.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub site: SiteFile,
    /// NATS servers, their CA and this site's identity.
    pub access: meridian_runtime::access::Access,
    pub work_dir: PathBuf,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What an agent records of each attempt it starts, beside its group file, to take it back after a restart.
#[derive(serde::Serialize, serde::Deserialize)]
struct AttemptRecord {
    job: JobId,
    attempt: u32,
    pool: meridian_federation::PoolName,
    devices: Vec<meridian_federation::DeviceShare>,
    started_ms: u64,
    checkpoint_path: PathBuf,
    /// On spot capacity (records of earlier agents lack it: on-demand).
    #[serde(default)]
    spot: bool,
    /// The backend's name for the attempt (records of earlier agents lack it: their process group file).
    #[serde(default)]
    handle: Option<backend::Handle>,
}

struct Proc {
    /// The backend's name for the attempt.
    handle: backend::Handle,
    started_ms: u64,
    cancel_reason: Option<String>,
    /// Stopped by the site itself (its spot capacity taken back): reported interrupted, so the broker replaces
    /// it.
    interrupt_reason: Option<String>,
    checkpoint_path: PathBuf,
    /// The agent's record of the attempt (none for a backend that runs nothing).
    record_path: Option<PathBuf>,
    /// The checkpoint URI last reported to the broker.
    reported_checkpoint: Option<String>,
    /// The attempt's trace and the broker's `offer` span (from the offer's `traceparent` header).
    trace: Option<([u8; 16], [u8; 8])>,
    /// The span its backend bills once it ended (a cloud instance's boot and idle included), when that is
    /// not its run.
    billed: Option<(u64, u64)>,
}

struct Agent {
    core: AgentCore,
    /// How accepted attempts run (the site file's `[backend]`).
    backend: Box<dyn Backend>,
    client: async_nats::Client,
    work_dir: PathBuf,
    procs: HashMap<(JobId, u32), Proc>,
    outbox: Arc<Mutex<StatusOutbox>>,
    wake: Arc<Notify>,
    heartbeat_seq: u64,
    /// This run's number among the agent's starts (kept in the work folder): the first part of its inventory
    /// marks.
    epoch: u64,
    /// How long jobs outlive this agent, for a restarted one to take them back.
    readopt: Duration,
    /// Where the provider's spot reclaim notice appears (`[agent] spot_notice`).
    spot_notice: Option<PathBuf>,
    /// The grid feed (`[agent] carbon_file`), and the last thing wrong with it (logged once, until it changes).
    carbon_file: Option<PathBuf>,
    carbon_file_error: Option<String>,
    /// Use changed since the last advert: the next reap tick (every 100 ms) sends one, so a burst of starts
    /// costs one advert, not one each.
    advert_due: bool,
    /// The generation of the last advert sent.
    advertised: u64,
    /// Spans of the attempts run here, when an OTLP endpoint is configured.
    telemetry: Option<meridian_runtime::telemetry::Telemetry>,
    /// The latest device report, for the agent's own `/metrics` (when it serves one).
    report: Arc<Mutex<Option<meridian_federation::SiteMetrics>>>,
    /// Within a burst of offers: status updates are written, and forced to disk once before the replies go.
    defer_sync: bool,
}

/// The most offers answered together (their status updates forced to disk once, then their replies sent).
const OFFER_BURST: usize = 256;

/// The pools the backend finds (a cloud's instance types), or those of the site file, with NVIDIA GPU pools
/// replaced by what NVML finds where it is available.
fn inventory(site: &SiteFile, backend: &mut dyn Backend) -> anyhow::Result<Vec<PoolAdvert>> {
    if let Some(pools) = backend.pools()? {
        return Ok(pools);
    }
    let mut pools = site.pools()?;
    if site.agent.nvml == NvmlMode::Off {
        return Ok(pools);
    }
    match NvmlProbe::default().probe() {
        Err(e) => {
            tracing::info!(
                "no NVIDIA GPUs probed ({e}); using the pools declared in the site file"
            );
        }
        Ok(devices) if devices.is_empty() => {
            tracing::info!("NVML found no GPUs; using the pools declared in the site file");
        }
        Ok(devices) => {
            let declared: Vec<PoolAdvert> = pools
                .iter()
                .filter(|p| p.vendor == "nvidia")
                .cloned()
                .collect();
            pools.retain(|p| p.vendor != "nvidia");
            for (i, probed) in group_into_pools(&devices).into_iter().enumerate() {
                let template = declared
                    .iter()
                    .find(|p| p.model.matches(probed.model.as_str()))
                    .or(declared.first());
                let Some(t) = template else {
                    tracing::warn!("NVML found {} but the site file declares no NVIDIA pool to price it; skipped", probed.model);
                    continue;
                };
                tracing::info!(
                    "NVML: {} × {} ({} MiB)",
                    probed.indices.len(),
                    probed.model,
                    probed.memory_mib
                );
                pools.push(PoolAdvert {
                    name: format!("{}-{}", probed.model.as_str().to_ascii_lowercase(), i).into(),
                    model: probed.model.clone(),
                    memory_mib: probed.memory_mib,
                    count: probed.indices.len() as u32,
                    measured_power_watts: probed.power_watts,
                    devices: probed
                        .indices
                        .iter()
                        .zip(&probed.healthy)
                        .map(|(index, healthy)| DeviceState {
                            index: *index,
                            healthy: *healthy,
                            used_milli: 0,
                        })
                        .collect(),
                    ..t.clone()
                });
            }
        }
    }
    Ok(pools)
}

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(opts: AgentOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(opts.work_dir.join("run"))
        .with_context(|| format!("creating {}", opts.work_dir.display()))?;
    let site = &opts.site;
    let info = site
        .site_info(now_ms() - now_ms() % 3_600_000)
        .map_err(anyhow::Error::msg)?;
    let mut backend = backend::for_site(
        site.backend.kind,
        site.id.as_str(),
        backend::ProcessSettings {
            shim_program: std::env::current_exe()?,
            run_dir: opts.work_dir.join("run"),
            grace: Duration::from_millis(site.agent.grace_ms),
            adopt_grace: Duration::from_millis(site.agent.readopt_ms),
        },
        site.backend.slurm.clone(),
        site.backend.ec2.clone(),
    )?;
    let core = AgentCore::new(
        info,
        inventory(site, backend.as_mut())?,
        site.agent.draining,
    );
    let id = core.info.id.clone();
    let client = opts
        .access
        .options(format!("meridian-agent {id}"))?
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(meridian_federation::nats_servers(&opts.access.nats))
        .await
        .with_context(|| format!("connecting to {}", opts.access.display_url()))?;
    tracing::info!("site {id} connected to {}", opts.access.display_url());

    let outbox = StatusOutbox::open(opts.work_dir.join("status-outbox.jsonl"))
        .with_context(|| format!("opening the status outbox in {}", opts.work_dir.display()))?;
    if !outbox.is_empty() {
        tracing::info!(
            "{} status updates from an earlier run are still to be delivered",
            outbox.len()
        );
    }
    let outbox = Arc::new(Mutex::new(outbox));
    let wake = Arc::new(Notify::new());
    tokio::spawn(send_statuses(
        client.clone(),
        subjects::site(&id, SiteTopic::Status),
        outbox.clone(),
        wake.clone(),
    ));

    let mut agent = Agent {
        core,
        backend,
        client: client.clone(),
        work_dir: opts.work_dir.clone(),
        procs: HashMap::new(),
        outbox,
        wake,
        heartbeat_seq: 0,
        epoch: next_epoch(&opts.work_dir)?,
        readopt: Duration::from_millis(site.agent.readopt_ms),
        spot_notice: site
            .agent
            .spot_notice
            .as_ref()
            .map(|p| opts.work_dir.join(p)),
        carbon_file: site
            .agent
            .carbon_file
            .as_ref()
            .map(|p| opts.work_dir.join(p)),
        carbon_file_error: None,
        advert_due: false,
        advertised: 0,
        telemetry: meridian_runtime::telemetry::Telemetry::from_env("meridian-agent")
            .map_err(anyhow::Error::msg)?,
        report: Arc::new(Mutex::new(None)),
        defer_sync: false,
    };
    tracing::info!(
        "site {id} runs its work on backend {}",
        agent.backend.kind().as_str()
    );
    agent.take_back_leftovers();
    if let Some(addr) = &site.agent.metrics_listen {
        serve_metrics(addr, &opts.work_dir, agent.report.clone()).await?;
    }

    let mut offers = client
        .subscribe(subjects::site(&id, SiteTopic::Offer))
        .await?;
    let mut cancels = client
        .subscribe(subjects::site(&id, SiteTopic::Cancel))
        .await?;
    let mut logs = client
        .subscribe(subjects::site(&id, SiteTopic::Logs))
        .await?;
    // "Send me your advert": to every site after a broker starts, or to this one after a missed advert.
    let mut hellos = futures::stream::select(
        client.subscribe(subjects::BROKER_HELLO).await?,
        client
            .subscribe(subjects::site(&id, SiteTopic::Hello))
            .await?,
    );
    let mut inventory_asks = client
        .subscribe(subjects::site(&id, SiteTopic::Inventory))
        .await?;
    agent.publish_advert().await;

    let mut heartbeat =
        tokio::time::interval(Duration::from_millis(site.agent.heartbeat_ms.max(50)));
    let mut advert = tokio::time::interval(Duration::from_millis(
        site.agent.advert_interval_ms.max(100),
    ));
    let mut reap = tokio::time::interval(Duration::from_millis(100));
    // Metrics off: an interval that never comes due in practice.
    let mut metrics = tokio::time::interval(Duration::from_millis(if site.agent.metrics_ms == 0 {
        u64::from(u32::MAX)
    } else {
        site.agent.metrics_ms.max(100)
    }));
    let nvml = site.agent.nvml == NvmlMode::Auto;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            Some(m) = offers.next() => {
                // The offers already here are answered together: one flush of their updates, not one each.
                let mut burst = vec![m];
                while burst.len() < OFFER_BURST {
                    match futures::FutureExt::now_or_never(offers.next()) {
                        Some(Some(m)) => burst.push(m),
                        _ => break,
                    }
                }
                agent.on_offers(burst).await;
            }
            Some(m) = cancels.next() => agent.on_cancel(&m.payload),
            Some(m) = logs.next() => agent.on_logs(m).await,
            Some(m) = inventory_asks.next() => {
                if let Some(reply) = m.reply {
                    let inv = agent.inventory(true);
                    agent.publish(reply.to_string(), encode(&inv)).await;
                }
            }
            Some(m) = hellos.next() => {
                if decode::<BrokerHello>(&m.payload).is_ok() {
                    agent.publish_advert().await;
                }
            }
            _ = heartbeat.tick() => {
                agent.report_checkpoints();
                agent.follow_site_capacity();
                agent.follow_grid_feed();
                // Whatever changed the advert since the last one sent (a new generation: the grid feed, the
                // site's own scheduler, a start or an end) goes out before the heartbeat that names it.
                if agent.core.generation != agent.advertised {
                    agent.publish_advert().await;
                }
                agent.publish_heartbeat().await
            }
            _ = advert.tick() => agent.publish_advert().await,
            _ = metrics.tick(), if site.agent.metrics_ms > 0 => agent.publish_metrics(nvml).await,
            _ = reap.tick() => {
                agent.backend.tick();
                agent.take_back_spot();
                agent.reap_finished().await;
                if agent.advert_due {
                    agent.publish_advert().await;
                }
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        }
    }
    agent.backend.shutdown();
    // Running jobs outlive the agent for the re-adoption grace: an agent started again meanwhile (an upgrade,
    // a restart by its supervisor) takes them back; otherwise their shims stop them.
    tracing::info!(
        "site {id} stopping; {} running jobs stay for {} ms for a restarted agent to take back",
        agent.procs.len(),
        agent.readopt.as_millis()
    );
    Ok(())
}

/// The agent's own `/metrics` (`[agent] metrics_listen`): its latest device report as Prometheus text. The
/// address it got is written to `metrics.addr` in the work folder.
async fn serve_metrics(
    addr: &str,
    work_dir: &std::path::Path,
    report: Arc<Mutex<Option<meridian_federation::SiteMetrics>>>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening for metrics on {addr}"))?;
    let bound = listener.local_addr()?;
    std::fs::write(work_dir.join("metrics.addr"), bound.to_string())
        .with_context(|| format!("writing metrics.addr in {}", work_dir.display()))?;
    tracing::info!("device metrics on http://{bound}/metrics");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = report
                .lock()
                .map(|r| meridian_runtime::device_metrics::render(r.as_ref()))
                .unwrap_or_default();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics listener stopped: {e}");
        }
    });
    Ok(())
}

/// The agent's span of an attempt: the job's process, from its start to its end, under the broker's `offer`.
fn run_span(
    site: &meridian_federation::SiteId,
    job: &JobId,
    attempt: u32,
    p: &Proc,
    state: &AttemptState,
) -> meridian_runtime::telemetry::SpanRecord {
    use meridian_runtime::telemetry::Value;
    let (outcome, code, error) = match state {
        AttemptState::Succeeded { exit_code } => ("succeeded", Some(*exit_code), None),
        AttemptState::Failed { exit_code, reason } => ("failed", *exit_code, Some(reason.clone())),
        AttemptState::Cancelled { reason } => ("cancelled", None, Some(reason.clone())),
        AttemptState::Interrupted { reason } => ("interrupted", None, Some(reason.clone())),
        AttemptState::Running => ("running", None, None),
    };
    let mut attributes = vec![
        ("meridian.site", Value::Text(site.to_string())),
        ("meridian.outcome", Value::Text(outcome.to_owned())),
    ];
    if let Some(c) = code {
        attributes.push(("process.exit.code", Value::Int(i64::from(c))));
    }
    meridian_runtime::telemetry::SpanRecord {
        job: job.clone(),
        attempt,
        kind: meridian_federation::trace::SpanKind::Run,
        parent: p.trace,
        start_ms: p.started_ms,
        end_ms: now_ms(),
        attributes,
        events: Vec::new(),
        error,
    }
}

/// How an attempt that its backend no longer runs ended: as Meridian asked (cancelled, or its spot capacity
/// taken back), or as the backend saw it. `None` while it runs.
fn end_state(p: &Proc, seen: Seen) -> Option<AttemptState> {
    Some(match (&p.cancel_reason, seen) {
        (_, Seen::Running) => return None,
        (Some(reason), _) => AttemptState::Cancelled {
            reason: reason.clone(),
        },
        (None, _) if p.interrupt_reason.is_some() => AttemptState::Interrupted {
            reason: p.interrupt_reason.clone().unwrap_or_default(),
        },
        (None, Seen::Ended(0)) => AttemptState::Succeeded { exit_code: 0 },
        (None, Seen::Ended(c)) => AttemptState::Failed {
            exit_code: Some(c),
            reason: format!("exit code {c}"),
        },
        (None, Seen::Failed { exit_code, reason }) => AttemptState::Failed { exit_code, reason },
        (None, Seen::Interrupted(reason)) => AttemptState::Interrupted { reason },
    })
}

/// The number of this start of the agent (one more than the last, kept in the work folder).
fn next_epoch(work_dir: &std::path::Path) -> anyhow::Result<u64> {
    let path = work_dir.join("epoch");
    let last: u64 = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, (last + 1).to_string())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| format!("recording this start in {}", path.display()))?;
    Ok(last + 1)
}

/// The checkpoint URI a job wrote to its checkpoint file, if any (at most 4 KiB).
fn read_checkpoint(path: &std::path::Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty() && s.len() <= 4096).then(|| s.to_owned())
}

/// Updates sent at once: they go out in order on one connection and the broker applies them in arrival order,
/// so keeping several in flight keeps the order while a slow acknowledgement holds up nobody.
const STATUS_WINDOW: usize = 128;

/// Sends status updates in order from the outbox, each repeated until the broker acknowledges it. Up to
/// [`STATUS_WINDOW`] are in flight; the acknowledged prefix is dropped from the outbox, and what follows the
/// first unacknowledged update is sent again (the broker treats a repeated update as a no-op).
async fn send_statuses(
    client: async_nats::Client,
    subject: String,
    outbox: Arc<Mutex<StatusOutbox>>,
    wake: Arc<Notify>,
) {
    loop {
        let head = outbox
            .lock()
            .map(|o| o.head(STATUS_WINDOW))
            .unwrap_or_default();
        if head.is_empty() {
            wake.notified().await;
            continue;
        }
        let acked = send_window(&client, &subject, &head).await;
        if let Ok(mut o) = outbox.lock() {
            if let Err(e) = o.pop_n(acked) {
                tracing::error!("status outbox: {e}");
            }
        }
        if acked < head.len() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// Publishes the updates in order, each with its own reply subject under one inbox, and waits up to 2 s for
/// the acknowledgements; returns how many from the front were acknowledged.
async fn send_window(client: &async_nats::Client, subject: &str, head: &[JobStatus]) -> usize {
    let inbox = client.new_inbox();
    let Ok(mut replies) = client.subscribe(format!("{inbox}.*")).await else {
        return 0;
    };
    let mut acked = vec![false; head.len()];
    for (i, status) in head.iter().enumerate() {
        match encode(status) {
            Ok(payload) => {
                let reply = format!("{inbox}.{i}");
                if client
                    .publish_with_reply(subject.to_owned(), reply, Bytes::from(payload))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            // An update that cannot be encoded can never be sent: count it as done.
            Err(_) => acked[i] = true,
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while acked.iter().any(|a| !a) {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, replies.next()).await else {
            break;
        };
        if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            // No broker is listening (one is taking over, say): try again soon rather than wait out the rest.
            break;
        }
        let index = m
            .subject
            .rsplit('.')
            .next()
            .and_then(|i| i.parse::<usize>().ok());
        if let (Some(i), true) = (index, decode::<StatusAck>(&m.payload).is_ok()) {
            if let Some(a) = acked.get_mut(i) {
                *a = true;
            }
        }
    }
    acked.iter().take_while(|a| **a).count()
}

impl Agent {
    async fn publish(
        &self,
        subject: String,
        payload: Result<Vec<u8>, meridian_federation::WireError>,
    ) {
        match payload {
            Ok(p) => {
                if let Err(e) = self.client.publish(subject, Bytes::from(p)).await {
                    tracing::debug!("publish failed: {e}");
                }
            }
            Err(e) => tracing::error!("could not encode a message: {e}"),
        }
    }

    async fn publish_advert(&mut self) {
        self.advert_due = false;
        let a = self.core.advert(now_ms());
        self.advertised = a.generation;
        self.publish(subjects::site(&a.site.id, SiteTopic::Advert), encode(&a))
            .await;
    }

    /// Reports, as a `running` update, every running job whose checkpoint file names a new checkpoint, so that
    /// the broker can resume it from there if this site is lost.
    fn report_checkpoints(&mut self) {
        let mut changed = Vec::new();
        for ((job, attempt), p) in self.procs.iter_mut() {
            let now = read_checkpoint(&p.checkpoint_path);
            if now.is_some() && now != p.reported_checkpoint {
                p.reported_checkpoint = now;
                changed.push((job.clone(), *attempt));
            }
        }
        for (job, attempt) in changed {
            if let Some(p) = self.procs.get(&(job.clone(), attempt)) {
                self.status(&job, attempt, AttemptState::Running, Some(p));
            }
        }
    }

    async fn publish_heartbeat(&mut self) {
        self.heartbeat_seq += 1;
        let running = self.core.running();
        let h = Heartbeat {
            v: WIRE_VERSION,
            site: self.core.info.id.clone(),
            seq: self.heartbeat_seq,
            sent_at_ms: now_ms(),
            generation: self.core.generation,
            running: if running.len() <= INVENTORY_LIST_MAX {
                running
            } else {
                Vec::new()
            },
            inventory: Some(self.inventory(false)),
        };
        self.publish(subjects::site(&h.site, SiteTopic::Heartbeat), encode(&h))
            .await;
    }

    async fn publish_metrics(&self, nvml: bool) {
        let samples = if nvml {
            NvmlProbe::default().sample().unwrap_or_default()
        } else {
            Vec::new()
        };
        let m = self.core.metrics(now_ms(), &samples);
        self.publish(subjects::site(&m.site, SiteTopic::Metrics), encode(&m))
            .await;
        if let Ok(mut r) = self.report.lock() {
            *r = Some(m);
        }
    }

    fn status(&self, job: &JobId, attempt: u32, state: AttemptState, p: Option<&Proc>) {
        let now = now_ms();
        let checkpoint = p.and_then(|p| read_checkpoint(&p.checkpoint_path));
        let update = JobStatus {
            v: WIRE_VERSION,
            job: job.clone(),
            attempt,
            site: self.core.info.id.clone(),
            state,
            at_ms: now,
            started_at_ms: p.map(|p| p.billed.map_or(p.started_ms, |b| b.0)),
            runtime_ms: p.map(|p| {
                p.billed
                    .map_or(now.saturating_sub(p.started_ms), |(from, to)| to - from)
            }),
            checkpoint,
            mark: Some(self.mark()),
        };
        match self.outbox.lock() {
            Ok(mut o) => {
                let stored = if self.defer_sync {
                    o.push_unsynced(update)
                } else {
                    o.push(update)
                };
                if let Err(e) = stored {
                    tracing::error!("status outbox: could not store an update for {job}: {e}");
                }
            }
            Err(_) => tracing::error!("status outbox unusable; an update for {job} is lost"),
        }
        self.wake.notify_one();
    }

    /// Answers a burst of offers: each is decided and started in turn, their status updates are forced to disk
    /// once, then every reply is sent (an accepted offer's update is on disk before its reply leaves).
    async fn on_offers(&mut self, burst: Vec<async_nats::Message>) {
        self.defer_sync = true;
        let replies: Vec<_> = burst.into_iter().filter_map(|m| self.on_offer(m)).collect();
        self.defer_sync = false;
        match self.outbox.lock() {
            Ok(o) => {
                if let Err(e) = o.sync() {
                    tracing::error!("status outbox: could not force updates to disk: {e}");
                }
            }
            Err(_) => tracing::error!("status outbox unusable"),
        }
        for (to, body) in replies {
            self.publish(to, body).await;
        }
    }

    /// Decides and starts one offer; returns the reply to send and where.
    fn on_offer(
        &mut self,
        m: async_nats::Message,
    ) -> Option<(String, Result<Vec<u8>, meridian_federation::WireError>)> {
        let reply_to = m.reply.clone()?;
        let offer = match decode::<Offer>(&m.payload) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("refused a malformed offer: {e}");
                let body = meridian_federation::ApiReply::<()>::err(e.to_body());
                return Some((reply_to.to_string(), encode(&body)));
            }
        };
        let trace = m
            .headers
            .as_ref()
            .and_then(|h| h.get(subjects::TRACEPARENT_HEADER))
            .and_then(|v| meridian_federation::trace::parse_traceparent(v.as_str()));
        let (mut reply, start) = self.core.on_offer(&offer);
        if start {
            if let Err(e) = self.start(&offer, trace) {
                // Refused, not accepted and lost: the broker places the job elsewhere and skips this site
                // for it a while; a backend that could not create capacity advertises the pool full.
                tracing::warn!("job {} attempt {} refused: {e:#}", offer.job, offer.attempt);
                reply = self.core.withdraw(
                    &offer.job,
                    offer.attempt,
                    format!("could not start: {e:#}"),
                );
                self.follow_site_capacity();
            }
        }
        if reply.outcome == meridian_federation::OfferOutcome::Accepted {
            reply.mark = Some(self.mark());
        }
        if start {
            self.advert_due = true;
        }
        Some((reply_to.to_string(), encode(&reply)))
    }

    fn start(&mut self, offer: &Offer, trace: Option<([u8; 16], [u8; 8])>) -> anyhow::Result<()> {
        let name = format!("{}__{}", offer.job, offer.attempt);
        let job_dir = self
            .work_dir
            .join("jobs")
            .join(format!("{}-{}", offer.job, offer.attempt));
        let checkpoint_path = job_dir.join("checkpoint");
        let indices: Vec<String> = offer.devices.iter().map(|d| d.index.to_string()).collect();
        let mut env: Vec<(String, String)> = offer.spec.run.env.clone().into_iter().collect();
        env.extend([
            ("MERIDIAN_JOB_ID".into(), offer.job.to_string()),
            ("MERIDIAN_ATTEMPT".into(), offer.attempt.to_string()),
            ("MERIDIAN_SITE_ID".into(), self.core.info.id.to_string()),
            ("MERIDIAN_POOL".into(), offer.pool.to_string()),
            ("MERIDIAN_DEVICES".into(), indices.join(",")),
            (
                "MERIDIAN_DEVICE_MILLI".into(),
                offer
                    .devices
                    .iter()
                    .map(|d| d.milli.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (
                "MERIDIAN_CHECKPOINT_FILE".into(),
                checkpoint_path.display().to_string(),
            ),
        ]);
        let pool = self.core.pools.iter().find(|p| p.name == offer.pool);
        let model = pool.map(|p| p.model.to_string()).unwrap_or_default();
        if pool.is_some_and(|p| p.vendor == "nvidia") {
            env.push(("CUDA_VISIBLE_DEVICES".into(), indices.join(",")));
        }
        if let Some(r) = &offer.resume_from {
            env.push(("MERIDIAN_RESUME_FROM".into(), r.clone()));
        }
        let started_ms = now_ms();
        let handle = self.backend.submit(&backend::Attempt {
            name: &name,
            command: &offer.spec.run.command,
            env,
            dir: &job_dir,
            tenant: offer.spec.tenant.as_str(),
            pool: offer.pool.as_str(),
            model: &model,
            // Whole devices, at least one for a share of one.
            devices: offer.devices.len() as u32,
            node: offer.devices.first().map_or(0, |d| {
                d.index / pool.map_or(1, |p| p.devices_per_node.max(1))
            }),
            spot: offer.spec.spot,
            // Past its deadline the job is of no use: a backend that enforces limits ends it there.
            time_limit_s: offer
                .spec
                .window
                .deadline_ms
                .map(|d| d.saturating_sub(started_ms) / 1000),
        })?;
        // What a restarted agent needs to take the attempt back.
        let record_path = self
            .backend
            .outlives_agent()
            .then(|| self.work_dir.join("run").join(format!("{name}.json")));
        if let Some(path) = &record_path {
            let record = AttemptRecord {
                job: offer.job.clone(),
                attempt: offer.attempt,
                pool: offer.pool.clone(),
                devices: offer.devices.clone(),
                started_ms,
                checkpoint_path: checkpoint_path.clone(),
                spot: offer.spec.spot,
                handle: Some(handle.clone()),
            };
            std::fs::write(path, serde_json::to_vec(&record)?)?;
        }
        let p = Proc {
            handle,
            started_ms,
            cancel_reason: None,
            interrupt_reason: None,
            checkpoint_path,
            record_path,
            reported_checkpoint: None,
            trace,
            billed: None,
        };
        self.status(&offer.job, offer.attempt, AttemptState::Running, Some(&p));
        self.procs.insert((offer.job.clone(), offer.attempt), p);
        Ok(())
    }

    /// The provider's spot reclaim notice: when its file appears, the spot attempts of the pools it names (one
    /// per line; every pool when it names none) are stopped and reported interrupted, and the file is removed.
    fn take_back_spot(&mut self) {
        let Some(path) = &self.spot_notice else {
            return;
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!("removing the spot notice {}: {e}", path.display());
        }
        let pools: Vec<meridian_federation::PoolName> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(meridian_federation::PoolName::from)
            .collect();
        let taken = self.core.reclaimed(&pools);
        tracing::info!(
            "spot reclaim notice for {}: stopping {} attempt(s)",
            if pools.is_empty() {
                "every pool".to_owned()
            } else {
                format!("{pools:?}")
            },
            taken.len()
        );
        for a in taken {
            if let Some(p) = self.procs.get_mut(&(a.job.clone(), a.attempt)) {
                if p.cancel_reason.is_some() || p.interrupt_reason.is_some() {
                    continue;
                }
                p.interrupt_reason = Some("spot capacity taken back by the provider".into());
                self.backend.cancel(&p.handle);
            }
        }
    }

    fn on_cancel(&mut self, payload: &[u8]) {
        let c = match decode::<CancelAttempt>(payload) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("ignored a malformed cancel: {e}");
                return;
            }
        };
        if let Some(p) = self.procs.get_mut(&(c.job.clone(), c.attempt)) {
            tracing::info!(
                "job {} attempt {}: stopping ({})",
                c.job,
                c.attempt,
                c.reason
            );
            p.cancel_reason = Some(c.reason);
            self.backend.cancel(&p.handle);
        }
    }

    async fn on_logs(&self, m: async_nats::Message) {
        let Some(reply_to) = m.reply.clone() else {
            return;
        };
        let body = match decode::<LogsRequest>(&m.payload) {
            Ok(r) => {
                let dir = self
                    .work_dir
                    .join("jobs")
                    .join(format!("{}-{}", r.job, r.attempt));
                match self.backend.logs(&dir, r.lines as usize) {
                    Ok(text) => encode(&LogsReply {
                        v: WIRE_VERSION,
                        job: r.job,
                        attempt: r.attempt,
                        site: self.core.info.id.clone(),
                        text,
                    }),
                    Err(e) => encode(&meridian_federation::ApiReply::<()>::err(
                        meridian_federation::ErrorBody::new(
                            meridian_federation::ErrorCode::NotFound,
                            None,
                            format!("no log for job {} attempt {} here: {e}", r.job, r.attempt),
                        ),
                    )),
                }
            }
            Err(e) => encode(&meridian_federation::ApiReply::<()>::err(e.to_body())),
        };
        self.publish(reply_to.to_string(), body).await;
    }

    async fn reap_finished(&mut self) {
        let mut done = Vec::new();
        for (key, p) in &self.procs {
            match self.backend.poll(&p.handle) {
                Seen::Running => {}
                seen => done.push((key.clone(), seen)),
            }
        }
        if done.is_empty() {
            return;
        }
        for ((job, attempt), seen) in done {
            let Some(state) = self
                .procs
                .get(&(job.clone(), attempt))
                .and_then(|p| end_state(p, seen))
            else {
                continue;
            };
            let Some(mut p) = self.procs.remove(&(job.clone(), attempt)) else {
                continue;
            };
            p.billed = self.backend.bill(&p.handle, now_ms());
            tracing::info!("job {job} attempt {attempt} ended: {state:?}");
            if let Some(t) = &self.telemetry {
                t.span(&run_span(&self.core.info.id, &job, attempt, &p, &state));
            }
            self.status(&job, attempt, state, Some(&p));
            self.forget(&p.handle, p.record_path.as_deref());
            self.core.on_finished(&job, attempt);
        }
        self.advert_due = true;
    }

    /// Where this agent's set of attempts stands (see [`InventoryMark`]).
    fn mark(&self) -> InventoryMark {
        let acked = self.outbox.lock().map_or(0, |o| o.acked());
        InventoryMark {
            epoch: self.epoch,
            seq: self.core.changes + acked,
        }
    }

    /// What this agent holds: attempts running, and ended ones whose end the broker has not acknowledged. The
    /// list goes with it when `full` or when it is short.
    fn inventory(&self, full: bool) -> Inventory {
        let mark = self.mark();
        let mut attempts: Vec<AttemptRef> = self.core.running();
        if let Ok(o) = self.outbox.lock() {
            attempts.extend(o.pending_ends());
        }
        attempts.sort();
        attempts.dedup();
        Inventory {
            mark,
            count: attempts.len() as u32,
            digest: inventory_digest(&attempts),
            attempts: (full || attempts.len() <= INVENTORY_LIST_MAX).then_some(attempts),
        }
    }

    /// Reads the grid feed: a change of the site's carbon is a new generation, advertised before the next
    /// heartbeat. A feed that cannot be read or is not valid leaves the last good value, said once in the log
    /// until what is wrong changes.
    fn follow_grid_feed(&mut self) {
        let Some(path) = &self.carbon_file else {
            return;
        };
        let read = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))
            .and_then(|text| {
                self.core
                    .follow_grid(&text)
                    .map_err(|e| format!("{}: {e}", path.display()))
            });
        match read {
            Ok(changed) => {
                self.carbon_file_error = None;
                if changed {
                    tracing::info!(
                        "grid intensity now {} gCO2e/kWh (from {})",
                        self.core.info.carbon.g_per_kwh,
                        path.display()
                    );
                }
            }
            Err(e) => {
                if self.carbon_file_error.as_ref() != Some(&e) {
                    tracing::warn!("grid feed ignored, the last good value holds: {e}");
                    self.carbon_file_error = Some(e);
                }
            }
        }
    }

    /// Takes what the site's own scheduler reports free, where it schedules work that is not Meridian's: a
    /// change is advertised at the next reap tick.
    fn follow_site_capacity(&mut self) {
        if let Some(free) = self.backend.free(&self.core.pools) {
            if self.core.site_reports_free(&free) {
                self.advert_due = true;
            }
        }
    }

    /// Forgets an attempt whose end is recorded: the backend's traces of it and the agent's record.
    fn forget(&mut self, handle: &backend::Handle, record: Option<&std::path::Path>) {
        self.backend.forget(handle);
        if let Some(path) = record {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Takes back the jobs an earlier run of this agent left, from its records of them. One the backend still
    /// runs is adopted: it holds its devices again and goes on as if the agent had never stopped. One that
    /// ended meanwhile is reported by its exit code; any other was stopped and is reported interrupted, so
    /// that the broker runs it again. Run times come from the attempt's record.
    fn take_back_leftovers(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.work_dir.join("run")) else {
            return;
        };
        let mut adopted = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let Some(r) = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<AttemptRecord>(&b).ok())
            else {
                tracing::warn!("{} is not an attempt record; left alone", path.display());
                continue;
            };
            // Records of earlier agents name no handle: theirs was the process group file beside them.
            let handle = r.handle.clone().unwrap_or_else(|| {
                backend::Handle(path.with_extension("pgid").display().to_string())
            });
            let found = self.backend.adopt(&handle);
            if found == Found::Running {
                self.core
                    .adopt(&r.job, r.attempt, &r.pool, &r.devices, r.spot);
                self.procs.insert(
                    (r.job.clone(), r.attempt),
                    Proc {
                        handle,
                        started_ms: r.started_ms,
                        cancel_reason: None,
                        interrupt_reason: None,
                        checkpoint_path: r.checkpoint_path.clone(),
                        record_path: Some(path.clone()),
                        reported_checkpoint: None,
                        // Taken back after a restart: the ids follow from the job and attempt.
                        trace: None,
                        billed: None,
                    },
                );
                adopted += 1;
                continue;
            }
            let (state, ended) = match found {
                Found::Ended {
                    exit_code: 0,
                    at_ms,
                } => (AttemptState::Succeeded { exit_code: 0 }, at_ms),
                Found::Ended { exit_code, at_ms } => (
                    AttemptState::Failed {
                        exit_code: Some(exit_code),
                        reason: format!("exit code {exit_code}"),
                    },
                    at_ms,
                ),
                Found::Failed { exit_code, reason } => {
                    (AttemptState::Failed { exit_code, reason }, None)
                }
                Found::Running => continue, // taken back above
                Found::Stopped(reason) => (AttemptState::Interrupted { reason }, None),
            };
            let ended = ended.unwrap_or_else(now_ms);
            tracing::info!(
                "job {} attempt {} was left by an earlier run: {state:?}",
                r.job,
                r.attempt
            );
            let update = JobStatus {
                v: WIRE_VERSION,
                job: r.job.clone(),
                attempt: r.attempt,
                site: self.core.info.id.clone(),
                state,
                at_ms: now_ms(),
                started_at_ms: Some(r.started_ms),
                runtime_ms: Some(ended.saturating_sub(r.started_ms)),
                checkpoint: read_checkpoint(&r.checkpoint_path),
                mark: Some(self.mark()),
            };
            self.forget(&handle, Some(&path));
            if let Ok(mut o) = self.outbox.lock() {
                if let Err(e) = o.push(update) {
                    tracing::error!("status outbox: {e}");
                }
            }
            self.wake.notify_one();
        }
        if adopted > 0 {
            tracing::info!("took back {adopted} jobs still running from an earlier run");
            self.advert_due = true;
        }
    }
}
