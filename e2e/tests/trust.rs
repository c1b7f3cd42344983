//! No credential can borrow the broker's hand. An attacker holding a site's credential, or an API client's
//! credential with no API token, sends a request on every subject the broker answers on (every site message,
//! every API call, the routes watch) naming as its reply subject each place only brokers may write — the
//! journal, audit, ledger, archive, lease, snapshots, a JetStream API call — and another site's offers and
//! another client's inbox. The attacker is nats-py (`e2e/py/reply_attack.py`), not the project's code.
//! Afterwards nothing was written there: the journal holds no foreign message and takes changes, the lease is
//! the broker's, `meridian audit` and `meridian report` work, the archive, ledger and snapshots are as they
//! were, nothing arrived at the other site or client, and the refusals are in the audit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use futures::StreamExt;
use meridian_e2e::*;
use meridian_federation::subjects::{self, api, SiteTopic};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(40);

/// Where only a broker may write, and where another identity reads.
const FORBIDDEN: [&str; 9] = [
    "meridian.v1.journal",
    "meridian.v1.audit",
    "meridian.v1.ledger",
    "meridian.v1.archive.job.j-000001",
    "$KV.MERIDIAN_LEASE.active-broker",
    "$O.MERIDIAN_SNAPSHOTS.C.broker-state",
    "$JS.API.STREAM.PURGE.MERIDIAN_AUDIT",
    "meridian.v1.site.site-b.offer",
    "_INBOX.operator.stolen",
];

/// Message counts of the streams only brokers write.
async fn stream_counts(js: &async_nats::jetstream::Context) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for name in [
        subjects::JOURNAL_STREAM,
        subjects::AUDIT_STREAM,
        subjects::LEDGER_STREAM,
        subjects::ARCHIVE_STREAM,
        "KV_MERIDIAN_LEASE",
        "OBJ_MERIDIAN_SNAPSHOTS",
    ] {
        // The snapshot store exists once a snapshot was taken.
        let n = match js.get_stream(name).await {
            Ok(mut s) => s.info().await.unwrap().state.messages,
            Err(_) => 0,
        };
        out.push((name.to_owned(), n));
    }
    out
}

async fn audit_last(js: &async_nats::jetstream::Context) -> u64 {
    let mut s = js.get_stream(subjects::AUDIT_STREAM).await.unwrap();
    s.info().await.unwrap().state.last_sequence
}

/// Counts what arrives on a subject, as `identity` reads it.
async fn watch(f: &Fed, identity: &str, subject: &str) -> Arc<AtomicUsize> {
    let nc = f.nats_as(identity).await;
    let mut sub = nc.subscribe(subject.to_owned()).await.unwrap();
    nc.flush().await.unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    tokio::spawn(async move {
        let _keep = nc;
        while sub.next().await.is_some() {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    n
}

fn attack(f: &Fed, identity: &str, plan: &Value) -> Value {
    let python = local::workspace_root().join(".venv/bin/python");
    let path = f.scratch.path().join(format!("plan-{identity}.json"));
    std::fs::write(&path, plan.to_string()).unwrap();
    let mut cmd = f.python_as(&python, "reply_attack.py", f.fed.access_as(identity), None);
    cmd.arg(&path);
    json_output(cmd)
}

#[test]
fn no_reply_subject_lets_a_credential_write_where_only_brokers_may() {
    let f = Fed::generated(
        &[
            SiteSpec::new("site-a", "owned", "A100", 4, 1.0),
            SiteSpec::new("site-b", "owned", "A100", 4, 2.0),
        ],
        "retention_ms = 1000",
    );
    // A finished and archived job, so that the archive and ledger have something to lose.
    let done = f.submit(&job("before", 1, "true"));
    f.wait_phase(&done, "succeeded", LONG);
    f.wait_until("the job is archived", LONG, || {
        f.job(&done)["archived"] == true
    });
    // An API client's credential, added the way an operator adds one.
    let creds = f.fed.security.as_ref().unwrap().creds.clone();
    let pid = f.fed.nats.nodes[0].pid().unwrap().to_string();
    let out = f.cli(&[
        "creds",
        "--dir",
        creds.to_str().unwrap(),
        "add",
        "client",
        "mallory",
        "--reload",
        &pid,
    ]);
    assert!(out.status.success(), "{out:?}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_runtime = rt.enter();
    let store = rt.block_on(f.nats_as("broker-1-store"));
    let js = async_nats::jetstream::new(store);
    let before = rt.block_on(stream_counts(&js));
    let journal_from = rt.block_on(async {
        let mut s = js.get_stream(subjects::JOURNAL_STREAM).await.unwrap();
        s.info().await.unwrap().state.last_sequence + 1
    });
    let audit_from = rt.block_on(audit_last(&js)) + 1;
    let (offers_b, stolen) = rt.block_on(async {
        (
            watch(
                &f,
                "site-b",
                &subjects::site(&"site-b".parse().unwrap(), SiteTopic::Offer),
            )
            .await,
            watch(&f, "operator", "_INBOX.operator.stolen").await,
        )
    });

    // As site A: every site message the broker answers, malformed and well-formed (a status of an attempt
    // the site does not hold is answered with a refusal).
    let site_subject = |t: SiteTopic| subjects::site(&"site-a".parse().unwrap(), t);
    let status = json!({"v": 1, "job": "j-000001", "attempt": 7, "site": "site-a", "state": "running",
        "at_ms": 1});
    let mut requests =
        vec![json!({"subject": site_subject(SiteTopic::Status), "body": status.to_string()})];
    for t in [
        SiteTopic::Status,
        SiteTopic::Heartbeat,
        SiteTopic::Advert,
        SiteTopic::Metrics,
    ] {
        requests.push(json!({"subject": site_subject(t), "body": "{not json"}));
    }
    let control = json!({"subject": site_subject(SiteTopic::Status), "body": "{not json"});
    let site_run = attack(
        &f,
        "site-a",
        &json!({"requests": requests, "replies": FORBIDDEN, "control": control}),
    );
    assert_eq!(site_run["sent"], 5 * FORBIDDEN.len(), "{site_run}");
    // The broker is listening: a request with the site's own inbox is answered.
    assert!(
        site_run["control"]["error"]["message"].is_string(),
        "{site_run}"
    );

    // As an API client without a token: every API call, the routes watch among them.
    let requests: Vec<Value> = api::CALLS
        .iter()
        .map(|c| json!({"subject": api::subject("mallory", c), "body": "{\"v\": 1}"}))
        .collect();
    let control =
        json!({"subject": api::subject("mallory", api::LIST_SITES), "body": "{\"v\": 1}"});
    let client_run = attack(
        &f,
        "mallory",
        &json!({"requests": requests, "replies": FORBIDDEN, "control": control}),
    );
    assert_eq!(client_run["sent"], api::CALLS.len() * FORBIDDEN.len());
    assert_eq!(
        client_run["control"]["error"]["code"], "unauthenticated",
        "{client_run}"
    );

    // Refusals are written every 5 s; what the attack would have sent has long arrived by then.
    std::thread::sleep(Duration::from_secs(6));
    let after = rt.block_on(stream_counts(&js));
    rt.block_on(async {
        let mut s = js.get_stream(subjects::JOURNAL_STREAM).await.unwrap();
        let last = s.info().await.unwrap().state.last_sequence;
        for seq in journal_from..=last {
            let m = s.get_raw_message(seq).await.unwrap();
            eprintln!("journal {seq}: {}", String::from_utf8_lossy(&m.payload));
        }
    });
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        if name == subjects::AUDIT_STREAM {
            assert!(a > b, "the refusals were not audited ({name}: {b} → {a})");
        } else if name == "KV_MERIDIAN_LEASE" {
            assert_eq!(*a, 1, "the lease bucket holds one key");
        } else {
            assert_eq!(a, b, "{name} changed under the attack: {b} → {a}");
        }
    }
    // Every audit message written since is the broker's: a list of entries.
    rt.block_on(async {
        let s = js.get_stream(subjects::AUDIT_STREAM).await.unwrap();
        for seq in audit_from..=audit_last(&js).await {
            let m = s.get_raw_message(seq).await.unwrap();
            let entries: Result<Vec<Value>, _> = serde_json::from_slice(&m.payload);
            assert!(
                entries.is_ok(),
                "audit message {seq} is not the broker's: {m:?}"
            );
        }
    });
    assert_eq!(offers_b.load(Ordering::SeqCst), 0, "site B got a message");
    assert_eq!(
        stolen.load(Ordering::SeqCst),
        0,
        "another client's inbox got a message"
    );

    // The lease is the broker's, and the broker still takes changes.
    let lease = rt.block_on(async {
        let kv = js.get_key_value("MERIDIAN_LEASE").await.unwrap();
        kv.get("active-broker").await.unwrap().unwrap()
    });
    assert!(
        String::from_utf8_lossy(&lease).contains("broker-1"),
        "{}",
        String::from_utf8_lossy(&lease)
    );
    let (_, format) = f.get("/v1/admin/journal/format");
    assert!(format["ok"]["unreadable"].is_null(), "{format}");
    let after_attack = f.submit(&job("after", 1, "true"));
    f.wait_phase(&after_attack, "succeeded", LONG);
    let logs = f.fed.broker_logs();
    assert!(
        !logs.contains("no longer active") && !logs.contains("stepping down"),
        "{logs}"
    );

    // The audit and the report read, and the audit names each refusal.
    let audit = f.cli(&["audit", "--limit", "200", "--output", "json"]);
    assert!(audit.status.success(), "{audit:?}");
    assert!(
        !String::from_utf8_lossy(&audit.stderr).contains("left out"),
        "{audit:?}"
    );
    let entries: Value = serde_json::from_slice(&audit.stdout).unwrap();
    let refused = |who: &str| {
        entries.as_array().unwrap().iter().any(|e| {
            e["who"] == who
                && e["outcome"]
                    .as_str()
                    .unwrap()
                    .contains("not the caller's own inbox")
        })
    };
    assert!(refused("site:site-a"), "{entries}");
    assert!(refused("nats:mallory"), "{entries}");
    let report = f.cli(&["report", "--output", "json"]);
    assert!(report.status.success(), "{report:?}");
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert!(report["total"].is_object(), "{report}");
    // Newest first: `--limit N` is the newest N.
    let times: Vec<u64> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["until_ms"].as_u64().or(e["at_ms"].as_u64()).unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] + 5_000 >= w[1]),
        "not newest first: {times:?}"
    );

    // A message that is not the broker's (written with a storage credential, or damaged) in the audit or
    // the ledger is left out and named; the rest still reads.
    rt.block_on(async {
        for subject in [subjects::AUDIT, subjects::LEDGER] {
            js.publish(subject, "\u{1}not the broker's".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let audit = f.cli(&["audit", "--limit", "50", "--output", "json"]);
    assert!(audit.status.success(), "{audit:?}");
    assert!(
        String::from_utf8_lossy(&audit.stderr).contains("left out: audit message"),
        "{audit:?}"
    );
    let report = f.cli(&["report", "--output", "json"]);
    assert!(report.status.success(), "{report:?}");
    assert!(
        String::from_utf8_lossy(&report.stderr).contains("left out of the figures: ledger message"),
        "{report:?}"
    );
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(
        report["unreadable"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert!(report["total"]["jobs"].as_u64().unwrap() >= 1, "{report}");

    // With NATS gone, a broker told to stop (SIGTERM) stops within its grace.
    let mut f = f;
    f.fed.nats.nodes[0].kill();
    std::thread::sleep(Duration::from_secs(2));
    let broker = f.fed.brokers[0].proc.as_mut().unwrap();
    let pid = broker.pid().unwrap();
    let told = std::time::Instant::now();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    while broker.alive() && told.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !broker.alive(),
        "the broker still runs 10 s after SIGTERM with NATS gone"
    );
    println!(
        "broker stopped {} ms after SIGTERM",
        told.elapsed().as_millis()
    );
}
