//! Start-up: the connections, recovery from the journal and snapshot (and the tenancy file), the lease,
//! recovery from the journal and snapshot, and the tasks it starts ([`run`]).
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use super::*;

/// Runs the broker until SIGINT or SIGTERM.
pub async fn run(cfg: BrokerConfig) -> anyhow::Result<()> {
    check_secured(&cfg)?;
    let tables = Tables::read(&cfg)?;
    let mut reactor = new_reactor(&cfg, &tables)?;
    // The tenancy file is checked now and applied, as a journaled change, once the journal is replayed.
    let tenancy_file = read_tenancy_file(&cfg)?;
    let (client, store, connected) = connect(&cfg).await?;
    let name = cfg.name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let (journal, lease) = recover(&cfg, &store, &name, &mut reactor, tenancy_file).await?;
    // From here on, what steps do is counted for the metrics (replay above counted nothing).
    reactor.observe();
    let (handle, rx, tokens_tx) = open_handle(&cfg, &store, client, tables, &reactor).await?;
    let task = Task::new(
        reactor,
        journal,
        handle.clone(),
        tokens_tx,
        cfg.retention_ms,
        Duration::from_millis(cfg.offer_timeout_ms),
    );
    let tick = Duration::from_millis(cfg.tick_ms.max(10));
    let reactor_task = tokio::spawn(reactor_loop(task, rx, connected, tick));
    serve_edges(&cfg, &handle).await?;
    hold_lease(lease, reactor_task).await
}

/// The reactor, with the tables the broker was started with.
fn new_reactor(cfg: &BrokerConfig, tables: &Tables) -> anyhow::Result<Reactor<BufferJournal>> {
    let regions = tables.regions()?;
    let rtt = tables.rtt.clone();
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
    let throughput = tables.throughput()?;
    Ok(Reactor::new(core, rtt, regions, BufferJournal::default()).with_throughput(throughput))
}

/// The tenancy file's text, checked.
fn read_tenancy_file(cfg: &BrokerConfig) -> anyhow::Result<Option<String>> {
    let Some(path) = &cfg.tenancy else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    meridian_core::quota::Tenancy::from_toml(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(Some(text))
}

/// The broker's two NATS connections — the one that serves and answers, and JetStream's own, which answers
/// no request (no reply subject a caller names can reach the journal, lease, snapshots, archive, ledger or
/// audit; nats-server's permissions say so too) — and whether the first is up (sites are not judged by
/// heartbeats the broker could not hear).
async fn connect(
    cfg: &BrokerConfig,
) -> anyhow::Result<(
    async_nats::Client,
    async_nats::Client,
    tokio::sync::watch::Receiver<bool>,
)> {
    let (connected_tx, connected) = tokio::sync::watch::channel(true);
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
    let store_access = cfg.store_access();
    let store = store_access
        .options("meridian broker store")?
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(meridian_federation::nats_servers(&store_access.nats))
        .await
        .with_context(|| format!("connecting to {} for storage", store_access.display_url()))?;
    Ok((client, store, connected))
}

/// Loads the state, follows the journal while waiting for the lease (a hot standby, so taking over costs
/// only the records written since the last look), then fences out the broker active before and resumes.
async fn recover(
    cfg: &BrokerConfig,
    store: &async_nats::Client,
    name: &str,
    reactor: &mut Reactor<BufferJournal>,
    tenancy_file: Option<String>,
) -> anyhow::Result<(journal::JetStreamJournal, lease::Lease)> {
    let holder = lease::Holder {
        broker: name.to_owned(),
        http: cfg.http.clone(),
        lease_ms: cfg.lease_ms.max(100),
    };
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
    let mut loaded = (records_in(&recovered.batches), recovered.batches.len());
    drop(recovered.batches);
    let load_ms = loading.elapsed().as_millis();
    let acquire = patiently("the lease", || {
        lease::Lease::acquire(store.clone(), &holder, cfg.replicas)
    });
    let lease = follow_until(acquire, &mut journal, reactor, &mut loaded).await?;
    tracing::info!("broker {name} is active");
    let taking_over = std::time::Instant::now();
    let late = journal.take_over(reactor.state().format()).await?;
    reactor.replay_batches(&late);
    if let Some((seq, reason)) = journal.unreadable() {
        tracing::error!("{}", journal::read_only(seq, reason));
        if tenancy_file.is_some() {
            tracing::warn!("the tenancy file is applied at a start with a readable journal");
        }
    } else {
        resume(reactor, &mut journal).await?;
        apply_tenancy_file(reactor, &mut journal, tenancy_file).await?;
    }
    say_recovered(reactor);
    tracing::info!(
        "recovered {} jobs and {} sites from {}{} journal records ({} batches) in {} ms",
        reactor.state().jobs().len(),
        reactor.state().sites().len(),
        if from_snapshot { "a snapshot and " } else { "" },
        loaded.0 + records_in(&late),
        loaded.1,
        load_ms + taking_over.elapsed().as_millis()
    );
    Ok((journal, lease))
}

/// Replays what other brokers journal until the lease is taken; `loaded` counts records and batches.
async fn follow_until(
    acquire: impl std::future::Future<Output = anyhow::Result<lease::Lease>>,
    journal: &mut journal::JetStreamJournal,
    reactor: &mut Reactor<BufferJournal>,
    loaded: &mut (usize, usize),
) -> anyhow::Result<lease::Lease> {
    tokio::pin!(acquire);
    let mut follow = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            lease = &mut acquire => return lease,
            _ = follow.tick() => match journal.catch_up().await {
                Ok(late) => {
                    reactor.replay_batches(&late);
                    loaded.0 += records_in(&late);
                    loaded.1 += late.len();
                }
                Err(e) => tracing::warn!("following the journal: {e:#}"),
            },
        }
    }
}

/// Logs the tenancy recovered, or why it could not be read.
fn say_recovered(reactor: &Reactor<BufferJournal>) {
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
}

/// The handle the API edges share, the reactor task's input, and the API tokens' watch.
async fn open_handle(
    cfg: &BrokerConfig,
    store: &async_nats::Client,
    client: async_nats::Client,
    tables: Tables,
    reactor: &Reactor<BufferJournal>,
) -> anyhow::Result<(
    BrokerHandle,
    mpsc::UnboundedReceiver<Input>,
    tokio::sync::watch::Sender<auth::Tokens>,
)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let archive = patiently("the archive", || {
        archive::Archive::open(store.clone(), cfg.replicas)
    })
    .await?;
    let audit = patiently("the audit", || {
        audit::Audit::open(store.clone(), cfg.replicas)
    })
    .await?;
    let (tokens_tx, tokens_rx) = tokio::sync::watch::channel(tokens_of(reactor));
    let rate = |per_s, burst| auth::Rate { per_s, burst };
    let auth = auth::Auth::new(
        cfg.insecure,
        cfg.admin_token.as_deref(),
        tokens_rx,
        rate(cfg.tenant_rate, cfg.tenant_burst),
        rate(cfg.site_rate, cfg.site_burst),
    );
    let traces = meridian_runtime::telemetry::Telemetry::from_env("meridian-broker")
        .map_err(anyhow::Error::msg)?
        .map(|t| {
            tracing::info!("exporting traces over OTLP/HTTP");
            std::sync::Arc::new(traces::Traces::new(t))
        });
    let handle = BrokerHandle {
        archive,
        tx,
        client,
        auth: std::sync::Arc::new(auth),
        audit,
        metrics: std::sync::Arc::new(metrics::Metrics::new()),
        traces,
        tables: std::sync::Arc::new(tables),
    };
    Ok((handle, rx, tokens_tx))
}

/// Listens to the sites and the NATS API, serves HTTP, and asks agents for their adverts (after a restart
/// the broker knows no sites).
async fn serve_edges(cfg: &BrokerConfig, handle: &BrokerHandle) -> anyhow::Result<()> {
    for topic in [
        SiteTopic::Advert,
        SiteTopic::Heartbeat,
        SiteTopic::Status,
        SiteTopic::Metrics,
    ] {
        spawn_site_listener(handle, topic).await?;
    }
    let api_sub = handle.client.subscribe(subjects::api::ALL).await?;
    tokio::spawn(api::nats::serve(handle.clone(), api_sub));
    let listener = tokio::net::TcpListener::bind(&cfg.http)
        .await
        .with_context(|| format!("binding the HTTP API to {}", cfg.http))?;
    let addr = listener.local_addr()?;
    let scheme = if cfg.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!("HTTP API on {scheme}://{addr}");
    if let Some(path) = &cfg.http_addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, addr.to_string())?;
        std::fs::rename(&tmp, path)?;
    }
    http::serve(listener, handle.clone(), cfg).await?;
    let hello = encode(&BrokerHello {
        v: WIRE_VERSION,
        sent_at_ms: now_ms(),
    })?;
    handle
        .client
        .publish(subjects::BROKER_HELLO, Bytes::from(hello))
        .await?;
    Ok(())
}

/// Renews the lease until a signal or the reactor task stops the broker, then hands it back.
async fn hold_lease(
    mut lease: lease::Lease,
    mut reactor_task: tokio::task::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut renew = tokio::time::interval(lease.lease / 3);
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
pub(super) async fn apply_tenancy_file(
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
pub(super) fn tokens_of(reactor: &Reactor<BufferJournal>) -> auth::Tokens {
    std::sync::Arc::new(reactor.state().tokens().clone())
}

pub(super) fn records_in(batches: &[meridian_core::durable::Batch]) -> usize {
    batches.iter().map(|b| b.records.len()).sum()
}

/// Retries a start-up step for a minute: a NATS cluster that has just started may not have elected its
/// JetStream leader yet.
pub(super) async fn patiently<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
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
