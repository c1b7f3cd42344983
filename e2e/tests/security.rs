//! The trust boundary, from the attacker's side too: real nats-server configured by `meridian creds`, real
//! binaries. A site's credential speaks only for that site; no credential, no TLS or another CA gets nowhere;
//! a revoked site is cut off and its work requeued; tenants see and touch only their own work; every action
//! and refusal is in the audit; a tenant's flood is slowed without slowing another tenant.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_broker::local::LocalOptions;
use meridian_e2e::*;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(40);

fn two_sites() -> Fed {
    Fed::generated(
        &[
            SiteSpec::new("site-a", "owned", "A100", 4, 1.0),
            SiteSpec::new("site-b", "owned", "H100", 4, 2.0),
        ],
        "",
    )
}

fn pinned(key: &str, site: &str, command: &str) -> Value {
    let mut j = job(key, 1, command);
    j["constraints"] = json!({"sites": [site]});
    j
}

/// Server errors (permission violations) a connection is told of.
type Errors = Arc<Mutex<Vec<String>>>;

async fn connect_watching(f: &Fed, identity: &str) -> (async_nats::Client, Errors) {
    let errors: Errors = Arc::default();
    let seen = errors.clone();
    let access = f.fed.access_as(identity);
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
    let client = access.connect_with(opts, LONG).await.unwrap();
    (client, errors)
}

/// Site A's credential cannot speak for site B: its advert, heartbeat and status as B are refused by
/// nats-server, and a status it sends on its own subject about B's attempt is refused by the broker. B and
/// B's job are unchanged; a made-up site cannot get in at all.
#[test]
fn a_sites_credential_speaks_only_for_that_site() {
    let f = two_sites();
    let id = f.submit(&pinned("on-b", "site-b", "sleep 600"));
    let running = f.wait_phase(&id, "running", LONG);
    let attempt = running["attempt"].as_u64().unwrap();
    // B's advert after the start (its generation moves on once) is in before B is looked at.
    f.wait_until("site-b's advert of the job's start", LONG, || {
        f.get("/v1/sites").1["ok"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["site"] == "site-b" && s["generation"].as_u64() > Some(1))
    });
    let sites_before = f.get("/v1/sites").1;
    let b_before: Vec<_> = sites_before["ok"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["site"] == "site-b")
        .map(|s| (s["pools"].clone(), s["generation"].clone(), s["up"].clone()))
        .collect();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (errors, own_subject_answer) = rt.block_on(async {
        let (nc, errors) = connect_watching(&f, "site-a").await;
        let fake_advert = json!({"v": 1, "site": {"id": "site-b"}, "generation": 99});
        let status = |site: &str| {
            json!({"v": 1, "job": id, "attempt": attempt, "site": site, "state": "succeeded",
                "exit_code": 0, "at_ms": 1, "runtime_ms": 10})
            .to_string()
        };
        for (subject, body) in [
            ("meridian.v1.site.site-b.advert", fake_advert.to_string()),
            (
                "meridian.v1.site.site-b.heartbeat",
                json!({"v": 1, "site": "site-b", "seq": 1}).to_string(),
            ),
            ("meridian.v1.site.site-b.status", status("site-b")),
            ("meridian.v1.site.made-up.advert", fake_advert.to_string()),
            ("meridian.v1.site.site-b.offer", "{}".into()),
            (
                "meridian.v1.site.site-b.hello",
                json!({"v": 1, "sent_at_ms": 1}).to_string(),
            ),
            ("$JS.API.STREAM.INFO.MERIDIAN_JOURNAL", String::new()),
            ("meridian.v1.journal", "garbage".into()),
        ] {
            nc.publish(subject, body.into_bytes().into()).await.unwrap();
        }
        // Nor can it listen to other sites' offers or to every subject.
        let _ = nc.subscribe("meridian.v1.site.site-b.offer").await;
        let _ = nc.subscribe(">").await;
        nc.flush().await.unwrap();
        // On its own subject it may speak, but not of an attempt site B holds: the broker refuses.
        let answer = nc
            .request(
                "meridian.v1.site.site-a.status",
                status("site-a").into_bytes().into(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let errors = errors.lock().unwrap().clone();
        let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
        (errors, answer)
    });
    println!("nats-server refused: {errors:#?}");
    for subject in [
        "meridian.v1.site.site-b.advert",
        "meridian.v1.site.site-b.heartbeat",
        "meridian.v1.site.site-b.status",
        "meridian.v1.site.made-up.advert",
        "meridian.v1.site.site-b.offer",
        "meridian.v1.site.site-b.hello",
        "meridian.v1.journal",
    ] {
        assert!(
            errors
                .iter()
                .any(|e| e.contains("ublish") && e.contains(subject)),
            "no publish violation for {subject}: {errors:?}"
        );
    }
    assert!(
        errors
            .iter()
            .any(|e| e.contains("ubscription") && e.contains('>')),
        "{errors:?}"
    );
    assert_eq!(
        own_subject_answer["error"]["code"], "forbidden",
        "{own_subject_answer}"
    );
    assert!(
        own_subject_answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("which site site-b holds"),
        "{own_subject_answer}"
    );

    // Nothing changed: B is as it was, its job still runs there as the same attempt, no made-up site.
    std::thread::sleep(Duration::from_millis(500));
    let job = f.job(&id);
    assert_eq!(job["phase"], "running", "{job}");
    assert_eq!(job["attempt"].as_u64(), Some(attempt));
    assert_eq!(job["site"], "site-b");
    let sites = f.get("/v1/sites").1;
    let ids: Vec<&str> = sites["ok"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["site"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["site-a", "site-b"]);
    let b_after: Vec<_> = sites["ok"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["site"] == "site-b")
        .map(|s| (s["pools"].clone(), s["generation"].clone(), s["up"].clone()))
        .collect();
    assert_eq!(b_before, b_after);

    // The broker alone may ask a site for its advert (what it does when a heartbeat names a generation it has
    // no advert of): site A answers the broker's ask on its own subject with its advert.
    rt.block_on(async {
        use futures::StreamExt;
        let broker = f.nats_as("broker-1").await;
        let mut adverts = broker
            .subscribe("meridian.v1.site.site-a.advert")
            .await
            .unwrap();
        broker.flush().await.unwrap();
        // Twice, each answered within seconds: the periodic advert (a minute apart) cannot answer both.
        for _ in 0..2 {
            let ask = json!({"v": 1, "sent_at_ms": 1}).to_string();
            broker
                .publish("meridian.v1.site.site-a.hello", ask.into_bytes().into())
                .await
                .unwrap();
            broker.flush().await.unwrap();
            let advert = tokio::time::timeout(Duration::from_secs(5), adverts.next())
                .await
                .expect("site-a answers the ask with its advert")
                .unwrap();
            let advert: Value = serde_json::from_slice(&advert.payload).unwrap();
            assert_eq!(advert["site"]["id"], "site-a", "{advert}");
        }
    });

    // No credential: no connection. A credential without its TLS: no connection.
    rt.block_on(async {
        let mut anonymous = f.fed.access();
        anonymous.creds = None;
        assert!(anonymous
            .connect("anonymous", Duration::from_secs(3))
            .await
            .is_err());
        let mut plain = f.fed.access();
        plain.ca = None;
        assert!(plain
            .connect("no tls", Duration::from_secs(3))
            .await
            .is_err());
    });

    // The broker audited the refusal, as site-a's.
    std::thread::sleep(Duration::from_secs(6));
    let (_, audit) = f.get("/v1/admin/audit?who=site:site-a");
    let entries = audit["ok"]["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "status"
                && e["outcome"].as_str().unwrap().starts_with("refused")),
        "{audit}"
    );
}

/// TLS on NATS and HTTPS: no TLS, or a certificate of another CA, gets no connection.
#[test]
fn without_tls_or_with_another_cas_certificate_nothing_connects() {
    let f = two_sites();
    let other = tempfile::tempdir().unwrap();
    let mut reg =
        meridian_broker::creds::Registry::init(other.path(), "other", &["127.0.0.1".to_owned()])
            .unwrap();
    // An identity of another federation: its own CA, an NKey of the same name as a real client.
    let creds = reg
        .add(meridian_broker::creds::Kind::Client, "operator")
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut foreign = f.fed.access();
        foreign.creds = Some(creds.clone());
        let refused = foreign.connect("foreign", Duration::from_secs(3)).await;
        assert!(refused.is_err(), "a certificate of another CA connected");
        // Trusting another CA, the client cannot verify the federation's servers either.
        let mut wrong_ca = f.fed.access();
        wrong_ca.ca = Some(reg.ca());
        assert!(wrong_ca
            .connect("wrong ca", Duration::from_secs(3))
            .await
            .is_err());
    });
    // HTTPS: plain HTTP to the API is no answer; a client trusting another CA refuses the server.
    let plain = f.fed.http.replace("https://", "http://");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into();
    match agent.get(&format!("{plain}/v1/sites")).call() {
        Ok(r) => assert!(
            r.status().as_u16() >= 400,
            "plain HTTP answered {}",
            r.status()
        ),
        Err(e) => println!("plain HTTP refused: {e}"),
    }
    let pem = std::fs::read(reg.ca()).unwrap();
    let other_ca: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![
                    ureq::tls::Certificate::from_pem(&pem).unwrap(),
                ])))
                .build(),
        )
        .build()
        .into();
    let e = other_ca
        .get(&format!("{}/v1/sites", f.fed.http))
        .call()
        .expect_err("a server certificate of the federation's CA is not one of another CA's");
    println!("another CA: {e}");
    // The federation's own CA verifies it.
    assert_eq!(f.get("/v1/sites").0, 200);
}

/// A revoked site: `meridian revoke-site` has the broker tell it to stop what it was given (the agent obeys,
/// so the requeued jobs run once; the explanation says the old attempt may still run there), treat it as lost
/// and requeue its work; `meridian creds revoke SITE --reload PID` has nats-server close its connections
/// within 5 s, and a copy of its credential cannot connect. `creds add client --reload` lets a client in
/// within seconds; a server that holds the identities inline is not told "reloaded".
#[test]
fn a_revoked_site_is_cut_off_and_its_jobs_are_requeued() {
    let f = two_sites();
    // Two jobs on the cheaper site, each writing its process id per run.
    let pids = |key: &str| f.scratch.path().join(format!("{key}.pids"));
    let ids: Vec<String> = ["moves-1", "moves-2"]
        .iter()
        .map(|key| {
            let mut j = job(
                key,
                1,
                &format!("echo $$ >> {}; exec sleep 600", pids(key).display()),
            );
            j["policy"] = json!("cost");
            f.submit(&j)
        })
        .collect();
    let victim = "site-a";
    for id in &ids {
        let running = f.wait_phase(id, "running", LONG);
        assert_eq!(running["site"], victim, "{running}");
    }
    let read_pids = |key: &str| -> Vec<i32> {
        std::fs::read_to_string(pids(key))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    f.wait_until("both runs wrote their pid", LONG, || {
        read_pids("moves-1").len() == 1 && read_pids("moves-2").len() == 1
    });
    let first_runs: Vec<i32> = ["moves-1", "moves-2"]
        .iter()
        .map(|k| read_pids(k)[0])
        .collect();
    // Keep a copy of the victim's credential, as a thief would.
    let access = f.fed.access_as(victim);
    let stolen = f.scratch.path().join(format!("{victim}.nk"));
    std::fs::copy(access.creds.as_ref().unwrap(), &stolen).unwrap();
    for ext in ["crt", "key"] {
        std::fs::copy(
            access.creds.as_ref().unwrap().with_extension(ext),
            stolen.with_extension(ext),
        )
        .unwrap();
    }

    // The broker first: before it stops listening to the site, it tells it to stop what it was given, and an
    // honest agent obeys, so the requeued jobs do not run twice.
    let revoked_at = Instant::now();
    let out = f.cli(&["revoke-site", victim]);
    assert!(out.status.success(), "{out:?}");
    for id in &ids {
        f.wait_until("the job runs on the other site", LONG, || {
            let j = f.job(id);
            j["phase"] == "running" && j["site"] != victim
        });
    }
    println!(
        "jobs requeued and running elsewhere {} ms after the revocation",
        revoked_at.elapsed().as_millis()
    );
    f.wait_until("the revoked site's runs stopped", LONG, || {
        first_runs.iter().all(|&p| !process_alive(p))
    });
    f.wait_until("the new runs wrote their pid", LONG, || {
        read_pids("moves-1").len() == 2 && read_pids("moves-2").len() == 2
    });
    for key in ["moves-1", "moves-2"] {
        let alive: Vec<i32> = read_pids(key)
            .into_iter()
            .filter(|&p| process_alive(p))
            .collect();
        assert_eq!(alive.len(), 1, "{key} runs once: {alive:?}");
    }
    // The broker cannot know the site obeyed: the explanation says the old attempt may still run there.
    let why = f.explain(&ids[0]);
    assert!(
        why["history"].as_array().unwrap().iter().any(|h| h
            .as_str()
            .unwrap()
            .contains("may still be running at site site-a")),
        "{why}"
    );
    let (_, sites) = f.get("/v1/sites");
    let v_site = sites["ok"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["site"] == victim)
        .cloned()
        .unwrap();
    assert_eq!(v_site["up"], false, "{v_site}");

    // Then its credential, as the README says: `meridian creds revoke SITE --reload PID`.
    let creds = f.fed.security.as_ref().unwrap().creds.clone();
    let pid = f.fed.nats.nodes[0].pid().unwrap().to_string();
    let dir = creds.to_str().unwrap();
    let heartbeats = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::StreamExt;
        let nc = f.nats_as("broker-1").await;
        let mut sub = nc
            .subscribe(format!("meridian.v1.site.{victim}.heartbeat"))
            .await
            .unwrap();
        nc.flush().await.unwrap();
        let seen = heartbeats.clone();
        tokio::spawn(async move {
            let _keep = nc;
            while sub.next().await.is_some() {
                seen.lock().unwrap().push(Instant::now());
            }
        });
    });
    let cut_at = Instant::now();
    let out = f.cli(&["creds", "--dir", dir, "revoke", victim, "--reload", &pid]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("servers reloaded"),
        "{out:?}"
    );
    // Disconnected within 5 s: no heartbeat of the site reaches NATS after that.
    std::thread::sleep(Duration::from_secs(8));
    let late: Vec<Duration> = heartbeats
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t > cut_at)
        .map(|t| t.duration_since(cut_at))
        .collect();
    assert!(
        late.iter().all(|d| *d < Duration::from_secs(5)),
        "heartbeats after the revocation: {late:?}"
    );
    f.wait_until("the agent is told it is no longer authorized", LONG, || {
        let log = std::fs::read_to_string(f.fed.dir.join(format!("agent-{victim}.log")))
            .unwrap_or_default();
        log.contains("uthorization") || log.contains("disconnected")
    });
    // The stolen credential no longer connects.
    rt.block_on(async {
        let mut thief = f.fed.access();
        thief.creds = Some(stolen.clone());
        assert!(thief
            .connect("thief", Duration::from_secs(3))
            .await
            .is_err());
    });
    // A client added with --reload connects at once.
    let out = f.cli(&[
        "creds", "--dir", dir, "add", "client", "carol", "--reload", &pid,
    ]);
    assert!(out.status.success(), "{out:?}");
    // nats-server applies a reload signal on its own time (milliseconds, longer on a loaded machine): the
    // new identity is let in within the same 5 s a revocation is given.
    let added_at = Instant::now();
    rt.block_on(async {
        let carol = loop {
            match meridian_broker::client::Client::connect(
                &f.fed.access_as("carol"),
                f.token.clone(),
            )
            .await
            {
                Ok(c) => break c,
                Err(e) if added_at.elapsed() < Duration::from_secs(5) => {
                    eprintln!("carol not yet let in: {e:#}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("carol is not let in 5 s after the reload: {e:#}"),
            }
        };
        println!(
            "carol let in {} ms after `creds add --reload`",
            added_at.elapsed().as_millis()
        );
        assert_eq!(carol.sites().await.unwrap().len(), 2);
    });
    // A server whose configuration holds the identities inline would re-read the old list: the command says
    // so instead of "reloaded".
    let inline_dir = f.scratch.path().join("inline");
    std::fs::create_dir_all(&inline_dir).unwrap();
    let reg = meridian_broker::creds::Registry::open(&creds).unwrap();
    let conf = inline_dir.join("nats-server.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: \"127.0.0.1:-1\"\n{}",
            meridian_broker::creds::server::authorization(reg.identities())
        ),
    )
    .unwrap();
    let mut inline = meridian_broker::local::process::Managed::spawn(
        "nats-server",
        std::process::Command::new(meridian_broker::local::process::find_nats_server().unwrap())
            .arg("-c")
            .arg(&conf),
    )
    .unwrap();
    let inline_pid = inline.pid().unwrap().to_string();
    let out = f.cli(&[
        "creds",
        "--dir",
        dir,
        "add",
        "client",
        "dave",
        "--reload",
        &inline_pid,
    ]);
    inline.kill9();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not reloaded") && err.contains("does not include"),
        "{err}"
    );
    std::thread::sleep(Duration::from_secs(6));
    let (_, audit) = f.get("/v1/admin/audit?who=admin");
    assert!(
        audit["ok"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "site_revoke" && e["target"] == format!("site {victim}")),
        "{audit}"
    );
}

/// Tenants are confined to their own work over HTTP and NATS; the audit names each caller.
#[test]
fn tenants_see_and_touch_only_their_own_work() {
    let f = two_sites();
    let alpha = f.create_token(Some("alpha"), &["submit", "watch", "cancel"]);
    let beta = f.create_token(Some("beta"), &["submit", "watch", "cancel", "report"]);
    let viewer = f.create_token(Some("alpha"), &["viewer"]);
    let spec = |tenant: &str, key: &str| {
        let mut j = job(key, 1, "sleep 600");
        j["tenant"] = json!(tenant);
        j
    };
    let a = f.with_token(Some(&alpha));
    let b = f.with_token(Some(&beta));
    let (status, v) = a.post("/v1/jobs", spec("alpha", "a1").to_string().as_bytes());
    assert_eq!(status, 201, "{v}");
    let a_job = v["ok"]["job"].as_str().unwrap().to_owned();
    f.wait_phase(&a_job, "running", LONG);

    // No token: 401. A submission naming another tenant: refused (403), not rewritten.
    let (status, v) = f.with_token(None).get("/v1/jobs");
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("unauthenticated"))
    );
    let (status, v) = b.post("/v1/jobs", spec("alpha", "forged").to_string().as_bytes());
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("acts for tenant beta"),
        "{v}"
    );

    // Beta cannot list, read, explain, read logs of or cancel alpha's job: it does not exist for beta.
    let (_, listed) = b.get("/v1/jobs");
    assert!(
        listed["ok"]["jobs"].as_array().unwrap().is_empty(),
        "{listed}"
    );
    let (status, _) = b.get("/v1/jobs?tenant=alpha");
    assert_eq!(status, 403);
    for path in [
        format!("/v1/jobs/{a_job}"),
        format!("/v1/jobs/{a_job}/explain"),
        format!("/v1/jobs/{a_job}/logs"),
    ] {
        let (status, v) = b.get(&path);
        assert_eq!(status, 404, "{path}: {v}");
        assert_eq!(v["error"]["message"], format!("job {a_job} not found"));
    }
    let (status, _) = b.delete(&format!("/v1/jobs/{a_job}"));
    assert_eq!(status, 404);
    assert_eq!(f.job(&a_job)["phase"], "running");
    // Beta's report holds only beta; asking for alpha's is refused.
    let (status, _) = b.get("/v1/report?tenant=alpha");
    assert_eq!(status, 403);
    // Administrator calls are refused to tenants, naming what is missing.
    let (status, v) = a.post("/v1/sites/site-a/drain", b"");
    assert_eq!(status, 403);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("administrator"),
        "{v}"
    );
    // A viewer reads but does not cancel.
    let v_api = f.with_token(Some(&viewer));
    assert_eq!(v_api.get(&format!("/v1/jobs/{a_job}")).0, 200);
    let (status, v) = v_api.delete(&format!("/v1/jobs/{a_job}"));
    assert_eq!(status, 403);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`cancel`"),
        "{v}"
    );

    // The same over NATS, with the token in the Authorization header.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = f.client().await;
        let as_beta = client.with_token(Some(beta.clone()));
        let job = meridian_federation::JobId::new(a_job.clone()).unwrap();
        for e in [
            as_beta.job(&job).await.unwrap_err(),
            as_beta.explain(&job).await.unwrap_err(),
            as_beta.logs(&job).await.unwrap_err(),
            as_beta.cancel(&job).await.unwrap_err(),
        ] {
            assert!(e.to_string().contains("not found"), "{e}");
        }
        assert!(as_beta.jobs().await.unwrap().is_empty());
        let none = client.with_token(None);
        let e = none.jobs().await.unwrap_err();
        assert!(e.to_string().contains("needs an API token"), "{e}");
        assert!(
            e.to_string().contains("--token or MERIDIAN_TOKEN"),
            "said for the CLI: {e}"
        );
        let as_alpha = client.with_token(Some(alpha.clone()));
        assert_eq!(as_alpha.jobs().await.unwrap().len(), 1);
    });
    // Alpha cancels its own.
    assert_eq!(a.delete(&format!("/v1/jobs/{a_job}")).0, 200);

    // The audit holds each action under the right credential id.
    std::thread::sleep(Duration::from_secs(6));
    let id_of = |t: &str| t.split('_').nth(1).unwrap().to_owned();
    let (_, audit) = f.get("/v1/admin/audit");
    let entries = audit["ok"]["entries"].as_array().unwrap();
    let has = |who: &str, action: &str, outcome: &str| {
        entries.iter().any(|e| {
            e["who"] == who
                && e["action"] == action
                && e["outcome"].as_str().unwrap().starts_with(outcome)
        })
    };
    assert!(has("admin", "token_create", "ok"), "{audit}");
    assert!(has(&id_of(&alpha), "submit", "ok"), "{audit}");
    assert!(has(&id_of(&alpha), "cancel", "ok"), "{audit}");
    assert!(has(&id_of(&beta), "submit", "refused"), "{audit}");
    assert!(has(&id_of(&beta), "cancel", "refused"), "{audit}");
    assert!(has(&id_of(&alpha), "drain", "refused"), "{audit}");
    // A call without a token is audited under the NATS identity it came from.
    assert!(has("nats:operator", "list_jobs", "refused"), "{audit}");
    // Tenants cannot read the audit.
    assert_eq!(a.get("/v1/admin/audit").0, 403);
}

/// One tenant flooding submissions is slowed (429 with Retry-After) while another, submitting at the same time,
/// is never refused and gets every job in.
#[test]
fn a_flooding_tenant_is_slowed_and_another_is_not() {
    let f = Fed::generated_with(
        &[SiteSpec::new("big", "owned", "A100", 4, 1.0)],
        "",
        LocalOptions {
            agent_args: vec!["--executor".into(), "noop".into()],
            broker_args: ["--tenant-rate", "40", "--tenant-burst", "40"]
                .map(String::from)
                .to_vec(),
            ..LocalOptions::default()
        },
    );
    let flood = f.create_token(Some("flood"), &["submit"]);
    let calm = f.create_token(Some("calm"), &["submit", "watch"]);
    let spec = |tenant: &str, key: String| {
        let mut j = job(&key, 1, "true");
        j["tenant"] = json!(tenant);
        j.to_string()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (limited, accepted) = (Arc::new(Mutex::new(0u32)), Arc::new(Mutex::new(0u32)));
    std::thread::scope(|s| {
        let mut flooders = Vec::new();
        for t in 0..4 {
            let (stop, limited, accepted, flood, f) = (&stop, &limited, &accepted, &flood, &f);
            flooders.push(s.spawn(move || {
                let api = f.with_token(Some(flood));
                let mut i = 0;
                // Every 429 says when to try again.
                let mut every_429_says_when = true;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, v, headers) = api.post_with_headers(
                        "/v1/jobs",
                        spec("flood", format!("f{t}-{i}")).as_bytes(),
                    );
                    i += 1;
                    match status {
                        429 => {
                            *limited.lock().unwrap() += 1;
                            // The body says when, in ms; the Retry-After header, in whole seconds.
                            let header = headers
                                .get("retry-after")
                                .and_then(|h| h.parse::<u64>().ok());
                            every_429_says_when &= v["error"]["retry_after_ms"].as_u64().is_some()
                                && header >= Some(1);
                        }
                        200 | 201 => *accepted.lock().unwrap() += 1,
                        other => panic!("flood got {other}: {v}"),
                    }
                }
                every_429_says_when
            }));
        }
        std::thread::sleep(Duration::from_millis(300));
        let calm_api = f.with_token(Some(&calm));
        let mut latencies = Vec::new();
        for i in 0..30 {
            let t = Instant::now();
            let (status, v) = calm_api.post("/v1/jobs", spec("calm", format!("c{i}")).as_bytes());
            latencies.push(t.elapsed().as_secs_f64() * 1000.0);
            assert!(status == 201, "the calm tenant was refused: {status} {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        latencies.sort_by(f64::total_cmp);
        println!(
            "calm tenant: 30 of 30 accepted, latency p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms",
            latencies[14], latencies[28], latencies[29]
        );
        let saw_retry_after = flooders.into_iter().any(|h| h.join().unwrap());
        assert!(
            saw_retry_after,
            "a 429 says when to retry, in its body and its Retry-After header"
        );
    });
    let (limited, accepted) = (*limited.lock().unwrap(), *accepted.lock().unwrap());
    println!("flooding tenant: {accepted} accepted, {limited} slowed (429)");
    assert!(limited > 0, "the flood was never slowed");
}

/// A journal message no broker can read (here, bytes appended with a broker's own credential, the only kind
/// that may write there) leaves a restarted broker read-only, not dead: reads are answered, every change is
/// refused with the message's sequence and the reason, and running work is left alone. Only an administrator
/// can set the message aside (a tenant cannot, nor can anyone name another message); then the broker replays
/// what followed and takes changes again, across later restarts too, and the audit says who did it.
#[test]
fn an_unreadable_journal_message_leaves_the_broker_read_only_until_set_aside() {
    let mut f = two_sites();
    let viewer = f.create_token(Some("team-a"), &["viewer"]);
    let id = f.submit(&pinned("before", "site-a", "sleep 600"));
    let running = f.wait_phase(&id, "running", LONG);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let seq = rt.block_on(async {
        // Only a broker's storage identity reaches JetStream.
        let nc = f.nats_as("broker-1-store").await;
        let js = async_nats::jetstream::new(nc);
        let ack = js
            .publish("meridian.v1.journal", "\u{1}garbage".into())
            .await
            .unwrap()
            .await
            .unwrap();
        ack.sequence
    });
    f.fed
        .restart_broker()
        .expect("a broker with an unreadable journal still starts");

    // Reads are answered and say why the broker is read-only.
    let seen = f.job(&id);
    assert_eq!(seen["phase"], "running", "{seen}");
    let (code, format) = f.get("/v1/admin/journal/format");
    assert_eq!(code, 200, "{format}");
    assert_eq!(format["ok"]["unreadable"]["seq"], seq, "{format}");
    // Changes are refused, naming the message.
    let (code, refused) = f.post("/v1/jobs", job("during", 1, "true").to_string().as_bytes());
    assert_eq!(code, 503, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("journal message {seq}"))
            && message.contains("meridian journal quarantine"),
        "{refused}"
    );
    // A tenant's token cannot set it aside; nobody can set aside a readable message.
    let (code, body) = f
        .with_token(Some(&viewer))
        .post(&format!("/v1/admin/journal/quarantine/{seq}"), b"");
    assert_eq!(code, 403, "{body}");
    let (code, body) = f.post(&format!("/v1/admin/journal/quarantine/{}", seq - 1), b"");
    assert_eq!(code, 409, "{body}");
    assert_eq!(
        f.get("/v1/admin/journal/format").1["ok"]["unreadable"]["seq"],
        seq
    );

    // The administrator sets it aside through the CLI: the broker takes changes again.
    let out = f.cli(&["journal", "quarantine", &seq.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, format) = f.get("/v1/admin/journal/format");
    assert!(format["ok"]["unreadable"].is_null(), "{format}");
    let (code, body) = f.post(&format!("/v1/admin/journal/quarantine/{seq}"), b"");
    assert_eq!(code, 409, "nothing is left to set aside: {body}");
    let after = f.submit(&pinned("after", "site-b", "true"));
    f.wait_phase(&after, "succeeded", LONG);
    let kept = f.job(&id);
    assert_eq!(
        kept["phase"], "running",
        "the running job was left alone: {kept}"
    );
    assert_eq!(kept["attempt"], running["attempt"], "{kept}");

    // The audit names who set it aside, and the refused attempts (refusals are written every few seconds).
    let audited = |f: &Fed| -> Vec<(String, String, String)> {
        let (_, audit) = f.get("/v1/admin/audit?limit=1000");
        audit["ok"]["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|e| e["action"] == "journal_quarantine")
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (s("action"), s("who"), s("outcome"))
            })
            .collect()
    };
    f.wait_until("the quarantine and its refusals in the audit", LONG, || {
        let a = audited(&f);
        a.iter().any(|(_, who, o)| who == "admin" && o == "ok")
            && a.iter().filter(|(_, _, o)| o != "ok").count() >= 2
    });

    // The marker keeps it set aside across restarts.
    f.fed.restart_broker().unwrap();
    let (_, format) = f.get("/v1/admin/journal/format");
    assert!(format["ok"]["unreadable"].is_null(), "{format}");
    assert_eq!(f.job(&after)["phase"], "succeeded");
    assert_eq!(f.job(&id)["phase"], "running");
}
