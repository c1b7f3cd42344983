//! The shell harness (tests only): a broker handle over the reactor with its journal, archive and audit in
//! memory and a recording outbox — no NATS — so that every API call is tested through the shell's own path
//! (authenticate, rate-limit, authorize, handler, reactor task) in milliseconds.
//!
//! Stand-ins, labelled: the journal is taken at once (no JetStream), the archive and audit are in memory
//! (`Archive::in_memory`, `Audit::in_memory`), the reactor task serves one input at a time, and the NATS
//! client is never connected (a call that would ask a site — a running job's logs — gets no answer).

use super::*;
use meridian_core::testkit;
use std::sync::{Arc, Mutex};

/// The administrator's bootstrap token of the harness's broker.
pub const ADMIN: &str = "harness-administrator-token";

pub struct Harness {
    pub h: BrokerHandle,
    /// What the reactor sent, in order (offers, cancels).
    pub outbox: Arc<Mutex<Vec<Command>>>,
}

impl Harness {
    /// A broker over two owned sites, `site-a` (4 A100) and `site-b` (4 H100).
    pub async fn start() -> anyhow::Result<Harness> {
        let mut reactor = Reactor::new(
            CoreConfig::default(),
            RttTable::default(),
            testkit::regions(),
            BufferJournal::default(),
        );
        for advert in [
            testkit::site("site-a", meridian_federation::Tier::Owned, 50.1, 8.7)
                .gpus("A100", 4, 2.0)
                .build(),
            testkit::site("site-b", meridian_federation::Tier::Owned, 40.7, -74.0)
                .gpus("H100", 4, 4.0)
                .build(),
        ] {
            reactor
                .step(now_ms(), Event::Advert(advert))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (tokens_tx, tokens_rx) = tokio::sync::watch::channel(tokens_of(&reactor));
        let unlimited = || auth::Rate {
            per_s: 1_000_000,
            burst: 1_000_000,
        };
        // Never connected: nothing is served on this address.
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("127.0.0.1:9")
            .await?;
        let h = BrokerHandle {
            tx,
            client,
            archive: archive::Archive::in_memory(),
            auth: Arc::new(auth::Auth::new(
                false,
                Some(ADMIN),
                tokens_rx,
                unlimited(),
                unlimited(),
            )),
            audit: audit::Audit::in_memory(),
            metrics: Arc::new(metrics::Metrics::new()),
            traces: None,
            tables: Arc::new(Tables::default()),
        };
        let outbox: Arc<Mutex<Vec<Command>>> = Arc::default();
        tokio::spawn(serve(reactor, rx, h.clone(), tokens_tx, outbox.clone()));
        Ok(Harness { h, outbox })
    }

    /// Carries out a call as the token says, as an edge would hand it over.
    pub async fn call(&self, token: Option<&str>, call: api::Call) -> api::ApiResult<api::Reply> {
        let req = api::Request {
            action: call.def().action,
            call: Ok(call),
        };
        api::handle(&self.h, token, None, req).await
    }

    /// A call's answer as JSON (its `ok`), or its error.
    pub async fn json(
        &self,
        token: Option<&str>,
        call: api::Call,
    ) -> Result<serde_json::Value, meridian_federation::ErrorBody> {
        let reply = self.call(token, call).await.map_err(|e| e.0)?;
        let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
        Ok(v["ok"].clone())
    }
}

/// The reactor task of the harness: each input served as it comes, its records taken as stored.
async fn serve(
    mut reactor: Reactor<BufferJournal>,
    mut rx: mpsc::UnboundedReceiver<Input>,
    handle: BrokerHandle,
    tokens: tokio::sync::watch::Sender<auth::Tokens>,
    outbox: Arc<Mutex<Vec<Command>>>,
) {
    let mut scaling = services::Autoscaling::default();
    while let Some(input) = rx.recv().await {
        let now = now_ms();
        match input {
            Input::Event {
                event,
                caller,
                reply,
            } => {
                let mut audited = Vec::new();
                let r = step_audited(
                    &mut reactor,
                    &handle.audit,
                    &mut audited,
                    now,
                    event,
                    caller,
                );
                reactor.journal_mut().take();
                handle.audit.batch(audited);
                let _ = tokens.send(tokens_of(&reactor));
                if let Ok(mut sent) = outbox.lock() {
                    sent.extend(reactor.take_outbox());
                }
                if let Some(tx) = reply {
                    let _ = tx.send(r);
                }
            }
            Input::Query(q, tx) => {
                let _ = tx.send(answer(&reactor, None, q));
            }
            Input::Services(call) => scaling.serve(&reactor, call, now),
            Input::Quarantine { seq, reply, .. } => {
                let _ = reply.send(Err(anyhow::anyhow!(
                    "journal message {seq} is not the unreadable one: the journal reads to its end"
                )));
            }
        }
    }
}
