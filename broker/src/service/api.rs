//! The API's one implementation, served over NATS request-reply and HTTP alike. Every call answers with an
//! [`ApiReply`] body and an HTTP status; bad input gets an error that names the field and the problem.

use super::authz;
use super::{Answer, BrokerHandle, Query};
use bytes::Bytes;
use futures::StreamExt;
use meridian_core::access::{Denied, Principal, Verb};
use meridian_core::reactor::{Event, Response, StepError};
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{
    decode, decode_strict, encode, ApiReply, DrainRequest, Empty, ErrorBody, ErrorCode, JobId,
    JobRef, JobSpec, JobView, LogsReply, LogsRequest, SiteId, WireError, WIRE_VERSION,
};
use serde::Serialize;
use std::time::Duration;

/// One API call, with its input still as received where it needs decoding.
#[derive(Debug)]
pub enum Call {
    Submit(Bytes),
    ListJobs(Bytes),
    /// The live work by queue (`QueuesRequest`).
    Queues(Bytes),
    GetJob(String),
    /// A job, and whether every site is weighed (`all`).
    Explain(String, bool),
    Cancel(String),
    Logs(String, u32),
    Timeline(String),
    ListSites,
    Drain(String, bool),
    ScaleIn(Bytes),
    /// Deploy or replace a service (`ServiceSpec`).
    ServiceDeploy(Bytes),
    /// The services the caller reads, or one (`ServiceRef`).
    Services(Bytes),
    /// Delete a service (`ServiceRef` with a name).
    ServiceDelete(Bytes),
    /// A service's routing table (`ServiceRef` with a name).
    ServiceRoutes(Bytes),
    /// A watch of a service's routing table (`RoutesWatchRequest`), its changes sent to this subject (NATS only).
    ServiceRoutesWatch(Bytes, super::reply::Inbox),
    /// A gateway's demand report (`DemandReport`).
    ServiceDemand(Bytes),
    Report(Bytes),
    /// Jobs submitted in a window, live and archived, for a capacity what-if.
    History(Bytes),
    /// Read the tenancy, or replace it with a tenancy file's text.
    Tenancy(Option<String>),
    /// Read the journal's durable format, or upgrade it to the newest this broker knows.
    Format {
        upgrade: bool,
    },
    /// Set aside the journal message the broker cannot read.
    Quarantine(u64),
    TokenCreate(Bytes),
    TokenList,
    TokenRevoke(String),
    /// Revoke a site, or (`true`) let it back in.
    SiteRevoke(String, bool),
    Audit(Bytes),
    /// The metrics, in the OpenMetrics text format (the body of the reply is that text, not JSON).
    Metrics,
    /// Who the token speaks for (a dashboard's sign-in).
    Session,
}

impl Call {
    /// The call's name in the audit.
    fn action(&self) -> &'static str {
        match self {
            Call::Submit(_) => "submit",
            Call::ListJobs(_) => "list_jobs",
            Call::Queues(_) => "queues",
            Call::GetJob(_) => "get_job",
            Call::Explain(..) => "explain",
            Call::Cancel(_) => "cancel",
            Call::Logs(..) => "logs",
            Call::Timeline(_) => "timeline",
            Call::ListSites => "list_sites",
            Call::Drain(..) => "drain",
            Call::ScaleIn(_) => "scale_in",
            Call::ServiceDeploy(_) => "service_deploy",
            Call::Services(_) => "services",
            Call::ServiceDelete(_) => "service_delete",
            Call::ServiceRoutes(_) => "service_routes",
            Call::ServiceRoutesWatch(..) => "service_routes_watch",
            Call::ServiceDemand(_) => "service_demand",
            Call::Report(_) => "report",
            Call::History(_) => "history",
            Call::Tenancy(_) => "tenancy",
            Call::Format { .. } => "journal_format",
            Call::Quarantine(_) => "journal_quarantine",
            Call::TokenCreate(_) => "token_create",
            Call::TokenList => "token_list",
            Call::TokenRevoke(_) => "token_revoke",
            Call::SiteRevoke(..) => "site_revoke",
            Call::Audit(_) => "audit",
            Call::Metrics => "metrics",
            Call::Session => "session",
        }
    }

    /// Whether the call only reads: the only calls a dashboard's session cookie may make (a change needs the
    /// token in an `Authorization` header, which another site's page cannot make a browser send).
    pub fn reads_only(&self) -> bool {
        match self {
            Call::ListJobs(_)
            | Call::Queues(_)
            | Call::GetJob(_)
            | Call::Explain(..)
            | Call::Logs(..)
            | Call::Timeline(_)
            | Call::ListSites
            | Call::Services(_)
            | Call::ServiceRoutes(_)
            | Call::ServiceRoutesWatch(..)
            | Call::Report(_)
            | Call::History(_)
            | Call::Tenancy(None)
            | Call::Format { upgrade: false }
            | Call::TokenList
            | Call::Audit(_)
            | Call::Metrics
            | Call::Session => true,
            Call::Submit(_)
            | Call::Cancel(_)
            | Call::Drain(..)
            | Call::ScaleIn(_)
            | Call::ServiceDeploy(_)
            | Call::ServiceDelete(_)
            | Call::ServiceDemand(_)
            | Call::Tenancy(Some(_))
            | Call::Format { upgrade: true }
            | Call::Quarantine(_)
            | Call::TokenCreate(_)
            | Call::TokenRevoke(_)
            | Call::SiteRevoke(..) => false,
        }
    }
}

/// The HTTP status and JSON body of a reply.
pub type Reply = (u16, Vec<u8>);

fn ok<T: Serialize>(status: u16, value: T) -> Reply {
    match encode(&ApiReply::ok(value)) {
        Ok(body) => (status, body),
        Err(e) => error(ErrorBody::new(ErrorCode::Internal, None, e.to_string())),
    }
}

pub(super) fn error(body: ErrorBody) -> Reply {
    let status = body.code.http_status();
    let bytes = encode(&ApiReply::<()>::err(body)).unwrap_or_else(|_| b"{}".to_vec());
    (status, bytes)
}

fn wire(e: WireError) -> Reply {
    error(e.to_body())
}

/// A request whose every field is optional: an empty body is the default one, anything else is decoded strictly.
fn optional_body<T>(body: &Bytes) -> Result<T, Reply>
where
    T: Default + serde::de::DeserializeOwned + meridian_federation::validate::Validate,
{
    if body.is_empty() {
        Ok(T::default())
    } else {
        decode_strict::<T>(body).map_err(wire)
    }
}

/// A listing or report of one tenant or all: a tenant's token is held to its own tenant (naming another is
/// refused, saying `what`); an administrator and a federation-wide viewer may name any tenant, or none.
fn scope_to_own_tenant(
    who: &Principal,
    tenant: &mut Option<meridian_federation::TenantId>,
    what: &str,
) -> Result<(), Reply> {
    if let (false, Some(own)) = (who.admin, &who.tenant) {
        if let Some(asked) = tenant.as_ref().filter(|asked| *asked != own) {
            return Err(denied(Denied::Forbidden(format!(
                "token {} acts for tenant {own}; it cannot read tenant {asked}'s {what}",
                who.id
            ))));
        }
        *tenant = Some(own.clone());
    }
    Ok(())
}

/// The tenant and name of a `ServiceRef` that must name one service: a tenant's token names its own tenant.
fn named_service(
    who: &Principal,
    body: &Bytes,
) -> Result<
    (
        meridian_federation::TenantId,
        meridian_federation::ServiceName,
    ),
    Reply,
> {
    let mut r = decode_strict::<meridian_federation::ServiceRef>(body).map_err(wire)?;
    scope_to_own_tenant(who, &mut r.tenant, "services")?;
    let bad = |field: &str, problem: &str| {
        error(ErrorBody::new(
            ErrorCode::Invalid,
            Some(field.to_owned()),
            problem.to_owned(),
        ))
    };
    let tenant = r
        .tenant
        .ok_or_else(|| bad("tenant", "name the service's tenant"))?;
    let name = r.name.ok_or_else(|| bad("name", "name the service"))?;
    Ok((tenant, name))
}

/// Services the caller reads (one when `name` is given), from the reactor task.
async fn service_views(
    h: &BrokerHandle,
    who: &Principal,
    tenant: Option<meridian_federation::TenantId>,
    name: Option<meridian_federation::ServiceName>,
    deployed: bool,
) -> Result<Vec<meridian_federation::ServiceView>, StepError> {
    ask(h, |reply| super::services::ServiceCall::Show {
        tenant,
        name,
        who: who.clone(),
        deployed,
        reply,
    })
    .await
}

/// Sends a call on services to the reactor task and waits for its answer.
async fn ask<T>(
    h: &BrokerHandle,
    call: impl FnOnce(
        tokio::sync::oneshot::Sender<Result<T, StepError>>,
    ) -> super::services::ServiceCall,
) -> Result<T, StepError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    h.services(call(tx));
    rx.await.unwrap_or_else(|_| {
        Err(StepError::Journal(
            meridian_core::journal::JournalError::Unavailable("broker is stopping".into()),
        ))
    })
}

/// The reply to a change that stops replicas (scale-in, a service deleted).
fn stopping(r: Result<Response, StepError>) -> Reply {
    match r {
        Ok(Response::Stopping(stopping)) => ok(200, meridian_federation::ScaleInReply { stopping }),
        Ok(other) => error(ErrorBody::new(
            ErrorCode::Internal,
            None,
            format!("unexpected {other:?}"),
        )),
        Err(e) => step_error(e),
    }
}

fn step_error(e: StepError) -> Reply {
    error(ErrorBody::new(e.code(), e.field(), e.to_string()))
}

fn not_found(what: String) -> Reply {
    error(ErrorBody::new(
        ErrorCode::NotFound,
        None,
        format!("{what} not found"),
    ))
}

fn unavailable() -> Reply {
    error(ErrorBody::new(
        ErrorCode::Unavailable,
        None,
        "broker is stopping",
    ))
}

fn job_id(s: &str) -> Result<JobId, Reply> {
    JobId::new(s).map_err(|p| {
        error(ErrorBody::new(
            ErrorCode::Invalid,
            Some("job".into()),
            p.to_string(),
        ))
    })
}

/// Carries out one call for the caller a bearer token names: authenticated, rate-limited, then judged by
/// the caller's permissions. Every refusal is audited.
pub async fn call(h: &BrokerHandle, bearer: Option<&str>, c: Call) -> Reply {
    call_from(h, bearer, None, c).await
}

/// [`call`], from a NATS identity (`None`: over HTTP).
pub async fn call_from(
    h: &BrokerHandle,
    bearer: Option<&str>,
    identity: Option<&str>,
    c: Call,
) -> Reply {
    let now = super::now_ms();
    let action = c.action();
    let who = match h.auth.authenticate(bearer, now) {
        Ok(p) => p,
        Err(e) => {
            let stranger = identity.map_or_else(|| "anonymous".to_owned(), |i| format!("nats:{i}"));
            if let Err(wait) = h.auth.admit_stranger(&stranger) {
                h.audit.refused(now, &stranger, action, "rate limited");
                return error(super::auth::slow_down(wait, &stranger));
            }
            h.audit.refused(now, &stranger, action, &e.message);
            return error(e);
        }
    };
    if let Err(wait) = h.auth.admit(&who) {
        h.audit.refused(now, &who.id, action, "rate limited");
        let whose = who
            .tenant
            .as_ref()
            .map_or_else(|| who.id.clone(), |t| format!("tenant {t}"));
        return error(super::auth::slow_down(wait, &whose));
    }
    let reply = call_as(h, &who, c).await;
    // Refusals of changes are audited in the reactor task; those of reads here.
    if matches!(reply.0, 401 | 403 | 404) && !changes(action) {
        let why = decode::<ApiReply<()>>(&reply.1)
            .ok()
            .and_then(|r| r.into_result().err())
            .map(|e| e.message)
            .unwrap_or_default();
        if reply.0 != 404 || !who.admin {
            h.audit.refused(now, &who.id, action, &why);
        }
    }
    reply
}

/// Calls that change state (their refusals are audited with the change).
fn changes(action: &str) -> bool {
    matches!(
        action,
        "submit"
            | "cancel"
            | "drain"
            | "scale_in"
            | "service_deploy"
            | "service_delete"
            | "token_create"
            | "token_revoke"
            | "site_revoke"
    )
}

fn denied(d: Denied) -> Reply {
    match d {
        Denied::Hidden(what) => not_found(what),
        Denied::Forbidden(why) => error(ErrorBody::new(ErrorCode::Forbidden, None, why)),
    }
}

/// Whether the caller may read a job (as a view says it is): another tenant's is "not found".
fn may_watch(who: &Principal, v: &JobView) -> Result<(), Reply> {
    who.may(
        Verb::Watch,
        &v.tenant,
        authz::queue_of(v.queue.as_ref()),
        &format!("job {}", v.job),
    )
    .map_err(denied)
}

/// A job's view, live or archived, if the caller may read it.
async fn watched_job(h: &BrokerHandle, who: &Principal, id: &JobId) -> Result<JobView, Reply> {
    let view = match h.query(Query::Job(id.clone())).await {
        Some(Answer::Job(Some(v))) => v,
        Some(_) => match h.archive.job(id).await {
            Ok(Some(a)) => a.view,
            Ok(None) => return Err(not_found(format!("job {id}"))),
            Err(e) => return Err(archive_unavailable(e)),
        },
        None => return Err(unavailable()),
    };
    may_watch(who, &view)?;
    Ok(view)
}

async fn call_as(h: &BrokerHandle, who: &Principal, c: Call) -> Reply {
    let c_kind = c.action();
    match c {
        Call::Submit(body) => {
            let spec = match decode_strict::<JobSpec>(&body) {
                Ok(s) => s,
                Err(e) => return wire(e),
            };
            match h.step_as(who, Event::Submit(spec)).await {
                Ok(Response::Submitted(r)) => ok(if r.created { 201 } else { 200 }, r),
                Ok(other) => error(ErrorBody::new(
                    ErrorCode::Internal,
                    None,
                    format!("unexpected {other:?}"),
                )),
                Err(e) => step_error(e),
            }
        }
        Call::Report(body) => {
            let mut req = match decode_strict::<meridian_federation::ReportRequest>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            if let Err(reply) = scope_to_own_tenant(who, &mut req.tenant, "report") {
                return reply;
            }
            let may = match &req.tenant {
                Some(t) => who.may_for_tenant(Verb::Report, t),
                None if who.admin || who.grants.iter().any(|g| g.verb == Verb::Report) => Ok(()),
                None => Err(Denied::Forbidden(format!(
                    "token {} lacks the permission `report`",
                    who.id
                ))),
            };
            if let Err(d) = may {
                return denied(d);
            }
            match h.query(Query::Ledger).await {
                Some(Answer::Ledger(mut entries)) => match h.archive.ledger().await {
                    Ok((archived, unreadable)) => {
                        entries.extend(archived);
                        let mut report = meridian_core::ledger::report(&entries, &req);
                        report.unreadable = unreadable;
                        ok(200, report)
                    }
                    Err(e) => archive_unavailable(e),
                },
                _ => unavailable(),
            }
        }
        Call::Tenancy(toml) => {
            let checked = match &toml {
                Some(_) => who.must_be_admin("changing the tenancy"),
                None => who.must_read_all("reading the tenancy"),
            };
            if let Err(d) = checked {
                return denied(d);
            }
            if let Some(toml) = toml {
                let event = Event::SetTenancy {
                    toml,
                    from_file: false,
                };
                if let Err(e) = h.step_as(who, event).await {
                    return step_error(e);
                }
            }
            match h.query(Query::Tenancy).await {
                Some(Answer::Tenancy(toml)) => ok(200, meridian_federation::TenancyView { toml }),
                _ => unavailable(),
            }
        }
        Call::Format { upgrade } => {
            let checked = if upgrade {
                who.must_be_admin("upgrading the journal's format")
            } else {
                who.must_read_all("reading the journal's format")
            };
            if let Err(d) = checked {
                return denied(d);
            }
            let newest = meridian_core::durable::FORMAT_VERSION;
            if upgrade {
                if let Err(e) = h.step_as(who, Event::UpgradeFormat { to: newest }).await {
                    return step_error(e);
                }
            }
            format_view(h).await
        }
        Call::Quarantine(seq) => {
            if let Err(d) = who.must_be_admin("setting a journal message aside") {
                return denied(d);
            }
            if let Err(why) = h.quarantine(who, seq).await {
                return error(ErrorBody::new(
                    ErrorCode::Conflict,
                    Some("seq".into()),
                    format!("{why:#}"),
                ));
            }
            format_view(h).await
        }
        Call::ListJobs(body) => {
            let mut req = match optional_body::<meridian_federation::JobListRequest>(&body) {
                Ok(r) => r,
                Err(reply) => return reply,
            };
            if let Err(reply) = scope_to_own_tenant(who, &mut req.tenant, "jobs") {
                return reply;
            }
            if let (false, Some(t)) = (who.admin, &req.tenant) {
                if let Err(d) = who.may_for_tenant(Verb::Watch, t) {
                    return denied(d);
                }
            }
            list_jobs(h, who, req).await
        }
        Call::Queues(body) => {
            let mut req = match optional_body::<meridian_federation::QueuesRequest>(&body) {
                Ok(r) => r,
                Err(reply) => return reply,
            };
            if let Err(reply) = scope_to_own_tenant(who, &mut req.tenant, "queues") {
                return reply;
            }
            match h.query(Query::Queues(req, who.clone())).await {
                Some(Answer::Queues(v)) => ok(200, v),
                _ => unavailable(),
            }
        }
        Call::GetJob(id) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            match watched_job(h, who, &id).await {
                Ok(v) => ok(200, v),
                Err(r) => r,
            }
        }
        Call::Explain(id, all) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            if let Err(r) = watched_job(h, who, &id).await {
                return r;
            }
            match h.query(Query::Explain(id.clone(), all)).await {
                Some(Answer::Explain(Some(v))) => ok(200, v),
                Some(_) => match h.archive.job(&id).await {
                    Ok(Some(a)) => ok(200, a.explain),
                    Ok(None) => not_found(format!("job {id}")),
                    Err(e) => archive_unavailable(e),
                },
                None => unavailable(),
            }
        }
        Call::Cancel(id) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            match h.step_as(who, Event::Cancel(id.clone())).await {
                Ok(_) => match h.query(Query::Job(id.clone())).await {
                    Some(Answer::Job(Some(v))) => ok(200, v),
                    _ => not_found(format!("job {id}")),
                },
                Err(e) => step_error(e),
            }
        }
        Call::Logs(id, lines) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            if let Err(r) = watched_job(h, who, &id).await {
                return r;
            }
            match fetch_logs(h, id, lines).await {
                Ok(r) => ok(200, r),
                Err(r) => r,
            }
        }
        Call::Timeline(id) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            if let Err(r) = watched_job(h, who, &id).await {
                return r;
            }
            let mut t = match h.query(Query::Timeline(id.clone())).await {
                Some(Answer::Timeline(Some(t))) => t,
                Some(_) => match h.archive.job(&id).await {
                    Ok(Some(a)) => meridian_core::views::timeline(&a.job),
                    Ok(None) => return not_found(format!("job {id}")),
                    Err(e) => return archive_unavailable(e),
                },
                None => return unavailable(),
            };
            match fetch_logs(h, id, TIMELINE_LOG_LINES).await {
                Ok(r) => t.log_tail = Some(r.text),
                Err((_, body)) => {
                    t.log_error = decode::<ApiReply<()>>(&body)
                        .ok()
                        .and_then(|r| r.into_result().err())
                        .map(|e| e.message);
                }
            }
            ok(200, t)
        }
        Call::ListSites => match h.query(Query::Sites).await {
            Some(Answer::Sites(v)) => ok(200, v),
            _ => unavailable(),
        },
        Call::ScaleIn(body) => {
            let r = match decode_strict::<meridian_federation::ScaleInRequest>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            let event = Event::ScaleIn {
                tenant: r.tenant,
                service: r.service,
                remove: r.remove,
            };
            stopping(h.step_as(who, event).await)
        }
        Call::ServiceDeploy(body) => {
            let spec = match decode_strict::<meridian_federation::ServiceSpec>(&body) {
                Ok(s) => s,
                Err(e) => return wire(e),
            };
            let (tenant, name) = (spec.tenant.clone(), spec.name.clone());
            if let Err(e) = h.step_as(who, Event::ServiceDeployed(spec)).await {
                return step_error(e);
            }
            match service_views(h, who, Some(tenant), Some(name), true).await {
                Ok(mut v) if !v.is_empty() => ok(200, v.swap_remove(0)),
                Ok(_) => unavailable(),
                Err(e) => step_error(e),
            }
        }
        Call::Services(body) => {
            let mut r = match decode_strict::<meridian_federation::ServiceRef>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            if let Err(reply) = scope_to_own_tenant(who, &mut r.tenant, "services") {
                return reply;
            }
            let one = r.name.is_some();
            match service_views(h, who, r.tenant, r.name, false).await {
                Ok(mut v) if one && !v.is_empty() => ok(200, v.swap_remove(0)),
                Ok(v) => ok(200, v),
                Err(e) => step_error(e),
            }
        }
        Call::ServiceDelete(body) | Call::ServiceRoutes(body) => {
            let routes = matches!(c_kind, "service_routes");
            let (tenant, name) = match named_service(who, &body) {
                Ok(x) => x,
                Err(reply) => return reply,
            };
            if routes {
                let routes = ask(h, |reply| super::services::ServiceCall::Routes {
                    tenant,
                    name,
                    who: who.clone(),
                    reply,
                })
                .await;
                return routes.map_or_else(step_error, |v| ok(200, v));
            }
            let event = Event::ServiceDeleted {
                tenant,
                service: name,
            };
            stopping(h.step_as(who, event).await)
        }
        Call::ServiceRoutesWatch(body, deliver) => {
            let mut r = match decode_strict::<meridian_federation::RoutesWatchRequest>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            if let Err(reply) = scope_to_own_tenant(who, &mut r.tenant, "services") {
                return reply;
            }
            let Some(tenant) = r.tenant else {
                return error(ErrorBody::new(
                    ErrorCode::Invalid,
                    Some("tenant".into()),
                    "name the service's tenant",
                ));
            };
            let watch = ask(h, |reply| super::services::ServiceCall::Watch {
                tenant,
                name: r.name,
                who: who.clone(),
                deliver,
                lease_ms: r.lease_s * 1000,
                reply,
            })
            .await;
            watch.map_or_else(step_error, |v| ok(200, v))
        }
        Call::ServiceDemand(body) => {
            let report = match decode_strict::<meridian_federation::DemandReport>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            let taken = ask(h, |reply| super::services::ServiceCall::Demand {
                report,
                who: who.clone(),
                reply,
            })
            .await;
            taken.map_or_else(step_error, |()| {
                ok(
                    200,
                    meridian_federation::Empty {
                        v: meridian_federation::WIRE_VERSION,
                    },
                )
            })
        }
        Call::Drain(site, drain) => {
            let site = match SiteId::new(site) {
                Ok(s) => s,
                Err(p) => {
                    return error(ErrorBody::new(
                        ErrorCode::Invalid,
                        Some("site".into()),
                        p.to_string(),
                    ))
                }
            };
            let event = Event::Drain {
                site: site.clone(),
                drain,
            };
            match h.step_as(who, event).await {
                Ok(_) => match h.query(Query::Sites).await {
                    Some(Answer::Sites(v)) => match v.into_iter().find(|s| s.site == site) {
                        Some(s) => ok(200, s),
                        None => not_found(format!("site {site}")),
                    },
                    _ => unavailable(),
                },
                Err(e) => step_error(e),
            }
        }
        Call::TokenCreate(body) => {
            let req = match decode_strict::<meridian_federation::TokenCreateRequest>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            create_token(h, who, req).await
        }
        Call::TokenList => {
            if let Err(d) = who.must_read_all("listing API tokens") {
                return denied(d);
            }
            match h.query(Query::Tokens).await {
                Some(Answer::Tokens(tokens)) => {
                    ok(200, tokens.iter().map(token_view).collect::<Vec<_>>())
                }
                _ => unavailable(),
            }
        }
        Call::TokenRevoke(id) => {
            match h.step_as(who, Event::TokenRevoked { id: id.clone() }).await {
                Ok(_) => match h.query(Query::Tokens).await {
                    Some(Answer::Tokens(tokens)) => match tokens.iter().find(|t| t.id == id) {
                        Some(t) => ok(200, token_view(t)),
                        None => not_found(format!("token {id}")),
                    },
                    _ => unavailable(),
                },
                Err(e) => step_error(e),
            }
        }
        Call::SiteRevoke(site, restore) => {
            let site = match SiteId::new(site) {
                Ok(s) => s,
                Err(p) => {
                    return error(ErrorBody::new(
                        ErrorCode::Invalid,
                        Some("site".into()),
                        p.to_string(),
                    ))
                }
            };
            let event = if restore {
                Event::SiteRestored { site }
            } else {
                Event::SiteRevoked { site }
            };
            match h.step_as(who, event).await {
                Ok(_) => ok(200, Empty { v: WIRE_VERSION }),
                Err(e) => step_error(e),
            }
        }
        Call::Session => ok(
            200,
            meridian_federation::SessionView {
                who: who.id.clone(),
                tenant: who.tenant.clone(),
                admin: who.admin,
            },
        ),
        Call::History(body) => {
            if let Err(d) = who.must_read_all("reading the job history") {
                return denied(d);
            }
            let req = match optional_body::<meridian_federation::HistoryRequest>(&body) {
                Ok(r) => r,
                Err(reply) => return reply,
            };
            let from = req.from_ms.unwrap_or(0);
            match h.query(Query::History(from)).await {
                Some(Answer::History(mut jobs, tenancy_toml, sites)) => {
                    let live: std::collections::BTreeSet<JobId> =
                        jobs.iter().map(|j| j.job.clone()).collect();
                    let scanned = h
                        .archive
                        .scan(0, |a| {
                            if a.job.submitted_ms >= from && !live.contains(&a.job.id) {
                                jobs.push(meridian_core::views::history_job(&a.job));
                            }
                            true
                        })
                        .await;
                    if let Err(e) = scanned {
                        return archive_unavailable(e);
                    }
                    jobs.sort_by(|a, b| (a.submitted_ms, &a.job).cmp(&(b.submitted_ms, &b.job)));
                    ok(
                        200,
                        meridian_federation::HistoryView {
                            now_ms: super::now_ms(),
                            tenancy_toml,
                            jobs,
                            federation: Some(meridian_federation::FederationView {
                                rtt: h.tables.rtt_touching(
                                    &sites
                                        .iter()
                                        .filter_map(|s| s.info.rtt_region.as_deref())
                                        .collect(),
                                ),
                                sites,
                                regions: h.tables.regions.clone(),
                                throughput_toml: h.tables.throughput_toml.clone(),
                            }),
                        },
                    )
                }
                _ => unavailable(),
            }
        }
        Call::Metrics => {
            if let Err(d) = who.must_read_all("reading the metrics") {
                return denied(d);
            }
            match h.query(Query::Gauges).await {
                Some(Answer::Gauges(g)) => {
                    (200, h.metrics.render(&g, super::now_ms()).into_bytes())
                }
                _ => unavailable(),
            }
        }
        Call::Audit(body) => {
            if let Err(d) = who.must_read_all("reading the audit") {
                return denied(d);
            }
            let req = match optional_body::<meridian_federation::AuditRequest>(&body) {
                Ok(r) => r,
                Err(reply) => return reply,
            };
            match h.audit.read(&req).await {
                Ok(page) => ok(200, page),
                Err(e) => error(ErrorBody::new(
                    ErrorCode::Unavailable,
                    None,
                    format!("the audit could not be read: {e:#}"),
                )),
            }
        }
    }
}

/// The journal's format, and the message that keeps the broker read-only if one does.
async fn format_view(h: &BrokerHandle) -> Reply {
    match h.query(Query::Format).await {
        Some(Answer::Format(format, unreadable)) => ok(
            200,
            meridian_federation::FormatView {
                format,
                newest: meridian_core::durable::FORMAT_VERSION,
                unreadable: unreadable
                    .map(|(seq, reason)| meridian_federation::UnreadableView { seq, reason }),
            },
        ),
        _ => unavailable(),
    }
}

/// Tokens live 90 days unless asked otherwise, at most two years.
const TOKEN_DEFAULT_S: u64 = 90 * 24 * 3600;
const TOKEN_MAX_S: u64 = 2 * 365 * 24 * 3600;

/// Makes a token: a new id and secret; only the secret's hash is journaled. The reply shows the token once.
async fn create_token(
    h: &BrokerHandle,
    who: &Principal,
    req: meridian_federation::TokenCreateRequest,
) -> Reply {
    use meridian_core::access::{parse_role, Role, TokenRecord};
    let bad = |field: &str, why: String| {
        error(ErrorBody::new(ErrorCode::Invalid, Some(field.into()), why))
    };
    let mut admin = false;
    let mut grants = Vec::new();
    for r in &req.roles {
        match parse_role(r) {
            Ok(Role::Admin) => admin = true,
            Ok(Role::Grants(g)) => grants.extend(g),
            Err(e) => return bad("roles", e.to_string()),
        }
    }
    if admin && req.tenant.is_some() {
        return bad(
            "tenant",
            "an administrator's token acts for every tenant: leave the tenant out".into(),
        );
    }
    if !admin && req.tenant.is_none() && !meridian_core::access::reads_only(&grants) {
        return bad(
            "tenant",
            "a token that is not an administrator's acts for one tenant (name it), unless it only reads: \
             `--role viewer` without a tenant is a federation-wide viewer"
                .into(),
        );
    }
    let life = req.expires_in_s.unwrap_or(TOKEN_DEFAULT_S);
    if life == 0 || life > TOKEN_MAX_S {
        return bad(
            "expires_in_s",
            format!("must be between 1 s and {TOKEN_MAX_S} s (two years)"),
        );
    }
    let (id, secret, token) = match super::auth::new_token() {
        Ok(t) => t,
        Err(e) => return error(ErrorBody::new(ErrorCode::Internal, None, e.to_string())),
    };
    let now = super::now_ms();
    let record = TokenRecord {
        id,
        name: req.name.unwrap_or_default(),
        hash: super::auth::hash_secret(&secret),
        tenant: req.tenant,
        admin,
        grants,
        created_ms: now,
        expires_ms: now.saturating_add(life.saturating_mul(1000)),
        created_by: who.id.clone(),
        revoked_ms: None,
    };
    let view = token_view(&record);
    match h.step_as(who, Event::TokenCreated(record)).await {
        Ok(_) => ok(201, meridian_federation::TokenCreated { token, view }),
        Err(e) => step_error(e),
    }
}

/// How the API shows a token: never its secret or hash.
fn token_view(t: &meridian_core::access::TokenRecord) -> meridian_federation::TokenView {
    let mut roles: Vec<String> = t
        .grants
        .iter()
        .map(|g| {
            // Queues, or a gateway's services: what the role was written with.
            let names: Vec<&str> = g
                .queues
                .iter()
                .map(|q| q.as_str())
                .chain(g.services.iter().map(|s| s.as_str()))
                .collect();
            if names.is_empty() {
                g.verb.as_str().to_owned()
            } else {
                format!("{}:{}", g.verb.as_str(), names.join(","))
            }
        })
        .collect();
    if t.admin {
        roles.insert(0, "admin".into());
    }
    meridian_federation::TokenView {
        id: t.id.clone(),
        name: t.name.clone(),
        tenant: t.tenant.clone(),
        roles,
        created_ms: t.created_ms,
        expires_ms: t.expires_ms,
        created_by: t.created_by.clone(),
        revoked: t.revoked_ms.is_some(),
    }
}

fn archive_unavailable(e: anyhow::Error) -> Reply {
    error(ErrorBody::new(
        ErrorCode::Unavailable,
        None,
        format!("the archive could not be read: {e:#}"),
    ))
}

/// The page size when the request names none.
const DEFAULT_PAGE: usize = 500;
/// A page stops before its body reaches this, well under NATS's 1 MiB payload limit.
const PAGE_BYTES: usize = 768 * 1024;

/// One page of jobs: live ones by id, then archived ones in archive order (see [`JobListRequest`]). The cursor
/// is `live:<job>` or `archived:<sequence>`.
///
/// [`JobListRequest`]: meridian_federation::JobListRequest
async fn list_jobs(
    h: &BrokerHandle,
    who: &Principal,
    req: meridian_federation::JobListRequest,
) -> Reply {
    use meridian_federation::{JobPage, JobScope};
    let limit = req.limit.map_or(DEFAULT_PAGE, |l| l as usize);
    enum At {
        Live(Option<JobId>),
        Archived(u64),
    }
    let bad_cursor = || {
        error(ErrorBody::new(
            ErrorCode::Invalid,
            Some("cursor".into()),
            "not a cursor this broker gave: expected live:<job> or archived:<sequence>",
        ))
    };
    let first_archived = if req.newest_first { NEWEST_ARCHIVED } else { 1 };
    let mut at = match req.cursor.as_deref() {
        None if req.scope == JobScope::Archived => At::Archived(first_archived),
        None => At::Live(None),
        Some(c) => match c.split_once(':') {
            Some(("live", id)) => match JobId::new(id) {
                Ok(id) => At::Live(Some(id)),
                Err(_) => return bad_cursor(),
            },
            Some(("archived", seq)) => match seq.parse() {
                Ok(seq) => At::Archived(seq),
                Err(_) => return bad_cursor(),
            },
            _ => return bad_cursor(),
        },
    };
    let mut page = JobPage::default();
    let mut bytes = 0usize;
    let fits = |v: &meridian_federation::JobView, bytes: &mut usize| {
        *bytes += serde_json::to_vec(v).map_or(0, |b| b.len() + 1);
        *bytes < PAGE_BYTES
    };
    if let At::Live(after) = &at {
        let Some(Answer::JobsPage(jobs, more)) = h
            .query(Query::JobsPage {
                after: after.clone(),
                limit,
                filter: req.clone(),
                who: who.clone(),
            })
            .await
        else {
            return unavailable();
        };
        let n = jobs.len();
        for v in jobs {
            if !fits(&v, &mut bytes) {
                break;
            }
            page.jobs.push(v);
        }
        if page.jobs.len() < n || more {
            page.next = page.jobs.last().map(|v| format!("live:{}", v.job));
            return ok(200, page);
        }
        if req.scope == JobScope::Live {
            return ok(200, page);
        }
        at = At::Archived(first_archived);
    }
    if let At::Archived(from) = at {
        let want = limit - page.jobs.len();
        if want == 0 {
            page.next = Some(format!("archived:{from}"));
            return ok(200, page);
        }
        let mut taken = 0;
        let keep = |a: super::archive::Archived| {
            let v = a.view;
            if req.passes(&v) && may_watch(who, &v).is_ok() {
                if !fits(&v, &mut bytes) {
                    return false;
                }
                page.jobs.push(v);
                taken += 1;
            }
            taken < want
        };
        let scanned = if req.newest_first {
            h.archive
                .scan_back((from != NEWEST_ARCHIVED).then_some(from), keep)
                .await
        } else {
            h.archive.scan(from, keep).await
        };
        match scanned {
            Ok(next) => page.next = next.map(|seq| format!("archived:{seq}")),
            Err(e) => return archive_unavailable(e),
        }
    }
    ok(200, page)
}

/// The archive cursor of a newest-first listing that has not read the archive yet: its newest message.
const NEWEST_ARCHIVED: u64 = u64::MAX;

/// Lines of the log a timeline shows.
const TIMELINE_LOG_LINES: u32 = 20;

/// Fetches a job's log tail from the agent of the site its latest attempt ran on.
async fn fetch_logs(h: &BrokerHandle, id: JobId, lines: u32) -> Result<LogsReply, Reply> {
    let Some(Answer::Placement(placement)) = h.query(Query::Placement(id.clone())).await else {
        return Err(unavailable());
    };
    let placement = match placement {
        Some(p) => Some(p),
        None => match h.archive.job(&id).await {
            Ok(a) => a.and_then(|a| Some((a.view.site?, a.view.attempt)).filter(|(_, n)| *n > 0)),
            Err(e) => return Err(archive_unavailable(e)),
        },
    };
    let Some((site, attempt)) = placement else {
        return Err(not_found(format!("a started attempt of job {id}")));
    };
    let req = LogsRequest {
        v: WIRE_VERSION,
        job: id,
        attempt,
        lines: lines.clamp(1, 10_000),
    };
    let Ok(body) = encode(&req) else {
        return Err(unavailable());
    };
    let asked = h
        .client
        .request(subjects::site(&site, SiteTopic::Logs), Bytes::from(body));
    match tokio::time::timeout(Duration::from_secs(3), asked).await {
        Ok(Ok(m)) => match decode::<LogsReply>(&m.payload) {
            Ok(r) => Ok(r),
            Err(_) => match decode::<ApiReply<()>>(&m.payload).map(ApiReply::into_result) {
                Ok(Err(e)) => Err(error(e)),
                _ => Err(error(ErrorBody::new(
                    ErrorCode::Internal,
                    None,
                    "unreadable answer from the agent",
                ))),
            },
        },
        _ => Err(error(ErrorBody::new(
            ErrorCode::Unavailable,
            None,
            format!("site {site} did not answer for the logs"),
        ))),
    }
}

/// Serves the NATS request-reply API until the subscription ends. Each request is answered on its own task,
/// and only into the inbox of the identity whose subject it came on (see [`super::reply`]).
pub async fn serve_nats(h: BrokerHandle, mut sub: async_nats::Subscriber) {
    while let Some(m) = sub.next().await {
        let Some((identity, call_name)) = subjects::api::parse(m.subject.as_str()) else {
            continue;
        };
        let (identity, call_name) = (identity.to_owned(), call_name.to_owned());
        let who = format!("nats:{identity}");
        // Named in the audit and the metrics only as a call there is, so that made-up names neither
        // defeat the counting of refusals nor grow the metrics without bound.
        let known = subjects::api::CALLS
            .into_iter()
            .find(|c| *c == call_name)
            .unwrap_or("unknown_call");
        let Some(to) = super::reply::inbox(
            &h,
            &identity,
            &who,
            known,
            m.reply.as_ref().map(|r| r.as_str()),
        ) else {
            continue;
        };
        let h = h.clone();
        tokio::spawn(async move {
            let header = m
                .headers
                .as_ref()
                .and_then(|hs| hs.get(crate::client::AUTHORIZATION))
                .map(|v| v.as_str().to_owned());
            let (_, body) = match nats_call(&call_name, m.payload, &to) {
                Ok((c, body_token)) => {
                    let bearer = header
                        .as_deref()
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .or(body_token.as_deref());
                    call_from(&h, bearer, Some(&identity), c).await
                }
                Err(r) => r,
            };
            super::reply::send(&h.client, &to, body).await;
        });
    }
}

/// The call a NATS request makes, and a token its body carried (clients of the previous release sent the
/// administrator's token in the body of the tenancy and format calls; the `Authorization` header is the way).
fn nats_call(
    subject: &str,
    payload: Bytes,
    reply_to: &super::reply::Inbox,
) -> Result<(Call, Option<String>), Reply> {
    use subjects::api;
    let job = |p: &Bytes| {
        decode_strict::<JobRef>(p)
            .map(|r| r.job.to_string())
            .map_err(wire)
    };
    let call = match subject {
        api::TENANCY => {
            let r = decode_strict::<meridian_federation::TenancyRequest>(&payload).map_err(wire)?;
            return Ok((Call::Tenancy(r.toml), r.token));
        }
        api::JOURNAL_FORMAT => {
            let r = decode_strict::<meridian_federation::FormatRequest>(&payload).map_err(wire)?;
            let call = match r.quarantine {
                Some(seq) => Call::Quarantine(seq),
                None => Call::Format { upgrade: r.upgrade },
            };
            return Ok((call, r.token));
        }
        api::SUBMIT => Call::Submit(payload),
        api::REPORT => Call::Report(payload),
        api::HISTORY => Call::History(payload),
        api::TOKEN_CREATE => Call::TokenCreate(payload),
        api::TOKEN_LIST => {
            empty(&payload)?;
            Call::TokenList
        }
        api::TOKEN_REVOKE => {
            let r =
                decode_strict::<meridian_federation::TokenRevokeRequest>(&payload).map_err(wire)?;
            Call::TokenRevoke(r.id)
        }
        api::SITE_REVOKE => {
            let r =
                decode_strict::<meridian_federation::SiteRevokeRequest>(&payload).map_err(wire)?;
            Call::SiteRevoke(r.site.to_string(), r.restore)
        }
        api::AUDIT => Call::Audit(payload),
        api::LIST_JOBS => Call::ListJobs(payload),
        api::QUEUES => Call::Queues(payload),
        api::GET_JOB => Call::GetJob(job(&payload)?),
        api::EXPLAIN => {
            let r = decode_strict::<meridian_federation::ExplainRequest>(&payload).map_err(wire)?;
            Call::Explain(r.job.to_string(), r.all)
        }
        api::CANCEL => Call::Cancel(job(&payload)?),
        api::LOGS => Call::Logs(job(&payload)?, 100),
        api::TIMELINE => Call::Timeline(job(&payload)?),
        api::LIST_SITES => {
            empty(&payload)?;
            Call::ListSites
        }
        api::SCALE_IN => Call::ScaleIn(payload),
        api::SERVICE_DEPLOY => Call::ServiceDeploy(payload),
        api::SERVICE_LIST | api::SERVICE_SHOW => Call::Services(payload),
        api::SERVICE_DELETE => Call::ServiceDelete(payload),
        api::SERVICE_ROUTES => Call::ServiceRoutes(payload),
        api::SERVICE_ROUTES_WATCH => Call::ServiceRoutesWatch(payload, reply_to.clone()),
        api::SERVICE_DEMAND => Call::ServiceDemand(payload),
        api::DRAIN => {
            let d = decode_strict::<DrainRequest>(&payload).map_err(wire)?;
            Call::Drain(d.site.to_string(), d.drain)
        }
        other => {
            return Err(error(ErrorBody::new(
                ErrorCode::NotFound,
                None,
                format!("no API call {other:?} (the subject is meridian.v1.api.<identity>.<call>)"),
            )))
        }
    };
    Ok((call, None))
}

fn empty(payload: &Bytes) -> Result<(), Reply> {
    if payload.is_empty() {
        return Ok(());
    }
    decode_strict::<Empty>(payload).map(|_| ()).map_err(wire)
}
