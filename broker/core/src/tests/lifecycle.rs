//! The job lifecycle through the reactor: offers, refusals, timeouts, lost sites, cancels, scale-in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

#[test]
fn submit_offer_accept_run_succeed() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 2));
    let offers = env.take_offers();
    assert_eq!(offers.len(), 1);
    assert_eq!(env.phase(&id), JobPhase::Offered);
    env.answer(&offers[0], OfferOutcome::Accepted);
    env.status(&offers[0], AttemptState::Running, 0);
    assert_eq!(env.phase(&id), JobPhase::Running);
    env.status(
        &offers[0],
        AttemptState::Succeeded { exit_code: 0 },
        3_600_000,
    );
    let job = &env.reactor.state().jobs[&id];
    assert_eq!(job.phase, JobPhase::Succeeded);
    assert!(job.metered.cost_micro_usd > 0);
    // A repeated status changes nothing.
    env.status(
        &offers[0],
        AttemptState::Succeeded { exit_code: 0 },
        3_600_000,
    );
    assert_eq!(
        env.reactor.state().jobs[&id].metered,
        job_metered(&env, &id)
    );
}

#[test]
fn a_spot_job_runs_only_where_spot_is_sold_and_is_metered_at_the_spot_price() {
    let mut env = TestEnv::new(vec![
        site("cheap-on-demand", Tier::Cloud, 40.0, -75.0)
            .gpus("A100", 4, 1.0)
            .build(),
        site("spot-seller", Tier::Cloud, 40.0, -76.0)
            .gpus("A100", 4, 3.0)
            .spot(0.5)
            .build(),
    ]);
    // A journal in a format before spot refuses a spot job, naming the way out.
    env.reactor.replay_batches(&[crate::durable::Batch {
        format: crate::reactor::SPOT_FORMAT - 1,
        leader: "old".into(),
        n: 1,
        records: vec![],
        quarantine: vec![],
    }]);
    let mut spec = job("spot-1", 1);
    spec.spot = true;
    let e = env
        .reactor
        .step(env.now, Event::Submit(spec.clone()))
        .unwrap_err();
    assert!(e.to_string().contains("upgrade-format"), "{e}");
    env.step(Event::UpgradeFormat {
        to: crate::reactor::SPOT_FORMAT,
    });
    let id = env.submit(spec);
    let offers = env.take_offers();
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].site.as_str(), "spot-seller");
    assert!(
        offers[0].spec.spot,
        "the agent is told the attempt is on spot"
    );
    env.answer(&offers[0], OfferOutcome::Accepted);
    env.status(&offers[0], AttemptState::Running, 0);
    env.status(
        &offers[0],
        AttemptState::Succeeded { exit_code: 0 },
        3_600_000,
    );
    // One device for an hour at 0.50 USD, not the pool's 3.00 on-demand.
    assert_eq!(job_metered(&env, &id).cost_micro_usd, 500_000);
    // With no pool selling spot, a spot job waits and says why.
    let mut env = TestEnv::new(vec![site("only-on-demand", Tier::Cloud, 40.0, -75.0)
        .gpus("A100", 4, 1.0)
        .build()]);
    let mut spec = job("spot-2", 1);
    spec.spot = true;
    let id = env.submit(spec);
    assert!(env.take_offers().is_empty());
    assert_eq!(env.phase(&id), JobPhase::Pending);
}

pub(super) fn job_metered(env: &TestEnv, id: &JobId) -> Amounts {
    env.reactor.state().jobs[id].metered
}

#[test]
fn a_refusal_moves_the_job_to_the_next_site() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let first = env.take_offers().remove(0);
    env.answer(
        &first,
        OfferOutcome::Rejected {
            reason: "devices busy".into(),
        },
    );
    let second = env.take_offers().remove(0);
    assert_ne!(second.site, first.site);
    assert_eq!(second.attempt, first.attempt + 1);
    assert_eq!(env.phase(&id), JobPhase::Offered);
}

#[test]
fn an_unanswered_offer_times_out_and_is_withdrawn() {
    let mut env = TestEnv::new(trio());
    env.submit(job("k1", 1));
    let first = env.take_offers().remove(0);
    for s in ["a-cheap", "b-green", "c-frankfurt"] {
        env.heartbeat(s);
    }
    env.advance(6_000);
    let second = env.take_offers().remove(0);
    assert_ne!(second.site, first.site);
    assert!(env
        .sent
        .iter()
        .any(|c| matches!(c, Command::Cancel { site, .. } if *site == first.site)));
    // The late acceptance of the first offer is answered with a cancel.
    env.sent.clear();
    env.answer(&first, OfferOutcome::Accepted);
    assert!(matches!(&env.sent[..], [Command::Cancel { site, .. }] if *site == first.site));
}

#[test]
fn a_lost_site_requeues_its_jobs_elsewhere() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let first = env.take_offers().remove(0);
    env.answer(&first, OfferOutcome::Accepted);
    // Every site but the job's keeps beating.
    for _ in 0..12 {
        for s in ["a-cheap", "b-green", "c-frankfurt"] {
            if s != first.site.as_str() {
                env.heartbeat(s);
            }
        }
        env.advance(1_000);
    }
    assert!(!env.reactor.state().sites[&first.site].up);
    let second = env.take_offers().remove(0);
    assert_ne!(second.site, first.site);
    assert_eq!(env.phase(&id), JobPhase::Offered);
    // When the lost site returns and still reports the old attempt, it is told to stop it.
    env.sent.clear();
    env.status(&first, AttemptState::Running, 1);
    assert!(
        matches!(&env.sent[..], [Command::Cancel { cancel, .. }] if cancel.attempt == first.attempt)
    );
}

#[test]
fn an_interrupted_attempt_is_requeued_to_another_site() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let first = env.take_offers().remove(0);
    env.answer(&first, OfferOutcome::Accepted);
    env.status(
        &first,
        AttemptState::Interrupted {
            reason: "agent restarted".into(),
        },
        500,
    );
    let second = env.take_offers().remove(0);
    assert_ne!(second.site, first.site);
    assert_eq!(second.attempt, first.attempt + 1);
    assert_eq!(env.reactor.state().jobs[&id].runtime_ms, 500);
}

#[test]
fn cancel_pending_and_running_jobs() {
    let mut env = TestEnv::new(vec![site("s", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 1, 1.0)
        .build()]);
    let a = env.submit(job("a", 1));
    let b = env.submit(job("b", 1));
    assert_eq!(env.phase(&b), JobPhase::Pending);
    env.step(Event::Cancel(b.clone()));
    assert_eq!(env.phase(&b), JobPhase::Cancelled);
    let offer = env.take_offers().remove(0);
    env.answer(&offer, OfferOutcome::Accepted);
    env.step(Event::Cancel(a.clone()));
    assert_eq!(env.phase(&a), JobPhase::Cancelling);
    env.status(
        &offer,
        AttemptState::Cancelled {
            reason: "user".into(),
        },
        10,
    );
    assert_eq!(env.phase(&a), JobPhase::Cancelled);
}

#[test]
fn scale_in_gives_back_cloud_replicas_first() {
    let mut env = TestEnv::new(vec![
        site("owned", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 2, 1.0)
            .build(),
        site("cloud-cheap", Tier::Cloud, 0.0, 0.0)
            .gpus("A100", 2, 3.0)
            .build(),
        site("cloud-dear", Tier::Cloud, 0.0, 0.0)
            .gpus("A100", 2, 5.0)
            .build(),
    ]);
    let mut ids = Vec::new();
    for i in 0..7 {
        let mut spec = job(&format!("r{i}"), 1);
        spec.kind = JobKind::Inference;
        spec.service = Some("chat".into());
        spec.policy = Some(Policy::Cost);
        ids.push(env.submit(spec));
    }
    for offer in env.take_offers() {
        env.answer(&offer, OfferOutcome::Accepted);
    }
    // Two on the owned site, two on each cloud site, one pending.
    let site_of = |env: &TestEnv, id: &JobId| {
        env.reactor.state().jobs[id]
            .assignment
            .as_ref()
            .map(|a| a.site.to_string())
    };
    assert_eq!(env.phase(&ids[6]), JobPhase::Pending);
    let tenant = TenantId::new("team-a").unwrap();
    let order: Vec<Option<String>> = env
        .reactor
        .scale_in_order(&tenant, &"chat".into())
        .iter()
        .map(|id| site_of(&env, id))
        .collect();
    let expect = [
        None,
        Some("cloud-dear"),
        Some("cloud-dear"),
        Some("cloud-cheap"),
        Some("cloud-cheap"),
        Some("owned"),
        Some("owned"),
    ];
    assert_eq!(order, expect.map(|s| s.map(str::to_owned)));
    match env.step(Event::ScaleIn {
        tenant,
        service: "chat".into(),
        remove: 3,
    }) {
        Response::Stopping(stopped) => {
            assert_eq!(stopped.len(), 3);
            assert_eq!(env.phase(&stopped[0]), JobPhase::Cancelled);
            assert!(stopped[1..]
                .iter()
                .all(|id| env.phase(id) == JobPhase::Cancelling));
        }
        other => panic!("{other:?}"),
    }
    let cancels = env
        .sent
        .iter()
        .filter(|c| matches!(c, Command::Cancel { site, .. } if site.as_str() == "cloud-dear"))
        .count();
    assert_eq!(cancels, 2);
}

#[test]
fn resubmission_with_the_same_key_returns_the_first_job() {
    let mut env = TestEnv::new(trio());
    let first = env.submit(job("same", 1));
    match env.step(Event::Submit(job("same", 1))) {
        Response::Submitted(r) => {
            assert_eq!(r.job, first);
            assert!(!r.created);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(env.reactor.state().jobs.len(), 1);
    let err = env
        .reactor
        .step(env.now, Event::Submit(job("same", 2)))
        .expect_err("different spec");
    assert_eq!(err.code(), ErrorCode::Conflict);
}

#[test]
fn drained_sites_get_no_new_work() {
    let mut env = TestEnv::new(trio());
    env.step(Event::Drain {
        site: SiteId::new("a-cheap").unwrap_or_else(|e| panic!("{e}")),
        drain: true,
    });
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    env.submit(spec);
    assert_ne!(env.take_offers()[0].site.as_str(), "a-cheap");
}

#[test]
fn waiting_jobs_start_when_capacity_frees() {
    let mut env = TestEnv::new(vec![site("s", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 1, 1.0)
        .build()]);
    env.submit(job("a", 1));
    let b = env.submit(job("b", 1));
    let a_offer = env.take_offers().remove(0);
    env.answer(&a_offer, OfferOutcome::Accepted);
    assert!(
        env.reactor.state().jobs[&b].why.contains("busy"),
        "{}",
        env.reactor.state().jobs[&b].why
    );
    env.status(&a_offer, AttemptState::Succeeded { exit_code: 0 }, 5);
    env.heartbeat("s");
    env.advance(100);
    assert_eq!(env.take_offers().len(), 1);
    assert_eq!(env.phase(&b), JobPhase::Offered);
}

#[test]
fn unknown_residency_is_refused_before_the_journal() {
    let mut env = TestEnv::new(trio());
    let before = env.reactor.journal().records.len();
    let mut spec = job("k", 1);
    spec.constraints.residency = Some("mars".into());
    let err = env
        .reactor
        .step(env.now, Event::Submit(spec))
        .expect_err("unknown region");
    assert_eq!(err.field().as_deref(), Some("constraints.residency"));
    assert_eq!(env.reactor.journal().records.len(), before);
}

fn inventory(epoch: u64, seq: u64, attempts: Vec<AttemptRef>, list: bool) -> Inventory {
    Inventory {
        mark: InventoryMark { epoch, seq },
        count: attempts.len() as u32,
        digest: inventory_digest(&attempts),
        attempts: list.then_some(attempts),
    }
}

fn heartbeat_with(env: &mut TestEnv, site: &str, inv: Inventory) {
    env.step(Event::Heartbeat(Heartbeat {
        v: 1,
        site: SiteId::new(site).unwrap(),
        seq: 0,
        sent_at_ms: env.now,
        generation: 1,
        running: vec![],
        inventory: Some(inv),
    }));
}

/// An agent that restarted without a job it had accepted says so in its inventory: the broker ends that
/// attempt (metered for the time it ran) and runs the job again; an inventory from before the acceptance, or
/// one that still lists it, changes nothing.
#[test]
fn an_attempt_the_site_no_longer_has_is_ended_and_its_job_requeued() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("lost", 1));
    let offer = env.take_offers().remove(0);
    let site = offer.site.to_string();
    env.step(Event::OfferAnswer {
        site: offer.site.clone(),
        job: offer.job.clone(),
        attempt: offer.attempt,
        outcome: OfferOutcome::Accepted,
        mark: Some(InventoryMark { epoch: 1, seq: 5 }),
    });
    let held = vec![AttemptRef {
        job: id.clone(),
        attempt: 1,
    }];
    // Older than the acceptance, or listing it: nothing happens.
    heartbeat_with(&mut env, &site, inventory(1, 4, vec![], true));
    heartbeat_with(&mut env, &site, inventory(1, 6, held.clone(), true));
    assert_eq!(env.phase(&id), JobPhase::Running);
    // Only a digest that matches: nothing either, and nothing asked.
    heartbeat_with(&mut env, &site, inventory(1, 7, held, false));
    assert!(env
        .sent
        .iter()
        .all(|c| !matches!(c, Command::AskInventory { .. })));
    // A digest that differs: the broker asks for the list.
    heartbeat_with(&mut env, &site, inventory(2, 0, vec![], false));
    assert!(env
        .sent
        .iter()
        .any(|c| matches!(c, Command::AskInventory { site: s } if s.as_str() == site)));
    assert_eq!(env.phase(&id), JobPhase::Running);
    // The list, from after a restart, without the attempt: it is over, and the job runs again.
    env.now += 60_000;
    env.step(Event::Inventory {
        site: SiteId::new(&site).unwrap(),
        inventory: inventory(2, 0, vec![], true),
    });
    let j = &env.reactor.state().jobs()[&id];
    assert_eq!(j.runs[0].runtime_ms, 60_000, "metered for the time it ran");
    assert!(j
        .history
        .iter()
        .any(|(_, w)| w.contains("no longer has attempt 1")));
    assert_eq!(j.attempt, 2, "offered again");
    assert!(env
        .take_offers()
        .iter()
        .any(|o| o.job == id && o.attempt == 2));
}

#[test]
fn observations_are_recorded_only_when_asked_and_say_what_the_steps_did() {
    use crate::observe::{Answer, Observation};
    let mut env = TestEnv::new(trio());
    env.submit(job("quiet", 1));
    assert!(
        env.reactor.take_observations().is_empty(),
        "a reactor not asked to observe records nothing (replay, the simulator)"
    );
    env.reactor.observe();
    env.now += 2_000;
    let id = env.submit(job("k1", 2));
    let first = env.take_offers().into_iter().find(|o| o.job == id).unwrap();
    env.answer(
        &first,
        OfferOutcome::Rejected {
            reason: "devices busy".into(),
        },
    );
    let second = env.take_offers().remove(0);
    env.answer(&second, OfferOutcome::Accepted);
    env.status(&second, AttemptState::Succeeded { exit_code: 0 }, 3_600_000);
    let seen = env.reactor.take_observations();
    let placed: Vec<_> = seen
        .iter()
        .filter_map(|o| match o {
            Observation::Placed { policy, .. } => Some(policy.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(placed, vec!["balanced", "balanced"], "{seen:?}");
    assert!(seen.iter().any(
        |o| matches!(o, Observation::Answered { answer: Answer::Refused, job, .. } if *job == id)
    ));
    assert!(seen.iter().any(
        |o| matches!(o, Observation::Answered { answer: Answer::Accepted, job, .. } if *job == id)
    ));
    let metered = job_metered(&env, &id);
    assert!(
        seen.iter().any(
            |o| matches!(o, Observation::Metered { amounts, device_ms, .. }
            if *amounts == metered && *device_ms == 2 * 3_600_000)
        ),
        "{seen:?}"
    );
    assert!(env.reactor.take_observations().is_empty(), "taken once");
}

#[test]
fn a_timeline_tells_a_jobs_life_in_order_with_its_attempts_and_candidates() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let first = env.take_offers().remove(0);
    env.now += 1_000;
    env.answer(
        &first,
        OfferOutcome::Rejected {
            reason: "devices busy".into(),
        },
    );
    let second = env.take_offers().remove(0);
    env.now += 1_000;
    env.answer(&second, OfferOutcome::Accepted);
    env.status(&second, AttemptState::Running, 0);
    env.now += 5_000;
    env.status(
        &second,
        AttemptState::Failed {
            exit_code: Some(3),
            reason: "exit code 3".into(),
        },
        5_000,
    );
    let t = crate::views::timeline(&env.reactor.state().jobs[&id]);
    let kinds: Vec<&str> = t.events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"submitted"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"finished"), "{kinds:?}");
    assert!(
        t.events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms),
        "in time order"
    );
    let offered: Vec<_> = t
        .events
        .iter()
        .filter(|e| e.event == "offered")
        .map(|e| (e.attempt, e.site.clone()))
        .collect();
    assert_eq!(
        offered,
        vec![
            (Some(first.attempt), Some(first.site.clone())),
            (Some(second.attempt), Some(second.site.clone()))
        ]
    );
    assert!(
        t.events
            .iter()
            .any(|e| e.event == "note" && e.detail.contains("devices busy")),
        "the refusal is told: {:?}",
        t.events
    );
    let finished = t.events.last().unwrap();
    assert!(finished.detail.contains("exit code 3"), "{finished:?}");
    assert_eq!(finished.site.as_ref(), Some(&second.site));
    assert_eq!(t.exit_code, Some(3));
    assert_eq!(t.attempts.len(), 2);
    assert!(t.attempts[1].metered && t.attempts[1].runtime_ms == 5_000);
    assert!(!t.attempts[0].metered, "the refused attempt never ran");
    assert!(!t.candidates.is_empty() && t.candidates.len() <= crate::views::TIMELINE_CANDIDATES);
    assert!(t.candidates[0].chosen, "the chosen candidate comes first");
    // Offers and acceptances are told once, as structured events, not again as notes.
    assert!(!t
        .events
        .iter()
        .any(|e| e.event == "note" && e.detail.contains(" offered to ")));
}

#[test]
fn a_run_reported_before_the_offers_answer_counts_as_its_acceptance_once() {
    use crate::observe::{Answer, Observation};
    let mut env = TestEnv::new(trio());
    env.reactor.observe();
    let id = env.submit(job("k1", 1));
    let offer = env.take_offers().remove(0);
    env.status(&offer, AttemptState::Running, 0);
    env.answer(&offer, OfferOutcome::Accepted);
    let accepted = env
        .reactor
        .take_observations()
        .into_iter()
        .filter(|o| matches!(o, Observation::Answered { answer: Answer::Accepted, job, .. } if *job == id))
        .count();
    assert_eq!(accepted, 1);
    assert_eq!(env.phase(&id), JobPhase::Running);
}

pub(super) fn service_spec(name: &str) -> meridian_federation::ServiceSpec {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "tenant": "team-a",
        "resources": {"kind": "gpu", "count": 1},
        "throughput": {"requests_per_s": 2.0},
        "slo_ms": 50,
        "max_replicas": 4,
        "run": {"command": "serve"}
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A service is journaled state from format 5: deployed, kept through a snapshot, and deleted with its
/// replicas stopped; a journal in format 4 refuses it with the way out.
#[test]
fn a_service_is_kept_through_a_snapshot_and_deleting_it_stops_its_replicas() {
    let mut env = TestEnv::new(vec![site("dc", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 4, 1.0)
        .build()]);
    env.reactor.replay_batches(&[crate::durable::Batch {
        format: 4,
        leader: "old".into(),
        n: 1,
        records: vec![],
        quarantine: vec![],
    }]);
    let spec = service_spec("chat");
    let e = env
        .reactor
        .step(env.now, Event::ServiceDeployed(spec.clone()))
        .unwrap_err();
    assert!(e.to_string().contains("upgrade-format"), "{e}");
    env.step(Event::UpgradeFormat { to: 5 });
    env.step(Event::ServiceDeployed(spec.clone()));
    let key = (spec.tenant.clone(), spec.name.clone());
    assert_eq!(env.reactor.state().services().get(&key), Some(&spec));
    let replicas: Vec<JobId> = (0..3).map(|i| env.submit(spec.replica_spec(i))).collect();
    for offer in env.take_offers() {
        env.answer(&offer, OfferOutcome::Accepted);
    }
    // Through a snapshot.
    let text = serde_json::to_string(&env.reactor.state().snapshot(0, env.now))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut again = crate::reactor::Reactor::new(
        crate::reactor::CoreConfig::default(),
        crate::latency::RttTable::default(),
        crate::testkit::regions(),
        crate::journal::MemoryJournal::default(),
    );
    again.restore(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(again.state().services(), env.reactor.state().services());
    // Deleted: every replica stops; a second delete finds nothing.
    let stopped = match env.step(Event::ServiceDeleted {
        tenant: spec.tenant.clone(),
        service: spec.name.clone(),
    }) {
        Response::Stopping(v) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(stopped.len(), replicas.len());
    assert!(env.reactor.state().services().is_empty());
    let e = env
        .reactor
        .step(
            env.now,
            Event::ServiceDeleted {
                tenant: spec.tenant.clone(),
                service: spec.name.clone(),
            },
        )
        .unwrap_err();
    assert!(
        matches!(e, crate::reactor::StepError::NotFound { .. }),
        "{e}"
    );
    // A spec that does not validate is refused before it is journaled.
    let mut bad = service_spec("bad");
    bad.slo_ms = 0.0;
    let e = env
        .reactor
        .step(env.now, Event::ServiceDeployed(bad))
        .unwrap_err();
    assert!(e.to_string().contains("slo_ms"), "{e}");
}

/// Lost sites are found at exactly the ticks a scan of every site would find them, though a tick scans only
/// once one may be due: random heartbeats, ticks, re-adverts of lost sites and a clock that sometimes steps
/// back, against a model of each site's last heartbeat.
#[test]
fn lost_sites_are_found_at_the_tick_a_full_scan_would_find_them() {
    let timeout = crate::reactor::CoreConfig::default().site_lost_after_ms;
    let ids: Vec<String> = (0..12).map(|i| format!("s{i:02}")).collect();
    let advert = |id: &str| {
        site(id, Tier::Owned, 50.0, 8.0)
            .gpus("A100", 4, 2.0)
            .build()
    };
    let mut env = TestEnv::new(ids.iter().map(|id| advert(id)).collect());
    // (up, last seen) as a full scan sees them.
    let mut model: Vec<(bool, u64)> = vec![(true, env.now); ids.len()];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut lost_seen = 0;
    for _ in 0..5_000 {
        let r = next();
        let i = (r >> 8) as usize % ids.len();
        match r % 10 {
            0..=4 => {
                env.heartbeat(&ids[i]);
                if model[i].0 {
                    model[i].1 = env.now;
                }
            }
            5 => {
                if !model[i].0 {
                    env.step(Event::Advert(advert(&ids[i])));
                    model[i] = (true, env.now);
                }
            }
            6 => env.now = env.now.saturating_sub(next() % timeout),
            _ => {
                env.advance(next() % (timeout / 2));
                for m in model.iter_mut() {
                    if m.0 && env.now.saturating_sub(m.1) > timeout {
                        m.0 = false;
                        lost_seen += 1;
                    }
                }
            }
        }
        for (id, m) in ids.iter().zip(&model) {
            let s = &env.reactor.state().sites()[&SiteId::new(id.as_str()).unwrap()];
            assert_eq!(s.up, m.0, "site {id} at {}", env.now);
        }
    }
    assert!(lost_seen > 50, "the run lost sites {lost_seen} times");
}

/// Adverts are sent on change: a heartbeat naming a generation the broker holds no advert of means that one
/// was lost, and the site is asked for it, at most every few seconds however many heartbeats say so; once the
/// advert is in, nothing more is asked.
#[test]
fn a_heartbeat_of_an_unknown_generation_asks_the_site_for_its_advert() {
    let mut env = TestEnv::new(trio());
    let asked = |env: &TestEnv| {
        env.sent
            .iter()
            .filter(|c| matches!(c, Command::AskAdvert { site } if site.as_str() == "a-cheap"))
            .count()
    };
    let beat = |env: &mut TestEnv, generation: u64| {
        env.step(Event::Heartbeat(Heartbeat {
            v: 1,
            site: SiteId::new("a-cheap").unwrap(),
            seq: 0,
            sent_at_ms: env.now,
            generation,
            running: vec![],
            inventory: None,
        }));
    };
    beat(&mut env, 1);
    assert_eq!(asked(&env), 0, "the generation it holds: nothing to ask");
    beat(&mut env, 2);
    assert_eq!(asked(&env), 1);
    env.now += 1_000;
    beat(&mut env, 2);
    assert_eq!(asked(&env), 1, "asked again only after a while");
    env.now += crate::reactor::ASK_EVERY_MS;
    beat(&mut env, 2);
    assert_eq!(asked(&env), 2);
    let mut advert = trio().remove(0);
    advert.generation = 2;
    env.step(Event::Advert(advert));
    env.now += 2 * crate::reactor::ASK_EVERY_MS;
    beat(&mut env, 2);
    assert_eq!(asked(&env), 2, "the advert came: nothing more is asked");
    assert!(env
        .sent
        .iter()
        .all(|c| !matches!(c, Command::AskAdvert { site } if site.as_str() != "a-cheap")));
}
