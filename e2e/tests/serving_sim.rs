//! The serving simulation as a user runs it (the real `meridian` binary, the GenAI QPS curve and the city list
//! from ../shared/data), and its independent checker made to catch broken schedules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use meridian_core::autoscale::Objective;
use meridian_e2e::*;
use meridian_tools::sim::serving::{self, check, engine};
use meridian_tools::sim::SimOptions;
use serde_json::Value;
use std::process::Command;

const SERVICE: &str = "configs/sim/service.toml";
const FEDERATION: &str = "configs/sim/federation-serving.toml";

fn qps() -> String {
    let p = meridian_broker::data::data_dir().join("alibaba-genai-qps-2026/qps.csv");
    assert!(p.exists(), "shared data file {} is missing", p.display());
    p.display().to_string()
}

fn field(r: &Value, k: &str) -> f64 {
    r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"))
}

/// One day of the GenAI curve over the world's cities: the autoscaler serves at least 99% of the demand within
/// the SLO at under 60% of the static peak plan's cost and carbon, serves at least what the SkyServe-style
/// baselines serve, and the checker confirms every run. With the SkyServe-style baseline's own delays (the
/// service file's), green emits at most 0.8× that baseline's carbon at no more than 1.05× its cost.
#[test]
fn the_autoscaler_follows_demand_within_the_slo_at_a_fraction_of_the_static_plan() {
    let out = Command::new(local::sibling_binary("meridian").unwrap())
        .current_dir(local::workspace_root())
        .args([
            "--output",
            "json",
            "sim",
            "--service",
            SERVICE,
            "--federation",
            FEDERATION,
        ])
        .args([
            "--demand",
            &qps(),
            "--days",
            "1",
            "--policy",
            "balanced,green",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "sim failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    println!("{report:#}");
    let runs = report["runs"].as_array().unwrap();
    let run = |name: &str| runs.iter().find(|r| r["policy"] == name).unwrap();
    let (auto, green, stat) = (
        run("meridian balanced"),
        run("meridian green"),
        run("static peak plan"),
    );
    let sky = [
        run("skyserve-style per region"),
        run("skyserve-style global"),
    ];
    assert!(report["cities"].as_u64().unwrap() > 200, "{report}");
    assert!(field(&report, "peak_reference_replicas") >= 100.0);
    for r in runs {
        assert_eq!(r["violations"], 0, "checker findings in {r}");
    }
    assert!(field(auto, "slo_attainment") >= 0.99, "{auto}");
    assert!(field(auto, "cost_usd") <= 0.6 * field(stat, "cost_usd"));
    assert!(field(auto, "co2_kg") <= 0.6 * field(stat, "co2_kg"));
    for (a, s) in [auto, green].into_iter().flat_map(|a| sky.map(|s| (a, s))) {
        assert!(
            field(a, "slo_attainment") >= field(s, "slo_attainment"),
            "{a}\n{s}"
        );
    }
    let per_region = sky[0];
    assert!(field(green, "slo_attainment") >= 0.99, "{green}");
    assert!(
        field(green, "co2_kg") <= 0.8 * field(per_region, "co2_kg"),
        "{green}\n{per_region}"
    );
    assert!(
        field(green, "cost_usd") <= 1.05 * field(per_region, "cost_usd"),
        "{green}\n{per_region}"
    );
    // The autoscaler changed counts as the day went: the static plan never did after its start.
    assert!(auto["scale_events"].as_u64().unwrap() > 50);
    assert!(field(auto, "replica_hours") < field(stat, "replica_hours"));
}

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    sim: SimOptions,
}

/// A real run's schedule passes the checker; each way of breaking it is caught with a message that says what.
#[test]
fn the_checker_catches_an_overfull_pool_a_replica_not_ready_a_route_beyond_the_slo_and_wrong_totals(
) {
    let root = local::workspace_root();
    let opts = Args::parse_from([
        "sim",
        "--service",
        &root.join(SERVICE).display().to_string(),
        "--federation",
        &root.join(FEDERATION).display().to_string(),
        "--demand",
        &qps(),
        "--days",
        "1",
        "--peak-replicas",
        "20",
    ])
    .sim;
    let l = serving::load(&opts).unwrap();
    let ctx = l.ctx(opts.start_ms, 2);
    let out = engine::run(
        &ctx,
        engine::Scaling::Autoscaler(Objective::Knee(meridian_core::autoscale::BALANCED_PREMIUM)),
    );
    let points = l.city_points();
    let inputs = check::Inputs {
        fed: &l.fed,
        spec: &l.spec,
        cities: &points,
        demand: &l.demand,
        start_ms: opts.start_ms,
    };
    let stated = check::stated(&out);
    assert_eq!(check::check(&inputs, &out, stated), Vec::<String>::new());
    assert!(out.routes.len() > 1000);

    let finds = |broken: &engine::Outcome, stated: check::Stated, what: &str| {
        let found = check::check(&inputs, broken, stated);
        assert!(
            found.iter().any(|f| f.contains(what)),
            "expected a finding with {what:?}, got {found:?}"
        );
    };
    // A pool holding more replicas than it has devices.
    let mut over = out.clone();
    let first = over.replicas[0].clone();
    for _ in 0..200 {
        let mut r = first.clone();
        r.id = over.replicas.len();
        over.replicas.push(r);
    }
    finds(&over, check::stated(&over), "has room for");
    // A replica serving before it is ready.
    let mut early = out.clone();
    let route = early.routes.iter().position(|r| r.minute > 10).unwrap();
    let replica = early.routes[route].replica as usize;
    early.replicas[replica].ready_min = early.routes[route].minute as usize + 1;
    finds(&early, stated, "is not ready then");
    // A replica serving more than its throughput.
    let mut heavy = out.clone();
    let extra = heavy.routes[0];
    for _ in 0..2000 {
        heavy.routes.push(extra);
    }
    let heavy_stated = check::Stated {
        served: heavy.routes.iter().map(|r| r.amount).sum(),
        ..stated
    };
    finds(&heavy, heavy_stated, "its throughput is");
    // A city served from a replica beyond the SLO: its routes handed to the city farthest from that replica.
    let mut far = out.clone();
    let r0 = far.routes[0];
    let site = l
        .fed
        .sites
        .iter()
        .find(|s| s.id == far.replicas[r0.replica as usize].key.site)
        .unwrap()
        .info_at(opts.start_ms)
        .location;
    let farthest = (0..l.cities.len())
        .max_by(|a, b| {
            let d = |c: usize| meridian_core::latency::distance_km(l.cities[c].location, site);
            d(*a).total_cmp(&d(*b))
        })
        .unwrap();
    far.routes[0].city = farthest as u32;
    finds(&far, stated, "beyond the");
    // Totals that differ from the replicas' minutes.
    let wrong = check::Stated {
        cost_usd: stated.cost_usd * 1.02,
        ..stated
    };
    finds(&out, wrong, "cost (USD)");
    let wrong = check::Stated {
        co2_kg: stated.co2_kg * 0.9,
        ..stated
    };
    finds(&out, wrong, "carbon (kgCO2e)");
}
