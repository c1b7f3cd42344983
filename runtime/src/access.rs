//! How a process reaches the federation's NATS: the servers, the CA that signs their certificates, and its own
//! identity. Every binary (broker, agent, CLI, benchmarks, tests) connects through [`Access::connect`], so a
//! change of how NATS is reached touches this one place.
//!
//! An identity is an NKey seed file `<name>.nk` written by `meridian creds`; beside it lie the identity's client
//! certificate `<name>.crt` and key `<name>.key` (presented when present: mutual TLS), and the identity's
//! replies arrive under its own inbox prefix `_INBOX.<name>`, the only inbox its permissions let it read.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where NATS is and who this process is. In help, under its own "Connection" heading.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct Access {
    /// NATS server URL(s), comma-separated.
    ///
    /// A client fails over between them.
    #[arg(
        long,
        global = true,
        env = "MERIDIAN_NATS",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats: String,
    /// The CA certificate (PEM) of the NATS servers.
    ///
    /// TLS is required when it is given.
    #[arg(long, global = true, env = "MERIDIAN_CA")]
    pub ca: Option<PathBuf>,
    /// This process's NATS identity (an NKey seed file from `meridian creds`).
    ///
    /// The seed file is `<name>.nk`; its client certificate `<name>.crt` and key `<name>.key`, when beside it,
    /// are presented to the server.
    #[arg(long, global = true, env = "MERIDIAN_CREDS")]
    pub creds: Option<PathBuf>,
}

/// Why a process could not use its access settings.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("reading the credential {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an NKey user seed (a line starting with SU, from `meridian creds`)")]
    NotASeed { path: PathBuf },
    #[error("{path}: the file name does not name an identity")]
    NoName { path: PathBuf },
    #[error("timed out connecting to {0}")]
    Timeout(String),
    #[error("connecting to {url}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
}

impl Access {
    /// Plain access to `url`, with no TLS and no identity (a server without authorization).
    pub fn plain(url: impl Into<String>) -> Self {
        Access {
            nats: url.into(),
            ca: None,
            creds: None,
        }
    }

    /// The identity's name: the credential file's stem.
    pub fn identity(&self) -> Option<String> {
        let path = self.creds.as_ref()?;
        path.file_stem()?.to_str().map(str::to_owned)
    }

    /// The name this process calls the API under, and whose inbox its replies arrive in: its identity, or
    /// [`meridian_federation::subjects::api::ANONYMOUS`] without a credential (an insecure federation).
    pub fn caller(&self) -> String {
        self.identity()
            .unwrap_or_else(|| meridian_federation::subjects::api::ANONYMOUS.to_owned())
    }

    /// The server URLs with any user or password taken out, for logs and errors.
    pub fn display_url(&self) -> String {
        redact_url(&self.nats)
    }

    /// Connection options for this access: TLS against the CA (required when a CA is given), the identity's
    /// NKey and client certificate, and its inbox prefix.
    pub fn options(
        &self,
        name: impl Into<String>,
    ) -> Result<async_nats::ConnectOptions, AccessError> {
        let mut opts = async_nats::ConnectOptions::new()
            .name(name.into())
            .custom_inbox_prefix(inbox_prefix(&self.caller()));
        if let Some(ca) = &self.ca {
            opts = opts.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some(path) = &self.creds {
            let seed = read_seed(path)?;
            self.identity()
                .ok_or_else(|| AccessError::NoName { path: path.clone() })?;
            opts = opts.nkey(seed);
            let (cert, key) = (path.with_extension("crt"), path.with_extension("key"));
            if cert.exists() && key.exists() {
                opts = opts.add_client_certificate(cert, key);
            }
        }
        Ok(opts)
    }

    /// Connects once (within `timeout`): for commands that should fail fast when NATS is not there.
    pub async fn connect(
        &self,
        name: impl Into<String>,
        timeout: Duration,
    ) -> Result<async_nats::Client, AccessError> {
        let opts = self.options(name)?.connection_timeout(timeout);
        self.connect_with(opts, timeout).await
    }

    /// Connects with options the caller tuned from [`Access::options`].
    pub async fn connect_with(
        &self,
        opts: async_nats::ConnectOptions,
        timeout: Duration,
    ) -> Result<async_nats::Client, AccessError> {
        let url = self.display_url();
        tokio::time::timeout(
            timeout,
            opts.connect(meridian_federation::nats_servers(&self.nats)),
        )
        .await
        .map_err(|_| AccessError::Timeout(url.clone()))?
        .map_err(|source| AccessError::Connect { url, source })
    }
}

/// The inbox prefix of an identity: replies to its requests arrive under it, and its permissions let it read
/// nothing else of `_INBOX`.
pub fn inbox_prefix(identity: &str) -> String {
    format!("_INBOX.{identity}")
}

/// Whether `reply` is an inbox of `identity` (`_INBOX.<identity>.<token>…`, no wildcard): the only subjects a
/// broker answers a request of that identity on.
pub fn owns_inbox(identity: &str, reply: &str) -> bool {
    let Some(rest) = reply
        .strip_prefix("_INBOX.")
        .and_then(|r| r.strip_prefix(identity))
        .and_then(|r| r.strip_prefix('.'))
    else {
        return false;
    };
    !rest.is_empty()
        && rest
            .split('.')
            .all(|t| !t.is_empty() && t != "*" && t != ">" && !t.contains(char::is_whitespace))
}

/// Reads an NKey user seed file (the seed may be surrounded by blank lines or comment lines).
pub fn read_seed(path: &Path) -> Result<String, AccessError> {
    let text = std::fs::read_to_string(path).map_err(|source| AccessError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let seed = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .ok_or_else(|| AccessError::NotASeed {
            path: path.to_path_buf(),
        })?;
    nkeys::KeyPair::from_seed(seed).map_err(|_| AccessError::NotASeed {
        path: path.to_path_buf(),
    })?;
    Ok(seed.to_owned())
}

/// A comma-separated URL list with any `user:password@` replaced by `***@`.
pub fn redact_url(list: &str) -> String {
    meridian_federation::nats_servers(list)
        .iter()
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***{}", &u[..s + 3], &u[at..]),
            (None, Some(at)) => format!("***{}", &u[at..]),
            _ => u.clone(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_identitys_own_inbox_is_its_own() {
        assert!(owns_inbox("edge-a", "_INBOX.edge-a.x1Yz.2"));
        for foreign in [
            "_INBOX.edge-ab.x",
            "_INBOX.edge-b.x",
            "_INBOX.edge-a",
            "_INBOX.edge-a.",
            "_INBOX.edge-a.>",
            "_INBOX.edge-a.*.x",
            "_INBOX.edge-a..x",
            "meridian.v1.journal",
            "$KV.MERIDIAN_LEASE.active-broker",
            "meridian.v1.site.edge-a.offer",
        ] {
            assert!(!owns_inbox("edge-a", foreign), "{foreign}");
        }
    }

    #[test]
    fn passwords_are_taken_out_of_urls() {
        assert_eq!(
            redact_url("nats://alice:s3cret@127.0.0.1:4222,tls://h:1"),
            "nats://***@127.0.0.1:4222,tls://h:1"
        );
        assert_eq!(redact_url("bob:pw@host:4222"), "***@host:4222");
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }

    #[test]
    fn a_file_without_a_seed_is_refused_with_its_path() {
        let dir = std::env::temp_dir().join(format!("meridian-access-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("site-a.nk");
        std::fs::write(&path, "not a seed\n").unwrap_or_default();
        let e = read_seed(&path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("site-a.nk") && e.contains("not an NKey user seed"),
            "{e}"
        );
        let kp = nkeys::KeyPair::new_user();
        let seed = kp.seed().unwrap_or_default();
        std::fs::write(&path, format!("# site-a\n{seed}\n")).unwrap_or_default();
        assert_eq!(read_seed(&path).ok(), Some(seed));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
