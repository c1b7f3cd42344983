//! Writes a journal fixture of the newest durable format from a real run (`broker/core/tests/fixtures/`):
//! jobs that succeed, fail, are cancelled and keep running, an API token created and revoked, a site revoked
//! and let back in, unpinned jobs under the balanced, carbon-price and cost-premium policies, services deployed
//! (one with its replica running, one deleted, one on spot capacity), a gateway token, a job that ran across a
//! change of its site's grid intensity, a job under a carbon price of 0 (placed as `cost`: the cleaner of two
//! sites of the same price), a kill -9 of the broker and its restart. Run by hand when a format is added (fixtures are
//! never regenerated):
//!   MERIDIAN_FIXTURE_DIR=broker/core/tests/fixtures/format-N \
//!     cargo test -p meridian-e2e --test format_fixture -- --ignored --nocapture
//! A relative folder is taken from the workspace root (cargo runs the test in `e2e/`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::LocalOptions;
use meridian_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::AsyncReadExt;

const LONG: Duration = Duration::from_secs(40);

fn pinned(key: &str, site: &str, command: &str) -> Value {
    let mut j = job(key, 1, command);
    j["constraints"] = json!({"sites": [site]});
    j
}

#[test]
#[ignore = "writes a fixture; run by hand when a durable format is added"]
fn write_a_journal_fixture_of_the_newest_format() {
    let out = local::workspace_root().join(
        std::env::var("MERIDIAN_FIXTURE_DIR").expect("MERIDIAN_FIXTURE_DIR names the folder"),
    );
    std::fs::create_dir_all(&out).unwrap();
    let throughput = configs().join("throughput.toml");
    let mut f = Fed::generated_with(
        &[
            SiteSpec {
                spot_price: Some(0.4),
                ..SiteSpec::new("site-a", "owned", "A100", 4, 1.0)
            },
            SiteSpec {
                grid_feed: true,
                ..SiteSpec::new("site-b", "owned", "H100", 4, 2.0)
            },
            // As cheap as site-a, on a cleaner grid: where cost's tie-break decides.
            SiteSpec {
                carbon: 100,
                ..SiteSpec::new("site-c", "owned", "A100", 4, 1.0)
            },
        ],
        &format!("throughput = {:?}", throughput.display().to_string()),
        LocalOptions {
            broker_args: vec!["--snapshot-every".into(), "10".into()],
            ..LocalOptions::default()
        },
    );
    let ok = f.submit(&pinned("ok", "site-a", "true"));
    let failed = f.submit(&pinned("fails", "site-a", "exit 3"));
    let cancelled = f.submit(&pinned("cancelled", "site-a", "sleep 600"));
    let on_b = f.submit(&pinned("on-b", "site-b", "sleep 600"));
    let stays = f.submit(&pinned("stays", "site-a", "sleep 600"));
    f.wait_phase(&ok, "succeeded", LONG);
    f.wait_phase(&failed, "failed", LONG);
    f.wait_phase(&cancelled, "running", LONG);
    f.wait_phase(&on_b, "running", LONG);
    f.wait_phase(&stays, "running", LONG);
    assert_eq!(f.delete(&format!("/v1/jobs/{cancelled}")).0, 200);
    f.wait_phase(&cancelled, "cancelled", LONG);
    let token = f.create_token(Some("e2e"), &["viewer", "submit:default"]);
    let id = token.split('_').nth(1).unwrap().to_owned();
    assert_eq!(f.delete(&format!("/v1/admin/tokens/{id}")).0, 200);
    assert_eq!(f.post("/v1/admin/sites/site-b/revoke", b"").0, 200);
    f.wait_phase(&on_b, "pending", LONG);
    assert_eq!(f.post("/v1/admin/sites/site-b/restore", b"").0, 200);
    // Unpinned jobs under the money-and-carbon policies (format 4): replay must place them where they ran.
    for (key, policy) in [
        ("balanced", json!("balanced")),
        ("carbon-priced", json!({"carbon_price_usd_per_t": 190})),
        ("premium", json!({"max_cost_premium": 0.05})),
        // Format 9: a carbon price of 0 is cost, so the cleaner of the two cheapest sites.
        ("zero-priced", json!({"carbon_price_usd_per_t": 0})),
    ] {
        let mut j = job(key, 1, "true");
        j["policy"] = policy;
        let id = f.submit(&j);
        f.wait_phase(&id, "succeeded", LONG);
        if key == "zero-priced" {
            assert_eq!(f.job(&id)["site"], "site-c", "{}", f.job(&id));
        }
    }
    // Services (format 5): one deployed, its replica started by the autoscaler; another deployed and deleted.
    let service = |name: &str| {
        json!({
            "name": name, "tenant": "e2e", "resources": {"kind": "gpu", "count": 1},
            "throughput": {"requests_per_s": 5.0}, "slo_ms": 50, "min_replicas": 1, "max_replicas": 2,
            "scale_up_delay_s": 0, "scale_down_delay_s": 2, "demand_window_s": 1, "policy": "cost",
            "run": {"command": "sleep 600"}
        })
        .to_string()
    };
    for name in ["chat", "gone"] {
        let (code, body) = f.post("/v1/services", service(name).as_bytes());
        assert_eq!(code, 200, "{body}");
    }
    // Spot (format 6): a service that allows it, its replica on site-a's spot capacity.
    let mut spot: Value = serde_json::from_str(&service("spot")).unwrap();
    spot["spot"] = json!(true);
    let (code, body) = f.post("/v1/services", spot.to_string().as_bytes());
    assert_eq!(code, 200, "{body}");
    // A gateway token (format 6), kept.
    f.create_token(Some("e2e"), &["gateway:chat"]);
    f.wait_until("a replica of each service running", LONG, || {
        let jobs = f.jobs();
        ["chat-", "gone-", "spot-"].iter().all(|p| {
            jobs.iter().any(|j| {
                j["phase"] == "running" && j["name"].as_str().is_some_and(|n| n.starts_with(p))
            })
        })
    });
    let (code, body) = f.delete("/v1/services/gone?tenant=e2e");
    assert_eq!(code, 200, "{body}");
    // Carbon metered over the intensities a run went through (format 8): site-b's grid feed goes from 300 to
    // 3,000 gCO2e/kWh half way through a 3-GPU job's run.
    f.set_grid("site-b", r#"{"g_per_kwh": 300}"#);
    let mut across = pinned("across", "site-b", "sleep 8");
    across["resources"]["count"] = json!(3);
    let across = f.submit(&across);
    f.wait_phase(&across, "running", LONG);
    std::thread::sleep(Duration::from_secs(4));
    f.set_grid("site-b", r#"{"g_per_kwh": 3000}"#);
    f.wait_phase(&across, "succeeded", LONG);
    f.fed.restart_broker().unwrap();
    let last = f.submit(&pinned("after-restart", "site-a", "true"));
    f.wait_phase(&last, "succeeded", LONG);
    std::thread::sleep(Duration::from_secs(3));

    let live = |f: &Fed| -> Value {
        let (code, page) = f.get("/v1/jobs?scope=live&limit=1000");
        assert_eq!(code, 200, "{page}");
        page["ok"]["jobs"].clone()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let nc = rt.block_on(f.nats_as("broker-1-store"));
    let js = rt.block_on(async { async_nats::jetstream::new(nc) });
    let snapshot = rt.block_on(async {
        let store = js.get_object_store("MERIDIAN_SNAPSHOTS").await.unwrap();
        let mut obj = store.get("broker-state").await.unwrap();
        let mut snap = Vec::new();
        obj.read_to_end(&mut snap).await.unwrap();
        String::from_utf8(snap).unwrap()
    });
    // A change after the snapshot, so that the fixture has batches after it.
    let (code, body) = f.post("/v1/sites/site-b/drain", br#"{"drain": true}"#);
    assert_eq!(code, 200, "{body}");
    std::thread::sleep(Duration::from_secs(2));
    let jobs = live(&f);
    let journal = rt.block_on(async {
        let mut stream = js.get_stream("MERIDIAN_JOURNAL").await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut lines = Vec::new();
        for seq in 1..=last {
            let m = stream.get_raw_message(seq).await.unwrap();
            lines.push(String::from_utf8(m.payload.to_vec()).unwrap());
        }
        lines
    });
    assert_eq!(live(&f), jobs, "the federation was still changing");
    std::fs::write(out.join("journal.jsonl"), journal.join("\n") + "\n").unwrap();
    std::fs::write(out.join("snapshot.json"), snapshot + "\n").unwrap();
    std::fs::write(
        out.join("jobs.json"),
        serde_json::to_string_pretty(&jobs).unwrap() + "\n",
    )
    .unwrap();
    std::fs::copy(&throughput, out.join("throughput.toml")).unwrap();
    println!(
        "{} journal messages, {} live jobs",
        journal.len(),
        jobs.as_array().unwrap().len()
    );
}
