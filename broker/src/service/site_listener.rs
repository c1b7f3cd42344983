//! The site listener: each site topic's messages, checked and turned into reactor events; attempts no
//! longer the broker's are stopped at their site.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use super::*;

/// Subscribes to one topic of every site and turns each valid message into a reactor event. Invalid messages
/// are logged with the reason and dropped; a status request gets an error reply so the agent sees why.
pub(super) async fn spawn_site_listener(
    handle: &BrokerHandle,
    topic: SiteTopic,
) -> anyhow::Result<()> {
    let mut sub = handle.client.subscribe(subjects::all_sites(topic)).await?;
    let h = handle.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let Some((site, _)) = subjects::parse_site(&m.subject) else {
                continue;
            };
            // Answers go only into the site's own inbox.
            let to = m.reply.as_ref().and_then(|r| {
                reply::inbox(
                    &h,
                    site.as_str(),
                    &format!("site:{site}"),
                    topic.as_str(),
                    Some(r.as_str()),
                )
            });
            if let Err(wait) = h.auth.admit_site(&site) {
                refuse(&h, &site, topic.as_str(), "rate limited").await;
                let slow = auth::slow_down(wait, &format!("site {site}"));
                answer_error(&h.client, to.as_ref(), slow).await;
                continue;
            }
            match decode_event(topic, &site, &m.payload) {
                Some(Ok(Event::Status(s))) => take_status(&h, site, s, to),
                Some(Ok(e)) => h.feed(e),
                Some(Err(err)) => {
                    tracing::warn!(
                        "dropped a bad {} message from site {site}: {err}",
                        topic.as_str()
                    );
                    refuse(&h, &site, topic.as_str(), &err.to_string()).await;
                    answer_error(&h.client, to.as_ref(), err.to_body()).await;
                }
                None if topic == SiteTopic::Metrics => take_metrics(&h, &site, &m.payload).await,
                None => {}
            }
        }
    });
    Ok(())
}

/// Audits a site's message refused.
async fn refuse(h: &BrokerHandle, site: &SiteId, topic: &str, why: &str) {
    h.audit
        .refused(now_ms(), &format!("site:{site}"), topic, why);
}

/// Answers a site's request with an error, when it asked into its own inbox.
async fn answer_error(
    client: &async_nats::Client,
    to: Option<&reply::Inbox>,
    e: meridian_federation::ErrorBody,
) {
    if let Some(to) = to {
        if let Ok(body) = encode(&meridian_federation::ApiReply::<()>::err(e)) {
            reply::send(client, to, body).await;
        }
    }
}

/// The event a site's message makes, checked to speak for the site whose subject it came on (`None`: the
/// topic makes no event).
fn decode_event(
    topic: SiteTopic,
    site: &SiteId,
    payload: &[u8],
) -> Option<Result<Event, meridian_federation::WireError>> {
    Some(match topic {
        SiteTopic::Advert => decode::<SiteAdvert>(payload).and_then(|a| {
            same_site(site, &a.site.id)?;
            Ok(Event::Advert(a))
        }),
        SiteTopic::Heartbeat => decode::<Heartbeat>(payload).and_then(|b| {
            same_site(site, &b.site)?;
            Ok(Event::Heartbeat(b))
        }),
        SiteTopic::Status => decode::<JobStatus>(payload).and_then(|s| {
            same_site(site, &s.site)?;
            Ok(Event::Status(s))
        }),
        _ => return None,
    })
}

/// An agent's device report, re-exported in the metrics.
async fn take_metrics(h: &BrokerHandle, site: &SiteId, payload: &[u8]) {
    match decode::<meridian_federation::SiteMetrics>(payload)
        .and_then(|r| same_site(site, &r.site).map(|()| r))
    {
        Ok(r) => h.metrics.agent_report(r, now_ms()),
        Err(err) => {
            tracing::warn!("dropped a bad metrics message from site {site}: {err}");
            refuse(h, site, "metrics", &err.to_string()).await;
        }
    }
}

/// A status is queued in arrival order (so a site's updates apply in order) and acknowledged once stored,
/// without holding up the next update. A refusal (the site does not hold the attempt, or is revoked) is
/// answered with the reason, so the agent stops retrying it.
fn take_status(h: &BrokerHandle, site: SiteId, s: JobStatus, to: Option<reply::Inbox>) {
    let ack = StatusAck {
        v: WIRE_VERSION,
        job: s.job.clone(),
        attempt: s.attempt,
    };
    let running =
        (s.state == meridian_federation::AttemptState::Running).then(|| (s.job.clone(), s.attempt));
    let applied = h.step_queued(Event::Status(s));
    let client = h.client.clone();
    tokio::spawn(async move {
        let body = match applied.await {
            Ok(Ok(_)) => encode(&ack).ok(),
            Ok(Err(e @ StepError::Refused(_))) => {
                // A site that says it runs an attempt the broker does not give it is told to stop it (on its
                // own subject: nothing is journaled).
                if let Some((job, attempt)) = running {
                    stop_unheld(&client, &site, job, attempt).await;
                }
                let refused = meridian_federation::ErrorBody::new(e.code(), None, e.to_string());
                encode(&meridian_federation::ApiReply::<()>::err(refused)).ok()
            }
            _ => None,
        };
        if let (Some(to), Some(body)) = (to, body) {
            reply::send(&client, &to, body).await;
        }
    });
}

/// Tells `site` to stop an attempt it reports running that the broker does not give it.
pub(super) async fn stop_unheld(
    client: &async_nats::Client,
    site: &SiteId,
    job: JobId,
    attempt: u32,
) {
    let cancel = meridian_federation::CancelAttempt {
        v: WIRE_VERSION,
        job,
        attempt,
        reason: "the broker does not give this attempt to this site".into(),
    };
    send_cancel(client, site, &cancel).await;
}

/// Tells `site` to stop one of its attempts.
pub(super) async fn send_cancel(
    client: &async_nats::Client,
    site: &SiteId,
    cancel: &meridian_federation::CancelAttempt,
) {
    if let Ok(body) = encode(cancel) {
        let _ = client
            .publish(subjects::site(site, SiteTopic::Cancel), Bytes::from(body))
            .await;
    }
}

pub(super) fn same_site(
    subject_site: &SiteId,
    body_site: &SiteId,
) -> Result<(), meridian_federation::WireError> {
    if subject_site != body_site {
        return Err(meridian_federation::WireError::invalid(
            "site",
            format!("message for site {body_site} arrived on the subject of site {subject_site}"),
        ));
    }
    Ok(())
}
