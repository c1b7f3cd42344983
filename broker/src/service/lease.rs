//! The active-broker lease: one key in a JetStream key-value bucket. The active broker renews it every third
//! of the lease time, each time with the revision it last wrote, so a renewal fails once anyone else has
//! written it. A standby watches the key and takes it over (again conditional on the revision it saw) when
//! the revision has not moved for a whole lease time, as measured on its own clock: no clocks are compared
//! across machines. A broker that stops cleanly deletes the key, and a standby takes over at once.
//!
//! The lease only decides who tries to be active; the journal's expected-last-sequence check is what keeps a
//! stale broker from writing (see `journal`).

use anyhow::Context;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use std::time::Duration;

const BUCKET: &str = "MERIDIAN_LEASE";
const KEY: &str = "active-broker";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    pub broker: String,
    /// The holder's HTTP API, for operators.
    pub http: String,
    /// Lease time in ms: a standby waits this long without a renewal.
    pub lease_ms: u64,
}

pub struct Lease {
    kv: kv::Store,
    holder: Bytes,
    revision: u64,
    pub lease: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("the lease was taken by another broker")]
pub struct Lost;

async fn bucket(client: async_nats::Client, replicas: usize) -> anyhow::Result<kv::Store> {
    let mut js = jetstream::new(client);
    js.set_timeout(Duration::from_secs(2));
    if let Ok(kv) = js.get_key_value(BUCKET).await {
        return Ok(kv);
    }
    js.create_key_value(kv::Config {
        bucket: BUCKET.to_owned(),
        history: 1,
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .context("creating the lease bucket")
}

impl Lease {
    /// Waits until this broker holds the lease.
    pub async fn acquire(
        client: async_nats::Client,
        holder: &Holder,
        replicas: usize,
    ) -> anyhow::Result<Lease> {
        let kv = bucket(client, replicas).await?;
        let value = Bytes::from(serde_json::to_vec(holder)?);
        let lease = Duration::from_millis(holder.lease_ms);
        let poll = (lease / 6).max(Duration::from_millis(20));
        let mut announced = false;
        // The revision seen, and since when (on this broker's clock) it has not moved.
        let mut seen: Option<(u64, tokio::time::Instant)> = None;
        loop {
            let entry = match kv.entry(KEY).await {
                Ok(e) => e,
                Err(e) => {
                    // An outage is no evidence that the active broker died (it cannot renew through it
                    // either): watch afresh once the lease can be read again.
                    tracing::warn!("reading the lease: {e}");
                    seen = None;
                    tokio::time::sleep(poll).await;
                    continue;
                }
            };
            let attempt = match &entry {
                None => kv.create(KEY, value.clone()).await.ok(),
                Some(e) if e.operation != kv::Operation::Put => {
                    kv.update(KEY, value.clone(), e.revision).await.ok()
                }
                Some(e) => {
                    let now = tokio::time::Instant::now();
                    match seen {
                        Some((rev, since)) if rev == e.revision => {
                            if now.duration_since(since) >= lease {
                                tracing::info!(
                                    "the active broker's lease was not renewed for {} ms: taking over",
                                    lease.as_millis()
                                );
                                kv.update(KEY, value.clone(), e.revision).await.ok()
                            } else {
                                None
                            }
                        }
                        _ => {
                            if !announced {
                                let who = serde_json::from_slice::<Holder>(&e.value)
                                    .map_or_else(|_| "another broker".to_owned(), |h| h.broker);
                                tracing::info!("standing by: {who} is active");
                                announced = true;
                            }
                            seen = Some((e.revision, now));
                            None
                        }
                    }
                }
            };
            if let Some(revision) = attempt {
                return Ok(Lease {
                    kv,
                    holder: value,
                    revision,
                    lease,
                });
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Renews the lease; `Err(Lost)` once another broker has written it. Other failures (NATS or JetStream
    /// unavailable, a stream leader being elected) are retried for as long as they last: a standby cannot take
    /// the lease through them either, and the journal's fencing stops this broker should one have.
    pub async fn renew(&mut self) -> Result<(), Lost> {
        let mut warned = false;
        loop {
            match self
                .kv
                .update(KEY, self.holder.clone(), self.revision)
                .await
            {
                Ok(rev) => {
                    self.revision = rev;
                    return Ok(());
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    // A renewal whose acknowledgement was lost leaves this broker's own value behind.
                    match self.kv.entry(KEY).await {
                        Ok(Some(e))
                            if e.operation == kv::Operation::Put && e.value == self.holder =>
                        {
                            self.revision = e.revision;
                            return Ok(());
                        }
                        _ => return Err(Lost),
                    }
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!("could not renew the lease ({e}); retrying");
                        warned = true;
                    }
                    tokio::time::sleep(self.lease / 10).await;
                }
            }
        }
    }

    /// Gives the lease up so that a standby takes over at once (on a clean stop).
    pub async fn release(self) {
        let _ = self
            .kv
            .delete_expect_revision(KEY, Some(self.revision))
            .await;
    }
}
