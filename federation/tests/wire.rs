//! Round trips of every message type and rejection of each kind of bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_federation::*;
use serde_json::{json, Value};

fn job_json() -> Value {
    json!({
        "v": 1,
        "tenant": "team-a",
        "idempotency_key": "k-1",
        "kind": "training",
        "resources": {"kind": "gpu", "count": 2, "models": ["A100"]},
        "duration_s": 3600,
        "users": [{"location": {"lat": 50.1, "lon": 8.7}, "weight": 2.0}],
        "datasets": [{"name": "imagenet", "size_bytes": 1000, "locality": "prefer"}],
        "policy": "green",
        "run": {"command": "echo hi"}
    })
}

fn advert_json() -> Value {
    json!({
        "v": 1,
        "site": {
            "id": "dc-a", "kind": "datacenter", "tier": "owned",
            "location": {"lat": 39.0, "lon": -77.5}, "pue": 1.3,
            "carbon": {"g_per_kwh": 363, "forecast_start_ms": 0, "forecast": [300, 310]},
            "egress_micro_usd_per_gb": 90000,
            "datasets": [{"name": "imagenet", "size_bytes": 150000000000u64}]
        },
        "pools": [{
            "name": "a100", "kind": "gpu", "vendor": "nvidia", "model": "A100", "memory_mib": 81920,
            "count": 2, "power_watts": 400, "price_micro_usd_per_hour": 1290000,
            "devices": [{"index": 0, "healthy": true, "used_milli": 0},
                        {"index": 1, "healthy": true, "used_milli": 500}]
        }],
        "generation": 7,
        "sent_at_ms": 1
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("json")
}

fn round_trip<T>(value: &T)
where
    T: serde::Serialize
        + serde::de::DeserializeOwned
        + validate::Validate
        + PartialEq
        + std::fmt::Debug,
{
    let encoded = encode(value).expect("encode");
    let decoded: T = decode(&encoded).expect("decode");
    assert_eq!(&decoded, value);
}

#[test]
fn every_message_round_trips() {
    let spec: JobSpec = decode(&bytes(&job_json())).expect("job");
    let advert: SiteAdvert = decode(&bytes(&advert_json())).expect("advert");
    assert_eq!(advert.pools[0].free_milli(), 1500);
    round_trip(&spec);
    round_trip(&advert);
    let job = JobId::new("j-1").expect("id");
    let site = SiteId::new("dc-a").expect("id");
    round_trip(&Heartbeat {
        v: 1,
        site: site.clone(),
        seq: 3,
        sent_at_ms: 9,
        generation: 7,
        running: vec![AttemptRef {
            job: job.clone(),
            attempt: 2,
        }],
        inventory: Some(Inventory {
            mark: InventoryMark { epoch: 2, seq: 9 },
            count: 1,
            digest: inventory_digest(&[AttemptRef {
                job: job.clone(),
                attempt: 2,
            }]),
            attempts: Some(vec![AttemptRef {
                job: job.clone(),
                attempt: 2,
            }]),
        }),
    });
    round_trip(&Offer {
        v: 1,
        job: job.clone(),
        attempt: 1,
        site: site.clone(),
        pool: "a100".into(),
        devices: vec![DeviceShare {
            index: 1,
            milli: 500,
        }],
        spec: spec.clone(),
        resume_from: Some("s3://ckpt/1".into()),
    });
    for outcome in [
        OfferOutcome::Accepted,
        OfferOutcome::Rejected {
            reason: "full".into(),
        },
    ] {
        round_trip(&OfferReply {
            v: 1,
            job: job.clone(),
            attempt: 1,
            outcome,
            mark: Some(InventoryMark { epoch: 1, seq: 4 }),
        });
    }
    round_trip(&CancelAttempt {
        v: 1,
        job: job.clone(),
        attempt: 1,
        reason: "user".into(),
    });
    for state in [
        AttemptState::Running,
        AttemptState::Succeeded { exit_code: 0 },
        AttemptState::Failed {
            exit_code: Some(3),
            reason: "exit 3".into(),
        },
        AttemptState::Cancelled {
            reason: "user".into(),
        },
        AttemptState::Interrupted {
            reason: "agent restarted".into(),
        },
    ] {
        round_trip(&JobStatus {
            v: 1,
            job: job.clone(),
            attempt: 1,
            site: site.clone(),
            state,
            at_ms: 5,
            started_at_ms: Some(4),
            runtime_ms: Some(1),
            checkpoint: None,
            mark: None,
        });
    }
    round_trip(&StatusAck {
        v: 1,
        job: job.clone(),
        attempt: 1,
    });
    round_trip(&LogsRequest {
        v: 1,
        job: job.clone(),
        attempt: 1,
        lines: 10,
    });
    round_trip(&LogsReply {
        v: 1,
        job: job.clone(),
        attempt: 1,
        site,
        text: "x".into(),
    });
    round_trip(&JobRef { v: 1, job });
    round_trip(&BrokerHello {
        v: 1,
        sent_at_ms: 1,
    });
    round_trip(&ApiReply::ok(SubmitReply {
        job: JobId::new("j-2").expect("id"),
        created: true,
    }));
    round_trip(&ApiReply::<SubmitReply>::err(ErrorBody::new(
        ErrorCode::Invalid,
        Some("x".into()),
        "bad",
    )));
}

fn job_error(edit: impl FnOnce(&mut Value)) -> WireError {
    let mut v = job_json();
    edit(&mut v);
    decode::<JobSpec>(&bytes(&v)).expect_err("must be rejected")
}

fn advert_error(edit: impl FnOnce(&mut Value)) -> WireError {
    let mut v = advert_json();
    edit(&mut v);
    decode::<SiteAdvert>(&bytes(&v)).expect_err("must be rejected")
}

#[test]
fn malformed_json_is_rejected_with_position() {
    let err = decode::<JobSpec>(b"{\"v\": 1, \"tenant\": ").expect_err("truncated");
    assert_eq!(err.code(), ErrorCode::Malformed);
    assert!(err.to_string().contains("EOF"), "{err}");
    let err = decode::<JobSpec>(b"not json").expect_err("garbage");
    assert_eq!(err.code(), ErrorCode::Malformed);
}

#[test]
fn negative_count_names_the_field() {
    let err = job_error(|v| v["resources"]["count"] = json!(-1));
    assert_eq!(err.field(), Some("resources.count"));
    assert!(err.to_string().contains("-1"), "{err}");
}

#[test]
fn unknown_accelerator_kind_lists_the_known_ones() {
    let err = job_error(|v| v["resources"]["kind"] = json!("tpu"));
    assert_eq!(err.field(), Some("resources.kind"));
    assert!(err.to_string().contains("unknown variant `tpu`"), "{err}");
    assert!(err.to_string().contains("gpu"), "{err}");
}

#[test]
fn latitude_out_of_range_is_invalid() {
    let err = job_error(|v| v["users"][0]["location"]["lat"] = json!(200.0));
    assert_eq!(err.code(), ErrorCode::Invalid);
    assert_eq!(err.field(), Some("users[0].location.lat"));
    assert!(err.to_string().contains("200"), "{err}");
}

#[test]
fn bad_ids_are_rejected() {
    let err = job_error(|v| v["tenant"] = json!("team a"));
    assert_eq!(err.field(), Some("tenant"));
    let err = job_error(|v| v["tenant"] = json!("x".repeat(100)));
    assert!(err.to_string().contains("limit is 64"), "{err}");
}

#[test]
fn counts_and_prices_out_of_range_are_rejected() {
    assert_eq!(
        job_error(|v| v["resources"]["count"] = json!(0)).field(),
        Some("resources.count")
    );
    assert_eq!(
        job_error(|v| v["resources"]["milli"] = json!(1500)).field(),
        Some("resources.milli")
    );
    assert_eq!(
        job_error(|v| v["replicas"] = json!(0)).field(),
        Some("replicas")
    );
    assert_eq!(
        job_error(|v| v["constraints"] = json!({"price_cap_micro_usd_per_hour": 5_000_000_000u64}))
            .field(),
        Some("constraints.price_cap_micro_usd_per_hour")
    );
    assert_eq!(
        job_error(|v| v["run"]["command"] = json!("  ")).field(),
        Some("run.command")
    );
    assert_eq!(
        job_error(|v| v["policy"] = json!({"weights": {"cost": 0.0}})).field(),
        Some("policy.weights")
    );
    assert_eq!(
        job_error(|v| v["run"]["env"] = json!({"1BAD": "x"})).field(),
        Some("run.env.1BAD")
    );
    assert_eq!(
        job_error(|v| v["policy"] = json!({"max_cost_premium": -0.1})).field(),
        Some("policy.max_cost_premium")
    );
    assert_eq!(
        job_error(|v| v["policy"] = json!({"carbon_price_usd_per_t": 1e9})).field(),
        Some("policy.carbon_price_usd_per_t")
    );
    assert_eq!(
        job_error(|v| v["resources"]["model_memory_mib"] = json!({"V100": 32768})).field(),
        Some("resources.model_memory_mib.V100")
    );
}

/// The money-and-carbon policies and memory per model read and write as documented.
#[test]
fn carbon_policies_and_memory_per_model_round_trip() {
    let mut v = job_json();
    v["policy"] = json!({"carbon_price_usd_per_t": 190});
    v["resources"]["models"] = json!(["A100", "V100"]);
    v["resources"]["model_memory_mib"] = json!({"V100": 32768});
    let spec: JobSpec = decode(&bytes(&v)).unwrap();
    assert_eq!(spec.policy, Some(Policy::CarbonPriceUsdPerT(190.0)));
    assert_eq!(spec.resources.model_memory_mib.get("V100"), Some(&32768));
    round_trip(&spec);
    v["policy"] = json!({"max_cost_premium": 0.05});
    let spec: JobSpec = decode(&bytes(&v)).unwrap();
    assert_eq!(spec.policy, Some(Policy::MaxCostPremium(0.05)));
    assert_eq!(
        Policy::parse_label("carbon-price=190"),
        Ok(Policy::CarbonPriceUsdPerT(190.0))
    );
    assert_eq!(
        Policy::parse_label("max-cost-premium=0.05").map(|p| p.label()),
        Ok("max-cost-premium=0.05".into())
    );
    assert!(Policy::parse_label("carbon-price=abc")
        .unwrap_err()
        .to_string()
        .contains("carbon-price"));
    assert!(Policy::parse_label("cheap")
        .unwrap_err()
        .to_string()
        .contains("known"));
}

#[test]
fn advert_inconsistencies_are_rejected() {
    assert_eq!(
        advert_error(|v| v["site"]["pue"] = json!(0.5)).field(),
        Some("site.pue")
    );
    assert_eq!(
        advert_error(|v| v["site"]["location"]["lon"] = json!(-181)).field(),
        Some("site.location.lon")
    );
    assert_eq!(
        advert_error(|v| v["pools"][0]["count"] = json!(3)).field(),
        Some("pools[0].devices")
    );
    assert_eq!(
        advert_error(|v| v["pools"][0]["devices"][1]["used_milli"] = json!(1001)).field(),
        Some("pools[0].devices[1].used_milli")
    );
    assert_eq!(
        advert_error(|v| v["pools"][0]["devices"][1]["index"] = json!(0)).field(),
        Some("pools[0].devices[1].index")
    );
    assert_eq!(
        advert_error(|v| v["pools"][0]["devices"][0]["index"] = json!(2)).field(),
        Some("pools[0].devices[0].index")
    );
    assert_eq!(
        advert_error(|v| v["pools"] = json!([])).field(),
        Some("pools")
    );
    assert_eq!(
        advert_error(|v| v["site"]["id"] = json!("a.b")).field(),
        Some("site.id")
    );
}

#[test]
fn oversized_messages_are_rejected_before_parsing() {
    let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
    let err = decode::<JobSpec>(&big).expect_err("too large");
    assert_eq!(err.code(), ErrorCode::TooLarge);
    assert_eq!(err.code().http_status(), 413);
}

#[test]
fn other_versions_are_refused() {
    let err = job_error(|v| v["v"] = json!(2));
    assert_eq!(
        err,
        WireError::UnsupportedVersion {
            found: 2,
            supported: 1
        }
    );
}

#[test]
fn trailing_garbage_is_rejected() {
    let mut b = bytes(&job_json());
    b.extend_from_slice(b" {}");
    assert_eq!(
        decode::<JobSpec>(&b).expect_err("trailing").code(),
        ErrorCode::Malformed
    );
}

#[test]
fn api_reply_must_hold_exactly_one_side() {
    let err = decode::<ApiReply<SubmitReply>>(br#"{"v":1}"#).expect_err("empty reply");
    assert_eq!(err.field(), Some("ok"));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever bytes arrive, decoding returns a value or an error; it never panics.
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<JobSpec>(&data);
            let _ = decode::<SiteAdvert>(&data);
        }

        /// Any in-range location is accepted and any out-of-range latitude is named.
        #[test]
        fn latitude_range(lat in -400.0f64..400.0) {
            let mut v = job_json();
            v["users"][0]["location"]["lat"] = json!(lat);
            let r = decode::<JobSpec>(&bytes(&v));
            if (-90.0..=90.0).contains(&lat) {
                prop_assert!(r.is_ok());
            } else {
                let e = r.expect_err("out of range");
                prop_assert_eq!(e.field(), Some("users[0].location.lat"));
            }
        }
    }
}

#[test]
fn a_cancel_reason_is_bounded_and_printable() {
    let cancel =
        |reason: String| bytes(&json!({"v": 1, "job": "j-000001", "attempt": 1, "reason": reason}));
    assert!(decode::<CancelAttempt>(&cancel("preempted".into())).is_ok());
    let long = decode::<CancelAttempt>(&cancel("x".repeat(5000))).unwrap_err();
    assert!(long.to_string().contains("reason"), "{long}");
    let control = decode::<CancelAttempt>(&cancel("a\nb".into())).unwrap_err();
    assert!(control.to_string().contains("control"), "{control}");
}

#[test]
fn unknown_fields_are_refused_where_people_write_and_ignored_between_components() {
    let mut v = job_json();
    v["constraints"] = json!({"residancy": "eu"});
    let e = decode_strict::<JobSpec>(&bytes(&v)).unwrap_err();
    assert_eq!(e.field(), Some("constraints.residancy"), "{e}");
    assert_eq!(e.code(), ErrorCode::Invalid);
    v["replica"] = json!(3);
    let e = decode_strict::<JobSpec>(&bytes(&v)).unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
    // A component of a newer release may add fields: they are ignored and counted.
    let mut a = advert_json();
    a["site"]["new_thing"] = json!(1);
    assert!(decode::<SiteAdvert>(&bytes(&a)).is_ok());
    assert!(codec::unknown_fields()
        .iter()
        .any(|(k, n)| k == "SiteAdvert.site.new_thing" && *n >= 1));
}

#[test]
fn a_missing_required_field_is_named() {
    let mut v = job_json();
    v.as_object_mut().unwrap().remove("tenant");
    let e = decode_strict::<JobSpec>(&bytes(&v)).unwrap_err();
    assert_eq!(e.field(), Some("tenant"), "{e}");
    let mut v = job_json();
    v["resources"].as_object_mut().unwrap().remove("kind");
    let e = decode_strict::<JobSpec>(&bytes(&v)).unwrap_err();
    assert_eq!(e.field(), Some("resources.kind"), "{e}");
}

#[test]
fn nul_bytes_deep_nesting_and_runaway_run_times_are_refused() {
    let e = job_error(|v| v["run"]["command"] = json!("echo a\u{0}b"));
    assert_eq!(e.field(), Some("run.command"), "{e}");
    let e = job_error(|v| v["run"]["env"] = json!({"TOKEN": "x\u{0}y"}));
    assert_eq!(e.field(), Some("run.env.TOKEN"), "{e}");
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert!(matches!(
        decode::<JobSpec>(deep.as_bytes()),
        Err(WireError::TooDeep { .. })
    ));
    let status = json!({"v": 1, "job": "j-000001", "attempt": 1, "site": "a", "state": "succeeded",
        "exit_code": 0, "at_ms": 5, "runtime_ms": u64::MAX});
    let e = decode::<JobStatus>(&bytes(&status)).unwrap_err();
    assert_eq!(e.field(), Some("runtime_ms"), "{e}");
}

#[test]
fn errors_escape_what_came_from_the_message() {
    let v = json!({"v": 1, "job": "j-000001", "attempt": 1, "reason": "a\nFAKE LOG LINE"});
    let e = decode::<CancelAttempt>(&bytes(&v)).unwrap_err();
    assert!(!e.to_string().contains('\n'), "{e}");
    let mut v = job_json();
    v["kind\nFAKE"] = json!(1);
    let e = decode_strict::<JobSpec>(&bytes(&v)).unwrap_err();
    assert!(!e.to_string().contains('\n'), "{e}");
}

/// Messages as the previous release wrote them (the agent, broker and job-spec shapes of wire version 1
/// before inventories and marks): a component of this release reads every one.
#[test]
fn messages_of_the_previous_release_still_decode() {
    fn read<T: serde::de::DeserializeOwned + validate::Validate>(name: &str) -> T {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/previous-release")
            .join(format!("{name}.json"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
    }
    let advert: SiteAdvert = read("advert");
    assert!(!advert.pools.is_empty());
    let spec: JobSpec = read("job_spec");
    assert_eq!(spec.v, 1);
    let _: JobStatus = read("status");
    let failed: JobStatus = read("status_failed");
    assert!(matches!(failed.state, AttemptState::Failed { .. }));
    let hb: Heartbeat = read("heartbeat");
    assert!(hb.inventory.is_none());
    let offer: Offer = read("offer");
    assert_eq!(offer.spec, spec);
    let reply: OfferReply = read("offer_reply");
    assert_eq!((reply.outcome, reply.mark), (OfferOutcome::Accepted, None));
    let _: OfferReply = read("offer_reply_rejected");
    let _: CancelAttempt = read("cancel");
    let _: StatusAck = read("status_ack");
    let _: LogsRequest = read("logs_request");
    let _: LogsReply = read("logs_reply");
    let _: BrokerHello = read("broker_hello");
}

fn service_json() -> Value {
    json!({
        "name": "chat",
        "tenant": "team-a",
        "resources": {"kind": "gpu", "count": 1, "models": ["A100", "H100"]},
        "throughput": {"requests_per_s": 2.0},
        "slo_ms": 50,
        "max_replicas": 10,
        "policy": {"max_cost_premium": 0.05},
        "spot": true,
        "run": {"command": "serve"}
    })
}

/// A service file round trips with its defaults filled in, and each bad field is named.
#[test]
fn a_service_spec_round_trips_and_each_bad_field_is_named() {
    let spec: ServiceSpec = decode_strict(&bytes(&service_json())).unwrap();
    assert_eq!(spec.min_replicas, 1);
    assert_eq!((spec.scale_up_delay_s, spec.scale_down_delay_s), (60, 600));
    assert_eq!(spec.target_utilization, 0.8);
    round_trip(&spec);
    let replica = spec.replica_spec(3);
    assert_eq!(replica.service.as_ref().map(|s| s.as_str()), Some("chat"));
    assert_eq!(replica.kind, JobKind::Inference);
    assert_eq!(replica.idempotency_key, "service-chat-3");
    let cases: [(&str, Value, &str); 8] = [
        ("throughput", json!({}), "throughput"),
        (
            "throughput",
            json!({"requests_per_s": 1.0, "tokens_per_s": 5.0}),
            "throughput",
        ),
        ("slo_ms", json!(0), "slo_ms"),
        ("min_replicas", json!(11), "min_replicas"),
        ("target_utilization", json!(1.5), "target_utilization"),
        ("policy", json!({"weights": {"cost": 1.0}}), "policy"),
        ("name", json!("has space"), "name"),
        (
            "resources",
            json!({"kind": "gpu", "count": 0}),
            "resources.count",
        ),
    ];
    for (key, value, field) in cases {
        let mut v = service_json();
        v[key] = value;
        let e = decode_strict::<ServiceSpec>(&bytes(&v)).expect_err(key);
        assert!(e.to_string().contains(field), "{key}: {e}");
    }
    let mut v = service_json();
    v["replicas_max"] = json!(3);
    let e = decode_strict::<ServiceSpec>(&bytes(&v)).expect_err("unknown field");
    assert!(e.to_string().contains("replicas_max"), "{e}");
}

#[test]
fn a_routes_watch_request_takes_a_lease_within_its_range_and_names_what_is_wrong() {
    let w: RoutesWatchRequest = decode_strict(&bytes(&json!({"name": "chat"}))).unwrap();
    assert_eq!((w.lease_s, w.tenant.as_ref()), (60, None));
    round_trip(&w);
    for (body, field) in [
        (json!({"name": "chat", "lease_s": 0}), "lease_s"),
        (json!({"name": "chat", "lease_s": 601}), "lease_s"),
        (json!({"name": "has space"}), "name"),
        (json!({"name": "chat", "lease": 5}), "lease"),
    ] {
        let e = decode_strict::<RoutesWatchRequest>(&bytes(&body)).expect_err(field);
        assert!(e.to_string().contains(field), "{body}: {e}");
    }
}
