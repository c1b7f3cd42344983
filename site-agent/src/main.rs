//! `meridian-agent`: the daemon at each site.

use anyhow::Context;
use clap::builder::TypedValueParser;
use clap::{Parser, Subcommand};
use meridian_agent::{config, runtime};
use meridian_federation::BackendKind;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "meridian-agent", version, about = "Meridian site agent")]
struct Cli {
    /// Site file (TOML).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// NATS server URL; overrides the site file.
    #[arg(long, env = "MERIDIAN_NATS")]
    nats: Option<String>,
    /// The CA that signs the NATS servers' certificates (TLS is required when given); overrides the site file.
    #[arg(long, env = "MERIDIAN_CA")]
    ca: Option<PathBuf>,
    /// This site's NKey seed file (`meridian creds add site <id>`); overrides the site file.
    #[arg(long, env = "MERIDIAN_CREDS")]
    creds: Option<PathBuf>,
    /// Folder for job logs and records; overrides the site file.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Heartbeat period, ms; overrides the site file.
    #[arg(long, env = "MERIDIAN_HEARTBEAT_MS")]
    heartbeat_ms: Option<u64>,
    /// How accepted jobs run, overriding the site file's `[backend] kind`: `process`, or `noop` (accepted and
    /// reported running, nothing started).
    #[arg(long, env = "MERIDIAN_EXECUTOR", value_parser = backend_kind())]
    executor: Option<BackendKind>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// `--executor`'s values: the wire names of the backends.
fn backend_kind() -> impl TypedValueParser<Value = BackendKind> {
    clap::builder::PossibleValuesParser::new(BackendKind::ALL.map(BackendKind::as_str)).map(
        |name| {
            BackendKind::ALL
                .into_iter()
                .find(|k| k.as_str() == name)
                .unwrap_or_default()
        },
    )
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Internal: supervise one job's process group (started by the agent itself).
    #[command(hide = true)]
    Shim {
        #[arg(long)]
        grace_ms: u64,
        /// How long the job outlives its agent, waiting for a new one to adopt it.
        #[arg(long, default_value_t = 0)]
        adopt_grace_ms: u64,
        #[arg(long)]
        pgid_file: PathBuf,
        #[arg(last = true)]
        argv: Vec<String>,
    },
    /// Print what the device probes find, as JSON.
    Probe,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::Shim {
            grace_ms,
            adopt_grace_ms,
            pgid_file,
            argv,
        }) => {
            let code = meridian_adapters::local::shim_main(
                Duration::from_millis(grace_ms),
                Duration::from_millis(adopt_grace_ms),
                &pgid_file,
                &argv,
            );
            std::process::exit(code);
        }
        Some(Cmd::Probe) => {
            use meridian_adapters::probe::{group_into_pools, DeviceProbe, NvmlProbe};
            match NvmlProbe::default().probe() {
                Ok(devices) => {
                    for p in group_into_pools(&devices) {
                        println!(
                            "{{\"vendor\":{:?},\"model\":{:?},\"memory_mib\":{},\"count\":{},\"power_watts\":{}}}",
                            p.vendor,
                            p.model,
                            p.memory_mib,
                            p.indices.len(),
                            p.power_watts.map(|w| w.to_string()).unwrap_or_else(|| "null".into())
                        );
                    }
                    Ok(())
                }
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
            }
        }
        None => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_target(false)
                .init();
            let path = cli.config.context("--config FILE is required")?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut site = config::parse_site_file(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if let Some(ms) = cli.heartbeat_ms {
                site.agent.heartbeat_ms = ms;
            }
            let access = meridian_runtime::access::Access {
                nats: cli.nats.unwrap_or_else(|| site.agent.nats_url.clone()),
                ca: cli.ca.or_else(|| site.agent.ca.clone()),
                creds: cli.creds.or_else(|| site.agent.creds.clone()),
            };
            if let Some(name) = access.identity() {
                anyhow::ensure!(
                    name == site.id.as_str(),
                    "the credential {} is site {name}'s, and this is site {}: a site connects only as itself",
                    access.creds.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                    site.id
                );
            }
            let work_dir = cli
                .work_dir
                .or_else(|| site.agent.work_dir.clone())
                .unwrap_or_else(|| {
                    std::env::temp_dir().join(format!("meridian-agent-{}", site.id))
                });
            // One thread: the agent's work is small and mostly waiting; a site with many agents on one host
            // (or a benchmark with fifty) is not worth two threads each.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            if let Some(kind) = cli.executor {
                site.backend.kind = kind;
            }
            rt.block_on(runtime::run(runtime::AgentOptions {
                site,
                access,
                work_dir,
            }))
        }
    }
}
