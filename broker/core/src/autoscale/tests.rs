use super::*;

fn offer(site: &str, tier: Tier, lon: f64, usd: f64, g: f64, room: u32) -> Offer {
    Offer {
        key: ReplicaKey {
            site: SiteId::new(site).unwrap_or_else(|_| unreachable!()),
            pool: PoolName::from("gpu"),
            spot: false,
        },
        tier,
        location: GeoPoint { lat: 40.0, lon },
        rtt_region: None,
        room,
        usd_per_hour: usd,
        kw: 1.0,
        g_co2_per_hour: g,
        capacity: 10.0,
    }
}

fn at(name: &str, lon: f64, rate: f64) -> LocationDemand {
    LocationDemand {
        name: name.to_owned(),
        location: GeoPoint { lat: 40.0, lon },
        rtt_region: None,
        rate,
    }
}

fn settings(objective: Objective) -> Settings {
    Settings {
        slo_ms: 40.0,
        min_replicas: 0,
        max_replicas: 1000,
        utilization: 1.0,
        objective,
        up_delay_ms: 60_000,
        down_delay_ms: 600_000,
        window_ms: 120_000,
    }
}

fn count(d: &Desired, site: &str) -> u32 {
    d.replicas
        .iter()
        .filter(|(k, _)| k.site.as_str() == site)
        .map(|(_, c)| *c)
        .sum()
}

fn spot(site: &str, lon: f64, usd: f64, g: f64, room: u32) -> Offer {
    let mut o = offer(site, Tier::Cloud, lon, usd, g, room);
    o.key.spot = true;
    o
}

#[test]
fn spot_goes_first_within_a_tier_and_shares_its_pool_s_room_with_on_demand() {
    // Each cloud pool sells on-demand and spot from the same four devices.
    let offers = vec![
        offer("cloud-a", Tier::Cloud, -75.0, 3.0, 10.0, 4),
        spot("cloud-a", -75.0, 1.0, 10.0, 4),
        offer("cloud-b", Tier::Cloud, -75.5, 2.0, 10.0, 4),
        spot("cloud-b", -75.5, 1.5, 10.0, 4),
    ];
    let demand = vec![at("new-york", -74.0, 70.0)];
    for objective in [
        Objective::Cost,
        Objective::Carbon,
        Objective::Knee(BALANCED_PREMIUM),
    ] {
        let d = desired(&offers, &demand, &RttTable::default(), &settings(objective));
        let want = |i: usize| d.replicas.get(&offers[i].key).copied().unwrap_or(0);
        // Seven replicas: both pools' spot first (four, then three), no pool beyond its four devices.
        assert_eq!((want(1), want(3)), (4, 3), "{objective:?}");
        assert_eq!((want(0), want(2)), (0, 0), "{objective:?}");
    }
    // More than spot can hold: on-demand takes the rest, in the room spot leaves.
    let d = desired(
        &offers,
        &[at("new-york", -74.0, 100.0)],
        &RttTable::default(),
        &settings(Objective::Cost),
    );
    let want = |i: usize| d.replicas.get(&offers[i].key).copied().unwrap_or(0);
    assert_eq!(want(1) + want(3), 8);
    assert_eq!(want(0) + want(2), 0, "both pools are full of spot replicas");
    assert!(d.unserved[0] > 19.0);
}

#[test]
fn each_location_is_served_within_the_slo_owned_first_then_by_policy() {
    let offers = vec![
        offer("cloud-east", Tier::Cloud, -75.0, 1.0, 100.0, 100),
        offer("dc-east-coal", Tier::Owned, -76.0, 2.0, 400.0, 3),
        offer("dc-east-hydro", Tier::Owned, -76.5, 2.1, 20.0, 100),
        offer("dc-west", Tier::Owned, -120.0, 1.0, 50.0, 100),
    ];
    let demand = vec![at("new-york", -74.0, 35.0), at("seattle", -122.0, 5.0)];
    let cost = desired(
        &offers,
        &demand,
        &RttTable::default(),
        &settings(Objective::Cost),
    );
    // The cheap cloud is dearer than owned capacity in tier order; the coal site is the cheapest owned one
    // and holds three replicas, the rest goes to the next owned one; Seattle is out of reach of the east.
    assert_eq!(count(&cost, "cloud-east"), 0);
    assert_eq!(count(&cost, "dc-east-coal"), 3);
    assert_eq!(count(&cost, "dc-east-hydro"), 1);
    assert_eq!(count(&cost, "dc-west"), 1);
    let green = desired(
        &offers,
        &demand,
        &RttTable::default(),
        &settings(Objective::Carbon),
    );
    assert_eq!(count(&green, "dc-east-hydro"), 4);
    assert_eq!(count(&green, "dc-east-coal"), 0);
    // Balanced: 5% dearer for 95% less carbon is worth it.
    let knee = desired(
        &offers,
        &demand,
        &RttTable::default(),
        &settings(Objective::Knee(BALANCED_PREMIUM)),
    );
    assert_eq!(count(&knee, "dc-east-hydro"), 4);
    assert!(knee.unserved.iter().all(|u| *u == 0.0));
    assert!(knee.beyond_slo.iter().all(|b| !b));
}

#[test]
fn a_full_owned_tier_spills_to_the_cloud_and_an_unreachable_location_goes_to_the_nearest() {
    let offers = vec![
        offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 2),
        offer("cloud", Tier::Cloud, -77.0, 3.0, 10.0, 100),
    ];
    let demand = vec![at("east", -75.0, 45.0), at("tokyo", 139.0, 5.0)];
    let d = desired(
        &offers,
        &demand,
        &RttTable::default(),
        &settings(Objective::Cost),
    );
    assert_eq!(count(&d, "dc"), 2);
    assert_eq!(count(&d, "cloud"), 3);
    assert!(d.beyond_slo[1]);
    assert!(!d.beyond_slo[0]);
}

#[test]
fn a_last_replica_whose_load_fits_in_the_spare_of_others_within_reach_is_given_up() {
    // Three owned pools in a row; Lyon reaches the first two, Milan the last two (checked below).
    let offers = vec![
        offer("dc-a", Tier::Owned, 0.0, 1.0, 10.0, 10),
        offer("dc-b", Tier::Owned, 3.0, 1.5, 10.0, 10),
        offer("dc-c", Tier::Owned, 6.0, 2.0, 10.0, 10),
    ];
    let demand = vec![at("lyon", 1.0, 5.0), at("milan", 5.0, 4.0)];
    let mut s = settings(Objective::Cost);
    s.slo_ms = crate::latency::estimate_rtt_ms(
        GeoPoint {
            lat: 40.0,
            lon: 0.0,
        },
        GeoPoint {
            lat: 40.0,
            lon: 3.5,
        },
    );
    let d = desired(&offers, &demand, &RttTable::default(), &s);
    assert_eq!(d.reach[0].len(), 2, "lyon reaches dc-a and dc-b");
    assert_eq!(d.reach[1].len(), 2, "milan reaches dc-b and dc-c");
    // Location by location, Lyon opens dc-a and Milan dc-b; dc-b's spare holds Lyon too, so one replica
    // serves both.
    assert_eq!(count(&d, "dc-a"), 0);
    assert_eq!(count(&d, "dc-b"), 1);
    assert_eq!(count(&d, "dc-c"), 0);
    let served: f64 = d.served.iter().flatten().map(|(_, r)| r).sum();
    assert!(
        (served - 9.0).abs() < 1e-9,
        "all demand still served: {served}"
    );
    assert!(d.served.iter().flatten().all(|(i, _)| *i == 1));
}

#[test]
fn a_small_remainder_goes_to_a_small_replica_where_that_is_worth_less() {
    // A large replica (10/s for $9) is the cheaper per unit; a small one (2/s for $5) the cheaper whole.
    let mut small = offer("dc-small", Tier::Owned, -75.0, 5.0, 50.0, 10);
    small.capacity = 2.0;
    let offers = vec![offer("dc-big", Tier::Owned, -75.0, 9.0, 90.0, 10), small];
    for objective in [
        Objective::Cost,
        Objective::Carbon,
        Objective::Knee(BALANCED_PREMIUM),
    ] {
        let plan = |rate: f64| {
            let d = desired(
                &offers,
                &[at("new-york", -74.0, rate)],
                &RttTable::default(),
                &settings(objective),
            );
            assert!(d.unserved[0] < 1e-9, "{objective:?} at {rate}");
            (count(&d, "dc-big"), count(&d, "dc-small"))
        };
        assert_eq!(
            plan(1.0),
            (0, 1),
            "{objective:?}: one small replica, not a large one idle"
        );
        assert_eq!(
            plan(11.0),
            (1, 1),
            "{objective:?}: the remainder of one large replica"
        );
        assert_eq!(
            plan(15.0),
            (2, 0),
            "{objective:?}: three small ones would cost more than one large"
        );
    }
}

#[test]
fn new_replicas_stay_where_replicas_run_unless_another_pool_is_markedly_better() {
    let plan = |usd_b: f64, running: &[(&str, u32)]| {
        let offers = vec![
            offer("dc-a", Tier::Owned, -75.0, 1.0, 10.0, 10),
            offer("dc-b", Tier::Owned, -75.5, usd_b, 10.0, 10),
        ];
        let running: BTreeMap<ReplicaKey, u32> = running
            .iter()
            .filter_map(|(site, n)| {
                let key = offers
                    .iter()
                    .find(|o| o.key.site.as_str() == *site)?
                    .key
                    .clone();
                Some((key, *n))
            })
            .collect();
        let d = desired_from(
            &offers,
            &[at("new-york", -74.0, 5.0)],
            &RttTable::default(),
            &settings(Objective::Cost),
            &running,
        );
        (count(&d, "dc-a"), count(&d, "dc-b"))
    };
    assert_eq!(plan(1.1, &[]), (1, 0), "nothing runs: the cheapest");
    assert_eq!(
        plan(1.1, &[("dc-b", 1)]),
        (0, 1),
        "10% dearer is no reason to move"
    );
    assert_eq!(plan(1.3, &[("dc-b", 1)]), (1, 0), "30% dearer is");
}

#[test]
fn spare_throughput_of_a_wanted_replica_is_used_before_a_new_one() {
    let offers = vec![
        offer("a", Tier::Owned, -75.0, 1.0, 10.0, 10),
        offer("b", Tier::Owned, -76.0, 1.5, 10.0, 10),
    ];
    // Two nearby cities of 4 req/s each: one replica (10 req/s) of the cheaper site serves both.
    let demand = vec![at("x", -75.5, 4.0), at("y", -76.2, 4.0)];
    let d = desired(
        &offers,
        &demand,
        &RttTable::default(),
        &settings(Objective::Cost),
    );
    assert_eq!(d.replicas.values().sum::<u32>(), 1);
    assert_eq!(count(&d, "a"), 1);
}

#[test]
fn the_total_stays_within_min_and_max_and_cloud_goes_first() {
    let offers = vec![
        offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 5),
        offer("cloud", Tier::Cloud, -77.0, 3.0, 10.0, 100),
    ];
    let mut s = settings(Objective::Cost);
    s.min_replicas = 2;
    let d = desired(&offers, &[], &RttTable::default(), &s);
    assert_eq!(count(&d, "dc"), 2);
    s.min_replicas = 0;
    s.max_replicas = 6;
    let d = desired(
        &offers,
        &[at("east", -75.0, 100.0)],
        &RttTable::default(),
        &s,
    );
    assert_eq!(count(&d, "dc"), 5);
    assert_eq!(count(&d, "cloud"), 1);
}

#[test]
fn replicas_over_the_maximum_go_worst_first_under_the_service_s_objective() {
    // Two cloud pools within reach: one cheap on a dirty grid, one dear on a clean one.
    let offers = vec![
        offer("cheap", Tier::Cloud, -76.0, 1.0, 100.0, 3),
        offer("clean", Tier::Cloud, -77.0, 2.0, 10.0, 3),
    ];
    let demand = [at("east", -75.0, 48.0)];
    for (objective, kept) in [(Objective::Cost, "cheap"), (Objective::Carbon, "clean")] {
        let mut s = settings(objective);
        s.max_replicas = 3;
        let d = desired(&offers, &demand, &RttTable::default(), &s);
        assert_eq!(d.replicas.values().sum::<u32>(), 3, "{objective:?}");
        assert_eq!(count(&d, kept), 3, "{objective:?}: {:?}", d.replicas);
    }
}

fn present(pairs: &[(&Offer, u32, u32)]) -> BTreeMap<ReplicaKey, Present> {
    pairs
        .iter()
        .map(|(o, ready, starting)| {
            (
                o.key.clone(),
                Present {
                    ready: *ready,
                    starting: *starting,
                },
            )
        })
        .collect()
}

#[test]
fn counts_follow_demand_only_after_their_delay_except_for_new_demand() {
    let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
    let s = settings(Objective::Cost);
    let rtt = RttTable::default();
    let mut scaler = Scaler::default();
    let mut step = |t: u64, rate: f64, p: &BTreeMap<ReplicaKey, Present>| {
        scaler
            .step(t, &offers, &[at("east", -75.0, rate)], p, &rtt, &s)
            .1
    };
    // First demand: planned for at once.
    let c = step(0, 25.0, &present(&[]));
    assert_eq!((c[0].to, c[0].why), (3, Why::Uncovered));
    // Demand doubles: nothing for a minute, then up to the level its sliding mean held over that minute.
    let three = present(&[(&offers[0], 3, 0)]);
    assert!(step(30_000, 55.0, &three).is_empty());
    assert!(step(60_000, 55.0, &three).is_empty());
    let c = step(90_000, 55.0, &three);
    assert_eq!((c[0].from, c[0].why), (3, Why::DemandRose));
    assert!(c[0].to > 3 && c[0].to < 6, "{c:?}");
    let part = present(&[(&offers[0], c[0].to, 0)]);
    for t in [120_000, 150_000] {
        step(t, 55.0, &part);
    }
    let c = step(180_000, 55.0, &part);
    assert_eq!((c[0].to, c[0].why), (6, Why::DemandRose));
    // Demand falls: nothing is removed before ten minutes of it, nor while a replica starts.
    let six = present(&[(&offers[0], 6, 0)]);
    let starting = present(&[(&offers[0], 5, 1)]);
    let mut removed = None;
    for t in (210_000..2_000_000).step_by(30_000) {
        if t >= 900_000 && removed.is_none() {
            assert!(step(t, 5.0, &starting).is_empty(), "at {t}, while starting");
        }
        let c = step(t, 5.0, &six);
        if let Some(c) = c.first() {
            assert_eq!((c.from, c.why), (6, Why::DemandFell));
            assert!(c.to < 6);
            removed = Some(t);
            break;
        }
    }
    let at = removed.expect("removed in the end");
    assert!(at >= 210_000 + 600_000, "removed at {at}");
    // Down to what the low demand needs once its mean has held for the delay.
    let c = step(at + 600_000, 5.0, &six);
    assert_eq!((c[0].from, c[0].to), (6, 1));
    // A spike is not followed at once.
    let one = present(&[(&offers[0], 1, 0)]);
    let base = at + 1_000_000;
    for t in (base..base + 700_000).step_by(30_000) {
        step(t, 5.0, &one);
    }
    assert!(step(base + 700_000, 90.0, &one).is_empty());
    assert!(step(base + 730_000, 5.0, &one).is_empty());
}

#[test]
fn a_pool_keeps_what_its_locations_needed_together_not_the_sum_of_each_one_s_peak() {
    let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
    let s = settings(Objective::Cost);
    let rtt = RttTable::default();
    let mut scaler = Scaler::default();
    let mut step = |t: u64, a: f64, b: f64, p: &BTreeMap<ReplicaKey, Present>| {
        scaler
            .step(
                t,
                &offers,
                &[at("east", -75.0, a), at("west", -77.0, b)],
                p,
                &rtt,
                &s,
            )
            .1
    };
    let c = step(0, 45.0, 15.0, &present(&[]));
    assert_eq!(c[0].to, 6, "{c:?}");
    let six = present(&[(&offers[0], 6, 0)]);
    for t in (60_000..=1_200_000).step_by(60_000) {
        assert!(step(t, 45.0, 15.0, &six).is_empty(), "at {t}");
    }
    // The two locations swap their demand: the pool's six replicas still serve both, and no more are
    // started (the sum of each location's own peak would want ten) nor any stopped.
    for t in (1_260_000..=3_000_000).step_by(60_000) {
        let c = step(t, 15.0, 45.0, &six);
        assert!(c.is_empty(), "at {t}: {c:?}");
    }
    // Both fall for good: the pool gives its replicas up once the fall has held a whole scale-down delay,
    // down to the one replica the low demand needs.
    let mut count = 6;
    let mut first_removal = None;
    for t in (3_060_000..6_000_000).step_by(60_000) {
        if let Some(c) = step(t, 5.0, 5.0, &present(&[(&offers[0], count, 0)])).first() {
            assert_eq!((c.from, c.why), (count, Why::DemandFell));
            assert!(c.to < count, "{c:?}");
            first_removal.get_or_insert(t);
            count = c.to;
        }
    }
    let at = first_removal.expect("given up in the end");
    assert!(at >= 3_060_000 + 600_000, "given up at {at}");
    assert_eq!(count, 1);
}

#[test]
fn a_location_whose_demand_pauses_keeps_a_replica_in_reach_for_a_scale_down_delay() {
    // Two pools an ocean apart, each the only one within the SLO of its city; the east is cheaper, so what
    // the service may keep while its demand falls goes to the east first.
    let offers = vec![
        offer("east", Tier::Owned, -75.0, 1.0, 10.0, 100),
        offer("west", Tier::Owned, 10.0, 2.0, 10.0, 100),
    ];
    let s = settings(Objective::Cost);
    let rtt = RttTable::default();
    let mut scaler = Scaler::default();
    let mut west = 0u32;
    let mut west_seen = None;
    for m in 0..40u64 {
        let t = m * 60_000;
        let (ny, fra) = match m {
            0..=11 => (45.0, 0.0),
            12 => (35.0, 5.0),
            _ => (35.0, 0.0),
        };
        if fra > 0.0 {
            west_seen = Some(t);
        }
        // The east's replicas stop slowly: all five still run.
        let now = present(&[(&offers[0], 5, 0), (&offers[1], west, 0)]);
        let (_, changes) = scaler.step(
            t,
            &offers,
            &[at("new-york", -74.0, ny), at("frankfurt", 9.0, fra)],
            &now,
            &rtt,
            &s,
        );
        if let Some(c) = changes.iter().find(|c| c.key == offers[1].key) {
            west = c.to;
        }
        if let Some(w) = west_seen.filter(|w| t < w + 600_000) {
            assert!(
                west >= 1,
                "minute {m}: Frankfurt had demand {} s ago and no replica",
                (t - w) / 1000
            );
        }
    }
    assert!(west_seen.is_some());
    assert_eq!(west, 0, "given up in the end");
}

#[test]
fn a_one_minute_dip_stops_no_replica_the_next_minute_would_restart() {
    // New York is served only from the east, Frankfurt only from the west. At minute 20 New York's demand dips
    // for one minute while Frankfurt's rises, so the service's total plan does not fall: only the east's does.
    let offers = vec![
        offer("east", Tier::Owned, -75.0, 1.0, 10.0, 100),
        offer("west", Tier::Owned, 10.0, 2.0, 10.0, 100),
    ];
    let s = Settings {
        window_ms: 60_000,
        ..settings(Objective::Cost)
    };
    let rtt = RttTable::default();
    let mut scaler = Scaler::default();
    let (mut east, mut west) = (0u32, 0u32);
    let mut east_counts = Vec::new();
    for m in 0..30u64 {
        let ny = if m == 20 { 20.0 } else { 50.0 };
        let fra = if m < 19 { 20.0 } else { 50.0 };
        let now = present(&[(&offers[0], east, 0), (&offers[1], west, 0)]);
        let (_, changes) = scaler.step(
            m * 60_000,
            &offers,
            &[at("new-york", -74.0, ny), at("frankfurt", 9.0, fra)],
            &now,
            &rtt,
            &s,
        );
        for c in &changes {
            if c.key == offers[0].key {
                east = c.to;
            } else if c.key == offers[1].key {
                west = c.to;
            }
        }
        east_counts.push(east);
    }
    assert_eq!(west, 5, "Frankfurt's rise is followed");
    assert!(
        east_counts[1..].iter().all(|c| *c == 5),
        "the east stopped replicas for a one-minute dip: {east_counts:?}"
    );
}

#[test]
fn demand_back_at_a_level_planned_for_within_the_scale_down_delay_is_planned_for_at_once() {
    let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
    let s = settings(Objective::Cost);
    let rtt = RttTable::default();
    let mut scaler = Scaler::default();
    let five = present(&[(&offers[0], 5, 0)]);
    let mut want = |t: u64, rate: f64| {
        let (d, _) = scaler.step(t, &offers, &[at("east", -75.0, rate)], &five, &rtt, &s);
        d.replicas.get(&offers[0].key).copied().unwrap_or(0)
    };
    for t in (0..=600_000).step_by(60_000) {
        assert_eq!(want(t, 50.0), 5);
    }
    // A dip: the plan follows it down at once (the pool keeps its replicas for the scale-down delay).
    for t in (660_000..=900_000).step_by(60_000) {
        want(t, 20.0);
    }
    assert_eq!(want(960_000, 20.0), 2);
    // Back at 50: planned for at once, not after the scale-up delay.
    assert_eq!(
        want(1_020_000, 50.0),
        4,
        "the sliding mean is half-way back"
    );
    assert_eq!(want(1_080_000, 50.0), 5);
    // A level never planned for is a spike: followed only after the scale-up delay.
    assert_eq!(want(1_140_000, 90.0), 5);
}

#[test]
fn a_new_scaler_removes_nothing_before_a_full_window() {
    let offers = vec![offer("dc", Tier::Owned, -76.0, 1.0, 10.0, 100)];
    let s = settings(Objective::Cost);
    let mut scaler = Scaler::default();
    let running = present(&[(&offers[0], 8, 0)]);
    let low = [at("east", -75.0, 5.0)];
    for t in (0..=600_000).step_by(60_000) {
        let (_, c) = scaler.step(
            1_000_000 + t,
            &offers,
            &low,
            &running,
            &RttTable::default(),
            &s,
        );
        assert_eq!(c.is_empty(), t < 600_000, "at {t}: {c:?}");
    }
}

#[test]
fn a_move_starts_the_new_replicas_before_it_stops_the_old_ones() {
    let mut offers = vec![
        offer("east", Tier::Owned, -75.0, 1.0, 10.0, 100),
        offer("west", Tier::Owned, -80.0, 1.0, 100.0, 100),
    ];
    let s = settings(Objective::Carbon);
    let rtt = RttTable::default();
    let mut scaler = Scaler::default();
    let demand = [at("pittsburgh", -77.5, 30.0)];
    let (_, c) = scaler.step(0, &offers, &demand, &present(&[]), &rtt, &s);
    assert_eq!((c[0].key.site.as_str(), c[0].to), ("east", 3));
    // The east's grid gets dirty at the next hour: the replicas move west.
    offers[0].g_co2_per_hour = 1000.0;
    let east_only = present(&[(&offers[0], 3, 0)]);
    let (_, c) = scaler.step(3_600_000, &offers, &demand, &east_only, &rtt, &s);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(
        (c[0].key.site.as_str(), c[0].to, c[0].why),
        ("west", 3, Why::DemandRose)
    );
    // While the west starts, the east keeps its replicas.
    let starting = present(&[(&offers[0], 3, 0), (&offers[1], 0, 3)]);
    let (_, c) = scaler.step(3_660_000, &offers, &demand, &starting, &rtt, &s);
    assert!(c.is_empty(), "{c:?}");
    // Once the west serves, the east goes.
    let both = present(&[(&offers[0], 3, 0), (&offers[1], 3, 0)]);
    let (_, c) = scaler.step(3_720_000, &offers, &demand, &both, &rtt, &s);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].key.site.as_str(), c[0].to), ("east", 0));
}

#[test]
fn routes_go_to_ready_replicas_within_the_slo_weighted_by_spare_capacity() {
    let offers = vec![
        offer("shared", Tier::Owned, -75.0, 1.0, 10.0, 100),
        offer("mine", Tier::Owned, -80.0, 1.0, 10.0, 100),
        offer("far", Tier::Owned, 10.0, 1.0, 10.0, 100),
    ];
    let ready: BTreeMap<ReplicaKey, u32> = [(&offers[0], 2), (&offers[1], 2), (&offers[2], 5)]
        .iter()
        .map(|(o, n)| (o.key.clone(), *n))
        .collect();
    // Two locations share "shared"; only the first reaches "mine".
    let demand = [
        at("a", -77.5, 10.0),
        at("b", -72.0, 10.0),
        at("tokyo", 139.0, 1.0),
    ];
    let table = routes(&offers, &ready, &demand, &RttTable::default(), 10.0);
    let a = &table[0].routes;
    assert_eq!(a.len(), 2);
    let w = |site: &str| {
        a.iter()
            .find(|r| r.key.site.as_str() == site)
            .map(|r| r.weight)
    };
    // "mine" serves a alone (20 of capacity for 10 of demand); "shared" splits its 20 over 20 of demand.
    assert!((w("mine").unwrap_or(0.0) - 2.0 / 3.0).abs() < 1e-9, "{a:?}");
    assert!((a.iter().map(|r| r.weight).sum::<f64>() - 1.0).abs() < 1e-9);
    assert_eq!(table[1].routes.len(), 1);
    assert_eq!(table[1].routes[0].key.site.as_str(), "shared");
    assert_eq!(table[1].routes[0].weight, 1.0);
    assert!(
        table[2].routes.is_empty(),
        "nothing within the SLO of Tokyo"
    );
    // A replica that is not ready is not routed to.
    let none: BTreeMap<ReplicaKey, u32> = BTreeMap::new();
    assert!(routes(&offers, &none, &demand, &RttTable::default(), 10.0)
        .iter()
        .all(|l| l.routes.is_empty()));
}

#[test]
fn weights_are_refused_for_a_service() {
    let w = Policy::Weights(meridian_federation::Weights::default());
    assert!(Objective::of(&w).is_err());
    assert_eq!(
        Objective::of(&Policy::Balanced),
        Ok(Objective::Knee(BALANCED_PREMIUM))
    );
    assert_eq!(
        Objective::of(&Policy::MaxCostPremium(0.05)),
        Ok(Objective::Knee(0.05))
    );
}
