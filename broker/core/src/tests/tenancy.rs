//! Quotas, cohorts, priorities, fair share, budgets and the metering report (invariants checked after
//! every step by the test environment's sanity check).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::ledger::cheap_job;
use super::*;

pub(super) const COHORT: &str = r#"
default_priority = "experiment"
priority_classes = [
  { name = "production", value = 100 },
  { name = "experiment", value = 10 },
]
[[queues]]
name = "team-a"
tenant = "team-a"
cohort = "research"
quota = { "gpu:*" = 8 }
[[queues]]
name = "team-b"
tenant = "team-b"
cohort = "research"
quota = { "gpu:*" = 8 }
"#;

pub(super) fn tenant_job(tenant: &str, key: &str) -> JobSpec {
    let mut spec = job(key, 1);
    spec.tenant = TenantId::new(tenant).unwrap();
    spec
}

/// Submits, and accepts every offer made.
pub(super) fn run_all(env: &mut TestEnv) {
    for o in env.take_offers() {
        env.answer(&o, OfferOutcome::Accepted);
        env.status(&o, AttemptState::Running, 0);
    }
}

/// The first job still pending (by id).
pub(super) fn first_pending(env: &TestEnv) -> &crate::model::Job {
    env.reactor
        .state()
        .jobs
        .values()
        .find(|j| j.phase == JobPhase::Pending)
        .unwrap_or_else(|| panic!("no job is pending"))
}

pub(super) fn count(env: &TestEnv, tenant: &str, phase: JobPhase) -> usize {
    env.reactor
        .state()
        .jobs
        .values()
        .filter(|j| j.spec.tenant.as_str() == tenant && j.phase == phase)
        .count()
}

/// Team A submits 17 one-GPU jobs one after another: 16 run on the cohort's quota (its own 8 and B's idle 8),
/// the last waits for quota.
fn borrow_the_cohorts_quota(env: &mut TestEnv) {
    for i in 0..17 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        env.advance(10);
        run_all(env);
    }
}

#[test]
fn a_lender_reclaims_its_quota_from_the_borrower_not_from_the_borrowers_own_share() {
    let mut env = TestEnv::new(trio());
    env.set_tenancy(COHORT);
    // Team A borrows B's idle 8 GPUs: 16 run (the federation has 24 GPUs; the cohort's quota is 16).
    borrow_the_cohorts_quota(&mut env);
    assert_eq!(count(&env, "team-a", JobPhase::Running), 16);
    let waiting = first_pending(&env);
    assert!(
        waiting.why.contains("waiting for quota: queue team-a"),
        "{}",
        waiting.why
    );
    let borrowed_last: Vec<JobId> = {
        let mut running: Vec<&crate::model::Job> = env
            .reactor
            .state()
            .jobs
            .values()
            .filter(|j| j.phase == JobPhase::Running)
            .collect();
        running.sort_by_key(|j| std::cmp::Reverse(j.offered_ms));
        running.iter().take(4).map(|j| j.id.clone()).collect()
    };

    // Team B submits 4: within its own quota, so it takes 4 GPUs back from A's borrowed ones.
    for i in 0..4 {
        env.submit(tenant_job("team-b", &format!("b{i}")));
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-b", JobPhase::Running), 4);
    assert_eq!(
        count(&env, "team-a", JobPhase::Running),
        12,
        "A keeps its own 8 and 4 borrowed"
    );
    let preempted: Vec<&crate::model::Job> = env
        .reactor
        .state()
        .jobs
        .values()
        .filter(|j| j.why.starts_with("requeued: preempted by"))
        .collect();
    assert_eq!(preempted.len(), 4);
    for j in &preempted {
        assert_eq!(j.spec.tenant.as_str(), "team-a");
        assert_eq!(j.phase, JobPhase::Pending);
        assert!(
            borrowed_last.contains(&j.id),
            "{} was not among the last borrowed",
            j.id
        );
        assert!(
            j.why.contains("reclaiming gpu:* quota queue team-b lent"),
            "{}",
            j.why
        );
    }
    // Each preempted attempt is stopped at its site.
    let cancels = env
        .sent
        .iter()
        .filter(|c| matches!(c, Command::Cancel { cancel, .. } if cancel.reason.starts_with("preempted by")))
        .count();
    assert_eq!(cancels, 4);
    // B fills its quota: A is back to exactly its own 8, never below.
    for i in 4..12 {
        env.submit(tenant_job("team-b", &format!("b{i}")));
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-b", JobPhase::Running), 8);
    assert_eq!(count(&env, "team-a", JobPhase::Running), 8);
    let b_waiting = env
        .reactor
        .state()
        .jobs
        .values()
        .find(|j| j.spec.tenant.as_str() == "team-b" && j.phase == JobPhase::Pending)
        .unwrap();
    assert!(
        b_waiting
            .why
            .contains("waiting for quota: queue team-b uses 8.000 of its 8.000 gpu:*"),
        "{}",
        b_waiting.why
    );
}

#[test]
fn a_higher_priority_job_preempts_lower_priority_work_of_its_own_queue_at_quota() {
    let mut env = TestEnv::new(trio());
    let t = COHORT.replace("cohort = \"research\"\n", "");
    env.set_tenancy(&t);
    for i in 0..8 {
        let mut s = tenant_job("team-a", &format!("exp{i}"));
        s.checkpointable = i % 2 == 0;
        env.submit(s);
        env.advance(10);
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-a", JobPhase::Running), 8);
    let mut prod = tenant_job("team-a", "prod");
    prod.priority = Some("production".into());
    let id = env.submit(prod);
    run_all(&mut env);
    assert_eq!(env.phase(&id), JobPhase::Running);
    let victim = env
        .reactor
        .state()
        .jobs
        .values()
        .find(|j| j.why.contains("preempted by"))
        .unwrap();
    // Checkpointable work goes first, the most recent of it.
    assert_eq!(victim.spec.idempotency_key, "exp6");
    assert!(
        victim.why.contains("higher-priority job of queue team-a"),
        "{}",
        victim.why
    );
    // An equal-priority job only waits.
    let other = env.submit(tenant_job("team-a", "exp-late"));
    run_all(&mut env);
    assert_eq!(env.phase(&other), JobPhase::Pending);
}

/// A higher-priority job that no pool of the federation can run (a model nobody has) preempts nothing: it
/// waits as unplaceable, and the work its quota would have taken keeps running, tick after tick. (Before, it
/// preempted the queue's work at every try and never ran, so that work never finished.)
#[test]
fn a_job_no_pool_can_run_preempts_nothing_for_its_quota() {
    let mut env = TestEnv::new(trio());
    let t = COHORT.replace("cohort = \"research\"\n", "");
    env.set_tenancy(&t);
    for i in 0..8 {
        env.submit(tenant_job("team-a", &format!("exp{i}")));
        env.advance(10);
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-a", JobPhase::Running), 8);
    let mut never = job("never", 8);
    never.tenant = TenantId::new("team-a").unwrap();
    never.priority = Some("production".into());
    never.resources.models = vec![ModelName::from("Z999")];
    let id = env.submit(never);
    for _ in 0..20 {
        env.advance(5_000);
        for site in ["a-cheap", "b-green", "c-frankfurt"] {
            env.heartbeat(site);
        }
        env.step(Event::Tick);
        run_all(&mut env);
    }
    let job = &env.reactor.state().jobs[&id];
    assert_eq!(job.phase, JobPhase::Pending);
    assert!(job.unsatisfiable, "{}", job.why);
    assert!(job.why.contains("no site fits"), "{}", job.why);
    let preempted = env
        .reactor
        .state()
        .jobs
        .values()
        .filter(|j| j.attempt > 1 || j.history.iter().any(|(_, h)| h.contains("preempted")))
        .count();
    assert_eq!(preempted, 0);
    assert_eq!(count(&env, "team-a", JobPhase::Running), 8);
}

/// A lender's waiting job that no pool can run does not keep its quota from the cohort: team B's job asks for a
/// model nobody has, and team A still borrows B's idle quota. (Before, A waited "for quota" as long as B's job
/// waited — for ever — and a simulation with such a job never ended.)
#[test]
fn a_waiting_job_no_pool_can_run_keeps_no_quota_from_borrowers() {
    let mut env = TestEnv::new(trio());
    env.set_tenancy(COHORT);
    let mut never = tenant_job("team-b", "never");
    never.resources.models = vec![ModelName::from("Z999")];
    let never = env.submit(never);
    assert!(env.reactor.state().jobs[&never].unsatisfiable);
    borrow_the_cohorts_quota(&mut env);
    assert_eq!(count(&env, "team-a", JobPhase::Running), 16);
    let job = &env.reactor.state().jobs[&never];
    assert!(job.why.starts_with("no site fits"), "{}", job.why);
}

#[test]
fn borrowing_stops_at_the_borrowing_limit_and_unknown_queues_are_refused() {
    let t = COHORT.replace(
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }",
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }\nborrowing_limit = { \"gpu:*\" = 2 }",
    );
    let tenancy = crate::quota::Tenancy::from_toml(&t).unwrap();
    assert_eq!(tenancy.queues["team-a"].borrowing_limit["gpu:*"], 2000);
    let mut env = TestEnv::new(trio());
    env.set_tenancy(&t);
    for i in 0..11 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        run_all(&mut env);
    }
    assert_eq!(count(&env, "team-a", JobPhase::Running), 10);
    let waiting = first_pending(&env);
    assert!(
        waiting.why.contains("over its borrowing limit of 2.000"),
        "{}",
        waiting.why
    );

    let mut stray = tenant_job("team-c", "c0");
    let err = env
        .reactor
        .step(env.now, Event::Submit(stray.clone()))
        .unwrap_err();
    assert_eq!(err.field().as_deref(), Some("queue"), "{err}");
    stray.tenant = TenantId::new("team-a").unwrap();
    stray.queue = Some("team-b".into());
    let err = env
        .reactor
        .step(env.now, Event::Submit(stray.clone()))
        .unwrap_err();
    assert!(
        err.to_string().contains("belongs to tenant team-b"),
        "{err}"
    );
    stray.queue = None;
    stray.priority = Some("urgent".into());
    let err = env.reactor.step(env.now, Event::Submit(stray)).unwrap_err();
    assert_eq!(err.field().as_deref(), Some("priority"), "{err}");
}

#[test]
fn tenancy_files_with_mistakes_are_refused_with_the_queue_named() {
    for (text, want) in [
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nquota = { \"gpu\" = 1 }",
            "queue \"q\": class \"gpu\"",
        ),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nquota = { \"tpu:*\" = 1 }",
            "kind must be",
        ),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nquota = { \"gpu:*\" = -1 }",
            "not a number of devices",
        ),
        ("default_priority = \"x\"", "default_priority \"x\""),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\n[[queues]]\nname = \"q\"\ntenant = \"t\"",
            "defined twice",
        ),
        (
            "[[queues]]\nname = \"q\"\ntenant = \"t\"\nspeed = 1",
            "unknown field",
        ),
    ] {
        let err = crate::quota::Tenancy::from_toml(text).unwrap_err();
        assert!(err.to_string().contains(want), "{text}: {err}");
    }
}

#[test]
fn a_gang_is_admitted_whole_or_not_at_all() {
    // Two sites of 4 GPUs each, 3 of them busy at each: 2 free in all, never 4 at one site.
    let mut env = TestEnv::new(vec![
        site("x", Tier::Owned, 39.0, -77.5)
            .gpus("A100", 4, 1.0)
            .used(0, 1000)
            .used(1, 1000)
            .used(2, 1000)
            .build(),
        site("y", Tier::Owned, 45.6, -121.2)
            .gpus("A100", 4, 1.0)
            .used(0, 1000)
            .used(1, 1000)
            .used(2, 1000)
            .build(),
    ]);
    let mut gang = tenant_job("team-a", "gang");
    gang.replicas = 2;
    gang.resources = Resources::whole(AcceleratorKind::Gpu, 1);
    let id = env.submit(gang.clone());
    assert!(env.take_offers().is_empty(), "no replica may start alone");
    assert_eq!(env.phase(&id), JobPhase::Pending);
    let why = &env.reactor.state().jobs[&id].why;
    assert!(
        why.starts_with("gang of 2 replicas, admitted only all together at one site"),
        "{why}"
    );
    // Site y frees up: both replicas go there together, in one offer.
    let mut freed = site("y", Tier::Owned, 45.6, -121.2)
        .gpus("A100", 4, 1.0)
        .used(0, 1000)
        .build();
    freed.generation += 1;
    env.step(Event::Advert(freed));
    let offers = env.take_offers();
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].devices.len(), 2);
    // Quota counts every replica: a queue of 3 GPUs never admits a 4-replica gang, not even in part.
    let t = COHORT.replace(
        "cohort = \"research\"\nquota = { \"gpu:*\" = 8 }",
        "quota = { \"gpu:*\" = 3 }",
    );
    let mut env = TestEnv::new(trio());
    env.set_tenancy(&t);
    gang.replicas = 4;
    gang.idempotency_key = "gang4".into();
    let id = env.submit(gang);
    assert!(env.take_offers().is_empty());
    let why = &env.reactor.state().jobs[&id].why;
    assert!(
        why.contains("waiting for quota: queue team-a uses 0.000 of its 3.000 gpu:*"),
        "{why}"
    );
}

#[test]
fn the_queue_with_the_smaller_dominant_share_goes_first() {
    let t = COHORT.replace("cohort = \"research\"\n", "");
    let mut env = TestEnv::new(vec![site("x", Tier::Owned, 39.0, -77.5)
        .gpus("A100", 2, 1.0)
        .build()]);
    env.set_tenancy(&t);
    env.submit(tenant_job("team-a", "a0"));
    env.submit(tenant_job("team-b", "b0"));
    let offers = env.take_offers();
    for o in &offers {
        env.answer(o, OfferOutcome::Accepted);
        env.status(o, AttemptState::Running, 0);
    }
    let a1 = env.submit(tenant_job("team-a", "a1"));
    let b1 = env.submit(tenant_job("team-b", "b1"));
    // B's job ends after 10 minutes; A's keeps running for two hours.
    env.now += 600_000;
    let b0 = offers
        .iter()
        .find(|o| o.spec.idempotency_key == "b0")
        .unwrap();
    env.status(b0, AttemptState::Succeeded { exit_code: 0 }, 600_000);
    env.now += 6_600_000;
    env.heartbeat("x");
    env.advance(10);
    // One device is free: B's job gets it although A's waited longer.
    assert_eq!(env.phase(&b1), JobPhase::Offered);
    assert_eq!(env.phase(&a1), JobPhase::Pending);
}

/// A job placed by cost: an hour of a 1 USD/h GPU at site a-cheap.
#[test]
fn a_tenancy_change_is_journaled_and_survives_replay_and_snapshots() {
    let mut env = TestEnv::new(trio());
    let small = COHORT
        .replace("cohort = \"research\"\n", "")
        .replace("quota = { \"gpu:*\" = 8 }", "quota = { \"gpu:*\" = 1 }");
    env.step(Event::SetTenancy {
        toml: small.clone(),
        from_file: true,
    });
    env.submit(tenant_job("team-a", "a0"));
    let a1 = env.submit(tenant_job("team-a", "a1"));
    run_all(&mut env);
    assert_eq!(env.phase(&a1), JobPhase::Pending);
    // A bad file is refused with the problem, and changes nothing.
    let err = env
        .reactor
        .step(
            env.now,
            Event::SetTenancy {
                toml: "[[queues]]\nname = 1".into(),
                from_file: false,
            },
        )
        .unwrap_err();
    assert_eq!(err.field().as_deref(), Some("tenancy"), "{err}");
    // Raising the quota lets the waiting job run.
    env.step(Event::SetTenancy {
        toml: COHORT.into(),
        from_file: false,
    });
    run_all(&mut env);
    assert_eq!(env.phase(&a1), JobPhase::Running);
    // A replay, and a snapshot, carry the tenancy in force.
    let records = env.reactor.journal().records.clone();
    let fresh = || {
        crate::reactor::Reactor::new(
            env.reactor.config().clone(),
            RttTable::default(),
            regions(),
            crate::journal::MemoryJournal::default(),
        )
    };
    let mut again = fresh();
    again.replay(&records);
    assert_eq!(again.tenancy(), env.reactor.tenancy());
    assert_eq!(again.state().jobs, env.reactor.state().jobs);
    let mut restored = fresh();
    restored.restore(env.reactor.state().snapshot(0, 0));
    assert_eq!(restored.tenancy(), env.reactor.tenancy());
    assert_eq!(restored.state().tenancy_toml.as_deref(), Some(COHORT));
    assert_eq!(
        restored.state().tenancy_file_toml.as_deref(),
        Some(small.as_str())
    );
}

#[test]
fn a_queue_capped_at_a_site_goes_elsewhere_and_the_explanation_says_why() {
    let t = COHORT.replace(
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }",
        "name = \"team-a\"\ntenant = \"team-a\"\ncohort = \"research\"\nquota = { \"gpu:*\" = 8 }\nsite_caps = { a-cheap = { \"gpu:A100\" = 2 } }",
    );
    let mut env = TestEnv::new(trio());
    env.set_tenancy(&t);
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(env.submit(cheap_job("team-a", &format!("a{i}"))));
        run_all(&mut env);
    }
    let sites: Vec<String> = ids
        .iter()
        .map(|id| {
            env.reactor.state().jobs[id]
                .assignment
                .as_ref()
                .unwrap()
                .site
                .to_string()
        })
        .collect();
    assert_eq!(
        sites.iter().filter(|s| *s == "a-cheap").count(),
        2,
        "{sites:?}"
    );
    let third = env.reactor.state().jobs[&ids[2]].decision.as_ref().unwrap();
    let capped = third
        .candidates
        .iter()
        .find(|c| c.site.as_str() == "a-cheap")
        .and_then(|c| c.reject.as_ref())
        .map(ToString::to_string);
    assert_eq!(
        capped.as_deref(),
        Some("the job's queue is at its quota cap at this site")
    );
    let err = crate::quota::Tenancy::from_toml(
        "[[queues]]\nname = \"q\"\ntenant = \"t\"\nsite_caps = { \"bad site\" = { \"gpu:*\" = 1 } }",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("site_caps: site \"bad site\""),
        "{err}"
    );
}

/// An administrator removes a queue that has waiting jobs: its jobs wait for a queue instead of running
/// outside quota, fair ordering (a sort) stays a total order with jobs of several queues waiting, and the
/// explanation says why.
#[test]
fn jobs_of_a_removed_queue_wait_for_a_queue_and_ordering_survives_it() {
    let three = format!(
        "{COHORT}[[queues]]\nname = \"team-c\"\ntenant = \"team-c\"\nquota = {{ \"gpu:*\" = 1 }}\n"
    );
    let mut env = TestEnv::new(trio());
    env.set_tenancy(&three);
    // Queue team-c holds its one GPU; more of its jobs wait for quota, among waiting jobs of other queues.
    for i in 0..4 {
        env.submit(tenant_job("team-c", &format!("c{i}")));
    }
    for i in 0..20 {
        env.submit(tenant_job("team-a", &format!("a{i}")));
        env.submit(tenant_job("team-b", &format!("b{i}")));
    }
    run_all(&mut env);
    assert_eq!(count(&env, "team-c", JobPhase::Running), 1);
    assert_eq!(count(&env, "team-c", JobPhase::Pending), 3);
    // team-c's queue goes away; capacity frees and waiting jobs are tried in fair order.
    env.set_tenancy(COHORT);
    let offers: Vec<Offer> = env.take_offers();
    for o in &offers {
        env.answer(o, OfferOutcome::Accepted);
    }
    env.advance(1_000);
    let running: Vec<JobId> = env
        .reactor
        .state()
        .jobs()
        .values()
        .filter(|j| j.phase == JobPhase::Running && j.spec.tenant.as_str() == "team-c")
        .map(|j| j.id.clone())
        .collect();
    let id = running[0].clone();
    let attempt = env.reactor.state().jobs()[&id].attempt;
    let site = env.reactor.state().jobs()[&id]
        .assignment
        .as_ref()
        .unwrap()
        .site
        .clone();
    env.step(Event::Status(JobStatus {
        v: 1,
        job: id,
        attempt,
        site,
        state: AttemptState::Succeeded { exit_code: 0 },
        at_ms: env.now,
        started_at_ms: None,
        runtime_ms: Some(1_000),
        checkpoint: None,
        mark: None,
    }));
    env.advance(1_000);
    assert_eq!(count(&env, "team-c", JobPhase::Running), 0);
    assert_eq!(count(&env, "team-c", JobPhase::Pending), 3);
    let waiting = env
        .reactor
        .state()
        .jobs()
        .values()
        .find(|j| j.phase == JobPhase::Pending && j.spec.tenant.as_str() == "team-c")
        .unwrap();
    assert!(waiting.why.contains("waits for a queue"), "{}", waiting.why);
}

/// A waiting job says why it waited at its last try (the views' `wait_reason`, the metrics' pending reasons):
/// quota, then capacity once the quota is gone; a restored state, which has not tried it yet, says `not_tried`.
#[test]
fn a_waiting_job_says_why_it_waited_at_its_last_try() {
    let mut env = TestEnv::new(trio());
    env.set_tenancy(COHORT);
    borrow_the_cohorts_quota(&mut env);
    let reason = |env: &TestEnv| crate::observe::wait_reason(first_pending(env));
    assert_eq!(reason(&env), "quota");
    let view = crate::views::job_view(
        first_pending(&env),
        env.reactor.state().sites(),
        env.reactor.rtt(),
    );
    assert_eq!(view.wait_reason.as_deref(), Some("quota"));
    // With quota to spare, the federation's 24 GPUs are what it waits for.
    env.set_tenancy(
        "[[queues]]\nname = \"team-a\"\ntenant = \"team-a\"\nquota = { \"gpu:*\" = 100 }\n",
    );
    for i in 0..8 {
        env.submit(tenant_job("team-a", &format!("b{i}")));
        env.advance(10);
        run_all(&mut env);
    }
    env.advance(10);
    assert_eq!(reason(&env), "capacity");
    // Soft state: a broker restored from a snapshot has not tried the job yet.
    let json = serde_json::to_vec(&env.reactor.state().snapshot(0, env.now)).unwrap();
    let snap: crate::snapshot::Snapshot = serde_json::from_slice(&json).unwrap();
    let mut restored = crate::reactor::Reactor::new(
        env.reactor.config().clone(),
        env.reactor.rtt().clone(),
        Default::default(),
        crate::journal::MemoryJournal::default(),
    );
    restored.restore(snap);
    let job = restored
        .state()
        .jobs()
        .values()
        .find(|j| j.phase == JobPhase::Pending)
        .unwrap();
    assert_eq!(crate::observe::wait_reason(job), "not_tried");
}

/// A model is named in any case: a job asking for `h100` is charged to the class its queue's quota names
/// (`gpu:H100`) for its demand as for its usage on the `H100` pool. Team A borrows B's idle H100 quota; B's
/// job asking for `h100` takes its share back, as one asking for `H100` does.
#[test]
fn a_quota_class_holds_whatever_case_a_job_names_its_model_in() {
    for b_model in ["H100", "h100"] {
        let mut env = TestEnv::new(trio());
        env.set_tenancy(
            r#"
[[queues]]
name = "team-a"
tenant = "team-a"
cohort = "research"
quota = { "gpu:*" = 8, "gpu:H100" = 4 }
[[queues]]
name = "team-b"
tenant = "team-b"
cohort = "research"
quota = { "gpu:*" = 8, "gpu:H100" = 4 }
"#,
        );
        let h100 = |tenant: &str, key: &str, model: &str| {
            let mut spec = tenant_job(tenant, key);
            spec.resources.models = vec![ModelName::from(model)];
            spec
        };
        for i in 0..8 {
            env.submit(h100("team-a", &format!("a{i}"), "h100"));
            env.advance(10);
            run_all(&mut env);
        }
        assert_eq!(
            count(&env, "team-a", JobPhase::Running),
            8,
            "A borrows B's 4 H100s"
        );
        env.submit(h100("team-b", "b0", b_model));
        env.advance(10);
        run_all(&mut env);
        assert_eq!(
            count(&env, "team-b", JobPhase::Running),
            1,
            "B asking for {b_model:?} takes back one of its lent H100s"
        );
        assert_eq!(count(&env, "team-a", JobPhase::Running), 7);
    }
}
