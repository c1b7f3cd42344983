//! What the broker's shell measures of the reactor (pure): observations of what steps did — placements, offers
//! that failed, preemptions, metered attempts — and gauges read off the state on demand.
//!
//! Soft state: nothing here is journaled or replayed. A reactor records observations only once asked to
//! ([`crate::reactor::Reactor::observe`]: the broker does after recovery), so replay and the simulator keep none.
//! Every label is bounded: policy names, tiers, reasons from fixed sets, queues, tenants, sites and models —
//! never a job id.

use crate::model::{Job, Site};
use meridian_federation::{Amounts, JobId, JobPhase, ModelName, SiteId, SiteState, TenantId, Tier};
use std::collections::BTreeMap;

/// Something a step did that the shell counts (metrics) and tells (traces). Times are the step's `now`.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// An offer was made: the policy's name (`balanced`, `carbon-price`, …), the site and its tier, since when
    /// the job had waited for this attempt, and the chosen candidate's terms.
    Placed {
        job: JobId,
        attempt: u32,
        tenant: TenantId,
        site: SiteId,
        policy: String,
        tier: Tier,
        waiting_since_ms: u64,
        at_ms: u64,
        terms: Terms,
    },
    /// The answer to an offer: accepted, refused, or none in time.
    Answered {
        job: JobId,
        attempt: u32,
        site: SiteId,
        answer: Answer,
        at_ms: u64,
    },
    /// A running attempt was stopped to give its devices to another job.
    Preempted {
        job: JobId,
        attempt: u32,
        reason: PreemptReason,
        at_ms: u64,
    },
    /// An attempt's end was metered.
    Metered {
        job: JobId,
        attempt: u32,
        tenant: TenantId,
        site: SiteId,
        tier: Tier,
        amounts: Amounts,
        /// Devices held × run time, in device-milliseconds.
        device_ms: u64,
        offered_ms: u64,
        started_ms: Option<u64>,
        /// When it ended (its start plus its run time).
        ended_ms: u64,
    },
    /// A job reached its end: succeeded, failed or cancelled.
    Finished {
        job: JobId,
        tenant: TenantId,
        outcome: JobPhase,
        at_ms: u64,
    },
}

/// The terms of a chosen candidate, as a trace tells them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Terms {
    pub cost_micro_usd: u64,
    pub co2_g: u64,
    pub latency_ms: f64,
    pub score: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Answer {
    Accepted,
    /// The agent answered with a refusal.
    Refused,
    /// The agent did not answer in time.
    TimedOut,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Accepted => "accepted",
            Answer::Refused => "refused",
            Answer::TimedOut => "timed_out",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PreemptReason {
    /// A queue took back quota it had lent to its cohort.
    QuotaReclaim,
    /// A higher-priority job of the same queue needed the quota.
    Priority,
}

impl PreemptReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptReason::QuotaReclaim => "quota_reclaim",
            PreemptReason::Priority => "priority",
        }
    }
}

/// Why a pending job waits, as a bounded label: why it waited at its last try, `requeued` for a job back in
/// the queue since, `not_tried` before its first try (or since a restart).
pub fn wait_reason(job: &Job) -> &'static str {
    if job.unsatisfiable {
        return "no_site_fits";
    }
    match (job.waited_on.0, job.attempt) {
        (Some(label), _) => label,
        (None, 0) => "not_tried",
        (None, _) => "requeued",
    }
}

/// The label of a wait.
pub fn wait_label(w: &crate::placement::Wait) -> &'static str {
    use crate::placement::Wait;
    match w {
        Wait::NoSiteFits { .. } => "no_site_fits",
        Wait::Busy { .. } => "capacity",
        Wait::NotBefore { .. } => "start_window",
        Wait::Deferred { .. } => "carbon_deferral",
        Wait::Quota(_) => "quota",
        Wait::Budget { .. } => "budget",
    }
}

/// Gauges of the federation as the broker sees it now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gauges {
    /// Pending jobs by (queue, reason). A job that names no queue is counted under its tenant's name, the queue
    /// it is filed in.
    pub pending: BTreeMap<(String, &'static str), u64>,
    /// Jobs by phase (pending, offered, running).
    pub jobs: BTreeMap<&'static str, u64>,
    /// Each site's state: `up`, `draining`, `lost`, `revoked`.
    pub site_states: BTreeMap<SiteId, &'static str>,
    /// Devices by (site, model, state): `used` and `free` (in devices; shares count as fractions of one),
    /// `unhealthy`.
    pub devices: BTreeMap<(SiteId, ModelName, &'static str), f64>,
}

impl Gauges {
    /// Reads the gauges off the sites and the live jobs.
    pub fn read<'a>(
        sites: impl IntoIterator<Item = &'a Site>,
        jobs: impl IntoIterator<Item = &'a Job>,
        revoked: &std::collections::BTreeSet<SiteId>,
    ) -> Gauges {
        let mut g = Gauges::default();
        for site in sites {
            g.site_states
                .insert(site.id().clone(), site_state(site, revoked).as_str());
            for pool in &site.pools {
                let mut add = |state: &'static str, devices: f64| {
                    *g.devices
                        .entry((site.id().clone(), pool.model.clone(), state))
                        .or_default() += devices;
                };
                let healthy = pool.healthy_devices();
                let free = pool.free_milli() as f64 / 1000.0;
                add("free", free);
                add("used", (healthy as f64 - free).max(0.0));
                add("unhealthy", (pool.devices.len() - healthy) as f64);
            }
        }
        for job in jobs {
            let phase = match job.phase {
                JobPhase::Pending => "pending",
                JobPhase::Offered => "offered",
                JobPhase::Running => "running",
                _ => continue,
            };
            *g.jobs.entry(phase).or_default() += 1;
            if job.phase == JobPhase::Pending {
                let queue = job
                    .spec
                    .queue
                    .as_ref()
                    .map_or_else(|| job.spec.tenant.to_string(), |q| q.to_string());
                *g.pending.entry((queue, wait_reason(job))).or_default() += 1;
            }
        }
        g
    }
}

/// The state a site is in: revoked, else lost (not up), else draining (by its agent or an operator), else up.
pub fn site_state(site: &Site, revoked: &std::collections::BTreeSet<SiteId>) -> SiteState {
    if revoked.contains(site.id()) {
        SiteState::Revoked
    } else if !site.up {
        SiteState::Lost
    } else if site.advert_draining || site.api_draining {
        SiteState::Draining
    } else {
        SiteState::Up
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{job, site};

    #[test]
    fn gauges_count_sites_devices_and_pending_jobs_by_reason() {
        let a = site("a", Tier::Owned, 45.0, -120.0)
            .gpus("H100", 4, 2.0)
            .build();
        let mut site = crate::model::Site::from_advert(&a, 0);
        site.pools[0].devices[0].reserved_milli = 500;
        site.pools[0].devices[1].healthy = false;
        let mut lost = site.clone();
        lost.info.id = SiteId::new("b").unwrap();
        lost.up = false;
        let spec = job("k", 1);
        let mut waiting = Job::new(JobId::numbered(1), spec.clone(), 0);
        waiting.unsatisfiable = true;
        let fresh = Job::new(JobId::numbered(2), spec, 0);
        let g = Gauges::read([&site, &lost], [&waiting, &fresh], &Default::default());
        assert_eq!(g.site_states.get(&SiteId::new("a").unwrap()), Some(&"up"));
        assert_eq!(g.site_states.get(&SiteId::new("b").unwrap()), Some(&"lost"));
        let dev = |s: &str| {
            g.devices
                .get(&(SiteId::new("a").unwrap(), ModelName::from("H100"), s))
                .copied()
        };
        assert_eq!(dev("free"), Some(2.5));
        assert_eq!(dev("used"), Some(0.5));
        assert_eq!(dev("unhealthy"), Some(1.0));
        assert_eq!(
            g.pending.get(&("team-a".to_owned(), "no_site_fits")),
            Some(&1)
        );
        assert_eq!(g.pending.get(&("team-a".to_owned(), "not_tried")), Some(&1));
        assert_eq!(g.jobs.get("pending"), Some(&2));
    }
}
