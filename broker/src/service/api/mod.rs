//! The API's one implementation, served over NATS request-reply and HTTP alike.
//!
//! A request is decoded once, at its edge ([`super::http`] or [`nats`]), into a typed [`Call`]; [`handle`]
//! authenticates the caller, rate-limits it, has [`super::authz`] judge the call and runs its handler (in the
//! rooms `jobs`, `services`, `admin`, `report`). Handlers return typed values or an [`ApiError`]; bytes are
//! made once ([`Reply`] for an answer, [`ApiError::into_reply`] for an error). Every call is declared once,
//! in [`calls`]: its name, access, NATS subject, HTTP route, edge decoders and the line docs/api.md shows.

mod admin;
pub mod calls;
mod decode;
mod jobs;
pub mod nats;
mod reference;
mod report;
pub use reference::reference_markdown;
mod services;

pub use calls::{Access, Call, CallDef, HttpIn, NatsIn, CALLS};

use super::{authz, BrokerHandle};
use meridian_core::access::{Denied, Principal};
use meridian_core::reactor::StepError;
use meridian_federation::{encode, ApiReply, ErrorBody, ErrorCode, WireError};
use serde::Serialize;

/// Why a call was not carried out: the error body the caller gets, with its HTTP status.
#[derive(Debug)]
pub struct ApiError(pub ErrorBody);

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: ErrorCode, field: Option<&str>, message: impl Into<String>) -> Self {
        ApiError(ErrorBody::new(code, field.map(str::to_owned), message))
    }

    /// A value that is not acceptable, naming its field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, Some(field), message)
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::NotFound, None, format!("{what} not found"))
    }

    pub fn unavailable() -> Self {
        Self::new(ErrorCode::Unavailable, None, "broker is stopping")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, None, message)
    }

    /// The archive could not be read.
    pub fn archive(e: anyhow::Error) -> Self {
        Self::new(
            ErrorCode::Unavailable,
            None,
            format!("the archive could not be read: {e:#}"),
        )
    }

    pub fn status(&self) -> u16 {
        self.0.code.http_status()
    }

    /// The reply's bytes: the API's JSON error shape.
    pub fn into_reply(self) -> Reply {
        let status = self.status();
        let body = encode(&ApiReply::<()>::err(self.0)).unwrap_or_else(|_| b"{}".to_vec());
        Reply { status, body }
    }
}

impl From<StepError> for ApiError {
    fn from(e: StepError) -> Self {
        ApiError(ErrorBody::new(e.code(), e.field(), e.to_string()))
    }
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> Self {
        ApiError(e.to_body())
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Hidden(what) => ApiError::not_found(what),
            Denied::Forbidden(why) => ApiError::new(ErrorCode::Forbidden, None, why),
        }
    }
}

impl From<ErrorBody> for ApiError {
    fn from(e: ErrorBody) -> Self {
        ApiError(e)
    }
}

/// An answer as bytes, with its HTTP status: JSON (`ApiReply`), or the metrics' text.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    /// `value` in the API's JSON shape.
    pub fn json<T: Serialize>(status: u16, value: &T) -> ApiResult<Reply> {
        match encode(&ApiReply::ok(value)) {
            Ok(body) => Ok(Reply { status, body }),
            Err(e) => Err(ApiError::internal(e.to_string())),
        }
    }
}

/// A request as an edge decoded it: the call's name (for the audit, whatever became of the decoding) and
/// the call, or why its input was refused.
pub struct Request {
    pub action: &'static str,
    pub call: ApiResult<Call>,
}

/// Carries out one call for the caller a bearer token names (`identity`: the NATS identity it came from;
/// `None` over HTTP): authenticated, rate-limited, then judged by the caller's permissions. Every refusal is
/// audited: those of changes in the reactor task, the others here.
pub async fn handle(
    h: &BrokerHandle,
    bearer: Option<&str>,
    identity: Option<&str>,
    req: Request,
) -> ApiResult<Reply> {
    let now = super::now_ms();
    let who = admit(h, bearer, identity, req.action, now)?;
    let call = req.call?;
    let def = call.def();
    let done = match authz::may_call(&who, &def.access) {
        Ok(()) => calls::dispatch(h, &who, call).await,
        Err(d) => Err(d.into()),
    };
    if let Err(e) = &done {
        let refused = matches!(
            e.0.code,
            ErrorCode::Unauthenticated | ErrorCode::Forbidden | ErrorCode::NotFound
        );
        // An administrator's "not found" is a typo, not a probe.
        let probe = e.0.code != ErrorCode::NotFound || !who.admin;
        if refused && probe && def.access != Access::Change {
            h.audit.refused(now, &who.id, def.action, &e.0.message);
        }
    }
    done
}

/// The caller a bearer token names, if it is one and not calling too fast (a stranger is rate-limited by
/// where it came from).
fn admit(
    h: &BrokerHandle,
    bearer: Option<&str>,
    identity: Option<&str>,
    action: &str,
    now: u64,
) -> ApiResult<Principal> {
    let who = match h.auth.authenticate(bearer, now) {
        Ok(p) => p,
        Err(e) => {
            let stranger = identity.map_or_else(|| "anonymous".to_owned(), |i| format!("nats:{i}"));
            if let Err(wait) = h.auth.admit_stranger(&stranger) {
                h.audit.refused(now, &stranger, action, "rate limited");
                return Err(super::auth::slow_down(wait, &stranger).into());
            }
            h.audit.refused(now, &stranger, action, &e.message);
            return Err(e.into());
        }
    };
    if let Err(wait) = h.auth.admit(&who) {
        h.audit.refused(now, &who.id, action, "rate limited");
        let whose = who
            .tenant
            .as_ref()
            .map_or_else(|| who.id.clone(), |t| format!("tenant {t}"));
        return Err(super::auth::slow_down(wait, &whose).into());
    }
    Ok(who)
}

/// [`handle`] as bytes, whichever way it went.
pub async fn reply(
    h: &BrokerHandle,
    bearer: Option<&str>,
    identity: Option<&str>,
    req: Request,
) -> Reply {
    handle(h, bearer, identity, req)
        .await
        .unwrap_or_else(ApiError::into_reply)
}
#[cfg(test)]
mod tests;
