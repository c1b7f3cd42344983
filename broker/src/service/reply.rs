//! Where the broker answers: only into an inbox of the identity that asked.
//!
//! A NATS request names its reply subject, and the broker publishes its answer there with its own
//! permissions. So the answer may go only to a subject the caller could have read anyway: its own inbox,
//! `_INBOX.<identity>.…`. Who asks is known from the subject the request came on, which nats-server lets
//! only that identity publish to: a site's subjects carry its site id, an API caller's its identity
//! (`meridian.v1.api.<identity>.<call>`). Any other reply subject is dropped, counted
//! (`meridian_replies_refused`) and audited, and nothing is published.
//!
//! [`Inbox`] is the only thing the broker publishes an answer to, and [`inbox`] is the only way to make one,
//! so no answer — now or later, like a routes watch's updates — can skip the check. nats-server checks again:
//! the connection that answers may publish only to inboxes and the sites' command subjects, and JetStream is
//! reached over another connection that answers nothing (see `creds::server`).

use super::BrokerHandle;
use bytes::Bytes;
use meridian_runtime::access::owns_inbox;

/// A subject the broker may answer on: an inbox of the identity that asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inbox(String);

impl Inbox {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An inbox for the tests of code that is handed one (the broker itself makes them only by [`inbox`]).
    #[cfg(test)]
    pub fn for_tests(subject: &str) -> Self {
        Inbox(subject.to_owned())
    }
}

/// The inbox `reply` names, when it is one of `identity`'s. Otherwise the answer is withheld: counted and
/// audited against `who` (as the audit names the caller) for `action`.
pub fn inbox(
    h: &BrokerHandle,
    identity: &str,
    who: &str,
    action: &str,
    reply: Option<&str>,
) -> Option<Inbox> {
    let reply = reply?;
    if owns_inbox(identity, reply) {
        return Some(Inbox(reply.to_owned()));
    }
    h.metrics.reply_refused(action);
    h.audit.refused(
        super::now_ms(),
        who,
        action,
        &format!(
            "reply subject is {}, not the caller's own inbox (_INBOX.{identity}.…); no answer sent",
            kind(reply)
        ),
    );
    tracing::debug!("{who} asked for an answer on {reply:?}, not its own inbox: refused");
    None
}

/// Publishes an answer into the caller's inbox.
pub async fn send(client: &async_nats::Client, to: &Inbox, body: impl Into<Bytes>) {
    let _ = client.publish(to.0.clone(), body.into()).await;
}

/// What a refused reply subject is, in a few words: the audit counts refusals by it, so it must not vary
/// with what the attacker writes.
fn kind(reply: &str) -> &'static str {
    let first = reply.split('.').next().unwrap_or_default();
    match first {
        "$JS" | "$KV" | "$O" => "a JetStream subject",
        "meridian" => "a Meridian subject",
        "_INBOX" => "another identity's inbox",
        _ => "another subject",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_subjects_are_counted_by_kind_not_by_name() {
        assert_eq!(kind("meridian.v1.journal"), "a Meridian subject");
        assert_eq!(
            kind("$KV.MERIDIAN_LEASE.active-broker"),
            "a JetStream subject"
        );
        assert_eq!(
            kind("$JS.API.STREAM.PURGE.MERIDIAN_AUDIT"),
            "a JetStream subject"
        );
        assert_eq!(kind("_INBOX.alice.x"), "another identity's inbox");
        assert_eq!(kind("x7f3.y"), "another subject");
    }
}
