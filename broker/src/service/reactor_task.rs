//! The reactor task: the one task that owns the reactor, steps it with what arrives (site events, API calls,
//! the clock), journals each batch before its effects leave, answers queries, and sends the outbox.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use super::*;

/// Inputs taken together into one journal append (group commit).
pub(super) const MAX_BATCH: usize = 1024;

/// A journal append slower than this means the broker was stalled.
pub(super) const STALL: Duration = Duration::from_secs(1);

#[allow(clippy::too_many_arguments)]
pub(super) async fn reactor_loop(
    mut reactor: Reactor<BufferJournal>,
    mut journal: journal::JetStreamJournal,
    archive: archive::Archive,
    retention_ms: u64,
    mut rx: mpsc::UnboundedReceiver<Input>,
    connected: tokio::sync::watch::Receiver<bool>,
    handle: BrokerHandle,
    tokens: tokio::sync::watch::Sender<auth::Tokens>,
    tick: Duration,
    offer_timeout: Duration,
) -> anyhow::Result<()> {
    let mut tokens_seen = reactor.state().tokens_generation();
    let mut autoscaling = services::Autoscaling::default();
    let mut clock = tokio::time::interval(tick);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut inputs = Vec::with_capacity(MAX_BATCH);
    let mut was_down = false;
    loop {
        // Timers run after every batch (so capacity a batch frees is refilled at once, not at the next clock
        // tick), and on the clock when nothing arrives.
        let mut tick = tokio::select! {
            input = rx.recv() => match input {
                Some(input) => {
                    inputs.push(input);
                    true
                }
                None => return Ok(()),
            },
            _ = clock.tick() => true,
        };
        while inputs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(input) => inputs.push(input),
                Err(_) => break,
            }
        }
        if journal.unreadable().is_some() {
            read_only(
                &mut reactor,
                &mut journal,
                &handle,
                &mut autoscaling,
                &mut inputs,
            )
            .await;
            if reactor.state().tokens_generation() != tokens_seen {
                tokens_seen = reactor.state().tokens_generation();
                let _ = tokens.send(tokens_of(&reactor));
            }
            if journal.unreadable().is_some() || inputs.is_empty() {
                continue;
            }
            // Set aside: what is left of the batch is served as usual.
        }
        // While the broker's own connection is down, no heartbeat can reach it: timers wait, and liveness starts
        // afresh once it is back.
        if !*connected.borrow() {
            was_down = true;
            tick = false;
        } else if was_down {
            was_down = false;
            tracing::info!("NATS connection back; site liveness starts afresh");
            if let Err(e) = reactor.step(now_ms(), Event::Resume) {
                tracing::error!("resume failed: {e}");
            }
        }
        // Timers run after what has arrived: heartbeats that waited in the queue count before a site is judged.
        // The services' autoscaler plans first; its decisions are journaled as replicas submitted and cancelled.
        if tick {
            for event in autoscaling.events(&reactor, now_ms()) {
                inputs.push(Input::Event {
                    event,
                    caller: None,
                    reply: None,
                });
            }
            inputs.push(Input::Event {
                event: Event::Tick,
                caller: None,
                reply: None,
            });
        }
        let now = now_ms();
        let mut replies = Vec::new();
        let mut answers = Vec::new();
        let mut audited = Vec::new();
        for input in inputs.drain(..) {
            match input {
                Input::Event {
                    event,
                    caller,
                    reply,
                } => {
                    let tick = matches!(event, Event::Tick);
                    let stepping = std::time::Instant::now();
                    let r = step_audited(
                        &mut reactor,
                        &handle.audit,
                        &mut audited,
                        now,
                        event,
                        caller,
                    );
                    let seen = reactor.take_observations();
                    let offers = seen
                        .iter()
                        .filter(|o| matches!(o, meridian_core::observe::Observation::Placed { .. }))
                        .count();
                    handle
                        .metrics
                        .placement_step(stepping.elapsed().as_secs_f64(), offers);
                    handle.metrics.record(&seen);
                    if let Some(t) = &handle.traces {
                        t.record(&seen);
                    }
                    match (&r, tick) {
                        (Err(e), true) => tracing::error!("tick failed: {e}"),
                        (Err(e), false) => tracing::debug!("step refused: {e}"),
                        _ => {}
                    }
                    if let Some(tx) = reply {
                        replies.push((tx, r));
                    }
                }
                Input::Query(q, tx) => answers.push((tx, answer(&reactor, &journal, q))),
                Input::Services(call) => autoscaling.serve(&reactor, call, now),
                Input::Quarantine { seq, who, reply } => {
                    quarantine(&mut reactor, &mut journal, &handle, seq, &who, reply).await;
                }
            }
        }
        // The steps are stored before anything is said or sent because of them.
        let records = reactor.journal_mut().take();
        if !records.is_empty() {
            let storing = std::time::Instant::now();
            if let Err(e) = journal.store(reactor.state().format(), records).await {
                tracing::error!("stopping: {e}");
                return Err(e.into());
            }
            handle
                .metrics
                .journal_append(storing.elapsed().as_secs_f64());
            if storing.elapsed() > STALL {
                // The broker could not act (JetStream was electing a leader, say): that time is not held
                // against the sites, whose heartbeats waited unheard.
                tracing::warn!(
                    "the journal took {} ms to store a batch; site liveness starts afresh",
                    storing.elapsed().as_millis()
                );
                if let Err(e) = reactor.step(now_ms(), Event::Resume) {
                    tracing::error!("resume failed: {e}");
                }
            }
            if journal.snapshot_due(reactor.state().jobs().len()) {
                journal.save_snapshot(&reactor.state().snapshot(journal.last_seq(), now));
            }
        }
        // What was audited is written once its batch is stored, as one message.
        handle.audit.batch(std::mem::take(&mut audited));
        if reactor.state().tokens_generation() != tokens_seen {
            tokens_seen = reactor.state().tokens_generation();
            let _ = tokens.send(tokens_of(&reactor));
        }
        if tick {
            archive_finished(&mut reactor, &archive, now, retention_ms).await;
        }
        for (tx, r) in replies {
            let _ = tx.send(r);
        }
        for (tx, a) in answers {
            let _ = tx.send(a);
        }
        for command in reactor.take_outbox() {
            send(&handle, command, offer_timeout);
        }
        // Watchers of routing tables hear of changes after the batch that made them.
        let updates = autoscaling.route_changes(&reactor, now_ms());
        if !updates.is_empty() {
            let client = handle.client.clone();
            tokio::spawn(async move {
                for (inbox, body) in updates {
                    reply::send(&client, &inbox, body).await;
                }
            });
        }
    }
}

/// Serves inputs while an unreadable journal message keeps the broker read-only: questions are answered; an
/// API caller's change is refused with the message's sequence and the reason; what sites say waits unanswered
/// (agents send statuses again until one is acknowledged) and the clock stands still. Once an administrator's
/// quarantine leaves the journal readable, the inputs not yet served stay in `inputs`.
pub(super) async fn read_only(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    handle: &BrokerHandle,
    autoscaling: &mut services::Autoscaling,
    inputs: &mut Vec<Input>,
) {
    let mut pending = std::mem::take(inputs).into_iter();
    while let Some((seq, reason)) = journal.unreadable() {
        let why = journal::read_only(seq, reason);
        let Some(input) = pending.next() else {
            break;
        };
        match input {
            Input::Query(q, tx) => {
                let _ = tx.send(answer(reactor, journal, q));
            }
            Input::Services(call) => autoscaling.serve(reactor, call, now_ms()),
            Input::Event {
                caller: Some(_),
                reply: Some(tx),
                ..
            } => {
                let _ = tx.send(Err(StepError::Journal(
                    meridian_core::journal::JournalError::Unavailable(why),
                )));
            }
            Input::Event { .. } => {}
            Input::Quarantine { seq, who, reply } => {
                quarantine(reactor, journal, handle, seq, &who, reply).await;
            }
        }
    }
    inputs.extend(pending);
}

/// An administrator's quarantine of journal message `seq`: carried out if it is the unreadable one, answered,
/// and audited either way.
pub(super) async fn quarantine(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    handle: &BrokerHandle,
    seq: u64,
    who: &Principal,
    reply: oneshot::Sender<anyhow::Result<()>>,
) {
    let now = now_ms();
    match set_aside(reactor, journal, seq).await {
        Ok(()) => {
            handle.audit.batch(vec![meridian_federation::AuditEntry {
                at_ms: now,
                who: who.id.clone(),
                action: "journal_quarantine".into(),
                target: Some(format!("journal message {seq}")),
                outcome: "ok".into(),
                count: 1,
                until_ms: None,
            }]);
            let _ = reply.send(Ok(()));
        }
        Err(e) => {
            handle
                .audit
                .refused(now, &who.id, "journal_quarantine", &format!("{e:#}"));
            let _ = reply.send(Err(e));
        }
    }
}

/// Sets the unreadable journal message `seq` aside and replays what followed it; once nothing unreadable is
/// left, the broker takes changes again.
pub(super) async fn set_aside(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
    seq: u64,
) -> anyhow::Result<()> {
    let batches = journal.quarantine(reactor.state().format(), seq).await?;
    reactor.replay_batches(&batches);
    tracing::warn!(
        "journal message {seq} set aside by an administrator; {} batches after it replayed",
        batches.len()
    );
    if let Some((next, reason)) = journal.unreadable() {
        tracing::error!("{}", journal::read_only(next, reason));
        return Ok(());
    }
    tracing::info!("the journal reads to its end again: the broker takes changes");
    resume(reactor, journal).await
}

/// Site liveness starts afresh (the broker heard nothing while it was not acting), journaled.
pub(super) async fn resume(
    reactor: &mut Reactor<BufferJournal>,
    journal: &mut journal::JetStreamJournal,
) -> anyhow::Result<()> {
    reactor
        .step(now_ms(), Event::Resume)
        .map_err(|e| anyhow::anyhow!("resuming: {e}"))?;
    journal
        .store(reactor.state().format(), reactor.journal_mut().take())
        .await?;
    Ok(())
}

/// One step: an API caller's change is judged against its permissions first; what the audit records of it (or
/// of a site's refused message) is noted.
pub(super) fn step_audited(
    reactor: &mut Reactor<BufferJournal>,
    audit: &audit::Audit,
    audited: &mut Vec<meridian_federation::AuditEntry>,
    now: u64,
    event: Event,
    caller: Option<Principal>,
) -> Result<Response, StepError> {
    let site = match &event {
        Event::Advert(a) => Some((a.site.id.clone(), "advert")),
        Event::Heartbeat(h) => Some((h.site.clone(), "heartbeat")),
        Event::Status(s) => Some((s.site.clone(), "status")),
        _ => None,
    };
    let joining =
        matches!(&event, Event::Advert(a) if !reactor.state().sites().contains_key(&a.site.id));
    let Some(who) = caller else {
        let r = reactor.step(now, event);
        match (&r, site) {
            (Err(StepError::Refused(why)), Some((site, topic))) => {
                audit.refused(now, &format!("site:{site}"), topic, why);
            }
            (Ok(_), Some((site, _))) if joining => audited.push(meridian_federation::AuditEntry {
                at_ms: now,
                who: format!("site:{site}"),
                action: "site_join".into(),
                target: Some(format!("site {site}")),
                outcome: "ok".into(),
                count: 1,
                until_ms: None,
            }),
            _ => {}
        }
        return r;
    };
    let described = authz::describe(&event);
    let r = authz::authorize(reactor, &who, &event).and_then(|()| reactor.step(now, event));
    if let Some((action, target)) = described {
        match &r {
            Ok(_) => audited.push(meridian_federation::AuditEntry {
                at_ms: now,
                who: who.id.clone(),
                action: action.into(),
                target: authz::outcome_target(target, &r),
                outcome: "ok".into(),
                count: 1,
                until_ms: None,
            }),
            Err(e) => audit.refused(now, &who.id, action, &e.to_string()),
        }
    }
    r
}

/// Moves finished jobs past their retention into the archive, then out of the live state (journaled with the
/// next batch). A failure leaves them live, to be tried again.
pub(super) async fn archive_finished(
    reactor: &mut Reactor<BufferJournal>,
    archive: &archive::Archive,
    now: u64,
    retention_ms: u64,
) {
    if reactor.state().format() < meridian_core::reactor::JOURNALED_DECISIONS {
        return; // Format 1 has no record for it: history stays live until the format is upgraded.
    }
    let batch: Vec<_> = reactor
        .archivable(now, retention_ms, 500)
        .into_iter()
        .map(|j| {
            (
                j.clone(),
                views::job_view(j, reactor.state().sites(), reactor.rtt()),
                views::explain_view(j),
            )
        })
        .collect();
    if batch.is_empty() {
        return;
    }
    let ids: Vec<JobId> = batch.iter().map(|(j, _, _)| j.id.clone()).collect();
    if let Err(e) = archive.store(batch).await {
        tracing::warn!("archiving finished jobs failed (they stay live, tried again): {e:#}");
        return;
    }
    if let Err(e) = reactor.step(now, Event::Archived { jobs: ids }) {
        tracing::error!("could not record archived jobs: {e}");
    }
}

pub(super) fn answer(
    reactor: &Reactor<BufferJournal>,
    journal: &journal::JetStreamJournal,
    q: Query,
) -> Answer {
    let st = reactor.state();
    match q {
        Query::JobsPage {
            after,
            limit,
            filter,
            who,
        } => {
            use std::ops::Bound::{Excluded, Unbounded};
            // After the cursor in the order asked for: ids upwards, or downwards newest first.
            let range: Box<dyn Iterator<Item = (&JobId, &meridian_core::model::Job)>> =
                match (&after, filter.newest_first) {
                    (Some(a), false) => {
                        Box::new(st.jobs().range::<JobId, _>((Excluded(a), Unbounded)))
                    }
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
                        && who
                            .may(
                                meridian_core::access::Verb::Watch,
                                &j.spec.tenant,
                                authz::queue_of(j.spec.queue.as_ref()),
                                "",
                            )
                            .is_ok()
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
        Query::Queues(req, who) => Answer::Queues(meridian_core::summary::queues(
            st.jobs().values().filter(|j| {
                who.may(
                    meridian_core::access::Verb::Watch,
                    &j.spec.tenant,
                    authz::queue_of(j.spec.queue.as_ref()),
                    "",
                )
                .is_ok()
            }),
            reactor.tenancy(),
            &req,
        )),
        Query::Job(id) => Answer::Job(
            st.jobs()
                .get(&id)
                .map(|j| views::job_view(j, st.sites(), reactor.rtt())),
        ),
        Query::Explain(id, all) => {
            Answer::Explain(reactor.explain(&id, now_ms(), all).map(|mut v| {
                if let Some(job) = st.jobs().get(&id) {
                    for (_, _, warning) in views::possibly_still_running(job, st.revoked_sites()) {
                        v.history.push(warning);
                    }
                }
                v
            }))
        }
        Query::Sites => Answer::Sites(
            st.sites()
                .values()
                .map(|s| {
                    let mut v = views::site_view(s);
                    v.carbon_history = st.intensity_of(s.id()).to_vec();
                    v
                })
                .collect(),
        ),
        Query::Format => Answer::Format(
            st.format(),
            journal
                .unreadable()
                .map(|(seq, reason)| (seq, reason.to_owned())),
        ),
        Query::Tokens => Answer::Tokens(st.tokens().values().cloned().collect()),
        Query::Gauges => Answer::Gauges(reactor.gauges()),
        Query::Timeline(id) => Answer::Timeline(st.jobs().get(&id).map(|job| {
            let mut t = views::timeline(job);
            for (attempt, site, warning) in views::possibly_still_running(job, st.revoked_sites()) {
                t.events.push(meridian_federation::TimelineEvent {
                    at_ms: now_ms(),
                    event: "note".into(),
                    attempt: Some(attempt),
                    site: Some(site),
                    detail: warning,
                });
            }
            t
        })),
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

/// Sends one outbox command. Offers are requests: the answer comes back as an event; a missing answer is
/// left to the reactor's offer timeout.
pub(super) fn send(handle: &BrokerHandle, command: Command, offer_timeout: Duration) {
    let h = handle.clone();
    tokio::spawn(async move {
        match command {
            Command::Offer(offer) => {
                let Ok(body) = encode(&offer) else { return };
                let subject = subjects::site(&offer.site, SiteTopic::Offer);
                // The attempt's trace continues at the site under the `offer` span.
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    subjects::TRACEPARENT_HEADER,
                    meridian_federation::trace::traceparent(
                        &offer.job,
                        offer.attempt,
                        meridian_federation::trace::SpanKind::Offer,
                    )
                    .as_str(),
                );
                let reply = tokio::time::timeout(
                    offer_timeout,
                    h.client
                        .request_with_headers(subject, headers, Bytes::from(body)),
                )
                .await;
                let (outcome, mark) = match reply {
                    Err(_) => return,
                    Ok(Err(e)) => (
                        OfferOutcome::Rejected {
                            reason: format!("no answer: {e}"),
                        },
                        None,
                    ),
                    Ok(Ok(m)) => match decode::<OfferReply>(&m.payload) {
                        Ok(r) if r.job == offer.job && r.attempt == offer.attempt => {
                            (r.outcome, r.mark)
                        }
                        Ok(_) => (
                            OfferOutcome::Rejected {
                                reason: "answer names another attempt".into(),
                            },
                            None,
                        ),
                        Err(e) => (
                            OfferOutcome::Rejected {
                                reason: format!("unreadable answer: {e}"),
                            },
                            None,
                        ),
                    },
                };
                h.feed(Event::OfferAnswer {
                    site: offer.site,
                    job: offer.job,
                    attempt: offer.attempt,
                    outcome,
                    mark,
                });
            }
            Command::AskInventory { site } => {
                let Ok(body) = encode(&meridian_federation::InventoryRequest { v: WIRE_VERSION })
                else {
                    return;
                };
                let subject = subjects::site(&site, SiteTopic::Inventory);
                let asked = h.client.request(subject, Bytes::from(body));
                match tokio::time::timeout(Duration::from_secs(10), asked).await {
                    Ok(Ok(m)) => match decode::<meridian_federation::Inventory>(&m.payload) {
                        Ok(inventory) => h.feed(Event::Inventory { site, inventory }),
                        Err(e) => tracing::warn!("site {site} sent an unreadable inventory: {e}"),
                    },
                    _ => tracing::debug!("site {site} did not answer for its inventory"),
                }
            }
            Command::Cancel { site, cancel } => send_cancel(&h.client, &site, &cancel).await,
        }
    });
}
