//! Strict where people type, tolerant between components: each kind of bad input gets a clear error in the
//! API's JSON shape, naming the field, and changes nothing; a third-party client (nats-py) drives the
//! documented NATS API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(40);

fn refused(f: &Fed, body: &Value) -> (u16, Value) {
    let (status, v) = f.post("/v1/jobs", body.to_string().as_bytes());
    assert!(status >= 400, "accepted: {v}");
    (status, v["error"].clone())
}

#[test]
fn each_bad_input_gets_its_error_and_changes_nothing() {
    let f = Fed::generated(&[SiteSpec::new("only", "owned", "A100", 4, 1.0)], "");
    let base = job("ok", 1, "true");
    // Unknown fields, named by their path: a typo never changes where work runs.
    for (edit, path) in [
        (
            json!({"constraints": {"residancy": "eu"}}),
            "constraints.residancy",
        ),
        (json!({"replica": 2}), "replica"),
        (
            json!({"resources": {"kind": "gpu", "count": 1, "model": "A100"}}),
            "resources.model",
        ),
        (json!({"constraints": {"site": "only"}}), "constraints.site"),
        (
            json!({"users": [{"location": {"lat": 50.1, "lon": 8.7, "alt": 100}}]}),
            "users[0].location.alt",
        ),
    ] {
        let mut spec = base.clone();
        for (k, v) in edit.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let (status, e) = refused(&f, &spec);
        assert_eq!(status, 400);
        assert_eq!(e["field"], path, "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("unknown field"),
            "{e}"
        );
    }
    // A missing field is named; NUL bytes, a deadline already past are refused with the field.
    let mut spec = base.clone();
    spec.as_object_mut().unwrap().remove("tenant");
    assert_eq!(refused(&f, &spec).1["field"], "tenant");
    let mut spec = base.clone();
    spec["run"]["command"] = json!("echo a\u{0}b");
    assert_eq!(refused(&f, &spec).1["field"], "run.command");
    let mut spec = base.clone();
    spec["run"]["env"] = json!({"KEY": "x\u{0}y"});
    assert_eq!(refused(&f, &spec).1["field"], "run.env.KEY");
    let mut spec = base.clone();
    spec["window"] = json!({"deadline_ms": 86_400_000});
    let (status, e) = refused(&f, &spec);
    assert_eq!(
        (status, e["field"].as_str()),
        (400, Some("window.deadline_ms"))
    );
    // Nothing of that was recorded.
    assert!(f.jobs().is_empty());

    // Work no site can run now is accepted, flagged and explained (a site may join later).
    let mut huge = job("huge", 4096, "true");
    huge["replicas"] = json!(1024);
    let id = f.submit(&huge);
    let j = f.job(&id);
    assert_eq!(
        (j["phase"].as_str(), j["unsatisfiable"].as_bool()),
        (Some("pending"), Some(true))
    );
    assert!(j["why"].as_str().unwrap().contains("no site fits"), "{j}");
    // A job field no backend honours is refused, never ignored; a backend no site runs makes the job wait.
    for (edit, field) in [
        (
            json!({"command": "true", "image": "nvcr.io/nvidia/pytorch:24.01"}),
            "run.image",
        ),
        (
            json!({"command": "true", "adapter": "kubernetes"}),
            "run.adapter",
        ),
    ] {
        let mut spec = job("backend", 1, "true");
        spec["run"] = edit;
        let (status, e) = refused(&f, &spec);
        assert_eq!((status, e["field"].as_str()), (400, Some(field)), "{e}");
    }
    let (_, sites) = f.get("/v1/sites");
    assert_eq!(sites["ok"][0]["backend"], "process", "{sites}");
    let mut dry = job("dry", 1, "true");
    dry["run"]["adapter"] = json!("noop");
    let id = f.submit(&dry);
    let why = f.job(&id)["why"].as_str().unwrap().to_owned();
    assert!(
        why.contains("backend process, the job asks for noop"),
        "{why}"
    );
    let mut here = job("here", 1, "true");
    here["run"]["adapter"] = json!("process");
    let id = f.submit(&here);
    f.wait_phase(&id, "succeeded", LONG);
    // A model no pool has is named as such.
    let mut b300 = job("b300", 1, "true");
    b300["resources"]["models"] = json!(["B300"]);
    let id = f.submit(&b300);
    let why = f.job(&id)["why"].as_str().unwrap().to_owned();
    assert!(
        why.contains("no pool examined has the model the job allows (B300)")
            && why.contains("A100"),
        "{why}"
    );

    // Over HTTP/2 too, a body over the limit gets the JSON 413, not a reset stream (a third-party client,
    // curl, with a 20 MB body sent whole and a 2 MB one sent in chunks).
    let big = f.scratch.path().join("big.json");
    std::fs::write(&big, vec![b' '; 20 << 20]).unwrap();
    for chunked in [false, true] {
        let mut curl = std::process::Command::new("curl");
        curl.args([
            "-sS",
            "--http2",
            "-o",
            "-",
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .arg("--cacert")
        .arg(f.ca().unwrap())
        .args([
            "-H",
            &format!("Authorization: Bearer {}", f.token.clone().unwrap()),
        ]);
        if chunked {
            std::fs::write(&big, vec![b' '; 2 << 20]).unwrap();
            curl.args(["-H", "Transfer-Encoding: chunked"]);
        }
        let out = curl
            .arg("--data-binary")
            .arg(format!("@{}", big.display()))
            .arg(format!("{}/v1/jobs", f.http()))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(text.ends_with("413 2"), "{text}");
        assert!(text.contains("\"code\":\"too_large\""), "{text}");
    }

    // Router-level errors answer in the same JSON shape.
    for (method, path, body, status) in [
        ("GET", "/v1/nothing-here", None, 404),
        ("DELETE", "/v1/sites", None, 405),
        ("GET", "/v1/jobs?limit=abc", None, 400),
        ("GET", "/v1/jobs?bogus=1", None, 400),
        ("GET", "/v1/jobs/bad.id", None, 400),
        (
            "POST",
            "/v1/jobs",
            Some(vec![b' '; meridian_federation::MAX_MESSAGE_BYTES + 10]),
            413,
        ),
    ] {
        let (got, v) = match (method, body) {
            ("GET", _) => f.get(path),
            ("DELETE", _) => f.delete(path),
            (_, Some(b)) => f.post(path, &b),
            _ => unreachable!(),
        };
        assert_eq!(got, status, "{method} {path}: {v}");
        assert!(v["error"]["code"].is_string(), "{method} {path}: {v}");
        assert!(v["error"]["message"].is_string(), "{method} {path}: {v}");
    }
    let (_, v) = f.get("/v1/jobs?bogus=1");
    assert_eq!(v["error"]["field"], "bogus", "{v}");

    // A status with a run time past any bound is refused: the job's metering is untouched.
    let ok = f.submit(&job("metered", 1, "sleep 2"));
    f.wait_phase(&ok, "running", LONG);
    let attempt = f.job(&ok)["attempt"].as_u64().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        // The site's own identity: only it may speak for the site.
        let nc = f.nats_as("only").await;
        let status = json!({"v": 1, "job": ok, "attempt": attempt, "site": "only", "state": "succeeded",
            "exit_code": 0, "at_ms": 1, "runtime_ms": u64::MAX});
        nc.request(
            "meridian.v1.site.only.status",
            status.to_string().into_bytes().into(),
        )
        .await
        .unwrap()
    });
    let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(answer["error"]["field"], "runtime_ms", "{answer}");
    let done = f.wait_phase(&ok, "succeeded", LONG);
    assert!(done["runtime_ms"].as_u64().unwrap() < 60_000, "{done}");
    assert!(
        done["metered"]["cost_micro_usd"].as_u64().unwrap() < 1_000_000,
        "{done}"
    );
}

/// nats-py, a client that is not the project's code, drives the documented NATS API with TLS, its NKey and a
/// tenant's token: a misspelt field is refused with its path, jobs are submitted and listed page by page, and a
/// call without a token is refused.
#[test]
fn a_third_party_client_uses_the_nats_api() {
    let f = Fed::generated(&[SiteSpec::new("only", "owned", "A100", 4, 1.0)], "");
    let python = local::workspace_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh (it installs nats-py)",
        python.display()
    );
    // A tenant's token, as a team using the API would hold.
    let token = f.create_token(Some("py"), &["submit", "watch"]);
    let mut cmd = f.python(&python, "api_client.py");
    cmd.env("MERIDIAN_TOKEN", &token);
    let seen = json_output(cmd);
    assert_eq!(
        seen["typo_error"]["field"], "constraints.residancy",
        "{seen}"
    );
    assert_eq!(seen["submitted"], 30);
    assert_eq!(seen["listed"], 30);
    assert!(seen["pages"].as_u64().unwrap() >= 5, "{seen}");
    assert_eq!(seen["all_submitted_listed"], true);
    assert_eq!(seen["bad_list_error"]["field"], "limt", "{seen}");
    assert_eq!(seen["no_token_error"]["code"], "unauthenticated", "{seen}");
    // What the broker is, over NATS and over HTTP alike.
    let (status, over_http) = f.get("/v1/version");
    assert_eq!(status, 200, "{over_http}");
    assert_eq!(seen["version"], over_http["ok"], "{seen}");
    assert_eq!(
        seen["version"]["wire"],
        meridian_federation::WIRE_VERSION,
        "{seen}"
    );
    assert!(
        seen["version"]["version"]
            .as_str()
            .is_some_and(|v| v.split('.').count() == 3),
        "{seen}"
    );
}
