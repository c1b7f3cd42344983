//! Snapshots of broker state, so that a restart replays only the journal records stored after the latest one
//! and recovery time does not grow with history. A snapshot holds what cannot be derived (sites, jobs, the job
//! counter) and the journal sequence it includes; the idempotency map, the active, pending and offered sets and
//! the site index are rebuilt from it.

use super::journal::Journal;
use super::model::{Job, Site};
use super::reactor::{Reactor, State};
use super::Millis;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The last journal sequence whose record is included.
    pub journal_seq: u64,
    pub at_ms: Millis,
    pub next_job: u64,
    pub sites: Vec<Site>,
    pub jobs: Vec<Job>,
    /// The tenancy in force (queues, quotas, budgets), as last set.
    #[serde(default)]
    pub tenancy_toml: Option<String>,
    #[serde(default)]
    pub tenancy_file_toml: Option<String>,
}

impl State {
    pub fn snapshot(&self, journal_seq: u64, at_ms: Millis) -> Snapshot {
        Snapshot {
            journal_seq,
            at_ms,
            next_job: self.next_job,
            sites: self.sites.values().cloned().collect(),
            jobs: self.jobs.values().cloned().collect(),
            tenancy_toml: self.tenancy_toml.clone(),
            tenancy_file_toml: self.tenancy_file_toml.clone(),
        }
    }
}

impl<J: Journal> Reactor<J> {
    /// Replaces the state with a snapshot's; derived parts are rebuilt.
    pub fn restore(&mut self, snap: Snapshot) {
        let mut st = State {
            next_job: snap.next_job,
            dirty: true,
            tenancy_file_toml: snap.tenancy_file_toml,
            ..State::default()
        };
        if let Some(toml) = snap.tenancy_toml {
            match super::quota::Tenancy::from_toml(&toml) {
                Ok(t) => {
                    self.tenancy = Some(t);
                    st.tenancy_toml = Some(toml);
                }
                Err(e) => st.tenancy_toml_error = Some(e),
            }
        }
        for site in snap.sites {
            st.index.update(&site, &self.throughput);
            st.sites.insert(site.id().clone(), site);
        }
        for job in snap.jobs {
            st.by_key.insert(
                (job.spec.tenant.clone(), job.spec.idempotency_key.clone()),
                job.id.clone(),
            );
            if !job.phase.is_terminal() {
                st.active.insert(job.id.clone());
            }
            match job.phase {
                meridian_federation::JobPhase::Pending => {
                    st.pending.insert(job.id.clone());
                }
                meridian_federation::JobPhase::Offered => {
                    st.offered.insert(job.id.clone());
                }
                _ => {}
            }
            st.jobs.insert(job.id.clone(), job);
        }
        self.state = st;
    }
}
