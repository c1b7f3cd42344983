//! The discrete-event engine: a virtual clock drives the broker's own reactor (queueing, `max_wait`,
//! reservations, offers, burst) with the agents' own pure core in place of NATS. Nothing here places jobs.

use super::federation::SimFederation;
use meridian_agent_core::core::AgentCore;
use meridian_core::journal::NullJournal;
use meridian_core::placement::Baseline;
use meridian_core::reactor::{Command, CoreConfig, Event, Reactor, Response};
use meridian_core::Millis;
use meridian_federation::{
    AttemptState, DeviceShare, JobId, JobPhase, JobSpec, JobStatus, ModelName, OfferOutcome,
    Policy, PoolName, SiteId, WIRE_VERSION,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// One job of a simulation: its spec, arrival and run time on the reference model.
#[derive(Clone, Debug)]
pub struct SimJob {
    pub spec: JobSpec,
    pub arrival_ms: Millis,
    /// Run time on the reference model; scaled by the throughput table where it runs.
    pub reference_ms: u64,
    /// Inference replicas run for exactly their window, whatever the model.
    pub fixed_runtime: bool,
    /// The trace's model alternatives as it states them (`V100M32`, `G2`; empty = any): what the checker
    /// judges the schedule against, independently of the spec made from them.
    pub trace_models: Vec<String>,
}

/// How candidates are ranked in a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Ranking {
    Policy(Policy),
    Baseline(Baseline),
    /// Each job's own policy (or its queue's default), as it was submitted: what a what-if replays.
    AsSubmitted,
}

impl Ranking {
    /// The policy with its parameter (`balanced`, `carbon-price=190`) or the baseline's name.
    pub fn name(&self) -> String {
        match self {
            Ranking::Policy(p) => p.label(),
            Ranking::Baseline(b) => b.name().to_owned(),
            Ranking::AsSubmitted => "as-submitted".to_owned(),
        }
    }
}

/// One placement the run made: the schedule the independent checker replays.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleEntry {
    pub job: usize,
    pub job_id: JobId,
    pub attempt: u32,
    pub site: SiteId,
    pub pool: PoolName,
    /// The pool's model.
    pub model: ModelName,
    pub devices: Vec<DeviceShare>,
    pub start_ms: Millis,
    pub end_ms: Millis,
    /// Stopped before its end (preempted to give quota back); the job ran again later.
    pub stopped: bool,
    /// What the broker metered for the attempt when it ended (the checker recomputes cost and energy).
    pub metered: meridian_federation::Amounts,
}

#[derive(Clone, Debug, Default)]
pub struct SimOutput {
    pub schedule: Vec<ScheduleEntry>,
    /// Jobs that were never placed (index into the jobs).
    pub unplaced: Vec<usize>,
    /// Of those, the jobs no site of the federation can run at all (index, why): the run ends without them.
    pub unplaceable: Vec<(usize, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Hour(u64),
    Finish {
        site: SiteId,
        job: JobId,
        attempt: u32,
    },
    Arrival(usize),
    Tick,
}

const HOUR_MS: u64 = 3_600_000;

/// Runs one simulation. Deterministic: the same inputs give the same schedule.
pub fn run(
    fed: &SimFederation,
    jobs: &[SimJob],
    ranking: &Ranking,
    start_ms: Millis,
    tenancy: Option<&str>,
) -> anyhow::Result<SimOutput> {
    let config = CoreConfig {
        site_lost_after_ms: u64::MAX / 4,
        offer_timeout_ms: u64::MAX / 4,
        refusal_cooldown_ms: 60_000,
        exhaustive_passes: false,
    };
    let baseline = match ranking {
        Ranking::Baseline(b) => Some(*b),
        Ranking::Policy(_) | Ranking::AsSubmitted => None,
    };
    let mut reactor = Reactor::new(config, fed.rtt.clone(), fed.regions.clone(), NullJournal)
        .with_throughput(fed.throughput.clone())
        .with_baseline(baseline);
    if let Some(toml) = tenancy {
        reactor
            .step(
                start_ms,
                Event::SetTenancy {
                    toml: toml.to_owned(),
                    from_file: true,
                },
            )
            .map_err(|e| anyhow::anyhow!("the simulator's tenancy was refused: {e}"))?;
    }
    let mut agents: BTreeMap<SiteId, AgentCore> = BTreeMap::new();
    for s in &fed.sites {
        let info = s.info_at(start_ms);
        agents.insert(
            info.id.clone(),
            AgentCore::new(info, s.pools.clone(), false),
        );
    }
    let mut sim = Sim {
        reactor,
        agents,
        jobs,
        fed,
        ids: BTreeMap::new(),
        queue: BinaryHeap::new(),
        seq: 0,
        out: SimOutput::default(),
        open: BTreeMap::new(),
    };
    let ids: Vec<SiteId> = sim.agents.keys().cloned().collect();
    for id in ids {
        sim.advertise(start_ms, &id)?;
    }
    for (i, j) in jobs.iter().enumerate() {
        sim.push(j.arrival_ms, Ev::Arrival(i));
    }
    sim.push(start_ms + HOUR_MS, Ev::Hour(1));
    let mut arrivals_left = jobs.len();
    while let Some(Reverse((now, _, ev))) = sim.queue.pop() {
        match ev {
            Ev::Arrival(i) => {
                arrivals_left -= 1;
                let mut spec = jobs[i].spec.clone();
                if let Ranking::Policy(p) = ranking {
                    spec.policy = Some(p.clone());
                }
                if let Response::Submitted(r) = sim.step(now, Event::Submit(spec))? {
                    sim.ids.insert(r.job.clone(), i);
                    if let Some(t) = sim
                        .reactor
                        .state()
                        .jobs()
                        .get(&r.job)
                        .and_then(|j| j.retry_at_ms)
                    {
                        sim.push(t.max(now), Ev::Tick);
                    }
                }
                sim.drain(now)?;
            }
            Ev::Finish { site, job, attempt } => {
                sim.finish(now, &site, &job, attempt)?;
                sim.step(now, Event::Tick)?;
                sim.drain(now)?;
            }
            Ev::Tick => {
                sim.step(now, Event::Tick)?;
                sim.drain(now)?;
            }
            Ev::Hour(h) => {
                let ids: Vec<SiteId> = sim
                    .fed
                    .sites
                    .iter()
                    .filter(|s| s.series.is_some())
                    .map(|s| s.id.clone())
                    .collect();
                for id in ids {
                    if let (Some(agent), Some(s)) = (sim.agents.get_mut(&id), sim.fed.site(&id)) {
                        agent.info = s.info_at(now);
                        agent.generation += 1;
                    }
                    sim.advertise(now, &id)?;
                }
                // Finished jobs leave the live state as the broker's shell archives them, so that scheduling
                // passes cost what the live jobs cost, not the whole history.
                let done: Vec<JobId> = sim
                    .reactor
                    .archivable(now, 0, usize::MAX)
                    .into_iter()
                    .map(|j| j.id.clone())
                    .collect();
                if !done.is_empty() {
                    sim.step(now, Event::Archived { jobs: done })?;
                }
                // Jobs no site can run keep nothing going: the run ends when only they are left.
                let busy = sim
                    .reactor
                    .state()
                    .active_jobs()
                    .any(|j| !(j.phase == JobPhase::Pending && j.unsatisfiable));
                if arrivals_left > 0 || busy {
                    sim.push(now + HOUR_MS, Ev::Hour(h + 1));
                }
            }
        }
    }
    let Sim {
        reactor,
        ids,
        mut out,
        ..
    } = sim;
    for (id, job) in reactor.state().jobs() {
        if job.phase == JobPhase::Pending {
            if let Some(i) = ids.get(id) {
                out.unplaced.push(*i);
                if job.unsatisfiable {
                    out.unplaceable.push((*i, job.why.clone()));
                }
            }
        }
    }
    Ok(out)
}

struct Sim<'a> {
    reactor: Reactor<NullJournal>,
    agents: BTreeMap<SiteId, AgentCore>,
    jobs: &'a [SimJob],
    fed: &'a SimFederation,
    ids: BTreeMap<JobId, usize>,
    queue: BinaryHeap<Reverse<(Millis, u64, Ev)>>,
    seq: u64,
    out: SimOutput,
    /// Schedule entries of attempts still running, by (job, attempt).
    open: BTreeMap<(JobId, u32), usize>,
}

impl Sim<'_> {
    fn push(&mut self, at: Millis, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, ev)));
    }

    /// One reactor step; the simulation stops on a refused step, since every input it makes should be valid.
    fn step(&mut self, now: Millis, event: Event) -> anyhow::Result<Response> {
        let what = format!("{event:?}");
        self.reactor.step(now, event).map_err(|e| {
            anyhow::anyhow!(
                "the reactor refused a simulated step at {now} ms: {e} (event {})",
                what.chars().take(300).collect::<String>()
            )
        })
    }

    fn advertise(&mut self, now: Millis, site: &SiteId) -> anyhow::Result<()> {
        if let Some(a) = self.agents.get(site) {
            let advert = a.advert(now);
            self.step(now, Event::Advert(advert))?;
            self.drain(now)?;
        }
        Ok(())
    }

    /// Delivers the reactor's outbox to the simulated agents until it is empty.
    fn drain(&mut self, now: Millis) -> anyhow::Result<()> {
        loop {
            let commands = self.reactor.take_outbox();
            if commands.is_empty() {
                return Ok(());
            }
            for c in commands {
                let offer = match c {
                    Command::Offer(offer) => offer,
                    Command::Cancel { site, cancel } => {
                        self.stop(now, &site, &cancel.job, cancel.attempt)?;
                        continue;
                    }
                    // The simulated agents send no inventories, and lose no adverts.
                    Command::AskInventory { .. } | Command::AskAdvert { .. } => continue,
                };
                let Some(agent) = self.agents.get_mut(&offer.site) else {
                    continue;
                };
                let (reply, start) = agent.on_offer(&offer);
                let accepted = reply.outcome == OfferOutcome::Accepted;
                self.step(
                    now,
                    Event::OfferAnswer {
                        site: offer.site.clone(),
                        job: offer.job.clone(),
                        attempt: offer.attempt,
                        outcome: reply.outcome,
                        mark: reply.mark,
                    },
                )?;
                if !(accepted && start) {
                    continue;
                }
                let Some(&i) = self.ids.get(&offer.job) else {
                    continue;
                };
                let job = &self.jobs[i];
                let model = self
                    .fed
                    .site(&offer.site)
                    .and_then(|s| s.pools.iter().find(|p| p.name == offer.pool))
                    .map(|p| p.model.clone())
                    .unwrap_or_default();
                let runtime = if job.fixed_runtime {
                    job.reference_ms
                } else {
                    self.fed
                        .throughput
                        .runtime_ms(job.reference_ms, &model)
                        .max(1)
                };
                self.open
                    .insert((offer.job.clone(), offer.attempt), self.out.schedule.len());
                self.out.schedule.push(ScheduleEntry {
                    job: i,
                    job_id: offer.job.clone(),
                    attempt: offer.attempt,
                    site: offer.site.clone(),
                    pool: offer.pool.clone(),
                    model,
                    devices: offer.devices.clone(),
                    start_ms: now,
                    end_ms: now + runtime,
                    stopped: false,
                    metered: Default::default(),
                });
                self.push(
                    now + runtime,
                    Ev::Finish {
                        site: offer.site.clone(),
                        job: offer.job.clone(),
                        attempt: offer.attempt,
                    },
                );
            }
        }
    }

    /// The agent stops an attempt (preemption): it ends now and is reported cancelled.
    fn stop(
        &mut self,
        now: Millis,
        site: &SiteId,
        job: &JobId,
        attempt: u32,
    ) -> anyhow::Result<()> {
        let Some(e) = self.open.remove(&(job.clone(), attempt)) else {
            return Ok(());
        };
        self.out.schedule[e].end_ms = now;
        self.out.schedule[e].stopped = true;
        let state = AttemptState::Cancelled {
            reason: "stopped".into(),
        };
        self.ended(now, site, job, attempt, e, state)
    }

    fn finish(
        &mut self,
        now: Millis,
        site: &SiteId,
        job: &JobId,
        attempt: u32,
    ) -> anyhow::Result<()> {
        // An attempt stopped earlier has nothing left to finish.
        let Some(e) = self.open.remove(&(job.clone(), attempt)) else {
            return Ok(());
        };
        self.ended(
            now,
            site,
            job,
            attempt,
            e,
            AttemptState::Succeeded { exit_code: 0 },
        )
    }

    /// The agent's side of an attempt's end: its devices are free, and the broker hears how it ended.
    fn ended(
        &mut self,
        now: Millis,
        site: &SiteId,
        job: &JobId,
        attempt: u32,
        entry: usize,
        state: AttemptState,
    ) -> anyhow::Result<()> {
        if let Some(a) = self.agents.get_mut(site) {
            a.on_finished(job, attempt);
        }
        let started = self.out.schedule[entry].start_ms;
        self.step(
            now,
            Event::Status(JobStatus {
                v: WIRE_VERSION,
                job: job.clone(),
                attempt,
                site: site.clone(),
                state,
                at_ms: now,
                started_at_ms: Some(started),
                runtime_ms: Some(now - started),
                checkpoint: None,
                mark: None,
            }),
        )?;
        if let Some(run) = self
            .reactor
            .state()
            .job(job)
            .and_then(|j| j.runs.iter().find(|r| r.attempt == attempt))
        {
            self.out.schedule[entry].metered = run.amounts;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::sim::federation::SERIES_EPOCH_MS;
    use meridian_federation::{AcceleratorKind, JobKind, Resources, TenantId};

    /// A job no site of the federation can run does not keep the simulation going: it ends, and the job is
    /// reported as unplaceable with the nearest miss.
    #[test]
    fn a_job_no_site_can_run_ends_the_run_as_unplaceable() {
        let path = meridian_broker::local::workspace_root().join("configs/sim/federation.toml");
        let fed = SimFederation::load(&path).unwrap();
        let job = |key: &str, model: &str| {
            let mut r = Resources::whole(AcceleratorKind::Gpu, 1);
            r.models = vec![model.into()];
            let mut spec =
                JobSpec::new(TenantId::new("t").unwrap(), key, JobKind::Batch, r, "true");
            spec.duration_s = Some(60);
            SimJob {
                spec,
                arrival_ms: SERIES_EPOCH_MS,
                reference_ms: 60_000,
                fixed_runtime: false,
                trace_models: Vec::new(),
            }
        };
        let jobs = vec![job("ok", "A100"), job("never", "V100M32")];
        let out = run(
            &fed,
            &jobs,
            &Ranking::Policy(Policy::Cost),
            SERIES_EPOCH_MS,
            None,
        )
        .unwrap();
        assert_eq!(out.schedule.len(), 1);
        assert_eq!(out.unplaceable.len(), 1, "{:?}", out.unplaceable);
        assert_eq!(out.unplaceable[0].0, 1);
        assert!(
            out.unplaceable[0].1.contains("no site fits"),
            "{}",
            out.unplaceable[0].1
        );
    }

    /// The same with a tenancy, in the form that once kept a run from ending: a high-priority job asking for its
    /// queue's whole quota of a model no pool has is set aside as unplaceable; it does not preempt the queue's
    /// running work at every try (which then never finished).
    #[test]
    fn a_job_no_site_can_run_under_a_quota_preempts_nothing_and_the_run_ends() {
        let path = meridian_broker::local::workspace_root().join("configs/sim/federation.toml");
        let fed = SimFederation::load(&path).unwrap();
        let job = |key: &str, count: u32, model: &str, priority: &str, at_s: u64| {
            let mut r = Resources::whole(AcceleratorKind::Gpu, count);
            r.models = vec![model.into()];
            let mut spec =
                JobSpec::new(TenantId::new("t").unwrap(), key, JobKind::Batch, r, "true");
            spec.duration_s = Some(7_200);
            spec.priority = Some(priority.into());
            SimJob {
                spec,
                arrival_ms: SERIES_EPOCH_MS + at_s * 1000,
                reference_ms: 7_200_000,
                fixed_runtime: false,
                trace_models: Vec::new(),
            }
        };
        let mut jobs: Vec<SimJob> = (0..8)
            .map(|i| job(&format!("work{i}"), 1, "A100", "low", i))
            .collect();
        jobs.push(job("never", 8, "V100M32", "high", 60));
        let tenancy = r#"
default_priority = "low"
priority_classes = [{ name = "high", value = 100 }, { name = "low", value = 0 }]
[[queues]]
name = "t"
tenant = "t"
quota = { "gpu:*" = 8 }
"#;
        let out = run(
            &fed,
            &jobs,
            &Ranking::Policy(Policy::Cost),
            SERIES_EPOCH_MS,
            Some(tenancy),
        )
        .unwrap();
        assert_eq!(
            out.schedule.len(),
            8,
            "each job ran once: {:?}",
            out.schedule
        );
        assert_eq!(out.unplaceable.len(), 1, "{:?}", out.unplaceable);
    }
}
