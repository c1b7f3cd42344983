//! The HTTP edge (axum): every route of the call table (`api::calls`) decodes its request into a typed call
//! and runs it; the dashboard's session and files are served beside them. Bodies are the wire types.

use super::api::{self, ApiError, CallDef, HttpIn, Reply, Request};
use super::BrokerHandle;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawPathParams, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodFilter, MethodRouter};
use axum::Router;
use meridian_federation::ErrorCode;
use std::collections::BTreeMap;

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
    let mut routes: BTreeMap<&'static str, MethodRouter<BrokerHandle>> = BTreeMap::new();
    for def in api::CALLS {
        for route in def.http {
            let filter = match route.method {
                api::calls::Method::Get => MethodFilter::GET,
                api::calls::Method::Post => MethodFilter::POST,
                api::calls::Method::Put => MethodFilter::PUT,
                api::calls::Method::Delete => MethodFilter::DELETE,
            };
            let decode = route.decode;
            let served = move |State(h): State<BrokerHandle>,
                               headers: HeaderMap,
                               params: RawPathParams,
                               uri: Uri,
                               body: Bytes| async move {
                serve_route(&h, def, decode, &headers, params, uri, body).await
            };
            let methods = routes.remove(route.path).unwrap_or_default();
            routes.insert(route.path, methods.on(filter, served));
        }
    }
    let session = routes
        .remove("/v1/session")
        .unwrap_or_default()
        .merge(post(sign_in).delete(sign_out));
    routes.insert("/v1/session", session);
    routes
        .into_iter()
        .fold(Router::new(), |r, (path, methods)| r.route(path, methods))
        .merge(super::dashboard::router())
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(
            meridian_federation::MAX_MESSAGE_BYTES + 1,
        ))
        .layer(axum::middleware::from_fn(bounded_body))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(h)
}

/// Decodes a request by its route's decoder and carries out the call for the caller its token names.
async fn serve_route(
    h: &BrokerHandle,
    def: &'static CallDef,
    decode: fn(HttpIn) -> api::ApiResult<api::Call>,
    headers: &HeaderMap,
    params: RawPathParams,
    uri: Uri,
    body: Bytes,
) -> Response {
    let input = HttpIn {
        params: params
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        uri,
        body,
    };
    let call = decode(input);
    let token = token_for(headers, def);
    let req = Request {
        action: def.action,
        call,
    };
    match api::handle(h, token.as_deref(), None, req).await {
        Ok(reply) => (
            StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK),
            [(header::CONTENT_TYPE, def.content_type)],
            reply.body,
        )
            .into_response(),
        Err(e) => refused(e),
    }
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
        return refused(ApiError::new(
            ErrorCode::TooLarge,
            None,
            format!("the request body is over the limit of {limit} bytes"),
        ));
    }
    if !matches!(read, Ok(true)) {
        return refused(ApiError::new(
            ErrorCode::Malformed,
            None,
            "the request body could not be read",
        ));
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
    refused(ApiError::new(
        ErrorCode::NotFound,
        None,
        format!("no API call at {path}"),
    ))
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
    let Reply { body, .. } = ApiError::new(code, None, message).into_reply();
    (status, [(header::CONTENT_TYPE, api::calls::JSON)], body).into_response()
}

/// An error in the API's JSON shape, with the headers its status calls for.
fn refused(e: ApiError) -> Response {
    let retry_after_ms = e.0.retry_after_ms;
    let Reply { status, body } = e.into_reply();
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (code, [(header::CONTENT_TYPE, api::calls::JSON)], body).into_response();
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
            let wait_ms = retry_after_ms.unwrap_or(1000);
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
fn token_for(headers: &HeaderMap, def: &CallDef) -> Option<String> {
    bearer(headers).or_else(|| {
        def.access
            .reads_only()
            .then(|| session_cookie(headers))
            .flatten()
    })
}

/// `POST /v1/session` with `Authorization: Bearer TOKEN`: signs a browser in. The token is checked; the reply
/// (a `SessionView`) sets the session cookie the dashboard reads with.
async fn sign_in(State(h): State<BrokerHandle>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        return refused(ApiError::new(
            ErrorCode::Unauthenticated,
            None,
            "signing in needs the token in an Authorization: Bearer header",
        ));
    };
    // A token is `mrd_<id>_<secret>` (or the bootstrap token): nothing that could break out of a cookie.
    if !token
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.~+/=".contains(c))
    {
        return refused(ApiError::new(
            ErrorCode::Unauthenticated,
            None,
            "the token holds characters no token has",
        ));
    }
    let req = Request {
        action: api::calls::SESSION.action,
        call: Ok(api::Call::Session),
    };
    let reply = match api::handle(&h, Some(&token), None, req).await {
        Ok(reply) => reply,
        Err(e) => return refused(e),
    };
    let mut response = ([(header::CONTENT_TYPE, api::calls::JSON)], reply.body).into_response();
    {
        let cookie = format!(
            "{SESSION_COOKIE}={token}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={SESSION_MAX_AGE_S}"
        );
        if let Ok(v) = axum::http::HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, v);
        }
    }
    response
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
