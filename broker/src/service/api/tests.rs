//! Every API call through the shell's own path, on the in-process harness (no NATS): its happy path, a caller
//! it refuses, and bad input it names. One case per call in [`CASES`]; a test checks that the table covers
//! every call the call table declares.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::calls::{self, CallDef, HttpIn};
use super::{Call, Request};
use crate::service::harness::{Harness, ADMIN};
use bytes::Bytes;
use meridian_federation::{ErrorBody, ErrorCode, JobId, SiteId};
use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;

const A: Option<&str> = Some(ADMIN);

/// A wire type from JSON.
fn wire<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// Makes a token as the administrator; returns it.
async fn token(x: &Harness, tenant: Option<&str>, roles: &[&str]) -> String {
    let req = wire(json!({"v": 1, "tenant": tenant, "roles": roles, "name": "harness"}));
    x.json(A, Call::TokenCreate(req)).await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A job of tenant `team-a` on one A100.
fn job(key: &str) -> meridian_federation::JobSpec {
    let mut spec = meridian_core::testkit::job(key, 1);
    spec.resources.models = vec!["A100".into()];
    spec
}

/// A job no site can run (a model no pool has): it waits, and has no attempt.
async fn submit_waiting(x: &Harness, key: &str) -> JobId {
    let mut waits = job(key);
    waits.resources.models = vec!["B300".into()];
    let ok = x.json(A, Call::Submit(waits)).await.unwrap();
    JobId::new(ok["job"].as_str().unwrap()).unwrap()
}

async fn submit_one(x: &Harness, key: &str) -> JobId {
    let ok = x.json(A, Call::Submit(job(key))).await.unwrap();
    JobId::new(ok["job"].as_str().unwrap()).unwrap()
}

fn service() -> meridian_federation::ServiceSpec {
    wire(json!({
        "name": "chat", "tenant": "team-a", "resources": {"kind": "gpu", "count": 1},
        "throughput": {"requests_per_s": 10.0}, "slo_ms": 30, "min_replicas": 0, "max_replicas": 4,
        "policy": "cost", "run": {"command": "serve"}
    }))
}

fn service_ref(tenant: Option<&str>, name: Option<&str>) -> meridian_federation::ServiceRef {
    wire(json!({"v": 1, "tenant": tenant, "name": name}))
}

/// The error's code.
fn code(r: Result<Value, ErrorBody>) -> ErrorCode {
    r.expect_err("refused").code
}

/// A call decoded by its HTTP edge (route `route` of `def`), then carried out as the token says.
async fn via_http(
    x: &Harness,
    token: Option<&str>,
    def: &'static CallDef,
    params: &[(&str, &str)],
    query: &str,
    body: &str,
) -> Result<Value, ErrorBody> {
    let input = HttpIn {
        params: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        uri: format!("/x?{query}").parse().unwrap(),
        body: Bytes::from(body.to_owned()),
    };
    let req = Request {
        action: def.action,
        call: (def.http[0].decode)(input),
    };
    let reply = super::handle(&x.h, token, None, req)
        .await
        .map_err(|e| e.0)?;
    let v: Value = serde_json::from_slice(&reply.body).unwrap_or_default();
    Ok(v["ok"].clone())
}

async fn submit(x: Harness) {
    let ok = x.json(A, Call::Submit(job("s-1"))).await.unwrap();
    assert_eq!(ok["created"], true, "{ok}");
    // Again with the same key: the same job.
    let again = x.json(A, Call::Submit(job("s-1"))).await.unwrap();
    assert_eq!(again["job"], ok["job"]);
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::Submit(job("s-2"))).await),
        ErrorCode::Forbidden
    );
    let e = via_http(
        &x,
        A,
        &calls::SUBMIT,
        &[],
        "",
        r#"{"v":1,"tenant":"team-a"}"#,
    )
    .await
    .unwrap_err();
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::Malformed, Some("idempotency_key")),
        "{e:?}"
    );
}

async fn list_jobs(x: Harness) {
    let id = submit_one(&x, "l-1").await;
    let page = x
        .json(A, Call::ListJobs(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert_eq!(page["jobs"][0]["job"], id.as_str(), "{page}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let theirs = x
        .json(Some(&other), Call::ListJobs(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert_eq!(theirs["jobs"], json!([]), "another tenant sees none");
    let e = via_http(&x, A, &calls::LIST_JOBS, &[], "cursor=nowhere", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("cursor"), "{e:?}");
}

async fn queues(x: Harness) {
    submit_one(&x, "q-1").await;
    let v = x
        .json(A, Call::Queues(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert!(!v["queues"].as_array().unwrap().is_empty(), "{v}");
    let own = token(&x, Some("team-b"), &["watch"]).await;
    let asks_other = Call::Queues(wire(json!({"v": 1, "tenant": "team-a"})));
    assert_eq!(
        code(x.json(Some(&own), asks_other).await),
        ErrorCode::Forbidden
    );
}

async fn get_job(x: Harness) {
    let id = submit_one(&x, "g-1").await;
    let v = x.json(A, Call::GetJob(id.clone())).await.unwrap();
    assert_eq!(v["job"], id.as_str());
    let other = token(&x, Some("team-b"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&other), Call::GetJob(id)).await),
        ErrorCode::NotFound
    );
    let e = via_http(&x, A, &calls::GET_JOB, &[("id", "not an id!")], "", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("job"), "{e:?}");
}

async fn explain(x: Harness) {
    let id = submit_one(&x, "e-1").await;
    let v = x
        .json(
            A,
            Call::Explain {
                job: id.clone(),
                all: true,
            },
        )
        .await
        .unwrap();
    assert!(v["candidates"].is_array(), "{v}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let hidden = Call::Explain {
        job: id.clone(),
        all: false,
    };
    assert_eq!(
        code(x.json(Some(&other), hidden).await),
        ErrorCode::NotFound
    );
    let e = via_http(
        &x,
        A,
        &calls::EXPLAIN,
        &[("id", id.as_str())],
        "everything=1",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Malformed, "{e:?}");
}

async fn logs(x: Harness) {
    // A job no site can run has no attempt whose log a site could be asked for (a running job's log comes
    // from its site over NATS, which the harness has not: the e2e tests read it).
    let id = submit_waiting(&x, "o-1").await;
    let e = x
        .json(A, Call::Logs { job: id, lines: 10 })
        .await
        .unwrap_err();
    assert!(e.message.contains("a started attempt"), "{e:?}");
    let e = via_http(&x, A, &calls::LOGS, &[("id", "j")], "lines=ten", "")
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Malformed, "{e:?}");
}

async fn timeline(x: Harness) {
    let id = submit_waiting(&x, "t-1").await;
    let v = x.json(A, Call::Timeline(id.clone())).await.unwrap();
    assert_eq!(v["events"][0]["event"], "submitted", "{v}");
    assert!(v["log_error"].is_string(), "no log without an attempt: {v}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&other), Call::Timeline(id)).await),
        ErrorCode::NotFound
    );
}

async fn cancel(x: Harness) {
    let id = submit_one(&x, "c-1").await;
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::Cancel(id.clone())).await),
        ErrorCode::Forbidden
    );
    let other = token(&x, Some("team-b"), &["cancel"]).await;
    assert_eq!(
        code(x.json(Some(&other), Call::Cancel(id.clone())).await),
        ErrorCode::NotFound
    );
    let v = x.json(A, Call::Cancel(id.clone())).await.unwrap();
    // Offered to site-a: the site is told to stop it, and the job ends when it says so.
    assert_eq!(v["phase"], "cancelling", "{v}");
    let sent = x.outbox.lock().unwrap();
    assert!(
        sent.iter().any(
            |c| matches!(c, meridian_core::reactor::Command::Cancel { site, cancel }
            if site.as_str() == "site-a" && cancel.job == id)
        ),
        "{sent:?}"
    );
}

async fn list_sites(x: Harness) {
    let v = x.json(A, Call::ListSites).await.unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    assert_eq!(
        code(x.json(None, Call::ListSites).await),
        ErrorCode::Unauthenticated
    );
}

async fn drain(x: Harness) {
    let site = SiteId::new("site-a").unwrap();
    let tenant = token(&x, Some("team-a"), &["submit", "cancel"]).await;
    let by_tenant = Call::Drain {
        site: site.clone(),
        drain: true,
    };
    assert_eq!(
        code(x.json(Some(&tenant), by_tenant).await),
        ErrorCode::Forbidden
    );
    let v = x.json(A, Call::Drain { site, drain: true }).await.unwrap();
    assert_eq!(v["draining"], true, "{v}");
    let e = via_http(&x, A, &calls::DRAIN, &[("id", "no such!")], "", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("site"), "{e:?}");
}

async fn scale_in(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let req = || wire(json!({"v": 1, "tenant": "team-a", "service": "chat", "remove": 1}));
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::ScaleIn(req())).await),
        ErrorCode::Forbidden
    );
    let v = x.json(A, Call::ScaleIn(req())).await.unwrap();
    assert!(v["stopping"].is_array(), "{v}");
}

async fn service_deploy(x: Harness) {
    let v = x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    assert_eq!(v["spec"]["name"], "chat", "{v}");
    let viewer = token(&x, None, &["viewer"]).await;
    assert_eq!(
        code(x.json(Some(&viewer), Call::ServiceDeploy(service())).await),
        ErrorCode::Forbidden
    );
    let e = via_http(&x, A, &calls::SERVICE_DEPLOY, &[], "", r#"{"name":"x"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("tenant"), "{e:?}");
}

async fn services(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let all = x
        .json(A, Call::Services(service_ref(None, None)))
        .await
        .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    let one = x
        .json(A, Call::Services(service_ref(Some("team-a"), Some("chat"))))
        .await
        .unwrap();
    assert_eq!(one["spec"]["name"], "chat", "{one}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let theirs = Call::Services(service_ref(Some("team-a"), None));
    assert_eq!(
        code(x.json(Some(&other), theirs).await),
        ErrorCode::Forbidden
    );
}

async fn service_delete(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let other = token(&x, Some("team-b"), &["cancel"]).await;
    let named = || service_ref(Some("team-b"), Some("chat"));
    assert_eq!(
        code(x.json(Some(&other), Call::ServiceDelete(named())).await),
        ErrorCode::NotFound
    );
    let v = x
        .json(
            A,
            Call::ServiceDelete(service_ref(Some("team-a"), Some("chat"))),
        )
        .await
        .unwrap();
    assert!(v["stopping"].is_array(), "{v}");
}

async fn service_routes(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let v = x
        .json(
            A,
            Call::ServiceRoutes(service_ref(Some("team-a"), Some("chat"))),
        )
        .await
        .unwrap();
    assert_eq!(v["service"], "chat", "{v}");
    let e = x
        .json(A, Call::ServiceRoutes(service_ref(None, Some("chat"))))
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("tenant"), "{e:?}");
}

async fn service_routes_watch(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let inbox = crate::service::reply::Inbox::for_tests("_INBOX.operator.w");
    let req = || wire(json!({"v": 1, "tenant": "team-a", "name": "chat"}));
    let v = x
        .json(A, Call::ServiceRoutesWatch(req(), inbox.clone()))
        .await
        .unwrap();
    assert_eq!(v["seq"], 1, "{v}");
    let renewed = x
        .json(A, Call::ServiceRoutesWatch(req(), inbox))
        .await
        .unwrap();
    assert_eq!(renewed["seq"], 2, "a renewal is numbered on: {renewed}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let inbox = crate::service::reply::Inbox::for_tests("_INBOX.b.w");
    let theirs = Call::ServiceRoutesWatch(
        wire(json!({"v": 1, "tenant": "team-b", "name": "chat"})),
        inbox,
    );
    assert_eq!(
        code(x.json(Some(&other), theirs).await),
        ErrorCode::NotFound
    );
}

async fn service_demand(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let report = || {
        wire(json!({"v": 1, "tenant": "team-a", "service": "chat",
            "locations": [{"name": "fra", "location": {"lat": 50.1, "lon": 8.7}, "per_s": 5.0}]}))
    };
    let gateway = token(&x, Some("team-a"), &["gateway:chat"]).await;
    x.json(Some(&gateway), Call::ServiceDemand(report()))
        .await
        .unwrap();
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::ServiceDemand(report())).await),
        ErrorCode::Forbidden
    );
    let e = via_http(
        &x,
        A,
        &calls::SERVICE_DEMAND,
        &[("name", "chat")],
        "",
        r#"{"service":"other"}"#,
    )
    .await
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("service"), "{e:?}");
}

async fn report(x: Harness) {
    let v = x
        .json(A, Call::Report(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert!(v.is_object(), "{v}");
    let reporter = token(&x, Some("team-b"), &["report"]).await;
    let other = Call::Report(wire(json!({"v": 1, "tenant": "team-a"})));
    assert_eq!(
        code(x.json(Some(&reporter), other).await),
        ErrorCode::Forbidden
    );
    let watcher = token(&x, Some("team-b"), &["watch"]).await;
    let own = Call::Report(wire(json!({"v": 1})));
    assert_eq!(
        code(x.json(Some(&watcher), own).await),
        ErrorCode::Forbidden
    );
}

async fn history(x: Harness) {
    let id = submit_one(&x, "h-1").await;
    let v = x
        .json(A, Call::History(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert_eq!(v["jobs"][0]["job"], id.as_str(), "{v}");
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let call = Call::History(wire(json!({"v": 1})));
    assert_eq!(
        code(x.json(Some(&tenant), call).await),
        ErrorCode::Forbidden
    );
}

async fn tenancy(x: Harness) {
    x.json(A, Call::Tenancy).await.unwrap();
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::Tenancy).await),
        ErrorCode::Forbidden
    );
}

async fn set_tenancy(x: Harness) {
    let toml =
        "[[queues]]\nname = \"team-a\"\ntenant = \"team-a\"\n[queues.quota]\n\"gpu:A100\" = 2\n";
    let v = x.json(A, Call::SetTenancy(toml.into())).await.unwrap();
    assert_eq!(v["toml"], toml, "{v}");
    let tenant = token(&x, Some("team-a"), &["submit"]).await;
    let call = Call::SetTenancy(String::new());
    assert_eq!(
        code(x.json(Some(&tenant), call).await),
        ErrorCode::Forbidden
    );
    let e = x
        .json(A, Call::SetTenancy("[[queues]]\nname = 3".into()))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Invalid, "{e:?}");
}

async fn format(x: Harness) {
    let v = x.json(A, Call::Format).await.unwrap();
    assert_eq!(v["newest"], meridian_core::durable::FORMAT_VERSION, "{v}");
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::Format).await),
        ErrorCode::Forbidden
    );
}

async fn upgrade_format(x: Harness) {
    let v = x.json(A, Call::UpgradeFormat).await.unwrap();
    assert_eq!(v["format"], v["newest"], "{v}");
    let viewer = token(&x, None, &["viewer"]).await;
    assert_eq!(
        code(x.json(Some(&viewer), Call::UpgradeFormat).await),
        ErrorCode::Forbidden
    );
}

async fn quarantine(x: Harness) {
    let e = x.json(A, Call::Quarantine(7)).await.unwrap_err();
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::Conflict, Some("seq"))
    );
    let viewer = token(&x, None, &["viewer"]).await;
    assert_eq!(
        code(x.json(Some(&viewer), Call::Quarantine(7)).await),
        ErrorCode::Forbidden
    );
    let e = via_http(&x, A, &calls::QUARANTINE, &[("seq", "seven")], "", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("seq"), "{e:?}");
}

async fn token_create(x: Harness) {
    let made = token(&x, Some("team-a"), &["submit"]).await;
    assert!(made.starts_with("mrd_"), "{made}");
    let req = || wire(json!({"v": 1, "tenant": "team-a", "roles": ["submit"]}));
    assert_eq!(
        code(x.json(Some(&made), Call::TokenCreate(req())).await),
        ErrorCode::Forbidden
    );
    let bad = wire(json!({"v": 1, "tenant": "team-a", "roles": ["sudo"]}));
    let e = x.json(A, Call::TokenCreate(bad)).await.unwrap_err();
    assert_eq!(e.field.as_deref(), Some("roles"), "{e:?}");
}

async fn token_list(x: Harness) {
    let made = token(&x, Some("team-a"), &["watch"]).await;
    let v = x.json(A, Call::TokenList).await.unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert!(
        !v.to_string().contains(&made[made.len() - 8..]),
        "no secret shown"
    );
    assert_eq!(
        code(x.json(Some(&made), Call::TokenList).await),
        ErrorCode::Forbidden
    );
}

async fn token_revoke(x: Harness) {
    let made = token(&x, Some("team-a"), &["watch"]).await;
    let id = made.split('_').nth(1).unwrap().to_owned();
    assert_eq!(
        code(x.json(Some(&made), Call::TokenRevoke(id.clone())).await),
        ErrorCode::Forbidden
    );
    let v = x.json(A, Call::TokenRevoke(id)).await.unwrap();
    assert_eq!(v["revoked"], true, "{v}");
    assert_eq!(
        code(x.json(Some(&made), Call::ListSites).await),
        ErrorCode::Unauthenticated
    );
}

async fn site_revoke(x: Harness) {
    let site = || SiteId::new("site-b").unwrap();
    let tenant = token(&x, Some("team-a"), &["submit"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::SiteRevoke(site())).await),
        ErrorCode::Forbidden
    );
    x.json(A, Call::SiteRevoke(site())).await.unwrap();
    let sites = x.json(A, Call::ListSites).await.unwrap();
    let b = sites
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["site"] == "site-b")
        .unwrap();
    assert_eq!(b["up"], false, "{b}");
}

async fn site_restore(x: Harness) {
    let site = || SiteId::new("site-b").unwrap();
    x.json(A, Call::SiteRevoke(site())).await.unwrap();
    let tenant = token(&x, Some("team-a"), &["submit"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::SiteRestore(site())).await),
        ErrorCode::Forbidden
    );
    x.json(A, Call::SiteRestore(site())).await.unwrap();
}

async fn audit(x: Harness) {
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let refused = x.json(Some(&tenant), Call::TokenList).await;
    assert_eq!(code(refused), ErrorCode::Forbidden);
    let call = || Call::Audit(wire(json!({"v": 1})));
    assert_eq!(
        code(x.json(Some(&tenant), call()).await),
        ErrorCode::Forbidden
    );
    // The audit is written off the caller's path: wait for the refusals to be kept.
    let mut v = Value::Null;
    for _ in 0..100 {
        v = x.json(A, call()).await.unwrap();
        if v.to_string().contains("token_list") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let entries = v["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["action"] == "token_create"), "{v}");
    assert!(
        entries.iter().any(|e| e["action"] == "token_list"
            && e["outcome"].as_str().unwrap().starts_with("refused")),
        "{v}"
    );
}

async fn metrics(x: Harness) {
    let reply = x.call(A, Call::Metrics).await.unwrap();
    assert!(String::from_utf8_lossy(&reply.body).contains("meridian_"));
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let e = x.call(Some(&tenant), Call::Metrics).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Forbidden);
}

async fn session(x: Harness) {
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let v = x.json(Some(&tenant), Call::Session).await.unwrap();
    assert_eq!(
        (v["tenant"].as_str(), v["admin"].as_bool()),
        (Some("team-a"), Some(false))
    );
    assert_eq!(
        code(x.json(Some("mrd_x_y"), Call::Session).await),
        ErrorCode::Unauthenticated
    );
}

async fn version(x: Harness) {
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let v = x.json(Some(&tenant), Call::Version).await.unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["wire"], meridian_federation::WIRE_VERSION);
    assert_eq!(
        code(x.json(None, Call::Version).await),
        ErrorCode::Unauthenticated
    );
}

type Case = fn(Harness) -> Pin<Box<dyn Future<Output = ()>>>;

/// Each call's case.
const CASES: &[(&CallDef, Case)] = &[
    (&calls::SUBMIT, |x| Box::pin(submit(x))),
    (&calls::LIST_JOBS, |x| Box::pin(list_jobs(x))),
    (&calls::QUEUES, |x| Box::pin(queues(x))),
    (&calls::GET_JOB, |x| Box::pin(get_job(x))),
    (&calls::EXPLAIN, |x| Box::pin(explain(x))),
    (&calls::LOGS, |x| Box::pin(logs(x))),
    (&calls::TIMELINE, |x| Box::pin(timeline(x))),
    (&calls::CANCEL, |x| Box::pin(cancel(x))),
    (&calls::LIST_SITES, |x| Box::pin(list_sites(x))),
    (&calls::DRAIN, |x| Box::pin(drain(x))),
    (&calls::SCALE_IN, |x| Box::pin(scale_in(x))),
    (&calls::SERVICE_DEPLOY, |x| Box::pin(service_deploy(x))),
    (&calls::SERVICES, |x| Box::pin(services(x))),
    (&calls::SERVICE_DELETE, |x| Box::pin(service_delete(x))),
    (&calls::SERVICE_ROUTES, |x| Box::pin(service_routes(x))),
    (&calls::SERVICE_ROUTES_WATCH, |x| {
        Box::pin(service_routes_watch(x))
    }),
    (&calls::SERVICE_DEMAND, |x| Box::pin(service_demand(x))),
    (&calls::REPORT, |x| Box::pin(report(x))),
    (&calls::HISTORY, |x| Box::pin(history(x))),
    (&calls::TENANCY, |x| Box::pin(tenancy(x))),
    (&calls::SET_TENANCY, |x| Box::pin(set_tenancy(x))),
    (&calls::FORMAT, |x| Box::pin(format(x))),
    (&calls::UPGRADE_FORMAT, |x| Box::pin(upgrade_format(x))),
    (&calls::QUARANTINE, |x| Box::pin(quarantine(x))),
    (&calls::TOKEN_CREATE, |x| Box::pin(token_create(x))),
    (&calls::TOKEN_LIST, |x| Box::pin(token_list(x))),
    (&calls::TOKEN_REVOKE, |x| Box::pin(token_revoke(x))),
    (&calls::SITE_REVOKE, |x| Box::pin(site_revoke(x))),
    (&calls::SITE_RESTORE, |x| Box::pin(site_restore(x))),
    (&calls::AUDIT, |x| Box::pin(audit(x))),
    (&calls::METRICS, |x| Box::pin(metrics(x))),
    (&calls::SESSION, |x| Box::pin(session(x))),
    (&calls::VERSION, |x| Box::pin(version(x))),
];

/// Every call the table declares has its case, and each passes on a broker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_call_is_tested_through_the_shell() {
    for def in calls::CALLS {
        assert!(
            CASES.iter().any(|(d, _)| std::ptr::eq(*d, *def)),
            "no case for {} ({:?})",
            def.action,
            def.http.first().map(|r| r.path)
        );
    }
    for (def, case) in CASES {
        let x = Harness::start().await.unwrap();
        let path = def.http.first().map_or("", |r| r.path);
        eprintln!("{} {path}", def.action);
        case(x).await;
    }
}
