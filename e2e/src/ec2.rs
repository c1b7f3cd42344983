//! The EC2 API of a test's own: moto in server mode (PyPI `moto[server]`, in `.venv`) behind the fault proxy of
//! `e2e/py/ec2_emulator.py`, on loopback ports it picks itself, stopped on drop. The proxy checks every
//! call's Signature Version 4 with botocore, answers the calls a test's faults name with EC2's XML errors,
//! and logs the calls it passes. Instances run nothing (moto's): the EC2 site's launcher is the local
//! stand-in, which runs the attempt on the agent's host with the instance's id in its environment.

use meridian_broker::local::{self, process::Managed};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The access key and secret the tests' agents sign with (the proxy refuses any other signature).
pub const ACCESS_KEY: &str = "AKIDMERIDIANTEST";
pub const SECRET_KEY: &str = "meridian-test-secret";

pub struct Ec2Emulator {
    dir: tempfile::TempDir,
    _server: Managed,
    /// The proxy's URL: the endpoint the EC2 site's agent is given.
    pub endpoint: String,
}

fn python() -> PathBuf {
    let p = local::workspace_root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup.sh (it installs moto[server])",
        p.display()
    );
    p
}

impl Ec2Emulator {
    /// Starts moto and the proxy, and sets the AWS credentials the agents started after it inherit.
    pub fn start() -> Ec2Emulator {
        let dir = tempfile::Builder::new()
            .prefix("ec2-")
            .tempdir()
            .expect("tempdir");
        let log = std::fs::File::create(dir.path().join("emulator.log")).expect("log");
        let server = Managed::spawn(
            "ec2-emulator",
            Command::new(python())
                .arg(local::workspace_root().join("e2e/py/ec2_emulator.py"))
                .arg("serve")
                .arg(dir.path())
                .env("EC2_EMULATOR_SECRET", SECRET_KEY)
                .stdout(log.try_clone().expect("log"))
                .stderr(log),
        )
        .expect("the EC2 emulator starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        let endpoint = loop {
            if let Ok(e) = std::fs::read_to_string(dir.path().join("endpoint")) {
                break e;
            }
            assert!(
                Instant::now() < deadline,
                "the EC2 emulator did not start: {}",
                std::fs::read_to_string(dir.path().join("emulator.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        // Agents inherit the test process's environment: these are the EC2 site's credentials.
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        std::env::remove_var("AWS_SESSION_TOKEN");
        Ec2Emulator {
            dir,
            _server: server,
            endpoint,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Answers the matching calls with EC2's error `code` (`{"action", "region", "zone", "market", "code",
    /// "times"}`: see `e2e/py/ec2_emulator.py`).
    pub fn set_faults(&self, faults: &Value) {
        let tmp = self.dir.path().join("faults.json.tmp");
        std::fs::write(&tmp, faults.to_string()).expect("faults");
        std::fs::rename(tmp, self.dir.path().join("faults.json")).expect("faults");
    }

    /// Every call the proxy saw: `{"action", "region", "zone", "market", "code", "signed"}`.
    pub fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("requests.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn ctl(&self, args: &[&str]) -> String {
        let moto = std::fs::read_to_string(self.dir.path().join("moto")).expect("moto's URL");
        let out = Command::new(python())
            .arg(local::workspace_root().join("e2e/py/ec2_emulator.py"))
            .arg("ctl")
            .arg(moto)
            .args(args)
            .output()
            .expect("ec2_emulator.py ctl");
        assert!(
            out.status.success(),
            "ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every instance in the emulator's regions, as boto3 describes them: `{"id", "region", "state", "type",
    /// "zone", "spot", "tags"}`.
    pub fn instances(&self) -> Vec<Value> {
        serde_json::from_str(&self.ctl(&["describe"])).expect("instances")
    }

    /// The instances not terminated (pending or running).
    pub fn live(&self) -> Vec<Value> {
        self.instances()
            .into_iter()
            .filter(|i| matches!(i["state"].as_str(), Some("pending" | "running")))
            .collect()
    }

    /// Creates an instance tagged as `site`'s behind its agent's back (one whose record a crash lost): its id.
    pub fn run_tagged(&self, site: &str, instance_type: &str, region: &str) -> String {
        self.ctl(&["run", site, instance_type, region])
            .trim()
            .to_owned()
    }

    /// Terminates an instance behind the agent's back: the provider's spot reclaim.
    pub fn reclaim(&self, id: &str, region: &str) {
        self.ctl(&["terminate", id, region]);
    }
}
