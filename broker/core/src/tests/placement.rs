//! Placement choices: policies, constraints, tiers, devices, explanations.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

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

/// Cost and carbon disagree: the cheapest site is on a coal-heavy grid, one 5% dearer emits half as much, the
/// cleanest is 40% dearer.
fn disagreeing() -> Vec<SiteAdvert> {
    vec![
        site("coal-cheap", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 8, 2.0)
            .carbon(800)
            .build(),
        site("gas-mid", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 8, 2.1)
            .carbon(400)
            .build(),
        site("hydro-dear", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 8, 2.8)
            .carbon(20)
            .build(),
    ]
}

fn under(policy: Policy) -> (String, String) {
    let mut spec = job("k", 1);
    spec.policy = Some(policy);
    (
        chosen_site(&choose(disagreeing(), &spec, 0)).to_owned(),
        chosen_site(&choose_indexed(disagreeing(), &spec, 0)).to_owned(),
    )
}

#[test]
fn balanced_trades_within_its_premium_and_counts_terms_by_their_share() {
    let same = |s: &str| (s.to_owned(), s.to_owned());
    assert_eq!(under(Policy::Cost), same("coal-cheap"));
    assert_eq!(under(Policy::Green), same("hydro-dear"));
    // 5% more money for 50% less carbon: taken; 40% more for 97.5% less: beyond balanced's premium.
    assert_eq!(under(Policy::Balanced), same("gas-mid"));
    // A journal of an earlier format keeps the rule it was written under (each term against its best, which
    // lets carbon, the term that varies most, decide).
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Balanced);
    let old = decide_in_format(
        &sites(disagreeing()),
        &spec,
        &Default::default(),
        None,
        0,
        3,
    );
    assert_eq!(chosen_site(&old.outcome), "hydro-dear");
}

/// Two owned A100 sites of 8 GPUs: `a-dirty` at $2.00/h on a 400 g/kWh grid, and `b-bit-cleaner` at `price`
/// on a grid of `carbon`: a little cleaner for a little more money.
fn a_small_saving(price: f64, carbon: u32) -> Vec<SiteAdvert> {
    vec![
        site("a-dirty", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 8, 2.0)
            .carbon(400)
            .build(),
        site("b-bit-cleaner", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 8, price)
            .carbon(carbon)
            .build(),
    ]
}

#[test]
fn balanced_pays_no_premium_for_a_small_saving() {
    // 9% more money for 5% less carbon is a bad trade: one per cent of cost counts as much as one of carbon.
    let adverts = a_small_saving(2.18, 380);
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Balanced);
    assert_eq!(chosen_site(&choose(adverts.clone(), &spec, 0)), "a-dirty");
    assert_eq!(chosen_site(&choose_indexed(adverts, &spec, 0)), "a-dirty");
}

#[test]
fn a_carbon_price_moves_work_as_the_price_rises() {
    // One A100 for an hour: 400 W × PUE 1.2 → 0.48 kWh; coal 384 g, gas 192 g, hydro 10 g. Against coal, gas
    // saves 192 g for $0.10 ($521/t); hydro saves 182 g more than gas for $0.70 more ($3,846/t).
    let same = |s: &str| (s.to_owned(), s.to_owned());
    assert_eq!(under(Policy::CarbonPriceUsdPerT(0.0)), same("coal-cheap"));
    assert_eq!(under(Policy::CarbonPriceUsdPerT(190.0)), same("coal-cheap"));
    assert_eq!(under(Policy::CarbonPriceUsdPerT(1000.0)), same("gas-mid"));
    assert_eq!(
        under(Policy::CarbonPriceUsdPerT(10_000.0)),
        same("hydro-dear")
    );
}

/// From format 9 a carbon price of 0 places exactly as `cost`: of two sites of the same money it takes the
/// cleaner (cost's tie-break), indexed or not, and a job with a deadline does not wait for a cleaner hour. A
/// journal of format 8 keeps its rule: the first of equal costs in site order, and the deferral.
#[test]
fn a_carbon_price_of_zero_places_as_cost_from_format_9() {
    const H: u64 = 3_600_000;
    let twins = || {
        let mut dirty = site("a-dirty", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 8, 2.0)
            .carbon(400)
            .build();
        // Clean from the third hour on: a deferral would save carbon.
        dirty.site.carbon.forecast_start_ms = 0;
        dirty.site.carbon.forecast = vec![400, 400, 400, 50, 50, 50, 50, 50];
        vec![
            dirty,
            site("b-clean", Tier::Owned, 0.0, 0.0)
                .gpus("A100", 8, 2.0)
                .carbon(300)
                .build(),
        ]
    };
    let t = Default::default();
    let newest = crate::durable::FORMAT_VERSION;
    for deadline in [None, Some(8 * H)] {
        let mut spec = job("k", 1);
        spec.duration_s = Some(3600);
        spec.window.deadline_ms = deadline;
        let place = |policy: Policy, format: u32, indexed: bool| {
            let mut spec = spec.clone();
            spec.policy = Some(policy);
            let federation = sites(twins());
            let mut index = crate::index::SiteIndex::default();
            for s in federation.values() {
                index.update(s, &Default::default());
            }
            decide_in_format(&federation, &spec, &t, indexed.then_some(&index), 0, format).outcome
        };
        for indexed in [false, true] {
            let cost = place(Policy::Cost, newest, indexed);
            assert_eq!(chosen_site(&cost), "b-clean", "{deadline:?}");
            assert_eq!(
                place(Policy::CarbonPriceUsdPerT(0.0), newest, indexed),
                cost
            );
        }
    }
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::CarbonPriceUsdPerT(0.0));
    spec.duration_s = Some(3600);
    let old = |spec: &JobSpec| {
        decide_in_format(
            &sites(twins()),
            spec,
            &t,
            None,
            0,
            crate::placement::ZERO_PRICE_FORMAT - 1,
        )
        .outcome
    };
    assert_eq!(chosen_site(&old(&spec)), "a-dirty");
    spec.window.deadline_ms = Some(8 * H);
    assert!(
        matches!(old(&spec), Outcome::Wait(Wait::Deferred { .. })),
        "{:?}",
        old(&spec)
    );
}

#[test]
fn a_cost_premium_buys_carbon_within_it() {
    let same = |s: &str| (s.to_owned(), s.to_owned());
    assert_eq!(under(Policy::MaxCostPremium(0.0)), same("coal-cheap"));
    assert_eq!(under(Policy::MaxCostPremium(0.04)), same("coal-cheap"));
    assert_eq!(under(Policy::MaxCostPremium(0.05)), same("gas-mid"));
    assert_eq!(under(Policy::MaxCostPremium(0.5)), same("hydro-dear"));
}

/// From format 7 a cost premium is spent where it buys the most carbon (the knee, as `balanced` spends its
/// own): 4.5% more money for 2.5% less carbon is within a 5% premium but a bad trade, so the job stays on the
/// cheapest site. A journal of format 6 keeps the rule it was written under: the least carbon within the
/// premium.
#[test]
fn a_cost_premium_is_not_spent_on_a_small_saving_from_format_7() {
    let adverts = a_small_saving(2.09, 390);
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::MaxCostPremium(0.05));
    assert_eq!(chosen_site(&choose(adverts.clone(), &spec, 0)), "a-dirty");
    assert_eq!(
        chosen_site(&choose_indexed(adverts.clone(), &spec, 0)),
        "a-dirty"
    );
    let old = decide_in_format(
        &sites(adverts),
        &spec,
        &Default::default(),
        None,
        0,
        crate::placement::PREMIUM_KNEE_FORMAT - 1,
    );
    assert_eq!(chosen_site(&old.outcome), "b-bit-cleaner");
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
    let mut throughput = crate::throughput::Throughput::default();
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    let decide = |t: &crate::throughput::Throughput| decide_on(&sites, &spec, t, None, 0).outcome;
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
    let mut t = crate::throughput::Throughput::default();
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
    assert!(env.reactor.state().jobs[&id]
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
    // A model no pool has is named as such.
    match choose(trio(), &spec, 0) {
        Outcome::Wait(Wait::NoSiteFits {
            nearest_miss: Some((_, why)),
        }) => assert!(
            why.contains("no pool examined has the model the job allows (V100)")
                && why.contains("A100"),
            "{why}"
        ),
        other => panic!("expected no fit, got {other:?}"),
    }
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

/// `balanced` keeps a tenant's jobs together within 10% of their cheapest placements: a clean site 30% dearer
/// is out of reach of one job, but the premium earlier jobs left unspent lets every third job go there (two jobs
/// at $2 bank $0.40, the third may cost 1.1 × (4 + 2) − 4 = $2.60). Another
/// tenant's savings are not shared, replay gives the same spending, and a snapshot keeps it.
#[test]
fn balanced_banks_the_premium_a_tenant_leaves_unspent() {
    let adverts = vec![
        site("a-coal", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 16, 2.0)
            .carbon(800)
            .build(),
        site("b-hydro", Tier::Owned, 0.0, 0.0)
            .gpus("A100", 16, 2.6)
            .carbon(20)
            .build(),
    ];
    let mut env = TestEnv::new(adverts);
    let mut placed = Vec::new();
    for i in 0..8 {
        let mut spec = job(&format!("k{i}"), 1);
        spec.policy = Some(Policy::Balanced);
        env.submit(spec);
        let offers = env.take_offers();
        assert_eq!(offers.len(), 1);
        placed.push(offers[0].site.to_string());
    }
    assert_eq!(
        placed,
        ["a-coal", "a-coal", "b-hydro", "a-coal", "a-coal", "b-hydro", "a-coal", "a-coal"],
        "{placed:?}"
    );
    // Another tenant starts with nothing banked.
    let mut spec = job("other", 1);
    spec.tenant = TenantId::new("other").unwrap();
    spec.policy = Some(Policy::Balanced);
    env.submit(spec);
    assert_eq!(env.take_offers()[0].site.as_str(), "a-coal");
    // Spending is state: replay and a snapshot give it back.
    let records = env.reactor.journal().records.clone();
    let mut again = crate::reactor::Reactor::new(
        crate::reactor::CoreConfig::default(),
        RttTable::default(),
        regions(),
        crate::journal::MemoryJournal::default(),
    );
    again.replay(&records);
    assert_eq!(again.state().premiums, env.reactor.state().premiums);
    let snap = env.reactor.state().snapshot(1, env.now);
    assert_eq!(snap.premiums.len(), 2);
}

/// A queue's policy applies to its jobs that name none; a job's own policy still wins. A journal in format 3
/// refuses a tenancy with queue policies (a broker of that release could not read it back).
#[test]
fn a_queue_policy_places_the_jobs_that_name_none() {
    let tenancy = r#"
        [[queues]]
        name = "team-a"
        tenant = "team-a"
        policy = { max_cost_premium = 0.5 }
    "#;
    let mut env = TestEnv::new(disagreeing());
    env.set_tenancy(tenancy);
    let mut spec = job("k", 1);
    spec.policy = None;
    env.submit(spec);
    assert_eq!(env.take_offers()[0].site.as_str(), "hydro-dear");
    let mut spec = job("own", 1);
    spec.policy = Some(Policy::Cost);
    env.submit(spec);
    assert_eq!(env.take_offers()[0].site.as_str(), "coal-cheap");
    assert_eq!(
        env.reactor
            .state()
            .premiums
            .keys()
            .map(|(_, p)| p.as_str())
            .collect::<Vec<_>>(),
        ["max-cost-premium=0.5"]
    );

    let mut old = crate::reactor::Reactor::new(
        crate::reactor::CoreConfig::default(),
        RttTable::default(),
        regions(),
        crate::journal::MemoryJournal::default(),
    );
    old.replay_batches(&[crate::durable::Batch {
        format: 3,
        leader: "b".into(),
        n: 1,
        records: vec![],
        quarantine: vec![],
    }]);
    let err = old
        .step(
            0,
            Event::SetTenancy {
                toml: tenancy.to_owned(),
                from_file: false,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("upgrade-format"), "{err}");
    let bad = tenancy.replace("0.5", "-1");
    assert!(crate::quota::Tenancy::from_toml(&bad)
        .unwrap_err()
        .to_string()
        .contains("max_cost_premium"));
}

/// A job that asks for a backend (`run.adapter`) goes only to sites that run it, on the scan and the indexed
/// paths alike; a site that does not say how it runs work (an earlier agent) is taken as before; a job asking
/// for none goes anywhere.
#[test]
fn a_job_asking_for_a_backend_goes_only_to_sites_that_run_it() {
    let adverts = || {
        vec![
            site("cheap-process", Tier::Owned, 39.0, -77.5)
                .gpus("A100", 8, 1.0)
                .backend(BackendKind::Process)
                .build(),
            site("dear-noop", Tier::Owned, 45.6, -121.2)
                .gpus("A100", 8, 3.0)
                .backend(BackendKind::Noop)
                .build(),
        ]
    };
    let mut spec = job("k", 1);
    spec.policy = Some(Policy::Cost);
    assert_eq!(chosen_site(&choose(adverts(), &spec, 0)), "cheap-process");
    spec.run.adapter = Some("noop".into());
    for outcome in [
        choose(adverts(), &spec, 0),
        choose_indexed(adverts(), &spec, 0),
    ] {
        assert_eq!(chosen_site(&outcome), "dear-noop");
    }
    // `local`, the name of earlier releases, is the process backend.
    spec.run.adapter = Some("local".into());
    assert_eq!(chosen_site(&choose(adverts(), &spec, 0)), "cheap-process");
    // No site runs it: the job waits, and says why.
    let only_process = vec![adverts().remove(0)];
    spec.run.adapter = Some("noop".into());
    match choose(only_process, &spec, 0) {
        Outcome::Wait(Wait::NoSiteFits {
            nearest_miss: Some((_, why)),
        }) => assert!(
            why.contains("backend process, the job asks for noop"),
            "{why}"
        ),
        other => panic!("expected no fit, got {other:?}"),
    }
    // An agent that does not advertise its backend is taken as before.
    let unknown = vec![site("older", Tier::Owned, 39.0, -77.5)
        .gpus("A100", 8, 1.0)
        .build()];
    assert_eq!(chosen_site(&choose(unknown, &spec, 0)), "older");
}
