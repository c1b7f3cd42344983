//! Execution backends and device probes used by the site agent.
//!
//! - [`backend`]: the one interface the agent drives to run the attempts it accepts (submit, cancel, poll,
//!   take back after a restart, logs), with the process and no-op backends.
//! - [`slurm`], [`ec2`]: the batch-system and cloud-burst backends.
//! - [`local`]: runs a job's command as a local process group under a small supervising shim, which stops
//!   every process of the job on a cancel, and keeps it for a restarted agent to take back.
//! - [`probe`]: device discovery (NVIDIA GPUs through NVML) turned into plain pool descriptions.

pub mod backend;
pub mod ec2;
pub mod local;
pub mod probe;
pub mod slurm;

/// Errors of adapters.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// The process could not be started here (retryable: another site, or later, may start it).
    #[error("could not start job process: {0}")]
    Spawn(std::io::Error),
    /// The job's log file could not be opened (retryable once the site's disk is fixed).
    #[error("could not open log file {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    /// The site's own scheduler or provider refused or failed the request (retryable: another site may take
    /// the job).
    #[error("{0}")]
    Backend(String),
    /// No such devices or driver here (not retryable: declared pools are used instead).
    #[error("device probe {probe} unavailable: {reason}")]
    ProbeUnavailable { probe: &'static str, reason: String },
    /// The probe was there but failed (retryable).
    #[error("device probe {probe} failed: {reason}")]
    ProbeFailed { probe: &'static str, reason: String },
}
