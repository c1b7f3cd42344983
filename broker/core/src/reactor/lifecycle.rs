//! The job lifecycle: submission, offers and their answers, statuses, metering, cancellation, requeues,
//! preemption and scale-in.

use super::{Command, Reactor, Response};
use crate::journal::Journal;
use crate::model::Job;
use crate::{metering, Millis};
use meridian_federation::{
    AttemptState, CancelAttempt, JobId, JobPhase, JobSpec, JobStatus, OfferOutcome, QueueName,
    ServiceName, SiteId, SubmitReply, TenantId, WIRE_VERSION,
};

impl<J: Journal> Reactor<J> {
    /// Tells `site` to stop attempt `attempt` of `job` (its whole process group).
    pub(super) fn cancel_attempt(
        &mut self,
        site: SiteId,
        job: JobId,
        attempt: u32,
        reason: impl Into<String>,
    ) {
        self.outbox.push(Command::Cancel {
            site,
            cancel: CancelAttempt {
                v: WIRE_VERSION,
                job,
                attempt,
                reason: reason.into(),
            },
        });
    }

    pub(super) fn is_current(&self, job: &JobId, attempt: u32, site: &SiteId) -> bool {
        self.state.jobs.get(job).is_some_and(|j| {
            j.attempt == attempt
                && j.holds_devices()
                && j.assignment.as_ref().is_some_and(|a| &a.site == site)
        })
    }

    pub(super) fn on_submit(&mut self, now: Millis, spec: JobSpec) -> Response {
        let key = (spec.tenant.clone(), spec.idempotency_key.clone());
        if let Some(id) = self.state.by_key.get(&key) {
            return Response::Submitted(SubmitReply {
                job: id.clone(),
                created: false,
            });
        }
        if let Some(Ok(id)) = self.archived_key(&spec) {
            return Response::Submitted(SubmitReply {
                job: id,
                created: false,
            });
        }
        self.state.next_job += 1;
        let id = JobId::numbered(self.state.next_job);
        self.state.by_key.insert(key, id.clone());
        self.state.active.insert(id.clone());
        self.state
            .jobs
            .insert(id.clone(), Job::new(id.clone(), spec, now));
        self.try_place(now, &id);
        Response::Submitted(SubmitReply {
            job: id,
            created: true,
        })
    }

    pub(super) fn on_cancel(&mut self, now: Millis, id: &JobId) {
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        match job.phase {
            JobPhase::Pending => {
                job.phase = JobPhase::Cancelled;
                job.finished_ms = Some(now);
                job.why = "cancelled while pending".into();
                job.note(now, "cancelled while pending");
                self.state.waiting.remove(id);
                self.settled(now, id);
            }
            JobPhase::Offered | JobPhase::Running => {
                job.phase = JobPhase::Cancelling;
                job.cancel_requested = true;
                job.why = "cancel requested; waiting for the site to stop it".into();
                job.note(now, "cancel requested");
                if let Some(site) = job.assignment.as_ref().map(|a| a.site.clone()) {
                    let attempt = job.attempt;
                    self.cancel_attempt(site, id.clone(), attempt, "cancelled by user");
                }
            }
            _ => {}
        }
    }

    pub(super) fn on_offer_answer(
        &mut self,
        now: Millis,
        site: SiteId,
        id: JobId,
        attempt: u32,
        outcome: OfferOutcome,
        mark: Option<meridian_federation::InventoryMark>,
    ) {
        let current = self.is_current(&id, attempt, &site);
        let offered = self
            .state
            .jobs
            .get(&id)
            .is_some_and(|j| j.phase == JobPhase::Offered);
        if !current || !offered {
            if current {
                return; // A repeated answer for an attempt already past the offer.
            }
            if outcome == OfferOutcome::Accepted {
                self.cancel_attempt(
                    site,
                    id,
                    attempt,
                    "offer was withdrawn before it was accepted",
                );
            }
            return;
        }
        match outcome {
            OfferOutcome::Accepted => {
                self.saw(crate::observe::Observation::Answered {
                    job: id.clone(),
                    attempt,
                    site: site.clone(),
                    answer: crate::observe::Answer::Accepted,
                    at_ms: now,
                });
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    job.phase = JobPhase::Running;
                    job.accepted = mark;
                    job.started_ms.get_or_insert(now);
                    job.note(now, format!("attempt {attempt} accepted by {site}"));
                }
            }
            OfferOutcome::Rejected { reason } => {
                self.saw(crate::observe::Observation::Answered {
                    job: id.clone(),
                    attempt,
                    site: site.clone(),
                    answer: crate::observe::Answer::Refused,
                    at_ms: now,
                });
                self.refuse(now, &id, &site, &format!("refused by {site}: {reason}"));
                self.try_place(now, &id);
            }
        }
    }

    /// Releases the job's devices, skips the site for a while and makes the job pending again.
    pub(super) fn refuse(&mut self, now: Millis, id: &JobId, site: &SiteId, why: &str) {
        let until = now + self.config.refusal_cooldown_ms;
        if let Some(job) = self.state.jobs.get_mut(id) {
            job.refused_until.retain(|(s, u)| s != site && *u > now);
            job.refused_until.push((site.clone(), until));
        }
        self.make_pending(now, id, why.to_owned(), false);
    }

    /// Makes a job that held devices pending again: its devices are released and it waits in the queue. A
    /// requeue (`restart_wait`) also restarts its wait, so `max_wait` counts again from now.
    pub(super) fn make_pending(
        &mut self,
        now: Millis,
        id: &JobId,
        why: String,
        restart_wait: bool,
    ) {
        self.release(id);
        if let Some(job) = self.state.jobs.get_mut(id) {
            job.phase = JobPhase::Pending;
            job.assignment = None;
            job.accepted = None;
            job.offered_ms = None;
            if restart_wait {
                job.waiting_since_ms = now;
            }
            job.note(now, why.clone());
            job.why = why;
        }
        self.file_waiting(id);
    }

    pub(super) fn release(&mut self, id: &JobId) {
        let Some(job) = self.state.jobs.get(id) else {
            return;
        };
        if !job.holds_devices() {
            return;
        }
        self.released += 1;
        if let Some(a) = &job.assignment {
            if let Some(site) = self.state.sites.get_mut(&a.site) {
                site.apply_reservation(&a.pool, &a.devices, false);
            }
            let site = a.site.clone();
            self.reindex(&site);
        }
        self.state.dirty = true;
    }

    pub(super) fn on_status(&mut self, now: Millis, s: JobStatus) {
        if !self.is_current(&s.job, s.attempt, &s.site) {
            if s.state != AttemptState::Running {
                // The end of an attempt that was preempted or given up: its use still goes to the ledger.
                self.meter(&s);
            }
            if s.state == AttemptState::Running {
                self.cancel_attempt(
                    s.site.clone(),
                    s.job,
                    s.attempt,
                    "attempt is no longer assigned to this site",
                );
            }
            return;
        }
        let id = s.job.clone();
        if let Some(job) = self.state.jobs.get_mut(&id) {
            if s.checkpoint.is_some() {
                job.checkpoint = s.checkpoint.clone();
            }
        }
        match s.state.clone() {
            AttemptState::Running => {
                // A site's first word of a run may come before its answer to the offer: it accepted.
                let answered_by_running = self
                    .state
                    .jobs
                    .get(&id)
                    .is_some_and(|j| j.phase == JobPhase::Offered);
                if answered_by_running {
                    self.saw(crate::observe::Observation::Answered {
                        job: id.clone(),
                        attempt: s.attempt,
                        site: s.site.clone(),
                        answer: crate::observe::Answer::Accepted,
                        at_ms: now,
                    });
                }
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    if job.accepted.is_none() {
                        job.accepted = s.mark;
                    }
                    let first = job.phase == JobPhase::Offered || job.started_ms.is_none();
                    if job.phase == JobPhase::Offered {
                        job.phase = JobPhase::Running;
                    }
                    job.started_ms = Some(s.started_at_ms.unwrap_or(now));
                    if let Some(run) = job.runs.iter_mut().find(|r| r.attempt == s.attempt) {
                        run.started_ms = run.started_ms.or(Some(s.started_at_ms.unwrap_or(now)));
                    }
                    if first {
                        job.note(now, format!("attempt {} running on {}", s.attempt, s.site));
                    }
                }
            }
            AttemptState::Succeeded { exit_code } => self.finish(
                now,
                &s,
                JobPhase::Succeeded,
                Some(exit_code),
                "succeeded".into(),
            ),
            AttemptState::Failed { exit_code, reason } => self.finish(
                now,
                &s,
                JobPhase::Failed,
                exit_code,
                format!("failed: {reason}"),
            ),
            AttemptState::Cancelled { reason } => self.finish(
                now,
                &s,
                JobPhase::Cancelled,
                None,
                format!("cancelled: {reason}"),
            ),
            AttemptState::Interrupted { reason } => {
                let cancel = self.state.jobs.get(&id).is_some_and(|j| j.cancel_requested);
                if cancel {
                    self.finish(
                        now,
                        &s,
                        JobPhase::Cancelled,
                        None,
                        format!("cancelled: {reason}"),
                    );
                } else {
                    self.meter(&s);
                    // Skip the site for a while, so one that cannot start the job does not get it back at once.
                    self.refuse(
                        now,
                        &id,
                        &s.site,
                        &format!("requeued: interrupted at {}: {reason}", s.site),
                    );
                    self.try_place(now, &id);
                }
            }
        }
    }

    /// Meters the end of an attempt into the job's ledger (once per attempt): its run time at the rates of the
    /// site and pool it ran on.
    pub(super) fn meter(&mut self, s: &JobStatus) {
        self.meter_runtime(&s.job, s.attempt, s.runtime_ms.unwrap_or(0));
    }

    /// Meters the end of an attempt that ran for `runtime` ms (once per attempt).
    pub(super) fn meter_runtime(&mut self, id: &JobId, attempt: u32, runtime: u64) {
        let Some(job) = self.state.jobs.get(id) else {
            return;
        };
        let Some(run) = job.runs.iter().find(|r| r.attempt == attempt && !r.metered) else {
            return;
        };
        // From format 8, carbon over the intensities the site advertised while the attempt ran; before, at the
        // one in force when it ended (so that older journals replay to what their broker metered).
        let start = run.started_ms.unwrap_or(run.offered_ms);
        let log = self
            .state
            .intensity
            .get(&run.site)
            .filter(|_| self.state.format() >= super::INTEGRATED_FORMAT);
        let amounts = self
            .state
            .sites
            .get(&run.site)
            .and_then(|site| {
                site.pool(&run.pool).map(|pool| {
                    let rates = site.rates(pool, job.spec.spot, site.info.carbon.g_per_kwh);
                    match log.map(|l| l.stretches(start, start.saturating_add(runtime))) {
                        Some(stretches) if !stretches.is_empty() => {
                            metering::amounts_integrated(&rates, run.milli, &stretches)
                        }
                        _ => metering::amounts(&rates, run.milli, runtime),
                    }
                })
            })
            .unwrap_or_default();
        let metered = crate::observe::Observation::Metered {
            job: id.clone(),
            attempt,
            site: run.site.clone(),
            offered_ms: run.offered_ms,
            started_ms: run.started_ms,
            ended_ms: run.started_ms.unwrap_or(run.offered_ms) + runtime,
            tenant: job.spec.tenant.clone(),
            tier: job
                .assignment
                .as_ref()
                .filter(|a| a.site == run.site)
                .map(|a| a.tier)
                .or_else(|| self.state.sites.get(&run.site).map(|s| s.info.tier))
                .unwrap_or(meridian_federation::Tier::Owned),
            amounts,
            device_ms: run.milli.saturating_mul(runtime) / 1000,
        };
        self.saw(metered);
        if let Some(job) = self.state.jobs.get_mut(id) {
            if let Some(run) = job.runs.iter_mut().find(|r| r.attempt == attempt) {
                run.runtime_ms = runtime;
                run.amounts = amounts;
                run.metered = true;
                let day = run.offered_ms - run.offered_ms % super::DAY_MS;
                let sum = self
                    .state
                    .metered_by_day
                    .entry((job.spec.tenant.clone(), day))
                    .or_default();
                *sum = metering::add(*sum, amounts);
            }
            job.runtime_ms = job.runtime_ms.saturating_add(runtime);
            job.metered = metering::add(job.metered, amounts);
        }
    }

    pub(super) fn finish(
        &mut self,
        now: Millis,
        s: &JobStatus,
        phase: JobPhase,
        exit: Option<i32>,
        why: String,
    ) {
        self.meter(s);
        self.release(&s.job);
        if let Some(job) = self.state.jobs.get_mut(&s.job) {
            job.phase = phase;
            job.exit_code = exit;
            job.finished_ms = Some(now);
            job.started_ms = job.started_ms.or(s.started_at_ms);
            let at = job
                .assignment
                .as_ref()
                .map(|a| a.site.to_string())
                .unwrap_or_default();
            job.why = format!("{why} on {at}");
            job.note(now, format!("attempt {} {why} on {at}", s.attempt));
            self.settled(now, &s.job);
        }
    }

    /// Files a job that just reached its end (its phase and finish time set): by finish time, the next to
    /// archive first, and observed by outcome.
    pub(super) fn settled(&mut self, now: Millis, id: &JobId) {
        let Some(job) = self.state.jobs.get(id) else {
            return;
        };
        let finished = crate::observe::Observation::Finished {
            job: id.clone(),
            tenant: job.spec.tenant.clone(),
            outcome: job.phase,
            at_ms: now,
        };
        self.state.finished.insert((now, id.clone()));
        self.state.aside.remove(id);
        self.saw(finished);
    }

    /// Requeues a job that held devices: pending again, with its wait restarted.
    pub(super) fn requeue(&mut self, now: Millis, id: &JobId, why: &str) {
        self.make_pending(now, id, format!("requeued: {why}"), true);
    }

    /// Stops a job's attempt to make room for `by` and puts it back in the queue; it resumes from its last
    /// checkpoint when it runs again.
    pub(super) fn preempt(
        &mut self,
        now: Millis,
        victim: &JobId,
        by: &JobId,
        reason: &str,
        reclaim: bool,
    ) {
        let Some(job) = self.state.jobs.get(victim) else {
            return;
        };
        let Some(site) = job.assignment.as_ref().map(|a| a.site.clone()) else {
            return;
        };
        let attempt = job.attempt;
        self.saw(crate::observe::Observation::Preempted {
            job: victim.clone(),
            attempt,
            reason: if reclaim {
                crate::observe::PreemptReason::QuotaReclaim
            } else {
                crate::observe::PreemptReason::Priority
            },
            at_ms: now,
        });
        let by_queue = self
            .state
            .jobs
            .get(by)
            .map(|j| {
                j.spec
                    .queue
                    .as_ref()
                    .map_or_else(|| j.spec.tenant.to_string(), QueueName::to_string)
            })
            .unwrap_or_default();
        let why = format!("preempted by {by} (queue {by_queue}): {reason}");
        self.cancel_attempt(site, victim.clone(), attempt, why.clone());
        self.requeue(now, victim, &why);
    }

    /// The order in which a service's live replicas are stopped on scale-in: pending ones first, then those on
    /// cloud sites, then partner, then owned ones (burst capacity is given back first); within a tier the
    /// dearest per device-hour first, then the newest.
    pub fn scale_in_order(&self, tenant: &TenantId, service: &ServiceName) -> Vec<JobId> {
        let mut replicas: Vec<(u8, std::cmp::Reverse<u64>, std::cmp::Reverse<JobId>)> = self
            .state
            .active_jobs()
            .filter(|j| {
                &j.spec.tenant == tenant
                    && j.spec.service.as_ref() == Some(service)
                    && !j.cancel_requested
            })
            .map(|j| {
                let (rank, price) = match (&j.phase, &j.assignment) {
                    (JobPhase::Pending, _) => (0, 0),
                    (_, Some(a)) => {
                        let rank = match a.tier {
                            meridian_federation::Tier::Cloud => 1,
                            meridian_federation::Tier::Partner => 2,
                            meridian_federation::Tier::Owned => 3,
                        };
                        let price = self
                            .state
                            .sites
                            .get(&a.site)
                            .and_then(|s| s.pool(&a.pool))
                            .map_or(0, |p| p.price_micro_usd_per_hour);
                        (rank, price)
                    }
                    _ => (4, 0),
                };
                (
                    rank,
                    std::cmp::Reverse(price),
                    std::cmp::Reverse(j.id.clone()),
                )
            })
            .collect();
        replicas.sort();
        replicas
            .into_iter()
            .map(|(_, _, std::cmp::Reverse(id))| id)
            .collect()
    }
}
