//! What nats-server is told: which identities may connect and what each may publish and subscribe to, and the
//! TLS blocks of its client, cluster and leaf-node listeners. Pure text generation, tested without a server.
//!
//! The rules (nats-server enforces them; the broker checks again on every message):
//! - a broker may do anything, JetStream included;
//! - site X may publish only its own advert, heartbeat and status subjects, receive only its own offers,
//!   cancels, log and inventory requests and the broker's hello, answer only into brokers' inboxes, and read
//!   only its own inbox. (Answers go to the brokers' inbox prefixes rather than through `allow_responses`,
//!   which does not carry across a leaf-node connection: an edge site's answers cross one.)
//! - an API client may publish only API requests and read only its own inbox;
//! - nobody but brokers touches JetStream (`$JS.API.…`, `$KV.…`, `$O.…`): sites and clients have no permission
//!   there at all.

use super::{Identity, Kind};
use meridian_federation::access::inbox_prefix;
use meridian_federation::subjects::{self, SiteTopic};
use std::path::Path;

/// Publish and subscribe permissions of one identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

/// What an identity of this kind and name may do, in a federation with these brokers.
pub fn permissions(kind: Kind, name: &str, brokers: &[&str]) -> Permissions {
    match kind {
        Kind::Broker => Permissions {
            publish: vec![">".into()],
            subscribe: vec![">".into()],
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
                subscribe: vec![
                    s(SiteTopic::Offer),
                    s(SiteTopic::Cancel),
                    s(SiteTopic::Logs),
                    s(SiteTopic::Inventory),
                    subjects::BROKER_HELLO.into(),
                    format!("{}.>", inbox_prefix(name)),
                ],
            }
        }
        Kind::Client => Permissions {
            publish: vec![subjects::api::ALL.into()],
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
    format!(
        "    # {} {}\n    {{ nkey: {:?}, permissions: {{ publish: {{ allow: {} }}, subscribe: {{ allow: {} }} }} }}\n",
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
    fn clients_reach_only_the_api_and_their_inbox() {
        let p = permissions(Kind::Client, "alice", &["broker-1"]);
        assert_eq!(p.publish, vec!["meridian.v1.api.>".to_owned()]);
        assert_eq!(p.subscribe, vec!["_INBOX.alice.>".to_owned()]);
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
        assert!(!text.contains("Uedge-a"));
        assert!(text.contains("\"Uedge-b\""));
        assert!(text.contains("meridian.v1.site.edge-b.status"));
    }
}
