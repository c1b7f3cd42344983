//! `meridian creds`: make the federation's CA and identities, list and revoke them, and write the
//! nats-server configuration that enforces them.

use super::outln;
use clap::Subcommand;
use meridian_broker::creds::{Kind, Registry};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum CredsCmd {
    /// Make a new credentials folder: the federation's CA, the servers' certificate, JetStream's key.
    Init {
        /// Host names and addresses the servers' certificate is valid for; repeatable.
        #[arg(long = "host", default_values_t = ["127.0.0.1".to_owned(), "localhost".to_owned()])]
        hosts: Vec<String>,
        /// The federation's name (in its CA's name).
        #[arg(long, default_value = "meridian")]
        name: String,
    },
    /// Add an identity: a broker, a site (named by its site id) or an API client. Writes its NKey seed
    /// (`users/<name>.nk`) and client certificate, and the servers' authorization block.
    Add {
        /// What the identity is.
        #[arg(value_enum)]
        kind: Kind,
        /// Its name: a broker's name, a site's id or a client's name (its files are `users/<name>.*`).
        name: String,
        /// nats-server processes to reload at once (their pids); repeatable.
        #[arg(long = "reload")]
        reload: Vec<i32>,
    },
    /// List the identities.
    List,
    /// Revoke an identity: it leaves the servers' authorization and its secret files are deleted. With
    /// `--reload`, the servers drop its connections now. (A revoked site's work is requeued by the broker once
    /// its heartbeats stop; `meridian revoke-site SITE` does it at once.)
    Revoke {
        /// The identity's name.
        name: String,
        /// nats-server processes to reload at once (their pids); repeatable.
        #[arg(long = "reload")]
        reload: Vec<i32>,
    },
    /// Print a complete nats-server configuration for one server: TLS with client certificates, the
    /// identities (included from the folder's authorization.conf, which `add` and `revoke` rewrite: a reload
    /// applies them), JetStream encrypted at rest.
    ServerConfig {
        /// The address the server listens on for clients.
        #[arg(long, default_value = "0.0.0.0:4222")]
        listen: String,
        /// JetStream's store folder.
        #[arg(long, default_value = "/var/lib/nats")]
        store: PathBuf,
        /// The folder the configuration file will be written to (its include is relative to it); default: the
        /// credentials folder.
        #[arg(long)]
        config_dir: Option<PathBuf>,
    },
}

pub fn run(cmd: CredsCmd, dir: &std::path::Path) -> anyhow::Result<bool> {
    match cmd {
        CredsCmd::Init { hosts, name } => {
            let reg = Registry::init(dir, &name, &hosts)?;
            outln!(
                "credentials folder {} made: CA {}",
                dir.display(),
                reg.ca().display()
            );
            outln!("next: meridian creds add broker broker-1; meridian creds add site <site-id>; meridian creds add client <name>");
        }
        CredsCmd::Add {
            kind,
            name,
            reload: pids,
        } => {
            let mut reg = Registry::open(dir)?;
            let path = reg.add(kind, &name)?;
            reg.reload_servers(&pids)?;
            outln!("{} {name}: {}", kind.as_str(), path.display());
            outln!(
                "give it MERIDIAN_CREDS={} and MERIDIAN_CA={}",
                path.display(),
                reg.ca().display()
            );
        }
        CredsCmd::List => {
            let reg = Registry::open(dir)?;
            outln!("{:<8} {:<24} {:<10} NKEY", "KIND", "NAME", "STATE");
            for i in reg.identities() {
                outln!(
                    "{:<8} {:<24} {:<10} {}",
                    i.kind.as_str(),
                    i.name,
                    if i.revoked_ms.is_some() {
                        "revoked"
                    } else {
                        "active"
                    },
                    i.nkey
                );
            }
        }
        CredsCmd::Revoke { name, reload: pids } => {
            let mut reg = Registry::open(dir)?;
            let kind = reg.revoke(&name)?.kind;
            reg.reload_servers(&pids)
                .map_err(|e| e.context(format!("{name} is revoked in {}", dir.display())))?;
            outln!(
                "{} {name} revoked{}",
                kind.as_str(),
                if pids.is_empty() {
                    "; reload the servers (nats-server --signal reload) to cut it off"
                } else {
                    "; servers reloaded"
                }
            );
        }
        CredsCmd::ServerConfig {
            listen,
            store,
            config_dir,
        } => {
            let reg = Registry::open(dir)?;
            let conf_dir = config_dir.unwrap_or_else(|| reg.dir().to_path_buf());
            super::out!("{}", reg.server_config(&listen, &store, &conf_dir)?);
        }
    }
    Ok(true)
}
