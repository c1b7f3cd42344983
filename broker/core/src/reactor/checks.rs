//! What the reactor refuses before anything is journaled: events that would not change state, and senders that
//! may not say what they say (a revoked site; a site speaking of an attempt another site holds).

use super::{Event, Reactor, StepError, SECURITY_FORMAT};
use crate::durable::FORMAT_VERSION;
use crate::journal::Journal;
use crate::placement::KNEE_FORMAT;
use crate::Millis;
use meridian_federation::{BackendKind, Policy, RunSpec};

/// A job field no backend would honour is refused, never ignored: a backend (`run.adapter`) no release has, or
/// a container image (`run.image`) where no backend runs one.
fn check_run(run: &RunSpec) -> Result<(), StepError> {
    let names = || {
        BackendKind::ALL
            .iter()
            .map(|b| b.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(a) = run.adapter.as_deref() {
        if BackendKind::named(a).is_none() {
            return Err(StepError::Invalid {
                field: "run.adapter".into(),
                problem: format!("no backend is called {a:?}: the backends are {}", names()),
            });
        }
    }
    if run.image.is_some() && !BackendKind::ALL.iter().any(|b| b.runs_images()) {
        return Err(StepError::Invalid {
            field: "run.image".into(),
            problem: format!(
                "no backend runs container images ({}): the job would run without its image, so it is refused",
                names()
            ),
        });
    }
    Ok(())
}

impl<J: Journal> Reactor<J> {
    /// Refuses events that would not change state, before anything is journaled.
    pub(super) fn check(&self, now: Millis, event: &Event) -> Result<(), StepError> {
        self.check_sender(event)?;
        match event {
            Event::Submit(spec) => {
                check_run(&spec.run)?;
                // Time-dependent checks happen here, before the journal; replay never repeats them. (A known
                // idempotency key returns its job whatever the time.)
                let known = self
                    .state
                    .by_key
                    .contains_key(&(spec.tenant.clone(), spec.idempotency_key.clone()))
                    || self.archived_key(spec).is_some();
                if let Some(deadline) = spec.window.deadline_ms.filter(|d| *d <= now && !known) {
                    return Err(StepError::Invalid {
                        field: "window.deadline_ms".into(),
                        problem: format!(
                            "{deadline} is already past (now is {now}): the job could never finish in time"
                        ),
                    });
                }
                let newer = if matches!(
                    spec.policy,
                    Some(Policy::CarbonPriceUsdPerT(_) | Policy::MaxCostPremium(_))
                ) {
                    Some(("policy", "the carbon-price and cost-premium policies"))
                } else if !spec.resources.model_memory_mib.is_empty() {
                    Some(("resources.model_memory_mib", "memory per model"))
                } else {
                    None
                };
                let spot = spec.spot.then_some(("spot", "jobs on spot capacity", super::SPOT_FORMAT));
                let since = newer.map(|(field, what)| (field, what, KNEE_FORMAT));
                if let Some((field, what, from)) = since
                    .into_iter()
                    .chain(spot)
                    .find(|(_, _, from)| self.state.format() < *from)
                {
                    return Err(StepError::Invalid {
                        field: field.into(),
                        problem: format!(
                            "{what} are kept from durable format {from}; the journal is in format {}: run `meridian journal upgrade-format` once every broker runs this release",
                            self.state.format()
                        ),
                    });
                }
                if let Some(t) = &self.tenancy {
                    t.queue_of(&spec.tenant, spec.queue.as_ref())
                        .map_err(|e| StepError::Invalid {
                            field: "queue".into(),
                            problem: e.to_string(),
                        })?;
                    t.priority_of(spec.priority.as_deref()).map_err(|problem| {
                        StepError::Invalid {
                            field: "priority".into(),
                            problem: problem.to_string(),
                        }
                    })?;
                    let known = self
                        .state
                        .by_key
                        .contains_key(&(spec.tenant.clone(), spec.idempotency_key.clone()));
                    if let Some(b) = t.budgets.get(&spec.tenant) {
                        if b.when_exceeded == crate::budget::WhenExceeded::Refuse && !known {
                            if let Some(why) = self.over_budget(b, spec, None, now) {
                                return Err(StepError::OverBudget(why));
                            }
                        }
                    }
                }
                if let Some(region) = &spec.constraints.residency {
                    if !self.regions.knows(region) {
                        let known: Vec<&str> = self.regions.names().collect();
                        return Err(StepError::Invalid {
                            field: "constraints.residency".into(),
                            problem: format!(
                                "unknown region {region:?}; known regions: {}",
                                known.join(", ")
                            ),
                        });
                    }
                }
                if let Some(Err(id)) = self.archived_key(spec) {
                    return Err(StepError::Conflict(format!(
                        "idempotency key {:?} of tenant {} was used for job {id} (now archived) with a different spec",
                        spec.idempotency_key, spec.tenant
                    )));
                }
                let key = (spec.tenant.clone(), spec.idempotency_key.clone());
                if let Some(id) = self.state.by_key.get(&key) {
                    let same = self.state.jobs.get(id).is_some_and(|j| &j.spec == spec);
                    if !same {
                        return Err(StepError::Conflict(format!(
                            "idempotency key {:?} of tenant {} was used for job {id} with a different spec",
                            spec.idempotency_key, spec.tenant
                        )));
                    }
                }
                Ok(())
            }
            Event::Cancel(job) => {
                self.state
                    .jobs
                    .contains_key(job)
                    .then_some(())
                    .ok_or_else(|| StepError::NotFound {
                        what: format!("job {job}"),
                    })
            }
            Event::Drain { site, .. } => self
                .state
                .sites
                .contains_key(site)
                .then_some(())
                .ok_or_else(|| StepError::NotFound {
                    what: format!("site {site}"),
                }),
            Event::UpgradeFormat { to } if *to > FORMAT_VERSION => Err(StepError::Invalid {
                field: "format".into(),
                problem: format!(
                    "this broker knows durable formats up to {FORMAT_VERSION}, not {to}"
                ),
            }),
            Event::SetTenancy { toml, .. } => {
                let t = crate::quota::Tenancy::from_toml(toml).map_err(|e| StepError::Invalid {
                    field: "tenancy".into(),
                    problem: e.to_string(),
                })?;
                match t.queues.values().find(|q| q.policy.is_some()) {
                    Some(q) if self.state.format() < KNEE_FORMAT => Err(StepError::Invalid {
                        field: format!("tenancy: queue {:?}: policy", q.name),
                        problem: format!(
                            "queue policies are kept from durable format {KNEE_FORMAT}; the journal is in format {}: run `meridian journal upgrade-format` once every broker runs this release",
                            self.state.format()
                        ),
                    }),
                    _ => Ok(()),
                }
            }
            Event::TokenCreated(_)
            | Event::TokenRevoked { .. }
            | Event::SiteRevoked { .. }
            | Event::SiteRestored { .. }
                if self.state.format() < SECURITY_FORMAT =>
            {
                Err(StepError::Invalid {
                    field: "format".into(),
                    problem: format!(
                        "tokens and site revocation are kept from durable format {SECURITY_FORMAT}; the journal is in format {}: run `meridian journal upgrade-format` once every broker runs this release",
                        self.state.format()
                    ),
                })
            }
            Event::ServiceDeployed(_) | Event::ServiceDeleted { .. }
                if self.state.format() < super::SERVICES_FORMAT =>
            {
                Err(StepError::Invalid {
                    field: "format".into(),
                    problem: format!(
                        "services are kept from durable format {}; the journal is in format {}: run `meridian journal upgrade-format` once every broker runs this release",
                        super::SERVICES_FORMAT,
                        self.state.format()
                    ),
                })
            }
            Event::ServiceDeployed(spec) => {
                use meridian_federation::validate::Validate;
                spec.validate().map_err(|e| StepError::Invalid {
                    field: e.field().unwrap_or("service").to_owned(),
                    problem: e.to_string(),
                })?;
                check_run(&spec.run)
            }
            Event::ServiceDeleted { tenant, service } => {
                if self
                    .state
                    .services
                    .contains_key(&(tenant.clone(), service.clone()))
                {
                    Ok(())
                } else {
                    Err(StepError::NotFound {
                        what: format!("service {service} of tenant {tenant}"),
                    })
                }
            }
            Event::TokenCreated(t) => {
                if let Some(problem) = t.problem() {
                    return Err(StepError::Invalid {
                        field: "token".into(),
                        problem,
                    });
                }
                if self.state.tokens.contains_key(&t.id) {
                    return Err(StepError::Conflict(format!("token id {} is taken", t.id)));
                }
                let gateway = t
                    .grants
                    .iter()
                    .any(|g| g.verb == crate::access::Verb::Gateway);
                if gateway && self.state.format() < super::GATEWAY_FORMAT {
                    return Err(StepError::Invalid {
                        field: "roles".into(),
                        problem: format!(
                            "gateway tokens are kept from durable format {}; the journal is in format {}: run `meridian journal upgrade-format` once every broker runs this release",
                            super::GATEWAY_FORMAT,
                            self.state.format()
                        ),
                    });
                }
                Ok(())
            }
            Event::TokenRevoked { id } => match self.state.tokens.get(id) {
                Some(_) => Ok(()),
                None => Err(StepError::NotFound {
                    what: format!("token {id}"),
                }),
            },
            _ => Ok(()),
        }
    }

    /// The broker checks the sender: what a site says is taken only from a site that is not revoked, and about
    /// an attempt only from the site that holds it. (Its subject, which its credential alone may publish on,
    /// named the site; the shell checked that the body names the same one.)
    fn check_sender(&self, event: &Event) -> Result<(), StepError> {
        let site = match event {
            Event::Advert(a) => &a.site.id,
            Event::Heartbeat(h) => &h.site,
            Event::Status(s) => &s.site,
            Event::Inventory { site, .. } => site,
            _ => return Ok(()),
        };
        if self.state.revoked_sites.contains(site) {
            return Err(StepError::Refused(format!(
                "site {site} is revoked: nothing it sends is taken"
            )));
        }
        if let Event::Status(s) = event {
            let holder = self
                .state
                .jobs
                .get(&s.job)
                .and_then(|j| j.runs.iter().find(|r| r.attempt == s.attempt))
                .map(|r| &r.site);
            match holder {
                Some(holder) if holder != &s.site => {
                    return Err(StepError::Refused(format!(
                        "site {} spoke of attempt {} of job {}, which site {holder} holds",
                        s.site, s.attempt, s.job
                    )));
                }
                Some(_) => {}
                // Nobody holds it: the job is not live (finished and archived, or never was), or the attempt
                // was never offered. Nothing is journaled for it.
                None => {
                    return Err(StepError::Refused(format!(
                        "site {} spoke of attempt {} of job {}, which no site holds: the job is not live or \
                         the attempt was never offered",
                        s.site, s.attempt, s.job
                    )));
                }
            }
        }
        Ok(())
    }
}
