//! Invariants of broker state, checked by tests after every step.

use super::Reactor;
use crate::journal::Journal;
use meridian_federation::{JobPhase, SiteId};
use std::collections::BTreeMap;

impl<J: Journal> Reactor<J> {
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
        if let Some(t) = &self.tenancy {
            self.check_quota(t)?;
        }
        Ok(())
    }

    /// No queue beyond its quota plus its borrowing limit; no cohort beyond the sum of its quotas.
    pub(super) fn check_quota(&self, t: &crate::quota::Tenancy) -> Result<(), String> {
        let used = crate::quota::usage(&self.holdings(t));
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
