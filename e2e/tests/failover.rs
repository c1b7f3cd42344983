//! Failover: the journal refuses a stale writer, a standby takes over from a paused broker which then steps
//! down, and a restarted broker recovers from its latest snapshot. Real nats-server and binaries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::LocalOptions;
use meridian_broker::service::journal::{JetStreamJournal, StoreError};
use meridian_core::durable::{Batch, FORMAT_VERSION};
use meridian_core::journal::Record;
use meridian_core::reactor::Event;
use meridian_e2e::*;
use meridian_federation::JobId;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(40);

fn record(n: u64) -> Record {
    Record {
        at_ms: n,
        event: Event::Cancel(JobId::numbered(n)),
    }
}

fn cancelled(batches: &[Batch]) -> Vec<u64> {
    batches
        .iter()
        .flat_map(|b| &b.records)
        .map(|r| match &r.event {
            Event::Cancel(id) => {
                assert_eq!(id, &JobId::numbered(r.at_ms));
                r.at_ms
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// Expected-last-sequence fencing: once a second writer has taken over, the first one's append is refused and
/// nothing it tried to write is in the journal.
#[test]
fn the_journal_refuses_a_writer_that_was_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let (_nats, access) = meridian_broker::local::secured_nats(dir.path()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = access.connect("test", LONG).await.unwrap();
        let mut a = JetStreamJournal::open(client.clone(), "a".into(), 1)
            .await
            .unwrap();
        assert!(a.recover().await.unwrap().batches.is_empty());
        assert!(a.take_over(FORMAT_VERSION).await.unwrap().is_empty());
        a.store(FORMAT_VERSION, vec![record(1), record(2)])
            .await
            .unwrap();

        let mut b = JetStreamJournal::open(client.clone(), "b".into(), 1)
            .await
            .unwrap();
        assert_eq!(cancelled(&b.recover().await.unwrap().batches), [1, 2]);
        // a writes after b has read but before b has fenced: b's takeover picks the record up.
        a.store(FORMAT_VERSION, vec![record(3)]).await.unwrap();
        assert_eq!(cancelled(&b.take_over(FORMAT_VERSION).await.unwrap()), [3]);

        let refused = a.store(FORMAT_VERSION, vec![record(4)]).await;
        assert!(
            matches!(refused, Err(StoreError::Fenced { .. })),
            "{refused:?}"
        );
        b.store(FORMAT_VERSION, vec![record(5)]).await.unwrap();

        let mut c = JetStreamJournal::open(client, "c".into(), 1).await.unwrap();
        assert_eq!(cancelled(&c.recover().await.unwrap().batches), [1, 2, 3, 5]);
    });
}

fn signal(pid: u32, s: Signal) {
    kill(Pid::from_raw(pid as i32), s).unwrap();
}

/// The active broker is paused (SIGSTOP); the standby takes over within a few seconds and carries on with the
/// running job; when the old one wakes it finds it lost the lease or is fenced, and steps down.
#[test]
fn a_standby_takes_over_and_the_paused_broker_steps_down() {
    let mut f = Fed::generated_with(
        &[SiteSpec::new("only", "owned", "A100", 4, 1.0)],
        "site_lost_after_ms = 60000",
        LocalOptions {
            standby: true,
            ..LocalOptions::default()
        },
    );
    let witness = f.scratch.path().join("witness");
    let cmd = |s: u32| {
        format!(
            "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT\" >> {}; sleep {s}",
            witness.display()
        )
    };
    let long = f.submit(&job("long", 1, &cmd(8)));
    f.wait_phase(&long, "running", LONG);
    let old = f.fed.active_broker().expect("an active broker");
    let new = 1 - old;
    let old_pid = f.fed.brokers[old].proc.as_ref().unwrap().pid().unwrap();

    signal(old_pid, Signal::SIGSTOP);
    let paused = Instant::now();
    let new_addr = f.fed.dir.join(if new == 0 {
        "broker.addr"
    } else {
        "broker-2.addr"
    });
    f.wait_until("the standby takes over", Duration::from_secs(20), || {
        new_addr.exists()
    });
    let takeover = paused.elapsed();
    println!(
        "takeover {} ms after the active broker was paused",
        takeover.as_millis()
    );
    assert!(takeover < Duration::from_secs(10), "{takeover:?}");
    // The paused broker's address file still names it: forget it, and talk to the new one.
    let old_addr = f.fed.dir.join(if old == 0 {
        "broker.addr"
    } else {
        "broker-2.addr"
    });
    std::fs::remove_file(old_addr).unwrap();
    f.fed.wait_for_broker().unwrap();
    assert_eq!(f.fed.active_broker(), Some(new));

    assert_eq!(f.job(&long)["phase"], "running");
    let short = f.submit(&job("short", 1, &cmd(0)));
    f.wait_phase(&short, "succeeded", LONG);

    signal(old_pid, Signal::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while f.fed.brokers[old].proc.as_mut().unwrap().alive() {
        assert!(
            Instant::now() < deadline,
            "the old broker did not step down"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = f.fed.broker_logs();
    assert!(
        log.contains("stepping down") || log.contains("no longer active"),
        "{log}"
    );

    let done = f.wait_phase(&long, "succeeded", LONG);
    assert_eq!(done["attempt"], 1, "{done}");
    let w = std::fs::read_to_string(&witness).unwrap();
    assert_eq!(
        w.lines()
            .filter(|l| l.starts_with(&format!("{long} ")))
            .count(),
        1,
        "{w}"
    );
}

/// With snapshots every 20 records, a restarted broker loads the latest snapshot and replays only the records
/// after it, and every job is where it was.
#[test]
fn recovery_starts_from_the_latest_snapshot() {
    let mut f = Fed::generated_with(
        &[SiteSpec::new("only", "owned", "A100", 4, 1.0)],
        "",
        LocalOptions {
            broker_args: vec!["--snapshot-every".into(), "20".into()],
            ..LocalOptions::default()
        },
    );
    let ids: Vec<String> = (0..12)
        .map(|i| f.submit(&job(&format!("j{i}"), 1, "true")))
        .collect();
    for id in &ids {
        f.wait_phase(id, "succeeded", LONG);
    }
    f.wait_until("a snapshot is stored", LONG, || {
        f.fed.broker_logs().contains("snapshot stored")
    });
    let last = f.submit(&job("after", 1, "true"));
    f.wait_phase(&last, "succeeded", LONG);

    f.fed.restart_broker().unwrap();
    let log = f.fed.broker_logs();
    let line = log
        .lines()
        .rfind(|l| l.contains("recovered 13 jobs"))
        .unwrap_or_else(|| panic!("{log}"));
    println!("{line}");
    assert!(line.contains("from a snapshot and"), "{line}");
    let replayed: usize = line
        .split("from a snapshot and ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // 13 jobs took at least 4 records each (52 or more in all); snapshots come every 20 records, so replay
    // starts at most 19 records plus the last job's few before the end.
    assert!(replayed < 30, "{line}");
    for id in ids.iter().chain([&last]) {
        assert_eq!(f.job(id)["phase"], "succeeded", "{id}");
    }
}
