#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::testkit::{job, site, TestEnv};
use meridian_federation::{GeoPoint, Tier};

fn service() -> ServiceSpec {
    serde_json::from_value(serde_json::json!({
        "name": "chat", "tenant": "team-a", "resources": {"kind": "gpu", "count": 1},
        "throughput": {"requests_per_s": 10.0}, "slo_ms": 30, "min_replicas": 0, "max_replicas": 4,
        "scale_up_delay_s": 0, "scale_down_delay_s": 600, "demand_window_s": 1, "policy": "cost",
        "run": {"command": "serve"}
    }))
    .unwrap()
}

fn pinned_to(e: &Event) -> Option<String> {
    match e {
        Event::Submit(s) => s.constraints.sites.first().map(|s| s.to_string()),
        _ => None,
    }
}

/// A replica pinned to a pool that other work took first is given up after [`STUCK_MS`] of waiting for
/// room, and the plan places it at the next pool, the first one held meanwhile.
#[test]
fn a_replica_that_waits_too_long_for_room_is_placed_elsewhere() {
    let mut env = TestEnv::new(vec![
        site("near-a", Tier::Owned, 40.7, -74.0)
            .gpus("A100", 1, 1.0)
            .build(),
        site("near-b", Tier::Owned, 40.8, -74.1)
            .gpus("A100", 1, 2.0)
            .build(),
    ]);
    let spec = service();
    env.step(Event::ServiceDeployed(spec.clone()));
    let mut scaling = Autoscaler::default();
    let new_york = LocationRate {
        name: "new-york".into(),
        location: GeoPoint {
            lat: 40.71,
            lon: -74.0,
        },
        rtt_region: None,
        per_s: 5.0,
    };
    scaling.report(&spec.tenant, &spec.name, vec![new_york.clone()], env.now);
    let first = scaling.plan(&env.reactor, env.now);
    assert_eq!(
        first.iter().filter_map(pinned_to).collect::<Vec<_>>(),
        ["near-a"]
    );
    // Other work takes near-a's only GPU before the replica is placed.
    let mut busy = job("busy", 1);
    busy.constraints.sites = vec![SiteId::new("near-a").unwrap()];
    env.submit(busy);
    for o in env.take_offers() {
        env.answer(&o, meridian_federation::OfferOutcome::Accepted);
        env.status(&o, meridian_federation::AttemptState::Running, 0);
    }
    for e in first {
        env.step(e);
    }
    let replica = live_replicas(&env.reactor, &spec)
        .next()
        .unwrap()
        .id
        .clone();
    assert_eq!(env.phase(&replica), JobPhase::Pending);

    // The plan follows the room at once: a replica at near-b. The one stuck at near-a is given up after
    // waiting STUCK_MS for room (until then it holds back every removal around it, as a replica that is
    // about to start). The sites stay up (heartbeats) and the gateway keeps reporting.
    let mut seen: Vec<(Millis, Event)> = Vec::new();
    for _ in 0..(STUCK_MS / 5_000 + 2) {
        env.heartbeat("near-a");
        env.heartbeat("near-b");
        env.advance(5_000);
        scaling.report(&spec.tenant, &spec.name, vec![new_york.clone()], env.now);
        for e in scaling.plan(&env.reactor, env.now) {
            seen.push((env.now, e.clone()));
            env.step(e);
        }
        for o in env.take_offers() {
            env.answer(&o, meridian_federation::OfferOutcome::Accepted);
            env.status(&o, meridian_federation::AttemptState::Running, 0);
        }
    }
    let submitted: Vec<String> = seen.iter().filter_map(|(_, e)| pinned_to(e)).collect();
    assert_eq!(submitted, ["near-b"], "{seen:?}");
    // Replicas are named by service, site and their number at the pool.
    let names: Vec<Option<String>> = seen
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Submit(s) => Some(s.name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(names, [Some(format!("{}-near-b-1", spec.name))], "{seen:?}");
    assert_eq!(
        env.reactor.state().jobs()[&replica].spec.name.as_deref(),
        Some(format!("{}-near-a-1", spec.name).as_str())
    );
    let cancelled: Vec<Millis> = seen
        .iter()
        .filter(|(_, e)| matches!(e, Event::Cancel(id) if *id == replica))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(cancelled.len(), 1, "{seen:?}");
    let waited = cancelled[0] - env.reactor.state().jobs()[&replica].submitted_ms;
    assert!((STUCK_MS..STUCK_MS + 10_000).contains(&waited), "{waited}");
    let view = scaling.view(&env.reactor, &spec, env.now);
    assert!(
        view.changes
            .iter()
            .any(|c| c.site.as_str() == "near-a" && c.why.contains("waited 120 s for room")),
        "{:?}",
        view.changes
    );
}

/// A replica that exits at once is started again after 10 s, then 20 s, then 40 s (not every planning
/// step), the service shows itself unhealthy with the exit code, and a replica that runs ten minutes
/// clears the backoff.
#[test]
fn replicas_that_keep_exiting_back_off_and_one_that_runs_ten_minutes_clears_it() {
    use meridian_federation::{AttemptState, OfferOutcome};
    let mut env = TestEnv::new(vec![site("near-a", Tier::Owned, 40.7, -74.0)
        .gpus("A100", 4, 1.0)
        .build()]);
    let mut spec = service();
    spec.min_replicas = 1;
    env.step(Event::ServiceDeployed(spec.clone()));
    let mut scaling = Autoscaler::default();
    let start = env.now;
    let mut starts: Vec<Millis> = Vec::new();
    let tick =
        |env: &mut TestEnv, scaling: &mut Autoscaler, starts: &mut Vec<Millis>, fail: bool| {
            env.heartbeat("near-a");
            for e in scaling.plan(&env.reactor, env.now) {
                if pinned_to(&e).is_some() {
                    starts.push(env.now - start);
                }
                env.step(e);
            }
            for o in env.take_offers() {
                env.answer(&o, OfferOutcome::Accepted);
                env.status(&o, AttemptState::Running, 0);
                if fail {
                    env.advance(300);
                    env.status(
                        &o,
                        AttemptState::Failed {
                            exit_code: Some(127),
                            reason: "exit code 127".into(),
                        },
                        300,
                    );
                }
            }
            env.advance(1_000);
        };
    while env.now < start + 60_000 {
        tick(&mut env, &mut scaling, &mut starts, true);
    }
    let starts_in_a_minute = starts.clone();
    assert_eq!(starts_in_a_minute.len(), 3, "{starts_in_a_minute:?}");
    let gaps: Vec<u64> = starts_in_a_minute.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        (10_000..14_000).contains(&gaps[0]) && (20_000..24_000).contains(&gaps[1]),
        "{gaps:?}"
    );
    let view = scaling.view(&env.reactor, &spec, env.now);
    assert_eq!(view.health, ServiceHealth::Unhealthy, "{view:?}");
    let b = &view.backoff[0];
    assert_eq!(
        (b.exits_in_a_row, b.last_exit_code),
        (3, Some(127)),
        "{b:?}"
    );
    assert!(b.next_start_ms > env.now, "{b:?}");
    assert!(
        view.changes
            .iter()
            .any(|c| c.why.contains("exit code 127") && c.why.contains("crash-loop backoff")),
        "{:?}",
        view.changes
    );
    // The next replica runs: after ten minutes the pool is clear and the service healthy.
    while env.now < start + 60_000 + 40_000 + crashloop::HEALTHY_RUN_MS {
        tick(&mut env, &mut scaling, &mut starts, false);
    }
    let view = scaling.view(&env.reactor, &spec, env.now);
    assert_eq!(view.health, ServiceHealth::Healthy, "{view:?}");
    assert!(view.backoff.is_empty(), "{view:?}");
    assert_eq!(starts.len(), 4, "{starts:?}");
}
