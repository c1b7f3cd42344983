//! What the edges' decoders share: strict bodies, ids from paths, query parameters as bodies.

use super::calls::{Call, HttpIn, NatsIn};
use super::{ApiError, ApiResult};
use meridian_federation::{decode_strict, Empty, ErrorCode, JobId, JobRef, ServiceRef, SiteId};
use std::collections::BTreeMap;

pub fn plain(c: ApiResult<Call>) -> ApiResult<(Call, Option<String>)> {
    c.map(|c| (c, None))
}

pub fn strict<T>(body: &[u8]) -> ApiResult<T>
where
    T: serde::de::DeserializeOwned + meridian_federation::validate::Validate,
{
    decode_strict::<T>(body).map_err(ApiError::from)
}

/// A request whose every field is optional: an empty body is the default one, anything else is decoded strictly.
pub fn optional<T>(body: &[u8]) -> ApiResult<T>
where
    T: Default + serde::de::DeserializeOwned + meridian_federation::validate::Validate,
{
    if body.is_empty() {
        Ok(T::default())
    } else {
        strict(body)
    }
}

pub fn empty(payload: &[u8]) -> ApiResult<()> {
    if payload.is_empty() {
        return Ok(());
    }
    strict::<Empty>(payload).map(|_| ())
}

pub fn job_ref(n: &NatsIn) -> ApiResult<JobId> {
    strict::<JobRef>(&n.payload).map(|r| r.job)
}

pub fn param(r: &HttpIn, name: &str) -> String {
    r.params.get(name).cloned().unwrap_or_default()
}

pub fn job_id(r: &HttpIn) -> ApiResult<JobId> {
    JobId::new(param(r, "id")).map_err(|p| ApiError::invalid("job", p.to_string()))
}

pub fn site_id(r: &HttpIn) -> ApiResult<SiteId> {
    SiteId::new(param(r, "id")).map_err(|p| ApiError::invalid("site", p.to_string()))
}

/// The query's parameters, as sent.
pub fn query(r: &HttpIn) -> ApiResult<BTreeMap<String, String>> {
    typed_query(r)
}

/// The query's parameters as a typed value: an unknown or bad one is refused, named.
pub fn typed_query<T: serde::de::DeserializeOwned>(r: &HttpIn) -> ApiResult<T> {
    axum::extract::Query::<T>::try_from_uri(&r.uri)
        .map(|q| q.0)
        .map_err(|e| ApiError::new(ErrorCode::Malformed, None, e.body_text()))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplainParam {
    /// Every site of the federation, as placement weighs the job now.
    #[serde(default)]
    pub all: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinesParam {
    pub lines: Option<u32>,
}

/// Query parameters that are flags (`true` or `false`) in every call that takes them.
const FLAGS: &[&str] = &["newest_first"];

/// Query parameters as the JSON body of the same call (numbers where the call takes numbers), so they are
/// checked like a body: an unknown or bad parameter is named in the error.
pub fn query_body(r: &HttpIn, numeric: &[&str]) -> ApiResult<Vec<u8>> {
    to_body(query(r)?, numeric)
}

pub fn to_body(q: BTreeMap<String, String>, numeric: &[&str]) -> ApiResult<Vec<u8>> {
    let mut body = serde_json::Map::new();
    body.insert("v".into(), 1.into());
    for (k, v) in q {
        let value = if numeric.contains(&k.as_str()) {
            v.parse::<u64>()
                .map_or(serde_json::Value::String(v), Into::into)
        } else if FLAGS.contains(&k.as_str()) {
            v.parse::<bool>()
                .map_or(serde_json::Value::String(v), Into::into)
        } else {
            serde_json::Value::String(v)
        };
        body.insert(k, value);
    }
    serde_json::to_vec(&body).map_err(|e| ApiError::internal(e.to_string()))
}

/// A `ServiceRef` from the path's name and the query (`?tenant=T`).
pub fn service_ref(r: &HttpIn) -> ApiResult<ServiceRef> {
    let mut q = query(r)?;
    q.insert("name".into(), param(r, "name"));
    strict(&to_body(q, &[])?)
}

/// A demand report's body with the path's service: `service` may be left out, and must match when given.
pub fn demand_body(r: &HttpIn) -> ApiResult<Vec<u8>> {
    let name = param(r, "name");
    match serde_json::from_slice::<serde_json::Value>(&r.body) {
        Ok(serde_json::Value::Object(mut m)) => {
            if let Some(given) = m.get("service").and_then(|v| v.as_str()) {
                if given != name {
                    return Err(ApiError::invalid(
                        "service",
                        format!("the body names service {given:?}; the path names {name:?}"),
                    ));
                }
            }
            m.insert("service".into(), serde_json::Value::String(name));
            serde_json::to_vec(&m).map_err(|e| ApiError::internal(e.to_string()))
        }
        // Not an object: decoding says what is wrong with it.
        _ => Ok(r.body.to_vec()),
    }
}

pub fn drain_body(body: &[u8]) -> ApiResult<bool> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct DrainBody {
        #[serde(default = "yes")]
        drain: bool,
    }
    fn yes() -> bool {
        true
    }
    serde_json::from_slice::<DrainBody>(body)
        .map(|b| b.drain)
        .map_err(|e| ApiError::new(ErrorCode::Malformed, None, format!("drain body: {e}")))
}
