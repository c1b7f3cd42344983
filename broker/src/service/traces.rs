//! The broker's spans of each job attempt, made from what the reactor's steps did
//! ([`meridian_core::observe::Observation`]) with the times they had: `placement` (from the time the job began
//! waiting for this attempt — admission by quota and budget, then placement — to the offer, with the
//! decision's site, policy, tier and terms), `offer` (to its answer), and the root `attempt` (to the attempt's
//! end, with its metered amounts, and preemptions as events). The agent adds `run` under `offer`.

use meridian_core::observe::{Answer, Observation};
use meridian_federation::trace::SpanKind;
use meridian_federation::{JobId, SiteId, Tier};
use meridian_runtime::telemetry::{Attributes, SpanEvent, SpanRecord, Telemetry, Value};
use std::collections::HashMap;

/// What is kept of an attempt between its offer and its end (soft: a broker that restarts in between makes the
/// root span from what it sees then).
struct Open {
    waiting_since_ms: u64,
    offered_ms: u64,
    policy: String,
    events: Vec<SpanEvent>,
}

/// At most this many attempts are kept open; past it the oldest are forgotten.
const MAX_OPEN: usize = 100_000;

/// Hands what steps did to a thread of its own, which makes and exports the spans: the reactor task only
/// sends.
pub struct Traces {
    tx: std::sync::mpsc::Sender<Vec<Observation>>,
}

/// The thread's state: the exporter and the attempts between their offer and their end.
struct Maker {
    telemetry: Telemetry,
    open: HashMap<(JobId, u32), Open>,
}

fn text(s: impl ToString) -> Value {
    Value::Text(s.to_string())
}

fn site_attrs(site: &SiteId, tier: Tier) -> Attributes {
    vec![
        ("meridian.site", text(site)),
        ("meridian.tier", text(tier.as_str())),
    ]
}

impl Traces {
    pub fn new(telemetry: Telemetry) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Observation>>();
        std::thread::spawn(move || {
            let mut maker = Maker {
                telemetry,
                open: HashMap::new(),
            };
            while let Ok(batch) = rx.recv() {
                for o in &batch {
                    maker.record_one(o);
                }
            }
        });
        Traces { tx }
    }

    /// Makes the spans of what a batch's steps did (on the spans' own thread).
    pub fn record(&self, observations: &[Observation]) {
        if !observations.is_empty() {
            let _ = self.tx.send(observations.to_vec());
        }
    }
}

/// A span of an attempt, with nothing said of it yet.
fn span(job: &JobId, attempt: u32, kind: SpanKind, start_ms: u64, end_ms: u64) -> SpanRecord {
    SpanRecord {
        job: job.clone(),
        attempt,
        kind,
        parent: None,
        start_ms,
        end_ms,
        attributes: Vec::new(),
        events: Vec::new(),
        error: None,
    }
}

impl Maker {
    fn record_one(&mut self, o: &Observation) {
        match o {
            Observation::Placed { .. } => self.placed(o),
            Observation::Answered { .. } => self.answered(o),
            Observation::Preempted {
                job,
                attempt,
                reason,
                at_ms,
            } => {
                if let Some(o) = self.open.get_mut(&(job.clone(), *attempt)) {
                    o.events.push((
                        *at_ms,
                        "preempted",
                        vec![("meridian.reason", text(reason.as_str()))],
                    ));
                }
            }
            Observation::Metered { .. } => self.metered(o),
            // An attempt's span ends when it is metered.
            Observation::Finished { .. } => {}
        }
    }

    /// The placement span, and the attempt kept open until it ends.
    fn placed(&mut self, o: &Observation) {
        let Observation::Placed {
            job,
            attempt,
            tenant,
            site,
            policy,
            tier,
            waiting_since_ms,
            at_ms,
            terms,
        } = o
        else {
            return;
        };
        let mut s = span(
            job,
            *attempt,
            SpanKind::Placement,
            *waiting_since_ms,
            *at_ms,
        );
        s.attributes = site_attrs(site, *tier);
        s.attributes.extend([
            ("meridian.tenant", text(tenant)),
            ("meridian.policy", text(policy)),
            (
                "meridian.cost_usd",
                Value::Float(terms.cost_micro_usd as f64 / 1e6),
            ),
            ("meridian.co2e_g", Value::Int(terms.co2_g as i64)),
            ("meridian.latency_ms", Value::Float(terms.latency_ms)),
            ("meridian.score", Value::Float(terms.score)),
        ]);
        self.telemetry.span(&s);
        if self.open.len() >= MAX_OPEN {
            self.open.clear();
        }
        self.open.insert(
            (job.clone(), *attempt),
            Open {
                waiting_since_ms: *waiting_since_ms,
                offered_ms: *at_ms,
                policy: policy.clone(),
                events: Vec::new(),
            },
        );
    }

    /// The offer's span; a refused offer ends the attempt, which never ran.
    fn answered(&mut self, o: &Observation) {
        let Observation::Answered {
            job,
            attempt,
            site,
            answer,
            at_ms,
        } = o
        else {
            return;
        };
        let key = (job.clone(), *attempt);
        let start = self.open.get(&key).map_or(*at_ms, |o| o.offered_ms);
        let mut s = span(job, *attempt, SpanKind::Offer, start, *at_ms);
        s.attributes = vec![
            ("meridian.site", text(site)),
            ("meridian.answer", text(answer.as_str())),
        ];
        if *answer != Answer::Accepted {
            s.error = Some(format!("offer {}", answer.as_str()));
        }
        self.telemetry.span(&s);
        if *answer != Answer::Accepted {
            let o = self.open.remove(&key);
            let since = o.as_ref().map_or(start, |o| o.waiting_since_ms);
            let mut root = span(job, *attempt, SpanKind::Attempt, since, *at_ms);
            root.attributes = vec![("meridian.site", text(site))];
            root.error = Some(format!("offer {}", answer.as_str()));
            self.telemetry.span(&root);
        }
    }

    /// The attempt's root span, with its metered amounts and what happened to it.
    fn metered(&mut self, o: &Observation) {
        let Observation::Metered {
            job,
            attempt,
            tenant,
            site,
            tier,
            amounts,
            offered_ms,
            ended_ms,
            ..
        } = o
        else {
            return;
        };
        let o = self.open.remove(&(job.clone(), *attempt));
        let start = o.as_ref().map_or(*offered_ms, |o| o.waiting_since_ms);
        let mut root = span(job, *attempt, SpanKind::Attempt, start, *ended_ms);
        root.attributes = site_attrs(site, *tier);
        root.attributes.extend([
            ("meridian.tenant", text(tenant)),
            (
                "meridian.cost_usd",
                Value::Float(amounts.cost_micro_usd as f64 / 1e6),
            ),
            ("meridian.energy_wh", Value::Int(amounts.energy_wh as i64)),
            ("meridian.co2e_g", Value::Int(amounts.co2_g as i64)),
        ]);
        if let Some(o) = o {
            root.attributes.push(("meridian.policy", text(o.policy)));
            root.events = o.events;
        }
        self.telemetry.span(&root);
    }
}
