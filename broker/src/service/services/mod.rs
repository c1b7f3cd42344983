//! Services on a live federation. The autoscaler's soft state — each location's demand as gateways report it,
//! the scaler's windows, the recent changes — lives in the reactor task; every few seconds it plans each
//! deployed service with the pure core's autoscaler and turns the changes into events that are journaled like
//! any other: the submission of a replica pinned to its site and model, the cancellation of a replica. After a
//! restart or a takeover the windows start empty, so nothing is removed before a full scale-down delay of
//! demand has been seen again.

use super::authz;
use super::reply::Inbox;
use meridian_core::access::Principal;
use meridian_core::autoscale::{
    desired_from, offers, routes, Change, LocationDemand, Objective, Offer, Present, ReplicaKey,
    Scaler, Settings,
};
use meridian_core::crashloop::{self, CrashLoop, Exit};
use meridian_core::journal::Journal;
use meridian_core::model::{Job, Site};
use meridian_core::placement::View;
use meridian_core::reactor::StepError;
use meridian_core::reactor::{Event, Reactor};
use meridian_core::Millis;
use meridian_federation::{
    ApiReply, DemandReport, ErrorBody, ErrorCode, JobId, JobPhase, LocationRate,
    LocationRoutesView, Policy, RouteView, RoutesUpdate, RoutesView, ServiceBackoffView,
    ServiceChangeView, ServiceHealth, ServiceName, ServiceReplicaView, ServiceSpec, ServiceView,
    SiteId, TenantId,
};
use std::collections::{BTreeMap, VecDeque};
use tokio::sync::oneshot;

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
/// A watched routing table is compared with what its watchers last got at most this often.
pub const ROUTES_EVERY_MS: u64 = 250;
/// Watches of one service's routing table at once.
pub const MAX_WATCHES: usize = 256;

type Key = (TenantId, ServiceName);

#[derive(Default)]
struct Run {
    scaler: Scaler,
    /// The latest rate of each location, and when it was reported.
    demand: BTreeMap<String, (LocationRate, Millis)>,
    changes: VecDeque<ServiceChangeView>,
    last_ms: Millis,
    /// Offers not used until then: where a replica was lost.
    held: BTreeMap<ReplicaKey, Millis>,
    /// Gateways watching the routing table.
    watches: Vec<Watch>,
    routes_ms: Millis,
    /// Crash-loop backoff per pool where replicas ended by themselves.
    crashes: BTreeMap<ReplicaKey, CrashLoop>,
    /// The last finished job looked at for exits.
    exits_seen: Option<(Millis, JobId)>,
}

/// A gateway's watch of a routing table: where its changes go, until when, and what it last got.
struct Watch {
    deliver: Inbox,
    until: Millis,
    seq: u64,
    last: RoutesView,
}

/// A message for a watcher: its inbox and the encoded `ApiReply`.
pub type Publish = (Inbox, Vec<u8>);

fn encoded<T: serde::Serialize>(reply: &ApiReply<T>) -> Vec<u8> {
    serde_json::to_vec(reply).unwrap_or_default()
}

/// The autoscaler's soft state of every service.
#[derive(Default)]
pub struct Autoscaling {
    runs: BTreeMap<Key, Run>,
    /// Messages for watchers of services that were deleted.
    farewells: Vec<Publish>,
}

/// The scaling settings of a spec.
pub fn settings(spec: &ServiceSpec) -> Settings {
    Settings {
        slo_ms: spec.slo_ms,
        min_replicas: spec.min_replicas,
        max_replicas: spec.max_replicas,
        utilization: spec.target_utilization,
        // Validated at deployment: weights never reach here.
        objective: Objective::of(spec.policy.as_ref().unwrap_or(&Policy::Balanced))
            .unwrap_or(Objective::Knee(meridian_core::autoscale::BALANCED_PREMIUM)),
        up_delay_ms: spec.scale_up_delay_s * 1000,
        down_delay_ms: spec.scale_down_delay_s * 1000,
        window_ms: spec.demand_window_s * 1000,
    }
}

/// The pool a replica job runs in or is pinned to: its assignment, else its pinned site's pool of its model.
fn key_of(job: &Job, sites: &BTreeMap<SiteId, Site>) -> Option<ReplicaKey> {
    if let Some(a) = &job.assignment {
        return Some(ReplicaKey {
            site: a.site.clone(),
            pool: a.pool.clone(),
            spot: job.spec.spot,
        });
    }
    let site = job.spec.constraints.sites.first()?;
    let model = job.spec.resources.models.first()?;
    let pool = sites
        .get(site)?
        .pools
        .iter()
        .find(|p| model.matches(p.model.as_str()))?;
    Some(ReplicaKey {
        site: site.clone(),
        pool: pool.name.clone(),
        spot: job.spec.spot,
    })
}

/// A replica that cannot start where it is pinned, until when its pool is best left alone, and why: the site
/// interrupted it (took its spot capacity back, lost its agent) or refused it, and the broker keeps it off that
/// site for a while; or it has waited [`STUCK_MS`] for room there (other work holds the pool). The autoscaler
/// replaces it.
fn lost(job: &Job, now: Millis) -> Option<(Millis, String)> {
    if job.assignment.is_some() || job.phase != JobPhase::Pending {
        return None;
    }
    let site = job.spec.constraints.sites.first()?;
    if let Some((_, until)) = job
        .refused_until
        .iter()
        .find(|(s, until)| s == site && *until > now)
    {
        // Why it was requeued (its `why` is the latest placement's by now).
        let why = job
            .history
            .iter()
            .rev()
            .find(|(_, text)| text.starts_with("requeued"))
            .map_or_else(|| job.why.clone(), |(_, text)| text.clone());
        return Some((*until, why));
    }
    let waited = now.saturating_sub(job.waiting_since_ms);
    let no_room = matches!(job.waited_on.0, Some("capacity" | "no_site_fits"));
    (no_room && waited >= STUCK_MS).then(|| {
        (
            now + STUCK_MS,
            format!("waited {} s for room at {site}", waited / 1000),
        )
    })
}

fn live_replicas<'a, J: Journal>(
    reactor: &'a Reactor<J>,
    spec: &'a ServiceSpec,
) -> impl Iterator<Item = &'a Job> + 'a {
    reactor.state().active_jobs().filter(move |j| {
        j.spec.tenant == spec.tenant
            && j.spec.service.as_ref() == Some(&spec.name)
            && !j.cancel_requested
    })
}

/// The service's offers now, less those `held`: each pool's room is its free slots plus the service's own
/// replicas there (on-demand and spot alike).
fn live_offers<J: Journal>(
    reactor: &Reactor<J>,
    spec: &ServiceSpec,
    held: &BTreeMap<ReplicaKey, Millis>,
    now: Millis,
) -> Vec<Offer> {
    let view = View {
        sites: reactor.state().sites(),
        rtt: reactor.rtt(),
        regions: reactor.regions(),
        throughput: reactor.throughput(),
        index: None,
        format: reactor.state().format(),
    };
    let replica = spec.replica_spec(0);
    let share = replica.resources.milli_per_replica().max(1);
    // Spot replicas are journaled from the durable format that keeps them.
    let spot = spec.spot && reactor.state().format() >= meridian_core::reactor::SPOT_FORMAT;
    let mut out = offers(view, &replica, spec.throughput.per_replica(), spot);
    out.retain(|o| held.get(&o.key).is_none_or(|until| *until <= now));
    for o in &mut out {
        let free: u64 = reactor
            .state()
            .sites()
            .get(&o.key.site)
            .and_then(|s| s.pool(&o.key.pool))
            .map_or(0, |p| match replica.resources.share() {
                Some(_) => p
                    .devices
                    .iter()
                    .filter(|d| d.healthy)
                    .map(|d| u64::from(d.free_milli()) / share)
                    .sum(),
                None => {
                    let whole = p
                        .devices
                        .iter()
                        .filter(|d| d.healthy && d.free_milli() >= 1000)
                        .count() as u64;
                    whole / u64::from(replica.resources.count.max(1))
                }
            });
        let own = live_replicas(reactor, spec)
            .filter_map(|j| j.assignment.as_ref())
            .filter(|a| a.site == o.key.site && a.pool == o.key.pool)
            .count() as u64;
        o.room = u32::try_from((free + own).min(u64::from(o.room))).unwrap_or(o.room);
    }
    out
}

/// The replicas at each pool, ready or starting; lost ones are not counted.
fn present<J: Journal>(
    reactor: &Reactor<J>,
    spec: &ServiceSpec,
    now: Millis,
) -> BTreeMap<ReplicaKey, Present> {
    let mut out: BTreeMap<ReplicaKey, Present> = BTreeMap::new();
    for j in live_replicas(reactor, spec).filter(|j| lost(j, now).is_none()) {
        let Some(key) = key_of(j, reactor.state().sites()) else {
            continue;
        };
        let p = out.entry(key).or_default();
        if j.phase == JobPhase::Running {
            p.ready += 1;
        } else {
            p.starting += 1;
        }
    }
    out
}

impl Run {
    fn record(&mut self, change: ServiceChangeView) {
        self.changes.push_back(change);
        while self.changes.len() > KEEP_CHANGES {
            self.changes.pop_front();
        }
    }

    /// Cancels the replicas that were lost and holds their offers: a spot pool for [`SPOT_HOLD_MS`], an
    /// on-demand one while the broker keeps the replica off its site. The plan that follows replaces them.
    fn replace_lost<J: Journal>(
        &mut self,
        reactor: &Reactor<J>,
        spec: &ServiceSpec,
        now: Millis,
    ) -> Vec<Event> {
        self.held.retain(|_, until| *until > now);
        let sites = reactor.state().sites();
        let mut out = Vec::new();
        let mut by_key: BTreeMap<ReplicaKey, (u32, u32, String)> = BTreeMap::new();
        for j in live_replicas(reactor, spec) {
            let Some(key) = key_of(j, sites) else {
                continue;
            };
            let entry = by_key.entry(key.clone()).or_default();
            entry.0 += 1;
            if let Some((until, why)) = lost(j, now) {
                let hold = if key.spot {
                    until.max(now + SPOT_HOLD_MS)
                } else {
                    until
                };
                let held = self.held.entry(key).or_default();
                *held = (*held).max(hold);
                entry.1 += 1;
                entry.2 = why;
                out.push(Event::Cancel(j.id.clone()));
            }
        }
        for (key, (n, lost, why)) in by_key.into_iter().filter(|(_, e)| e.1 > 0) {
            self.record(ServiceChangeView {
                at_ms: now,
                site: key.site,
                pool: key.pool,
                spot: key.spot,
                from: n,
                to: n - lost,
                why: format!("replica lost ({why}); replaced where the plan says, this pool held"),
            });
        }
        out
    }

    /// Takes in the replicas that ended by themselves since the last look (each holds its pool for the
    /// crash-loop backoff, and is told in the changes), and clears the pools where a replica has run for
    /// [`crashloop::HEALTHY_RUN_MS`]. After a start, exits of the last ten minutes are looked at.
    fn watch_exits<J: Journal>(&mut self, reactor: &Reactor<J>, spec: &ServiceSpec, now: Millis) {
        let state = reactor.state();
        let since = now.saturating_sub(crashloop::HEALTHY_RUN_MS);
        let mut last = None;
        let mut told = Vec::new();
        for (at, j) in state.finished_after(self.exits_seen.as_ref(), since) {
            last = Some(at.clone());
            let mine = j.spec.tenant == spec.tenant && j.spec.service.as_ref() == Some(&spec.name);
            let by_itself = matches!(j.phase, JobPhase::Failed | JobPhase::Succeeded);
            if !mine || !by_itself || j.cancel_requested {
                continue;
            }
            let Some(key) = key_of(j, state.sites()) else {
                continue;
            };
            let ran_ms = j.started_ms.map_or(0, |s| at.0.saturating_sub(s));
            let crashes = self.crashes.entry(key.clone()).or_default();
            crashes.exited(Exit {
                job: j.id.clone(),
                at_ms: at.0,
                ran_ms,
                exit_code: j.exit_code,
                reason: j.why.clone(),
            });
            let code = j
                .exit_code
                .map_or_else(|| "no exit code".to_owned(), |c| format!("exit code {c}"));
            told.push(ServiceChangeView {
                at_ms: at.0,
                site: key.site.clone(),
                pool: key.pool.clone(),
                spot: key.spot,
                from: 0,
                to: 0,
                why: format!(
                    "replica {} ended by itself ({code}; {}) after {} s, {} in a row here: crash-loop backoff, no new replica here for {} s",
                    j.id,
                    j.why,
                    ran_ms / 1000,
                    crashes.in_a_row(),
                    crashes.until_ms().saturating_sub(now) / 1000,
                ),
            });
        }
        if last.is_some() {
            self.exits_seen = last;
        }
        for change in told {
            self.record(change);
        }
        for j in live_replicas(reactor, spec).filter(|j| j.phase == JobPhase::Running) {
            let (Some(key), Some(started)) = (key_of(j, state.sites()), j.started_ms) else {
                continue;
            };
            if let Some(c) = self.crashes.get_mut(&key) {
                c.running(started, now);
            }
        }
        self.crashes.retain(|_, c| !c.is_clear());
    }

    fn demand(&self, now: Millis) -> Vec<LocationDemand> {
        self.demand
            .values()
            .map(|(r, at)| LocationDemand {
                name: r.name.clone(),
                location: r.location,
                rtt_region: r.rtt_region.clone(),
                rate: if now.saturating_sub(*at) > STALE_MS {
                    0.0
                } else {
                    r.per_s
                },
            })
            .collect()
    }
}

impl Autoscaling {
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

    /// Plans every service that is due and returns the events that carry out its changes. Services that were
    /// deleted lose their soft state.
    pub fn events<J: Journal>(&mut self, reactor: &Reactor<J>, now: Millis) -> Vec<Event> {
        let services = reactor.state().services();
        let gone: Vec<Key> = self
            .runs
            .keys()
            .filter(|k| !services.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            let Some(run) = self.runs.remove(&key) else {
                continue;
            };
            // Its watchers hear that it is gone, once.
            for w in run.watches.iter().filter(|w| w.until > now) {
                let end = ApiReply::<()>::err(ErrorBody::new(
                    ErrorCode::NotFound,
                    None,
                    format!("service {} was deleted", key.1),
                ));
                self.farewells.push((w.deliver.clone(), encoded(&end)));
            }
        }
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

    /// What watchers of routing tables are to be sent now: each watched table that changed since its
    /// watchers last got it (compared at most every [`ROUTES_EVERY_MS`]), and the end of watches of deleted
    /// services. Expired watches are dropped.
    pub fn route_changes<J: Journal>(&mut self, reactor: &Reactor<J>, now: Millis) -> Vec<Publish> {
        let mut out = std::mem::take(&mut self.farewells);
        let mut due = Vec::new();
        for (key, run) in &mut self.runs {
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
            let table = self.routes(reactor, spec, now);
            let Some(run) = self.runs.get_mut(&key) else {
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

fn why(c: &Change) -> String {
    use meridian_core::autoscale::Why;
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

mod calls;
mod views;
pub use calls::ServiceCall;

#[cfg(test)]
mod tests;
