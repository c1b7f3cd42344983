//! Random sequences of events into the reactor: adverts, heartbeats (some naming attempts the broker no
//! longer assigns), submissions, offer answers, statuses (some stale), time passing (so sites are lost and
//! offers expire), cancels, drains, tenancy changes (one removes a queue that has waiting jobs), scale-in and
//! resumes. After every step the invariants hold, and a second reactor that replays the journal as it grows —
//! a broker killed at that point and restarted — has the same state as the live one; a snapshot taken at a
//! random point, restored and replayed to the end, has it too; and a broker restarted from the journal cut there
//! sends every unanswered offer again for the same attempt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::state_eq::same;
use super::*;
use crate::journal::{MemoryJournal, Record};
use crate::reactor::{CoreConfig, Reactor};
use crate::Millis;
use proptest::prelude::*;

use super::random_events::{action, sites, Action, Submission, TENANCIES, TENANTS};

/// The live reactor, the offers and attempts the agents would hold, and a replica replaying its journal.
struct Run {
    live: Reactor<MemoryJournal>,
    now: Millis,
    adverts: Vec<SiteAdvert>,
    /// Offers sent and not yet answered.
    offers: Vec<Offer>,
    /// Attempts accepted: their offer.
    running: Vec<Offer>,
    /// Specs submitted, by key, so a key can be reused.
    keys: BTreeMap<(usize, u8), JobSpec>,
    replica: Reactor<MemoryJournal>,
    replayed: usize,
    /// The same events into a reactor that tries every waiting job in every pass.
    naive: Reactor<MemoryJournal>,
    /// Each site's agent: its inventory mark (starts, changes).
    marks: Vec<InventoryMark>,
    /// Sites whose whole inventory the broker asked for.
    asked: Vec<SiteId>,
}

fn reactor() -> Reactor<MemoryJournal> {
    Reactor::new(
        CoreConfig::default(),
        RttTable::default(),
        regions(),
        MemoryJournal::default(),
    )
}

impl Run {
    fn new() -> Self {
        Run {
            live: reactor(),
            now: 1_700_000_000_000,
            adverts: sites(),
            offers: Vec::new(),
            running: Vec::new(),
            keys: BTreeMap::new(),
            replica: reactor(),
            replayed: 0,
            marks: vec![InventoryMark { epoch: 1, seq: 0 }; 4],
            asked: Vec::new(),
            naive: Reactor::new(
                CoreConfig {
                    exhaustive_passes: true,
                    ..CoreConfig::default()
                },
                RttTable::default(),
                regions(),
                MemoryJournal::default(),
            ),
        }
    }

    fn step(&mut self, event: Event) {
        // A refused step (a conflicting key, an unknown queue, …) changes nothing; anything else is applied.
        let quota = self.live.holders();
        let _ = self.naive.step(self.now, event.clone());
        self.naive.take_outbox();
        let _ = self.live.step(self.now, event);
        for c in self.live.take_outbox() {
            match c {
                Command::Offer(o) => self.offers.push(o),
                Command::Cancel { cancel, .. } => self
                    .running
                    .retain(|o| !(o.job == cancel.job && o.attempt == cancel.attempt)),
                Command::AskInventory { site } => self.asked.push(site),
                Command::AskAdvert { .. } => {}
            }
        }
        self.live
            .sanity_check()
            .and_then(|()| self.live.check_quota_step(&quota))
            .unwrap_or_else(|e| panic!("invariant broken: {e}"));
        // The replica is a broker restarted from the journal as it stands now.
        let records = &self.live.journal().records;
        self.replica.replay(&records[self.replayed..]);
        self.replayed = records.len();
        if let Err(e) = same(self.live.state(), self.replica.state()) {
            panic!(
                "replay differs from the live run after {} records: {e}",
                self.replayed
            );
        }
        // Passing over blocked groups places exactly what trying every waiting job places.
        for (id, j) in self.live.state().jobs() {
            let n = &self.naive.state().jobs()[id];
            let placed =
                |j: &crate::model::Job| (j.phase, j.attempt, j.assignment.clone(), j.runs.clone());
            if placed(j) != placed(n) {
                panic!(
                    "{id} differs from the exhaustive passes: {:?} against {:?}",
                    placed(j),
                    placed(n)
                );
            }
        }
    }

    fn play(&mut self, a: &Action) {
        match a {
            Action::Advert { site, used, drain } => {
                let mut advert = self.adverts[*site].clone();
                advert.generation += 1;
                advert.draining = *drain;
                if let Some(d) = advert.pools[0].devices.first_mut() {
                    d.used_milli = u32::from(*used) * 500;
                }
                self.adverts[*site] = advert.clone();
                self.step(Event::Advert(advert));
            }
            Action::Heartbeat { site, stale } => {
                let id = self.adverts[*site].site.id.clone();
                let mut running: Vec<AttemptRef> = self
                    .running
                    .iter()
                    .filter(|o| o.site == id)
                    .map(|o| AttemptRef {
                        job: o.job.clone(),
                        attempt: o.attempt,
                    })
                    .collect();
                if *stale {
                    running.push(AttemptRef {
                        job: JobId::numbered(999),
                        attempt: 7,
                    });
                }
                // The inventory: the list itself, or (when `stale`) only its digest.
                let held: Vec<AttemptRef> =
                    running.iter().filter(|a| a.attempt != 7).cloned().collect();
                let inventory = Inventory {
                    mark: self.marks[*site],
                    count: held.len() as u32,
                    digest: inventory_digest(&held),
                    attempts: (!*stale).then(|| held.clone()),
                };
                self.step(Event::Heartbeat(Heartbeat {
                    v: 1,
                    site: id.clone(),
                    seq: 0,
                    sent_at_ms: self.now,
                    generation: self.adverts[*site].generation,
                    running,
                    inventory: Some(inventory),
                }));
                // The agent answers a request for its whole inventory at once.
                for asked in std::mem::take(&mut self.asked) {
                    let Some(i) = self.adverts.iter().position(|a| a.site.id == asked) else {
                        continue;
                    };
                    let list: Vec<AttemptRef> = self
                        .running
                        .iter()
                        .filter(|o| o.site == asked)
                        .map(|o| AttemptRef {
                            job: o.job.clone(),
                            attempt: o.attempt,
                        })
                        .collect();
                    self.step(Event::Inventory {
                        site: asked,
                        inventory: Inventory {
                            mark: self.marks[i],
                            count: list.len() as u32,
                            digest: inventory_digest(&list),
                            attempts: Some(list),
                        },
                    });
                }
            }
            Action::AgentRestart { site } => {
                let id = self.adverts[*site].site.id.clone();
                self.running.retain(|o| o.site != id);
                self.offers.retain(|o| o.site != id);
                self.marks[*site] = InventoryMark {
                    epoch: self.marks[*site].epoch + 1,
                    seq: 0,
                };
            }
            Action::Submit(s) => {
                let spec = self.spec(s);
                self.step(Event::Submit(spec));
            }
            Action::Answer { pick, accept } => {
                if self.offers.is_empty() {
                    return;
                }
                let o = self.offers.remove(pick % self.offers.len());
                let site = self.adverts.iter().position(|a| a.site.id == o.site);
                let mut mark = None;
                let outcome = if *accept {
                    self.running.push(o.clone());
                    if let Some(i) = site {
                        self.marks[i].seq += 1;
                        mark = Some(self.marks[i]);
                    }
                    OfferOutcome::Accepted
                } else {
                    OfferOutcome::Rejected {
                        reason: "busy".into(),
                    }
                };
                self.step(Event::OfferAnswer {
                    site: o.site,
                    job: o.job,
                    attempt: o.attempt,
                    outcome,
                    mark,
                });
            }
            Action::Status {
                pick,
                kind,
                runtime_s,
                stale,
            } => {
                if self.running.is_empty() {
                    return;
                }
                let i = pick % self.running.len();
                let o = self.running[i].clone();
                let state = match kind {
                    0 => AttemptState::Running,
                    1 | 2 => AttemptState::Succeeded { exit_code: 0 },
                    3 => AttemptState::Failed {
                        exit_code: Some(1),
                        reason: "exit code 1".into(),
                    },
                    4 => AttemptState::Interrupted {
                        reason: "agent restarted".into(),
                    },
                    _ => AttemptState::Cancelled {
                        reason: "stopped".into(),
                    },
                };
                if state.is_terminal() && !stale {
                    self.running.remove(i);
                    if let Some(k) = self.adverts.iter().position(|a| a.site.id == o.site) {
                        self.marks[k].seq += 1;
                    }
                }
                self.step(Event::Status(JobStatus {
                    v: 1,
                    job: o.job,
                    attempt: if *stale { o.attempt + 1 } else { o.attempt },
                    site: o.site,
                    state,
                    at_ms: self.now,
                    started_at_ms: Some(self.now.saturating_sub(u64::from(*runtime_s) * 1000)),
                    runtime_ms: Some(u64::from(*runtime_s) * 1000),
                    checkpoint: None,
                    mark: None,
                }));
            }
            Action::Advance { ms } => {
                self.now += u64::from(*ms);
                self.step(Event::Tick);
            }
            Action::Cancel { pick } => {
                let jobs: Vec<JobId> = self.live.state().jobs().keys().cloned().collect();
                let id = if jobs.is_empty() || *pick >= jobs.len() + 2 {
                    JobId::numbered(424_242)
                } else {
                    jobs[pick % jobs.len()].clone()
                };
                self.step(Event::Cancel(id));
            }
            Action::Drain { site, on } => {
                let site = self.adverts[*site].site.id.clone();
                self.step(Event::Drain { site, drain: *on });
            }
            Action::Revoke { site, on } => {
                let site = self.adverts[*site].site.id.clone();
                self.step(if *on {
                    Event::SiteRevoked { site }
                } else {
                    Event::SiteRestored { site }
                });
            }
            Action::Tenancy { which } => {
                if let Some(t) = TENANCIES[*which] {
                    self.step(Event::SetTenancy {
                        toml: t.to_owned(),
                        from_file: false,
                    });
                }
            }
            Action::ScaleIn { remove } => self.step(Event::ScaleIn {
                tenant: TenantId::new("team-a").unwrap(),
                service: "chat".into(),
                remove: *remove,
            }),
            Action::Resume => self.step(Event::Resume),
            Action::Service { deploy, spot } => {
                let event = if *deploy {
                    let mut spec = super::lifecycle::service_spec("chat");
                    spec.spot = *spot;
                    Event::ServiceDeployed(spec)
                } else {
                    Event::ServiceDeleted {
                        tenant: TenantId::new("team-a").unwrap(),
                        service: "chat".into(),
                    }
                };
                self.step(event);
            }
            Action::Archive { retention_s } => {
                let jobs: Vec<JobId> = self
                    .live
                    .archivable(self.now, u64::from(*retention_s) * 1000, 5)
                    .into_iter()
                    .map(|j| j.id.clone())
                    .collect();
                if !jobs.is_empty() {
                    self.step(Event::Archived { jobs });
                }
            }
        }
    }

    fn spec(&mut self, s: &Submission) -> JobSpec {
        let key = (s.tenant, s.key);
        if let Some(spec) = self.keys.get(&key) {
            // Every other reuse changes the spec: the key conflicts.
            let mut spec = spec.clone();
            if s.key % 2 == 1 {
                spec.duration_s = Some(spec.duration_s.unwrap_or(0) + 1);
            }
            return spec;
        }
        let mut spec = job(&format!("k{}", s.key), s.gpus);
        spec.tenant = TenantId::new(TENANTS[s.tenant]).unwrap();
        if let Some(m) = s.milli {
            spec.resources = Resources::shared(AcceleratorKind::Gpu, m);
        }
        spec.replicas = s.replicas;
        spec.policy = Some(match s.policy {
            0 => Policy::Cost,
            1 => Policy::Green,
            2 => Policy::Latency,
            3 => Policy::Balanced,
            _ => Policy::Weights(Weights {
                cost: 1.0,
                carbon: 0.5,
                ..Weights::default()
            }),
        });
        spec.users = vec![UserLocation {
            name: None,
            location: GeoPoint {
                lat: 48.0,
                lon: 2.0,
            },
            weight: 1.0,
            rtt_region: None,
        }];
        spec.max_wait_s = s.max_wait_s;
        spec.checkpointable = s.checkpointable;
        if s.service {
            spec.kind = JobKind::Inference;
            spec.service = Some("chat".into());
        }
        spec.spot = s.spot;
        spec.priority = s.priority.map(|p| ["high", "low"][p].to_owned());
        spec.window.deadline_ms = s.deadline_h.map(|h| self.now + h * 3_600_000);
        self.keys.insert(key, spec.clone());
        spec
    }
}

fn play(actions: &[Action], cut: usize) {
    let mut run = Run::new();
    for a in run.adverts.clone() {
        run.step(Event::Advert(a));
    }
    for a in actions {
        run.play(a);
    }
    // A snapshot at a point of the journal, through JSON, plus the records after it, is the same state too.
    let records: Vec<Record> = run.live.journal().records.clone();
    let cut = cut % (records.len() + 1);
    let mut before = reactor();
    before.replay(&records[..cut]);
    let json = crate::durable::encode_snapshot(&before.state().snapshot(cut as u64, 0)).unwrap();
    let mut after = reactor();
    after.restore(crate::durable::decode_snapshot(&json).unwrap());
    after.replay(&records[cut..]);
    after.sanity_check().unwrap();
    if let Err(e) = same(run.live.state(), after.state()) {
        panic!("snapshot at record {cut} plus the rest differs: {e}");
    }
    restarted_at(&records[..cut], run.now);
}

/// A broker killed right after journal record `records.len()` and restarted (replay, then `Resume`): every
/// offer still unanswered is sent again for the same attempt, and no job that was offered or running gets a new
/// attempt number (a restart is the same broker: it does not let its own offers expire into second attempts).
fn restarted_at(records: &[Record], now: Millis) {
    let mut r = reactor();
    r.replay(records);
    let before: BTreeMap<JobId, (JobPhase, u32)> = r
        .state()
        .jobs()
        .iter()
        .filter(|(_, j)| matches!(j.phase, JobPhase::Offered | JobPhase::Running))
        .map(|(id, j)| (id.clone(), (j.phase, j.attempt)))
        .collect();
    r.take_outbox();
    let _ = r.step(now, Event::Resume);
    let resent: BTreeMap<JobId, u32> = r
        .take_outbox()
        .into_iter()
        .filter_map(|c| match c {
            Command::Offer(o) => Some((o.job, o.attempt)),
            _ => None,
        })
        .collect();
    let at = records.len();
    for (id, (phase, attempt)) in &before {
        let j = &r.state().jobs()[id];
        assert_eq!(
            j.attempt, *attempt,
            "{id}: attempt {attempt} became {} on a restart at record {at}",
            j.attempt
        );
        if *phase == JobPhase::Offered {
            assert_eq!(
                resent.get(id),
                Some(attempt),
                "{id}: its unanswered offer of attempt {attempt} was not sent again after a restart at record {at}"
            );
        }
    }
    for (id, attempt) in &resent {
        assert_eq!(
            before.get(id),
            Some(&(JobPhase::Offered, *attempt)),
            "{id}: attempt {attempt} offered on a restart at record {at} was not an unanswered offer"
        );
    }
}

/// Sequences per run: `MERIDIAN_SEQUENCES` (default 10,000).
fn cases() -> u32 {
    std::env::var("MERIDIAN_SEQUENCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_event_sequences_keep_the_invariants_and_replay_to_the_live_state(
        actions in prop::collection::vec(action(), 1..100),
        cut in any::<usize>(),
    ) {
        play(&actions, cut);
    }
}

/// A plain submission of the regression tests: `tenant`'s job of `replicas` × `gpus`, its key `key`.
fn plain_submission(tenant: usize, gpus: u32, replicas: u32, key: u8) -> Action {
    Action::Submit(Submission {
        tenant,
        gpus,
        milli: None,
        replicas,
        policy: 0,
        max_wait_s: 0,
        checkpointable: false,
        service: false,
        spot: false,
        priority: None,
        deadline_h: None,
        key,
    })
}

/// Found by the random sequences: a preemption in the middle of a pass frees capacity; groups passed over
/// earlier get another look, but only at their jobs after the one that preempted (a pass that tries every job
/// had already tried the earlier ones while they were blocked).
#[test]
fn a_group_passed_over_is_looked_at_again_only_past_the_job_that_freed_capacity() {
    let s = plain_submission;
    let ad = |site, used| Action::Advert {
        site,
        used,
        drain: false,
    };
    let actions = vec![
        ad(0, 0),
        s(1, 1, 1, 0),
        s(1, 2, 2, 1),
        ad(0, 0),
        ad(0, 0),
        s(2, 1, 1, 0),
        Action::Answer {
            pick: 3,
            accept: true,
        },
        Action::Status {
            pick: 0,
            kind: 0,
            runtime_s: 0,
            stale: false,
        },
        ad(0, 0),
        s(0, 2, 1, 0),
        Action::Advance { ms: 10001 },
        s(0, 3, 1, 1),
        s(0, 3, 1, 2),
        ad(3, 1),
        ad(0, 0),
        Action::Status {
            pick: 0,
            kind: 1,
            runtime_s: 1,
            stale: false,
        },
        ad(0, 0),
        Action::Tenancy { which: 0 },
        Action::Advance { ms: 1169 },
        Action::Advance { ms: 2796 },
        Action::Advance { ms: 1036 },
    ];
    play(&actions, 0);
}

/// Found by the random sequences: a spot job and an on-demand job of the same shape were one group, so the spot
/// one, blocked (no owned pool sells spot), held back the other from an owned site with room.
#[test]
fn a_spot_job_that_cannot_start_holds_back_no_on_demand_job_of_its_shape() {
    let s = |spot, key| {
        Action::Submit(Submission {
            tenant: 0,
            gpus: 1,
            milli: None,
            replicas: 2,
            policy: 0,
            max_wait_s: 0,
            checkpointable: false,
            service: false,
            spot,
            priority: None,
            deadline_h: None,
            key,
        })
    };
    let actions = vec![
        s(true, 4),
        s(false, 0),
        Action::Advance { ms: 10_001 },
        Action::Advert {
            site: 0,
            used: 0,
            drain: false,
        },
    ];
    play(&actions, 0);
}

/// Found by the random sequences: when a site is lost, the head of team-b's group is found to fit nowhere and
/// set aside, and the pass passed over the rest of the group; the job behind it kept its stale mark (filed as
/// waiting, its demand on team-b's quota), which held team-a's preempted job back from borrowing once the site
/// came back. A pass that tries every job had set both aside. (The sequence as the random run shrank it.)
#[test]
fn a_stale_mark_behind_a_group_s_head_is_settled_in_the_same_pass() {
    let s = plain_submission;
    let cloud = Action::Advert {
        site: 3,
        used: 0,
        drain: false,
    };
    let actions = vec![
        Action::Tenancy { which: 0 },
        s(1, 2, 1, 0),
        s(0, 2, 2, 0),
        Action::Drain { site: 3, on: true },
        Action::Advance { ms: 10_001 },
        cloud.clone(),
        s(0, 1, 1, 1),
        Action::Drain { site: 3, on: false },
        s(1, 2, 1, 1),
        Action::Advance { ms: 10_001 },
        cloud,
    ];
    play(&actions, 0);
}
