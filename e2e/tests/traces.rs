//! Traces from outside: a small OTLP/HTTP receiver on loopback takes what the broker and an agent of a local
//! federation export (`OTEL_EXPORTER_OTLP_ENDPOINT` set for them), and the test finds one job attempt's spans —
//! the broker's `attempt`, `placement` and `offer`, the agent's `run` — under one trace id with the parent
//! links right (the agent learns its parent from the offer's `traceparent` header).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use meridian_e2e::{job, Fed, SiteSpec};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every request body the receiver was sent.
type Bodies = Arc<Mutex<Vec<Value>>>;

/// An OTLP/HTTP receiver (JSON bodies): answers every POST with `{}` and keeps the body.
fn receiver() -> (String, Bodies) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let bodies: Bodies = Arc::default();
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    // The request line and headers.
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = l.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    if let Ok(v) = serde_json::from_slice(&body) {
                        kept.lock().unwrap().push(v);
                    }
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if conn.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, bodies)
}

/// A received span: its service, name, ids and attributes.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: Value,
}

fn spans(bodies: &Bodies) -> Vec<Span> {
    let mut out = Vec::new();
    for body in bodies.lock().unwrap().iter() {
        for rs in body["resourceSpans"].as_array().into_iter().flatten() {
            let service = rs["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["key"] == "service.name")
                .and_then(|a| a["value"]["stringValue"].as_str())
                .unwrap_or_default()
                .to_owned();
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    out.push(Span {
                        service: service.clone(),
                        name: s["name"].as_str().unwrap_or_default().to_owned(),
                        trace: s["traceId"].as_str().unwrap_or_default().to_owned(),
                        id: s["spanId"].as_str().unwrap_or_default().to_owned(),
                        parent: s["parentSpanId"].as_str().unwrap_or_default().to_owned(),
                        attributes: s["attributes"].clone(),
                    });
                }
            }
        }
    }
    out
}

fn attribute<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attributes
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

#[test]
fn one_attempt_one_trace_across_broker_and_agent() {
    let (addr, bodies) = receiver();
    // The broker and agents the federation starts inherit these.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"));
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "200");
    let f = Fed::generated(&[SiteSpec::new("dc-a", "owned", "H100", 2, 2.0)], "");
    let id = f.submit(&job("traced", 1, "sleep 1"));
    f.wait_phase(&id, "succeeded", Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut found = Vec::new();
    while Instant::now() < deadline {
        found = spans(&bodies)
            .into_iter()
            .filter(|s| {
                attribute(s, "meridian.job").and_then(|v| v["stringValue"].as_str())
                    == Some(id.as_str())
            })
            .collect();
        let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
        if ["attempt", "placement", "offer", "run"]
            .iter()
            .all(|n| names.contains(n))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("{found:#?}");
    let one = |name: &str| {
        found
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span: {found:#?}"))
            .clone()
    };
    let (attempt, placement, offer, run) =
        (one("attempt"), one("placement"), one("offer"), one("run"));
    assert!(!attempt.trace.is_empty());
    for s in [&placement, &offer, &run] {
        assert_eq!(s.trace, attempt.trace, "one trace: {s:?}");
    }
    assert_eq!(attempt.parent, "", "the attempt is the root");
    assert_eq!(placement.parent, attempt.id);
    assert_eq!(offer.parent, attempt.id);
    assert_eq!(
        run.parent, offer.id,
        "the agent's run is under the broker's offer"
    );
    assert_eq!(attempt.service, "meridian-broker");
    assert_eq!(run.service, "meridian-agent");
    assert_eq!(
        attribute(&placement, "meridian.site").and_then(|v| v["stringValue"].as_str()),
        Some("dc-a")
    );
    assert_eq!(
        attribute(&placement, "meridian.policy").and_then(|v| v["stringValue"].as_str()),
        Some("balanced")
    );
    assert!(attribute(&placement, "meridian.score").is_some());
    assert_eq!(
        attribute(&run, "process.exit.code").and_then(|v| v["intValue"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| v["intValue"].as_i64().map(|i| i.to_string()))),
        Some("0".to_owned())
    );
}
