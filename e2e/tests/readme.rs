//! The README's tour and the docs' examples, run as a new user would: every `meridian` command their shell
//! blocks show, from a folder that is not the checkout, against a federation `meridian up` starts (the demo
//! federation, secured), each exiting 0. Not run here: `up` itself (the federation is the test's), `jobs
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
    let commands: Vec<meridian_broker::cli::DocCommand> = files
        .iter()
        .flat_map(|f| meridian_broker::cli::documented_commands(f).unwrap())
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
