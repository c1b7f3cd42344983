//! `cargo bench -p meridian-agent`: one status update written and one acknowledged, with 10, 1,000 and 10,000
//! updates waiting in the outbox. What an acknowledgement costs should not grow with what still waits: the
//! smallest depth is the baseline of the same run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_agent::outbox::StatusOutbox;
use meridian_federation::{AttemptState, JobId, JobStatus, SiteId};

fn main() {
    divan::main();
}

fn status(i: usize) -> JobStatus {
    JobStatus {
        v: 1,
        job: JobId::new(format!("job-{i}")).unwrap(),
        attempt: 1,
        site: SiteId::new("site-a").unwrap(),
        state: AttemptState::Running,
        at_ms: 1_700_000_000_000 + i as u64,
        started_at_ms: Some(1_700_000_000_000),
        runtime_ms: None,
        checkpoint: None,
        mark: None,
    }
}

#[divan::bench(args = [10, 1000, 10000], sample_count = 50)]
fn push_and_acknowledge(bencher: divan::Bencher, waiting: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut o = StatusOutbox::open(dir.path().join("outbox.jsonl")).unwrap();
    for i in 0..waiting {
        o.push_unsynced(status(i)).unwrap();
    }
    o.sync().unwrap();
    let mut i = waiting;
    bencher.bench_local(|| {
        i += 1;
        o.push(status(i)).unwrap();
        o.pop().unwrap();
    });
}
