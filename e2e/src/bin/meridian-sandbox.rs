//! Stand-ins for the systems real sites run, for the demo on one machine: a Slurm cluster of its own (Debian's
//! `slurmctld`/`slurmd`, GPUs as GRES over device files; root needed) and the EC2 API (moto behind the fault
//! proxy). Writes `DIR/env` (`SLURM_CONF`, `AWS_ENDPOINT_URL_EC2`, the test credentials) once both are up,
//! runs until SIGINT or SIGTERM, then prints what each was asked (Slurm's jobs from its controller's log, the
//! EC2 calls from the proxy's log) and stops them, Slurm's jobs first.
//!
//!     meridian-sandbox DIR [SLURM_GPUS] [SLURM_GPU_TYPE]
#![allow(clippy::disallowed_methods)] // a tool of its own: reads the clock

use meridian_e2e::ec2::{self, Ec2Emulator};
use meridian_e2e::slurm::SlurmCluster;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or_else(|| {
        anyhow::anyhow!("usage: meridian-sandbox DIR [SLURM_GPUS] [SLURM_GPU_TYPE]")
    })?);
    let gpus: u32 = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|e| anyhow::anyhow!("SLURM_GPUS {n:?}: {e}"))?,
        None => 2,
    };
    let gpu_type = args.next().unwrap_or_else(|| "a100".into());
    std::fs::create_dir_all(&dir)?;
    let started = std::time::Instant::now();
    let slurm = SlurmCluster::start(gpus, &gpu_type);
    let emulator = Ec2Emulator::start();
    let env = format!(
        "SLURM_CONF={}\nAWS_ENDPOINT_URL_EC2={}\nAWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\n",
        slurm.conf().display(),
        emulator.endpoint,
        ec2::ACCESS_KEY,
        ec2::SECRET_KEY
    );
    let tmp = dir.join("env.tmp");
    std::fs::write(&tmp, env)?;
    std::fs::rename(tmp, dir.join("env"))?;
    eprintln!(
        "sandbox up in {:.1} s: a Slurm cluster of {gpus} {gpu_type} GPUs ({}), the EC2 API at {}",
        started.elapsed().as_secs_f64(),
        slurm.conf().display(),
        emulator.endpoint
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;

    let allocated = slurm
        .log("slurmctld.log")
        .lines()
        .filter(|l| {
            l.contains("sched: Allocate JobId=")
                || l.contains("sched/backfill: _start_job: Started JobId=")
        })
        .count();
    let mut calls: BTreeMap<String, usize> = BTreeMap::new();
    for c in emulator.calls() {
        let key = format!(
            "{} {}",
            c["action"].as_str().unwrap_or("?"),
            c["code"].as_str().unwrap_or("?")
        );
        *calls.entry(key).or_default() += 1;
    }
    println!(
        "Slurm: {allocated} jobs allocated by slurmctld (its log: {}); sacct:",
        slurm.log_path("slurmctld.log").display()
    );
    for line in slurm
        .run(
            "sacct",
            &[
                "-P",
                "-X",
                "-o",
                "JobID,JobName%40,State,ExitCode,ElapsedRaw,AllocTRES",
            ],
        )
        .lines()
    {
        println!("  {line}");
    }
    println!("EC2 calls (the emulator's request log):");
    for (call, n) in calls {
        println!("  {n:>5}  {call}");
    }
    let instances = emulator.instances();
    println!(
        "EC2 instances: {} created, {} left running",
        instances.len(),
        emulator.live().len()
    );
    Ok(())
}
