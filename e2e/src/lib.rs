//! Support for the black-box tests: a local federation of real processes (nats-server, `meridian broker`,
//! `meridian-agent`) and a small HTTP client for its API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::{LocalFederation, LocalOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use meridian_broker::local;

pub mod ec2;
pub mod slurm;

/// The workspace's `configs/` folder.
pub fn configs() -> PathBuf {
    local::workspace_root().join("configs")
}

/// A running federation and its API. Every test reaches it through here: the HTTPS address, the CA, the
/// operator's NATS identity and the administrator's token (a change of access touches this one place).
pub struct Fed {
    pub fed: LocalFederation,
    agent: ureq::Agent,
    /// The token calls carry (the administrator's, unless a test chose another).
    pub token: Option<String>,
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
    /// Its agent also serves `/metrics` on a loopback port of its own (see [`Fed::agent_metrics_addr`]).
    pub metrics_listen: bool,
    /// Its pool also sells spot capacity at this price (USD per hour); its agent reads the provider's reclaim
    /// notice from `spot-notice` in its work folder (see [`Fed::reclaim_spot`]).
    pub spot_price: Option<f64>,
    /// Its agent follows a grid feed, `carbon.json` in its work folder (see [`Fed::set_grid`]).
    pub grid_feed: bool,
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
            metrics_listen: false,
            spot_price: None,
            grid_feed: false,
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
{}
[agent]
readopt_ms = {}
metrics_ms = 1000
{}"#,
        s.id,
        s.tier,
        s.lat,
        s.lon,
        s.carbon,
        s.model,
        s.count,
        s.price,
        s.spot_price.map_or(String::new(), |p| format!(
            "spot_price_usd_per_hour = {p}\n"
        )),
        s.readopt_ms,
        [
            s.metrics_listen
                .then_some("metrics_listen = \"127.0.0.1:0\"\n"),
            s.spot_price.map(|_| "spot_notice = \"spot-notice\"\n"),
            s.grid_feed.then_some("carbon_file = \"carbon.json\"\n"),
        ]
        .into_iter()
        .flatten()
        .collect::<String>()
    )
}

impl Fed {
    /// Starts the federation described by `file`.
    pub fn start(file: &Path) -> Fed {
        Self::start_with(file, LocalOptions::default())
    }

    pub fn start_with(file: &Path, opts: LocalOptions) -> Fed {
        let fed = LocalFederation::start(file, opts).expect("federation starts");
        let agent = http_agent(
            fed.security
                .as_ref()
                .map(|s| s.creds.join("ca.crt"))
                .as_deref(),
        );
        let token = fed.token().map(str::to_owned);
        let f = Fed {
            fed,
            agent,
            token,
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

    /// The address of a site's agent's own `/metrics` (an agent started with `metrics_listen`), once it listens.
    /// The provider takes back `site`'s spot capacity: the reclaim notice its agent watches appears (the agent
    /// stops its spot attempts and reports them interrupted; nothing goes to the broker but that).
    /// Writes the site's grid feed (whole, by a rename, as a feed should be replaced).
    pub fn set_grid(&self, site: &str, text: &str) {
        let dir = self.fed.dir.join("agents").join(site);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let tmp = dir.join("carbon.json.new");
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
        std::fs::rename(&tmp, dir.join("carbon.json")).expect("the feed replaced");
    }

    pub fn reclaim_spot(&self, site: &str) {
        let file = self.fed.dir.join("agents").join(site).join("spot-notice");
        std::fs::write(&file, "").unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    }

    pub fn agent_metrics_addr(&self, site: &str) -> String {
        let file = self.fed.dir.join("agents").join(site).join("metrics.addr");
        let mut addr = String::new();
        self.wait_until(
            "the agent's metrics address",
            Duration::from_secs(30),
            || {
                addr = std::fs::read_to_string(&file).unwrap_or_default();
                !addr.is_empty()
            },
        );
        addr.trim().to_owned()
    }

    /// The federation's CA certificate (`None` when insecure).
    pub fn ca(&self) -> Option<PathBuf> {
        self.fed.security.as_ref().map(|s| s.creds.join("ca.crt"))
    }

    /// The same federation's API with another token (`None`: no token at all).
    pub fn with_token(&self, token: Option<&str>) -> Api<'_> {
        Api {
            fed: self,
            token: token.map(str::to_owned),
        }
    }

    /// A NATS connection as the operator (TLS, its NKey).
    pub async fn nats(&self) -> async_nats::Client {
        self.fed
            .access()
            .connect("e2e", Duration::from_secs(10))
            .await
            .expect("NATS connects")
    }

    /// A NATS connection as another identity of the federation.
    pub async fn nats_as(&self, identity: &str) -> async_nats::Client {
        self.fed
            .access_as(identity)
            .connect("e2e", Duration::from_secs(10))
            .await
            .expect("NATS connects")
    }

    /// Creates an API token through the API (as the administrator); returns the token.
    pub fn create_token(&self, tenant: Option<&str>, roles: &[&str]) -> String {
        let body = json!({"v": 1, "tenant": tenant, "roles": roles, "name": "e2e"});
        let (status, v) = self.post("/v1/admin/tokens", body.to_string().as_bytes());
        assert_eq!(status, 201, "token create: {v}");
        v["ok"]["token"].as_str().expect("a token").to_owned()
    }

    /// The project's API client as the operator, with the administrator's token.
    pub async fn client(&self) -> meridian_broker::client::Client {
        meridian_broker::client::Client::connect(&self.fed.access(), self.token.clone())
            .await
            .expect("client connects")
    }

    fn authorized<B>(
        &self,
        req: ureq::RequestBuilder<B>,
        token: Option<&str>,
    ) -> ureq::RequestBuilder<B> {
        match token {
            Some(t) => req.header("authorization", &format!("Bearer {t}")),
            None => req,
        }
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

    /// A request with exactly these headers (no token unless one is among them): its status, body as text, and
    /// the reply's headers (names in lower case; repeated ones joined by newlines).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String, std::collections::BTreeMap<String, String>) {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(()).expect("a request");
        let mut r = self
            .agent
            .run(req)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let mut out: std::collections::BTreeMap<String, String> = Default::default();
        for (k, v) in r.headers() {
            let e = out.entry(k.as_str().to_owned()).or_default();
            if !e.is_empty() {
                e.push('\n');
            }
            e.push_str(v.to_str().unwrap_or(""));
        }
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().expect("body");
        (status, text, out)
    }

    /// The federation's HTTP address (`https://127.0.0.1:PORT`).
    pub fn http(&self) -> &str {
        &self.fed.http
    }

    /// Like `get`, `post`: `None` when no broker answers (while one takes over, say).
    pub fn try_get(&self, path: &str) -> Option<(u16, Value)> {
        let req = self.authorized(self.agent.get(&self.url(path)), self.token.as_deref());
        let r = req.call().ok()?;
        Some(Self::read(Ok(r), "GET"))
    }

    pub fn try_post(&self, path: &str, body: &[u8]) -> Option<(u16, Value)> {
        let req = self
            .agent
            .post(&self.url(path))
            .header("content-type", "application/json");
        let r = self
            .authorized(req, self.token.as_deref())
            .send(body)
            .ok()?;
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
        self.with_token(self.token.as_deref()).get(path)
    }

    pub fn post(&self, path: &str, body: &[u8]) -> (u16, Value) {
        self.with_token(self.token.as_deref()).post(path, body)
    }

    pub fn put(&self, path: &str, body: &[u8]) -> (u16, Value) {
        self.with_token(self.token.as_deref()).put(path, body)
    }

    pub fn delete(&self, path: &str) -> (u16, Value) {
        self.with_token(self.token.as_deref()).delete(path)
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
                    "job {id} did not reach {phase} in {timeout:?}: {j}\nexplain: {}\nlogs in {}\n{}",
                    self.explain(id),
                    self.fed.dir.display(),
                    self.fed.log_tails(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
        self.wait_for(what, timeout, || {
            if check() {
                Ok(())
            } else {
                Err(String::new())
            }
        });
    }

    /// Waits until `check` says `Ok`; on timeout the panic gives what it last said and the logs' tails.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<(), String>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match check() {
                Ok(()) => return,
                Err(last) => last,
            };
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}{}; logs in {}\n{}",
                    if last.is_empty() {
                        String::new()
                    } else {
                        format!(" (last seen: {last})")
                    },
                    self.fed.dir.display(),
                    self.fed.log_tails(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs the `meridian` binary against this federation, as its operator would from another shell (the
    /// lines `meridian up` prints: NATS, CA, credential, token).
    /// A third-party Python client (`e2e/py/SCRIPT`, nats-py) given the federation's access the way `meridian up`
    /// prints it (environment variables), with the administrator's token unless the caller sets another.
    pub fn python(&self, python: &Path, script: &str) -> std::process::Command {
        self.python_as(python, script, self.fed.access(), self.token.clone())
    }

    /// [`Fed::python`] under another NATS identity (a site's, another client's) and token.
    pub fn python_as(
        &self,
        python: &Path,
        script: &str,
        access: meridian_runtime::access::Access,
        token: Option<String>,
    ) -> std::process::Command {
        let mut cmd = std::process::Command::new(python);
        cmd.arg(local::workspace_root().join("e2e/py").join(script))
            .env("MERIDIAN_NATS", &access.nats);
        for (var, value) in [
            (
                "MERIDIAN_CA",
                access.ca.as_ref().map(|p| p.display().to_string()),
            ),
            (
                "MERIDIAN_CREDS",
                access.creds.as_ref().map(|p| p.display().to_string()),
            ),
            ("MERIDIAN_TOKEN", token),
        ] {
            match value {
                Some(v) => cmd.env(var, v),
                None => cmd.env_remove(var),
            };
        }
        cmd
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cli_command(args).output().expect("run meridian")
    }

    /// The `meridian` command with this federation's access in its environment, not yet run.
    pub fn cli_command(&self, args: &[&str]) -> std::process::Command {
        let access = self.fed.access();
        let mut cmd =
            std::process::Command::new(local::sibling_binary("meridian").expect("meridian built"));
        cmd.env("MERIDIAN_NATS", &access.nats)
            .env_remove("MERIDIAN_CA")
            .env_remove("MERIDIAN_CREDS")
            .env_remove("MERIDIAN_TOKEN");
        if let Some(ca) = &access.ca {
            cmd.env("MERIDIAN_CA", ca);
        }
        if let Some(creds) = &access.creds {
            cmd.env("MERIDIAN_CREDS", creds);
        }
        if let Some(t) = &self.token {
            cmd.env("MERIDIAN_TOKEN", t);
        }
        cmd.args(args);
        cmd
    }
}

/// Runs a third-party script to its end, which must succeed, and reads the one JSON line it prints.
pub fn json_output(mut cmd: std::process::Command) -> Value {
    let out = cmd.output().expect("the script runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints one JSON line")
}

/// An HTTP client that trusts the federation's CA (or plain HTTP when there is none).
fn http_agent(ca: Option<&Path>) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        // A fresh connection per call: the server may close one after refusing a body.
        .max_idle_connections(0)
        .timeout_global(Some(Duration::from_secs(10)));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).expect("read the CA");
        let cert = ureq::tls::Certificate::from_pem(&pem).expect("a PEM certificate");
        config = config.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(vec![
                    cert,
                ])))
                .build(),
        );
    }
    config.build().into()
}

/// The API as seen with one token (or none).
pub struct Api<'a> {
    fed: &'a Fed,
    token: Option<String>,
}

impl Api<'_> {
    pub fn get(&self, path: &str) -> (u16, Value) {
        let req = self.fed.authorized(
            self.fed.agent.get(&self.fed.url(path)),
            self.token.as_deref(),
        );
        Fed::read(req.call(), "GET")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let req = self
            .fed
            .agent
            .post(&self.fed.url(path))
            .header("content-type", "application/json");
        Fed::read(
            self.fed.authorized(req, self.token.as_deref()).send(body),
            "POST",
        )
    }

    /// `post`, with the reply's headers (names in lower case).
    pub fn post_with_headers(
        &self,
        path: &str,
        body: &[u8],
    ) -> (u16, Value, std::collections::BTreeMap<String, String>) {
        let req = self
            .fed
            .agent
            .post(&self.fed.url(path))
            .header("content-type", "application/json");
        let mut r = self
            .fed
            .authorized(req, self.token.as_deref())
            .send(body)
            .expect("POST");
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }

    pub fn put(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let req = self
            .fed
            .agent
            .put(&self.fed.url(path))
            .header("content-type", "application/json");
        Fed::read(
            self.fed.authorized(req, self.token.as_deref()).send(body),
            "PUT",
        )
    }

    pub fn delete(&self, path: &str) -> (u16, Value) {
        let req = self.fed.authorized(
            self.fed.agent.delete(&self.fed.url(path)),
            self.token.as_deref(),
        );
        Fed::read(req.call(), "DELETE")
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
