//! The reactor task: the one task that owns the reactor, steps it with what arrives (site events, API calls,
//! the clock), journals each batch before its effects leave, answers queries, and sends the outbox.
#![allow(clippy::disallowed_methods)] // a shell: reads the clock

use super::*;

/// Inputs taken together into one journal append (group commit).
pub(super) const MAX_BATCH: usize = 1024;

/// A journal append slower than this means the broker was stalled.
pub(super) const STALL: Duration = Duration::from_secs(1);

/// What the reactor task owns between batches.
pub(super) struct Task {
    pub reactor: Reactor<BufferJournal>,
    pub journal: journal::JetStreamJournal,
    pub handle: BrokerHandle,
    /// The API tokens as the reactor holds them, for authentication outside the task.
    pub tokens: tokio::sync::watch::Sender<auth::Tokens>,
    /// How long finished jobs stay live before they are archived.
    pub retention_ms: u64,
    pub offer_timeout: Duration,
    pub autoscaling: services::Autoscaling,
    tokens_seen: u64,
    was_down: bool,
}

/// Where the answer to a change goes.
type Answered = oneshot::Sender<Result<Response, StepError>>;

/// What a batch says once it is stored: answers to changes and questions, and audit entries.
#[derive(Default)]
struct Said {
    replies: Vec<(Answered, Result<Response, StepError>)>,
    answers: Vec<(oneshot::Sender<Answer>, Answer)>,
    audited: Vec<meridian_federation::AuditEntry>,
}

/// Takes inputs in batches until the handles are gone: timers run after every batch (so capacity a batch frees
/// is refilled at once, not at the next clock tick), and on the clock when nothing arrives.
pub(super) async fn reactor_loop(
    mut task: Task,
    mut rx: mpsc::UnboundedReceiver<Input>,
    connected: tokio::sync::watch::Receiver<bool>,
    tick: Duration,
) -> anyhow::Result<()> {
    let mut clock = tokio::time::interval(tick);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut inputs = Vec::with_capacity(MAX_BATCH);
    loop {
        let tick = tokio::select! {
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
        if task.journal.unreadable().is_some() {
            let Task {
                reactor,
                journal,
                handle,
                autoscaling,
                ..
            } = &mut task;
            read_only(reactor, journal, handle, autoscaling, &mut inputs).await;
            task.publish_tokens();
            if task.journal.unreadable().is_some() || inputs.is_empty() {
                continue;
            }
            // Set aside: what is left of the batch is served as usual.
        }
        let tick = task.connection_up(&connected) && tick;
        if tick {
            task.add_timers(&mut inputs);
        }
        task.run_batch(&mut inputs, tick).await?;
    }
}

impl Task {
    pub(super) fn new(
        reactor: Reactor<BufferJournal>,
        journal: journal::JetStreamJournal,
        handle: BrokerHandle,
        tokens: tokio::sync::watch::Sender<auth::Tokens>,
        retention_ms: u64,
        offer_timeout: Duration,
    ) -> Self {
        Task {
            tokens_seen: reactor.state().tokens_generation(),
            reactor,
            journal,
            handle,
            tokens,
            retention_ms,
            offer_timeout,
            autoscaling: services::Autoscaling::default(),
            was_down: false,
        }
    }

    /// Whether the broker's own connection is up. While it is down no heartbeat can reach the broker: timers
    /// wait, and liveness starts afresh once it is back.
    fn connection_up(&mut self, connected: &tokio::sync::watch::Receiver<bool>) -> bool {
        if !*connected.borrow() {
            self.was_down = true;
            return false;
        }
        if self.was_down {
            self.was_down = false;
            tracing::info!("NATS connection back; site liveness starts afresh");
            if let Err(e) = self.reactor.step(now_ms(), Event::Resume) {
                tracing::error!("resume failed: {e}");
            }
        }
        true
    }

    /// Timers run after what has arrived: heartbeats that waited in the queue count before a site is judged.
    /// The services' autoscaler plans first; its decisions are journaled as replicas submitted and cancelled.
    fn add_timers(&mut self, inputs: &mut Vec<Input>) {
        let planned = self.autoscaling.events(&self.reactor, now_ms());
        for event in planned.into_iter().chain([Event::Tick]) {
            inputs.push(Input::Event {
                event,
                caller: None,
                reply: None,
            });
        }
    }

    /// Steps the batch, stores it, then says and sends what it made.
    async fn run_batch(&mut self, inputs: &mut Vec<Input>, tick: bool) -> anyhow::Result<()> {
        let now = now_ms();
        let mut said = Said::default();
        for input in inputs.drain(..) {
            self.take(input, now, &mut said).await;
        }
        // The steps are stored before anything is said or sent because of them.
        self.store(now).await?;
        // What was audited is written once its batch is stored, as one message.
        self.handle.audit.batch(std::mem::take(&mut said.audited));
        self.publish_tokens();
        if tick {
            let archive = self.handle.archive.clone();
            archive_finished(&mut self.reactor, &archive, now, self.retention_ms).await;
        }
        for (tx, r) in said.replies {
            let _ = tx.send(r);
        }
        for (tx, a) in said.answers {
            let _ = tx.send(a);
        }
        for command in self.reactor.take_outbox() {
            send(&self.handle, command, self.offer_timeout);
        }
        // Watchers of routing tables hear of changes after the batch that made them.
        let updates = self.autoscaling.route_changes(&self.reactor, now_ms());
        if !updates.is_empty() {
            let client = self.handle.client.clone();
            tokio::spawn(async move {
                for (inbox, body) in updates {
                    reply::send(&client, &inbox, body).await;
                }
            });
        }
        Ok(())
    }

    /// Serves one input of the batch.
    async fn take(&mut self, input: Input, now: u64, said: &mut Said) {
        match input {
            Input::Event {
                event,
                caller,
                reply,
            } => {
                let r = self.step(now, event, caller, &mut said.audited);
                if let Some(tx) = reply {
                    said.replies.push((tx, r));
                }
            }
            Input::Query(q, tx) => said
                .answers
                .push((tx, answer(&self.reactor, self.journal.unreadable(), q))),
            Input::Services(call) => self.autoscaling.serve(&self.reactor, call, now),
            Input::Quarantine { seq, who, reply } => {
                let (reactor, journal) = (&mut self.reactor, &mut self.journal);
                quarantine(reactor, journal, &self.handle, seq, &who, reply).await;
            }
        }
    }

    /// One step, judged and audited, its observations counted for the metrics and traces.
    fn step(
        &mut self,
        now: u64,
        event: Event,
        caller: Option<Principal>,
        audited: &mut Vec<meridian_federation::AuditEntry>,
    ) -> Result<Response, StepError> {
        let tick = matches!(event, Event::Tick);
        let stepping = std::time::Instant::now();
        let audit = &self.handle.audit;
        let r = step_audited(&mut self.reactor, audit, audited, now, event, caller);
        let seen = self.reactor.take_observations();
        let offers = seen
            .iter()
            .filter(|o| matches!(o, meridian_core::observe::Observation::Placed { .. }))
            .count();
        let metrics = &self.handle.metrics;
        metrics.placement_step(stepping.elapsed().as_secs_f64(), offers);
        metrics.record(&seen);
        if let Some(t) = &self.handle.traces {
            t.record(&seen);
        }
        match (&r, tick) {
            (Err(e), true) => tracing::error!("tick failed: {e}"),
            (Err(e), false) => tracing::debug!("step refused: {e}"),
            _ => {}
        }
        r
    }

    /// Stores what the batch's steps journaled, and a snapshot when one is due.
    async fn store(&mut self, now: u64) -> anyhow::Result<()> {
        let records = self.reactor.journal_mut().take();
        if records.is_empty() {
            return Ok(());
        }
        let storing = std::time::Instant::now();
        if let Err(e) = self
            .journal
            .store(self.reactor.state().format(), records)
            .await
        {
            tracing::error!("stopping: {e}");
            return Err(e.into());
        }
        let took = storing.elapsed();
        self.handle.metrics.journal_append(took.as_secs_f64());
        if took > STALL {
            // The broker could not act (JetStream was electing a leader, say): that time is not held against
            // the sites, whose heartbeats waited unheard.
            tracing::warn!(
                "the journal took {} ms to store a batch; site liveness starts afresh",
                took.as_millis()
            );
            if let Err(e) = self.reactor.step(now_ms(), Event::Resume) {
                tracing::error!("resume failed: {e}");
            }
        }
        let state = self.reactor.state();
        if self
            .journal
            .snapshot_due(state.jobs().len() + state.sites().len())
        {
            let snapshot = state.snapshot(self.journal.last_seq(), now);
            self.journal.save_snapshot(&snapshot);
        }
        Ok(())
    }

    /// Hands the API tokens to authentication when they changed.
    fn publish_tokens(&mut self) {
        let generation = self.reactor.state().tokens_generation();
        if generation != self.tokens_seen {
            self.tokens_seen = generation;
            let _ = self.tokens.send(tokens_of(&self.reactor));
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
                let _ = tx.send(answer(reactor, journal.unreadable(), q));
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
            Command::AskAdvert { site } => {
                let Ok(body) = encode(&meridian_federation::BrokerHello {
                    v: WIRE_VERSION,
                    sent_at_ms: super::now_ms(),
                }) else {
                    return;
                };
                let subject = subjects::site(&site, SiteTopic::Hello);
                if let Err(e) = h.client.publish(subject, Bytes::from(body)).await {
                    tracing::debug!("could not ask site {site} for its advert: {e}");
                }
            }
            Command::Cancel { site, cancel } => send_cancel(&h.client, &site, &cancel).await,
        }
    });
}
