//! The HTTP JSON API (axum). Routes map onto [`super::api::Call`]; bodies are the wire types.

use super::api::{call, Call, Reply};
use super::BrokerHandle;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

/// Serves the API on `listener`: HTTPS when the broker has a certificate, plain HTTP otherwise (insecure).
pub async fn serve(
    listener: tokio::net::TcpListener,
    h: BrokerHandle,
    cfg: &super::BrokerConfig,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let app = router(h);
    match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(cert), Some(key)) => {
            let tls = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                .await
                .with_context(|| {
                    format!(
                        "reading the HTTP API's certificate {} and key {}",
                        cert.display(),
                        key.display()
                    )
                })?;
            let listener = listener.into_std()?;
            tokio::spawn(async move {
                let served = axum_server::from_tcp_rustls(listener, tls)
                    .serve(app.into_make_service())
                    .await;
                if let Err(e) = served {
                    tracing::error!("HTTP API stopped: {e}");
                }
            });
        }
        _ => {
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!("HTTP API stopped: {e}");
                }
            });
        }
    }
    Ok(())
}

pub fn router(h: BrokerHandle) -> Router {
    Router::new()
        .route("/v1/jobs", post(submit).get(list_jobs))
        .route("/v1/jobs/{id}", get(get_job).delete(cancel))
        .route("/v1/jobs/{id}/explain", get(explain))
        .route("/v1/jobs/{id}/logs", get(logs))
        .route("/v1/sites", get(list_sites))
        .route("/v1/sites/{id}/drain", post(drain))
        .route("/v1/services/scale-in", post(scale_in))
        .route("/v1/report", get(report))
        .route("/v1/admin/tenancy", get(get_tenancy).put(put_tenancy))
        .route("/v1/admin/journal/format", get(get_format))
        .route("/v1/admin/journal/upgrade-format", post(upgrade_format))
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(
            meridian_federation::MAX_MESSAGE_BYTES + 1,
        ))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(h)
}

async fn no_route(uri: axum::http::Uri) -> Response {
    respond(super::api::error(meridian_federation::ErrorBody::new(
        meridian_federation::ErrorCode::NotFound,
        None,
        format!("no API call at {}", uri.path()),
    )))
}

/// Every error answers in the API's JSON shape, those the router and extractors make too (a wrong method, a
/// bad path or query, a body over the limit): their plain text becomes the message.
async fn json_errors(response: Response) -> Response {
    use meridian_federation::{ErrorBody, ErrorCode};
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if status.as_u16() < 400 || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let code = match status.as_u16() {
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        413 => ErrorCode::TooLarge,
        500..=599 => ErrorCode::Internal,
        _ => ErrorCode::Malformed,
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_owned()
    } else {
        text
    };
    let (_, body) = super::api::error(ErrorBody::new(code, None, message));
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn respond((status, body): Reply) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn submit(State(h): State<BrokerHandle>, body: Bytes) -> Response {
    respond(call(&h, Call::Submit(body)).await)
}

/// `GET /v1/jobs?cursor=…&limit=…&scope=…&tenant=…&state=…&site=…&from_ms=…&to_ms=…`: the parameters become a
/// `JobListRequest`, checked like any body.
async fn list_jobs(
    State(h): State<BrokerHandle>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let body = query_body(q, &["limit", "from_ms", "to_ms"]);
    respond(call(&h, Call::ListJobs(body)).await)
}

/// Query parameters as the JSON body of the same call (numbers where the call takes numbers), so they are
/// checked like a body: an unknown or bad parameter is named in the error.
fn query_body(q: std::collections::BTreeMap<String, String>, numeric: &[&str]) -> Bytes {
    let mut body = serde_json::Map::new();
    body.insert("v".into(), 1.into());
    for (k, v) in q {
        let value = if numeric.contains(&k.as_str()) {
            v.parse::<u64>()
                .map_or(serde_json::Value::String(v), Into::into)
        } else {
            serde_json::Value::String(v)
        };
        body.insert(k, value);
    }
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

async fn get_job(State(h): State<BrokerHandle>, Path(id): Path<String>) -> Response {
    respond(call(&h, Call::GetJob(id)).await)
}

async fn cancel(State(h): State<BrokerHandle>, Path(id): Path<String>) -> Response {
    respond(call(&h, Call::Cancel(id)).await)
}

async fn explain(State(h): State<BrokerHandle>, Path(id): Path<String>) -> Response {
    respond(call(&h, Call::Explain(id)).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinesParam {
    lines: Option<u32>,
}

async fn logs(
    State(h): State<BrokerHandle>,
    Path(id): Path<String>,
    Query(q): Query<LinesParam>,
) -> Response {
    respond(call(&h, Call::Logs(id, q.lines.unwrap_or(100))).await)
}

/// `GET /v1/report?tenant=T&from_ms=A&to_ms=B`: the parameters become a `ReportRequest`, checked like any
/// body (a bad value is named in the error).
async fn report(
    State(h): State<BrokerHandle>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let bytes = query_body(q, &["from_ms", "to_ms"]);
    respond(call(&h, Call::Report(bytes)).await)
}

/// The bearer token of an `Authorization` header.
fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_owned)
}

async fn get_tenancy(State(h): State<BrokerHandle>, headers: axum::http::HeaderMap) -> Response {
    respond(
        call(
            &h,
            Call::Tenancy {
                token: bearer(&headers),
                toml: None,
            },
        )
        .await,
    )
}

async fn get_format(State(h): State<BrokerHandle>, headers: axum::http::HeaderMap) -> Response {
    let token = bearer(&headers);
    respond(
        call(
            &h,
            Call::Format {
                token,
                upgrade: false,
            },
        )
        .await,
    )
}

/// `POST /v1/admin/journal/upgrade-format`: write the journal in the newest durable format from now on.
async fn upgrade_format(State(h): State<BrokerHandle>, headers: axum::http::HeaderMap) -> Response {
    let token = bearer(&headers);
    respond(
        call(
            &h,
            Call::Format {
                token,
                upgrade: true,
            },
        )
        .await,
    )
}

/// `PUT /v1/admin/tenancy`: the body is the new tenancy file (TOML); `Authorization: Bearer TOKEN`.
async fn put_tenancy(
    State(h): State<BrokerHandle>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let toml = String::from_utf8_lossy(&body).into_owned();
    respond(
        call(
            &h,
            Call::Tenancy {
                token: bearer(&headers),
                toml: Some(toml),
            },
        )
        .await,
    )
}

async fn scale_in(State(h): State<BrokerHandle>, body: Bytes) -> Response {
    respond(call(&h, Call::ScaleIn(body)).await)
}

async fn list_sites(State(h): State<BrokerHandle>) -> Response {
    respond(call(&h, Call::ListSites).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    #[serde(default = "yes")]
    drain: bool,
}

fn yes() -> bool {
    true
}

async fn drain(State(h): State<BrokerHandle>, Path(id): Path<String>, body: Bytes) -> Response {
    let drain = if body.is_empty() {
        true
    } else {
        match serde_json::from_slice::<DrainBody>(&body) {
            Ok(b) => b.drain,
            Err(e) => {
                return respond((
                    400,
                    serde_json::to_vec(&meridian_federation::ApiReply::<()>::err(
                        meridian_federation::ErrorBody::new(
                            meridian_federation::ErrorCode::Malformed,
                            None,
                            format!("drain body: {e}"),
                        ),
                    ))
                    .unwrap_or_default(),
                ))
            }
        }
    };
    respond(call(&h, Call::Drain(id, drain)).await)
}
