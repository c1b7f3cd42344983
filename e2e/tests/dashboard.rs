//! The operator dashboard in a real browser: Debian's headless Chromium, driven through ChromeDriver's WebDriver
//! protocol, trusting the local federation's development CA (an NSS database of its own), signs in with the
//! address `meridian up` prints, finds every site on the map, the jobs in the table and a running job's flow,
//! follows a job to its page and saves screenshots, signed in as a federation-wide viewer (every tenant's work,
//! nothing it may change). Its attacker's side: the session cookie reads but changes nothing, a wrong token sets
//! no cookie, another tenant's session sees none of these jobs, the viewer cancels, drains and creates nothing,
//! and the page itself holds no data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// ChromeDriver (in a process group of its own, killed on drop) and one browser session.
struct Browser {
    driver: Child,
    base: String,
    http: ureq::Agent,
    session: String,
}

impl Browser {
    /// Starts ChromeDriver with `home` as the browser's home (its NSS database trusts the CA).
    fn start(home: &Path, profile: &Path) -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .env("HOME", home)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/setup.sh installs it)");
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let base = format!("http://127.0.0.1:{port}");
        let mut b = Browser {
            driver,
            base,
            http,
            session: String::new(),
        };
        let until = Instant::now() + Duration::from_secs(20);
        while b.call("GET", "/status", None)["value"]["ready"] != true {
            assert!(Instant::now() < until, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1300", format!("--user-data-dir={}", profile.display())]
            }
        }}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {v}"))
            .to_owned();
        b
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let reply = match (method, body) {
            ("GET", _) => self.http.get(&url).call(),
            ("DELETE", _) => self.http.delete(&url).call(),
            (_, body) => self
                .http
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or(json!({})).to_string().as_bytes()),
        };
        match reply {
            Ok(mut r) => serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default())
                .unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The elements that match a CSS selector.
    fn find_all(&self, css: &str) -> Vec<String> {
        let v = self.session_call(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        v["value"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn attr(&self, element: &str, name: &str) -> String {
        let v = self.session_call("GET", &format!("/element/{element}/attribute/{name}"), None);
        v["value"].as_str().unwrap_or_default().to_owned()
    }

    fn text(&self, element: &str) -> String {
        let v = self.session_call("GET", &format!("/element/{element}/text"), None);
        v["value"].as_str().unwrap_or_default().to_owned()
    }

    fn click(&self, element: &str) {
        self.session_call("POST", &format!("/element/{element}/click"), None);
    }

    /// Waits until `check` holds, saying what it waited for.
    fn wait(&self, what: &str, mut check: impl FnMut() -> bool) {
        let until = Instant::now() + LONG;
        while !check() {
            if Instant::now() > until {
                let page = self.session_call("GET", "/source", None);
                panic!(
                    "timed out waiting for {what}; the page: {}",
                    page["value"].as_str().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let v = self.session_call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v["value"].as_str().expect("a screenshot"))
            .expect("base64");
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            self.session_call("DELETE", "", None);
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.driver.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.driver.wait();
    }
}

/// An NSS database under `home` that trusts the federation's CA, as a browser on an operator's machine would.
fn trust_ca(home: &Path, ca: &Path) {
    let db = home.join(".pki/nssdb");
    std::fs::create_dir_all(&db).unwrap();
    let dir = format!("sql:{}", db.display());
    let run = |args: &[&str]| {
        let out = Command::new("certutil")
            .args(args)
            .output()
            .expect("certutil (Debian's libnss3-tools; scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "certutil {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["-d", &dir, "-N", "--empty-password"]);
    run(&[
        "-d",
        &dir,
        "-A",
        "-t",
        "C,,",
        "-n",
        "meridian-dev-ca",
        "-i",
        &ca.display().to_string(),
    ]);
}

#[test]
fn the_dashboard_shows_sites_jobs_and_a_jobs_page_in_a_real_browser() {
    let sites = [
        SiteSpec::new("dc-virginia", "owned", "A100", 4, 1.0),
        SiteSpec {
            lat: 45.6,
            lon: -121.2,
            carbon: 80,
            ..SiteSpec::new("dc-oregon", "owned", "H100", 8, 2.0)
        },
        SiteSpec {
            lat: 48.86,
            lon: 2.35,
            carbon: 50,
            ..SiteSpec::new("eu-paris", "partner", "A100", 2, 1.5)
        },
    ];
    let f = Fed::generated(&sites, "");
    let mut near_london = job("from-london", 1, "sleep 600");
    near_london["users"] = json!([{"name": "London", "location": {"lat": 51.5, "lon": -0.12}}]);
    let running = [
        f.submit(&near_london),
        f.submit(&job("plain", 1, "echo dashboard; sleep 600")),
    ];
    let waiting = f.submit(&job("too-big", 64, "true"));
    let mut theirs = job("other-team-job", 1, "sleep 600");
    theirs["tenant"] = json!("other-team");
    let theirs = f.submit(&theirs);
    for id in running.iter().chain([&theirs]) {
        f.wait_phase(id, "running", LONG);
    }
    let ids: BTreeSet<String> = running.iter().chain([&waiting, &theirs]).cloned().collect();

    // The attacker's side first, over plain HTTP.
    let token = f
        .token
        .clone()
        .expect("a secured federation's administrator's token");
    let (status, page, headers) = f.request("GET", "/", &[]);
    assert_eq!(status, 200);
    assert!(headers["content-security-policy"].contains("script-src 'self'"));
    assert!(
        ids.iter().all(|id| !page.contains(id.as_str())),
        "the page itself holds no data"
    );
    let (status, _, headers) = f.request(
        "POST",
        "/v1/session",
        &[("authorization", "Bearer mrd_nobody_nothing")],
    );
    assert_eq!(status, 401);
    assert!(
        !headers.contains_key("set-cookie"),
        "a wrong token sets no cookie"
    );
    let (status, _, headers) = f.request(
        "POST",
        "/v1/session",
        &[("authorization", &format!("Bearer {token}"))],
    );
    assert_eq!(status, 200);
    let cookie = headers["set-cookie"].clone();
    for attr in ["HttpOnly", "Secure", "SameSite=Strict"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();
    let (status, body, _) = f.request("GET", "/v1/jobs", &[("cookie", &session)]);
    assert_eq!(status, 200, "the cookie reads: {body}");
    let (status, body, _) = f.request(
        "DELETE",
        &format!("/v1/jobs/{}", running[0]),
        &[("cookie", &session)],
    );
    assert_eq!(status, 401, "the cookie alone changes nothing: {body}");
    assert_eq!(f.job(&running[0])["phase"], "running");
    let other = f.create_token(Some("someone-else"), &["viewer"]);
    let (_, body, headers) = f.request(
        "POST",
        "/v1/session",
        &[("authorization", &format!("Bearer {other}"))],
    );
    let other_session = headers["set-cookie"].split(';').next().unwrap().to_owned();
    let (status, listed, _) = f.request("GET", "/v1/jobs", &[("cookie", &other_session)]);
    assert_eq!(status, 200, "{body}");
    assert!(
        ids.iter().all(|id| !listed.contains(id.as_str())),
        "another tenant's session sees none of these jobs: {listed}"
    );

    // A federation-wide viewer reads every tenant's work and the operator's read-only calls, and changes
    // nothing, with its token or its session.
    let viewer = f.create_token(None, &["viewer"]);
    let as_viewer = f.with_token(Some(&viewer));
    let (status, body) = as_viewer.get("/v1/jobs");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"]["jobs"].as_array().unwrap().len(), ids.len());
    for path in ["/v1/report", "/v1/admin/history", "/v1/admin/tenancy"] {
        assert_eq!(as_viewer.get(path).0, 200, "{path}");
    }
    let (status, _, _) = f.request(
        "GET",
        "/metrics",
        &[("authorization", &format!("Bearer {viewer}"))],
    );
    assert_eq!(status, 200, "a viewer may scrape the metrics");
    let (status, body) = as_viewer.delete(&format!("/v1/jobs/{theirs}"));
    assert_eq!(status, 403, "a viewer cancels nothing: {body}");
    let (status, body) = as_viewer.post(
        &format!("/v1/sites/{}/drain", sites[0].id),
        br#"{"drain": true}"#,
    );
    assert_eq!(status, 403, "a viewer drains nothing: {body}");
    let (status, body) = as_viewer.post("/v1/admin/tokens", br#"{"roles": ["admin"]}"#);
    assert_eq!(status, 403, "a viewer makes no token: {body}");
    assert_eq!(f.job(&theirs)["phase"], "running");

    // The browser, signed in as the viewer.
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path().join("home");
    trust_ca(&home, &f.ca().expect("a CA"));
    let b = Browser::start(&home, &scratch.path().join("profile"));
    b.goto(&format!("{}/#token={viewer}", f.http()));
    let want: BTreeSet<String> = sites.iter().map(|s| s.id.to_owned()).collect();
    let mut on_map = BTreeSet::new();
    b.wait("every site on the map", || {
        on_map = b
            .find_all("circle[data-site]")
            .iter()
            .map(|e| b.attr(e, "data-site"))
            .collect();
        on_map == want
    });
    b.wait("the country outlines", || {
        b.find_all("path.country").len() > 100
    });
    let mut in_table = BTreeSet::new();
    b.wait("the jobs in the table", || {
        in_table = b
            .find_all("tr[data-job]")
            .iter()
            .map(|e| b.attr(e, "data-job"))
            .collect();
        ids.is_subset(&in_table)
    });
    b.wait("the London job's flow", || {
        b.find_all("path.flow")
            .iter()
            .any(|e| b.attr(e, "data-job") == running[0])
    });
    let queue = b.find_all("tr[data-queue='e2e']");
    assert_eq!(queue.len(), 1);
    let text = b.text(&queue[0]);
    assert!(text.contains("no_site_fits 1"), "{text}");
    let who = b.text(&b.find_all("#who")[0]);
    assert!(who.contains("federation-wide viewer"), "{who}");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"));
    b.screenshot(&shots.join("dashboard.png"));

    // Follow a job to its page.
    let link = b.find_all(&format!("tr[data-job='{}'] a.job-link", running[1]));
    assert_eq!(link.len(), 1);
    b.click(&link[0]);
    b.wait("the job's page", || {
        b.find_all(&format!("#job-page[data-job='{}']", running[1]))
            .len()
            == 1
    });
    let events: Vec<String> = b
        .find_all("tr.timeline-row")
        .iter()
        .map(|e| b.text(e))
        .collect();
    assert!(
        ["submitted", "offered", "started"]
            .iter()
            .all(|e| events.iter().any(|row| row.contains(e))),
        "{events:?}"
    );
    b.wait("the job's log", || {
        b.find_all("#log")
            .first()
            .is_some_and(|e| b.text(e).contains("dashboard"))
    });
    b.screenshot(&shots.join("dashboard-job.png"));
    println!(
        "sites on the map: {on_map:?}; jobs in the table: {}; screenshots: {} and {}",
        in_table.len(),
        shots.join("dashboard.png").display(),
        shots.join("dashboard-job.png").display()
    );
}
