//! The API's one implementation, served over NATS request-reply and HTTP alike. Every call answers with an
//! [`ApiReply`] body and an HTTP status; bad input gets an error that names the field and the problem.

use super::{Answer, BrokerHandle, Query};
use bytes::Bytes;
use futures::StreamExt;
use meridian_core::reactor::{Event, Response, StepError};
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{
    decode, decode_strict, encode, ApiReply, DrainRequest, Empty, ErrorBody, ErrorCode, JobId,
    JobRef, JobSpec, LogsReply, LogsRequest, SiteId, WireError, WIRE_VERSION,
};
use serde::Serialize;
use std::time::Duration;

/// One API call, with its input still as received where it needs decoding.
#[derive(Debug)]
pub enum Call {
    Submit(Bytes),
    ListJobs(Bytes),
    GetJob(String),
    Explain(String),
    Cancel(String),
    Logs(String, u32),
    ListSites,
    Drain(String, bool),
    ScaleIn(Bytes),
    Report(Bytes),
    /// Read or replace the tenancy: the caller's token, and the new tenancy file's text.
    Tenancy {
        token: Option<String>,
        toml: Option<String>,
    },
    /// Read the journal's durable format, or upgrade it to the newest this broker knows.
    Format {
        token: Option<String>,
        upgrade: bool,
    },
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
    JobId::new(s).map_err(|p| error(ErrorBody::new(ErrorCode::Invalid, Some("job".into()), p)))
}

/// Whether `token` is the administrator's (compared in constant time).
fn admin(h: &BrokerHandle, token: Option<&str>) -> Result<(), Reply> {
    let forbidden = |why: &str| {
        Err(error(ErrorBody::new(
            ErrorCode::Forbidden,
            Some("token".into()),
            why.to_owned(),
        )))
    };
    let Some(want) = h.admin_token.as_deref() else {
        return forbidden("no administrator token is configured on this broker (--admin-token)");
    };
    let Some(got) = token else {
        return forbidden("this call needs the administrator's token");
    };
    let (a, b) = (want.as_bytes(), got.as_bytes());
    let diff = a.len() ^ b.len()
        | a.iter()
            .zip(b.iter().cycle())
            .fold(0usize, |acc, (x, y)| acc | usize::from(x ^ y));
    if diff != 0 || b.is_empty() {
        return forbidden("wrong administrator token");
    }
    Ok(())
}

/// Carries out one call.
pub async fn call(h: &BrokerHandle, c: Call) -> Reply {
    match c {
        Call::Submit(body) => {
            let spec = match decode_strict::<JobSpec>(&body) {
                Ok(s) => s,
                Err(e) => return wire(e),
            };
            match h.step(Event::Submit(spec)).await {
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
            let req = match decode_strict::<meridian_federation::ReportRequest>(&body) {
                Ok(r) => r,
                Err(e) => return wire(e),
            };
            match h.query(Query::Ledger).await {
                Some(Answer::Ledger(mut entries)) => match h.archive.ledger().await {
                    Ok(archived) => {
                        entries.extend(archived);
                        ok(200, meridian_core::ledger::report(&entries, &req))
                    }
                    Err(e) => archive_unavailable(e),
                },
                _ => unavailable(),
            }
        }
        Call::Tenancy { token, toml } => {
            if let Err(r) = admin(h, token.as_deref()) {
                return r;
            }
            if let Some(toml) = toml {
                if let Err(e) = h
                    .step(Event::SetTenancy {
                        toml,
                        from_file: false,
                    })
                    .await
                {
                    return step_error(e);
                }
            }
            match h.query(Query::Tenancy).await {
                Some(Answer::Tenancy(toml)) => ok(200, meridian_federation::TenancyView { toml }),
                _ => unavailable(),
            }
        }
        Call::Format { token, upgrade } => {
            if let Err(r) = admin(h, token.as_deref()) {
                return r;
            }
            let newest = meridian_core::durable::FORMAT_VERSION;
            if upgrade {
                if let Err(e) = h.step(Event::UpgradeFormat { to: newest }).await {
                    return step_error(e);
                }
            }
            match h.query(Query::Format).await {
                Some(Answer::Format(format)) => {
                    ok(200, meridian_federation::FormatView { format, newest })
                }
                _ => unavailable(),
            }
        }
        Call::ListJobs(body) => {
            let req = if body.is_empty() {
                meridian_federation::JobListRequest::default()
            } else {
                match decode_strict::<meridian_federation::JobListRequest>(&body) {
                    Ok(r) => r,
                    Err(e) => return wire(e),
                }
            };
            list_jobs(h, req).await
        }
        Call::GetJob(id) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            match h.query(Query::Job(id.clone())).await {
                Some(Answer::Job(Some(v))) => ok(200, v),
                Some(_) => match h.archive.job(&id).await {
                    Ok(Some(a)) => ok(200, a.view),
                    Ok(None) => not_found(format!("job {id}")),
                    Err(e) => archive_unavailable(e),
                },
                None => unavailable(),
            }
        }
        Call::Explain(id) => {
            let id = match job_id(&id) {
                Ok(id) => id,
                Err(r) => return r,
            };
            match h.query(Query::Explain(id.clone())).await {
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
            match h.step(Event::Cancel(id.clone())).await {
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
            logs(h, id, lines).await
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
            match h.step(event).await {
                Ok(Response::Stopping(stopping)) => {
                    ok(200, meridian_federation::ScaleInReply { stopping })
                }
                Ok(other) => error(ErrorBody::new(
                    ErrorCode::Internal,
                    None,
                    format!("unexpected {other:?}"),
                )),
                Err(e) => step_error(e),
            }
        }
        Call::Drain(site, drain) => {
            let site = match SiteId::new(site) {
                Ok(s) => s,
                Err(p) => return error(ErrorBody::new(ErrorCode::Invalid, Some("site".into()), p)),
            };
            match h
                .step(Event::Drain {
                    site: site.clone(),
                    drain,
                })
                .await
            {
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
async fn list_jobs(h: &BrokerHandle, req: meridian_federation::JobListRequest) -> Reply {
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
    let mut at = match req.cursor.as_deref() {
        None if req.scope == JobScope::Archived => At::Archived(1),
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
        at = At::Archived(1);
    }
    if let At::Archived(from) = at {
        let want = limit - page.jobs.len();
        if want == 0 {
            page.next = Some(format!("archived:{from}"));
            return ok(200, page);
        }
        let mut taken = 0;
        let scanned = h
            .archive
            .scan(from, |a| {
                let v = a.view;
                let pass = req.tenant.as_ref().is_none_or(|t| t == &v.tenant)
                    && req.state.is_none_or(|p| p == v.phase)
                    && req.site.as_ref().is_none_or(|s| v.site.as_ref() == Some(s))
                    && req.from_ms.is_none_or(|f| v.submitted_at_ms >= f)
                    && req.to_ms.is_none_or(|t| v.submitted_at_ms < t);
                if pass {
                    if !fits(&v, &mut bytes) {
                        return false;
                    }
                    page.jobs.push(v);
                    taken += 1;
                }
                taken < want
            })
            .await;
        match scanned {
            Ok(next) => page.next = next.map(|seq| format!("archived:{seq}")),
            Err(e) => return archive_unavailable(e),
        }
    }
    ok(200, page)
}

/// Fetches a job's log tail from the agent of the site its latest attempt ran on.
async fn logs(h: &BrokerHandle, id: JobId, lines: u32) -> Reply {
    let Some(Answer::Placement(placement)) = h.query(Query::Placement(id.clone())).await else {
        return unavailable();
    };
    let placement = match placement {
        Some(p) => Some(p),
        None => match h.archive.job(&id).await {
            Ok(a) => a.and_then(|a| Some((a.view.site?, a.view.attempt)).filter(|(_, n)| *n > 0)),
            Err(e) => return archive_unavailable(e),
        },
    };
    let Some((site, attempt)) = placement else {
        return not_found(format!("a started attempt of job {id}"));
    };
    let req = LogsRequest {
        v: WIRE_VERSION,
        job: id,
        attempt,
        lines: lines.clamp(1, 10_000),
    };
    let Ok(body) = encode(&req) else {
        return unavailable();
    };
    let asked = h
        .client
        .request(subjects::site(&site, SiteTopic::Logs), Bytes::from(body));
    match tokio::time::timeout(Duration::from_secs(3), asked).await {
        Ok(Ok(m)) => match decode::<LogsReply>(&m.payload) {
            Ok(r) => ok(200, r),
            Err(_) => match decode::<ApiReply<()>>(&m.payload).map(ApiReply::into_result) {
                Ok(Err(e)) => error(e),
                _ => error(ErrorBody::new(
                    ErrorCode::Internal,
                    None,
                    "unreadable answer from the agent",
                )),
            },
        },
        _ => error(ErrorBody::new(
            ErrorCode::Unavailable,
            None,
            format!("site {site} did not answer for the logs"),
        )),
    }
}

/// Serves the NATS request-reply API until the subscription ends. Each request is answered on its own task.
pub async fn serve_nats(h: BrokerHandle, mut sub: async_nats::Subscriber) {
    while let Some(m) = sub.next().await {
        let Some(reply_to) = m.reply.clone() else {
            continue;
        };
        let h = h.clone();
        tokio::spawn(async move {
            let (_, body) = match nats_call(m.subject.as_str(), m.payload) {
                Ok(c) => call(&h, c).await,
                Err(r) => r,
            };
            let _ = h.client.publish(reply_to, Bytes::from(body)).await;
        });
    }
}

fn nats_call(subject: &str, payload: Bytes) -> Result<Call, Reply> {
    use subjects::api;
    let job = |p: &Bytes| {
        decode_strict::<JobRef>(p)
            .map(|r| r.job.to_string())
            .map_err(wire)
    };
    Ok(match subject {
        api::SUBMIT => Call::Submit(payload),
        api::REPORT => Call::Report(payload),
        api::TENANCY => {
            let r = decode_strict::<meridian_federation::TenancyRequest>(&payload).map_err(wire)?;
            Call::Tenancy {
                token: r.token,
                toml: r.toml,
            }
        }
        api::JOURNAL_FORMAT => {
            let r = decode_strict::<meridian_federation::FormatRequest>(&payload).map_err(wire)?;
            Call::Format {
                token: r.token,
                upgrade: r.upgrade,
            }
        }
        api::LIST_JOBS => Call::ListJobs(payload),
        api::GET_JOB => Call::GetJob(job(&payload)?),
        api::EXPLAIN => Call::Explain(job(&payload)?),
        api::CANCEL => Call::Cancel(job(&payload)?),
        api::LOGS => Call::Logs(job(&payload)?, 100),
        api::LIST_SITES => {
            empty(&payload)?;
            Call::ListSites
        }
        api::SCALE_IN => Call::ScaleIn(payload),
        api::DRAIN => {
            let d = decode_strict::<DrainRequest>(&payload).map_err(wire)?;
            Call::Drain(d.site.to_string(), d.drain)
        }
        other => {
            return Err(error(ErrorBody::new(
                ErrorCode::NotFound,
                None,
                format!("no API call at subject {other}"),
            )))
        }
    })
}

fn empty(payload: &Bytes) -> Result<(), Reply> {
    if payload.is_empty() {
        return Ok(());
    }
    decode_strict::<Empty>(payload).map(|_| ()).map_err(wire)
}
