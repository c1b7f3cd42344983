//! What `meridian service show` and a gateway see of a service: its view and its routing table.

use super::*;

impl Autoscaler {
    /// A service as `meridian service show` gives it.
    pub fn view<J: Journal>(
        &self,
        reactor: &Reactor<J>,
        spec: &ServiceSpec,
        now: Millis,
    ) -> ServiceView {
        let run = self.runs.get(&(spec.tenant.clone(), spec.name.clone()));
        let none = BTreeMap::new();
        let offers = live_offers(reactor, spec, run.map_or(&none, |r| &r.held), now);
        let demand = run.map(|r| r.demand(now)).unwrap_or_default();
        let have = present(reactor, spec, now);
        let running: BTreeMap<ReplicaKey, u32> =
            have.iter().map(|(k, p)| (k.clone(), p.total())).collect();
        let plan = desired_from(&offers, &demand, reactor.rtt(), &settings(spec), &running);
        let mut per_key: BTreeMap<ReplicaKey, f64> = BTreeMap::new();
        for shares in &plan.served {
            for (i, rate) in shares {
                *per_key.entry(offers[*i].key.clone()).or_default() += rate;
            }
        }
        let replicas = replica_views(reactor, spec, &offers, &have, &per_key, now);
        let backoff = backoff_views(run);
        let serving = replicas.iter().any(|r| r.state == "running");
        let health = match (backoff.is_empty(), serving) {
            (true, _) => ServiceHealth::Healthy,
            (false, true) => ServiceHealth::Degraded,
            (false, false) => ServiceHealth::Unhealthy,
        };
        ServiceView {
            spec: spec.clone(),
            health,
            backoff,
            replicas,
            demand: demand
                .iter()
                .map(|d| LocationRate {
                    name: d.name.clone(),
                    location: d.location,
                    rtt_region: d.rtt_region.clone(),
                    per_s: d.rate,
                })
                .collect(),
            changes: run
                .map(|r| r.changes.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// The routing table: per location with demand, the pools with running replicas within the SLO.
    pub fn routes<J: Journal>(
        &self,
        reactor: &Reactor<J>,
        spec: &ServiceSpec,
        now: Millis,
    ) -> RoutesView {
        let run = self.runs.get(&(spec.tenant.clone(), spec.name.clone()));
        // Every pool with ready replicas is routed to, held or not.
        let offers = live_offers(reactor, spec, &BTreeMap::new(), now);
        let ready: BTreeMap<ReplicaKey, u32> = present(reactor, spec, now)
            .into_iter()
            .map(|(k, p)| (k, p.ready))
            .collect();
        let demand = run.map(|r| r.demand(now)).unwrap_or_default();
        let table = routes(&offers, &ready, &demand, reactor.rtt(), spec.slo_ms);
        RoutesView {
            tenant: spec.tenant.clone(),
            service: spec.name.clone(),
            locations: table
                .into_iter()
                .map(|l| LocationRoutesView {
                    location: l.location,
                    routes: l
                        .routes
                        .into_iter()
                        .map(|r| RouteView {
                            site: r.key.site,
                            pool: r.key.pool,
                            spot: r.key.spot,
                            replicas: r.replicas,
                            rtt_ms: r.rtt_ms,
                            weight: r.weight,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// Each live replica: where it runs, its state, what it costs and the demand it serves.
fn replica_views<J: Journal>(
    reactor: &Reactor<J>,
    spec: &ServiceSpec,
    offers: &[crate::autoscale::Offer],
    have: &BTreeMap<ReplicaKey, crate::autoscale::Present>,
    per_key: &BTreeMap<ReplicaKey, f64>,
    now: Millis,
) -> Vec<ServiceReplicaView> {
    live_replicas(reactor, spec)
        .filter_map(|j| {
            let key = key_of(j, reactor.state().sites())?;
            let o = offers.iter().find(|o| o.key == key);
            let n = have.get(&key).map_or(1, |p| p.total().max(1));
            Some(ServiceReplicaView {
                job: j.id.clone(),
                site: key.site.clone(),
                pool: Some(key.pool.clone()),
                spot: key.spot,
                state: if j.phase == JobPhase::Running {
                    "running".into()
                } else if lost(j, now).is_some() {
                    "lost".into()
                } else {
                    "starting".into()
                },
                usd_per_hour: o.map_or(0.0, |o| o.usd_per_hour),
                co2_g_per_hour: o.map_or(0.0, |o| o.g_co2_per_hour),
                serves_per_s: per_key.get(&key).copied().unwrap_or(0.0) / f64::from(n),
            })
        })
        .collect()
}

/// The pools a service's replicas keep exiting at, and when they are tried again.
fn backoff_views(run: Option<&Run>) -> Vec<ServiceBackoffView> {
    run.into_iter()
        .flat_map(|r| &r.crashes)
        .filter_map(|(key, c)| {
            let last = c.last()?;
            Some(ServiceBackoffView {
                site: key.site.clone(),
                pool: key.pool.clone(),
                spot: key.spot,
                exits_in_a_row: c.in_a_row(),
                last_job: last.job.clone(),
                last_exit_code: last.exit_code,
                last_reason: last.reason.clone(),
                last_exit_ms: last.at_ms,
                last_ran_ms: last.ran_ms,
                next_start_ms: c.until_ms(),
            })
        })
        .collect()
}
