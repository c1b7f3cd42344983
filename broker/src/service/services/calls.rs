//! The calls on services the reactor task serves with the autoscaler's soft state.

use super::*;

/// A call on services that the reactor task serves from its state and the autoscaler's soft state.
#[derive(Debug)]
pub enum ServiceCall {
    /// A gateway's report: the caller may submit to the service's tenant and queue.
    Demand {
        report: DemandReport,
        who: Principal,
        reply: oneshot::Sender<Result<(), StepError>>,
    },
    /// The services the caller may read, or one by name.
    Show {
        tenant: Option<TenantId>,
        name: Option<ServiceName>,
        who: Principal,
        /// The caller just deployed it: it sees what it deployed without the permission to watch.
        deployed: bool,
        reply: oneshot::Sender<Result<Vec<ServiceView>, StepError>>,
    },
    Routes {
        tenant: TenantId,
        name: ServiceName,
        who: Principal,
        reply: oneshot::Sender<Result<RoutesView, StepError>>,
    },
    /// A gateway watches the routing table: changes go to `deliver` until the lease ends.
    Watch {
        tenant: TenantId,
        name: ServiceName,
        who: Principal,
        deliver: Inbox,
        lease_ms: u64,
        reply: oneshot::Sender<Result<RoutesUpdate, StepError>>,
    },
}

impl Autoscaling {
    /// Serves one call (in the reactor task).
    pub fn serve<J: Journal>(&mut self, reactor: &Reactor<J>, call: ServiceCall, now: Millis) {
        match call {
            ServiceCall::Demand { report, who, reply } => {
                let _ = reply.send(self.demand_report(reactor, report, &who, now));
            }
            ServiceCall::Show {
                tenant,
                name,
                who,
                deployed,
                reply,
            } => {
                let r = self.show(reactor, tenant.as_ref(), name.as_ref(), &who, deployed, now);
                let _ = reply.send(r);
            }
            ServiceCall::Routes {
                tenant,
                name,
                who,
                reply,
            } => {
                let r = authz::may_route(reactor, &who, &tenant, &name)
                    .map(|spec| self.scaler.routes(reactor, spec, now));
                let _ = reply.send(r);
            }
            ServiceCall::Watch {
                tenant,
                name,
                who,
                deliver,
                lease_ms,
                reply,
            } => {
                let r = authz::may_route(reactor, &who, &tenant, &name)
                    .map(|spec| self.scaler.routes(reactor, spec, now))
                    .and_then(|routes| {
                        self.watch((tenant, name), deliver, now + lease_ms, routes, now)
                    });
                let _ = reply.send(r);
            }
        }
    }

    /// A gateway's report, taken when the caller may feed the service.
    fn demand_report<J: Journal>(
        &mut self,
        reactor: &Reactor<J>,
        report: DemandReport,
        who: &Principal,
        now: Millis,
    ) -> Result<(), StepError> {
        let tenant = report
            .tenant
            .clone()
            .or_else(|| who.tenant.clone())
            .ok_or_else(|| StepError::Invalid {
                field: "tenant".into(),
                problem: "name the service's tenant".into(),
            })?;
        let spec = authz::visible_service(reactor, who, &tenant, &report.service)?;
        authz::may_feed(who, spec)?;
        self.scaler
            .report(&tenant, &report.service, report.locations, now);
        Ok(())
    }

    /// The services the caller reads (of a tenant, or by name).
    fn show<J: Journal>(
        &self,
        reactor: &Reactor<J>,
        tenant: Option<&TenantId>,
        name: Option<&ServiceName>,
        who: &Principal,
        deployed: bool,
        now: Millis,
    ) -> Result<Vec<ServiceView>, StepError> {
        let mut out = Vec::new();
        for ((t, n), spec) in reactor.state().services() {
            if tenant.is_some_and(|x| x != t)
                || name.is_some_and(|x| x != n)
                || !authz::lists_service(who, t, deployed)
            {
                continue;
            }
            out.push(self.scaler.view(reactor, spec, now));
        }
        if let (Some(n), true) = (name, out.is_empty()) {
            return Err(StepError::NotFound {
                what: format!("service {n}"),
            });
        }
        Ok(out)
    }

    /// Starts or renews a watch of a service's routing table, until `until`.
    fn watch(
        &mut self,
        key: Key,
        deliver: Inbox,
        until: Millis,
        routes: RoutesView,
        now: Millis,
    ) -> Result<RoutesUpdate, StepError> {
        let service = key.1.clone();
        let run = self.watching.entry(key).or_default();
        run.watches.retain(|w| w.until > now);
        // Sent again from the same inbox: a renewal, numbered on.
        let watched = run.watches.len();
        let seq = match run.watches.iter_mut().find(|w| w.deliver == deliver) {
            Some(w) => {
                w.seq += 1;
                w.until = until;
                w.last = routes.clone();
                w.seq
            }
            None if watched >= MAX_WATCHES => {
                return Err(StepError::Refused(format!(
                    "service {service} has {MAX_WATCHES} watches of its routing table, the most it takes"
                )));
            }
            None => {
                run.watches.push(Watch {
                    deliver,
                    until,
                    seq: 1,
                    last: routes.clone(),
                });
                1
            }
        };
        Ok(RoutesUpdate {
            seq,
            until_ms: until,
            routes,
        })
    }
}
