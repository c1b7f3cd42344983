//! Status updates the broker has not acknowledged yet, kept on disk (one JSON line each) so that they survive
//! a restart of the agent: a job that finished while NATS was unreachable is still reported when the agent
//! comes back, in order.

use meridian_federation::{decode, encode, JobStatus};
use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug)]
pub struct StatusOutbox {
    path: PathBuf,
    queue: VecDeque<JobStatus>,
    /// Updates acknowledged since this agent started (part of the inventory mark: the set of attempts
    /// with an end still to deliver shrinks with it).
    acked: u64,
}

impl StatusOutbox {
    /// Opens the outbox at `path`, loading what an earlier run left unacknowledged. Unreadable lines are
    /// skipped and counted in the log.
    pub fn open(path: PathBuf) -> std::io::Result<Self> {
        let mut queue = VecDeque::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            let mut bad = 0;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match decode::<JobStatus>(line.as_bytes()) {
                    Ok(s) => queue.push_back(s),
                    Err(_) => bad += 1,
                }
            }
            if bad > 0 {
                tracing::warn!("{}: skipped {bad} unreadable status lines", path.display());
            }
        }
        let outbox = StatusOutbox {
            path,
            queue,
            acked: 0,
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
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(&line)?;
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

    /// Drops the oldest `n` updates (the broker acknowledged them), with one rewrite of the file.
    pub fn pop_n(&mut self, n: usize) -> std::io::Result<()> {
        let n = n.min(self.queue.len());
        if n == 0 {
            return Ok(());
        }
        self.queue.drain(..n);
        self.acked += n as u64;
        self.rewrite()
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

    fn rewrite(&self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        for s in &self.queue {
            let mut line = encode(s).map_err(std::io::Error::other)?;
            line.push(b'\n');
            f.write_all(&line)?;
        }
        f.sync_data()?;
        std::fs::rename(&tmp, &self.path)
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
}
