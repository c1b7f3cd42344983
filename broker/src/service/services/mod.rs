//! Services on a live federation, the shell's side: the pure autoscaler of deployed services
//! ([`meridian_core::autoscale::Autoscaler`]) runs in the reactor task, and this keeps what only the shell has:
//! gateways' watches of routing tables and the messages they are sent, and the calls on services
//! ([`ServiceCall`]).

use super::authz;
use super::reply::Inbox;
use meridian_core::access::Principal;
use meridian_core::autoscale::{Autoscaler, ServiceKey as Key};
use meridian_core::journal::Journal;
use meridian_core::reactor::StepError;
use meridian_core::reactor::{Event, Reactor};
use meridian_core::Millis;
use meridian_federation::{
    ApiReply, DemandReport, ErrorBody, ErrorCode, RoutesUpdate, RoutesView, ServiceName,
    ServiceView, TenantId,
};
use std::collections::BTreeMap;
use tokio::sync::oneshot;

/// A watched routing table is compared with what its watchers last got at most this often.
pub const ROUTES_EVERY_MS: u64 = 250;
/// Watches of one service's routing table at once.
pub const MAX_WATCHES: usize = 256;

/// A gateway's watch of a routing table: where its changes go, until when, and what it last got.
struct Watch {
    deliver: Inbox,
    until: Millis,
    seq: u64,
    last: RoutesView,
}

/// The watches of one service's routing table, and when it was last compared.
#[derive(Default)]
struct Watching {
    watches: Vec<Watch>,
    routes_ms: Millis,
}

/// A message for a watcher: its inbox and the encoded `ApiReply`.
pub type Publish = (Inbox, Vec<u8>);

fn encoded<T: serde::Serialize>(reply: &ApiReply<T>) -> Vec<u8> {
    serde_json::to_vec(reply).unwrap_or_default()
}

/// The autoscaler of every service, and the watches of their routing tables.
#[derive(Default)]
pub struct Autoscaling {
    scaler: Autoscaler,
    watching: BTreeMap<Key, Watching>,
    /// Messages for watchers of services that were deleted.
    farewells: Vec<Publish>,
}

impl Autoscaling {
    /// The events that carry out the plans of the services due (see [`Autoscaler::plan`]). Watchers of a
    /// service that was deleted hear that it is gone, once.
    pub fn events<J: Journal>(&mut self, reactor: &Reactor<J>, now: Millis) -> Vec<Event> {
        let services = reactor.state().services();
        let gone: Vec<Key> = self
            .watching
            .keys()
            .filter(|k| !services.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            let Some(w) = self.watching.remove(&key) else {
                continue;
            };
            for w in w.watches.iter().filter(|w| w.until > now) {
                let end = ApiReply::<()>::err(ErrorBody::new(
                    ErrorCode::NotFound,
                    None,
                    format!("service {} was deleted", key.1),
                ));
                self.farewells.push((w.deliver.clone(), encoded(&end)));
            }
        }
        self.scaler.plan(reactor, now)
    }

    /// What watchers of routing tables are to be sent now: each watched table that changed since its
    /// watchers last got it (compared at most every [`ROUTES_EVERY_MS`]), and the end of watches of deleted
    /// services. Expired watches are dropped.
    pub fn route_changes<J: Journal>(&mut self, reactor: &Reactor<J>, now: Millis) -> Vec<Publish> {
        let mut out = std::mem::take(&mut self.farewells);
        let mut due = Vec::new();
        for (key, run) in &mut self.watching {
            run.watches.retain(|w| w.until > now);
            if !run.watches.is_empty() && now >= run.routes_ms + ROUTES_EVERY_MS {
                run.routes_ms = now;
                due.push(key.clone());
            }
        }
        for key in due {
            let Some(spec) = reactor.state().services().get(&key) else {
                continue;
            };
            let table = self.scaler.routes(reactor, spec, now);
            let Some(run) = self.watching.get_mut(&key) else {
                continue;
            };
            for w in run.watches.iter_mut().filter(|w| w.last != table) {
                w.seq += 1;
                w.last = table.clone();
                let update = ApiReply::ok(RoutesUpdate {
                    seq: w.seq,
                    until_ms: w.until,
                    routes: table.clone(),
                });
                out.push((w.deliver.clone(), encoded(&update)));
            }
        }
        out
    }
}

mod calls;
pub use calls::ServiceCall;
