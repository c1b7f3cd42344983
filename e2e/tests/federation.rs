//! End to end: real nats-server, real `meridian broker` and `meridian-agent` processes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;
use serde_json::json;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(40);

fn demo() -> Fed {
    Fed::start(&configs().join("federation-demo.toml"))
}

fn site_of(f: &Fed, id: &str) -> String {
    f.job(id)["site"].as_str().unwrap_or("-").to_owned()
}

/// (a) inference near Frankfurt users goes to the Frankfurt edge; (b) EU residency never leaves the EU polygon
/// even when a US site is cheaper; (d) a big dataset pulls the job to the site that holds it.
#[test]
fn placement_on_the_demo_federation() {
    let f = demo();
    // (a)
    let mut inf = job("a-inference", 0, "while true; do sleep 1; done");
    inf["kind"] = json!("inference");
    inf["resources"] = json!({"kind": "gpu", "milli": 500});
    inf["users"] = json!([
        {"name": "Frankfurt", "location": {"lat": 50.1167, "lon": 8.6833}, "weight": 3},
        {"name": "Mainz", "location": {"lat": 49.99, "lon": 8.25}, "weight": 1}
    ]);
    let a = f.submit(&inf);
    f.wait_phase(&a, "running", LONG);
    assert_eq!(site_of(&f, &a), "edge-frankfurt", "{}", f.explain(&a));

    // (b) A100 in the EU exists only in the cloud; dc-virginia's A100s are cheaper but in the US.
    let mut eu = job("b-eu", 1, "true");
    eu["policy"] = json!("cost");
    eu["resources"]["models"] = json!(["A100"]);
    eu["constraints"] = json!({"residency": "eu"});
    let b = f.submit(&eu);
    f.wait_phase(&b, "succeeded", LONG);
    assert_eq!(site_of(&f, &b), "cloud-westeurope", "{}", f.explain(&b));
    let explained = f.explain(&b);
    let virginia = explained["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["site"] == "dc-virginia")
        .unwrap_or_else(|| panic!("dc-virginia is not among the candidates: {explained}"))
        .clone();
    assert!(
        virginia["rejected"]
            .as_str()
            .unwrap()
            .contains("outside residency region eu"),
        "{virginia}"
    );

    // (d) Balanced picks Oregon for a plain job, Virginia when the job reads the 90 TB crawl held there.
    let mut plain = job("d-plain", 1, "true");
    plain["policy"] = json!("balanced");
    plain["resources"]["models"] = json!(["A100", "H100"]);
    let p = f.submit(&plain);
    let mut data = plain.clone();
    data["idempotency_key"] = json!("d-data");
    data["datasets"] = json!([{"name": "common-crawl-2024", "size_bytes": 90_000_000_000_000u64}]);
    let d = f.submit(&data);
    f.wait_phase(&p, "succeeded", LONG);
    f.wait_phase(&d, "succeeded", LONG);
    assert_eq!(site_of(&f, &p), "dc-oregon", "{}", f.explain(&p));
    assert_eq!(site_of(&f, &d), "dc-virginia", "{}", f.explain(&d));
    // The explanation says in words that where the data is decided it.
    let decided = f.explain(&d)["decided_by"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        decided.starts_with("data locality: ") && decided.contains("less data to move"),
        "{decided}"
    );
    println!("{d} decided by {decided}");
    let decided = f.explain(&p)["decided_by"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        !decided.is_empty() && !decided.starts_with("data locality"),
        "{decided}"
    );
    println!("{p} decided by {decided}");

    // explain --all: every site of the federation weighed, none left out by the index unscored.
    let (status, all) = f.get(&format!("/v1/jobs/{d}/explain?all=true"));
    assert_eq!(status, 200, "{all}");
    let all = &all["ok"];
    assert_eq!(all["every_site_now"], true, "{all}");
    assert_eq!(all["pruned"].as_array().map_or(0, Vec::len), 0, "{all}");
    // The distinct sites a list of objects names.
    let sites_in = |list: &serde_json::Value| {
        let mut s: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["site"].as_str().unwrap().to_owned())
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let (_, sites) = f.get("/v1/sites");
    assert_eq!(
        sites_in(&all["candidates"]),
        sites_in(&sites["ok"]),
        "{all}"
    );
    let (status, _) = f.get(&format!("/v1/jobs/{d}/explain?everything=1"));
    assert_eq!(status, 400, "an unknown parameter is refused");
    // The CLI's table says the choice moved no data where the other sites would move the 90 TB.
    let text = f.cli(&["explain", "--all", &d]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("DATA GB"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("dc-oregon") && l.contains("90000.0")),
        "{text}"
    );
}

/// (c) A flexible training job lands on the lowest-kgCO2e site under `green` and the cheapest under `cost`.
#[test]
fn green_and_cost_policies_choose_their_own_best() {
    let f = Fed::generated(
        &[
            SiteSpec {
                carbon: 600,
                ..SiteSpec::new("cheap-coal", "owned", "A100", 4, 1.5)
            },
            SiteSpec {
                lat: 41.8,
                lon: -87.6,
                ..SiteSpec::new("mid", "owned", "A100", 4, 2.5)
            },
            SiteSpec {
                lat: 45.8,
                lon: -119.7,
                carbon: 40,
                ..SiteSpec::new("dear-hydro", "owned", "A100", 4, 3.5)
            },
        ],
        "",
    );
    let mut train = job("c-green", 2, "true");
    train["kind"] = json!("training");
    train["policy"] = json!("green");
    let green = f.submit(&train);
    train["idempotency_key"] = json!("c-cost");
    train["policy"] = json!("cost");
    let cost = f.submit(&train);
    f.wait_phase(&green, "succeeded", LONG);
    f.wait_phase(&cost, "succeeded", LONG);
    assert_eq!(site_of(&f, &green), "dear-hydro", "{}", f.explain(&green));
    assert_eq!(site_of(&f, &cost), "cheap-coal", "{}", f.explain(&cost));
}

/// (e) With the owned site full, a job waits `max_wait`, then bursts to the cloud site, never earlier.
#[test]
fn burst_to_cloud_only_after_max_wait() {
    let f = Fed::generated(
        &[
            SiteSpec::new("owned", "owned", "A100", 1, 1.0),
            SiteSpec::new("cloud", "cloud", "A100", 4, 4.0),
        ],
        "",
    );
    let filler = f.submit(&job("filler", 1, "sleep 30"));
    f.wait_phase(&filler, "running", LONG);
    assert_eq!(site_of(&f, &filler), "owned");
    let mut burst = job("burst", 1, "true");
    burst["max_wait_s"] = json!(4);
    let submitted = Instant::now();
    let b = f.submit(&burst);
    std::thread::sleep(Duration::from_millis(1500));
    let pending = f.job(&b);
    assert_eq!(pending["phase"], "pending", "{pending}");
    assert!(
        pending["why"]
            .as_str()
            .unwrap()
            .contains("cloud burst allowed in"),
        "{pending}"
    );
    f.wait_until("the burst job to leave pending", LONG, || {
        f.job(&b)["phase"] != "pending"
    });
    let waited = submitted.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "burst after {waited:?}, before max_wait"
    );
    f.wait_phase(&b, "succeeded", LONG);
    assert_eq!(site_of(&f, &b), "cloud");
    // Cancel over HTTP stops the filler that held the owned site.
    let (status, v) = f.delete(&format!("/v1/jobs/{filler}"));
    assert_eq!(status, 200, "{v}");
    f.wait_phase(&filler, "cancelled", LONG);
}

/// (f) kill -9 of an agent: its running job is requeued and finishes elsewhere, resuming from the checkpoint it
/// reported, and the job's process on the dead agent's side stops (the witness file shows attempt 1 never
/// finished).
#[test]
fn a_killed_agent_loses_no_job_and_leaves_no_process() {
    let mut f = Fed::generated(
        &[
            SiteSpec::new("first", "owned", "A100", 2, 1.0),
            SiteSpec {
                lat: 45.8,
                lon: -119.7,
                ..SiteSpec::new("second", "owned", "A100", 2, 2.0)
            },
        ],
        "site_lost_after_ms = 2000",
    );
    let witness = f.scratch.path().join("witness");
    let cmd = format!(
        "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT start $MERIDIAN_SITE_ID from ${{MERIDIAN_RESUME_FROM:-scratch}}\" >> {w}; \
         echo \"s3://ckpt/$MERIDIAN_JOB_ID/step-$MERIDIAN_ATTEMPT\" > \"$MERIDIAN_CHECKPOINT_FILE\"; sleep 6; \
         echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT end $MERIDIAN_SITE_ID\" >> {w}",
        w = witness.display()
    );
    let mut spec = job("survivor", 1, &cmd);
    spec["policy"] = json!("cost");
    let id = f.submit(&spec);
    f.wait_phase(&id, "running", LONG);
    assert_eq!(site_of(&f, &id), "first");
    f.wait_until("attempt 1 to start", LONG, || {
        std::fs::read_to_string(&witness).is_ok_and(|w| w.contains("start first"))
    });
    // The agent reports the checkpoint the job wrote, so the broker can resume it elsewhere.
    f.wait_until("the checkpoint to be reported", LONG, || {
        f.job(&id)["checkpoint"] == format!("s3://ckpt/{id}/step-1")
    });
    f.fed.kill_agent("first");
    let done = f.wait_phase(&id, "succeeded", Duration::from_secs(60));
    assert_eq!(done["site"], "second", "{done}");
    assert!(done["attempt"].as_u64().unwrap() >= 2, "{done}");
    // Long enough for attempt 1 to have finished had it survived.
    std::thread::sleep(Duration::from_secs(2));
    let w = std::fs::read_to_string(&witness).unwrap();
    assert!(
        w.contains(&format!("{id} 1 start first from scratch")),
        "{w}"
    );
    assert!(
        w.lines()
            .any(|l| l.contains("start second from s3://ckpt/") && l.ends_with("/step-1")),
        "the requeued attempt did not resume from the checkpoint:\n{w}"
    );
    assert!(
        !w.contains(&format!("{id} 1 end")),
        "attempt 1 kept running after its agent died:\n{w}"
    );
    assert!(w.lines().any(|l| l.ends_with("end second")), "{w}");
}

/// (g) Malformed and invalid jobs get clear errors naming the problem; the broker stays up and a valid job
/// sent right after succeeds.
#[test]
fn bad_input_gets_clear_errors_and_loses_nothing() {
    let f = Fed::generated(
        &[SiteSpec {
            lat: 50.1,
            lon: 8.7,
            ..SiteSpec::new("only", "owned", "A100", 2, 1.0)
        }],
        "",
    );
    let (status, v) = f.post("/v1/jobs", b"{\"v\": 1, \"tenant\": ");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "malformed", "{v}");

    let mut neg = job("neg", 1, "true");
    neg["resources"]["count"] = json!(-1);
    let (status, v) = f.post("/v1/jobs", neg.to_string().as_bytes());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "resources.count", "{v}");

    let mut tpu = job("tpu", 1, "true");
    tpu["resources"]["kind"] = json!("tpu");
    let (status, v) = f.post("/v1/jobs", tpu.to_string().as_bytes());
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown variant `tpu`"),
        "{v}"
    );

    let mut lat = job("lat", 1, "true");
    lat["users"] = json!([{"location": {"lat": 200.0, "lon": 8.0}}]);
    let (status, v) = f.post("/v1/jobs", lat.to_string().as_bytes());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "users[0].location.lat", "{v}");

    let mut mars = job("mars", 1, "true");
    mars["constraints"] = json!({"residency": "mars"});
    let (status, v) = f.post("/v1/jobs", mars.to_string().as_bytes());
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("known regions: eu"),
        "{v}"
    );

    // Just over the limit: the server stops reading at the limit and answers; the few bytes past it are already
    // in the socket's buffers, so the client reads the answer rather than a broken pipe.
    let big = vec![b'x'; meridian_federation::MAX_MESSAGE_BYTES + 4096];
    let (status, _) = f.post("/v1/jobs", &big);
    assert_eq!(status, 413);

    let (status, v) = f.get("/v1/jobs/not.an.id");
    assert_eq!(status, 400, "{v}");
    let (status, _) = f.get("/v1/jobs/j-999999");
    assert_eq!(status, 404);

    // The same through the NATS API, with the CLI.
    let bad = f.scratch.path().join("bad.json");
    std::fs::write(&bad, neg.to_string()).unwrap();
    let out = f.cli(&["submit", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resources.count"), "{err}");
    // A TOML file's error names the file's own line and key, not a place in the JSON it was sent as.
    let bad = f.scratch.path().join("bad.toml");
    std::fs::write(
        &bad,
        "tenant = \"e2e\"\nidempotency_key = \"neg\"\nkind = \"batch\"\n\n[resources]\nkind = \"gpu\"\ncount = -1\n\n[run]\ncommand = \"true\"\n",
    )
    .unwrap();
    let out = f.cli(&["submit", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:7: resources.count: ", bad.display())),
        "{err}"
    );
    assert!(!err.contains("column"), "{err}");

    let ok = f.submit(&job("fine", 1, "true"));
    f.wait_phase(&ok, "succeeded", LONG);
    let jobs = f.jobs();
    assert_eq!(jobs.len(), 1, "refused jobs must not be recorded: {jobs:?}");

    // A job no site can run is accepted, and the CLI says so at once rather than a plain "submitted".
    let mut nowhere = job("nowhere", 1, "true");
    nowhere["resources"]["models"] = json!(["B300"]);
    let file = f.scratch.path().join("nowhere.json");
    std::fs::write(&file, nowhere.to_string()).unwrap();
    let out = f.cli(&["submit", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("accepted, but no site can run it now:") && said.contains("B300"),
        "{said}"
    );
    let again = f.cli(&["submit", file.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("accepted, but no site can run it now:"),
        "a repeat (same idempotency key) says the same: {again:?}"
    );
}

/// (h) A job's command really runs with its environment, and its status carries the exit code.
#[test]
fn a_job_runs_for_real_and_reports_its_exit_code() {
    let f = Fed::generated(
        &[SiteSpec {
            lat: 50.1,
            lon: 8.7,
            ..SiteSpec::new("solo", "owned", "A100", 4, 1.0)
        }],
        "",
    );
    let out = f.scratch.path().join("out.txt");
    let cmd = format!(
        "echo \"$MERIDIAN_JOB_ID $MERIDIAN_SITE_ID $CUDA_VISIBLE_DEVICES\" > {}; echo to-the-log",
        out.display()
    );
    let id = f.submit(&job("writer", 2, &cmd));
    let done = f.wait_phase(&id, "succeeded", LONG);
    assert_eq!(done["exit_code"], 0);
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(written.trim(), format!("{id} solo 0,1"));
    let logs = f.cli(&["logs", &id]);
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("to-the-log"),
        "{logs:?}"
    );

    // The accelerator catalogue names the site's pool with its price.
    let gpus = f.cli(&["gpus", "--model", "a100"]);
    let gpus = String::from_utf8_lossy(&gpus.stdout).to_string();
    assert!(
        gpus.lines()
            .any(|l| l.starts_with("A100") && l.contains("solo") && l.contains("1.00")),
        "{gpus}"
    );
    // A one-line job with no spec file: the command after `--`, quoted for the shell as it was typed.
    let submitted = f.cli(&[
        "submit",
        "--tenant",
        "e2e",
        "--gpus",
        "A100:1",
        "--name",
        "failing",
        "--",
        "sh",
        "-c",
        "echo 'it is done'; exit 3",
    ]);
    let said = String::from_utf8_lossy(&submitted.stdout).to_string();
    assert!(submitted.status.success(), "{submitted:?}");
    assert!(said.trim_end().ends_with(" submitted"), "{said}");
    let failing = said.split_whitespace().next().unwrap().to_owned();
    let failed = f.wait_phase(&failing, "failed", LONG);
    assert_eq!(failed["exit_code"], 3, "{failed}");
    let logs = f.cli(&["logs", &failing]);
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("it is done"),
        "{logs:?}"
    );
    // `logs -f` follows a job from its start to its end: every line once, in order.
    let counting = f.cli(&[
        "submit",
        "--tenant",
        "e2e",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4; do echo line-$i; sleep 1; done",
    ]);
    let counting = String::from_utf8_lossy(&counting.stdout).to_string();
    let counting = counting.split_whitespace().next().unwrap().to_owned();
    let followed = f.cli(&["logs", "-f", &counting]);
    let followed = String::from_utf8_lossy(&followed.stdout).to_string();
    let lines: Vec<&str> = followed
        .lines()
        .filter(|l| l.starts_with("line-"))
        .collect();
    assert_eq!(
        lines,
        ["line-1", "line-2", "line-3", "line-4"],
        "{followed}"
    );
    assert_eq!(f.job(&counting)["phase"], "succeeded");
    // `show`: one job, a field a line, times in UTC.
    let shown = f.cli(&["show", &failing]);
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    for line in ["state      failed", "exit code  3", "site       solo pool "] {
        assert!(shown.contains(line), "{line:?} in\n{shown}");
    }
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("finished   20") && l.ends_with('Z')),
        "{shown}"
    );
    // A model no site has: accepted, and said at once that no site can run it.
    let nowhere = f.cli(&[
        "submit", "--tenant", "e2e", "--gpus", "H100:1", "--", "true",
    ]);
    let nowhere = String::from_utf8_lossy(&nowhere.stdout).to_string();
    assert!(
        nowhere.contains("accepted, but no site can run it now"),
        "{nowhere}"
    );
    // `jobs --since`: a window of submission times.
    let listed = |since: &str| {
        let out = f.cli(&["--output", "json", "jobs", "--since", since]);
        let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        jobs.as_array()
            .unwrap()
            .iter()
            .map(|j| j["job"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert!(listed("1h").contains(&failing));
    assert!(listed("2999-01-01").is_empty());
    // `jobs --watch`: the listing again and again until stopped (a JSON array a line).
    let mut watch = f
        .cli_command(&["--output", "json", "jobs", "--watch", "--since", "1h"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    for _ in 0..2 {
        let line = rx.recv_timeout(Duration::from_secs(10)).expect("a listing");
        let jobs: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert!(jobs
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["job"] == failing.as_str()));
    }
    watch.kill().unwrap();
    watch.wait().unwrap();
}

/// (i) nats-server restarts mid-run: agents and broker reconnect and the run completes.
#[test]
fn the_run_survives_a_nats_restart() {
    let mut f = Fed::generated(
        &[SiteSpec {
            lat: 50.1,
            lon: 8.7,
            ..SiteSpec::new("steady", "owned", "A100", 2, 1.0)
        }],
        "site_lost_after_ms = 15000",
    );
    let id = f.submit(&job("through", 1, "sleep 4"));
    f.wait_phase(&id, "running", LONG);
    f.fed.nats.nodes[0].restart().expect("nats restarts");
    f.wait_phase(&id, "succeeded", Duration::from_secs(60));
    let after = f.submit(&job("after", 1, "true"));
    f.wait_phase(&after, "succeeded", LONG);
}

/// (j) Cancel stops a running job's whole process group; an idempotent resubmission creates no second job; a
/// drained site gets no new work.
#[test]
fn cancel_idempotency_and_drain() {
    let f = Fed::generated(
        &[
            SiteSpec::new("cheap", "owned", "A100", 2, 1.0),
            SiteSpec::new("dear", "owned", "A100", 2, 3.0),
        ],
        "",
    );
    let pidfile = f.scratch.path().join("child.pid");
    let cmd = format!("sleep 120 & echo $! > {}; wait", pidfile.display());
    let mut spec = job("long", 1, &cmd);
    spec["policy"] = json!("cost");
    let id = f.submit(&spec);
    f.wait_phase(&id, "running", LONG);
    f.wait_until("the child pid", LONG, || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| !s.trim().is_empty())
    });
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_alive(child));

    // Same key, same spec: the first job comes back.
    let (status, again) = f.post("/v1/jobs", spec.to_string().as_bytes());
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["ok"]["job"], id.as_str());
    assert_eq!(again["ok"]["created"], false);

    let out = f.cli(&["cancel", &id]);
    assert!(out.status.success(), "{out:?}");
    f.wait_phase(&id, "cancelled", LONG);
    f.wait_until(
        "the job's child process to die",
        Duration::from_secs(10),
        || !process_alive(child),
    );

    let (status, _) = f.post("/v1/sites/cheap/drain", b"{\"drain\": true}");
    assert_eq!(status, 200);
    let mut next = job("after-drain", 1, "true");
    next["policy"] = json!("cost");
    let n = f.submit(&next);
    f.wait_phase(&n, "succeeded", LONG);
    assert_eq!(site_of(&f, &n), "dear", "{}", f.explain(&n));
    assert_eq!(f.jobs().len(), 2);
}

/// Scale-in of a service stops its cloud replicas first, over the CLI and NATS, while owned ones keep running.
#[test]
fn scale_in_stops_cloud_replicas_first() {
    let f = Fed::generated(
        &[
            SiteSpec::new("owned", "owned", "A100", 2, 1.0),
            SiteSpec::new("cloud", "cloud", "A100", 4, 4.0),
        ],
        "",
    );
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut spec = job(&format!("replica-{i}"), 1, "while true; do sleep 1; done");
        spec["kind"] = json!("inference");
        spec["service"] = json!("chat");
        let id = f.submit(&spec);
        f.wait_phase(&id, "running", LONG);
        ids.push(id);
    }
    let sites: Vec<String> = ids.iter().map(|id| site_of(&f, id)).collect();
    assert_eq!(sites, ["owned", "owned", "cloud"]);
    let out = f.cli(&[
        "--output", "json", "scale-in", "chat", "1", "--tenant", "e2e",
    ]);
    assert!(out.status.success(), "{out:?}");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["stopping"], json!([ids[2]]));
    f.wait_phase(&ids[2], "cancelled", LONG);
    for id in &ids[..2] {
        assert_eq!(f.job(id)["phase"], "running");
    }
}

/// kill -9 of the broker: after a restart it replays its journal from JetStream, and every job is where it
/// was — finished jobs finished, the running one still tracked (and not run again), the waiting one still
/// waiting — and the run completes.
#[test]
fn a_restarted_broker_loses_nothing() {
    let mut f = Fed::generated(&[SiteSpec::new("only", "owned", "A100", 2, 1.0)], "");
    let witness = f.scratch.path().join("witness");
    let run = |name: &str, gpus: u32, seconds: u32| {
        let cmd = format!(
            "echo \"$MERIDIAN_JOB_ID $MERIDIAN_ATTEMPT\" >> {}; sleep {seconds}",
            witness.display()
        );
        job(name, gpus, &cmd)
    };
    let done = f.submit(&run("done", 1, 0));
    f.wait_phase(&done, "succeeded", LONG);
    let running = f.submit(&run("running", 1, 6));
    f.wait_phase(&running, "running", LONG);
    let waiting = f.submit(&run("waiting", 2, 0));
    assert_eq!(f.job(&waiting)["phase"], "pending");

    f.fed.restart_broker().expect("broker restarts");
    assert_eq!(f.job(&done)["phase"], "succeeded");
    assert_eq!(f.job(&running)["phase"], "running");
    assert_eq!(f.job(&running)["attempt"], 1);
    assert_eq!(f.job(&waiting)["phase"], "pending");

    f.wait_phase(&running, "succeeded", LONG);
    f.wait_phase(&waiting, "succeeded", LONG);
    let w = std::fs::read_to_string(&witness).unwrap();
    assert_eq!(
        w.lines()
            .filter(|l| l.starts_with(&format!("{running} ")))
            .count(),
        1,
        "ran twice:\n{w}"
    );
    assert_eq!(f.job(&running)["attempt"], 1);
    let log = f.fed.broker_logs();
    assert!(log.contains("recovered 3 jobs"), "{log}");
}

/// A job that finishes while NATS is down, on an agent that is then killed and restarted, is still reported
/// as succeeded: unacknowledged status updates wait on disk and are delivered, in order, after the restart.
#[test]
fn status_updates_survive_an_outage_and_an_agent_restart() {
    let mut f = Fed::generated(
        &[SiteSpec {
            lat: 50.1,
            lon: 8.7,
            ..SiteSpec::new("edge", "owned", "L4", 1, 1.0)
        }],
        "site_lost_after_ms = 60000",
    );
    let id = f.submit(&job("through-outage", 1, "sleep 2"));
    f.wait_phase(&id, "running", LONG);
    f.fed.nats.nodes[0].kill();
    // The job ends while nobody can hear about it; then the agent dies too.
    std::thread::sleep(Duration::from_secs(4));
    f.fed.kill_agent("edge");
    f.fed.nats.nodes[0].restart().expect("nats restarts");
    f.fed.restart_agent("edge").expect("agent restarts");
    let done = f.wait_phase(&id, "succeeded", Duration::from_secs(60));
    assert_eq!(done["attempt"], 1, "{done}");
    assert_eq!(done["exit_code"], 0, "{done}");
}

/// A site's grid feed (`[agent] carbon_file`) moves the intensity the broker sees at once; a feed that is not a
/// carbon object, or out of range, changes nothing. An attempt that ran across a change is metered at each
/// intensity for the time it held (format 8), not at the one in force when it ended.
#[test]
fn carbon_is_metered_over_the_intensities_a_run_went_through() {
    let f = Fed::generated(
        &[SiteSpec {
            carbon: 100,
            grid_feed: true,
            ..SiteSpec::new("grid", "owned", "A100", 8, 1.0)
        }],
        "",
    );
    let seen = || -> u64 {
        let (_, sites) = f.get("/v1/sites");
        sites["ok"][0]["carbon_g_per_kwh"].as_u64().unwrap()
    };
    for bad in ["not json", r#"{"g_per_kwh": 9000}"#] {
        f.set_grid("grid", bad);
        std::thread::sleep(Duration::from_millis(1_500));
        assert_eq!(seen(), 100, "a bad feed ({bad}) changed the intensity");
    }
    f.set_grid("grid", r#"{"g_per_kwh": 100}"#);
    let id = f.submit(&job("across", 8, "sleep 12"));
    f.wait_phase(&id, "running", LONG);
    std::thread::sleep(Duration::from_secs(6));
    f.set_grid("grid", r#"{"g_per_kwh": 3000}"#);
    f.wait_until("the broker to see the new intensity", LONG, || {
        seen() == 3000
    });
    let done = f.wait_phase(&id, "succeeded", LONG);
    let (wh, g) = (
        done["metered"]["energy_wh"].as_f64().unwrap(),
        done["metered"]["co2_g"].as_f64().unwrap(),
    );
    // About 13 Wh: all of it at 100 g/kWh would be about 1 g, all at 3,000 (the rule before) about 40 g.
    assert!(wh >= 10.0, "{done}");
    assert!(
        g > wh * 0.1 * 3.0 && g < wh * 3.0 * 0.8,
        "{g} g for {wh} Wh is not between the two intensities: {done}"
    );
}
