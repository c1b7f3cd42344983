//! Trace context of a job attempt (W3C Trace Context, carried in the `traceparent` header of NATS messages).
//!
//! Every id is derived from the job and the attempt, so any broker — the one that placed the attempt, or one
//! that took over or restarted since — names the same trace and the same spans, and nothing needs to be kept
//! in the journal for a trace to continue. One trace per attempt: its root span `attempt`, and under it the
//! broker's `placement` and `offer`, and the agent's `run` under `offer` (the agent learns the `offer` span from
//! the header of the offer it is sent).

use crate::JobId;
use sha2::{Digest, Sha256};

/// The spans of an attempt's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// The root: from the time the job began waiting for this attempt to the attempt's end.
    Attempt,
    /// Admission (quota, budget) and placement, until the offer.
    Placement,
    /// The offer to a site, until its answer.
    Offer,
    /// The job's process at the site (the agent's span).
    Run,
}

impl SpanKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SpanKind::Attempt => "attempt",
            SpanKind::Placement => "placement",
            SpanKind::Offer => "offer",
            SpanKind::Run => "run",
        }
    }

    /// The span this one is a child of (`None` for the root).
    pub fn parent(self) -> Option<SpanKind> {
        match self {
            SpanKind::Attempt => None,
            SpanKind::Placement | SpanKind::Offer => Some(SpanKind::Attempt),
            SpanKind::Run => Some(SpanKind::Offer),
        }
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// The trace id of a job's attempt (never all zero).
pub fn trace_id(job: &JobId, attempt: u32) -> [u8; 16] {
    let d = digest(&[
        b"meridian-trace",
        job.as_str().as_bytes(),
        &attempt.to_be_bytes(),
    ]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&d[..16]);
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// The id of one span of a job's attempt (never all zero).
pub fn span_id(job: &JobId, attempt: u32, span: SpanKind) -> [u8; 8] {
    let d = digest(&[
        b"meridian-span",
        job.as_str().as_bytes(),
        &attempt.to_be_bytes(),
        span.as_str().as_bytes(),
    ]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `traceparent` value naming `span` of the attempt as the parent (sampled).
pub fn traceparent(job: &JobId, attempt: u32, span: SpanKind) -> String {
    format!(
        "00-{}-{}-01",
        hex(&trace_id(job, attempt)),
        hex(&span_id(job, attempt, span))
    )
}

/// Reads a `traceparent` value: the trace id and the parent span id; `None` for anything else (a malformed
/// header is ignored, never an error: tracing must not refuse work).
pub fn parse_traceparent(value: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, _flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || trace.len() != 32 || span.len() != 16 || parts.next().is_some() {
        return None;
    }
    let byte = |s: &str, i: usize| u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok();
    let mut t = [0u8; 16];
    for (i, b) in t.iter_mut().enumerate() {
        *b = byte(trace, i)?;
    }
    let mut p = [0u8; 8];
    for (i, b) in p.iter_mut().enumerate() {
        *b = byte(span, i)?;
    }
    (t != [0; 16] && p != [0; 8]).then_some((t, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_from_the_job_and_attempt_alone() {
        let j = JobId::numbered(7);
        assert_eq!(trace_id(&j, 1), trace_id(&j, 1));
        assert_ne!(trace_id(&j, 1), trace_id(&j, 2));
        assert_ne!(
            span_id(&j, 1, SpanKind::Offer),
            span_id(&j, 1, SpanKind::Placement)
        );
    }

    #[test]
    fn traceparent_round_trips_and_rejects_what_is_not_one() {
        let j = JobId::numbered(7);
        let tp = traceparent(&j, 2, SpanKind::Offer);
        assert_eq!(
            parse_traceparent(&tp),
            Some((trace_id(&j, 2), span_id(&j, 2, SpanKind::Offer)))
        );
        for bad in [
            "",
            "01-00000000000000000000000000000001-0000000000000001-01",
            "00-00000000000000000000000000000000-0000000000000001-01",
            "00-zz000000000000000000000000000001-0000000000000001-01",
            "00-0000000000000000000000000000001-0000000000000001-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
