//! The broker's async shell: one task owns the reactor and feeds it events from NATS, the HTTP API and a
//! clock; it sends what the reactor puts in its outbox. Nothing here decides placement.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

pub mod api;
pub mod archive;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod dashboard;
pub mod http;
pub mod journal;
pub mod lease;
pub mod metrics;
pub mod reply;
pub mod services;
pub mod traces;

mod config;
#[cfg(test)]
pub mod harness;
mod queries;
mod reactor_task;
mod site_listener;
mod startup;

pub use config::BrokerConfig;
use config::*;
use queries::answer;
pub use queries::{Answer, Query};
use reactor_task::*;
use site_listener::*;
pub use startup::run;
use startup::*;

use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use meridian_core::access::Principal;
use meridian_core::journal::BufferJournal;
use meridian_core::latency::RttTable;
use meridian_core::reactor::{Command, CoreConfig, Event, Reactor, Response, StepError};
use meridian_core::regions::{parse_geojson, Regions};
use meridian_core::views;
use meridian_federation::subjects::{self, SiteTopic};
use meridian_federation::{
    decode, encode, BrokerHello, Heartbeat, JobId, JobStatus, OfferOutcome, OfferReply, SiteAdvert,
    SiteId, StatusAck, WIRE_VERSION,
};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

enum Input {
    Event {
        event: Event,
        /// The API caller asking for the change (judged and audited in the reactor task); `None` for what
        /// sites and the broker's own clock say.
        caller: Option<Principal>,
        reply: Option<oneshot::Sender<Result<Response, StepError>>>,
    },
    Query(Query, oneshot::Sender<Answer>),
    /// A call on services (demand, views, routes), served with the autoscaler's soft state.
    Services(services::ServiceCall),
    /// An administrator sets aside the journal message the broker cannot read.
    Quarantine {
        seq: u64,
        who: Principal,
        reply: oneshot::Sender<anyhow::Result<()>>,
    },
}

/// A handle to the reactor task, shared by the API front ends.
#[derive(Clone)]
pub struct BrokerHandle {
    tx: mpsc::UnboundedSender<Input>,
    pub client: async_nats::Client,
    /// Finished jobs that left the live state.
    pub archive: archive::Archive,
    /// Who is calling, and whether too fast.
    pub auth: std::sync::Arc<auth::Auth>,
    /// The audit trail.
    pub audit: audit::Audit,
    /// What `/metrics` shows.
    pub metrics: std::sync::Arc<metrics::Metrics>,
    /// Spans of job attempts, when an OTLP endpoint is configured.
    pub traces: Option<std::sync::Arc<traces::Traces>>,
    /// The tables the broker was started with, as read (regions, round trips, throughput): what a what-if
    /// needs besides the sites.
    pub tables: std::sync::Arc<config::Tables>,
}

impl BrokerHandle {
    /// A change an API caller asks for: judged against their permissions, then applied, then audited.
    pub async fn step_as(&self, who: &Principal, event: Event) -> Result<Response, StepError> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Input::Event {
            event,
            caller: Some(who.clone()),
            reply: Some(tx),
        });
        rx.await.map_err(|_| stopped())?
    }

    /// Queues an event now (events are applied in the order they are queued); the answer comes later.
    pub fn step_queued(&self, event: Event) -> oneshot::Receiver<Result<Response, StepError>> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Input::Event {
            event,
            caller: None,
            reply: Some(tx),
        });
        rx
    }

    /// Sets aside the unreadable journal message `seq` (the caller is an administrator), so the broker replays
    /// what follows and takes changes again.
    pub async fn quarantine(&self, who: &Principal, seq: u64) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Input::Quarantine {
            seq,
            who: who.clone(),
            reply: tx,
        });
        rx.await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("broker is stopping")))
    }

    /// A call on services; the reply comes through the call's own channel.
    pub fn services(&self, call: services::ServiceCall) {
        let _ = self.tx.send(Input::Services(call));
    }

    pub async fn query(&self, q: Query) -> Option<Answer> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Input::Query(q, tx)).ok()?;
        rx.await.ok()
    }

    fn feed(&self, event: Event) {
        let _ = self.tx.send(Input::Event {
            event,
            caller: None,
            reply: None,
        });
    }
}

fn stopped() -> StepError {
    StepError::Journal(meridian_core::journal::JournalError::Unavailable(
        "broker is stopping".into(),
    ))
}
