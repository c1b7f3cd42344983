//! The broker's pure core: no tokio, NATS or clocks. Time is passed in as milliseconds since the Unix epoch.

pub mod index;
pub mod inference;
pub mod journal;
pub mod latency;
pub mod metering;
pub mod model;
pub mod placement;
pub mod reactor;
pub mod regions;
#[cfg(test)]
pub mod testkit;
#[cfg(test)]
mod tests;
pub mod throughput;
pub mod views;

/// Milliseconds since the Unix epoch.
pub type Millis = u64;
