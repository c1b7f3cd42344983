//! What goes into a reactor step and what comes out of it.

use crate::journal::JournalError;
use meridian_federation::{
    CancelAttempt, ErrorCode, Heartbeat, Inventory, InventoryMark, JobId, JobSpec, JobStatus,
    Offer, OfferOutcome, ServiceName, SiteAdvert, SiteId, SubmitReply, TenantId,
};

/// Everything that can change broker state.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Advert(SiteAdvert),
    Heartbeat(Heartbeat),
    Submit(JobSpec),
    Cancel(JobId),
    OfferAnswer {
        site: SiteId,
        job: JobId,
        attempt: u32,
        outcome: OfferOutcome,
        /// The agent's inventory mark once it accepted (see [`meridian_federation::InventoryMark`]).
        #[serde(default)]
        mark: Option<InventoryMark>,
    },
    Status(JobStatus),
    Drain {
        site: SiteId,
        drain: bool,
    },
    /// Stop `remove` replicas of a tenant's service (see [`Reactor::scale_in_order`]).
    ScaleIn {
        tenant: TenantId,
        service: ServiceName,
        remove: u32,
    },
    /// Replace the queues, quotas, priority classes and budgets (the tenancy file's text). Journaled, so an
    /// administrator's change survives restarts.
    SetTenancy {
        toml: String,
        /// Set from the broker's tenancy file at start (not through the API).
        #[serde(default)]
        from_file: bool,
    },
    /// The broker could not act for a while (it took over from another, its journal stalled, or its own NATS
    /// connection was down): offers still unanswered get their full timeout again from now, since their answers
    /// may have been waiting unheard; and site liveness starts afresh.
    Resume,
    /// Time passed. From format 2: the retry and burst timers of waiting jobs; sites lost and offers given up
    /// are decided before it, from liveness, and journaled as [`Event::SiteLost`] and [`Event::OfferExpired`].
    /// In format 1 the tick itself judged them, again on replay, from liveness that replay does not have.
    Tick,
    /// The live broker declared a site lost: no heartbeat for the loss timeout. Decided from liveness (soft
    /// state, not journaled), so journaled as a decision that replay applies and never re-decides. (Format 2.)
    SiteLost {
        site: SiteId,
    },
    /// The live broker gave up an offer that was not answered within the offer timeout. (Format 2.)
    OfferExpired {
        job: JobId,
        attempt: u32,
    },
    /// An agent's whole inventory, asked for when its heartbeat's digest differed from what the broker expects.
    /// Liveness, like a heartbeat: not journaled; what it decides is.
    Inventory {
        site: SiteId,
        inventory: Inventory,
    },
    /// The live broker found that a site no longer has an attempt it had accepted (an inventory from after
    /// the acceptance omits it, and its end was never reported): the attempt is over, run for `runtime_ms`,
    /// and the job is requeued. (Format 2.)
    AttemptLost {
        site: SiteId,
        job: JobId,
        attempt: u32,
        runtime_ms: u64,
    },
    /// The shell stored these finished jobs in the archive: they leave the live state (their metering, fair
    /// share and idempotency keys stay in aggregates). (Format 2.)
    Archived {
        jobs: Vec<JobId>,
    },
    /// Write the journal in durable format `to` from now on: an operator's explicit upgrade, once no broker of
    /// an earlier release needs to read it. (Format 2.)
    UpgradeFormat {
        to: u32,
    },
    /// An administrator created an API token (only its hash is kept). (Format 3.)
    TokenCreated(crate::access::TokenRecord),
    /// An administrator revoked an API token: it is refused from now on. (Format 3.)
    TokenRevoked {
        id: String,
    },
    /// An administrator revoked a site (its credential was revoked too): it is lost now, its work requeued, and
    /// nothing it sends is taken until it is restored. (Format 3.)
    SiteRevoked {
        site: SiteId,
    },
    /// An administrator let a revoked site back in (it was enrolled again with a new credential). (Format 3.)
    SiteRestored {
        site: SiteId,
    },
    /// A tenant deployed a service, or replaced its spec (the autoscaler's decisions that follow are journaled
    /// as the submissions and cancellations of its replicas). (Format 5.)
    ServiceDeployed(meridian_federation::ServiceSpec),
    /// A tenant deleted a service: its replicas are stopped. (Format 5.)
    ServiceDeleted {
        tenant: TenantId,
        service: ServiceName,
    },
}

/// A message for the shell to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Offer(Offer),
    Cancel {
        site: SiteId,
        cancel: CancelAttempt,
    },
    /// Ask the site's agent for its whole inventory; the answer comes back as [`Event::Inventory`].
    AskInventory {
        site: SiteId,
    },
    /// Ask the site's agent for its advert: a heartbeat named a generation the broker holds no advert of (an
    /// advert was lost on the way); the answer comes back as an advert.
    AskAdvert {
        site: SiteId,
    },
}

/// What a step answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Submitted(SubmitReply),
    Job(JobId),
    Site(SiteId),
    Stopping(Vec<JobId>),
    Done,
}

/// Why a step was refused; nothing was journaled or changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepError {
    /// The job or site named does not exist (not retryable).
    #[error("{what} not found")]
    NotFound { what: String },
    /// A field's value is not acceptable now (not retryable as it stands).
    #[error("invalid `{field}`: {problem}")]
    Invalid { field: String, problem: String },
    /// An idempotency key reused with another spec (not retryable).
    #[error("{0}")]
    Conflict(String),
    /// The tenant's budget refuses the job (retryable in the next budget period).
    #[error("{0}")]
    OverBudget(String),
    /// The sender may not say this: a site speaking of an attempt another site holds, or a revoked site (not
    /// retryable; counted and audited by the shell).
    #[error("{0}")]
    Refused(String),
    /// The journal could not take the step (retryable).
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl StepError {
    pub fn code(&self) -> ErrorCode {
        match self {
            StepError::NotFound { .. } => ErrorCode::NotFound,
            StepError::Invalid { .. } => ErrorCode::Invalid,
            StepError::Conflict(_) => ErrorCode::Conflict,
            StepError::OverBudget(_) => ErrorCode::OverBudget,
            StepError::Refused(_) => ErrorCode::Forbidden,
            StepError::Journal(_) => ErrorCode::Unavailable,
        }
    }

    pub fn field(&self) -> Option<String> {
        match self {
            StepError::Invalid { field, .. } => Some(field.clone()),
            _ => None,
        }
    }
}
