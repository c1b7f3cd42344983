//! Scheduling: which waiting jobs are tried, in what order, and placing one of them.

use super::{Command, Reactor};
use crate::journal::Journal;
use crate::model::Assignment;
use crate::placement::{self, Outcome, Request, View};
use crate::Millis;
use meridian_federation::{JobId, JobPhase, JobSpec, Offer, SiteId, TenantId, WIRE_VERSION};
use std::collections::{BTreeMap, HashMap};

/// Accelerator time older than this does not count towards a queue's fair share.
pub const FAIR_SHARE_WINDOW_MS: u64 = 24 * 3_600_000;

impl<J: Journal> Reactor<J> {
    /// Tries every pending job, oldest first.
    pub(super) fn try_pending(&mut self, now: Millis) {
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
        if due.is_empty() {
            // Nothing waits: whether capacity changed stays as it was (so a tick that is not journaled changes
            // nothing that replay would not).
            return;
        }
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
    pub(super) fn fair_order(&self, t: &crate::quota::Tenancy, now: Millis, due: &mut [JobId]) {
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
        let mut queues: HashMap<(&TenantId, Option<&str>), Option<&crate::quota::Queue>> =
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
        // A total order: jobs whose queue no longer exists (an administrator removed it) go last, by id.
        type Key = (bool, f64, std::cmp::Reverse<i32>);
        let key = |id: &JobId| -> Key {
            let Some(job) = self.state.jobs.get(id) else {
                return (true, 0.0, std::cmp::Reverse(0));
            };
            let Ok(q) = t.queue_of(&job.spec.tenant, job.spec.queue.as_deref()) else {
                return (true, 0.0, std::cmp::Reverse(0));
            };
            let p = t
                .priority_of(job.spec.priority.as_deref())
                .unwrap_or(t.default_priority);
            (false, dominant(&q.name), std::cmp::Reverse(p))
        };
        let mut keyed: Vec<(Key, JobId)> = due.iter().map(|id| (key(id), id.clone())).collect();
        keyed.sort_by(|(ka, a), (kb, b)| {
            ka.0.cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then(ka.2.cmp(&kb.2))
                .then_with(|| a.cmp(b))
        });
        for (slot, (_, id)) in due.iter_mut().zip(keyed) {
            *slot = id;
        }
    }

    /// Places one pending job: reserves devices and sends an offer, or records why it waits.
    pub(super) fn try_place(&mut self, now: Millis, id: &JobId) {
        self.try_place_with(now, id, &mut None);
    }

    /// [`Self::try_place`] with the pass's quota view (computed when first needed, dropped after a change).
    pub(super) fn try_place_with(
        &mut self,
        now: Millis,
        id: &JobId,
        quota: &mut Option<crate::quota::QuotaView>,
    ) {
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        if job.phase != JobPhase::Pending {
            return;
        }
        job.refused_until.retain(|(_, u)| *u > now);
        if !self.admit_before_placement(now, id, quota) {
            return;
        }
        let Some(decision) = self.decide(now, id, quota) else {
            return;
        };
        match &decision.outcome {
            Outcome::Wait(wait) => {
                let wait = wait.clone();
                self.record_wait(now, id, &wait, decision);
            }
            Outcome::Place(choice) => {
                let choice = choice.clone();
                self.offer(now, id, &choice, decision);
            }
        }
    }

    /// Quota first, on the classes the job counts against whatever pool it gets: a job its queue cannot take
    /// waits for quota, not for capacity; a lender taking its quota back frees the borrowed devices before
    /// placement looks for some. Whether the job may go on to placement.
    fn admit_before_placement(
        &mut self,
        now: Millis,
        id: &JobId,
        quota: &mut Option<crate::quota::QuotaView>,
    ) -> bool {
        let demand = match (&self.tenancy, self.state.jobs.get(id)) {
            (Some(_), Some(job)) => Self::spec_demand(&job.spec),
            _ => BTreeMap::new(),
        };
        match self.admit_demand(id, &demand, quota) {
            crate::quota::Admission::Admit => true,
            crate::quota::Admission::Wait(why) => {
                if let Some(job) = self.state.jobs.get_mut(id) {
                    if job.why != why {
                        job.note(now, why.clone());
                    }
                    job.why = why;
                    job.retry_at_ms = None;
                }
                false
            }
            crate::quota::Admission::Preempt { victims, reason } => {
                for v in &victims {
                    self.preempt(now, v, id, &reason);
                }
                *quota = None;
                true
            }
        }
    }

    /// Placement, then the budget and the quota of the chosen placement (which may turn it into a wait, or
    /// preempt borrowed or lower-priority work).
    fn decide(
        &mut self,
        now: Millis,
        id: &JobId,
        quota: &mut Option<crate::quota::QuotaView>,
    ) -> Option<placement::Decision> {
        let capped = self.capped_pools(self.state.jobs.get(id)?, quota);
        let job = self.state.jobs.get(id)?;
        let refused: Vec<SiteId> = job.refused_sites(now).cloned().collect();
        let request = Request {
            spec: &job.spec,
            waited_ms: now.saturating_sub(job.waiting_since_ms),
            refused: &refused,
            capped: &capped,
            baseline: self.baseline,
        };
        let mut decision = placement::place(self.view(), request, now);
        // Budget: expected spend at the chosen placement.
        if let (Outcome::Place(choice), Some(t)) = (&decision.outcome, &self.tenancy) {
            if let Some(b) = t.budgets.get(&job.spec.tenant) {
                if let Some(why) = self.over_budget(b, &job.spec, Some(choice), now) {
                    let until_ms = crate::budget::period(now, b.period).1;
                    decision.outcome = Outcome::Wait(placement::Wait::Budget { why, until_ms });
                }
            }
        }
        // Quota: a job that could run now may still have to wait for its queue's quota, or take it back.
        if let Outcome::Place(choice) = &decision.outcome {
            match self.admission(id, choice, quota) {
                crate::quota::Admission::Admit => {}
                crate::quota::Admission::Wait(why) => {
                    decision.outcome = Outcome::Wait(placement::Wait::Quota(why));
                }
                crate::quota::Admission::Preempt { victims, reason } => {
                    for v in &victims {
                        self.preempt(now, v, id, &reason);
                    }
                }
            }
            // The job is placed now (or preempted others): what quota saw has changed.
            *quota = None;
        }
        Some(decision)
    }

    /// What placement reads of the state.
    pub(super) fn view(&self) -> View<'_> {
        View {
            sites: &self.state.sites,
            rtt: &self.rtt,
            regions: &self.regions,
            throughput: &self.throughput,
            index: Some(&self.state.index),
        }
    }

    /// The job waits: why, and when to try it again even if nothing changes.
    fn record_wait(
        &mut self,
        now: Millis,
        id: &JobId,
        wait: &placement::Wait,
        decision: placement::Decision,
    ) {
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        let next_refusal = job.refused_until.iter().map(|(_, u)| *u).min();
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

    /// The job is placed: a new attempt, its devices reserved and an offer sent to the site.
    fn offer(
        &mut self,
        now: Millis,
        id: &JobId,
        choice: &placement::Choice,
        decision: placement::Decision,
    ) {
        let model = self
            .state
            .sites
            .get(&choice.site)
            .and_then(|s| s.pool(&choice.pool))
            .map(|p| p.model.clone())
            .unwrap_or_default();
        let able = decision
            .candidates
            .iter()
            .filter(|c| {
                c.tier == choice.tier
                    && c.terms.is_some()
                    && !matches!(c.reject, Some(placement::Reject::Busy { .. }))
            })
            .count();
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
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
        job.runs.push(crate::model::Run {
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
            "placed on {} ({}) by policy {}: best score among {able} candidates that can run it now",
            choice.site,
            choice.tier.as_str(),
            decision.policy,
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
        job.decision = Some(decision);
        if let Some(s) = self.state.sites.get_mut(&choice.site) {
            s.apply_reservation(&choice.pool, &choice.devices, true);
        }
        self.reindex(&choice.site);
        self.outbox.push(Command::Offer(offer));
    }

    /// Why a job of `spec` would take its tenant over budget `b` (`None` if it fits): its expected spend is the
    /// estimate at `choice`, or at the placement the broker would choose now.
    pub(super) fn over_budget(
        &self,
        b: &crate::budget::Budget,
        spec: &JobSpec,
        choice: Option<&placement::Choice>,
        now: Millis,
    ) -> Option<String> {
        let terms = match choice {
            Some(c) => Some(c.terms.clone()),
            None => {
                let request = Request {
                    spec,
                    waited_ms: u64::MAX,
                    refused: &[],
                    capped: &[],
                    baseline: self.baseline,
                };
                match placement::place(self.view(), request, now).outcome {
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
        let (from, to) = crate::budget::period(now, b.period);
        let used = crate::budget::used(self.state.jobs.values(), &b.tenant, from, to);
        crate::budget::over(b, &used, &expected)
    }
}
