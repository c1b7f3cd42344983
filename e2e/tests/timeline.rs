//! A job's timeline from outside: curl reads `GET /v1/jobs/{id}/timeline` over HTTPS with the federation's CA
//! and a tenant's token, and `meridian timeline` prints it; another tenant's token finds no such job.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::{job, Fed, SiteSpec};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// `GET path` by curl with `token`: the HTTP status and the JSON body.
fn curl(f: &Fed, path: &str, token: &str) -> (u16, Value) {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--cacert"])
        .arg(f.ca().expect("a secured federation"))
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["--write-out", "\n%{http_code}"])
        .arg(format!("{}{path}", f.fed.http))
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.trim_end().rsplit_once('\n').unwrap();
    (status.parse().unwrap(), serde_json::from_str(body).unwrap())
}

#[test]
fn a_failed_jobs_timeline_shows_its_attempt_exit_code_candidates_and_log() {
    let f = Fed::generated(
        &[
            SiteSpec::new("dc-a", "owned", "H100", 2, 2.0),
            SiteSpec::new("dc-b", "owned", "H100", 2, 3.0),
        ],
        "",
    );
    let id = f.submit(&job(
        "fails",
        1,
        "echo hello-from-the-timeline; sleep 1; exit 3",
    ));
    f.wait_phase(&id, "failed", LONG);
    let tenant = f.create_token(Some("e2e"), &["watch"]);
    let (status, v) = curl(&f, &format!("/v1/jobs/{id}/timeline"), &tenant);
    assert_eq!(status, 200, "{v}");
    let t = &v["ok"];
    println!("{}", serde_json::to_string_pretty(t).unwrap());
    let events: Vec<&str> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    for kind in ["submitted", "offered", "started", "ended", "finished"] {
        assert!(events.contains(&kind), "no {kind} in {events:?}");
    }
    let last = t["events"].as_array().unwrap().last().unwrap();
    assert_eq!(last["event"], "finished");
    assert!(
        last["detail"].as_str().unwrap().contains("exit code 3"),
        "{last}"
    );
    assert_eq!(t["exit_code"], 3);
    let attempt = &t["attempts"][0];
    assert_eq!(attempt["site"], last["site"]);
    assert_eq!(attempt["metered"], true);
    assert!(attempt["runtime_ms"].as_u64().unwrap() >= 1000, "{attempt}");
    assert_eq!(t["candidates"][0]["chosen"], true, "{t}");
    assert!(
        t["log_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("hello-from-the-timeline"),
        "{t}"
    );
    // Another tenant's token: no such job.
    let other = f.create_token(Some("someone-else"), &["watch"]);
    let (status, v) = curl(&f, &format!("/v1/jobs/{id}/timeline"), &other);
    assert_eq!(status, 404, "{v}");
    // The command line prints the same life as a table.
    let out = f.cli(&["timeline", &id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    for expected in [
        "submitted",
        "finished",
        "exit code 3",
        "hello-from-the-timeline",
        "CHOSEN",
    ] {
        assert!(text.contains(expected), "no {expected:?} in\n{text}");
    }
}
