//! Who is calling the API, and whether they are calling too fast.
//!
//! A token is `mrd_<id>_<secret>`: the id is public (the credential id in the audit), the secret is 32 random
//! bytes, and the broker keeps only the secret's SHA-256 (journaled with the token's tenant, roles and expiry).
//! The broker's bootstrap administrator token (`--admin-token`) is compared the same way, by digest, in
//! constant time. Expiry is judged here, at the API, against the clock; the core never sees time-dependent
//! checks.
//!
//! Rate limits are token buckets (the `governor` crate) per tenant and per site: a tenant's excess calls are
//! answered "slow down" (HTTP 429 with `Retry-After`) before they reach the reactor, so one tenant's flood does
//! not slow another's calls. Administrators are not limited. Calls that fail authentication are limited per
//! NATS identity (HTTP's together, as `anonymous`), so a credential without a token cannot keep the broker busy refusing.

use meridian_core::access::{Principal, TokenRecord};
use meridian_federation::{ErrorBody, ErrorCode, SiteId};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The prefix of every API token.
pub const TOKEN_PREFIX: &str = "mrd_";

/// The API tokens the broker knows, as the reactor last published them.
pub type Tokens = Arc<BTreeMap<String, TokenRecord>>;

/// A rate limiter per key: a tenant or identity's name, or a site (keyed by its id as it came, so that a
/// site's message is admitted without a copy of its name).
type Limiter<K = String> = governor::DefaultKeyedRateLimiter<K>;

/// Authentication and rate limits, shared by the API front ends.
pub struct Auth {
    /// Every caller is an administrator (an insecure broker).
    insecure: bool,
    /// SHA-256 of the bootstrap administrator token.
    admin: Option<[u8; 32]>,
    tokens: tokio::sync::watch::Receiver<Tokens>,
    tenants: Option<Limiter>,
    sites: Option<Limiter<SiteId>>,
    /// Calls that failed authentication, per NATS identity (HTTP's together, as `anonymous`): a flood of them is answered
    /// "slow down" before any token is looked at.
    strangers: Option<Limiter>,
}

/// Calls per second and burst.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub per_s: u32,
    pub burst: u32,
}

fn limiter<K: Clone + Eq + std::hash::Hash>(rate: Rate) -> Option<Limiter<K>> {
    let per_s = NonZeroU32::new(rate.per_s)?;
    let burst = NonZeroU32::new(rate.burst.max(rate.per_s)).unwrap_or(per_s);
    Some(governor::RateLimiter::keyed(
        governor::Quota::per_second(per_s).allow_burst(burst),
    ))
}

fn digest(s: &[u8]) -> [u8; 32] {
    Sha256::digest(s).into()
}

/// Hex SHA-256 of a token's secret part: what the broker keeps.
pub fn hash_secret(secret: &str) -> String {
    digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new token: its id, and the whole token (`mrd_<id>_<secret>`), shown once.
pub fn new_token() -> anyhow::Result<(String, String, String)> {
    let mut id = [0u8; 6];
    getrandom::getrandom(&mut id).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let secret = crate::creds::random_hex()?;
    let token = format!("{TOKEN_PREFIX}{id}_{secret}");
    Ok((id, secret, token))
}

fn unauthenticated(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::Unauthenticated, None, message)
}

impl Auth {
    pub fn new(
        insecure: bool,
        admin_token: Option<&str>,
        tokens: tokio::sync::watch::Receiver<Tokens>,
        tenant_rate: Rate,
        site_rate: Rate,
    ) -> Self {
        Auth {
            insecure,
            admin: admin_token
                .filter(|t| !t.is_empty())
                .map(|t| digest(t.as_bytes())),
            tokens,
            tenants: limiter(tenant_rate),
            sites: limiter(site_rate),
            strangers: limiter(tenant_rate),
        }
    }

    /// The principal a bearer token stands for, at `now`; a refusal says why (never echoing the token).
    pub fn authenticate(&self, bearer: Option<&str>, now: u64) -> Result<Principal, ErrorBody> {
        if self.insecure {
            return Ok(Principal::administrator("anonymous"));
        }
        let Some(token) = bearer.map(str::trim).filter(|t| !t.is_empty()) else {
            return Err(unauthenticated(
                "this call needs an API token: send `Authorization: Bearer <token>` (`meridian token create`)",
            ));
        };
        if let Some(admin) = &self.admin {
            if bool::from(digest(token.as_bytes()).ct_eq(admin)) {
                return Ok(Principal::administrator("admin"));
            }
        }
        let Some((id, secret)) = token
            .strip_prefix(TOKEN_PREFIX)
            .and_then(|rest| rest.split_once('_'))
        else {
            return Err(unauthenticated("not a valid API token"));
        };
        let tokens = self.tokens.borrow().clone();
        let Some(record) = tokens.get(id) else {
            return Err(unauthenticated("not a valid API token"));
        };
        let want = record.hash.as_bytes();
        let got = hash_secret(secret);
        if !bool::from(got.as_bytes().ct_eq(want)) {
            return Err(unauthenticated("not a valid API token"));
        }
        if record.revoked_ms.is_some() {
            return Err(unauthenticated(format!("token {id} was revoked")));
        }
        if record.expires_ms <= now {
            return Err(unauthenticated(format!(
                "token {id} expired at {} ms since the epoch",
                record.expires_ms
            )));
        }
        Ok(record.principal())
    }

    /// Whether the caller may call now; else how long to wait, ms.
    pub fn admit(&self, who: &Principal) -> Result<(), u64> {
        if who.admin {
            return Ok(());
        }
        let key = who
            .tenant
            .as_ref()
            .map_or_else(|| who.id.clone(), |t| t.to_string());
        check(self.tenants.as_ref(), &key)
    }

    /// Whether a call from `identity` (`nats:<identity>`, or `anonymous` over HTTP) that failed authentication is answered
    /// now; else how long to wait, ms.
    pub fn admit_stranger(&self, identity: &str) -> Result<(), u64> {
        check(self.strangers.as_ref(), &identity.to_owned())
    }

    /// Whether a site's message is taken now; else how long it should wait, ms.
    pub fn admit_site(&self, site: &SiteId) -> Result<(), u64> {
        check(self.sites.as_ref(), site)
    }
}

fn check<K: Clone + Eq + std::hash::Hash>(
    limiter: Option<&Limiter<K>>,
    key: &K,
) -> Result<(), u64> {
    let Some(l) = limiter else { return Ok(()) };
    l.check_key(key).map_err(|not_until| {
        let wait = not_until.wait_time_from(governor::clock::Clock::now(
            &governor::clock::DefaultClock::default(),
        ));
        (wait.as_millis() as u64).max(1)
    })
}

/// The error of a rate-limited call.
pub fn slow_down(retry_after_ms: u64, whose: &str) -> ErrorBody {
    let mut e = ErrorBody::new(
        ErrorCode::RateLimited,
        None,
        format!("too many calls from {whose}: slow down and try again in {retry_after_ms} ms"),
    );
    e.retry_after_ms = Some(retry_after_ms);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::access::{Grant, Verb};

    fn auth(tokens: Vec<TokenRecord>) -> Auth {
        let map: BTreeMap<String, TokenRecord> =
            tokens.into_iter().map(|t| (t.id.clone(), t)).collect();
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(map));
        Auth::new(
            false,
            Some("bootstrap"),
            rx,
            Rate { per_s: 2, burst: 2 },
            Rate { per_s: 0, burst: 0 },
        )
    }

    fn record(id: &str, secret: &str, expires_ms: u64, revoked: bool) -> TokenRecord {
        TokenRecord {
            id: id.into(),
            name: String::new(),
            hash: hash_secret(secret),
            tenant: Some(meridian_federation::TenantId::new("a").unwrap_or_else(|e| panic!("{e}"))),
            admin: false,
            grants: vec![Grant {
                verb: Verb::Watch,
                queues: vec![],
                services: vec![],
            }],
            created_ms: 1,
            expires_ms,
            created_by: "admin".into(),
            revoked_ms: revoked.then_some(5),
        }
    }

    #[test]
    fn tokens_are_checked_by_hash_expiry_and_revocation() {
        let a = auth(vec![
            record("aa", "s1", 100, false),
            record("bb", "s2", 100, true),
        ]);
        assert_eq!(
            a.authenticate(Some("mrd_aa_s1"), 50).map(|p| p.id),
            Ok("aa".into())
        );
        let msg = |r: Result<Principal, ErrorBody>| {
            r.err()
                .map(|e| (e.code, e.message))
                .unwrap_or_else(|| panic!("accepted"))
        };
        assert_eq!(
            msg(a.authenticate(Some("mrd_aa_wrong"), 50)).0,
            ErrorCode::Unauthenticated
        );
        assert!(msg(a.authenticate(Some("mrd_aa_s1"), 100))
            .1
            .contains("expired"));
        assert!(msg(a.authenticate(Some("mrd_bb_s2"), 50))
            .1
            .contains("revoked"));
        assert!(msg(a.authenticate(None, 50))
            .1
            .contains("Authorization: Bearer"));
        assert!(msg(a.authenticate(Some("guess"), 50))
            .1
            .contains("not a valid"));
        let admin = a
            .authenticate(Some("bootstrap"), 50)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(admin.admin && admin.id == "admin");
        // A refusal never repeats the token it was given.
        assert!(!msg(a.authenticate(Some("mrd_aa_wrong"), 50))
            .1
            .contains("wrong"));
    }

    #[test]
    fn a_tenant_over_its_rate_waits_and_administrators_do_not() {
        let a = auth(vec![record("aa", "s1", u64::MAX, false)]);
        let p = a
            .authenticate(Some("mrd_aa_s1"), 1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(a.admit(&p).is_ok() && a.admit(&p).is_ok());
        let wait = a
            .admit(&p)
            .expect_err("the third call within the second waits");
        assert!(wait > 0 && wait <= 1000, "{wait}");
        let admin = Principal::administrator("admin");
        assert!((0..100).all(|_| a.admit(&admin).is_ok()));
        assert!(
            a.admit_site(&SiteId::new("s").unwrap_or_else(|e| panic!("{e}")))
                .is_ok(),
            "site limits off"
        );
    }

    #[test]
    fn new_tokens_have_a_public_id_and_a_hashed_secret() {
        let (id, secret, token) = new_token().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(token, format!("mrd_{id}_{secret}"));
        assert_eq!(hash_secret(&secret).len(), 64);
        assert_ne!(hash_secret(&secret), secret);
    }
}
