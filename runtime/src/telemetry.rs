//! Traces out of Meridian's processes: OpenTelemetry spans exported over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard `OTEL_*` variables configure the exporter and its batch
//! processor), nothing otherwise.
//!
//! Spans are made after the fact, with the times the events had (the broker's core keeps no clock: its shell
//! times what it decides) and the ids of [`meridian_federation::trace`], so that every process — and every
//! broker across restarts and takeovers — names the same trace and spans of an attempt.

use meridian_federation::trace::{span_id, trace_id, SpanKind as Kind};
use meridian_federation::JobId;
use opentelemetry::trace::{
    Event, Span as _, SpanBuilder, SpanContext, SpanId, Status, TraceContextExt, TraceFlags,
    TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A value of a span attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
    Float(f64),
}

/// Attributes of a span or event.
pub type Attributes = Vec<(&'static str, Value)>;

/// An event within a span: when, its name, and what.
pub type SpanEvent = (u64, &'static str, Attributes);

/// One span of a job attempt's trace, with the times it had.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub job: JobId,
    pub attempt: u32,
    pub kind: Kind,
    /// The trace and parent span as a `traceparent` header gave them; `None`: derived from the job and attempt.
    pub parent: Option<([u8; 16], [u8; 8])>,
    pub start_ms: u64,
    pub end_ms: u64,
    pub attributes: Attributes,
    /// Events within the span.
    pub events: Vec<SpanEvent>,
    pub error: Option<String>,
}

/// An exporter of spans, when one is configured.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn kv(k: &'static str, v: &Value) -> KeyValue {
    match v {
        Value::Text(s) => KeyValue::new(k, s.clone()),
        Value::Int(i) => KeyValue::new(k, *i),
        Value::Float(f) => KeyValue::new(k, *f),
    }
}

impl Telemetry {
    /// The exporter `OTEL_EXPORTER_OTLP_ENDPOINT` names (OTLP over HTTP, JSON), or `None` when it is unset.
    /// `service` names the process in the traces (`meridian-broker`, `meridian-agent`).
    pub fn from_env(service: &str) -> Result<Option<Telemetry>, String> {
        let set = |v: &str| std::env::var(v).is_ok_and(|s| !s.trim().is_empty());
        if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            return Ok(None);
        }
        use opentelemetry_otlp::{Protocol, WithExportConfig};
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .build()
            .map_err(|e| format!("the OTLP exporter: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service.to_owned())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("meridian");
        Ok(Some(Telemetry { provider, tracer }))
    }

    /// Exports one span (batched).
    pub fn span(&self, r: &SpanRecord) {
        let (trace, parent_span) = match r.parent {
            Some((t, p)) => (TraceId::from_bytes(t), Some(SpanId::from_bytes(p))),
            None => (
                TraceId::from_bytes(trace_id(&r.job, r.attempt)),
                r.kind
                    .parent()
                    .map(|p| SpanId::from_bytes(span_id(&r.job, r.attempt, p))),
            ),
        };
        let parent = match parent_span {
            Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                trace,
                p,
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let mut attributes = vec![
            KeyValue::new("meridian.job", r.job.to_string()),
            KeyValue::new("meridian.attempt", i64::from(r.attempt)),
        ];
        attributes.extend(r.attributes.iter().map(|(k, v)| kv(k, v)));
        let events = r
            .events
            .iter()
            .map(|(t, name, attrs)| {
                Event::new(
                    *name,
                    at(*t),
                    attrs.iter().map(|(k, v)| kv(k, v)).collect(),
                    0,
                )
            })
            .collect();
        let builder = SpanBuilder::from_name(r.kind.as_str())
            .with_trace_id(trace)
            .with_span_id(SpanId::from_bytes(span_id(&r.job, r.attempt, r.kind)))
            .with_start_time(at(r.start_ms))
            .with_attributes(attributes)
            .with_events(events)
            .with_status(match &r.error {
                Some(e) => Status::error(e.clone()),
                None => Status::Ok,
            });
        let mut span = self.tracer.build_with_context(builder, &parent);
        span.end_with_timestamp(at(r.end_ms.max(r.start_ms)));
    }

    /// Sends what is batched (at shutdown).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}
