//! The commands that talk to a federation through its NATS API.

use super::render::{self, print};
use super::{out, outln, Output};
use crate::client::{read_job_file, Client};
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use meridian_federation::{JobId, JobPhase, JobScope, SiteId, TenantId};
use std::path::PathBuf;

/// How a client reaches the federation: NATS, its CA, the client's identity, and its API token.
#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub access: meridian_federation::access::Access,
    /// The API token (`meridian token create`; `meridian up` prints an administrator's).
    #[arg(long, global = true, env = "MERIDIAN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// What `meridian journal` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum JournalAction {
    /// Show the durable format the journal is written in.
    Format,
    /// Write the journal in the newest durable format this broker knows from now on.
    UpgradeFormat,
}

#[derive(Subcommand, Debug)]
pub enum ClientCmd {
    /// Submit a job spec (TOML or JSON).
    Submit { file: PathBuf },
    /// List jobs: every one by default (live, then archived), page by page.
    Jobs {
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        tenant: Option<TenantId>,
        /// pending, offered, running, cancelling, succeeded, failed or cancelled.
        #[arg(long, value_parser = parse_phase)]
        state: Option<JobPhase>,
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
        tenant: TenantId,
    },
    /// Show the broker's tenancy (queues, quotas, priority classes, budgets), or replace it with a file's.
    Tenancy {
        /// The new tenancy file (TOML, see configs/tenancy.toml).
        #[arg(long)]
        set: Option<PathBuf>,
    },
    /// The journal's durable format: `format` shows it, `upgrade-format` moves the journal to the newest format
    /// this broker knows (do it once every broker of the federation runs this release).
    Journal {
        #[arg(value_enum)]
        action: JournalAction,
    },
    /// The metering ledger per tenant, site and accelerator model: accelerator-hours, USD, kWh (PUE included),
    /// kgCO2e, queue wait and attempts, for the attempts offered in a window.
    Report {
        #[arg(long)]
        tenant: Option<TenantId>,
        /// From this instant (UTC, `YYYY-MM-DDTHH:MMZ`).
        #[arg(long, value_parser = crate::sim::parse_instant)]
        from: Option<u64>,
        /// Until this instant (UTC, `YYYY-MM-DDTHH:MMZ`), exclusive.
        #[arg(long, value_parser = crate::sim::parse_instant)]
        to: Option<u64>,
    },
}

fn parse_phase(s: &str) -> Result<JobPhase, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|_| {
        format!("{s:?} is not a job state: pending, offered, running, cancelling, succeeded, failed or cancelled")
    })
}

pub async fn run(cmd: ClientCmd, connect: &ConnectArgs, out: Output) -> anyhow::Result<bool> {
    let client = Client::connect(&connect.access, connect.token.clone()).await?;
    match cmd {
        ClientCmd::Submit { file } => {
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
        ClientCmd::Jobs {
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
                scope: if live { JobScope::Live } else { JobScope::All },
                ..Default::default()
            };
            let jobs = client.jobs_matching(req, limit).await?;
            print(out, &jobs, |j| render::jobs(j))
        }
        ClientCmd::Sites => {
            let sites = client.sites().await?;
            print(out, &sites, |s| render::sites(s))
        }
        ClientCmd::Explain { job } => {
            let e = client.explain(&job).await?;
            print(out, &e, render::explain)
        }
        ClientCmd::Cancel { job } => {
            let j = client.cancel(&job).await?;
            print(out, &j, |j| {
                outln!("{} {}: {}", j.job, j.phase.as_str(), j.why)
            })
        }
        ClientCmd::Logs { job } => {
            let l = client.logs(&job).await?;
            print(out, &l, |l| outln!("{}", l.text))
        }
        ClientCmd::ScaleIn {
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
        ClientCmd::Tenancy { set } => {
            let toml = match &set {
                Some(path) => Some(
                    std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?,
                ),
                None => None,
            };
            let v = client.tenancy(toml).await?;
            print(out, &v, |v| match &v.toml {
                Some(t) => out!("{t}"),
                None => outln!("no tenancy: nothing is limited by quota"),
            })
        }
        ClientCmd::Journal { action } => {
            let upgrade = action == JournalAction::UpgradeFormat;
            let v = client.journal_format(upgrade).await?;
            print(out, &v, |v| {
                outln!(
                    "journal format {} (this broker knows up to {})",
                    v.format,
                    v.newest
                )
            })
        }
        ClientCmd::Report { tenant, from, to } => {
            let req = meridian_federation::ReportRequest {
                v: meridian_federation::WIRE_VERSION,
                tenant,
                from_ms: from,
                to_ms: to,
            };
            let r = client.report(&req).await?;
            if out == Output::Csv {
                render::report_csv(&r);
                return Ok(true);
            }
            print(out, &r, render::report_table)
        }
        ClientCmd::Drain { site, undo } => {
            let s = client.drain(&site, !undo).await?;
            print(out, &s, |s| outln!("{} draining: {}", s.site, s.draining))
        }
    }
}
