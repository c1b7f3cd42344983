//! A site whose GPUs sit behind Slurm: the agent drives the cluster's own scheduler (real `slurmctld` and
//! `slurmd`, Debian's 22.05, with GPUs declared as GRES) through `sbatch`, `squeue`, `scontrol` and
//! `scancel`. The site advertises what Slurm reports free: it shrinks when the cluster's own users take GPUs
//! and drops to nothing when the node is drained. A job asking for 2 GPUs runs as a Slurm batch job and sees
//! the devices Slurm picked (not Meridian's: another user of the cluster holds the first two); its exit code
//! arrives as it was; its log is read back; `meridian cancel` cancels it in Slurm.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::slurm::SlurmCluster;
use meridian_e2e::*;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// A federation of one site, `hpc`, with 4 A100s behind this Slurm cluster; its files live as long as the
/// folder returned.
fn hpc_federation(slurm: &SlurmCluster) -> (tempfile::TempDir, Fed) {
    let dir = tempfile::tempdir().unwrap();
    let prefix: Vec<String> = slurm
        .command_prefix()
        .iter()
        .map(|p| format!("{p:?}"))
        .collect();
    let site = format!(
        "{}\n[backend]\nkind = \"slurm\"\n[backend.slurm]\ncommand_prefix = [{}]\nstart_within_s = 5\n",
        site_toml(&SiteSpec::new("hpc", "owned", "A100", 4, 1.0)),
        prefix.join(", ")
    );
    std::fs::write(dir.path().join("hpc.toml"), site).unwrap();
    std::fs::write(
        dir.path().join("federation.toml"),
        "sites = [\"hpc.toml\"]\n",
    )
    .unwrap();
    let f = Fed::start(&dir.path().join("federation.toml"));
    (dir, f)
}

#[test]
fn a_slurm_site_runs_meridians_jobs_as_slurm_jobs() {
    let slurm = SlurmCluster::start(4, "a100");

    let (_files, f) = hpc_federation(&slurm);
    let (_, sites) = f.get("/v1/sites");
    assert_eq!(sites["ok"][0]["backend"], "slurm", "{sites}");
    let free = |f: &Fed| f.get("/v1/sites").1["ok"][0]["pools"][0]["free_milli"].as_u64();
    assert_eq!(free(&f), Some(4000));
    // A user of the cluster who is not Meridian takes two GPUs: the site's advert follows within a poll.
    let theirs = slurm.run(
        "sbatch",
        &["--parsable", "--gres=gpu:a100:2", "--wrap", "sleep 300"],
    );
    assert!(!theirs.trim().is_empty(), "sbatch of the site's own user");
    f.wait_until(
        "the site advertises what Slurm has free",
        Duration::from_secs(10),
        || free(&f) == Some(2000),
    );

    // Two GPUs, an exit code of 3: Slurm's devices, Slurm's job, the code as it was.
    let id = f.submit(&job(
        "two-gpus",
        2,
        "echo devices=$CUDA_VISIBLE_DEVICES slurm_job=$SLURM_JOB_ID meridian_job=$MERIDIAN_JOB_ID; exit 3",
    ));
    let done = f.wait_phase(&id, "failed", LONG);
    assert_eq!(done["exit_code"], 3, "{done}");
    let (_, logs) = f.get(&format!("/v1/jobs/{id}/logs"));
    let text = logs["ok"]["text"].as_str().unwrap_or_default().to_owned();
    assert!(
        text.contains("devices=2,3"),
        "Slurm picks the devices: {text}"
    );
    assert!(text.contains(&format!("meridian_job={id}")), "{text}");
    assert!(!text.contains("slurm_job= "), "{text}");
    // Billed as Slurm allocated it: the ledger's GPU-seconds are sacct's (ElapsedRaw × gres/gpu of AllocTRES).
    let name = format!("meridian-{id}__1");
    f.wait_until("sacct has the job", LONG, || {
        slurm.accounted(&name).is_some()
    });
    let (elapsed_s, gpus) = slurm.accounted(&name).unwrap();
    assert_eq!(gpus, 2, "{name}");
    assert_eq!(
        done["runtime_ms"].as_u64(),
        Some(elapsed_s * 1000),
        "the attempt is billed for sacct's elapsed time: {done}"
    );

    // A long one: it is a job in Slurm's queue, and `meridian cancel` cancels it there.
    let id = f.submit(&job("long", 1, "sleep 600"));
    f.wait_phase(&id, "running", LONG);
    let name = format!("meridian-{id}__1");
    f.wait_until("the job is in Slurm's queue", LONG, || {
        slurm
            .queue()
            .iter()
            .any(|(_, n, s)| n == &name && s == "RUNNING")
    });
    let (code, v) = f.delete(&format!("/v1/jobs/{id}"));
    assert_eq!(code, 200, "{v}");
    f.wait_phase(&id, "cancelled", LONG);
    f.wait_until("Slurm no longer runs it", LONG, || {
        !slurm.queue().iter().any(|(_, n, _)| n == &name)
    });
    // The site's own user's job was left alone.
    assert!(
        slurm.queue().iter().any(|(i, _, _)| i == theirs.trim()),
        "{:?}",
        slurm.queue()
    );
    f.wait_until(
        "the cancelled job's GPU is free again",
        Duration::from_secs(10),
        || free(&f) == Some(2000),
    );
    // A drained node gives nothing.
    slurm.run(
        "scontrol",
        &[
            "update",
            "nodename=gpu1",
            "state=drain",
            "reason=maintenance",
        ],
    );
    f.wait_until(
        "a drained node advertises nothing free",
        Duration::from_secs(10),
        || free(&f) == Some(0),
    );
}

/// Slurm preempts a Meridian job for the cluster's own urgent work: the attempt ends as interrupted, the job is
/// requeued and its next attempt resumes from the checkpoint it reported. An agent killed and restarted takes
/// back the Slurm job it was running: the same attempt goes on, and a cancel still reaches Slurm.
#[test]
fn a_slurm_preemption_requeues_from_the_checkpoint_and_a_restarted_agent_takes_its_jobs_back() {
    let slurm = SlurmCluster::start(4, "a100");
    let (_files, mut f) = hpc_federation(&slurm);

    let mut spec = job(
        "resumable",
        1,
        "if [ -n \"$MERIDIAN_RESUME_FROM\" ]; then echo resumed from $MERIDIAN_RESUME_FROM; exit 0; fi; \
         echo s3://ckpt/step-1 > $MERIDIAN_CHECKPOINT_FILE; sleep 600",
    );
    spec["checkpointable"] = serde_json::json!(true);
    let id = f.submit(&spec);
    f.wait_phase(&id, "running", LONG);
    f.wait_until("the checkpoint is reported", LONG, || {
        f.job(&id)["checkpoint"] == "s3://ckpt/step-1"
    });
    // The cluster's own urgent work needs every GPU: Slurm preempts Meridian's job.
    slurm.run(
        "sbatch",
        &[
            "--partition=urgent",
            "--gres=gpu:a100:4",
            "--wrap",
            "sleep 4",
        ],
    );
    let done = f.wait_phase(&id, "succeeded", Duration::from_secs(90));
    assert_eq!(done["attempt"], 2, "{done}");
    let (_, logs) = f.get(&format!("/v1/jobs/{id}/logs"));
    let text = logs["ok"]["text"].as_str().unwrap_or_default();
    assert!(text.contains("resumed from s3://ckpt/step-1"), "{logs}");
    let (_, timeline) = f.get(&format!("/v1/jobs/{id}/timeline"));
    assert!(
        timeline.to_string().contains("PREEMPTED"),
        "the first attempt ended by Slurm's preemption: {timeline}"
    );

    // An agent killed and started again takes its Slurm job back.
    let id = f.submit(&job("kept", 1, "sleep 600"));
    f.wait_phase(&id, "running", LONG);
    let name = format!("meridian-{id}__1");
    f.wait_until("the job is in Slurm's queue", LONG, || {
        slurm.queue().iter().any(|(_, n, _)| n == &name)
    });
    f.fed.kill_agent("hpc");
    f.fed.restart_agent("hpc").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let j = f.job(&id);
    assert_eq!(
        (j["phase"].as_str(), j["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{j}"
    );
    assert!(slurm
        .queue()
        .iter()
        .any(|(_, n, s)| n == &name && s == "RUNNING"));
    let (code, v) = f.delete(&format!("/v1/jobs/{id}"));
    assert_eq!(code, 200, "{v}");
    f.wait_phase(&id, "cancelled", LONG);
    f.wait_until("Slurm no longer runs it", LONG, || {
        !slurm.queue().iter().any(|(_, n, _)| n == &name)
    });

    // Slurm takes a job it cannot start (its partition is down): past the site's start deadline (5 s) the
    // attempt is cancelled in Slurm and reported as not started; with the partition up, the next one runs.
    slurm.run("scontrol", &["update", "partitionname=gpu", "state=down"]);
    let id = f.submit(&job("stuck", 1, "echo ran"));
    f.wait_until("the pending attempt is given up", LONG, || {
        f.get(&format!("/v1/jobs/{id}/timeline"))
            .1
            .to_string()
            .contains("could not start: pending in Slurm")
    });
    assert!(
        !slurm
            .queue()
            .iter()
            .any(|(_, n, _)| n == &format!("meridian-{id}__1")),
        "cancelled in Slurm: {:?}",
        slurm.queue()
    );
    slurm.run("scontrol", &["update", "partitionname=gpu", "state=up"]);
    let done = f.wait_phase(&id, "succeeded", LONG);
    assert!(done["attempt"].as_u64() >= Some(2), "{done}");
}
