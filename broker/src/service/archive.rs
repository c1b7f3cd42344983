//! The archive: finished jobs leave the broker's live state into JetStream, so memory, snapshots and recovery
//! follow the live jobs while every job stays readable.
//!
//! Two streams. `MERIDIAN_ARCHIVE` holds one message per archived job on its own subject (the latest kept):
//! the job's record, and its API views as they were when it was archived, so `GET /v1/jobs/{id}`, explain and
//! logs answer for it, and listings page through it in archive order. `MERIDIAN_LEDGER` holds the metering
//! ledger of each archived batch, compact, for reports. The broker writes a batch here, waits for the
//! acknowledgements, and only then journals `Archived` (the jobs leave the live state); a crash in between
//! archives them again, which overwrites the same subjects.

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use meridian_core::ledger::LedgerEntry;
use meridian_core::model::Job;
use meridian_federation::subjects;
use meridian_federation::{ExplainView, JobId, JobView, UnreadableView};
use serde::{Deserialize, Serialize};
#[cfg(test)]
use std::collections::BTreeMap;

/// The format of archive and ledger messages (see `meridian_core::durable`).
const ARCHIVE_FORMAT: u32 = 1;
/// Archived jobs are kept this long.
const ARCHIVE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(400 * 24 * 3600);

/// One archived job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Archived {
    pub format: u32,
    pub job: Job,
    pub view: JobView,
    pub explain: ExplainView,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct LedgerBatch {
    format: u32,
    entries: Vec<LedgerEntry>,
}

/// Gives an archived job to a scan's `keep` (whether it wants more). A message no broker wrote is left out of
/// listings (and named in the log); the rest still reads.
fn offer(seq: u64, payload: &[u8], keep: &mut impl FnMut(Archived) -> bool) -> bool {
    match decode(payload) {
        Ok(a) => keep(a),
        Err(e) => {
            tracing::warn!(
                "{} message {seq} cannot be read, left out: {e:#}",
                subjects::ARCHIVE_STREAM
            );
            true
        }
    }
}

#[derive(Clone)]
pub struct Archive {
    store: Store,
}

#[derive(Clone)]
enum Store {
    JetStream {
        js: jetstream::Context,
        jobs: stream::Stream,
        ledger: stream::Stream,
    },
    /// The shell harness's stand-in (tests only): archived jobs by sequence, and the ledger.
    #[cfg(test)]
    Memory(memory::Shared),
}

impl Archive {
    pub async fn open(client: async_nats::Client, replicas: usize) -> anyhow::Result<Self> {
        let mut js = jetstream::new(client);
        js.set_timeout(std::time::Duration::from_secs(5));
        let jobs = js
            .get_or_create_stream(stream::Config {
                name: subjects::ARCHIVE_STREAM.to_owned(),
                subjects: vec![subjects::ARCHIVE_JOBS.to_owned()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                max_messages_per_subject: 1,
                max_age: ARCHIVE_MAX_AGE,
                allow_direct: true,
                ..Default::default()
            })
            .await
            .context("opening the archive stream")?;
        let ledger = js
            .get_or_create_stream(stream::Config {
                name: subjects::LEDGER_STREAM.to_owned(),
                subjects: vec![subjects::LEDGER.to_owned()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                max_age: ARCHIVE_MAX_AGE,
                ..Default::default()
            })
            .await
            .context("opening the ledger stream")?;
        Ok(Archive {
            store: Store::JetStream { js, jobs, ledger },
        })
    }

    /// An archive in memory, for the shell harness.
    #[cfg(test)]
    pub fn in_memory() -> Self {
        Archive {
            store: Store::Memory(Default::default()),
        }
    }

    /// The JetStream streams (`None`: the harness's memory).
    fn streams(&self) -> Option<(&jetstream::Context, &stream::Stream, &stream::Stream)> {
        match &self.store {
            Store::JetStream { js, jobs, ledger } => Some((js, jobs, ledger)),
            #[cfg(test)]
            Store::Memory(_) => None,
        }
    }

    /// Stores finished jobs with their views, and their ledger; returns once JetStream has acknowledged all.
    pub async fn store(&self, jobs: Vec<(Job, JobView, ExplainView)>) -> anyhow::Result<()> {
        #[cfg(test)]
        if let Store::Memory(m) = &self.store {
            return memory::store(m, jobs);
        }
        let Some((js, _, _)) = self.streams() else {
            return Ok(());
        };
        let mut acks = Vec::with_capacity(jobs.len() + 1);
        let entries: Vec<LedgerEntry> = jobs.iter().map(|(j, _, _)| LedgerEntry::of(j)).collect();
        for (job, mut view, explain) in jobs {
            view.archived = true;
            let subject = subjects::archived_job(&job.id);
            let body = serde_json::to_vec(&Archived {
                format: ARCHIVE_FORMAT,
                job,
                view,
                explain,
            })?;
            acks.push(js.publish(subject, Bytes::from(body)).await?);
        }
        let body = serde_json::to_vec(&LedgerBatch {
            format: ARCHIVE_FORMAT,
            entries,
        })?;
        acks.push(js.publish(subjects::LEDGER, Bytes::from(body)).await?);
        for ack in acks {
            ack.await.context("archiving finished jobs")?;
        }
        Ok(())
    }

    /// An archived job, by id.
    pub async fn job(&self, id: &JobId) -> anyhow::Result<Option<Archived>> {
        #[cfg(test)]
        if let Store::Memory(m) = &self.store {
            return Ok(memory::job(m, id));
        }
        let Some((_, jobs, _)) = self.streams() else {
            return Ok(None);
        };
        match jobs
            .direct_get_last_for_subject(subjects::archived_job(id))
            .await
        {
            Ok(m) => Ok(Some(decode(&m.payload)?)),
            Err(e) if e.kind() == async_nats::jetstream::stream::DirectGetErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e).context("reading the archive"),
        }
    }

    /// Archived jobs from stream sequence `from` on, for as long as `keep` asks for more; returns the sequence
    /// to go on from, or `None` at the end of the stream.
    pub async fn scan(
        &self,
        from: u64,
        mut keep: impl FnMut(Archived) -> bool,
    ) -> anyhow::Result<Option<u64>> {
        #[cfg(test)]
        if let Store::Memory(m) = &self.store {
            return Ok(memory::scan(m, from, keep));
        }
        let Some((_, jobs, _)) = self.streams() else {
            return Ok(None);
        };
        let mut s = jobs.clone();
        let last = s
            .info()
            .await
            .context("reading the archive")?
            .state
            .last_sequence;
        if last < from.max(1) {
            return Ok(None);
        }
        let consumer = jobs
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from.max(1),
                },
                ..Default::default()
            })
            .await
            .context("reading the archive")?;
        let mut messages = consumer.messages().await.context("reading the archive")?;
        while let Some(m) = messages.next().await {
            let m = m.context("reading the archive")?;
            let seq = m
                .info()
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .stream_sequence;
            let more = offer(seq, &m.payload, &mut keep);
            if seq >= last {
                return Ok(None);
            }
            if !more {
                return Ok(Some(seq + 1));
            }
        }
        Ok(None)
    }

    /// Archived jobs from stream sequence `from` (the newest when `None`) down, the most recently archived
    /// first, for as long as `keep` asks for more; returns the sequence to go on from (downwards), or `None` at
    /// the start of the stream.
    pub async fn scan_back(
        &self,
        from: Option<u64>,
        mut keep: impl FnMut(Archived) -> bool,
    ) -> anyhow::Result<Option<u64>> {
        #[cfg(test)]
        if let Store::Memory(m) = &self.store {
            return Ok(memory::scan_back(m, from, keep));
        }
        let Some((_, jobs, _)) = self.streams() else {
            return Ok(None);
        };
        let mut s = jobs.clone();
        let state = s.info().await.context("reading the archive")?.state.clone();
        let first = state.first_sequence.max(1);
        let mut seq = from.map_or(state.last_sequence, |f| f.min(state.last_sequence));
        while seq >= first && seq > 0 {
            let m = match jobs.get_raw_message(seq).await {
                Ok(m) => m,
                // Overwritten by a later archiving of the same job, or removed by age.
                Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {
                    seq -= 1;
                    continue;
                }
                Err(e) => return Err(e).context("reading the archive"),
            };
            let more = offer(seq, &m.payload, &mut keep);
            seq -= 1;
            if !more {
                return Ok((seq >= first && seq > 0).then_some(seq));
            }
        }
        Ok(None)
    }

    /// The ledger of every archived job, and the ledger messages that could not be read (left out).
    pub async fn ledger(&self) -> anyhow::Result<(Vec<LedgerEntry>, Vec<UnreadableView>)> {
        #[cfg(test)]
        if let Store::Memory(m) = &self.store {
            return Ok((
                m.lock().map(|m| m.1.clone()).unwrap_or_default(),
                Vec::new(),
            ));
        }
        let Some((_, _, ledger)) = self.streams() else {
            return Ok((Vec::new(), Vec::new()));
        };
        let mut s = ledger.clone();
        let last = s
            .info()
            .await
            .context("reading the ledger")?
            .state
            .last_sequence;
        let mut out = Vec::new();
        let mut unreadable = Vec::new();
        if last == 0 {
            return Ok((out, unreadable));
        }
        let consumer = ledger
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .context("reading the ledger")?;
        let mut messages = consumer.messages().await.context("reading the ledger")?;
        while let Some(m) = messages.next().await {
            let m = m.context("reading the ledger")?;
            let seq = m
                .info()
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .stream_sequence;
            match decode::<LedgerBatch>(&m.payload) {
                Ok(batch) => out.extend(batch.entries),
                Err(e) => unreadable.push(UnreadableView {
                    seq,
                    reason: format!("{e:#}"),
                }),
            }
            if seq >= last {
                break;
            }
        }
        Ok((out, unreadable))
    }
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> anyhow::Result<T> {
    #[derive(Deserialize)]
    struct Head {
        format: u32,
    }
    let head: Head = serde_json::from_slice(bytes).context("an archive message is unreadable")?;
    anyhow::ensure!(
        head.format <= ARCHIVE_FORMAT,
        "an archive message has format {}, newer than this broker knows ({ARCHIVE_FORMAT})",
        head.format
    );
    serde_json::from_slice(bytes).context("an archive message is unreadable")
}

/// The harness's archive in memory: one entry per job (a later archiving replaces it, as the stream's
/// per-subject limit does), in sequence order.
#[cfg(test)]
mod memory {
    use super::*;

    /// Archived jobs by sequence, and the ledger.
    pub type Shared = std::sync::Arc<std::sync::Mutex<(BTreeMap<u64, Archived>, Vec<LedgerEntry>)>>;

    pub fn store(m: &Shared, jobs: Vec<(Job, JobView, ExplainView)>) -> anyhow::Result<()> {
        let mut m = m
            .lock()
            .map_err(|_| anyhow::anyhow!("the archive's lock is poisoned"))?;
        for (job, mut view, explain) in jobs {
            view.archived = true;
            m.1.push(LedgerEntry::of(&job));
            m.0.retain(|_, a| a.job.id != job.id);
            let seq = m.0.keys().next_back().map_or(1, |s| s + 1);
            let format = ARCHIVE_FORMAT;
            m.0.insert(
                seq,
                Archived {
                    format,
                    job,
                    view,
                    explain,
                },
            );
        }
        Ok(())
    }

    pub fn job(m: &Shared, id: &JobId) -> Option<Archived> {
        let m = m.lock().ok()?;
        m.0.values().find(|a| &a.job.id == id).cloned()
    }

    pub fn scan(m: &Shared, from: u64, mut keep: impl FnMut(Archived) -> bool) -> Option<u64> {
        let all: Vec<(u64, Archived)> = m
            .lock()
            .ok()?
            .0
            .range(from.max(1)..)
            .map(|(s, a)| (*s, a.clone()))
            .collect();
        let last = all.last().map(|(s, _)| *s)?;
        for (seq, a) in all {
            if !keep(a) && seq < last {
                return Some(seq + 1);
            }
        }
        None
    }

    pub fn scan_back(
        m: &Shared,
        from: Option<u64>,
        mut keep: impl FnMut(Archived) -> bool,
    ) -> Option<u64> {
        let all: Vec<(u64, Archived)> = m
            .lock()
            .ok()?
            .0
            .range(..=from.unwrap_or(u64::MAX))
            .rev()
            .map(|(s, a)| (*s, a.clone()))
            .collect();
        for (seq, a) in all {
            if !keep(a) {
                return (seq > 1).then_some(seq - 1);
            }
        }
        None
    }
}
