//! A cloud region whose capacity is elastic: the agent of an EC2 site creates instances through EC2's API (moto
//! in server mode behind a fault proxy that checks every signature with botocore, `e2e/src/ec2.rs`) for the
//! work the broker bursts to it, and terminates them once idle. Instances run nothing here (moto's): the
//! site's launcher is the local stand-in, which runs the attempt on the agent's host with the instance's id in
//! its environment. Checked from outside with boto3: which instances exist, in which region, with which tags.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::ec2::Ec2Emulator;
use meridian_e2e::*;
use serde_json::json;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);
/// The EC2 site keeps an idle instance this long.
const IDLE_S: u64 = 3;

/// An EC2 site, `burst`: two regions (us-east-1 with two zones, then us-east-2), two GPU types the site may
/// create (prices of the providers' public lists, as the site file would carry them), and, when `owned`, an
/// owned site `dc` of one A100 in front of it.
fn burst_federation(ec2: &Ec2Emulator, owned: bool) -> (tempfile::TempDir, Fed) {
    let dir = tempfile::tempdir().unwrap();
    let site = format!(
        r#"id = "burst"
kind = "cloud"
tier = "cloud"
latitude = 39.0
longitude = -77.5
pue = 1.15
carbon_g_per_kwh = 380

[agent]
readopt_ms = 8000

[backend]
kind = "ec2"

[backend.ec2]
endpoint = "{}"
image_id = "ami-12c6146b"
idle_s = {IDLE_S}
backoff_s = 30
max_devices = 8
regions = [
  {{ name = "us-east-1", zones = ["us-east-1a", "us-east-1b"] }},
  {{ name = "us-east-2", zones = ["us-east-2a"] }},
]
instance_types = [
  {{ name = "g5.xlarge", usd_per_hour = 1.006, spot_usd_per_hour = 0.45, gpu_power_watts = 300 }},
  {{ name = "p4d.24xlarge", usd_per_hour = 32.77, spot_usd_per_hour = 9.83, gpu_power_watts = 400 }},
]
"#,
        ec2.endpoint
    );
    std::fs::write(dir.path().join("burst.toml"), site).unwrap();
    let mut sites = vec!["\"burst.toml\""];
    if owned {
        std::fs::write(
            dir.path().join("dc.toml"),
            site_toml(&SiteSpec::new("dc", "owned", "A100", 1, 1.0)),
        )
        .unwrap();
        sites.push("\"dc.toml\"");
    }
    std::fs::write(
        dir.path().join("federation.toml"),
        format!("sites = [{}]\n", sites.join(", ")),
    )
    .unwrap();
    let f = Fed::start(&dir.path().join("federation.toml"));
    (dir, f)
}

fn tags_attempt(i: &serde_json::Value, id: &str, attempt: u32) -> bool {
    i["tags"]["meridian:attempt"] == format!("{id}__{attempt}")
}

/// Owned capacity full, a job waits its `max_wait` and bursts: the agent asks for a spot instance zone by zone
/// in us-east-1 (no capacity: EC2's `InsufficientInstanceCapacity`), then in us-east-2 (the account's spot
/// quota is spent: `MaxSpotInstanceCountExceeded`) and gets an on-demand one there, of the one-GPU type that
/// fits the job. The job runs with the instance's id, the instance is terminated once idle, and the bill
/// covers the instance's time, boot and idle included. With every region out of capacity the site refuses,
/// and the broker places elsewhere.
#[test]
fn a_burst_creates_an_instance_where_ec2_has_capacity_and_terminates_it_when_idle() {
    let ec2 = Ec2Emulator::start();
    ec2.set_faults(&json!([
        {"action": "RunInstances", "region": "us-east-1", "code": "InsufficientInstanceCapacity"},
        {"action": "RunInstances", "region": "us-east-2", "market": "spot", "code": "MaxSpotInstanceCountExceeded"},
    ]));
    let (_files, f) = burst_federation(&ec2, true);
    let (_, sites) = f.get("/v1/sites");
    let burst = sites["ok"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["site"] == "burst")
        .cloned()
        .unwrap();
    assert_eq!(burst["backend"], "ec2", "{burst}");
    let pools = burst["pools"].to_string();
    // The pools are EC2's description of the allowed types: 1 × A10G and 8 × A100.
    assert!(pools.contains("A10G") && pools.contains("A100"), "{pools}");

    // The owned A100 is taken; the next job waits 1 s, then bursts.
    let hold = f.submit(&job("hold", 1, "sleep 600"));
    f.wait_phase(&hold, "running", LONG);
    let mut spec = job(
        "burst",
        1,
        "echo instance=$MERIDIAN_INSTANCE_ID region=$MERIDIAN_INSTANCE_REGION; sleep 2",
    );
    spec["max_wait_s"] = json!(1);
    spec["spot"] = json!(true);
    let id = f.submit(&spec);
    let done = f.wait_phase(&id, "succeeded", LONG);
    assert_eq!(done["site"], "burst", "{done}");
    let instances = ec2.instances();
    let mine: Vec<_> = instances
        .iter()
        .filter(|i| tags_attempt(i, &id, 1))
        .collect();
    assert_eq!(mine.len(), 1, "{instances:?}");
    let inst = mine[0];
    assert_eq!(
        (
            inst["region"].as_str(),
            inst["type"].as_str(),
            inst["spot"].as_bool()
        ),
        (Some("us-east-2"), Some("g5.xlarge"), Some(false)),
        "the one-GPU type, on-demand, in the region with capacity: {inst}"
    );
    assert_eq!(inst["tags"]["meridian:site"], "burst");
    let (_, logs) = f.get(&format!("/v1/jobs/{id}/logs"));
    let text = logs["ok"]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains(&format!(
            "instance={} region=us-east-2",
            inst["id"].as_str().unwrap()
        )),
        "{text}"
    );
    // The calls, in order: spot then on-demand in each zone of us-east-1, then spot refused by quota and
    // on-demand granted in us-east-2; every one of them correctly signed.
    let runs: Vec<String> = ec2
        .calls()
        .iter()
        .filter(|c| c["action"] == "RunInstances")
        .map(|c| {
            format!(
                "{} {} {}",
                c["zone"].as_str().unwrap(),
                c["market"].as_str().unwrap(),
                c["code"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            "us-east-1a spot InsufficientInstanceCapacity",
            "us-east-1b spot InsufficientInstanceCapacity",
            "us-east-1a on-demand InsufficientInstanceCapacity",
            "us-east-1b on-demand InsufficientInstanceCapacity",
            "us-east-2a spot MaxSpotInstanceCountExceeded",
            "us-east-2a on-demand ok",
        ],
        "{:?}",
        ec2.calls()
    );
    assert!(ec2.calls().iter().all(|c| c["signed"] == true));

    // Idle for IDLE_S, the instance is terminated.
    let inst_id = inst["id"].as_str().unwrap().to_owned();
    f.wait_until(
        "the idle instance is terminated",
        Duration::from_secs(IDLE_S + 15),
        || {
            ec2.instances()
                .iter()
                .any(|i| i["id"] == inst_id.as_str() && i["state"] == "terminated")
        },
    );
    // Billed from launch to termination: the 2 s run, its boot and the idle time.
    let runtime_ms = done["runtime_ms"].as_u64().unwrap_or(0);
    assert!(
        runtime_ms >= 2_000 + IDLE_S * 1000,
        "boot and idle are billed: {done}"
    );
    assert!(runtime_ms < 2_000 + IDLE_S * 1000 + 10_000, "{done}");

    // Every region out of capacity: the site refuses (it does not accept and lose the job), advertises the
    // type full for a while, and the job waits for owned capacity instead.
    ec2.set_faults(&json!([
        {"action": "RunInstances", "code": "InsufficientInstanceCapacity"},
    ]));
    let mut spec = job("nowhere", 1, "echo ran-on=$MERIDIAN_SITE_ID");
    spec["max_wait_s"] = json!(1);
    let id = f.submit(&spec);
    f.wait_until("the burst site refused it", LONG, || {
        f.get(&format!("/v1/jobs/{id}/timeline"))
            .1
            .to_string()
            .contains("refused by burst")
    });
    let (code, v) = f.delete(&format!("/v1/jobs/{hold}"));
    assert_eq!(code, 200, "{v}");
    let done = f.wait_phase(&id, "succeeded", LONG);
    assert_eq!(
        done["site"], "dc",
        "placed elsewhere once the owned site was free: {done}"
    );
    assert!(ec2.live().is_empty(), "{:?}", ec2.live());
}

/// A spot instance reclaimed by the provider under a running attempt: the attempt is interrupted and the next
/// one resumes from its checkpoint on a new instance. An agent killed mid-burst and started again takes its
/// running attempt back on the same instance, and terminates an instance tagged as the site's that nothing
/// holds; a broker restarted mid-burst changes nothing. At the end no instance is left running.
#[test]
fn a_spot_reclaim_requeues_and_restarts_leave_no_orphan_instance() {
    let ec2 = Ec2Emulator::start();
    let (_files, mut f) = burst_federation(&ec2, false);

    let mut spec = job(
        "resumable",
        1,
        "if [ -n \"$MERIDIAN_RESUME_FROM\" ]; then echo resumed from $MERIDIAN_RESUME_FROM on $MERIDIAN_INSTANCE_ID; exit 0; fi; \
         echo s3://ckpt/step-7 > $MERIDIAN_CHECKPOINT_FILE; sleep 600",
    );
    spec["spot"] = json!(true);
    spec["checkpointable"] = json!(true);
    let id = f.submit(&spec);
    f.wait_phase(&id, "running", LONG);
    f.wait_until("the checkpoint is reported", LONG, || {
        f.job(&id)["checkpoint"] == "s3://ckpt/step-7"
    });
    let first = ec2
        .instances()
        .into_iter()
        .find(|i| tags_attempt(i, &id, 1))
        .unwrap();
    assert_eq!(first["spot"], true, "{first}");
    ec2.reclaim(
        first["id"].as_str().unwrap(),
        first["region"].as_str().unwrap(),
    );
    let done = f.wait_phase(&id, "succeeded", LONG);
    assert_eq!(done["attempt"], 2, "{done}");
    let (_, logs) = f.get(&format!("/v1/jobs/{id}/logs"));
    let text = logs["ok"]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("resumed from s3://ckpt/step-7 on i-"),
        "{text}"
    );
    let (_, timeline) = f.get(&format!("/v1/jobs/{id}/timeline"));
    assert!(
        timeline.to_string().contains("spot capacity reclaimed"),
        "{timeline}"
    );

    // Mid-burst: a long job runs on its instance; the agent is killed, and meanwhile an instance tagged as the
    // site's appears that no attempt holds (one created just before a crash, say).
    let id = f.submit(&job("kept", 1, "sleep 600"));
    f.wait_phase(&id, "running", LONG);
    // (It runs on the instance the resumed attempt left idle: an instance is kept for the next attempt.)
    let live = ec2.live();
    assert_eq!(live.len(), 1, "{live:?}");
    let kept = live[0].clone();
    f.fed.kill_agent("burst");
    let orphan = ec2.run_tagged("burst", "g5.xlarge", "us-east-1");
    f.fed.restart_agent("burst").unwrap();
    f.wait_until("the orphan is terminated", LONG, || {
        ec2.instances()
            .iter()
            .any(|i| i["id"] == orphan.as_str() && i["state"] == "terminated")
    });
    let j = f.job(&id);
    assert_eq!(
        (j["phase"].as_str(), j["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "taken back, not run again: {j}"
    );
    assert!(ec2.live().iter().any(|i| i["id"] == kept["id"]));
    // A broker restarted mid-burst: the attempt goes on.
    f.fed.restart_broker().unwrap();
    f.wait_until("the restarted broker answers", LONG, || {
        f.try_get(&format!("/v1/jobs/{id}"))
            .is_some_and(|(code, _)| code == 200)
    });
    assert_eq!(f.job(&id)["attempt"], 1);
    let (code, v) = f.delete(&format!("/v1/jobs/{id}"));
    assert_eq!(code, 200, "{v}");
    f.wait_phase(&id, "cancelled", LONG);
    f.wait_until(
        "no instance is left running",
        Duration::from_secs(IDLE_S + 20),
        || ec2.live().is_empty(),
    );
}
