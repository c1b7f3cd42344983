//! Meridian's broker daemon: the service shell around the pure core (`meridian-core`) — NATS, the HTTP API,
//! the journal — with the client other programs drive it by, the credentials it is secured with, and the
//! local federation (`meridian up`). The `meridian` command itself is `meridian-tools`.

pub mod client;
pub mod creds;
pub mod data;
pub mod local;
pub mod service;
