//! Execution backends and device probes used by the site agent.
//!
//! - [`local`]: runs a job's command as a local process group under a small supervising shim, so that a
//!   cancel, or the death of the agent, stops every process of the job.
//! - [`probe`]: device discovery (NVIDIA GPUs through NVML) turned into plain pool descriptions.

pub mod local;
pub mod probe;

/// Errors of adapters, with whether trying again could help.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("could not start job process: {0}")]
    Spawn(std::io::Error),
    #[error("could not open log file {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error("device probe {probe} unavailable: {reason}")]
    ProbeUnavailable { probe: &'static str, reason: String },
    #[error("device probe {probe} failed: {reason}")]
    ProbeFailed { probe: &'static str, reason: String },
}

impl AdapterError {
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AdapterError::Spawn(_) | AdapterError::ProbeFailed { .. }
        )
    }
}
