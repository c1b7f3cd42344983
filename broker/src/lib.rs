//! Meridian's broker: the pure placement and queue core, the reactor over broker state, and the service shell
//! (NATS, HTTP API, local federation) behind the `meridian` command.

pub mod bench;
pub mod client;
pub mod core;
pub mod data;
pub mod demo;
pub mod local;
pub mod service;
pub mod sim;
