//! `meridian creds`: the federation's identities and certificates, kept in one folder.
//!
//! ```text
//! <dir>/identities.json     who may connect: name, kind (broker, site, client), public NKey, revoked or not
//! <dir>/authorization.conf  the nats-server authorization block made from it (reload the servers on change)
//! <dir>/ca.crt, ca.key      the federation's CA (ca.key signs new certificates; keep it off the servers)
//! <dir>/server.crt, .key    the servers' certificate (NATS listeners, routes, leaf nodes, the HTTP API)
//! <dir>/jetstream.key       JetStream's encryption key at rest
//! <dir>/users/<name>.nk     an identity's NKey seed (its secret), with <name>.crt and <name>.key (mutual TLS)
//! ```
//! Secrets are written readable by their owner only. A site's identity is named by its site id: its
//! permissions confine it to that site's subjects (see [`server`]).

pub mod pki;
pub mod server;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What an identity is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A broker's connection that answers requests and sends sites their work: it may publish only into
    /// inboxes and the sites' command subjects. `meridian creds add broker NAME` also makes its storage
    /// identity, `NAME-store`.
    Broker,
    /// A broker's storage connection (`<broker>-store`): JetStream only, and it never answers a request.
    Store,
    /// A site's agent (or its leaf node): its own site subjects only.
    Site,
    /// An API client: API requests only. Which tenant it acts for is its API token's business.
    Client,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Broker => "broker",
            Kind::Store => "store",
            Kind::Site => "site",
            Kind::Client => "client",
        }
    }
}

/// One identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub name: String,
    pub kind: Kind,
    /// Public NKey (`U…`): what the servers know of it.
    pub nkey: String,
    pub created_ms: u64,
    /// When it was revoked: it is left out of the servers' authorization from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    version: u32,
    /// The federation's name (in the CA's name).
    name: String,
    /// Host names and addresses the servers' certificate is valid for.
    hosts: Vec<String>,
    identities: Vec<Identity>,
}

/// The credentials folder.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    file: RegistryFile,
}

const REGISTRY: &str = "identities.json";

fn now_ms() -> u64 {
    #[allow(clippy::disallowed_methods)]
    // the time an identity was made, for the operator's listing
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes a file readable by its owner only.
pub fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn write_public(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// 32 random bytes, hex.
pub fn random_hex() -> anyhow::Result<String> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Registry {
    /// Makes a new credentials folder: CA, server certificate, JetStream key, no identities yet.
    pub fn init(dir: &Path, name: &str, hosts: &[String]) -> anyhow::Result<Self> {
        if dir.join(REGISTRY).exists() {
            bail!(
                "{} already holds a federation's credentials; use it, or choose another folder",
                dir.display()
            );
        }
        meridian_federation::ids::check_id(name)
            .map_err(|e| anyhow::anyhow!("federation name {name:?} {e}"))?;
        if hosts.is_empty() {
            bail!("the servers' certificate needs at least one host name or address (--host)");
        }
        std::fs::create_dir_all(dir.join("users"))
            .with_context(|| format!("creating {}", dir.display()))?;
        // Absolute, so generated configurations work from any working folder.
        let dir = &dir.canonicalize()?;
        let ca = pki::new_ca(name)?;
        write_public(&dir.join("ca.crt"), &ca.cert)?;
        write_secret(&dir.join("ca.key"), &ca.key)?;
        let server = pki::issue(&ca, &format!("{name} servers"), hosts, pki::Usage::Server)?;
        write_public(&dir.join("server.crt"), &server.cert)?;
        write_secret(&dir.join("server.key"), &server.key)?;
        write_secret(&dir.join("jetstream.key"), &random_hex()?)?;
        let reg = Registry {
            dir: dir.to_path_buf(),
            file: RegistryFile {
                version: 1,
                name: name.to_owned(),
                hosts: hosts.to_vec(),
                identities: Vec::new(),
            },
        };
        reg.save()?;
        Ok(reg)
    }

    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(REGISTRY);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (make the folder with `meridian creds init`)",
                path.display()
            )
        })?;
        let file: RegistryFile =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if file.version != 1 {
            bail!(
                "{}: version {} is not one this build reads",
                path.display(),
                file.version
            );
        }
        Ok(Registry {
            dir: dir.canonicalize()?,
            file,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn identities(&self) -> &[Identity] {
        &self.file.identities
    }

    pub fn get(&self, name: &str) -> Option<&Identity> {
        self.file.identities.iter().find(|i| i.name == name)
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    pub fn authorization(&self) -> PathBuf {
        self.dir.join("authorization.conf")
    }

    /// The NKey seed file of an identity (what `--creds` / `MERIDIAN_CREDS` names).
    pub fn creds(&self, name: &str) -> PathBuf {
        self.dir.join("users").join(format!("{name}.nk"))
    }

    /// JetStream's key at rest.
    pub fn jetstream_key(&self) -> anyhow::Result<String> {
        let path = self.dir.join("jetstream.key");
        Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .to_owned())
    }

    /// Adds an identity: a new NKey and client certificate. A revoked name may be added again (with new keys);
    /// a live one may not. A broker comes with its storage identity ([`store_name`]).
    pub fn add(&mut self, kind: Kind, name: &str) -> anyhow::Result<PathBuf> {
        if kind == Kind::Store {
            bail!("a storage identity comes with its broker: `meridian creds add broker NAME` makes NAME-store");
        }
        if kind == Kind::Broker {
            let store = store_name(name);
            if self.get(&store).is_some_and(|i| i.revoked_ms.is_none()) {
                bail!("{store} already exists; revoke it first to issue new keys");
            }
            let path = self.add_one(kind, name)?;
            self.add_one(Kind::Store, &store)?;
            return Ok(path);
        }
        self.add_one(kind, name)
    }

    /// Gives every live broker a storage identity it lacks (a folder made before brokers had one).
    pub fn ensure_stores(&mut self) -> anyhow::Result<()> {
        let lacking: Vec<String> = self
            .file
            .identities
            .iter()
            .filter(|i| i.kind == Kind::Broker && i.revoked_ms.is_none())
            .map(|i| store_name(&i.name))
            .filter(|s| self.get(s).is_none_or(|i| i.revoked_ms.is_some()))
            .collect();
        for store in lacking {
            self.add_one(Kind::Store, &store)?;
        }
        Ok(())
    }

    fn add_one(&mut self, kind: Kind, name: &str) -> anyhow::Result<PathBuf> {
        meridian_federation::ids::check_id(name)
            .map_err(|e| anyhow::anyhow!("identity name {name:?} {e}"))?;
        if let Some(i) = self.get(name) {
            if i.revoked_ms.is_none() {
                bail!(
                    "{} {name} already exists; revoke it first to issue new keys",
                    i.kind.as_str()
                );
            }
        }
        let pair = nkeys::KeyPair::new_user();
        let seed = pair
            .seed()
            .map_err(|e| anyhow::anyhow!("making an NKey: {e}"))?;
        let ca = pki::Pem {
            cert: std::fs::read_to_string(self.ca())?,
            key: std::fs::read_to_string(self.dir.join("ca.key"))
                .context("reading ca.key (new identities are signed by the CA)")?,
        };
        let cert = pki::issue(&ca, name, &[], pki::Usage::Client)?;
        let path = self.creds(name);
        // The seed alone, as NATS clients read it.
        write_secret(&path, &format!("{seed}\n"))?;
        write_public(&path.with_extension("crt"), &cert.cert)?;
        write_secret(&path.with_extension("key"), &cert.key)?;
        self.file.identities.retain(|i| i.name != name);
        self.file.identities.push(Identity {
            name: name.to_owned(),
            kind,
            nkey: pair.public_key(),
            created_ms: now_ms(),
            revoked_ms: None,
        });
        self.save()?;
        Ok(path)
    }

    /// Revokes an identity: it leaves the servers' authorization (applied at their next reload), and its
    /// secret files are deleted.
    pub fn revoke(&mut self, name: &str) -> anyhow::Result<&Identity> {
        let Some(pos) = self.file.identities.iter().position(|i| i.name == name) else {
            bail!("no identity {name} in {}", self.dir.display());
        };
        // A broker's storage identity goes with it.
        if self.file.identities[pos].kind == Kind::Broker {
            let store = store_name(name);
            if self.get(&store).is_some() {
                self.revoke(&store)?;
            }
        }
        if self.file.identities[pos].revoked_ms.is_none() {
            self.file.identities[pos].revoked_ms = Some(now_ms());
        }
        let path = self.creds(name);
        for p in [path.clone(), path.with_extension("key")] {
            let _ = std::fs::remove_file(p);
        }
        self.save()?;
        Ok(&self.file.identities[pos])
    }

    /// Writes the registry and the authorization block made from it.
    fn save(&self) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(&self.file)?;
        write_public(&self.dir.join(REGISTRY), &text)?;
        write_public(
            &self.authorization(),
            &server::authorization(&self.file.identities),
        )
    }

    /// A complete single-server configuration, for a file in `conf_dir`: TLS with client certificates, the
    /// identities (included from `authorization.conf`, so `meridian creds add|revoke --reload` applies a
    /// change), JetStream encrypted at rest.
    pub fn server_config(
        &self,
        listen: &str,
        store: &Path,
        conf_dir: &Path,
    ) -> anyhow::Result<String> {
        let conf_dir = conf_dir
            .canonicalize()
            .with_context(|| format!("the configuration's folder {}", conf_dir.display()))?;
        Ok(format!(
            "# Written by `meridian creds server-config`, for a file in {}. The identities are included from\n# authorization.conf: after `meridian creds add` or `revoke`, reload the server (or pass --reload PID).\nlisten: {listen:?}\n{}\n{}jetstream {{ store_dir: {:?}, {} }}\n",
            conf_dir.display(),
            server::tls_block(&self.dir),
            server::include(&conf_dir, &self.authorization()),
            store.display().to_string(),
            server::cipher(&self.jetstream_key()?),
        ))
    }

    /// Reloads nats-server processes after a change of identities, once each is seen to read this folder's
    /// authorization file (a server with the identities written into its own configuration would re-read the
    /// old list: the change would not take effect).
    pub fn reload_servers(&self, pids: &[i32]) -> anyhow::Result<()> {
        let want = self.authorization().canonicalize()?;
        let mut blind = Vec::new();
        for &pid in pids {
            let conf = server::config_of(pid)?;
            if !server::files_read(&conf).contains(&want) {
                blind.push(format!("{pid} ({})", conf.display()));
            }
        }
        if !blind.is_empty() {
            bail!(
                "not reloaded: nats-server {} does not include {}, so a reload would not apply the change; \
                 put `include` of it in the server's configuration (`meridian creds server-config` writes one), \
                 restart the server once, then reload",
                blind.join(", "),
                want.display()
            );
        }
        reload(pids)
    }
}

/// The storage identity of broker `name`.
pub fn store_name(name: &str) -> String {
    format!("{name}-store")
}

/// Asks nats-server processes to reload their configuration (SIGHUP, as `nats-server --signal reload` does).
pub fn reload(pids: &[i32]) -> anyhow::Result<()> {
    for &pid in pids {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .with_context(|| format!("signalling nats-server {pid} to reload"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_added_listed_and_revoked() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let hosts = vec!["127.0.0.1".to_owned()];
        let mut reg = Registry::init(dir.path(), "test", &hosts).unwrap_or_else(|e| panic!("{e}"));
        assert!(Registry::init(dir.path(), "test", &hosts).is_err());
        let seed = reg
            .add(Kind::Site, "edge-a")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(reg.add(Kind::Site, "edge-a").is_err());
        assert!(reg.add(Kind::Client, "bad name!").is_err());
        let mode = std::fs::metadata(&seed)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777);
        assert_eq!(mode.ok(), Some(0o600));
        let access = meridian_runtime::access::Access {
            nats: String::new(),
            ca: None,
            creds: Some(seed.clone()),
        };
        assert!(meridian_runtime::access::read_seed(&seed).is_ok());
        assert_eq!(access.identity().as_deref(), Some("edge-a"));
        let conf = std::fs::read_to_string(reg.authorization()).unwrap_or_default();
        let nkey = reg
            .get("edge-a")
            .map(|i| i.nkey.clone())
            .unwrap_or_default();
        assert!(conf.contains(&nkey));
        reg.revoke("edge-a").unwrap_or_else(|e| panic!("{e}"));
        let conf = std::fs::read_to_string(reg.authorization()).unwrap_or_default();
        assert!(!conf.contains(&nkey));
        assert!(!seed.exists());
        let again = Registry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert!(again.get("edge-a").is_some_and(|i| i.revoked_ms.is_some()));
        // A revoked name may be enrolled again, with new keys.
        let mut again = again;
        again
            .add(Kind::Site, "edge-a")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(again.get("edge-a").map(|i| i.nkey.clone()), Some(nkey));
    }

    #[test]
    fn a_broker_comes_and_goes_with_its_storage_identity() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let hosts = vec!["127.0.0.1".to_owned()];
        let mut reg = Registry::init(dir.path(), "test", &hosts).unwrap_or_else(|e| panic!("{e}"));
        reg.add(Kind::Broker, "broker-1")
            .unwrap_or_else(|e| panic!("{e}"));
        let store = reg.get("broker-1-store").cloned();
        assert_eq!(store.as_ref().map(|i| i.kind), Some(Kind::Store));
        assert!(reg.creds("broker-1-store").exists());
        assert!(reg.add(Kind::Store, "other-store").is_err());
        reg.revoke("broker-1").unwrap_or_else(|e| panic!("{e}"));
        assert!(reg
            .get("broker-1-store")
            .is_some_and(|i| i.revoked_ms.is_some()));
        assert!(!reg.creds("broker-1-store").exists());
    }
}
