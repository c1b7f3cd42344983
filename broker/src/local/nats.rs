//! nats-server processes for a local federation: one server with JetStream, or a three-node cluster (JetStream
//! replicated three ways) with a leaf node per edge site, as an edge room behind NAT would join.
//!
//! Each server writes its configuration file under its own folder. A server picks its own client port
//! (`listen: 127.0.0.1:-1`, read back from its ports file) so that parallel runs never race for it. Route and
//! leaf-node ports must be known before the nodes start (a JetStream cluster needs its routes configured), so
//! those are taken from the kernel's free ports just before and the start is retried on a clash. A restarted
//! server keeps all its ports.
//!
//! Secured (the default of `meridian up`, the demo and the tests), every listener speaks TLS with client
//! certificates verified against the federation's CA, clients authenticate with the NKeys of a credentials
//! folder (`meridian creds`) whose permissions confine each identity, cluster routes and leaf connections use
//! TLS, each leaf node connects with its site's own credential, and JetStream is encrypted at rest.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use super::process::{find_nats_server, Managed};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The part a server plays.
#[derive(Clone, Debug)]
pub enum Role {
    /// One server with JetStream.
    Single,
    /// A cluster node with JetStream: its route and leaf-node ports, and every node's route port.
    Node {
        name: String,
        route: u16,
        leaf: u16,
        routes: Vec<u16>,
    },
    /// A leaf node without JetStream, connecting to the cluster's leaf-node ports, for one site.
    Leaf {
        name: String,
        site: String,
        hubs: Vec<u16>,
    },
}

/// How the servers are secured: the credentials folder made by `meridian creds` (see the module's text).
#[derive(Clone, Debug)]
pub struct Security {
    pub creds: PathBuf,
}

/// A nats-server process.
#[derive(Debug)]
pub struct NatsServer {
    pub url: String,
    pub port: u16,
    pub role: Role,
    dir: PathBuf,
    security: Option<Security>,
    proc: Option<Managed>,
}

impl NatsServer {
    /// Starts a single server that picks its own port, storing JetStream data under `dir`.
    pub fn start(dir: &Path, security: Option<&Security>) -> anyhow::Result<Self> {
        Self::launch(dir, Role::Single, None, security)
    }

    pub fn launch(
        dir: &Path,
        role: Role,
        port: Option<u16>,
        security: Option<&Security>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let bin = find_nats_server()?;
        let ports_dir = dir.join("ports");
        let _ = std::fs::remove_dir_all(&ports_dir);
        std::fs::create_dir_all(&ports_dir)?;
        let conf = dir.join("nats-server.conf");
        crate::creds::write_secret(&conf, &config(dir, &role, port, security)?)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("nats-server.log"))?;
        let mut proc = Managed::spawn(
            "nats-server",
            Command::new(&bin)
                .arg("-c")
                .arg(&conf)
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
                    role,
                    dir: dir.to_path_buf(),
                    security: security.cloned(),
                    proc: Some(proc),
                });
            }
            if Instant::now() > deadline || !proc.alive() {
                let log = std::fs::read_to_string(dir.join("nats-server.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                bail!(
                    "nats-server did not start ({}); its log ends:\n{}",
                    dir.join("nats-server.log").display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
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

    /// The server's process id, while it runs (what `meridian creds … --reload PID` signals).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Managed::pid)
    }

    pub fn alive(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Managed::alive)
    }

    /// Starts it again with the same ports and store.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let again = Self::launch(
            &self.dir,
            self.role.clone(),
            Some(self.port),
            self.security.as_ref(),
        )?;
        *self = again;
        Ok(())
    }

    /// Writes its configuration again (the identities may have changed) and has it reload (SIGHUP): a revoked
    /// identity's connections are closed.
    pub fn reload(&mut self) -> anyhow::Result<()> {
        let text = config(
            &self.dir,
            &self.role,
            Some(self.port),
            self.security.as_ref(),
        )?;
        crate::creds::write_secret(&self.dir.join("nats-server.conf"), &text)?;
        if let Some(pid) = self.proc.as_ref().and_then(Managed::pid) {
            crate::creds::reload(&[pid as i32])?;
        }
        Ok(())
    }
}

fn config(
    dir: &Path,
    role: &Role,
    port: Option<u16>,
    security: Option<&Security>,
) -> anyhow::Result<String> {
    use crate::creds::server;
    let port = port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
    let store = dir.join("jetstream");
    let mut c = format!("listen: \"127.0.0.1:{port}\"\n");
    let reg = security
        .map(|s| crate::creds::Registry::open(&s.creds))
        .transpose()?;
    // TLS on a listener, the identities that may connect, and JetStream's key, when secured.
    let tls = reg
        .as_ref()
        .map(|r| format!(", {}", server::tls_block(r.dir())))
        .unwrap_or_default();
    let cipher = match &reg {
        Some(r) => format!(", {}", server::cipher(&r.jetstream_key()?)),
        None => String::new(),
    };
    if let Some(r) = &reg {
        c += &format!("{}\n", server::tls_block(r.dir()));
        if !matches!(role, Role::Leaf { .. }) {
            // Included, so that a reload reads the identities `meridian creds add|revoke` wrote.
            c += &server::include(&dir.canonicalize()?, &r.authorization());
        }
    }
    let url = |scheme: &str, p: &u16| format!("\"{scheme}://127.0.0.1:{p}\"");
    match role {
        Role::Single => {
            c += &format!(
                "jetstream {{ store_dir: {:?}{cipher} }}\n",
                store.display().to_string()
            );
        }
        Role::Node {
            name,
            route,
            leaf,
            routes,
        } => {
            let routes: Vec<String> = routes.iter().map(|p| url("nats-route", p)).collect();
            c += &format!(
                "server_name: {name:?}\n\
                 jetstream {{ store_dir: {:?}{cipher} }}\n\
                 cluster {{ name: \"meridian\", listen: \"127.0.0.1:{route}\", routes: [{}]{tls} }}\n\
                 leafnodes {{ listen: \"127.0.0.1:{leaf}\"{tls} }}\n",
                store.display().to_string(),
                routes.join(", ")
            );
        }
        Role::Leaf { name, site, hubs } => {
            let hubs: Vec<String> = hubs.iter().map(|p| url("nats-leaf", p)).collect();
            // Secured, the leaf lets in only its site's agent, and joins the cluster as that site.
            let remote = match &reg {
                Some(r) => {
                    let seed = meridian_runtime::access::read_seed(&r.creds(site))?;
                    let me: Vec<_> = r
                        .identities()
                        .iter()
                        .filter(|i| &i.name == site)
                        .cloned()
                        .collect();
                    c += &server::authorization_for(&me, r.identities());
                    format!(
                        ", nkey: {seed:?}, {}",
                        server::remote_tls_block(r.dir(), site)
                    )
                }
                None => String::new(),
            };
            c += &format!(
                "server_name: {name:?}\nleafnodes {{ remotes: [ {{ urls: [{}]{remote} }} ] }}\n",
                hubs.join(", ")
            );
        }
    }
    Ok(c)
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

/// A port the kernel reports free on loopback now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The NATS servers of a local federation: one server, or a three-node cluster with JetStream and a leaf node
/// per edge site.
#[derive(Debug)]
pub struct Nats {
    pub nodes: Vec<NatsServer>,
    /// (site id, its leaf node).
    pub leaves: Vec<(String, NatsServer)>,
    dir: PathBuf,
    security: Option<Security>,
}

impl Nats {
    pub const NODES: usize = 3;

    pub fn single(dir: &Path, security: Option<Security>) -> anyhow::Result<Self> {
        Ok(Nats {
            nodes: vec![NatsServer::start(dir, security.as_ref())?],
            leaves: Vec::new(),
            dir: dir.to_path_buf(),
            security,
        })
    }

    /// Has every server reload its configuration (after identities changed).
    pub fn reload(&mut self) -> anyhow::Result<()> {
        for n in &mut self.nodes {
            n.reload()?;
        }
        Ok(())
    }

    pub fn is_cluster(&self) -> bool {
        self.nodes.len() > 1
    }

    /// JetStream copies the journal should keep: one per node.
    pub fn replicas(&self) -> usize {
        self.nodes.len()
    }

    pub fn cluster(dir: &Path, security: Option<Security>) -> anyhow::Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(dir, security.as_ref()) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no cluster")))
    }

    fn try_start(dir: &Path, security: Option<&Security>) -> anyhow::Result<Self> {
        let mut ports = Vec::new();
        while ports.len() < 2 * Self::NODES {
            let p = free_port()?;
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let routes: Vec<u16> = ports[..Self::NODES].to_vec();
        let mut nodes = Vec::new();
        for i in 0..Self::NODES {
            let node_dir = dir.join(format!("node-{}", i + 1));
            let _ = std::fs::remove_dir_all(&node_dir);
            let role = Role::Node {
                name: format!("node-{}", i + 1),
                route: routes[i],
                leaf: ports[Self::NODES + i],
                routes: routes.clone(),
            };
            nodes.push(NatsServer::launch(&node_dir, role, None, security)?);
        }
        Ok(Nats {
            nodes,
            leaves: Vec::new(),
            dir: dir.to_path_buf(),
            security: security.cloned(),
        })
    }

    /// Every node's client URL, comma-separated (clients fail over between them).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts a leaf node for one edge site; returns its client URL.
    pub fn add_leaf(&mut self, site: &str) -> anyhow::Result<String> {
        let hubs = self
            .nodes
            .iter()
            .filter_map(|n| match n.role {
                Role::Node { leaf, .. } => Some(leaf),
                _ => None,
            })
            .collect();
        let role = Role::Leaf {
            name: format!("leaf-{site}"),
            site: site.to_owned(),
            hubs,
        };
        let leaf = NatsServer::launch(
            &self.dir.join(format!("leaf-{site}")),
            role,
            None,
            self.security.as_ref(),
        )?;
        let url = leaf.url.clone();
        self.leaves.push((site.to_owned(), leaf));
        Ok(url)
    }

    /// The leaf node of an edge site.
    pub fn leaf(&mut self, site: &str) -> Option<&mut NatsServer> {
        self.leaves
            .iter_mut()
            .find(|(s, _)| s == site)
            .map(|(_, l)| l)
    }
}
