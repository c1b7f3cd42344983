//! Every NATS subject Meridian uses. Site subjects carry the site id as their fourth token
//! (`meridian.v1.site.<id>.<what>`), so a per-site account can be confined to `meridian.v1.site.<id>.>`.
//!
//! Trace context travels in NATS message headers named [`TRACEPARENT_HEADER`] and [`TRACESTATE_HEADER`]
//! (W3C Trace Context), never in the JSON bodies.

use crate::ids::SiteId;

pub const PREFIX: &str = "meridian.v1";
pub const TRACEPARENT_HEADER: &str = "traceparent";
pub const TRACESTATE_HEADER: &str = "tracestate";

/// What a site subject carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteTopic {
    /// Agent → broker: [`crate::SiteAdvert`].
    Advert,
    /// Agent → broker: [`crate::Heartbeat`].
    Heartbeat,
    /// Agent → broker, request: [`crate::JobStatus`], answered with [`crate::StatusAck`].
    Status,
    /// Broker → agent, request: [`crate::Offer`], answered with [`crate::OfferReply`].
    Offer,
    /// Broker → agent: [`crate::CancelAttempt`].
    Cancel,
    /// Broker → agent, request: [`crate::LogsRequest`], answered with [`crate::LogsReply`].
    Logs,
    /// Broker → agent, request: [`crate::InventoryRequest`], answered with the full [`crate::Inventory`].
    Inventory,
    /// Agent → broker: [`crate::SiteMetrics`].
    Metrics,
}

impl SiteTopic {
    pub const ALL: [SiteTopic; 8] = [
        SiteTopic::Advert,
        SiteTopic::Heartbeat,
        SiteTopic::Status,
        SiteTopic::Offer,
        SiteTopic::Cancel,
        SiteTopic::Logs,
        SiteTopic::Inventory,
        SiteTopic::Metrics,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SiteTopic::Advert => "advert",
            SiteTopic::Heartbeat => "heartbeat",
            SiteTopic::Status => "status",
            SiteTopic::Offer => "offer",
            SiteTopic::Cancel => "cancel",
            SiteTopic::Logs => "logs",
            SiteTopic::Inventory => "inventory",
            SiteTopic::Metrics => "metrics",
        }
    }
}

/// The subject of `topic` for one site.
pub fn site(site: &SiteId, topic: SiteTopic) -> String {
    format!("{PREFIX}.site.{site}.{}", topic.as_str())
}

/// The wildcard subject of `topic` over all sites (for the broker's subscriptions).
pub fn all_sites(topic: SiteTopic) -> String {
    format!("{PREFIX}.site.*.{}", topic.as_str())
}

/// Splits a site subject into its site id and topic.
pub fn parse_site(subject: &str) -> Option<(SiteId, SiteTopic)> {
    let rest = subject.strip_prefix(PREFIX)?.strip_prefix(".site.")?;
    let (id, topic) = rest.split_once('.')?;
    let topic = SiteTopic::ALL.into_iter().find(|t| t.as_str() == topic)?;
    Some((SiteId::new(id).ok()?, topic))
}

/// The broker's journal: a JetStream stream of this name, on this subject, holds every durable broker event.
pub const JOURNAL_STREAM: &str = "MERIDIAN_JOURNAL";
pub const JOURNAL: &str = "meridian.v1.journal";

/// Finished jobs leave the broker's live state into this stream, one message per job on [`archived_job`]'s
/// subject (the latest kept), so any one can be read back by its id.
pub const ARCHIVE_STREAM: &str = "MERIDIAN_ARCHIVE";
pub const ARCHIVE_JOBS: &str = "meridian.v1.archive.job.*";

/// The subject of one archived job.
pub fn archived_job(job: &crate::JobId) -> String {
    format!("meridian.v1.archive.job.{job}")
}

/// The metering ledger of archived jobs: one message per archived batch, what reports read.
pub const LEDGER_STREAM: &str = "MERIDIAN_LEDGER";
pub const LEDGER: &str = "meridian.v1.ledger";

/// The audit trail: one message per journal batch with the audited actions it held, and one per interval with
/// the refusals counted in it (each a JSON array of [`crate::AuditEntry`]).
pub const AUDIT_STREAM: &str = "MERIDIAN_AUDIT";
pub const AUDIT: &str = "meridian.v1.audit";

/// Broker → all agents: [`crate::BrokerHello`]; agents answer by sending their advert.
pub const BROKER_HELLO: &str = "meridian.v1.broker.hello";

/// The request-reply API for programs. Each request body is shown; each reply is an [`crate::ApiReply`].
pub mod api {
    /// [`crate::JobSpec`] → [`crate::SubmitReply`].
    pub const SUBMIT: &str = "meridian.v1.api.jobs.submit";
    /// [`crate::JobListRequest`] → [`crate::JobPage`]: live jobs, then archived ones, a page at a time.
    pub const LIST_JOBS: &str = "meridian.v1.api.jobs.list";
    /// [`crate::JobRef`] → [`crate::JobView`].
    pub const GET_JOB: &str = "meridian.v1.api.jobs.get";
    /// [`crate::JobRef`] → [`crate::ExplainView`].
    pub const EXPLAIN: &str = "meridian.v1.api.jobs.explain";
    /// [`crate::JobRef`] → [`crate::JobView`].
    pub const CANCEL: &str = "meridian.v1.api.jobs.cancel";
    /// [`crate::JobRef`] → [`crate::LogsReply`].
    pub const LOGS: &str = "meridian.v1.api.jobs.logs";
    /// [`crate::JobRef`] → [`crate::TimelineView`].
    pub const TIMELINE: &str = "meridian.v1.api.jobs.timeline";
    /// [`crate::Empty`] → `Vec<`[`crate::SiteView`]`>`.
    pub const LIST_SITES: &str = "meridian.v1.api.sites.list";
    /// [`crate::DrainRequest`] → [`crate::SiteView`].
    pub const DRAIN: &str = "meridian.v1.api.sites.drain";
    /// [`crate::ScaleInRequest`] → [`crate::ScaleInReply`].
    pub const SCALE_IN: &str = "meridian.v1.api.services.scale_in";
    /// Deploy or replace a service (`ServiceSpec` → `ServiceView`).
    pub const SERVICE_DEPLOY: &str = "meridian.v1.api.services.deploy";
    /// The services the caller sees (`ServiceRef` with no name → `Vec<ServiceView>`).
    pub const SERVICE_LIST: &str = "meridian.v1.api.services.list";
    /// One service with its replicas, demand and recent changes (`ServiceRef` → `ServiceView`).
    pub const SERVICE_SHOW: &str = "meridian.v1.api.services.show";
    /// Delete a service and stop its replicas (`ServiceRef` → `ScaleInReply`).
    pub const SERVICE_DELETE: &str = "meridian.v1.api.services.delete";
    /// A gateway's report of request rates per user location (`DemandReport` → `Empty`).
    pub const SERVICE_DEMAND: &str = "meridian.v1.api.services.demand";
    /// The routing table of a service (`ServiceRef` → `RoutesView`).
    pub const SERVICE_ROUTES: &str = "meridian.v1.api.services.routes";
    /// A watch of a service's routing table (`RoutesWatchRequest` → `RoutesUpdate`): the reply is the table now,
    /// and every change of it goes to the same reply subject until the lease ends; sending it again renews.
    pub const SERVICE_ROUTES_WATCH: &str = "meridian.v1.api.services.routes.watch";
    /// The metering ledger (`ReportRequest` → `ReportView`).
    pub const REPORT: &str = "meridian.v1.api.report";
    /// Jobs submitted in a window with their attempts, for capacity what-ifs (`HistoryRequest` →
    /// `HistoryView`; an administrator's call).
    pub const HISTORY: &str = "meridian.v1.api.history";
    /// Read or replace the tenancy, with the administrator's token (`TenancyRequest` → `TenancyView`).
    pub const TENANCY: &str = "meridian.v1.api.admin.tenancy";
    /// Read or upgrade the journal's durable format, or set aside the journal message a broker cannot read
    /// (`FormatRequest` → `FormatView`): administrators only.
    pub const JOURNAL_FORMAT: &str = "meridian.v1.api.admin.journal.format";
    /// Create an API token (`TokenCreateRequest` → `TokenCreated`): administrators only.
    pub const TOKEN_CREATE: &str = "meridian.v1.api.admin.tokens.create";
    /// List API tokens (`Empty` → `Vec<TokenView>`): administrators only.
    pub const TOKEN_LIST: &str = "meridian.v1.api.admin.tokens.list";
    /// Revoke an API token (`TokenRevokeRequest` → `TokenView`): administrators only.
    pub const TOKEN_REVOKE: &str = "meridian.v1.api.admin.tokens.revoke";
    /// Revoke a site or let it back in (`SiteRevokeRequest` → `Empty`): administrators only.
    pub const SITE_REVOKE: &str = "meridian.v1.api.admin.sites.revoke";
    /// Read the audit trail (`AuditRequest` → `AuditPage`): administrators only.
    pub const AUDIT: &str = "meridian.v1.api.admin.audit";
    /// All API subjects, for the broker's subscription.
    pub const ALL: &str = "meridian.v1.api.>";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_subjects_round_trip() {
        let id = SiteId::new("edge-fra").expect("valid id");
        for t in SiteTopic::ALL {
            let s = site(&id, t);
            assert!(s.starts_with("meridian.v1.site.edge-fra."));
            assert_eq!(parse_site(&s), Some((id.clone(), t)));
        }
    }

    #[test]
    fn foreign_subjects_do_not_parse() {
        assert_eq!(parse_site("meridian.v1.site.a.unknown"), None);
        assert_eq!(parse_site("other.v1.site.a.advert"), None);
        assert_eq!(parse_site("meridian.v1.site.a"), None);
    }

    #[test]
    fn wildcards_cover_site_subjects() {
        assert_eq!(all_sites(SiteTopic::Advert), "meridian.v1.site.*.advert");
    }
}
