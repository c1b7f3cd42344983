//! The local-process adapter.
//!
//! A job runs as `shim -- sh -c COMMAND`. The shim (the agent binary's `shim` subcommand, see [`shim_main`])
//! starts the command in a new process group and watches its own standard input, a pipe held by the agent:
//! when the pipe closes — because the agent cancels the job, or because the agent died, even by `kill -9` —
//! the shim sends SIGTERM to the whole group, waits a grace period, sends SIGKILL, and exits. When the command
//! ends by itself, the shim kills whatever the command left behind in its group. The shim writes the group id
//! to a file so that an agent restarted after a crash of the shim too can reap leftovers.

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
        drop(self.child.stdin.take());
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
        .arg("--pgid-file")
        .arg(&l.pgid_path)
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(&l.command)
        .current_dir(&l.work_dir)
        .envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
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

/// The shim: runs `argv` in a new process group and stops the group when standard input closes. Returns the
/// exit code to exit with.
pub fn shim_main(grace: Duration, pgid_file: &Path, argv: &[String]) -> i32 {
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
    if let Err(e) = std::fs::write(pgid_file, pgid.to_string()) {
        eprintln!(
            "meridian shim: could not write {}: {e}",
            pgid_file.display()
        );
    }
    let group = Pid::from_raw(pgid);
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = stopping.clone();
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        // Returns on EOF (the agent closed the pipe or died) or on a read error.
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
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
