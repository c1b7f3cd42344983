//! Metrics from outside: a real Prometheus (Debian's `prometheus`) scrapes a secured local federation's broker
//! over HTTPS with the federation's CA and a token, and its HTTP API is asked for placements, pending jobs and
//! the devices the agents report over NATS. The attacker's side: a token that is not an administrator's reads
//! no metrics, and a site cannot report another site's devices (on that site's subject nats-server refuses it;
//! on its own subject the broker does).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::Managed;
use meridian_e2e::{job, Fed, SiteSpec};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

fn federation() -> Fed {
    Fed::generated(
        &[
            SiteSpec::new("dc-a", "owned", "H100", 2, 2.0),
            SiteSpec::new("cloud-b", "cloud", "H100", 2, 4.0),
        ],
        "",
    )
}

/// The text of `GET /metrics` with the federation's administrator token.
fn scrape(f: &Fed) -> String {
    let (status, v) = f.get("/metrics");
    assert_eq!(status, 200, "{v}");
    v.as_str().expect("metrics are text").to_owned()
}

/// The value of the one series of `text` whose line starts with `series` (name and labels as written).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_broker_exports_placements_waits_spend_and_agent_device_metrics() {
    let f = federation();
    let a = f.submit(&job("runs", 1, "sleep 1"));
    // Eight GPUs: no site has them, so it waits with a reason.
    let waiting = f.submit(&job("too-big", 8, "true"));
    f.wait_phase(&a, "succeeded", LONG);
    assert_eq!(f.job(&waiting)["phase"], "pending");
    let mut text = String::new();
    f.wait_until("the agents' device reports", LONG, || {
        text = scrape(&f);
        text.contains(r#"meridian_device_allocated_ratio{site="dc-a",pool="gpu",device="0"}"#)
            && text.contains(r#"meridian_device_allocated_ratio{site="cloud-b""#)
    });
    println!("{text}");
    assert!(
        value(
            &text,
            r#"meridian_placements_total{policy="balanced",tier="owned"}"#
        ) >= Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"meridian_pending_jobs{queue="e2e",reason="no_site_fits"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value(&text, r#"meridian_sites{state="up"}"#), Some(2.0));
    assert!(value(&text, r#"meridian_tenant_cost_usd_total{tenant="e2e"}"#) > Some(0.0));
    // A one-second run is well under a gram and a watt-hour (integers): the series are there, at zero.
    assert!(value(&text, r#"meridian_tenant_co2e_grams_total{tenant="e2e"}"#).is_some());
    assert!(value(
        &text,
        r#"meridian_tenant_energy_joules_total{tenant="e2e"}"#
    )
    .is_some());
    assert!(value(&text, "meridian_journal_append_seconds_count") > Some(0.0));
    assert!(value(&text, "meridian_admission_wait_seconds_count") >= Some(1.0));
    assert_eq!(
        value(
            &text,
            r#"meridian_devices{site="dc-a",model="H100",state="free"}"#
        ),
        Some(2.0),
        "the finished job gave its device back: {text}"
    );
    // A tenant's token, even one that may read the tenant's jobs, reads no metrics; no token at all, neither.
    let viewer = f.create_token(Some("e2e"), &["viewer"]);
    let (status, v) = f.with_token(Some(&viewer)).get("/metrics");
    assert_eq!(status, 403, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("administrator"));
    assert_eq!(f.with_token(None).get("/metrics").0, 401);
}

#[test]
fn a_site_cannot_report_another_sites_devices() {
    let f = federation();
    f.wait_until("dc-a's device report", LONG, || {
        scrape(&f).contains(r#"meridian_device_allocated_ratio{site="dc-a""#)
    });
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let seen = errors.clone();
        let access = f.fed.access_as("dc-a");
        let opts = access
            .options("attacker")
            .unwrap()
            .event_callback(move |e| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = e {
                        seen.lock().unwrap().push(e.to_string());
                    }
                }
            });
        let nc = access.connect_with(opts, LONG).await.unwrap();
        let forged = json!({"v": 1, "site": "cloud-b", "sent_at_ms": 1, "devices": [
            {"pool": "forged", "index": 0, "allocated_milli": 1000, "utilization": 1.0}
        ]})
        .to_string();
        for subject in [
            "meridian.v1.site.cloud-b.metrics",
            "meridian.v1.site.dc-a.metrics",
        ] {
            nc.publish(subject, forged.clone().into_bytes().into())
                .await
                .unwrap();
        }
        // Malformed on its own subject: refused too.
        nc.publish(
            "meridian.v1.site.dc-a.metrics",
            json!({"v": 1, "site": "dc-a", "sent_at_ms": 1, "devices": [
                {"pool": "gpu", "index": 0, "allocated_milli": 5000}
            ]})
            .to_string()
            .into_bytes()
            .into(),
        )
        .await
        .unwrap();
        nc.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
    });
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("ublish") && e.contains("meridian.v1.site.cloud-b.metrics")),
        "nats-server lets dc-a publish as cloud-b: {errors:?}"
    );
    let text = scrape(&f);
    assert!(!text.contains("forged"), "{text}");
    assert!(!text.contains(" 5.0\n"), "{text}");
    // The broker is still up and counting the sites' own reports.
    assert!(text.contains(r#"meridian_device_allocated_ratio{site="cloud-b",pool="gpu""#));
    f.wait_until("the refusals in the audit", LONG, || {
        let (_, audit) = f.get("/v1/admin/audit?who=site:dc-a");
        audit["ok"]["entries"]
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["action"] == "metrics"))
    });
}

/// Debian's Prometheus, or `None` outside CI when it is not installed (`scripts/setup.sh` installs it).
fn prometheus_binary() -> Option<PathBuf> {
    let found = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: prometheus must be installed (scripts/setup.sh)"
        );
        eprintln!("prometheus is not installed; skipped (scripts/setup.sh installs it)");
    }
    found
}

/// Starts Prometheus on a port of its own choosing, scraping the broker (HTTPS, the CA, a token) and one
/// agent's own `/metrics` (`agent`, plain HTTP on loopback) every second; returns it and its address.
fn start_prometheus(
    bin: &PathBuf,
    dir: &std::path::Path,
    f: &Fed,
    agent: &str,
) -> (Managed, String) {
    let target = f.fed.http.trim_start_matches("https://").to_owned();
    let token_file = dir.join("token");
    std::fs::write(&token_file, f.token.clone().expect("a secured federation")).unwrap();
    let config = format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: meridian
    scheme: https
    tls_config:
      ca_file: {ca:?}
    authorization:
      credentials_file: {token:?}
    static_configs:
      - targets: [{target:?}]
  - job_name: agent
    static_configs:
      - targets: [{agent:?}]
"#,
        ca = f.ca().expect("CA").display().to_string(),
        token = token_file.display().to_string(),
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let log = dir.join("prometheus.log");
    let mut cmd = Command::new(bin);
    cmd.arg(format!(
        "--config.file={}",
        dir.join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        dir.join("data").display()
    ))
    .arg("--web.listen-address=127.0.0.1:0")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap());
    let p = Managed::spawn("prometheus", &mut cmd).unwrap();
    let deadline = Instant::now() + LONG;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(addr) = text
            .lines()
            .filter(|l| l.contains("msg=\"Listening on\""))
            .find_map(|l| l.split("address=").nth(1))
        {
            return (p, addr.trim().to_owned());
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not start:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Asks Prometheus's HTTP API for `query`; returns the result vector.
fn query(addr: &str, q: &str) -> Vec<Value> {
    let url = format!("http://{addr}/api/v1/query");
    let reply = ureq::get(&url).query("query", q).call();
    let Ok(mut r) = reply else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_real_prometheus_scrapes_the_federation() {
    let Some(bin) = prometheus_binary() else {
        return;
    };
    // dc-a's agent also serves its own /metrics (off by default).
    let f = Fed::generated(
        &[
            SiteSpec {
                metrics_listen: true,
                ..SiteSpec::new("dc-a", "owned", "H100", 2, 2.0)
            },
            SiteSpec::new("cloud-b", "cloud", "H100", 2, 4.0),
        ],
        "",
    );
    let a = f.submit(&job("runs", 1, "sleep 1"));
    f.submit(&job("too-big", 8, "true"));
    f.wait_phase(&a, "succeeded", LONG);
    let agent = f.agent_metrics_addr("dc-a");
    let dir = tempfile::tempdir().unwrap();
    let (_prometheus, addr) = start_prometheus(&bin, dir.path(), &f, &agent);
    let mut placements = Vec::new();
    let deadline = Instant::now() + LONG;
    while Instant::now() < deadline {
        placements = query(&addr, "sum(meridian_placements_total)");
        let devices = query(&addr, r#"meridian_device_allocated_ratio{site="dc-a"}"#);
        let from_agent = query(&addr, r#"meridian_device_allocated_ratio{job="agent"}"#);
        if !placements.is_empty() && !devices.is_empty() && !from_agent.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let up = query(&addr, r#"up{job="meridian"}"#);
    println!("up: {up:?}\nplacements: {placements:?}");
    assert_eq!(
        up[0]["value"][1], "1",
        "Prometheus scrapes the broker: {up:?}"
    );
    let n: f64 = placements[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(n >= 1.0, "{placements:?}");
    let pending = query(&addr, r#"meridian_pending_jobs{reason="no_site_fits"}"#);
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["metric"]["queue"], "e2e");
    assert_eq!(pending[0]["value"][1], "1");
    let devices = query(
        &addr,
        r#"count(meridian_device_allocated_ratio{job="meridian"})"#,
    );
    assert_eq!(
        devices[0]["value"][1], "4",
        "two devices at each of two sites, reported by their agents over NATS: {devices:?}"
    );
    let up = query(&addr, r#"up{job="agent"}"#);
    assert_eq!(
        up[0]["value"][1], "1",
        "Prometheus scrapes the agent: {up:?}"
    );
    let own = query(
        &addr,
        r#"count(meridian_device_allocated_ratio{job="agent",site="dc-a"})"#,
    );
    assert_eq!(
        own[0]["value"][1], "2",
        "dc-a's two devices from its own /metrics: {own:?}"
    );
}
