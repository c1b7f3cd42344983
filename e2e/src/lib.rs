//! Support for the black-box tests: a local federation of real processes (nats-server, `meridian broker`,
//! `meridian-agent`) and a small HTTP client for its API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::{LocalFederation, LocalOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use meridian_broker::local;

/// The workspace's `configs/` folder.
pub fn configs() -> PathBuf {
    local::workspace_root().join("configs")
}

/// A running federation and its API.
pub struct Fed {
    pub fed: LocalFederation,
    agent: ureq::Agent,
    /// A scratch folder for the test (witness files, generated configs).
    pub scratch: tempfile::TempDir,
}

/// A site file for generated federations.
pub struct SiteSpec<'a> {
    pub id: &'a str,
    pub tier: &'a str,
    pub lat: f64,
    pub lon: f64,
    pub model: &'a str,
    pub count: u32,
    pub price: f64,
    pub carbon: u32,
    /// An edge room (its agent joins through a leaf node on the cluster topology).
    pub edge: bool,
    /// How long its jobs outlive a stopped agent, ms (below the test federations' site-loss timeouts).
    pub readopt_ms: u64,
}

impl<'a> SiteSpec<'a> {
    /// `count` GPUs of `model` at `price` USD per hour, in Northern Virginia on a 300 gCO2e/kWh grid.
    pub fn new(id: &'a str, tier: &'a str, model: &'a str, count: u32, price: f64) -> Self {
        SiteSpec {
            id,
            tier,
            lat: 39.0,
            lon: -77.4,
            model,
            count,
            price,
            carbon: 300,
            edge: false,
            readopt_ms: 1_000,
        }
    }
}

pub fn site_toml(s: &SiteSpec<'_>) -> String {
    let kind = if s.tier == "cloud" {
        "cloud"
    } else if s.edge {
        "edge"
    } else {
        "datacenter"
    };
    format!(
        r#"id = "{}"
kind = "{kind}"
tier = "{}"
latitude = {}
longitude = {}
pue = 1.3
carbon_g_per_kwh = {}
egress_usd_per_gb = 0.09

[[pools]]
name = "gpu"
kind = "gpu"
vendor = "nvidia"
model = "{}"
memory_gib = 80
count = {}
power_watts = 400
shareable = true
price_usd_per_hour = {}

[agent]
readopt_ms = {}
"#,
        s.id, s.tier, s.lat, s.lon, s.carbon, s.model, s.count, s.price, s.readopt_ms
    )
}

impl Fed {
    /// Starts the federation described by `file`.
    pub fn start(file: &Path) -> Fed {
        Self::start_with(file, LocalOptions::default())
    }

    pub fn start_with(file: &Path, opts: LocalOptions) -> Fed {
        let fed = LocalFederation::start(file, opts).expect("federation starts");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // A fresh connection per call: the server may close one after refusing a body.
            .max_idle_connections(0)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let f = Fed {
            fed,
            agent,
            scratch: tempfile::tempdir().expect("tempdir"),
        };
        let n = f.fed.site_ids().len();
        f.wait_until("all sites up", Duration::from_secs(30), || {
            let (_, v) = f.get("/v1/sites");
            v["ok"]
                .as_array()
                .is_some_and(|s| s.iter().filter(|s| s["up"] == true).count() == n)
        });
        f
    }

    /// Writes a federation of generated sites into a scratch folder and starts it.
    pub fn generated(sites: &[SiteSpec<'_>], broker: &str) -> Fed {
        Self::generated_with(sites, broker, LocalOptions::default())
    }

    /// Like [`Fed::generated`], with options for the local federation.
    pub fn generated_with(sites: &[SiteSpec<'_>], broker: &str, opts: LocalOptions) -> Fed {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut names = Vec::new();
        for s in sites {
            let name = format!("{}.toml", s.id);
            std::fs::write(dir.path().join(&name), site_toml(s)).expect("write site");
            names.push(format!("{name:?}"));
        }
        let eu = configs().join("regions/eu.geojson");
        let fed = format!(
            "sites = [{}]\n[broker]\nregions = {{ eu = {:?} }}\n{broker}\n",
            names.join(", "),
            eu.display().to_string()
        );
        let path = dir.path().join("federation.toml");
        std::fs::write(&path, fed).expect("write federation");
        let mut f = Self::start_with(&path, opts);
        // Keep the generated files for as long as the federation runs.
        let scratch = std::mem::replace(&mut f.scratch, dir);
        drop(scratch);
        f
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.fed.http)
    }

    /// Reads a reply: its status and JSON body (or the text, when it is not JSON).
    fn read(
        reply: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
        what: &str,
    ) -> (u16, Value) {
        let mut r = reply.unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Like `get`, `post`: `None` when no broker answers (while one takes over, say).
    pub fn try_get(&self, path: &str) -> Option<(u16, Value)> {
        let r = self.agent.get(&self.url(path)).call().ok()?;
        Some(Self::read(Ok(r), "GET"))
    }

    pub fn try_post(&self, path: &str, body: &[u8]) -> Option<(u16, Value)> {
        let req = self
            .agent
            .post(&self.url(path))
            .header("content-type", "application/json");
        let r = req.send(body).ok()?;
        Some(Self::read(Ok(r), "POST"))
    }

    /// Every job, page by page through `GET /v1/jobs` (live ones, then archived ones).
    pub fn jobs(&self) -> Vec<Value> {
        self.try_jobs().expect("the job list answers")
    }

    /// [`Self::jobs`], or `None` if a page did not answer (a broker restarting).
    pub fn try_jobs(&self) -> Option<Vec<Value>> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(c) => format!("/v1/jobs?limit=1000&cursor={c}"),
                None => "/v1/jobs?limit=1000".to_owned(),
            };
            let (status, v) = self.try_get(&path)?;
            if status != 200 {
                return None;
            }
            out.extend(v["ok"]["jobs"].as_array()?.iter().cloned());
            match v["ok"]["next"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Some(out),
            }
        }
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        Self::read(self.agent.get(&self.url(path)).call(), "GET")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let req = self
            .agent
            .post(&self.url(path))
            .header("content-type", "application/json");
        Self::read(req.send(body), "POST")
    }

    pub fn delete(&self, path: &str) -> (u16, Value) {
        Self::read(self.agent.delete(&self.url(path)).call(), "DELETE")
    }

    /// Submits a job; returns its id.
    pub fn submit(&self, spec: &Value) -> String {
        let (status, v) = self.post("/v1/jobs", spec.to_string().as_bytes());
        assert!(
            status == 201 || status == 200,
            "submit failed: {status} {v}"
        );
        v["ok"]["job"].as_str().expect("job id").to_owned()
    }

    pub fn job(&self, id: &str) -> Value {
        let (status, v) = self.get(&format!("/v1/jobs/{id}"));
        assert_eq!(status, 200, "{v}");
        v["ok"].clone()
    }

    pub fn explain(&self, id: &str) -> Value {
        self.get(&format!("/v1/jobs/{id}/explain")).1["ok"].clone()
    }

    /// Waits until the job reaches `phase`; panics with its explanation otherwise.
    pub fn wait_phase(&self, id: &str, phase: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let j = self.job(id);
            if j["phase"] == phase {
                return j;
            }
            if Instant::now() > deadline {
                panic!(
                    "job {id} did not reach {phase} in {timeout:?}: {j}\nexplain: {}\nlogs in {}",
                    self.explain(id),
                    self.fed.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !check() {
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; logs in {}",
                    self.fed.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs the `meridian` binary against this federation's NATS server.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(local::sibling_binary("meridian").expect("meridian built"))
            .args(["--nats", &self.fed.nats_url()])
            .args(args)
            .output()
            .expect("run meridian")
    }
}

/// A job spec with the fields every test sets.
pub fn job(key: &str, gpus: u32, command: &str) -> Value {
    json!({
        "v": 1,
        "tenant": "e2e",
        "idempotency_key": key,
        "name": key,
        "kind": "batch",
        "duration_s": 3600,
        "resources": {"kind": "gpu", "count": gpus},
        "run": {"command": command}
    })
}

/// Whether a process with this pid exists.
pub fn process_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}
