//! The command-line client: calls the NATS request-reply API and prints tables or JSON.

use anyhow::Context;
use bytes::Bytes;
use meridian_federation::subjects::api;
use meridian_federation::{decode, encode, ApiReply, Empty, JobId, JobRef, JobSpec, WIRE_VERSION};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

#[derive(Clone)]
pub struct Client {
    nats: async_nats::Client,
    /// The NATS identity the calls are made under (their subjects name it).
    caller: String,
    /// The API token, sent in each request's `Authorization` header.
    token: Option<String>,
}

/// The header an API request carries its token in (`Bearer <token>`), on NATS as on HTTP.
pub const AUTHORIZATION: &str = "Authorization";

impl Client {
    pub async fn connect(
        access: &meridian_runtime::access::Access,
        token: Option<String>,
    ) -> anyhow::Result<Self> {
        let nats = access
            .connect("meridian client", Duration::from_secs(5))
            .await?;
        Ok(Client {
            nats,
            caller: access.caller(),
            token,
        })
    }

    /// A client of a local federation, as its operator (the administrator's token).
    pub async fn of(fed: &crate::local::LocalFederation) -> anyhow::Result<Self> {
        Self::connect(&fed.access(), fed.token().map(str::to_owned)).await
    }

    /// The same connection with another token.
    pub fn with_token(&self, token: Option<String>) -> Self {
        Client {
            nats: self.nats.clone(),
            caller: self.caller.clone(),
            token,
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        call: &'static str,
        body: &B,
    ) -> anyhow::Result<T> {
        let payload = encode(body)?;
        self.raw(call, payload).await
    }

    /// One call (a constant of [`api`]) with a body already encoded.
    pub async fn raw<T: DeserializeOwned>(
        &self,
        call: &'static str,
        payload: impl Into<Bytes>,
    ) -> anyhow::Result<T> {
        let subject = api::subject(&self.caller, call);
        let mut headers = async_nats::HeaderMap::new();
        if let Some(t) = &self.token {
            headers.insert(AUTHORIZATION, format!("Bearer {t}").as_str());
        }
        let m = tokio::time::timeout(
            Duration::from_secs(10),
            self.nats
                .request_with_headers(subject, headers, payload.into()),
        )
        .await
        .context("the broker did not answer within 10 s")?
        .context("no broker is answering")?;
        let reply: ApiReply<T> = decode(&m.payload).context("unreadable reply from the broker")?;
        reply.into_result().map_err(|e| {
            // Said for the command line, not for an HTTP client: which flag or variable gives the token.
            let hint = match (e.code, &self.token) {
                (meridian_federation::ErrorCode::Unauthenticated, None) => {
                    " — give one with --token or MERIDIAN_TOKEN (`meridian up` prints the administrator's)"
                }
                (meridian_federation::ErrorCode::Unauthenticated, Some(_)) => {
                    " — the token given with --token or MERIDIAN_TOKEN"
                }
                _ => "",
            };
            anyhow::Error::new(ApiError {
                body: e,
                hint: hint.to_owned(),
            })
        })
    }

    /// Waits until every site of a local federation is up as the broker sees it; an error names how many
    /// came up and where the logs are.
    pub async fn wait_for_sites(
        &self,
        fed: &crate::local::LocalFederation,
        within: Duration,
    ) -> anyhow::Result<()> {
        let want = fed.site_ids().len();
        let mut up = 0;
        let all_up = async {
            loop {
                up = self
                    .sites()
                    .await
                    .map(|s| s.iter().filter(|s| s.up).count())
                    .unwrap_or(0);
                if up == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        if tokio::time::timeout(within, all_up).await.is_err() {
            anyhow::bail!(
                "only {up} of {want} sites came up; logs in {}",
                fed.dir.display()
            );
        }
        Ok(())
    }

    pub async fn submit(&self, spec: &JobSpec) -> anyhow::Result<meridian_federation::SubmitReply> {
        self.call(api::SUBMIT, spec).await
    }

    pub async fn submit_raw(
        &self,
        body: Vec<u8>,
    ) -> anyhow::Result<meridian_federation::SubmitReply> {
        self.raw(api::SUBMIT, body).await
    }

    pub async fn tenancy(
        &self,
        toml: Option<String>,
    ) -> anyhow::Result<meridian_federation::TenancyView> {
        let req = meridian_federation::TenancyRequest {
            v: WIRE_VERSION,
            token: None,
            toml,
        };
        self.call(api::TENANCY, &req).await
    }

    /// The journal's durable format; with `upgrade`, upgraded first to the newest the broker knows.
    pub async fn journal_format(
        &self,
        upgrade: bool,
    ) -> anyhow::Result<meridian_federation::FormatView> {
        self.journal(upgrade, None).await
    }

    /// Sets aside the journal message the broker cannot read (administrators only).
    pub async fn journal_quarantine(
        &self,
        seq: u64,
    ) -> anyhow::Result<meridian_federation::FormatView> {
        self.journal(false, Some(seq)).await
    }

    async fn journal(
        &self,
        upgrade: bool,
        quarantine: Option<u64>,
    ) -> anyhow::Result<meridian_federation::FormatView> {
        let req = meridian_federation::FormatRequest {
            v: WIRE_VERSION,
            token: None,
            upgrade,
            quarantine,
        };
        self.call(api::JOURNAL_FORMAT, &req).await
    }

    pub async fn report(
        &self,
        req: &meridian_federation::ReportRequest,
    ) -> anyhow::Result<meridian_federation::ReportView> {
        self.call(api::REPORT, req).await
    }

    /// The jobs submitted from `from_ms` on, live and archived (an administrator's call).
    pub async fn history(
        &self,
        from_ms: Option<u64>,
    ) -> anyhow::Result<meridian_federation::HistoryView> {
        let req = meridian_federation::HistoryRequest {
            v: meridian_federation::WIRE_VERSION,
            from_ms,
        };
        self.call(api::HISTORY, &req).await
    }

    /// The live work by queue, site and users' place, with each queue's first waiting jobs.
    pub async fn queues(
        &self,
        req: &meridian_federation::QueuesRequest,
    ) -> anyhow::Result<meridian_federation::QueuesView> {
        self.call(api::QUEUES, req).await
    }

    /// One page of jobs.
    pub async fn jobs_page(
        &self,
        req: &meridian_federation::JobListRequest,
    ) -> anyhow::Result<meridian_federation::JobPage> {
        self.call(api::LIST_JOBS, req).await
    }

    /// Every job the request selects, page by page, up to `limit` of them.
    pub async fn jobs_matching(
        &self,
        mut req: meridian_federation::JobListRequest,
        limit: Option<usize>,
    ) -> anyhow::Result<Vec<meridian_federation::JobView>> {
        let mut out = Vec::new();
        loop {
            if let Some(l) = limit {
                let left = l.saturating_sub(out.len());
                if left == 0 {
                    return Ok(out);
                }
                req.limit = Some(left.min(meridian_federation::MAX_PAGE as usize) as u32);
            }
            let page = self.jobs_page(&req).await?;
            out.extend(page.jobs);
            match page.next {
                Some(next) => req.cursor = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// Every job, live and archived.
    pub async fn jobs(&self) -> anyhow::Result<Vec<meridian_federation::JobView>> {
        self.jobs_matching(Default::default(), None).await
    }

    pub async fn job(&self, job: &JobId) -> anyhow::Result<meridian_federation::JobView> {
        self.call(api::GET_JOB, &job_ref(job)).await
    }

    pub async fn explain(&self, job: &JobId) -> anyhow::Result<meridian_federation::ExplainView> {
        self.explain_sites(job, false).await
    }

    /// [`Self::explain`]; with `all`, every site of the federation as placement weighs the job now.
    pub async fn explain_sites(
        &self,
        job: &JobId,
        all: bool,
    ) -> anyhow::Result<meridian_federation::ExplainView> {
        let req = meridian_federation::ExplainRequest {
            v: WIRE_VERSION,
            job: job.clone(),
            all,
        };
        self.call(api::EXPLAIN, &req).await
    }

    pub async fn cancel(&self, job: &JobId) -> anyhow::Result<meridian_federation::JobView> {
        self.call(api::CANCEL, &job_ref(job)).await
    }

    pub async fn logs(&self, job: &JobId) -> anyhow::Result<meridian_federation::LogsReply> {
        self.call(api::LOGS, &job_ref(job)).await
    }

    pub async fn timeline(&self, job: &JobId) -> anyhow::Result<meridian_federation::TimelineView> {
        self.call(api::TIMELINE, &job_ref(job)).await
    }

    pub async fn scale_in(
        &self,
        tenant: &meridian_federation::TenantId,
        service: &meridian_federation::ServiceName,
        remove: u32,
    ) -> anyhow::Result<meridian_federation::ScaleInReply> {
        self.call(
            api::SCALE_IN,
            &meridian_federation::ScaleInRequest {
                v: WIRE_VERSION,
                tenant: tenant.clone(),
                service: service.clone(),
                remove,
            },
        )
        .await
    }

    /// Deploys a service from its file's body (JSON).
    pub async fn deploy_service(
        &self,
        body: Vec<u8>,
    ) -> anyhow::Result<meridian_federation::ServiceView> {
        self.raw(api::SERVICE_DEPLOY, body).await
    }

    fn service_ref(
        tenant: Option<&meridian_federation::TenantId>,
        name: Option<&meridian_federation::ServiceName>,
    ) -> meridian_federation::ServiceRef {
        meridian_federation::ServiceRef {
            v: WIRE_VERSION,
            tenant: tenant.cloned(),
            name: name.cloned(),
        }
    }

    pub async fn services(
        &self,
        tenant: Option<&meridian_federation::TenantId>,
    ) -> anyhow::Result<Vec<meridian_federation::ServiceView>> {
        self.call(api::SERVICE_LIST, &Self::service_ref(tenant, None))
            .await
    }

    pub async fn service(
        &self,
        tenant: Option<&meridian_federation::TenantId>,
        name: &meridian_federation::ServiceName,
    ) -> anyhow::Result<meridian_federation::ServiceView> {
        self.call(api::SERVICE_SHOW, &Self::service_ref(tenant, Some(name)))
            .await
    }

    pub async fn delete_service(
        &self,
        tenant: Option<&meridian_federation::TenantId>,
        name: &meridian_federation::ServiceName,
    ) -> anyhow::Result<meridian_federation::ScaleInReply> {
        self.call(api::SERVICE_DELETE, &Self::service_ref(tenant, Some(name)))
            .await
    }

    pub async fn service_routes(
        &self,
        tenant: Option<&meridian_federation::TenantId>,
        name: &meridian_federation::ServiceName,
    ) -> anyhow::Result<meridian_federation::RoutesView> {
        self.call(api::SERVICE_ROUTES, &Self::service_ref(tenant, Some(name)))
            .await
    }

    pub async fn report_demand(
        &self,
        report: &meridian_federation::DemandReport,
    ) -> anyhow::Result<Empty> {
        self.call(api::SERVICE_DEMAND, report).await
    }

    pub async fn sites(&self) -> anyhow::Result<Vec<meridian_federation::SiteView>> {
        self.sites_in(None).await
    }

    /// The sites in one state (all with `None`), by id, read a page at a time.
    pub async fn sites_in(
        &self,
        state: Option<meridian_federation::SiteState>,
    ) -> anyhow::Result<Vec<meridian_federation::SiteView>> {
        let limit = meridian_federation::MAX_PAGE;
        let mut out: Vec<meridian_federation::SiteView> = Vec::new();
        loop {
            let req = meridian_federation::SiteListRequest {
                v: WIRE_VERSION,
                state,
                after: out.last().map(|s| s.site.clone()),
                limit: Some(limit),
            };
            let page: Vec<meridian_federation::SiteView> = self.call(api::LIST_SITES, &req).await?;
            if page.is_empty() {
                return Ok(out);
            }
            out.extend(page);
        }
    }

    pub async fn drain(
        &self,
        site: &meridian_federation::SiteId,
        drain: bool,
    ) -> anyhow::Result<meridian_federation::SiteView> {
        self.call(
            api::DRAIN,
            &meridian_federation::DrainRequest {
                v: WIRE_VERSION,
                site: site.clone(),
                drain,
            },
        )
        .await
    }
}

impl Client {
    /// Creates an API token (administrators only); the reply holds the token, shown this once.
    pub async fn token_create(
        &self,
        req: &meridian_federation::TokenCreateRequest,
    ) -> anyhow::Result<meridian_federation::TokenCreated> {
        self.call(api::TOKEN_CREATE, req).await
    }

    pub async fn tokens(&self) -> anyhow::Result<Vec<meridian_federation::TokenView>> {
        self.call(api::TOKEN_LIST, &Empty { v: WIRE_VERSION }).await
    }

    pub async fn token_revoke(&self, id: &str) -> anyhow::Result<meridian_federation::TokenView> {
        let req = meridian_federation::TokenRevokeRequest {
            v: WIRE_VERSION,
            id: id.to_owned(),
        };
        self.call(api::TOKEN_REVOKE, &req).await
    }

    /// Revokes a site (or lets it back in, `restore`).
    pub async fn site_revoke(
        &self,
        site: &meridian_federation::SiteId,
        restore: bool,
    ) -> anyhow::Result<Empty> {
        let req = meridian_federation::SiteRevokeRequest {
            v: WIRE_VERSION,
            site: site.clone(),
            restore,
        };
        self.call(api::SITE_REVOKE, &req).await
    }

    /// A page of the audit trail.
    pub async fn audit(
        &self,
        req: &meridian_federation::AuditRequest,
    ) -> anyhow::Result<meridian_federation::AuditPage> {
        self.call(api::AUDIT, req).await
    }
}

fn job_ref(job: &JobId) -> JobRef {
    JobRef {
        v: WIRE_VERSION,
        job: job.clone(),
    }
}

/// The broker's refusal of a call, as the command line says it: the message, the field it names and, for a
/// missing token, which flag or variable gives one.
#[derive(Debug)]
pub struct ApiError {
    pub body: meridian_federation::ErrorBody,
    pub hint: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.body.message)?;
        if let Some(field) = &self.body.field {
            write!(f, " (field {field})")?;
        }
        write!(f, "{}", self.hint)
    }
}

impl std::error::Error for ApiError {}

/// Says a refusal of what a TOML file held in the file's own terms: the line and key the field path names
/// (`resources.count` → `job.toml:7: resources.count: …`), without the position in the JSON the file was sent
/// as. Any other error is returned as it is.
pub fn in_file_terms(e: anyhow::Error, path: &std::path::Path) -> anyhow::Error {
    let is_toml = path.extension().is_some_and(|x| x == "toml");
    let Some(api) = e.downcast_ref::<ApiError>() else {
        return e;
    };
    let (Some(field), true) = (&api.body.field, is_toml) else {
        return e;
    };
    let Ok(text) = std::fs::read_to_string(crate::local::resolve(path)) else {
        return e;
    };
    // serde_json's "at line 1 column 43" is a place in the converted JSON, not in the user's file.
    let message = match api.body.message.find(" at line ") {
        Some(i) => &api.body.message[..i],
        None => &api.body.message,
    };
    match toml_line_of(&text, field) {
        Some(line) => anyhow::anyhow!("{}:{line}: {field}: {message}", path.display()),
        None => anyhow::anyhow!("{}: {field}: {message}", path.display()),
    }
}

/// The line (from 1) where a TOML document sets the value at `path` (`a.b`, `users[0].location.lat`): the
/// line of its key (or, for an array's element, of the element).
pub fn toml_line_of(text: &str, path: &str) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let mut steps: Vec<(&str, Option<usize>)> = Vec::new();
    for part in path.split('.') {
        let mut pieces = part.split('[');
        steps.push((pieces.next()?, None));
        for index in pieces {
            steps.push(("", Some(index.trim_end_matches(']').parse().ok()?)));
        }
    }
    let root = DeValue::Table(DeTable::parse(text).ok()?.into_inner());
    let mut value = &root;
    let mut start = None;
    for (key, index) in steps
        .into_iter()
        .filter(|(k, i)| !k.is_empty() || i.is_some())
    {
        value = match (value, index) {
            (DeValue::Table(t), None) => {
                let (k, v) = t.iter().find(|(k, _)| k.get_ref().as_ref() == key)?;
                start = Some(k.span().start);
                v.get_ref()
            }
            (DeValue::Array(a), Some(i)) => {
                let v = a.get(i)?;
                start = Some(v.span().start);
                v.get_ref()
            }
            _ => return None,
        };
    }
    Some(text[..start?.min(text.len())].matches('\n').count() + 1)
}

/// Reads a job spec from a TOML or JSON file (by extension; JSON when unsure). The `v` field may be omitted.
pub fn read_job_file(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let text = std::fs::read_to_string(crate::local::resolve(path))
        .with_context(|| format!("reading {}", path.display()))?;
    let is_toml = path.extension().is_some_and(|e| e == "toml");
    if is_toml {
        let value: toml::Value =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(serde_json::to_vec(&value)?)
    } else {
        Ok(text.into_bytes())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A refusal's field path is found in the user's TOML file: keys in tables, inline tables and arrays of
    /// tables.
    #[test]
    fn a_field_path_is_found_on_its_line_of_the_toml_file() {
        let text = "v = 1\ntenant = \"t\"\n\n[resources]\nkind = \"gpu\"\ncount = -1\n\n\
                    [[users]]\nlocation = { lat = 1.0, lon = 2.0 }\n[[users]]\nlocation = { lat = 91.0, lon = 2.0 }\n\
                    [constraints]\nresidancy = \"eu\"\n";
        assert_eq!(toml_line_of(text, "tenant"), Some(2));
        assert_eq!(toml_line_of(text, "resources.count"), Some(6));
        assert_eq!(toml_line_of(text, "users[1].location.lat"), Some(11));
        assert_eq!(toml_line_of(text, "constraints.residancy"), Some(13));
        assert_eq!(toml_line_of(text, "missing"), None);
        assert_eq!(toml_line_of(text, "users[7].location"), None);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        std::fs::write(&path, text).unwrap();
        let refused = anyhow::Error::new(ApiError {
            body: meridian_federation::ErrorBody::new(
                meridian_federation::ErrorCode::Invalid,
                Some("resources.count".into()),
                "invalid value: integer `-1`, expected u32 at line 1 column 43",
            ),
            hint: String::new(),
        });
        let said = in_file_terms(refused, &path).to_string();
        assert_eq!(
            said,
            format!(
                "{}:6: resources.count: invalid value: integer `-1`, expected u32",
                path.display()
            )
        );
    }

    /// A TOML job file states the money-and-carbon policies as docs/jobs.md shows them.
    #[test]
    fn toml_job_files_take_the_carbon_policies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        for (policy, want) in [
            (
                "{ carbon_price_usd_per_t = 190 }",
                meridian_federation::Policy::CarbonPriceUsdPerT(190.0),
            ),
            (
                "{ max_cost_premium = 0.05 }",
                meridian_federation::Policy::MaxCostPremium(0.05),
            ),
        ] {
            std::fs::write(
                &path,
                format!(
                    "v = 1\ntenant = \"t\"\nidempotency_key = \"k\"\nkind = \"batch\"\npolicy = {policy}\n\
                     [resources]\nkind = \"gpu\"\ncount = 1\n[run]\ncommand = \"true\"\n"
                ),
            )
            .unwrap();
            let bytes = read_job_file(&path).unwrap();
            let spec: meridian_federation::JobSpec = meridian_federation::decode(&bytes).unwrap();
            assert_eq!(spec.policy, Some(want));
        }
    }
}
