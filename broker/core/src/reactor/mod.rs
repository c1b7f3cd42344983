//! The broker's reactor: every change of broker state is one `step(now, event)`. A step checks the event,
//! records it in the journal, applies it, and pushes the messages to send into the outbox. The async shell
//! around it only moves bytes; it decides nothing.

mod aside;
mod checks;
mod events;
mod fairness;
mod history;
mod invariants;
mod lifecycle;
mod liveness;
mod reconcile;
mod scheduling;
mod spending;
mod state;
mod tenancy;
mod waiting;

pub use events::{Command, Event, Response, StepError};
pub use invariants::{QuotaLimit, Violation};
pub use state::State;

/// The first durable format in which decisions made from liveness are journaled (see [`Event::SiteLost`]).
pub const JOURNALED_DECISIONS: u32 = 2;
/// The first durable format with API tokens and revoked sites.
pub const SECURITY_FORMAT: u32 = 3;
/// The first durable format with deployed services.
pub const SERVICES_FORMAT: u32 = 5;
/// The first durable format with spot capacity: jobs that run on it, pools' spot prices in snapshots.
pub const SPOT_FORMAT: u32 = 6;
/// The first durable format with gateway tokens (the `gateway` role).
pub const GATEWAY_FORMAT: u32 = 6;
/// The first durable format that meters an attempt's carbon over the intensities its site advertised while it
/// ran (each site's log of them in state and snapshots), not at the one in force when it ended.
pub const INTEGRATED_FORMAT: u32 = 8;

use crate::durable::{Batch, FORMAT_VERSION};
use crate::journal::{Journal, Record};
use crate::latency::RttTable;
use crate::model::Job;
use crate::placement;
use crate::quota::Tenancy;
use crate::regions::Regions;
use crate::snapshot::Snapshot;
use crate::throughput::Throughput;
use crate::Millis;
use meridian_federation::{JobId, JobPhase, SiteId};

pub use fairness::FAIR_SHARE_WINDOW_MS;
pub use history::{spec_digest, DAY_MS, IDEMPOTENCY_WINDOW_MS};
pub use reconcile::ASK_EVERY_MS;
pub use state::{ArchivedKey, RecentRun};

/// Timings of the core, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreConfig {
    /// A site whose last heartbeat is older than this is declared lost.
    pub site_lost_after_ms: u64,
    /// An offer not answered within this is treated as refused.
    pub offer_timeout_ms: u64,
    /// How long a site that refused an offer is skipped for that job.
    pub refusal_cooldown_ms: u64,
    /// Try every waiting job in every pass, instead of passing over a group whose first job is blocked: the
    /// reference the grouped passes are tested against.
    pub exhaustive_passes: bool,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            site_lost_after_ms: 10_000,
            offer_timeout_ms: 5_000,
            refusal_cooldown_ms: 10_000,
            exhaustive_passes: false,
        }
    }
}

/// The broker's state machine. Fields are private: state changes only through [`Reactor::step`] (and the replay
/// of journaled steps); the environment (round-trip table, regions, throughput table, a simulator's baseline) is
/// fixed when the reactor is built.
pub struct Reactor<J: Journal> {
    state: State,
    config: CoreConfig,
    rtt: RttTable,
    regions: Regions,
    throughput: Throughput,
    /// Rank every job by this baseline instead of its policy (the simulator's comparison runs).
    baseline: Option<placement::Baseline>,
    /// Queues, quotas and priority classes, as set by `SetTenancy`; without them nothing is limited by quota.
    tenancy: Option<Tenancy>,
    journal: J,
    outbox: Vec<Command>,
    /// Reservations released so far (not state: a scheduling pass reads it to notice capacity coming free).
    released: u64,
    /// What steps did, for the shell's metrics; `None` until [`Reactor::observe`] (replay records nothing).
    observations: Option<Vec<crate::observe::Observation>>,
    /// In a scheduling pass (the sites' facts do not change during one), and the federation's print as
    /// worked out in it (see [`aside`]).
    in_pass: bool,
    pass_print: Option<u64>,
    /// Liveness (not state): no up site was last heard from before this (0: unknown, scan). Every step lowers
    /// it to its own time, at which any site it hears from is seen, so until this plus the loss timeout no site
    /// can be lost and a tick need not look at every site (see `due_decisions`).
    heard_since: Millis,
}

impl<J: Journal> Reactor<J> {
    pub fn new(config: CoreConfig, rtt: RttTable, regions: Regions, journal: J) -> Self {
        Reactor {
            state: State {
                format: FORMAT_VERSION,
                ..State::default()
            },
            config,
            rtt,
            regions,
            throughput: Throughput::default(),
            baseline: None,
            tenancy: None,
            journal,
            outbox: Vec::new(),
            released: 0,
            observations: None,
            in_pass: false,
            pass_print: None,
            heard_since: 0,
        }
    }

    /// The relative-throughput table of accelerator models (set before any step).
    pub fn with_throughput(mut self, throughput: Throughput) -> Self {
        self.throughput = throughput;
        for site in self.state.sites.values() {
            self.state.index.update(site, &self.throughput);
        }
        self
    }

    /// Ranks every job by `baseline` instead of its policy (the simulator's comparison runs).
    pub fn with_baseline(mut self, baseline: Option<placement::Baseline>) -> Self {
        self.baseline = baseline;
        self
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    pub fn rtt(&self) -> &RttTable {
        &self.rtt
    }

    pub fn regions(&self) -> &Regions {
        &self.regions
    }

    pub fn throughput(&self) -> &Throughput {
        &self.throughput
    }

    /// The tenancy in force (queues, quotas, priority classes, budgets), if any.
    pub fn tenancy(&self) -> Option<&Tenancy> {
        self.tenancy.as_ref()
    }

    pub fn journal(&self) -> &J {
        &self.journal
    }

    pub fn journal_mut(&mut self) -> &mut J {
        &mut self.journal
    }

    /// Takes the messages produced by the steps so far.
    pub fn take_outbox(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.outbox)
    }

    /// From now on, records what steps do for [`Reactor::take_observations`] (the broker's metrics).
    pub fn observe(&mut self) {
        self.observations.get_or_insert_with(Vec::new);
    }

    /// Takes what the steps did since the last call (nothing unless [`Reactor::observe`] was called).
    pub fn take_observations(&mut self) -> Vec<crate::observe::Observation> {
        self.observations
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The gauges of the federation now: sites, devices, jobs, pending jobs by queue and reason.
    pub fn gauges(&self) -> crate::observe::Gauges {
        crate::observe::Gauges::read(
            self.state.sites.values(),
            self.state.active_jobs(),
            &self.state.revoked_sites,
        )
    }

    pub(crate) fn saw(&mut self, o: crate::observe::Observation) {
        if let Some(v) = &mut self.observations {
            v.push(o);
        }
    }

    /// Applies one event at time `now`.
    pub fn step(&mut self, now: Millis, event: Event) -> Result<Response, StepError> {
        self.check(now, &event)?;
        self.heard_since = self.heard_since.min(now);
        if self.state.format() >= JOURNALED_DECISIONS {
            // What liveness decides is journaled as decisions of their own, before the event.
            let decisions = match &event {
                Event::Tick => self.due_decisions(now),
                Event::Heartbeat(h) => match &h.inventory {
                    Some(inv) => self.inventory_decisions(now, &h.site, inv),
                    None => Vec::new(),
                },
                Event::Inventory { site, inventory } => {
                    self.inventory_decisions(now, site, inventory)
                }
                _ => Vec::new(),
            };
            for decision in decisions {
                self.record_and_apply(now, decision)?;
            }
        }
        self.record_and_apply(now, event)
    }

    fn record_and_apply(&mut self, now: Millis, event: Event) -> Result<Response, StepError> {
        if self.is_durable(now, &event) {
            self.journal.append(&Record {
                at_ms: now,
                event: event.clone(),
            })?;
        }
        Ok(self.apply(now, event))
    }

    /// Rebuilds state from the journal's batches, each applied in its own format.
    pub fn replay_batches<'b>(&mut self, batches: impl IntoIterator<Item = &'b Batch>) {
        for b in batches {
            self.state.format = b.format;
            self.replay(&b.records);
        }
    }

    /// Rebuilds state from journal records (the messages they would send are dropped).
    pub fn replay<'r>(&mut self, records: impl IntoIterator<Item = &'r Record>) {
        for r in records {
            self.apply(r.at_ms, r.event.clone());
        }
        self.outbox.clear();
    }

    /// Whether the event changes durable state. Heartbeats, adverts that repeat a known generation and ticks
    /// with nothing due only refresh liveness, which is rebuilt from the next heartbeats after a restart.
    fn is_durable(&self, now: Millis, event: &Event) -> bool {
        match event {
            Event::Heartbeat(_) | Event::Inventory { .. } => false,
            Event::AttemptLost {
                site, job, attempt, ..
            } => self.is_current(job, *attempt, site),
            Event::Advert(a) => !self
                .state
                .sites
                .get(&a.site.id)
                .is_some_and(|s| s.repeats(a)),
            Event::Tick => self.tick_due(now),
            Event::SiteLost { site } => self.state.sites.get(site).is_some_and(|s| s.up),
            Event::UpgradeFormat { to } => *to > self.state.format(),
            Event::OfferExpired { job, attempt } => self
                .state
                .jobs
                .get(job)
                .is_some_and(|j| j.phase == JobPhase::Offered && j.attempt == *attempt),
            Event::Submit(spec) => {
                !self
                    .state
                    .by_key
                    .contains_key(&(spec.tenant.clone(), spec.idempotency_key.clone()))
                    && self.archived_key(spec).is_none()
            }
            _ => true,
        }
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
                mark,
            } => {
                self.on_offer_answer(now, site, job, attempt, outcome, mark);
                Response::Done
            }
            Event::Inventory { .. } => Response::Done,
            Event::AttemptLost {
                site,
                job,
                attempt,
                runtime_ms,
            } => {
                self.on_attempt_lost(now, &site, &job, attempt, runtime_ms);
                Response::Job(job)
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
                if self.state.format() >= JOURNALED_DECISIONS {
                    self.on_timers(now);
                } else {
                    self.on_tick_format_1(now);
                }
                Response::Done
            }
            Event::SiteLost { site } => {
                if self.state.sites.get(&site).is_some_and(|s| s.up) {
                    self.on_site_lost(now, &site);
                }
                Response::Site(site)
            }
            Event::OfferExpired { job, attempt } => {
                self.on_offer_expired(now, &job, attempt);
                Response::Job(job)
            }
            Event::UpgradeFormat { to } => {
                let from = self.state.format();
                self.state.format = from.max(to);
                if from < INTEGRATED_FORMAT && to >= INTEGRATED_FORMAT {
                    // The logs start from what each site advertises at this moment.
                    let now_values: Vec<(SiteId, u32)> = self
                        .state
                        .sites
                        .iter()
                        .map(|(id, s)| (id.clone(), s.info.carbon.g_per_kwh))
                        .collect();
                    for (id, g) in now_values {
                        self.state.intensity.entry(id).or_default().set(now, g);
                    }
                }
                Response::Done
            }
            Event::Archived { jobs } => {
                self.on_archived(now, &jobs);
                Response::Done
            }
            Event::TokenCreated(t) => {
                self.state.tokens.insert(t.id.clone(), t);
                self.state.tokens_generation += 1;
                Response::Done
            }
            Event::TokenRevoked { id } => {
                if let Some(t) = self.state.tokens.get_mut(&id) {
                    t.revoked_ms.get_or_insert(now);
                }
                self.state.tokens_generation += 1;
                Response::Done
            }
            Event::SiteRevoked { site } => {
                self.state.revoked_sites.insert(site.clone());
                if self.state.sites.get(&site).is_some_and(|s| s.up) {
                    // Before the broker stops listening to it, the site is told to stop everything it was
                    // given: an honest agent obeys, so requeued work does not run twice. (A hostile one need
                    // not: the explanation says the attempt may still run there.)
                    let held: Vec<(JobId, u32)> = self
                        .state
                        .active_jobs()
                        .filter(|j| {
                            j.holds_devices()
                                && j.assignment.as_ref().is_some_and(|a| a.site == site)
                        })
                        .map(|j| (j.id.clone(), j.attempt))
                        .collect();
                    for (job, attempt) in held {
                        self.cancel_attempt(
                            site.clone(),
                            job,
                            attempt,
                            format!("site {site} was revoked: its work is requeued elsewhere"),
                        );
                    }
                    self.on_site_lost(now, &site);
                }
                Response::Site(site)
            }
            Event::SiteRestored { site } => {
                self.state.revoked_sites.remove(&site);
                Response::Site(site)
            }
            Event::Resume => {
                self.resume(now);
                self.offer_again(now);
                Response::Done
            }
            Event::SetTenancy { toml, from_file } => {
                if from_file {
                    self.state.tenancy_file_toml = Some(toml.clone());
                }
                // Checked before it was journaled; a record that no longer reads is kept out, said so.
                match crate::quota::Tenancy::from_toml(&toml) {
                    Ok(t) => {
                        self.tenancy = Some(t);
                        self.state.tenancy_toml = Some(toml);
                        // Queues and priorities decide how waiting jobs are filed.
                        self.refile_all();
                        self.state.dirty = true;
                        self.try_pending(now);
                    }
                    Err(e) => self.state.tenancy_toml_error = Some(e.to_string()),
                }
                Response::Done
            }
            Event::ServiceDeployed(spec) => {
                self.state
                    .services
                    .insert((spec.tenant.clone(), spec.name.clone()), spec);
                Response::Done
            }
            Event::ServiceDeleted { tenant, service } => {
                self.state
                    .services
                    .remove(&(tenant.clone(), service.clone()));
                let chosen = self.scale_in_order(&tenant, &service);
                for id in &chosen {
                    if let Some(job) = self.state.jobs.get_mut(id) {
                        job.note(now, format!("stopped: service {service} was deleted"));
                    }
                    self.on_cancel(now, id);
                }
                Response::Stopping(chosen)
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

    /// Refiles a site in the index after a change to it.
    fn reindex(&mut self, id: &SiteId) {
        if let Some(s) = self.state.sites.get(id) {
            self.state.index.update(s, &self.throughput);
        }
    }

    /// Replaces the state with a snapshot's; derived parts are rebuilt.
    pub fn restore(&mut self, snap: Snapshot) {
        let mut st = State {
            format: snap.format,
            next_job: snap.next_job,
            dirty: snap.dirty,
            tenancy_file_toml: snap.tenancy_file_toml,
            ..State::default()
        };
        if let Some(toml) = snap.tenancy_toml {
            match crate::quota::Tenancy::from_toml(&toml) {
                Ok(t) => {
                    self.tenancy = Some(t);
                    st.tenancy_toml = Some(toml);
                }
                Err(e) => st.tenancy_toml_error = Some(e.to_string()),
            }
        }
        for site in snap.sites {
            let site = site.with_facts_print();
            st.index.update(&site, &self.throughput);
            st.sites.insert(site.id().clone(), site);
        }
        // The snapshot lists jobs in id order (it is taken from the map), so every index below is built in bulk
        // from sorted input rather than by one insertion per job (at a million jobs, restore is about 2.4× faster).
        st.by_key.reserve(snap.jobs.len());
        let (mut active, mut offered, mut with_runs, mut finished) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let jobs: Vec<(JobId, Job)> = snap
            .jobs
            .into_iter()
            .map(|job| {
                st.by_key.insert(
                    (job.spec.tenant.clone(), job.spec.idempotency_key.clone()),
                    job.id.clone(),
                );
                if !job.phase.is_terminal() {
                    active.push(job.id.clone());
                }
                if job.phase == JobPhase::Offered {
                    offered.push(job.id.clone());
                }
                if !job.runs.is_empty() {
                    with_runs.push(job.id.clone());
                }
                if let (true, Some(f)) = (job.phase.is_terminal(), job.finished_ms) {
                    finished.push((f, job.id.clone()));
                }
                (job.id.clone(), job)
            })
            .collect();
        st.jobs = jobs.into_iter().collect();
        st.active = active.into_iter().collect();
        st.offered = offered.into_iter().collect();
        st.with_runs = with_runs.into_iter().collect();
        st.finished = finished.into_iter().collect();
        match snap.metered_by_day {
            Some(days) => {
                st.metered_by_day = days.into_iter().map(|(t, d, a)| ((t, d), a)).collect();
            }
            None => {
                for job in st.jobs.values() {
                    for run in job.runs.iter().filter(|r| r.metered) {
                        let day = run.offered_ms - run.offered_ms % DAY_MS;
                        let sum = st
                            .metered_by_day
                            .entry((job.spec.tenant.clone(), day))
                            .or_default();
                        *sum = crate::metering::add(*sum, run.amounts);
                    }
                }
            }
        }
        st.archived_keys = snap
            .archived_keys
            .into_iter()
            .map(|k| ((k.tenant.clone(), k.key.clone()), k))
            .collect();
        st.recent_runs = snap.recent_runs;
        st.tokens = snap.tokens.into_iter().map(|t| (t.id.clone(), t)).collect();
        st.tokens_generation = 1;
        st.revoked_sites = snap.revoked_sites.into_iter().collect();
        st.premiums = snap
            .premiums
            .into_iter()
            .map(|(t, p, s)| ((t, p), s))
            .collect();
        st.services = snap
            .services
            .into_iter()
            .map(|s| ((s.tenant.clone(), s.name.clone()), s))
            .collect();
        st.intensity = snap.intensity.into_iter().collect();
        self.state = st;
        self.refile_all();
    }
}
