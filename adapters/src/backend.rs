//! How a site runs the attempts its agent accepts: one interface the agent drives, whatever runs the work.
//!
//! The agent decides nothing here: it has accepted an offer, and asks its site's backend to run the attempt
//! ([`Backend::submit`]), to stop it ([`Backend::cancel`]), where it stands ([`Backend::poll`]), and — after
//! the agent itself restarted — whether an attempt an earlier run left is still there ([`Backend::adopt`]).
//! A backend names each attempt by a [`Handle`] of its own (a process group's file, a batch system's job id),
//! which the agent keeps in its record of the attempt so that a restarted agent finds it again.
//!
//! - [`ProcessBackend`]: each attempt a process group on the agent's host under a shim ([`crate::local`]).
//! - [`NoopBackend`]: nothing runs; an attempt is running until it is stopped (dry runs, measurements).
//! - [`crate::slurm::SlurmBackend`]: each attempt a batch job of the site's Slurm cluster.
//! - [`crate::ec2::Ec2Backend`]: each attempt on a cloud instance created for it through EC2's API.

use crate::local::{self, Launch, Running};
use crate::AdapterError;
use meridian_federation::{BackendKind, PoolAdvert, PoolName};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One attempt to run.
#[derive(Clone, Debug)]
pub struct Attempt<'a> {
    /// A name unique to the attempt on this site (`<job>__<attempt>`).
    pub name: &'a str,
    /// A shell command line, run with `sh -c`.
    pub command: &'a str,
    pub env: Vec<(String, String)>,
    /// The attempt's own folder: its log is `output.log` there.
    pub dir: &'a Path,
    /// Whose job it is, on which pool and model, on how many whole devices (backends that pick the devices
    /// themselves ask for that many of that model), and how long it may run: until its deadline, if it has one.
    pub tenant: &'a str,
    pub pool: &'a str,
    pub model: &'a str,
    pub devices: u32,
    pub time_limit_s: Option<u64>,
    /// The node of the pool Meridian packed the attempt on (its first device's index over the pool's
    /// devices per node): backends that pin an attempt to a node or instance use it.
    pub node: u32,
    /// Whether the job allows spot capacity.
    pub spot: bool,
}

/// A backend's own name for an attempt it runs, kept in the agent's record of the attempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Handle(pub String);

/// Where an attempt stands, as its backend sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Running,
    /// Ended with this exit code (128 + the signal for one stopped by a signal).
    Ended(i32),
    /// Ended by the backend for a reason of its own that the job is to blame for (a time limit, memory).
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
    /// Ended by the site, not by the job or Meridian (preempted, a node failed): it runs again elsewhere.
    Interrupted(String),
}

/// What a restarted agent finds of an attempt an earlier run of it left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Still running: taken back, it goes on as if the agent had never stopped.
    Running,
    /// It ended meanwhile, with this exit code, at this time (ms since the epoch) when known.
    Ended { exit_code: i32, at_ms: Option<u64> },
    /// The backend ended it for a reason the job is to blame for (see [`Seen::Failed`]).
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
    /// Nothing of it runs any more, and not by its own doing: why (it runs again elsewhere).
    Stopped(String),
}

/// How a site runs the attempts its agent accepts.
pub trait Backend: Send {
    fn kind(&self) -> BackendKind;
    /// Whether its attempts outlive the agent, so that the agent keeps a record of each to take it back.
    fn outlives_agent(&self) -> bool {
        true
    }
    /// Starts an attempt.
    fn submit(&mut self, a: &Attempt<'_>) -> Result<Handle, AdapterError>;
    /// Asks an attempt to stop (given its grace); its end is then seen by [`Backend::poll`].
    fn cancel(&mut self, h: &Handle);
    /// Where an attempt stands now.
    fn poll(&mut self, h: &Handle) -> Seen;
    /// Takes back an attempt an earlier run of the agent left (an attempt that is not running is stopped).
    fn adopt(&mut self, h: &Handle) -> Found;
    /// Forgets an attempt whose end has been recorded.
    fn forget(&mut self, h: &Handle);
    /// How many whole devices of each pool are free as the backend sees them, when it schedules work that
    /// Meridian does not give it (a batch system's own users): `None` when only Meridian's work runs here,
    /// and the agent's own count stands.
    fn free(&mut self, _pools: &[PoolAdvert]) -> Option<BTreeMap<PoolName, u32>> {
        None
    }
    /// The pools the backend itself finds at start (a cloud's instance types), in place of the site file's:
    /// `None` where the site file declares them.
    fn pools(&mut self) -> Result<Option<Vec<PoolAdvert>>, AdapterError> {
        Ok(None)
    }
    /// Housekeeping, called a few times a second (a cloud backend terminates the instances idle too long).
    fn tick(&mut self) {}
    /// The agent stops: what nothing runs on is let go (a cloud backend terminates its idle instances; the
    /// running attempts stay for a restarted agent to take back).
    fn shutdown(&mut self) {}
    /// The span an attempt that just ended is billed for, ms since the epoch, where the backend bills other
    /// than its run (a cloud instance's boot and idle time): `None` bills the run.
    fn bill(&mut self, _h: &Handle, _ended_ms: u64) -> Option<(u64, u64)> {
        None
    }
    /// The last lines of an attempt's log.
    fn logs(&self, dir: &Path, lines: usize) -> std::io::Result<String> {
        local::tail(&dir.join("output.log"), lines)
    }
}

/// The backend a site file names, for site `site`.
pub fn for_site(
    kind: BackendKind,
    site: &str,
    process: ProcessSettings,
    slurm: crate::slurm::SlurmSettings,
    ec2: crate::ec2::Ec2Settings,
) -> Result<Box<dyn Backend>, AdapterError> {
    Ok(match kind {
        BackendKind::Process => Box::new(ProcessBackend::new(process)),
        BackendKind::Noop => Box::new(NoopBackend::default()),
        BackendKind::Slurm => Box::new(crate::slurm::SlurmBackend::new(slurm)),
        BackendKind::Ec2 => Box::new(crate::ec2::Ec2Backend::new(ec2, site, process)?),
    })
}

/// How the process backend runs attempts.
#[derive(Clone, Debug)]
pub struct ProcessSettings {
    /// The program that provides the shim (the agent's own executable).
    pub shim_program: PathBuf,
    /// Where each attempt's process-group file and its siblings are kept.
    pub run_dir: PathBuf,
    /// Time between SIGTERM and SIGKILL when an attempt is stopped.
    pub grace: Duration,
    /// How long attempts outlive their agent, for a restarted one to take them back.
    pub adopt_grace: Duration,
}

/// Each attempt a process group on the agent's host, under a shim. Its handle is the group file's path.
pub struct ProcessBackend {
    settings: ProcessSettings,
    /// Attempts this agent started: the shims' pipes. The others were taken back and are watched through
    /// their files.
    started: HashMap<Handle, Running>,
}

impl ProcessBackend {
    pub fn new(settings: ProcessSettings) -> Self {
        ProcessBackend {
            settings,
            started: HashMap::new(),
        }
    }

    /// Where each attempt's process-group file is kept (`<name>.pgid`).
    pub fn run_dir(&self) -> &Path {
        &self.settings.run_dir
    }

    fn path(h: &Handle) -> &Path {
        Path::new(&h.0)
    }
}

impl Backend for ProcessBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Process
    }

    fn submit(&mut self, a: &Attempt<'_>) -> Result<Handle, AdapterError> {
        std::fs::create_dir_all(a.dir).map_err(AdapterError::Spawn)?;
        let pgid_path = self.settings.run_dir.join(format!("{}.pgid", a.name));
        let running = local::launch(&Launch {
            shim_program: self.settings.shim_program.clone(),
            command: a.command.to_owned(),
            env: a.env.clone(),
            work_dir: a.dir.to_path_buf(),
            log_path: a.dir.join("output.log"),
            pgid_path: pgid_path.clone(),
            grace: self.settings.grace,
            adopt_grace: self.settings.adopt_grace,
        })?;
        tracing::info!("attempt {} started (pid {})", a.name, running.pid());
        let h = Handle(pgid_path.display().to_string());
        self.started.insert(h.clone(), running);
        Ok(h)
    }

    fn cancel(&mut self, h: &Handle) {
        match self.started.get_mut(h) {
            Some(r) => r.stop(),
            None => local::request_stop(Self::path(h)),
        }
    }

    fn poll(&mut self, h: &Handle) -> Seen {
        match self.started.get_mut(h) {
            Some(r) => match r.try_wait() {
                Ok(Some(status)) => Seen::Ended(local::exit_code(status)),
                Ok(None) => Seen::Running,
                Err(e) => {
                    tracing::warn!("waiting for {}: {e}", h.0);
                    Seen::Running
                }
            },
            // Taken back: its shim is gone once it has ended (the command's exit code, or stopped).
            None if !local::shim_alive(Self::path(h)) => {
                Seen::Ended(local::kept_exit_code(Self::path(h)).unwrap_or(143))
            }
            None => Seen::Running,
        }
    }

    fn adopt(&mut self, h: &Handle) -> Found {
        let path = Self::path(h);
        if local::adopt(path) {
            return Found::Running;
        }
        let kept = local::kept_exit_code(path);
        let killed = kept.is_none() && local::reap(path);
        if killed {
            tracing::info!("{}: its process group was left running and is killed", h.0);
        }
        match kept {
            Some(exit_code) => Found::Ended {
                exit_code,
                at_ms: std::fs::metadata(local::exit_file(path))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as u64),
            },
            None => Found::Stopped(
                "agent restarted after its re-adoption grace; the attempt was stopped".into(),
            ),
        }
    }

    fn forget(&mut self, h: &Handle) {
        self.started.remove(h);
        local::forget(Self::path(h));
    }
}

/// Nothing runs: an attempt is running from its submission until it is stopped, and then ends with code 0.
/// Nothing outlives the agent, so nothing is taken back.
#[derive(Default)]
pub struct NoopBackend {
    stopped: HashSet<Handle>,
}

impl Backend for NoopBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Noop
    }

    fn outlives_agent(&self) -> bool {
        false
    }

    fn submit(&mut self, a: &Attempt<'_>) -> Result<Handle, AdapterError> {
        Ok(Handle(a.name.to_owned()))
    }

    fn cancel(&mut self, h: &Handle) {
        self.stopped.insert(h.clone());
    }

    fn poll(&mut self, h: &Handle) -> Seen {
        if self.stopped.contains(h) {
            Seen::Ended(0)
        } else {
            Seen::Running
        }
    }

    fn adopt(&mut self, _: &Handle) -> Found {
        Found::Stopped("nothing runs under the no-op backend after a restart".into())
    }

    fn forget(&mut self, h: &Handle) {
        self.stopped.remove(h);
    }

    fn logs(&self, _: &Path, _: usize) -> std::io::Result<String> {
        Ok(String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt<'a>(name: &'a str, command: &'a str, dir: &'a Path) -> Attempt<'a> {
        Attempt {
            name,
            command,
            env: vec![("GREETING".into(), "hello".into())],
            dir,
            tenant: "t",
            pool: "p",
            model: "A100",
            devices: 1,
            time_limit_s: None,
            node: 0,
            spot: false,
        }
    }

    #[test]
    fn nothing_runs_under_the_noop_backend_until_it_is_stopped() {
        let mut b = NoopBackend::default();
        let dir = PathBuf::from("/nonexistent");
        let h = b
            .submit(&attempt("j-1__1", "true", &dir))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.poll(&h), Seen::Running);
        b.cancel(&h);
        assert_eq!(b.poll(&h), Seen::Ended(0));
        assert!(matches!(b.adopt(&h), Found::Stopped(_)));
    }
}
