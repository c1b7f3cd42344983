//! The README's tour, run as a new user would: every `meridian` command its shell blocks show, from a folder
//! that is not the checkout, against a federation `meridian up` starts (the demo federation, secured), each
//! exiting 0. Two are not run here: `up` itself (the federation is the test's) and `jobs --watch`, which runs
//! until Ctrl-C (`federation.rs` runs it and stops it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::*;

#[test]
fn every_command_of_the_readme_runs_from_another_folder() {
    let readme = local::workspace_root().join("README.md");
    let commands = meridian_broker::cli::documented_commands(&readme).unwrap();
    let f = Fed::start(&configs().join("federation-demo.toml"));
    let elsewhere = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for (at, cmd) in &commands {
        let words = shlex::split(cmd).unwrap_or_else(|| panic!("{at}: unquoted {cmd:?}"));
        if words.first().map(String::as_str) == Some("up") || words.iter().any(|w| w == "--watch") {
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
    assert!(ran >= 10, "only {ran} of the README's commands ran");
}
