//! The broker's settings (`meridian broker`), the tables it reads at start (regions, round-trip times,
//! throughput), and the check that it runs secured.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use super::*;

/// Settings of `meridian broker`.
#[derive(clap::Args, Clone, Debug)]
pub struct BrokerConfig {
    /// NATS servers, their CA and this broker's identity.
    #[command(flatten)]
    pub access: meridian_runtime::access::Access,
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
    pub fn store_access(&self) -> meridian_runtime::access::Access {
        let mut a = self.access.clone();
        a.creds = self.store_creds.clone().or_else(|| {
            let creds = self.access.creds.as_ref()?;
            let name = self.access.identity()?;
            Some(creds.with_file_name(format!("{name}-store.nk")))
        });
        a
    }
}

pub(super) fn parse_region(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=FILE, got {s:?}"))?;
    meridian_federation::ids::check_id(name).map_err(|e| format!("region name {name:?} {e}"))?;
    Ok((name.to_owned(), PathBuf::from(path)))
}

/// The tables a broker is started with, as read from their files: what it parses for placement, and what a
/// capacity what-if is given with the sites (`HistoryView::federation`).
#[derive(Debug, Default)]
pub struct Tables {
    /// Residency regions: name → GeoJSON.
    pub regions: std::collections::BTreeMap<String, String>,
    /// The measured round-trip table (empty without one).
    pub rtt: RttTable,
    /// The relative-throughput table (TOML).
    pub throughput_toml: Option<String>,
}

impl Tables {
    pub(super) fn read(cfg: &BrokerConfig) -> anyhow::Result<Tables> {
        let read = |what: String, path: &std::path::Path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("reading {what} from {}", path.display()))
        };
        let mut regions = std::collections::BTreeMap::new();
        for (name, path) in &cfg.regions {
            regions.insert(name.clone(), read(format!("region {name}"), path)?);
        }
        let rtt = match cfg.rtt_table.as_deref() {
            None => RttTable::default(),
            Some(p) => RttTable::from_azure_csv(&read("the round-trip table".into(), p)?)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
        };
        Ok(Tables {
            regions,
            rtt,
            throughput_toml: cfg
                .throughput
                .as_deref()
                .map(|p| read("the throughput table".into(), p))
                .transpose()?,
        })
    }

    /// The measured round trips from or to one of these regions (what a what-if on these sites can ask).
    pub fn rtt_touching(
        &self,
        regions: &std::collections::BTreeSet<&str>,
    ) -> Vec<meridian_federation::RttView> {
        let mut out: Vec<meridian_federation::RttView> = self
            .rtt
            .entries()
            .filter(|(f, t, _)| regions.contains(f) || regions.contains(t))
            .map(|(f, t, ms)| meridian_federation::RttView {
                from: f.to_owned(),
                to: t.to_owned(),
                rtt_ms: ms,
            })
            .collect();
        out.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
        out
    }

    /// The residency regions, parsed.
    pub(super) fn regions(&self) -> anyhow::Result<Regions> {
        let mut regions = Regions::default();
        for (name, text) in &self.regions {
            let area = parse_geojson(text).map_err(|e| anyhow::anyhow!("region {name}: {e}"))?;
            regions.insert(name, area);
        }
        Ok(regions)
    }

    /// The throughput table, parsed (every model at 1.0 without one).
    pub(super) fn throughput(&self) -> anyhow::Result<meridian_core::throughput::Throughput> {
        match &self.throughput_toml {
            None => Ok(Default::default()),
            Some(text) => meridian_core::throughput::Throughput::from_toml(text)
                .map_err(|e| anyhow::anyhow!("the throughput table: {e}")),
        }
    }
}

/// What a broker needs to run secured, as one error naming everything missing.
pub(super) fn check_secured(cfg: &BrokerConfig) -> anyhow::Result<()> {
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
