//! The autoscaler of the services deployed on a live reactor: its soft state — each location's demand as
//! gateways report it, the scaler's windows, pools held after a replica was lost, crash-loop backoff, the recent
//! changes — and [`Autoscaler::plan`], which plans each deployed service every [`EVERY_MS`] and turns the
//! changes into events journaled like any other: the submission of a replica pinned to its site and model,
//! the cancellation of a replica. Pure: the reactor's state and the time in, events out. After a restart or a
//! takeover the windows start empty, so nothing is removed before a full scale-down delay of demand has been
//! seen again.

use super::{
    desired_from, offers, routes, Change, LocationDemand, Objective, Offer, Present, ReplicaKey,
    Scaler, Settings,
};
use crate::crashloop::{self, CrashLoop, Exit};
use crate::journal::Journal;
use crate::model::{Job, Site};
use crate::placement::View;
use crate::reactor::{Event, Reactor};
use crate::Millis;
use meridian_federation::{
    JobId, JobPhase, LocationRate, LocationRoutesView, Policy, RouteView, RoutesView,
    ServiceBackoffView, ServiceChangeView, ServiceHealth, ServiceName, ServiceReplicaView,
    ServiceSpec, ServiceView, SiteId, TenantId,
};
use std::collections::{BTreeMap, VecDeque};

mod replicas;
#[cfg(test)]
mod tests;
mod views;

pub use replicas::settings;
use replicas::*;

/// How often each service is planned.
pub const EVERY_MS: u64 = 2_000;
/// A location not reported for this long has no demand.
pub const STALE_MS: u64 = 60_000;
/// Changes kept per service for `meridian service show`.
const KEEP_CHANGES: usize = 50;
/// How long a pool that took back a spot replica of a service gets no new spot replica of it: its
/// replacement goes to another pool's spot capacity, or on-demand.
pub const SPOT_HOLD_MS: u64 = 600_000;
/// How long a replica may wait for room at the site it is pinned to before it is given up and the plan places
/// it elsewhere (that pool held as long).
pub const STUCK_MS: u64 = 120_000;

/// A service: its tenant and name.
pub type Key = (TenantId, ServiceName);

/// The soft state of one service.
#[derive(Default)]
struct Run {
    scaler: Scaler,
    /// The latest rate of each location, and when it was reported.
    demand: BTreeMap<String, (LocationRate, Millis)>,
    changes: VecDeque<ServiceChangeView>,
    last_ms: Millis,
    /// Offers not used until then: where a replica was lost.
    held: BTreeMap<ReplicaKey, Millis>,
    /// Crash-loop backoff per pool where replicas ended by themselves.
    crashes: BTreeMap<ReplicaKey, CrashLoop>,
    /// The last finished job looked at for exits.
    exits_seen: Option<(Millis, JobId)>,
}

/// The autoscaler's soft state of every deployed service.
#[derive(Default)]
pub struct Autoscaler {
    runs: BTreeMap<Key, Run>,
}

impl Autoscaler {
    /// A gateway's report: each location's latest rate.
    pub fn report(
        &mut self,
        tenant: &TenantId,
        service: &ServiceName,
        rates: Vec<LocationRate>,
        now: Millis,
    ) {
        let run = self
            .runs
            .entry((tenant.clone(), service.clone()))
            .or_default();
        for r in rates {
            run.demand.insert(r.name.clone(), (r, now));
        }
    }

    /// Plans every service that is due: the events that carry out its changes. Services that were deleted lose
    /// their soft state (see [`Autoscaler::forget_deleted`]).
    pub fn plan<J: Journal>(&mut self, reactor: &Reactor<J>, now: Millis) -> Vec<Event> {
        let services = reactor.state().services();
        self.runs.retain(|k, _| services.contains_key(k));
        let mut out = Vec::new();
        for (key, spec) in services {
            let run = self.runs.entry(key.clone()).or_default();
            if now < run.last_ms + EVERY_MS {
                continue;
            }
            run.last_ms = now;
            out.extend(run.replace_lost(reactor, spec, now));
            run.watch_exits(reactor, spec, now);
            let offers = live_offers(reactor, spec, &run.held, now);
            let have = present(reactor, spec, now);
            let s = settings(spec);
            let demand = run.demand(now);
            let (_, changes) = run
                .scaler
                .step(now, &offers, &demand, &have, reactor.rtt(), &s);
            for (i, c) in changes.iter().enumerate() {
                let crashes = run.crashes.get(&c.key);
                if c.to > c.from && crashes.is_some_and(|b| b.holds(now)) {
                    // Backing off: started when the wait is over (the plan still wants it here).
                    continue;
                }
                out.extend(carry_out(reactor, spec, c, now, i as u64));
                let why = match crashes.filter(|_| c.to > c.from) {
                    Some(b) => format!(
                        "replaces replicas that ended by themselves ({} in a row here), after the crash-loop backoff",
                        b.in_a_row()
                    ),
                    None => why(c),
                };
                run.record(ServiceChangeView {
                    at_ms: now,
                    site: c.key.site.clone(),
                    pool: c.key.pool.clone(),
                    spot: c.key.spot,
                    from: c.from,
                    to: c.to,
                    why,
                });
            }
        }
        out
    }
}

fn why(c: &Change) -> String {
    use crate::autoscale::Why;
    match c.why {
        Why::Uncovered => "a location with demand had no replica within the SLO".into(),
        Why::DemandRose => {
            "more demand planned for here (it rose, or moved here) for the scale-up delay".into()
        }
        Why::DemandFell => {
            "less demand planned for here (it fell, or moved away) for the scale-down delay".into()
        }
    }
}

/// The events of one change: new replicas pinned to the pool's site and model, or the pool's replicas that
/// start last (waiting ones first, then the newest) cancelled.
fn carry_out<J: Journal>(
    reactor: &Reactor<J>,
    spec: &ServiceSpec,
    c: &Change,
    now: Millis,
    n: u64,
) -> Vec<Event> {
    if c.to > c.from {
        let model = reactor
            .state()
            .sites()
            .get(&c.key.site)
            .and_then(|s| s.pool(&c.key.pool))
            .map(|p| p.model.clone());
        (c.from..c.to)
            .map(|i| {
                let mut job = spec.replica_spec(now * 1000 + n * 100 + u64::from(i));
                // A short name that says where the replica is and which of the pool's it is (`chat-dc-eu-3`):
                // the pool's replicas are numbered from 1, and one stopped and started again takes its number.
                job.name = Some(format!(
                    "{}-{}{}-{}",
                    spec.name,
                    c.key.site,
                    if c.key.spot { "-spot" } else { "" },
                    i + 1
                ));
                job.constraints.sites = vec![c.key.site.clone()];
                job.spot = c.key.spot;
                if let Some(m) = &model {
                    job.resources.models = vec![m.clone()];
                    job.resources
                        .model_memory_mib
                        .retain(|k, _| k.matches(m.as_str()));
                }
                Event::Submit(job)
            })
            .collect()
    } else {
        let mut mine: Vec<&Job> = live_replicas(reactor, spec)
            .filter(|j| key_of(j, reactor.state().sites()).as_ref() == Some(&c.key))
            .collect();
        mine.sort_by_key(|j| {
            (
                j.phase == JobPhase::Running,
                std::cmp::Reverse(j.id.clone()),
            )
        });
        mine.into_iter()
            .take((c.from - c.to) as usize)
            .map(|j| Event::Cancel(j.id.clone()))
            .collect()
    }
}
