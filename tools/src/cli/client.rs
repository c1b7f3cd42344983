//! The commands that talk to a federation through its NATS API.

use super::render::{self, print};
use super::{out, outln, Output};
use anyhow::Context;
use clap::{Args, Subcommand};
use meridian_broker::client::{read_job_file, Client};
use meridian_federation::{JobId, JobPhase, JobScope, SiteId, TenantId};
use std::path::PathBuf;

/// How a client reaches the federation: NATS, its CA, the client's identity, and its API token.
#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub access: meridian_runtime::access::Access,
    /// The API token.
    ///
    /// Made by `meridian token create`; `meridian up` prints an administrator's.
    #[arg(
        long,
        global = true,
        env = "MERIDIAN_TOKEN",
        hide_env_values = true,
        help_heading = "Connection"
    )]
    pub token: Option<String>,
}

/// What `meridian journal` does.
#[derive(Subcommand, Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalAction {
    /// Show the durable format the journal is written in, and any message that keeps the broker read-only.
    Format,
    /// Write the journal in the newest durable format this broker knows from now on.
    UpgradeFormat,
    /// Set aside the journal message the broker cannot read (the sequence it names), so it replays what
    /// follows and takes changes again. The message stays in the stream, unread.
    Quarantine {
        /// The journal message's sequence (`meridian journal format` names the one that cannot be read).
        seq: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum ServiceCmd {
    /// Deploy a service, or replace its spec (TOML or JSON; see docs/serving.md).
    Deploy {
        /// The service file (TOML or JSON).
        file: PathBuf,
    },
    /// The services the token reads.
    List {
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
    },
    /// A service: its replicas per site with their state, the demand they serve, their cost and kgCO2e per
    /// hour; the demand planned for; the recent changes and why.
    Show {
        /// The service's name.
        name: meridian_federation::ServiceName,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
    },
    /// Delete a service: its replicas stop.
    Delete {
        /// The service's name.
        name: meridian_federation::ServiceName,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
    },
    /// Report demand as a gateway: `--at NAME:LAT:LON:RATE` per user location (rate per second in the
    /// service's unit).
    Demand {
        /// The service's name.
        name: meridian_federation::ServiceName,
        /// A user location and its rate: `NAME:LAT:LON:RATE` (requests per second); repeatable.
        #[arg(long = "at", value_parser = parse_rate, required = true)]
        at: Vec<meridian_federation::LocationRate>,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
    },
    /// The routing table: per user location, the sites with running replicas within the SLO and their weights.
    Routes {
        /// The service's name.
        name: meridian_federation::ServiceName,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
    },
}

/// The order of `meridian jobs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    Newest,
    Oldest,
}

/// A site state, as `meridian sites --state` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SiteStateArg {
    Up,
    Draining,
    Lost,
    Revoked,
}

impl SiteStateArg {
    fn state(self) -> meridian_federation::SiteState {
        use meridian_federation::SiteState as S;
        match self {
            SiteStateArg::Up => S::Up,
            SiteStateArg::Draining => S::Draining,
            SiteStateArg::Lost => S::Lost,
            SiteStateArg::Revoked => S::Revoked,
        }
    }
}

/// `NAME:LAT:LON:RATE`.
fn parse_rate(s: &str) -> Result<meridian_federation::LocationRate, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [name, lat, lon, rate] = parts.as_slice() else {
        return Err(format!("{s:?}: expected NAME:LAT:LON:RATE"));
    };
    let num = |what: &str, v: &str| {
        v.parse::<f64>()
            .map_err(|_| format!("{s:?}: {what} {v:?} is not a number"))
    };
    Ok(meridian_federation::LocationRate {
        name: (*name).to_owned(),
        location: meridian_federation::GeoPoint {
            lat: num("latitude", lat)?,
            lon: num("longitude", lon)?,
        },
        rtt_region: None,
        per_s: num("rate", rate)?,
    })
}

#[derive(Subcommand, Debug)]
pub enum ClientCmd {
    /// Submit a job: from its spec file (TOML or JSON), or in one line with no file
    /// (`meridian submit --tenant research --gpus A100:4 -- python train.py`).
    Submit(SubmitArgs),
    /// List jobs, newest first: every one by default (live, then archived), page by page.
    Jobs {
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
        /// pending, offered, running, cancelling, succeeded, failed or cancelled.
        #[arg(long, value_parser = parse_phase)]
        state: Option<JobPhase>,
        /// Only jobs that ran (or run) at this site.
        #[arg(long)]
        site: Option<SiteId>,
        /// Only live jobs (not the archive).
        #[arg(long)]
        live: bool,
        /// Submitted at or after this instant (UTC: `2026-12-04`, `2026-12-04T20:00Z`) or this long ago
        /// (`90s`, `30m`, `1h`, `2d`).
        #[arg(long, value_parser = parse_since)]
        since: Option<u64>,
        /// Submitted before this instant or this long ago (as `--since`).
        #[arg(long, value_parser = parse_since)]
        until: Option<u64>,
        /// Draw the listing again every 2 s until Ctrl-C (with `--output json`, one JSON array a line).
        #[arg(long)]
        watch: bool,
        /// `newest` first (live jobs by submission, then the most recently archived) or `oldest` first.
        #[arg(long, value_enum, default_value_t = Sort::Newest)]
        sort: Sort,
        /// The table's columns, comma-separated (job, name, tenant, queue, kind, state, site, pool, att,
        /// submitted, started, finished, exit, wait, usd, est-usd, kgco2, why).
        #[arg(long, value_enum, value_delimiter = ',')]
        columns: Vec<render::JobColumn>,
    },
    /// The queues: live jobs per queue (running, offered, pending and why they wait), and each queue's waiting
    /// jobs in the order they are tried, with their positions.
    Queue {
        /// Only this queue (a job that names none is in its tenant's).
        queue: Option<String>,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
        /// Waiting jobs listed per queue.
        #[arg(long, default_value_t = 10)]
        head: u32,
    },
    /// One job, a field a line: its state and why, site and pool, times (UTC), exit code, and its estimated
    /// and metered cost, energy and carbon.
    Show {
        /// The job's id (`j-000042`).
        job: JobId,
    },
    /// List sites.
    Sites {
        /// Only the sites in this state.
        #[arg(long, value_enum)]
        state: Option<SiteStateArg>,
    },
    /// The accelerator catalogue: every pool of every site by model, with its free and total devices, price
    /// per device-hour and grid carbon, cheapest first.
    Gpus {
        /// Only this model (any case).
        #[arg(long)]
        model: Option<String>,
    },
    /// Explain where a job is placed, or why it waits: each candidate site's cost, energy, carbon and latency,
    /// or why it was rejected.
    Explain {
        /// The job's id.
        job: JobId,
        /// Every site of the federation, as placement weighs the job now (none left out unscored).
        #[arg(long)]
        all: bool,
    },
    /// Cancel a job.
    Cancel {
        /// The job's id.
        job: JobId,
    },
    /// Show the tail of a job's output; `-f` follows it until the job ends.
    Logs {
        /// The job's id.
        job: JobId,
        /// Keep printing new lines as the job writes them, until it ends (Ctrl-C stops following).
        #[arg(short, long)]
        follow: bool,
    },
    /// Show a job's life: every change with its time, attempt and site, each attempt's run time and amounts,
    /// the latest placement's best candidates, and the end of its log.
    Timeline {
        /// The job's id.
        job: JobId,
    },
    /// Drain a site (no new work; running work finishes); `--undo` lifts the drain.
    Drain {
        /// The site's id.
        site: SiteId,
        /// Lift the drain: the site takes new work again.
        #[arg(long)]
        undo: bool,
    },
    /// Inference services: deploy one from its file, list, show, delete, report demand, read its routes.
    #[command(subcommand)]
    Service(ServiceCmd),
    /// Stop replicas of a service: pending ones first, then cloud, partner and owned ones.
    ScaleIn {
        /// The service's name.
        service: meridian_federation::ServiceName,
        /// How many replicas to stop.
        remove: u32,
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: TenantId,
    },
    /// Show the broker's tenancy (queues, quotas, priority classes, budgets), or replace it with a file's.
    Tenancy {
        /// The new tenancy file (TOML, see configs/tenancy.toml).
        #[arg(long)]
        set: Option<PathBuf>,
    },
    /// The journal (administrators): `format` shows its durable format, `upgrade-format` moves it to the newest
    /// format this broker knows (once every broker of the federation runs this release), `quarantine SEQ` sets
    /// aside a message the broker cannot read.
    Journal {
        #[command(subcommand)]
        action: JournalAction,
    },
    /// API tokens (administrators): `create --tenant T --role ROLE…`, `list`, `revoke ID`.
    Token {
        #[command(subcommand)]
        what: TokenCmd,
    },
    /// Revoke a site (it is lost at once, its work requeued, and nothing it sends is taken; revoke its NATS
    /// credential too, with `meridian creds revoke`), or let it back in with `--restore`.
    RevokeSite {
        /// The site's id.
        site: SiteId,
        /// Let a revoked site back in (its agent must hold a valid credential again).
        #[arg(long)]
        restore: bool,
    },
    /// The audit trail (administrators): who did what, when, and how it ended; refusals counted.
    Audit {
        /// From this instant (UTC: `2026-12-04`, `2026-12-04T20:00Z`, `2026-12-04T20:00:00Z`) or this long ago
        /// (`90s`, `30m`, `1h`, `2d`).
        #[arg(long, value_parser = parse_since)]
        since: Option<u64>,
        /// One credential: a token id, `admin`, or `site:<id>`.
        #[arg(long)]
        who: Option<String>,
        /// At most this many entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// The metering ledger per tenant, site and accelerator model: accelerator-hours, USD, kWh (PUE included),
    /// kgCO2e, queue wait and attempts, for the attempts offered in a window.
    Report {
        /// The tenant (an administrator's token may name any; a tenant's token, its own).
        #[arg(long)]
        tenant: Option<TenantId>,
        /// From this instant (UTC, `YYYY-MM-DDTHH:MMZ`).
        #[arg(long, value_parser = crate::sim::parse_instant)]
        from: Option<u64>,
        /// Until this instant (UTC, `YYYY-MM-DDTHH:MMZ`), exclusive.
        #[arg(long, value_parser = crate::sim::parse_instant)]
        to: Option<u64>,
    },
    /// Capacity what-if: replay the jobs of the last days (live and archived) through the simulator on today's
    /// federation and on one changed by --add, --remove and --drain; compare wait, cost, energy, carbon and
    /// burst (an administrator's call).
    Plan(crate::sim::plan::PlanOptions),
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a token; it is printed once (only its hash is kept).
    Create {
        /// The tenant it acts for (not with `--role admin`).
        #[arg(long)]
        tenant: Option<TenantId>,
        /// `admin`, `viewer`, or `submit`, `cancel`, `watch`, `report`, each optionally `:QUEUE,QUEUE`;
        /// repeatable.
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// A name to know it by in `token list` and the audit.
        #[arg(long)]
        name: Option<String>,
        /// Valid for this many days.
        #[arg(long, default_value_t = 90)]
        days: u64,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id: refused from now on.
    Revoke {
        /// The token's id (`meridian token list`).
        id: String,
    },
}

/// `meridian submit`: a spec file, or a one-line job built from the flags and the command after `--`.
#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// The job spec (TOML or JSON; see configs/jobs/). Not with a command after `--`.
    #[arg(required_unless_present = "command", conflicts_with = "command")]
    pub file: Option<PathBuf>,
    /// The tenant the one-line job is for.
    #[arg(long, env = "MERIDIAN_TENANT")]
    pub tenant: Option<TenantId>,
    /// Devices per replica: `4`, or `MODEL:4` for one model (`A100:4`).
    #[arg(long, value_parser = parse_gpus, default_value = "1", conflicts_with = "file")]
    pub gpus: Gpus,
    /// The queue (its tenant's only queue when absent).
    #[arg(long, conflicts_with = "file")]
    pub queue: Option<meridian_federation::QueueName>,
    /// training, fine-tune, batch or inference.
    #[arg(long, default_value = "batch", conflicts_with = "file")]
    pub kind: String,
    /// A name to know the job by.
    #[arg(long, conflicts_with = "file")]
    pub name: Option<String>,
    /// The placement policy: latency, cost, green or balanced.
    #[arg(long, conflicts_with = "file")]
    pub policy: Option<String>,
    /// The expected run time (`90s`, `30m`, `2h`), for placement's cost and carbon estimates.
    #[arg(long, value_parser = parse_duration_s, conflicts_with = "file")]
    pub duration: Option<u64>,
    /// Submitting the same key again returns the first job (made up when absent).
    #[arg(long, conflicts_with = "file")]
    pub key: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Devices per replica, of one model or of any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpus {
    pub model: Option<String>,
    pub count: u32,
}

/// `4` or `MODEL:4`.
fn parse_gpus(s: &str) -> Result<Gpus, String> {
    let (model, n) = match s.rsplit_once(':') {
        Some((m, n)) if !m.trim().is_empty() => (Some(m.trim().to_owned()), n),
        Some(_) => {
            return Err(format!(
                "{s:?}: the model before ':' is empty; expected 4 or MODEL:4 (A100:4)"
            ))
        }
        None => (None, s),
    };
    match n.trim().parse::<u32>() {
        Ok(count) if count > 0 => Ok(Gpus { model, count }),
        _ => Err(format!(
            "{s:?}: expected a device count of 1 or more, as 4 or MODEL:4 (A100:4)"
        )),
    }
}

/// `90s`, `30m`, `2h`, `1d`, or plain seconds.
fn parse_duration_s(s: &str) -> Result<u64, String> {
    let s = s.trim();
    s.parse::<u64>()
        .ok()
        .or_else(|| span_ms(s).map(|ms| ms / 1000))
        .ok_or_else(|| format!("{s:?}: expected a duration such as 90s, 30m, 2h or 1d"))
}

/// A command line as one shell string: each argument quoted where the shell would split or expand it.
fn shell_line(args: &[String]) -> String {
    let quote = |a: &String| {
        let plain = !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
        match plain {
            true => a.clone(),
            false => format!("'{}'", a.replace('\'', r"'\''")),
        }
    };
    args.iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// The spec of a one-line job, as the JSON a spec file would hold (the broker validates it as any other).
fn one_line_spec(a: &SubmitArgs, now_ms: u64) -> anyhow::Result<Vec<u8>> {
    let tenant = a.tenant.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "a job with no spec file needs its tenant: give --tenant NAME or set MERIDIAN_TENANT"
        )
    })?;
    let key = match &a.key {
        Some(k) => k.clone(),
        None => format!("cli-{now_ms}-{}", std::process::id()),
    };
    let mut resources = serde_json::json!({ "kind": "gpu", "count": a.gpus.count });
    if let Some(m) = &a.gpus.model {
        resources["models"] = serde_json::json!([m]);
    }
    let mut spec = serde_json::json!({
        "tenant": tenant,
        "idempotency_key": key,
        "kind": a.kind,
        "resources": resources,
        "run": { "command": shell_line(&a.command) },
    });
    let optional = [
        ("queue", a.queue.as_ref().map(|q| serde_json::json!(q))),
        ("name", a.name.as_ref().map(|n| serde_json::json!(n))),
        ("policy", a.policy.as_ref().map(|p| serde_json::json!(p))),
        ("duration_s", a.duration.map(|d| serde_json::json!(d))),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            spec[k] = v;
        }
    }
    Ok(serde_json::to_vec(&spec)?)
}

fn parse_phase(s: &str) -> Result<JobPhase, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|_| {
        format!("{s:?} is not a job state: pending, offered, running, cancelling, succeeded, failed or cancelled")
    })
}

pub async fn run(cmd: ClientCmd, connect: &ConnectArgs, out: Output) -> anyhow::Result<bool> {
    let client = Client::connect(&connect.access, connect.token.clone()).await?;
    match cmd {
        ClientCmd::Submit(args) => {
            let (body, what) = match &args.file {
                Some(file) => (read_job_file(file)?, file.display().to_string()),
                None => (
                    one_line_spec(&args, meridian_broker::service::now_ms())?,
                    "the job".to_owned(),
                ),
            };
            let r = client
                .submit_raw(body)
                .await
                .map_err(|e| match &args.file {
                    Some(file) => meridian_broker::client::in_file_terms(e, file),
                    None => e,
                })
                .with_context(|| format!("submitting {what}"))?;
            // Said at once when no site of the federation can run it as it stands (model, memory, count…).
            let cannot = match client.job(&r.job).await {
                Ok(v) if v.unsatisfiable => Some(v.why),
                _ => None,
            };
            print(out, &r, |r| {
                let said = match (&cannot, r.created) {
                    (Some(why), _) => format!("accepted, but no site can run it now: {why}"),
                    (None, true) => "submitted".to_owned(),
                    (None, false) => "already submitted (same idempotency key)".to_owned(),
                };
                outln!("{} {said}", r.job)
            })
        }
        ClientCmd::Jobs {
            limit,
            tenant,
            state,
            site,
            live,
            since,
            until,
            watch,
            sort,
            columns,
        } => {
            let req = meridian_federation::JobListRequest {
                tenant,
                state,
                site,
                from_ms: since,
                to_ms: until,
                scope: if live { JobScope::Live } else { JobScope::All },
                newest_first: sort == Sort::Newest,
                ..Default::default()
            };
            let columns = if columns.is_empty() {
                render::DEFAULT_JOB_COLUMNS.to_vec()
            } else {
                columns
            };
            if !watch {
                let jobs = client.jobs_matching(req, limit).await?;
                return print(out, &jobs, |j| render::jobs(j, &columns));
            }
            loop {
                let jobs = client.jobs_matching(req.clone(), limit).await?;
                match out {
                    Output::Json => outln!("{}", serde_json::to_string(&jobs)?),
                    _ => {
                        // Clear the screen, then the listing and when it was read.
                        out!("\x1b[2J\x1b[H");
                        outln!(
                            "{} jobs at {} (every 2 s; Ctrl-C stops)",
                            jobs.len(),
                            render::iso(meridian_broker::service::now_ms())
                        );
                        render::jobs(&jobs, &columns);
                    }
                }
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
        ClientCmd::Queue {
            queue,
            tenant,
            head,
        } => {
            let req = meridian_federation::QueuesRequest {
                queue,
                tenant,
                head: Some(head),
                ..Default::default()
            };
            let q = client.queues(&req).await?;
            print(out, &q, render::queues)
        }
        ClientCmd::Show { job } => {
            let j = client.job(&job).await?;
            print(out, &j, render::job)
        }
        ClientCmd::Gpus { model } => {
            let sites = client.sites().await?;
            let rows = render::gpu_rows(&sites, model.as_deref());
            print(out, &rows, |r| render::gpus(r))
        }
        ClientCmd::Sites { state } => {
            let sites = client.sites_in(state.map(SiteStateArg::state)).await?;
            print(out, &sites, |s| render::sites(s))
        }
        ClientCmd::Explain { job, all } => {
            let e = client.explain_sites(&job, all).await?;
            print(out, &e, render::explain)
        }
        ClientCmd::Cancel { job } => {
            let j = client.cancel(&job).await?;
            print(out, &j, |j| {
                outln!("{} {}: {}", j.job, j.phase.as_str(), j.why)
            })
        }
        ClientCmd::Logs { job, follow: false } => {
            let l = client.logs(&job).await?;
            print(out, &l, |l| outln!("{}", l.text))
        }
        ClientCmd::Logs { job, follow: true } => follow_logs(&client, &job).await,
        ClientCmd::Timeline { job } => {
            let t = client.timeline(&job).await?;
            print(out, &t, render::timeline)
        }
        ClientCmd::Service(cmd) => service_cmd(&client, cmd, out).await,
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
            let v = match action {
                JournalAction::Quarantine { seq } => client.journal_quarantine(seq).await?,
                _ => {
                    client
                        .journal_format(action == JournalAction::UpgradeFormat)
                        .await?
                }
            };
            print(out, &v, |v| {
                outln!(
                    "journal format {} (this broker knows up to {})",
                    v.format,
                    v.newest
                );
                if let Some(u) = &v.unreadable {
                    outln!(
                        "READ-ONLY: journal message {} cannot be read ({}); set it aside with `meridian journal quarantine {}`",
                        u.seq,
                        u.reason,
                        u.seq
                    );
                }
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
            for u in &r.unreadable {
                eprintln!(
                    "left out of the figures: ledger message {} cannot be read ({})",
                    u.seq, u.reason
                );
            }
            if out == Output::Csv {
                render::report_csv(&r);
                return Ok(true);
            }
            print(out, &r, render::report_table)
        }
        ClientCmd::Plan(opts) => {
            let from = meridian_broker::service::now_ms()
                .saturating_sub(opts.days.saturating_mul(24 * 3_600_000));
            let history = client.history(Some(from)).await?;
            let report = tokio::task::block_in_place(|| crate::sim::plan::plan(&opts, &history))?;
            print(out, &report, |r| out!("{}", crate::sim::plan::table(r)))
        }
        ClientCmd::Token { what } => match what {
            TokenCmd::Create {
                tenant,
                roles,
                name,
                days,
            } => {
                let req = meridian_federation::TokenCreateRequest {
                    v: meridian_federation::WIRE_VERSION,
                    tenant,
                    roles,
                    name,
                    expires_in_s: Some(days.saturating_mul(86_400)),
                };
                let t = client.token_create(&req).await?;
                print(out, &t, |t| {
                    outln!("{}", t.token);
                    eprintln!(
                        "token {} ({}) made; it is shown this once",
                        t.view.id,
                        t.view.roles.join(", ")
                    );
                })
            }
            TokenCmd::List => {
                let tokens = client.tokens().await?;
                print(out, &tokens, |t| render::tokens(t))
            }
            TokenCmd::Revoke { id } => {
                let t = client.token_revoke(&id).await?;
                print(out, &t, |t| outln!("token {} revoked", t.id))
            }
        },
        ClientCmd::RevokeSite { site, restore } => {
            let r = client.site_revoke(&site, restore).await?;
            print(out, &r, |_| {
                outln!(
                    "site {site} {}",
                    if restore {
                        "restored"
                    } else {
                        "revoked: lost now, its work requeued"
                    }
                )
            })
        }
        ClientCmd::Audit { since, who, limit } => {
            // Newest first: `--limit N` is the newest N.
            let mut req = meridian_federation::AuditRequest {
                v: meridian_federation::WIRE_VERSION,
                since_ms: since,
                who,
                newest_first: true,
                ..Default::default()
            };
            let mut entries = Vec::new();
            while entries.len() < limit {
                req.limit = Some((limit - entries.len()).min(5_000) as u32);
                let page = client.audit(&req).await?;
                entries.extend(page.entries);
                for u in &page.unreadable {
                    eprintln!(
                        "left out: audit message {} cannot be read ({})",
                        u.seq, u.reason
                    );
                }
                match page.next {
                    Some(n) => req.before_seq = Some(n),
                    None => break,
                }
            }
            entries.truncate(limit);
            print(out, &entries, |e| render::audit(e))
        }
        ClientCmd::Drain { site, undo } => {
            let s = client.drain(&site, !undo).await?;
            print(out, &s, |s| outln!("{} draining: {}", s.site, s.draining))
        }
    }
}

/// `meridian logs -f`: the log's tail, then each new line as the job writes it (the tail is polled each
/// second), until the job has ended and its last lines are printed.
async fn follow_logs(client: &Client, job: &JobId) -> anyhow::Result<bool> {
    let mut shown: Option<(u32, String)> = None;
    loop {
        // Read the phase first: a job that had ended before this read of its log has all of it in the read.
        let ended = client.job(job).await?.phase.is_terminal();
        match client.logs(job).await {
            Ok(l) => {
                let prev = match &shown {
                    Some((attempt, text)) if *attempt == l.attempt => text.as_str(),
                    Some(_) => {
                        outln!("--- attempt {} on {} ---", l.attempt, l.site);
                        ""
                    }
                    None => "",
                };
                let (skipped, new) = new_lines(prev, &l.text);
                if skipped {
                    outln!("… (lines written faster than one tail a second are left out)");
                }
                for line in new {
                    outln!("{line}");
                }
                shown = Some((l.attempt, l.text));
            }
            // No attempt has run yet, or its site is not answering: ask again.
            Err(_) if !ended => {}
            Err(e) => return Err(e),
        }
        if ended {
            return Ok(true);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The lines of tail `next` that tail `prev` did not show: those after the longest run of `prev`'s last lines
/// that `next` starts with. `true` when the two do not overlap at all although both have lines (more was written
/// between them than a tail holds, so some lines were never seen).
fn new_lines<'a>(prev: &str, next: &'a str) -> (bool, Vec<&'a str>) {
    let p: Vec<&str> = prev.lines().collect();
    let n: Vec<&'a str> = next.lines().collect();
    let overlap = (1..=p.len().min(n.len()))
        .rev()
        .find(|k| p[p.len() - k..] == n[..*k])
        .unwrap_or(0);
    let skipped = overlap == 0 && !p.is_empty() && !n.is_empty() && prev != next;
    (skipped, n[overlap..].to_vec())
}

/// The tenant of a service: the one given, else the one whose service of that name the token reads (as
/// `service show` finds it), so that no service command needs `--tenant` where `show` does not.
async fn service_tenant(
    client: &Client,
    tenant: Option<TenantId>,
    name: &meridian_federation::ServiceName,
) -> anyhow::Result<TenantId> {
    match tenant {
        Some(t) => Ok(t),
        None => Ok(client.service(None, name).await?.spec.tenant),
    }
}

async fn service_cmd(client: &Client, cmd: ServiceCmd, out: Output) -> anyhow::Result<bool> {
    match cmd {
        ServiceCmd::Deploy { file } => {
            let body = read_job_file(&file)?;
            let v = client
                .deploy_service(body)
                .await
                .map_err(|e| meridian_broker::client::in_file_terms(e, &file))
                .with_context(|| format!("deploying {}", file.display()))?;
            print(out, &v, render::service)
        }
        ServiceCmd::List { tenant } => {
            let v = client.services(tenant.as_ref()).await?;
            print(out, &v, |v| {
                for s in v {
                    let running = s.replicas.iter().filter(|r| r.state == "running").count();
                    outln!(
                        "{} (tenant {}): {} replicas, {running} running",
                        s.spec.name,
                        s.spec.tenant,
                        s.replicas.len()
                    );
                }
            })
        }
        ServiceCmd::Show { name, tenant } => {
            let v = client.service(tenant.as_ref(), &name).await?;
            print(out, &v, render::service)
        }
        ServiceCmd::Delete { name, tenant } => {
            let tenant = service_tenant(client, tenant, &name).await?;
            let r = client.delete_service(Some(&tenant), &name).await?;
            print(out, &r, |r| {
                outln!(
                    "service {name} deleted; {} replicas stopping",
                    r.stopping.len()
                );
            })
        }
        ServiceCmd::Demand { name, at, tenant } => {
            let report = meridian_federation::DemandReport {
                v: meridian_federation::WIRE_VERSION,
                tenant: Some(service_tenant(client, tenant, &name).await?),
                service: name.clone(),
                locations: at,
            };
            let r = client.report_demand(&report).await?;
            print(out, &r, |_| outln!("demand of service {name} reported"))
        }
        ServiceCmd::Routes { name, tenant } => {
            let tenant = service_tenant(client, tenant, &name).await?;
            let v = client.service_routes(Some(&tenant), &name).await?;
            print(out, &v, |v| {
                for l in &v.locations {
                    let routes: Vec<String> = l
                        .routes
                        .iter()
                        .map(|r| {
                            format!(
                                "{}/{}{} ×{} {:.0} ms {:.0}%",
                                r.site,
                                r.pool,
                                if r.spot { " spot" } else { "" },
                                r.replicas,
                                r.rtt_ms,
                                r.weight * 100.0
                            )
                        })
                        .collect();
                    outln!(
                        "{:<20} {}",
                        l.location,
                        if routes.is_empty() {
                            "no replica within the SLO".to_owned()
                        } else {
                            routes.join(", ")
                        }
                    );
                }
            })
        }
    }
}

/// `--since`: an instant, UTC (`2026-12-04`, `2026-12-04T20:00Z`, `2026-12-04T20:00:00Z`), or a span before
/// now (`90s`, `30m`, `1h`, `2d`); ms since the epoch.
fn parse_since(s: &str) -> Result<u64, String> {
    since_at(s, meridian_broker::service::now_ms())
}

/// A span as `90s`, `30m`, `1h` or `2d`, in milliseconds.
fn span_ms(s: &str) -> Option<u64> {
    let unit = s.chars().last()?;
    let ms: u64 = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return None,
    };
    let n = s[..s.len() - unit.len_utf8()].parse::<u64>().ok()?;
    Some(n.saturating_mul(ms))
}

fn since_at(s: &str, now_ms: u64) -> Result<u64, String> {
    let s = s.trim();
    let bad = || {
        format!(
            "{s:?}: expected an instant (2026-12-04, 2026-12-04T20:00Z, 2026-12-04T20:00:00.5+01:00: \
             UTC unless it says its offset) or a span before now (90s, 30m, 1h, 2d)"
        )
    };
    if let Some(span) = span_ms(s) {
        return Ok(now_ms.saturating_sub(span));
    }
    // Any RFC 3339 instant: seconds' fractions and offsets from UTC (`2026-12-04T21:00:00.5+01:00`).
    if let Ok(t) = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339) {
        return u64::try_from(t.unix_timestamp_nanos() / 1_000_000).map_err(|_| bad());
    }
    let t = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = t.split_once('T').unwrap_or((t, "00:00"));
    let time = if time.matches(':').count() == 1 {
        format!("{time}:00")
    } else {
        time.to_owned()
    };
    crate::sim::trace::parse_timestamp_ms(&format!("{date} {time}")).ok_or_else(bad)
}

#[cfg(test)]
mod since_tests {
    use super::since_at;

    #[test]
    fn since_takes_an_instant_or_a_span_before_now() {
        let now = 1_796_400_000_000;
        assert_eq!(since_at("1h", now), Ok(now - 3_600_000));
        assert_eq!(since_at("90s", now), Ok(now - 90_000));
        assert_eq!(since_at("2d", now), Ok(now - 2 * 86_400_000));
        let day = since_at("2026-12-04", now).unwrap_or(0);
        assert_eq!(since_at("2026-12-04T00:00Z", now), Ok(day));
        assert_eq!(since_at("2026-12-04T00:00:00Z", now), Ok(day));
        assert_eq!(since_at("2026-12-04T01:30Z", now), Ok(day + 5_400_000));
        assert_eq!(
            since_at("2026-12-04T02:30:00.250+01:00", now),
            Ok(day + 5_400_250)
        );
        assert_eq!(
            since_at("2026-12-03T20:30:00-05:00", now),
            Ok(day + 5_400_000)
        );
        assert!(since_at("yesterday", now)
            .unwrap_err()
            .contains("expected an instant"));
        assert!(since_at("", now).is_err());
    }
}

#[cfg(test)]
mod follow_tests {
    use super::new_lines;

    #[test]
    fn following_a_tail_prints_each_line_once() {
        assert_eq!(new_lines("", "a\nb\n"), (false, vec!["a", "b"]));
        assert_eq!(new_lines("a\nb\n", "a\nb\n"), (false, vec![]));
        assert_eq!(new_lines("a\nb\n", "a\nb\nc\n"), (false, vec!["c"]));
        // The tail slid: its first lines fell out of the window.
        assert_eq!(
            new_lines("a\nb\nc\n", "b\nc\nd\ne\n"),
            (false, vec!["d", "e"])
        );
        // A line repeated is not taken for one already shown unless the whole run matches.
        assert_eq!(new_lines("x\ny\n", "y\ny\n"), (false, vec!["y"]));
        // More written between two reads than the tail holds: said, not hidden.
        assert_eq!(new_lines("a\nb\n", "x\ny\n"), (true, vec!["x", "y"]));
    }
}

#[cfg(test)]
mod submit_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        submit: SubmitArgs,
    }

    fn args(line: &[&str]) -> Result<SubmitArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("submit").chain(line.iter().copied())).map(|c| c.submit)
    }

    #[test]
    fn a_one_line_job_is_the_spec_a_file_would_hold() {
        let a = args(&[
            "--tenant",
            "research",
            "--gpus",
            "A100:4",
            "--duration",
            "2h",
            "--",
            "python",
            "train.py",
            "--lr",
            "3e-4 warm",
        ])
        .unwrap();
        let body = one_line_spec(&a, 1_796_400_000_000).unwrap();
        let spec: meridian_federation::JobSpec = meridian_federation::codec::decode(&body).unwrap();
        assert_eq!(spec.tenant.as_str(), "research");
        assert_eq!(spec.resources.count, 4);
        assert_eq!(spec.resources.models.len(), 1);
        assert_eq!(spec.resources.models[0].as_str(), "A100");
        assert_eq!(spec.duration_s, Some(7_200));
        assert_eq!(spec.kind, meridian_federation::JobKind::Batch);
        assert_eq!(spec.run.command, "python train.py --lr '3e-4 warm'");
        // A key is made up, so the same line twice is two jobs unless --key says otherwise.
        assert!(spec.idempotency_key.starts_with("cli-1796400000000-"));
    }

    #[test]
    fn a_one_line_job_says_what_is_missing_or_wrong() {
        let a = args(&["--gpus", "2", "--", "true"]).unwrap();
        if std::env::var_os("MERIDIAN_TENANT").is_none() {
            let e = one_line_spec(&a, 0).unwrap_err().to_string();
            assert!(e.contains("--tenant"), "{e}");
        }
        for bad in ["0", "A100:x", ":4", "four"] {
            let e = args(&["--tenant", "t", "--gpus", bad, "--", "true"])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("MODEL:4"), "{bad}: {e}");
        }
        // Neither a file nor a command; both.
        assert!(args(&["--tenant", "t"]).is_err());
        assert!(args(&["job.toml", "--", "true"]).is_err());
        assert!(args(&["job.toml"]).unwrap().command.is_empty());
        // A one-line job's flags with a spec file would be ignored: refused instead.
        assert!(args(&["job.toml", "--gpus", "4"]).is_err());
    }

    #[test]
    fn a_command_line_is_quoted_where_the_shell_would_split_it() {
        let line = shell_line(&["echo".into(), "it's".into(), "$HOME".into(), "a=b".into()]);
        assert_eq!(line, r#"echo 'it'\''s' '$HOME' a=b"#);
    }
}
