//! Invariants of broker state, checked by tests after every step.

use super::Reactor;
use crate::journal::Journal;
use meridian_federation::{JobId, JobPhase, SiteId};
use std::collections::{BTreeMap, BTreeSet};

/// A broken invariant of broker state, in words. Never the fault of an input: a bug in the reactor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

impl<J: Journal> Reactor<J> {
    /// Checks the invariants of broker state; returns the first one broken. Tests call it after every step.
    pub fn sanity_check(&self) -> Result<(), Violation> {
        self.check_state().map_err(Violation)
    }

    fn check_state(&self) -> Result<(), String> {
        let mut reserved: BTreeMap<(SiteId, meridian_federation::PoolName, u32), u32> =
            BTreeMap::new();
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
            if (job.phase == JobPhase::Pending) != self.state.waiting.contains(&job.id) {
                return Err(format!(
                    "{} is {:?} but the waiting index says otherwise",
                    job.id, job.phase
                ));
            }
            if job.phase == JobPhase::Pending {
                let timer = job
                    .refused_until
                    .iter()
                    .map(|(_, u)| *u)
                    .chain(job.retry_at_ms)
                    .min();
                if self.state.waiting.timer_of(&job.id) != timer {
                    return Err(format!("{}'s timer is not filed as {timer:?}", job.id));
                }
            }
            if job.phase == JobPhase::Offered && !self.state.offered.contains(&job.id) {
                return Err(format!("{} is offered but not in the offered set", job.id));
            }
            if job.runs.is_empty() == self.state.with_runs.contains(&job.id) {
                return Err(format!("{}: the set of jobs with runs is wrong", job.id));
            }
            if let (true, Some(f)) = (job.phase.is_terminal(), job.finished_ms) {
                if !self.state.finished.contains(&(f, job.id.clone())) {
                    return Err(format!("{} is finished but not filed as such", job.id));
                }
            }
            if self
                .state
                .by_key
                .get(&(job.spec.tenant.clone(), job.spec.idempotency_key.clone()))
                != Some(&job.id)
            {
                return Err(format!("{}'s idempotency key does not lead to it", job.id));
            }
            if !job.phase.is_terminal() && !self.state.active.contains(&job.id) {
                return Err(format!(
                    "{} is unfinished but not in the active set",
                    job.id
                ));
            }
            let runs = job.runs.iter().fold(
                (
                    crate::metering::add(Default::default(), Default::default()),
                    0u64,
                ),
                |(a, t), r| (crate::metering::add(a, r.amounts), t + r.runtime_ms),
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
        let mut fresh = crate::index::SiteIndex::default();
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
        Ok(())
    }

    /// Every quota limit in force with what is held against it: queues (quota plus borrowing limit), cohorts
    /// (the sum of their quotas) and per-site caps. Usage may stand above a limit after an administrator
    /// lowered it (running work is not evicted for that); admission never takes it higher, which
    /// [`Reactor::check_quota_step`] checks across a step.
    pub fn quota_limits(&self) -> Vec<QuotaLimit> {
        let Some(t) = &self.tenancy else {
            return Vec::new();
        };
        let holdings = self.holdings(t);
        let used = crate::quota::usage(&holdings);
        let holders = |f: &dyn Fn(&crate::quota::Holding) -> bool| -> Vec<JobId> {
            holdings
                .iter()
                .filter(|h| f(h))
                .map(|h| h.job.clone())
                .collect()
        };
        let mut out = Vec::new();
        let mut cohorts: BTreeMap<(String, crate::quota::Class), (u64, u64)> = BTreeMap::new();
        for q in t.queues.values() {
            for (class, nominal) in &q.nominal {
                let u = used
                    .get(&(q.name.clone(), class.clone()))
                    .copied()
                    .unwrap_or(0);
                if let Some(limit) = q.borrowing_limit.get(class) {
                    out.push(QuotaLimit {
                        what: format!("queue {} (quota plus borrowing limit) of {class}", q.name),
                        used: u,
                        limit: nominal + limit,
                        jobs: holders(&|h| h.queue == q.name && h.usage.contains_key(class)),
                    });
                }
                let key = (
                    q.cohort.clone().unwrap_or_else(|| q.name.to_string()),
                    class.clone(),
                );
                let e = cohorts.entry(key).or_default();
                e.0 += u;
                e.1 += nominal;
            }
            for (site, caps) in &q.site_caps {
                for (class, cap) in caps {
                    let u: u64 = holdings
                        .iter()
                        .filter(|h| h.queue == q.name && &h.site == site)
                        .filter_map(|h| h.usage.get(class))
                        .sum();
                    out.push(QuotaLimit {
                        what: format!("queue {} at {site} (its cap) of {class}", q.name),
                        used: u,
                        limit: *cap,
                        jobs: holders(&|h| {
                            h.queue == q.name && &h.site == site && h.usage.contains_key(class)
                        }),
                    });
                }
            }
        }
        for ((cohort, class), (u, n)) in cohorts {
            let members: Vec<&str> = t
                .queues
                .values()
                .filter(|q| q.cohort.as_deref().unwrap_or(q.name.as_str()) == cohort)
                .map(|q| q.name.as_str())
                .collect();
            out.push(QuotaLimit {
                what: format!("cohort {cohort} (the sum of its quotas) of {class}"),
                used: u,
                limit: n,
                jobs: holders(&|h| {
                    members.contains(&h.queue.as_str()) && h.usage.contains_key(&class)
                }),
            });
        }
        out
    }

    /// Checks a step against quota: no job that did not hold devices before the step (`before`, from
    /// [`Self::holders`]) holds them under a limit that stands exceeded after it. Tests call it around every step.
    pub fn check_quota_step(&self, before: &BTreeSet<JobId>) -> Result<(), Violation> {
        for l in self.quota_limits() {
            if l.used > l.limit {
                if let Some(new) = l.jobs.iter().find(|j| !before.contains(*j)) {
                    return Err(Violation(format!(
                        "{new} was admitted into {}, which holds {} milli, over its limit {}",
                        l.what, l.used, l.limit
                    )));
                }
            }
        }
        Ok(())
    }

    /// The jobs holding devices now.
    pub fn holders(&self) -> BTreeSet<JobId> {
        self.state
            .active_jobs()
            .filter(|j| j.holds_devices())
            .map(|j| j.id.clone())
            .collect()
    }
}

/// One quota limit and what is held against it, in milli-devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaLimit {
    pub what: String,
    pub used: u64,
    pub limit: u64,
    /// The jobs holding devices under it.
    pub jobs: Vec<JobId>,
}
