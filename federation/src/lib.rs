//! The wire contract between Meridian's processes, version 1.
//!
//! This crate alone knows the JSON shapes of NATS messages and HTTP bodies and the NATS subject names. Every
//! message carries `v`; [`codec::decode`] checks size, syntax, version and field values before anyone acts on
//! it, and answers with a [`WireError`] that names the field and the problem.
//!
//! Amounts that are summed (money, energy, carbon) are integers: micro-USD, watt-hours, grams CO2e.

pub mod codec;
pub mod error;
pub mod ids;
pub mod messages;
pub mod names;
pub mod subjects;
pub mod trace;
pub mod validate;

pub use codec::{decode, decode_strict, encode, MAX_MESSAGE_BYTES};
pub use error::{ErrorBody, ErrorCode, WireError};
pub use ids::{IdError, JobId, SiteId, TenantId};
pub use messages::*;
pub use names::{ModelName, PoolName, QueueName, ServiceName};

/// The wire version this build speaks.
pub const WIRE_VERSION: u32 = 1;

/// NATS server URLs from a comma-separated list (`nats://a:4222,nats://b:4222`): a client given several
/// fails over between them.
pub fn nats_servers(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
