//! Journals and snapshots written by earlier releases still replay. Each `fixtures/format-N/` holds what a
//! broker of format N wrote (the journal stream's messages, one per line, and a snapshot from the same run),
//! the answer that broker gave to `meridian jobs --output json` at the end, and the throughput table it ran
//! with. Fixtures are never regenerated: a new format adds a folder (written from a real run by
//! `e2e/tests/format_fixture.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_core::access::Verb;
use meridian_core::durable::{self, Batch};
use meridian_core::journal::MemoryJournal;
use meridian_core::latency::RttTable;
use meridian_core::reactor::{CoreConfig, Reactor, SPOT_FORMAT};
use meridian_core::regions::Regions;
use meridian_core::throughput::Throughput;
use meridian_core::views;
use meridian_federation::JobView;
use std::path::PathBuf;

fn fixture(format: u32, name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("format-{format}"))
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn reactor(format: u32) -> Reactor<MemoryJournal> {
    let throughput = Throughput::from_toml(&fixture(format, "throughput.toml")).unwrap();
    Reactor::new(
        CoreConfig::default(),
        RttTable::default(),
        Regions::default(),
        MemoryJournal::default(),
    )
    .with_throughput(throughput)
}

/// The journal's batches, by stream sequence (from 1).
fn batches(format: u32) -> Vec<Batch> {
    fixture(format, "journal.jsonl")
        .lines()
        .enumerate()
        .map(|(i, line)| {
            durable::decode_batch(line.as_bytes())
                .unwrap_or_else(|e| panic!("journal message {}: {e}", i + 1))
        })
        .collect()
}

fn job_views(r: &Reactor<MemoryJournal>) -> Vec<JobView> {
    r.state()
        .jobs()
        .values()
        .map(|j| views::job_view(j, r.state().sites(), r.rtt()))
        .collect()
}

/// Format 1 journaled the clock's ticks and let replay judge site loss and offer timeouts again, from
/// liveness that is not journaled; so its replay need not retrace the live run for jobs whose sites were lost
/// or whose offers were pending (the reason format 2 journals those decisions). What the journal decided by
/// itself replays exactly: every job, its spec, and how each finished job ended and what it was metered.
#[test]
fn a_format_1_journal_replays_every_job_and_every_finished_job_as_its_broker_reported() {
    let batches = batches(1);
    assert!(batches.iter().all(|b| b.format == 1));
    let mut r = reactor(1);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(1, "jobs.json")).unwrap();
    assert_eq!(want.len(), 21);
    let got = job_views(&r);
    assert_eq!(got.len(), want.len());
    let mut finished = 0;
    for (g, w) in got.iter().zip(&want) {
        let key = |v: &JobView| {
            (
                v.job.clone(),
                v.tenant.clone(),
                v.name.clone(),
                v.kind,
                v.submitted_at_ms,
            )
        };
        assert_eq!(key(g), key(w));
        if w.phase.is_terminal() {
            finished += 1;
            let end = |v: &JobView| {
                (
                    v.phase,
                    v.exit_code,
                    v.metered,
                    v.runtime_ms,
                    v.site.clone(),
                    v.attempt,
                )
            };
            assert_eq!(end(g), end(w), "{}", w.job);
        }
    }
    assert_eq!(finished, 19);
}

/// A format 1 snapshot reads, restores to a sane state, and takes the batches after it.
#[test]
fn a_format_1_snapshot_restores_and_takes_the_batches_after_it() {
    let batches = batches(1);
    let snap = durable::decode_snapshot(fixture(1, "snapshot.json").as_bytes()).unwrap();
    assert_eq!(snap.format, 1);
    assert_eq!(snap.jobs.len(), 17);
    let after: Vec<Batch> = batches
        .iter()
        .skip(snap.journal_seq as usize)
        .cloned()
        .collect();
    assert!(
        !after.is_empty(),
        "the fixture has batches after its snapshot"
    );
    let mut from_snapshot = reactor(1);
    from_snapshot.restore(snap);
    from_snapshot.sanity_check().unwrap();
    from_snapshot.replay_batches(&after);
    from_snapshot.sanity_check().unwrap();
    assert_eq!(from_snapshot.state().jobs().len(), 21);
}

/// From format 2 every decision made from liveness is journaled: a replay is the live run. The journal
/// replays to exactly what its broker answered for its live jobs (after a kill -9 and a restart of that
/// broker), and its snapshot plus the batches after it to exactly the same state as the whole journal.
#[test]
fn a_format_2_journal_replays_to_exactly_what_its_broker_reported() {
    let batches = batches(2);
    assert!(batches.iter().all(|b| b.format == 2));
    let mut r = reactor(2);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(2, "jobs.json")).unwrap();
    assert_eq!(want.len(), 2);
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
    // The rest left for the archive.
    assert_eq!(r.state().jobs().len(), 2);
    assert!(r.state().format() == 2);
}

#[test]
fn a_format_2_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(2);
}

/// Format 3 adds API token records (hashes only) and site revocation. Its journal, from a run with a token
/// created and revoked, a site revoked and let back in, a kill -9 of the broker and a restart, replays to exactly
/// what its broker reported, and keeps the token (revoked) and the site (let back in).
#[test]
fn a_format_3_journal_replays_to_exactly_what_its_broker_reported_with_its_tokens_and_sites() {
    let batches = batches(3);
    assert!(batches.iter().all(|b| b.format == 3));
    let mut r = reactor(3);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(3, "jobs.json")).unwrap();
    assert_eq!(want.len(), 6);
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
    let tokens: Vec<_> = r.state().tokens().values().collect();
    assert_eq!(tokens.len(), 1);
    assert!(tokens[0].revoked_ms.is_some(), "{:?}", tokens[0]);
    assert!(
        r.state().revoked_sites().is_empty(),
        "site-b was let back in"
    );
    let journal = fixture(3, "journal.jsonl");
    assert!(journal.contains("site_revoked") && journal.contains("site_restored"));
}

#[test]
fn a_format_3_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(3);
}

/// Format 4 adds the carbon-price and cost-premium policies, memory per model, and `balanced` at the knee. Its
/// journal (the format 3 run plus unpinned jobs under those policies) replays to exactly what its broker reported.
#[test]
fn a_format_4_journal_replays_to_exactly_what_its_broker_reported_with_its_policies() {
    let batches = batches(4);
    assert!(batches.iter().all(|b| b.format == 4));
    let mut r = reactor(4);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(4, "jobs.json")).unwrap();
    assert_eq!(want.len(), 9);
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
    let journal = fixture(4, "journal.jsonl");
    assert!(journal.contains("carbon_price_usd_per_t") && journal.contains("max_cost_premium"));
}

#[test]
fn a_format_4_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(4);
}

/// Format 5 adds services: deployed and deleted as journaled events, their replicas submitted and cancelled by the
/// autoscaler as ordinary jobs. Its journal (the format 4 run plus a service with a running replica and one
/// deployed and deleted) replays to exactly what its broker reported, with the one service left.
#[test]
fn a_format_5_journal_replays_to_exactly_what_its_broker_reported_with_its_services() {
    let batches = batches(5);
    assert!(batches.iter().all(|b| b.format == 5));
    let mut r = reactor(5);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(5, "jobs.json")).unwrap();
    assert_eq!(want.len(), 13);
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
    let services: Vec<String> = r
        .state()
        .services()
        .keys()
        .map(|(t, n)| format!("{t}/{n}"))
        .collect();
    assert_eq!(services, ["e2e/chat"]);
    let journal = fixture(5, "journal.jsonl");
    assert!(journal.contains("service_deployed") && journal.contains("service_deleted"));
}

#[test]
fn a_format_5_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(5);
}

/// Format 6 adds spot capacity — jobs that run on it (a service's replicas the autoscaler put there), metered at
/// the spot price, and pools' spot prices in snapshots — and gateway tokens. Its journal (the format 5 run plus a
/// service that allows spot, its replica on spot, and a gateway token) replays to exactly what its broker
/// reported.
#[test]
fn a_format_6_journal_replays_to_exactly_what_its_broker_reported_with_spot_replicas() {
    let batches = batches(6);
    assert!(batches.iter().all(|b| b.format == 6));
    let mut r = reactor(6);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(6, "jobs.json")).unwrap();
    assert_eq!(want.len(), 14);
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
    let on_spot: Vec<_> = r
        .state()
        .active_jobs()
        .filter(|j| j.spec.spot)
        .map(|j| j.spec.service.clone())
        .collect();
    assert_eq!(on_spot.len(), 1, "{on_spot:?}");
    assert_eq!(on_spot[0].as_ref().map(|s| s.as_str()), Some("spot"));
    let snapshot = fixture(6, "snapshot.json");
    assert!(snapshot.contains("\"spot_price_micro_usd_per_hour\":400000"));
    let gateways: Vec<_> = r
        .state()
        .tokens()
        .values()
        .filter(|t| t.grants.iter().any(|g| g.verb == Verb::Gateway))
        .map(|t| t.grants.clone())
        .collect();
    assert_eq!(gateways.len(), 1, "{gateways:?}");
    assert_eq!(gateways[0][0].services, ["chat"]);
}

#[test]
fn a_format_6_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(6);
}

/// Format 7 changes a rule, not a record: `max_cost_premium` spends its premium by the knee, as `balanced` does.
/// Its journal (the format 6 run, a job under each policy included) replays to exactly what its broker reported.
#[test]
fn a_format_7_journal_replays_to_exactly_what_its_broker_reported_with_the_premium_knee() {
    let batches = batches(7);
    assert!(batches.iter().all(|b| b.format == 7));
    assert!(fixture(7, "journal.jsonl").contains("max_cost_premium"));
    let mut r = reactor(7);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(7, "jobs.json")).unwrap();
    assert_eq!(want.len(), 14);
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
}

#[test]
fn a_format_7_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(7);
}

/// Its journal (the format 7 run, and a 3-GPU job on site-b whose grid feed went from 300 to 3,000 gCO2e/kWh
/// half way through its run) replays to exactly what its broker reported: that job metered at each intensity
/// for the time it held (5 g for 3 Wh; the intensity at its end would give 10).
#[test]
fn a_format_8_journal_replays_to_exactly_what_its_broker_reported_with_carbon_over_the_run() {
    let batches = batches(8);
    assert!(batches.iter().all(|b| b.format == 8));
    let mut r = reactor(8);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(8, "jobs.json")).unwrap();
    assert_eq!(want.len(), 15);
    let across = want
        .iter()
        .find(|j| j.name.as_deref() == Some("across"))
        .expect("the job that ran across the change");
    assert_eq!((across.metered.energy_wh, across.metered.co2_g), (3, 5));
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
}

#[test]
fn a_format_8_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(8);
}

/// Its journal (the format 8 run, with a third site as cheap as site-a on a cleaner grid and a job under a
/// carbon price of 0) replays to exactly what its broker reported: that job placed as `cost` places it, on the
/// cleaner of the two cheapest sites (format 8 took the first of them in site order, site-a).
#[test]
fn a_format_9_journal_replays_to_exactly_what_its_broker_reported_with_a_zero_price_as_cost() {
    let batches = batches(9);
    assert!(batches.iter().all(|b| b.format == 9));
    let mut r = reactor(9);
    r.replay_batches(&batches);
    r.sanity_check().unwrap();
    let want: Vec<JobView> = serde_json::from_str(&fixture(9, "jobs.json")).unwrap();
    let zero = want
        .iter()
        .find(|j| j.name.as_deref() == Some("zero-priced"))
        .expect("the job under a carbon price of 0");
    assert_eq!(zero.site.as_ref().map(|s| s.as_str()), Some("site-c"));
    same(
        &serde_json::to_value(job_views(&r)).unwrap(),
        &serde_json::to_value(&want).unwrap(),
        "",
    );
}

#[test]
fn a_format_9_snapshot_plus_the_batches_after_it_is_the_whole_journal() {
    snapshot_plus_the_batches_after_it_is_the_whole_journal(9);
}

/// From format 2: the snapshot, restored, plus the batches after it is exactly the state of the whole journal.
fn snapshot_plus_the_batches_after_it_is_the_whole_journal(format: u32) {
    let batches = batches(format);
    let snap = durable::decode_snapshot(fixture(format, "snapshot.json").as_bytes()).unwrap();
    assert_eq!(snap.format, format);
    let after: Vec<Batch> = batches
        .iter()
        .skip(snap.journal_seq as usize)
        .cloned()
        .collect();
    assert!(
        !after.is_empty(),
        "the fixture has batches after its snapshot"
    );
    let mut from_snapshot = reactor(format);
    from_snapshot.restore(snap);
    from_snapshot.replay_batches(&after);
    from_snapshot.sanity_check().unwrap();
    let mut whole = reactor(format);
    whole.replay_batches(&batches);
    let mut whole = durable_state(&whole);
    if format < SPOT_FORMAT {
        // Snapshots before spot hold no spot prices: a restored broker takes them from each site's next advert
        // (`a_site_restored_without_its_spot_prices_takes_them_from_its_next_advert`).
        forget_spot_prices(&mut whole);
    }
    same(&durable_state(&from_snapshot), &whole, "");
}

fn forget_spot_prices(state: &mut serde_json::Value) {
    for site in state["sites"].as_array_mut().into_iter().flatten() {
        for pool in site["pools"].as_array_mut().into_iter().flatten() {
            if let Some(p) = pool.as_object_mut() {
                p.remove("spot_price_micro_usd_per_hour");
            }
        }
    }
}

/// Broker state as JSON, without liveness (soft state: when each site was last heard from).
fn durable_state(r: &Reactor<MemoryJournal>) -> serde_json::Value {
    let mut v = serde_json::to_value(r.state().snapshot(0, 0)).unwrap();
    if let Some(sites) = v["sites"].as_array_mut() {
        for s in sites {
            s["last_seen_ms"] = serde_json::Value::Null;
        }
    }
    v
}

/// Asserts two JSON values are equal, naming the first path where they differ (the values are large).
fn same(got: &serde_json::Value, want: &serde_json::Value, path: &str) {
    use serde_json::Value;
    match (got, want) {
        // Every field the fixture's broker reported; a view field added since (unknown to it) is not compared.
        (Value::Object(a), Value::Object(b)) => {
            for k in b.keys() {
                same(
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                );
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}: lengths differ");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                same(x, y, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(got, want, "{path} differs"),
    }
}
