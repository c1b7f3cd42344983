//! Broker state: what the reactor owns and every step changes.

use crate::model::{Job, Site};
use crate::Millis;
use meridian_federation::{
    AcceleratorKind, Amounts, JobId, ModelName, QueueName, SiteId, TenantId,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// An archived job's idempotency key: a resubmission within the window returns the job (if the spec is the
/// same).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArchivedKey {
    pub tenant: TenantId,
    pub key: String,
    pub job: JobId,
    /// A digest of the spec (FNV-1a 64 of its JSON), to tell a resubmission from a conflicting one.
    pub spec_digest: u64,
    pub archived_ms: Millis,
}

/// An attempt of an archived job that ran within the fair-share window.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecentRun {
    pub tenant: TenantId,
    pub queue: Option<QueueName>,
    pub kind: AcceleratorKind,
    pub model: ModelName,
    pub milli: u64,
    pub start_ms: Millis,
    pub end_ms: Millis,
}

/// Broker state: sites, jobs and the idempotency index.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub(crate) sites: BTreeMap<SiteId, Site>,
    pub(crate) jobs: BTreeMap<JobId, Job>,
    pub(crate) next_job: u64,
    pub(crate) by_key: HashMap<(TenantId, String), JobId>,
    /// Capacity changed since pending jobs were last tried.
    pub(crate) dirty: bool,
    /// Every job not yet finished (and, until pruned, some that just finished): what timers and retries scan,
    /// so their cost follows the live jobs, not the whole history.
    pub(crate) active: std::collections::BTreeSet<JobId>,
    /// Every pending job, filed by what it needs, with its timers (see [`super::waiting`]): what scheduling
    /// passes look at, so their cost follows what changed, not the number of waiting jobs.
    pub(crate) waiting: super::waiting::Waiting,
    /// The tenancy in force, as set through `SetTenancy` (the source of `Reactor::tenancy`).
    pub(crate) tenancy_toml: Option<String>,
    /// The tenancy file's text as last applied at a start: an unchanged file does not undo the administrator's
    /// later changes.
    pub(crate) tenancy_file_toml: Option<String>,
    /// Why a journaled tenancy could not be read back (a newer broker's format, say).
    pub(crate) tenancy_toml_error: Option<String>,
    /// The durable format in force (0 stands for the first): what the journal is written in.
    pub(crate) format: u32,
    /// Every offered job (and, until pruned, some that left that phase): what the offer timer scans.
    pub(crate) offered: std::collections::BTreeSet<JobId>,
    /// The active set is pruned of finished jobs when it grows past this (amortised: twice its size after the
    /// previous pruning).
    pub(crate) active_prune_at: usize,
    /// Sites by accelerator class and spare capacity; refiled after every change to a site.
    pub(crate) index: crate::index::SiteIndex,
    /// Metered amounts of every attempt, per tenant and UTC day it was offered: what budgets read. They
    /// outlive the job records, which are archived.
    pub(crate) metered_by_day: BTreeMap<(TenantId, Millis), Amounts>,
    /// Live jobs with at least one attempt: what fair share and budgets look at (with `recent_runs`), so they
    /// cost in proportion to the jobs that ran, not to the waiting ones.
    pub(crate) with_runs: BTreeSet<JobId>,
    /// Finished jobs still in the live state, by finish time: the next to archive first.
    pub(crate) finished: BTreeSet<(Millis, JobId)>,
    /// Idempotency keys of archived jobs, for [`super::IDEMPOTENCY_WINDOW_MS`] after they were archived.
    pub(crate) archived_keys: HashMap<(TenantId, String), ArchivedKey>,
    /// Attempts of archived jobs that ran in the fair-share window.
    pub(crate) recent_runs: Vec<RecentRun>,
    /// API tokens by id (hashes only), revoked ones included (their ids are never reused).
    pub(crate) tokens: BTreeMap<String, crate::access::TokenRecord>,
    /// Sites an administrator revoked: nothing they send is taken.
    pub(crate) revoked_sites: BTreeSet<SiteId>,
    /// Per tenant and policy with a premium (`balanced`, `max-cost-premium=…`): what its placed jobs cost
    /// against their cheapest candidates (see [`crate::placement::Spent`]).
    pub(crate) premiums: BTreeMap<(TenantId, String), crate::placement::Spent>,
    /// Deployed services by tenant and name. (Format 5.)
    pub(crate) services:
        BTreeMap<(TenantId, meridian_federation::ServiceName), meridian_federation::ServiceSpec>,
    /// Each site's grid intensity as it advertised it over time, back to the start of its oldest attempt still
    /// running: what an attempt's carbon is metered over. (Format 8.)
    pub(crate) intensity: BTreeMap<SiteId, crate::steps::Steps<u32>>,
    /// Counts changes to `tokens` (not durable): the shell refreshes its table when it moves.
    pub(crate) tokens_generation: u64,
    /// Waiting jobs no pool can run, set aside with the federation's print, their wait and its words (soft
    /// state: see
    /// `reactor::aside`).
    pub(crate) aside: HashMap<JobId, (u64, crate::placement::Wait, String)>,
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

/// Read access for the shells (API views, the simulator); only the reactor changes state.
impl State {
    /// A site's grid intensity steps as kept for metering (see `intensity`), oldest first.
    pub fn intensity_of(&self, site: &SiteId) -> &[(Millis, u32)] {
        self.intensity.get(site).map_or(&[], |s| s.steps())
    }

    pub fn sites(&self) -> &BTreeMap<SiteId, Site> {
        &self.sites
    }

    pub fn site(&self, id: &SiteId) -> Option<&Site> {
        self.sites.get(id)
    }

    pub fn jobs(&self) -> &BTreeMap<JobId, Job> {
        &self.jobs
    }

    pub fn job(&self, id: &JobId) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Finished jobs still in the live state, in the order they finished: those after `after` (the last one
    /// seen, by finish time and job), or with none seen yet those that finished at `since_ms` or later.
    pub fn finished_after<'a>(
        &'a self,
        after: Option<&'a (Millis, JobId)>,
        since_ms: Millis,
    ) -> impl Iterator<Item = (&'a (Millis, JobId), &'a Job)> + 'a {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.finished
            .range((from, Bound::Unbounded))
            .skip_while(move |k| after.is_none() && k.0 < since_ms)
            .filter_map(|k| self.jobs.get(&k.1).map(|j| (k, j)))
    }

    /// The tenancy in force as the text it was set from.
    pub fn tenancy_toml(&self) -> Option<&str> {
        self.tenancy_toml.as_deref()
    }

    /// The tenancy file's text as last applied at a start.
    pub fn tenancy_file_toml(&self) -> Option<&str> {
        self.tenancy_file_toml.as_deref()
    }

    /// The durable format in force: the journal's batches and snapshots are written in it.
    pub fn format(&self) -> u32 {
        self.format.max(crate::durable::FIRST_FORMAT)
    }

    /// API tokens by id (revoked ones included).
    pub fn services(
        &self,
    ) -> &BTreeMap<(TenantId, meridian_federation::ServiceName), meridian_federation::ServiceSpec>
    {
        &self.services
    }

    pub fn tokens(&self) -> &BTreeMap<String, crate::access::TokenRecord> {
        &self.tokens
    }

    /// Moves whenever a token is created or revoked.
    pub fn tokens_generation(&self) -> u64 {
        self.tokens_generation
    }

    /// Sites an administrator revoked.
    pub fn revoked_sites(&self) -> &BTreeSet<SiteId> {
        &self.revoked_sites
    }

    /// Why a journaled tenancy could not be read back.
    pub fn tenancy_toml_error(&self) -> Option<&str> {
        self.tenancy_toml_error.as_deref()
    }
}
