//! What was used and what was asked for: the metering report, and the job history a what-if replays.

use super::{ApiError, ApiResult};
use crate::service::{authz, Answer, BrokerHandle, Query};
use meridian_core::access::Principal;
use meridian_federation::{
    FederationView, HistoryJob, HistoryRequest, HistoryView, JobId, ReportRequest, ReportView,
};
use std::collections::BTreeSet;

pub async fn report(
    h: &BrokerHandle,
    who: &Principal,
    mut req: ReportRequest,
) -> ApiResult<ReportView> {
    authz::scope_to_own_tenant(who, &mut req.tenant, "report")?;
    authz::may_report(who, req.tenant.as_ref())?;
    let Some(Answer::Ledger(mut entries)) = h.query(Query::Ledger).await else {
        return Err(ApiError::unavailable());
    };
    let (archived, unreadable) = h.archive.ledger().await.map_err(ApiError::archive)?;
    entries.extend(archived);
    let mut report = meridian_core::ledger::report(&entries, &req);
    report.unreadable = unreadable;
    Ok(report)
}

/// The jobs submitted from `from_ms` on, live and archived, and the federation the broker places on.
pub async fn history(h: &BrokerHandle, req: HistoryRequest) -> ApiResult<HistoryView> {
    let from = req.from_ms.unwrap_or(0);
    let Some(Answer::History(mut jobs, tenancy_toml, sites)) = h.query(Query::History(from)).await
    else {
        return Err(ApiError::unavailable());
    };
    let live: BTreeSet<JobId> = jobs.iter().map(|j| j.job.clone()).collect();
    h.archive
        .scan(0, |a| {
            if a.job.submitted_ms >= from && !live.contains(&a.job.id) {
                jobs.push(meridian_core::views::history_job(&a.job));
            }
            true
        })
        .await
        .map_err(ApiError::archive)?;
    jobs.sort_by(|a: &HistoryJob, b: &HistoryJob| {
        (a.submitted_ms, &a.job).cmp(&(b.submitted_ms, &b.job))
    });
    let regions_used = sites
        .iter()
        .filter_map(|s| s.info.rtt_region.as_deref())
        .collect();
    Ok(HistoryView {
        now_ms: crate::service::now_ms(),
        tenancy_toml,
        jobs,
        federation: Some(FederationView {
            rtt: h.tables.rtt_touching(&regions_used),
            sites,
            regions: h.tables.regions.clone(),
            throughput_toml: h.tables.throughput_toml.clone(),
        }),
    })
}
