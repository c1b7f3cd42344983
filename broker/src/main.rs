//! `meridian`: the broker, the client commands and the local federation.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use meridian_broker::client::{read_job_file, Client};
use meridian_broker::local::{LocalFederation, LocalOptions, Topology};
use meridian_broker::{demo, service};
use meridian_federation::{JobId, SiteId};
use serde::Serialize;
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

#[derive(Parser, Debug)]
#[command(
    name = "meridian",
    version,
    about = "Meridian: a federation broker for heterogeneous AI compute"
)]
struct Cli {
    /// NATS server of the federation (client commands).
    #[arg(
        long,
        global = true,
        env = "MERIDIAN_NATS",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats: String,
    /// Output format of client commands.
    #[arg(long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
    /// Comma-separated values (`report` only).
    Csv,
}

/// What `meridian journal` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum JournalAction {
    /// Show the durable format the journal is written in.
    Format,
    /// Write the journal in the newest durable format this broker knows from now on.
    UpgradeFormat,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the broker.
    Broker(service::BrokerConfig),
    /// Submit a job spec (TOML or JSON).
    Submit { file: PathBuf },
    /// List jobs: every one by default (live, then archived), page by page.
    Jobs {
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        tenant: Option<meridian_federation::TenantId>,
        /// pending, offered, running, cancelling, succeeded, failed or cancelled.
        #[arg(long, value_parser = parse_phase)]
        state: Option<meridian_federation::JobPhase>,
        #[arg(long)]
        site: Option<SiteId>,
        /// Only live jobs (not the archive).
        #[arg(long)]
        live: bool,
    },
    /// List sites.
    Sites,
    /// Explain where a job is placed, or why it waits.
    Explain { job: JobId },
    /// Cancel a job.
    Cancel { job: JobId },
    /// Show the tail of a job's output.
    Logs { job: JobId },
    /// Drain a site (no new work; running work finishes); `--undo` lifts the drain.
    Drain {
        site: SiteId,
        #[arg(long)]
        undo: bool,
    },
    /// Stop replicas of a service: pending ones first, then cloud, partner and owned ones.
    ScaleIn {
        service: String,
        /// How many replicas to stop.
        remove: u32,
        #[arg(long)]
        tenant: meridian_federation::TenantId,
    },
    /// Show the broker's tenancy (queues, quotas, priority classes, budgets), or replace it with a file's.
    Tenancy {
        /// The new tenancy file (TOML, see configs/tenancy.toml).
        #[arg(long)]
        set: Option<PathBuf>,
        /// The administrator's token.
        #[arg(long, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: String,
    },
    /// The journal's durable format: `format` shows it, `upgrade-format` moves the journal to the newest format
    /// this broker knows (do it once every broker of the federation runs this release).
    Journal {
        #[arg(value_enum)]
        action: JournalAction,
        /// The administrator's token.
        #[arg(long, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: String,
    },
    /// The metering ledger per tenant, site and accelerator model: accelerator-hours, USD, kWh (PUE included),
    /// kgCO2e, queue wait and attempts, for the attempts offered in a window.
    Report {
        #[arg(long)]
        tenant: Option<meridian_federation::TenantId>,
        /// From this instant (UTC, `YYYY-MM-DDTHH:MMZ`).
        #[arg(long)]
        from: Option<String>,
        /// Until this instant (UTC, `YYYY-MM-DDTHH:MMZ`), exclusive.
        #[arg(long)]
        to: Option<String>,
    },
    /// Bring up a local federation (nats-server, broker, one agent per site) until Ctrl-C.
    Up {
        #[arg(default_value = "configs/federation-demo.toml")]
        federation: PathBuf,
        /// `cluster`: three clustered nats-servers (JetStream replicas 3), edge sites on leaf nodes, and a
        /// standby broker.
        #[arg(long, value_enum, default_value_t = Topology::Single)]
        topology: Topology,
        /// Also start a standby broker (implied by `--topology cluster`).
        #[arg(long)]
        standby: bool,
    },
    /// Simulate a trace over a federation under each policy (and baselines), judged by an independent checker.
    Sim {
        /// Alibaba GPU trace v2023 pod list (CSV).
        #[arg(long)]
        trace: PathBuf,
        /// Azure LLM inference trace (CSV): requests for one inference service.
        #[arg(long)]
        inference: Option<PathBuf>,
        #[arg(long, default_value = "configs/sim/federation.toml")]
        federation: PathBuf,
        /// Run only this policy or baseline.
        #[arg(long)]
        policy: Option<String>,
        /// Also run the baselines fifo-first-fit, nearest, cheapest, greenest.
        #[arg(long)]
        baselines: bool,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Trace time 0 maps to this instant (UTC, `YYYY-MM-DDTHH:MMZ`).
        #[arg(long, default_value = "2022-01-01T00:00Z")]
        start: String,
        /// max_wait_s given to every trace job.
        #[arg(long, default_value_t = 600)]
        max_wait_s: u64,
        /// Use only the first N trace tasks.
        #[arg(long)]
        limit: Option<usize>,
        /// Inference round-trip SLO, ms.
        #[arg(long, default_value_t = 50.0)]
        slo_ms: f64,
        /// Requests per second one inference replica serves.
        #[arg(long, default_value_t = 2.0)]
        replica_rps: f64,
        /// Write an SVG chart of cost against kgCO2e per run.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Write each run's schedule (job name → site) as JSON.
        #[arg(long)]
        schedule: Option<PathBuf>,
        /// Queues, quotas and priority classes for the trace's tenants (`qos-ls`, `qos-be`, …), see
        /// configs/sim/tenancy.toml; adds per-tenant wait and share to the report.
        #[arg(long)]
        tenancy: Option<PathBuf>,
    },
    /// Benchmarks; `meridian bench placement --sites N`.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// The main job: bring up the demo federation, run a trace workload, print where each job ran and why.
    Demo {
        #[arg(long, default_value = "configs/federation-demo.toml")]
        federation: PathBuf,
        /// Workload used when the shared trace data is absent (and for the inference services).
        #[arg(long, default_value = "configs/demo-workload.toml")]
        workload: PathBuf,
        /// Batch jobs taken from the trace.
        #[arg(long, default_value_t = 12)]
        jobs: usize,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// Jobs per second from submission to acceptance through nats-server, the durable broker and 50 agents
    /// on the no-op executor, against plain NATS request-reply in the same run; then jobs that spawn `true`.
    Dispatch {
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        #[arg(long, default_value_t = 50)]
        sites: usize,
        /// Submissions outstanding at once.
        #[arg(long, default_value_t = 256)]
        in_flight: usize,
        /// Jobs of the second run, which spawn `true` (0 skips it).
        #[arg(long, default_value_t = 1_000)]
        spawn_jobs: usize,
    },
    /// Submissions per second and broker CPU per submission as the queue deepens (a full site, jobs that
    /// wait), completions per second at the deepest queue, memory per waiting job, and memory and recovery
    /// time once every job has finished.
    Queue {
        /// Queue depths at which submissions are timed (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [0usize, 100_000, 1_000_000])]
        depths: Vec<usize>,
        /// Submissions timed at each depth (and completions at the deepest).
        #[arg(long, default_value_t = 10_000)]
        step: usize,
        /// Devices of the one full site.
        #[arg(long, default_value_t = 64)]
        devices: usize,
        #[arg(long, default_value_t = 256)]
        in_flight: usize,
        /// Keep logs and state in this folder.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Decision latency with the site index, and by a plain scan of every site, over a synthetic federation.
    Placement {
        #[arg(long, default_value_t = 1000)]
        sites: usize,
        #[arg(long, default_value_t = 2000)]
        decisions: usize,
    },
}

fn main() {
    let cli = Cli::parse();
    let filter = match &cli.command {
        Cmd::Broker(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    let code = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(cli)))
    {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn parse_phase(s: &str) -> Result<meridian_federation::JobPhase, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|_| {
        format!("{s:?} is not a job state: pending, offered, running, cancelling, succeeded, failed or cancelled")
    })
}

fn print<T: Serialize>(output: Output, value: &T, table: impl FnOnce(&T)) -> anyhow::Result<bool> {
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(value)?),
        Output::Table => table(value),
        Output::Csv => {
            anyhow::bail!("--output csv is for `meridian report`; use table or json here")
        }
    }
    Ok(true)
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    let out = cli.output;
    match cli.command {
        Cmd::Broker(cfg) => service::run(cfg).await.map(|_| true),
        Cmd::Up {
            federation,
            topology,
            standby,
        } => {
            let opts = LocalOptions {
                topology,
                standby,
                ..LocalOptions::default()
            };
            let fed = tokio::task::block_in_place(|| LocalFederation::start(&federation, opts))?;
            let url = fed.nats_url();
            outln!("federation up: HTTP API {}", fed.http);
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
                "logs and state in {}; Ctrl-C stops everything",
                fed.dir.display()
            );
            outln!("try: meridian --nats {url} sites");
            let mut sigterm =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = tokio::signal::ctrl_c() => r?,
                _ = sigterm.recv() => {}
            }
            tokio::task::block_in_place(|| drop(fed));
            Ok(true)
        }
        Cmd::Demo {
            federation,
            workload,
            jobs,
        } => {
            demo::run(demo::DemoOptions {
                federation,
                workload,
                jobs,
                json: out == Output::Json,
            })
            .await
        }
        Cmd::Sim {
            trace,
            inference,
            federation,
            policy,
            baselines,
            seed,
            start,
            max_wait_s,
            limit,
            slo_ms,
            replica_rps,
            plot,
            schedule,
            tenancy,
        } => {
            let start_ms = parse_start(&start)?;
            let opts = meridian_broker::sim::SimOptions {
                trace,
                inference,
                federation,
                policy,
                baselines,
                seed,
                start_ms,
                max_wait_s,
                limit,
                slo_ms,
                replica_rps,
                tenancy,
            };
            let (report, schedules, jobs) =
                tokio::task::block_in_place(|| meridian_broker::sim::simulate(&opts))?;
            if let Some(path) = plot {
                std::fs::write(&path, meridian_broker::sim::plot_svg(&report))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if let Some(path) = schedule {
                let map: std::collections::BTreeMap<
                    String,
                    std::collections::BTreeMap<String, String>,
                > = schedules
                    .iter()
                    .map(|(name, entries)| {
                        let sites = entries
                            .iter()
                            .map(|e| {
                                (
                                    jobs[e.job].spec.name.clone().unwrap_or_default(),
                                    e.site.to_string(),
                                )
                            })
                            .collect();
                        (name.clone(), sites)
                    })
                    .collect();
                std::fs::write(&path, serde_json::to_string_pretty(&map)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            print(out, &report, |r| out!("{}", meridian_broker::sim::table(r)))
        }
        Cmd::Bench {
            what:
                BenchCmd::Dispatch {
                    jobs,
                    sites,
                    in_flight,
                    spawn_jobs,
                },
        } => {
            let f = meridian_broker::bench::dispatch::dispatch(
                meridian_broker::bench::dispatch::DispatchOptions {
                    jobs,
                    sites,
                    in_flight,
                    spawn_jobs,
                },
            )
            .await?;
            // One JSON line either way: the figures are meant to be compared and collected.
            outln!("{}", serde_json::to_string(&f)?);
            if out == Output::Table {
                eprintln!(
                    "{} jobs on {} sites, {} in flight: {:.0} dispatches/s vs {:.0} plain NATS requests/s (ratio {:.3}); p50 {:.1} ms, p99 {:.1} ms; {} journal appends; recovery after kill -9 {} ms",
                    f.jobs, f.sites, f.in_flight, f.dispatches_per_s, f.raw_nats_req_per_s, f.ratio, f.p50_ms, f.p99_ms, f.journal_appends,
                    f.recovery_ms.map_or_else(|| "?".to_owned(), |m| m.to_string())
                );
                if let Some(s) = &f.spawn {
                    eprintln!(
                        "{} jobs spawning `true`: {:.0} dispatches/s, p50 {:.1} ms, p99 {:.1} ms; {:.0} completed/s",
                        s.jobs, s.dispatches_per_s, s.p50_ms, s.p99_ms, s.completed_per_s
                    );
                }
            }
            Ok(true)
        }
        Cmd::Bench {
            what:
                BenchCmd::Queue {
                    depths,
                    step,
                    devices,
                    in_flight,
                    dir,
                },
        } => {
            let f =
                meridian_broker::bench::queue::queue(meridian_broker::bench::queue::QueueOptions {
                    depths,
                    step,
                    devices,
                    in_flight,
                    dir,
                })
                .await?;
            outln!("{}", serde_json::to_string(&f)?);
            Ok(true)
        }
        Cmd::Bench {
            what: BenchCmd::Placement { sites, decisions },
        } => {
            let figures =
                tokio::task::block_in_place(|| meridian_broker::bench::placement(sites, decisions));
            print(out, &figures, |f| {
                outln!(
                    "{} sites: {:.0} decisions/s, p50 {:.2} µs, p99 {:.2} µs with the index; full scan p50 {:.2} µs, p99 {:.2} µs; {:.0}% placed",
                    f.sites, f.decisions_per_s, f.p50_us, f.p99_us, f.full_scan_p50_us, f.full_scan_p99_us, f.placed_share * 100.0
                )
            })
        }
        cmd => {
            let client = Client::connect(&cli.nats).await?;
            match cmd {
                Cmd::Submit { file } => {
                    let body = read_job_file(&file)?;
                    let r = client
                        .submit_raw(body)
                        .await
                        .with_context(|| format!("submitting {}", file.display()))?;
                    print(out, &r, |r| {
                        outln!(
                            "{} {}",
                            r.job,
                            if r.created {
                                "submitted"
                            } else {
                                "already submitted (same idempotency key)"
                            }
                        )
                    })
                }
                Cmd::Jobs {
                    limit,
                    tenant,
                    state,
                    site,
                    live,
                } => {
                    let req = meridian_federation::JobListRequest {
                        tenant,
                        state,
                        site,
                        scope: if live {
                            meridian_federation::JobScope::Live
                        } else {
                            meridian_federation::JobScope::All
                        },
                        ..Default::default()
                    };
                    let jobs = client.jobs_matching(req, limit).await?;
                    print(out, &jobs, |jobs| {
                        outln!(
                            "{:<9} {:<20} {:<10} {:<10} {:<16} {:>3}  WHY",
                            "JOB",
                            "NAME",
                            "KIND",
                            "STATE",
                            "SITE",
                            "ATT"
                        );
                        for j in jobs {
                            outln!(
                                "{:<9} {:<20} {:<10} {:<10} {:<16} {:>3}  {}",
                                j.job.as_str(),
                                j.name.clone().unwrap_or_default(),
                                j.kind.as_str(),
                                j.phase.as_str(),
                                j.site.as_ref().map(|s| s.as_str()).unwrap_or("-"),
                                j.attempt,
                                j.why
                            );
                        }
                    })
                }
                Cmd::Sites => {
                    let sites = client.sites().await?;
                    print(out, &sites, |sites| {
                        outln!(
                            "{:<18} {:<8} {:<5} {:<6} {:>5} {:>6}  POOLS (free/total)",
                            "SITE",
                            "TIER",
                            "UP",
                            "DRAIN",
                            "PUE",
                            "gCO2"
                        );
                        for s in sites {
                            let pools: Vec<String> = s
                                .pools
                                .iter()
                                .map(|p| {
                                    format!(
                                        "{} {:.1}/{}",
                                        p.model,
                                        p.free_milli as f64 / 1000.0,
                                        p.count
                                    )
                                })
                                .collect();
                            outln!(
                                "{:<18} {:<8} {:<5} {:<6} {:>5.2} {:>6}  {}",
                                s.site.as_str(),
                                s.tier.as_str(),
                                s.up,
                                s.draining,
                                s.pue,
                                s.carbon_g_per_kwh,
                                pools.join(", ")
                            );
                        }
                    })
                }
                Cmd::Explain { job } => {
                    let e = client.explain(&job).await?;
                    print(out, &e, |e| {
                        outln!("{} is {}: {}", e.job, e.phase.as_str(), e.why);
                        outln!("policy {}", e.policy);
                        if e.candidates.is_empty() {
                            outln!("(no placement was tried: the reason above holds it first)");
                        } else {
                            outln!(
                                "{:<18} {:<8} {:<8} {:>9} {:>8} {:>8} {:>8} {:>8}  VERDICT",
                                "SITE",
                                "TIER",
                                "POOL",
                                "COST $",
                                "kWh",
                                "kgCO2",
                                "RTT ms",
                                "SCORE"
                            );
                        }
                        for c in &e.candidates {
                            let (cost, kwh, co2, rtt, score) = match &c.terms {
                                Some(t) => (
                                    format!("{:.2}", t.cost_micro_usd as f64 / 1e6),
                                    format!("{:.1}", t.energy_wh as f64 / 1000.0),
                                    format!("{:.2}", t.co2_g as f64 / 1000.0),
                                    format!("{:.1}", t.latency_ms),
                                    if t.score >= 0.0 {
                                        format!("{:.3}", t.score)
                                    } else {
                                        "-".into()
                                    },
                                ),
                                None => {
                                    ("-".into(), "-".into(), "-".into(), "-".into(), "-".into())
                                }
                            };
                            let verdict = if c.chosen {
                                "CHOSEN".to_string()
                            } else {
                                c.rejected.clone().unwrap_or_default()
                            };
                            outln!(
                                "{:<18} {:<8} {:<8} {:>9} {:>8} {:>8} {:>8} {:>8}  {}",
                                c.site.as_str(),
                                c.tier.as_str(),
                                c.pool.clone().unwrap_or_else(|| "-".into()),
                                cost,
                                kwh,
                                co2,
                                rtt,
                                score,
                                verdict
                            );
                        }
                        for p in &e.pruned {
                            outln!(
                                "{:<18} pruned by the index: {}",
                                format!("({} sites)", p.sites),
                                p.reason
                            );
                        }
                        outln!("history:");
                        for h in &e.history {
                            outln!("  {h}");
                        }
                    })
                }
                Cmd::Cancel { job } => {
                    let j = client.cancel(&job).await?;
                    print(out, &j, |j| {
                        outln!("{} {}: {}", j.job, j.phase.as_str(), j.why)
                    })
                }
                Cmd::Logs { job } => {
                    let l = client.logs(&job).await?;
                    print(out, &l, |l| outln!("{}", l.text))
                }
                Cmd::ScaleIn {
                    service,
                    remove,
                    tenant,
                } => {
                    let r = client.scale_in(&tenant, &service, remove).await?;
                    print(out, &r, |r| {
                        for id in &r.stopping {
                            outln!("{id} stopping");
                        }
                    })
                }
                Cmd::Tenancy { set, admin_token } => {
                    let toml = match &set {
                        Some(path) => Some(
                            std::fs::read_to_string(path)
                                .with_context(|| format!("reading {}", path.display()))?,
                        ),
                        None => None,
                    };
                    let v = client.tenancy(&admin_token, toml).await?;
                    print(out, &v, |v| match &v.toml {
                        Some(t) => out!("{t}"),
                        None => outln!("no tenancy: nothing is limited by quota"),
                    })
                }
                Cmd::Journal {
                    action,
                    admin_token,
                } => {
                    let upgrade = action == JournalAction::UpgradeFormat;
                    let v = client.journal_format(&admin_token, upgrade).await?;
                    print(out, &v, |v| {
                        outln!(
                            "journal format {} (this broker knows up to {})",
                            v.format,
                            v.newest
                        )
                    })
                }
                Cmd::Report { tenant, from, to } => {
                    let req = meridian_federation::ReportRequest {
                        v: meridian_federation::WIRE_VERSION,
                        tenant,
                        from_ms: from.as_deref().map(parse_start).transpose()?,
                        to_ms: to.as_deref().map(parse_start).transpose()?,
                    };
                    let r = client.report(&req).await?;
                    if out == Output::Csv {
                        print_report_csv(&r);
                        return Ok(true);
                    }
                    print(out, &r, print_report_table)
                }
                Cmd::Drain { site, undo } => {
                    let s = client.drain(&site, !undo).await?;
                    print(out, &s, |s| outln!("{} draining: {}", s.site, s.draining))
                }
                Cmd::Broker(_)
                | Cmd::Up { .. }
                | Cmd::Demo { .. }
                | Cmd::Sim { .. }
                | Cmd::Bench { .. } => Ok(true),
            }
        }
    }
}

fn report_sections(
    r: &meridian_federation::ReportView,
) -> [(&'static str, Vec<&meridian_federation::ReportRow>); 4] {
    [
        ("tenant", r.by_tenant.iter().collect()),
        ("site", r.by_site.iter().collect()),
        ("model", r.by_model.iter().collect()),
        ("total", vec![&r.total]),
    ]
}

fn print_report_table(r: &meridian_federation::ReportView) {
    outln!(
        "{:<7} {:<20} {:>6} {:>8} {:>12} {:>12} {:>10} {:>10} {:>11}",
        "BY",
        "KEY",
        "JOBS",
        "ATTEMPTS",
        "DEVICE-H",
        "USD",
        "kWh",
        "kgCO2e",
        "WAIT s"
    );
    for (by, rows) in report_sections(r) {
        for x in rows {
            outln!(
                "{:<7} {:<20} {:>6} {:>8} {:>12.3} {:>12.2} {:>10.3} {:>10.3} {:>11.1}",
                by,
                x.key,
                x.jobs,
                x.attempts,
                x.device_milli_ms as f64 / 3.6e9,
                x.cost_micro_usd as f64 / 1e6,
                x.energy_wh as f64 / 1e3,
                x.co2_g as f64 / 1e3,
                x.wait_ms as f64 / 1e3
            );
        }
    }
    outln!("JOBS per site or model counts a job in every row it ran in; the other columns add up to the total.");
}

/// The report as CSV, in the ledger's integer units.
fn print_report_csv(r: &meridian_federation::ReportView) {
    outln!("by,key,jobs,attempts,device_milli_ms,cost_micro_usd,energy_wh,co2_g,wait_ms");
    for (by, rows) in report_sections(r) {
        for x in rows {
            outln!(
                "{by},{},{},{},{},{},{},{},{}",
                x.key,
                x.jobs,
                x.attempts,
                x.device_milli_ms,
                x.cost_micro_usd,
                x.energy_wh,
                x.co2_g,
                x.wait_ms
            );
        }
    }
}

/// `YYYY-MM-DDTHH:MMZ` → milliseconds since the Unix epoch.
fn parse_start(s: &str) -> anyhow::Result<u64> {
    let bad = || anyhow::anyhow!("--start {s:?}: expected YYYY-MM-DDTHH:MMZ");
    let (date, time) = s.trim_end_matches('Z').split_once('T').ok_or_else(bad)?;
    meridian_broker::sim::trace::parse_timestamp_ms(&format!("{date} {time}:00")).ok_or_else(bad)
}
