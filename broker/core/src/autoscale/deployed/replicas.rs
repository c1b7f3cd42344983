//! A service's replicas as the reactor holds them: where each runs or is pinned, which are lost, the offers
//! and the replicas present at each pool, and the soft state each plan updates.

use super::*;

/// The scaling settings of a spec.
pub fn settings(spec: &ServiceSpec) -> Settings {
    Settings {
        slo_ms: spec.slo_ms,
        min_replicas: spec.min_replicas,
        max_replicas: spec.max_replicas,
        utilization: spec.target_utilization,
        // Validated at deployment: weights never reach here.
        objective: Objective::of(spec.policy.as_ref().unwrap_or(&Policy::Balanced))
            .unwrap_or(Objective::Knee(crate::autoscale::BALANCED_PREMIUM)),
        up_delay_ms: spec.scale_up_delay_s * 1000,
        down_delay_ms: spec.scale_down_delay_s * 1000,
        window_ms: spec.demand_window_s * 1000,
    }
}

/// The pool a replica job runs in or is pinned to: its assignment, else its pinned site's pool of its model.
pub(super) fn key_of(job: &Job, sites: &BTreeMap<SiteId, Site>) -> Option<ReplicaKey> {
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
pub(super) fn lost(job: &Job, now: Millis) -> Option<(Millis, String)> {
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

pub(super) fn live_replicas<'a, J: Journal>(
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
pub(super) fn live_offers<J: Journal>(
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
    let spot = spec.spot && reactor.state().format() >= crate::reactor::SPOT_FORMAT;
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
pub(super) fn present<J: Journal>(
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
    pub(super) fn record(&mut self, change: ServiceChangeView) {
        self.changes.push_back(change);
        while self.changes.len() > KEEP_CHANGES {
            self.changes.pop_front();
        }
    }

    /// Cancels the replicas that were lost and holds their offers: a spot pool for [`SPOT_HOLD_MS`], an
    /// on-demand one while the broker keeps the replica off its site. The plan that follows replaces them.
    pub(super) fn replace_lost<J: Journal>(
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
    pub(super) fn watch_exits<J: Journal>(
        &mut self,
        reactor: &Reactor<J>,
        spec: &ServiceSpec,
        now: Millis,
    ) {
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

    pub(super) fn demand(&self, now: Millis) -> Vec<LocationDemand> {
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
