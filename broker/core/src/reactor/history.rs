//! Bounded history: finished jobs leave the live state once the shell has archived them durably
//! ([`Event::Archived`]); what budgets, fair share and idempotency need of them stays, in aggregates.
//!
//! - Budgets read metered amounts per tenant and UTC day (`metered_by_day`), kept as attempts are metered.
//! - Fair share reads the attempts of archived jobs that ran in its window (`recent_runs`).
//! - A resubmission of an archived job's idempotency key within [`IDEMPOTENCY_WINDOW_MS`] of its archiving
//!   returns that job (the same spec) or is refused as a conflict (another spec).

use super::state::{ArchivedKey, RecentRun};
use super::{Reactor, FAIR_SHARE_WINDOW_MS};
use crate::journal::Journal;
use crate::model::Job;
use crate::Millis;
use meridian_federation::{Amounts, JobId, JobSpec, TenantId};
use std::hash::Hasher;

pub const DAY_MS: u64 = 24 * 3_600_000;

/// How long an archived job's idempotency key is honoured after archiving.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 7 * DAY_MS;

/// How long metered amounts per day are kept for budgets (a monthly budget needs 31 days).
const METERED_DAYS_KEPT_MS: u64 = 400 * DAY_MS;

/// A stable digest of a spec: FNV-1a 64 of its JSON (not a security measure; it tells specs apart).
pub fn spec_digest(spec: &JobSpec) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(&serde_json::to_vec(spec).unwrap_or_default());
    h.finish()
}

impl<J: Journal> Reactor<J> {
    /// Finished jobs whose retention has passed at `now`, oldest finish first, at most `limit`: what the shell
    /// archives next.
    pub fn archivable(&self, now: Millis, retention_ms: u64, limit: usize) -> Vec<&Job> {
        self.state
            .finished
            .iter()
            .take_while(|(t, _)| t.saturating_add(retention_ms) <= now)
            .filter_map(|(_, id)| self.state.jobs.get(id))
            .take(limit)
            .collect()
    }

    /// The shell stored these finished jobs in the archive: they leave the live state.
    pub(super) fn on_archived(&mut self, now: Millis, jobs: &[JobId]) {
        for id in jobs {
            let Some(job) = self.state.jobs.get(id) else {
                continue;
            };
            if !job.phase.is_terminal() {
                continue;
            }
            let Some(job) = self.state.jobs.remove(id) else {
                continue;
            };
            let key = (job.spec.tenant.clone(), job.spec.idempotency_key.clone());
            self.state.by_key.remove(&key);
            self.state.active.remove(id);
            self.state.offered.remove(id);
            self.state.with_runs.remove(id);
            if let Some(f) = job.finished_ms {
                self.state.finished.remove(&(f, id.clone()));
            }
            self.state.archived_keys.insert(
                key.clone(),
                ArchivedKey {
                    tenant: key.0,
                    key: key.1,
                    job: id.clone(),
                    spec_digest: spec_digest(&job.spec),
                    archived_ms: now,
                },
            );
            let queue = self.tenancy.as_ref().and_then(|t| {
                t.queue_of(&job.spec.tenant, job.spec.queue.as_ref())
                    .ok()
                    .map(|q| q.name.clone())
            });
            for run in &job.runs {
                let Some(start) = run.started_ms else {
                    continue;
                };
                let end = start.saturating_add(run.runtime_ms);
                if run.metered && end + FAIR_SHARE_WINDOW_MS > now {
                    self.state.recent_runs.push(RecentRun {
                        tenant: job.spec.tenant.clone(),
                        queue: queue.clone(),
                        kind: job.spec.resources.kind,
                        model: run.model.clone(),
                        milli: run.milli,
                        start_ms: start,
                        end_ms: end,
                    });
                }
            }
        }
        self.state
            .archived_keys
            .retain(|_, k| k.archived_ms + IDEMPOTENCY_WINDOW_MS > now);
        self.state
            .recent_runs
            .retain(|r| r.end_ms + FAIR_SHARE_WINDOW_MS > now);
        let keep_from = now.saturating_sub(METERED_DAYS_KEPT_MS);
        self.state
            .metered_by_day
            .retain(|(_, day), _| *day >= keep_from);
    }

    /// What an archived job's key says about a submission: `Some(Ok(job))` for a resubmission of the same spec,
    /// `Some(Err(job))` for a different spec under the key; `None` if the key is not an archived job's.
    pub(super) fn archived_key(&self, spec: &JobSpec) -> Option<Result<JobId, JobId>> {
        let k = self
            .state
            .archived_keys
            .get(&(spec.tenant.clone(), spec.idempotency_key.clone()))?;
        Some(if k.spec_digest == spec_digest(spec) {
            Ok(k.job.clone())
        } else {
            Err(k.job.clone())
        })
    }

    /// What `tenant` has used in `[from, to)` (UTC day boundaries): metered attempts offered in it, plus the
    /// estimates of the attempts still holding devices (not metered yet).
    pub(super) fn budget_used(&self, tenant: &TenantId, from: Millis, to: Millis) -> Amounts {
        let mut a = Amounts::default();
        for m in self
            .state
            .metered_by_day
            .range((tenant.clone(), from)..(tenant.clone(), to))
            .map(|(_, m)| m)
        {
            a = crate::metering::add(a, *m);
        }
        for job in self
            .state
            .with_runs
            .iter()
            .filter_map(|id| self.state.jobs.get(id))
            .filter(|j| &j.spec.tenant == tenant && j.holds_devices())
        {
            let current = job
                .runs
                .iter()
                .find(|r| r.attempt == job.attempt && !r.metered)
                .filter(|r| r.offered_ms >= from && r.offered_ms < to);
            if let (Some(_), Some(e)) = (current, &job.estimate) {
                a.cost_micro_usd += e.cost_micro_usd;
                a.energy_wh += e.energy_wh;
                a.co2_g += e.co2_g;
            }
        }
        a
    }
}
