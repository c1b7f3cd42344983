//! What nats-server is told: which identities may connect and what each may publish and subscribe to, and the
//! TLS blocks of its client, cluster and leaf-node listeners. Pure text generation, tested without a server.
//!
//! The rules (nats-server enforces them; the broker checks again on every message):
//! - a broker's answering connection may publish only into inboxes (not its storage connection's) and the
//!   sites' command subjects (offers, cancels, log and inventory requests, the hello), and read the API, what
//!   sites send and its own inbox: no reply subject a caller names can make it write to JetStream;
//! - a broker's storage connection (`<broker>-store`) reaches JetStream — the journal, lease, snapshots,
//!   archive, ledger and audit — and its own inbox, and never answers a request;
//! - site X may publish only its own advert, heartbeat and status subjects, receive only its own offers,
//!   cancels, log and inventory requests and the broker's hello, answer only into brokers' inboxes, and read
//!   only its own inbox. (Answers go to the brokers' inbox prefixes rather than through `allow_responses`,
//!   which does not carry across a leaf-node connection: an edge site's answers cross one.)
//! - an API client may publish only API requests and read only its own inbox;
//! - nobody but brokers touches JetStream (`$JS.API.…`, `$KV.…`, `$O.…`): sites and clients have no permission
//!   there at all.

use super::{Identity, Kind};
use meridian_federation::subjects::{self, SiteTopic};
use meridian_runtime::access::inbox_prefix;
use std::path::Path;

/// Publish and subscribe permissions of one identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    /// Subjects excepted from `publish`.
    pub publish_deny: Vec<String>,
    pub subscribe: Vec<String>,
}

/// What an identity of this kind and name may do, in a federation with these brokers.
pub fn permissions(kind: Kind, name: &str, brokers: &[&str]) -> Permissions {
    let all_sites = |t: SiteTopic| subjects::all_sites(t);
    match kind {
        Kind::Broker => Permissions {
            publish: [
                "_INBOX.>".to_owned(),
                all_sites(SiteTopic::Offer),
                all_sites(SiteTopic::Cancel),
                all_sites(SiteTopic::Logs),
                all_sites(SiteTopic::Inventory),
                all_sites(SiteTopic::Hello),
                subjects::BROKER_HELLO.to_owned(),
            ]
            .into(),
            // No broker answers into a storage connection's inbox.
            publish_deny: brokers
                .iter()
                .map(|b| format!("{}.>", inbox_prefix(&super::store_name(b))))
                .collect(),
            subscribe: [
                subjects::api::ALL.to_owned(),
                all_sites(SiteTopic::Advert),
                all_sites(SiteTopic::Heartbeat),
                all_sites(SiteTopic::Status),
                all_sites(SiteTopic::Metrics),
                format!("{}.>", inbox_prefix(name)),
            ]
            .into(),
        },
        Kind::Store => Permissions {
            publish: [
                "$JS.API.>",
                "$JS.ACK.>",
                "$JS.FC.>",
                "$KV.MERIDIAN_LEASE.>",
                "$O.MERIDIAN_SNAPSHOTS.>",
                subjects::JOURNAL,
                subjects::AUDIT,
                subjects::LEDGER,
                "meridian.v1.archive.>",
            ]
            .map(str::to_owned)
            .into(),
            publish_deny: Vec::new(),
            subscribe: vec![format!("{}.>", inbox_prefix(name))],
        },
        Kind::Site => {
            // A site's name is its site id (checked when it is added).
            let s = |t: SiteTopic| format!("{}.site.{name}.{}", subjects::PREFIX, t.as_str());
            Permissions {
                publish: [
                    s(SiteTopic::Advert),
                    s(SiteTopic::Heartbeat),
                    s(SiteTopic::Status),
                    s(SiteTopic::Metrics),
                ]
                .into_iter()
                .chain(brokers.iter().map(|b| format!("{}.>", inbox_prefix(b))))
                .collect(),
                publish_deny: Vec::new(),
                subscribe: vec![
                    s(SiteTopic::Offer),
                    s(SiteTopic::Cancel),
                    s(SiteTopic::Logs),
                    s(SiteTopic::Inventory),
                    s(SiteTopic::Hello),
                    subjects::BROKER_HELLO.into(),
                    format!("{}.>", inbox_prefix(name)),
                ],
            }
        }
        Kind::Client => Permissions {
            publish: vec![subjects::api::of(name)],
            publish_deny: Vec::new(),
            subscribe: vec![format!("{}.>", inbox_prefix(name))],
        },
    }
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// One user entry of an `authorization { users = [...] }` block.
fn user_entry(id: &Identity, brokers: &[&str]) -> String {
    let p = permissions(id.kind, &id.name, brokers);
    let deny = if p.publish_deny.is_empty() {
        String::new()
    } else {
        format!(", deny: {}", list(&p.publish_deny))
    };
    format!(
        "    # {} {}\n    {{ nkey: {:?}, permissions: {{ publish: {{ allow: {}{deny} }}, subscribe: {{ allow: {} }} }} }}\n",
        id.kind.as_str(),
        id.name,
        id.nkey,
        list(&p.publish),
        list(&p.subscribe),
    )
}

/// The authorization block for the federation's servers: every identity not revoked.
pub fn authorization(identities: &[Identity]) -> String {
    authorization_for(identities, identities)
}

/// The authorization block letting in `admitted` (those not revoked), in a federation of `all`.
pub fn authorization_for(admitted: &[Identity], all: &[Identity]) -> String {
    let brokers: Vec<&str> = all
        .iter()
        .filter(|i| i.kind == Kind::Broker && i.revoked_ms.is_none())
        .map(|i| i.name.as_str())
        .collect();
    let mut out = String::from(
        "# Written by `meridian creds`: every identity that may connect, with its permissions. Regenerated on\n\
         # every change; reload the servers (nats-server --signal reload) to apply it.\n\
         authorization {\n  timeout: 2\n  users = [\n",
    );
    for id in admitted.iter().filter(|i| i.revoked_ms.is_none()) {
        out += &user_entry(id, &brokers);
    }
    out += "  ]\n}\n";
    out
}

/// The line that makes a server whose configuration file lies in `conf_dir` read the authorization file
/// `authorization` (both absolute). nats-server resolves an `include` against the configuration's folder and
/// takes no absolute path, so the path is written relative to that folder. Kept out of the configuration
/// itself, the identities are read again at every reload: `meridian creds add|revoke` rewrites the file, and
/// a reload applies it.
pub fn include(conf_dir: &Path, authorization: &Path) -> String {
    format!(
        "include {:?}\n",
        relative(conf_dir, authorization).display().to_string()
    )
}

/// `to` relative to the folder `from` (both absolute).
fn relative(from: &Path, to: &Path) -> std::path::PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = std::path::PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

/// The files a nats-server configuration reads: itself and what it includes, recursively (paths resolved
/// as nats-server resolves them, against the including file's folder).
pub fn files_read(conf: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![conf.to_path_buf()];
    while let Some(f) = todo.pop() {
        let f = f.canonicalize().unwrap_or(f);
        if out.contains(&f) || out.len() > 64 {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let dir = f.parent().map(Path::to_path_buf).unwrap_or_default();
        for line in text.lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix("include") else {
                continue;
            };
            if !rest.starts_with([' ', '\t']) {
                continue;
            }
            let name = rest
                .split('#')
                .next()
                .unwrap_or_default()
                .trim()
                .trim_end_matches(';')
                .trim()
                .trim_matches(|c| c == '"' || c == '\'');
            if !name.is_empty() {
                todo.push(dir.join(name));
            }
        }
        out.push(f);
    }
    out
}

/// The configuration file nats-server process `pid` was started with, from its command line (`-c FILE`,
/// `--config FILE`, `-config=FILE`…), resolved against its working folder.
pub fn config_of(pid: i32) -> anyhow::Result<std::path::PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| anyhow::anyhow!("no process {pid} to reload: {e}"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut conf = None;
    for (i, a) in args.iter().enumerate() {
        let flag = a.trim_start_matches('-');
        if a.starts_with('-') && (flag == "c" || flag == "config") {
            conf = args.get(i + 1).cloned();
        } else if let Some(v) = flag.strip_prefix("config=").or(flag.strip_prefix("c=")) {
            conf = Some(v.to_owned());
        }
    }
    let conf = conf.ok_or_else(|| {
        anyhow::anyhow!("process {pid} was started without a configuration file (-c FILE)")
    })?;
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
    Ok(cwd.join(conf))
}

/// The TLS block of a listener: the server's certificate, and clients verified against the CA (mutual TLS).
pub fn tls_block(dir: &Path) -> String {
    format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true, timeout: 2 }}",
        dir.join("server.crt").display().to_string(),
        dir.join("server.key").display().to_string(),
        dir.join("ca.crt").display().to_string(),
    )
}

/// The TLS block of a leaf node's remote: the CA that signs the hub, and the site's own certificate.
pub fn remote_tls_block(dir: &Path, site: &str) -> String {
    let users = dir.join("users");
    format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, timeout: 2 }}",
        users.join(format!("{site}.crt")).display().to_string(),
        users.join(format!("{site}.key")).display().to_string(),
        dir.join("ca.crt").display().to_string(),
    )
}

/// JetStream's encryption at rest: the key file's text as the cipher key.
pub fn cipher(key_hex: &str) -> String {
    format!("cipher: chachapoly, key: {key_hex:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(kind: Kind, name: &str, revoked: bool) -> Identity {
        Identity {
            name: name.into(),
            kind,
            nkey: format!("U{name}"),
            created_ms: 0,
            revoked_ms: revoked.then_some(1),
        }
    }

    #[test]
    fn a_site_speaks_only_for_itself() {
        let p = permissions(Kind::Site, "edge-a", &["broker-1"]);
        let (own, answers): (Vec<_>, Vec<_>) = p
            .publish
            .iter()
            .partition(|s| s.starts_with("meridian.v1.site.edge-a."));
        assert_eq!(own.len(), 4, "advert, heartbeat, status, metrics: {own:?}");
        assert!(!own.iter().any(|s| s.contains('>') || s.contains('*')));
        assert_eq!(answers, vec!["_INBOX.broker-1.>"]);
        assert!(p
            .subscribe
            .contains(&"meridian.v1.site.edge-a.offer".to_owned()));
        assert!(p.subscribe.contains(&"_INBOX.edge-a.>".to_owned()));
        assert!(!p.subscribe.iter().any(|s| s.starts_with("$JS") || s == ">"));
    }

    #[test]
    fn clients_reach_only_their_own_api_subjects_and_their_inbox() {
        let p = permissions(Kind::Client, "alice", &["broker-1"]);
        assert_eq!(p.publish, vec!["meridian.v1.api.alice.>".to_owned()]);
        assert_eq!(p.subscribe, vec!["_INBOX.alice.>".to_owned()]);
    }

    /// Whether a subject matches a NATS permission pattern (`*` one token, `>` the rest).
    fn matches(pattern: &str, subject: &str) -> bool {
        let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
        loop {
            match (p.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    fn may_publish(p: &Permissions, subject: &str) -> bool {
        p.publish.iter().any(|a| matches(a, subject))
            && !p.publish_deny.iter().any(|d| matches(d, subject))
    }

    /// The connection that answers requests cannot write where only storage may, whatever reply subject a
    /// caller names; the storage connection can, and answers nothing.
    #[test]
    fn the_answering_connection_cannot_reach_jetstream() {
        let brokers = ["broker-1", "broker-2"];
        let answering = permissions(Kind::Broker, "broker-1", &brokers);
        let store = permissions(Kind::Store, "broker-1-store", &brokers);
        let storage_subjects = [
            "meridian.v1.journal",
            "meridian.v1.audit",
            "meridian.v1.ledger",
            "meridian.v1.archive.job.j-1",
            "$KV.MERIDIAN_LEASE.active-broker",
            "$O.MERIDIAN_SNAPSHOTS.C.x",
            "$JS.API.STREAM.PURGE.MERIDIAN_AUDIT",
            "$JS.API.STREAM.MSG.DELETE.MERIDIAN_JOURNAL",
            "_INBOX.broker-1-store.abc",
            "_INBOX.broker-2-store.abc",
        ];
        for s in storage_subjects {
            assert!(
                !may_publish(&answering, s),
                "the answering connection may publish {s}"
            );
        }
        for s in &storage_subjects[..8] {
            assert!(may_publish(&store, s), "storage may not publish {s}");
        }
        for s in [
            "_INBOX.alice.x",
            "_INBOX.edge-a.x",
            "meridian.v1.site.edge-a.offer",
            "meridian.v1.site.edge-a.cancel",
            "meridian.v1.broker.hello",
        ] {
            assert!(may_publish(&answering, s), "the broker may not send {s}");
            assert!(!may_publish(&store, s), "storage may publish {s}");
        }
        // What sites say is not the broker's to say.
        for s in [
            "meridian.v1.site.edge-a.status",
            "meridian.v1.site.edge-a.heartbeat",
            "meridian.v1.api.alice.jobs.submit",
        ] {
            assert!(!may_publish(&answering, s), "{s}");
        }
        assert_eq!(store.subscribe, vec!["_INBOX.broker-1-store.>".to_owned()]);
        assert!(!store.subscribe.iter().any(|s| s.starts_with("meridian.")));
        // Sites answer brokers' requests, never into a storage inbox.
        let site = permissions(Kind::Site, "edge-a", &brokers);
        assert!(!may_publish(&site, "_INBOX.broker-1-store.x"));
        assert!(may_publish(&site, "_INBOX.broker-1.x"));
    }

    #[test]
    fn a_server_configuration_includes_the_authorization_file_by_a_relative_path() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let creds = dir.path().join("creds");
        let conf_dir = dir.path().join("nats").join("node-1");
        std::fs::create_dir_all(&creds).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&conf_dir).unwrap_or_else(|e| panic!("{e}"));
        let auth = creds.join("authorization.conf");
        std::fs::write(&auth, "authorization { }\n").unwrap_or_else(|e| panic!("{e}"));
        let line = include(&conf_dir, &auth);
        assert_eq!(line, "include \"../../creds/authorization.conf\"\n");
        let conf = conf_dir.join("nats-server.conf");
        std::fs::write(&conf, format!("listen: 127.0.0.1:-1\n{line}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let read = files_read(&conf);
        let auth = auth.canonicalize().unwrap_or_else(|e| panic!("{e}"));
        assert!(read.contains(&auth), "{read:?}");
        // The same identities written inline are not the file: a reload would not see a change of it.
        std::fs::write(
            &conf,
            "listen: 127.0.0.1:-1\nauthorization { users = [] }\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!files_read(&conf).contains(&auth));
    }

    #[test]
    fn revoked_identities_are_left_out() {
        let ids = [
            id(Kind::Broker, "broker-1", false),
            id(Kind::Site, "edge-a", true),
            id(Kind::Site, "edge-b", false),
        ];
        let text = authorization(&ids);
        assert!(text.contains("\"Ubroker-1\""));
        assert!(text.contains("deny: [\"_INBOX.broker-1-store.>\"]"));
        assert!(!text.contains("Uedge-a"));
        assert!(text.contains("\"Uedge-b\""));
        assert!(text.contains("meridian.v1.site.edge-b.status"));
    }
}
