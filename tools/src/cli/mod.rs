//! The `meridian` command line: its arguments (each option struct derives clap's `Args` once, where it lives),
//! the commands that run things (broker, local federation, demo, simulator, benchmarks) and, in
//! [`client`], those that talk to a federation. Tables are drawn in [`render`].

pub mod client;
pub mod creds;
pub mod render;

use crate::{bench, demo, sim};
use clap::{Parser, Subcommand, ValueEnum};
use meridian_broker::local::{LocalFederation, LocalOptions};
use meridian_broker::service;
use std::path::PathBuf;

/// `println!` for the command's output: a reader that has gone away (`meridian jobs | head`) ends the command
/// quietly instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

/// `print!` for the command's output (see [`outln!`]).
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($t)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

pub(crate) use {out, outln};

#[derive(Parser, Debug)]
#[command(
    name = "meridian",
    version,
    about = "Meridian: a federation broker for heterogeneous AI compute"
)]
pub struct Cli {
    /// How client commands reach the federation.
    #[command(flatten)]
    pub connect: client::ConnectArgs,
    /// Output format of client commands.
    #[arg(long, global = true, value_enum, default_value_t = Output::Table, help_heading = "Output")]
    pub output: Output,
    #[command(subcommand)]
    pub command: Cmd,
}

/// The commands by area, as `meridian --help` lists them (every command is in one group: a test checks).
pub const GROUPS: &[(&str, &[&str])] = &[
    (
        "Jobs",
        &[
            "submit", "jobs", "show", "queue", "explain", "timeline", "logs", "cancel",
        ],
    ),
    ("Services", &["service", "scale-in"]),
    ("Sites", &["sites", "gpus", "drain", "revoke-site"]),
    ("Tenancy and money", &["tenancy", "report", "plan"]),
    ("Security", &["token", "creds", "audit"]),
    (
        "Running things",
        &[
            "up",
            "demo",
            "broker",
            "journal",
            "sim",
            "bench",
            "completions",
        ],
    ),
];

/// The command line, its help listing the commands by area ([`GROUPS`]).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let width = GROUPS
        .iter()
        .flat_map(|(_, names)| names.iter().map(|n| n.len()))
        .max()
        .unwrap_or(0);
    let mut groups = String::new();
    for (title, names) in GROUPS {
        groups.push_str(&format!("{title}:\n"));
        for name in *names {
            let about = cmd
                .find_subcommand(name)
                .and_then(|c| c.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            groups.push_str(&format!("  {name:<width$}  {about}\n"));
        }
        groups.push('\n');
    }
    // The commands are listed by area above; the flat list clap would add after them is left out (they still
    // parse, and completions still offer them: those are made from `Cli::command()`).
    let mut cmd = cmd
        .help_template(format!(
            "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{groups}{{all-args}}{{after-help}}"
        ))
        .after_help("A command's own options: `meridian COMMAND --help` (or `meridian help COMMAND`).");
    for (_, names) in GROUPS {
        for name in *names {
            cmd = cmd.mut_subcommand(name, |c| c.hide(true));
        }
    }
    cmd
}

/// The command-line reference (`docs/cli.md`): every command by area, each with its usage, its description
/// and its arguments, made from the same definitions as `--help` (a test keeps the file equal to it).
pub fn reference_markdown() -> String {
    fn args(cmd: &clap::Command, out: &mut String) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if ["help", "version"].contains(&id) || a.is_hide_set() || a.is_global_set() {
                continue;
            }
            let name = match (a.get_long(), a.get_short()) {
                (Some(l), _) => format!("--{l}"),
                (None, Some(c)) => format!("-{c}"),
                (None, None) => format!("<{}>", id.to_uppercase()),
            };
            let help = a
                .get_help()
                .map(|h| h.to_string().replace('\n', " "))
                .unwrap_or_default();
            let default: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let flag = matches!(a.get_action(), clap::ArgAction::SetTrue);
            let default = if default.is_empty() || flag {
                String::new()
            } else {
                format!(" (default `{}`)", default.join(","))
            };
            let env = a
                .get_env()
                .map(|e| format!(" [env `{}`]", e.to_string_lossy()))
                .unwrap_or_default();
            out.push_str(&format!("- `{name}`: {help}{default}{env}\n"));
        }
    }
    fn section(cmd: &clap::Command, path: &str, out: &mut String) {
        let mut c = cmd.clone();
        let usage = c.render_usage().to_string();
        let usage = usage.trim_start_matches("Usage: ");
        out.push_str(&format!("### `{path}`\n\n"));
        if let Some(about) = cmd.get_about() {
            out.push_str(&format!("{about}\n\n"));
        }
        out.push_str(&format!("`{usage}`\n\n"));
        args(cmd, out);
        out.push('\n');
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            section(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
    let root = Cli::command_for_reference();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Made from the same definitions as `meridian --help` (`cli::doc_tests` keeps this file equal to them; \
         `MERIDIAN_WRITE_DOCS=1 cargo test -p meridian-tools --lib cli_reference` writes it again).\n\n\
         ## Options of every command\n\n",
    );
    for a in root.get_arguments().filter(|a| a.is_global_set()) {
        let help = a
            .get_help()
            .map(|h| h.to_string().replace('\n', " "))
            .unwrap_or_default();
        let env = a
            .get_env()
            .map(|e| format!(" [env `{}`]", e.to_string_lossy()))
            .unwrap_or_default();
        out.push_str(&format!(
            "- `--{}`: {help}{env}\n",
            a.get_long().unwrap_or_default()
        ));
    }
    out.push('\n');
    for (title, names) in GROUPS {
        out.push_str(&format!("## {title}\n\n"));
        for name in *names {
            if let Some(sub) = root.find_subcommand(name) {
                section(sub, &format!("meridian {name}"), &mut out);
            }
        }
    }
    out
}

impl Cli {
    /// The command as clap builds it (every subcommand visible).
    fn command_for_reference() -> clap::Command {
        let mut c = <Cli as clap::CommandFactory>::command();
        c.build();
        c
    }
}

/// The arguments of this process, parsed by [`command`] (help and errors end the process, as clap's do).
pub fn parse() -> Cli {
    use clap::FromArgMatches;
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    /// Comma-separated values (`report` only).
    Csv,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run the broker.
    Broker(service::BrokerConfig),
    /// Bring up a local federation (nats-server, broker, one agent per site) until Ctrl-C or SIGTERM.
    Up {
        /// The federation file (sites, tenancy): relative to the working folder, else to the checkout.
        #[arg(default_value = "configs/federation-demo.toml")]
        federation: PathBuf,
        #[command(flatten)]
        opts: LocalOptions,
    },
    /// The main job: bring up the demo federation, run a trace workload, print where each job ran and why.
    Demo(demo::DemoOptions),
    /// Simulate a trace over a federation under each policy (and baselines), judged by an independent checker.
    Sim(sim::SimOptions),
    /// Benchmarks; `meridian bench placement --sites N`.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// The federation's identities and certificates (NATS NKeys, TLS): init, add, list, revoke, server-config.
    Creds {
        /// The credentials folder.
        #[arg(long, env = "MERIDIAN_CREDS_DIR", default_value = "meridian-creds")]
        dir: PathBuf,
        #[command(subcommand)]
        what: creds::CredsCmd,
    },
    #[command(flatten)]
    Client(client::ClientCmd),
    /// Print a shell completion script: `meridian completions bash > /etc/bash_completion.d/meridian`, or
    /// `source <(meridian completions bash)`.
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Jobs per second from submission to acceptance through nats-server, the durable broker and 50 agents
    /// on the no-op executor, against plain NATS request-reply in the same run; then jobs that spawn `true`.
    Dispatch(bench::dispatch::DispatchOptions),
    /// Submissions per second and broker CPU per submission as the queue deepens (a full site, jobs that
    /// wait), completions per second at the deepest queue, memory per waiting job, and memory and recovery
    /// time once every job has finished.
    Queue(bench::queue::QueueOptions),
    /// The broker's CPU share and memory with many made-up sites sending adverts and heartbeats over a few
    /// NATS connections, against the same broker before they joined.
    Adverts(bench::adverts::AdvertsOptions),
    /// Decision latency with the site index, and by a plain scan of every site, over a synthetic federation.
    Placement {
        /// Sites of the synthetic federation.
        #[arg(long, default_value_t = 1000)]
        sites: usize,
        /// Decisions timed (each a new job against the federation as the earlier ones left it).
        #[arg(long, default_value_t = 2000)]
        decisions: usize,
    },
}

/// Runs a command; `Ok(false)` for a command that ran but failed at what it was asked (exit code 1).
pub async fn run(cli: Cli) -> anyhow::Result<bool> {
    let out = cli.output;
    match cli.command {
        Cmd::Broker(cfg) => service::run(cfg).await.map(|_| true),
        Cmd::Up { federation, opts } => up(&federation, opts).await,
        Cmd::Demo(mut opts) => {
            opts.json = out == Output::Json;
            demo::run(opts).await
        }
        Cmd::Sim(opts) if opts.service.is_some() => {
            let (report, outcomes) = tokio::task::block_in_place(|| sim::serving::simulate(&opts))?;
            if let Some(path) = &opts.schedule {
                sim::serving::write_schedule(path, &outcomes)?;
            }
            render::print(out, &report, |r| out!("{}", sim::serving::table(r)))
        }
        Cmd::Sim(opts) => {
            let simulated = tokio::task::block_in_place(|| sim::simulate(&opts))?;
            sim::write_outputs(&opts, &simulated)?;
            render::print(out, &simulated.0, |r| out!("{}", sim::table(r)))
        }
        Cmd::Bench { what } => run_bench(what, out).await,
        Cmd::Creds { dir, what } => creds::run(what, &dir),
        Cmd::Client(cmd) => client::run(cmd, &cli.connect, out).await,
        Cmd::Completions { shell } => {
            out!("{}", completion_script(shell));
            Ok(true)
        }
    }
}

async fn up(federation: &std::path::Path, opts: LocalOptions) -> anyhow::Result<bool> {
    let fed = tokio::task::block_in_place(|| LocalFederation::start(federation, opts))?;
    // What is printed next is what a second shell needs: the sites are there when it looks.
    meridian_broker::client::Client::of(&fed)
        .await?
        .wait_for_sites(&fed, std::time::Duration::from_secs(60))
        .await?;
    outln!("federation up: HTTP API {}", fed.http);
    outln!("dashboard: {}", fed.dashboard_address());
    for (i, n) in fed.nats.nodes.iter().enumerate() {
        outln!("NATS node {}: {}", i + 1, n.url);
    }
    for (site, leaf) in &fed.nats.leaves {
        outln!("NATS leaf node for {site}: {}", leaf.url);
    }
    let names: Vec<&str> = fed.brokers.iter().map(|b| b.name.as_str()).collect();
    outln!(
        "brokers: {} (the first is active{})",
        names.join(", "),
        if names.len() > 1 {
            ", the others stand by"
        } else {
            ""
        }
    );
    outln!("sites: {}", fed.site_ids().join(", "));
    outln!(
        "logs and state in {} ({}); Ctrl-C stops everything",
        fed.dir.display(),
        match (fed.keeps_dir(), fed.resumed) {
            (true, true) => "resumed from the run before, kept after exit",
            (true, false) => "kept after exit; the same --state-dir resumes it",
            _ => "removed at exit; --state-dir DIR keeps them",
        }
    );
    match &fed.security {
        Some(s) => {
            outln!(
                "secured: TLS on every link (CA {}), an NKey per broker, site and client, JetStream encrypted at rest",
                s.creds.join("ca.crt").display()
            );
            outln!("for another shell (the token is this local federation's administrator's):");
        }
        None => outln!("INSECURE: no TLS, no credentials, every API caller is an administrator"),
    }
    for line in fed.exports() {
        outln!("{line}");
    }
    outln!("try: meridian sites");
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = sigterm.recv() => {}
    }
    tokio::task::block_in_place(|| drop(fed));
    Ok(true)
}

async fn run_bench(what: BenchCmd, out: Output) -> anyhow::Result<bool> {
    match what {
        BenchCmd::Dispatch(opts) => {
            let f = bench::dispatch::dispatch(opts).await?;
            // One JSON line either way: the figures are meant to be compared and collected.
            outln!("{}", serde_json::to_string(&f)?);
            if out == Output::Table {
                eprintln!("{}", render::dispatch_summary(&f));
            }
            Ok(true)
        }
        BenchCmd::Queue(opts) => {
            let f = bench::queue::queue(opts).await?;
            outln!("{}", serde_json::to_string(&f)?);
            Ok(true)
        }
        BenchCmd::Adverts(opts) => {
            let f = bench::adverts::adverts(opts).await?;
            outln!("{}", serde_json::to_string(&f)?);
            if out == Output::Table {
                eprintln!("{}", render::adverts_summary(&f));
            }
            Ok(true)
        }
        BenchCmd::Placement { sites, decisions } => {
            let figures = tokio::task::block_in_place(|| bench::placement(sites, decisions));
            render::print(out, &figures, |f| {
                outln!("{}", render::placement_summary(f))
            })
        }
    }
}

/// `meridian completions SHELL`: the script that completes meridian's commands and flags in that shell.
pub fn completion_script(shell: clap_complete::Shell) -> String {
    let mut script = Vec::new();
    clap_complete::generate(
        shell,
        &mut <Cli as clap::CommandFactory>::command(),
        "meridian",
        &mut script,
    );
    String::from_utf8_lossy(&script).into_owned()
}

/// A `meridian` command a document shows.
#[derive(Clone, Debug)]
pub struct DocCommand {
    /// `FILE:LINE`.
    pub at: String,
    /// Without its leading `meridian`.
    pub cmd: String,
    /// Shown, not meant to be run by a test (see [`documented_commands`]).
    pub illustration: bool,
}

/// The `meridian …` commands of the shell blocks of a Markdown file, each with where it is (`FILE:LINE`):
/// continuation lines joined, the comment after `  #` dropped, `A | meridian B` taken as two commands, and each
/// without its leading `meridian`. A line with `[…]` (optional parts) or `a|b` (alternatives) is a summary, not a
/// command, and is left out. A block whose fence says `illustration` (```` ```sh illustration ````) shows what a
/// user would type in a setting a test cannot make (a long run, a cluster): its commands are parsed, not run.
/// (The tests parse every command and run the others.)
pub fn documented_commands(file: &std::path::Path) -> std::io::Result<Vec<DocCommand>> {
    let text = std::fs::read_to_string(file)?;
    let mut out = Vec::new();
    let mut code = false;
    let mut illustration = false;
    let mut pending = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            code = !code;
            illustration = code && line.contains("illustration");
            continue;
        }
        if !code || (pending.is_empty() && !line.trim_start().starts_with("meridian ")) {
            continue;
        }
        let line = match line.find("  #") {
            Some(c) => &line[..c],
            None => line,
        };
        pending.push_str(line.trim());
        if let Some(rest) = pending.strip_suffix('\\') {
            pending = format!("{} ", rest.trim_end());
            continue;
        }
        let at = format!("{}:{}", file.display(), i + 1);
        for cmd in std::mem::take(&mut pending).split(" | meridian ") {
            let cmd = cmd.trim().trim_start_matches("meridian ").to_owned();
            let summary = cmd.contains('[')
                || cmd
                    .split_whitespace()
                    .any(|w| w.contains('|') && !w.starts_with('\''));
            if !summary {
                out.push(DocCommand {
                    at: at.clone(),
                    cmd,
                    illustration,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod doc_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::Cli;
    use clap::Parser;

    /// Every command and every argument says what it is for in its help.
    #[test]
    fn every_command_and_argument_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if ["help", "version"].contains(&id) || a.is_hide_set() {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for c in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
                let p = format!("{path} {}", c.get_name());
                if c.get_about().is_none() {
                    missing.push(p.clone());
                }
                walk(c, &p, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::command(), "meridian", &mut missing);
        assert!(missing.is_empty(), "no description: {missing:#?}");
    }

    /// Every TOML example of the README and docs/ is read by the parser of what it shows, named on its fence
    /// (```` ```toml job ````: a job spec; `service`, `site`, `federation`, `tenancy`; or `illustration`, not
    /// read): the docs cannot drift from what the programs take.
    #[test]
    fn every_toml_example_in_the_docs_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![root.join("README.md")];
        files.extend(
            std::fs::read_dir(root.join("docs"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "md")),
        );
        let as_json = |text: &str| -> Vec<u8> {
            let mut v: serde_json::Value =
                serde_json::to_value(toml::from_str::<toml::Value>(text).unwrap()).unwrap();
            v["v"] = 1.into();
            serde_json::to_vec(&v).unwrap()
        };
        let mut read = std::collections::BTreeMap::<String, usize>::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let mut rest = text.as_str();
            while let Some(at) = rest.find("```toml") {
                let after = &rest[at + 7..];
                let (tag, body) = after.split_once('\n').unwrap();
                let end = body.find("```").unwrap();
                let (tag, example) = (tag.trim(), &body[..end]);
                let place = format!("{} ({tag})", file.display());
                let parsed: Result<(), String> = match tag {
                    "job" => meridian_federation::decode_strict::<meridian_federation::JobSpec>(
                        &as_json(example),
                    )
                    .map(drop)
                    .map_err(|e| e.to_string()),
                    "service" => meridian_federation::decode_strict::<
                        meridian_federation::ServiceSpec,
                    >(&as_json(example))
                    .map(drop)
                    .map_err(|e| e.to_string()),
                    "site" => meridian_agent_core::config::parse_site_file(example)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    "federation" => meridian_broker::local::FederationFile::parse(example)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    "tenancy" => meridian_core::quota::Tenancy::from_toml(example)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    "illustration" => Ok(()),
                    other => Err(format!(
                        "untagged or unknown example {other:?}: tag its fence"
                    )),
                };
                if let Err(e) = parsed {
                    panic!("{place}: {e}");
                }
                *read.entry(tag.to_owned()).or_default() += 1;
                rest = &body[end + 3..];
            }
        }
        for tag in ["job", "service", "site", "federation", "tenancy"] {
            assert!(read.contains_key(tag), "no {tag} example found: {read:?}");
        }
    }

    /// docs/cli.md is the reference `--help` is made from, word for word.
    #[test]
    fn cli_reference_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        let made = super::reference_markdown();
        if std::env::var_os("MERIDIAN_WRITE_DOCS").is_some() {
            std::fs::write(&path, &made).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            text == made,
            "docs/cli.md differs from the CLI's definitions: run MERIDIAN_WRITE_DOCS=1 cargo test -p \
             meridian-tools --lib cli_reference"
        );
        for (_, names) in super::GROUPS {
            for n in *names {
                assert!(text.contains(&format!("### `meridian {n}`")), "{n}");
            }
        }
    }

    /// `meridian --help` lists every command once, under its area.
    #[test]
    fn the_help_lists_every_command_once_by_area() {
        let cmd = super::command();
        let grouped: Vec<&str> = super::GROUPS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        let mut commands: Vec<&str> = cmd
            .get_subcommands()
            .map(|c| c.get_name())
            .filter(|n| *n != "help")
            .collect();
        commands.sort();
        let mut sorted = grouped.clone();
        sorted.sort();
        assert_eq!(sorted, commands, "every command in exactly one group");
        let help = cmd.clone().render_help().to_string();
        for (title, names) in super::GROUPS {
            assert!(help.contains(&format!("{title}:\n")), "{help}");
            for n in *names {
                assert_eq!(
                    help.matches(&format!("\n  {n} ")).count(),
                    1,
                    "{n} in {help}"
                );
            }
        }
        assert!(
            help.contains("Connection:") && help.contains("--token"),
            "{help}"
        );
    }

    /// `meridian completions bash` is a script bash reads without a syntax error, and it completes the commands.
    #[test]
    fn the_bash_completion_script_is_valid_bash() {
        let text = super::completion_script(clap_complete::Shell::Bash);
        assert!(text.contains("submit") && text.contains("--state-dir"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meridian.bash");
        std::fs::write(&path, &text).unwrap();
        let checked = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("bash");
        assert!(
            checked.status.success(),
            "{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }

    /// Every command the README and docs/ show parses as the CLI has it: no flag or command that does not exist.
    #[test]
    fn every_documented_command_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![root.join("README.md")];
        let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
            .expect("docs/")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
        let commands: Vec<super::DocCommand> = files
            .iter()
            .flat_map(|f| super::documented_commands(f).unwrap())
            .collect();
        assert!(commands.len() >= 15, "{commands:?}");
        for super::DocCommand { at, cmd, .. } in commands {
            let words = shlex::split(&cmd).unwrap_or_else(|| panic!("{at}: unquoted {cmd:?}"));
            if let Err(e) = Cli::try_parse_from(std::iter::once("meridian".to_owned()).chain(words))
            {
                panic!("{at}: `meridian {cmd}` does not parse:\n{e}");
            }
        }
    }
}
