//! The broker's reactor: every change of broker state is one `step(now, event)`. A step checks the event,
//! records it in the journal, applies it, and pushes the messages to send into the outbox. The async shell
//! around it only moves bytes; it decides nothing.

use super::journal::{Journal, JournalError, Record};
use super::latency::RttTable;
use super::metering;
use super::model::{Assignment, Job, Site};
use super::placement::{self, Outcome, Request, View};
use super::regions::Regions;
use super::Millis;
use meridian_federation::{
    AttemptRef, AttemptState, CancelAttempt, ErrorCode, Heartbeat, JobId, JobPhase, JobSpec,
    JobStatus, Offer, OfferOutcome, SiteAdvert, SiteId, SubmitReply, TenantId, WIRE_VERSION,
};
use std::collections::{BTreeMap, HashMap};

/// Accelerator time older than this does not count towards a queue's fair share.
pub const FAIR_SHARE_WINDOW_MS: u64 = 24 * 3_600_000;

/// Timings of the core, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreConfig {
    /// A site whose last heartbeat is older than this is declared lost.
    pub site_lost_after_ms: u64,
    /// An offer not answered within this is treated as refused.
    pub offer_timeout_ms: u64,
    /// How long a site that refused an offer is skipped for that job.
    pub refusal_cooldown_ms: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            site_lost_after_ms: 10_000,
            offer_timeout_ms: 5_000,
            refusal_cooldown_ms: 10_000,
        }
    }
}

/// Everything that can change broker state.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Advert(SiteAdvert),
    Heartbeat(Heartbeat),
    Submit(JobSpec),
    Cancel(JobId),
    OfferAnswer {
        site: SiteId,
        job: JobId,
        attempt: u32,
        outcome: OfferOutcome,
    },
    Status(JobStatus),
    Drain {
        site: SiteId,
        drain: bool,
    },
    /// Stop `remove` replicas of a tenant's service (see [`Reactor::scale_in_order`]).
    ScaleIn {
        tenant: TenantId,
        service: String,
        remove: u32,
    },
    /// Replace the queues, quotas, priority classes and budgets (the tenancy file's text). Journaled, so an
    /// administrator's change survives restarts.
    SetTenancy {
        toml: String,
        /// Set from the broker's tenancy file at start (not through the API).
        #[serde(default)]
        from_file: bool,
    },
    /// The broker could not act for a while (it took over from another, its journal stalled, or its own NATS
    /// connection was down): offers still unanswered get their full timeout again from now, since their answers
    /// may have been waiting unheard; and site liveness starts afresh.
    Resume,
    /// Time passed: loss of sites, offer timeouts, burst timers.
    Tick,
}

/// A message for the shell to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Offer(Offer),
    Cancel { site: SiteId, cancel: CancelAttempt },
}

/// What a step answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Submitted(SubmitReply),
    Job(JobId),
    Site(SiteId),
    Stopping(Vec<JobId>),
    Done,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepError {
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("invalid `{field}`: {problem}")]
    Invalid { field: String, problem: String },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    OverBudget(String),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl StepError {
    pub fn code(&self) -> ErrorCode {
        match self {
            StepError::NotFound { .. } => ErrorCode::NotFound,
            StepError::Invalid { .. } => ErrorCode::Invalid,
            StepError::Conflict(_) => ErrorCode::Conflict,
            StepError::OverBudget(_) => ErrorCode::OverBudget,
            StepError::Journal(_) => ErrorCode::Unavailable,
        }
    }

    pub fn field(&self) -> Option<String> {
        match self {
            StepError::Invalid { field, .. } => Some(field.clone()),
            _ => None,
        }
    }

    pub fn is_retryable(&self) -> bool {
        matches!(self, StepError::Journal(e) if e.is_retryable())
    }
}

/// Broker state: sites, jobs and the idempotency index.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub sites: BTreeMap<SiteId, Site>,
    pub jobs: BTreeMap<JobId, Job>,
    pub next_job: u64,
    pub by_key: HashMap<(TenantId, String), JobId>,
    /// Capacity changed since pending jobs were last tried.
    pub dirty: bool,
    /// Every job not yet finished (and, until pruned, some that just finished): what timers and retries scan,
    /// so their cost follows the live jobs, not the whole history.
    pub active: std::collections::BTreeSet<JobId>,
    /// Every pending job (and, until pruned, some that left that phase): what `try_pending` scans, so that
    /// placing waiting work costs in proportion to the waiting jobs, not to all the running ones.
    pub pending: std::collections::BTreeSet<JobId>,
    /// The tenancy in force, as set through `SetTenancy` (the source of `Reactor::tenancy`).
    pub tenancy_toml: Option<String>,
    /// The tenancy file's text as last applied at a start: an unchanged file does not undo the administrator's
    /// later changes.
    pub tenancy_file_toml: Option<String>,
    /// Why a journaled tenancy could not be read back (a newer broker's format, say).
    pub tenancy_toml_error: Option<String>,
    /// Every offered job (and, until pruned, some that left that phase): what the offer timer scans.
    pub offered: std::collections::BTreeSet<JobId>,
    /// The active set is pruned of finished jobs when it grows past this (amortised: twice its size after the
    /// previous pruning).
    pub active_prune_at: usize,
    /// Sites by accelerator class and spare capacity; refiled after every change to a site.
    pub index: super::index::SiteIndex,
}

impl State {
    /// Jobs that are not finished.
    pub fn active_jobs(&self) -> impl Iterator<Item = &Job> {
        self.active
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| !j.phase.is_terminal())
    }
}

pub struct Reactor<J: Journal> {
    pub state: State,
    pub config: CoreConfig,
    pub rtt: RttTable,
    pub regions: Regions,
    pub throughput: super::throughput::Throughput,
    /// Rank every job by this baseline instead of its policy (the simulator's comparison runs).
    pub baseline: Option<placement::Baseline>,
    /// Queues, quotas and priority classes; without them nothing is limited by quota.
    pub tenancy: Option<super::quota::Tenancy>,
    journal: J,
    outbox: Vec<Command>,
}

impl<J: Journal> Reactor<J> {
    pub fn new(config: CoreConfig, rtt: RttTable, regions: Regions, journal: J) -> Self {
        Reactor {
            state: State::default(),
            config,
            rtt,
            regions,
            throughput: Default::default(),
            baseline: None,
            tenancy: None,
            journal,
            outbox: Vec::new(),
        }
    }

    pub fn journal(&self) -> &J {
        &self.journal
    }

    pub fn journal_mut(&mut self) -> &mut J {
        &mut self.journal
    }

    /// After a replay, liveness starts afresh: every known site counts as seen now, and is declared lost only if
    /// its heartbeats stay away for the loss timeout from here.
    pub fn resume(&mut self, now: Millis) {
        for s in self.state.sites.values_mut() {
            s.last_seen_ms = now;
        }
    }

    /// Takes the messages produced by the steps so far.
    pub fn take_outbox(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.outbox)
    }

    /// Applies one event at time `now`.
    pub fn step(&mut self, now: Millis, event: Event) -> Result<Response, StepError> {
        self.check(now, &event)?;
        if self.is_durable(now, &event) {
            self.journal.append(&Record {
                at_ms: now,
                event: event.clone(),
            })?;
        }
        Ok(self.apply(now, event))
    }

    /// Rebuilds state from journal records (the messages they would send are dropped).
    pub fn replay<'r>(&mut self, records: impl IntoIterator<Item = &'r Record>) {
        for r in records {
            self.apply(r.at_ms, r.event.clone());
        }
        self.outbox.clear();
    }

    /// Refuses events that would not change state, before anything is journaled.
    fn check(&self, now: Millis, event: &Event) -> Result<(), StepError> {
        match event {
            Event::Submit(spec) => {
                if let Some(t) = &self.tenancy {
                    t.queue_of(&spec.tenant, spec.queue.as_deref())
                        .map_err(|problem| StepError::Invalid {
                            field: "queue".into(),
                            problem,
                        })?;
                    t.priority_of(spec.priority.as_deref()).map_err(|problem| {
                        StepError::Invalid {
                            field: "priority".into(),
                            problem,
                        }
                    })?;
                    let known = self
                        .state
                        .by_key
                        .contains_key(&(spec.tenant.clone(), spec.idempotency_key.clone()));
                    if let Some(b) = t.budgets.get(&spec.tenant) {
                        if b.when_exceeded == super::budget::WhenExceeded::Refuse && !known {
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
            Event::SetTenancy { toml, .. } => super::quota::Tenancy::from_toml(toml)
                .map(|_| ())
                .map_err(|problem| StepError::Invalid {
                    field: "tenancy".into(),
                    problem,
                }),
            _ => Ok(()),
        }
    }

    /// Whether the event changes durable state. Heartbeats, adverts that repeat a known generation and ticks
    /// with nothing due only refresh liveness, which is rebuilt from the next heartbeats after a restart.
    fn is_durable(&self, now: Millis, event: &Event) -> bool {
        match event {
            Event::Heartbeat(_) => false,
            Event::Advert(a) => !self
                .state
                .sites
                .get(&a.site.id)
                .is_some_and(|s| s.up && s.generation == a.generation && s.info == a.site),
            Event::Tick => self.tick_due(now),
            Event::Submit(spec) => !self
                .state
                .by_key
                .contains_key(&(spec.tenant.clone(), spec.idempotency_key.clone())),
            _ => true,
        }
    }

    fn tick_due(&self, now: Millis) -> bool {
        let lost =
            self.state.sites.values().any(|s| {
                s.up && now.saturating_sub(s.last_seen_ms) > self.config.site_lost_after_ms
            });
        let jobs = |set: &'_ std::collections::BTreeSet<JobId>| {
            set.iter()
                .filter_map(|id| self.state.jobs.get(id))
                .collect::<Vec<_>>()
        };
        let timed_out = jobs(&self.state.offered).into_iter().any(|j| {
            j.phase == JobPhase::Offered
                && j.offered_ms
                    .is_some_and(|t| now.saturating_sub(t) > self.config.offer_timeout_ms)
        });
        let retry = jobs(&self.state.pending).into_iter().any(|j| {
            j.phase == JobPhase::Pending
                && (self.state.dirty
                    || j.retry_at_ms.is_some_and(|t| t <= now)
                    || j.refused_until.iter().any(|(_, u)| *u <= now))
        });
        lost || timed_out || retry
    }

    fn apply(&mut self, now: Millis, event: Event) -> Response {
        match event {
            Event::Advert(a) => {
                self.on_advert(now, a);
                Response::Done
            }
            Event::Heartbeat(h) => {
                self.on_heartbeat(now, h);
                Response::Done
            }
            Event::Submit(spec) => self.on_submit(now, spec),
            Event::Cancel(job) => {
                self.on_cancel(now, &job);
                Response::Job(job)
            }
            Event::OfferAnswer {
                site,
                job,
                attempt,
                outcome,
            } => {
                self.on_offer_answer(now, site, job, attempt, outcome);
                Response::Done
            }
            Event::Status(s) => {
                self.on_status(now, s);
                Response::Done
            }
            Event::Drain { site, drain } => {
                if let Some(s) = self.state.sites.get_mut(&site) {
                    s.api_draining = drain;
                    self.state.dirty = true;
                }
                self.reindex(&site);
                Response::Site(site)
            }
            Event::Tick => {
                self.on_tick(now);
                Response::Done
            }
            Event::Resume => {
                self.resume(now);
                for id in &self.state.offered {
                    if let Some(job) = self.state.jobs.get_mut(id) {
                        if job.phase == JobPhase::Offered {
                            job.offered_ms = Some(now);
                        }
                    }
                }
                Response::Done
            }
            Event::SetTenancy { toml, from_file } => {
                if from_file {
                    self.state.tenancy_file_toml = Some(toml.clone());
                }
                // Checked before it was journaled; a record that no longer reads is kept out, said so.
                match super::quota::Tenancy::from_toml(&toml) {
                    Ok(t) => {
                        self.tenancy = Some(t);
                        self.state.tenancy_toml = Some(toml);
                        self.state.dirty = true;
                        self.try_pending(now);
                    }
                    Err(e) => self.state.tenancy_toml_error = Some(e),
                }
                Response::Done
            }
            Event::ScaleIn {
                tenant,
                service,
                remove,
            } => {
                let chosen: Vec<JobId> = self
                    .scale_in_order(&tenant, &service)
                    .into_iter()
                    .take(remove as usize)
                    .collect();
                for id in &chosen {
                    if let Some(job) = self.state.jobs.get_mut(id) {
                        job.note(now, format!("stopped by scale-in of service {service}"));
                    }
                    self.on_cancel(now, id);
                }
                Response::Stopping(chosen)
            }
        }
    }

    fn on_advert(&mut self, now: Millis, a: SiteAdvert) {
        let id = a.site.id.clone();
        let api_draining = self.state.sites.get(&id).is_some_and(|s| s.api_draining);
        let unchanged = self
            .state
            .sites
            .get(&id)
            .is_some_and(|s| s.up && s.generation == a.generation && s.info == a.site);
        if unchanged {
            if let Some(s) = self.state.sites.get_mut(&id) {
                s.last_seen_ms = now;
            }
            return;
        }
        // Same pools as before (the usual periodic or carbon update): refresh in place, keeping reservations.
        if let Some(s) = self.state.sites.get_mut(&id) {
            if s.same_shape(&a) {
                s.refresh(&a, now);
                self.state.dirty = true;
                self.reindex(&id);
                self.try_pending(now);
                return;
            }
        }
        let mut site = Site::from_advert(&a, now);
        site.api_draining = api_draining;
        // Reservations are the broker's own: rebuild them from the jobs that hold devices here.
        for job in self.state.active_jobs().filter(|j| j.holds_devices()) {
            if let Some(asg) = job.assignment.as_ref().filter(|asg| asg.site == id) {
                site.apply_reservation(&asg.pool, &asg.devices, true);
            }
        }
        self.state.sites.insert(id.clone(), site);
        self.reindex(&id);
        self.state.dirty = true;
        self.try_pending(now);
    }

    fn on_heartbeat(&mut self, now: Millis, h: Heartbeat) {
        let Some(site) = self.state.sites.get_mut(&h.site) else {
            return;
        };
        if !site.up {
            // A lost site must re-advertise before it gets work again; its heartbeat alone is not enough.
            return;
        }
        site.last_seen_ms = now;
        // Attempts the site runs that the broker no longer assigns there are stopped.
        for AttemptRef { job, attempt } in h.running {
            if !self.is_current(&job, attempt, &h.site) {
                self.outbox.push(Command::Cancel {
                    site: h.site.clone(),
                    cancel: CancelAttempt {
                        v: WIRE_VERSION,
                        job,
                        attempt,
                        reason: "attempt is no longer assigned to this site".into(),
                    },
                });
            }
        }
    }

    fn is_current(&self, job: &JobId, attempt: u32, site: &SiteId) -> bool {
        self.state.jobs.get(job).is_some_and(|j| {
            j.attempt == attempt
                && j.holds_devices()
                && j.assignment.as_ref().is_some_and(|a| &a.site == site)
        })
    }

    fn on_submit(&mut self, now: Millis, spec: JobSpec) -> Response {
        let key = (spec.tenant.clone(), spec.idempotency_key.clone());
        if let Some(id) = self.state.by_key.get(&key) {
            return Response::Submitted(SubmitReply {
                job: id.clone(),
                created: false,
            });
        }
        self.state.next_job += 1;
        let id = JobId::numbered(self.state.next_job);
        self.state.by_key.insert(key, id.clone());
        self.state.active.insert(id.clone());
        self.state.pending.insert(id.clone());
        self.state
            .jobs
            .insert(id.clone(), Job::new(id.clone(), spec, now));
        self.try_place(now, &id);
        Response::Submitted(SubmitReply {
            job: id,
            created: true,
        })
    }

    fn on_cancel(&mut self, now: Millis, id: &JobId) {
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        match job.phase {
            JobPhase::Pending => {
                job.phase = JobPhase::Cancelled;
                job.finished_ms = Some(now);
                job.why = "cancelled while pending".into();
                job.note(now, "cancelled while pending");
            }
            JobPhase::Offered | JobPhase::Running => {
                job.phase = JobPhase::Cancelling;
                job.cancel_requested = true;
                job.why = "cancel requested; waiting for the site to stop it".into();
                job.note(now, "cancel requested");
                if let Some(a) = &job.assignment {
                    self.outbox.push(Command::Cancel {
                        site: a.site.clone(),
                        cancel: CancelAttempt {
                            v: WIRE_VERSION,
                            job: id.clone(),
                            attempt: job.attempt,
                            reason: "cancelled by user".into(),
                        },
                    });
                }
            }
            _ => {}
        }
    }

    fn on_offer_answer(
        &mut self,
        now: Millis,
        site: SiteId,
        id: JobId,
        attempt: u32,
        outcome: OfferOutcome,
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
                self.outbox.push(Command::Cancel {
                    site,
                    cancel: CancelAttempt {
                        v: WIRE_VERSION,
                        job: id,
                        attempt,
                        reason: "offer was withdrawn before it was accepted".into(),
                    },
                });
            }
            return;
        }
        match outcome {
            OfferOutcome::Accepted => {
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    job.phase = JobPhase::Running;
                    job.started_ms.get_or_insert(now);
                    job.note(now, format!("attempt {attempt} accepted by {site}"));
                }
            }
            OfferOutcome::Rejected { reason } => {
                self.refuse(now, &id, &site, &format!("refused by {site}: {reason}"));
                self.try_place(now, &id);
            }
        }
    }

    /// Releases the job's devices, skips the site for a while and makes the job pending again.
    fn refuse(&mut self, now: Millis, id: &JobId, site: &SiteId, why: &str) {
        self.release(id);
        let until = now + self.config.refusal_cooldown_ms;
        if let Some(job) = self.state.jobs.get_mut(id) {
            job.refused_until.retain(|(s, u)| s != site && *u > now);
            job.refused_until.push((site.clone(), until));
            job.phase = JobPhase::Pending;
            self.state.pending.insert(id.clone());
            job.assignment = None;
            job.offered_ms = None;
            job.why = why.to_owned();
            job.note(now, why);
        }
    }

    fn release(&mut self, id: &JobId) {
        let Some(job) = self.state.jobs.get(id) else {
            return;
        };
        if !job.holds_devices() {
            return;
        }
        if let Some(a) = &job.assignment {
            if let Some(site) = self.state.sites.get_mut(&a.site) {
                site.apply_reservation(&a.pool, &a.devices, false);
            }
            let site = a.site.clone();
            self.reindex(&site);
        }
        self.state.dirty = true;
    }

    fn on_status(&mut self, now: Millis, s: JobStatus) {
        if !self.is_current(&s.job, s.attempt, &s.site) {
            if s.state != AttemptState::Running {
                // The end of an attempt that was preempted or given up: its use still goes to the ledger.
                self.meter(&s);
            }
            if s.state == AttemptState::Running {
                self.outbox.push(Command::Cancel {
                    site: s.site.clone(),
                    cancel: CancelAttempt {
                        v: WIRE_VERSION,
                        job: s.job,
                        attempt: s.attempt,
                        reason: "attempt is no longer assigned to this site".into(),
                    },
                });
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
                if let Some(job) = self.state.jobs.get_mut(&id) {
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
    fn meter(&mut self, s: &JobStatus) {
        let Some(job) = self.state.jobs.get(&s.job) else {
            return;
        };
        let Some(run) = job
            .runs
            .iter()
            .find(|r| r.attempt == s.attempt && !r.metered)
        else {
            return;
        };
        let runtime = s.runtime_ms.unwrap_or(0);
        let amounts = self
            .state
            .sites
            .get(&run.site)
            .and_then(|site| {
                site.pool(&run.pool).map(|pool| {
                    let rates = site.rates(pool, site.info.carbon.g_per_kwh);
                    metering::amounts(&rates, run.milli, runtime)
                })
            })
            .unwrap_or_default();
        if let Some(job) = self.state.jobs.get_mut(&s.job) {
            if let Some(run) = job.runs.iter_mut().find(|r| r.attempt == s.attempt) {
                run.runtime_ms = runtime;
                run.amounts = amounts;
                run.metered = true;
            }
            job.runtime_ms = job.runtime_ms.saturating_add(runtime);
            job.metered = metering::add(job.metered, amounts);
        }
    }

    fn finish(
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
        }
    }

    /// Makes a job that held devices pending again (its devices released).
    fn requeue(&mut self, now: Millis, id: &JobId, why: &str) {
        self.release(id);
        if let Some(job) = self.state.jobs.get_mut(id) {
            job.phase = JobPhase::Pending;
            self.state.pending.insert(id.clone());
            job.assignment = None;
            job.offered_ms = None;
            job.waiting_since_ms = now;
            job.why = format!("requeued: {why}");
            job.note(now, format!("requeued: {why}"));
        }
    }

    fn on_tick(&mut self, now: Millis) {
        let jobs = &self.state.jobs;
        if self.state.active.len() > self.state.active_prune_at {
            self.state
                .active
                .retain(|id| jobs.get(id).is_some_and(|j| !j.phase.is_terminal()));
            self.state.active_prune_at = (2 * self.state.active.len()).max(1024);
        }
        self.state
            .offered
            .retain(|id| jobs.get(id).is_some_and(|j| j.phase == JobPhase::Offered));
        let lost: Vec<SiteId> = self
            .state
            .sites
            .values()
            .filter(|s| s.up && now.saturating_sub(s.last_seen_ms) > self.config.site_lost_after_ms)
            .map(|s| s.id().clone())
            .collect();
        for site in lost {
            self.on_site_lost(now, &site);
        }
        let timed_out: Vec<(JobId, SiteId)> = self
            .state
            .offered
            .iter()
            .filter_map(|id| self.state.jobs.get(id))
            .filter(|j| {
                j.phase == JobPhase::Offered
                    && j.offered_ms
                        .is_some_and(|t| now.saturating_sub(t) > self.config.offer_timeout_ms)
            })
            .filter_map(|j| {
                j.assignment
                    .as_ref()
                    .map(|a| (j.id.clone(), a.site.clone()))
            })
            .collect();
        for (job, site) in timed_out {
            let attempt = self.state.jobs.get(&job).map(|j| j.attempt).unwrap_or(0);
            self.outbox.push(Command::Cancel {
                site: site.clone(),
                cancel: CancelAttempt {
                    v: WIRE_VERSION,
                    job: job.clone(),
                    attempt,
                    reason: "offer timed out".into(),
                },
            });
            self.refuse(now, &job, &site, &format!("offer to {site} timed out"));
        }
        self.try_pending(now);
    }

    fn on_site_lost(&mut self, now: Millis, site: &SiteId) {
        if let Some(s) = self.state.sites.get_mut(site) {
            s.up = false;
        }
        self.reindex(site);
        let held: Vec<JobId> = self
            .state
            .active_jobs()
            .filter(|j| j.holds_devices() && j.assignment.as_ref().is_some_and(|a| &a.site == site))
            .map(|j| j.id.clone())
            .collect();
        for id in held {
            let cancel = self.state.jobs.get(&id).is_some_and(|j| j.cancel_requested);
            if cancel {
                self.release(&id);
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    job.phase = JobPhase::Cancelled;
                    job.finished_ms = Some(now);
                    job.why = format!("cancelled; site {site} was lost");
                    job.note(now, job.why.clone());
                }
            } else {
                self.requeue(now, &id, &format!("site {site} lost (no heartbeats)"));
            }
        }
        self.state.dirty = true;
    }

    /// Tries every pending job, oldest first.
    fn try_pending(&mut self, now: Millis) {
        let jobs = &self.state.jobs;
        self.state
            .pending
            .retain(|id| jobs.get(id).is_some_and(|j| j.phase == JobPhase::Pending));
        let due: Vec<JobId> = self
            .state
            .pending
            .iter()
            .filter_map(|id| self.state.jobs.get(id))
            .filter(|j| {
                j.phase == JobPhase::Pending
                    && (self.state.dirty
                        || j.retry_at_ms.is_some_and(|t| t <= now)
                        || j.refused_until.iter().any(|(_, u)| *u <= now))
            })
            .map(|j| j.id.clone())
            .collect();
        self.state.dirty = false;
        let mut due = due;
        if let Some(t) = &self.tenancy {
            self.fair_order(t, now, &mut due);
        }
        let mut quota = None;
        for id in due {
            self.try_place_with(now, &id, &mut quota);
        }
    }

    /// Orders waiting jobs for dominant-resource fairness between queues: the queue with the smallest dominant
    /// share of recent accelerator time goes first (then higher priority, then the oldest job). A queue's share
    /// of a kind (GPU, NPU, …) is its accelerator time over the last [`FAIR_SHARE_WINDOW_MS`] — running
    /// attempts included — over the federation's capacity of that kind for as long; both are in reference
    /// device-time, each model weighted by the relative-throughput table, so an hour of H100 counts for more
    /// than an hour of L4. The dominant share is the largest over the kinds.
    fn fair_order(&self, t: &super::quota::Tenancy, now: Millis, due: &mut [JobId]) {
        use meridian_federation::AcceleratorKind;
        if due.len() < 2 {
            return;
        }
        let from = now.saturating_sub(FAIR_SHARE_WINDOW_MS);
        let mut capacity: BTreeMap<AcceleratorKind, f64> = BTreeMap::new();
        for site in self.state.sites.values().filter(|s| s.up) {
            for p in &site.pools {
                *capacity.entry(p.kind).or_default() += p.devices.len() as f64
                    * 1000.0
                    * self.throughput.factor(&p.model)
                    * FAIR_SHARE_WINDOW_MS as f64;
            }
        }
        let mut used: BTreeMap<(String, AcceleratorKind), f64> = BTreeMap::new();
        let mut queues: HashMap<(&TenantId, Option<&str>), Option<&super::quota::Queue>> =
            HashMap::new();
        for job in self.state.jobs.values() {
            // Only jobs that ran in the window count.
            if job.runs.is_empty() || job.finished_ms.is_some_and(|f| f < from) {
                continue;
            }
            let q = *queues
                .entry((&job.spec.tenant, job.spec.queue.as_deref()))
                .or_insert_with(|| t.queue_of(&job.spec.tenant, job.spec.queue.as_deref()).ok());
            let Some(q) = q else {
                continue;
            };
            for run in &job.runs {
                let Some(start) = run.started_ms else {
                    continue;
                };
                let end = if run.metered {
                    start + run.runtime_ms
                } else if job.holds_devices() && job.attempt == run.attempt {
                    now
                } else {
                    continue;
                };
                let overlap = end.min(now).saturating_sub(start.max(from));
                *used
                    .entry((q.name.clone(), job.spec.resources.kind))
                    .or_default() +=
                    run.milli as f64 * overlap as f64 * self.throughput.factor(&run.model);
            }
        }
        let dominant = |queue: &str| {
            used.iter()
                .filter(|((q, _), _)| q == queue)
                .map(|((_, kind), u)| u / capacity.get(kind).copied().unwrap_or(f64::INFINITY))
                .fold(0.0f64, f64::max)
        };
        let key = |id: &JobId| {
            let job = self.state.jobs.get(id)?;
            let q = t
                .queue_of(&job.spec.tenant, job.spec.queue.as_deref())
                .ok()?;
            let p = t
                .priority_of(job.spec.priority.as_deref())
                .unwrap_or(t.default_priority);
            Some((dominant(&q.name), std::cmp::Reverse(p)))
        };
        due.sort_by(|a, b| {
            let (ka, kb) = (key(a), key(b));
            match (ka, kb) {
                (Some((da, pa)), Some((db, pb))) => da.total_cmp(&db).then(pa.cmp(&pb)),
                _ => std::cmp::Ordering::Equal,
            }
            .then_with(|| a.cmp(b))
        });
    }

    /// Places one pending job: reserves devices and sends an offer, or records why it waits.
    fn try_place(&mut self, now: Millis, id: &JobId) {
        self.try_place_with(now, id, &mut None);
    }

    /// [`Self::try_place`] with the pass's quota view (computed when first needed, dropped after a change).
    fn try_place_with(
        &mut self,
        now: Millis,
        id: &JobId,
        quota: &mut Option<super::quota::QuotaView>,
    ) {
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        if job.phase != JobPhase::Pending {
            return;
        }
        job.refused_until.retain(|(_, u)| *u > now);
        // Quota first, on the classes the job counts against whatever pool it gets: a job its queue cannot
        // take waits for quota, not for capacity; a lender taking its quota back frees the borrowed devices
        // before placement looks for some.
        let demand = if self.tenancy.is_some() {
            Self::spec_demand(&job.spec)
        } else {
            BTreeMap::new()
        };
        match self.admit_demand(id, &demand, quota) {
            super::quota::Admission::Admit => {}
            super::quota::Admission::Wait(why) => {
                if let Some(job) = self.state.jobs.get_mut(id) {
                    if job.why != why {
                        job.note(now, why.clone());
                    }
                    job.why = why;
                    job.retry_at_ms = None;
                }
                return;
            }
            super::quota::Admission::Preempt { victims, reason } => {
                for v in &victims {
                    self.preempt(now, v, id, &reason);
                }
                *quota = None;
            }
        }
        let capped = match self.state.jobs.get(id) {
            Some(job) => self.capped_pools(job, quota),
            None => return,
        };
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        let refused: Vec<SiteId> = job.refused_sites(now).cloned().collect();
        let view = View {
            sites: &self.state.sites,
            rtt: &self.rtt,
            regions: &self.regions,
            throughput: &self.throughput,
            index: Some(&self.state.index),
        };
        let request = Request {
            spec: &job.spec,
            waited_ms: now.saturating_sub(job.waiting_since_ms),
            refused: &refused,
            capped: &capped,
            baseline: self.baseline,
        };
        let mut decision = placement::place(view, request, now);
        // Budget: expected spend at the chosen placement.
        if let (Outcome::Place(choice), Some(t)) = (&decision.outcome, &self.tenancy) {
            if let Some(job) = self.state.jobs.get(id) {
                if let Some(b) = t.budgets.get(&job.spec.tenant) {
                    if let Some(why) = self.over_budget(b, &job.spec, Some(choice), now) {
                        let until_ms = super::budget::period(now, b.period).1;
                        decision.outcome = Outcome::Wait(placement::Wait::Budget { why, until_ms });
                    }
                }
            }
        }
        // Quota: a job that could run now may still have to wait for its queue's quota, or take it back.
        if let Outcome::Place(choice) = &decision.outcome {
            match self.admission(id, choice, quota) {
                super::quota::Admission::Admit => {}
                super::quota::Admission::Wait(why) => {
                    decision.outcome = Outcome::Wait(placement::Wait::Quota(why));
                }
                super::quota::Admission::Preempt { victims, reason } => {
                    for v in &victims {
                        self.preempt(now, v, id, &reason);
                    }
                }
            }
            // The job is placed now (or preempted others): what quota saw has changed.
            *quota = None;
        }
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        let next_refusal = job.refused_until.iter().map(|(_, u)| *u).min();
        match &decision.outcome {
            Outcome::Wait(wait) => {
                job.why = match wait {
                    placement::Wait::Busy { .. } if job.spec.replicas > 1 => format!(
                        "gang of {} replicas, admitted only all together at one site: {wait}",
                        job.spec.replicas
                    ),
                    _ => wait.to_string(),
                };
                job.retry_at_ms = wait.retry_at(now).or(next_refusal);
                job.decision = Some(decision);
            }
            Outcome::Place(choice) => {
                job.attempt += 1;
                job.phase = JobPhase::Offered;
                self.state.offered.insert(id.clone());
                job.offered_ms = Some(now);
                job.retry_at_ms = None;
                job.assignment = Some(Assignment {
                    site: choice.site.clone(),
                    pool: choice.pool.clone(),
                    tier: choice.tier,
                    devices: choice.devices.clone(),
                });
                job.estimate = Some(choice.terms.clone());
                let model = self
                    .state
                    .sites
                    .get(&choice.site)
                    .and_then(|s| s.pool(&choice.pool))
                    .map(|p| p.model.clone())
                    .unwrap_or_default();
                job.runs.push(super::model::Run {
                    attempt: job.attempt,
                    site: choice.site.clone(),
                    pool: choice.pool.clone(),
                    model,
                    milli: choice.devices.iter().map(|d| u64::from(d.milli)).sum(),
                    offered_ms: now,
                    started_ms: None,
                    runtime_ms: 0,
                    amounts: Default::default(),
                    metered: false,
                });
                job.why = format!(
                    "placed on {} ({}) by policy {}: best score among {} candidates that can run it now",
                    choice.site,
                    choice.tier.as_str(),
                    decision.policy,
                    decision
                        .candidates
                        .iter()
                        .filter(|c| c.tier == choice.tier && c.terms.is_some() && !matches!(c.reject, Some(placement::Reject::Busy { .. })))
                        .count()
                );
                job.note(
                    now,
                    format!("attempt {} offered to {}", job.attempt, choice.site),
                );
                let offer = Offer {
                    v: WIRE_VERSION,
                    job: id.clone(),
                    attempt: job.attempt,
                    site: choice.site.clone(),
                    pool: choice.pool.clone(),
                    devices: choice.devices.clone(),
                    spec: job.spec.clone(),
                    resume_from: job.checkpoint.clone(),
                };
                let (site, pool, devices) = (
                    choice.site.clone(),
                    choice.pool.clone(),
                    choice.devices.clone(),
                );
                job.decision = Some(decision);
                if let Some(s) = self.state.sites.get_mut(&site) {
                    s.apply_reservation(&pool, &devices, true);
                }
                self.reindex(&site);
                self.outbox.push(Command::Offer(offer));
            }
        }
    }

    /// Why a job of `spec` would take its tenant over budget `b` (`None` if it fits): its expected spend is the
    /// estimate at `choice`, or at the placement the broker would choose now.
    fn over_budget(
        &self,
        b: &super::budget::Budget,
        spec: &JobSpec,
        choice: Option<&placement::Choice>,
        now: Millis,
    ) -> Option<String> {
        let terms = match choice {
            Some(c) => Some(c.terms.clone()),
            None => {
                let view = View {
                    sites: &self.state.sites,
                    rtt: &self.rtt,
                    regions: &self.regions,
                    throughput: &self.throughput,
                    index: Some(&self.state.index),
                };
                let request = Request {
                    spec,
                    waited_ms: u64::MAX,
                    refused: &[],
                    capped: &[],
                    baseline: self.baseline,
                };
                match placement::place(view, request, now).outcome {
                    Outcome::Place(c) => Some(c.terms),
                    Outcome::Wait(_) => None,
                }
            }
        };
        let expected = terms.map_or_else(Default::default, |t| meridian_federation::Amounts {
            cost_micro_usd: t.cost_micro_usd,
            energy_wh: t.energy_wh,
            co2_g: t.co2_g,
        });
        let (from, to) = super::budget::period(now, b.period);
        let used = super::budget::used(self.state.jobs.values(), &b.tenant, from, to);
        super::budget::over(b, &used, &expected)
    }

    /// What quota says about placing job `id` as `choice` (admitted when there is no tenancy).
    fn admission(
        &self,
        id: &JobId,
        choice: &placement::Choice,
        quota: &mut Option<super::quota::QuotaView>,
    ) -> super::quota::Admission {
        let demand = self.class_usage(&choice.site, &choice.pool, &choice.devices);
        self.admit_demand(id, &demand, quota)
    }

    /// What quota decisions look at now (see [`super::quota::QuotaView`]).
    fn quota_view(&self, t: &super::quota::Tenancy) -> super::quota::QuotaView {
        let waiting = self
            .state
            .pending
            .iter()
            .filter_map(|p| self.state.jobs.get(p))
            .filter(|j| j.phase == JobPhase::Pending)
            .filter_map(|j| {
                let q = t.queue_of(&j.spec.tenant, j.spec.queue.as_deref()).ok()?;
                Some((q.name.clone(), Self::spec_demand(&j.spec)))
            })
            .collect();
        super::quota::QuotaView::new(self.holdings(t), waiting)
    }

    /// What quota says about job `id` taking `demand` (admitted when there is no tenancy).
    fn admit_demand(
        &self,
        id: &JobId,
        demand: &BTreeMap<super::quota::Class, u64>,
        quota: &mut Option<super::quota::QuotaView>,
    ) -> super::quota::Admission {
        use super::quota::{admit, Admission};
        let (Some(t), Some(job)) = (&self.tenancy, self.state.jobs.get(id)) else {
            return Admission::Admit;
        };
        let Ok(queue) = t.queue_of(&job.spec.tenant, job.spec.queue.as_deref()) else {
            return Admission::Admit;
        };
        let priority = t
            .priority_of(job.spec.priority.as_deref())
            .unwrap_or(t.default_priority);
        // (The job itself is among the waiting ones; `admit` looks only at other queues' waiting work.)
        let view = quota.get_or_insert_with(|| self.quota_view(t));
        admit(t, view, queue, priority, demand)
    }

    /// The classes a job counts against whatever pool it gets: `kind:*`, and `kind:model` when it allows one
    /// model only.
    fn spec_demand(spec: &JobSpec) -> BTreeMap<super::quota::Class, u64> {
        let mut demand = BTreeMap::new();
        let milli = spec.resources.milli_per_replica() * u64::from(spec.replicas.max(1));
        let any = super::quota::classes_of(spec.resources.kind, "*");
        demand.insert(any[1].clone(), milli);
        if let [model] = spec.resources.models.as_slice() {
            demand.insert(
                super::quota::classes_of(spec.resources.kind, model)[0].clone(),
                milli,
            );
        }
        demand
    }

    /// Milli-devices per quota class of a share of a pool.
    fn class_usage(
        &self,
        site: &SiteId,
        pool: &str,
        devices: &[meridian_federation::DeviceShare],
    ) -> BTreeMap<super::quota::Class, u64> {
        let milli: u64 = devices.iter().map(|d| u64::from(d.milli)).sum();
        self.state
            .sites
            .get(site)
            .and_then(|s| s.pool(pool))
            .map(|p| {
                super::quota::classes_of(p.kind, &p.model)
                    .into_iter()
                    .map(|c| (c, milli))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pools where the job's queue has reached its per-site cap.
    fn capped_pools(
        &self,
        job: &super::model::Job,
        quota: &mut Option<super::quota::QuotaView>,
    ) -> Vec<(SiteId, String)> {
        let Some(t) = &self.tenancy else {
            return Vec::new();
        };
        let Ok(queue) = t.queue_of(&job.spec.tenant, job.spec.queue.as_deref()) else {
            return Vec::new();
        };
        if queue.site_caps.is_empty() {
            return Vec::new();
        }
        let milli = job.spec.resources.milli_per_replica() * u64::from(job.spec.replicas.max(1));
        let pools = self.state.sites.values().flat_map(|s| {
            s.pools
                .iter()
                .map(move |p| (s.id(), p.name.as_str(), p.kind, p.model.as_str()))
        });
        let view = quota.get_or_insert_with(|| self.quota_view(t));
        super::quota::capped_pools(queue, &view.holdings, pools, milli)
    }

    /// Every job holding devices, for quota accounting.
    fn holdings(&self, t: &super::quota::Tenancy) -> Vec<super::quota::Holding> {
        self.state
            .active_jobs()
            .filter(|j| j.holds_devices())
            .filter_map(|j| {
                let a = j.assignment.as_ref()?;
                let queue = t.queue_of(&j.spec.tenant, j.spec.queue.as_deref()).ok()?;
                Some(super::quota::Holding {
                    job: j.id.clone(),
                    queue: queue.name.clone(),
                    site: a.site.clone(),
                    priority: t
                        .priority_of(j.spec.priority.as_deref())
                        .unwrap_or(t.default_priority),
                    checkpointable: j.spec.checkpointable,
                    since_ms: j.offered_ms.unwrap_or(0),
                    usage: self.class_usage(&a.site, &a.pool, &a.devices),
                })
            })
            .collect()
    }

    /// Stops a job's attempt to make room for `by` and puts it back in the queue; it resumes from its last
    /// checkpoint when it runs again.
    fn preempt(&mut self, now: Millis, victim: &JobId, by: &JobId, reason: &str) {
        let Some(job) = self.state.jobs.get(victim) else {
            return;
        };
        let Some(site) = job.assignment.as_ref().map(|a| a.site.clone()) else {
            return;
        };
        let by_queue = self
            .state
            .jobs
            .get(by)
            .map(|j| {
                j.spec
                    .queue
                    .clone()
                    .unwrap_or_else(|| j.spec.tenant.to_string())
            })
            .unwrap_or_default();
        let why = format!("preempted by {by} (queue {by_queue}): {reason}");
        self.outbox.push(Command::Cancel {
            site,
            cancel: CancelAttempt {
                v: WIRE_VERSION,
                job: victim.clone(),
                attempt: job.attempt,
                reason: why.clone(),
            },
        });
        self.requeue(now, victim, &why);
    }

    /// The order in which a service's live replicas are stopped on scale-in: pending ones first, then those on
    /// cloud sites, then partner, then owned ones (burst capacity is given back first); within a tier the
    /// dearest per device-hour first, then the newest.
    pub fn scale_in_order(&self, tenant: &TenantId, service: &str) -> Vec<JobId> {
        let mut replicas: Vec<(u8, std::cmp::Reverse<u64>, std::cmp::Reverse<JobId>)> = self
            .state
            .active_jobs()
            .filter(|j| {
                &j.spec.tenant == tenant
                    && j.spec.service.as_deref() == Some(service)
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

    /// Refiles a site in the index after a change to it.
    fn reindex(&mut self, id: &SiteId) {
        if let Some(s) = self.state.sites.get(id) {
            self.state.index.update(s, &self.throughput);
        }
    }

    /// Checks the invariants of broker state; returns the first one broken. Tests call it after every step.
    pub fn sanity_check(&self) -> Result<(), String> {
        let mut reserved: BTreeMap<(SiteId, String, u32), u32> = BTreeMap::new();
        for job in self.state.jobs.values() {
            match (job.holds_devices(), &job.assignment) {
                (true, Some(a)) => {
                    for d in &a.devices {
                        *reserved
                            .entry((a.site.clone(), a.pool.clone(), d.index))
                            .or_default() += d.milli;
                    }
                }
                (true, None) => {
                    return Err(format!("{} holds devices without an assignment", job.id))
                }
                _ => {}
            }
            if job.phase == JobPhase::Pending && !self.state.pending.contains(&job.id) {
                return Err(format!("{} is pending but not in the pending set", job.id));
            }
            if job.phase == JobPhase::Offered && !self.state.offered.contains(&job.id) {
                return Err(format!("{} is offered but not in the offered set", job.id));
            }
            if !job.phase.is_terminal() && !self.state.active.contains(&job.id) {
                return Err(format!(
                    "{} is unfinished but not in the active set",
                    job.id
                ));
            }
            let runs = job.runs.iter().fold(
                (
                    super::metering::add(Default::default(), Default::default()),
                    0u64,
                ),
                |(a, t), r| (super::metering::add(a, r.amounts), t + r.runtime_ms),
            );
            if (runs.0, runs.1) != (job.metered, job.runtime_ms) {
                return Err(format!(
                    "{}: metered {:?} over {} ms, but its runs add up to {:?} over {} ms",
                    job.id, job.metered, job.runtime_ms, runs.0, runs.1
                ));
            }
            if job.phase.is_terminal() && job.finished_ms.is_none() {
                return Err(format!(
                    "{} is {:?} without a finish time",
                    job.id, job.phase
                ));
            }
        }
        for site in self.state.sites.values() {
            for pool in &site.pools {
                for d in &pool.devices {
                    let want = reserved
                        .remove(&(site.id().clone(), pool.name.clone(), d.index))
                        .unwrap_or(0);
                    if d.reserved_milli != want {
                        return Err(format!(
                            "{}/{}/{}: reserved {} but jobs hold {want}",
                            site.id(),
                            pool.name,
                            d.index,
                            d.reserved_milli
                        ));
                    }
                    if d.reserved_milli > 1000 {
                        return Err(format!(
                            "{}/{}/{} over-committed",
                            site.id(),
                            pool.name,
                            d.index
                        ));
                    }
                }
            }
        }
        let mut fresh = super::index::SiteIndex::default();
        for site in self.state.sites.values() {
            fresh.update(site, &self.throughput);
        }
        if fresh != self.state.index {
            return Err(format!(
                "the site index differs from one rebuilt from the sites:\n{:?}\n{fresh:?}",
                self.state.index
            ));
        }
        if let Some(((s, p, i), m)) = reserved.into_iter().next() {
            return Err(format!("jobs hold {m} milli of unknown device {s}/{p}/{i}"));
        }
        if let Some(t) = &self.tenancy {
            self.check_quota(t)?;
        }
        Ok(())
    }

    /// No queue beyond its quota plus its borrowing limit; no cohort beyond the sum of its quotas.
    fn check_quota(&self, t: &super::quota::Tenancy) -> Result<(), String> {
        let used = super::quota::usage(&self.holdings(t));
        let mut cohorts: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for q in t.queues.values() {
            for (class, nominal) in &q.nominal {
                let u = used
                    .get(&(q.name.clone(), class.clone()))
                    .copied()
                    .unwrap_or(0);
                if let Some(limit) = q.borrowing_limit.get(class) {
                    if u > nominal + limit {
                        return Err(format!(
                            "queue {} uses {u} milli of {class}: over its quota {nominal} plus borrowing limit {limit}",
                            q.name
                        ));
                    }
                }
                let key = (
                    q.cohort.clone().unwrap_or_else(|| q.name.clone()),
                    class.clone(),
                );
                let e = cohorts.entry(key).or_default();
                e.0 += u;
                e.1 += nominal;
            }
        }
        let holdings = self.holdings(t);
        for q in t.queues.values() {
            for (site, caps) in &q.site_caps {
                for (class, cap) in caps {
                    let u: u64 = holdings
                        .iter()
                        .filter(|h| h.queue == q.name && &h.site == site)
                        .filter_map(|h| h.usage.get(class))
                        .sum();
                    if u > *cap {
                        return Err(format!(
                            "queue {} holds {u} milli of {class} at {site}, over its cap {cap}",
                            q.name
                        ));
                    }
                }
            }
        }
        for ((cohort, class), (u, n)) in cohorts {
            if u > n {
                return Err(format!(
                    "cohort {cohort} uses {u} milli of {class}, over its quota {n}"
                ));
            }
        }
        Ok(())
    }
}
