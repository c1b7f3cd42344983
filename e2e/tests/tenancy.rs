//! Tenancy through the real broker and agents: two tenants share a cohort; one borrows the other's idle quota;
//! the lender's work takes it back by preemption; a preempted checkpointable job resumes from its checkpoint
//! (the contract: write the checkpoint's URI to `$MERIDIAN_CHECKPOINT_FILE`, find it in `$MERIDIAN_RESUME_FROM`
//! when run again) and finishes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;
use serde_json::json;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

const TENANCY: &str = r#"
[[queues]]
name = "lender"
tenant = "lender"
cohort = "shared"
quota = { "gpu:*" = 2 }
[[queues]]
name = "borrower"
tenant = "borrower"
cohort = "shared"
quota = { "gpu:*" = 2 }
[[queues]]
name = "capped"
tenant = "capped"
[[budgets]]
tenant = "capped"
period = "month"
usd = 0.5
when_exceeded = "refuse"
"#;

#[test]
fn a_lender_reclaims_its_quota_and_the_preempted_job_resumes_from_its_checkpoint() {
    let scratch = tempfile::tempdir().unwrap();
    let tenancy = scratch.path().join("tenancy.toml");
    std::fs::write(&tenancy, TENANCY).unwrap();
    let f = Fed::generated(
        &[SiteSpec::new("only", "owned", "A100", 4, 1.0)],
        &format!("tenancy = {:?}", tenancy.display().to_string()),
    );
    let witness = scratch.path().join("witness");
    // Checkpoints once running; on a resumed run, records where it resumed from and ends at once.
    let resumable = format!(
        "if [ -n \"$MERIDIAN_RESUME_FROM\" ]; then echo \"$MERIDIAN_JOB_ID resumed $MERIDIAN_RESUME_FROM\" >> {w}; exit 0; fi; \
         echo \"file:///shared/ckpt/$MERIDIAN_JOB_ID/step-100\" > \"$MERIDIAN_CHECKPOINT_FILE\"; sleep 60",
        w = witness.display()
    );
    let mut borrowed = Vec::new();
    for i in 0..4 {
        let mut spec = job(&format!("b{i}"), 1, &resumable);
        spec["tenant"] = json!("borrower");
        spec["checkpointable"] = json!(true);
        borrowed.push(f.submit(&spec));
    }
    for id in &borrowed {
        f.wait_phase(id, "running", LONG);
    }
    // The checkpoints are reported (agents look at each heartbeat).
    f.wait_until("checkpoints reported", LONG, || {
        borrowed
            .iter()
            .all(|id| f.job(id)["checkpoint"].as_str().is_some())
    });

    // A third borrower job waits: the cohort's quota (4) is in use.
    let mut extra = job("b-extra", 1, "true");
    extra["tenant"] = json!("borrower");
    let extra = f.submit(&extra);
    std::thread::sleep(Duration::from_millis(500));
    let why = f.explain(&extra)["why"].as_str().unwrap().to_owned();
    assert!(why.contains("waiting for quota: queue borrower"), "{why}");

    // The lender's two jobs take its quota back: two borrowed jobs are preempted, not the borrower's own two.
    let mut lent = Vec::new();
    for i in 0..2 {
        let mut spec = job(&format!("l{i}"), 1, "sleep 2");
        spec["tenant"] = json!("lender");
        lent.push(f.submit(&spec));
    }
    for id in &lent {
        f.wait_phase(id, "running", LONG);
    }
    let preempted: Vec<&String> = borrowed
        .iter()
        .filter(|id| {
            let e = f.explain(id);
            e["history"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h.as_str().unwrap_or("").contains("preempted by"))
        })
        .collect();
    assert_eq!(preempted.len(), 2, "{preempted:?}");
    let still: usize = borrowed
        .iter()
        .filter(|id| f.job(id)["phase"] == "running" && f.job(id)["attempt"] == 1)
        .count();
    assert_eq!(still, 2, "the borrower keeps its own quota");

    // When the lender's jobs end, the preempted ones run again and resume from their checkpoints.
    for id in &lent {
        f.wait_phase(id, "succeeded", LONG);
    }
    for id in &preempted {
        let done = f.wait_phase(id, "succeeded", LONG);
        assert_eq!(done["attempt"], 2, "{done}");
    }
    let w = std::fs::read_to_string(&witness).unwrap();
    for id in &preempted {
        assert!(
            w.contains(&format!("{id} resumed file:///shared/ckpt/{id}/step-100")),
            "{w}"
        );
    }
    f.wait_phase(&extra, "succeeded", LONG);

    // The report's totals match the job records, summed here independently.
    let out = f.cli(&["--output", "json", "report"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = f.jobs();
    for field in ["cost_micro_usd", "energy_wh", "co2_g"] {
        let sum: u64 = jobs
            .iter()
            .map(|j| j["metered"][field].as_u64().unwrap())
            .sum();
        assert_eq!(
            report["total"][field].as_u64().unwrap(),
            sum,
            "{field}: {report}"
        );
    }
    assert!(
        report["total"]["cost_micro_usd"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert_eq!(report["total"]["jobs"], jobs.len(), "{report}");
    let attempts: u64 = jobs.iter().map(|j| j["attempt"].as_u64().unwrap()).sum();
    assert_eq!(report["total"]["attempts"], attempts, "{report}");
    let tenants: Vec<&str> = report["by_tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["borrower", "lender"]);
    let csv = f.cli(&["--output", "csv", "report", "--tenant", "lender"]);
    let csv = String::from_utf8_lossy(&csv.stdout);
    assert!(
        csv.starts_with("by,key,jobs,attempts,device_milli_ms"),
        "{csv}"
    );
    assert!(csv.contains("\ntenant,lender,2,2,"), "{csv}");
    // A budget refuses a job expected to cost more than what is left (an hour of a 1 USD/h GPU > 0.50 USD).
    let mut spec = job("c0", 1, "true");
    spec["tenant"] = json!("capped");
    let (status, v) = f.post("/v1/jobs", spec.to_string().as_bytes());
    assert_eq!(status, 402, "{v}");
    assert_eq!(v["error"]["code"], "over_budget", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("tenant capped has 0.50 of its 0.50 USD for this month left"),
        "{msg}"
    );
    // A bad request names the field.
    let (status, v) = f.get("/v1/report?from_ms=yesterday");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "from_ms", "{v}");
}

/// Quotas change through the API without a restart, by the administrator only, and the change is kept in the
/// journal: a restarted broker still has it.
#[test]
fn an_administrator_changes_quotas_at_run_time_and_the_change_survives_a_restart() {
    let scratch = tempfile::tempdir().unwrap();
    let tenancy = scratch.path().join("tenancy.toml");
    let one = "[[queues]]\nname = \"solo\"\ntenant = \"solo\"\nquota = { \"gpu:*\" = 1 }\n";
    std::fs::write(&tenancy, one).unwrap();
    let mut f = Fed::generated_with(
        &[SiteSpec::new("only", "owned", "A100", 4, 1.0)],
        &format!("tenancy = {:?}", tenancy.display().to_string()),
        meridian_broker::local::LocalOptions::default(),
    );
    let spec = |key: &str| {
        let mut s = job(key, 1, "sleep 30");
        s["tenant"] = json!("solo");
        s
    };
    let first = f.submit(&spec("s0"));
    f.wait_phase(&first, "running", LONG);
    let second = f.submit(&spec("s1"));
    std::thread::sleep(Duration::from_millis(300));
    let explain = f.cli(&["explain", &second]);
    let text = String::from_utf8_lossy(&explain.stdout);
    println!("meridian explain {second}:\n{text}");
    assert!(
        text.contains("waiting for quota: queue solo uses 1.000 of its 1.000 gpu:*"),
        "{text}"
    );

    let two = one.replace("= 1 }", "= 2 }");
    let admin = f.token.clone().expect("a secured federation");
    let put = |token: Option<&str>, body: &str| {
        f.with_token(token)
            .put("/v1/admin/tenancy", body.as_bytes())
    };
    let (status, v) = put(None, &two);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("unauthenticated")),
        "{v}"
    );
    let (status, _) = put(Some("guess"), &two);
    assert_eq!(status, 401);
    let (status, v) = put(Some(&admin), "[[queues]]\nname = 7\n");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "tenancy", "{v}");
    assert_eq!(
        f.job(&second)["phase"],
        "pending",
        "a refused change changes nothing"
    );
    let (status, v) = put(Some(&admin), &two);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["ok"]["toml"], two);
    f.wait_phase(&second, "running", LONG);

    // The change outlives the broker: after a kill -9 and a restart it is still in force.
    f.fed.restart_broker().unwrap();
    let out = f.cli(&["tenancy"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), two);
    let third = f.submit(&spec("s2"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(f.job(&third)["phase"], "pending");
    assert!(f.explain(&third)["why"]
        .as_str()
        .unwrap()
        .contains("uses 2.000 of its 2.000 gpu:*"));
}
