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

mod admin;
mod jobs;
mod services;
use admin::*;
use jobs::*;
use services::*;

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
