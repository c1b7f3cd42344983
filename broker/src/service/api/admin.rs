//! The federation's administration: sites, tenancy, the journal's format, API tokens, the audit, metrics,
//! and who a token is.

use super::{ApiError, ApiResult};
use crate::service::{Answer, BrokerHandle, Query};
use meridian_core::access::{parse_role, Principal, Role, TokenRecord};
use meridian_core::reactor::Event;
use meridian_federation::{
    AuditPage, AuditRequest, Empty, ErrorCode, FormatView, SessionView, SiteId, SiteView,
    TenancyView, TokenCreateRequest, TokenCreated, TokenView, UnreadableView, VersionView,
    WIRE_VERSION,
};

/// A page of sites stops before its body reaches this, well under NATS's 1 MiB payload limit.
const PAGE_BYTES: usize = 768 * 1024;

/// The sites asked for; a page (`limit`) also stops short of [`PAGE_BYTES`].
pub async fn sites(
    h: &BrokerHandle,
    req: meridian_federation::SiteListRequest,
) -> ApiResult<Vec<SiteView>> {
    let paged = req.limit.is_some();
    let mut v = match h.query(Query::Sites(req)).await {
        Some(Answer::Sites(v)) => v,
        _ => return Err(ApiError::unavailable()),
    };
    if paged {
        let mut bytes = 0;
        let fit = v
            .iter()
            .position(|s| {
                bytes += serde_json::to_vec(s).map_or(0, |b| b.len() + 1);
                bytes >= PAGE_BYTES
            })
            .unwrap_or(v.len());
        // At least one site, so that a reader moves on.
        v.truncate(fit.max(1));
    }
    Ok(v)
}

pub async fn drain(
    h: &BrokerHandle,
    who: &Principal,
    site: SiteId,
    drain: bool,
) -> ApiResult<SiteView> {
    let event = Event::Drain {
        site: site.clone(),
        drain,
    };
    h.step_as(who, event).await?;
    sites(h, Default::default())
        .await?
        .into_iter()
        .find(|s| s.site == site)
        .ok_or_else(|| ApiError::not_found(format!("site {site}")))
}

/// Revokes a site, or (`restore`) lets it back in.
pub async fn revoke_site(
    h: &BrokerHandle,
    who: &Principal,
    site: SiteId,
    restore: bool,
) -> ApiResult<Empty> {
    let event = if restore {
        Event::SiteRestored { site }
    } else {
        Event::SiteRevoked { site }
    };
    h.step_as(who, event).await?;
    Ok(Empty { v: WIRE_VERSION })
}

pub async fn tenancy(h: &BrokerHandle) -> ApiResult<TenancyView> {
    match h.query(Query::Tenancy).await {
        Some(Answer::Tenancy(toml)) => Ok(TenancyView { toml }),
        _ => Err(ApiError::unavailable()),
    }
}

pub async fn set_tenancy(
    h: &BrokerHandle,
    who: &Principal,
    toml: String,
) -> ApiResult<TenancyView> {
    let event = Event::SetTenancy {
        toml,
        from_file: false,
    };
    h.step_as(who, event).await?;
    tenancy(h).await
}

/// The journal's format, and the message that keeps the broker read-only if one does.
pub async fn format(h: &BrokerHandle) -> ApiResult<FormatView> {
    match h.query(Query::Format).await {
        Some(Answer::Format(format, unreadable)) => Ok(FormatView {
            format,
            newest: meridian_core::durable::FORMAT_VERSION,
            unreadable: unreadable.map(|(seq, reason)| UnreadableView { seq, reason }),
        }),
        _ => Err(ApiError::unavailable()),
    }
}

pub async fn upgrade_format(h: &BrokerHandle, who: &Principal) -> ApiResult<FormatView> {
    let to = meridian_core::durable::FORMAT_VERSION;
    h.step_as(who, Event::UpgradeFormat { to }).await?;
    format(h).await
}

pub async fn quarantine(h: &BrokerHandle, who: &Principal, seq: u64) -> ApiResult<FormatView> {
    h.quarantine(who, seq)
        .await
        .map_err(|why| ApiError::new(ErrorCode::Conflict, Some("seq"), format!("{why:#}")))?;
    format(h).await
}

/// Tokens live 90 days unless asked otherwise, at most two years.
const TOKEN_DEFAULT_S: u64 = 90 * 24 * 3600;
const TOKEN_MAX_S: u64 = 2 * 365 * 24 * 3600;

/// Makes a token: a new id and secret; only the secret's hash is journaled. The reply shows the token once.
pub async fn create_token(
    h: &BrokerHandle,
    who: &Principal,
    req: TokenCreateRequest,
) -> ApiResult<TokenCreated> {
    let (admin, grants) = roles(&req)?;
    let life = req.expires_in_s.unwrap_or(TOKEN_DEFAULT_S);
    if life == 0 || life > TOKEN_MAX_S {
        return Err(ApiError::invalid(
            "expires_in_s",
            format!("must be between 1 s and {TOKEN_MAX_S} s (two years)"),
        ));
    }
    let (id, secret, token) =
        crate::service::auth::new_token().map_err(|e| ApiError::internal(e.to_string()))?;
    let now = crate::service::now_ms();
    let record = TokenRecord {
        id,
        name: req.name.unwrap_or_default(),
        hash: crate::service::auth::hash_secret(&secret),
        tenant: req.tenant,
        admin,
        grants,
        created_ms: now,
        expires_ms: now.saturating_add(life.saturating_mul(1000)),
        created_by: who.id.clone(),
        revoked_ms: None,
    };
    let view = token_view(&record);
    h.step_as(who, Event::TokenCreated(record)).await?;
    Ok(TokenCreated { token, view })
}

/// A new token's roles: whether it is an administrator's, and its grants, checked against its tenant.
fn roles(req: &TokenCreateRequest) -> ApiResult<(bool, Vec<meridian_core::access::Grant>)> {
    let mut admin = false;
    let mut grants = Vec::new();
    for r in &req.roles {
        match parse_role(r) {
            Ok(Role::Admin) => admin = true,
            Ok(Role::Grants(g)) => grants.extend(g),
            Err(e) => return Err(ApiError::invalid("roles", e.to_string())),
        }
    }
    if admin && req.tenant.is_some() {
        return Err(ApiError::invalid(
            "tenant",
            "an administrator's token acts for every tenant: leave the tenant out",
        ));
    }
    if !admin && req.tenant.is_none() && !meridian_core::access::reads_only(&grants) {
        return Err(ApiError::invalid(
            "tenant",
            "a token that is not an administrator's acts for one tenant (name it), unless it only reads: \
             `--role viewer` without a tenant is a federation-wide viewer",
        ));
    }
    Ok((admin, grants))
}

pub async fn tokens(h: &BrokerHandle) -> ApiResult<Vec<TokenView>> {
    match h.query(Query::Tokens).await {
        Some(Answer::Tokens(tokens)) => Ok(tokens.iter().map(token_view).collect()),
        _ => Err(ApiError::unavailable()),
    }
}

pub async fn revoke_token(h: &BrokerHandle, who: &Principal, id: String) -> ApiResult<TokenView> {
    h.step_as(who, Event::TokenRevoked { id: id.clone() })
        .await?;
    match h.query(Query::Tokens).await {
        Some(Answer::Tokens(tokens)) => tokens
            .iter()
            .find(|t| t.id == id)
            .map(token_view)
            .ok_or_else(|| ApiError::not_found(format!("token {id}"))),
        _ => Err(ApiError::unavailable()),
    }
}

/// How the API shows a token: never its secret or hash.
fn token_view(t: &TokenRecord) -> TokenView {
    let mut roles: Vec<String> = t
        .grants
        .iter()
        .map(|g| {
            // Queues, or a gateway's services: what the role was written with.
            let names: Vec<&str> = g
                .queues
                .iter()
                .map(|q| q.as_str())
                .chain(g.services.iter().map(|s| s.as_str()))
                .collect();
            if names.is_empty() {
                g.verb.as_str().to_owned()
            } else {
                format!("{}:{}", g.verb.as_str(), names.join(","))
            }
        })
        .collect();
    if t.admin {
        roles.insert(0, "admin".into());
    }
    TokenView {
        id: t.id.clone(),
        name: t.name.clone(),
        tenant: t.tenant.clone(),
        roles,
        created_ms: t.created_ms,
        expires_ms: t.expires_ms,
        created_by: t.created_by.clone(),
        revoked: t.revoked_ms.is_some(),
    }
}

pub async fn audit(h: &BrokerHandle, req: AuditRequest) -> ApiResult<AuditPage> {
    h.audit.read(&req).await.map_err(|e| {
        ApiError::new(
            ErrorCode::Unavailable,
            None,
            format!("the audit could not be read: {e:#}"),
        )
    })
}

/// The metrics, in the OpenMetrics text format.
pub async fn metrics(h: &BrokerHandle) -> ApiResult<String> {
    match h.query(Query::Gauges).await {
        Some(Answer::Gauges(g)) => Ok(h.metrics.render(&g, crate::service::now_ms())),
        _ => Err(ApiError::unavailable()),
    }
}

pub fn session(who: &Principal) -> SessionView {
    SessionView {
        who: who.id.clone(),
        tenant: who.tenant.clone(),
        admin: who.admin,
    }
}

pub fn version() -> VersionView {
    VersionView {
        v: WIRE_VERSION,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        wire: WIRE_VERSION,
        format: meridian_core::durable::FORMAT_VERSION,
    }
}
