//! The Slurm backend: each attempt is a batch job of the site's own Slurm cluster, driven through Slurm's
//! command-line tools (`sbatch`, `squeue`, `scontrol`, `sacct`, `scancel`) — the stable interface across
//! Slurm releases (slurmrestd's field names change between API versions) — behind a configurable command
//! prefix: nothing where the tools are on the agent's host, `ssh login-node` where they are on another,
//! `env SLURM_CONF=…` for a cluster of its own.
//!
//! Slurm picks the physical devices: the job asks for `--gres=gpu:<model>:<count>` and Slurm sets
//! `CUDA_VISIBLE_DEVICES` itself. The batch script `exec`s `srun`, so Slurm's signals (a cancel, a
//! preemption's grace) reach the command. Slurm's states map onto Meridian's: PREEMPTED, NODE_FAIL and
//! BOOT_FAIL end an attempt as interrupted (it runs again, from its checkpoint), TIMEOUT and OUT_OF_MEMORY as
//! failed with that reason, and CANCELLED not asked for by Meridian as interrupted ("cancelled by the site").
//! Exit codes come from `scontrol`, then `sacct -P` (22.05's `sacct --json` reports 0 for a failed job).
#![allow(clippy::disallowed_methods)] // I/O at the edge: paces its reads of Slurm's queue by the clock

use crate::backend::{Attempt, Backend, Found, Handle, Seen};
use crate::AdapterError;
use meridian_federation::{BackendKind, PoolAdvert, PoolName};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `[backend.slurm]` in a site file.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSettings {
    /// Put before every Slurm command: `["ssh", "login-node"]`, `["env", "SLURM_CONF=/etc/slurm/x.conf"]`;
    /// empty runs the tools on the agent's host.
    #[serde(default)]
    pub command_prefix: Vec<String>,
    /// The partition of each pool (by pool name); Slurm's default partition for the others.
    #[serde(default)]
    pub partitions: BTreeMap<String, String>,
    /// The Slurm account of each tenant; Slurm's default account for the others.
    #[serde(default)]
    pub accounts: BTreeMap<String, String>,
    /// The Slurm QoS of each tenant; the account's default QoS for the others.
    #[serde(default)]
    pub qos: BTreeMap<String, String>,
    /// The Slurm node behind each node of a pool (by pool name, in Meridian's node order): an attempt packed on
    /// node *k* is pinned there (`--nodelist`); Slurm picks the node for the other pools.
    #[serde(default)]
    pub nodes: BTreeMap<String, Vec<String>>,
    /// How long an attempt may wait in Slurm's queue before it is cancelled and reported as not started (the
    /// broker then places it again), seconds.
    #[serde(default = "default_start_within_s")]
    pub start_within_s: u64,
}

fn default_start_within_s() -> u64 {
    300
}

impl Default for SlurmSettings {
    fn default() -> Self {
        SlurmSettings {
            command_prefix: Vec::new(),
            partitions: BTreeMap::new(),
            accounts: BTreeMap::new(),
            qos: BTreeMap::new(),
            nodes: BTreeMap::new(),
            start_within_s: default_start_within_s(),
        }
    }
}

/// How often Slurm's queue is read at most.
const QUEUE_EVERY: Duration = Duration::from_millis(1000);

pub struct SlurmBackend {
    settings: SlurmSettings,
    /// Jobs this agent cancelled: a CANCELLED end is then Meridian's, not the site's.
    cancelled: HashSet<Handle>,
    /// Slurm's queue as last read (job id → state), and when.
    queue: Option<(Instant, HashMap<String, String>)>,
    /// Ends already looked up, kept until the attempt is forgotten.
    ended: HashMap<Handle, Seen>,
    /// When each attempt was submitted (its start deadline counts from there).
    submitted: HashMap<Handle, Instant>,
}

impl SlurmBackend {
    pub fn new(settings: SlurmSettings) -> Self {
        SlurmBackend {
            settings,
            cancelled: HashSet::new(),
            queue: None,
            ended: HashMap::new(),
            submitted: HashMap::new(),
        }
    }

    fn command(&self, program: &str) -> Command {
        let mut prefix = self.settings.command_prefix.iter();
        match prefix.next() {
            Some(first) => {
                let mut c = Command::new(first);
                c.args(prefix).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    /// Runs a Slurm tool; its standard output, or an error with its standard error.
    fn run(&self, program: &str, args: &[String], input: Option<&str>) -> Result<String, String> {
        let mut c = self.command(program);
        c.args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("{program}: {e}"))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write;
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("{program}: writing its input: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{program} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Slurm's queue: job id → state, read at most every [`QUEUE_EVERY`].
    fn queue(&mut self) -> Option<&HashMap<String, String>> {
        let fresh = self
            .queue
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < QUEUE_EVERY);
        if !fresh {
            let args = ["--noheader", "--format=%i|%T"].map(str::to_owned);
            match self.run("squeue", &args, None) {
                Ok(text) => self.queue = Some((Instant::now(), parse_queue(&text))),
                Err(e) => {
                    tracing::warn!("reading Slurm's queue: {e}");
                    return None;
                }
            }
        }
        self.queue.as_ref().map(|(_, q)| q)
    }

    /// How a job that left the queue ended: from `scontrol`, else `sacct -P`.
    fn end_of(&self, h: &Handle) -> Option<(String, i32)> {
        let id = h.0.clone();
        if let Ok(text) = self.run(
            "scontrol",
            &["-o".into(), "show".into(), "job".into(), id.clone()],
            None,
        ) {
            if let Some(end) = parse_scontrol(&text) {
                return Some(end);
            }
        }
        let args = ["-P", "-n", "-X", "-o", "State,ExitCode", "-j"]
            .map(str::to_owned)
            .into_iter()
            .chain([id])
            .collect::<Vec<_>>();
        self.run("sacct", &args, None)
            .ok()
            .and_then(|t| parse_sacct(&t))
    }

    /// When Slurm started and ended a job, ms since the epoch: from `scontrol`, else `sacct` (times asked
    /// for as epoch seconds, `SLURM_TIME_FORMAT=%s`, through `env` so that it crosses a command prefix).
    fn allocation_of(&self, h: &Handle) -> Option<(u64, u64)> {
        let env = |tool: &str, args: &[&str]| {
            let mut all = vec!["SLURM_TIME_FORMAT=%s".to_owned(), tool.to_owned()];
            all.extend(args.iter().map(|a| (*a).to_owned()));
            self.run("env", &all, None).ok()
        };
        env("scontrol", &["-o", "show", "job", &h.0])
            .and_then(|t| parse_allocation_scontrol(&t))
            .or_else(|| {
                env("sacct", &["-P", "-n", "-X", "-o", "Start,End", "-j", &h.0])
                    .and_then(|t| parse_allocation_sacct(&t))
            })
    }

    fn seen(&self, h: &Handle, state: &str, exit_code: i32) -> Seen {
        match state {
            "COMPLETED" | "FAILED" => Seen::Ended(exit_code),
            "CANCELLED" if self.cancelled.contains(h) => Seen::Ended(143),
            "CANCELLED" => Seen::Interrupted("cancelled by the site (Slurm: CANCELLED)".into()),
            "TIMEOUT" => Seen::Failed {
                exit_code: None,
                reason: "ran past its Slurm time limit (TIMEOUT)".into(),
            },
            "OUT_OF_MEMORY" => Seen::Failed {
                exit_code: None,
                reason: "out of memory (Slurm: OUT_OF_MEMORY)".into(),
            },
            other => Seen::Interrupted(format!("Slurm ended it: {other}")),
        }
    }
}

impl Backend for SlurmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Slurm
    }

    fn submit(&mut self, a: &Attempt<'_>) -> Result<Handle, AdapterError> {
        std::fs::create_dir_all(a.dir).map_err(AdapterError::Spawn)?;
        let args = sbatch_args(&self.settings, a);
        let script = batch_script(a);
        let out = self
            .run("sbatch", &args, Some(&script))
            .map_err(|e| AdapterError::Backend(format!("sbatch refused the job: {e}")))?;
        // `--parsable` prints `id` or `id;cluster`.
        let id = out
            .trim()
            .split(';')
            .next()
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| {
                AdapterError::Backend(format!("sbatch printed no job id: {:?}", out.trim()))
            })?;
        tracing::info!("attempt {} is Slurm job {id}", a.name);
        self.queue = None;
        let h = Handle(id.to_owned());
        self.submitted.insert(h.clone(), Instant::now());
        Ok(h)
    }

    fn cancel(&mut self, h: &Handle) {
        self.cancelled.insert(h.clone());
        if let Err(e) = self.run("scancel", std::slice::from_ref(&h.0), None) {
            tracing::warn!("cancelling Slurm job {}: {e}", h.0);
        }
        self.queue = None;
    }

    fn poll(&mut self, h: &Handle) -> Seen {
        if let Some(seen) = self.ended.get(h) {
            return seen.clone();
        }
        let Some(state) = self.queue().map(|q| q.get(&h.0).cloned()) else {
            // Slurm did not answer: nothing is concluded.
            return Seen::Running;
        };
        if state.as_deref() == Some("PENDING") {
            let waited = self.submitted.get(h).map(Instant::elapsed);
            if let Some(w) = waited.filter(|w| w.as_secs() >= self.settings.start_within_s) {
                // Past its start deadline: Slurm will not start it soon; the broker places it again.
                self.cancel(h);
                let seen = Seen::Interrupted(format!(
                    "could not start: pending in Slurm's queue for {} s",
                    w.as_secs()
                ));
                self.ended.insert(h.clone(), seen.clone());
                return seen;
            }
        }
        if state.as_deref().is_some_and(|s| !is_final(s)) {
            return Seen::Running;
        }
        let seen = match self.end_of(h) {
            Some((state, code)) if is_final(&state) => self.seen(h, &state, code),
            Some(_) => return Seen::Running,
            None => Seen::Interrupted(format!("Slurm no longer knows job {}", h.0)),
        };
        self.ended.insert(h.clone(), seen.clone());
        seen
    }

    fn adopt(&mut self, h: &Handle) -> Found {
        match self.poll(h) {
            Seen::Running => Found::Running,
            Seen::Ended(exit_code) => Found::Ended {
                exit_code,
                at_ms: None,
            },
            Seen::Failed { exit_code, reason } => Found::Failed { exit_code, reason },
            Seen::Interrupted(why) => Found::Stopped(why),
        }
    }

    /// What Slurm allocated is what is billed: the job's span from its start to its end as Slurm recorded
    /// them (its devices are those the attempt asked for, `--gres`), not the agent's view of its run.
    fn bill(&mut self, h: &Handle, _ended_ms: u64) -> Option<(u64, u64)> {
        let span = self.allocation_of(h);
        if span.is_none() {
            tracing::warn!(
                "Slurm job {}: no start and end recorded; billed by the agent's clock",
                h.0
            );
        }
        span
    }

    fn forget(&mut self, h: &Handle) {
        self.cancelled.remove(h);
        self.ended.remove(h);
        self.submitted.remove(h);
    }

    fn free(&mut self, pools: &[PoolAdvert]) -> Option<BTreeMap<PoolName, u32>> {
        let text = match self.run("sinfo", &["--json".to_owned()], None) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("reading Slurm's nodes: {e}");
                return None;
            }
        };
        let nodes = match parse_sinfo(&text) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("reading Slurm's nodes: {e}");
                return None;
            }
        };
        Some(
            pools
                .iter()
                .map(|p| {
                    let partition = self.settings.partitions.get(p.name.as_str());
                    let model = p.model.as_str().to_ascii_lowercase();
                    let free = nodes
                        .iter()
                        .filter(|n| partition.is_none_or(|part| n.partitions.contains(part)))
                        .map(|n| n.free_gpus(&model))
                        .sum();
                    (p.name.clone(), free)
                })
                .collect(),
        )
    }
}

/// `sbatch`'s arguments for an attempt.
fn sbatch_args(settings: &SlurmSettings, a: &Attempt<'_>) -> Vec<String> {
    let mut args = vec![
        "--parsable".to_owned(),
        format!("--job-name=meridian-{}", a.name),
        format!("--output={}", a.dir.join("output.log").display()),
        "--no-requeue".to_owned(),
    ];
    if a.devices > 0 {
        args.push(format!(
            "--gres=gpu:{}:{}",
            a.model.to_ascii_lowercase(),
            a.devices
        ));
    }
    if let Some(p) = settings.partitions.get(a.pool) {
        args.push(format!("--partition={p}"));
    }
    if let Some(node) = settings
        .nodes
        .get(a.pool)
        .and_then(|n| n.get(a.node as usize))
    {
        args.push(format!("--nodelist={node}"));
    }
    if let Some(acct) = settings.accounts.get(a.tenant) {
        args.push(format!("--account={acct}"));
    }
    if let Some(q) = settings.qos.get(a.tenant) {
        args.push(format!("--qos={q}"));
    }
    if let Some(s) = a.time_limit_s {
        // Slurm's limit is in whole minutes.
        args.push(format!("--time={}", s.div_ceil(60).max(1)));
    }
    args
}

/// One node as `sinfo --json` shows it (Slurm 22.05's field names).
#[derive(Debug, serde::Deserialize)]
struct Node {
    #[serde(default)]
    state: String,
    #[serde(default)]
    state_flags: Vec<String>,
    #[serde(default)]
    gres: String,
    #[serde(default)]
    gres_used: String,
    #[serde(default)]
    partitions: Vec<String>,
    /// CPUs and memory (MB) not given to jobs: a GPU job needs some of each.
    #[serde(default)]
    idle_cpus: Option<u32>,
    #[serde(default)]
    real_memory: Option<u64>,
    #[serde(default)]
    alloc_memory: Option<u64>,
}

impl Node {
    /// GPUs of this type the node could give a job now: none on a node drained, down or failing.
    fn free_gpus(&self, gpu_type: &str) -> u32 {
        let state = self.state.to_ascii_uppercase();
        let unusable = [
            "DOWN",
            "DRAIN",
            "FAIL",
            "MAINT",
            "NOT_RESPONDING",
            "POWERED_DOWN",
            "RESERVED",
        ];
        if !matches!(state.as_str(), "IDLE" | "MIXED")
            || self
                .state_flags
                .iter()
                .any(|f| unusable.iter().any(|u| f.to_ascii_uppercase().contains(u)))
        {
            return 0;
        }
        let memory_left = match (self.real_memory, self.alloc_memory) {
            (Some(real), Some(alloc)) if real > 0 => real.saturating_sub(alloc),
            _ => u64::MAX,
        };
        // A job takes at least one CPU and some memory: a node with none left starts nothing more.
        if memory_left == 0 || self.idle_cpus == Some(0) {
            return 0;
        }
        gpus_of(&self.gres, gpu_type).saturating_sub(gpus_of(&self.gres_used, gpu_type))
    }
}

#[derive(Debug, serde::Deserialize)]
struct Sinfo {
    nodes: Vec<Node>,
}

fn parse_sinfo(text: &str) -> Result<Vec<Node>, String> {
    serde_json::from_str::<Sinfo>(text)
        .map(|s| s.nodes)
        .map_err(|e| format!("sinfo --json: {e}"))
}

/// GPUs of one type in a GRES list (`gpu:a100:4(S:0),gpu:v100:2`, `gpu:a100:2(IDX:0,2)`); an untyped
/// `gpu:4` counts for every type.
fn gpus_of(gres: &str, gpu_type: &str) -> u32 {
    let mut depth = 0;
    let mut entries = Vec::new();
    let mut start = 0;
    for (i, c) in gres.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&gres[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    entries.push(&gres[start..]);
    entries
        .into_iter()
        .filter_map(|e| {
            let e = e.split('(').next()?.trim();
            let parts: Vec<&str> = e.split(':').collect();
            match parts.as_slice() {
                ["gpu", t, n] if t.eq_ignore_ascii_case(gpu_type) => n.parse::<u32>().ok(),
                ["gpu", n] => n.parse::<u32>().ok(),
                _ => None,
            }
        })
        .sum()
}

/// Whether a Slurm job state is an end.
fn is_final(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "CONFIGURING"
            | "RUNNING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_FED"
            | "REQUEUE_HOLD"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
            | "RESV_DEL_HOLD"
    )
}

/// The batch script: the attempt's environment, then the command under `srun`, so that Slurm's signals reach
/// it. The devices are Slurm's to pick: a `CUDA_VISIBLE_DEVICES` of Meridian's is left out.
fn batch_script(a: &Attempt<'_>) -> String {
    let mut s = String::from("#!/bin/sh\n");
    for (k, v) in &a.env {
        if k == "CUDA_VISIBLE_DEVICES" || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            continue;
        }
        s += &format!("export {k}={}\n", quote(v));
    }
    s += &format!("cd {} || exit 1\n", quote(&a.dir.display().to_string()));
    s += &format!("exec srun /bin/sh -c {}\n", quote(a.command));
    s
}

/// A word for `sh`, single-quoted.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `squeue --noheader --format=%i|%T`: job id → state.
fn parse_queue(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once('|'))
        .map(|(id, state)| (id.trim().to_owned(), state.trim().to_owned()))
        .collect()
}

/// `scontrol -o show job ID`: the state and the exit code (`ExitCode=3:0`; a signal's is 128 + it). A job
/// that ended on its own within a preemption's grace time (its command stopped on SIGTERM) is FAILED with a
/// `PreemptTime`: it was preempted, unless it completed.
fn parse_scontrol(text: &str) -> Option<(String, i32)> {
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    let mut state = field("JobState")?.to_owned();
    let preempted = field("PreemptTime").is_some_and(|t| t != "None" && t != "Unknown");
    if preempted && state != "COMPLETED" {
        state = "PREEMPTED".to_owned();
    }
    Some((state, exit_code(field("ExitCode")?)))
}

/// `StartTime=1796417905 … EndTime=1796417907` of `scontrol -o show job` (epoch seconds) → ms.
fn parse_allocation_scontrol(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse::<u64>().ok())
    };
    span_ms(field("StartTime")?, field("EndTime")?)
}

/// `1796417905|1796417907` of `sacct -P -n -X -o Start,End` (epoch seconds) → ms.
fn parse_allocation_sacct(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let (start, end) = line.split_once('|')?;
    span_ms(start.trim().parse().ok()?, end.trim().parse().ok()?)
}

fn span_ms(start_s: u64, end_s: u64) -> Option<(u64, u64)> {
    (start_s > 0 && end_s >= start_s).then(|| (start_s * 1000, end_s * 1000))
}

/// `sacct -P -n -X -o State,ExitCode`: `FAILED|3:0` (a `CANCELLED by 0` state keeps its first word).
fn parse_sacct(text: &str) -> Option<(String, i32)> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let (state, code) = line.split_once('|')?;
    let state = state.split_whitespace().next()?.to_owned();
    Some((state, exit_code(code.trim())))
}

/// `3:0` → 3; `0:15` (ended by signal 15) → 143.
fn exit_code(text: &str) -> i32 {
    let (code, signal) = text.split_once(':').unwrap_or((text, "0"));
    let code: i32 = code.trim().parse().unwrap_or(-1);
    let signal: i32 = signal.trim().parse().unwrap_or(0);
    if code == 0 && signal > 0 {
        128 + signal
    } else {
        code
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn slurms_answers_are_read() {
        let q = parse_queue("12|RUNNING\n13|PENDING\n\n");
        assert_eq!(q.get("12").map(String::as_str), Some("RUNNING"));
        assert_eq!(q.len(), 2);
        let line = "JobId=12 JobName=x UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 RunTime=00:00:01";
        assert_eq!(parse_scontrol(line), Some(("FAILED".to_owned(), 3)));
        assert_eq!(
            parse_scontrol("JobId=9 JobState=CANCELLED ExitCode=0:15 PreemptTime=None"),
            Some(("CANCELLED".to_owned(), 143))
        );
        // Stopped within a preemption's grace: what Slurm 22.05 showed for a job its partition preempted.
        let preempted = "JobId=1 JobState=FAILED Reason=NonZeroExitCode ExitCode=143:0 \
                         PreemptEligibleTime=2026-12-04T18:46:46 PreemptTime=2026-12-04T18:46:49";
        assert_eq!(
            parse_scontrol(preempted),
            Some(("PREEMPTED".to_owned(), 143))
        );
        assert_eq!(
            parse_sacct("CANCELLED by 0|0:15\n"),
            Some(("CANCELLED".to_owned(), 143))
        );
        assert_eq!(
            parse_sacct("OUT_OF_MEMORY|0:125"),
            Some(("OUT_OF_MEMORY".to_owned(), 253))
        );
    }

    #[test]
    fn free_gpus_are_what_slurm_has_not_given_out_on_usable_nodes() {
        assert_eq!(gpus_of("gpu:a100:4(S:0)", "a100"), 4);
        assert_eq!(gpus_of("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:0)", "a100"), 2);
        assert_eq!(gpus_of("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:0)", "v100"), 1);
        assert_eq!(gpus_of("gpu:4", "h100"), 4);
        assert_eq!(gpus_of("", "a100"), 0);
        let nodes = parse_sinfo(
            r#"{"nodes": [
                {"name": "a", "state": "mixed", "state_flags": [], "gres": "gpu:a100:4", "gres_used": "gpu:a100:2(IDX:0-1)", "partitions": ["gpu"]},
                {"name": "b", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:a100:4", "gres_used": "gpu:a100:0(IDX:N/A)", "partitions": ["gpu"]},
                {"name": "c", "state": "allocated", "state_flags": [], "gres": "gpu:a100:4", "gres_used": "gpu:a100:1(IDX:0)", "partitions": ["gpu"]},
                {"name": "d", "state": "idle", "state_flags": [], "gres": "gpu:a100:8", "gres_used": "gpu:a100:0(IDX:N/A)", "partitions": ["other"]},
                {"name": "e", "state": "mixed", "state_flags": [], "gres": "gpu:a100:4", "gres_used": "gpu:a100:1(IDX:0)", "partitions": ["gpu"], "idle_cpus": 0, "real_memory": 1000, "alloc_memory": 500},
                {"name": "f", "state": "mixed", "state_flags": [], "gres": "gpu:a100:4", "gres_used": "gpu:a100:1(IDX:0)", "partitions": ["gpu"], "idle_cpus": 8, "real_memory": 1000, "alloc_memory": 1000}
            ]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let free: Vec<u32> = nodes.iter().map(|n| n.free_gpus("a100")).collect();
        // e: 3 GPUs free but no CPU; f: no memory left.
        assert_eq!(free, vec![2, 0, 0, 8, 0, 0]);
    }

    #[test]
    fn the_allocation_is_read_as_slurm_recorded_it() {
        let text = "JobId=1 JobName=x JobState=FAILED ExitCode=3:0 RunTime=00:00:02 \
                    StartTime=1796417905 EndTime=1796417907 TRES=cpu=1,node=1,gres/gpu=2";
        assert_eq!(
            parse_allocation_scontrol(text),
            Some((1_796_417_905_000, 1_796_417_907_000))
        );
        // A job that never started: no span.
        assert_eq!(
            parse_allocation_scontrol("JobState=CANCELLED StartTime=Unknown EndTime=1796417907"),
            None
        );
        assert_eq!(
            parse_allocation_sacct("1796417905|1796417907\n"),
            Some((1_796_417_905_000, 1_796_417_907_000))
        );
        assert_eq!(parse_allocation_sacct("Unknown|Unknown"), None);
    }

    #[test]
    fn slurms_ends_map_onto_meridians() {
        let mut b = SlurmBackend::new(SlurmSettings::default());
        let h = Handle("7".into());
        assert_eq!(b.seen(&h, "COMPLETED", 0), Seen::Ended(0));
        assert_eq!(b.seen(&h, "FAILED", 3), Seen::Ended(3));
        assert!(matches!(b.seen(&h, "PREEMPTED", 0), Seen::Interrupted(_)));
        assert!(matches!(b.seen(&h, "NODE_FAIL", 0), Seen::Interrupted(_)));
        assert!(matches!(b.seen(&h, "TIMEOUT", 0), Seen::Failed { .. }));
        assert!(
            matches!(b.seen(&h, "CANCELLED", 0), Seen::Interrupted(r) if r.contains("by the site"))
        );
        b.cancelled.insert(h.clone());
        assert_eq!(b.seen(&h, "CANCELLED", 0), Seen::Ended(143));
        assert!(is_final("PREEMPTED") && !is_final("COMPLETING") && !is_final("PENDING"));
    }

    #[test]
    fn the_batch_script_quotes_what_it_is_given_and_leaves_the_devices_to_slurm() {
        let a = Attempt {
            name: "j-1__1",
            command: "echo 'it''s' $HOME; exit 3",
            env: vec![
                ("GREETING".into(), "it's \"here\"".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "0,1".into()),
                ("BAD KEY".into(), "x".into()),
            ],
            dir: Path::new("/work/jobs/j-1-1"),
            tenant: "t",
            pool: "p",
            model: "A100",
            devices: 2,
            time_limit_s: None,
            node: 0,
            spot: false,
        };
        let s = batch_script(&a);
        let settings = SlurmSettings {
            nodes: [("p".to_owned(), vec!["gpu1".to_owned(), "gpu2".to_owned()])].into(),
            partitions: [("p".to_owned(), "batch".to_owned())].into(),
            accounts: [("t".to_owned(), "proj-7".to_owned())].into(),
            qos: [("t".to_owned(), "low".to_owned())].into(),
            ..SlurmSettings::default()
        };
        let args = sbatch_args(
            &settings,
            &Attempt {
                node: 1,
                time_limit_s: Some(61),
                ..a.clone()
            },
        );
        for want in [
            "--gres=gpu:a100:2",
            "--partition=batch",
            "--nodelist=gpu2",
            "--account=proj-7",
            "--qos=low",
            "--time=2",
            "--no-requeue",
        ] {
            assert!(args.iter().any(|x| x == want), "{want}: {args:?}");
        }
        assert!(s.contains("export GREETING='it'\\''s \"here\"'\n"), "{s}");
        assert!(
            !s.contains("CUDA_VISIBLE_DEVICES") && !s.contains("BAD KEY"),
            "{s}"
        );
        assert!(
            s.ends_with("exec srun /bin/sh -c 'echo '\\''it'\\'''\\''s'\\'' $HOME; exit 3'\n"),
            "{s}"
        );
    }
}
