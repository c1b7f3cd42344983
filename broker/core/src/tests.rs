//! Tests of placement choices, reactor scenarios and a brute-force oracle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::latency::RttTable;
use super::model::Site;
use super::placement::{place, Outcome, Reject, Request, View, Wait};
use super::reactor::{Command, Event, Response};
use super::testkit::*;
use meridian_federation::*;
use std::collections::BTreeMap;

fn sites(adverts: Vec<SiteAdvert>) -> BTreeMap<SiteId, Site> {
    adverts
        .iter()
        .map(|a| (a.site.id.clone(), Site::from_advert(a, 0)))
        .collect()
}

fn choose(adverts: Vec<SiteAdvert>, spec: &JobSpec, waited_ms: u64) -> Outcome {
    decide_on(&sites(adverts), spec, &Default::default(), None, waited_ms).outcome
}

fn choose_indexed(adverts: Vec<SiteAdvert>, spec: &JobSpec, waited_ms: u64) -> Outcome {
    let sites = sites(adverts);
    let mut index = crate::index::SiteIndex::default();
    for s in sites.values() {
        index.update(s, &Default::default());
    }
    decide_on(&sites, spec, &Default::default(), Some(&index), waited_ms).outcome
}

/// One decision over `sites`, with no measured round trips, the test regions, and this throughput and index.
fn decide_on(
    sites: &BTreeMap<SiteId, Site>,
    spec: &JobSpec,
    throughput: &super::throughput::Throughput,
    index: Option<&crate::index::SiteIndex>,
    waited_ms: u64,
) -> super::placement::Decision {
    let (rtt, regions) = (RttTable::default(), regions());
    let view = View {
        sites,
        rtt: &rtt,
        regions: &regions,
        throughput,
        index,
    };
    let request = Request {
        spec,
        waited_ms,
        refused: &[],
        capped: &[],
        baseline: None,
    };
    place(view, request, 0)
}

fn chosen_site(o: &Outcome) -> &str {
    match o {
        Outcome::Place(c) => c.site.as_str(),
        Outcome::Wait(w) => panic!("expected a placement, got wait: {w}"),
    }
}

/// Two owned sites: A cheap and dirty, B dear and clean, C far away and mid.
fn trio() -> Vec<SiteAdvert> {
    vec![
        site("a-cheap", Tier::Owned, 39.0, -77.5)
            .gpus("A100", 8, 1.0)
            .carbon(400)
            .build(),
        site("b-green", Tier::Owned, 45.6, -121.2)
            .gpus("H100", 8, 3.0)
            .carbon(50)
            .build(),
        site("c-frankfurt", Tier::Owned, 50.1, 8.7)
            .gpus("A100", 8, 2.0)
            .carbon(300)
            .build(),
    ]
}

#[test]
fn policies_pick_their_own_best() {
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    assert_eq!(chosen_site(&choose(trio(), &spec, 0)), "a-cheap");
    spec.policy = Some(Policy::Green);
    assert_eq!(chosen_site(&choose(trio(), &spec, 0)), "b-green");
    spec.policy = Some(Policy::Latency);
    spec.users = vec![UserLocation {
        name: None,
        location: GeoPoint {
            lat: 48.8,
            lon: 2.3,
        },
        weight: 1.0,
        rtt_region: None,
    }];
    assert_eq!(chosen_site(&choose(trio(), &spec, 0)), "c-frankfurt");
}

#[test]
fn faster_models_cost_less_per_job_under_the_throughput_table() {
    let adverts = vec![
        site("a100-site", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 4, 2.0)
            .build(),
        site("h100-site", Tier::Owned, 0.0, 0.0)
            .gpus("H100", 4, 4.0)
            .build(),
    ];
    let sites = sites(adverts);
    let mut throughput = super::throughput::Throughput::default();
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    let decide = |t: &super::throughput::Throughput| decide_on(&sites, &spec, t, None, 0).outcome;
    assert_eq!(chosen_site(&decide(&throughput)), "a100-site");
    throughput.insert("H100", 3.0);
    assert_eq!(chosen_site(&decide(&throughput)), "h100-site");
}

#[test]
fn a_deadline_rules_out_slow_hardware() {
    let adverts = vec![
        site("slow-cheap", Tier::Owned, 0.0, 0.0)
            .gpus("L4", 4, 0.5)
            .build(),
        site("fast-dear", Tier::Owned, 0.0, 0.0)
            .gpus("H100", 4, 4.0)
            .build(),
    ];
    let sites = sites(adverts);
    let mut t = super::throughput::Throughput::default();
    t.insert("L4", 0.4);
    t.insert("H100", 3.0);
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    spec.duration_s = Some(6 * 3600);
    let decide = |spec: &JobSpec| decide_on(&sites, spec, &t, None, 0);
    assert_eq!(chosen_site(&decide(&spec).outcome), "slow-cheap");
    // 6 reference hours take 15 h on the L4 and 2 h on the H100; a 10-hour deadline leaves only the H100.
    spec.window.deadline_ms = Some(10 * 3_600_000);
    let d = decide(&spec);
    assert_eq!(chosen_site(&d.outcome), "fast-dear");
    let slow = d
        .candidates
        .iter()
        .find(|c| c.site.as_str() == "slow-cheap")
        .unwrap();
    assert!(slow
        .reject
        .as_ref()
        .unwrap()
        .to_string()
        .contains("after the deadline"));
}

#[test]
fn a_start_window_holds_the_job_until_it_opens() {
    let mut env = TestEnv::new(trio());
    let mut spec = job("later", 1);
    spec.window.start_after_ms = Some(env.now + 30_000);
    let id = env.submit(spec);
    assert!(env.take_offers().is_empty());
    assert!(env.reactor.state.jobs[&id]
        .why
        .contains("start window opens"));
    for _ in 0..4 {
        for s in ["a-cheap", "b-green", "c-frankfurt"] {
            env.heartbeat(s);
        }
        env.advance(8_000);
    }
    assert_eq!(env.take_offers().len(), 1);
}

#[test]
fn deferrable_work_waits_for_a_cleaner_hour_only_while_the_deadline_holds() {
    const H: u64 = 3_600_000;
    let mut a = site("solar", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 4, 1.0)
        .carbon(400)
        .build();
    // Dirty now and for two hours, clean from the third hour on.
    a.site.carbon.forecast_start_ms = 0;
    a.site.carbon.forecast = vec![400, 400, 400, 100, 100, 100, 100, 100];
    let sites = sites(vec![a]);
    let t = Default::default();
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Green);
    spec.duration_s = Some(3600);
    spec.window.deadline_ms = Some(8 * H);
    let decide = |spec: &JobSpec| decide_on(&sites, spec, &t, None, 0).outcome;
    match decide(&spec) {
        Outcome::Wait(Wait::Deferred { until_ms, .. }) => assert_eq!(until_ms, 3 * H),
        other => panic!("expected a deferral, got {other:?}"),
    }
    // With the deadline too close for the clean hours, it runs now.
    spec.window.deadline_ms = Some(3 * H);
    assert_eq!(chosen_site(&decide(&spec)), "solar");
    // Without a deadline it is not deferrable.
    spec.window.deadline_ms = None;
    assert_eq!(chosen_site(&decide(&spec)), "solar");
}

#[test]
fn mig_slices_go_to_pools_that_offer_the_profile() {
    let mut plain = site("plain", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 2, 1.0)
        .build();
    plain.pools[0].sharing.milli = false;
    let mut sliced = site("sliced", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 2, 2.0)
        .used(0, 700)
        .build();
    sliced.pools[0].sharing = Sharing {
        milli: false,
        mig_profiles: vec!["1g.10gb".into(), "3g.40gb".into()],
    };
    let mut spec = job("k", 0);
    spec.policy = Some(Policy::Cost);
    spec.resources.mig = Some("3g.40gb".into());
    match choose(vec![plain.clone(), sliced.clone()], &spec, 0) {
        // 3 of 7 slices = 429 milli: device 0 has 300 free, so device 1.
        Outcome::Place(c) => {
            assert_eq!(c.site.as_str(), "sliced");
            assert_eq!(
                c.devices,
                vec![DeviceShare {
                    index: 1,
                    milli: 429
                }]
            );
        }
        other => panic!("{other:?}"),
    }
    spec.resources.mig = Some("2g.20gb".into());
    assert!(matches!(
        choose(vec![plain, sliced], &spec, 0),
        Outcome::Wait(Wait::NoSiteFits { .. })
    ));
}

#[test]
fn a_same_node_gang_stays_in_one_interconnect_domain() {
    // Two nodes of 4: devices 0-3 and 4-7; node one has two free, node two three free.
    let mut a = site("s", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 8, 1.0)
        .build();
    a.pools[0].devices_per_node = 4;
    for d in [0usize, 1, 4] {
        a.pools[0].devices[d].used_milli = 1000;
    }
    let mut spec = job("k", 3);
    match choose(vec![a.clone()], &spec, 0) {
        Outcome::Place(c) => assert_eq!(
            c.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
            vec![2, 3, 5]
        ),
        other => panic!("{other:?}"),
    }
    spec.resources.same_node = true;
    match choose(vec![a.clone()], &spec, 0) {
        Outcome::Place(c) => assert_eq!(
            c.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
            vec![5, 6, 7]
        ),
        other => panic!("{other:?}"),
    }
    spec.resources.count = 5;
    assert!(matches!(
        choose(vec![a], &spec, 0),
        Outcome::Wait(Wait::NoSiteFits { .. })
    ));
}

#[test]
fn residency_excludes_cheaper_sites_outside_the_region() {
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    spec.constraints.residency = Some("eu".into());
    assert_eq!(chosen_site(&choose(trio(), &spec, 0)), "c-frankfurt");
}

#[test]
fn a_large_dataset_pulls_the_job_to_its_site() {
    let mut adverts = trio();
    adverts[1] = site("b-green", Tier::Owned, 45.6, -121.2)
        .gpus("H100", 8, 3.0)
        .carbon(50)
        .dataset("corpus", 50_000_000_000_000)
        .build();
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    spec.datasets = vec![DatasetNeed {
        name: "corpus".into(),
        size_bytes: 50_000_000_000_000,
        locality: Locality::Prefer,
    }];
    assert_eq!(chosen_site(&choose(adverts.clone(), &spec, 0)), "b-green");
    spec.datasets[0].locality = Locality::Must;
    spec.policy = Some(Policy::Latency);
    assert_eq!(chosen_site(&choose(adverts, &spec, 0)), "b-green");
}

#[test]
fn cloud_waits_for_max_wait_then_bursts() {
    let adverts = vec![
        site("owned", Tier::Owned, 39.0, -77.5)
            .gpus("A100", 2, 1.0)
            .used(0, 1000)
            .used(1, 1000)
            .build(),
        site("cloud", Tier::Cloud, 39.0, -77.5)
            .gpus("A100", 8, 4.0)
            .build(),
    ];
    let mut spec = job("k", 1);
    spec.max_wait_s = 60;
    match choose(adverts.clone(), &spec, 10_000) {
        Outcome::Wait(Wait::Busy {
            burst_in_ms: Some(ms),
        }) => assert_eq!(ms, 50_000),
        other => panic!("expected a burst wait, got {other:?}"),
    }
    assert_eq!(chosen_site(&choose(adverts, &spec, 60_000)), "cloud");
}

#[test]
fn owned_capacity_is_used_before_cheaper_cloud() {
    let adverts = vec![
        site("owned", Tier::Owned, 39.0, -77.5)
            .gpus("A100", 2, 5.0)
            .build(),
        site("cloud", Tier::Cloud, 39.0, -77.5)
            .gpus("A100", 8, 1.0)
            .build(),
    ];
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    assert_eq!(chosen_site(&choose(adverts, &spec, 0)), "owned");
}

#[test]
fn hard_limits_name_the_nearest_miss() {
    let mut spec = job("k", 16);
    spec.constraints.price_cap_micro_usd_per_hour = Some(500_000);
    match choose(trio(), &spec, 0) {
        Outcome::Wait(Wait::NoSiteFits {
            nearest_miss: Some((_, why)),
        }) => assert!(why.contains("needs 16"), "{why}"),
        other => panic!("expected no fit, got {other:?}"),
    }
    spec.resources.count = 1;
    spec.resources.models = vec!["V100".into()];
    assert!(matches!(
        choose(trio(), &spec, 0),
        Outcome::Wait(Wait::NoSiteFits { .. })
    ));
}

#[test]
fn milli_shares_pack_onto_the_fullest_device_that_fits() {
    let adverts = vec![site("s", Tier::Owned, 0.0, 0.0)
        .gpus("T4", 3, 1.0)
        .used(1, 600)
        .used(2, 300)
        .build()];
    let mut spec = job("k", 0);
    spec.resources.milli = Some(400);
    match choose(adverts, &spec, 0) {
        Outcome::Place(c) => assert_eq!(
            c.devices,
            vec![DeviceShare {
                index: 1,
                milli: 400
            }]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_candidate_is_explained() {
    let mut adverts = trio();
    adverts.push(
        site("cloud", Tier::Cloud, 0.0, 0.0)
            .gpus("A100", 4, 1.0)
            .build(),
    );
    let sites = sites(adverts);
    let mut spec = job("k", 1);
    spec.constraints.residency = Some("eu".into());
    let d = decide_on(&sites, &spec, &Default::default(), None, 0);
    assert_eq!(d.candidates.len(), 4);
    let rejected: Vec<String> = d
        .candidates
        .iter()
        .filter_map(|c| c.reject.as_ref().map(|r| format!("{}: {r}", c.site)))
        .collect();
    assert_eq!(rejected.len(), 3, "{rejected:?}");
    assert!(
        rejected
            .iter()
            .all(|r| r.contains("outside residency region eu")),
        "{rejected:?}"
    );
}

// ------------------------------------------------------------------------------------------------------------
// Reactor scenarios

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
    let job = &env.reactor.state.jobs[&id];
    assert_eq!(job.phase, JobPhase::Succeeded);
    assert!(job.metered.cost_micro_usd > 0);
    // A repeated status changes nothing.
    env.status(
        &offers[0],
        AttemptState::Succeeded { exit_code: 0 },
        3_600_000,
    );
    assert_eq!(env.reactor.state.jobs[&id].metered, job_metered(&env, &id));
}

fn job_metered(env: &TestEnv, id: &JobId) -> Amounts {
    env.reactor.state.jobs[id].metered
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
    assert!(!env.reactor.state.sites[&first.site].up);
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
    assert_eq!(env.reactor.state.jobs[&id].runtime_ms, 500);
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
        env.reactor.state.jobs[id]
            .assignment
            .as_ref()
            .map(|a| a.site.to_string())
    };
    assert_eq!(env.phase(&ids[6]), JobPhase::Pending);
    let tenant = TenantId::new("team-a").unwrap();
    let order: Vec<Option<String>> = env
        .reactor
        .scale_in_order(&tenant, "chat")
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
    assert_eq!(env.reactor.state.jobs.len(), 1);
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
        env.reactor.state.jobs[&b].why.contains("busy"),
        "{}",
        env.reactor.state.jobs[&b].why
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

/// Six jobs submitted, one run to the end, one refused, then a site loss: a journal with some of everything.
fn journaled_scenario() -> TestEnv {
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
    let mut fresh = super::reactor::Reactor::new(
        env.reactor.config.clone(),
        RttTable::default(),
        regions(),
        super::journal::MemoryJournal::default(),
    );
    fresh.replay(&env.reactor.journal().records);
    assert_eq!(fresh.state.jobs, env.reactor.state.jobs);
    assert_eq!(fresh.state.sites, env.reactor.state.sites);
}

#[test]
fn a_snapshot_plus_the_records_after_it_rebuilds_the_same_state_from_any_point() {
    let env = journaled_scenario();
    let records = &env.reactor.journal().records;
    let fresh = || {
        super::reactor::Reactor::new(
            env.reactor.config.clone(),
            RttTable::default(),
            regions(),
            super::journal::MemoryJournal::default(),
        )
    };
    let mut whole = fresh();
    whole.replay(records);
    let want = whole.state.snapshot(records.len() as u64, 0);
    for cut in 0..=records.len() {
        let mut before = fresh();
        before.replay(&records[..cut]);
        let json = serde_json::to_vec(&before.state.snapshot(cut as u64, 0)).unwrap();
        let snap: super::snapshot::Snapshot = serde_json::from_slice(&json).unwrap();
        let mut after = fresh();
        after.restore(snap);
        after.replay(&records[cut..]);
        assert_eq!(
            after.state.snapshot(records.len() as u64, 0),
            want,
            "restored at record {cut}"
        );
        after.sanity_check().unwrap();
    }
}

// ------------------------------------------------------------------------------------------------------------
// Quotas and cohorts (invariants checked after every step by the test environment's sanity check).

const COHORT: &str = r#"
default_priority = "experiment"
priority_classes = [
  { name = "production", value = 100 },
  { name = "experiment", value = 10 },
]
[[queues]]
name = "team-a"
tenant = "team-a"
cohort = "research"
quota = { "gpu:*" = 8 }
[[queues]]
name = "team-b"
tenant = "team-b"
cohort = "research"
quota = { "gpu:*" = 8 }
"#;

fn tenant_job(tenant: &str, key: &str) -> JobSpec {
    let mut spec = job(key, 1);
    spec.tenant = TenantId::new(tenant).unwrap();
    spec
}

/// Submits, and accepts every offer made.
fn run_all(env: &mut TestEnv) {
    for o in env.take_offers() {
        env.answer(&o, OfferOutcome::Accepted);
        env.status(&o, AttemptState::Running, 0);
    }
}

/// The first job still pending (by id).
fn first_pending(env: &TestEnv) -> &super::model::Job {
    env.reactor
        .state
        .jobs
        .values()
        .find(|j| j.phase == JobPhase::Pending)
        .unwrap_or_else(|| panic!("no job is pending"))
}

fn count(env: &TestEnv, tenant: &str, phase: JobPhase) -> usize {
    env.reactor
        .state
        .jobs
        .values()
        .filter(|j| j.spec.tenant.as_str() == tenant && j.phase == phase)
        .count()
}

#[test]
fn a_lender_reclaims_its_quota_from_the_borrower_not_from_the_borrowers_own_share() {
    let mut env = TestEnv::new(trio());
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(COHORT).unwrap());
    // Team A borrows B's idle 8 GPUs: 16 run (the federation has 24 GPUs; the cohort's quota is 16).
    for i in 0..17 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        env.advance(10);
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-a", JobPhase::Running), 16);
    let waiting = first_pending(&env);
    assert!(
        waiting.why.contains("waiting for quota: queue team-a"),
        "{}",
        waiting.why
    );
    let borrowed_last: Vec<JobId> = {
        let mut running: Vec<&super::model::Job> = env
            .reactor
            .state
            .jobs
            .values()
            .filter(|j| j.phase == JobPhase::Running)
            .collect();
        running.sort_by_key(|j| std::cmp::Reverse(j.offered_ms));
        running.iter().take(4).map(|j| j.id.clone()).collect()
    };

    // Team B submits 4: within its own quota, so it takes 4 GPUs back from A's borrowed ones.
    for i in 0..4 {
        env.submit(tenant_job("team-b", &format!("b{i}")));
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-b", JobPhase::Running), 4);
    assert_eq!(
        count(&env, "team-a", JobPhase::Running),
        12,
        "A keeps its own 8 and 4 borrowed"
    );
    let preempted: Vec<&super::model::Job> = env
        .reactor
        .state
        .jobs
        .values()
        .filter(|j| j.why.starts_with("requeued: preempted by"))
        .collect();
    assert_eq!(preempted.len(), 4);
    for j in &preempted {
        assert_eq!(j.spec.tenant.as_str(), "team-a");
        assert_eq!(j.phase, JobPhase::Pending);
        assert!(
            borrowed_last.contains(&j.id),
            "{} was not among the last borrowed",
            j.id
        );
        assert!(
            j.why.contains("reclaiming gpu:* quota queue team-b lent"),
            "{}",
            j.why
        );
    }
    // Each preempted attempt is stopped at its site.
    let cancels = env
        .sent
        .iter()
        .filter(|c| matches!(c, Command::Cancel { cancel, .. } if cancel.reason.starts_with("preempted by")))
        .count();
    assert_eq!(cancels, 4);
    // B fills its quota: A is back to exactly its own 8, never below.
    for i in 4..12 {
        env.submit(tenant_job("team-b", &format!("b{i}")));
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-b", JobPhase::Running), 8);
    assert_eq!(count(&env, "team-a", JobPhase::Running), 8);
    let b_waiting = env
        .reactor
        .state
        .jobs
        .values()
        .find(|j| j.spec.tenant.as_str() == "team-b" && j.phase == JobPhase::Pending)
        .unwrap();
    assert!(
        b_waiting
            .why
            .contains("waiting for quota: queue team-b uses 8.000 of its 8.000 gpu:*"),
        "{}",
        b_waiting.why
    );
}

#[test]
fn a_higher_priority_job_preempts_lower_priority_work_of_its_own_queue_at_quota() {
    let mut env = TestEnv::new(trio());
    let t = COHORT.replace("cohort = \"research\"\n", "");
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(&t).unwrap());
    for i in 0..8 {
        let mut s = tenant_job("team-a", &format!("exp{i}"));
        s.checkpointable = i % 2 == 0;
        env.submit(s);
        env.advance(10);
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-a", JobPhase::Running), 8);
    let mut prod = tenant_job("team-a", "prod");
    prod.priority = Some("production".into());
    let id = env.submit(prod);
    run_all(&mut env);
    assert_eq!(env.phase(&id), JobPhase::Running);
    let victim = env
        .reactor
        .state
        .jobs
        .values()
        .find(|j| j.why.contains("preempted by"))
        .unwrap();
    // Checkpointable work goes first, the most recent of it.
    assert_eq!(victim.spec.idempotency_key, "exp6");
    assert!(
        victim.why.contains("higher-priority job of queue team-a"),
        "{}",
        victim.why
    );
    // An equal-priority job only waits.
    let other = env.submit(tenant_job("team-a", "exp-late"));
    run_all(&mut env);
    assert_eq!(env.phase(&other), JobPhase::Pending);
}

#[test]
fn borrowing_stops_at_the_borrowing_limit_and_unknown_queues_are_refused() {
    let t = COHORT.replace(
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }",
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }\nborrowing_limit = { \"gpu:*\" = 2 }",
    );
    let tenancy = super::quota::Tenancy::from_toml(&t).unwrap();
    assert_eq!(tenancy.queues["team-a"].borrowing_limit["gpu:*"], 2000);
    let mut env = TestEnv::new(trio());
    env.reactor.tenancy = Some(tenancy);
    for i in 0..11 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-a", JobPhase::Running), 10);
    let waiting = first_pending(&env);
    assert!(
        waiting.why.contains("over its borrowing limit of 2.000"),
        "{}",
        waiting.why
    );

    let mut stray = tenant_job("team-c", "c0");
    let err = env
        .reactor
        .step(env.now, Event::Submit(stray.clone()))
        .unwrap_err();
    assert_eq!(err.field().as_deref(), Some("queue"), "{err}");
    stray.tenant = TenantId::new("team-a").unwrap();
    stray.queue = Some("team-b".into());
    let err = env
        .reactor
        .step(env.now, Event::Submit(stray.clone()))
        .unwrap_err();
    assert!(
        err.to_string().contains("belongs to tenant team-b"),
        "{err}"
    );
    stray.queue = None;
    stray.priority = Some("urgent".into());
    let err = env.reactor.step(env.now, Event::Submit(stray)).unwrap_err();
    assert_eq!(err.field().as_deref(), Some("priority"), "{err}");
}

#[test]
fn tenancy_files_with_mistakes_are_refused_with_the_queue_named() {
    for (text, want) in [
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nquota = { \"gpu\" = 1 }",
            "queue \"q\": class \"gpu\"",
        ),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nquota = { \"tpu:*\" = 1 }",
            "kind must be",
        ),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nquota = { \"gpu:*\" = -1 }",
            "not a number of devices",
        ),
        ("default_priority = \"x\"", "default_priority \"x\""),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\n[[queues]]\nname = \"q\"\ntenant = \"t\"",
            "defined twice",
        ),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nspeed = 1",
            "unknown field",
        ),
    ] {
        let err = super::quota::Tenancy::from_toml(text).unwrap_err();
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn the_report_adds_up_to_the_job_records_in_every_breakdown() {
    let mut env = TestEnv::new(trio());
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(COHORT).unwrap());
    for i in 0..16 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        run_all(&mut env);
        env.advance(100);
    }
    // Team B takes back 3 GPUs: 3 of A's attempts are preempted; their ends are reported late and metered.
    for i in 0..3 {
        env.submit(tenant_job("team-b", &format!("b{i}")));
        run_all(&mut env);
    }
    let cancels: Vec<(SiteId, CancelAttempt)> = env
        .sent
        .iter()
        .filter_map(|c| match c {
            Command::Cancel { site, cancel } => Some((site.clone(), cancel.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        cancels.len(),
        3,
        "A running {}, B running {}, pending {:?}",
        count(&env, "team-a", JobPhase::Running),
        count(&env, "team-b", JobPhase::Running),
        env.reactor
            .state
            .jobs
            .values()
            .filter(|j| j.phase == JobPhase::Pending)
            .map(|j| j.why.clone())
            .collect::<Vec<_>>()
    );
    for (site, c) in &cancels {
        env.step(Event::Status(JobStatus {
            v: 1,
            job: c.job.clone(),
            attempt: c.attempt,
            site: site.clone(),
            state: AttemptState::Cancelled {
                reason: c.reason.clone(),
            },
            at_ms: env.now,
            started_at_ms: None,
            runtime_ms: Some(600_000),
            checkpoint: None,
        }));
    }
    // Everything running ends after an hour.
    env.now += 3_600_000;
    let running: Vec<(JobId, u32, SiteId)> = env
        .reactor
        .state
        .jobs
        .values()
        .filter(|j| j.phase == JobPhase::Running)
        .map(|j| {
            (
                j.id.clone(),
                j.attempt,
                j.assignment.as_ref().unwrap().site.clone(),
            )
        })
        .collect();
    for (job, attempt, site) in running {
        env.step(Event::Status(JobStatus {
            v: 1,
            job,
            attempt,
            site,
            state: AttemptState::Succeeded { exit_code: 0 },
            at_ms: env.now,
            started_at_ms: None,
            runtime_ms: Some(3_600_000),
            checkpoint: None,
        }));
    }
    run_all(&mut env);

    let r = super::ledger::report(env.reactor.state.jobs.values(), &ReportRequest::default());
    // An independent sum over the job records.
    let (mut dev, mut cost, mut wh, mut g, mut attempts) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for j in env.reactor.state.jobs.values() {
        for run in &j.runs {
            dev += run.milli * run.runtime_ms;
            cost += run.amounts.cost_micro_usd;
            wh += run.amounts.energy_wh;
            g += run.amounts.co2_g;
            attempts += 1;
        }
    }
    assert!(cost > 0 && dev > 0);
    let t = &r.total;
    assert_eq!(
        (
            t.device_milli_ms,
            t.cost_micro_usd,
            t.energy_wh,
            t.co2_g,
            t.attempts
        ),
        (dev, cost, wh, g, attempts)
    );
    // The preempted hour-fractions are in it: 3 attempts of 10 minutes on one device each.
    let preempted: u64 = env
        .reactor
        .state
        .jobs
        .values()
        .flat_map(|j| &j.runs)
        .filter(|r| r.runtime_ms == 600_000)
        .map(|r| r.milli * r.runtime_ms)
        .sum();
    assert_eq!(preempted, 3 * 1000 * 600_000);
    for rows in [&r.by_tenant, &r.by_site, &r.by_model] {
        let sum = |f: fn(&ReportRow) -> u64| rows.iter().map(f).sum::<u64>();
        assert_eq!(sum(|x| x.device_milli_ms), t.device_milli_ms);
        assert_eq!(sum(|x| x.cost_micro_usd), t.cost_micro_usd);
        assert_eq!(sum(|x| x.energy_wh), t.energy_wh);
        assert_eq!(sum(|x| x.co2_g), t.co2_g);
        assert_eq!(sum(|x| x.attempts), t.attempts);
        assert_eq!(sum(|x| x.wait_ms), t.wait_ms);
    }
    assert_eq!(r.by_tenant.iter().map(|x| x.jobs).sum::<u64>(), t.jobs);
    assert_eq!(
        t.jobs,
        env.reactor
            .state
            .jobs
            .values()
            .filter(|j| !j.runs.is_empty())
            .count() as u64
    );
    // One tenant, and a window that leaves everything out.
    let only_b = super::ledger::report(
        env.reactor.state.jobs.values(),
        &ReportRequest {
            tenant: Some(TenantId::new("team-b").unwrap()),
            ..ReportRequest::default()
        },
    );
    assert_eq!(only_b.by_tenant.len(), 1);
    assert_eq!(only_b.total.jobs, 3);
    let none = super::ledger::report(
        env.reactor.state.jobs.values(),
        &ReportRequest {
            to_ms: Some(1),
            ..ReportRequest::default()
        },
    );
    assert_eq!(
        none.total,
        ReportRow {
            key: "total".into(),
            ..ReportRow::default()
        }
    );
}

#[test]
fn a_gang_is_admitted_whole_or_not_at_all() {
    // Two sites of 4 GPUs each, 3 of them busy at each: 2 free in all, never 4 at one site.
    let mut env = TestEnv::new(vec![
        site("x", Tier::Owned, 39.0, -77.5)
            .gpus("A100", 4, 1.0)
            .used(0, 1000)
            .used(1, 1000)
            .used(2, 1000)
            .build(),
        site("y", Tier::Owned, 45.6, -121.2)
            .gpus("A100", 4, 1.0)
            .used(0, 1000)
            .used(1, 1000)
            .used(2, 1000)
            .build(),
    ]);
    let mut gang = tenant_job("team-a", "gang");
    gang.replicas = 2;
    gang.resources = Resources::whole(AcceleratorKind::Gpu, 1);
    let id = env.submit(gang.clone());
    assert!(env.take_offers().is_empty(), "no replica may start alone");
    assert_eq!(env.phase(&id), JobPhase::Pending);
    let why = &env.reactor.state.jobs[&id].why;
    assert!(
        why.starts_with("gang of 2 replicas, admitted only all together at one site"),
        "{why}"
    );
    // Site y frees up: both replicas go there together, in one offer.
    let mut freed = site("y", Tier::Owned, 45.6, -121.2)
        .gpus("A100", 4, 1.0)
        .used(0, 1000)
        .build();
    freed.generation += 1;
    env.step(Event::Advert(freed));
    let offers = env.take_offers();
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].devices.len(), 2);
    // Quota counts every replica: a queue of 3 GPUs never admits a 4-replica gang, not even in part.
    let t = COHORT.replace(
        "cohort = \"research\"\nquota = { \"gpu:*\" = 8 }",
        "quota = { \"gpu:*\" = 3 }",
    );
    let mut env = TestEnv::new(trio());
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(&t).unwrap());
    gang.replicas = 4;
    gang.idempotency_key = "gang4".into();
    let id = env.submit(gang);
    assert!(env.take_offers().is_empty());
    let why = &env.reactor.state.jobs[&id].why;
    assert!(
        why.contains("waiting for quota: queue team-a uses 0.000 of its 3.000 gpu:*"),
        "{why}"
    );
}

#[test]
fn the_queue_with_the_smaller_dominant_share_goes_first() {
    let t = COHORT.replace("cohort = \"research\"\n", "");
    let mut env = TestEnv::new(vec![site("x", Tier::Owned, 39.0, -77.5)
        .gpus("A100", 2, 1.0)
        .build()]);
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(&t).unwrap());
    env.submit(tenant_job("team-a", "a0"));
    env.submit(tenant_job("team-b", "b0"));
    let offers = env.take_offers();
    for o in &offers {
        env.answer(o, OfferOutcome::Accepted);
        env.status(o, AttemptState::Running, 0);
    }
    let a1 = env.submit(tenant_job("team-a", "a1"));
    let b1 = env.submit(tenant_job("team-b", "b1"));
    // B's job ends after 10 minutes; A's keeps running for two hours.
    env.now += 600_000;
    let b0 = offers
        .iter()
        .find(|o| o.spec.idempotency_key == "b0")
        .unwrap();
    env.status(b0, AttemptState::Succeeded { exit_code: 0 }, 600_000);
    env.now += 6_600_000;
    env.heartbeat("x");
    env.advance(10);
    // One device is free: B's job gets it although A's waited longer.
    assert_eq!(env.phase(&b1), JobPhase::Offered);
    assert_eq!(env.phase(&a1), JobPhase::Pending);
}

/// A job placed by cost: an hour of a 1 USD/h GPU at site a-cheap.
fn cheap_job(tenant: &str, key: &str) -> JobSpec {
    let mut spec = tenant_job(tenant, key);
    spec.policy = Some(Policy::Cost);
    spec
}

fn budget_env(mode: &str) -> TestEnv {
    let t = format!(
        "{COHORT}\n[[budgets]]\ntenant = \"team-a\"\nperiod = \"day\"\nusd = 2.5\nwhen_exceeded = \"{mode}\"\n"
    );
    let mut env = TestEnv::new(trio());
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(&t).unwrap());
    env
}

#[test]
fn a_submission_over_the_tenants_budget_is_refused_with_the_budget_named() {
    let mut env = budget_env("refuse");
    // Each job is expected to cost about 1 USD (an hour of a 1 USD/h GPU): two fit in 2.50 USD.
    env.submit(cheap_job("team-a", "a0"));
    env.submit(cheap_job("team-a", "a1"));
    run_all(&mut env);
    let err = env
        .reactor
        .step(env.now, Event::Submit(cheap_job("team-a", "a2")))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OverBudget);
    let msg = err.to_string();
    assert!(
        msg.contains("over budget: tenant team-a has 0.50 of its 2.50 USD for this day left"),
        "{msg}"
    );
    // Another tenant is not limited; a resubmission of an accepted job still answers with that job.
    env.submit(cheap_job("team-b", "b0"));
    env.submit(cheap_job("team-a", "a0"));
    // The next day the budget is whole again.
    env.now += 86_400_000;
    env.heartbeat("a-cheap");
    env.heartbeat("b-green");
    env.heartbeat("c-frankfurt");
    env.submit(cheap_job("team-a", "a3"));
}

#[test]
fn a_held_job_waits_for_the_next_budget_period_and_then_runs() {
    let mut env = budget_env("hold");
    env.submit(cheap_job("team-a", "a0"));
    env.submit(cheap_job("team-a", "a1"));
    let held = env.submit(cheap_job("team-a", "a2"));
    run_all(&mut env);
    assert_eq!(env.phase(&held), JobPhase::Pending);
    let job = &env.reactor.state.jobs[&held];
    assert!(
        job.why
            .contains("held until the budget period ends at 86400000: over budget: tenant team-a"),
        "{}",
        job.why
    );
    assert_eq!(job.retry_at_ms, Some(86_400_000));
    // Midnight UTC: a new day, a new budget.
    env.now = 86_400_000;
    for s in ["a-cheap", "b-green", "c-frankfurt"] {
        env.heartbeat(s);
    }
    env.advance(1);
    assert_eq!(env.phase(&held), JobPhase::Offered);
}

#[test]
fn a_tenancy_change_is_journaled_and_survives_replay_and_snapshots() {
    let mut env = TestEnv::new(trio());
    let small = COHORT
        .replace("cohort = \"research\"\n", "")
        .replace("quota = { \"gpu:*\" = 8 }", "quota = { \"gpu:*\" = 1 }");
    env.step(Event::SetTenancy {
        toml: small.clone(),
        from_file: true,
    });
    env.submit(tenant_job("team-a", "a0"));
    let a1 = env.submit(tenant_job("team-a", "a1"));
    run_all(&mut env);
    assert_eq!(env.phase(&a1), JobPhase::Pending);
    // A bad file is refused with the problem, and changes nothing.
    let err = env
        .reactor
        .step(
            env.now,
            Event::SetTenancy {
                toml: "[[queues]]\nname = 1".into(),
                from_file: false,
            },
        )
        .unwrap_err();
    assert_eq!(err.field().as_deref(), Some("tenancy"), "{err}");
    // Raising the quota lets the waiting job run.
    env.step(Event::SetTenancy {
        toml: COHORT.into(),
        from_file: false,
    });
    run_all(&mut env);
    assert_eq!(env.phase(&a1), JobPhase::Running);
    // A replay, and a snapshot, carry the tenancy in force.
    let records = env.reactor.journal().records.clone();
    let fresh = || {
        super::reactor::Reactor::new(
            env.reactor.config.clone(),
            RttTable::default(),
            regions(),
            super::journal::MemoryJournal::default(),
        )
    };
    let mut again = fresh();
    again.replay(&records);
    assert_eq!(again.tenancy, env.reactor.tenancy);
    assert_eq!(again.state.jobs, env.reactor.state.jobs);
    let mut restored = fresh();
    restored.restore(env.reactor.state.snapshot(0, 0));
    assert_eq!(restored.tenancy, env.reactor.tenancy);
    assert_eq!(restored.state.tenancy_toml.as_deref(), Some(COHORT));
    assert_eq!(
        restored.state.tenancy_file_toml.as_deref(),
        Some(small.as_str())
    );
}

#[test]
fn a_queue_capped_at_a_site_goes_elsewhere_and_the_explanation_says_why() {
    let t = COHORT.replace(
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }",
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }\nsite_caps = { a-cheap = { \"gpu:A100\" = 2 } }",
    );
    let mut env = TestEnv::new(trio());
    env.reactor.tenancy = Some(super::quota::Tenancy::from_toml(&t).unwrap());
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(env.submit(cheap_job("team-a", &format!("a{i}"))));
        run_all(&mut env);
    }
    let sites: Vec<String> = ids
        .iter()
        .map(|id| {
            env.reactor.state.jobs[id]
                .assignment
                .as_ref()
                .unwrap()
                .site
                .to_string()
        })
        .collect();
    assert_eq!(
        sites.iter().filter(|s| *s == "a-cheap").count(),
        2,
        "{sites:?}"
    );
    let third = env.reactor.state.jobs[&ids[2]].decision.as_ref().unwrap();
    let capped = third
        .candidates
        .iter()
        .find(|c| c.site.as_str() == "a-cheap")
        .and_then(|c| c.reject.as_ref())
        .map(ToString::to_string);
    assert_eq!(
        capped.as_deref(),
        Some("the job's queue is at its quota cap at this site")
    );
    let err = super::quota::Tenancy::from_toml(
        "[[queues]]\nname = \"q\"\ntenant = \"t\"\nsite_caps = { \"bad site\" = { \"gpu:*\" = 1 } }",
    )
    .unwrap_err();
    assert!(err.contains("site_caps: site \"bad site\""), "{err}");
}

#[test]
fn after_a_resume_an_unanswered_offer_gets_its_full_timeout_again() {
    let mut env = TestEnv::new(trio());
    let id = env.submit(job("k", 1));
    let offers = env.take_offers();
    assert_eq!(offers.len(), 1);
    // The broker was blind for longer than the offer timeout (a takeover, a stalled journal).
    env.now += env.reactor.config.offer_timeout_ms + 1_000;
    env.step(Event::Resume);
    env.advance(10);
    assert_eq!(
        env.phase(&id),
        JobPhase::Offered,
        "the answer may still be on its way"
    );
    // The agent's answer, heard late, is taken.
    env.answer(&offers[0], OfferOutcome::Accepted);
    env.status(&offers[0], AttemptState::Running, 0);
    assert_eq!(env.phase(&id), JobPhase::Running);
    assert_eq!(env.reactor.state.jobs[&id].attempt, 1);
    // Without the resume, the same wait times the offer out.
    let mut other = TestEnv::new(trio());
    let id = other.submit(job("k", 1));
    other.take_offers();
    other.now += other.reactor.config.offer_timeout_ms + 1_000;
    for s in ["a-cheap", "b-green", "c-frankfurt"] {
        other.heartbeat(s);
    }
    other.advance(10);
    assert_eq!(
        other.reactor.state.jobs[&id].attempt, 2,
        "timed out and offered again elsewhere"
    );
}

// ------------------------------------------------------------------------------------------------------------
// Oracle: the placer never breaks a hard constraint, respects the tier order, and under the cost policy never
// loses to a brute-force scan of every site on its own objective.

mod oracle {
    use super::*;
    use proptest::prelude::*;

    fn arb_site(i: usize) -> impl Strategy<Value = SiteAdvert> {
        (
            0usize..3,
            -60.0f64..60.0,
            -170.0f64..170.0,
            1u32..6,
            0u32..6,
            1u32..50,
            0u32..800,
        )
            .prop_map(move |(tier, lat, lon, count, busy, price, carbon)| {
                let tier = Tier::ALL[tier];
                let mut b = site(&format!("s{i}"), tier, lat, lon)
                    .gpus(
                        if i.is_multiple_of(2) { "A100" } else { "H100" },
                        count,
                        f64::from(price) / 10.0,
                    )
                    .carbon(carbon);
                for d in 0..busy.min(count) {
                    b = b.used(d as usize, 1000);
                }
                b.build()
            })
    }

    fn arb_sites() -> impl Strategy<Value = Vec<SiteAdvert>> {
        (1usize..7).prop_flat_map(|n| (0..n).map(arb_site).collect::<Vec<_>>())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn never_breaks_a_hard_constraint_and_beats_brute_force(
            adverts in arb_sites(),
            count in 1u32..4,
            cap in proptest::option::of(1u64..50),
            eu in any::<bool>(),
            model in proptest::option::of(0usize..2),
            waited in 0u64..2,
            objective in 0usize..3,
            user in (-60.0f64..60.0, -170.0f64..170.0),
            indexed in any::<bool>(),
        ) {
            let mut spec = job("k", count);
            spec.policy = Some([Policy::Cost, Policy::Green, Policy::Latency][objective].clone());
            spec.max_wait_s = 1;
            spec.constraints.price_cap_micro_usd_per_hour = cap.map(|c| c * 100_000);
            spec.constraints.residency = eu.then(|| "eu".to_string());
            spec.resources.models = model.map(|m| vec![["A100", "H100"][m].to_string()]).unwrap_or_default();
            let user = GeoPoint { lat: user.0, lon: user.1 };
            spec.users = vec![UserLocation { name: None, location: user, weight: 1.0, rtt_region: None }];
            let regions = regions();
            // Brute force, written independently: every site that satisfies every constraint and has the devices
            // free now, with the chosen objective: list price; grams of CO2 for `count` 400 W devices at PUE 1.2
            // for one hour, rounded down; or great-circle distance to the user.
            let feasible: Vec<(Tier, f64, String)> = adverts.iter().filter_map(|a| {
                let p = &a.pools[0];
                let free = p.devices.iter().filter(|d| d.used_milli == 0).count() as u32;
                let ok = free >= count
                    && cap.is_none_or(|c| p.price_micro_usd_per_hour <= c * 100_000)
                    && (!eu || regions.contains("eu", a.site.location) == Some(true))
                    && spec.resources.models.iter().all(|m| *m == p.model);
                let key = match objective {
                    0 => p.price_micro_usd_per_hour as f64,
                    1 => (400u128 * u128::from(count) * 1200 * u128::from(a.site.carbon.g_per_kwh) / 1_000_000_000) as f64,
                    _ => {
                        let (la1, lo1, la2, lo2) = (user.lat.to_radians(), user.lon.to_radians(), a.site.location.lat.to_radians(), a.site.location.lon.to_radians());
                        let h = ((la2 - la1) / 2.0).sin().powi(2) + la1.cos() * la2.cos() * ((lo2 - lo1) / 2.0).sin().powi(2);
                        2.0 * 6371.0 * h.sqrt().asin()
                    }
                };
                ok.then(|| (a.site.tier, key, a.site.id.to_string()))
            }).collect();
            let outcome = if indexed { choose_indexed(adverts.clone(), &spec, waited * 1000) } else { choose(adverts.clone(), &spec, waited * 1000) };
            let best_tier = feasible.iter().map(|f| f.0).min();
            match (&outcome, best_tier) {
                (Outcome::Place(c), Some(t)) => {
                    let me = feasible.iter().find(|f| f.2 == c.site.as_str());
                    prop_assert!(me.is_some(), "chose {} which breaks a constraint", c.site);
                    prop_assert_eq!(c.tier, t, "tier order broken");
                    if t == Tier::Cloud {
                        prop_assert!(waited >= 1, "burst before max_wait");
                    }
                    let best = feasible.iter().filter(|f| f.0 == t).map(|f| f.1).fold(f64::INFINITY, f64::min);
                    let mine = me.map(|m| m.1).unwrap_or(f64::NAN);
                    prop_assert!((mine - best).abs() <= 1e-6 * best.max(1.0), "chose {} at {} but {} exists", c.site, mine, best);
                    prop_assert_eq!(c.devices.len() as u32, count);
                }
                (Outcome::Wait(_), None) => {}
                (Outcome::Wait(_), Some(Tier::Cloud)) => prop_assert!(waited == 0),
                (o, t) => prop_assert!(false, "placer {:?} vs brute force tier {:?}", o, t),
            }
        }
    }
}

mod index_oracle {
    use super::*;
    use crate::index::SiteIndex;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// With the index, a decision places the job exactly where a scan of every site does.
        #[test]
        fn the_index_changes_no_placement(
            counts in proptest::collection::vec((1u32..9, 0u32..9, 0usize..3, 1u32..40, 0u32..700), 1..12),
            need in 1u32..6,
            share in proptest::option::of(1u32..1000),
            policy in 0usize..5,
            users in proptest::collection::vec((-60.0f64..60.0, -170.0f64..170.0, 0.1f64..5.0), 1..4),
            inference in any::<bool>(),
        ) {
            let adverts: Vec<SiteAdvert> = counts.iter().enumerate().map(|(i, (n, busy, tier, price, carbon))| {
                let mut b = site(&format!("s{i}"), Tier::ALL[*tier], (i as f64) * 5.0, (i as f64) * 7.0)
                    .gpus(if i % 3 == 0 { "H100" } else { "A100" }, *n, f64::from(*price) / 10.0)
                    .carbon(*carbon);
                for d in 0..(*busy).min(*n) {
                    b = b.used(d as usize, if d % 2 == 0 { 1000 } else { 600 });
                }
                b.build()
            }).collect();
            let sites = sites(adverts);
            let mut index = SiteIndex::default();
            for s in sites.values() {
                index.update(s, &Default::default());
            }
            let mut spec = job("k", need);
            if let Some(m) = share {
                spec.resources.count = 0;
                spec.resources.milli = Some(m);
            }
            let weighted = Policy::Weights(Weights { cost: 1.0, energy: 0.0, carbon: 2.0, latency: 0.5, data: 0.0 });
            spec.policy = Some([Policy::Latency, Policy::Cost, Policy::Green, Policy::Balanced, weighted][policy].clone());
            if inference {
                spec.kind = JobKind::Inference;
            }
            spec.users = users
                .iter()
                .map(|(lat, lon, w)| UserLocation { name: None, location: GeoPoint { lat: *lat, lon: *lon }, weight: *w, rtt_region: None })
                .collect();
            let decide = |index: Option<&SiteIndex>| decide_on(&sites, &spec, &Default::default(), index, 0).outcome;
            let (full, indexed) = (decide(None), decide(Some(&index)));
            match (&full, &indexed) {
                (Outcome::Place(a), Outcome::Place(b)) => {
                    prop_assert_eq!(&a.site, &b.site);
                    prop_assert_eq!(&a.devices, &b.devices);
                }
                (Outcome::Wait(a), Outcome::Wait(b)) => prop_assert_eq!(a, b),
                _ => prop_assert!(false, "full scan {:?} vs index {:?}", full, indexed),
            }
        }
    }
}

#[test]
fn busy_candidates_say_how_much_is_free() {
    let adverts = vec![site("s", Tier::Owned, 0.0, 0.0)
        .gpus("A100", 2, 1.0)
        .used(0, 1000)
        .build()];
    let sites = sites(adverts);
    let spec = job("k", 2);
    let d = decide_on(&sites, &spec, &Default::default(), None, 0);
    assert!(matches!(
        d.candidates[0].reject,
        Some(Reject::Busy {
            free_milli: 1000,
            needs_milli: 2000
        })
    ));
}
