//! The NATS edge: `meridian.v1.api.<identity>.<call>` requests, decoded by the call table, answered only into
//! the caller's own inbox (see [`crate::service::reply`]).

use super::calls::{FromNats, NatsIn, CALLS};
use super::{ApiError, Request};
use crate::service::BrokerHandle;
use futures::StreamExt;
use meridian_federation::subjects;
use meridian_federation::ErrorCode;

/// A call subject as declared, the call's name and the subject's decoder.
fn find(call: &str) -> Option<(&'static str, &'static str, FromNats)> {
    CALLS.iter().find_map(|def| {
        def.nats
            .iter()
            .find(|(s, _)| *s == call)
            .map(|(s, from)| (*s, def.action, *from))
    })
}

/// Serves the NATS request-reply API until the subscription ends. Each request is answered on its own task.
pub async fn serve(h: BrokerHandle, mut sub: async_nats::Subscriber) {
    while let Some(m) = sub.next().await {
        let Some((identity, call_name)) = subjects::api::parse(m.subject.as_str()) else {
            continue;
        };
        let identity = identity.to_owned();
        let who = format!("nats:{identity}");
        // Named in the audit and the metrics only as a call there is, so that made-up names neither
        // defeat the counting of refusals nor grow the metrics without bound.
        let found = find(call_name);
        let known = found.map_or("unknown_call", |(subject, ..)| subject);
        let Some(to) = crate::service::reply::inbox(
            &h,
            &identity,
            &who,
            known,
            m.reply.as_ref().map(|r| r.as_str()),
        ) else {
            continue;
        };
        let Some((_, action, from)) = found else {
            let e = ApiError::new(
                ErrorCode::NotFound,
                None,
                format!(
                    "no API call {call_name:?} (the subject is meridian.v1.api.<identity>.<call>)"
                ),
            );
            crate::service::reply::send(&h.client, &to, e.into_reply().body).await;
            continue;
        };
        let h = h.clone();
        tokio::spawn(async move {
            let header = m
                .headers
                .as_ref()
                .and_then(|hs| hs.get(crate::client::AUTHORIZATION))
                .map(|v| v.as_str().to_owned());
            let decoded = from(NatsIn {
                payload: m.payload,
                inbox: to.clone(),
            });
            let (call, body_token) = match decoded {
                Ok((c, t)) => (Ok(c), t),
                Err(e) => (Err(e), None),
            };
            let bearer = header
                .as_deref()
                .and_then(|v| v.strip_prefix("Bearer "))
                .or(body_token.as_deref());
            let req = Request { action, call };
            let reply = super::reply(&h, bearer, Some(&identity), req).await;
            crate::service::reply::send(&h.client, &to, reply.body).await;
        });
    }
}
