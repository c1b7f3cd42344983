//! The broker's async shell: one task owns the reactor and feeds it events from NATS, the HTTP API and a
//! clock; it sends what the reactor puts in its outbox. Nothing here decides placement.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

pub mod api;
pub mod archive;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod dashboard;
pub mod http;
pub mod journal;
pub mod lease;
pub mod metrics;
pub mod reply;
pub mod services;
pub mod traces;

use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use meridian_core::access::Principal;
use meridian_core::journal::BufferJournal;
use meridian_core::latency::RttTable;
use meridian_core::reactor::{Command, CoreConfig, Event, Reactor, Response, StepError};
use meridian_core::regions::{parse_geojson, Regions};
use meridian_core::views;
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{
    decode, encode, BrokerHello, ExplainView, Heartbeat, JobId, JobStatus, JobView, OfferOutcome,
    OfferReply, SiteAdvert, SiteId, SiteView, StatusAck, WIRE_VERSION,
};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

/// Settings of `meridian broker`.
#[derive(clap::Args, Clone, Debug)]
pub struct BrokerConfig {
    /// NATS servers, their CA and this broker's identity.
    #[command(flatten)]
    pub access: meridian_federation::access::Access,
    /// This broker's storage identity: the NKey seed its JetStream connection (journal, lease, snapshots,
    /// archive, ledger, audit) uses, a connection that never answers a request. Default: `<name>-store.nk`
    /// beside `--creds` (`meridian creds add broker NAME` makes both).
    #[arg(long, env = "MERIDIAN_STORE_CREDS")]
    pub store_creds: Option<PathBuf>,
    /// The HTTP API's certificate (PEM); with `--tls-key`, the API speaks HTTPS.
    #[arg(long, env = "MERIDIAN_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The HTTP API certificate's private key (PEM).
    #[arg(long, env = "MERIDIAN_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Run without TLS, a NATS identity and API tokens, every caller an administrator: only for measuring
    /// what security costs on a closed machine. Without it the broker refuses to start unsecured.
    #[arg(long)]
    pub insecure: bool,
    /// Address of the HTTP API (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub http: String,
    /// Write the HTTP API's bound address to this file once listening.
    #[arg(long)]
    pub http_addr_file: Option<PathBuf>,
    /// A site whose heartbeats stop for this long is declared lost and its jobs are requeued, ms.
    #[arg(long, default_value_t = 10_000)]
    pub site_lost_after_ms: u64,
    /// An offer not answered within this is withdrawn and the next site is tried, ms.
    #[arg(long, default_value_t = 5_000)]
    pub offer_timeout_ms: u64,
    /// Period of the clock that drives timeouts and retries, ms.
    #[arg(long, default_value_t = 250)]
    pub tick_ms: u64,
    /// Residency region as NAME=FILE.geojson; repeatable.
    #[arg(long = "region", value_parser = parse_region)]
    pub regions: Vec<(String, PathBuf)>,
    /// Measured round-trip table (CSV: from_region,to_region,from_id,to_id,rtt_ms).
    #[arg(long)]
    pub rtt_table: Option<PathBuf>,
    /// Relative-throughput table of accelerator models (TOML, see configs/throughput.toml).
    #[arg(long)]
    pub throughput: Option<PathBuf>,
    /// Queues, quotas and priority classes (TOML, see configs/tenancy.toml); without it nothing is limited by
    /// quota.
    #[arg(long)]
    pub tenancy: Option<PathBuf>,
    /// The administrator's token, for changing the tenancy through the API (admin calls are refused without one).
    #[arg(long, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Name of this broker in the lease and the journal (default: host name and process id).
    #[arg(long)]
    pub name: Option<String>,
    /// Copies JetStream keeps of the journal, snapshots and lease: 1 on one server, 3 on a cluster.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// A standby takes over when the active broker has not renewed its lease for this long, ms.
    #[arg(long, default_value_t = 3_000)]
    pub lease_ms: u64,
    /// Journal records between snapshots of broker state.
    #[arg(long, default_value_t = journal::SNAPSHOT_EVERY)]
    pub snapshot_every: u64,
    /// Finished jobs stay in the live state this long, then move to the archive (JetStream), ms.
    #[arg(long, default_value_t = 600_000)]
    pub retention_ms: u64,
    /// API calls per second per tenant (a token bucket; 0 turns the limit off). Administrators are not limited.
    #[arg(long, default_value_t = 200)]
    pub tenant_rate: u32,
    /// Calls a tenant may make at once above its rate.
    #[arg(long, default_value_t = 400)]
    pub tenant_burst: u32,
    /// Messages per second per site: adverts, heartbeats, statuses (0 turns the limit off).
    #[arg(long, default_value_t = 2_000)]
    pub site_rate: u32,
    /// Messages a site may send at once above its rate.
    #[arg(long, default_value_t = 10_000)]
    pub site_burst: u32,
}

impl BrokerConfig {
    /// How the storage connection reaches NATS: the same servers and CA, under the storage identity.
    pub fn store_access(&self) -> meridian_federation::access::Access {
        let mut a = self.access.clone();
        a.creds = self.store_creds.clone().or_else(|| {
            let creds = self.access.creds.as_ref()?;
            let name = self.access.identity()?;
            Some(creds.with_file_name(format!("{name}-store.nk")))
        });
        a
    }
}

fn parse_region(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=FILE, got {s:?}"))?;
    meridian_federation::ids::check_id(name).map_err(|e| format!("region name {name:?} {e}"))?;
    Ok((name.to_owned(), PathBuf::from(path)))
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Read-only questions to the reactor task.
#[derive(Debug)]
pub enum Query {
    /// Live jobs after `after` (by id) that pass the filter, at most `limit`, and whether more follow.
    JobsPage {
        after: Option<JobId>,
        limit: usize,
        filter: meridian_federation::JobListRequest,
        /// Only the jobs the caller may read.
        who: Principal,
    },
    Job(JobId),
    /// A job, and whether every site is weighed (`explain --all`).
    Explain(JobId, bool),
    Timeline(JobId),
    Sites,
    /// Where the job's latest attempt ran: site and attempt.
    Placement(JobId),
    /// The ledger of the live jobs.
    Ledger,
    /// The live jobs submitted from this time on, for a what-if, and the tenancy in force.
    History(u64),
    Tenancy,
    /// The journal's durable format in force.
    Format,
    /// The API tokens.
    Tokens,
    /// The gauges `/metrics` shows.
    Gauges,
}

#[derive(Debug)]
pub enum Answer {
    JobsPage(Vec<JobView>, bool),
    Job(Option<JobView>),
    Explain(Option<ExplainView>),
    Timeline(Option<meridian_federation::TimelineView>),
    Sites(Vec<SiteView>),
    Placement(Option<(SiteId, u32)>),
    Ledger(Vec<meridian_core::ledger::LedgerEntry>),
    History(Vec<meridian_federation::HistoryJob>, Option<String>),
    Tenancy(Option<String>),
    /// The format in force, and the journal message that keeps the broker read-only (sequence, reason).
    Format(u32, Option<(u64, String)>),
    Tokens(Vec<meridian_core::access::TokenRecord>),
    Gauges(meridian_core::observe::Gauges),
}

enum Input {
    Event {
        event: Event,
        /// The API caller asking for the change (judged and audited in the reactor task); `None` for what
        /// sites and the broker's own clock say.
        caller: Option<Principal>,
        reply: Option<oneshot::Sender<Result<Response, StepError>>>,
    },
    Query(Query, oneshot::Sender<Answer>),
    /// A call on services (demand, views, routes), served with the autoscaler's soft state.
    Services(services::ServiceCall),
    /// An administrator sets aside the journal message the broker cannot read.
    Quarantine {
        seq: u64,
        who: Principal,
        reply: oneshot::Sender<anyhow::Result<()>>,
    },
}

/// A handle to the reactor task, shared by the API front ends.
#[derive(Clone)]
pub struct BrokerHandle {
    tx: mpsc::UnboundedSender<Input>,
    pub client: async_nats::Client,
    /// Finished jobs that left the live state.
    pub archive: archive::Archive,
    /// Who is calling, and whether too fast.
    pub auth: std::sync::Arc<auth::Auth>,
    /// The audit trail.
    pub audit: audit::Audit,
    /// What `/metrics` shows.
    pub metrics: std::sync::Arc<metrics::Metrics>,
    /// Spans of job attempts, when an OTLP endpoint is configured.
    pub traces: Option<std::sync::Arc<traces::Traces>>,
}

impl BrokerHandle {
    /// A change an API caller asks for: judged against their permissions, then applied, then audited.
    pub async fn step_as(&self, who: &Principal, event: Event) -> Result<Response, StepError> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Input::Event {
            event,
            caller: Some(who.clone()),
            reply: Some(tx),
        });
        rx.await.map_err(|_| stopped())?
    }

    /// Queues an event now (events are applied in the order they are queued); the answer comes later.
    pub fn step_queued(&self, event: Event) -> oneshot::Receiver<Result<Response, StepError>> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Input::Event {
            event,
            caller: None,
            reply: Some(tx),
        });
        rx
    }

    /// Sets aside the unreadable journal message `seq` (the caller is an administrator), so the broker replays
    /// what follows and takes changes again.
    pub async fn quarantine(&self, who: &Principal, seq: u64) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Input::Quarantine {
            seq,
            who: who.clone(),
            reply: tx,
        });
        rx.await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("broker is stopping")))
    }

    /// A call on services; the reply comes through the call's own channel.
    pub fn services(&self, call: services::ServiceCall) {
        let _ = self.tx.send(Input::Services(call));
    }

    pub async fn query(&self, q: Query) -> Option<Answer> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Input::Query(q, tx)).ok()?;
        rx.await.ok()
    }

    fn feed(&self, event: Event) {
        let _ = self.tx.send(Input::Event {
            event,
            caller: None,
            reply: None,
        });
    }
}

fn stopped() -> StepError {
    StepError::Journal(meridian_core::journal::JournalError::Unavailable(
        "broker is stopping".into(),
    ))
}

fn load_regions(cfg: &BrokerConfig) -> anyhow::Result<Regions> {
    let mut regions = Regions::default();
    for (name, path) in &cfg.regions {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading region {name} from {}", path.display()))?;
        let area = parse_geojson(&text)
            .map_err(|e| anyhow::anyhow!("region {name} ({}): {e}", path.display()))?;
        regions.insert(name, area);
    }
    Ok(regions)
}

fn load_rtt(cfg: &BrokerConfig) -> anyhow::Result<RttTable> {
    match &cfg.rtt_table {
        None => Ok(RttTable::default()),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            RttTable::from_azure_csv(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
        }
    }
}

/// What a broker needs to run secured, as one error naming everything missing.
fn check_secured(cfg: &BrokerConfig) -> anyhow::Result<()> {
    if cfg.insecure {
        tracing::warn!(
            "running INSECURE: no TLS, no NATS identity, every API caller is an administrator"
        );
        return Ok(());
    }
    let mut missing: Vec<String> = Vec::new();
    if cfg.access.ca.is_none() {
        missing.push("--ca (MERIDIAN_CA): the CA that signs the NATS servers".into());
    }
    if cfg.access.creds.is_none() {
        missing.push("--creds (MERIDIAN_CREDS): this broker's NKey seed from `meridian creds add broker NAME`".into());
    } else if let Some(store) = cfg.store_access().creds.filter(|p| !p.exists()) {
        missing.push(format!(
            "--store-creds (MERIDIAN_STORE_CREDS): this broker's storage identity ({} does not exist; `meridian creds add broker NAME` makes it)",
            store.display()
        ));
    }
    if cfg.admin_token.as_deref().is_none_or(str::is_empty) {
        missing.push("--admin-token (MERIDIAN_ADMIN_TOKEN): the administrator's API token".into());
    }
    if cfg.tls_cert.is_none() || cfg.tls_key.is_none() {
        missing.push("--tls-cert and --tls-key: the HTTP API's certificate".into());
    }
    if !missing.is_empty() {
        anyhow::bail!(
            "a broker runs secured, and these are missing:\n  {}\n(or pass --insecure, for measurements on a closed machine only)",
            missing.join("\n  ")
        );
    }
    Ok(())
}

/// Runs the broker until SIGINT or SIGTERM.
pub async fn run(cfg: BrokerConfig) -> anyhow::Result<()> {
    check_secured(&cfg)?;
    let regions = load_regions(&cfg)?;
    let rtt = load_rtt(&cfg)?;
    tracing::info!(
        "{} residency regions, {} measured round trips",
        regions.names().count(),
        rtt.len()
    );
    let core = CoreConfig {
        site_lost_after_ms: cfg.site_lost_after_ms,
        offer_timeout_ms: cfg.offer_timeout_ms,
        refusal_cooldown_ms: cfg.offer_timeout_ms.max(2_000) * 2,
        exhaustive_passes: false,
    };
    let throughput = match &cfg.throughput {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            meridian_core::throughput::Throughput::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Default::default(),
    };
    let mut reactor =
        Reactor::new(core, rtt, regions, BufferJournal::default()).with_throughput(throughput);
    // Whether the broker's own connection is up: sites are not judged by heartbeats it could not hear.
    let (connected_tx, connected) = tokio::sync::watch::channel(true);
    // The tenancy file is checked now and applied, as a journaled change, once the journal is replayed.
    let tenancy_file = match &cfg.tenancy {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            meridian_core::quota::Tenancy::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(text)
        }
        None => None,
    };
    let client = cfg
        .access
        .options("meridian broker")?
        .retry_on_initial_connect()
        .max_reconnects(None)
        .event_callback(move |event| {
            let tx = connected_tx.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        let _ = tx.send(true);
                    }
                    async_nats::Event::Disconnected => {
                        let _ = tx.send(false);
                    }
                    _ => {}
                }
                tracing::info!("NATS: {event}");
            }
        })
        .connect(meridian_federation::nats_servers(&cfg.access.nats))
        .await
        .with_context(|| format!("connecting to {}", cfg.access.display_url()))?;
    tracing::info!(
        "connected to {} as {}",
        cfg.access.display_url(),
        cfg.access
            .identity()
            .as_deref()
            .unwrap_or("an anonymous user")
    );
    // JetStream over a connection of its own, which answers no request: no reply subject a caller names can
    // reach the journal, lease, snapshots, archive, ledger or audit (nats-server's permissions say so too).
    let store_access = cfg.store_access();
    let store = store_access
        .options("meridian broker store")?
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(meridian_federation::nats_servers(&store_access.nats))
        .await
        .with_context(|| format!("connecting to {} for storage", store_access.display_url()))?;

    let name = cfg.name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let holder = lease::Holder {
        broker: name.clone(),
        http: cfg.http.clone(),
        lease_ms: cfg.lease_ms.max(100),
    };
    // Load the state first and keep following the journal while waiting for the lease (a hot standby), so
    // that taking over costs only the records written since the last look.
    let loading = std::time::Instant::now();
    let instance = format!("{name}-{}", now_ms());
    let mut journal = patiently("the journal", || {
        journal::JetStreamJournal::open(store.clone(), instance.clone(), cfg.replicas)
    })
    .await?;
    journal.snapshot_every = cfg.snapshot_every.max(1);
    let recovered = journal.recover_patiently().await?;
    if let Some((seq, reason)) = journal.unreadable() {
        tracing::error!("{}", journal::read_only(seq, reason));
    }
    let from_snapshot = recovered.snapshot.is_some();
    if let Some(snap) = recovered.snapshot {
        reactor.restore(snap);
    }
    reactor.replay_batches(&recovered.batches);
    let mut replayed = records_in(&recovered.batches);
    let mut batches = recovered.batches.len();
    drop(recovered.batches);
    let load_ms = loading.elapsed().as_millis();

    let acquire = patiently("the lease", || {
        lease::Lease::acquire(store.clone(), &holder, cfg.replicas)
    });
    tokio::pin!(acquire);
    let mut follow = tokio::time::interval(Duration::from_millis(500));
    let mut lease = loop {
        tokio::select! {
            lease = &mut acquire => break lease?,
            _ = follow.tick() => match journal.catch_up().await {
                Ok(late) => {
                    reactor.replay_batches(&late);
                    replayed += records_in(&late);
                    batches += late.len();
                }
                Err(e) => tracing::warn!("following the journal: {e:#}"),
            },
        }
    };
    tracing::info!("broker {name} is active");
    let taking_over = std::time::Instant::now();
    // Fence out the broker that was active before, and replay what it wrote since the last look.
    let late = journal.take_over(reactor.state().format()).await?;
    reactor.replay_batches(&late);
    if let Some((seq, reason)) = journal.unreadable() {
        tracing::error!("{}", journal::read_only(seq, reason));
        if tenancy_file.is_some() {
            tracing::warn!("the tenancy file is applied at a start with a readable journal");
        }
    } else {
        resume(&mut reactor, &mut journal).await?;
        apply_tenancy_file(&mut reactor, &mut journal, tenancy_file).await?;
    }
    if let Some(e) = &reactor.state().tenancy_toml_error() {
        tracing::error!(
            "the journaled tenancy could not be read ({e}); quotas are off until it is set again"
        );
    }
    if let Some(t) = &reactor.tenancy() {
        tracing::info!(
            "tenancy: {} queues, {} priority classes, {} budgets",
            t.queues.len(),
            t.priorities.len(),
            t.budgets.len()
        );
    }
    tracing::info!(
        "recovered {} jobs and {} sites from {}{} journal records ({} batches) in {} ms",
        reactor.state().jobs().len(),
        reactor.state().sites().len(),
        if from_snapshot { "a snapshot and " } else { "" },
        replayed + records_in(&late),
        batches,
        load_ms + taking_over.elapsed().as_millis()
    );

    // From here on, what steps do is counted for the metrics (replay above counted nothing).
    reactor.observe();
    let (tx, rx) = mpsc::unbounded_channel();
    let archive = patiently("the archive", || {
        archive::Archive::open(store.clone(), cfg.replicas)
    })
    .await?;
    let audit = patiently("the audit", || {
        audit::Audit::open(store.clone(), cfg.replicas)
    })
    .await?;
    let (tokens_tx, tokens_rx) = tokio::sync::watch::channel(tokens_of(&reactor));
    let auth = auth::Auth::new(
        cfg.insecure,
        cfg.admin_token.as_deref(),
        tokens_rx,
        auth::Rate {
            per_s: cfg.tenant_rate,
            burst: cfg.tenant_burst,
        },
        auth::Rate {
            per_s: cfg.site_rate,
            burst: cfg.site_burst,
        },
    );
    let handle = BrokerHandle {
        archive: archive.clone(),
        tx,
        client: client.clone(),
        auth: std::sync::Arc::new(auth),
        audit,
        metrics: std::sync::Arc::new(metrics::Metrics::new()),
        traces: meridian_adapters::telemetry::Telemetry::from_env("meridian-broker")
            .map_err(anyhow::Error::msg)?
            .map(|t| {
                tracing::info!("exporting traces over OTLP/HTTP");
                std::sync::Arc::new(traces::Traces::new(t))
            }),
    };
    let reactor_task = tokio::spawn(reactor_loop(
        reactor,
        journal,
        archive,
        cfg.retention_ms,
        rx,
        connected,
        handle.clone(),
        tokens_tx,
        Duration::from_millis(cfg.tick_ms.max(10)),
        Duration::from_millis(cfg.offer_timeout_ms),
    ));

    spawn_site_listener(&handle, SiteTopic::Advert).await?;
    spawn_site_listener(&handle, SiteTopic::Heartbeat).await?;
    spawn_site_listener(&handle, SiteTopic::Status).await?;
    spawn_site_listener(&handle, SiteTopic::Metrics).await?;
    let api_sub = client.subscribe(subjects::api::ALL).await?;
    tokio::spawn(api::serve_nats(handle.clone(), api_sub));

    let listener = tokio::net::TcpListener::bind(&cfg.http)
        .await
        .with_context(|| format!("binding the HTTP API to {}", cfg.http))?;
    let addr = listener.local_addr()?;
    tracing::info!(
        "HTTP API on {}://{addr}",
        if cfg.tls_cert.is_some() {
            "https"
        } else {
            "http"
        }
    );
    if let Some(path) = &cfg.http_addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, addr.to_string())?;
        std::fs::rename(&tmp, path)?;
    }
    http::serve(listener, handle.clone(), &cfg).await?;

    // Ask agents for their adverts: after a restart the broker knows no sites.
    let hello = encode(&BrokerHello {
        v: WIRE_VERSION,
        sent_at_ms: now_ms(),
    })?;
    client
        .publish(subjects::BROKER_HELLO, Bytes::from(hello))
        .await?;

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut renew = tokio::time::interval(lease.lease / 3);
    let mut reactor_task = reactor_task;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            r = &mut reactor_task => {
                r??;
                break;
            }
            _ = renew.tick() => {
                // A renewal retries while NATS is gone: a signal still stops the broker meanwhile.
                tokio::select! {
                    renewed = lease.renew() => if let Err(e) = renewed {
                        tracing::error!("stepping down: {e}");
                        return Err(e.into());
                    },
                    _ = tokio::signal::ctrl_c() => break,
                    _ = sigterm.recv() => break,
                }
            }
        }
    }
    tracing::info!("broker stopping; handing the lease back");
    // With NATS gone the lease cannot be handed back: it expires by itself, and the broker exits anyway.
    if tokio::time::timeout(Duration::from_secs(2), lease.release())
        .await
        .is_err()
    {
        tracing::warn!("the lease could not be handed back; it expires by itself");
    }
    Ok(())
}

/// A tenancy file is applied when it differs from the one last applied at a start: editing the file and
/// restarting applies it; restarting alone keeps the administrator's changes made through the API.
async fn apply_tenancy_file(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    tenancy_file: Option<String>,
) -> anyhow::Result<()> {
    let Some(text) = tenancy_file else {
        return Ok(());
    };
    if reactor.state().tenancy_file_toml() != Some(text.as_str()) {
        reactor
            .step(
                now_ms(),
                Event::SetTenancy {
                    toml: text,
                    from_file: true,
                },
            )
            .map_err(|e| anyhow::anyhow!("tenancy: {e}"))?;
        journal
            .store(reactor.state().format(), reactor.journal_mut().take())
            .await?;
    }
    Ok(())
}

/// The API tokens of the state, for the API front ends.
fn tokens_of(reactor: &Reactor<BufferJournal>) -> auth::Tokens {
    std::sync::Arc::new(reactor.state().tokens().clone())
}

fn records_in(batches: &[meridian_core::durable::Batch]) -> usize {
    batches.iter().map(|b| b.records.len()).sum()
}

/// Retries a start-up step for a minute: a NATS cluster that has just started may not have elected its
/// JetStream leader yet.
async fn patiently<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(t) => return Ok(t),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!("opening {what}: {e:#}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.context(format!("opening {what}"))),
        }
    }
}

/// Subscribes to one topic of every site and turns each valid message into a reactor event. Invalid messages
/// are logged with the reason and dropped; a status request gets an error reply so the agent sees why.
async fn spawn_site_listener(handle: &BrokerHandle, topic: SiteTopic) -> anyhow::Result<()> {
    let mut sub = handle.client.subscribe(subjects::all_sites(topic)).await?;
    let h = handle.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let Some((site, _)) = subjects::parse_site(&m.subject) else {
                continue;
            };
            // Answers go only into the site's own inbox.
            let to = reply::inbox(
                &h,
                site.as_str(),
                &format!("site:{site}"),
                topic.as_str(),
                m.reply.as_ref().map(|r| r.as_str()),
            );
            if let Err(wait) = h.auth.admit_site(site.as_str()) {
                h.audit.refused(
                    now_ms(),
                    &format!("site:{site}"),
                    topic.as_str(),
                    "rate limited",
                );
                if let Some(to) = &to {
                    let body = meridian_federation::ApiReply::<()>::err(auth::slow_down(
                        wait,
                        &format!("site {site}"),
                    ));
                    if let Ok(body) = encode(&body) {
                        reply::send(&h.client, to, body).await;
                    }
                }
                continue;
            }
            if topic == SiteTopic::Metrics {
                match decode::<meridian_federation::SiteMetrics>(&m.payload)
                    .and_then(|r| same_site(&site, &r.site).map(|()| r))
                {
                    Ok(r) => h.metrics.agent_report(r, now_ms()),
                    Err(err) => {
                        tracing::warn!("dropped a bad metrics message from site {site}: {err}");
                        h.audit.refused(
                            now_ms(),
                            &format!("site:{site}"),
                            "metrics",
                            &err.to_string(),
                        );
                    }
                }
                continue;
            }
            let event = match topic {
                SiteTopic::Advert => decode::<SiteAdvert>(&m.payload).and_then(|a| {
                    same_site(&site, &a.site.id)?;
                    Ok(Event::Advert(a))
                }),
                SiteTopic::Heartbeat => decode::<Heartbeat>(&m.payload).and_then(|b| {
                    same_site(&site, &b.site)?;
                    Ok(Event::Heartbeat(b))
                }),
                SiteTopic::Status => decode::<JobStatus>(&m.payload).and_then(|s| {
                    same_site(&site, &s.site)?;
                    Ok(Event::Status(s))
                }),
                _ => continue,
            };
            match event {
                Ok(Event::Status(s)) => {
                    let ack = StatusAck {
                        v: WIRE_VERSION,
                        job: s.job.clone(),
                        attempt: s.attempt,
                    };
                    // Queued in arrival order (so a site's updates apply in order); acknowledged once stored,
                    // without holding up the next update. A refusal (the site does not hold the attempt, or is
                    // revoked) is answered with the reason, so the agent stops retrying it.
                    let running = (s.state == meridian_federation::AttemptState::Running)
                        .then(|| (s.job.clone(), s.attempt));
                    let applied = h.step_queued(Event::Status(s));
                    let client = h.client.clone();
                    let cancel_to = site.clone();
                    tokio::spawn(async move {
                        let body = match applied.await {
                            Ok(Ok(_)) => encode(&ack).ok(),
                            Ok(Err(e @ StepError::Refused(_))) => {
                                // A site that says it runs an attempt the broker does not give it is told to
                                // stop it (on its own subject: nothing is journaled).
                                if let Some((job, attempt)) = running {
                                    stop_unheld(&client, &cancel_to, job, attempt).await;
                                }
                                encode(&meridian_federation::ApiReply::<()>::err(
                                    meridian_federation::ErrorBody::new(
                                        e.code(),
                                        None,
                                        e.to_string(),
                                    ),
                                ))
                                .ok()
                            }
                            _ => None,
                        };
                        if let (Some(to), Some(body)) = (to, body) {
                            reply::send(&client, &to, body).await;
                        }
                    });
                }
                Ok(e) => h.feed(e),
                Err(err) => {
                    tracing::warn!(
                        "dropped a bad {} message from site {site}: {err}",
                        topic.as_str()
                    );
                    h.audit.refused(
                        now_ms(),
                        &format!("site:{site}"),
                        topic.as_str(),
                        &err.to_string(),
                    );
                    if let Some(to) = &to {
                        let body = meridian_federation::ApiReply::<()>::err(err.to_body());
                        if let Ok(body) = encode(&body) {
                            reply::send(&h.client, to, body).await;
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

/// Tells `site` to stop an attempt it reports running that the broker does not give it.
async fn stop_unheld(client: &async_nats::Client, site: &SiteId, job: JobId, attempt: u32) {
    let cancel = meridian_federation::CancelAttempt {
        v: WIRE_VERSION,
        job,
        attempt,
        reason: "the broker does not give this attempt to this site".into(),
    };
    send_cancel(client, site, &cancel).await;
}

/// Tells `site` to stop one of its attempts.
async fn send_cancel(
    client: &async_nats::Client,
    site: &SiteId,
    cancel: &meridian_federation::CancelAttempt,
) {
    if let Ok(body) = encode(cancel) {
        let _ = client
            .publish(subjects::site(site, SiteTopic::Cancel), Bytes::from(body))
            .await;
    }
}

fn same_site(
    subject_site: &SiteId,
    body_site: &SiteId,
) -> Result<(), meridian_federation::WireError> {
    if subject_site != body_site {
        return Err(meridian_federation::WireError::invalid(
            "site",
            format!("message for site {body_site} arrived on the subject of site {subject_site}"),
        ));
    }
    Ok(())
}

/// Inputs taken together into one journal append (group commit).
const MAX_BATCH: usize = 1024;
/// A journal append slower than this means the broker was stalled.
const STALL: Duration = Duration::from_secs(1);

#[allow(clippy::too_many_arguments)]
async fn reactor_loop(
    mut reactor: Reactor<BufferJournal>,
    mut journal: journal::JetStreamJournal,
    archive: archive::Archive,
    retention_ms: u64,
    mut rx: mpsc::UnboundedReceiver<Input>,
    connected: tokio::sync::watch::Receiver<bool>,
    handle: BrokerHandle,
    tokens: tokio::sync::watch::Sender<auth::Tokens>,
    tick: Duration,
    offer_timeout: Duration,
) -> anyhow::Result<()> {
    let mut tokens_seen = reactor.state().tokens_generation();
    let mut autoscaling = services::Autoscaling::default();
    let mut clock = tokio::time::interval(tick);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut inputs = Vec::with_capacity(MAX_BATCH);
    let mut was_down = false;
    loop {
        // Timers run after every batch (so capacity a batch frees is refilled at once, not at the next clock
        // tick), and on the clock when nothing arrives.
        let mut tick = tokio::select! {
            input = rx.recv() => match input {
                Some(input) => {
                    inputs.push(input);
                    true
                }
                None => return Ok(()),
            },
            _ = clock.tick() => true,
        };
        while inputs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(input) => inputs.push(input),
                Err(_) => break,
            }
        }
        if journal.unreadable().is_some() {
            read_only(
                &mut reactor,
                &mut journal,
                &handle,
                &mut autoscaling,
                &mut inputs,
            )
            .await;
            if reactor.state().tokens_generation() != tokens_seen {
                tokens_seen = reactor.state().tokens_generation();
                let _ = tokens.send(tokens_of(&reactor));
            }
            if journal.unreadable().is_some() || inputs.is_empty() {
                continue;
            }
            // Set aside: what is left of the batch is served as usual.
        }
        // While the broker's own connection is down, no heartbeat can reach it: timers wait, and liveness starts
        // afresh once it is back.
        if !*connected.borrow() {
            was_down = true;
            tick = false;
        } else if was_down {
            was_down = false;
            tracing::info!("NATS connection back; site liveness starts afresh");
            if let Err(e) = reactor.step(now_ms(), Event::Resume) {
                tracing::error!("resume failed: {e}");
            }
        }
        // Timers run after what has arrived: heartbeats that waited in the queue count before a site is judged.
        // The services' autoscaler plans first; its decisions are journaled as replicas submitted and cancelled.
        if tick {
            for event in autoscaling.events(&reactor, now_ms()) {
                inputs.push(Input::Event {
                    event,
                    caller: None,
                    reply: None,
                });
            }
            inputs.push(Input::Event {
                event: Event::Tick,
                caller: None,
                reply: None,
            });
        }
        let now = now_ms();
        let mut replies = Vec::new();
        let mut answers = Vec::new();
        let mut audited = Vec::new();
        for input in inputs.drain(..) {
            match input {
                Input::Event {
                    event,
                    caller,
                    reply,
                } => {
                    let tick = matches!(event, Event::Tick);
                    let stepping = std::time::Instant::now();
                    let r = step_audited(
                        &mut reactor,
                        &handle.audit,
                        &mut audited,
                        now,
                        event,
                        caller,
                    );
                    let seen = reactor.take_observations();
                    let offers = seen
                        .iter()
                        .filter(|o| matches!(o, meridian_core::observe::Observation::Placed { .. }))
                        .count();
                    handle
                        .metrics
                        .placement_step(stepping.elapsed().as_secs_f64(), offers);
                    handle.metrics.record(&seen);
                    if let Some(t) = &handle.traces {
                        t.record(&seen);
                    }
                    match (&r, tick) {
                        (Err(e), true) => tracing::error!("tick failed: {e}"),
                        (Err(e), false) => tracing::debug!("step refused: {e}"),
                        _ => {}
                    }
                    if let Some(tx) = reply {
                        replies.push((tx, r));
                    }
                }
                Input::Query(q, tx) => answers.push((tx, answer(&reactor, &journal, q))),
                Input::Services(call) => autoscaling.serve(&reactor, call, now),
                Input::Quarantine { seq, who, reply } => {
                    quarantine(&mut reactor, &mut journal, &handle, seq, &who, reply).await;
                }
            }
        }
        // The steps are stored before anything is said or sent because of them.
        let records = reactor.journal_mut().take();
        if !records.is_empty() {
            let storing = std::time::Instant::now();
            if let Err(e) = journal.store(reactor.state().format(), records).await {
                tracing::error!("stopping: {e}");
                return Err(e.into());
            }
            handle
                .metrics
                .journal_append(storing.elapsed().as_secs_f64());
            if storing.elapsed() > STALL {
                // The broker could not act (JetStream was electing a leader, say): that time is not held
                // against the sites, whose heartbeats waited unheard.
                tracing::warn!(
                    "the journal took {} ms to store a batch; site liveness starts afresh",
                    storing.elapsed().as_millis()
                );
                if let Err(e) = reactor.step(now_ms(), Event::Resume) {
                    tracing::error!("resume failed: {e}");
                }
            }
            if journal.snapshot_due(reactor.state().jobs().len()) {
                journal.save_snapshot(&reactor.state().snapshot(journal.last_seq(), now));
            }
        }
        // What was audited is written once its batch is stored, as one message.
        handle.audit.batch(std::mem::take(&mut audited));
        if reactor.state().tokens_generation() != tokens_seen {
            tokens_seen = reactor.state().tokens_generation();
            let _ = tokens.send(tokens_of(&reactor));
        }
        if tick {
            archive_finished(&mut reactor, &archive, now, retention_ms).await;
        }
        for (tx, r) in replies {
            let _ = tx.send(r);
        }
        for (tx, a) in answers {
            let _ = tx.send(a);
        }
        for command in reactor.take_outbox() {
            send(&handle, command, offer_timeout);
        }
        // Watchers of routing tables hear of changes after the batch that made them.
        let updates = autoscaling.route_changes(&reactor, now_ms());
        if !updates.is_empty() {
            let client = handle.client.clone();
            tokio::spawn(async move {
                for (inbox, body) in updates {
                    reply::send(&client, &inbox, body).await;
                }
            });
        }
    }
}

/// Serves inputs while an unreadable journal message keeps the broker read-only: questions are answered; an
/// API caller's change is refused with the message's sequence and the reason; what sites say waits unanswered
/// (agents send statuses again until one is acknowledged) and the clock stands still. Once an administrator's
/// quarantine leaves the journal readable, the inputs not yet served stay in `inputs`.
async fn read_only(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    handle: &BrokerHandle,
    autoscaling: &mut services::Autoscaling,
    inputs: &mut Vec<Input>,
) {
    let mut pending = std::mem::take(inputs).into_iter();
    while let Some((seq, reason)) = journal.unreadable() {
        let why = journal::read_only(seq, reason);
        let Some(input) = pending.next() else {
            break;
        };
        match input {
            Input::Query(q, tx) => {
                let _ = tx.send(answer(reactor, journal, q));
            }
            Input::Services(call) => autoscaling.serve(reactor, call, now_ms()),
            Input::Event {
                caller: Some(_),
                reply: Some(tx),
                ..
            } => {
                let _ = tx.send(Err(StepError::Journal(
                    meridian_core::journal::JournalError::Unavailable(why),
                )));
            }
            Input::Event { .. } => {}
            Input::Quarantine { seq, who, reply } => {
                quarantine(reactor, journal, handle, seq, &who, reply).await;
            }
        }
    }
    inputs.extend(pending);
}

/// An administrator's quarantine of journal message `seq`: carried out if it is the unreadable one, answered,
/// and audited either way.
async fn quarantine(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    handle: &BrokerHandle,
    seq: u64,
    who: &Principal,
    reply: oneshot::Sender<anyhow::Result<()>>,
) {
    let now = now_ms();
    match set_aside(reactor, journal, seq).await {
        Ok(()) => {
            handle.audit.batch(vec![meridian_federation::AuditEntry {
                at_ms: now,
                who: who.id.clone(),
                action: "journal_quarantine".into(),
                target: Some(format!("journal message {seq}")),
                outcome: "ok".into(),
                count: 1,
                until_ms: None,
            }]);
            let _ = reply.send(Ok(()));
        }
        Err(e) => {
            handle
                .audit
                .refused(now, &who.id, "journal_quarantine", &format!("{e:#}"));
            let _ = reply.send(Err(e));
        }
    }
}

/// Sets the unreadable journal message `seq` aside and replays what followed it; once nothing unreadable is
/// left, the broker takes changes again.
async fn set_aside(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    seq: u64,
) -> anyhow::Result<()> {
    let batches = journal.quarantine(reactor.state().format(), seq).await?;
    reactor.replay_batches(&batches);
    tracing::warn!(
        "journal message {seq} set aside by an administrator; {} batches after it replayed",
        batches.len()
    );
    if let Some((next, reason)) = journal.unreadable() {
        tracing::error!("{}", journal::read_only(next, reason));
        return Ok(());
    }
    tracing::info!("the journal reads to its end again: the broker takes changes");
    resume(reactor, journal).await
}

/// Site liveness starts afresh (the broker heard nothing while it was not acting), journaled.
async fn resume(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
) -> anyhow::Result<()> {
    reactor
        .step(now_ms(), Event::Resume)
        .map_err(|e| anyhow::anyhow!("resuming: {e}"))?;
    journal
        .store(reactor.state().format(), reactor.journal_mut().take())
        .await?;
    Ok(())
}

/// One step: an API caller's change is judged against its permissions first; what the audit records of it (or
/// of a site's refused message) is noted.
fn step_audited(
    reactor: &mut Reactor<BufferJournal>,
    audit: &audit::Audit,
    audited: &mut Vec<meridian_federation::AuditEntry>,
    now: u64,
    event: Event,
    caller: Option<Principal>,
) -> Result<Response, StepError> {
    let site = match &event {
        Event::Advert(a) => Some((a.site.id.clone(), "advert")),
        Event::Heartbeat(h) => Some((h.site.clone(), "heartbeat")),
        Event::Status(s) => Some((s.site.clone(), "status")),
        _ => None,
    };
    let joining =
        matches!(&event, Event::Advert(a) if !reactor.state().sites().contains_key(&a.site.id));
    let Some(who) = caller else {
        let r = reactor.step(now, event);
        match (&r, site) {
            (Err(StepError::Refused(why)), Some((site, topic))) => {
                audit.refused(now, &format!("site:{site}"), topic, why);
            }
            (Ok(_), Some((site, _))) if joining => audited.push(meridian_federation::AuditEntry {
                at_ms: now,
                who: format!("site:{site}"),
                action: "site_join".into(),
                target: Some(format!("site {site}")),
                outcome: "ok".into(),
                count: 1,
                until_ms: None,
            }),
            _ => {}
        }
        return r;
    };
    let described = authz::describe(&event);
    let r = authz::authorize(reactor, &who, &event).and_then(|()| reactor.step(now, event));
    if let Some((action, target)) = described {
        match &r {
            Ok(_) => audited.push(meridian_federation::AuditEntry {
                at_ms: now,
                who: who.id.clone(),
                action: action.into(),
                target: authz::outcome_target(target, &r),
                outcome: "ok".into(),
                count: 1,
                until_ms: None,
            }),
            Err(e) => audit.refused(now, &who.id, action, &e.to_string()),
        }
    }
    r
}

/// Moves finished jobs past their retention into the archive, then out of the live state (journaled with the
/// next batch). A failure leaves them live, to be tried again.
async fn archive_finished(
    reactor: &mut Reactor<BufferJournal>,
    archive: &archive::Archive,
    now: u64,
    retention_ms: u64,
) {
    if reactor.state().format() < meridian_core::reactor::JOURNALED_DECISIONS {
        return; // Format 1 has no record for it: history stays live until the format is upgraded.
    }
    let batch: Vec<_> = reactor
        .archivable(now, retention_ms, 500)
        .into_iter()
        .map(|j| {
            (
                j.clone(),
                views::job_view(j, reactor.state().sites(), reactor.rtt()),
                views::explain_view(j),
            )
        })
        .collect();
    if batch.is_empty() {
        return;
    }
    let ids: Vec<JobId> = batch.iter().map(|(j, _, _)| j.id.clone()).collect();
    if let Err(e) = archive.store(batch).await {
        tracing::warn!("archiving finished jobs failed (they stay live, tried again): {e:#}");
        return;
    }
    if let Err(e) = reactor.step(now, Event::Archived { jobs: ids }) {
        tracing::error!("could not record archived jobs: {e}");
    }
}

fn answer(
    reactor: &Reactor<BufferJournal>,
    journal: &journal::JetStreamJournal,
    q: Query,
) -> Answer {
    let st = reactor.state();
    match q {
        Query::JobsPage {
            after,
            limit,
            filter,
            who,
        } => {
            let range = match &after {
                Some(a) => st
                    .jobs()
                    .range::<JobId, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
                None => st.jobs().range::<JobId, _>(..),
            };
            let mut page: Vec<JobView> = range
                .map(|(_, j)| j)
                .filter(|j| {
                    filter.tenant.as_ref().is_none_or(|t| t == &j.spec.tenant)
                        && filter.state.is_none_or(|p| p == j.phase)
                        && filter.from_ms.is_none_or(|f| j.submitted_ms >= f)
                        && filter.to_ms.is_none_or(|t| j.submitted_ms < t)
                        && who
                            .may(
                                meridian_core::access::Verb::Watch,
                                &j.spec.tenant,
                                authz::queue_of(j.spec.queue.as_ref()),
                                "",
                            )
                            .is_ok()
                })
                .map(|j| views::job_view(j, st.sites(), reactor.rtt()))
                .filter(|v| {
                    filter
                        .site
                        .as_ref()
                        .is_none_or(|s| v.site.as_ref() == Some(s))
                })
                .take(limit + 1)
                .collect();
            let more = page.len() > limit;
            page.truncate(limit);
            Answer::JobsPage(page, more)
        }
        Query::Job(id) => Answer::Job(
            st.jobs()
                .get(&id)
                .map(|j| views::job_view(j, st.sites(), reactor.rtt())),
        ),
        Query::Explain(id, all) => {
            Answer::Explain(reactor.explain(&id, now_ms(), all).map(|mut v| {
                if let Some(job) = st.jobs().get(&id) {
                    for (_, _, warning) in views::possibly_still_running(job, st.revoked_sites()) {
                        v.history.push(warning);
                    }
                }
                v
            }))
        }
        Query::Sites => Answer::Sites(st.sites().values().map(views::site_view).collect()),
        Query::Format => Answer::Format(
            st.format(),
            journal
                .unreadable()
                .map(|(seq, reason)| (seq, reason.to_owned())),
        ),
        Query::Tokens => Answer::Tokens(st.tokens().values().cloned().collect()),
        Query::Gauges => Answer::Gauges(reactor.gauges()),
        Query::Timeline(id) => Answer::Timeline(st.jobs().get(&id).map(|job| {
            let mut t = views::timeline(job);
            for (attempt, site, warning) in views::possibly_still_running(job, st.revoked_sites()) {
                t.events.push(meridian_federation::TimelineEvent {
                    at_ms: now_ms(),
                    event: "note".into(),
                    attempt: Some(attempt),
                    site: Some(site),
                    detail: warning,
                });
            }
            t
        })),
        Query::Tenancy => Answer::Tenancy(st.tenancy_toml().map(str::to_owned)),
        Query::History(from) => Answer::History(
            st.jobs()
                .values()
                .filter(|j| j.submitted_ms >= from)
                .map(views::history_job)
                .collect(),
            st.tenancy_toml().map(str::to_owned),
        ),
        Query::Ledger => Answer::Ledger(
            st.jobs()
                .values()
                .map(meridian_core::ledger::LedgerEntry::of)
                .collect(),
        ),
        Query::Placement(id) => Answer::Placement(st.jobs().get(&id).and_then(|j| {
            let site = views::job_view(j, st.sites(), reactor.rtt()).site?;
            (j.attempt > 0).then_some((site, j.attempt))
        })),
    }
}

/// Sends one outbox command. Offers are requests: the answer comes back as an event; a missing answer is
/// left to the reactor's offer timeout.
fn send(handle: &BrokerHandle, command: Command, offer_timeout: Duration) {
    let h = handle.clone();
    tokio::spawn(async move {
        match command {
            Command::Offer(offer) => {
                let Ok(body) = encode(&offer) else { return };
                let subject = subjects::site(&offer.site, SiteTopic::Offer);
                // The attempt's trace continues at the site under the `offer` span.
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    subjects::TRACEPARENT_HEADER,
                    meridian_federation::trace::traceparent(
                        &offer.job,
                        offer.attempt,
                        meridian_federation::trace::SpanKind::Offer,
                    )
                    .as_str(),
                );
                let reply = tokio::time::timeout(
                    offer_timeout,
                    h.client
                        .request_with_headers(subject, headers, Bytes::from(body)),
                )
                .await;
                let (outcome, mark) = match reply {
                    Err(_) => return,
                    Ok(Err(e)) => (
                        OfferOutcome::Rejected {
                            reason: format!("no answer: {e}"),
                        },
                        None,
                    ),
                    Ok(Ok(m)) => match decode::<OfferReply>(&m.payload) {
                        Ok(r) if r.job == offer.job && r.attempt == offer.attempt => {
                            (r.outcome, r.mark)
                        }
                        Ok(_) => (
                            OfferOutcome::Rejected {
                                reason: "answer names another attempt".into(),
                            },
                            None,
                        ),
                        Err(e) => (
                            OfferOutcome::Rejected {
                                reason: format!("unreadable answer: {e}"),
                            },
                            None,
                        ),
                    },
                };
                h.feed(Event::OfferAnswer {
                    site: offer.site,
                    job: offer.job,
                    attempt: offer.attempt,
                    outcome,
                    mark,
                });
            }
            Command::AskInventory { site } => {
                let Ok(body) = encode(&meridian_federation::InventoryRequest { v: WIRE_VERSION })
                else {
                    return;
                };
                let subject = subjects::site(&site, SiteTopic::Inventory);
                let asked = h.client.request(subject, Bytes::from(body));
                match tokio::time::timeout(Duration::from_secs(10), asked).await {
                    Ok(Ok(m)) => match decode::<meridian_federation::Inventory>(&m.payload) {
                        Ok(inventory) => h.feed(Event::Inventory { site, inventory }),
                        Err(e) => tracing::warn!("site {site} sent an unreadable inventory: {e}"),
                    },
                    _ => tracing::debug!("site {site} did not answer for its inventory"),
                }
            }
            Command::Cancel { site, cancel } => send_cancel(&h.client, &site, &cancel).await,
        }
    });
}
