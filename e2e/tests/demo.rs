//! The main job (README command 1) with and without the shared data: every batch job must succeed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_e2e::local;
use serde_json::Value;
use std::process::Command;

fn run_demo(no_data: bool) -> Value {
    let root = local::workspace_root();
    let mut cmd = Command::new(local::sibling_binary("meridian").expect("meridian built"));
    cmd.current_dir(&root)
        .args(["--output", "json", "demo", "--jobs", "8"]);
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
    for j in v["jobs"].as_array().unwrap() {
        assert_ne!(j["site"], "-", "every job was placed: {j}");
    }
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
