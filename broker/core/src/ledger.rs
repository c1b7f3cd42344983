//! The metering ledger, summed (pure). Every attempt a job was offered is a [`Run`] in the job's record, metered
//! once when the attempt ends (preempted and abandoned attempts included) in integer units. A report sums the
//! runs offered in a window, per tenant, per site and per accelerator model; each breakdown adds up to the
//! total exactly.

use super::model::{Job, Run};
use super::Millis;
use meridian_federation::{AcceleratorKind, JobId, ReportRequest, ReportRow, ReportView, TenantId};
use std::collections::{BTreeMap, BTreeSet};

/// What the ledger needs of a job: taken from its record while it is live, and kept in the archive's ledger
/// once it is archived.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LedgerEntry {
    pub job: JobId,
    pub tenant: TenantId,
    pub kind: AcceleratorKind,
    pub submitted_ms: Millis,
    pub runs: Vec<Run>,
}

impl LedgerEntry {
    pub fn of(job: &Job) -> Self {
        LedgerEntry {
            job: job.id.clone(),
            tenant: job.spec.tenant.clone(),
            kind: job.spec.resources.kind,
            submitted_ms: job.submitted_ms,
            runs: job.runs.clone(),
        }
    }
}

/// Adds a run to a row. Sums saturate: one that would overflow stays at `u64::MAX` rather than wrap around
/// (metered quantities are bounded at the wire, so only absurd totals get there).
fn add(row: &mut ReportRow, run: &Run) {
    let sum = |a: u64, b: u64| a.saturating_add(b);
    row.attempts = sum(row.attempts, 1);
    row.device_milli_ms = sum(
        row.device_milli_ms,
        run.milli.saturating_mul(run.runtime_ms),
    );
    row.cost_micro_usd = sum(row.cost_micro_usd, run.amounts.cost_micro_usd);
    row.energy_wh = sum(row.energy_wh, run.amounts.energy_wh);
    row.co2_g = sum(row.co2_g, run.amounts.co2_g);
}

/// Sums the ledger of `jobs` as `req` asks.
pub fn report<'a>(
    jobs: impl IntoIterator<Item = &'a LedgerEntry>,
    req: &ReportRequest,
) -> ReportView {
    let mut tenants: BTreeMap<String, (ReportRow, BTreeSet<&str>)> = BTreeMap::new();
    let mut sites: BTreeMap<String, (ReportRow, BTreeSet<&str>)> = BTreeMap::new();
    let mut models: BTreeMap<String, (ReportRow, BTreeSet<&str>)> = BTreeMap::new();
    let mut total = ReportRow {
        key: "total".into(),
        ..ReportRow::default()
    };
    let in_window = |r: &Run| {
        req.from_ms.is_none_or(|f| r.offered_ms >= f) && req.to_ms.is_none_or(|t| r.offered_ms < t)
    };
    for job in jobs {
        if req.tenant.as_ref().is_some_and(|t| t != &job.tenant) {
            continue;
        }
        let runs: Vec<&Run> = job.runs.iter().filter(|r| in_window(r)).collect();
        let Some(first) = runs.first() else {
            continue;
        };
        // The wait goes with the job's first attempt in the window, if that attempt is its first start.
        let wait = job
            .runs
            .iter()
            .find_map(|r| r.started_ms)
            .filter(|_| job.runs.first().is_some_and(|r| r.attempt == first.attempt))
            .map_or(0, |s| s.saturating_sub(job.submitted_ms));
        let id = job.job.as_str();
        let model = |r: &Run| {
            format!(
                "{}:{}",
                job.kind.as_str(),
                if r.model.as_str().is_empty() {
                    "?"
                } else {
                    r.model.as_str()
                }
            )
        };
        for (i, run) in runs.iter().enumerate() {
            let keys = [
                (&mut tenants, job.tenant.to_string()),
                (&mut sites, run.site.to_string()),
                (&mut models, model(run)),
            ];
            for (map, key) in keys {
                let (row, seen) = map.entry(key.clone()).or_insert_with(|| {
                    (
                        ReportRow {
                            key,
                            ..ReportRow::default()
                        },
                        BTreeSet::new(),
                    )
                });
                add(row, run);
                if seen.insert(id) {
                    row.jobs += 1;
                }
                if i == 0 {
                    row.wait_ms += wait;
                }
            }
            add(&mut total, run);
        }
        total.jobs += 1;
        total.wait_ms += wait;
    }
    let rows = |m: BTreeMap<String, (ReportRow, BTreeSet<&str>)>| {
        m.into_values().map(|(r, _)| r).collect()
    };
    ReportView {
        tenant: req.tenant.clone(),
        from_ms: req.from_ms,
        to_ms: req.to_ms,
        by_tenant: rows(tenants),
        by_site: rows(sites),
        by_model: rows(models),
        total,
        unreadable: Vec::new(),
    }
}
