//! Meridian's pure core: placement, queues and quotas, budgets, the metering ledger and the reactor over broker
//! state. No tokio, NATS or clocks (this crate depends on none of them, so the compiler keeps the rule). Time is
//! passed in as milliseconds since the Unix epoch.

pub mod access;
pub mod autoscale;
pub mod budget;
pub mod crashloop;
pub mod durable;
pub mod error;
pub mod index;
pub mod journal;
pub mod latency;
pub mod ledger;
pub mod metering;
pub mod model;
pub mod observe;
pub mod placement;
pub mod quota;
pub mod reactor;
pub mod regions;
pub mod snapshot;
pub mod steps;
pub mod summary;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;
pub mod throughput;
pub mod views;

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// An instant as people read it in an explanation: `2026-12-02T04:00Z` (UTC, to the minute).
pub fn utc(ms: Millis) -> String {
    let seconds = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    match time::OffsetDateTime::from_unix_timestamp(seconds) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute()
        ),
        Err(_) => format!("{ms} ms after the epoch"),
    }
}

/// Serde for a float that may be NaN: JSON has no NaN, so it is stored as null and read back as NaN.
pub(crate) mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_nan() {
            s.serialize_none()
        } else {
            s.serialize_f64(*x)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}
