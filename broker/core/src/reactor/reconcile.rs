//! Reconciliation: what a site's agent holds against what the broker believes runs there.
//!
//! Every heartbeat carries the agent's inventory — the attempts it runs, and those whose end it has not had
//! acknowledged — as of an inventory mark, with the list itself when it is short and a digest otherwise. An
//! attempt the broker holds at the site, accepted at a mark no later than the inventory's, that the inventory
//! omits is over: the agent lost it (it restarted without it, say) and its end will never be reported. It is
//! ended as [`Event::AttemptLost`] and its job requeued; its devices come free. An attempt the inventory lists
//! that the broker does not assign there is stopped. When only a digest comes and it differs from the
//! broker's, the broker asks for the whole list (at most every [`ASK_EVERY_MS`]).

use super::{Command, Event, Reactor};
use crate::journal::Journal;
use crate::Millis;
use meridian_federation::{inventory_digest, AttemptRef, Inventory, JobId, JobPhase, SiteId};
use std::collections::BTreeSet;

/// The shortest time between two requests for a site's whole inventory.
pub const ASK_EVERY_MS: u64 = 5_000;

impl<J: Journal> Reactor<J> {
    /// The attempts the broker holds at `site` that the agent has accepted: (attempt, accepted at mark).
    fn held_at(
        &self,
        site: &SiteId,
    ) -> Vec<(AttemptRef, Option<meridian_federation::InventoryMark>)> {
        self.state
            .with_runs
            .iter()
            .filter_map(|id| self.state.jobs.get(id))
            .filter(|j| j.holds_devices() && j.assignment.as_ref().is_some_and(|a| &a.site == site))
            .map(|j| {
                (
                    AttemptRef {
                        job: j.id.clone(),
                        attempt: j.attempt,
                    },
                    j.accepted,
                )
            })
            .collect()
    }

    /// What an inventory decides (see the module docs). Asking for a whole list and stopping unknown attempts
    /// are messages only; lost attempts are decisions to journal.
    pub(super) fn inventory_decisions(
        &mut self,
        now: Millis,
        site: &SiteId,
        inv: &Inventory,
    ) -> Vec<Event> {
        if !self.state.sites.get(site).is_some_and(|s| s.up) {
            return Vec::new();
        }
        let held = self.held_at(site);
        let Some(list) = &inv.attempts else {
            let accepted: Vec<&AttemptRef> = held
                .iter()
                .filter(|(_, m)| m.is_some_and(|m| m <= inv.mark))
                .map(|(a, _)| a)
                .collect();
            let differs =
                accepted.len() != inv.count as usize || inventory_digest(accepted) != inv.digest;
            if let Some(s) = self.state.sites.get_mut(site) {
                if differs && now.saturating_sub(s.inventory_asked_ms) >= ASK_EVERY_MS {
                    s.inventory_asked_ms = now;
                    self.outbox
                        .push(Command::AskInventory { site: site.clone() });
                }
            }
            return Vec::new();
        };
        let listed: BTreeSet<&AttemptRef> = list.iter().collect();
        let known: BTreeSet<&AttemptRef> = held.iter().map(|(a, _)| a).collect();
        let unknown: Vec<AttemptRef> = list
            .iter()
            .filter(|a| !known.contains(a) && !self.ended_here(a, site))
            .cloned()
            .collect();
        for a in unknown {
            self.cancel_attempt(
                site.clone(),
                a.job,
                a.attempt,
                "attempt is no longer assigned to this site",
            );
        }
        held.iter()
            .filter(|(a, m)| m.is_some_and(|m| m <= inv.mark) && !listed.contains(a))
            .map(|(a, _)| {
                let started = self
                    .state
                    .jobs
                    .get(&a.job)
                    .and_then(|j| j.runs.iter().find(|r| r.attempt == a.attempt))
                    .map(|r| r.started_ms.unwrap_or(r.offered_ms));
                Event::AttemptLost {
                    site: site.clone(),
                    job: a.job.clone(),
                    attempt: a.attempt,
                    runtime_ms: started.map_or(0, |s| now.saturating_sub(s)),
                }
            })
            .collect()
    }

    /// Whether an attempt the agent still lists ended here as far as the broker knows (its end reported and
    /// recorded, the acknowledgement perhaps still on its way): no reason to stop it.
    fn ended_here(&self, a: &AttemptRef, site: &SiteId) -> bool {
        self.state.jobs.get(&a.job).is_some_and(|j| {
            j.runs
                .iter()
                .any(|r| r.attempt == a.attempt && &r.site == site && r.metered)
        })
    }

    /// An accepted attempt the site no longer has: metered for the time it ran, and its job requeued (or
    /// cancelled, if a cancel was waiting for it).
    pub(super) fn on_attempt_lost(
        &mut self,
        now: Millis,
        site: &SiteId,
        job: &JobId,
        attempt: u32,
        runtime_ms: u64,
    ) {
        if !self.is_current(job, attempt, site) {
            return;
        }
        self.meter_runtime(job, attempt, runtime_ms);
        let cancel = self.state.jobs.get(job).is_some_and(|j| j.cancel_requested);
        if cancel {
            self.release(job);
            if let Some(j) = self.state.jobs.get_mut(job) {
                j.phase = JobPhase::Cancelled;
                j.finished_ms = Some(now);
                j.why = format!("cancelled; site {site} no longer had attempt {attempt}");
                j.note(now, j.why.clone());
            }
            self.settled(now, job);
            return;
        }
        self.requeue(
            now,
            job,
            &format!("site {site} no longer has attempt {attempt} (its agent lost it)"),
        );
        self.try_place(now, job);
    }
}
