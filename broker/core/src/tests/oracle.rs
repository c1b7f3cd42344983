//! Oracle tests: placement never breaks a hard constraint, never loses to brute force on its objective, and
//! the index never changes a placement.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

mod placement_oracle {
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
            spec.resources.models = model.map(|m| vec![["A100", "H100"][m].into()]).unwrap_or_default();
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

    /// A decision for a tenant that has spent `spent` so far, with or without the index.
    fn spending(
        sites: &std::collections::BTreeMap<meridian_federation::SiteId, crate::model::Site>,
        spec: &JobSpec,
        index: Option<&SiteIndex>,
        spent: crate::placement::Spent,
    ) -> Outcome {
        let (rtt, regions) = (
            crate::latency::RttTable::default(),
            crate::regions::Regions::default(),
        );
        let throughput = crate::throughput::Throughput::default();
        let view = crate::placement::View {
            sites,
            rtt: &rtt,
            regions: &regions,
            throughput: &throughput,
            index,
            format: crate::durable::FORMAT_VERSION,
        };
        let request = crate::placement::Request {
            spec,
            waited_ms: 0,
            refused: &[],
            capped: &[],
            baseline: None,
            spent,
            queue_policy: None,
        };
        crate::placement::place(view, request, 0).outcome
    }

    /// The job is placed exactly where a scan of every site places it, with the site index, for a tenant that
    /// has banked premium (its earlier jobs cost their cheapest: the premium rules may spend more on this one,
    /// up to their per-job cap).
    fn index_agrees(
        sites: &std::collections::BTreeMap<meridian_federation::SiteId, crate::model::Site>,
        spec: &JobSpec,
        banked: Option<u64>,
    ) -> Result<(), TestCaseError> {
        let mut index = SiteIndex::default();
        for s in sites.values() {
            index.update(s, &Default::default());
        }
        let spent = crate::placement::Spent {
            chosen_micro_usd: banked.unwrap_or(0),
            cheapest_micro_usd: banked.unwrap_or(0),
        };
        let full = spending(sites, spec, None, spent);
        let indexed = spending(sites, spec, Some(&index), spent);
        match (&full, &indexed) {
            (Outcome::Place(a), Outcome::Place(b)) => {
                prop_assert_eq!(&a.site, &b.site);
                prop_assert_eq!(&a.devices, &b.devices);
            }
            (Outcome::Wait(a), Outcome::Wait(b)) => prop_assert_eq!(a, b),
            _ => prop_assert!(false, "full scan {:?} vs index {:?}", full, indexed),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Where the searches stop early matters only when there are many sites: on a federation of a few
        /// hundred, with prices and carbon spread as real ones are, the index still places every job exactly
        /// where a scan of every site does, under the rules that search several terms.
        #[test]
        fn the_index_changes_no_placement_among_hundreds_of_sites(
            seed in any::<u64>(),
            n in 100usize..400,
            policy in 0usize..4,
            need in 1u32..5,
            banked in proptest::option::of(0u64..500_000_000),
            inference in any::<bool>(),
        ) {
            let mut x = seed | 1;
            let mut next = move |below: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % below
            };
            let adverts: Vec<SiteAdvert> = (0..n).map(|i| {
                let devices = 4 + next(12) as u32;
                let mut b = site(
                    &format!("s{i:03}"),
                    Tier::ALL[(next(10) / 8) as usize],
                    next(120) as f64 - 60.0,
                    next(340) as f64 - 170.0,
                )
                .gpus(["A100", "H100", "L4"][next(3) as usize], devices, 0.5 + next(400) as f64 / 100.0)
                .carbon(20 + next(680) as u32);
                for d in 0..next(u64::from(devices) + 1) as u32 {
                    b = b.used(d as usize, 1000);
                }
                b.build()
            }).collect();
            let sites = sites(adverts);
            let mut spec = job("k", need);
            let weighted = Policy::Weights(Weights { cost: 1.0, energy: 0.0, carbon: 2.0, latency: 0.5, data: 0.0 });
            spec.policy = Some([Policy::Balanced, Policy::MaxCostPremium(0.05), Policy::CarbonPriceUsdPerT(190.0), weighted][policy].clone());
            if inference {
                spec.kind = JobKind::Inference;
            }
            spec.users = vec![UserLocation {
                name: None,
                location: GeoPoint { lat: next(100) as f64 - 50.0, lon: next(300) as f64 - 150.0 },
                weight: 1.0,
                rtt_region: None,
            }];
            index_agrees(&sites, &spec, banked)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// With the index, a decision places the job exactly where a scan of every site does.
        #[test]
        fn the_index_changes_no_placement(
            counts in proptest::collection::vec((1u32..9, 0u32..9, 0usize..3, 1u32..40, 0u32..700), 1..12),
            need in 1u32..6,
            share in proptest::option::of(1u32..1000),
            policy in 0usize..7,
            users in proptest::collection::vec((-60.0f64..60.0, -170.0f64..170.0, 0.1f64..5.0), 1..4),
            inference in any::<bool>(),
            banked in proptest::option::of(0u64..200_000_000),
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
            let mut spec = job("k", need);
            if let Some(m) = share {
                spec.resources.count = 0;
                spec.resources.milli = Some(m);
            }
            let weighted = Policy::Weights(Weights { cost: 1.0, energy: 0.0, carbon: 2.0, latency: 0.5, data: 0.0 });
            spec.policy = Some([Policy::Latency, Policy::Cost, Policy::Green, Policy::Balanced, weighted, Policy::CarbonPriceUsdPerT(500.0), Policy::MaxCostPremium(0.1)][policy].clone());
            if inference {
                spec.kind = JobKind::Inference;
            }
            spec.users = users
                .iter()
                .map(|(lat, lon, w)| UserLocation { name: None, location: GeoPoint { lat: *lat, lon: *lon }, weight: *w, rtt_region: None })
                .collect();
            index_agrees(&sites, &spec, banked)?;
        }
    }
}
