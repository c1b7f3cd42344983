//! Errors of the core's parsers and lookups (a step's refusal is `reactor::StepError`). None is retryable: the
//! same input fails the same way. Messages say what is wrong and where.

use meridian_federation::{QueueName, TenantId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A configuration text — tenancy file, throughput table, round-trip table, GeoJSON region — is not
    /// acceptable.
    #[error("{problem}")]
    Config { problem: String },
    /// A job names a queue the tenancy does not have.
    #[error("unknown queue {queue:?}; queues: {known}")]
    UnknownQueue { queue: QueueName, known: String },
    /// A job names a queue of another tenant.
    #[error("queue {queue:?} belongs to tenant {owner}, not {tenant}")]
    ForeignQueue {
        queue: QueueName,
        owner: TenantId,
        tenant: TenantId,
    },
    /// A job names a priority class the tenancy does not have.
    #[error("unknown priority class {class:?}; classes: {known}")]
    UnknownPriority { class: String, known: String },
    /// A token's role that is not one.
    #[error("{role:?} is not a role: admin, viewer, submit, cancel, watch, report (each optionally :QUEUE,QUEUE), or gateway (optionally :SERVICE,SERVICE)")]
    UnknownRole { role: String },
}

/// A configuration error saying `problem`.
pub(crate) fn config(problem: impl Into<String>) -> CoreError {
    CoreError::Config {
        problem: problem.into(),
    }
}
