//! The call table: every API call declared once — its name, who may make it, its NATS subject and HTTP route,
//! how each edge decodes it into a typed [`Call`], the handler it runs and the line docs/api.md shows.
//!
//! Adding a call touches this file (a [`Call`] variant, its [`CallDef`], its arms in [`Call::def`] and
//! [`dispatch`]), the room of its handler and its test.

use super::decode::*;
use super::{admin, jobs, report, services, ApiError, ApiResult, Reply};
use crate::service::reply::Inbox;
use crate::service::BrokerHandle;
use bytes::Bytes;
use meridian_core::access::Principal;
use meridian_federation::subjects::api as subject;
use meridian_federation::{
    AuditRequest, DemandReport, DrainRequest, ExplainRequest, FormatRequest, HistoryRequest, JobId,
    JobListRequest, JobSpec, QueuesRequest, ReportRequest, RoutesWatchRequest, ScaleInRequest,
    ServiceRef, ServiceSpec, SiteId, SiteListRequest, SiteRevokeRequest, TenancyRequest,
    TokenCreateRequest, TokenRevokeRequest,
};
use std::collections::BTreeMap;

/// One API call, its input decoded and checked.
#[derive(Debug)]
pub enum Call {
    Submit(JobSpec),
    ListJobs(JobListRequest),
    Queues(QueuesRequest),
    GetJob(JobId),
    Explain {
        job: JobId,
        all: bool,
    },
    Cancel(JobId),
    Logs {
        job: JobId,
        lines: u32,
    },
    Timeline(JobId),
    ListSites(SiteListRequest),
    Drain {
        site: SiteId,
        drain: bool,
    },
    ScaleIn(ScaleInRequest),
    ServiceDeploy(ServiceSpec),
    /// The services the caller reads, or one (`name`).
    Services(ServiceRef),
    ServiceDelete(ServiceRef),
    ServiceRoutes(ServiceRef),
    /// A watch of a service's routing table, its changes sent to this inbox (NATS only).
    ServiceRoutesWatch(RoutesWatchRequest, Inbox),
    ServiceDemand(DemandReport),
    Report(ReportRequest),
    History(HistoryRequest),
    Tenancy,
    /// Replace the tenancy with a tenancy file's text.
    SetTenancy(String),
    Format,
    UpgradeFormat,
    /// Set aside the journal message the broker cannot read.
    Quarantine(u64),
    TokenCreate(TokenCreateRequest),
    TokenList,
    TokenRevoke(String),
    SiteRevoke(SiteId),
    SiteRestore(SiteId),
    Audit(AuditRequest),
    /// The metrics, in the OpenMetrics text format.
    Metrics,
    /// Who the token speaks for (a dashboard's sign-in).
    Session,
    /// The broker's release and the formats it speaks.
    Version,
}

/// Who may make a call. Judged in one place, [`crate::service::authz`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Any caller; it reads only what it may see (judged per job, service or tenant).
    Read,
    /// An administrator or a federation-wide viewer (the words say what is read).
    ReadAll(&'static str),
    /// An administrator (the words say what is done).
    Admin(&'static str),
    /// A change judged in the reactor task against the state it applies to, and audited there.
    Change,
    /// A service's gateway or owner, judged against the service named.
    Gateway,
}

impl Access {
    /// Whether the call only reads: the only calls a dashboard's session cookie may make (a change needs the
    /// token in an `Authorization` header, which another site's page cannot make a browser send).
    pub fn reads_only(&self) -> bool {
        matches!(self, Access::Read | Access::ReadAll(_))
    }

    /// Who may make the call, in docs/api.md's words.
    pub fn who(&self) -> &'static str {
        match self {
            Access::Read => "any token: what it may read",
            Access::ReadAll(_) => "administrator or federation-wide viewer",
            Access::Admin(_) => "administrator",
            Access::Change => "judged with the change",
            Access::Gateway => "the service's gateway or owner",
        }
    }
}

/// An HTTP request's parts an edge decoder reads.
pub struct HttpIn {
    /// The path's parameters (`{id}`, `{name}`, `{seq}`).
    pub params: BTreeMap<String, String>,
    pub uri: axum::http::Uri,
    pub body: Bytes,
}

/// A NATS request's parts an edge decoder reads.
pub struct NatsIn {
    pub payload: Bytes,
    /// The caller's own inbox the answer goes to.
    pub inbox: Inbox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub decode: fn(HttpIn) -> ApiResult<Call>,
}

/// A NATS subject's decoder: the call, and a token its body carried (clients of the previous release sent
/// the administrator's token in the body of the tenancy and format calls; the `Authorization` header is the
/// way).
pub type FromNats = fn(NatsIn) -> ApiResult<(Call, Option<String>)>;

/// One call's declaration.
pub struct CallDef {
    /// Its name in the audit and the metrics.
    pub action: &'static str,
    pub access: Access,
    pub http: &'static [Route],
    /// Its NATS subjects (`meridian.v1.api.<identity>.<subject>`) and their decoder; a subject may make
    /// another call of the same family (`admin.tenancy` reads or replaces), declared here once.
    pub nats: &'static [(&'static str, FromNats)],
    /// The reply's content type over HTTP.
    pub content_type: &'static str,
    /// Body → reply, for docs/api.md.
    pub doc: &'static str,
}

pub const JSON: &str = "application/json";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

macro_rules! def {
    ($name:ident, $action:literal, $access:expr, [$($m:ident $path:literal => $dec:expr),*], [$($subj:expr => $from:expr),*], $doc:literal) => {
        pub static $name: CallDef = CallDef {
            action: $action,
            access: $access,
            http: &[$(Route { method: Method::$m, path: $path, decode: $dec }),*],
            nats: &[$(($subj, $from)),*],
            content_type: JSON,
            doc: $doc,
        };
    };
}

def!(SUBMIT, "submit", Access::Change,
    [Post "/v1/jobs" => |r| strict(&r.body).map(Call::Submit)],
    [subject::SUBMIT => |n| plain(strict(&n.payload).map(Call::Submit))],
    "`JobSpec` → `SubmitReply` (201 new, 200 when the idempotency key matched); may `submit` to the job's tenant and queue");
def!(LIST_JOBS, "list_jobs", Access::Read,
    [Get "/v1/jobs" => |r| optional(&query_body(&r, &["limit", "from_ms", "to_ms"])?).map(Call::ListJobs)],
    [subject::LIST_JOBS => |n| plain(optional(&n.payload).map(Call::ListJobs))],
    "`?cursor=C&limit=N&scope=all|live|archived&tenant=T&state=S&site=X&from_ms=A&to_ms=B&text=W&newest_first=true` → `JobPage` `{jobs: [JobView], next}`: live jobs by id, then archived ones in the order they were archived (with `newest_first`, both the other way: what `meridian jobs` and the dashboard ask); `text` keeps the jobs whose id, name or `why` holds it (any case); follow `next` until it is absent");
def!(QUEUES, "queues", Access::Read,
    [Get "/v1/queues" => |r| optional(&query_body(&r, &["head"])?).map(Call::Queues)],
    [subject::QUEUES => |n| plain(optional(&n.payload).map(Call::Queues))],
    "`?queue=Q&tenant=T&head=N` → `QueuesView` `{queues: [{queue, running, offered, pending, reasons: {label: n}, waiting: [{position, job, tenant, name, priority, milli, submitted_at_ms, wait_reason, why}]}], sites: [{site, running, offered}], flows: [{from: {lat, lon}, site, jobs}]}`: the live jobs the caller may read counted by queue (a job that names none is in its tenant's), by site and by their users' place; `waiting` lists each queue's first `N` waiting jobs (default 10, 0 for none) in the order they are tried: higher priority first, then the oldest (`meridian queue`)");
def!(GET_JOB, "get_job", Access::Read,
    [Get "/v1/jobs/{id}" => |r| job_id(&r).map(Call::GetJob)],
    [subject::GET_JOB => |n| plain(job_ref(&n).map(Call::GetJob))],
    "→ `JobView` (another tenant's job is not found)");
def!(EXPLAIN, "explain", Access::Read,
    [Get "/v1/jobs/{id}/explain" => |r| {
        let all = typed_query::<ExplainParam>(&r)?.all;
        Ok(Call::Explain { job: job_id(&r)?, all })
    }],
    [subject::EXPLAIN => |n| {
        let r: ExplainRequest = strict(&n.payload)?;
        plain(Ok(Call::Explain { job: r.job, all: r.all }))
    }],
    "`?all=true` → `ExplainView`: each candidate's terms or why it was rejected; `decided_by`, in words, the term the chosen site gains most on against the next best (price, carbon, latency, data locality), what it gives up and what kept the other sites out (`meridian explain` prints it as \"decided by …\"); with `all`, every site of the federation as placement weighs the job now (`every_site_now`)");
def!(CANCEL, "cancel", Access::Change,
    [Delete "/v1/jobs/{id}" => |r| job_id(&r).map(Call::Cancel)],
    [subject::CANCEL => |n| plain(job_ref(&n).map(Call::Cancel))],
    "→ `JobView` (cancel); may `cancel` in the job's tenant and queue");
def!(LOGS, "logs", Access::Read,
    [Get "/v1/jobs/{id}/logs" => |r| {
        let lines = typed_query::<LinesParam>(&r)?.lines.unwrap_or(100);
        Ok(Call::Logs { job: job_id(&r)?, lines })
    }],
    [subject::LOGS => |n| plain(job_ref(&n).map(|job| Call::Logs { job, lines: 100 }))],
    "`?lines=N` → `LogsReply` (fetched from the site's agent)");
def!(TIMELINE, "timeline", Access::Read,
    [Get "/v1/jobs/{id}/timeline" => |r| job_id(&r).map(Call::Timeline)],
    [subject::TIMELINE => |n| plain(job_ref(&n).map(Call::Timeline))],
    "→ `TimelineView`: `events` (`submitted`, `offered`, `started`, `ended`, `waiting`, `finished`, `note`, each with `at_ms`, `attempt`, `site`, `detail`), `attempts` (site, pool, model, devices, run time, metered amounts), the latest placement's best `candidates`, `log_tail` (or `log_error`)");
def!(LIST_SITES, "list_sites", Access::Read,
    [Get "/v1/sites" => |r| optional(&query_body(&r, &["limit"])?).map(Call::ListSites)],
    [subject::LIST_SITES => |n| plain(optional(&n.payload).map(Call::ListSites))],
    "`?state=up|draining|lost|revoked&after=SITE&limit=N` → `[SiteView]` by id (every site, or those in that state; with `limit`, at most N after `after`, fewer where they would not fit in one message; an empty page is past the last): each site's pools, state, PUE and grid carbon now, its advertised hourly forecast (`carbon_forecast`, from `carbon_forecast_start_ms`) and the intensities the broker keeps to meter its running work (`carbon_history`, `[from_ms, g]` steps)");
def!(DRAIN, "drain", Access::Change,
    [Post "/v1/sites/{id}/drain" => |r| {
        let drain = if r.body.is_empty() { true } else { drain_body(&r.body)? };
        Ok(Call::Drain { site: site_id(&r)?, drain })
    }],
    [subject::DRAIN => |n| {
        let d: DrainRequest = strict(&n.payload)?;
        plain(Ok(Call::Drain { site: d.site, drain: d.drain }))
    }],
    "`{\"drain\": true|false}` → `SiteView` (administrator)");
def!(SCALE_IN, "scale_in", Access::Change,
    [Post "/v1/services/scale-in" => |r| strict(&r.body).map(Call::ScaleIn)],
    [subject::SCALE_IN => |n| plain(strict(&n.payload).map(Call::ScaleIn))],
    "`{\"tenant\", \"service\", \"remove\"}` → `{\"stopping\": [job ids]}`: pending replicas first, then cloud, partner and owned ones, the dearest first; may `cancel` in the tenant");
def!(SERVICE_DEPLOY, "service_deploy", Access::Change,
    [Post "/v1/services" => |r| strict(&r.body).map(Call::ServiceDeploy)],
    [subject::SERVICE_DEPLOY => |n| plain(strict(&n.payload).map(Call::ServiceDeploy))],
    "`ServiceSpec` (see [serving](serving.md)) → `ServiceView` (deploy, or replace the spec); may `submit` to the service's queue");
def!(SERVICES, "services", Access::Read,
    [Get "/v1/services" => |r| strict(&query_body(&r, &[])?).map(Call::Services),
     Get "/v1/services/{name}" => |r| service_ref(&r).map(Call::Services)],
    [subject::SERVICE_LIST => |n| plain(strict(&n.payload).map(Call::Services)),
     subject::SERVICE_SHOW => |n| plain(strict(&n.payload).map(Call::Services))],
    "`?tenant=T` → `[ServiceView]`, or with a name `ServiceView` `{spec, health, backoff: [{site, pool, exits_in_a_row, last_job, last_exit_code, last_reason, last_exit_ms, last_ran_ms, next_start_ms}], replicas: [{job, site, pool, state, usd_per_hour, co2_g_per_hour, serves_per_s}], demand: [LocationRate], changes: [{at_ms, site, pool, from, to, why}]}` (a tenant's token names its own tenant or none)");
def!(SERVICE_DELETE, "service_delete", Access::Change,
    [Delete "/v1/services/{name}" => |r| service_ref(&r).map(Call::ServiceDelete)],
    [subject::SERVICE_DELETE => |n| plain(strict(&n.payload).map(Call::ServiceDelete))],
    "`?tenant=T` → `{\"stopping\": [job ids]}`: the service is gone, its replicas stop; may `cancel` in the tenant");
def!(SERVICE_ROUTES, "service_routes", Access::Read,
    [Get "/v1/services/{name}/routes" => |r| service_ref(&r).map(Call::ServiceRoutes)],
    [subject::SERVICE_ROUTES => |n| plain(strict(&n.payload).map(Call::ServiceRoutes))],
    "`?tenant=T` → `RoutesView` `{tenant, service, locations: [{location, routes: [{site, pool, spot?, replicas, rtt_ms, weight}]}]}` (who may read the service or report its demand)");
def!(SERVICE_ROUTES_WATCH, "service_routes_watch", Access::Read,
    [],
    [subject::SERVICE_ROUTES_WATCH => |n| {
        let r: RoutesWatchRequest = strict(&n.payload)?;
        plain(Ok(Call::ServiceRoutesWatch(r, n.inbox)))
    }],
    "`{\"tenant\"?, \"name\", \"lease_s\"?}` (1–600, default 60) → `RoutesUpdate` `{seq, until_ms, routes: RoutesView}` on the request's reply subject, then one more there for every change of the table until `until_ms` (send the request again from the same inbox to renew; `seq` numbers the messages of a watch: drop one not above the last; a deleted service ends the watch with a `not_found` error)");
def!(SERVICE_DEMAND, "service_demand", Access::Gateway,
    [Post "/v1/services/{name}/demand" => |r| {
        let body = demand_body(&r)?;
        strict(&body).map(Call::ServiceDemand)
    }],
    [subject::SERVICE_DEMAND => |n| plain(strict(&n.payload).map(Call::ServiceDemand))],
    "`{\"tenant\"?, \"locations\": [{\"name\", \"location\": {\"lat\", \"lon\"}, \"rtt_region\"?, \"per_s\"}]}` → `{}`: a gateway's rates per user location (`service` may be left out over HTTP: the path names it)");
def!(REPORT, "report", Access::Read,
    [Get "/v1/report" => |r| strict(&query_body(&r, &["from_ms", "to_ms"])?).map(Call::Report)],
    [subject::REPORT => |n| plain(strict(&n.payload).map(Call::Report))],
    "`?tenant=T&from_ms=A&to_ms=B` → `ReportView`: the metering ledger per tenant, site and model (see [tenancy](tenancy.md)); needs `report` on the tenant");
def!(HISTORY, "history", Access::ReadAll("reading the job history"),
    [Get "/v1/admin/history" => |r| optional(&query_body(&r, &["from_ms"])?).map(Call::History)],
    [subject::HISTORY => |n| plain(optional(&n.payload).map(Call::History))],
    "`?from_ms=A` → `HistoryView` `{now_ms, tenancy_toml, jobs: [{job, phase, submitted_ms, spec, runs: [{attempt, site, model, started_ms, runtime_ms, ended}]}], federation: {sites: [{info, pools, up}], regions: {name: GeoJSON}, rtt: [{from, to, rtt_ms}], throughput_toml}}`: the jobs submitted from `A` on, live and archived, their specs without the run spec, and the federation the broker places on (what `meridian plan` replays, and on what)");
def!(TENANCY, "tenancy", Access::ReadAll("reading the tenancy"),
    [Get "/v1/admin/tenancy" => |_| Ok(Call::Tenancy)],
    [subject::TENANCY => |n| {
        let r: TenancyRequest = strict(&n.payload)?;
        Ok((r.toml.map_or(Call::Tenancy, Call::SetTenancy), r.token))
    }],
    "→ `TenancyView` (over NATS `{\"toml\"?}`: with a tenancy file's text, replaces it)");
def!(SET_TENANCY, "tenancy", Access::Change,
    [Put "/v1/admin/tenancy" => |r| Ok(Call::SetTenancy(String::from_utf8_lossy(&r.body).into_owned()))],
    [],
    "(tenancy file as TOML) → `TenancyView` (administrator)");
def!(FORMAT, "journal_format", Access::ReadAll("reading the journal's format"),
    [Get "/v1/admin/journal/format" => |_| Ok(Call::Format)],
    [subject::JOURNAL_FORMAT => |n| {
        let r: FormatRequest = strict(&n.payload)?;
        let call = match (r.quarantine, r.upgrade) {
            (Some(seq), _) => Call::Quarantine(seq),
            (None, true) => Call::UpgradeFormat,
            (None, false) => Call::Format,
        };
        Ok((call, r.token))
    }],
    "→ `FormatView` `{format, newest, unreadable?: {seq, reason}}` (over NATS `{\"upgrade\"?, \"quarantine\"?}` upgrades or sets aside)");
def!(UPGRADE_FORMAT, "journal_format", Access::Change,
    [Post "/v1/admin/journal/upgrade-format" => |_| Ok(Call::UpgradeFormat)],
    [],
    "→ `FormatView`: the journal is written in the newest durable format from now on (administrator)");
def!(QUARANTINE, "journal_quarantine", Access::Admin("setting a journal message aside"),
    [Post "/v1/admin/journal/quarantine/{seq}" => |r| {
        let seq = param(&r, "seq");
        seq.parse().map(Call::Quarantine).map_err(|_| {
            ApiError::invalid("seq", format!("{seq:?} is not a journal sequence number"))
        })
    }],
    [],
    "→ `FormatView`: sets aside the unreadable journal message (409 for any other sequence)");
def!(TOKEN_CREATE, "token_create", Access::Change,
    [Post "/v1/admin/tokens" => |r| strict(&r.body).map(Call::TokenCreate)],
    [subject::TOKEN_CREATE => |n| plain(strict(&n.payload).map(Call::TokenCreate))],
    "`{\"tenant\"?, \"roles\": [..], \"name\"?, \"expires_in_s\"?}` → `TokenCreated` (the token, shown once; administrator)");
def!(TOKEN_LIST, "token_list", Access::ReadAll("listing API tokens"),
    [Get "/v1/admin/tokens" => |_| Ok(Call::TokenList)],
    [subject::TOKEN_LIST => |n| { empty(&n.payload)?; plain(Ok(Call::TokenList)) }],
    "→ `[TokenView]` (never a secret)");
def!(TOKEN_REVOKE, "token_revoke", Access::Change,
    [Delete "/v1/admin/tokens/{id}" => |r| Ok(Call::TokenRevoke(param(&r, "id")))],
    [subject::TOKEN_REVOKE => |n| {
        let r: TokenRevokeRequest = strict(&n.payload)?;
        plain(Ok(Call::TokenRevoke(r.id)))
    }],
    "→ `TokenView` (administrator)");
def!(SITE_REVOKE, "site_revoke", Access::Change,
    [Post "/v1/admin/sites/{id}/revoke" => |r| site_id(&r).map(Call::SiteRevoke)],
    [subject::SITE_REVOKE => |n| {
        let r: SiteRevokeRequest = strict(&n.payload)?;
        plain(Ok(if r.restore { Call::SiteRestore(r.site) } else { Call::SiteRevoke(r.site) }))
    }],
    "→ `{}`: the site is lost at once, its work requeued, nothing it sends taken (administrator; over NATS `{\"site\", \"restore\"?}`)");
def!(SITE_RESTORE, "site_revoke", Access::Change,
    [Post "/v1/admin/sites/{id}/restore" => |r| site_id(&r).map(Call::SiteRestore)],
    [],
    "→ `{}`: the site is let back in (administrator)");
def!(AUDIT, "audit", Access::ReadAll("reading the audit"),
    [Get "/v1/admin/audit" => |r| optional(&query_body(&r, &["since_ms", "after_seq", "before_seq", "limit"])?).map(Call::Audit)],
    [subject::AUDIT => |n| plain(optional(&n.payload).map(Call::Audit))],
    "`?since_ms=A&who=ID&limit=N` → `AuditPage` `{entries: [{at_ms, who, action, target, outcome, count, until_ms}], next, unreadable?: [{seq, reason}]}`, oldest first (`after_seq=` the page's `next`); `newest_first=true` (what `meridian audit` asks) goes the other way (`before_seq=` the page's `next`). A stored message that is not audit entries is left out and named in `unreadable`, and the rest is answered");
def!(SESSION, "session", Access::Read,
    [Get "/v1/session" => |_| Ok(Call::Session)],
    [],
    "→ `SessionView` `{who, tenant, admin}`; `POST /v1/session` (with `Authorization`) answers the same and sets the dashboard's session cookie, `DELETE` clears it (see [security](security.md))");
def!(VERSION, "version", Access::Read,
    [Get "/v1/version" => |_| Ok(Call::Version)],
    [subject::VERSION => |n| { empty(&n.payload)?; plain(Ok(Call::Version)) }],
    "→ `VersionView` `{version, wire, format}`: the broker's release, the wire version it speaks and the journal's newest durable format");

pub static METRICS: CallDef = CallDef {
    action: "metrics",
    access: Access::ReadAll("reading the metrics"),
    http: &[Route {
        method: Method::Get,
        path: "/metrics",
        decode: |_| Ok(Call::Metrics),
    }],
    nats: &[],
    content_type: OPENMETRICS,
    doc: "→ the OpenMetrics text Prometheus scrapes (see [observability](observability.md))",
};

/// Every call, in the order docs/api.md shows them.
pub static CALLS: &[&CallDef] = &[
    &SUBMIT,
    &LIST_JOBS,
    &QUEUES,
    &GET_JOB,
    &EXPLAIN,
    &LOGS,
    &TIMELINE,
    &CANCEL,
    &LIST_SITES,
    &DRAIN,
    &SCALE_IN,
    &SERVICE_DEPLOY,
    &SERVICES,
    &SERVICE_DELETE,
    &SERVICE_DEMAND,
    &SERVICE_ROUTES,
    &SERVICE_ROUTES_WATCH,
    &REPORT,
    &SESSION,
    &VERSION,
    &HISTORY,
    &TENANCY,
    &SET_TENANCY,
    &FORMAT,
    &UPGRADE_FORMAT,
    &QUARANTINE,
    &TOKEN_CREATE,
    &TOKEN_LIST,
    &TOKEN_REVOKE,
    &SITE_REVOKE,
    &SITE_RESTORE,
    &AUDIT,
    &METRICS,
];

impl Call {
    /// The call's declaration.
    pub fn def(&self) -> &'static CallDef {
        match self {
            Call::Submit(_) => &SUBMIT,
            Call::ListJobs(_) => &LIST_JOBS,
            Call::Queues(_) => &QUEUES,
            Call::GetJob(_) => &GET_JOB,
            Call::Explain { .. } => &EXPLAIN,
            Call::Cancel(_) => &CANCEL,
            Call::Logs { .. } => &LOGS,
            Call::Timeline(_) => &TIMELINE,
            Call::ListSites(_) => &LIST_SITES,
            Call::Drain { .. } => &DRAIN,
            Call::ScaleIn(_) => &SCALE_IN,
            Call::ServiceDeploy(_) => &SERVICE_DEPLOY,
            Call::Services(_) => &SERVICES,
            Call::ServiceDelete(_) => &SERVICE_DELETE,
            Call::ServiceRoutes(_) => &SERVICE_ROUTES,
            Call::ServiceRoutesWatch(..) => &SERVICE_ROUTES_WATCH,
            Call::ServiceDemand(_) => &SERVICE_DEMAND,
            Call::Report(_) => &REPORT,
            Call::History(_) => &HISTORY,
            Call::Tenancy => &TENANCY,
            Call::SetTenancy(_) => &SET_TENANCY,
            Call::Format => &FORMAT,
            Call::UpgradeFormat => &UPGRADE_FORMAT,
            Call::Quarantine(_) => &QUARANTINE,
            Call::TokenCreate(_) => &TOKEN_CREATE,
            Call::TokenList => &TOKEN_LIST,
            Call::TokenRevoke(_) => &TOKEN_REVOKE,
            Call::SiteRevoke(_) => &SITE_REVOKE,
            Call::SiteRestore(_) => &SITE_RESTORE,
            Call::Audit(_) => &AUDIT,
            Call::Metrics => &METRICS,
            Call::Session => &SESSION,
            Call::Version => &VERSION,
        }
    }
}

/// Runs a call's handler (the caller is already admitted and the call's access judged); the answer is made
/// into bytes here, once.
pub async fn dispatch(h: &BrokerHandle, who: &Principal, call: Call) -> ApiResult<Reply> {
    match call {
        Call::Submit(spec) => {
            let r = jobs::submit(h, who, spec).await?;
            Reply::json(if r.created { 201 } else { 200 }, &r)
        }
        Call::ListJobs(req) => Reply::json(200, &jobs::list(h, who, req).await?),
        Call::Queues(req) => Reply::json(200, &jobs::queues(h, who, req).await?),
        Call::GetJob(id) => Reply::json(200, &jobs::get(h, who, &id).await?),
        Call::Explain { job, all } => Reply::json(200, &jobs::explain(h, who, job, all).await?),
        Call::Cancel(id) => Reply::json(200, &jobs::cancel(h, who, id).await?),
        Call::Logs { job, lines } => Reply::json(200, &jobs::logs(h, who, job, lines).await?),
        Call::Timeline(id) => Reply::json(200, &jobs::timeline(h, who, id).await?),
        Call::ListSites(req) => Reply::json(200, &admin::sites(h, req).await?),
        Call::Drain { site, drain } => Reply::json(200, &admin::drain(h, who, site, drain).await?),
        Call::ScaleIn(r) => Reply::json(200, &services::scale_in(h, who, r).await?),
        Call::ServiceDeploy(spec) => Reply::json(200, &services::deploy(h, who, spec).await?),
        Call::Services(r) => Reply::json(200, &services::show(h, who, r).await?),
        Call::ServiceDelete(r) => Reply::json(200, &services::delete(h, who, r).await?),
        Call::ServiceRoutes(r) => Reply::json(200, &services::routes(h, who, r).await?),
        Call::ServiceRoutesWatch(r, to) => Reply::json(200, &services::watch(h, who, r, to).await?),
        Call::ServiceDemand(r) => Reply::json(200, &services::demand(h, who, r).await?),
        Call::Report(req) => Reply::json(200, &report::report(h, who, req).await?),
        Call::History(req) => Reply::json(200, &report::history(h, req).await?),
        Call::Tenancy => Reply::json(200, &admin::tenancy(h).await?),
        Call::SetTenancy(toml) => Reply::json(200, &admin::set_tenancy(h, who, toml).await?),
        Call::Format => Reply::json(200, &admin::format(h).await?),
        Call::UpgradeFormat => Reply::json(200, &admin::upgrade_format(h, who).await?),
        Call::Quarantine(seq) => Reply::json(200, &admin::quarantine(h, who, seq).await?),
        Call::TokenCreate(req) => Reply::json(201, &admin::create_token(h, who, req).await?),
        Call::TokenList => Reply::json(200, &admin::tokens(h).await?),
        Call::TokenRevoke(id) => Reply::json(200, &admin::revoke_token(h, who, id).await?),
        Call::SiteRevoke(site) => Reply::json(200, &admin::revoke_site(h, who, site, false).await?),
        Call::SiteRestore(site) => Reply::json(200, &admin::revoke_site(h, who, site, true).await?),
        Call::Audit(req) => Reply::json(200, &admin::audit(h, req).await?),
        Call::Metrics => Ok(Reply {
            status: 200,
            body: admin::metrics(h).await?.into_bytes(),
        }),
        Call::Session => Reply::json(200, &admin::session(who)),
        Call::Version => Reply::json(200, &admin::version()),
    }
}
