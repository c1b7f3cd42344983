//! Meridian's broker: the pure placement and queue core, the reactor over broker state, and the service shell
//! (NATS, HTTP API, local federation) behind the `meridian` command.

pub mod core;
