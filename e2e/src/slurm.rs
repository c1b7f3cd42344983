//! A Slurm cluster of a test's own: Debian's `munged`, `slurmctld` and `slurmd` (Slurm 22.05), one node whose
//! GPUs are character devices declared as GRES (no GPU is needed: Slurm only hands out their indices), Slurm's
//! ports picked free on loopback, everything under a temporary folder, stopped on drop (its jobs first, so
//! that no job process outlives the test).
//!
//! It runs as root (`mknod`, Slurm's daemons). `scripts/setup.sh` installs the packages. The traps found on
//! this kind of machine (`../shared/notes/backends.md`) are avoided: the daemons start under their own
//! program names, the GPUs are device files, and Slurm's own traffic uses 127.0.0.1.

use meridian_broker::local::process::Managed;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct SlurmCluster {
    dir: tempfile::TempDir,
    /// munged, slurmctld, slurmd: dropped last to first.
    daemons: Vec<Managed>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl SlurmCluster {
    /// Starts a cluster with one node, `gpu1`, of `gpus` GPUs of type `gpu_type` (Slurm's GRES type: the
    /// model, lower case), and waits until the node is idle. Its partitions: `gpu` (the default) and
    /// `urgent`, whose jobs preempt those of `gpu` after a grace of 2 s.
    pub fn start(gpus: u32, gpu_type: &str) -> SlurmCluster {
        for bin in [
            "/usr/sbin/munged",
            "/usr/sbin/slurmctld",
            "/usr/sbin/slurmd",
            "/usr/sbin/slurmdbd",
            "/usr/sbin/mariadbd",
            "/usr/bin/mariadb-install-db",
        ] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: run scripts/setup.sh (it installs slurmctld, slurmd, slurmdbd, \
                 mariadb-server and munge)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("slurm-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        for sub in ["state", "spool", "log", "dev", "munge", "db"] {
            std::fs::create_dir_all(d.join(sub)).expect("folders");
        }
        let devices = d.join("dev");
        for i in 0..gpus {
            let path = devices.join(format!("nvidia{i}"));
            let made = Command::new("mknod")
                .arg(&path)
                .args(["c", "1", "3"])
                .status()
                .expect("mknod");
            assert!(
                made.success(),
                "mknod {} (the test runs as root)",
                path.display()
            );
        }
        let key = d.join("munge/munge.key");
        std::fs::write(
            &key,
            (0..1024).map(|i| (i * 37 % 251) as u8).collect::<Vec<u8>>(),
        )
        .expect("munge key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("munge key mode");
        let socket = d.join("munge/munge.sock");
        let host = String::from_utf8(
            Command::new("hostname")
                .arg("-s")
                .output()
                .expect("hostname")
                .stdout,
        )
        .expect("host name")
        .trim()
        .to_owned();
        let last = gpus.saturating_sub(1);
        let dbd_port = free_port();
        let conf = format!(
            "ClusterName=meridian-test\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
             AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
             SlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n\
             AccountingStoragePort={dbd_port}\nAccountingStoragePass={sock}\nAccountingStorageTRES=gres/gpu\n\
             JobCompType=jobcomp/none\n\
             SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             GresTypes=gpu\nReturnToService=2\nMpiDefault=none\nDebugFlags=NO_CONF_HASH\n\
             MinJobAge=600\n\
             PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n\
             NodeName=gpu1 NodeAddr=127.0.0.1 NodeHostname={host} CPUs=2 RealMemory=1000 Gres=gpu:{gpu_type}:{gpus} State=UNKNOWN\n\
             PartitionName=gpu Nodes=gpu1 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=2\n\
             PartitionName=urgent Nodes=gpu1 MaxTime=INFINITE State=UP PriorityTier=10\n",
            ctld = free_port(),
            slurmd = free_port(),
            sock = socket.display(),
            d = d.display(),
        );
        let conf_path = d.join("slurm.conf");
        std::fs::write(&conf_path, conf).expect("slurm.conf");
        std::fs::write(
            d.join("gres.conf"),
            format!(
                "AutoDetect=off\nNodeName=gpu1 Name=gpu Type={gpu_type} File={}/nvidia[0-{last}]\n",
                devices.display()
            ),
        )
        .expect("gres.conf");

        let log = |name: &str| {
            std::fs::File::create(d.join("log").join(format!("{name}.out"))).expect("log file")
        };
        let mut daemons = Vec::new();
        daemons.push(
            Managed::spawn(
                "munged",
                Command::new("/usr/sbin/munged")
                    .args(["--foreground", "--force"])
                    .arg(format!("--socket={}", socket.display()))
                    .arg(format!("--key-file={}", key.display()))
                    .arg(format!(
                        "--pid-file={}",
                        d.join("munge/munged.pid").display()
                    ))
                    .arg(format!("--seed-file={}", d.join("munge/seed").display()))
                    .arg(format!("--log-file={}", d.join("log/munged.log").display()))
                    .stdout(log("munged"))
                    .stderr(log("munged.err")),
            )
            .expect("munged starts"),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "munged did not make its socket");
            std::thread::sleep(Duration::from_millis(50));
        }
        daemons.extend(accounting(d, &socket, dbd_port, &conf_path));
        for (name, program, extra) in [
            ("slurmctld", "/usr/sbin/slurmctld", vec!["-D", "-i"]),
            ("slurmd", "/usr/sbin/slurmd", vec!["-D", "-N", "gpu1"]),
        ] {
            daemons.push(
                Managed::spawn(
                    name,
                    Command::new(program)
                        .args(extra)
                        .arg("-f")
                        .arg(&conf_path)
                        .env("SLURM_CONF", &conf_path)
                        .stdout(log(name))
                        .stderr(log(&format!("{name}.err"))),
                )
                .expect("a Slurm daemon starts"),
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let cluster = SlurmCluster { dir, daemons };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let state = cluster.run("sinfo", &["--noheader", "--format=%T"]);
            if state.trim() == "idle" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the Slurm node did not come up ({state:?}); logs in {}",
                cluster.dir.path().join("log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        cluster
    }

    /// The cluster's configuration file.
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// What a site file's `[backend.slurm] command_prefix` names to reach this cluster.
    pub fn command_prefix(&self) -> Vec<String> {
        vec![
            "env".into(),
            format!("SLURM_CONF={}", self.conf().display()),
        ]
    }

    /// Runs a Slurm tool against this cluster, in its folder (where `sbatch` writes a job's default output
    /// file); its standard output.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new(program)
            .args(args)
            .current_dir(self.dir.path())
            .env("SLURM_CONF", self.conf())
            .output()
            .expect("a Slurm tool runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Where one of the daemons' logs is (`slurmctld.log`, `slurmd-gpu1.log`, `munged.log`).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join("log").join(name)
    }

    /// One of the daemons' logs, as far as it is written.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// `sacct`'s record of the job named `name`: `(ElapsedRaw seconds, GPUs in AllocTRES)`, once it ended.
    pub fn accounted(&self, name: &str) -> Option<(u64, u32)> {
        let text = self.run(
            "sacct",
            &[
                "-P",
                "-n",
                "-X",
                "-o",
                "ElapsedRaw,AllocTRES,State",
                &format!("--name={name}"),
            ],
        );
        let line = text.lines().find(|l| !l.trim().is_empty())?;
        let mut f = line.split('|');
        let elapsed = f.next()?.trim().parse().ok()?;
        let gpus = f
            .next()?
            .split(',')
            .find_map(|t| t.strip_prefix("gres/gpu="))?
            .parse()
            .ok()?;
        let state = f.next()?;
        (!matches!(state, "RUNNING" | "PENDING")).then_some((elapsed, gpus))
    }

    /// The jobs in Slurm's queue: `(id, name, state)`.
    pub fn queue(&self) -> Vec<(String, String, String)> {
        self.run("squeue", &["--noheader", "--format=%i|%j|%T"])
            .lines()
            .filter_map(|l| {
                let mut f = l.trim().split('|');
                Some((f.next()?.into(), f.next()?.into(), f.next()?.into()))
            })
            .collect()
    }
}

/// Slurm's accounting, for `sacct`: a MariaDB server of the cluster's own (on a free loopback port, its data
/// under `d/db`) and `slurmdbd`, with the cluster, an account and root's association registered.
fn accounting(d: &Path, munge: &Path, dbd_port: u16, conf: &Path) -> Vec<Managed> {
    let db = d.join("db");
    // A temporary folder of this cluster's own: two clusters' servers sharing /tmp collide on the names of
    // their temporary tables ("Could not remove temporary table '/tmp/#sql-temptable-…'").
    let tmp = db.join("tmp");
    std::fs::create_dir_all(&tmp).expect("the database's temporary folder");
    let installed = Command::new("mariadb-install-db")
        .args(["--no-defaults", "--user=root", "--skip-test-db"])
        .arg(format!("--datadir={}", db.join("data").display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .arg("--auth-root-authentication-method=normal")
        .output()
        .expect("mariadb-install-db");
    assert!(
        installed.status.success(),
        "mariadb-install-db: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let init = db.join("init.sql");
    std::fs::write(
        &init,
        "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmdb';\n\
         GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\nFLUSH PRIVILEGES;\n",
    )
    .expect("init.sql");
    let db_port = free_port();
    let mut daemons = vec![Managed::spawn(
        "mariadbd",
        Command::new("/usr/sbin/mariadbd")
            .args([
                "--no-defaults",
                "--user=root",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
            ])
            .args([
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
            ])
            .arg(format!("--port={db_port}"))
            .arg(format!("--datadir={}", db.join("data").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--socket={}", db.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", db.join("mysqld.pid").display()))
            .arg(format!("--init-file={}", init.display()))
            .arg(format!(
                "--log-error={}",
                d.join("log/mariadbd.log").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
    .expect("mariadbd starts")];
    let dbd_conf = d.join("slurmdbd.conf");
    std::fs::write(
        &dbd_conf,
        format!(
            "AuthType=auth/munge\nAuthInfo=socket={}\nDbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={dbd_port}\n\
             SlurmUser=root\nPidFile={d}/slurmdbd.pid\nLogFile={d}/log/slurmdbd.log\n\
             StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\n\
             StorageUser=slurm\nStoragePass=slurmdb\nStorageLoc=slurm_acct_db\n",
            munge.display(),
            d = d.display()
        ),
    )
    .expect("slurmdbd.conf");
    std::fs::set_permissions(
        &dbd_conf,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("slurmdbd.conf mode");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(d.join("log/mariadbd.log"))
        .unwrap_or_default()
        .contains("ready for connections")
    {
        assert!(
            Instant::now() < deadline,
            "MariaDB did not start; its log is {}",
            d.join("log/mariadbd.log").display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // slurmdbd reads slurmdbd.conf beside SLURM_CONF.
    daemons.push(
        Managed::spawn(
            "slurmdbd",
            Command::new("/usr/sbin/slurmdbd")
                .arg("-D")
                .env("SLURM_CONF", conf)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        )
        .expect("slurmdbd starts"),
    );
    let sacctmgr = |args: &[&str]| {
        Command::new("sacctmgr")
            .arg("-i")
            .args(args)
            .env("SLURM_CONF", conf)
            .output()
            .expect("sacctmgr")
    };
    loop {
        let out = sacctmgr(&["add", "cluster", "meridian-test"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slurmdbd did not answer: {}; its log is {}/log/slurmdbd.log",
            String::from_utf8_lossy(&out.stderr),
            d.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for args in [
        &["add", "account", "meridian", "Cluster=meridian-test"][..],
        &[
            "add",
            "user",
            "root",
            "Account=meridian",
            "Cluster=meridian-test",
        ][..],
    ] {
        let out = sacctmgr(args);
        assert!(
            out.status.success(),
            "sacctmgr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    daemons
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Its jobs first, so that no job process outlives the test; then the daemons, newest first.
        for (id, _, _) in self.queue() {
            self.run("scancel", &[&id]);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.queue().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        while let Some(mut d) = self.daemons.pop() {
            d.stop(Duration::from_secs(2));
        }
    }
}
