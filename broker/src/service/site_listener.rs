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
            let to = reply::inbox(
                &h,
                site.as_str(),
                &format!("site:{site}"),
                topic.as_str(),
                m.reply.as_ref().map(|r| r.as_str()),
            );
            if let Err(wait) = h.auth.admit_site(site.as_str()) {
                h.audit.refused(
                    now_ms(),
                    &format!("site:{site}"),
                    topic.as_str(),
                    "rate limited",
                );
                if let Some(to) = &to {
                    let body = meridian_federation::ApiReply::<()>::err(auth::slow_down(
                        wait,
                        &format!("site {site}"),
                    ));
                    if let Ok(body) = encode(&body) {
                        reply::send(&h.client, to, body).await;
                    }
                }
                continue;
            }
            if topic == SiteTopic::Metrics {
                match decode::<meridian_federation::SiteMetrics>(&m.payload)
                    .and_then(|r| same_site(&site, &r.site).map(|()| r))
                {
                    Ok(r) => h.metrics.agent_report(r, now_ms()),
                    Err(err) => {
                        tracing::warn!("dropped a bad metrics message from site {site}: {err}");
                        h.audit.refused(
                            now_ms(),
                            &format!("site:{site}"),
                            "metrics",
                            &err.to_string(),
                        );
                    }
                }
                continue;
            }
            let event = match topic {
                SiteTopic::Advert => decode::<SiteAdvert>(&m.payload).and_then(|a| {
                    same_site(&site, &a.site.id)?;
                    Ok(Event::Advert(a))
                }),
                SiteTopic::Heartbeat => decode::<Heartbeat>(&m.payload).and_then(|b| {
                    same_site(&site, &b.site)?;
                    Ok(Event::Heartbeat(b))
                }),
                SiteTopic::Status => decode::<JobStatus>(&m.payload).and_then(|s| {
                    same_site(&site, &s.site)?;
                    Ok(Event::Status(s))
                }),
                _ => continue,
            };
            match event {
                Ok(Event::Status(s)) => {
                    let ack = StatusAck {
                        v: WIRE_VERSION,
                        job: s.job.clone(),
                        attempt: s.attempt,
                    };
                    // Queued in arrival order (so a site's updates apply in order); acknowledged once stored,
                    // without holding up the next update. A refusal (the site does not hold the attempt, or is
                    // revoked) is answered with the reason, so the agent stops retrying it.
                    let running = (s.state == meridian_federation::AttemptState::Running)
                        .then(|| (s.job.clone(), s.attempt));
                    let applied = h.step_queued(Event::Status(s));
                    let client = h.client.clone();
                    let cancel_to = site.clone();
                    tokio::spawn(async move {
                        let body = match applied.await {
                            Ok(Ok(_)) => encode(&ack).ok(),
                            Ok(Err(e @ StepError::Refused(_))) => {
                                // A site that says it runs an attempt the broker does not give it is told to
                                // stop it (on its own subject: nothing is journaled).
                                if let Some((job, attempt)) = running {
                                    stop_unheld(&client, &cancel_to, job, attempt).await;
                                }
                                encode(&meridian_federation::ApiReply::<()>::err(
                                    meridian_federation::ErrorBody::new(
                                        e.code(),
                                        None,
                                        e.to_string(),
                                    ),
                                ))
                                .ok()
                            }
                            _ => None,
                        };
                        if let (Some(to), Some(body)) = (to, body) {
                            reply::send(&client, &to, body).await;
                        }
                    });
                }
                Ok(e) => h.feed(e),
                Err(err) => {
                    tracing::warn!(
                        "dropped a bad {} message from site {site}: {err}",
                        topic.as_str()
                    );
                    h.audit.refused(
                        now_ms(),
                        &format!("site:{site}"),
                        topic.as_str(),
                        &err.to_string(),
                    );
                    if let Some(to) = &to {
                        let body = meridian_federation::ApiReply::<()>::err(err.to_body());
                        if let Ok(body) = encode(&body) {
                            reply::send(&h.client, to, body).await;
                        }
                    }
                }
            }
        }
    });
    Ok(())
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
