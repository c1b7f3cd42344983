//! Chaos: a run of many jobs on the cluster topology (three nats-servers with JetStream replicas 3, an edge
//! site on a leaf node, an active and a standby broker), during which the active broker, one agent and one
//! NATS node are each killed with SIGKILL once, at seeded random moments while jobs are in flight, and started
//! again. Every job appends `job attempt` to a witness file that Meridian does not know about.
//!
//! Checked, from the ledger (the broker's job records) and the witness file independently: every job reaches
//! exactly one terminal state, `succeeded`; none is lost or duplicated; every execution the witness shows ran
//! under an attempt Meridian recorded, and no attempt ran twice; the standby took over.
//!
//! CI runs a short version (300 jobs); the full one: `MERIDIAN_CHAOS_JOBS=2000 cargo test -p meridian-e2e
//! --test chaos -- --nocapture`. `MERIDIAN_CHAOS_SEED` picks the moments.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::{LocalOptions, Topology};
use meridian_e2e::*;
use meridian_tools::sim::trace::SplitMix64;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kill {
    Broker,
    Agent,
    NatsNode,
}

/// Something to do at a moment of the run.
#[derive(Debug)]
enum Action {
    Kill(Kill),
    RestartAgent(String),
    RestartNode(usize),
}

#[test]
fn killing_a_broker_an_agent_and_a_nats_node_loses_nothing() {
    let jobs = env("MERIDIAN_CHAOS_JOBS", 300) as usize;
    let seed = env("MERIDIAN_CHAOS_SEED", 1);
    let sites = [
        SiteSpec::new("dc-a", "owned", "A100", 16, 1.0),
        SiteSpec::new("dc-b", "owned", "A100", 16, 1.2),
        SiteSpec::new("dc-c", "owned", "H100", 12, 2.0),
        SiteSpec {
            edge: true,
            ..SiteSpec::new("edge-d", "owned", "L4", 8, 0.5)
        },
    ];
    let slots: u32 = sites.iter().map(|s| s.count).sum();
    let mut f = Fed::generated_with(
        &sites,
        "site_lost_after_ms = 6000\noffer_timeout_ms = 3000",
        LocalOptions {
            topology: Topology::Cluster,
            broker_args: vec!["--lease-ms".into(), "2000".into()],
            // Keep the logs and state of a run here (otherwise they go with the test).
            dir: std::env::var_os("MERIDIAN_CHAOS_DIR").map(Into::into),
            ..LocalOptions::default()
        },
    );
    let witness = f.scratch.path().join("witness");
    std::fs::write(&witness, "").unwrap();

    // Jobs of 1-2 s: the run lasts about jobs × 1.5 s / slots, and the kills fall in its first 60%.
    let expected =
        Duration::from_secs_f64(jobs as f64 * 1.5 / f64::from(slots)).max(Duration::from_secs(8));
    let mut rng = SplitMix64::new(seed);
    let mut at = |lo: f64, hi: f64| {
        let u = (rng.next_u64() % 10_000) as f64 / 10_000.0;
        Duration::from_secs_f64(expected.as_secs_f64() * (lo + (hi - lo) * u))
    };
    // One kill in each third of the window, in a seeded order, so recoveries do not overlap much.
    let mut kinds = [Kill::Broker, Kill::Agent, Kill::NatsNode];
    let r = rng_pick(seed, 6);
    kinds.rotate_left(r % 3);
    if r >= 3 {
        kinds.swap(1, 2);
    }
    let mut plan: Vec<(Duration, Action)> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let third = i as f64 * 0.2;
            (at(0.05 + third, 0.2 + third), Action::Kill(*k))
        })
        .collect();
    plan.sort_by_key(|(t, _)| *t);

    let start = Instant::now();
    let mut log: Vec<String> = Vec::new();
    let mut ids: BTreeMap<usize, String> = BTreeMap::new();
    let mut took_over: Option<Duration> = None;
    // Jobs the agent kill interrupted: each runs again.
    let mut interrupted = 0;
    let mut next = 0;
    let deadline = start + expected * 4 + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "the run did not finish; logs in {}",
            f.fed.dir.display()
        );
        // Submit in small batches, retrying through a takeover (the idempotency key makes that safe).
        let mut batch = 0;
        while next < jobs && batch < 25 {
            let secs = 1.0 + (next % 11) as f64 / 10.0;
            let cmd = format!(
                "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT\" >> {}; sleep {secs}",
                witness.display()
            );
            let spec = job(&format!("chaos-{next}"), 1, &cmd);
            match f.try_post("/v1/jobs", spec.to_string().as_bytes()) {
                Some((200 | 201, v)) => {
                    ids.insert(next, v["ok"]["job"].as_str().unwrap().to_owned());
                    next += 1;
                    batch += 1;
                }
                _ => {
                    let _ = f.fed.wait_for_broker();
                    break;
                }
            }
        }
        let elapsed = start.elapsed();
        while plan.first().is_some_and(|(t, _)| *t <= elapsed) {
            let (_, action) = plan.remove(0);
            let t = start.elapsed().as_secs_f64();
            match action {
                Action::Kill(Kill::Broker) => {
                    let running: usize = running_by_site(&f).values().sum();
                    let slot = f.fed.active_broker().expect("an active broker");
                    f.fed.kill_broker(slot);
                    let killed = Instant::now();
                    f.fed.wait_for_broker().expect("the standby takes over");
                    took_over = Some(killed.elapsed());
                    log.push(format!(
                        "{t:6.1} s  kill -9 active broker {} ({next} jobs submitted, {running} running); standby active after {} ms",
                        f.fed.brokers[slot].name,
                        killed.elapsed().as_millis()
                    ));
                    f.fed
                        .start_broker(slot)
                        .expect("broker restarts as standby");
                }
                Action::Kill(Kill::Agent) => {
                    // The agent with the most job processes running (its process-group files), so that the
                    // kill interrupts work; if none runs any yet, a little later.
                    let Some((site, n)) = processes_by_site(&f)
                        .into_iter()
                        .filter(|(_, n)| *n > 0)
                        .max_by_key(|(s, n)| (*n, std::cmp::Reverse(s.clone())))
                    else {
                        plan.push((
                            elapsed + Duration::from_millis(200),
                            Action::Kill(Kill::Agent),
                        ));
                        plan.sort_by_key(|(t, _)| *t);
                        continue;
                    };
                    f.fed.kill_agent(&site);
                    interrupted = n;
                    log.push(format!(
                        "{t:6.1} s  kill -9 agent {site} ({n} jobs running there)"
                    ));
                    plan.push((
                        elapsed + Duration::from_millis(1500),
                        Action::RestartAgent(site),
                    ));
                }
                Action::Kill(Kill::NatsNode) => {
                    let running: usize = running_by_site(&f).values().sum();
                    let node = (seed as usize) % f.fed.nats.nodes.len();
                    f.fed.nats.nodes[node].kill();
                    log.push(format!(
                        "{t:6.1} s  kill -9 NATS node {} ({running} jobs running)",
                        node + 1
                    ));
                    plan.push((elapsed + Duration::from_secs(2), Action::RestartNode(node)));
                }
                Action::RestartAgent(site) => {
                    f.fed.restart_agent(&site).expect("agent restarts");
                    log.push(format!("{t:6.1} s  agent {site} started again"));
                }
                Action::RestartNode(node) => {
                    f.fed.nats.nodes[node].restart().expect("node restarts");
                    log.push(format!("{t:6.1} s  NATS node {} started again", node + 1));
                }
            }
            plan.sort_by_key(|(t, _)| *t);
        }
        if next == jobs && plan.is_empty() {
            if let Some(all) = f.try_jobs() {
                let done = all
                    .iter()
                    .filter(|j| {
                        matches!(
                            j["phase"].as_str(),
                            Some("succeeded" | "failed" | "cancelled")
                        )
                    })
                    .count();
                if done >= jobs {
                    break;
                }
            } else {
                let _ = f.fed.wait_for_broker();
            }
        }
        std::thread::sleep(Duration::from_millis(if next < jobs { 20 } else { 500 }));
    }
    let run = start.elapsed();

    // The ledger, as the broker reports it.
    let all = f.jobs();
    let ledger: BTreeMap<String, Value> = all
        .iter()
        .map(|j| (j["job"].as_str().unwrap().to_owned(), j.clone()))
        .collect();
    assert_eq!(ledger.len(), jobs, "jobs in the ledger");
    let submitted: BTreeSet<&String> = ids.values().collect();
    assert_eq!(submitted.len(), jobs, "distinct job ids");
    for id in &submitted {
        let j = &ledger[*id];
        assert_eq!(j["phase"], "succeeded", "{j}");
        assert_eq!(j["exit_code"], 0, "{j}");
    }

    // The witness, independently.
    let text = std::fs::read_to_string(&witness).unwrap();
    let mut runs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in text.lines() {
        let (job, attempt) = line.split_once(' ').expect("witness line");
        runs.entry(job.to_owned())
            .or_default()
            .push(attempt.parse().expect("attempt"));
    }
    let mut again = 0;
    for id in &submitted {
        let attempts = runs
            .get(*id)
            .unwrap_or_else(|| panic!("{id} succeeded in the ledger but never ran"));
        let recorded = ledger[*id]["attempt"].as_u64().unwrap();
        let distinct: BTreeSet<_> = attempts.iter().collect();
        assert_eq!(
            distinct.len(),
            attempts.len(),
            "{id} ran one attempt twice: {attempts:?}"
        );
        for a in attempts {
            assert!(
                *a <= recorded,
                "{id} ran attempt {a} but Meridian recorded {recorded}"
            );
        }
        again += attempts.len() - 1;
    }
    assert!(
        runs.keys().all(|j| submitted.contains(j)),
        "the witness names unknown jobs"
    );
    // What made jobs run again, from their histories (shown with the timeline if the bound below fails).
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (id, j) in &ledger {
        if j["attempt"].as_u64().unwrap_or(0) > 1 {
            let e = f.explain(id);
            for h in e["history"].as_array().into_iter().flatten() {
                let h = h.as_str().unwrap_or("");
                // Requeues, and offers given up (timed out or refused), each note after its time stamp.
                let note = h.split_once(' ').map_or(h, |(_, n)| n);
                let why = note
                    .strip_prefix("requeued: ")
                    .or_else(|| note.contains("offer to").then_some(note));
                if let Some(why) = why {
                    let why: String = why.chars().take(60).collect();
                    *reasons.entry(why).or_default() += 1;
                }
            }
        }
    }
    // Second runs come from the interrupted jobs and from the few offers in flight when the broker or a NATS
    // node died; a wave of needless requeues (sites judged lost while the broker could not hear them) is a bug.
    let bound = interrupted + slots as usize / 2;
    assert!(
        again <= bound,
        "{again} second runs, more than the {interrupted} interrupted jobs plus {}\ntimeline:\n{}\nrequeued because: {reasons:#?}\nlogs in {}",
        slots / 2,
        log.join("\n"),
        f.fed.dir.display()
    );
    let took_over = took_over.expect("the broker was killed");
    let logs = f.fed.broker_logs();
    let recoveries: Vec<&str> = logs.lines().filter(|l| l.contains("recovered")).collect();
    assert!(recoveries.len() >= 2, "{logs}");

    println!(
        "chaos run, seed {seed}: {jobs} jobs on {slots} devices in {:.1} s",
        run.as_secs_f64()
    );
    for l in &log {
        println!("  {l}");
    }
    println!(
        "  {} executions witnessed, {again} of them second runs (each under a new attempt Meridian recorded)",
        text.lines().count()
    );
    println!(
        "  standby took over {} ms after the kill",
        took_over.as_millis()
    );
    for (why, n) in &reasons {
        println!("  requeued {n}×: {why}");
    }
    for r in recoveries {
        println!("  {}", r.split("INFO").last().unwrap_or(r).trim());
    }
}

/// Jobs running now, by site (empty when no broker answers).
fn running_by_site(f: &Fed) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    if let Some(all) = f.try_jobs() {
        for j in &all {
            if j["phase"] == "running" {
                if let Some(site) = j["site"].as_str() {
                    *out.entry(site.to_owned()).or_default() += 1;
                }
            }
        }
    }
    out
}

/// Job processes running now, by site: the process-group files each agent keeps for its running jobs.
fn processes_by_site(f: &Fed) -> BTreeMap<String, usize> {
    f.fed
        .site_ids()
        .into_iter()
        .map(|site| {
            let run = f.fed.dir.join("agents").join(&site).join("run");
            let n = std::fs::read_dir(run).map_or(0, |d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "pgid"))
                    .count()
            });
            (site, n)
        })
        .collect()
}

/// A seeded choice in `0..n`.
fn rng_pick(seed: u64, n: usize) -> usize {
    (SplitMix64::new(seed ^ 0x5eed).next_u64() % n as u64) as usize
}
