//! Meridian's broker: the service shell around the pure core (`meridian-core`)
//! (NATS, HTTP API, local federation) behind the `meridian` command.

pub mod bench;
pub mod cli;
pub mod client;
pub mod creds;
pub mod data;
pub mod demo;
pub mod local;
pub mod progress;
pub mod service;
pub mod sim;
