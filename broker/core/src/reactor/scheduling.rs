//! Scheduling: which waiting jobs are tried, in what order, and placing one of them.

use super::fairness::OrderKey;
use super::waiting::{tenant_owner, GroupKey};
use super::{Command, Reactor};
use crate::journal::Journal;
use crate::model::{Assignment, Job};
use crate::placement::{self, Outcome, Request, View};
use crate::Millis;
use meridian_federation::{JobId, JobPhase, JobSpec, Offer, SiteId, WIRE_VERSION};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

impl<J: Journal> Reactor<J> {
    /// A scheduling pass. When capacity changed (`dirty`), every waiting job may be tried, in fair order: group
    /// by group (see [`super::waiting`]), a group whose first job is blocked is passed over; groups passed over
    /// are looked at again if the pass frees capacity (a preemption) or, for those held by quota, places a job.
    /// Otherwise only the jobs whose timers are due are tried.
    pub(super) fn try_pending(&mut self, now: Millis) {
        self.in_pass = true;
        self.pass_print = None;
        self.scheduling_pass(now);
        self.in_pass = false;
        self.pass_print = None;
    }

    fn scheduling_pass(&mut self, now: Millis) {
        let dirty = self.state.dirty;
        if self.state.waiting.is_empty() {
            // Nothing waits: whether capacity changed stays as it was (so a tick that is not journaled changes
            // nothing that replay would not).
            return;
        }
        let due = if dirty {
            Vec::new()
        } else {
            self.state.waiting.due(now)
        };
        if !dirty && due.is_empty() {
            return;
        }
        self.state.dirty = false;
        let order = self.order(now);
        let mut quota = None;
        if !dirty {
            let mut keyed: Vec<(OrderKey, JobId)> = due
                .into_iter()
                .map(|id| {
                    let k = self
                        .state
                        .waiting
                        .group_of(&id)
                        .and_then(|g| self.state.waiting.group(g))
                        .map_or(OrderKey::missing(), |g| order.key(g));
                    (k, id)
                })
                .collect();
            keyed.sort();
            for (_, id) in keyed {
                self.try_place_with(now, &id, &mut quota);
            }
            return;
        }
        let stamp = self.state.waiting.stamp();
        let mut heads: BinaryHeap<Reverse<(OrderKey, JobId, u32)>> = BinaryHeap::new();
        let groups: Vec<(u32, OrderKey)> = self
            .state
            .waiting
            .groups()
            .map(|(g, group)| (g, order.key(group)))
            .collect();
        for (g, key) in groups {
            if let Some(head) = self.state.waiting.next_in(g, None, stamp) {
                heads.push(Reverse((key, head, g)));
            }
        }
        // Groups passed over: (group, order key, the job tried last, blocked by quota rather than capacity).
        let mut held: Vec<(u32, OrderKey, JobId, bool)> = Vec::new();
        while let Some(Reverse((key, id, g))) = heads.pop() {
            let was_unsatisfiable = self.state.jobs.get(&id).is_some_and(|j| j.unsatisfiable);
            let tried = self.try_place_with(now, &id, &mut quota);
            // A job found to fit nowhere for the first time: the rest of its group is tried too (each is set
            // aside in turn, and its demand leaves the quota's waiting work, as a pass trying every job does).
            let newly_unsatisfiable =
                !was_unsatisfiable && self.state.jobs.get(&id).is_some_and(|j| j.unsatisfiable);
            // Capacity came free (or quota moved): groups passed over may have jobs that can go now. A pass that
            // tried every job would reach only those after this one in its order; so do we.
            let mut reopen = |only_quota: bool, heads: &mut BinaryHeap<_>| {
                held.retain(|(hg, hk, _, by_quota)| {
                    if only_quota && !by_quota {
                        return true;
                    }
                    if *hk == key {
                        if let Some(next) = self.state.waiting.next_in(*hg, Some(&id), stamp) {
                            heads.push(Reverse((*hk, next, *hg)));
                        }
                    }
                    false
                });
            };
            if tried.preempted {
                reopen(false, &mut heads);
            } else if tried.placed {
                reopen(true, &mut heads);
            }
            // The next job of the group is tried too when its mark (set aside as fitting nowhere, or not) is not
            // this one's now: a mark from before the federation or the tenancy changed is stale (a job still
            // filed as waiting whose demand holds back another queue's borrowing, or one still set aside that
            // files no demand), and a pass that tried every job would settle it. Each such try settles one mark.
            let stale_next = || {
                let mark = self.state.jobs.get(&id).map(|j| j.unsatisfiable);
                self.state
                    .waiting
                    .next_in(g, Some(&id), stamp)
                    .is_some_and(|n| self.state.jobs.get(&n).map(|j| j.unsatisfiable) != mark)
            };
            match tried
                .blocked
                .filter(|_| !self.config.exhaustive_passes && !newly_unsatisfiable && !stale_next())
            {
                Some(by_quota) => held.push((g, key, id, by_quota)),
                None => {
                    if let Some(next) = self.state.waiting.next_in(g, Some(&id), stamp) {
                        heads.push(Reverse((key, next, g)));
                    }
                }
            }
        }
    }

    /// Files a pending job in the waiting index (again, after anything that may change its group or timer).
    pub(super) fn file_waiting(&mut self, id: &JobId) {
        let Some(job) = self.state.jobs.get(id) else {
            return;
        };
        match Self::filing(self.tenancy.as_ref(), id, job) {
            Some(f) => self
                .state
                .waiting
                .file(id, f.key, f.queue, f.timer, f.demand),
            None => self.state.waiting.remove(id),
        }
    }

    /// Where a job is filed in the waiting index: its group, its queue, its next timer and its quota demand
    /// (`None` for a job that is not pending).
    fn filing(tenancy: Option<&crate::quota::Tenancy>, id: &JobId, job: &Job) -> Option<Filing> {
        if job.phase != JobPhase::Pending {
            return None;
        }
        let (owner, queue, priority, demand) = match tenancy {
            Some(t) => {
                let priority = t
                    .priority_of(job.spec.priority.as_deref())
                    .unwrap_or(t.default_priority);
                match t.queue_of(&job.spec.tenant, job.spec.queue.as_ref()) {
                    Ok(q) => {
                        // A job no pool can run cannot use quota: its demand keeps no lender's quota back.
                        let demand = match job.unsatisfiable {
                            true => Vec::new(),
                            false => Self::spec_demand(&job.spec)
                                .into_iter()
                                .map(|(c, m)| (q.name.clone(), c, m))
                                .collect(),
                        };
                        (q.name.to_string(), Some(q.name.clone()), priority, demand)
                    }
                    Err(_) => (tenant_owner(&job.spec.tenant), None, priority, Vec::new()),
                }
            }
            None => (tenant_owner(&job.spec.tenant), None, 0, Vec::new()),
        };
        let key = GroupKey {
            owner,
            priority,
            shape: shape(&job.spec),
            solo: (!job.refused_until.is_empty()).then(|| id.clone()),
        };
        let timer = job
            .refused_until
            .iter()
            .map(|(_, u)| *u)
            .chain(job.retry_at_ms)
            .min();
        Some(Filing {
            key,
            queue,
            timer,
            demand,
        })
    }

    /// Files every pending job again (the tenancy changed, or the state was restored).
    pub(super) fn refile_all(&mut self) {
        let state = &mut self.state;
        state.waiting = Default::default();
        state.waiting.reserve(state.active.len());
        for id in &state.active {
            let Some(job) = state.jobs.get(id) else {
                continue;
            };
            if let Some(f) = Self::filing(self.tenancy.as_ref(), id, job) {
                state.waiting.file(id, f.key, f.queue, f.timer, f.demand);
            }
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
    ) -> Tried {
        let Some(job) = self.state.jobs.get_mut(id) else {
            return Tried::default();
        };
        if job.phase != JobPhase::Pending {
            return Tried::default();
        }
        job.refused_until.retain(|(_, u)| *u > now);
        let unsatisfiable = job.unsatisfiable;
        let released = self.released;
        let mut tried = Tried::default();
        // A job no pool could run is asked first whether one can now (quota comes after: it is not waiting
        // for quota).
        let nowhere = match unsatisfiable && !self.still_aside(id) {
            true => self.nowhere(now, id, quota),
            false => None,
        };
        if unsatisfiable && self.state.aside.contains_key(id) {
            // No pool could run it, and the federation has not changed since: placement would say the same.
            tried.blocked = Some(false);
            let unchanged = self.state.jobs.get(id).is_some_and(|j| {
                j.refused_until.is_empty() && j.unsatisfiable && j.retry_at_ms.is_none()
            }) && self.released == released;
            if unchanged && self.aside_why_holds(id) {
                // Nothing to record and nothing to file again.
                return tried;
            }
            if let Some((_, wait, _)) = self.state.aside.get(id).cloned() {
                self.record_wait(now, id, &wait);
            }
        } else if let Some(wait) = nowhere {
            tried.blocked = Some(false);
            self.set_aside(now, id, &wait, quota);
            self.record_wait(now, id, &wait);
        } else if !self.admit_before_placement(now, id, quota) {
            tried.blocked = Some(true);
        } else if let Some(decision) = self.decide(now, id, quota) {
            match &decision.outcome {
                Outcome::Wait(wait) => {
                    let wait = wait.clone();
                    drop(decision);
                    if matches!(
                        wait,
                        placement::Wait::Busy { burst_in_ms: None }
                            | placement::Wait::NoSiteFits { .. }
                    ) {
                        tried.blocked = Some(false);
                    }
                    if matches!(wait, placement::Wait::NoSiteFits { .. }) {
                        self.set_aside(now, id, &wait, quota);
                    }
                    self.record_wait(now, id, &wait);
                }
                Outcome::Place(choice) => {
                    let choice = choice.clone();
                    self.count_premium(id, &decision);
                    self.offer(now, id, &choice, decision);
                    tried.placed = true;
                }
            }
        }
        tried.preempted = self.released != released;
        if tried.preempted {
            tried.blocked = None;
        }
        // Its group or timer may have changed (a refusal ran out; a new retry time).
        self.file_waiting(id);
        tried
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
                    job.waited_on = crate::model::WaitLabel(Some("quota"));
                }
                false
            }
            // Work is stopped only for a job that some pool can run: one that fits nowhere goes on to
            // placement, which sets it aside as unplaceable.
            crate::quota::Admission::Preempt { .. }
                if self.still_aside(id) || self.nowhere(now, id, quota).is_some() =>
            {
                true
            }
            crate::quota::Admission::Preempt {
                victims,
                reason,
                reclaim,
            } => {
                for v in &victims {
                    self.preempt(now, v, id, &reason, reclaim);
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
        let mut decision = self.placement_now(job, now, &capped);
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
                crate::quota::Admission::Preempt {
                    victims,
                    reason,
                    reclaim,
                } => {
                    for v in &victims {
                        self.preempt(now, v, id, &reason, reclaim);
                    }
                }
            }
            // The job is placed now (or preempted others): what quota saw has changed.
            *quota = None;
        }
        Some(decision)
    }

    /// Why the job waits if no pool of the federation can run it as it stands (model, kind, memory,
    /// residency, size), whatever frees up.
    fn nowhere(
        &mut self,
        now: Millis,
        id: &JobId,
        quota: &mut Option<crate::quota::QuotaView>,
    ) -> Option<placement::Wait> {
        let capped = self.capped_pools(self.state.jobs.get(id)?, quota);
        let job = self.state.jobs.get(id)?;
        match self.placement_now(job, now, &capped).outcome {
            Outcome::Wait(w @ placement::Wait::NoSiteFits { .. }) => Some(w),
            _ => None,
        }
    }

    /// A job's explanation. A waiting job's candidates are those placement would weigh now; a placed job's,
    /// those of the decision that placed it. With `all`, every site of the federation is weighed (the index
    /// leaves none out unscored), for a placed job as placement weighs it now.
    pub fn explain(
        &self,
        id: &JobId,
        now: Millis,
        all: bool,
    ) -> Option<meridian_federation::ExplainView> {
        let job = self.state.jobs.get(id)?;
        if job.phase != JobPhase::Pending && !all {
            return Some(crate::views::explain_view(job));
        }
        let capped = self.capped_pools(job, &mut None);
        let decision = self.placement_in(self.view_with(!all), job, now, &capped);
        let mut v = crate::views::explain_with(job, Some(&decision));
        v.every_site_now = job.phase != JobPhase::Pending;
        Some(v)
    }

    /// Placement's decision for a waiting job now: its own refusals and the pools its quota caps left out.
    fn placement_now(
        &self,
        job: &crate::model::Job,
        now: Millis,
        capped: &[(SiteId, meridian_federation::PoolName)],
    ) -> placement::Decision {
        self.placement_in(self.view(), job, now, capped)
    }

    /// [`Self::placement_now`] over a given view of the state.
    fn placement_in(
        &self,
        view: View<'_>,
        job: &crate::model::Job,
        now: Millis,
        capped: &[(SiteId, meridian_federation::PoolName)],
    ) -> placement::Decision {
        let refused: Vec<SiteId> = job.refused_sites(now).cloned().collect();
        let request = Request {
            spec: &job.spec,
            waited_ms: now.saturating_sub(job.waiting_since_ms),
            refused: &refused,
            capped,
            baseline: self.baseline,
            spent: self.spent(&job.spec),
            queue_policy: self.queue_policy(&job.spec),
        };
        placement::place(view, request, now)
    }

    /// What placement reads of the state.
    pub(super) fn view(&self) -> View<'_> {
        self.view_with(true)
    }

    /// [`Self::view`], with the site index or without it (every site scored: a plain scan).
    fn view_with(&self, indexed: bool) -> View<'_> {
        View {
            sites: &self.state.sites,
            rtt: &self.rtt,
            regions: &self.regions,
            throughput: &self.throughput,
            index: indexed.then_some(&self.state.index),
            format: self.state.format(),
        }
    }

    /// A job no pool can run, found so with nothing of its own in the way (no site it is kept off, no pool its
    /// quota caps): set aside until the federation changes (see [`super::aside`]).
    fn set_aside(
        &mut self,
        now: Millis,
        id: &JobId,
        wait: &placement::Wait,
        quota: &mut Option<crate::quota::QuotaView>,
    ) {
        let Some(job) = self.state.jobs.get(id) else {
            return;
        };
        if job.refused_sites(now).next().is_some() || !self.capped_pools(job, quota).is_empty() {
            return;
        }
        let print = self.federation_print();
        self.state
            .aside
            .insert(id.clone(), (print, wait.clone(), wait.to_string()));
    }

    /// Whether a job set aside still says why, as placement last told it.
    fn aside_why_holds(&self, id: &JobId) -> bool {
        match (self.state.jobs.get(id), self.state.aside.get(id)) {
            (Some(j), Some((_, _, why))) => j.why == *why,
            _ => false,
        }
    }

    /// Whether a job is set aside and the federation is as it was when it was set aside.
    fn still_aside(&mut self, id: &JobId) -> bool {
        let Some((print, _, _)) = self.state.aside.get(id) else {
            return false;
        };
        let print = *print;
        if print == self.federation_print() {
            return true;
        }
        self.state.aside.remove(id);
        false
    }

    /// The job waits: why, and when to try it again even if nothing changes.
    fn record_wait(&mut self, now: Millis, id: &JobId, wait: &placement::Wait) {
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
        job.unsatisfiable = matches!(wait, placement::Wait::NoSiteFits { .. });
        job.waited_on = crate::model::WaitLabel(Some(crate::observe::wait_label(wait)));
        // A waiting job keeps only why it waits: its candidates are worked out again when it is explained (see
        // `Reactor::explain`), so a deep queue costs little memory.
        job.decision = None;
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
        self.state.aside.remove(id);
        let Some(job) = self.state.jobs.get_mut(id) else {
            return;
        };
        job.attempt += 1;
        job.phase = JobPhase::Offered;
        job.waited_on = crate::model::WaitLabel::default();
        job.unsatisfiable = false;
        self.state.offered.insert(id.clone());
        self.state.waiting.remove(id);
        job.offered_ms = Some(now);
        job.retry_at_ms = None;
        job.assignment = Some(Assignment {
            site: choice.site.clone(),
            pool: choice.pool.clone(),
            tier: choice.tier,
            devices: choice.devices.clone(),
        });
        job.estimate = Some(Box::new(choice.terms.clone()));
        self.state.with_runs.insert(id.clone());
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
        let placed = crate::observe::Observation::Placed {
            job: id.clone(),
            attempt: job.attempt,
            tenant: job.spec.tenant.clone(),
            site: choice.site.clone(),
            policy: decision
                .policy
                .split('=')
                .next()
                .unwrap_or_default()
                .to_owned(),
            tier: choice.tier,
            waiting_since_ms: job.waiting_since_ms,
            at_ms: now,
            terms: crate::observe::Terms {
                cost_micro_usd: choice.terms.cost_micro_usd,
                co2_g: choice.terms.co2_g,
                latency_ms: choice.terms.latency_ms,
                score: choice.terms.score,
            },
        };
        job.decision = Some(Box::new(decision));
        if let Some(s) = self.state.sites.get_mut(&choice.site) {
            s.apply_reservation(&choice.pool, &choice.devices, true);
        }
        self.reindex(&choice.site);
        self.outbox.push(Command::Offer(offer));
        self.saw(placed);
    }
}

/// What a try of one waiting job came to.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tried {
    pub placed: bool,
    /// It preempted other work (capacity came free).
    pub preempted: bool,
    /// It is blocked in a way every job of its group is (`Some(true)`: by quota before placement;
    /// `Some(false)`: no site has room for its shape, or none fits it).
    pub blocked: Option<bool>,
}

/// A pending job's place in the waiting index (see [`Reactor::filing`]).
struct Filing {
    key: GroupKey,
    queue: Option<meridian_federation::QueueName>,
    timer: Option<Millis>,
    demand: Vec<(meridian_federation::QueueName, crate::quota::Class, u64)>,
}

/// What tells waiting jobs apart for placement and quota: their resources, replicas, constraints, whether they
/// run on spot capacity, required datasets, start window, (with a deadline) expected duration and the backend
/// it asks for, encoded.
fn shape(spec: &JobSpec) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Shape<'a> {
        kind: meridian_federation::JobKind,
        resources: &'a meridian_federation::Resources,
        replicas: u32,
        constraints: &'a meridian_federation::Constraints,
        spot: bool,
        must: Vec<&'a str>,
        window: &'a meridian_federation::Window,
        duration_s: Option<u64>,
        /// The backend it asks for (left out when none, so other jobs' shapes are as before).
        #[serde(skip_serializing_if = "Option::is_none")]
        adapter: Option<&'a str>,
    }
    let must = spec
        .datasets
        .iter()
        .filter(|d| d.locality == meridian_federation::Locality::Must)
        .map(|d| d.name.as_str())
        .collect();
    serde_json::to_vec(&Shape {
        kind: spec.kind,
        resources: &spec.resources,
        replicas: spec.replicas,
        constraints: &spec.constraints,
        spot: spec.spot,
        must,
        window: &spec.window,
        duration_s: spec.window.deadline_ms.and(spec.duration_s),
        adapter: spec.run.adapter.as_deref(),
    })
    .unwrap_or_default()
}
