//! The journal: replay and snapshots rebuild the same state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::journal::MemoryJournal;
use crate::reactor::{CoreConfig, Reactor};

/// Six jobs submitted, one run to the end, one refused, then a site loss: a journal with some of everything.
pub(super) fn journaled_scenario() -> TestEnv {
    let mut env = TestEnv::new(trio());
    for i in 0..6 {
        env.submit(job(&format!("k{i}"), 3));
    }
    let offers = env.take_offers();
    env.answer(&offers[0], OfferOutcome::Accepted);
    env.answer(
        &offers[1],
        OfferOutcome::Rejected {
            reason: "no".into(),
        },
    );
    env.status(&offers[0], AttemptState::Succeeded { exit_code: 0 }, 1000);
    env.advance(20_000);
    env
}

#[test]
fn replaying_the_journal_rebuilds_the_same_state() {
    let env = journaled_scenario();
    let mut fresh = crate::reactor::Reactor::new(
        env.reactor.config().clone(),
        RttTable::default(),
        regions(),
        crate::journal::MemoryJournal::default(),
    );
    fresh.replay(&env.reactor.journal().records);
    assert_eq!(fresh.state().jobs, env.reactor.state().jobs);
    assert_eq!(fresh.state().sites, env.reactor.state().sites);
}

#[test]
fn a_snapshot_plus_the_records_after_it_rebuilds_the_same_state_from_any_point() {
    let env = journaled_scenario();
    let records = &env.reactor.journal().records;
    let fresh = || {
        crate::reactor::Reactor::new(
            env.reactor.config().clone(),
            RttTable::default(),
            regions(),
            crate::journal::MemoryJournal::default(),
        )
    };
    let mut whole = fresh();
    whole.replay(records);
    let want = whole.state().snapshot(records.len() as u64, 0);
    for cut in 0..=records.len() {
        let mut before = fresh();
        before.replay(&records[..cut]);
        let json = serde_json::to_vec(&before.state().snapshot(cut as u64, 0)).unwrap();
        let snap: crate::snapshot::Snapshot = serde_json::from_slice(&json).unwrap();
        let mut after = fresh();
        after.restore(snap);
        after.replay(&records[cut..]);
        assert_eq!(
            after.state().snapshot(records.len() as u64, 0),
            want,
            "restored at record {cut}"
        );
        after.sanity_check().unwrap();
    }
}

#[test]
fn after_a_resume_an_unanswered_offer_gets_its_full_timeout_again() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k", 1));
    let offers = env.take_offers();
    assert_eq!(offers.len(), 1);
    // The broker was blind for longer than the offer timeout (a takeover, a stalled journal).
    env.now += env.reactor.config().offer_timeout_ms + 1_000;
    env.step(Event::Resume);
    // The offer is sent again, for the same attempt: the first may never have left.
    assert_eq!(env.take_offers(), offers, "the same offer again");
    env.advance(10);
    assert_eq!(
        env.phase(&id),
        JobPhase::Offered,
        "the answer may still be on its way"
    );
    assert!(env.take_offers().is_empty(), "sent again once");
    // The agent's answer, heard late, is taken.
    env.answer(&offers[0], OfferOutcome::Accepted);
    env.status(&offers[0], AttemptState::Running, 0);
    assert_eq!(env.phase(&id), JobPhase::Running);
    assert_eq!(env.reactor.state().jobs[&id].attempt, 1);
    // Without the resume, the same wait times the offer out.
    let mut other = TestEnv::new(trio());
    let id = other.submit(job("k", 1));
    other.take_offers();
    other.now += other.reactor.config().offer_timeout_ms + 1_000;
    for s in ["a-cheap", "b-green", "c-frankfurt"] {
        other.heartbeat(s);
    }
    other.advance(10);
    assert_eq!(
        other.reactor.state().jobs[&id].attempt,
        2,
        "timed out and offered again elsewhere"
    );
}

/// Whether capacity changed since waiting jobs were last tried is part of a snapshot: restored without it,
/// the next tick retried every waiting job at a moment the live broker did not, and the two diverged.
#[test]
fn a_snapshot_keeps_whether_waiting_jobs_are_due_a_retry() {
    let mut env = TestEnv::new(trio());
    for i in 0..6 {
        env.submit(job(&format!("w{i}"), 8));
    }
    env.advance(1_000);
    let live = env.reactor.state().snapshot(0, env.now);
    assert!(!live.dirty, "the waiting jobs were just tried");
    let json = crate::durable::encode_snapshot(&live).unwrap();
    let back = crate::durable::decode_snapshot(&json).unwrap();
    assert!(!back.dirty);
    let mut restored = Reactor::new(
        CoreConfig::default(),
        RttTable::default(),
        regions(),
        MemoryJournal::default(),
    );
    restored.restore(back);
    restored.step(env.now + 1, Event::Tick).unwrap();
    assert!(
        restored.journal().records.is_empty(),
        "a tick with nothing due is not journaled after a restore either"
    );
}

/// Snapshots before spot hold no spot prices. A broker restored from one takes them from each site's next
/// advert, though it repeats the generation the snapshot knew; once known, a repeat is not journaled again.
#[test]
fn a_site_restored_without_its_spot_prices_takes_them_from_its_next_advert() {
    let advert = site("spot-seller", Tier::Cloud, 40.0, -76.0)
        .gpus("A100", 4, 3.0)
        .spot(0.5)
        .build();
    let env = TestEnv::new(vec![advert.clone()]);
    let live = env.reactor.state().snapshot(0, env.now);
    let mut json: serde_json::Value = serde_json::to_value(&live).unwrap();
    json["format"] = serde_json::json!(crate::reactor::SPOT_FORMAT - 1);
    let pool = &mut json["sites"][0]["pools"][0];
    assert_eq!(pool["spot_price_micro_usd_per_hour"], 500_000);
    pool.as_object_mut()
        .unwrap()
        .remove("spot_price_micro_usd_per_hour");
    let old = crate::durable::decode_snapshot(&serde_json::to_vec(&json).unwrap()).unwrap();
    let mut restored = Reactor::new(
        CoreConfig::default(),
        RttTable::default(),
        regions(),
        MemoryJournal::default(),
    );
    restored.restore(old);
    let spot = |r: &Reactor<MemoryJournal>| {
        r.state().sites()[&SiteId::new("spot-seller").unwrap()].pools[0]
            .spot_price_micro_usd_per_hour
    };
    assert_eq!(spot(&restored), None);
    restored
        .step(env.now + 1, Event::Advert(advert.clone()))
        .unwrap();
    assert_eq!(spot(&restored), Some(500_000));
    let journaled = restored.journal().records.len();
    assert_eq!(journaled, 1, "the advert that brought the prices is kept");
    restored.step(env.now + 2, Event::Advert(advert)).unwrap();
    assert_eq!(restored.journal().records.len(), journaled);
}
