//! Services on a real local federation (nats-server, the broker, two agents an ocean apart): deployed, fed
//! demand by a gateway from New York and Frankfurt, replicas started near each; the Frankfurt demand ends and
//! its replica goes after the delay; the routing table follows; callers without the right token change nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

fn service() -> Value {
    json!({
        "name": "chat",
        "tenant": "acme",
        "resources": {"kind": "gpu", "count": 1},
        "throughput": {"requests_per_s": 10.0},
        "slo_ms": 30,
        "min_replicas": 0,
        "max_replicas": 6,
        "scale_up_delay_s": 0,
        "scale_down_delay_s": 4,
        "demand_window_s": 2,
        "target_utilization": 1.0,
        "policy": "cost",
        "run": {"command": "sleep 600"}
    })
}

fn demand(ny: f64, frankfurt: f64) -> Vec<u8> {
    json!({"locations": [
        {"name": "new-york", "location": {"lat": 40.71, "lon": -74.0}, "per_s": ny},
        {"name": "frankfurt", "location": {"lat": 50.11, "lon": 8.68}, "per_s": frankfurt},
    ]})
    .to_string()
    .into_bytes()
}

/// Running replicas per site, from `GET /v1/services/chat`.
fn running(api: &Api<'_>) -> Vec<(String, usize)> {
    let (status, v) = api.get("/v1/services/chat?tenant=acme");
    assert_eq!(status, 200, "{v}");
    let mut per: std::collections::BTreeMap<String, usize> = Default::default();
    for r in v["ok"]["replicas"].as_array().unwrap() {
        if r["state"] == "running" {
            *per.entry(r["site"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    per.into_iter().collect()
}

#[test]
fn replicas_follow_demand_to_each_city_and_leave_when_it_ends() {
    let mut us = SiteSpec::new("us-east", "owned", "A100", 4, 2.0);
    (us.lat, us.lon) = (40.0, -74.5);
    let mut eu = SiteSpec::new("eu-west", "owned", "A100", 4, 2.0);
    (eu.lat, eu.lon) = (50.0, 8.5);
    let f = Fed::generated(&[us, eu], "");
    let admin = f.with_token(f.token.as_deref());
    let owner = f.create_token(Some("acme"), &["submit:default"]);
    // The gateway holds the gateway role for chat and nothing else.
    let gateway = f.create_token(Some("acme"), &["gateway:chat"]);
    let viewer = f.create_token(Some("acme"), &["viewer"]);
    let mallory = f.create_token(Some("mallory"), &["submit:default", "cancel"]);
    let (gw, view, other) = (
        f.with_token(Some(&gateway)),
        f.with_token(Some(&viewer)),
        f.with_token(Some(&mallory)),
    );
    let own = f.with_token(Some(&owner));
    // The token list shows the role as it was written.
    let (status, v) = admin.get("/v1/admin/tokens");
    assert_eq!(status, 200, "{v}");
    let id = gateway.split('_').nth(1).unwrap();
    let listed = v["ok"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap()
        .clone();
    assert_eq!(listed["roles"], json!(["gateway:chat"]), "{listed}");

    // Another tenant's token cannot deploy for acme; a bad file is refused with the field named.
    let body = service().to_string();
    let (status, v) = other.post("/v1/services", body.as_bytes());
    assert_eq!(status, 403, "{v}");
    let mut bad = service();
    bad["slo_ms"] = json!(0);
    let (status, v) = own.post("/v1/services", bad.to_string().as_bytes());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "slo_ms", "{v}");
    let (status, v) = gw.post("/v1/services", body.as_bytes());
    assert_eq!(status, 403, "a gateway deploys nothing: {v}");
    let (status, v) = own.post("/v1/services", body.as_bytes());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["ok"]["spec"]["name"], "chat");
    // Nor does it submit jobs or read them.
    let (status, v) = gw.post("/v1/jobs", job("gw-job", 1, "true").to_string().as_bytes());
    assert_eq!(status, 403, "{v}");
    let (status, v) = gw.get("/v1/jobs");
    assert_eq!(status, 403, "{v}");

    // Demand from two cities an ocean apart, 15 req/s in New York and 5 in Frankfurt, first from a third-party
    // gateway over NATS (nats-py): taken, and a malformed report refused with the field's path.
    let python = local::workspace_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    let locations: Value =
        serde_json::from_slice::<Value>(&demand(15.0, 5.0)).unwrap()["locations"].clone();
    let mut cmd = f.python(&python, "gateway.py");
    cmd.env("MERIDIAN_TOKEN", &gateway)
        .args(["chat", "acme", &locations.to_string()]);
    let seen = json_output(cmd);
    assert!(seen["report"]["ok"].is_object(), "{seen}");
    assert_eq!(
        seen["bad_report_error"]["field"], "locations[0].location.lat",
        "{seen}"
    );
    assert_eq!(seen["routes"]["ok"]["service"], "chat", "{seen}");
    f.wait_until(
        "two replicas near New York and one near Frankfurt",
        LONG,
        || {
            gw.post("/v1/services/chat/demand", &demand(15.0, 5.0));
            running(&view) == vec![("eu-west".into(), 1), ("us-east".into(), 2)]
        },
    );
    // The routing table sends each city to its own side of the ocean.
    let (status, v) = view.get("/v1/services/chat/routes?tenant=acme");
    assert_eq!(status, 200, "{v}");
    let routes = |v: &Value, city: &str| -> Vec<String> {
        v["ok"]["locations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["location"] == city)
            .map(|l| {
                l["routes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["site"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(routes(&v, "new-york"), ["us-east"], "{v}");
    assert_eq!(routes(&v, "frankfurt"), ["eu-west"], "{v}");
    // The operator sees them running through the CLI.
    let out = f.cli(&["service", "show", "chat", "--tenant", "acme"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("us-east/gpu") && text.contains("eu-west/gpu") && text.contains("running"),
        "{text}"
    );

    // What may not report demand or delete changes nothing: a viewer, another tenant, a malformed report.
    let (status, v) = view.post("/v1/services/chat/demand", &demand(0.0, 0.0));
    assert_eq!(status, 403, "{v}");
    let (status, v) = other.post("/v1/services/chat/demand?tenant=acme", &demand(0.0, 0.0));
    assert!(status == 403 || status == 404, "{status} {v}");
    let (status, v) = other.delete("/v1/services/chat?tenant=acme");
    assert!(status == 403 || status == 404, "{status} {v}");
    let mut broken: Value = serde_json::from_slice(&demand(1.0, 1.0)).unwrap();
    broken["locations"][0]["location"]["lat"] = json!(200.0);
    let (status, v) = gw.post("/v1/services/chat/demand", broken.to_string().as_bytes());
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["field"]
            .as_str()
            .unwrap()
            .contains("locations[0].location.lat"),
        "{v}"
    );
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        running(&view),
        vec![("eu-west".into(), 1), ("us-east".into(), 2)]
    );

    // Frankfurt's demand ends: its replica goes after the scale-down delay; New York's stay.
    f.wait_until("the Frankfurt replica gone", LONG, || {
        gw.post("/v1/services/chat/demand", &demand(15.0, 0.0));
        running(&view) == vec![("us-east".into(), 2)]
    });
    let (_, v) = view.get("/v1/services/chat/routes?tenant=acme");
    assert!(routes(&v, "frankfurt").is_empty(), "{v}");
    let (_, v) = view.get("/v1/services/chat?tenant=acme");
    let changes = v["ok"]["changes"].as_array().unwrap();
    assert!(
        changes.iter().any(|c| c["site"] == "eu-west"
            && c["to"] == 0
            && c["why"].as_str().unwrap().contains("less demand")),
        "{v}"
    );

    // Deleted: every replica stops, the service is gone.
    let (status, v) = admin.delete("/v1/services/chat?tenant=acme");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["ok"]["stopping"].as_array().unwrap().len(), 2, "{v}");
    let (status, _) = view.get("/v1/services/chat?tenant=acme");
    assert_eq!(status, 404);
    f.wait_until("every replica ended", LONG, || {
        f.jobs()
            .iter()
            .all(|j| j["phase"] != "running" && j["phase"] != "pending")
    });
}

/// A replica's or a route's site, with ` spot` on spot capacity.
fn label(r: &Value) -> String {
    format!(
        "{}{}",
        r["site"].as_str().unwrap(),
        if r["spot"] == true { " spot" } else { "" }
    )
}

/// The sites running replicas, from `GET /v1/services/chat`.
fn running_pools(api: &Api<'_>) -> Vec<String> {
    let (status, v) = api.get("/v1/services/chat?tenant=acme");
    assert_eq!(status, 200, "{v}");
    let mut out: Vec<String> = v["ok"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "running")
        .map(label)
        .collect();
    out.sort();
    out
}

/// New York's routes in a `RoutesView`.
fn new_york(routes: &Value) -> Vec<String> {
    routes["locations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["location"] == "new-york")
        .flat_map(|l| l["routes"].as_array().unwrap().iter())
        .map(label)
        .collect()
}

/// New York's routes, from `GET /v1/services/chat/routes`.
fn new_york_routes(api: &Api<'_>) -> Vec<String> {
    let (status, v) = api.get("/v1/services/chat/routes?tenant=acme");
    assert_eq!(status, 200, "{v}");
    new_york(&v["ok"])
}

#[test]
fn a_spot_replica_taken_back_is_replaced_on_spot_elsewhere_then_on_demand() {
    // Two clouds near New York, both selling spot: cloud-a's spot is the cheapest capacity, cloud-b's on-demand
    // the cheapest on-demand.
    let a = SiteSpec {
        lat: 40.0,
        lon: -74.5,
        spot_price: Some(0.8),
        ..SiteSpec::new("cloud-a", "cloud", "A100", 2, 3.0)
    };
    let b = SiteSpec {
        lat: 40.5,
        lon: -74.2,
        spot_price: Some(1.0),
        ..SiteSpec::new("cloud-b", "cloud", "A100", 2, 2.5)
    };
    let f = Fed::generated(&[a, b], "");
    let owner = f.create_token(Some("acme"), &["submit:default"]);
    let gateway = f.create_token(Some("acme"), &["gateway:chat"]);
    let viewer = f.create_token(Some("acme"), &["viewer"]);
    let mallory = f.create_token(Some("mallory"), &["gateway"]);
    let (gw, view) = (f.with_token(Some(&gateway)), f.with_token(Some(&viewer)));
    let mut spec = service();
    spec["spot"] = json!(true);
    let (status, v) = f
        .with_token(Some(&owner))
        .post("/v1/services", spec.to_string().as_bytes());
    assert_eq!(status, 200, "{v}");

    // 5 req/s from New York: one replica, on the cheapest spot capacity.
    f.wait_until("a spot replica at cloud-a", LONG, || {
        gw.post("/v1/services/chat/demand", &demand(5.0, 0.0));
        running_pools(&view) == ["cloud-a spot"]
    });
    assert_eq!(new_york_routes(&view), ["cloud-a spot"]);
    // A third-party gateway (nats-py) watches the routing table over NATS from here on.
    let python = local::workspace_root().join(".venv/bin/python");
    let mut cmd = f.python(&python, "route_watcher.py");
    cmd.env("MERIDIAN_TOKEN", &gateway)
        .env("MERIDIAN_OTHER_TOKEN", &mallory)
        .args(["chat", "acme", "120"]);
    let watcher = Watcher::spawn(cmd);
    f.wait_until("the watcher's first table", LONG, || {
        gw.post("/v1/services/chat/demand", &demand(5.0, 0.0));
        watcher.lines().iter().any(|l| l.get("watch").is_some())
    });

    // The provider takes cloud-a's spot capacity back (the agent's own notice): the routing table drops the
    // replica as soon as the broker hears of it, and a spot replica at cloud-b replaces it.
    f.reclaim_spot("cloud-a");
    f.wait_until("the cloud-a replica interrupted", LONG, || {
        running_pools(&view).is_empty() || running_pools(&view) == ["cloud-b spot"]
    });
    assert!(
        !new_york_routes(&view).contains(&"cloud-a spot".to_owned()),
        "{:?}",
        new_york_routes(&view)
    );
    f.wait_until("a spot replica at cloud-b", LONG, || {
        gw.post("/v1/services/chat/demand", &demand(5.0, 0.0));
        running_pools(&view) == ["cloud-b spot"]
    });
    assert_eq!(new_york_routes(&view), ["cloud-b spot"]);
    // The watch compares the table at most every 250 ms: the next change waits until it has been heard.
    f.wait_until("the watcher heard cloud-b's spot replica", LONG, || {
        watcher.tables().iter().any(|t| t == &["cloud-b spot"])
    });

    // cloud-b's spot goes too: with both spot pools held, on-demand takes over, at the cheaper cloud.
    f.reclaim_spot("cloud-b");
    f.wait_until("an on-demand replica at cloud-b", LONG, || {
        gw.post("/v1/services/chat/demand", &demand(5.0, 0.0));
        running_pools(&view) == ["cloud-b"]
    });
    assert_eq!(new_york_routes(&view), ["cloud-b"]);
    let (_, v) = view.get("/v1/services/chat?tenant=acme");
    let lost: Vec<&Value> = v["ok"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["why"].as_str().unwrap().contains("replica lost"))
        .collect();
    assert_eq!(lost.len(), 2, "{v}");
    assert!(
        lost.iter().all(|c| c["spot"] == true
            && c["why"]
                .as_str()
                .unwrap()
                .contains("taken back by the provider")),
        "{v}"
    );
    // The watcher heard each change as it happened: cloud-a's spot replica first, then a table without it
    // (dropped before its replacement ran), then cloud-b's spot, then cloud-b on-demand; another tenant's watch
    // and a lease out of range were refused.
    f.wait_until("the watcher heard the on-demand replica", LONG, || {
        watcher.tables().last().map(Vec::as_slice) == Some(&["cloud-b".to_owned()][..])
    });
    let lines = watcher.lines();
    let bad = lines.iter().find_map(|l| l.get("bad_lease")).unwrap();
    assert_eq!(bad["error"]["field"], "lease_s", "{bad}");
    let other = lines.iter().find_map(|l| l.get("other_tenant")).unwrap();
    assert!(
        other["ok"].is_null() && other["error"].is_object(),
        "{other}"
    );
    let seqs: Vec<u64> = lines
        .iter()
        .filter_map(|l| l["watch"]["ok"]["seq"].as_u64())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let tables = watcher.tables();
    let at = |want: &[&str]| {
        tables
            .iter()
            .position(|t| t.iter().map(String::as_str).eq(want.iter().copied()))
            .unwrap_or_else(|| panic!("no table {want:?} in {tables:?}"))
    };
    let (first, dropped, spot_b, on_demand) = (
        at(&["cloud-a spot"]),
        at(&[]),
        at(&["cloud-b spot"]),
        at(&["cloud-b"]),
    );
    assert!(
        first < dropped && dropped < spot_b && spot_b < on_demand,
        "{tables:?}"
    );

    // The interrupted replicas were cancelled, not left waiting for a site that has no spot capacity.
    let jobs = f.jobs();
    assert_eq!(
        jobs.iter().filter(|j| j["phase"] == "pending").count(),
        0,
        "{jobs:?}"
    );
}

/// A service whose command does not exist (the shell answers 127) on a real federation: in its first minute a
/// few replicas start, backed off (10 s, 20 s, 40 s), not one every planning step; `meridian service show` names
/// the exit code and the backoff and calls the service unhealthy; the broker counts the failures by outcome.
#[test]
fn a_service_whose_replicas_keep_exiting_backs_off_and_says_why() {
    let f = Fed::generated(&[SiteSpec::new("dc-a", "owned", "A100", 4, 2.0)], "");
    let owner = f.create_token(Some("acme"), &["submit:default"]);
    let own = f.with_token(Some(&owner));
    let mut spec = service();
    spec["name"] = json!("broken");
    spec["min_replicas"] = json!(1);
    spec["run"]["command"] = json!("meridian-no-such-server --port 8000");
    let (status, v) = own.post("/v1/services", spec.to_string().as_bytes());
    assert_eq!(status, 200, "{v}");
    let deployed = std::time::Instant::now();
    let replicas = || -> Vec<Value> {
        f.jobs()
            .into_iter()
            .filter(|j| j["name"].as_str().is_some_and(|n| n.starts_with("broken-")))
            .collect()
    };
    f.wait_until("a first replica that failed", LONG, || {
        replicas().iter().any(|j| j["phase"] == "failed")
    });
    std::thread::sleep(Duration::from_secs(60).saturating_sub(deployed.elapsed()));
    let started = replicas();
    let failed: Vec<&Value> = started.iter().filter(|j| j["phase"] == "failed").collect();
    // Without a backoff a replica would start every planning step (2 s): about 30 in this minute.
    assert!(
        (2..=6).contains(&started.len()),
        "{} replicas in the first minute: {started:#?}",
        started.len()
    );
    assert!(failed.iter().all(|j| j["exit_code"] == 127), "{failed:#?}");

    let out = f.cli(&["service", "show", "broken", "--tenant", "acme"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("health: unhealthy"), "{text}");
    assert!(text.contains("exit code 127"), "{text}");
    assert!(text.contains("crash-loop backoff, next start at"), "{text}");
    let (status, v) = f.get("/v1/services/broken?tenant=acme");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["ok"]["health"], "unhealthy", "{v}");
    assert_eq!(v["ok"]["backoff"][0]["last_exit_code"], 127, "{v}");

    let (status, metrics) = f.get("/metrics");
    assert_eq!(status, 200, "{metrics}");
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    let counted: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"meridian_jobs_finished_total{outcome="failed"} "#))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no failed jobs counted in\n{metrics}"));
    assert!(counted >= failed.len(), "{counted} < {}", failed.len());
}

/// The route watcher (`e2e/py/route_watcher.py`), stopped when dropped; a thread collects its output lines as
/// they come.
struct Watcher {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Watcher {
    fn spawn(mut cmd: std::process::Command) -> Self {
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let into = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                into.lock().unwrap().push(line);
            }
        });
        Watcher { child, lines }
    }

    /// The JSON lines it has printed so far.
    fn lines(&self) -> Vec<Value> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// New York's routes in each table it was sent, in order.
    fn tables(&self) -> Vec<Vec<String>> {
        self.lines()
            .iter()
            .map(|l| &l["watch"]["ok"]["routes"])
            .filter(|routes| routes.is_object())
            .map(new_york)
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
