//! Tables for the command line's output.

use super::{outln, Output};
use meridian_federation::{CandidateView, ExplainView, JobPhase, JobView, SiteView, TimelineView};
use serde::Serialize;

/// Prints `value` as JSON, or as a table drawn by `table`.
pub fn print<T: Serialize>(
    output: Output,
    value: &T,
    table: impl FnOnce(&T),
) -> anyhow::Result<bool> {
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(value)?),
        Output::Table => table(value),
        Output::Csv => {
            anyhow::bail!("--output csv is for `meridian report`; use table or json here")
        }
    }
    Ok(true)
}

/// Whether tables are coloured: on a terminal, unless `NO_COLOR` is set (any value) or the terminal is dumb.
fn colour() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        use std::io::IsTerminal;
        std::io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none()
            && std::env::var("TERM").map_or(true, |t| t != "dumb")
    })
}

/// `text` in the colour of a job's state (green done, red failed, yellow waiting, cyan under way) when `on`.
fn painted(text: &str, phase: meridian_federation::JobPhase, on: bool) -> String {
    use meridian_federation::JobPhase as P;
    let code = match phase {
        P::Succeeded => "32",
        P::Failed => "31",
        P::Pending => "33",
        P::Offered | P::Running => "36",
        _ => "2",
    };
    match on {
        true => format!("\x1b[{code}m{text}\x1b[0m"),
        false => text.to_owned(),
    }
}

/// A column of `meridian jobs` (`--columns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum JobColumn {
    Job,
    Name,
    Tenant,
    Queue,
    Kind,
    State,
    Site,
    Pool,
    Att,
    Submitted,
    Started,
    Finished,
    Exit,
    /// Why a pending job waits (a short label).
    Wait,
    /// Metered money, USD.
    Usd,
    /// The estimate's money, USD.
    EstUsd,
    /// Metered carbon, kgCO2e.
    Kgco2,
    Why,
}

/// The columns `meridian jobs` shows unless told.
pub const DEFAULT_JOB_COLUMNS: &[JobColumn] = &[
    JobColumn::Job,
    JobColumn::Name,
    JobColumn::Kind,
    JobColumn::State,
    JobColumn::Site,
    JobColumn::Att,
    JobColumn::Why,
];

impl JobColumn {
    fn header(self) -> &'static str {
        match self {
            JobColumn::Job => "JOB",
            JobColumn::Name => "NAME",
            JobColumn::Tenant => "TENANT",
            JobColumn::Queue => "QUEUE",
            JobColumn::Kind => "KIND",
            JobColumn::State => "STATE",
            JobColumn::Site => "SITE",
            JobColumn::Pool => "POOL",
            JobColumn::Att => "ATT",
            JobColumn::Submitted => "SUBMITTED",
            JobColumn::Started => "STARTED",
            JobColumn::Finished => "FINISHED",
            JobColumn::Exit => "EXIT",
            JobColumn::Wait => "WAITS ON",
            JobColumn::Usd => "USD",
            JobColumn::EstUsd => "EST USD",
            JobColumn::Kgco2 => "KGCO2E",
            JobColumn::Why => "WHY",
        }
    }

    fn numeric(self) -> bool {
        matches!(
            self,
            JobColumn::Att
                | JobColumn::Exit
                | JobColumn::Usd
                | JobColumn::EstUsd
                | JobColumn::Kgco2
        )
    }

    fn cell(self, j: &JobView) -> String {
        let dash = || "-".to_owned();
        let time = |t: Option<u64>| t.map_or_else(dash, iso);
        match self {
            JobColumn::Job => j.job.to_string(),
            JobColumn::Name => j.name.clone().unwrap_or_default(),
            JobColumn::Tenant => j.tenant.to_string(),
            JobColumn::Queue => j.queue.as_ref().map_or_else(dash, |q| q.to_string()),
            JobColumn::Kind => j.kind.as_str().to_owned(),
            JobColumn::State => j.phase.as_str().to_owned(),
            JobColumn::Site => j.site.as_ref().map_or_else(dash, |s| s.to_string()),
            JobColumn::Pool => j.pool.as_ref().map_or_else(dash, |p| p.to_string()),
            JobColumn::Att => j.attempt.to_string(),
            JobColumn::Submitted => iso(j.submitted_at_ms),
            JobColumn::Started => time(j.started_at_ms),
            JobColumn::Finished => time(j.finished_at_ms),
            JobColumn::Exit => j.exit_code.map_or_else(dash, |c| c.to_string()),
            JobColumn::Wait => j.wait_reason.clone().unwrap_or_else(dash),
            JobColumn::Usd => format!("{:.2}", j.metered.cost_micro_usd as f64 / 1e6),
            JobColumn::EstUsd => j
                .estimate
                .map_or_else(dash, |e| format!("{:.2}", e.cost_micro_usd as f64 / 1e6)),
            JobColumn::Kgco2 => format!("{:.3}", j.metered.co2_g as f64 / 1e3),
            JobColumn::Why => j.why.clone(),
        }
    }
}

/// The jobs as a table of `columns`, each as wide as its widest cell (the last left unpadded).
pub fn jobs(jobs: &[JobView], columns: &[JobColumn]) {
    for line in job_lines(jobs, columns, colour()) {
        outln!("{line}");
    }
}

fn job_lines(jobs: &[JobView], columns: &[JobColumn], colour: bool) -> Vec<String> {
    let cells: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| columns.iter().map(|c| c.cell(j)).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .chain([c.header().len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |row: Vec<String>, phase: Option<JobPhase>| {
        let last = columns.len().saturating_sub(1);
        let mut out = Vec::with_capacity(columns.len());
        for (i, (c, cell)) in columns.iter().zip(row).enumerate() {
            let w = widths[i];
            let padded = match (i == last, c.numeric()) {
                (true, false) => cell,
                (_, true) => format!("{cell:>w$}"),
                (false, false) => format!("{cell:<w$}"),
            };
            // Padded first, so that the colour's codes do not count in the column's width.
            out.push(match (c, phase) {
                (JobColumn::State, Some(p)) => painted(&padded, p, colour),
                _ => padded,
            });
        }
        out.join("  ").trim_end().to_owned()
    };
    let mut lines = vec![line(
        columns.iter().map(|c| c.header().to_owned()).collect(),
        None,
    )];
    for (j, row) in jobs.iter().zip(cells) {
        lines.push(line(row, Some(j.phase)));
    }
    lines
}

/// One job, a field a line (`meridian show`).
pub fn job(j: &JobView) {
    for (k, v) in job_fields(j) {
        let v = match k {
            "state" => painted(&v, j.phase, colour()),
            _ => v,
        };
        outln!("{k:<10} {v}");
    }
}

/// The lines of [`job`]: what a person asks of one job first, then times, then money and carbon.
fn job_fields(j: &JobView) -> Vec<(&'static str, String)> {
    let money = |a: &meridian_federation::Amounts| {
        format!(
            "${:.2}, {:.3} kWh, {:.3} kgCO2e",
            a.cost_micro_usd as f64 / 1e6,
            a.energy_wh as f64 / 1e3,
            a.co2_g as f64 / 1e3
        )
    };
    let mut f = vec![
        ("job", j.job.to_string()),
        ("name", j.name.clone().unwrap_or_else(|| "-".to_owned())),
        (
            "tenant",
            match &j.queue {
                Some(q) => format!("{} (queue {q})", j.tenant),
                None => j.tenant.to_string(),
            },
        ),
        ("kind", j.kind.as_str().to_owned()),
        (
            "state",
            match (j.archived, &j.wait_reason) {
                (true, _) => format!("{} (archived)", j.phase.as_str()),
                (false, Some(w)) => format!("{} ({w})", j.phase.as_str()),
                (false, None) => j.phase.as_str().to_owned(),
            },
        ),
        ("why", j.why.clone()),
    ];
    if let Some(site) = &j.site {
        let pool = j
            .pool
            .as_ref()
            .map_or(String::new(), |p| format!(" pool {p}"));
        f.push(("site", format!("{site}{pool}, attempt {}", j.attempt)));
    }
    f.push(("submitted", iso(j.submitted_at_ms)));
    if let Some(t) = j.started_at_ms {
        f.push(("started", iso(t)));
    }
    if let Some(t) = j.finished_at_ms {
        f.push(("finished", iso(t)));
    }
    if j.runtime_ms > 0 {
        f.push(("ran", format!("{:.1} s", j.runtime_ms as f64 / 1000.0)));
    }
    if let Some(c) = j.exit_code {
        f.push(("exit code", c.to_string()));
    }
    if let Some(rtt) = j.user_rtt_ms {
        f.push(("users", format!("{rtt:.1} ms round trip (mean)")));
    }
    if let Some(e) = &j.estimate {
        f.push(("estimate", format!("{} (for the expected run)", money(e))));
    }
    f.push(("metered", money(&j.metered)));
    if let Some(c) = &j.checkpoint {
        f.push(("checkpoint", c.clone()));
    }
    f
}

/// One pool of the accelerator catalogue (`meridian gpus`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuRow {
    pub model: String,
    pub site: String,
    pub tier: String,
    pub pool: String,
    pub up: bool,
    pub free: f64,
    pub total: u32,
    pub usd_per_hour: f64,
    pub carbon_g_per_kwh: u32,
    pub pue: f64,
}

/// Every pool of the federation, by model, then cheapest first, then least carbon; only `model`'s (any case)
/// when given.
pub fn gpu_rows(sites: &[SiteView], model: Option<&str>) -> Vec<GpuRow> {
    let mut rows: Vec<GpuRow> = sites
        .iter()
        .flat_map(|s| {
            s.pools.iter().map(move |p| GpuRow {
                model: p.model.to_string(),
                site: s.site.to_string(),
                tier: s.tier.as_str().to_owned(),
                pool: p.name.to_string(),
                up: s.up && !s.draining,
                free: p.free_milli as f64 / 1000.0,
                total: p.count,
                usd_per_hour: p.price_micro_usd_per_hour as f64 / 1e6,
                carbon_g_per_kwh: s.carbon_g_per_kwh,
                pue: s.pue,
            })
        })
        .filter(|r| model.is_none_or(|m| r.model.eq_ignore_ascii_case(m)))
        .collect();
    rows.sort_by(|a, b| {
        a.model
            .cmp(&b.model)
            .then(a.usd_per_hour.total_cmp(&b.usd_per_hour))
            .then(a.carbon_g_per_kwh.cmp(&b.carbon_g_per_kwh))
            .then(a.site.cmp(&b.site))
    });
    rows
}

pub fn gpus(rows: &[GpuRow]) {
    outln!(
        "{:<8} {:<18} {:<8} {:>11} {:>8} {:>9} {:>5}",
        "MODEL",
        "SITE",
        "TIER",
        "FREE/TOTAL",
        "USD/H",
        "gCO2/kWh",
        "PUE"
    );
    for r in rows {
        let state = if r.up { "" } else { "  (down or draining)" };
        outln!(
            "{:<8} {:<18} {:<8} {:>11} {:>8.2} {:>9} {:>5.2}{state}",
            r.model,
            r.site,
            r.tier,
            format!("{:.1}/{}", r.free, r.total),
            r.usd_per_hour,
            r.carbon_g_per_kwh,
            r.pue
        );
    }
}

/// `meridian queue`: the counts per queue, then each queue's waiting jobs in the order they are tried.
pub fn queues(q: &meridian_federation::QueuesView) {
    for line in queue_lines(q, meridian_broker::service::now_ms()) {
        outln!("{line}");
    }
}

fn queue_lines(q: &meridian_federation::QueuesView, now_ms: u64) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<20} {:>7} {:>7} {:>7}  WHY THEY WAIT",
        "QUEUE", "RUNNING", "OFFERED", "PENDING"
    )];
    if q.queues.is_empty() {
        lines.push("(no live jobs)".to_owned());
    }
    for v in &q.queues {
        let reasons: Vec<String> = v.reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
        lines.push(format!(
            "{:<20} {:>7} {:>7} {:>7}  {}",
            v.queue,
            v.running,
            v.offered,
            v.pending,
            if reasons.is_empty() {
                "-".to_owned()
            } else {
                reasons.join(", ")
            }
        ));
    }
    for v in q.queues.iter().filter(|v| !v.waiting.is_empty()) {
        lines.push(String::new());
        let shown = v.waiting.len() as u64;
        lines.push(format!(
            "{}: {} waiting{}, in the order they are tried",
            v.queue,
            v.pending,
            if v.pending > shown {
                format!(" (the first {shown})")
            } else {
                String::new()
            }
        ));
        lines.push(format!(
            "{:>5}  {:<9} {:>5} {:>7} {:>9}  WHY",
            "POS", "JOB", "PRIO", "DEVICES", "WAITED"
        ));
        for w in &v.waiting {
            lines.push(format!(
                "{:>5}  {:<9} {:>5} {:>7} {:>9}  {}",
                w.position,
                w.job.as_str(),
                w.priority,
                format!("{}", w.milli as f64 / 1000.0),
                short_duration(now_ms.saturating_sub(w.submitted_at_ms)),
                w.why
            ));
        }
    }
    lines
}

/// `45s`, `12m`, `3h20m`, `2d4h`.
fn short_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

pub fn sites(sites: &[SiteView]) {
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
}

pub fn explain(e: &ExplainView) {
    outln!("{} is {}: {}", e.job, e.phase.as_str(), e.why);
    outln!("policy {}", e.policy);
    if let Some(d) = &e.decided_by {
        outln!("decided by {d}");
    }
    if e.every_site_now {
        outln!("every site as placement weighs the job now (not the decision that placed it):");
    }
    if e.candidates.is_empty() {
        outln!("(no placement was tried: the reason above holds it first)");
    }
    candidates(&e.candidates);
    for p in &e.pruned {
        outln!(
            "{:<18} pruned by the index: {}",
            format!("({} sites)", p.sites),
            p.reason
        );
    }
    outln!("history:");
    for h in &e.history {
        outln!("  {}", history_line(h));
    }
}

/// A history line as the API gives it (`1796447289130 submitted`) with its time in UTC
/// (`2026-12-05T05:08:09Z submitted`).
fn history_line(h: &str) -> String {
    match h.split_once(' ').map(|(t, rest)| (t.parse::<u64>(), rest)) {
        Some((Ok(ms), rest)) => format!("{} {rest}", iso(ms)),
        _ => h.to_owned(),
    }
}

/// A job's timeline: its events with their times (seconds after submission), its attempts, the latest
/// placement's best candidates and the end of its log.
pub fn timeline(t: &TimelineView) {
    outln!(
        "{} ({}) is {}: {}",
        t.job,
        t.tenant,
        t.phase.as_str(),
        t.why
    );
    let start = t.events.first().map_or(0, |e| e.at_ms);
    outln!(
        "{:>9} {:<10} {:>3} {:<16}  DETAIL",
        "T+ s",
        "EVENT",
        "ATT",
        "SITE"
    );
    for e in &t.events {
        outln!(
            "{:>9.1} {:<10} {:>3} {:<16}  {}",
            e.at_ms.saturating_sub(start) as f64 / 1000.0,
            e.event,
            e.attempt.map_or("-".to_owned(), |a| a.to_string()),
            e.site.as_ref().map_or("-", |s| s.as_str()),
            e.detail
        );
    }
    if !t.attempts.is_empty() {
        outln!("attempts:");
        outln!(
            "{:>3} {:<16} {:<8} {:<8} {:>7} {:>9} {:>9} {:>8} {:>8}",
            "ATT",
            "SITE",
            "POOL",
            "MODEL",
            "DEVICES",
            "RUN s",
            "COST $",
            "kWh",
            "kgCO2"
        );
        for a in &t.attempts {
            let metered = |x: String| if a.metered { x } else { "-".to_owned() };
            outln!(
                "{:>3} {:<16} {:<8} {:<8} {:>7.3} {:>9} {:>9} {:>8} {:>8}",
                a.attempt,
                a.site.as_str(),
                a.pool,
                a.model,
                a.milli as f64 / 1000.0,
                metered(format!("{:.1}", a.runtime_ms as f64 / 1000.0)),
                metered(format!("{:.4}", a.amounts.cost_micro_usd as f64 / 1e6)),
                metered(format!("{:.3}", a.amounts.energy_wh as f64 / 1000.0)),
                metered(format!("{:.3}", a.amounts.co2_g as f64 / 1000.0)),
            );
        }
    }
    if !t.candidates.is_empty() {
        outln!("latest placement (policy {}):", t.policy);
        candidates(&t.candidates);
    }
    match (&t.log_tail, &t.log_error) {
        (Some(log), _) => {
            outln!("log (last lines):");
            for l in log.lines() {
                outln!("  {l}");
            }
        }
        (None, Some(why)) => outln!("log: {why}"),
        (None, None) => {}
    }
}

/// The candidates of a placement as a table.
fn candidates(list: &[CandidateView]) {
    for line in candidate_lines(list) {
        outln!("{line}");
    }
}

/// The candidates' table. A column of the data each would move in (GB, whose egress is in its cost) appears
/// when any candidate moves data, so that a choice made by where the data is says so.
fn candidate_lines(list: &[CandidateView]) -> Vec<String> {
    let moves_data = list
        .iter()
        .any(|c| c.terms.as_ref().is_some_and(|t| t.data_bytes_moved > 0));
    let mut lines = Vec::new();
    if !list.is_empty() {
        let data = if moves_data {
            format!(" {:>9}", "DATA GB")
        } else {
            String::new()
        };
        lines.push(format!(
            "{:<18} {:<8} {:<8} {:>9} {:>8} {:>8} {:>8}{data} {:>8}  VERDICT",
            "SITE", "TIER", "POOL", "COST $", "kWh", "kgCO2", "RTT ms", "SCORE"
        ));
    }
    for c in list {
        let (cost, kwh, co2, rtt, gb, score) = match &c.terms {
            Some(t) => (
                format!("{:.2}", t.cost_micro_usd as f64 / 1e6),
                format!("{:.1}", t.energy_wh as f64 / 1000.0),
                format!("{:.2}", t.co2_g as f64 / 1000.0),
                format!("{:.1}", t.latency_ms),
                format!("{:.1}", t.data_bytes_moved as f64 / 1e9),
                if t.score >= 0.0 {
                    format!("{:.3}", t.score)
                } else {
                    "-".into()
                },
            ),
            None => (
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ),
        };
        let verdict = if c.chosen {
            "CHOSEN".to_string()
        } else {
            c.rejected.clone().unwrap_or_default()
        };
        let data = if moves_data {
            format!(" {gb:>9}")
        } else {
            String::new()
        };
        lines.push(format!(
            "{:<18} {:<8} {:<8} {:>9} {:>8} {:>8} {:>8}{data} {:>8}  {}",
            c.site.as_str(),
            c.tier.as_str(),
            c.pool.as_ref().map_or("-", |p| p.as_str()),
            cost,
            kwh,
            co2,
            rtt,
            score,
            verdict
        ));
    }
    lines
}

pub fn report_sections(
    r: &meridian_federation::ReportView,
) -> [(&'static str, Vec<&meridian_federation::ReportRow>); 4] {
    [
        ("tenant", r.by_tenant.iter().collect()),
        ("site", r.by_site.iter().collect()),
        ("model", r.by_model.iter().collect()),
        ("total", vec![&r.total]),
    ]
}

pub fn report_table(r: &meridian_federation::ReportView) {
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
pub fn report_csv(r: &meridian_federation::ReportView) {
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

pub fn dispatch_summary(f: &crate::bench::dispatch::DispatchFigures) -> String {
    let mut s = format!(
        "{} jobs on {} sites, {} in flight: {:.0} dispatches/s vs {:.0} plain NATS requests/s (ratio {:.3}); p50 {:.1} ms, p99 {:.1} ms; {} journal appends; recovery after kill -9 {} ms",
        f.jobs, f.sites, f.in_flight, f.dispatches_per_s, f.raw_nats_req_per_s, f.ratio, f.p50_ms, f.p99_ms, f.journal_appends,
        f.recovery_ms.map_or_else(|| "?".to_owned(), |m| m.to_string())
    );
    if let Some(x) = &f.insecure {
        s.push_str(&format!(
            "\nsecurity on (TLS, credentials, tokens, encryption at rest, audit) vs off: {:.0} vs {:.0} dispatches/s (ratio {:.3}); without it p50 {:.1} ms, p99 {:.1} ms",
            f.dispatches_per_s, x.dispatches_per_s, x.secured_ratio, x.p50_ms, x.p99_ms
        ));
    }
    if let Some(x) = &f.spawn {
        s.push_str(&format!(
            "\n{} jobs spawning `true`: {:.0} dispatches/s, p50 {:.1} ms, p99 {:.1} ms; {:.0} completed/s",
            x.jobs, x.dispatches_per_s, x.p50_ms, x.p99_ms, x.completed_per_s
        ));
    }
    s
}

pub fn adverts_summary(f: &crate::bench::adverts::AdvertsFigures) -> String {
    format!(
        "{} sites over {} connections: {:.0} heartbeats/s and {:.0} adverts/s ({:.1} changed/s) cost the broker {:.1}% of a core ({:.1}% before they joined; {:.2} µs a message) and {:.1} MiB ({:.1} MiB before; {:.0} bytes a site); nats-server {:.1}% of a core; joined in {:.1} s; at the end {} sites up, {} lost",
        f.sites, f.connections, f.heartbeats_per_s, f.adverts_per_s, f.changed_adverts_per_s,
        f.broker_cpu_share * 100.0, f.broker_cpu_share_idle * 100.0, f.broker_cpu_us_per_message,
        f.broker_rss_mib, f.broker_rss_mib_idle, f.broker_rss_bytes_per_site, f.nats_cpu_share * 100.0,
        f.join_s, f.sites_up, f.sites_lost
    )
}

pub fn placement_summary(f: &crate::bench::PlacementFigures) -> String {
    format!(
        "{} sites: {:.0} decisions/s, p50 {:.2} µs, p99 {:.2} µs with the index; full scan p50 {:.2} µs, p99 {:.2} µs ({} decisions); {:.0}% placed",
        f.sites, f.decisions_per_s, f.p50_us, f.p99_us, f.full_scan_p50_us, f.full_scan_p99_us, f.full_scan_decisions, f.placed_share * 100.0
    )
}

pub fn tokens(tokens: &[meridian_federation::TokenView]) {
    outln!(
        "{:<14} {:<16} {:<14} {:<8} {:<20} ROLES",
        "ID",
        "NAME",
        "TENANT",
        "STATE",
        "EXPIRES (UTC)"
    );
    for t in tokens {
        outln!(
            "{:<14} {:<16} {:<14} {:<8} {:<20} {}",
            t.id,
            t.name,
            t.tenant.as_ref().map_or("(all)", |t| t.as_str()),
            if t.revoked { "revoked" } else { "active" },
            utc(t.expires_ms),
            t.roles.join(" ")
        );
    }
}

pub fn audit(entries: &[meridian_federation::AuditEntry]) {
    outln!(
        "{:<20} {:<24} {:<14} {:<36} OUTCOME",
        "AT (UTC)",
        "WHO",
        "ACTION",
        "TARGET"
    );
    for e in entries {
        let count = if e.count > 1 {
            format!(
                " (x{} until {})",
                e.count,
                utc(e.until_ms.unwrap_or(e.at_ms))
            )
        } else {
            String::new()
        };
        outln!(
            "{:<20} {:<24} {:<14} {:<36} {}{count}",
            utc(e.at_ms),
            e.who,
            e.action,
            e.target.as_deref().unwrap_or("-"),
            e.outcome
        );
    }
}

/// ISO-8601 UTC to the second (`2026-12-04T22:40:10Z`) of milliseconds since the epoch.
pub fn iso(ms: u64) -> String {
    format!("{}Z", utc(ms).replacen(' ', "T", 1))
}

/// `YYYY-MM-DD HH:MM:SS` of milliseconds since the epoch.
fn utc(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp((ms / 1000) as i64)
        .map(|t| {
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            )
        })
        .unwrap_or_else(|_| ms.to_string())
}

/// A service: its replicas per site, the demand planned for and the recent changes.
fn spot_mark(spot: bool) -> &'static str {
    if spot {
        " spot"
    } else {
        ""
    }
}

pub fn service(s: &meridian_federation::ServiceView) {
    let spec = &s.spec;
    outln!(
        "service {} (tenant {}): SLO {} ms, {}–{} replicas, {} {}/s per replica, policy {}",
        spec.name,
        spec.tenant,
        spec.slo_ms,
        spec.min_replicas,
        spec.max_replicas,
        spec.throughput.per_replica(),
        spec.throughput.unit(),
        spec.policy
            .as_ref()
            .map_or("balanced".to_owned(), |p| p.label())
    );
    service_health(s);
    outln!(
        "{:<24} {:<18} {:<10} {:>10} {:>9} {:>12}",
        "REPLICA",
        "SITE/POOL",
        "STATE",
        "SERVES/S",
        "USD/H",
        "GCO2E/H"
    );
    for r in &s.replicas {
        outln!(
            "{:<24} {:<18} {:<10} {:>10.2} {:>9.2} {:>12.1}",
            r.job.to_string(),
            format!(
                "{}/{}{}",
                r.site,
                r.pool.as_ref().map_or("?".to_owned(), |p| p.to_string()),
                spot_mark(r.spot)
            ),
            r.state,
            r.serves_per_s,
            r.usd_per_hour,
            r.co2_g_per_hour
        );
    }
    if !s.demand.is_empty() {
        outln!("demand planned for:");
        for d in &s.demand {
            outln!(
                "  {:<20} ({:.2}, {:.2}) {:.2}/s",
                d.name,
                d.location.lat,
                d.location.lon,
                d.per_s
            );
        }
    }
    for c in s.changes.iter().rev().take(10) {
        let counts = if c.from == c.to {
            String::new()
        } else {
            format!(" {} → {}", c.from, c.to)
        };
        outln!(
            "{} {}/{}{}{counts}: {}",
            iso(c.at_ms),
            c.site,
            c.pool,
            spot_mark(c.spot),
            c.why
        );
    }
}

/// A service's health, and each pool that backs off.
fn service_health(s: &meridian_federation::ServiceView) {
    use meridian_federation::ServiceHealth;
    let why = match s.health {
        ServiceHealth::Healthy => "",
        ServiceHealth::Degraded => {
            ": replicas run, but at some pool they keep ending by themselves"
        }
        ServiceHealth::Unhealthy => ": no replica runs and replicas keep ending by themselves",
    };
    outln!("health: {}{why}", s.health.as_str());
    for b in &s.backoff {
        let code = b
            .last_exit_code
            .map_or_else(|| "no exit code".to_owned(), |c| format!("exit code {c}"));
        outln!(
            "  {}/{}{}: {} in a row, the last {} at {} ({code}, ran {} s: {}); crash-loop backoff, next start at {}",
            b.site,
            b.pool,
            spot_mark(b.spot),
            b.exits_in_a_row,
            b.last_job,
            iso(b.last_exit_ms),
            b.last_ran_ms / 1000,
            b.last_reason,
            iso(b.next_start_ms)
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_job_reads_a_field_a_line_with_utc_times_and_both_amounts() {
        let j: JobView = serde_json::from_value(serde_json::json!({
            "job": "j-000042", "tenant": "research", "queue": "research", "name": "train", "kind": "training",
            "phase": "failed", "attempt": 2, "site": "dc-oregon", "pool": "h100", "why": "exit code 3",
            "submitted_at_ms": 1_796_400_000_000u64, "started_at_ms": 1_796_400_005_000u64,
            "finished_at_ms": 1_796_400_065_000u64, "exit_code": 3,
            "estimate": { "cost_micro_usd": 4_000_000, "energy_wh": 1_500, "co2_g": 300 },
            "user_rtt_ms": null,
            "metered": { "cost_micro_usd": 66_000, "energy_wh": 25, "co2_g": 5 },
            "runtime_ms": 60_000, "checkpoint": null
        }))
        .unwrap();
        let f: std::collections::BTreeMap<_, _> = job_fields(&j).into_iter().collect();
        assert_eq!(f["state"], "failed");
        assert_eq!(f["site"], "dc-oregon pool h100, attempt 2");
        assert_eq!(f["submitted"], "2026-12-04T16:00:00Z");
        assert_eq!(f["finished"], "2026-12-04T16:01:05Z");
        assert_eq!(f["exit code"], "3");
        assert_eq!(f["metered"], "$0.07, 0.025 kWh, 0.005 kgCO2e");
        assert!(f["estimate"].starts_with("$4.00, 1.500 kWh, 0.300 kgCO2e"));
        assert!(!f.contains_key("users"));
    }

    #[test]
    fn the_jobs_table_has_the_columns_asked_for_each_as_wide_as_its_cells() {
        let j = |id: &str, phase: &str, usd: u64, why: &str| -> JobView {
            serde_json::from_value(serde_json::json!({
                "job": id, "tenant": "research", "name": null, "kind": "training", "phase": phase,
                "attempt": 1, "site": "dc-oregon", "pool": "h100", "why": why, "submitted_at_ms": 0,
                "started_at_ms": null, "finished_at_ms": null, "exit_code": null, "estimate": null,
                "user_rtt_ms": null, "metered": { "cost_micro_usd": usd, "energy_wh": 0, "co2_g": 0 },
                "runtime_ms": 0, "checkpoint": null
            }))
            .unwrap()
        };
        let jobs = [
            j("j-000002", "running", 12_345_678, "cheapest"),
            j("j-000001", "succeeded", 0, "done"),
        ];
        let cols = [
            JobColumn::Job,
            JobColumn::State,
            JobColumn::Usd,
            JobColumn::Why,
        ];
        assert_eq!(
            job_lines(&jobs, &cols, false),
            [
                "JOB       STATE        USD  WHY",
                "j-000002  running    12.35  cheapest",
                "j-000001  succeeded   0.00  done",
            ]
        );
        let coloured = job_lines(&jobs, &cols, true);
        assert!(coloured[1].contains("\x1b["), "{coloured:?}");
    }

    #[test]
    fn the_queue_lists_counts_then_the_waiting_jobs_by_position() {
        let q: meridian_federation::QueuesView = serde_json::from_value(serde_json::json!({
            "queues": [{
                "queue": "research", "running": 2, "offered": 0, "pending": 12,
                "reasons": { "capacity": 10, "quota": 2 },
                "waiting": [{
                    "position": 1, "job": "j-000007", "tenant": "research", "priority": 100,
                    "milli": 4000, "submitted_at_ms": 1_000, "wait_reason": "capacity",
                    "why": "owned and partner sites busy"
                }]
            }],
            "sites": [], "flows": []
        }))
        .unwrap();
        let lines = queue_lines(&q, 3_601_000);
        assert_eq!(
            lines[1],
            "research                   2       0      12  capacity 10, quota 2"
        );
        assert_eq!(
            lines[3],
            "research: 12 waiting (the first 1), in the order they are tried"
        );
        assert_eq!(
            lines[5],
            "    1  j-000007    100       4     1h00m  owned and partner sites busy"
        );
    }

    #[test]
    fn the_gpu_catalogue_lists_every_pool_by_model_cheapest_first() {
        let site = |id: &str, tier: &str, carbon: u32, pools: serde_json::Value| -> SiteView {
            serde_json::from_value(serde_json::json!({
                "site": id, "kind": "datacenter", "tier": tier, "up": true, "draining": false,
                "location": { "lat": 0.0, "lon": 0.0 }, "pue": 1.2, "carbon_g_per_kwh": carbon,
                "pools": pools, "last_seen_ms": 0, "generation": 1
            }))
            .unwrap()
        };
        let pool = |name: &str, model: &str, count: u32, free: u64, usd: u64| {
            serde_json::json!({ "name": name, "kind": "gpu", "model": model, "count": count,
                                "free_milli": free, "price_micro_usd_per_hour": usd })
        };
        let sites = vec![
            site(
                "dear",
                "cloud",
                400,
                serde_json::json!([pool("a", "A100", 8, 8000, 3_700_000)]),
            ),
            site(
                "cheap",
                "owned",
                60,
                serde_json::json!([
                    pool("a", "A100", 4, 1500, 2_000_000),
                    pool("h", "H100", 2, 0, 4_000_000)
                ]),
            ),
        ];
        let rows = gpu_rows(&sites, None);
        let order: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.model.as_str(), r.site.as_str()))
            .collect();
        assert_eq!(
            order,
            [("A100", "cheap"), ("A100", "dear"), ("H100", "cheap")]
        );
        assert_eq!(
            (rows[0].free, rows[0].total, rows[0].usd_per_hour),
            (1.5, 4, 2.0)
        );
        assert_eq!(gpu_rows(&sites, Some("h100")).len(), 1);
    }

    #[test]
    fn a_choice_made_by_where_the_data_is_shows_the_data_each_site_would_move() {
        let c = |site: &str, usd: u64, bytes: u64, chosen: bool| -> CandidateView {
            serde_json::from_value(serde_json::json!({
                "site": site, "tier": "owned", "pool": "a100",
                "terms": { "cost_micro_usd": usd, "energy_wh": 1000, "co2_g": 100, "latency_ms": 0.0,
                           "data_bytes_moved": bytes, "score": 0.0 },
                "rejected": null, "chosen": chosen
            }))
            .unwrap()
        };
        let lines = candidate_lines(&[
            c("has-data", 15_920_000, 0, true),
            c("far", 8_110_000_000, 90_000_000_000_000, false),
        ]);
        assert!(lines[0].contains("DATA GB"), "{lines:?}");
        assert!(
            lines[1].contains(" 0.0 ") && lines[1].ends_with("CHOSEN"),
            "{lines:?}"
        );
        assert!(lines[2].contains("90000.0"), "{lines:?}");
        // No column when no candidate moves data.
        let plain = candidate_lines(&[c("a", 1, 0, true)]);
        assert!(!plain[0].contains("DATA"), "{plain:?}");
    }

    #[test]
    fn a_state_is_coloured_only_when_asked() {
        use meridian_federation::JobPhase;
        assert_eq!(painted("failed", JobPhase::Failed, false), "failed");
        assert_eq!(
            painted("failed", JobPhase::Failed, true),
            "\x1b[31mfailed\x1b[0m"
        );
        assert!(painted("succeeded", JobPhase::Succeeded, true).starts_with("\x1b[32m"));
    }

    #[test]
    fn explain_history_reads_in_utc() {
        assert_eq!(
            history_line("1796400000000 attempt 1 offered to dc-oregon"),
            "2026-12-04T16:00:00Z attempt 1 offered to dc-oregon"
        );
        assert_eq!(history_line("no time here"), "no time here");
    }
}
