//! Budgets and the metering report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::tenancy::{count, run_all, tenant_job, COHORT};
use super::*;
use crate::journal::MemoryJournal;
use crate::reactor::{CoreConfig, Reactor};

#[test]
fn the_report_adds_up_to_the_job_records_in_every_breakdown() {
    let mut env = TestEnv::new(trio());
    env.set_tenancy(COHORT);
    for i in 0..16 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        run_all(&mut env);
        env.advance(100);
    }
    // Team B takes back 3 GPUs: 3 of A's attempts are preempted; their ends are reported late and metered.
    for i in 0..3 {
        env.submit(tenant_job("team-b", &format!("b{i}")));
        run_all(&mut env);
    }
    let cancels: Vec<(SiteId, CancelAttempt)> = env
        .sent
        .iter()
        .filter_map(|c| match c {
            Command::Cancel { site, cancel } => Some((site.clone(), cancel.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        cancels.len(),
        3,
        "A running {}, B running {}, pending {:?}",
        count(&env, "team-a", JobPhase::Running),
        count(&env, "team-b", JobPhase::Running),
        env.reactor
            .state()
            .jobs
            .values()
            .filter(|j| j.phase == JobPhase::Pending)
            .map(|j| j.why.clone())
            .collect::<Vec<_>>()
    );
    for (site, c) in &cancels {
        env.step(Event::Status(JobStatus {
            v: 1,
            job: c.job.clone(),
            attempt: c.attempt,
            site: site.clone(),
            state: AttemptState::Cancelled {
                reason: c.reason.clone(),
            },
            at_ms: env.now,
            started_at_ms: None,
            runtime_ms: Some(600_000),
            checkpoint: None,
            mark: None,
        }));
    }
    // Everything running ends after an hour.
    env.now += 3_600_000;
    let running: Vec<(JobId, u32, SiteId)> = env
        .reactor
        .state()
        .jobs
        .values()
        .filter(|j| j.phase == JobPhase::Running)
        .map(|j| {
            (
                j.id.clone(),
                j.attempt,
                j.assignment.as_ref().unwrap().site.clone(),
            )
        })
        .collect();
    for (job, attempt, site) in running {
        env.step(Event::Status(JobStatus {
            v: 1,
            job,
            attempt,
            site,
            state: AttemptState::Succeeded { exit_code: 0 },
            at_ms: env.now,
            started_at_ms: None,
            runtime_ms: Some(3_600_000),
            checkpoint: None,
            mark: None,
        }));
    }
    run_all(&mut env);

    let r = crate::ledger::report(&entries(&env), &ReportRequest::default());
    // An independent sum over the job records.
    let (mut dev, mut cost, mut wh, mut g, mut attempts) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for j in env.reactor.state().jobs.values() {
        for run in &j.runs {
            dev += run.milli * run.runtime_ms;
            cost += run.amounts.cost_micro_usd;
            wh += run.amounts.energy_wh;
            g += run.amounts.co2_g;
            attempts += 1;
        }
    }
    assert!(cost > 0 && dev > 0);
    let t = &r.total;
    assert_eq!(
        (
            t.device_milli_ms,
            t.cost_micro_usd,
            t.energy_wh,
            t.co2_g,
            t.attempts
        ),
        (dev, cost, wh, g, attempts)
    );
    // The preempted hour-fractions are in it: 3 attempts of 10 minutes on one device each.
    let preempted: u64 = env
        .reactor
        .state()
        .jobs
        .values()
        .flat_map(|j| &j.runs)
        .filter(|r| r.runtime_ms == 600_000)
        .map(|r| r.milli * r.runtime_ms)
        .sum();
    assert_eq!(preempted, 3 * 1000 * 600_000);
    for rows in [&r.by_tenant, &r.by_site, &r.by_model] {
        let sum = |f: fn(&ReportRow) -> u64| rows.iter().map(f).sum::<u64>();
        assert_eq!(sum(|x| x.device_milli_ms), t.device_milli_ms);
        assert_eq!(sum(|x| x.cost_micro_usd), t.cost_micro_usd);
        assert_eq!(sum(|x| x.energy_wh), t.energy_wh);
        assert_eq!(sum(|x| x.co2_g), t.co2_g);
        assert_eq!(sum(|x| x.attempts), t.attempts);
        assert_eq!(sum(|x| x.wait_ms), t.wait_ms);
    }
    assert_eq!(r.by_tenant.iter().map(|x| x.jobs).sum::<u64>(), t.jobs);
    assert_eq!(
        t.jobs,
        env.reactor
            .state()
            .jobs
            .values()
            .filter(|j| !j.runs.is_empty())
            .count() as u64
    );
    // One tenant, and a window that leaves everything out.
    let only_b = crate::ledger::report(
        &entries(&env),
        &ReportRequest {
            tenant: Some(TenantId::new("team-b").unwrap()),
            ..ReportRequest::default()
        },
    );
    assert_eq!(only_b.by_tenant.len(), 1);
    assert_eq!(only_b.total.jobs, 3);
    let none = crate::ledger::report(
        &entries(&env),
        &ReportRequest {
            to_ms: Some(1),
            ..ReportRequest::default()
        },
    );
    assert_eq!(
        none.total,
        ReportRow {
            key: "total".into(),
            ..ReportRow::default()
        }
    );
}

pub(super) fn cheap_job(tenant: &str, key: &str) -> JobSpec {
    let mut spec = tenant_job(tenant, key);
    spec.policy = Some(Policy::Cost);
    spec
}

pub(super) fn budget_env(mode: &str) -> TestEnv {
    let t = format!(
        "{COHORT}\n[[budgets]]\ntenant = \"team-a\"\nperiod = \"day\"\nusd = 2.5\nwhen_exceeded = \"{mode}\"\n"
    );
    let mut env = TestEnv::new(trio());
    env.set_tenancy(&t);
    env
}

#[test]
fn a_submission_over_the_tenants_budget_is_refused_with_the_budget_named() {
    let mut env = budget_env("refuse");
    // Each job is expected to cost about 1 USD (an hour of a 1 USD/h GPU): two fit in 2.50 USD.
    env.submit(cheap_job("team-a", "a0"));
    env.submit(cheap_job("team-a", "a1"));
    run_all(&mut env);
    let err = env
        .reactor
        .step(env.now, Event::Submit(cheap_job("team-a", "a2")))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OverBudget);
    let msg = err.to_string();
    assert!(
        msg.contains("over budget: tenant team-a has 0.50 of its 2.50 USD for this day left"),
        "{msg}"
    );
    // Another tenant is not limited; a resubmission of an accepted job still answers with that job.
    env.submit(cheap_job("team-b", "b0"));
    env.submit(cheap_job("team-a", "a0"));
    // The next day the budget is whole again.
    env.now += 86_400_000;
    env.heartbeat("a-cheap");
    env.heartbeat("b-green");
    env.heartbeat("c-frankfurt");
    env.submit(cheap_job("team-a", "a3"));
}

#[test]
fn a_held_job_waits_for_the_next_budget_period_and_then_runs() {
    let mut env = budget_env("hold");
    env.submit(cheap_job("team-a", "a0"));
    env.submit(cheap_job("team-a", "a1"));
    let held = env.submit(cheap_job("team-a", "a2"));
    run_all(&mut env);
    assert_eq!(env.phase(&held), JobPhase::Pending);
    let job = &env.reactor.state().jobs[&held];
    assert!(
        job.why.contains(
            "held until the budget period ends at 1970-01-02T00:00Z: over budget: tenant team-a"
        ),
        "{}",
        job.why
    );
    assert_eq!(job.retry_at_ms, Some(86_400_000));
    // Midnight UTC: a new day, a new budget.
    env.now = 86_400_000;
    for s in ["a-cheap", "b-green", "c-frankfurt"] {
        env.heartbeat(s);
    }
    env.advance(1);
    assert_eq!(env.phase(&held), JobPhase::Offered);
}

/// Finished jobs leave the live state once archived; what they spent still counts against the budget, and
/// their idempotency keys still return them (or conflict).
#[test]
fn archived_jobs_still_count_against_the_budget_and_keep_their_keys() {
    let mut env = budget_env("refuse");
    let first = env.submit(cheap_job("team-a", "a0"));
    let offers = env.take_offers();
    env.answer(&offers[0], OfferOutcome::Accepted);
    // An hour at the cheapest site: 1 USD of the 2.5 a day.
    env.status(
        &offers[0],
        AttemptState::Succeeded { exit_code: 0 },
        3_600_000,
    );
    let spent = env.reactor.state().jobs()[&first].metered;
    assert_eq!(spent.cost_micro_usd, 1_000_000, "{spent:?}");
    let archivable: Vec<JobId> = env
        .reactor
        .archivable(env.now, 0, 10)
        .into_iter()
        .map(|j| j.id.clone())
        .collect();
    assert_eq!(archivable, vec![first.clone()]);
    env.step(Event::Archived { jobs: archivable });
    assert!(env.reactor.state().job(&first).is_none());
    // The same key and spec: the archived job, not a new one.
    match env.step(Event::Submit(cheap_job("team-a", "a0"))) {
        Response::Submitted(r) => assert_eq!((r.job, r.created), (first.clone(), false)),
        other => panic!("{other:?}"),
    }
    // The same key with another spec: a conflict naming the archived job.
    let mut other = cheap_job("team-a", "a0");
    other.duration_s = Some(7);
    let e = env.reactor.step(env.now, Event::Submit(other)).unwrap_err();
    assert!(e.to_string().contains(first.as_str()), "{e}");
    // The budget still holds what the archived job spent: a second hour-long job no longer fits.
    env.submit(cheap_job("team-a", "a1"));
    let e = env
        .reactor
        .step(env.now, Event::Submit(cheap_job("team-a", "a2")))
        .unwrap_err();
    assert!(e.to_string().contains("over budget"), "{e}");
}

fn entries(env: &TestEnv) -> Vec<crate::ledger::LedgerEntry> {
    env.reactor
        .state()
        .jobs()
        .values()
        .map(crate::ledger::LedgerEntry::of)
        .collect()
}

/// One H100 drawing 400 W at PUE 1.5 (600 W in all), its grid at `g` gCO2e/kWh, in its `generation`th advert.
fn grid_advert(g: u32, generation: u64) -> SiteAdvert {
    let mut a = site("grid", Tier::Owned, 45.0, -120.0)
        .gpus("H100", 1, 2.0)
        .carbon(g)
        .pue(1.5)
        .build();
    a.generation = generation;
    a
}

/// From format 8, an attempt's carbon is each stretch's energy at the intensity its site advertised for that
/// stretch: half an hour at 100, an hour at 500 and a quarter hour at 200 g/kWh, for 600 W, come to 360 g (the
/// intensity when it ended, the rule before, gives 210). A broker restored from a snapshot taken while it ran
/// meters the same; the log shrinks once nothing running needs its old steps.
#[test]
fn an_attempt_spanning_hours_of_different_intensity_is_charged_each_hour_at_its_own() {
    let advert = grid_advert;
    let mut env = TestEnv::new(vec![advert(100, 1)]);
    let id = env.submit(job("long", 1));
    let offer = env.take_offers().pop().expect("an offer");
    env.answer(&offer, OfferOutcome::Accepted);
    env.status(&offer, AttemptState::Running, 0);
    let started = env.now;
    env.now = started + 1_800_000;
    env.step(Event::Advert(advert(500, 2)));
    // A broker that restarts from a snapshot here meters the attempt as the live one does.
    let mut restored = Reactor::new(
        CoreConfig::default(),
        RttTable::default(),
        regions(),
        MemoryJournal::default(),
    );
    restored.restore(
        crate::durable::decode_snapshot(
            &crate::durable::encode_snapshot(&env.reactor.state().snapshot(0, 0)).unwrap(),
        )
        .unwrap(),
    );
    let end = [
        (started + 5_400_000, Event::Advert(advert(200, 3))),
        (
            started + 6_300_000,
            Event::Status(JobStatus {
                v: 1,
                job: id.clone(),
                attempt: offer.attempt,
                site: offer.site.clone(),
                state: AttemptState::Succeeded { exit_code: 0 },
                at_ms: started + 6_300_000,
                started_at_ms: None,
                runtime_ms: Some(6_300_000),
                checkpoint: None,
                mark: None,
            }),
        ),
    ];
    for (at, e) in end {
        env.now = at;
        env.step(e.clone());
        restored.step(at, e).unwrap();
    }
    let metered = env.reactor.state().jobs()[&id].metered;
    assert_eq!(metered.energy_wh, 1_050);
    assert_eq!(metered.co2_g, 30 + 300 + 30, "{metered:?}");
    assert_eq!(restored.state().jobs()[&id].metered, metered);
    assert_eq!(env.reactor.state().intensity[&offer.site].len(), 3);
    // Nothing runs there now: at its 64th step the log forgets all but the step in force.
    for g in 0..61u32 {
        env.now += 1_000;
        env.step(Event::Advert(advert(300 + g, 4 + u64::from(g))));
    }
    assert_eq!(env.reactor.state().intensity[&offer.site].len(), 1);
}

/// A journal in format 7 meters at the intensity in force when the attempt ended, as its broker did; the
/// upgrade to format 8 starts each site's log from the intensity it advertises at that moment.
#[test]
fn a_format_7_broker_meters_at_the_end_and_its_upgrade_starts_the_logs() {
    let advert = grid_advert;
    let mut env = TestEnv::new(vec![]);
    env.reactor.restore(crate::snapshot::Snapshot {
        format: 7,
        ..env.reactor.state().snapshot(0, 0)
    });
    env.step(Event::Advert(advert(100, 1)));
    assert!(env.reactor.state().intensity.is_empty());
    let offer = {
        env.submit(job("old", 1));
        env.take_offers().pop().expect("an offer")
    };
    env.answer(&offer, OfferOutcome::Accepted);
    env.status(&offer, AttemptState::Running, 0);
    env.now += 1_800_000;
    env.step(Event::Advert(advert(500, 2)));
    env.now += 1_800_000;
    env.status(&offer, AttemptState::Succeeded { exit_code: 0 }, 3_600_000);
    // 600 Wh at 500 g/kWh: the end's intensity for the whole hour.
    assert_eq!(env.reactor.state().jobs()[&offer.job].metered.co2_g, 300);
    env.step(Event::UpgradeFormat { to: 8 });
    let log = &env.reactor.state().intensity[&offer.site];
    assert_eq!(log.stretches(0, 1), [(1, 500)]);
}
