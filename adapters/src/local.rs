//! The local-process adapter.
//!
//! A job runs as `shim -- sh -c COMMAND`. The shim (the agent binary's `shim` subcommand, see [`shim_main`])
//! starts the command in a new process group and watches its own standard input, a pipe held by the agent.
//!
//! - The agent stops a job by writing `stop` on the pipe: the shim sends SIGTERM to the whole group, waits the
//!   grace period, sends SIGKILL, and exits.
//! - When the pipe closes without `stop` — the agent stopped or died, even by `kill -9` — the job keeps
//!   running for the adoption grace, so that an agent restarted meanwhile takes it back ([`adopt`]: it writes
//!   its process id beside the group file). An adopted job is stopped through a file ([`request_stop`]); if
//!   no live agent holds it for the adoption grace, the shim stops it as above.
//! - When the command ends by itself, the shim kills whatever it left behind in its group and keeps its exit
//!   code in a file beside the group file, for an agent that was away to report.
//!
//! Beside `<attempt>.pgid` (the group id) live `.shim` (the shim's pid), `.adopt` (the adopting agent's pid),
//! `.stop` (a stop request) and `.exit` (the exit code); [`forget`] removes them all.

use crate::AdapterError;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// How to launch one attempt.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The program that provides the shim (the agent's own executable).
    pub shim_program: PathBuf,
    pub command: String,
    pub env: Vec<(String, String)>,
    pub work_dir: PathBuf,
    pub log_path: PathBuf,
    pub pgid_path: PathBuf,
    pub grace: Duration,
    /// How long the job outlives its agent, waiting to be adopted by a new one.
    pub adopt_grace: Duration,
}

/// A launched attempt. Dropping it closes the shim's pipe, which stops the job.
#[derive(Debug)]
pub struct Running {
    child: Child,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks the shim to stop the job: SIGTERM to its group, SIGKILL after the grace period.
    pub fn stop(&mut self) {
        use std::io::Write;
        if let Some(mut pipe) = self.child.stdin.take() {
            let _ = pipe.write_all(b"stop\n");
        }
    }

    /// Returns the exit status once the shim has exited.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }
}

/// Starts an attempt under the shim.
pub fn launch(l: &Launch) -> Result<Running, AdapterError> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&l.log_path)
        .map_err(|source| AdapterError::Log {
            path: l.log_path.display().to_string(),
            source,
        })?;
    let log2 = log.try_clone().map_err(AdapterError::Spawn)?;
    let child = Command::new(&l.shim_program)
        .arg("shim")
        .arg("--grace-ms")
        .arg(l.grace.as_millis().to_string())
        .arg("--adopt-grace-ms")
        .arg(l.adopt_grace.as_millis().to_string())
        .arg("--pgid-file")
        .arg(&l.pgid_path)
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(&l.command)
        .current_dir(&l.work_dir)
        .envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        // Its own process group: a supervisor that stops the agent's group leaves the shim to keep its job
        // for a restarted agent (and to stop it when none comes).
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2))
        .spawn()
        .map_err(AdapterError::Spawn)?;
    Ok(Running { child })
}

/// Exit code of a finished process: its code, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Kills a leftover process group recorded in `pgid_path` (after an agent restart). Returns whether a group
/// was signalled.
pub fn reap(pgid_path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(pgid_path) else {
        return false;
    };
    let Ok(pgid) = text.trim().parse::<i32>() else {
        return false;
    };
    pgid > 1 && killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok()
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> std::io::Result<String> {
    const MAX_BYTES: u64 = 256 * 1024;
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    if len > MAX_BYTES {
        use std::io::{Seek, SeekFrom};
        f.seek(SeekFrom::Start(len - MAX_BYTES))?;
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    Ok(all[start..].join("\n"))
}

/// The shim: runs `argv` in a new process group and stops the group when the agent asks, or when no agent has
/// held it for `adopt_grace`. Returns the exit code to exit with.
pub fn shim_main(grace: Duration, adopt_grace: Duration, pgid_file: &Path, argv: &[String]) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("meridian shim: no command given");
        return 2;
    };
    let mut child = match Command::new(program)
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("meridian shim: could not start {program}: {e}");
            return 127;
        }
    };
    let pgid = child.id() as i32;
    for (path, text) in [
        (pgid_file.to_path_buf(), pgid.to_string()),
        (sibling(pgid_file, "shim"), std::process::id().to_string()),
    ] {
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("meridian shim: could not write {}: {e}", path.display());
        }
    }
    let group = Pid::from_raw(pgid);
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = stopping.clone();
    let files = pgid_file.to_path_buf();
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut stdin = std::io::BufReader::new(std::io::stdin());
        // `stop` on the pipe, or the pipe gone (the agent stopped or died).
        let asked = matches!(
            std::io::BufRead::read_line(&mut stdin, &mut line),
            Ok(n) if n > 0 && line.trim() == "stop"
        );
        if !asked {
            wait_for_an_agent(&files, adopt_grace);
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = killpg(group, Signal::SIGTERM);
        std::thread::sleep(grace);
        let _ = killpg(group, Signal::SIGKILL);
        std::process::exit(143);
    });
    let code = match child.wait() {
        Ok(status) => exit_code(status),
        Err(e) => {
            eprintln!("meridian shim: wait failed: {e}");
            1
        }
    };
    // The command is done; nothing it started may outlive it.
    let _ = killpg(group, Signal::SIGKILL);
    // The process-group file stays until the agent has recorded the end. If the command ended by itself, its
    // exit code is kept beside it, so that an agent that died meanwhile reports the real outcome on restart.
    if !stopping.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = std::fs::write(exit_file(pgid_file), code.to_string());
    }
    code
}

/// Without its agent: returns when a stop is requested, or when no live agent has adopted the job for
/// `adopt_grace` (from now, or from when its adopting agent was last seen alive).
#[allow(clippy::disallowed_methods)] // the shim is a process of its own: it reads the clock
fn wait_for_an_agent(pgid_file: &Path, adopt_grace: Duration) {
    let mut last_held = std::time::Instant::now();
    loop {
        if sibling(pgid_file, "stop").exists() {
            return;
        }
        let held = std::fs::read_to_string(sibling(pgid_file, "adopt"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .is_some_and(is_agent);
        if held {
            last_held = std::time::Instant::now();
        } else if last_held.elapsed() >= adopt_grace {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `pid` is a live process of the program the shim itself runs as (the agent's executable): a
/// recycled pid of another program does not count.
fn is_agent(pid: i32) -> bool {
    let exe = |p: &str| {
        std::fs::read_link(p).ok().map(|l| {
            l.to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_owned()
        })
    };
    pid > 1 && exe(&format!("/proc/{pid}/exe")).is_some_and(|e| Some(e) == exe("/proc/self/exe"))
}

/// A file beside the group file: `<attempt>.<ext>`.
fn sibling(pgid_file: &Path, ext: &str) -> PathBuf {
    pgid_file.with_extension(ext)
}

/// Whether the shim of an attempt is still running (its job may be, or may be about to be stopped).
pub fn shim_alive(pgid_file: &Path) -> bool {
    std::fs::read_to_string(sibling(pgid_file, "shim"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
        .is_some_and(|pid| pid > 1 && is_agent(pid))
}

/// Takes back an attempt whose shim outlived an earlier agent: records this process as its agent. Returns
/// whether the shim is alive to be adopted.
pub fn adopt(pgid_file: &Path) -> bool {
    shim_alive(pgid_file)
        && std::fs::write(sibling(pgid_file, "adopt"), std::process::id().to_string()).is_ok()
}

/// Asks the shim of an adopted attempt to stop its job.
pub fn request_stop(pgid_file: &Path) {
    let _ = std::fs::write(sibling(pgid_file, "stop"), b"stop");
}

/// Removes the files of an attempt that has ended and been recorded.
pub fn forget(pgid_file: &Path) {
    for ext in ["exit", "shim", "adopt", "stop", "json"] {
        let _ = std::fs::remove_file(sibling(pgid_file, ext));
    }
    let _ = std::fs::remove_file(pgid_file);
}

/// Stops an attempt's job at once, adopted or not: SIGKILL to its process group and to its shim. For a
/// federation that is shutting down for good (a local federation, a test) — not for an agent's restart.
pub fn kill_now(pgid_file: &Path) {
    reap(pgid_file);
    // The shim, if the recorded pid is still one (its command line names this attempt's group file).
    let is_shim = |pid: i32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0)
                .any(|arg| arg == pgid_file.as_os_str().as_encoded_bytes())
        })
    };
    if let Some(pid) = std::fs::read_to_string(sibling(pgid_file, "shim"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
        .filter(|p| *p > 1 && is_shim(*p))
    {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Where the shim keeps the exit code of a command that ended by itself (beside its process-group file).
pub fn exit_file(pgid_file: &Path) -> std::path::PathBuf {
    pgid_file.with_extension("exit")
}

/// The exit code a shim kept for a command that ended by itself, if any.
pub fn kept_exit_code(pgid_file: &Path) -> Option<i32> {
    std::fs::read_to_string(exit_file(pgid_file))
        .ok()?
        .trim()
        .parse()
        .ok()
}
