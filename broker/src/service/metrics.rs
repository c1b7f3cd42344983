//! The broker's metrics, served on `GET /metrics` in the OpenMetrics text format that Prometheus scrapes.
//!
//! Three sources: counters and histograms fed after every batch from what the reactor's steps did
//! ([`meridian_core::observe::Observation`]) and from the shell's own timings (placement steps, journal
//! appends); gauges read off the reactor's state at each scrape ([`meridian_core::observe::Gauges`]); and what
//! agents measure of their devices, published over NATS (`meridian.v1.site.<S>.metrics`) and re-exported here
//! with a `site` label, so no site runs a listener of its own. Counters count from the broker's start (a
//! restart resets them, as Prometheus expects). Labels are bounded: no job ids.

use meridian_core::observe::{Answer, Gauges, Observation};
use meridian_federation::{SiteId, SiteMetrics, Tier};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// How long an agent's last report is shown: a site that stopped reporting drops out of the device series.
pub const AGENT_METRICS_TTL_MS: u64 = 120_000;

type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyTier {
    policy: String,
    tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueReason {
    queue: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SiteModelState {
    site: String,
    model: String,
    state: String,
}

/// Every metric of the broker, registered once.
pub struct Metrics {
    registry: Registry,
    placements: Family<PolicyTier, Counter>,
    admission_wait: Histogram,
    decision: Histogram,
    offers_failed: Family<Reason, Counter>,
    preemptions: Family<Reason, Counter>,
    journal_append: Histogram,
    cost: Family<TenantLabel, FloatCounter>,
    energy: Family<TenantLabel, FloatCounter>,
    co2e: Family<TenantLabel, FloatCounter>,
    burst: FloatCounter,
    replies_refused: Family<Reason, Counter>,
    finished: Family<Outcome, Counter>,
    pending: Family<QueueReason, Gauge>,
    jobs: Family<Phase, Gauge>,
    sites: Family<StateLabel, Gauge>,
    devices: Family<SiteModelState, FloatGauge>,
    /// What agents report of their devices.
    device_reports: meridian_runtime::device_metrics::DeviceFamilies,
    /// Each site's latest report and when it arrived.
    agents: Mutex<BTreeMap<SiteId, (u64, SiteMetrics)>>,
    /// One scrape at a time: gauges are cleared and set again for each.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::default();
        let m = Metrics {
            placements: Family::default(),
            admission_wait: Histogram::new(exponential_buckets(0.1, 2.0, 18)),
            decision: Histogram::new(exponential_buckets(0.000_01, 2.0, 20)),
            offers_failed: Family::default(),
            preemptions: Family::default(),
            journal_append: Histogram::new(exponential_buckets(0.000_5, 2.0, 16)),
            cost: Family::default(),
            energy: Family::default(),
            co2e: Family::default(),
            burst: FloatCounter::default(),
            replies_refused: Family::default(),
            finished: Family::default(),
            pending: Family::default(),
            jobs: Family::default(),
            sites: Family::default(),
            devices: Family::default(),
            device_reports: Default::default(),
            agents: Mutex::new(BTreeMap::new()),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        register_decisions(&mut r, &m);
        register_usage(&mut r, &m);
        let device_reports = meridian_runtime::device_metrics::DeviceFamilies::register(&mut r);
        Metrics {
            registry: r,
            device_reports,
            ..m
        }
    }

    /// Counts what a batch's steps did.
    pub fn record(&self, observations: &[Observation]) {
        for o in observations {
            match o {
                Observation::Placed {
                    policy,
                    tier,
                    waiting_since_ms,
                    at_ms,
                    ..
                } => {
                    self.placements
                        .get_or_create(&PolicyTier {
                            policy: policy.clone(),
                            tier: tier.as_str().to_owned(),
                        })
                        .inc();
                    self.admission_wait
                        .observe(at_ms.saturating_sub(*waiting_since_ms) as f64 / 1000.0);
                }
                Observation::Answered { answer, .. } => {
                    if *answer != Answer::Accepted {
                        self.offers_failed
                            .get_or_create(&Reason {
                                reason: answer.as_str().to_owned(),
                            })
                            .inc();
                    }
                }
                Observation::Preempted { reason, .. } => {
                    self.preemptions
                        .get_or_create(&Reason {
                            reason: reason.as_str().to_owned(),
                        })
                        .inc();
                }
                Observation::Metered {
                    tenant,
                    tier,
                    amounts,
                    device_ms,
                    ..
                } => {
                    let t = TenantLabel {
                        tenant: tenant.to_string(),
                    };
                    self.cost
                        .get_or_create(&t)
                        .inc_by(amounts.cost_micro_usd as f64 / 1e6);
                    self.energy
                        .get_or_create(&t)
                        .inc_by(amounts.energy_wh as f64 * 3600.0);
                    self.co2e.get_or_create(&t).inc_by(amounts.co2_g as f64);
                    if *tier == Tier::Cloud {
                        self.burst.inc_by(*device_ms as f64 / 1000.0);
                    }
                }
                Observation::Finished { outcome, .. } => {
                    self.finished
                        .get_or_create(&Outcome {
                            outcome: outcome.as_str().to_owned(),
                        })
                        .inc();
                }
            }
        }
    }

    /// A step took `seconds` and made `offers` offers.
    /// An answer withheld: its reply subject was not the caller's inbox.
    pub fn reply_refused(&self, action: &str) {
        self.replies_refused
            .get_or_create(&Reason {
                reason: action.to_owned(),
            })
            .inc();
    }

    pub fn placement_step(&self, seconds: f64, offers: usize) {
        for _ in 0..offers {
            self.decision.observe(seconds / offers as f64);
        }
    }

    pub fn journal_append(&self, seconds: f64) {
        self.journal_append.observe(seconds);
    }

    /// Keeps a site's latest report (the caller has checked that it came from that site).
    pub fn agent_report(&self, m: SiteMetrics, now_ms: u64) {
        if let Ok(mut agents) = self.agents.lock() {
            agents.insert(m.site.clone(), (now_ms, m));
        }
    }

    /// The text Prometheus reads: the gauges set from `g`, then every metric.
    pub fn render(&self, g: &Gauges, now_ms: u64) -> String {
        let _one = self.scrape.lock();
        self.pending.clear();
        for ((queue, reason), n) in &g.pending {
            self.pending
                .get_or_create(&QueueReason {
                    queue: queue.clone(),
                    reason: (*reason).to_owned(),
                })
                .set(*n as i64);
        }
        self.jobs.clear();
        for (phase, n) in &g.jobs {
            self.jobs
                .get_or_create(&Phase {
                    phase: (*phase).to_owned(),
                })
                .set(*n as i64);
        }
        self.sites.clear();
        for state in ["up", "draining", "lost", "revoked"] {
            let n = g.site_states.values().filter(|s| **s == state).count();
            self.sites
                .get_or_create(&StateLabel {
                    state: state.to_owned(),
                })
                .set(n as i64);
        }
        self.devices.clear();
        for ((site, model, state), n) in &g.devices {
            self.devices
                .get_or_create(&SiteModelState {
                    site: site.to_string(),
                    model: model.to_string(),
                    state: (*state).to_owned(),
                })
                .set(*n);
        }
        self.device_reports.clear();
        if let Ok(mut agents) = self.agents.lock() {
            // Reports of sites the broker does not know, or has revoked, or that stopped reporting, go.
            agents.retain(|site, (at, _)| {
                g.site_states.get(site).is_some_and(|s| *s != "revoked")
                    && at.saturating_add(AGENT_METRICS_TTL_MS) > now_ms
            });
            for (_, m) in agents.values() {
                self.device_reports.set(m);
            }
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!("encoding metrics: {e}");
        }
        out
    }
}

/// The families of the broker's decisions and their timings.
fn register_decisions(r: &mut Registry, m: &Metrics) {
    r.register(
        "meridian_placements",
        "Offers made, by the job's policy and the site's tier",
        m.placements.clone(),
    );
    r.register_with_unit(
        "meridian_admission_wait",
        "Time a job waited for this attempt before it was offered",
        Unit::Seconds,
        m.admission_wait.clone(),
    );
    r.register_with_unit(
        "meridian_placement_decision",
        "Broker time per placement: a step's time divided among the offers it made",
        Unit::Seconds,
        m.decision.clone(),
    );
    r.register(
        "meridian_offers_failed",
        "Offers that did not lead to a run, by reason (refused, timed_out)",
        m.offers_failed.clone(),
    );
    r.register(
        "meridian_preemptions",
        "Running jobs stopped for another, by reason (quota_reclaim, priority)",
        m.preemptions.clone(),
    );
    r.register_with_unit(
        "meridian_journal_append",
        "Time to store a batch of journal records in JetStream",
        Unit::Seconds,
        m.journal_append.clone(),
    );
}

/// The families of what work used and where it stands.
fn register_usage(r: &mut Registry, m: &Metrics) {
    r.register(
        "meridian_tenant_cost_usd",
        "Money metered for finished attempts, by tenant",
        m.cost.clone(),
    );
    r.register_with_unit(
        "meridian_tenant_energy",
        "Energy metered for finished attempts (PUE included), by tenant",
        Unit::Joules,
        m.energy.clone(),
    );
    r.register(
        "meridian_tenant_co2e_grams",
        "Carbon metered for finished attempts, grams CO2e, by tenant",
        m.co2e.clone(),
    );
    r.register_with_unit(
        "meridian_burst_device",
        "Device time run on cloud-tier sites (bursts)",
        Unit::Seconds,
        m.burst.clone(),
    );
    r.register(
        "meridian_replies_refused",
        "Answers the broker did not send because the request named a reply subject that is not the caller's own inbox, by what was asked",
        m.replies_refused.clone(),
    );
    r.register(
        "meridian_jobs_finished",
        "Jobs that reached their end, by outcome (succeeded, failed, cancelled); a service's replicas included",
        m.finished.clone(),
    );
    r.register(
        "meridian_pending_jobs",
        "Jobs waiting, by queue and reason",
        m.pending.clone(),
    );
    r.register("meridian_jobs", "Live jobs by phase", m.jobs.clone());
    r.register(
        "meridian_sites",
        "Sites by state (up, draining, lost, revoked)",
        m.sites.clone(),
    );
    r.register(
        "meridian_devices",
        "Devices by site, model and state (used, free, unhealthy; shares count as fractions)",
        m.devices.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::observe::{PreemptReason, Terms};
    use meridian_federation::{
        Amounts, DeviceMetrics, JobId, JobPhase, ModelName, TenantId, WIRE_VERSION,
    };

    fn site(s: &str) -> SiteId {
        SiteId::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn observations_and_gauges_come_out_under_prometheus_names() {
        let m = Metrics::new();
        let (job, tenant) = (
            JobId::numbered(1),
            TenantId::new("research").unwrap_or_else(|e| panic!("{e}")),
        );
        m.record(&[
            Observation::Placed {
                job: job.clone(),
                attempt: 1,
                tenant: tenant.clone(),
                site: site("dc-a"),
                policy: "balanced".into(),
                tier: Tier::Cloud,
                waiting_since_ms: 500,
                at_ms: 2000,
                terms: Terms {
                    cost_micro_usd: 1,
                    co2_g: 1,
                    latency_ms: 1.0,
                    score: 0.0,
                },
            },
            Observation::Answered {
                job: job.clone(),
                attempt: 1,
                site: site("dc-a"),
                answer: Answer::TimedOut,
                at_ms: 3000,
            },
            Observation::Answered {
                job: job.clone(),
                attempt: 2,
                site: site("dc-a"),
                answer: Answer::Accepted,
                at_ms: 3000,
            },
            Observation::Preempted {
                job: job.clone(),
                attempt: 2,
                reason: PreemptReason::QuotaReclaim,
                at_ms: 4000,
            },
            Observation::Metered {
                job: job.clone(),
                attempt: 2,
                tenant: tenant.clone(),
                site: site("dc-a"),
                tier: Tier::Cloud,
                amounts: Amounts {
                    cost_micro_usd: 2_500_000,
                    energy_wh: 2,
                    co2_g: 7,
                },
                device_ms: 90_000,
                offered_ms: 3000,
                started_ms: Some(3000),
                ended_ms: 93_000,
            },
            Observation::Finished {
                job,
                tenant,
                outcome: JobPhase::Failed,
                at_ms: 93_000,
            },
        ]);
        m.placement_step(0.004, 2);
        m.journal_append(0.002);
        let mut g = Gauges::default();
        g.pending.insert(("research".into(), "quota"), 3);
        g.site_states.insert(site("dc-a"), "up");
        g.site_states.insert(site("dc-b"), "lost");
        g.devices
            .insert((site("dc-a"), ModelName::from("H100"), "free"), 1.5);
        m.agent_report(
            SiteMetrics {
                v: WIRE_VERSION,
                site: site("dc-a"),
                sent_at_ms: 0,
                devices: vec![DeviceMetrics {
                    pool: "h100".into(),
                    index: 3,
                    allocated_milli: 250,
                    utilization: Some(0.5),
                    power_watts: None,
                }],
            },
            1_000,
        );
        // A report from a site the broker does not know is not shown.
        m.agent_report(
            SiteMetrics {
                v: WIRE_VERSION,
                site: site("nowhere"),
                sent_at_ms: 0,
                devices: Vec::new(),
            },
            1_000,
        );
        let text = m.render(&g, 2_000);
        for line in [
            r#"meridian_placements_total{policy="balanced",tier="cloud"} 1"#,
            "meridian_admission_wait_seconds_count 1",
            "meridian_placement_decision_seconds_count 2",
            r#"meridian_offers_failed_total{reason="timed_out"} 1"#,
            r#"meridian_preemptions_total{reason="quota_reclaim"} 1"#,
            "meridian_journal_append_seconds_count 1",
            r#"meridian_tenant_cost_usd_total{tenant="research"} 2.5"#,
            r#"meridian_tenant_energy_joules_total{tenant="research"} 7200.0"#,
            r#"meridian_tenant_co2e_grams_total{tenant="research"} 7.0"#,
            "meridian_burst_device_seconds_total 90.0",
            r#"meridian_jobs_finished_total{outcome="failed"} 1"#,
            r#"meridian_pending_jobs{queue="research",reason="quota"} 3"#,
            r#"meridian_sites{state="lost"} 1"#,
            r#"meridian_devices{site="dc-a",model="H100",state="free"} 1.5"#,
            r#"meridian_device_allocated_ratio{site="dc-a",pool="h100",device="3"} 0.25"#,
            r#"meridian_device_utilization_ratio{site="dc-a",pool="h100",device="3"} 0.5"#,
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("nowhere"), "{text}");
        assert!(!text.contains("meridian_device_power_watts{"), "{text}");
        // Past its time to live, a site's report is gone.
        let later = m.render(&g, 1_000 + AGENT_METRICS_TTL_MS);
        assert!(
            !later.contains("meridian_device_allocated_ratio{"),
            "{later}"
        );
    }
}
