//! The durable journal: broker events in a JetStream stream, and snapshots of broker state in a JetStream
//! object store.
//!
//! The reactor appends to a buffer; the shell stores what a batch of steps appended as one message (a
//! [`Batch`]; group commit) and waits for JetStream's acknowledgement before it sends the steps' messages or
//! answers their callers. Every append is fenced: it carries the stream sequence this broker last saw
//! (`Nats-Expected-Last-Sequence`), so a broker that lost its lease and wakes up cannot append after the new
//! active broker has; its append is refused ([`StoreError::Fenced`]) and it steps down.
//!
//! At start the broker loads the latest snapshot and replays only the batches stored after it; snapshots are
//! written in the background every `snapshot_every` records, so recovery time follows the live state, not
//! the length of history. The stream itself is kept whole: it is the record of what happened.

use anyhow::Context;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, consumer, object_store, stream};
use bytes::Bytes;
use futures::StreamExt;
use meridian_core::durable::{self, Batch};
use meridian_core::journal::Record;
use meridian_core::snapshot::Snapshot;
use meridian_federation::subjects;
use std::collections::BTreeSet;
use tokio::io::AsyncReadExt;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another broker appended since this one last did: this one is no longer the active broker.
    #[error("the journal was appended to by another broker (expected last sequence {expected}, found {found}): this broker is no longer active")]
    Fenced { expected: u64, found: u64 },
    #[error("the journal did not take an append for 30 s: {0}")]
    Unavailable(String),
    /// A journal message could not be read: nothing is written until it is set aside.
    #[error("{0}")]
    ReadOnly(String),
}

/// What the journal holds at start.
pub struct Recovered {
    pub snapshot: Option<Snapshot>,
    /// Batches stored after the snapshot (all of them without one), oldest first, up to the first message no
    /// broker could read (if any: see [`JetStreamJournal::unreadable`]).
    pub batches: Vec<Batch>,
}

/// A journal message that could not be read, and what was read after it.
#[derive(Debug)]
struct Stuck {
    seq: u64,
    reason: String,
    rest: Vec<(u64, Result<Batch, durable::FormatError>)>,
}

/// Orders what was read into the batches to replay and the first unreadable message not set aside (with what
/// follows it). Messages named by a quarantine marker anywhere in `read` are skipped.
fn settle(read: Vec<(u64, Result<Batch, durable::FormatError>)>) -> (Vec<Batch>, Option<Stuck>) {
    let set_aside: BTreeSet<u64> = read
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flat_map(|b| b.quarantine.iter().copied())
        .collect();
    let mut batches = Vec::new();
    let mut stuck: Option<Stuck> = None;
    for (seq, r) in read {
        match (&mut stuck, r) {
            (Some(s), r) => s.rest.push((seq, r)),
            (None, Ok(b)) => batches.push(b),
            (None, Err(_)) if set_aside.contains(&seq) => {}
            (None, Err(e)) => {
                stuck = Some(Stuck {
                    seq,
                    reason: e.to_string(),
                    rest: Vec::new(),
                })
            }
        }
    }
    (batches, stuck)
}

/// What a broker says while an unreadable journal message keeps it read-only.
pub fn read_only(seq: u64, reason: &str) -> String {
    format!(
        "the broker is read-only: journal message {seq} cannot be read ({reason}); reads are answered, changes \
         wait until an administrator sets the message aside with `meridian journal quarantine {seq}`"
    )
}

/// How long an append is retried (through a NATS restart, say) before the broker stops.
const STORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
/// A batch's message stays well below NATS's default 1 MiB payload limit; larger batches are split.
const MAX_MESSAGE: usize = 768 * 1024;
/// Records between snapshots.
pub const SNAPSHOT_EVERY: u64 = 20_000;
const SNAPSHOT_BUCKET: &str = "MERIDIAN_SNAPSHOTS";
const SNAPSHOT_OBJECT: &str = "broker-state";

pub struct JetStreamJournal {
    js: jetstream::Context,
    stream: stream::Stream,
    instance: String,
    next_batch: u64,
    /// Sequence of the last message in the stream as this broker knows it: its next append must follow it.
    last_seq: u64,
    /// Records stored since the last snapshot was taken.
    since_snapshot: u64,
    /// Records between snapshots.
    pub snapshot_every: u64,
    snapshots: tokio::sync::watch::Sender<Option<Bytes>>,
    /// The first message no broker could read, not yet set aside: nothing after it is replayed, and nothing
    /// is written, until an operator sets it aside.
    stuck: Option<Stuck>,
}

impl JetStreamJournal {
    /// Opens (or creates) the journal stream and the snapshot store. `replicas` is the number of copies
    /// JetStream keeps (1 on a single server, 3 on a cluster).
    pub async fn open(
        client: async_nats::Client,
        instance: String,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        let mut js = jetstream::new(client);
        // A server that has just rejoined its cluster can leave a request unanswered: give up on it soon and
        // try again (opening is retried by the caller, appends here).
        js.set_timeout(std::time::Duration::from_secs(2));
        let stream = js
            .get_or_create_stream(stream::Config {
                name: subjects::JOURNAL_STREAM.to_owned(),
                subjects: vec![subjects::JOURNAL.to_owned()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .context("opening the journal stream (is JetStream enabled on the NATS server?)")?;
        let store = match js.get_object_store(SNAPSHOT_BUCKET).await {
            Ok(s) => s,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: SNAPSHOT_BUCKET.to_owned(),
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .context("creating the snapshot store")?,
        };
        let (tx, rx) = tokio::sync::watch::channel(None);
        tokio::spawn(upload_snapshots(store, rx));
        Ok(JetStreamJournal {
            js,
            stream,
            instance,
            next_batch: 0,
            last_seq: 0,
            since_snapshot: 0,
            snapshot_every: SNAPSHOT_EVERY,
            snapshots: tx,
            stuck: None,
        })
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Loads the latest snapshot and the records stored after it. A snapshot that cannot be read is reported
    /// and ignored: the whole journal is replayed instead.
    /// Like [`Self::recover`], retried for a minute: a cluster may still be electing the stream's leader.
    pub async fn recover_patiently(&mut self) -> anyhow::Result<Recovered> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match self.recover().await {
                Ok(r) => return Ok(r),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!("reading the journal: {e:#}; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub async fn recover(&mut self) -> anyhow::Result<Recovered> {
        let snapshot = match self.load_snapshot().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("ignoring the snapshot ({e:#}); replaying the whole journal");
                None
            }
        };
        let from = snapshot.as_ref().map_or(0, |s| s.journal_seq);
        let (read, last) = self.read_after(from).await?;
        self.last_seq = last.max(from);
        let (batches, stuck) = settle(read);
        self.stuck = stuck;
        Ok(Recovered { snapshot, batches })
    }

    /// The message that keeps this broker read-only, and why it could not be read.
    pub fn unreadable(&self) -> Option<(u64, &str)> {
        self.stuck.as_ref().map(|s| (s.seq, s.reason.as_str()))
    }

    /// Sets the unreadable message `seq` aside (an operator's decision): a marker batch names it, so every replay
    /// from now on skips it (the message itself stays in the stream, unread, for whoever investigates). Returns
    /// the batches that followed it, to replay, up to the next unreadable message if there is one.
    pub async fn quarantine(&mut self, format: u32, seq: u64) -> anyhow::Result<Vec<Batch>> {
        match &self.stuck {
            None => anyhow::bail!("every journal message is readable: nothing to set aside"),
            Some(s) if s.seq != seq => anyhow::bail!(
                "journal message {seq} is not the unreadable one: message {} is ({})",
                s.seq,
                s.reason
            ),
            Some(_) => {}
        }
        self.append_batch(format, Vec::new(), vec![seq]).await?;
        let rest = self.stuck.take().map(|s| s.rest).unwrap_or_default();
        let (batches, stuck) = settle(rest);
        self.stuck = stuck;
        Ok(batches)
    }

    async fn load_snapshot(&self) -> anyhow::Result<Option<Snapshot>> {
        let store = self.js.get_object_store(SNAPSHOT_BUCKET).await?;
        let mut object = match store.get(SNAPSHOT_OBJECT).await {
            Ok(o) => o,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context("reading the snapshot"),
        };
        let mut bytes = Vec::new();
        object
            .read_to_end(&mut bytes)
            .await
            .context("reading the snapshot")?;
        let snap = durable::decode_snapshot(&bytes).context("reading the snapshot")?;
        Ok(Some(snap))
    }

    /// The messages after sequence `from`, up to the stream's end when the read began, each a batch or why it
    /// is unreadable, and the last sequence read. A batch of a newer format than this broker knows is an error:
    /// the broker stops and says so (such a message is never set aside, only reported).
    async fn read_after(
        &self,
        from: u64,
    ) -> anyhow::Result<(Vec<(u64, Result<Batch, durable::FormatError>)>, u64)> {
        let mut stream = self.stream.clone();
        let info = stream.info().await.context("reading the journal's state")?;
        let end = info.state.last_sequence;
        if end <= from {
            return Ok((Vec::new(), end));
        }
        let consumer = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from + 1,
                },
                ..Default::default()
            })
            .await
            .context("reading the journal")?;
        let mut messages = consumer.messages().await.context("reading the journal")?;
        let mut out = Vec::new();
        let mut last = from;
        while last < end {
            let Some(m) = messages.next().await else {
                break;
            };
            let m = m.context("reading the journal")?;
            let seq = m
                .info()
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .stream_sequence;
            let batch = match durable::decode_batch(&m.payload) {
                Ok(b) => Ok(b),
                Err(e @ durable::FormatError::Newer { .. }) => {
                    return Err(anyhow::Error::new(e).context(format!("journal message {seq}")))
                }
                Err(e) => Err(e),
            };
            out.push((seq, batch));
            last = seq;
        }
        Ok((out, last))
    }

    /// The batches stored since this broker last read or wrote, up to the first unreadable message not set
    /// aside (after which nothing is returned until it is set aside).
    pub async fn catch_up(&mut self) -> anyhow::Result<Vec<Batch>> {
        let (read, last) = self.read_after(self.last_seq).await?;
        self.last_seq = last.max(self.last_seq);
        if let Some(s) = &mut self.stuck {
            s.rest.extend(read);
            return Ok(Vec::new());
        }
        let (batches, stuck) = settle(read);
        self.stuck = stuck;
        Ok(batches)
    }

    /// Appends an empty batch to fence out any earlier active broker. If another broker appended since this one
    /// recovered, the batches it appended are returned (to be replayed) and the marker is tried again.
    pub async fn take_over(&mut self, format: u32) -> anyhow::Result<Vec<Batch>> {
        let mut late = Vec::new();
        let deadline = tokio::time::Instant::now() + STORE_PATIENCE;
        loop {
            match self.append(format, Vec::new()).await {
                Ok(()) => return Ok(late),
                Err(StoreError::Fenced { .. }) => match self.catch_up().await {
                    Ok(batches) => late.extend(batches),
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::warn!("reading the journal: {e:#}; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Stores the records of a batch of steps (split into messages below the payload limit), each message
    /// acknowledged by JetStream before the next.
    pub async fn store(&mut self, format: u32, records: Vec<Record>) -> Result<(), StoreError> {
        if let Some(s) = &self.stuck {
            return Err(StoreError::ReadOnly(read_only(s.seq, &s.reason)));
        }
        let n = records.len() as u64;
        let mut chunk = Vec::new();
        let mut size = 0;
        for r in records {
            let len = serde_json::to_vec(&r).map_or(0, |v| v.len());
            if !chunk.is_empty() && size + len > MAX_MESSAGE {
                self.append(format, std::mem::take(&mut chunk)).await?;
                size = 0;
            }
            size += len;
            chunk.push(r);
        }
        if !chunk.is_empty() {
            self.append(format, chunk).await?;
        }
        self.since_snapshot += n;
        Ok(())
    }

    /// Whether enough records were stored since the last snapshot that another is due: at least
    /// `snapshot_every`, and at least twice the number of jobs and sites in a snapshot (`held`), so that the
    /// cost of snapshots, which grows with the state, stays a constant share of the cost of appending (a
    /// federation of 100,000 sites joining is not snapshotted five times over).
    pub fn snapshot_due(&self, held: usize) -> bool {
        self.since_snapshot >= self.snapshot_every.max(2 * held as u64)
    }

    /// Hands a snapshot (taken right after a store, so it includes everything up to [`Self::last_seq`]) to the
    /// background uploader; only the newest waiting one is written.
    pub fn save_snapshot(&mut self, snap: &Snapshot) {
        match durable::encode_snapshot(snap) {
            Ok(bytes) => {
                self.since_snapshot = 0;
                let _ = self.snapshots.send(Some(Bytes::from(bytes)));
            }
            Err(e) => tracing::error!("could not encode a snapshot: {e}"),
        }
    }

    async fn append(&mut self, format: u32, records: Vec<Record>) -> Result<(), StoreError> {
        self.append_batch(format, records, Vec::new()).await
    }

    /// One fenced message, retried with the same content for up to [`STORE_PATIENCE`].
    async fn append_batch(
        &mut self,
        format: u32,
        records: Vec<Record>,
        quarantine: Vec<u64>,
    ) -> Result<(), StoreError> {
        self.next_batch += 1;
        let batch = Batch {
            format,
            leader: self.instance.clone(),
            n: self.next_batch,
            records,
            quarantine,
        };
        let body = Bytes::from(
            durable::encode_batch(&batch).map_err(|e| StoreError::Unavailable(e.to_string()))?,
        );
        let deadline = tokio::time::Instant::now() + STORE_PATIENCE;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let msg = PublishMessage::build()
                .payload(body.clone())
                .expected_last_sequence(self.last_seq);
            let attempt = async {
                let ack = self.js.send_publish(subjects::JOURNAL, msg).await?.await?;
                Ok::<u64, async_nats::jetstream::context::PublishError>(ack.sequence)
            };
            let err = match attempt.await {
                Ok(seq) => {
                    self.last_seq = seq;
                    return Ok(());
                }
                Err(e) => e,
            };
            if err.kind() == PublishErrorKind::WrongLastSequence {
                // Either another broker appended, or an earlier try of this very batch was stored and only
                // its acknowledgement was lost.
                match self.last_message().await {
                    Ok((seq, Some((leader, n)))) if leader == batch.leader && n == batch.n => {
                        self.last_seq = seq;
                        return Ok(());
                    }
                    Ok((found, _)) => {
                        return Err(StoreError::Fenced {
                            expected: self.last_seq,
                            found,
                        })
                    }
                    Err(e) => tracing::warn!("reading the journal's last message: {e:#}"),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Unavailable(err.to_string()));
            }
            tracing::warn!("journal append failed ({err}); retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }

    /// The stream's last message: its sequence and writer.
    async fn last_message(&self) -> anyhow::Result<(u64, Option<(String, u64)>)> {
        let m = self
            .stream
            .get_last_raw_message_by_subject(subjects::JOURNAL)
            .await?;
        #[derive(serde::Deserialize)]
        struct Head {
            leader: String,
            n: u64,
        }
        let head = serde_json::from_slice::<Head>(&m.payload)
            .ok()
            .map(|h| (h.leader, h.n));
        Ok((m.sequence, head))
    }
}

/// Writes the newest snapshot handed over, one at a time, so an older one never replaces a newer one.
async fn upload_snapshots(
    store: object_store::ObjectStore,
    mut rx: tokio::sync::watch::Receiver<Option<Bytes>>,
) {
    while rx.changed().await.is_ok() {
        let Some(bytes) = rx.borrow_and_update().clone() else {
            continue;
        };
        let started = tokio::time::Instant::now();
        match store.put(SNAPSHOT_OBJECT, &mut bytes.as_ref()).await {
            Ok(_) => tracing::info!(
                "snapshot stored: {} KiB in {} ms",
                bytes.len() / 1024,
                started.elapsed().as_millis()
            ),
            Err(e) => {
                tracing::warn!("could not store a snapshot (the next one will be tried): {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u64, quarantine: Vec<u64>) -> Result<Batch, durable::FormatError> {
        Ok(Batch {
            format: durable::FORMAT_VERSION,
            leader: "b".into(),
            n,
            records: Vec::new(),
            quarantine,
        })
    }

    fn ns(batches: &[Batch]) -> Vec<u64> {
        batches.iter().map(|b| b.n).collect()
    }

    #[test]
    fn an_unreadable_message_stops_replay_and_keeps_what_follows() {
        let read = vec![
            (1, batch(1, vec![])),
            (2, Err(durable::FormatError::Unreadable("garbage".into()))),
            (3, batch(3, vec![])),
            (
                4,
                Err(durable::FormatError::Unreadable("more garbage".into())),
            ),
            (5, batch(5, vec![])),
        ];
        let (batches, stuck) = settle(read);
        assert_eq!(ns(&batches), vec![1]);
        let stuck = stuck.expect("message 2 is unreadable");
        assert_eq!(
            (stuck.seq, stuck.reason.as_str()),
            (2, "unreadable: garbage")
        );
        // Set aside, message 2 lets 3 through and stops again at 4.
        let (batches, stuck) = settle(stuck.rest);
        assert_eq!(ns(&batches), vec![3]);
        assert_eq!(stuck.map(|s| s.seq), Some(4));
    }

    #[test]
    fn a_quarantine_marker_skips_the_message_it_names_at_every_replay() {
        let read = vec![
            (1, batch(1, vec![])),
            (2, Err(durable::FormatError::Unreadable("garbage".into()))),
            (3, batch(3, vec![])),
            (4, batch(4, vec![2])),
            (
                5,
                Err(durable::FormatError::Unreadable("later garbage".into())),
            ),
        ];
        let (batches, stuck) = settle(read);
        assert_eq!(ns(&batches), vec![1, 3, 4]);
        assert_eq!(
            stuck.map(|s| s.seq),
            Some(5),
            "only the named message is skipped"
        );
    }
}
