//! The README's tour and the docs' examples, run as a new user would: every `meridian` command their shell
//! blocks show, from a folder that is not the checkout, against a federation `meridian up` starts (the demo
//! federation, secured), each exiting 0. `up` itself runs in the second test, as a user runs it (its printed
//! lines are all a second shell needs; SIGTERM stops it; `--state-dir` resumes it). Not run here: `jobs
//! --watch`, which runs until Ctrl-C (`federation.rs` runs it and stops it), and the blocks marked as
//! illustrations (a cluster, a week's simulation); summaries with `[optional]` parts are parsed only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;

#[test]
fn every_command_of_the_readme_and_docs_runs_from_another_folder() {
    let root = local::workspace_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let commands: Vec<meridian_tools::cli::DocCommand> = files
        .iter()
        .flat_map(|f| meridian_tools::cli::documented_commands(f).unwrap())
        .collect();
    let f = Fed::start(&configs().join("federation-demo.toml"));
    let elsewhere = tempfile::tempdir().unwrap();
    let (mut ran, mut shown) = (0, 0);
    for c in &commands {
        let (at, cmd) = (&c.at, &c.cmd);
        let words = shlex::split(cmd).unwrap_or_else(|| panic!("{at}: unquoted {cmd:?}"));
        if c.illustration
            || words.first().map(String::as_str) == Some("up")
            || words.iter().any(|w| w == "--watch")
        {
            shown += 1;
            continue;
        }
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        let out = f
            .cli_command(&args)
            .current_dir(elsewhere.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{at}: `meridian {cmd}` failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    println!("{ran} documented commands ran, {shown} shown only (up, --watch, illustrations)");
    assert!(
        commands
            .iter()
            .any(|c| c.at.contains("docs/serving.md") && !c.illustration),
        "docs/ commands are run too"
    );
    assert!(ran >= 15, "only {ran} of the documented commands ran");
}

/// A `meridian up` started by a test: stopped on drop as Ctrl-C would stop it (SIGTERM, so it stops the
/// processes it started), then killed if it has not ended, so a failed assertion leaks nothing.
struct Up(std::process::Child);

impl Up {
    /// Sends SIGTERM and waits for the exit; whether it ended within `within`.
    fn stop(&mut self, within: std::time::Duration) -> bool {
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
        let until = std::time::Instant::now() + within;
        while std::time::Instant::now() < until {
            if self.0.try_wait().ok().flatten().is_some() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
        false
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.stop(std::time::Duration::from_secs(30));
        }
    }
}

/// The tour's first command as a user runs it: `meridian up --state-dir DIR` from another folder prints what a
/// second shell needs; with those lines alone `meridian sites` reaches the federation; SIGTERM stops it and
/// leaves its folder; the same command again resumes it (the same token), and stops again.
#[test]
fn meridian_up_prints_what_a_second_shell_needs_and_resumes_from_its_state_dir() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    let elsewhere = tempfile::tempdir().unwrap();
    let state = elsewhere.path().join("state");
    let up = |resumed: bool| -> Vec<(String, String)> {
        let mut up = Up(
            std::process::Command::new(local::sibling_binary("meridian").unwrap())
                .args(["up", "--state-dir"])
                .arg(&state)
                .current_dir(elsewhere.path())
                .env_remove("MERIDIAN_NATS")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap(),
        );
        let mut said = Vec::new();
        let mut exports = Vec::new();
        for line in BufReader::new(up.0.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(pairs) = line.strip_prefix("export ") {
                for pair in pairs.split_whitespace() {
                    if let Some((k, v)) = pair.split_once('=') {
                        exports.push((k.to_owned(), v.to_owned()));
                    }
                }
            }
            let done = line.starts_with("try: meridian sites");
            said.push(line);
            if done {
                break;
            }
        }
        let text = said.join("\n");
        assert!(
            text.contains(if resumed {
                "resumed from the run before"
            } else {
                "the same --state-dir resumes it"
            }),
            "{text}"
        );
        let names: Vec<&str> = exports.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "MERIDIAN_NATS",
                "MERIDIAN_CA",
                "MERIDIAN_CREDS",
                "MERIDIAN_TOKEN"
            ],
            "{text}"
        );
        // A second shell with those lines and nothing else.
        let sites = std::process::Command::new(local::sibling_binary("meridian").unwrap())
            .arg("sites")
            .current_dir(elsewhere.path())
            .env_clear()
            .envs(exports.iter().cloned())
            .output()
            .unwrap();
        assert!(
            sites.status.success() && String::from_utf8_lossy(&sites.stdout).contains("dc-oregon"),
            "{}\n{}",
            String::from_utf8_lossy(&sites.stdout),
            String::from_utf8_lossy(&sites.stderr)
        );
        assert!(
            up.stop(std::time::Duration::from_secs(60)),
            "meridian up did not stop on SIGTERM within 60 s"
        );
        assert!(state.join("creds").is_dir(), "the state folder is kept");
        exports
    };
    let first = up(false);
    let again = up(true);
    let token = |e: &[(String, String)]| e.iter().find(|(k, _)| k == "MERIDIAN_TOKEN").cloned();
    assert_eq!(
        token(&first),
        token(&again),
        "the same administrator's token"
    );
}
