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

    /// Makes the window this size (a taller window shows more of the page in a screenshot).
    fn resize(&self, width: u32, height: u32) {
        self.session_call(
            "POST",
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        );
    }

    /// Types `text` into an input.
    fn type_text(&self, element: &str, text: &str) {
        self.session_call(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// An element's box on the page: x, y, width, height.
    fn rect(&self, element: &str) -> (f64, f64, f64, f64) {
        let v = self.session_call("GET", &format!("/element/{element}/rect"), None);
        let n = |k: &str| v["value"][k].as_f64().unwrap_or(f64::NAN);
        (n("x"), n("y"), n("width"), n("height"))
    }

    /// The text of the first element that matches, or "" when none does.
    fn first_text(&self, css: &str) -> String {
        self.find_all(css)
            .first()
            .map(|e| self.text(e))
            .unwrap_or_default()
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

/// A large owned site on a clean grid, far from the others.
fn oregon() -> SiteSpec<'static> {
    SiteSpec {
        lat: 45.6,
        lon: -121.2,
        carbon: 80,
        ..SiteSpec::new("dc-oregon", "owned", "H100", 8, 2.0)
    }
}

/// A partner's site in Europe.
fn paris() -> SiteSpec<'static> {
    SiteSpec {
        lat: 48.86,
        lon: 2.35,
        carbon: 50,
        ..SiteSpec::new("eu-paris", "partner", "A100", 2, 1.5)
    }
}

#[test]
fn the_dashboard_shows_sites_jobs_and_a_jobs_page_in_a_real_browser() {
    let sites = [
        SiteSpec::new("dc-virginia", "owned", "A100", 4, 1.0),
        oregon(),
        paris(),
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
    let london_site = f.job(&running[0])["site"].as_str().unwrap().to_owned();
    b.wait("the London job's flow", || {
        b.find_all("path.flow")
            .iter()
            .any(|e| b.attr(e, "data-site") == london_site)
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

/// The dashboard at scale: 10,000 waiting jobs beside running work and a service. The queue counts and the map
/// come from the broker's counts over every live job (not a page of them); the table pages newest first and is
/// filtered by the broker; nearby sites' labels do not overlap; a site's page and the services view show what
/// they should.
#[test]
fn the_dashboard_counts_pages_and_maps_ten_thousand_jobs() {
    const BULK: usize = 10_000;
    const CLIENTS: usize = 32;
    // Three sites within a few hundred kilometres (the labels must not overlap), two far away.
    let sites = [
        SiteSpec {
            lat: 38.9,
            lon: -77.0,
            ..SiteSpec::new("dc-virginia", "owned", "A100", 4, 1.0)
        },
        SiteSpec {
            lat: 39.04,
            lon: -77.49,
            ..SiteSpec::new("dc-ashburn", "owned", "A100", 4, 1.2)
        },
        SiteSpec {
            lat: 40.71,
            lon: -74.0,
            edge: true,
            ..SiteSpec::new("edge-nyc", "owned", "A100", 2, 1.8)
        },
        oregon(),
        paris(),
    ];
    let f = Fed::generated(&sites, "");
    let viewer = f.create_token(None, &["viewer"]);

    // A service with one replica at least.
    let service = json!({
        "name": "chat", "tenant": "acme", "resources": {"kind": "gpu", "count": 1},
        "throughput": {"requests_per_s": 10.0}, "slo_ms": 30, "min_replicas": 1, "max_replicas": 2,
        "policy": "cost", "run": {"command": "sleep 600"}
    });
    let (status, v) = f.post("/v1/services", service.to_string().as_bytes());
    assert_eq!(status, 200, "{v}");

    // 10,000 one-GPU jobs from users in London, submitted by 32 clients at once: some run, the rest wait
    // for capacity.
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..CLIENTS {
            let f = &f;
            scope.spawn(move || {
                for i in (t..BULK).step_by(CLIENTS) {
                    let mut j = job(&format!("bulk-{i:05}"), 1, "sleep 600");
                    j["tenant"] = json!("bulk");
                    j["users"] = json!([{"location": {"lat": 51.5, "lon": -0.12}}]);
                    f.submit(&j);
                }
            });
        }
    });
    println!("{BULK} jobs submitted in {:?}", started.elapsed());
    let marker = f.submit(&job("needle-in-the-haystack", 1, "sleep 600"));

    // What the broker counts, over every live job.
    let as_viewer = f.with_token(Some(&viewer));
    let mut counts = (0, 0);
    f.wait_until("the bulk queue's jobs all counted", LONG, || {
        let (status, v) = as_viewer.get("/v1/queues?head=3");
        assert_eq!(status, 200, "{v}");
        let q = v["ok"]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == "bulk")
            .cloned()
            .unwrap_or(Value::Null);
        let n = |k: &str| q[k].as_u64().unwrap_or(0);
        counts = (n("running") + n("offered"), n("pending"));
        counts.0 + counts.1 == BULK as u64 && n("offered") == 0 && counts.0 > 0
    });
    let (running_bulk, pending_bulk) = counts;
    // Newest first, from the API: the marker, then the last bulk jobs.
    let (_, page) = as_viewer.get("/v1/jobs?scope=live&newest_first=true&limit=2");
    assert_eq!(page["ok"]["jobs"][0]["job"], marker.as_str(), "{page}");

    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path().join("home");
    trust_ca(&home, &f.ca().expect("a CA"));
    let b = Browser::start(&home, &scratch.path().join("profile"));
    b.goto(&format!("{}/#token={viewer}", f.http()));
    let cells = |css: &str| -> Vec<String> {
        b.find_all(&format!("{css} td"))
            .iter()
            .map(|e| b.text(e))
            .collect()
    };
    let want = [
        "bulk".to_owned(),
        running_bulk.to_string(),
        pending_bulk.to_string(),
    ];
    b.wait("the bulk queue's counts", || {
        cells("tr[data-queue='bulk']").get(..3) == Some(&want[..])
    });
    let (_, v) = as_viewer.get("/v1/queues?head=0");
    let live: u64 = v["ok"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            ["running", "offered", "pending"]
                .iter()
                .map(|k| q[*k].as_u64().unwrap())
                .sum::<u64>()
        })
        .sum();
    assert!(live > BULK as u64, "{v}");
    b.wait("the count of every live job", || {
        b.first_text("#live-count") == format!("{live} live jobs")
    });
    // The map's flows come from the counts: one line from London per site the bulk runs at, as many jobs as run.
    let mut flowing = 0u64;
    b.wait("the flows from London", || {
        flowing = b
            .find_all("path.flow")
            .iter()
            .map(|e| b.attr(e, "data-jobs").parse::<u64>().unwrap_or(0))
            .sum();
        flowing == running_bulk
    });
    // No two site labels overlap, nor does a label cover another site's circle.
    let labels: Vec<(String, (f64, f64, f64, f64))> = b
        .find_all("text.site-label")
        .iter()
        .map(|e| (b.attr(e, "data-label"), b.rect(e)))
        .collect();
    assert_eq!(labels.len(), sites.len());
    let overlap = |a: (f64, f64, f64, f64), b: (f64, f64, f64, f64)| {
        a.0 < b.0 + b.2 && b.0 < a.0 + a.2 && a.1 < b.1 + b.3 && b.1 < a.1 + a.3
    };
    for (i, (na, ra)) in labels.iter().enumerate() {
        assert!(ra.2 > 0.0 && ra.3 > 0.0, "{na} has no box: {ra:?}");
        for (nb, rb) in &labels[i + 1..] {
            assert!(
                !overlap(*ra, *rb),
                "labels {na} {ra:?} and {nb} {rb:?} overlap"
            );
        }
    }
    // The table: a page of 50, newest first; the next page goes on where it ended; a search finds one job.
    let page_ids = |b: &Browser| -> Vec<String> {
        b.find_all("#jobs tr[data-job]")
            .iter()
            .map(|e| b.attr(e, "data-job"))
            .collect()
    };
    let mut first = Vec::new();
    b.wait("the first page, newest first", || {
        first = page_ids(&b);
        first.len() == 50 && first[0] == marker
    });
    assert!(first.windows(2).all(|w| w[0] > w[1]), "{first:?}");
    b.resize(1400, 2400);
    b.wait("the services' rows", || {
        !b.find_all("tr[data-service]").is_empty()
    });
    b.screenshot(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-10k.png"));
    b.click(&b.find_all("#older")[0]);
    let mut second = Vec::new();
    b.wait("the second page", || {
        second = page_ids(&b);
        second.len() == 50 && second[0] < first[49]
    });
    assert!(
        b.first_text("#page-no").starts_with("51"),
        "{}",
        b.first_text("#page-no")
    );
    b.click(&b.find_all("#newer")[0]);
    b.wait("the first page again", || {
        page_ids(&b).first() == Some(&marker)
    });
    b.type_text(&b.find_all("#filter-text")[0], "needle");
    b.wait("the search's one job", || page_ids(&b) == [marker.clone()]);

    // The services view.
    b.wait("the service's row", || {
        let row = b.first_text("tr[data-service='chat']");
        row.contains("acme") && row.contains("healthy")
    });

    // A site's page: pools, the carbon chart and its live jobs.
    let site = "dc-oregon";
    b.goto(&format!("{}/#/site/{site}", f.http()));
    b.wait("the site's page", || {
        b.find_all(&format!("#site-page[data-site='{site}']")).len() == 1
    });
    assert_eq!(b.find_all("tr[data-pool]").len(), 1);
    assert_eq!(b.find_all("#carbon-chart path.carbon-past").len(), 1);
    b.wait("the site's running jobs", || {
        !b.find_all("#site-page ~ section tr[data-job]").is_empty()
    });
    b.screenshot(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-site.png"));
    println!(
        "bulk: {running_bulk} running, {pending_bulk} pending; {flowing} jobs on the map's flows; screenshots in {}",
        env!("CARGO_TARGET_TMPDIR")
    );
}
