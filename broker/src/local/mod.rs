//! A local federation on loopback: NATS (one server, or a three-node cluster with a leaf node per edge site),
//! the broker (and a standby), and one `meridian-agent` per site, each a real process in its own process group
//! that is killed when dropped. `meridian up`, `meridian demo`, the benchmarks and the e2e tests all start
//! federations through here.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

pub mod nats;
pub mod process;
pub mod proxy;

use anyhow::{bail, Context};
pub use nats::{Nats, NatsServer};
pub use process::{find_nats_server, resolve, sibling_binary, workspace_root, Managed};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A federation file: the broker's settings and the sites to run. Paths are relative to the file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederationFile {
    #[serde(default)]
    pub broker: BrokerSection,
    /// Site files.
    pub sites: Vec<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerSection {
    /// Residency regions: name → GeoJSON file.
    #[serde(default)]
    pub regions: std::collections::BTreeMap<String, PathBuf>,
    /// Measured round-trip table, relative to the data folder (used when present).
    #[serde(default)]
    pub rtt_table: Option<PathBuf>,
    /// Relative-throughput table, relative to the federation file.
    #[serde(default)]
    pub throughput: Option<PathBuf>,
    /// Queues, quotas and priority classes, relative to the federation file.
    #[serde(default)]
    pub tenancy: Option<PathBuf>,
    #[serde(default)]
    pub site_lost_after_ms: Option<u64>,
    #[serde(default)]
    pub offer_timeout_ms: Option<u64>,
    /// How long finished jobs stay live before they move to the archive, ms.
    #[serde(default)]
    pub retention_ms: Option<u64>,
}

impl FederationFile {
    /// Reads a federation file's text (paths in it stay relative).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(toml::from_str(text)?)
    }

    pub fn load(path: &Path) -> anyhow::Result<(Self, PathBuf)> {
        let path = &process::resolve(path);
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file = Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok((file, base))
    }
}

/// How NATS is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    /// One nats-server with JetStream.
    #[default]
    Single,
    /// Three clustered nats-servers (JetStream replicas 3); each edge site's agent talks to its own leaf node.
    Cluster,
}

/// Options of a local federation beyond the file (the command line sets the topology and the standby).
#[derive(Clone, Debug, clap::Args)]
pub struct LocalOptions {
    /// Heartbeat period of the agents, ms.
    #[arg(skip = 500u64)]
    pub heartbeat_ms: u64,
    /// Extra arguments for the broker.
    #[arg(skip)]
    pub broker_args: Vec<String>,
    /// Extra arguments for every agent.
    #[arg(skip)]
    pub agent_args: Vec<String>,
    /// Keep the federation's logs, credentials and state in this folder after it stops; started again with the
    /// same folder and federation file, it resumes (the same credentials, token, jobs and journal). A folder of
    /// other files, or another federation's, is refused. Without it they go in a temporary folder, removed at
    /// exit.
    #[arg(long = "state-dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// `cluster`: three clustered nats-servers (JetStream replicas 3), edge sites on leaf nodes, and a standby
    /// broker.
    #[arg(long, value_enum, default_value_t = Topology::Single)]
    pub topology: Topology,
    /// Also start a standby broker (implied by `--topology cluster`).
    #[arg(long)]
    pub standby: bool,
    /// Run without TLS, NATS credentials and API tokens: for measuring what security costs, never for use.
    #[arg(long)]
    pub insecure: bool,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            heartbeat_ms: 500,
            broker_args: Vec::new(),
            agent_args: Vec::new(),
            dir: None,
            topology: Topology::Single,
            standby: false,
            insecure: false,
        }
    }
}

/// One broker process slot: the first writes `broker.log` and `broker.addr`, the second `broker-2.*`.
#[derive(Debug)]
pub struct BrokerSlot {
    pub name: String,
    pub proc: Option<Managed>,
    log: PathBuf,
    addr: PathBuf,
}

/// A site's agent.
#[derive(Debug)]
pub struct AgentProc {
    pub id: String,
    pub file: PathBuf,
    /// The NATS URL(s) it talks to: the cluster, or its own leaf node.
    pub nats: String,
    pub proc: Managed,
}

/// How a local federation is secured: its credentials folder and the administrator's API token.
#[derive(Clone, Debug)]
pub struct LocalSecurity {
    /// The credentials folder (`meridian creds`): CA, server certificate, every identity.
    pub creds: PathBuf,
    /// The administrator's API token of this federation (made for it, printed by `meridian up`).
    pub token: String,
}

/// The identity a local federation makes for its operator's commands.
pub const OPERATOR: &str = "operator";

/// A running local federation.
#[derive(Debug)]
pub struct LocalFederation {
    pub nats: Nats,
    /// TLS, identities and the administrator's token; `None` when started `insecure`.
    pub security: Option<LocalSecurity>,
    pub brokers: Vec<BrokerSlot>,
    pub agents: Vec<AgentProc>,
    /// The federation's HTTP API: a stable address that reaches whichever broker serves it now.
    pub http: String,
    relay: Option<proxy::Relay>,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    agent_bin: PathBuf,
    heartbeat_ms: u64,
    agent_args: Vec<String>,
    /// The broker's program and arguments (without name and address file), to start it again.
    broker_cmd: (PathBuf, Vec<std::ffi::OsString>),
    /// Started from the state a federation of the same file left in its folder (`--state-dir`): the same
    /// credentials, token, journal and archive.
    pub resumed: bool,
}

impl Drop for LocalFederation {
    /// Stops the agents (their jobs would wait for a restarted agent), then every job they left, at once: a
    /// local federation that stops leaves no process behind.
    /// A federation dropped while its thread panics (a failed test) keeps its folder, logs and state.
    fn drop(&mut self) {
        for a in &mut self.agents {
            a.proc.stop(std::time::Duration::from_millis(500));
        }
        self.stop_jobs();
        if std::thread::panicking() {
            if let Some(tmp) = self._tmp.take() {
                let kept = tmp.keep();
                eprintln!("federation folder kept: {}", kept.display());
            }
        }
    }
}

impl LocalFederation {
    /// Kills every job the agents left running (their process groups and shims).
    pub fn stop_jobs(&self) {
        for a in &self.agents {
            let run = self.dir.join("agents").join(&a.id).join("run");
            let Ok(entries) = std::fs::read_dir(&run) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().and_then(|x| x.to_str()) == Some("pgid") {
                    meridian_adapters::local::kill_now(&p);
                }
            }
        }
    }

    pub fn start(file: &Path, opts: LocalOptions) -> anyhow::Result<Self> {
        let (fed, base) = FederationFile::load(file)?;
        let (tmp, dir, resumed) = match &opts.dir {
            Some(d) => {
                let resumed = usable_state_dir(d, &process::resolve(file))?;
                (None, d.clone(), resumed)
            }
            None => {
                let t = tempfile::Builder::new().prefix("meridian-").tempdir()?;
                let d = t.path().to_path_buf();
                (Some(t), d, false)
            }
        };
        let standby = opts.standby || opts.topology == Topology::Cluster;
        let brokers = if standby { 2 } else { 1 };
        let security = if opts.insecure {
            None
        } else {
            Some(secure(&dir, &fed, &base, brokers)?)
        };
        let nats_security = security.as_ref().map(|s| nats::Security {
            creds: s.creds.clone(),
        });
        let nats = match opts.topology {
            Topology::Single => Nats::single(&dir.join("nats"), nats_security)?,
            Topology::Cluster => Nats::cluster(&dir.join("nats"), nats_security)?,
        };
        let meridian = std::env::current_exe()
            .ok()
            .filter(|p| p.file_name().is_some_and(|n| n == "meridian"))
            .map(Ok)
            .unwrap_or_else(|| sibling_binary("meridian"))?;
        let agent_bin = sibling_binary("meridian-agent")?;
        let mut args: Vec<std::ffi::OsString> =
            vec!["broker".into(), "--nats".into(), nats.urls().into()];
        args.extend(["--http".into(), "127.0.0.1:0".into()]);
        if let Some(s) = &security {
            let reg = crate::creds::Registry::open(&s.creds)?;
            args.extend(["--ca".into(), reg.ca().into_os_string()]);
            args.extend(["--tls-cert".into(), reg.server_cert().into_os_string()]);
            args.extend(["--tls-key".into(), reg.server_key().into_os_string()]);
        } else {
            args.push("--insecure".into());
        }
        args.extend(["--replicas".into(), nats.replicas().to_string().into()]);
        for (name, path) in &fed.broker.regions {
            args.push("--region".into());
            args.push(format!("{name}={}", base.join(path).display()).into());
        }
        if let Some(rtt) = &fed.broker.rtt_table {
            if let Some(p) = crate::data::data_file(rtt)? {
                args.extend(["--rtt-table".into(), p.into_os_string()]);
            }
        }
        if let Some(t) = &fed.broker.throughput {
            args.extend(["--throughput".into(), base.join(t).into_os_string()]);
        }
        if let Some(t) = &fed.broker.tenancy {
            args.extend(["--tenancy".into(), base.join(t).into_os_string()]);
        }
        if let Some(ms) = fed.broker.site_lost_after_ms {
            args.extend(["--site-lost-after-ms".into(), ms.to_string().into()]);
        }
        if let Some(ms) = fed.broker.offer_timeout_ms {
            args.extend(["--offer-timeout-ms".into(), ms.to_string().into()]);
        }
        if let Some(ms) = fed.broker.retention_ms {
            args.extend(["--retention-ms".into(), ms.to_string().into()]);
        }
        args.extend(opts.broker_args.iter().map(Into::into));
        let brokers = (1..=brokers)
            .map(|n| {
                let stem = if n == 1 {
                    "broker".to_owned()
                } else {
                    format!("broker-{n}")
                };
                BrokerSlot {
                    name: format!("broker-{n}"),
                    proc: None,
                    log: dir.join(format!("{stem}.log")),
                    addr: dir.join(format!("{stem}.addr")),
                }
            })
            .collect();
        let mut this = LocalFederation {
            nats,
            security,
            brokers,
            agents: Vec::new(),
            http: String::new(),
            relay: None,
            dir: dir.clone(),
            _tmp: tmp,
            agent_bin,
            heartbeat_ms: opts.heartbeat_ms,
            agent_args: opts.agent_args.clone(),
            broker_cmd: (meridian, args),
            resumed,
        };
        this.start_broker(0)?;
        this.wait_for_broker()?;
        let relay = proxy::Relay::start(this.brokers.iter().map(|b| b.addr.clone()).collect())?;
        let scheme = if this.security.is_some() {
            "https"
        } else {
            "http"
        };
        this.http = format!("{scheme}://{}", relay.addr);
        this.relay = Some(relay);
        // The standby starts once the first is active, so the first is the one that starts active.
        for slot in 1..this.brokers.len() {
            this.start_broker(slot)?;
        }
        for (id, path, edge) in site_ids(&fed, &base)? {
            let url = if edge && this.nats.is_cluster() {
                this.nats.add_leaf(&id)?
            } else {
                this.nats.urls()
            };
            let proc = this.spawn_agent(&id, &path, &url)?;
            this.agents.push(AgentProc {
                id,
                file: path,
                nats: url,
                proc,
            });
        }
        Ok(this)
    }

    /// The URL(s) clients use.
    pub fn nats_url(&self) -> String {
        self.nats.urls()
    }

    /// How `identity` reaches this federation's NATS (the cluster's nodes).
    pub fn access_as(&self, identity: &str) -> meridian_runtime::access::Access {
        let mut a = meridian_runtime::access::Access::plain(self.nats.urls());
        if let Some(s) = &self.security {
            a.ca = Some(s.creds.join("ca.crt"));
            a.creds = Some(s.creds.join("users").join(format!("{identity}.nk")));
        }
        a
    }

    /// How the operator's commands reach this federation.
    pub fn access(&self) -> meridian_runtime::access::Access {
        self.access_as(OPERATOR)
    }

    /// The administrator's API token (`None` when insecure).
    pub fn token(&self) -> Option<&str> {
        self.security.as_ref().map(|s| s.token.as_str())
    }

    /// The dashboard's sign-in address: the page takes the administrator's token from the address's fragment
    /// (never sent to the server), signs in with it and drops it from the address bar. With the export lines,
    /// the only places the token is printed.
    /// Whether the federation's folder outlives it (`--state-dir`), or is a temporary one removed at exit.
    pub fn keeps_dir(&self) -> bool {
        self._tmp.is_none()
    }

    pub fn dashboard_address(&self) -> String {
        match self.token() {
            Some(t) => format!("{}/#token={t}", self.http),
            None => format!("{}/", self.http),
        }
    }

    /// The shell lines that give another shell this federation's access (with the dashboard's address, the
    /// only places its token is printed).
    pub fn exports(&self) -> Vec<String> {
        let a = self.access();
        let mut lines = vec![format!("export MERIDIAN_NATS={}", a.nats)];
        if let (Some(ca), Some(creds), Some(token)) = (&a.ca, &a.creds, self.token()) {
            lines.push(format!("export MERIDIAN_CA={}", ca.display()));
            lines.push(format!("export MERIDIAN_CREDS={}", creds.display()));
            lines.push(format!("export MERIDIAN_TOKEN={token}"));
        }
        lines
    }

    /// Revokes an identity: the servers reload, and its connections are closed.
    pub fn revoke_identity(&mut self, name: &str) -> anyhow::Result<()> {
        let Some(s) = &self.security else {
            bail!("an insecure federation has no identities");
        };
        crate::creds::Registry::open(&s.creds)?.revoke(name)?;
        self.nats.reload()
    }

    /// Starts the broker of a slot (it becomes active or waits as a standby).
    pub fn start_broker(&mut self, slot: usize) -> anyhow::Result<()> {
        let b = &mut self.brokers[slot];
        let _ = std::fs::remove_file(&b.addr);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&b.log)?;
        let mut cmd = Command::new(&self.broker_cmd.0);
        cmd.args(&self.broker_cmd.1)
            .args(["--name", &b.name])
            .arg("--http-addr-file")
            .arg(&b.addr)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        if let Some(s) = &self.security {
            // Each broker has its own identity; the token goes by the environment, never the command line.
            cmd.arg("--creds")
                .arg(s.creds.join("users").join(format!("{}.nk", b.name)))
                .env("MERIDIAN_ADMIN_TOKEN", &s.token);
        }
        b.proc = Some(Managed::spawn(&b.name, &mut cmd)?);
        Ok(())
    }

    /// The slot of the broker that is active now (alive, and has opened its HTTP API).
    pub fn active_broker(&mut self) -> Option<usize> {
        self.brokers
            .iter_mut()
            .position(|b| b.addr.exists() && b.proc.as_mut().is_some_and(Managed::alive))
    }

    /// Kills a broker with SIGKILL, as a crash would.
    pub fn kill_broker(&mut self, slot: usize) {
        let b = &mut self.brokers[slot];
        if let Some(mut p) = b.proc.take() {
            p.kill9();
        }
        let _ = std::fs::remove_file(&b.addr);
    }

    /// Waits until a broker is active; returns the URL of its own API (the federation's stable one is
    /// [`Self::http`]).
    pub fn wait_for_broker(&mut self) -> anyhow::Result<String> {
        // (A broker recovering a million jobs takes a while.)
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(slot) = self.active_broker() {
                let addr = std::fs::read_to_string(&self.brokers[slot].addr)?;
                return Ok(format!("http://{}", addr.trim()));
            }
            let running = self
                .brokers
                .iter_mut()
                .any(|b| b.proc.as_mut().is_some_and(Managed::alive));
            if Instant::now() > deadline || !running {
                bail!(
                    "no broker became active; see {}",
                    self.dir.join("broker.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the active broker with SIGKILL, as a crash would, and starts it again with the same settings; it
    /// (or the standby) recovers the state from the journal.
    pub fn restart_broker(&mut self) -> anyhow::Result<()> {
        let slot = self.active_broker().unwrap_or(0);
        self.kill_broker(slot);
        self.start_broker(slot)?;
        self.wait_for_broker()?;
        Ok(())
    }

    /// Every broker's log, concatenated.
    pub fn broker_logs(&self) -> String {
        self.brokers
            .iter()
            .map(|b| std::fs::read_to_string(&b.log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The last `lines` lines of every broker's and agent's log, each under its file's name: what a failed
    /// test prints, so that a run whose folder is gone still says what happened.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut files: Vec<PathBuf> = self.brokers.iter().map(|b| b.log.clone()).collect();
        files.extend(
            self.agents
                .iter()
                .map(|a| self.dir.join(format!("agent-{}.log", a.id))),
        );
        let mut out = String::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            out.push_str(&format!(
                "--- {} (last {} lines)\n",
                f.display(),
                tail.len()
            ));
            for l in tail {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    fn spawn_agent(&self, id: &str, path: &Path, nats: &str) -> anyhow::Result<Managed> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("agent-{id}.log")))?;
        let mut cmd = Command::new(&self.agent_bin);
        cmd.arg("--config")
            .arg(path)
            .args(["--nats", nats])
            .arg("--work-dir")
            .arg(self.dir.join("agents").join(id))
            .args(&self.agent_args)
            .env("MERIDIAN_HEARTBEAT_MS", self.heartbeat_ms.to_string())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        if let Some(s) = &self.security {
            cmd.arg("--ca")
                .arg(s.creds.join("ca.crt"))
                .arg("--creds")
                .arg(s.creds.join("users").join(format!("{id}.nk")));
        }
        Managed::spawn(&format!("agent {id}"), &mut cmd)
    }

    /// Kills an agent with SIGKILL, as a crash would.
    pub fn kill_agent(&mut self, id: &str) {
        if let Some(a) = self.agents.iter_mut().find(|a| a.id == id) {
            a.proc.kill9();
        }
    }

    /// Stops an agent as a supervisor would (SIGTERM to its process group; SIGKILL after 5 s).
    pub fn stop_agent(&mut self, id: &str) {
        if let Some(a) = self.agents.iter_mut().find(|a| a.id == id) {
            a.proc.stop(Duration::from_secs(5));
        }
    }

    /// Starts a killed agent again with the same site file, NATS server and work folder.
    pub fn restart_agent(&mut self, id: &str) -> anyhow::Result<()> {
        let Some(i) = self.agents.iter().position(|a| a.id == id) else {
            bail!("no site {id}");
        };
        let a = &self.agents[i];
        let proc = self.spawn_agent(id, &a.file.clone(), &a.nats.clone())?;
        self.agents[i].proc = proc;
        Ok(())
    }

    pub fn site_ids(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.id.clone()).collect()
    }
}

/// One secured nats-server (TLS, identities, JetStream encrypted) with a broker identity, for tests of the
/// broker's JetStream parts; returns it and the access of the broker's storage identity.
/// The file in a state folder that names the federation file it holds the state of.
const STATE_MARK: &str = "federation.path";

/// A folder a federation's files may go in, and whether a federation that ran before is resumed from it: made
/// if absent; an empty one starts afresh; one a federation of `file` left (its credentials, journal, logs) is
/// resumed; anything else is refused rather than written over — a folder of other files, or the state of
/// another federation file.
fn usable_state_dir(d: &Path, file: &Path) -> anyhow::Result<bool> {
    std::fs::create_dir_all(d)
        .with_context(|| format!("making the state folder {}", d.display()))?;
    let mut entries = std::fs::read_dir(d)
        .with_context(|| format!("reading the state folder {}", d.display()))?;
    let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let mark = d.join(STATE_MARK);
    if entries.next().is_none() {
        std::fs::write(&mark, file.as_os_str().as_encoded_bytes())
            .with_context(|| format!("writing {}", mark.display()))?;
        return Ok(false);
    }
    let Ok(was) = std::fs::read(&mark) else {
        anyhow::bail!(
            "the state folder {} holds files that are not a local federation's: give an empty or new folder",
            d.display()
        );
    };
    if was != file.as_os_str().as_encoded_bytes() {
        anyhow::bail!(
            "the state folder {} holds the federation of {}, not of {}: give that file to resume it, or a new folder",
            d.display(),
            String::from_utf8_lossy(&was),
            file.display()
        );
    }
    Ok(true)
}

pub fn secured_nats(dir: &Path) -> anyhow::Result<(Nats, meridian_runtime::access::Access)> {
    let mut reg =
        crate::creds::Registry::init(&dir.join("creds"), "test", &["127.0.0.1".to_owned()])?;
    reg.add(crate::creds::Kind::Broker, "broker-1")?;
    // JetStream is reached only by a broker's storage identity.
    let creds = reg.creds(&crate::creds::store_name("broker-1"));
    let nats = Nats::single(
        &dir.join("nats"),
        Some(nats::Security {
            creds: reg.dir().to_path_buf(),
        }),
    )?;
    let access = meridian_runtime::access::Access {
        nats: nats.urls(),
        ca: Some(reg.ca()),
        creds: Some(creds),
    };
    Ok((nats, access))
}

/// The ids of the sites a federation file lists.
fn site_ids(fed: &FederationFile, base: &Path) -> anyhow::Result<Vec<(String, PathBuf, bool)>> {
    let mut out = Vec::new();
    for site in &fed.sites {
        let path = base.join(site);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let table = toml::from_str::<toml::Table>(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let id = table
            .get("id")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .with_context(|| format!("{}: no site id", path.display()))?;
        let edge = table.get("kind").and_then(|v| v.as_str()) == Some("edge");
        out.push((id, path, edge));
    }
    Ok(out)
}

/// Makes a local federation's credentials: a CA and server certificate for loopback, one identity per broker
/// and site and one for the operator, and the administrator's API token.
fn secure(
    dir: &Path,
    fed: &FederationFile,
    base: &Path,
    brokers: usize,
) -> anyhow::Result<LocalSecurity> {
    use crate::creds::{Kind, Registry};
    let creds = dir.join("creds");
    let hosts = ["127.0.0.1".to_owned(), "localhost".to_owned()];
    let mut reg = if creds.join("identities.json").exists() {
        Registry::open(&creds)?
    } else {
        Registry::init(&creds, "local", &hosts)?
    };
    let mut want: Vec<(Kind, String)> = (1..=brokers)
        .map(|n| (Kind::Broker, format!("broker-{n}")))
        .collect();
    want.extend(
        site_ids(fed, base)?
            .into_iter()
            .map(|(id, _, _)| (Kind::Site, id)),
    );
    want.push((Kind::Client, OPERATOR.to_owned()));
    for (kind, name) in want {
        if reg.get(&name).is_none_or(|i| i.revoked_ms.is_some()) {
            reg.add(kind, &name)?;
        }
    }
    reg.ensure_stores()?;
    let token_file = reg.dir().join("admin.token");
    let token = match std::fs::read_to_string(&token_file) {
        Ok(t) => t.trim().to_owned(),
        Err(_) => {
            let t = crate::creds::random_hex()?;
            crate::creds::write_secret(&token_file, &t)?;
            t
        }
    };
    Ok(LocalSecurity {
        creds: reg.dir().to_path_buf(),
        token,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::usable_state_dir;

    #[test]
    fn a_state_folder_is_made_resumed_by_its_federation_and_refused_to_any_other() {
        let t = tempfile::tempdir().unwrap();
        let (file, other) = (t.path().join("fed.toml"), t.path().join("other.toml"));
        std::fs::write(&file, "").unwrap();
        std::fs::write(&other, "").unwrap();
        let new = t.path().join("a/b");
        assert!(
            !usable_state_dir(&new, &file).unwrap(),
            "a new folder starts afresh"
        );
        assert!(new.is_dir());
        std::fs::write(new.join("broker.log"), "").unwrap();
        assert!(
            usable_state_dir(&new, &file).unwrap(),
            "the same federation resumes"
        );
        let e = usable_state_dir(&new, &other).unwrap_err().to_string();
        assert!(
            e.contains("holds the federation of") && e.contains("new folder"),
            "{e}"
        );
        let stranger = t.path().join("c");
        std::fs::create_dir_all(&stranger).unwrap();
        std::fs::write(stranger.join("notes.txt"), "mine").unwrap();
        let e = usable_state_dir(&stranger, &file).unwrap_err().to_string();
        assert!(e.contains("not a local federation's"), "{e}");
        assert_eq!(
            std::fs::read_to_string(stranger.join("notes.txt")).unwrap(),
            "mine"
        );
    }
}
