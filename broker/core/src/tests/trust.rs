//! The trust boundary in the core: a site speaks only of attempts it holds, a revoked site is cut off and its
//! work requeued, token records are checked and kept, and none of it works in a journal format that cannot
//! hold it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::access::{Grant, TokenRecord, Verb};
use crate::reactor::StepError;

fn status_from(offer: &Offer, site: &str, state: AttemptState, now: u64) -> Event {
    Event::Status(JobStatus {
        v: 1,
        job: offer.job.clone(),
        attempt: offer.attempt,
        site: SiteId::new(site).unwrap(),
        state,
        at_ms: now,
        started_at_ms: None,
        runtime_ms: Some(3_600_000),
        checkpoint: None,
        mark: None,
    })
}

#[test]
fn a_site_cannot_end_or_meter_an_attempt_another_site_holds() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let offer = env.take_offers().remove(0);
    env.answer(&offer, OfferOutcome::Accepted);
    env.status(&offer, AttemptState::Running, 0);
    let other = trio()
        .into_iter()
        .map(|a| a.site.id)
        .find(|s| s != &offer.site)
        .unwrap();
    let before = env.reactor.state().jobs()[&id].clone();
    let records = env.reactor.journal().records.len();
    for state in [
        AttemptState::Succeeded { exit_code: 0 },
        AttemptState::Failed {
            exit_code: Some(1),
            reason: "forged".into(),
        },
    ] {
        let forged = status_from(&offer, other.as_str(), state, env.now);
        let e = env.reactor.step(env.now, forged).unwrap_err();
        assert!(
            matches!(&e, StepError::Refused(m) if m.contains(&format!("which site {} holds", offer.site))),
            "{e}"
        );
        assert_eq!(e.code(), ErrorCode::Forbidden);
    }
    assert_eq!(env.reactor.state().jobs()[&id], before, "nothing changed");
    assert_eq!(
        env.reactor.journal().records.len(),
        records,
        "nothing journaled"
    );
    assert!(env.reactor.take_outbox().is_empty(), "nothing sent");
    // The holder's own word still counts.
    env.status(&offer, AttemptState::Succeeded { exit_code: 0 }, 60_000);
    assert_eq!(env.phase(&id), JobPhase::Succeeded);
}

/// A status about an attempt no site holds — of a job that is not live, or an attempt never offered — is
/// refused: nothing is journaled for it.
#[test]
fn a_status_about_an_attempt_nobody_holds_is_refused_and_journals_nothing() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let offer = env.take_offers().remove(0);
    env.answer(&offer, OfferOutcome::Accepted);
    let records = env.reactor.journal().records.len();
    let mut never_offered = offer.clone();
    never_offered.attempt += 5;
    let mut not_live = offer.clone();
    not_live.job = JobId::numbered(999);
    for o in [&never_offered, &not_live] {
        let e = env
            .reactor
            .step(
                env.now,
                status_from(o, offer.site.as_str(), AttemptState::Running, env.now),
            )
            .unwrap_err();
        assert!(
            matches!(&e, StepError::Refused(m) if m.contains("which no site holds")),
            "{e}"
        );
    }
    assert_eq!(env.reactor.journal().records.len(), records);
    assert!(env.reactor.take_outbox().is_empty(), "nothing sent");
    // The holder's word about its own attempt is taken.
    env.status(&offer, AttemptState::Running, 0);
    assert_eq!(env.phase(&id), JobPhase::Running);
}

#[test]
fn a_revoked_site_is_lost_at_once_and_nothing_it_says_is_taken() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k1", 1));
    let offer = env.take_offers().remove(0);
    env.answer(&offer, OfferOutcome::Accepted);
    env.status(&offer, AttemptState::Running, 0);
    env.sent.clear();
    env.step(Event::SiteRevoked {
        site: offer.site.clone(),
    });
    assert!(!env.reactor.state().sites()[&offer.site].up);
    // Before it is heard no more, it is told to stop what it was given.
    assert!(
        env.sent
            .iter()
            .any(|c| matches!(c, Command::Cancel { site, cancel }
            if *site == offer.site && cancel.job == id && cancel.attempt == offer.attempt)),
        "{:?}",
        env.sent
    );
    // Its job went elsewhere.
    let next = env.take_offers();
    assert!(next.iter().all(|o| o.site != offer.site), "{next:?}");
    assert_ne!(env.phase(&id), JobPhase::Running);
    let advert = trio()
        .into_iter()
        .find(|a| a.site.id == offer.site)
        .unwrap();
    let e = env
        .reactor
        .step(env.now, Event::Advert(advert.clone()))
        .unwrap_err();
    assert!(
        matches!(&e, StepError::Refused(m) if m.contains("revoked")),
        "{e}"
    );
    let e = env
        .reactor
        .step(
            env.now,
            status_from(
                &offer,
                offer.site.as_str(),
                AttemptState::Succeeded { exit_code: 0 },
                env.now,
            ),
        )
        .unwrap_err();
    assert!(matches!(e, StepError::Refused(_)));
    assert!(!env.reactor.state().sites()[&offer.site].up);
    // Restored (enrolled again), it is taken back.
    env.step(Event::SiteRestored {
        site: offer.site.clone(),
    });
    env.step(Event::Advert(advert));
    assert!(env.reactor.state().sites()[&offer.site].up);
}

fn token(id: &str) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        name: "ci".into(),
        hash: "ab".repeat(32),
        tenant: Some(TenantId::new("a").unwrap()),
        admin: false,
        grants: vec![Grant {
            verb: Verb::Submit,
            queues: vec![],
            services: vec![],
        }],
        created_ms: 1,
        expires_ms: u64::MAX,
        created_by: "admin".into(),
        revoked_ms: None,
    }
}

#[test]
fn tokens_are_kept_revoked_and_survive_a_snapshot() {
    let mut env = TestEnv::new(trio());
    // A journal still in format 2 cannot hold them: refused, with the way out.
    env.reactor.replay_batches(&[crate::durable::Batch {
        format: 2,
        leader: "old".into(),
        n: 1,
        records: vec![],
        quarantine: vec![],
    }]);
    let e = env
        .reactor
        .step(env.now, Event::TokenCreated(token("t1")))
        .unwrap_err();
    assert!(e.to_string().contains("upgrade-format"), "{e}");
    env.step(Event::UpgradeFormat { to: 3 });
    let generation = env.reactor.state().tokens_generation();
    env.step(Event::TokenCreated(token("t1")));
    assert!(env.reactor.state().tokens_generation() > generation);
    let e = env
        .reactor
        .step(env.now, Event::TokenCreated(token("t1")))
        .unwrap_err();
    assert!(matches!(e, StepError::Conflict(_)));
    let mut bad = token("t2");
    bad.grants.clear();
    assert!(matches!(
        env.reactor.step(env.now, Event::TokenCreated(bad)),
        Err(StepError::Invalid { .. })
    ));
    env.step(Event::TokenRevoked { id: "t1".into() });
    assert!(env.reactor.state().tokens()["t1"].revoked_ms.is_some());
    assert!(matches!(
        env.reactor
            .step(env.now, Event::TokenRevoked { id: "nope".into() }),
        Err(StepError::NotFound { .. })
    ));
    // Snapshot and replay keep them.
    let snap = env.reactor.state().snapshot(0, env.now);
    let json = serde_json::to_string(&snap).unwrap();
    let mut again = TestEnv::new(vec![]);
    again.reactor.restore(serde_json::from_str(&json).unwrap());
    assert_eq!(again.reactor.state().tokens(), env.reactor.state().tokens());
    let mut replayed = TestEnv::new(vec![]);
    replayed
        .reactor
        .replay(env.reactor.journal().records.iter());
    assert_eq!(
        replayed.reactor.state().tokens(),
        env.reactor.state().tokens()
    );
}

/// A job field no backend would honour is refused at submission, never ignored: a container image (no backend
/// runs one), a backend no release has. Nothing is journaled. A service's replicas are held to the same.
#[test]
fn a_job_field_no_backend_honours_is_refused_at_submission() {
    let mut env = TestEnv::new(trio());
    let records = env.reactor.journal().records.len();
    let mut with_image = job("image", 1);
    with_image.run.image = Some("nvcr.io/nvidia/pytorch:24.01".into());
    let mut unknown_backend = job("k8s", 1);
    unknown_backend.run.adapter = Some("kubernetes".into());
    for (spec, field) in [(with_image, "run.image"), (unknown_backend, "run.adapter")] {
        let e = env.reactor.step(env.now, Event::Submit(spec)).unwrap_err();
        assert!(
            matches!(&e, StepError::Invalid { field: f, .. } if f == field),
            "{e}"
        );
    }
    assert_eq!(env.reactor.journal().records.len(), records);
    let mut known = job("noop", 1);
    known.run.adapter = Some("noop".into());
    env.submit(known);
}
