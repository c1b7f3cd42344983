//! The durable journal: broker events in a JetStream stream. The reactor appends to a buffer; after each step
//! the shell stores the step's records here and waits for JetStream's acknowledgement before it sends the
//! step's messages or answers the caller. At start the broker replays the stream to rebuild its state.
//! If a record cannot be stored the broker stops (state in memory would be ahead of the journal); a restart
//! replays what was stored.

use crate::core::journal::Record;
use anyhow::Context;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use meridian_federation::subjects;

pub struct JetStreamJournal {
    js: jetstream::Context,
    stream: stream::Stream,
    /// Message ids `<instance>-<n>` let JetStream drop the duplicate when an append is retried.
    instance: String,
    next: u64,
}

/// How long an append is retried (through a NATS restart, say) before the broker stops.
const STORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

impl JetStreamJournal {
    /// Opens (or creates) the journal stream.
    pub async fn open(client: async_nats::Client) -> anyhow::Result<Self> {
        let js = jetstream::new(client);
        let stream = js
            .get_or_create_stream(stream::Config {
                name: subjects::JOURNAL_STREAM.to_owned(),
                subjects: vec![subjects::JOURNAL.to_owned()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .context("opening the journal stream (is JetStream enabled on the NATS server?)")?;
        let instance = format!("{}-{}", std::process::id(), crate::service::now_ms());
        Ok(JetStreamJournal {
            js,
            stream,
            instance,
            next: 0,
        })
    }

    /// Every stored record, oldest first.
    pub async fn load(&self) -> anyhow::Result<Vec<Record>> {
        let info = self
            .stream
            .get_info()
            .await
            .context("reading the journal's state")?;
        let count = info.state.messages;
        if count == 0 {
            return Ok(Vec::new());
        }
        let consumer = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .context("reading the journal")?;
        let mut messages = consumer.messages().await.context("reading the journal")?;
        let mut out = Vec::with_capacity(count as usize);
        while (out.len() as u64) < count {
            let Some(m) = messages.next().await else {
                break;
            };
            let m = m.context("reading the journal")?;
            let record: Record = serde_json::from_slice(&m.payload)
                .with_context(|| format!("journal record {} is unreadable", out.len() + 1))?;
            out.push(record);
        }
        Ok(out)
    }

    /// Stores records in order, each acknowledged by JetStream before the next. An append that fails is
    /// retried with the same message id (so it is stored once) for up to [`STORE_PATIENCE`].
    pub async fn store(&mut self, records: Vec<Record>) -> anyhow::Result<()> {
        for r in records {
            let body = Bytes::from(serde_json::to_vec(&r)?);
            self.next += 1;
            let id = format!("{}-{}", self.instance, self.next);
            let deadline = tokio::time::Instant::now() + STORE_PATIENCE;
            let mut pause = std::time::Duration::from_millis(50);
            loop {
                let attempt = async {
                    let msg = PublishMessage::build()
                        .payload(body.clone())
                        .message_id(&id);
                    self.js.send_publish(subjects::JOURNAL, msg).await?.await?;
                    Ok::<(), async_nats::Error>(())
                };
                match attempt.await {
                    Ok(()) => break,
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::warn!("journal append failed ({e}); retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_secs(1));
                    }
                    Err(e) => {
                        return Err(anyhow::anyhow!(
                            "the journal did not take an append for 30 s: {e}"
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}
