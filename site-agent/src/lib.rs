//! Meridian's site agent: describes its site from a TOML file (and NVML where present), advertises capacity
//! over NATS, answers offers, runs accepted work through the local-process adapter and reports its status.
//! It never decides placement.

pub use meridian_agent_core::{config, core};
pub mod outbox;
pub mod runtime;
