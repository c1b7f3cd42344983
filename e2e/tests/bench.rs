//! The dispatch benchmark runs end to end at a small size: nats-server, broker, agents on the no-op and the
//! process executors, and prints its figures as one JSON line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_e2e::*;

#[test]
fn the_dispatch_benchmark_dispatches_every_job_and_prints_its_figures() {
    let out = std::process::Command::new(local::sibling_binary("meridian").unwrap())
        .args([
            "--output", "json", "bench", "dispatch", "--jobs", "300", "--sites", "5",
        ])
        .args(["--in-flight", "32", "--spawn-jobs", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(f["jobs"], 300, "{f}");
    assert_eq!(f["sites"], 5, "{f}");
    for key in [
        "dispatches_per_s",
        "raw_nats_req_per_s",
        "ratio",
        "p50_ms",
        "p99_ms",
    ] {
        assert!(f[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {f}");
    }
    assert!(f["p99_ms"].as_f64() >= f["p50_ms"].as_f64(), "{f}");
    // The same jobs without security, in the same run, and the ratio (printed, not asserted).
    for key in ["dispatches_per_s", "secured_ratio"] {
        assert!(
            f["insecure"][key].as_f64().is_some_and(|x| x > 0.0),
            "{key}: {f}"
        );
    }
    assert_eq!(f["spawn"]["jobs"], 20, "{f}");
    assert!(
        f["spawn"]["completed_per_s"]
            .as_f64()
            .is_some_and(|x| x > 0.0),
        "{f}"
    );
}
