//! Tenancy: quota admission, per-site caps and the holdings quota counts.

use super::Reactor;
use crate::journal::Journal;
use crate::placement::{self};
use meridian_federation::{JobId, JobSpec, SiteId};
use std::collections::BTreeMap;

impl<J: Journal> Reactor<J> {
    /// What quota says about placing job `id` as `choice` (admitted when there is no tenancy).
    pub(super) fn admission(
        &self,
        id: &JobId,
        choice: &placement::Choice,
        quota: &mut Option<crate::quota::QuotaView>,
    ) -> crate::quota::Admission {
        let demand = self.class_usage(&choice.site, &choice.pool, &choice.devices);
        self.admit_demand(id, &demand, quota)
    }

    /// What quota decisions look at now (see [`crate::quota::QuotaView`]).
    pub(super) fn quota_view(&self, t: &crate::quota::Tenancy) -> crate::quota::QuotaView {
        // Per queue, the smallest waiting demand of each class: all `admit` asks is whether some job of a queue
        // fits in what is left of its own quota.
        let waiting = self.state.waiting.smallest_demands();
        crate::quota::QuotaView::new(self.holdings(t), waiting)
    }

    /// What quota says about job `id` taking `demand` (admitted when there is no tenancy).
    pub(super) fn admit_demand(
        &self,
        id: &JobId,
        demand: &BTreeMap<crate::quota::Class, u64>,
        quota: &mut Option<crate::quota::QuotaView>,
    ) -> crate::quota::Admission {
        use crate::quota::{admit, Admission};
        let (Some(t), Some(job)) = (&self.tenancy, self.state.jobs.get(id)) else {
            return Admission::Admit;
        };
        let queue = match t.queue_of(&job.spec.tenant, job.spec.queue.as_ref()) {
            Ok(q) => q,
            // Its queue was removed after it was submitted: it waits for one rather than run outside quota.
            Err(why) => {
                return Admission::Wait(format!(
                    "waits for a queue: {why} (the tenancy changed after it was submitted)"
                ))
            }
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
    pub(super) fn spec_demand(spec: &JobSpec) -> BTreeMap<crate::quota::Class, u64> {
        let mut demand = BTreeMap::new();
        let milli = spec.resources.milli_per_replica() * u64::from(spec.replicas.max(1));
        let any = crate::quota::classes_of(spec.resources.kind, "*");
        demand.insert(any[1].clone(), milli);
        if let [model] = spec.resources.models.as_slice() {
            demand.insert(
                crate::quota::classes_of(spec.resources.kind, model.as_str())[0].clone(),
                milli,
            );
        }
        demand
    }

    /// Milli-devices per quota class of a share of a pool.
    pub(super) fn class_usage(
        &self,
        site: &SiteId,
        pool: &meridian_federation::PoolName,
        devices: &[meridian_federation::DeviceShare],
    ) -> BTreeMap<crate::quota::Class, u64> {
        let milli: u64 = devices.iter().map(|d| u64::from(d.milli)).sum();
        self.state
            .sites
            .get(site)
            .and_then(|s| s.pool(pool))
            .map(|p| {
                crate::quota::classes_of(p.kind, p.model.as_str())
                    .into_iter()
                    .map(|c| (c, milli))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pools where the job's queue has reached its per-site cap.
    pub(super) fn capped_pools(
        &self,
        job: &crate::model::Job,
        quota: &mut Option<crate::quota::QuotaView>,
    ) -> Vec<(SiteId, meridian_federation::PoolName)> {
        let Some(t) = &self.tenancy else {
            return Vec::new();
        };
        let Ok(queue) = t.queue_of(&job.spec.tenant, job.spec.queue.as_ref()) else {
            return Vec::new();
        };
        if queue.site_caps.is_empty() {
            return Vec::new();
        }
        let milli = job.spec.resources.milli_per_replica() * u64::from(job.spec.replicas.max(1));
        let pools = self.state.sites.values().flat_map(|s| {
            s.pools
                .iter()
                .map(move |p| (s.id(), &p.name, p.kind, &p.model))
        });
        let view = quota.get_or_insert_with(|| self.quota_view(t));
        crate::quota::capped_pools(queue, &view.holdings, pools, milli)
    }

    /// Every job holding devices, for quota accounting.
    pub(super) fn holdings(&self, t: &crate::quota::Tenancy) -> Vec<crate::quota::Holding> {
        self.state
            .active_jobs()
            .filter(|j| j.holds_devices())
            .filter_map(|j| {
                let a = j.assignment.as_ref()?;
                let queue = t.queue_of(&j.spec.tenant, j.spec.queue.as_ref()).ok()?;
                Some(crate::quota::Holding {
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
}
