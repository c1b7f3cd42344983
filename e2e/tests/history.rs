//! Bounded history: finished jobs move to the archive, and every job stays listable (page by page, over NATS
//! and HTTP), readable, explainable and reported.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::LocalOptions;
use meridian_e2e::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// 5,000 jobs on a small site (no-op executor): most wait, 2,000 are cancelled and archived after a one-second
/// retention. Every one of them is listed, page by page, through HTTP, through the NATS API and by `meridian
/// jobs`; an archived job still answers `GET`, explain and the report; its idempotency key still returns it.
#[test]
fn five_thousand_jobs_list_in_pages_and_archived_ones_stay_readable() {
    let f = Fed::generated_with(
        &[SiteSpec::new("small", "owned", "A100", 16, 1.0)],
        "retention_ms = 1000",
        LocalOptions {
            agent_args: vec!["--executor".into(), "noop".into()],
            ..LocalOptions::default()
        },
    );
    let n = 5_000;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(f.client());
    let ids: Vec<String> = rt.block_on(async {
        let mut ids = Vec::new();
        let specs: Vec<Value> = (0..n)
            .map(|i| job(&format!("deep-{i}"), 1, "sleep 600"))
            .collect();
        for chunk in specs.chunks(100) {
            let futures = chunk
                .iter()
                .map(|s| client.submit_raw(s.to_string().into_bytes()));
            for r in futures::future::join_all(futures).await {
                ids.push(r.unwrap().job.to_string());
            }
        }
        ids
    });
    // Cancel 2,000 waiting jobs: they finish at once and go to the archive after the retention.
    let cancelled: Vec<String> = ids[n - 2_000..].to_vec();
    rt.block_on(async {
        let refs: Vec<meridian_federation::JobId> = cancelled
            .iter()
            .map(|id| meridian_federation::JobId::new(id.as_str()).unwrap())
            .collect();
        for chunk in refs.chunks(100) {
            let futures = chunk.iter().map(|id| client.cancel(id));
            for r in futures::future::join_all(futures).await {
                r.unwrap();
            }
        }
    });
    let probe = cancelled[0].clone();
    f.wait_until("cancelled jobs to be archived", LONG, || {
        f.job(&probe)["archived"] == true
    });
    f.wait_until("every cancelled job to be archived", LONG, || {
        let (_, v) = f.get("/v1/jobs?scope=live&limit=1000&state=cancelled");
        v["ok"]["jobs"].as_array().is_some_and(|j| j.is_empty())
    });
    // HTTP, page by page.
    let mut pages = 0;
    let mut cursor: Option<String> = None;
    let mut over_http = Vec::new();
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=700&cursor={c}"),
            None => "/v1/jobs?limit=700".into(),
        };
        let (status, v) = f.get(&path);
        assert_eq!(status, 200, "{v}");
        pages += 1;
        over_http.extend(v["ok"]["jobs"].as_array().unwrap().iter().cloned());
        match v["ok"]["next"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let unique: BTreeSet<String> = over_http
        .iter()
        .map(|j| j["job"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(unique.len(), n, "{pages} pages");
    assert!(pages >= n / 700);
    let archived = over_http.iter().filter(|j| j["archived"] == true).count();
    assert_eq!(archived, 2_000);
    // Newest first: the live jobs by id downwards, then the archive read backwards; every job once.
    let mut cursor: Option<String> = None;
    let mut newest = Vec::new();
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=700&newest_first=true&cursor={c}"),
            None => "/v1/jobs?limit=700&newest_first=true".into(),
        };
        let (status, v) = f.get(&path);
        assert_eq!(status, 200, "{v}");
        newest.extend(v["ok"]["jobs"].as_array().unwrap().iter().cloned());
        match v["ok"]["next"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let ids: Vec<&str> = newest.iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), n);
    assert_eq!(ids.len(), n, "no job twice");
    let live: Vec<&str> = newest
        .iter()
        .filter(|j| j["archived"] != true)
        .map(|j| j["job"].as_str().unwrap())
        .collect();
    assert!(
        live.windows(2).all(|w| w[0] > w[1]),
        "live jobs newest first"
    );
    assert!(
        newest[..live.len()].iter().all(|j| j["archived"] != true),
        "the live jobs come before the archive"
    );
    // The NATS API, and the command line, list every job too.
    let over_nats = rt.block_on(client.jobs()).unwrap();
    assert_eq!(over_nats.len(), n);
    let out = f.cli(&["--output", "json", "jobs"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.len(), n);
    let limited = f.cli(&["--output", "json", "jobs", "--limit", "10"]);
    let limited: Vec<Value> = serde_json::from_slice(&limited.stdout).unwrap();
    assert_eq!(limited.len(), 10);
    // An archived job: read, explained, resubmitted under its key.
    let j = f.job(&probe);
    assert_eq!(j["phase"], "cancelled");
    let e = f.explain(&probe);
    assert_eq!(e["job"], probe.as_str());
    let i: usize = n - 2_000;
    let (status, again) = f.post(
        "/v1/jobs",
        job(&format!("deep-{i}"), 1, "sleep 600")
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        (status, again["ok"]["job"].as_str()),
        (200, Some(probe.as_str()))
    );
    // Filters reach the archive.
    let (_, v) = f.get("/v1/jobs?scope=archived&state=cancelled&limit=5");
    assert_eq!(v["ok"]["jobs"].as_array().unwrap().len(), 5);
    println!("{n} jobs listed in {pages} HTTP pages of 700; 2,000 of them from the archive");
}

/// A capacity what-if from real history: four one-GPU jobs queue on a one-GPU site and run one after another;
/// once they have finished and left for the archive, `meridian plan --add` (no file: the federation the broker
/// places on) replays them on the site with three more GPUs, and the checker's wait drops (nothing waits); the
/// federation's file gives the same. The history is an
/// administrator's: a tenant's token is refused, and a change naming no site of the federation is an error.
#[test]
fn plan_replays_the_recorded_history_and_added_capacity_lowers_the_wait() {
    let f = Fed::generated_with(
        &[SiteSpec::new("small", "owned", "A100", 1, 1.0)],
        "retention_ms = 1000",
        LocalOptions::default(),
    );
    let ids: Vec<String> = (0..4)
        .map(|i| f.submit(&job(&format!("queued-{i}"), 1, "sleep 2")))
        .collect();
    for id in &ids {
        f.wait_phase(id, "succeeded", LONG);
    }
    f.wait_until("finished jobs to be archived", LONG, || {
        ids.iter().all(|id| f.job(id)["archived"] == true)
    });
    let fed_file = f.scratch.path().join("federation.toml");
    let fed_arg = fed_file.to_string_lossy().to_string();
    // No federation file: the what-if runs on the federation the broker places on.
    let plan = |output: &str| {
        f.cli(&[
            "--output",
            output,
            "plan",
            "--days",
            "1",
            "--add",
            "small:A100:3",
        ])
    };
    let out = plan("json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert_eq!(r["jobs"], 4, "every archived job is replayed: {r}");
    let (today, changed) = (&r["today"], &r["changed"]);
    for run in [today, changed] {
        assert_eq!(run["violations"], 0, "{run}");
        assert_eq!(run["unplaced"], 0, "{run}");
    }
    let wait = |run: &Value| run["wait_p95_s"].as_f64().unwrap();
    assert!(
        wait(today) >= 4.0,
        "the jobs queued behind each other: {today}"
    );
    assert!(wait(changed) < 1.0, "four GPUs run them at once: {changed}");
    // The table says the same.
    let table = plan("table");
    let text = String::from_utf8_lossy(&table.stdout);
    println!("{text}");
    assert!(
        text.contains("wait p95 (s)") && text.contains("add 3 × A100 to small"),
        "{text}"
    );
    // The same from the federation's file, as an option.
    let from_file = f.cli(&[
        "--output",
        "json",
        "plan",
        "--federation",
        &fed_arg,
        "--days",
        "1",
        "--add",
        "small:A100:3",
    ]);
    let from_file: Value = serde_json::from_slice(&from_file.stdout).unwrap();
    assert_eq!(from_file["today"], r["today"]);
    assert_eq!(from_file["changed"], r["changed"]);
    // A change naming no site of the federation is refused with why.
    let bad = f.cli(&["plan", "--add", "nowhere:A100:1"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("no site nowhere in the federation (its sites: small)"),
        "{err}"
    );
    // The history is an administrator's.
    let tenant = f.create_token(Some("e2e"), &["viewer"]);
    let (status, body) = f.with_token(Some(&tenant)).get("/v1/admin/history");
    assert_eq!(status, 403, "{body}");
    let (status, body) = f.get("/v1/admin/history?from_ms=0");
    assert_eq!(status, 200, "{body}");
    let listed = body["ok"]["jobs"].as_array().unwrap();
    assert_eq!(listed.len(), 4);
    assert!(
        listed
            .iter()
            .all(|j| j["spec"]["run"]["command"] != "sleep 2"),
        "commands stay out of the history"
    );
}
