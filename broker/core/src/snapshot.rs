//! Snapshots of broker state, so that a restart replays only the journal records stored after the latest one
//! and recovery time does not grow with history. A snapshot holds what cannot be derived (sites, jobs, the job
//! counter) and the journal sequence it includes; the idempotency map, the active, pending and offered sets and
//! the site index are rebuilt from it.

use super::model::{Job, Site};
use super::reactor::{ArchivedKey, RecentRun, State};
use super::Millis;
use meridian_federation::{Amounts, TenantId};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The durable format of the records it holds (absent in format 1).
    #[serde(default = "crate::durable::first_format")]
    pub format: u32,
    /// The last journal sequence whose record is included.
    pub journal_seq: u64,
    pub at_ms: Millis,
    pub next_job: u64,
    pub sites: Vec<Site>,
    /// In id order.
    pub jobs: Vec<Job>,
    /// The tenancy in force (queues, quotas, budgets), as last set.
    #[serde(default)]
    pub tenancy_toml: Option<String>,
    #[serde(default)]
    pub tenancy_file_toml: Option<String>,
    /// Capacity changed since waiting jobs were last tried (format 1 snapshots lack it: taken as changed).
    #[serde(default = "changed")]
    pub dirty: bool,
    /// Metered amounts per tenant and UTC day (format 1 snapshots lack them: they are summed from the jobs,
    /// which were all still there).
    #[serde(default)]
    pub metered_by_day: Option<Vec<(TenantId, Millis, Amounts)>>,
    #[serde(default)]
    pub archived_keys: Vec<ArchivedKey>,
    #[serde(default)]
    pub recent_runs: Vec<RecentRun>,
    /// API tokens (hashes only). (Format 3.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<crate::access::TokenRecord>,
    /// Revoked sites. (Format 3.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revoked_sites: Vec<meridian_federation::SiteId>,
    /// What each tenant's jobs under a premium rule have spent (tenant, policy, spent). (Format 4.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub premiums: Vec<(TenantId, String, crate::placement::Spent)>,
    /// Deployed services. (Format 5.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<meridian_federation::ServiceSpec>,
    /// Each site's grid intensity over time (see `State::intensity`). (Format 8.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intensity: Vec<(meridian_federation::SiteId, crate::steps::Steps<u32>)>,
}

fn changed() -> bool {
    true
}

impl State {
    pub fn snapshot(&self, journal_seq: u64, at_ms: Millis) -> Snapshot {
        Snapshot {
            format: self.format(),
            journal_seq,
            at_ms,
            next_job: self.next_job,
            sites: self.sites.values().cloned().collect(),
            jobs: self.jobs.values().cloned().collect(),
            tenancy_toml: self.tenancy_toml.clone(),
            tenancy_file_toml: self.tenancy_file_toml.clone(),
            dirty: self.dirty,
            metered_by_day: Some(
                self.metered_by_day
                    .iter()
                    .map(|((t, d), a)| (t.clone(), *d, *a))
                    .collect(),
            ),
            archived_keys: {
                let mut keys: Vec<ArchivedKey> = self.archived_keys.values().cloned().collect();
                keys.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
                keys
            },
            recent_runs: self.recent_runs.clone(),
            tokens: self.tokens.values().cloned().collect(),
            revoked_sites: self.revoked_sites.iter().cloned().collect(),
            premiums: self
                .premiums
                .iter()
                .map(|((t, p), s)| (t.clone(), p.clone(), *s))
                .collect(),
            services: self.services.values().cloned().collect(),
            intensity: self
                .intensity
                .iter()
                .map(|(s, l)| (s.clone(), l.clone()))
                .collect(),
        }
    }
}
