//! The HTTP JSON API (axum). Routes map onto [`super::api::Call`]; bodies are the wire types.

use super::api::{call, Call, Reply};
use super::BrokerHandle;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use meridian_federation::{ErrorBody, ErrorCode};
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
        .route("/v1/queues", get(queues))
        .route("/v1/jobs/{id}", get(get_job).delete(cancel))
        .route("/v1/jobs/{id}/explain", get(explain))
        .route("/v1/jobs/{id}/logs", get(logs))
        .route("/v1/jobs/{id}/timeline", get(timeline))
        .route("/v1/sites", get(list_sites))
        .route("/v1/sites/{id}/drain", post(drain))
        .route("/v1/services/scale-in", post(scale_in))
        .route("/v1/services", post(deploy_service).get(list_services))
        .route(
            "/v1/services/{name}",
            get(show_service).delete(delete_service),
        )
        .route("/v1/services/{name}/demand", post(service_demand))
        .route("/v1/services/{name}/routes", get(service_routes))
        .route("/v1/report", get(report))
        .route("/v1/admin/history", get(history))
        .route("/v1/admin/tenancy", get(get_tenancy).put(put_tenancy))
        .route("/v1/admin/journal/format", get(get_format))
        .route("/v1/admin/journal/upgrade-format", post(upgrade_format))
        .route("/v1/admin/journal/quarantine/{seq}", post(quarantine))
        .route("/v1/admin/tokens", post(create_token).get(list_tokens))
        .route("/v1/admin/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/v1/admin/sites/{id}/revoke", post(revoke_site))
        .route("/v1/admin/sites/{id}/restore", post(restore_site))
        .route("/v1/admin/audit", get(audit))
        .route("/metrics", get(metrics))
        .route("/v1/session", post(sign_in).get(session).delete(sign_out))
        .merge(super::dashboard::router())
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(
            meridian_federation::MAX_MESSAGE_BYTES + 1,
        ))
        .layer(axum::middleware::from_fn(bounded_body))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(h)
}

/// The most of an oversized body read (and dropped) so that its sender gets the 413 answer: an HTTP/2
/// server that answers before the body ends resets the stream, and clients then report a framing error
/// instead of the answer.
const DRAIN_BYTES: usize = 64 << 20;
/// How long an oversized body is read for.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads a request's body up to the message limit; over it, reads the rest (bounded by [`DRAIN_BYTES`] and
/// [`DRAIN_FOR`]) and answers 413 in the API's JSON shape.
async fn bounded_body(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use futures::StreamExt;
    let limit = meridian_federation::MAX_MESSAGE_BYTES;
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut total = 0usize;
    let read = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { return false };
            total += chunk.len();
            if total <= limit {
                kept.extend_from_slice(&chunk);
            } else if total > DRAIN_BYTES {
                break;
            }
        }
        true
    })
    .await;
    if total > limit {
        let (_, body) = super::api::error(ErrorBody::new(
            ErrorCode::TooLarge,
            None,
            format!("the request body is over the limit of {limit} bytes"),
        ));
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
    }
    if !matches!(read, Ok(true)) {
        return respond(super::api::error(ErrorBody::new(
            ErrorCode::Malformed,
            None,
            "the request body could not be read",
        )));
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(kept),
    ))
    .await
}

async fn no_route(uri: axum::http::Uri) -> Response {
    not_found(uri.path())
}

/// 404 in the API's JSON shape.
pub(super) fn not_found(path: &str) -> Response {
    respond(super::api::error(ErrorBody::new(
        ErrorCode::NotFound,
        None,
        format!("no API call at {path}"),
    )))
}

/// Every error answers in the API's JSON shape, those the router and extractors make too (a wrong method, a
/// bad path or query, a body over the limit): their plain text becomes the message.
async fn json_errors(response: Response) -> Response {
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
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.clone(),
    )
        .into_response();
    match status {
        // Refused for want of a token: say how to authenticate.
        401 => {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        // Rate-limited: say when to try again, in whole seconds.
        429 => {
            let wait_ms = serde_json::from_slice::<meridian_federation::ApiReply<()>>(&body)
                .ok()
                .and_then(|r| r.into_result().err())
                .and_then(|e| e.retry_after_ms)
                .unwrap_or(1000);
            if let Ok(v) =
                axum::http::HeaderValue::from_str(&wait_ms.div_ceil(1000).max(1).to_string())
            {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        _ => {}
    }
    response
}

/// The bearer token of an `Authorization` header.
fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_owned)
}

/// The dashboard's session cookie: the token itself, `HttpOnly` (no script reads it), `SameSite=Strict` (no
/// other site's page makes the browser send it) and `Secure`.
const SESSION_COOKIE: &str = "meridian_session";
/// How long a dashboard session lasts (the token's own expiry and revocation still apply).
const SESSION_MAX_AGE_S: u64 = 12 * 3600;

/// The token of the dashboard's session cookie.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

/// The token a call is made with: the `Authorization` header's; for a call that only reads, else the session
/// cookie's.
fn token_for(headers: &HeaderMap, c: &Call) -> Option<String> {
    bearer(headers).or_else(|| c.reads_only().then(|| session_cookie(headers)).flatten())
}

/// `POST /v1/session` with `Authorization: Bearer TOKEN`: signs a browser in. The token is checked; the reply
/// (a `SessionView`) sets the session cookie the dashboard reads with.
async fn sign_in(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        return respond(super::api::error(ErrorBody::new(
            ErrorCode::Unauthenticated,
            None,
            "signing in needs the token in an Authorization: Bearer header".to_owned(),
        )));
    };
    // A token is `mrd_<id>_<secret>` (or the bootstrap token): nothing that could break out of a cookie.
    if !token
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.~+/=".contains(c))
    {
        return respond(super::api::error(ErrorBody::new(
            ErrorCode::Unauthenticated,
            None,
            "the token holds characters no token has".to_owned(),
        )));
    }
    let reply = call(&h, Some(&token), Call::Session).await;
    let ok = reply.0 == 200;
    let mut response = respond(reply);
    if ok {
        let cookie = format!(
            "{SESSION_COOKIE}={token}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={SESSION_MAX_AGE_S}"
        );
        if let Ok(v) = axum::http::HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, v);
        }
    }
    response
}

/// `GET /v1/session`: who the session (or the `Authorization` header) speaks for.
async fn session(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    run(&h, &headers, Call::Session).await
}

/// `DELETE /v1/session`: signs the browser out (the cookie is cleared; the token itself stays valid).
async fn sign_out() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            format!("{SESSION_COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0"),
        )],
    )
        .into_response()
}

/// `GET /metrics`: the OpenMetrics text Prometheus scrapes, for an administrator's token (errors in JSON).
async fn metrics(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    match call(
        &h,
        token_for(&headers, &Call::Metrics).as_deref(),
        Call::Metrics,
    )
    .await
    {
        (200, text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        refused => respond(refused),
    }
}

/// Carries out a call for the caller the request's token names.
async fn run(h: &BrokerHandle, headers: &HeaderMap, c: Call) -> Response {
    let token = token_for(headers, &c);
    respond(call(h, token.as_deref(), c).await)
}

async fn submit(State(h): State<BrokerHandle>, headers: HeaderMap, body: Bytes) -> Response {
    run(&h, &headers, Call::Submit(body)).await
}

/// `GET /v1/jobs?cursor=…&limit=…&scope=…&tenant=…&state=…&site=…&from_ms=…&to_ms=…`: the parameters become a
/// `JobListRequest`, checked like any body.
async fn list_jobs(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let body = query_body(q, &["limit", "from_ms", "to_ms"]);
    run(&h, &headers, Call::ListJobs(body)).await
}

async fn queues(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let body = query_body(q, &["head"]);
    run(&h, &headers, Call::Queues(body)).await
}

/// Query parameters that are flags (`true` or `false`) in every call that takes them.
const FLAGS: &[&str] = &["newest_first"];

/// Query parameters as the JSON body of the same call (numbers where the call takes numbers), so they are
/// checked like a body: an unknown or bad parameter is named in the error.
fn query_body(q: std::collections::BTreeMap<String, String>, numeric: &[&str]) -> Bytes {
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
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

async fn get_job(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    run(&h, &headers, Call::GetJob(id)).await
}

async fn cancel(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    run(&h, &headers, Call::Cancel(id)).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainParam {
    /// Every site of the federation, as placement weighs the job now.
    #[serde(default)]
    all: bool,
}

async fn explain(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<ExplainParam>,
) -> Response {
    run(&h, &headers, Call::Explain(id, q.all)).await
}

async fn timeline(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    run(&h, &headers, Call::Timeline(id)).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinesParam {
    lines: Option<u32>,
}

async fn logs(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<LinesParam>,
) -> Response {
    run(&h, &headers, Call::Logs(id, q.lines.unwrap_or(100))).await
}

/// `GET /v1/report?tenant=T&from_ms=A&to_ms=B`: the parameters become a `ReportRequest`, checked like any
/// body (a bad value is named in the error).
async fn report(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let bytes = query_body(q, &["from_ms", "to_ms"]);
    run(&h, &headers, Call::Report(bytes)).await
}

/// `GET /v1/admin/history?from_ms=A`: the jobs submitted from `A` on, live and archived (a `HistoryRequest`).
async fn history(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let bytes = query_body(q, &["from_ms"]);
    run(&h, &headers, Call::History(bytes)).await
}

async fn get_tenancy(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    run(&h, &headers, Call::Tenancy(None)).await
}

async fn get_format(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    run(&h, &headers, Call::Format { upgrade: false }).await
}

/// `POST /v1/admin/journal/upgrade-format`: write the journal in the newest durable format from now on.
async fn upgrade_format(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    run(&h, &headers, Call::Format { upgrade: true }).await
}

/// `POST /v1/admin/journal/quarantine/{seq}`: set aside the journal message the broker cannot read.
async fn quarantine(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(seq): Path<String>,
) -> Response {
    match seq.parse::<u64>() {
        Ok(seq) => run(&h, &headers, Call::Quarantine(seq)).await,
        Err(_) => respond(super::api::error(meridian_federation::ErrorBody::new(
            meridian_federation::ErrorCode::Invalid,
            Some("seq".into()),
            format!("{seq:?} is not a journal sequence number"),
        ))),
    }
}

/// `PUT /v1/admin/tenancy`: the body is the new tenancy file (TOML).
async fn put_tenancy(State(h): State<BrokerHandle>, headers: HeaderMap, body: Bytes) -> Response {
    let toml = String::from_utf8_lossy(&body).into_owned();
    run(&h, &headers, Call::Tenancy(Some(toml))).await
}

async fn deploy_service(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run(&h, &headers, Call::ServiceDeploy(body)).await
}

async fn list_services(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    run(&h, &headers, Call::Services(query_body(q, &[]))).await
}

/// A `ServiceRef` from the path's name and the query (`?tenant=T`).
fn service_ref(name: String, mut q: std::collections::BTreeMap<String, String>) -> Bytes {
    q.insert("name".into(), name);
    query_body(q, &[])
}

async fn show_service(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    run(&h, &headers, Call::Services(service_ref(name, q))).await
}

async fn delete_service(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    run(&h, &headers, Call::ServiceDelete(service_ref(name, q))).await
}

async fn service_routes(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    run(&h, &headers, Call::ServiceRoutes(service_ref(name, q))).await
}

/// `POST /v1/services/{name}/demand`: the body is a `DemandReport`; `service` may be left out (the path names
/// it) and must match when given.
async fn service_demand(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let merged = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(mut m)) => {
            match m.get("service").and_then(|v| v.as_str()) {
                Some(given) if given != name => {
                    return respond(super::api::error(meridian_federation::ErrorBody::new(
                        meridian_federation::ErrorCode::Invalid,
                        Some("service".into()),
                        format!("the body names service {given:?}; the path names {name:?}"),
                    )))
                }
                _ => {}
            }
            m.insert("service".into(), serde_json::Value::String(name));
            Bytes::from(serde_json::to_vec(&m).unwrap_or_default())
        }
        // Not an object: decoding says what is wrong with it.
        _ => body,
    };
    run(&h, &headers, Call::ServiceDemand(merged)).await
}

async fn scale_in(State(h): State<BrokerHandle>, headers: HeaderMap, body: Bytes) -> Response {
    run(&h, &headers, Call::ScaleIn(body)).await
}

async fn list_sites(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    run(&h, &headers, Call::ListSites).await
}

/// `POST /v1/admin/tokens`: a `TokenCreateRequest`; the reply shows the token once.
async fn create_token(State(h): State<BrokerHandle>, headers: HeaderMap, body: Bytes) -> Response {
    run(&h, &headers, Call::TokenCreate(body)).await
}

async fn list_tokens(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    run(&h, &headers, Call::TokenList).await
}

async fn revoke_token(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    run(&h, &headers, Call::TokenRevoke(id)).await
}

async fn revoke_site(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    run(&h, &headers, Call::SiteRevoke(id, false)).await
}

async fn restore_site(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    run(&h, &headers, Call::SiteRevoke(id, true)).await
}

/// `GET /v1/admin/audit?since_ms=…&who=…&after_seq=…&limit=…`.
async fn audit(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let body = query_body(q, &["since_ms", "after_seq", "limit"]);
    run(&h, &headers, Call::Audit(body)).await
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

async fn drain(
    State(h): State<BrokerHandle>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let drain = if body.is_empty() {
        true
    } else {
        match serde_json::from_slice::<DrainBody>(&body) {
            Ok(b) => b.drain,
            Err(e) => {
                return respond(super::api::error(meridian_federation::ErrorBody::new(
                    meridian_federation::ErrorCode::Malformed,
                    None,
                    format!("drain body: {e}"),
                )))
            }
        }
    };
    run(&h, &headers, Call::Drain(id, drain)).await
}
