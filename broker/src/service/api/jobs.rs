//! Jobs: submit, list, count by queue, read, explain, cancel, logs and timeline.

use super::{ApiError, ApiResult};
use crate::service::{authz, Answer, BrokerHandle, Query};
use bytes::Bytes;
use meridian_core::access::Principal;
use meridian_core::reactor::{Event, Response};
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{
    decode, encode, ApiReply, ErrorCode, ExplainView, JobId, JobListRequest, JobPage, JobScope,
    JobSpec, JobView, LogsReply, LogsRequest, QueuesRequest, QueuesView, SubmitReply, TimelineView,
    WIRE_VERSION,
};
use std::time::Duration;

pub async fn submit(h: &BrokerHandle, who: &Principal, spec: JobSpec) -> ApiResult<SubmitReply> {
    match h.step_as(who, Event::Submit(spec)).await? {
        Response::Submitted(r) => Ok(r),
        other => Err(ApiError::internal(format!("unexpected {other:?}"))),
    }
}

pub async fn queues(
    h: &BrokerHandle,
    who: &Principal,
    mut req: QueuesRequest,
) -> ApiResult<QueuesView> {
    authz::scope_to_own_tenant(who, &mut req.tenant, "queues")?;
    match h.query(Query::Queues(req, who.clone())).await {
        Some(Answer::Queues(v)) => Ok(v),
        _ => Err(ApiError::unavailable()),
    }
}

/// A job's view, live or archived, if the caller may read it (another tenant's is "not found").
pub async fn get(h: &BrokerHandle, who: &Principal, id: &JobId) -> ApiResult<JobView> {
    let view = match h.query(Query::Job(id.clone())).await {
        Some(Answer::Job(Some(v))) => v,
        Some(_) => match h.archive.job(id).await {
            Ok(Some(a)) => a.view,
            Ok(None) => return Err(ApiError::not_found(format!("job {id}"))),
            Err(e) => return Err(ApiError::archive(e)),
        },
        None => return Err(ApiError::unavailable()),
    };
    authz::may_watch(who, &view)?;
    Ok(view)
}

pub async fn explain(
    h: &BrokerHandle,
    who: &Principal,
    id: JobId,
    all: bool,
) -> ApiResult<ExplainView> {
    get(h, who, &id).await?;
    match h.query(Query::Explain(id.clone(), all)).await {
        Some(Answer::Explain(Some(v))) => Ok(v),
        Some(_) => match h.archive.job(&id).await {
            Ok(Some(a)) => Ok(a.explain),
            Ok(None) => Err(ApiError::not_found(format!("job {id}"))),
            Err(e) => Err(ApiError::archive(e)),
        },
        None => Err(ApiError::unavailable()),
    }
}

pub async fn cancel(h: &BrokerHandle, who: &Principal, id: JobId) -> ApiResult<JobView> {
    h.step_as(who, Event::Cancel(id.clone())).await?;
    match h.query(Query::Job(id.clone())).await {
        Some(Answer::Job(Some(v))) => Ok(v),
        _ => Err(ApiError::not_found(format!("job {id}"))),
    }
}

pub async fn logs(
    h: &BrokerHandle,
    who: &Principal,
    id: JobId,
    lines: u32,
) -> ApiResult<LogsReply> {
    get(h, who, &id).await?;
    fetch_logs(h, id, lines).await
}

/// Lines of the log a timeline shows.
const TIMELINE_LOG_LINES: u32 = 20;

pub async fn timeline(h: &BrokerHandle, who: &Principal, id: JobId) -> ApiResult<TimelineView> {
    get(h, who, &id).await?;
    let mut t = match h.query(Query::Timeline(id.clone())).await {
        Some(Answer::Timeline(Some(t))) => t,
        Some(_) => match h.archive.job(&id).await {
            Ok(Some(a)) => meridian_core::views::timeline(&a.job),
            Ok(None) => return Err(ApiError::not_found(format!("job {id}"))),
            Err(e) => return Err(ApiError::archive(e)),
        },
        None => return Err(ApiError::unavailable()),
    };
    match fetch_logs(h, id, TIMELINE_LOG_LINES).await {
        Ok(r) => t.log_tail = Some(r.text),
        Err(e) => t.log_error = Some(e.0.message),
    }
    Ok(t)
}

/// Fetches a job's log tail from the agent of the site its latest attempt ran on.
async fn fetch_logs(h: &BrokerHandle, id: JobId, lines: u32) -> ApiResult<LogsReply> {
    let Some(Answer::Placement(placement)) = h.query(Query::Placement(id.clone())).await else {
        return Err(ApiError::unavailable());
    };
    let placement = match placement {
        Some(p) => Some(p),
        None => match h.archive.job(&id).await {
            Ok(a) => a.and_then(|a| Some((a.view.site?, a.view.attempt)).filter(|(_, n)| *n > 0)),
            Err(e) => return Err(ApiError::archive(e)),
        },
    };
    let Some((site, attempt)) = placement else {
        return Err(ApiError::not_found(format!(
            "a started attempt of job {id}"
        )));
    };
    let req = LogsRequest {
        v: WIRE_VERSION,
        job: id,
        attempt,
        lines: lines.clamp(1, 10_000),
    };
    let body = encode(&req).map_err(|_| ApiError::unavailable())?;
    let asked = h
        .client
        .request(subjects::site(&site, SiteTopic::Logs), Bytes::from(body));
    let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(3), asked).await else {
        return Err(ApiError::new(
            ErrorCode::Unavailable,
            None,
            format!("site {site} did not answer for the logs"),
        ));
    };
    if let Ok(r) = decode::<LogsReply>(&m.payload) {
        return Ok(r);
    }
    match decode::<ApiReply<()>>(&m.payload).map(ApiReply::into_result) {
        Ok(Err(e)) => Err(e.into()),
        _ => Err(ApiError::internal("unreadable answer from the agent")),
    }
}

/// The page size when the request names none.
const DEFAULT_PAGE: usize = 500;
/// A page stops before its body reaches this, well under NATS's 1 MiB payload limit.
const PAGE_BYTES: usize = 768 * 1024;
/// The archive cursor of a newest-first listing that has not read the archive yet: its newest message.
const NEWEST_ARCHIVED: u64 = u64::MAX;

/// Where a page starts: after a live job, or at an archive sequence.
enum At {
    Live(Option<JobId>),
    Archived(u64),
}

/// A page being filled, up to a count and a size.
struct Filling {
    page: JobPage,
    bytes: usize,
    limit: usize,
}

impl Filling {
    /// Adds a job if the page's body stays under its size.
    fn fits(&mut self, v: JobView) -> bool {
        self.bytes += serde_json::to_vec(&v).map_or(0, |b| b.len() + 1);
        if self.bytes >= PAGE_BYTES {
            return false;
        }
        self.page.jobs.push(v);
        true
    }
}

/// One page of jobs: live ones by id, then archived ones in archive order (see [`JobListRequest`]). The cursor
/// is `live:<job>` or `archived:<sequence>`.
pub async fn list(
    h: &BrokerHandle,
    who: &Principal,
    mut req: JobListRequest,
) -> ApiResult<JobPage> {
    authz::may_list_jobs(who, &mut req.tenant)?;
    let first_archived = if req.newest_first { NEWEST_ARCHIVED } else { 1 };
    let mut fill = Filling {
        page: JobPage::default(),
        bytes: 0,
        limit: req.limit.map_or(DEFAULT_PAGE, |l| l as usize),
    };
    let mut at = cursor(&req, first_archived)?;
    if let At::Live(after) = at {
        if !live_page(h, who, &req, after, &mut fill).await? || req.scope == JobScope::Live {
            return Ok(fill.page);
        }
        at = At::Archived(first_archived);
    }
    if let At::Archived(from) = at {
        archived_page(h, who, &req, from, &mut fill).await?;
    }
    Ok(fill.page)
}

fn cursor(req: &JobListRequest, first_archived: u64) -> ApiResult<At> {
    let bad = || {
        ApiError::invalid(
            "cursor",
            "not a cursor this broker gave: expected live:<job> or archived:<sequence>",
        )
    };
    Ok(match req.cursor.as_deref() {
        None if req.scope == JobScope::Archived => At::Archived(first_archived),
        None => At::Live(None),
        Some(c) => match c.split_once(':') {
            Some(("live", id)) => At::Live(Some(JobId::new(id).map_err(|_| bad())?)),
            Some(("archived", seq)) => At::Archived(seq.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        },
    })
}

/// Fills the page with live jobs after `after`; whether the archive comes next (every live job fitted).
async fn live_page(
    h: &BrokerHandle,
    who: &Principal,
    req: &JobListRequest,
    after: Option<JobId>,
    fill: &mut Filling,
) -> ApiResult<bool> {
    let Some(Answer::JobsPage(jobs, more)) = h
        .query(Query::JobsPage {
            after,
            limit: fill.limit,
            filter: req.clone(),
            who: who.clone(),
        })
        .await
    else {
        return Err(ApiError::unavailable());
    };
    let n = jobs.len();
    for v in jobs {
        if !fill.fits(v) {
            break;
        }
    }
    if fill.page.jobs.len() < n || more {
        fill.page.next = fill.page.jobs.last().map(|v| format!("live:{}", v.job));
        return Ok(false);
    }
    Ok(true)
}

/// Fills the rest of the page from the archive, from sequence `from`.
async fn archived_page(
    h: &BrokerHandle,
    who: &Principal,
    req: &JobListRequest,
    from: u64,
    fill: &mut Filling,
) -> ApiResult<()> {
    let want = fill.limit - fill.page.jobs.len();
    if want == 0 {
        fill.page.next = Some(format!("archived:{from}"));
        return Ok(());
    }
    let mut taken = 0;
    let keep = |a: crate::service::archive::Archived| {
        let v = a.view;
        if req.passes(&v) && authz::may_watch(who, &v).is_ok() {
            if !fill.fits(v) {
                return false;
            }
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
    let next = scanned.map_err(ApiError::archive)?;
    fill.page.next = next.map(|seq| format!("archived:{seq}"));
    Ok(())
}
