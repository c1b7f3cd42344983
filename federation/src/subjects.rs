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
    /// Broker → one agent: [`crate::BrokerHello`], "send me your advert now" (a heartbeat named a generation
    /// the broker has no advert of).
    Hello,
}

impl SiteTopic {
    pub const ALL: [SiteTopic; 9] = [
        SiteTopic::Advert,
        SiteTopic::Heartbeat,
        SiteTopic::Status,
        SiteTopic::Offer,
        SiteTopic::Cancel,
        SiteTopic::Logs,
        SiteTopic::Inventory,
        SiteTopic::Metrics,
        SiteTopic::Hello,
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
            SiteTopic::Hello => "hello",
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
///
/// A caller sends a request on its own subject, `meridian.v1.api.<identity>.<call>` ([`subject`]): nats-server
/// lets an identity publish only under its own name, so the broker knows who asks from the subject alone, and
/// answers only into that identity's inbox (`_INBOX.<identity>.…`). The constants below are the calls.
pub mod api {
    /// [`crate::JobSpec`] → [`crate::SubmitReply`].
    pub const SUBMIT: &str = "jobs.submit";
    /// [`crate::JobListRequest`] → [`crate::JobPage`]: live jobs, then archived ones, a page at a time.
    pub const LIST_JOBS: &str = "jobs.list";
    /// [`crate::QueuesRequest`] → [`crate::QueuesView`]: the live work counted by queue, site and users' place,
    /// and each queue's waiting jobs in the order they are tried.
    pub const QUEUES: &str = "jobs.queues";
    /// [`crate::JobRef`] → [`crate::JobView`].
    pub const GET_JOB: &str = "jobs.get";
    /// [`crate::ExplainRequest`] (a [`crate::JobRef`], with `all` for every site) → [`crate::ExplainView`].
    pub const EXPLAIN: &str = "jobs.explain";
    /// [`crate::JobRef`] → [`crate::JobView`].
    pub const CANCEL: &str = "jobs.cancel";
    /// [`crate::JobRef`] → [`crate::LogsReply`].
    pub const LOGS: &str = "jobs.logs";
    /// [`crate::JobRef`] → [`crate::TimelineView`].
    pub const TIMELINE: &str = "jobs.timeline";
    /// [`crate::Empty`] → `Vec<`[`crate::SiteView`]`>`.
    pub const LIST_SITES: &str = "sites.list";
    /// [`crate::DrainRequest`] → [`crate::SiteView`].
    pub const DRAIN: &str = "sites.drain";
    /// [`crate::ScaleInRequest`] → [`crate::ScaleInReply`].
    pub const SCALE_IN: &str = "services.scale_in";
    /// Deploy or replace a service (`ServiceSpec` → `ServiceView`).
    pub const SERVICE_DEPLOY: &str = "services.deploy";
    /// The services the caller sees (`ServiceRef` with no name → `Vec<ServiceView>`).
    pub const SERVICE_LIST: &str = "services.list";
    /// One service with its replicas, demand and recent changes (`ServiceRef` → `ServiceView`).
    pub const SERVICE_SHOW: &str = "services.show";
    /// Delete a service and stop its replicas (`ServiceRef` → `ScaleInReply`).
    pub const SERVICE_DELETE: &str = "services.delete";
    /// A gateway's report of request rates per user location (`DemandReport` → `Empty`).
    pub const SERVICE_DEMAND: &str = "services.demand";
    /// The routing table of a service (`ServiceRef` → `RoutesView`).
    pub const SERVICE_ROUTES: &str = "services.routes";
    /// A watch of a service's routing table (`RoutesWatchRequest` → `RoutesUpdate`): the reply is the table now,
    /// and every change of it goes to the same reply subject until the lease ends; sending it again renews.
    pub const SERVICE_ROUTES_WATCH: &str = "services.routes.watch";
    /// The metering ledger (`ReportRequest` → `ReportView`).
    pub const REPORT: &str = "report";
    /// Jobs submitted in a window with their attempts, for capacity what-ifs (`HistoryRequest` →
    /// `HistoryView`; an administrator's call).
    pub const HISTORY: &str = "history";
    /// Read or replace the tenancy, with the administrator's token (`TenancyRequest` → `TenancyView`).
    pub const TENANCY: &str = "admin.tenancy";
    /// Read or upgrade the journal's durable format, or set aside the journal message a broker cannot read
    /// (`FormatRequest` → `FormatView`): administrators only.
    pub const JOURNAL_FORMAT: &str = "admin.journal.format";
    /// Create an API token (`TokenCreateRequest` → `TokenCreated`): administrators only.
    pub const TOKEN_CREATE: &str = "admin.tokens.create";
    /// List API tokens (`Empty` → `Vec<TokenView>`): administrators only.
    pub const TOKEN_LIST: &str = "admin.tokens.list";
    /// Revoke an API token (`TokenRevokeRequest` → `TokenView`): administrators only.
    pub const TOKEN_REVOKE: &str = "admin.tokens.revoke";
    /// Revoke a site or let it back in (`SiteRevokeRequest` → `Empty`): administrators only.
    pub const SITE_REVOKE: &str = "admin.sites.revoke";
    /// Read the audit trail (`AuditRequest` → `AuditPage`): administrators only.
    pub const AUDIT: &str = "admin.audit";
    /// The broker's release and the formats it speaks (`Empty` → `VersionView`).
    pub const VERSION: &str = "version";
    /// Every call, for tests and tooling that go through them all.
    pub const CALLS: [&str; 28] = [
        SUBMIT,
        LIST_JOBS,
        QUEUES,
        GET_JOB,
        EXPLAIN,
        CANCEL,
        LOGS,
        TIMELINE,
        LIST_SITES,
        DRAIN,
        SCALE_IN,
        SERVICE_DEPLOY,
        SERVICE_LIST,
        SERVICE_SHOW,
        SERVICE_DELETE,
        SERVICE_DEMAND,
        SERVICE_ROUTES,
        SERVICE_ROUTES_WATCH,
        REPORT,
        HISTORY,
        TENANCY,
        JOURNAL_FORMAT,
        TOKEN_CREATE,
        TOKEN_LIST,
        TOKEN_REVOKE,
        SITE_REVOKE,
        AUDIT,
        VERSION,
    ];
    /// All API subjects, for the broker's subscription.
    pub const ALL: &str = "meridian.v1.api.>";
    /// An identity that names no credential (a client of an insecure broker).
    pub const ANONYMOUS: &str = "anonymous";

    /// The subject on which `identity` makes `call`.
    pub fn subject(identity: &str, call: &str) -> String {
        format!("meridian.v1.api.{identity}.{call}")
    }

    /// Every API subject of one identity: what its permissions let it publish.
    pub fn of(identity: &str) -> String {
        format!("meridian.v1.api.{identity}.>")
    }

    /// Splits an API subject into the caller's identity and the call.
    pub fn parse(subject: &str) -> Option<(&str, &str)> {
        let rest = subject.strip_prefix("meridian.v1.api.")?;
        let (identity, call) = rest.split_once('.')?;
        (!identity.is_empty() && !call.is_empty()).then_some((identity, call))
    }
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
    fn api_subjects_name_their_caller() {
        let s = api::subject("alice", api::SUBMIT);
        assert_eq!(s, "meridian.v1.api.alice.jobs.submit");
        assert_eq!(api::parse(&s), Some(("alice", api::SUBMIT)));
        assert_eq!(
            api::parse(&api::subject("ops", api::JOURNAL_FORMAT)),
            Some(("ops", "admin.journal.format"))
        );
        assert_eq!(api::parse("meridian.v1.api.alice"), None);
        assert_eq!(api::parse("meridian.v1.site.a.advert"), None);
        assert!(s.starts_with(api::of("alice").trim_end_matches('>')));
        let calls: std::collections::BTreeSet<&str> = api::CALLS.into_iter().collect();
        assert_eq!(calls.len(), api::CALLS.len(), "a call listed twice");
    }

    #[test]
    fn wildcards_cover_site_subjects() {
        assert_eq!(all_sites(SiteTopic::Advert), "meridian.v1.site.*.advert");
    }
}
