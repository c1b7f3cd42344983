//! Jobs set aside: a waiting job that no pool of the federation can run as it stands (model, kind, memory,
//! residency, size), found so with nothing of its own in the way (no site it is kept off for a while, no pool its
//! quota caps), is not placed again until the federation changes. What it would be told again — its
//! `NoSiteFits` wait — is kept with a print of the federation's facts; a scheduling pass that finds the print
//! unchanged records that wait again without running placement, so waiting jobs that cannot run cost a lookup
//! per pass rather than a placement over every site.
//!
//! Soft state: what a set-aside job records is exactly what placement would (the same inputs give the same
//! wait), so whether a job is set aside changes nothing durable, and a restored or replayed broker, which starts
//! with none, reaches the same state.

use super::Reactor;
use crate::journal::Journal;
use std::hash::{Hash, Hasher};

impl<J: Journal> Reactor<J> {
    /// A print of every fact of the sites that placement reads to decide whether a job fits anywhere: each
    /// site's [`crate::model::FactsPrint`] and whether it is up, draining or revoked. Worked out once per
    /// scheduling pass.
    pub(super) fn federation_print(&mut self) -> u64 {
        if let Some(p) = self.pass_print.filter(|_| self.in_pass) {
            return p;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.state.sites.len().hash(&mut h);
        for (id, s) in &self.state.sites {
            id.as_str().hash(&mut h);
            s.facts.0.hash(&mut h);
            (s.up, s.advert_draining, s.api_draining).hash(&mut h);
            self.state.revoked_sites.contains(id).hash(&mut h);
        }
        let print = h.finish();
        if self.in_pass {
            self.pass_print = Some(print);
        }
        print
    }
}
