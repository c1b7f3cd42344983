//! The operator's dashboard, served by the broker at `/`: static assets built into the binary (committed in
//! their built form in `dashboard/`, so nothing runs at build time). The page holds no data: it reads the
//! HTTP API with the session cookie a sign-in sets (`POST /v1/session`), as the token's roles allow.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// One embedded file: its name under `/dashboard/`, media type and bytes.
struct Asset {
    name: &'static str,
    media_type: &'static str,
    body: &'static [u8],
}

const INDEX: &[u8] = include_bytes!("dashboard/index.html");

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        media_type: "text/javascript; charset=utf-8",
        body: include_bytes!("dashboard/app.js"),
    },
    Asset {
        name: "app.css",
        media_type: "text/css; charset=utf-8",
        body: include_bytes!("dashboard/app.css"),
    },
    Asset {
        name: "topojson-client.min.js",
        media_type: "text/javascript; charset=utf-8",
        body: include_bytes!("dashboard/vendor/topojson-client.min.js"),
    },
    Asset {
        name: "countries-110m.json",
        media_type: "application/json",
        body: include_bytes!("dashboard/vendor/countries-110m.json"),
    },
];

/// Scripts, styles and data from the broker itself only; no frames, no inline script.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/dashboard/{file}", get(asset))
}

fn served(media_type: &'static str, body: &'static [u8]) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, media_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    served("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == file) {
        Some(a) => served(a.media_type, a.body),
        None => super::http::not_found(&format!("/dashboard/{file}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file the page names is served, and nothing else is.
    #[test]
    fn the_page_names_only_assets_that_are_served() {
        let page = String::from_utf8_lossy(INDEX);
        let named: Vec<&str> = page
            .split("/dashboard/")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert!(named.len() >= 3, "{named:?}");
        for n in &named {
            assert!(ASSETS.iter().any(|a| &a.name == n), "{n} is not served");
        }
        let app = String::from_utf8_lossy(ASSETS[0].body);
        assert!(app.contains("/dashboard/countries-110m.json"));
    }
}
