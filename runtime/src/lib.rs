//! What every Meridian process (broker, agent, command line, benchmarks, tests) runs with, beside the wire
//! contract (`meridian-federation`) it speaks:
//!
//! - [`access`]: how a process reaches the federation's NATS — servers, TLS, its identity.
//! - [`telemetry`]: OpenTelemetry spans of job attempts, exported over OTLP/HTTP when configured.
//! - [`device_metrics`]: the Prometheus families of the devices agents report, shown by the broker and by an
//!   agent's own `/metrics`.

pub mod access;
pub mod device_metrics;
pub mod telemetry;
