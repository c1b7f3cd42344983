//! The reactor task's answers to read-only questions, from the state as the last batch left it.

use super::{authz, now_ms};
use meridian_core::access::{Principal, Verb};
use meridian_core::journal::BufferJournal;
use meridian_core::model::Job;
use meridian_core::reactor::Reactor;
use meridian_core::views;
use meridian_federation::{ExplainView, JobId, JobListRequest, JobView, SiteId, SiteView};

/// Read-only questions to the reactor task.
#[derive(Debug)]
pub enum Query {
    /// Live jobs after `after` (by id) that pass the filter, at most `limit`, and whether more follow.
    JobsPage {
        after: Option<JobId>,
        limit: usize,
        filter: meridian_federation::JobListRequest,
        /// Only the jobs the caller may read.
        who: Principal,
    },
    Job(JobId),
    /// A job, and whether every site is weighed (`explain --all`).
    Explain(JobId, bool),
    Timeline(JobId),
    /// Sites by id: every one, or a page of them, in one state or any.
    Sites(meridian_federation::SiteListRequest),
    /// Where the job's latest attempt ran: site and attempt.
    Placement(JobId),
    /// The ledger of the live jobs.
    Ledger,
    /// The live jobs submitted from this time on, for a what-if, and the tenancy in force.
    History(u64),
    Tenancy,
    /// The journal's durable format in force.
    Format,
    /// The API tokens.
    Tokens,
    /// The gauges `/metrics` shows.
    Gauges,
    /// The live work by queue, site and users' place, over the jobs the caller may read.
    Queues(meridian_federation::QueuesRequest, Principal),
}

#[derive(Debug)]
pub enum Answer {
    JobsPage(Vec<JobView>, bool),
    Job(Option<JobView>),
    Explain(Option<ExplainView>),
    Timeline(Option<meridian_federation::TimelineView>),
    Sites(Vec<SiteView>),
    Placement(Option<(SiteId, u32)>),
    Ledger(Vec<meridian_core::ledger::LedgerEntry>),
    /// The jobs, the tenancy's text, and the sites as the broker knows them.
    History(
        Vec<meridian_federation::HistoryJob>,
        Option<String>,
        Vec<meridian_federation::FederationSite>,
    ),
    Tenancy(Option<String>),
    /// The format in force, and the journal message that keeps the broker read-only (sequence, reason).
    Format(u32, Option<(u64, String)>),
    Tokens(Vec<meridian_core::access::TokenRecord>),
    Gauges(meridian_core::observe::Gauges),
    Queues(meridian_federation::QueuesView),
}

/// Answers one question; `unreadable` is the journal message that keeps the broker read-only, if one does.
pub(super) fn answer(
    reactor: &Reactor<BufferJournal>,
    unreadable: Option<(u64, &str)>,
    q: Query,
) -> Answer {
    let st = reactor.state();
    match q {
        Query::JobsPage {
            after,
            limit,
            filter,
            who,
        } => jobs_page(reactor, after.as_ref(), limit, &filter, &who),
        Query::Queues(req, who) => Answer::Queues(meridian_core::summary::queues(
            st.jobs().values().filter(|j| watches(&who, j)),
            reactor.tenancy(),
            &req,
        )),
        Query::Job(id) => Answer::Job(
            st.jobs()
                .get(&id)
                .map(|j| views::job_view(j, st.sites(), reactor.rtt())),
        ),
        Query::Explain(id, all) => Answer::Explain(explain(reactor, &id, all)),
        Query::Sites(req) => Answer::Sites(sites(reactor, &req)),
        Query::Format => Answer::Format(
            st.format(),
            unreadable.map(|(seq, reason)| (seq, reason.to_owned())),
        ),
        Query::Tokens => Answer::Tokens(st.tokens().values().cloned().collect()),
        Query::Gauges => Answer::Gauges(reactor.gauges()),
        Query::Timeline(id) => Answer::Timeline(st.jobs().get(&id).map(|j| timeline(reactor, j))),
        Query::Tenancy => Answer::Tenancy(st.tenancy_toml().map(str::to_owned)),
        Query::History(from) => Answer::History(
            st.jobs()
                .values()
                .filter(|j| j.submitted_ms >= from)
                .map(views::history_job)
                .collect(),
            st.tenancy_toml().map(str::to_owned),
            st.sites().values().map(views::federation_site).collect(),
        ),
        Query::Ledger => Answer::Ledger(
            st.jobs()
                .values()
                .map(meridian_core::ledger::LedgerEntry::of)
                .collect(),
        ),
        Query::Placement(id) => Answer::Placement(st.jobs().get(&id).and_then(|j| {
            let site = views::job_view(j, st.sites(), reactor.rtt()).site?;
            (j.attempt > 0).then_some((site, j.attempt))
        })),
    }
}

/// Whether the caller may read a live job.
fn watches(who: &Principal, j: &Job) -> bool {
    who.may(
        Verb::Watch,
        &j.spec.tenant,
        authz::queue_of(j.spec.queue.as_ref()),
        "",
    )
    .is_ok()
}

/// Live jobs after the cursor, in the order asked for (ids upwards, or downwards newest first), that pass the
/// filter and the caller may read; and whether more follow.
fn jobs_page(
    reactor: &Reactor<BufferJournal>,
    after: Option<&JobId>,
    limit: usize,
    filter: &JobListRequest,
    who: &Principal,
) -> Answer {
    use std::ops::Bound::{Excluded, Unbounded};
    let st = reactor.state();
    let range: Box<dyn Iterator<Item = (&JobId, &Job)>> = match (after, filter.newest_first) {
        (Some(a), false) => Box::new(st.jobs().range::<JobId, _>((Excluded(a), Unbounded))),
        (None, false) => Box::new(st.jobs().iter()),
        (Some(a), true) => Box::new(st.jobs().range::<JobId, _>(..a).rev()),
        (None, true) => Box::new(st.jobs().iter().rev()),
    };
    let mut page: Vec<JobView> = range
        .map(|(_, j)| j)
        .filter(|j| {
            filter.tenant.as_ref().is_none_or(|t| t == &j.spec.tenant)
                && filter.state.is_none_or(|p| p == j.phase)
                && filter.from_ms.is_none_or(|f| j.submitted_ms >= f)
                && filter.to_ms.is_none_or(|t| j.submitted_ms < t)
                && filter.text_matches(j.id.as_str(), j.spec.name.as_deref(), &j.why)
                && watches(who, j)
        })
        .map(|j| views::job_view(j, st.sites(), reactor.rtt()))
        .filter(|v| {
            filter
                .site
                .as_ref()
                .is_none_or(|s| v.site.as_ref() == Some(s))
        })
        .take(limit + 1)
        .collect();
    let more = page.len() > limit;
    page.truncate(limit);
    Answer::JobsPage(page, more)
}

/// A job's explanation, warning of attempts that may still run at revoked sites.
fn explain(reactor: &Reactor<BufferJournal>, id: &JobId, all: bool) -> Option<ExplainView> {
    let st = reactor.state();
    reactor.explain(id, now_ms(), all).map(|mut v| {
        if let Some(job) = st.jobs().get(id) {
            for (_, _, warning) in views::possibly_still_running(job, st.revoked_sites()) {
                v.history.push(warning);
            }
        }
        v
    })
}

fn sites(
    reactor: &Reactor<BufferJournal>,
    req: &meridian_federation::SiteListRequest,
) -> Vec<SiteView> {
    use std::ops::Bound;
    let st = reactor.state();
    let from = req.after.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
    st.sites()
        .range::<SiteId, _>((from, Bound::Unbounded))
        .map(|(_, s)| s)
        .filter(|s| {
            req.state.is_none_or(|want| {
                meridian_core::observe::site_state(s, st.revoked_sites()) == want
            })
        })
        .take(req.limit.map_or(usize::MAX, |l| l as usize))
        .map(|s| {
            let mut v = views::site_view(s);
            v.carbon_history = st.intensity_of(s.id()).to_vec();
            v
        })
        .collect()
}

/// A job's timeline, with a note for each attempt that may still run at a revoked site.
fn timeline(reactor: &Reactor<BufferJournal>, job: &Job) -> meridian_federation::TimelineView {
    let mut t = views::timeline(job);
    for (attempt, site, warning) in
        views::possibly_still_running(job, reactor.state().revoked_sites())
    {
        t.events.push(meridian_federation::TimelineEvent {
            at_ms: now_ms(),
            event: "note".into(),
            attempt: Some(attempt),
            site: Some(site),
            detail: warning,
        });
    }
    t
}
