//! `meridian bench adverts`: what a federation of many sites costs the broker in adverts and heartbeats.
//!
//! A local federation is started as `meridian up` starts it, secured (TLS with client certificates, an NKey per
//! process, permissions), with one real agent on the no-op executor. Then `sites` made-up sites (the synthetic
//! sites of `bench placement`: one or two GPU pools of 8-64 devices each) join through a few NATS connections,
//! as the leaf node of an edge region carries many sites over one link: each sends its advert, then a heartbeat
//! every `heartbeat_ms` and its advert again every `advert_ms` (an agent's defaults); each heartbeat period a
//! share `changing` of the sites take or free a device and advertise it at once, as an agent does (a new
//! generation, which the broker journals). The broker's CPU
//! share (user + system over wall time, from /proc) and resident memory are read over a window of `seconds`,
//! and in the same run, as the baseline, over the same window before the made-up sites joined. nats-server's
//! share is printed beside it.
//!
//! The made-up sites' connections use one bench identity, allowed to publish every site's advert and
//! heartbeat subjects and nothing else. `meridian creds` issues no such identity (a site's credential speaks
//! for its own site only); the bench writes it into the federation's authorization itself. At the end the
//! sites the broker holds up and lost are counted through the API: a broker that fell behind its heartbeats
//! would have lost sites.
#![allow(clippy::disallowed_methods)] // a benchmark: reads the clock

use super::queue::{cpu_s, rss};
use super::synthetic_advert;
use crate::sim::trace::SplitMix64;
use anyhow::Context;
use bytes::Bytes;
use meridian_broker::local::{LocalFederation, LocalOptions};
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{encode, Heartbeat, SiteAdvert, SiteState, WIRE_VERSION};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The identity the made-up sites' connections use.
const EDGE: &str = "bench-edge";

#[derive(Clone, Debug, clap::Args)]
pub struct AdvertsOptions {
    /// Made-up sites.
    #[arg(long, default_value_t = 10_000)]
    pub sites: usize,
    /// Seconds the broker's CPU and memory are measured over (and, before the sites join, the baseline).
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Each site's heartbeat period, ms.
    #[arg(long, default_value_t = 1_000)]
    pub heartbeat_ms: u64,
    /// Each site's period of full adverts sent even when nothing changed, ms (a multiple of the heartbeat
    /// period; an agent's default).
    #[arg(long, default_value_t = 60_000)]
    pub advert_ms: u64,
    /// Share of the sites that take or free a device in each heartbeat period, and advertise it at once.
    #[arg(long, default_value_t = 0.001)]
    pub changing: f64,
    /// NATS connections the made-up sites share.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Keep the run's folder (logs) here.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AdvertsFigures {
    pub sites: usize,
    pub connections: usize,
    pub seconds: u64,
    /// Sent by the made-up sites over the window, per second.
    pub heartbeats_per_s: f64,
    pub adverts_per_s: f64,
    /// Adverts that changed a site (journaled), per second.
    pub changed_adverts_per_s: f64,
    /// The broker's CPU time over the window's wall time (1.0 is one core).
    pub broker_cpu_share: f64,
    /// The same before the made-up sites joined (one real site): the baseline.
    pub broker_cpu_share_idle: f64,
    /// Broker CPU per message taken (adverts and heartbeats), over the idle baseline, µs.
    pub broker_cpu_us_per_message: f64,
    pub nats_cpu_share: f64,
    pub broker_rss_mib: f64,
    pub broker_rss_mib_idle: f64,
    /// Broker resident memory per made-up site, over the idle baseline, bytes.
    pub broker_rss_bytes_per_site: f64,
    /// From the first advert until the broker held every made-up site up, s.
    pub join_s: f64,
    /// Sites the broker held up, and lost, at the end (the real site included).
    pub sites_up: usize,
    pub sites_lost: usize,
}

/// Gives the bench identity a seed, a client certificate and its permissions in the servers' authorization
/// (applied at the next reload).
fn add_edge_identity(creds: &Path) -> anyhow::Result<()> {
    let pair = nkeys::KeyPair::new_user();
    let seed = pair
        .seed()
        .map_err(|e| anyhow::anyhow!("making an NKey: {e}"))?;
    let ca = meridian_broker::creds::pki::Pem {
        cert: std::fs::read_to_string(creds.join("ca.crt"))?,
        key: std::fs::read_to_string(creds.join("ca.key"))?,
    };
    let cert = meridian_broker::creds::pki::issue(
        &ca,
        EDGE,
        &[],
        meridian_broker::creds::pki::Usage::Client,
    )?;
    let users = creds.join("users");
    meridian_broker::creds::write_secret(&users.join(format!("{EDGE}.nk")), &format!("{seed}\n"))?;
    std::fs::write(users.join(format!("{EDGE}.crt")), &cert.cert)?;
    meridian_broker::creds::write_secret(&users.join(format!("{EDGE}.key")), &cert.key)?;
    let path = creds.join("authorization.conf");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let end = text
        .rfind("  ]\n}")
        .context("authorization.conf has no users list")?;
    let entry = format!(
        "    # bench {EDGE}: every site's adverts and heartbeats\n    {{ nkey: {:?}, permissions: {{ publish: {{ allow: [{:?}, {:?}] }}, subscribe: {{ allow: [{:?}] }} }} }}\n",
        pair.public_key(),
        subjects::all_sites(SiteTopic::Advert),
        subjects::all_sites(SiteTopic::Heartbeat),
        format!("{}.>", meridian_runtime::access::inbox_prefix(EDGE)),
    );
    std::fs::write(&path, format!("{}{entry}{}", &text[..end], &text[end..]))?;
    Ok(())
}

/// One made-up site: its advert as last sent, and its heartbeat count.
struct Made {
    advert: SiteAdvert,
    seq: u64,
}

impl Made {
    fn advert_body(&self) -> anyhow::Result<Bytes> {
        Ok(Bytes::from(encode(&self.advert)?))
    }

    fn heartbeat_body(&mut self, now_ms: u64) -> anyhow::Result<Bytes> {
        self.seq += 1;
        let h = Heartbeat {
            v: WIRE_VERSION,
            site: self.advert.site.id.clone(),
            seq: self.seq,
            sent_at_ms: now_ms,
            generation: self.advert.generation,
            running: Vec::new(),
            inventory: None,
        };
        Ok(Bytes::from(encode(&h)?))
    }

    /// A device taken or freed: a new generation.
    fn change(&mut self, rng: &mut SplitMix64) {
        if let Some(pool) = self.advert.pools.first_mut() {
            let n = pool.devices.len().max(1);
            if let Some(d) = pool.devices.get_mut((rng.next_u64() as usize) % n) {
                d.used_milli = 1000 - d.used_milli.min(1000);
            }
        }
        self.advert.generation += 1;
    }
}

#[derive(Default)]
struct Sent {
    heartbeats: AtomicU64,
    adverts: AtomicU64,
    changed: AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sends one connection's sites: their adverts at once, then each period a heartbeat from every site (spread
/// over the period in 20 steps), each after its advert where the site changed or, one site in `adverts_every`
/// each period, its full advert is due.
async fn run_sites(
    client: async_nats::Client,
    mut sites: Vec<Made>,
    opts: AdvertsOptions,
    sent: Arc<Sent>,
    seed: u64,
) -> anyhow::Result<()> {
    for s in &sites {
        client
            .publish(
                subjects::site(&s.advert.site.id, SiteTopic::Advert),
                s.advert_body()?,
            )
            .await?;
    }
    client.flush().await?;
    let mut rng = SplitMix64::new(seed);
    let adverts_every = (opts.advert_ms / opts.heartbeat_ms.max(1)).max(1) as usize;
    const STEPS: usize = 20;
    let mut tick = tokio::time::interval(Duration::from_millis(
        (opts.heartbeat_ms / STEPS as u64).max(1),
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let per_step = sites.len().div_ceil(STEPS);
    let mut period = 0usize;
    loop {
        for step in 0..STEPS {
            tick.tick().await;
            let now = now_ms();
            let from = (step * per_step).min(sites.len());
            let to = ((step + 1) * per_step).min(sites.len());
            for (j, s) in sites[from..to].iter_mut().enumerate() {
                let changed = rng.next_f64() < opts.changing;
                if changed {
                    s.change(&mut rng);
                    sent.changed.fetch_add(1, Ordering::Relaxed);
                }
                if changed || (from + j + period).is_multiple_of(adverts_every) {
                    client
                        .publish(
                            subjects::site(&s.advert.site.id, SiteTopic::Advert),
                            s.advert_body()?,
                        )
                        .await?;
                    sent.adverts.fetch_add(1, Ordering::Relaxed);
                }
                let heartbeat = s.heartbeat_body(now)?;
                client
                    .publish(
                        subjects::site(&s.advert.site.id, SiteTopic::Heartbeat),
                        heartbeat,
                    )
                    .await?;
                sent.heartbeats.fetch_add(1, Ordering::Relaxed);
            }
        }
        period += 1;
    }
}

/// Sites the broker holds in `state`, counted a page at a time.
async fn count(
    client: &meridian_broker::client::Client,
    state: SiteState,
) -> anyhow::Result<usize> {
    Ok(client.sites_in(Some(state)).await?.len())
}

pub async fn adverts(opts: AdvertsOptions) -> anyhow::Result<AdvertsFigures> {
    anyhow::ensure!(opts.sites > 0, "--sites must be at least 1");
    anyhow::ensure!(opts.connections > 0, "--connections must be at least 1");
    anyhow::ensure!(opts.heartbeat_ms > 0, "--heartbeat-ms must be at least 1");
    let tmp = tempfile::tempdir()?;
    let dir = opts.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let file = super::queue::write_federation(&dir, 8)?;
    let fed_opts = LocalOptions {
        heartbeat_ms: 1_000,
        agent_args: vec!["--executor".into(), "noop".into()],
        dir: Some(dir.join("run")),
        ..LocalOptions::default()
    };
    let mut fed = tokio::task::block_in_place(|| LocalFederation::start(&file, fed_opts))?;
    let creds = fed
        .security
        .as_ref()
        .map(|s| s.creds.clone())
        .context("the federation runs secured")?;
    add_edge_identity(&creds)?;
    tokio::task::block_in_place(|| fed.nats.reload())?;
    let client = meridian_broker::client::Client::of(&fed).await?;
    client
        .wait_for_sites(&fed, Duration::from_secs(60))
        .await
        .context("the real site did not come up")?;
    let broker = fed
        .brokers
        .first()
        .and_then(|b| b.proc.as_ref())
        .and_then(|p| p.pid())
        .context("no broker process")?;
    let nats = fed
        .nats
        .nodes
        .first()
        .and_then(|n| n.pid())
        .context("no nats-server process")?;

    // The baseline: the broker with its one real site.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (idle_cpu, idle_rss) = {
        let (c0, t0) = (cpu_s(broker), Instant::now());
        tokio::time::sleep(Duration::from_secs(opts.seconds)).await;
        (
            (cpu_s(broker) - c0) / t0.elapsed().as_secs_f64(),
            rss(broker) as f64,
        )
    };

    // The made-up sites join, then keep their heartbeats and adverts going.
    let mut rng = SplitMix64::new(7);
    let mut shares: Vec<Vec<Made>> = (0..opts.connections).map(|_| Vec::new()).collect();
    for i in 0..opts.sites {
        let mut advert = synthetic_advert(i, &mut rng);
        advert.site.id = meridian_federation::SiteId::new(format!("edge-{i:06}"))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        shares[i % opts.connections].push(Made { advert, seq: 0 });
    }
    let sent = Arc::new(Sent::default());
    let access = fed.access_as(EDGE);
    let mut senders = Vec::new();
    let joined_from = Instant::now();
    for (c, sites) in shares.into_iter().enumerate() {
        let conn = access
            .connect(format!("bench edge {c}"), Duration::from_secs(10))
            .await?;
        senders.push(tokio::spawn(run_sites(
            conn,
            sites,
            opts.clone(),
            sent.clone(),
            100 + c as u64,
        )));
    }
    let want = opts.sites + 1;
    let deadline = Instant::now() + Duration::from_secs(300);
    let join_s = loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(done) = senders.iter().find(|s| s.is_finished()) {
            let _ = done;
            break None;
        }
        let up = count(&client, SiteState::Up).await.unwrap_or(0);
        if up >= want {
            break Some(joined_from.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {up} of {want} sites came up in 300 s"
        );
    };
    let Some(join_s) = join_s else {
        for s in senders {
            s.await??;
        }
        anyhow::bail!("a connection of the made-up sites stopped");
    };

    // The window.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counts = |s: &Sent| {
        (
            s.heartbeats.load(Ordering::Relaxed),
            s.adverts.load(Ordering::Relaxed),
            s.changed.load(Ordering::Relaxed),
        )
    };
    let (h0, a0, x0) = counts(&sent);
    let (b0, n0, t0) = (cpu_s(broker), cpu_s(nats), Instant::now());
    tokio::time::sleep(Duration::from_secs(opts.seconds)).await;
    let wall = t0.elapsed().as_secs_f64();
    let (b1, n1) = (cpu_s(broker), cpu_s(nats));
    let (h1, a1, x1) = counts(&sent);
    let broker_rss = rss(broker) as f64;
    let sites_lost = count(&client, SiteState::Lost).await?;
    let sites_up = count(&client, SiteState::Up).await?;
    for s in &senders {
        s.abort();
    }
    let per_s = |a: u64, b: u64| ((b - a) as f64 / wall * 10.0).round() / 10.0;
    let broker_cpu_share = (b1 - b0) / wall;
    let messages = (h1 - h0 + a1 - a0) as f64;
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let mib = |b: f64| (b / 1048576.0 * 10.0).round() / 10.0;
    let figures = AdvertsFigures {
        sites: opts.sites,
        connections: opts.connections,
        seconds: opts.seconds,
        heartbeats_per_s: per_s(h0, h1),
        adverts_per_s: per_s(a0, a1),
        changed_adverts_per_s: per_s(x0, x1),
        broker_cpu_share: r3(broker_cpu_share),
        broker_cpu_share_idle: r3(idle_cpu),
        broker_cpu_us_per_message: if messages > 0.0 {
            (((broker_cpu_share - idle_cpu).max(0.0) * wall / messages) * 1e6 * 100.0).round()
                / 100.0
        } else {
            0.0
        },
        nats_cpu_share: r3((n1 - n0) / wall),
        broker_rss_mib: mib(broker_rss),
        broker_rss_mib_idle: mib(idle_rss),
        broker_rss_bytes_per_site: ((broker_rss - idle_rss).max(0.0) / opts.sites as f64).round(),
        join_s: (join_s * 10.0).round() / 10.0,
        sites_up,
        sites_lost,
    };
    tokio::task::block_in_place(|| drop(fed));
    Ok(figures)
}
