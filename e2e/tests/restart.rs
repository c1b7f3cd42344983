//! A restarted broker is the broker that crashed, and agents and the broker agree on what runs: kill -9 of the
//! broker at random moments with jobs running on healthy sites; an agent killed with many running jobs; an
//! agent restarted within its re-adoption grace; and stopping a federation, which must leave no job process
//! behind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::LocalOptions;
use meridian_e2e::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

/// A small deterministic random source (the kill moments), seeded by `MERIDIAN_KILL_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % below
    }
}

/// Lines of the witness file: (job, attempt, pid) per start.
fn starts(witness: &std::path::Path) -> Vec<(String, u64, i32)> {
    std::fs::read_to_string(witness)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.to_owned(),
                w.next()?.parse().ok()?,
                w.next()?.parse().ok()?,
            ))
        })
        .collect()
}

fn history(f: &Fed, id: &str) -> Vec<Value> {
    f.explain(id)["history"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// kill -9 of the broker at random moments, twenty times, while jobs run on healthy sites (and new ones are
/// submitted between kills): no running job is requeued or stopped, no attempt number is used twice, and
/// every job's history is the same after as before.
#[test]
fn a_broker_killed_twenty_times_stops_and_requeues_no_healthy_run() {
    let mut f = Fed::generated_with(
        &[
            SiteSpec::new("east", "owned", "A100", 16, 1.0),
            SiteSpec {
                lat: 45.6,
                lon: -121.2,
                ..SiteSpec::new("west", "owned", "A100", 16, 1.5)
            },
        ],
        "site_lost_after_ms = 4000\noffer_timeout_ms = 3000",
        LocalOptions {
            broker_args: vec!["--lease-ms".into(), "1000".into()],
            ..LocalOptions::default()
        },
    );
    let witness = f.scratch.path().join("witness");
    let cmd = format!(
        "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT $$\" >> {}; exec sleep 600",
        witness.display()
    );
    let mut ids: Vec<String> = (0..8)
        .map(|i| f.submit(&job(&format!("steady-{i}"), 1, &cmd)))
        .collect();
    for id in &ids {
        f.wait_phase(id, "running", LONG);
    }
    let before: BTreeMap<String, Vec<Value>> =
        ids.iter().map(|id| (id.clone(), history(&f, id))).collect();
    let seed = std::env::var("MERIDIAN_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = Rng(seed);
    let kills = 20;
    let started = Instant::now();
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(rng.next(1_500)));
        if k % 4 == 1 {
            ids.push(f.submit(&job(&format!("between-{k}"), 1, &cmd)));
        }
        f.fed.restart_broker().expect("the broker comes back");
    }
    // Longer than the site-loss timeout: a replay that judged liveness again would have lost the sites.
    std::thread::sleep(Duration::from_secs(6));
    let all = f.jobs();
    assert_eq!(all.len(), ids.len());
    for j in &all {
        assert_eq!(j["phase"], "running", "{j}");
        assert_eq!(j["attempt"], 1, "a job was offered again: {j}");
    }
    let runs = starts(&witness);
    let mut seen = BTreeSet::new();
    for (job, attempt, _) in &runs {
        assert!(
            seen.insert((job.clone(), *attempt)),
            "attempt {attempt} of {job} started twice"
        );
    }
    assert_eq!(runs.len(), ids.len(), "one start per job: {runs:?}");
    for (pid_job, _, pid) in &runs {
        assert!(process_alive(*pid), "the run of {pid_job} was stopped");
    }
    for (id, h) in &before {
        assert_eq!(&history(&f, id), h, "the history of {id} changed");
    }
    println!(
        "{kills} kills of the broker in {:.1}s (seed {seed}); {} jobs running on healthy sites, each with one \
         start, attempt 1 and the same history",
        started.elapsed().as_secs_f64(),
        ids.len()
    );
}

/// An agent with many running jobs is killed and started again; it has lost them all (no-op executor: nothing
/// outlives it). Its inventory says so, the broker ends those attempts and runs every job again there, within
/// a minute, none twice at once.
#[test]
fn an_agent_killed_with_many_running_jobs_is_reconciled_within_a_minute() {
    let n = std::env::var("MERIDIAN_RECONCILE_JOBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_600);
    let mut f = Fed::generated_with(
        &[SiteSpec::new("big", "owned", "A100", n as u32, 1.0)],
        "site_lost_after_ms = 60000",
        LocalOptions {
            agent_args: vec!["--executor".into(), "noop".into()],
            ..LocalOptions::default()
        },
    );
    let specs: Vec<Value> = (0..n)
        .map(|i| job(&format!("many-{i}"), 1, "sleep 600"))
        .collect();
    submit_all(&f, &specs);
    f.wait_until("every job running", LONG, || {
        f.try_jobs()
            .is_some_and(|all| all.iter().filter(|j| j["phase"] == "running").count() == n)
    });
    f.fed.kill_agent("big");
    let killed = Instant::now();
    f.fed.restart_agent("big").unwrap();
    f.wait_for("every job running again", LONG, || {
        let all = f.try_jobs().ok_or("no job list")?;
        let again = all
            .iter()
            .filter(|j| j["phase"] == "running" && j["attempt"] == 2)
            .count();
        if again == n {
            return Ok(());
        }
        // How the others stand, by phase and attempt, with one of each.
        let mut others: std::collections::BTreeMap<String, (usize, String)> = Default::default();
        for j in all
            .iter()
            .filter(|j| !(j["phase"] == "running" && j["attempt"] == 2))
        {
            let e = others
                .entry(format!("{} attempt {}", j["phase"], j["attempt"]))
                .or_insert((0, j["id"].to_string()));
            e.0 += 1;
        }
        Err(format!("{again} of {n} running again; others: {others:?}"))
    });
    let took = killed.elapsed();
    let all = f.jobs();
    assert!(
        all.iter().all(|j| j["attempt"].as_u64() == Some(2)),
        "a job ran a third time"
    );
    let (_, sites) = f.get("/v1/sites");
    assert_eq!(sites["ok"][0]["pools"][0]["free_milli"], 0);
    println!(
        "{n} running jobs on a killed agent: all running again (attempt 2) {:.1}s after the kill",
        took.as_secs_f64()
    );
    assert!(took < LONG);
}

/// Submits specs through the NATS API, 64 at a time.
fn submit_all(f: &Fed, specs: &[Value]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = f.client().await;
        for chunk in specs.chunks(64) {
            let futures = chunk
                .iter()
                .map(|s| client.submit_raw(s.to_string().into_bytes()));
            for r in futures::future::join_all(futures).await {
                r.unwrap();
            }
        }
    });
}

/// An agent killed (or stopped) and started again within its re-adoption grace takes back the jobs still
/// running under their shims: the same attempts go on and finish, nothing runs twice; a job whose agent does
/// not come back in time is stopped and runs again elsewhere.
#[test]
fn a_restarted_agent_takes_back_its_running_jobs() {
    let mut f = Fed::generated(
        &[
            SiteSpec {
                readopt_ms: 8_000,
                ..SiteSpec::new("keeper", "owned", "A100", 4, 1.0)
            },
            SiteSpec {
                readopt_ms: 1_000,
                lat: 45.6,
                lon: -121.2,
                ..SiteSpec::new("other", "owned", "A100", 4, 3.0)
            },
        ],
        "site_lost_after_ms = 12000",
    );
    let witness = f.scratch.path().join("witness");
    let cmd = |s: u32| {
        format!(
            "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT $$\" >> {w}; sleep {s}; echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT end\" >> {w}.end",
            w = witness.display()
        )
    };
    let mut spec = job("kept", 1, &cmd(8));
    spec["policy"] = json!("cost");
    let kept = f.submit(&spec);
    f.wait_phase(&kept, "running", LONG);
    assert_eq!(f.job(&kept)["site"], "keeper");
    f.wait_until("the job to start", LONG, || starts(&witness).len() == 1);
    // kill -9, then a clean stop (SIGTERM), each followed by a restart within the grace.
    f.fed.kill_agent("keeper");
    std::thread::sleep(Duration::from_secs(1));
    f.fed.restart_agent("keeper").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    f.fed.stop_agent("keeper");
    std::thread::sleep(Duration::from_secs(1));
    f.fed.restart_agent("keeper").unwrap();
    let done = f.wait_phase(&kept, "succeeded", LONG);
    assert_eq!(done["attempt"], 1, "{done}");
    assert_eq!(done["site"], "keeper");
    assert!(done["runtime_ms"].as_u64().unwrap() >= 7_000, "{done}");
    let ends = std::fs::read_to_string(witness.with_extension("end")).unwrap();
    assert_eq!(ends.trim(), format!("{kept} 1 end"));
    assert_eq!(starts(&witness).len(), 1, "the job started again");

    // An agent that does not come back within its grace: its job is stopped, and runs again elsewhere once
    // the site is declared lost.
    let mut spec = job("orphan", 1, &cmd(30));
    spec["constraints"] = json!({"sites": ["other", "keeper"]});
    spec["policy"] = json!("cost");
    let orphan = f.submit(&spec);
    f.wait_phase(&orphan, "running", LONG);
    let first = f.job(&orphan)["site"].as_str().unwrap().to_owned();
    f.wait_until("the job to start", LONG, || starts(&witness).len() == 2);
    let pid = starts(&witness)[1].2;
    f.fed.kill_agent(&first);
    let grace = if first == "keeper" { 8 } else { 1 };
    f.wait_until(
        "the orphaned job to be stopped",
        Duration::from_secs(grace + 10),
        || !process_alive(pid),
    );
    f.wait_until("the job to run again elsewhere", LONG, || {
        let j = f.job(&orphan);
        j["attempt"] == 2 && j["phase"] == "running"
    });
    assert_ne!(f.job(&orphan)["site"], first.as_str());
}

/// Stopping a local federation stops every job process it started: the witness records the pid of each
/// running job's process; once the federation is dropped (as `meridian up` does on SIGTERM), none is left.
#[test]
fn stopping_the_federation_leaves_no_job_process() {
    let f = Fed::generated(
        &[
            SiteSpec {
                readopt_ms: 30_000,
                ..SiteSpec::new("one", "owned", "A100", 4, 1.0)
            },
            SiteSpec {
                readopt_ms: 30_000,
                lat: 50.1,
                lon: 8.7,
                ..SiteSpec::new("two", "owned", "A100", 4, 1.0)
            },
        ],
        "",
    );
    let witness = f.scratch.path().join("witness");
    let cmd = format!(
        "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT $$\" >> {}; exec sleep 300",
        witness.display()
    );
    let ids: Vec<String> = (0..6)
        .map(|i| f.submit(&job(&format!("stay-{i}"), 1, &cmd)))
        .collect();
    for id in &ids {
        f.wait_phase(id, "running", LONG);
    }
    f.wait_until("every job to start", LONG, || {
        starts(&witness).len() == ids.len()
    });
    let pids: Vec<i32> = starts(&witness).iter().map(|s| s.2).collect();
    assert!(pids.iter().all(|p| process_alive(*p)));
    let fed = f.fed;
    drop(fed);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| process_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "job processes outlived their federation: {:?}",
            pids.iter()
                .filter(|p| process_alive(**p))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(f.scratch);
}

/// `meridian up --state-dir DIR` keeps a federation: stopped and started again on the same folder, it resumes
/// with the same credentials and administrator's token, the jobs it ran and the jobs that waited; the folder is
/// refused to another federation file.
#[test]
fn a_federation_kept_in_a_state_folder_resumes_where_it_stopped() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("federation");
    let file = configs().join("federation-demo.toml");
    let opts = || LocalOptions {
        dir: Some(dir.clone()),
        ..LocalOptions::default()
    };
    let (done, waiting, token) = {
        let f = Fed::start_with(&file, opts());
        assert!(!f.fed.resumed, "a new folder starts afresh");
        let done = f.submit(&job("before-the-stop", 1, "echo kept"));
        f.wait_phase(&done, "succeeded", LONG);
        let mut nowhere = job("waits-across-the-stop", 1, "true");
        nowhere["resources"]["models"] = json!(["B300"]);
        let waiting = f.submit(&nowhere);
        (done, waiting, f.token.clone())
    };
    let f = Fed::start_with(&file, opts());
    assert!(f.fed.resumed);
    assert_eq!(f.token, token, "the same administrator's token");
    assert_eq!(f.job(&done)["phase"], "succeeded");
    assert_eq!(f.job(&waiting)["phase"], "pending");
    // The same idempotency key is the same job, across the stop.
    let (status, again) = f.post(
        "/v1/jobs",
        job("before-the-stop", 1, "echo kept")
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        (status, again["ok"]["job"].as_str()),
        (200, Some(done.as_str()))
    );
    drop(f);
    let other = configs().join("demo/federation.toml");
    let refused = meridian_broker::local::LocalFederation::start(&other, opts())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(refused.contains("holds the federation of"), "{refused}");
}
