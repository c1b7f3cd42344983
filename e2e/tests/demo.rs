//! The main job (README command 1) with and without the shared data: every batch job must succeed, and the run
//! shows each thing Meridian decides: work bursting to a cloud site once owned capacity is full, EU-resident
//! work kept in the EU, a deadline job deferred to a cleaner hour, inference replicas at the edge rooms near
//! their users, a queue waiting on its quota; it gives the dashboard's address.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_e2e::local;
use serde_json::Value;
use std::process::Command;

fn run_demo(no_data: bool) -> Value {
    let root = local::workspace_root();
    let mut cmd = Command::new(local::sibling_binary("meridian").expect("meridian built"));
    cmd.current_dir(&root).args(["--output", "json", "demo"]);
    let empty = tempfile::tempdir().unwrap();
    if no_data {
        // A bare clone: no shared data. CI=true would make the missing data an error, which is what CI wants
        // for every other run; this one checks the fallback on purpose.
        cmd.env("MERIDIAN_DATA", empty.path()).env_remove("CI");
    }
    let out = cmd.output().expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("demo JSON")
}

fn check(v: &Value) {
    let total = v["batch_total"].as_u64().unwrap();
    assert!(total > 0, "{v}");
    assert_eq!(v["batch_succeeded"].as_u64().unwrap(), total, "{v}");
    let jobs = v["jobs"].as_array().unwrap();
    let with_role =
        |role: &str| -> Vec<&Value> { jobs.iter().filter(|j| j["role"] == role).collect() };
    for j in with_role("batch") {
        assert_ne!(j["site"], "-", "every job was placed: {j}");
    }
    // Burst: some work waited for owned capacity and ran on a cloud site.
    let burst: Vec<&Value> = with_role("batch")
        .into_iter()
        .filter(|j| j["tier"] == "cloud")
        .collect();
    assert!(!burst.is_empty(), "nothing burst: {v}");
    for j in &burst {
        assert!(
            j["wait_s"].as_f64().unwrap() >= 2.5,
            "it waited its max_wait first: {j}"
        );
    }
    assert!(!v["decided"]["burst"].as_array().unwrap().is_empty());
    // Residency: the EU jobs ran in the EU.
    let eu = with_role("eu");
    assert_eq!(eu.len(), 2);
    for j in eu {
        assert_eq!(j["phase"], "succeeded", "{j}");
        let site = j["site"].as_str().unwrap();
        assert!(
            ["edge-frankfurt", "cloud-westeurope"].contains(&site),
            "{j}"
        );
    }
    // Deferral: the deadline job waits for the cleaner hours of its site's forecast.
    let deadline = with_role("deadline");
    assert_eq!(deadline.len(), 1);
    assert_eq!(deadline[0]["phase"], "pending", "{}", deadline[0]);
    assert!(
        deadline[0]["waited_on"]
            .as_array()
            .unwrap()
            .contains(&Value::from("carbon_deferral")),
        "{}",
        deadline[0]
    );
    assert!(deadline[0]["why"]
        .as_str()
        .unwrap()
        .contains("lower carbon at dc-california"));
    // Inference: each service at the edge room near its users.
    for (service, site) in [("chat-eu", "edge-frankfurt"), ("chat-us", "edge-newyork")] {
        let j = jobs.iter().find(|j| j["name"] == service).unwrap();
        assert_eq!(j["site"], site, "{j}");
        assert!(j["user_rtt_ms"].as_f64().unwrap() < 20.0, "{j}");
    }
    // Quota: the interns' queue ran its jobs one at a time, the others waiting on its quota.
    let interns = with_role("interns");
    assert_eq!(interns.len(), 3);
    let on_quota = interns
        .iter()
        .filter(|j| {
            j["waited_on"]
                .as_array()
                .unwrap()
                .contains(&Value::from("quota"))
        })
        .count();
    assert!(on_quota >= 2, "{interns:?}");
    assert!(v["dashboard"]
        .as_str()
        .unwrap()
        .starts_with("https://127.0.0.1:"));
}

#[test]
fn demo_with_shared_data() {
    let v = run_demo(false);
    check(&v);
    if local::workspace_root()
        .join("../shared/data/alibaba-gpu-v2023")
        .exists()
    {
        assert!(v["source"].as_str().unwrap().contains("Alibaba"), "{v}");
    }
}

#[test]
fn demo_without_shared_data() {
    let v = run_demo(true);
    check(&v);
    assert!(v["source"].as_str().unwrap().contains("fallback"), "{v}");
}
