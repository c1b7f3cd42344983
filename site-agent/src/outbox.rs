//! Status updates the broker has not acknowledged yet, kept on disk so that they survive a restart of the
//! agent: a job that finished while NATS was unreachable is still reported when the agent comes back, in order.
//!
//! The file is append-only: one JSON line per update, and, when the broker acknowledges updates, an
//! acknowledgement mark `{"ack":N}` saying that the file's first N updates are delivered. Acknowledging costs one
//! short line and one flush, whatever is still waiting; the file is rewritten with only what waits (compacted)
//! when it opens and once the delivered updates are at least [`COMPACT_AFTER`] and half of the file.

use meridian_federation::{decode, encode, JobStatus};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;

/// Delivered updates kept in the file before it is compacted (when they are also half of it or more).
pub const COMPACT_AFTER: u64 = 4096;

/// An acknowledgement mark: the first `ack` update lines of the file are delivered.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AckMark {
    ack: u64,
}

#[derive(Debug)]
pub struct StatusOutbox {
    path: PathBuf,
    queue: VecDeque<JobStatus>,
    /// Updates acknowledged since this agent started (part of the inventory mark: the set of attempts
    /// with an end still to deliver shrinks with it).
    acked: u64,
    /// The file's first update lines that are delivered (the last mark written); the rest are `queue`.
    delivered: u64,
    compact_after: u64,
}

impl StatusOutbox {
    /// Opens the outbox at `path`, loading what an earlier run left unacknowledged. Unreadable lines are
    /// skipped and counted in the log; each still counts as one update for the marks after it.
    pub fn open(path: PathBuf) -> std::io::Result<Self> {
        Self::open_compacting_after(path, COMPACT_AFTER)
    }

    fn open_compacting_after(path: PathBuf, compact_after: u64) -> std::io::Result<Self> {
        let mut updates: Vec<(u64, JobStatus)> = Vec::new();
        let mut delivered = 0;
        if let Ok(text) = std::fs::read_to_string(&path) {
            let (mut bad, mut slot) = (0, 0u64);
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                if let Ok(mark) = serde_json::from_str::<AckMark>(line) {
                    delivered = mark.ack;
                    continue;
                }
                match decode::<JobStatus>(line.as_bytes()) {
                    Ok(s) => updates.push((slot, s)),
                    Err(_) => bad += 1,
                }
                slot += 1;
            }
            if bad > 0 {
                tracing::warn!("{}: skipped {bad} unreadable status lines", path.display());
            }
        }
        let mut outbox = StatusOutbox {
            path,
            queue: updates
                .into_iter()
                .filter(|(slot, _)| *slot >= delivered)
                .map(|(_, s)| s)
                .collect(),
            acked: 0,
            delivered: 0,
            compact_after,
        };
        outbox.rewrite()?;
        Ok(outbox)
    }

    /// Adds an update at the end, on disk before it returns.
    pub fn push(&mut self, status: JobStatus) -> std::io::Result<()> {
        self.push_unsynced(status)?;
        self.sync()
    }

    /// Adds an update at the end, written but not yet forced to disk: [`Self::sync`] does that for every update
    /// written before it (one flush for a burst of updates).
    pub fn push_unsynced(&mut self, status: JobStatus) -> std::io::Result<()> {
        let mut line = encode(&status).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.append(&line, false)?;
        self.queue.push_back(status);
        Ok(())
    }

    /// Forces every update written so far to disk.
    pub fn sync(&self) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.path)?
            .sync_data()
    }

    /// The oldest unacknowledged update.
    pub fn front(&self) -> Option<&JobStatus> {
        self.queue.front()
    }

    /// Drops the oldest update (the broker acknowledged it).
    pub fn pop(&mut self) -> std::io::Result<()> {
        self.pop_n(1)
    }

    /// The oldest `n` updates, oldest first.
    pub fn head(&self, n: usize) -> Vec<JobStatus> {
        self.queue.iter().take(n).cloned().collect()
    }

    /// Drops the oldest `n` updates (the broker acknowledged them): one mark appended and flushed, or, when
    /// delivered updates fill enough of the file, one rewrite of what still waits.
    pub fn pop_n(&mut self, n: usize) -> std::io::Result<()> {
        let n = n.min(self.queue.len());
        if n == 0 {
            return Ok(());
        }
        self.queue.drain(..n);
        self.acked += n as u64;
        self.delivered += n as u64;
        // Delivered lines at least half of the file: at least as many as those still waiting.
        if self.delivered >= self.compact_after && self.delivered >= self.queue.len() as u64 {
            return self.rewrite();
        }
        let mut line = serde_json::to_vec(&AckMark {
            ack: self.delivered,
        })
        .map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.append(&line, true)
    }

    /// Updates acknowledged since this agent started.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// The attempts whose end is still to be delivered.
    pub fn pending_ends(&self) -> Vec<meridian_federation::AttemptRef> {
        self.queue
            .iter()
            .filter(|s| s.state.is_terminal())
            .map(|s| meridian_federation::AttemptRef {
                job: s.job.clone(),
                attempt: s.attempt,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Appends `line` to the file, forced to disk with `sync`.
    fn append(&self, line: &[u8], sync: bool) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(line)?;
        if sync {
            f.sync_data()?;
        }
        Ok(())
    }

    /// Replaces the file by the updates still waiting (through a flushed temporary file and a rename).
    fn rewrite(&mut self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        for s in &self.queue {
            let mut line = encode(s).map_err(std::io::Error::other)?;
            line.push(b'\n');
            f.write_all(&line)?;
        }
        f.sync_data()?;
        std::fs::rename(&tmp, &self.path)?;
        self.delivered = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use meridian_federation::{AttemptState, JobId, SiteId};

    fn status(job: &str, state: AttemptState) -> JobStatus {
        JobStatus {
            v: 1,
            job: JobId::new(job).unwrap(),
            attempt: 1,
            site: SiteId::new("s").unwrap(),
            state,
            at_ms: 1,
            started_at_ms: None,
            runtime_ms: None,
            checkpoint: None,
            mark: None,
        }
    }

    #[test]
    fn unacknowledged_updates_survive_a_restart_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.jsonl");
        let mut o = StatusOutbox::open(path.clone()).unwrap();
        o.push(status("a", AttemptState::Running)).unwrap();
        o.push(status("a", AttemptState::Succeeded { exit_code: 0 }))
            .unwrap();
        o.push(status("b", AttemptState::Running)).unwrap();
        o.pop().unwrap();
        drop(o);
        let mut again = StatusOutbox::open(path.clone()).unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!(
            again.front().unwrap().state,
            AttemptState::Succeeded { exit_code: 0 }
        );
        again.pop().unwrap();
        assert_eq!(again.front().unwrap().job.as_str(), "b");
        std::fs::write(&path, "garbage\n").unwrap();
        assert!(StatusOutbox::open(path).unwrap().is_empty());
    }

    #[test]
    fn a_burst_written_then_flushed_once_is_kept_in_order_beside_single_updates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.jsonl");
        let mut o = StatusOutbox::open(path.clone()).unwrap();
        o.push(status("a", AttemptState::Running)).unwrap();
        for job in ["b", "c", "d"] {
            o.push_unsynced(status(job, AttemptState::Running)).unwrap();
        }
        o.sync().unwrap();
        o.push(status("e", AttemptState::Running)).unwrap();
        o.pop().unwrap();
        drop(o);
        let again = StatusOutbox::open(path).unwrap();
        let jobs: Vec<String> = again.head(10).iter().map(|s| s.job.to_string()).collect();
        assert_eq!(jobs, ["b", "c", "d", "e"]);
    }

    #[test]
    fn an_acknowledged_prefix_is_dropped_at_once_and_the_rest_kept_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.jsonl");
        let mut o = StatusOutbox::open(path.clone()).unwrap();
        for job in ["a", "b", "c", "d"] {
            o.push(status(job, AttemptState::Running)).unwrap();
        }
        let head: Vec<String> = o.head(3).iter().map(|s| s.job.to_string()).collect();
        assert_eq!(head, ["a", "b", "c"]);
        o.pop_n(2).unwrap();
        drop(o);
        let mut again = StatusOutbox::open(path).unwrap();
        let rest: Vec<String> = again.head(10).iter().map(|s| s.job.to_string()).collect();
        assert_eq!(rest, ["c", "d"]);
        again.pop_n(10).unwrap();
        assert!(again.is_empty());
    }

    #[test]
    fn an_acknowledgement_appends_a_mark_and_the_file_is_compacted_once_delivered_updates_fill_half_of_it(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.jsonl");
        let mut o = StatusOutbox::open_compacting_after(path.clone(), 4).unwrap();
        for job in ["a", "b", "c", "d", "e", "f", "g", "h"] {
            o.push(status(job, AttemptState::Running)).unwrap();
        }
        let size = std::fs::metadata(&path).unwrap().len();
        o.pop_n(3).unwrap();
        // Nothing rewritten: the file only grew by the mark.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().last(), Some(r#"{"ack":3}"#));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            size + r#"{"ack":3}"#.len() as u64 + 1
        );
        let again = StatusOutbox::open_compacting_after(path.clone(), 4).unwrap();
        let rest: Vec<String> = again.head(10).iter().map(|s| s.job.to_string()).collect();
        assert_eq!(rest, ["d", "e", "f", "g", "h"]);
        // Opening compacted the file: only what waits, no mark.
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 5);
        drop(again);
        o = StatusOutbox::open_compacting_after(path.clone(), 4).unwrap();
        o.pop_n(1).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("ack"));
        // Four delivered of five lines: compacted at once, the marks gone.
        o.pop_n(3).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains("ack"));
        o.push(status("i", AttemptState::Running)).unwrap();
        o.pop().unwrap();
        let again = StatusOutbox::open(path).unwrap();
        let rest: Vec<String> = again.head(10).iter().map(|s| s.job.to_string()).collect();
        assert_eq!(rest, ["i"]);
    }

    #[test]
    fn an_unreadable_update_line_still_counts_for_the_marks_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.jsonl");
        let line = |job: &str| {
            String::from_utf8(encode(&status(job, AttemptState::Running)).unwrap()).unwrap()
        };
        std::fs::write(
            &path,
            format!(
                "{}\ngarbage\n{}\n{{\"ack\":2}}\n{}\n",
                line("a"),
                line("c"),
                line("d")
            ),
        )
        .unwrap();
        let o = StatusOutbox::open(path).unwrap();
        let rest: Vec<String> = o.head(10).iter().map(|s| s.job.to_string()).collect();
        assert_eq!(rest, ["c", "d"]);
    }
}
