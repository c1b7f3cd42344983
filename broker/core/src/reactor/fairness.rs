//! The fair order of waiting jobs: with a tenancy, dominant-resource fairness between queues over recent
//! accelerator time, then priority; without one, oldest first.

use super::waiting::Group;
use super::Reactor;
use crate::journal::Journal;
use crate::Millis;
use meridian_federation::{QueueName, TenantId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

/// Accelerator time older than this does not count towards a queue's fair share.
pub const FAIR_SHARE_WINDOW_MS: u64 = 24 * 3_600_000;

impl<J: Journal> Reactor<J> {
    /// How waiting jobs are ordered: with a tenancy, for dominant-resource fairness between queues — the queue
    /// with the smallest dominant share of recent accelerator time first, then higher priority — and the oldest
    /// job first within that; without one, oldest first. A queue's share of a kind (GPU, NPU, …) is its
    /// accelerator time over the last [`FAIR_SHARE_WINDOW_MS`] — running attempts included — over the
    /// federation's capacity of that kind for as long; both are in reference device-time, each model weighted by
    /// the relative-throughput table, so an hour of H100 counts for more than an hour of L4. The dominant share
    /// is the largest over the kinds.
    pub(super) fn order(&self, now: Millis) -> Order {
        use meridian_federation::AcceleratorKind;
        let Some(t) = &self.tenancy else {
            return Order::default();
        };
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
        let mut used: BTreeMap<(QueueName, AcceleratorKind), f64> = BTreeMap::new();
        let mut queues: HashMap<(&TenantId, Option<&QueueName>), Option<&crate::quota::Queue>> =
            HashMap::new();
        for job in self
            .state
            .with_runs
            .iter()
            .filter_map(|id| self.state.jobs.get(id))
        {
            // Only jobs that ran in the window count.
            if job.runs.is_empty() || job.finished_ms.is_some_and(|f| f < from) {
                continue;
            }
            let q = *queues
                .entry((&job.spec.tenant, job.spec.queue.as_ref()))
                .or_insert_with(|| t.queue_of(&job.spec.tenant, job.spec.queue.as_ref()).ok());
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
        // Attempts of archived jobs (their queue as it was when they were archived).
        for r in &self.state.recent_runs {
            let Some(q) = &r.queue else {
                continue;
            };
            let overlap = r.end_ms.min(now).saturating_sub(r.start_ms.max(from));
            *used.entry((q.clone(), r.kind)).or_default() +=
                r.milli as f64 * overlap as f64 * self.throughput.factor(&r.model);
        }
        let mut dominant: HashMap<QueueName, f64> = HashMap::new();
        for ((q, kind), u) in &used {
            let share = u / capacity.get(kind).copied().unwrap_or(f64::INFINITY);
            let d = dominant.entry(q.clone()).or_insert(0.0);
            *d = d.max(share);
        }
        Order {
            tenancy: true,
            dominant,
        }
    }
}

/// The fair order of waiting jobs (see [`Reactor::order`]): a key per group, then the job id.
#[derive(Clone, Debug, Default)]
pub(super) struct Order {
    tenancy: bool,
    dominant: HashMap<QueueName, f64>,
}

impl Order {
    pub(super) fn key(&self, g: &Group) -> OrderKey {
        if !self.tenancy {
            return OrderKey::default();
        }
        match &g.queue {
            // Jobs whose queue no longer exists (an administrator removed it) go last.
            None => OrderKey::missing(),
            Some(q) => OrderKey {
                missing: false,
                share: self.dominant.get(q).copied().unwrap_or(0.0),
                priority: Reverse(g.key.priority),
            },
        }
    }
}

/// Orders by queue missing, dominant share, then higher priority first: a total order (shares compared with
/// `total_cmp`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OrderKey {
    missing: bool,
    share: f64,
    priority: Reverse<i32>,
}

impl OrderKey {
    pub(super) fn missing() -> Self {
        OrderKey {
            missing: true,
            share: 0.0,
            priority: Reverse(0),
        }
    }
}

impl PartialEq for OrderKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for OrderKey {}

impl PartialOrd for OrderKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.missing
            .cmp(&other.missing)
            .then(self.share.total_cmp(&other.share))
            .then(self.priority.cmp(&other.priority))
    }
}
