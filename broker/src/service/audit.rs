//! The audit trail: who did what, when, and how it ended, in the JetStream stream `MERIDIAN_AUDIT`.
//!
//! The reactor task hands over the audited actions of each journal batch after the batch is stored: one
//! message per batch, never one per submission. Refusals (a missing or bad token, a missing permission, a rate
//! limit, a site speaking for another or of an attempt it does not hold) are counted per credential, action
//! and reason, and written once per interval, so a flood of forgeries is a handful of writes. The stream keeps
//! a bounded history (age and size limits); it outlives broker restarts and failover like the journal.

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use meridian_federation::{subjects, AuditEntry, AuditPage, AuditRequest, UnreadableView};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long refusals are counted before they are written.
const REFUSALS_EVERY: Duration = Duration::from_secs(5);
/// The stream keeps 180 days, and at most 1 GiB.
const MAX_AGE: Duration = Duration::from_secs(180 * 24 * 3600);
const MAX_BYTES: i64 = 1 << 30;
/// A page of the trail stops before this many bytes.
const PAGE_BYTES: usize = 768 * 1024;

enum Msg {
    Batch(Vec<AuditEntry>),
    Refused(AuditEntry),
}

/// Where the broker's parts send what is audited.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::UnboundedSender<Msg>,
    store: Store,
}

#[derive(Clone)]
enum Store {
    JetStream(stream::Stream),
    /// The shell harness's stand-in (tests only): every entry as it was handed over, refusals uncounted.
    #[cfg(test)]
    Memory(std::sync::Arc<std::sync::Mutex<Vec<AuditEntry>>>),
}

impl Audit {
    /// Opens the stream and starts the writer.
    pub async fn open(client: async_nats::Client, replicas: usize) -> anyhow::Result<Self> {
        let mut js = jetstream::new(client);
        js.set_timeout(Duration::from_secs(5));
        let stream = js
            .get_or_create_stream(stream::Config {
                name: subjects::AUDIT_STREAM.to_owned(),
                subjects: vec![subjects::AUDIT.to_owned()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                max_age: MAX_AGE,
                max_bytes: MAX_BYTES,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            })
            .await
            .context("opening the audit stream")?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(js, rx));
        Ok(Audit {
            tx,
            store: Store::JetStream(stream),
        })
    }

    /// An audit kept in memory, for the shell harness.
    #[cfg(test)]
    pub fn in_memory() -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let kept: std::sync::Arc<std::sync::Mutex<Vec<AuditEntry>>> = Default::default();
        let into = kept.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let entries = match msg {
                    Msg::Batch(entries) => entries,
                    Msg::Refused(e) => vec![e],
                };
                if let Ok(mut kept) = into.lock() {
                    kept.extend(entries);
                }
            }
        });
        Audit {
            tx,
            store: Store::Memory(kept),
        }
    }

    /// The stream (`None`: the harness's memory, read by [`Audit::read`] itself).
    fn stream(&self) -> Option<&stream::Stream> {
        match &self.store {
            Store::JetStream(s) => Some(s),
            #[cfg(test)]
            Store::Memory(_) => None,
        }
    }

    /// The audited actions of one stored journal batch.
    pub fn batch(&self, entries: Vec<AuditEntry>) {
        if !entries.is_empty() {
            let _ = self.tx.send(Msg::Batch(entries));
        }
    }

    /// A refusal, to be counted.
    pub fn refused(&self, at_ms: u64, who: &str, action: &str, reason: &str) {
        let _ = self.tx.send(Msg::Refused(AuditEntry {
            at_ms,
            who: who.to_owned(),
            action: action.to_owned(),
            target: None,
            outcome: format!("refused: {reason}"),
            count: 1,
            until_ms: None,
        }));
    }

    /// A page of the trail: oldest first from `after_seq`, or newest first before `before_seq`. A message
    /// that cannot be read is left out and named in the page's `unreadable`; the rest is answered.
    pub async fn read(&self, req: &AuditRequest) -> anyhow::Result<AuditPage> {
        #[cfg(test)]
        if let Store::Memory(kept) = &self.store {
            let mut page = AuditPage::default();
            let body = serde_json::to_vec(&*kept.lock().map_err(|_| anyhow::anyhow!("poisoned"))?)?;
            take(&mut page, req, 1, &body, req.newest_first);
            return Ok(page);
        }
        if req.newest_first {
            return self.read_newest(req).await;
        }
        let Some(stream) = self.stream() else {
            return Ok(AuditPage::default());
        };
        let limit = limit(req);
        let mut s = stream.clone();
        let last = s
            .info()
            .await
            .context("reading the audit")?
            .state
            .last_sequence;
        let mut page = AuditPage::default();
        let from = req.after_seq.map_or(1, |s| s + 1);
        if last < from {
            return Ok(page);
        }
        let deliver_policy = match (req.after_seq, req.since_ms) {
            (None, Some(ms)) => consumer::DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from_unix_timestamp_nanos(
                    i128::from(ms) * 1_000_000,
                )
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
            },
            _ => consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy,
                ..Default::default()
            })
            .await
            .context("reading the audit")?;
        let mut messages = consumer.messages().await.context("reading the audit")?;
        let mut bytes = 0usize;
        while let Some(m) = messages.next().await {
            let m = m.context("reading the audit")?;
            let seq = m
                .info()
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .stream_sequence;
            bytes += take(&mut page, req, seq, &m.payload, false);
            if seq >= last {
                return Ok(page);
            }
            if page.entries.len() >= limit || bytes > PAGE_BYTES {
                page.next = Some(seq);
                return Ok(page);
            }
        }
        Ok(page)
    }

    /// Newest first: messages read one by one downwards from `before_seq` (or the newest).
    async fn read_newest(&self, req: &AuditRequest) -> anyhow::Result<AuditPage> {
        let Some(stream) = self.stream() else {
            return Ok(AuditPage::default());
        };
        let limit = limit(req);
        let mut s = stream.clone();
        let state = s.info().await.context("reading the audit")?.state.clone();
        let mut page = AuditPage::default();
        let top = req.before_seq.map_or(state.last_sequence, |b| {
            b.saturating_sub(1).min(state.last_sequence)
        });
        let mut bytes = 0usize;
        let mut seq = top;
        while seq >= state.first_sequence.max(1) {
            let m = match stream.get_raw_message(seq).await {
                Ok(m) => m,
                Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {
                    seq -= 1;
                    continue;
                }
                Err(e) => return Err(e).context("reading the audit"),
            };
            // Everything below was stored before this one: older than `since`, when this is.
            let stored_ms = (m.time.unix_timestamp_nanos() / 1_000_000) as u64;
            if req.since_ms.is_some_and(|since| stored_ms < since) {
                break;
            }
            bytes += take(&mut page, req, seq, &m.payload, true);
            if page.entries.len() >= limit || bytes > PAGE_BYTES {
                page.next = (seq > state.first_sequence.max(1)).then_some(seq);
                break;
            }
            seq -= 1;
        }
        Ok(page)
    }
}

fn limit(req: &AuditRequest) -> usize {
    req.limit.unwrap_or(500).clamp(1, 5_000) as usize
}

/// Adds the wanted entries of message `seq` to the page (newest first when `reversed`), or names the message
/// as unreadable; returns the bytes added.
fn take(
    page: &mut AuditPage,
    req: &AuditRequest,
    seq: u64,
    payload: &[u8],
    reversed: bool,
) -> usize {
    let mut entries: Vec<AuditEntry> = match serde_json::from_slice(payload) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(
                "{} message {seq} cannot be read, left out: {e}",
                subjects::AUDIT_STREAM
            );
            page.unreadable.push(UnreadableView {
                seq,
                reason: format!("not audit entries: {e}"),
            });
            return 0;
        }
    };
    if reversed {
        entries.reverse();
    }
    let mut bytes = 0;
    for e in entries {
        let wanted = req.who.as_ref().is_none_or(|w| w == &e.who)
            && req
                .since_ms
                .is_none_or(|s| e.until_ms.unwrap_or(e.at_ms) >= s);
        if wanted {
            bytes += serde_json::to_vec(&e).map_or(0, |b| b.len());
            page.entries.push(e);
        }
    }
    bytes
}

/// Writes batches as they come and counted refusals once per interval.
async fn writer(js: jetstream::Context, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut refusals: BTreeMap<(String, String, String), AuditEntry> = BTreeMap::new();
    let mut every = tokio::time::interval(REFUSALS_EVERY);
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Batch(entries)) => publish(&js, &entries).await,
                Some(Msg::Refused(e)) => {
                    let key = (e.who.clone(), e.action.clone(), e.outcome.clone());
                    refusals
                        .entry(key)
                        .and_modify(|r| {
                            r.count += 1;
                            r.until_ms = Some(e.at_ms);
                        })
                        .or_insert(e);
                }
                None => break,
            },
            _ = every.tick() => {
                if !refusals.is_empty() {
                    let entries: Vec<AuditEntry> = std::mem::take(&mut refusals).into_values().collect();
                    publish(&js, &entries).await;
                }
            }
        }
    }
    if !refusals.is_empty() {
        let entries: Vec<AuditEntry> = refusals.into_values().collect();
        publish(&js, &entries).await;
    }
}

/// One message; retried a few times (the stream may be electing a leader).
async fn publish(js: &jetstream::Context, entries: &[AuditEntry]) {
    let Ok(body) = serde_json::to_vec(entries) else {
        return;
    };
    let body = Bytes::from(body);
    for attempt in 0..5 {
        let stored = match js.publish(subjects::AUDIT, body.clone()).await {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match stored {
            Ok(()) => return,
            Err(e) if attempt == 4 => {
                tracing::error!("{} audit entries could not be stored: {e}", entries.len());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200 << attempt)).await,
        }
    }
}
