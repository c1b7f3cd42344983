//! Liveness: adverts and heartbeats, sites lost, offers that time out, and the clock's tick.

use super::{Command, Event, Reactor};
use crate::journal::Journal;
use crate::model::Site;
use crate::Millis;
use meridian_federation::{
    AttemptRef, Heartbeat, JobId, JobPhase, Offer, SiteAdvert, SiteId, WIRE_VERSION,
};

impl<J: Journal> Reactor<J> {
    /// After a replay, liveness starts afresh: every known site counts as seen now, and is declared lost only if
    /// its heartbeats stay away for the loss timeout from here.
    pub(super) fn resume(&mut self, now: Millis) {
        for s in self.state.sites.values_mut() {
            s.last_seen_ms = now;
        }
    }

    /// After the broker could not act: each offer still unanswered gets its full timeout again from now, and is
    /// sent again for the same attempt. The first sending may never have left (the broker stopped between
    /// journaling the offer and sending it) or its answer may have gone unheard; an agent answers a repeated
    /// offer as it answered the first, and starts nothing twice.
    pub(super) fn offer_again(&mut self, now: Millis) {
        for id in &self.state.offered {
            let Some(job) = self.state.jobs.get_mut(id) else {
                continue;
            };
            if job.phase != JobPhase::Offered {
                continue;
            }
            job.offered_ms = Some(now);
            if let Some(a) = &job.assignment {
                self.outbox.push(Command::Offer(Offer {
                    v: WIRE_VERSION,
                    job: id.clone(),
                    attempt: job.attempt,
                    site: a.site.clone(),
                    pool: a.pool.clone(),
                    devices: a.devices.clone(),
                    spec: job.spec.clone(),
                    resume_from: job.checkpoint.clone(),
                }));
            }
        }
    }

    /// Whether a tick would change durable state: a waiting job's timer is due, capacity changed since waiting
    /// jobs were last tried, or (format 1, where the tick judged them) a site or an offer timed out.
    pub(super) fn tick_due(&self, now: Millis) -> bool {
        let retry = !self.state.waiting.is_empty()
            && (self.state.dirty || self.state.waiting.timer_due(now));
        retry
            || (self.state.format() < super::JOURNALED_DECISIONS
                && (!self.lost_sites(now).0.is_empty() || !self.due_offers(now).is_empty()))
    }

    /// What liveness decides at `now`: sites whose heartbeats stopped for the loss timeout, and offers not
    /// answered within the offer timeout.
    ///
    /// The sites are scanned only when one may be due: once the loss timeout has passed since the oldest
    /// heartbeat of an up site the last scan saw (or any step since, at its own time). With many sites and a
    /// tick after every batch of messages, a scan per tick would cost each heartbeat a pass over every site.
    pub(super) fn due_decisions(&mut self, now: Millis) -> Vec<Event> {
        let timeout = self.config.site_lost_after_ms;
        let mut out = if self.heard_since > 0 && now.saturating_sub(self.heard_since) <= timeout {
            Vec::new()
        } else {
            let (lost, oldest) = self.lost_sites(now);
            // Sites found lost are looked at again at the next tick, in case their loss was not applied.
            self.heard_since = if lost.is_empty() { oldest } else { 0 };
            lost
        };
        out.extend(self.due_offers(now));
        out
    }

    /// Every up site whose heartbeats stopped for the loss timeout, and the oldest heartbeat among the others
    /// (`now` when there are none).
    fn lost_sites(&self, now: Millis) -> (Vec<Event>, Millis) {
        let timeout = self.config.site_lost_after_ms;
        let mut oldest = now;
        let mut lost = Vec::new();
        for s in self.state.sites.values().filter(|s| s.up) {
            if now.saturating_sub(s.last_seen_ms) > timeout {
                lost.push(Event::SiteLost {
                    site: s.id().clone(),
                });
            } else {
                oldest = oldest.min(s.last_seen_ms);
            }
        }
        (lost, oldest)
    }

    /// Offers not answered within the offer timeout.
    fn due_offers(&self, now: Millis) -> Vec<Event> {
        let mut out = Vec::new();
        out.extend(
            self.state
                .offered
                .iter()
                .filter_map(|id| self.state.jobs.get(id))
                .filter(|j| {
                    j.phase == JobPhase::Offered
                        && j.offered_ms
                            .is_some_and(|t| now.saturating_sub(t) > self.config.offer_timeout_ms)
                })
                .map(|j| Event::OfferExpired {
                    job: j.id.clone(),
                    attempt: j.attempt,
                }),
        );
        out
    }

    pub(super) fn on_advert(&mut self, now: Millis, a: SiteAdvert) {
        let id = a.site.id.clone();
        let api_draining = self.state.sites.get(&id).is_some_and(|s| s.api_draining);
        let unchanged = self.state.sites.get(&id).is_some_and(|s| s.repeats(&a));
        if unchanged {
            if let Some(s) = self.state.sites.get_mut(&id) {
                s.last_seen_ms = now;
            }
            return;
        }
        // Same pools as before (the usual periodic or carbon update): refresh in place, keeping reservations.
        if let Some(s) = self.state.sites.get_mut(&id) {
            if s.same_shape(&a) {
                s.refresh(&a, now);
                self.state.dirty = true;
                self.log_intensity(now, &id);
                self.reindex(&id);
                self.try_pending(now);
                return;
            }
        }
        let mut site = Site::from_advert(&a, now);
        site.api_draining = api_draining;
        // Reservations are the broker's own: rebuild them from the jobs that hold devices here.
        for job in self.state.active_jobs().filter(|j| j.holds_devices()) {
            if let Some(asg) = job.assignment.as_ref().filter(|asg| asg.site == id) {
                site.apply_reservation(&asg.pool, &asg.devices, true);
            }
        }
        self.state.sites.insert(id.clone(), site);
        self.log_intensity(now, &id);
        self.reindex(&id);
        self.state.dirty = true;
        self.try_pending(now);
    }

    /// From format 8: the site's grid intensity from `now` on joins its log. A log that reaches a multiple of
    /// 64 steps forgets those before the start of the site's oldest attempt that still holds devices there
    /// (a rule that reads only state, so a restored broker prunes at the same steps).
    fn log_intensity(&mut self, now: Millis, id: &SiteId) {
        if self.state.format() < super::INTEGRATED_FORMAT {
            return;
        }
        let Some(g) = self.state.sites.get(id).map(|s| s.info.carbon.g_per_kwh) else {
            return;
        };
        let log = self.state.intensity.entry(id.clone()).or_default();
        let before = log.len();
        log.set(now, g);
        if log.len() == before || !log.len().is_multiple_of(64) {
            return;
        }
        let oldest = self
            .state
            .active_jobs()
            .filter(|j| j.assignment.as_ref().is_some_and(|a| &a.site == id))
            .filter_map(|j| j.runs.iter().find(|r| r.attempt == j.attempt))
            // An attempt is metered from its start, never before its offer.
            .map(|r| r.offered_ms)
            .min()
            .unwrap_or(now);
        if let Some(log) = self.state.intensity.get_mut(id) {
            log.prune_before(oldest);
        }
    }

    pub(super) fn on_heartbeat(&mut self, now: Millis, h: Heartbeat) {
        let Some(site) = self.state.sites.get_mut(&h.site) else {
            return;
        };
        if !site.up {
            // A lost site must re-advertise before it gets work again; its heartbeat alone is not enough.
            return;
        }
        site.last_seen_ms = now;
        // Adverts are sent when something changed (and in full now and then): a heartbeat of another generation
        // than the broker's means one was lost on the way, and the site is asked for it.
        if h.generation != site.generation
            && now.saturating_sub(site.advert_asked_ms) >= super::reconcile::ASK_EVERY_MS
        {
            site.advert_asked_ms = now;
            self.outbox.push(Command::AskAdvert {
                site: h.site.clone(),
            });
        }
        // Attempts the site runs that the broker no longer assigns there are stopped.
        for AttemptRef { job, attempt } in h.running {
            if !self.is_current(&job, attempt, &h.site) {
                self.cancel_attempt(
                    h.site.clone(),
                    job,
                    attempt,
                    "attempt is no longer assigned to this site",
                );
            }
        }
    }

    /// Keeps the scan sets of live jobs small: finished jobs leave the active set, past offers the offered set.
    fn prune(&mut self) {
        let jobs = &self.state.jobs;
        if self.state.active.len() > self.state.active_prune_at {
            self.state
                .active
                .retain(|id| jobs.get(id).is_some_and(|j| !j.phase.is_terminal()));
            self.state.active_prune_at = (2 * self.state.active.len()).max(1024);
        }
        self.state
            .offered
            .retain(|id| jobs.get(id).is_some_and(|j| j.phase == JobPhase::Offered));
    }

    /// A tick from format 2: waiting jobs whose timers are due are tried (sites lost and offers given up came
    /// before it as decisions of their own).
    pub(super) fn on_timers(&mut self, now: Millis) {
        self.prune();
        self.try_pending(now);
    }

    /// A tick of format 1, which judged lost sites and timed-out offers itself (kept to replay format 1
    /// journals as their broker did, and to run as that broker does until the format is upgraded).
    pub(super) fn on_tick_format_1(&mut self, now: Millis) {
        self.prune();
        for decision in self.due_decisions(now) {
            match decision {
                Event::SiteLost { site } => self.on_site_lost(now, &site),
                Event::OfferExpired { job, attempt } => self.on_offer_expired(now, &job, attempt),
                _ => {}
            }
        }
        self.try_pending(now);
    }

    /// Gives up an unanswered offer: the site is told to drop it and skipped for a while, and the job waits again.
    pub(super) fn on_offer_expired(&mut self, now: Millis, job: &JobId, attempt: u32) {
        let site = match self.state.jobs.get(job) {
            Some(j) if j.phase == JobPhase::Offered && j.attempt == attempt => {
                match j.assignment.as_ref() {
                    Some(a) => a.site.clone(),
                    None => return,
                }
            }
            _ => return,
        };
        self.saw(crate::observe::Observation::Answered {
            job: job.clone(),
            attempt,
            site: site.clone(),
            answer: crate::observe::Answer::TimedOut,
            at_ms: now,
        });
        self.cancel_attempt(site.clone(), job.clone(), attempt, "offer timed out");
        self.refuse(now, job, &site, &format!("offer to {site} timed out"));
    }

    pub(super) fn on_site_lost(&mut self, now: Millis, site: &SiteId) {
        if let Some(s) = self.state.sites.get_mut(site) {
            s.up = false;
        }
        self.reindex(site);
        let held: Vec<JobId> = self
            .state
            .active_jobs()
            .filter(|j| j.holds_devices() && j.assignment.as_ref().is_some_and(|a| &a.site == site))
            .map(|j| j.id.clone())
            .collect();
        for id in held {
            let cancel = self.state.jobs.get(&id).is_some_and(|j| j.cancel_requested);
            if cancel {
                self.release(&id);
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    job.phase = JobPhase::Cancelled;
                    job.finished_ms = Some(now);
                    job.why = format!("cancelled; site {site} was lost");
                    job.note(now, job.why.clone());
                    self.settled(now, &id);
                }
            } else {
                self.requeue(now, &id, &format!("site {site} lost (no heartbeats)"));
            }
        }
        self.state.dirty = true;
    }
}
