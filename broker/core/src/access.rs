//! Who may do what through the API: API tokens, their grants, and the rules every call is judged by. Pure:
//! the shell authenticates a caller (hashing, expiry, the clock) and asks here whether the principal it found
//! may act; the token records themselves are broker state, changed only by journaled events.
//!
//! A token acts for one tenant (an administrator's for all) and grants verbs per queue, as fine as Armada's:
//! `submit`, `cancel`, `watch` (read jobs, explanations and logs) and `report`; `gateway` is a service's
//! gateway's (report its demand, read its routing table: nothing else); `viewer` is watch and report on
//! every queue; `admin` is everything, for any tenant (sites, drain, tenancy, budgets, tokens, the journal and
//! the audit). A job of another tenant is answered as if it did not exist, so a token cannot even learn which
//! job ids other tenants have.

use crate::error::CoreError;
use meridian_federation::{QueueName, ServiceName, TenantId};
use serde::{Deserialize, Serialize};

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// Submit jobs to the queue.
    Submit,
    /// Cancel the queue's jobs and scale in its services.
    Cancel,
    /// Read the queue's jobs: get, list, explain, logs.
    Watch,
    /// Read the tenant's metering report.
    Report,
    /// Report the demand of the services named (every service of the tenant when none is) and read their
    /// routing tables: a service's gateway.
    Gateway,
}

impl Verb {
    pub const ALL: [Verb; 5] = [
        Verb::Submit,
        Verb::Cancel,
        Verb::Watch,
        Verb::Report,
        Verb::Gateway,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Submit => "submit",
            Verb::Cancel => "cancel",
            Verb::Watch => "watch",
            Verb::Report => "report",
            Verb::Gateway => "gateway",
        }
    }
}

/// One verb on some queues of the token's tenant (every queue when `queues` is empty); `gateway` on some of its
/// services (every service when `services` is empty).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub verb: Verb,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueName>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceName>,
}

impl Grant {
    fn covers(&self, verb: Verb, queue: &str) -> bool {
        self.verb == verb && (self.queues.is_empty() || self.queues.iter().any(|q| q == queue))
    }
}

/// A role as written on the command line: `admin`, `viewer`, `VERB[:QUEUE,QUEUE…]`, or `gateway[:SERVICE,…]`.
pub fn parse_role(s: &str) -> Result<Role, CoreError> {
    match s {
        "admin" => Ok(Role::Admin),
        "viewer" => Ok(Role::Grants(vec![
            Grant {
                verb: Verb::Watch,
                queues: Vec::new(),
                services: Vec::new(),
            },
            Grant {
                verb: Verb::Report,
                queues: Vec::new(),
                services: Vec::new(),
            },
        ])),
        _ => {
            let (verb, queues) = s.split_once(':').unwrap_or((s, ""));
            let verb = Verb::ALL
                .into_iter()
                .find(|v| v.as_str() == verb)
                .ok_or_else(|| CoreError::UnknownRole { role: s.to_owned() })?;
            let names: Vec<&str> = queues
                .split(',')
                .map(str::trim)
                .filter(|q| !q.is_empty() && *q != "*")
                .collect();
            if verb == Verb::Gateway {
                // A service's name follows the wire's rule for names of things.
                if names
                    .iter()
                    .any(|n| meridian_federation::ids::check_id(n).is_err())
                {
                    return Err(CoreError::UnknownRole { role: s.to_owned() });
                }
                let services = names.into_iter().map(ServiceName::new).collect();
                return Ok(Role::Grants(vec![Grant {
                    verb,
                    queues: Vec::new(),
                    services,
                }]));
            }
            let queues = names.into_iter().map(QueueName::from).collect();
            Ok(Role::Grants(vec![Grant {
                verb,
                queues,
                services: Vec::new(),
            }]))
        }
    }
}

/// What `parse_role` reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Grants(Vec<Grant>),
}

/// An API token as the broker keeps it: never the secret, only its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// The token's public id: the credential id in the audit (the token is `mrd_<id>_<secret>`).
    pub id: String,
    /// A name the administrator gave it.
    #[serde(default)]
    pub name: String,
    /// Hex SHA-256 of the secret part.
    pub hash: String,
    /// The tenant it acts for; `None` only for administrators.
    #[serde(default)]
    pub tenant: Option<TenantId>,
    #[serde(default)]
    pub admin: bool,
    #[serde(default)]
    pub grants: Vec<Grant>,
    pub created_ms: u64,
    pub expires_ms: u64,
    /// Who created it (a credential id).
    #[serde(default)]
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<u64>,
}

impl TokenRecord {
    /// Why the record cannot be kept as it is, or `None`.
    pub fn problem(&self) -> Option<String> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 32
            && self.id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !id_ok {
            return Some(format!(
                "token id {:?} must be 1 to 32 letters or digits",
                self.id
            ));
        }
        if self.hash.len() != 64 || !self.hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some("the token's hash must be 64 hex digits (SHA-256)".into());
        }
        if self.name.len() > 128 {
            return Some("a token's name is at most 128 characters".into());
        }
        if !self.admin && self.tenant.is_none() && !reads_only(&self.grants) {
            return Some(
                "a token that is not an administrator's acts for one tenant (name it), unless it only reads \
                 (viewer, watch, report: a federation-wide viewer)"
                    .into(),
            );
        }
        if !self.admin && self.grants.is_empty() {
            return Some(
                "a token needs a role: admin, viewer, or submit, cancel, watch, report, gateway"
                    .into(),
            );
        }
        if self.expires_ms <= self.created_ms {
            return Some("a token must expire after it is created".into());
        }
        None
    }

    /// The principal this token authenticates.
    pub fn principal(&self) -> Principal {
        Principal {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            admin: self.admin,
            grants: self.grants.clone(),
        }
    }
}

/// Whether grants only read (watch, report): what a token acting for no tenant may hold.
pub fn reads_only(grants: &[Grant]) -> bool {
    grants
        .iter()
        .all(|g| matches!(g.verb, Verb::Watch | Verb::Report))
}

/// Who is calling, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The credential id (a token's id, or `admin` for the broker's bootstrap token): what the audit records.
    pub id: String,
    pub tenant: Option<TenantId>,
    pub admin: bool,
    pub grants: Vec<Grant>,
}

/// Why a call is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// Another tenant's object: answered as if it did not exist.
    #[error("{0} not found")]
    Hidden(String),
    /// The token lacks a permission; the message names it.
    #[error("{0}")]
    Forbidden(String),
}

impl Principal {
    /// An administrator (the broker's bootstrap token, or every caller of an insecure broker).
    pub fn administrator(id: &str) -> Self {
        Principal {
            id: id.to_owned(),
            tenant: None,
            admin: true,
            grants: Vec::new(),
        }
    }

    /// Whether it may see the tenant's objects at all: an administrator and a federation-wide viewer (a token
    /// acting for no tenant, which only reads) see every tenant's.
    pub fn sees(&self, tenant: &TenantId) -> bool {
        self.admin || self.tenant.is_none() || self.tenant.as_ref() == Some(tenant)
    }

    /// A federation-wide viewer: no tenant, not an administrator; its grants only read.
    pub fn is_viewer(&self) -> bool {
        !self.admin && self.tenant.is_none() && self.grants.iter().any(|g| g.verb == Verb::Watch)
    }

    /// A call that reads what only an operator reads (the metrics, the job history, the tenancy, the audit,
    /// the tokens' list — never a secret): an administrator or a federation-wide viewer.
    pub fn must_read_all(&self, what: &str) -> Result<(), Denied> {
        if self.admin || self.is_viewer() {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{what} needs an administrator's or a federation-wide viewer's token; token {} is neither",
                self.id
            )))
        }
    }

    /// Whether it may `verb` on `queue` of `tenant`; `what` names the object for a hidden answer.
    pub fn may(
        &self,
        verb: Verb,
        tenant: &TenantId,
        queue: &str,
        what: &str,
    ) -> Result<(), Denied> {
        if self.admin {
            return Ok(());
        }
        if !self.sees(tenant) {
            return Err(Denied::Hidden(what.to_owned()));
        }
        if self.grants.iter().any(|g| g.covers(verb, queue)) {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "token {} lacks the permission `{}` on queue {queue} of tenant {tenant}",
            self.id,
            verb.as_str()
        )))
    }

    /// Submitting names its tenant in the spec: a token acting for one tenant submits only that tenant's jobs.
    pub fn may_submit(&self, tenant: &TenantId, queue: &str) -> Result<(), Denied> {
        if !self.admin && !self.sees(tenant) {
            return Err(Denied::Forbidden(format!(
                "token {} acts for tenant {}; it cannot submit a job of tenant {tenant} (the tenant of a job is its submitter's)",
                self.id,
                self.tenant.as_ref().map(|t| t.as_str()).unwrap_or("-")
            )));
        }
        self.may(Verb::Submit, tenant, queue, "")
    }

    /// A gateway's call on `service` of `tenant` (its demand, its routing table).
    pub fn may_gateway(&self, tenant: &TenantId, service: &ServiceName) -> Result<(), Denied> {
        if self.admin {
            return Ok(());
        }
        if !self.sees(tenant) {
            return Err(Denied::Hidden(format!("service {service}")));
        }
        if self.grants.iter().any(|g| {
            g.verb == Verb::Gateway && (g.services.is_empty() || g.services.contains(service))
        }) {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "token {} lacks the permission `gateway` on service {service} of tenant {tenant}",
            self.id
        )))
    }

    /// A tenant-wide verb (reports): any grant of it, on any queue.
    pub fn may_for_tenant(&self, verb: Verb, tenant: &TenantId) -> Result<(), Denied> {
        if self.admin {
            return Ok(());
        }
        if !self.sees(tenant) {
            return Err(Denied::Forbidden(format!(
                "token {} acts for tenant {}, not {tenant}",
                self.id,
                self.tenant.as_ref().map(|t| t.as_str()).unwrap_or("-")
            )));
        }
        if self.grants.iter().any(|g| g.verb == verb) {
            return Ok(());
        }
        Err(Denied::Forbidden(format!(
            "token {} lacks the permission `{}`",
            self.id,
            verb.as_str()
        )))
    }

    /// An administrator's call: `what` says which.
    pub fn must_be_admin(&self, what: &str) -> Result<(), Denied> {
        if self.admin {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{what} needs an administrator's token; token {} is not one",
                self.id
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn tenant_token(role: &str) -> Principal {
        let Ok(Role::Grants(grants)) = parse_role(role) else {
            panic!("{role}");
        };
        Principal {
            id: "abc".into(),
            tenant: Some(t("a")),
            admin: false,
            grants,
        }
    }

    #[test]
    fn another_tenants_job_is_hidden_and_a_missing_verb_is_named() {
        let p = tenant_token("watch:train");
        assert_eq!(p.may(Verb::Watch, &t("a"), "train", "job 1"), Ok(()));
        assert_eq!(
            p.may(Verb::Watch, &t("b"), "train", "job 1"),
            Err(Denied::Hidden("job 1".into()))
        );
        let e = p.may(Verb::Cancel, &t("a"), "train", "job 1");
        assert!(
            matches!(&e, Err(Denied::Forbidden(m)) if m.contains("`cancel` on queue train")),
            "{e:?}"
        );
        let e = p.may(Verb::Watch, &t("a"), "batch", "job 1");
        assert!(
            matches!(&e, Err(Denied::Forbidden(m)) if m.contains("queue batch")),
            "{e:?}"
        );
    }

    #[test]
    fn a_token_submits_only_its_own_tenants_jobs() {
        let p = tenant_token("submit");
        assert_eq!(p.may_submit(&t("a"), "any"), Ok(()));
        let e = p.may_submit(&t("b"), "any");
        assert!(
            matches!(&e, Err(Denied::Forbidden(m)) if m.contains("acts for tenant a")),
            "{e:?}"
        );
        let admin = Principal::administrator("admin");
        assert_eq!(admin.may_submit(&t("b"), "any"), Ok(()));
    }

    #[test]
    fn roles_parse_and_bad_ones_say_what_exists() {
        assert_eq!(parse_role("admin"), Ok(Role::Admin));
        let Ok(Role::Grants(v)) = parse_role("viewer") else {
            panic!()
        };
        assert_eq!(v.len(), 2);
        assert_eq!(
            parse_role("cancel:a,b"),
            Ok(Role::Grants(vec![Grant {
                verb: Verb::Cancel,
                queues: vec!["a".into(), "b".into()],
                services: vec![],
            }]))
        );
        assert_eq!(
            parse_role("gateway:chat"),
            Ok(Role::Grants(vec![Grant {
                verb: Verb::Gateway,
                queues: vec![],
                services: vec!["chat".into()],
            }]))
        );
        assert!(parse_role("gateway:has space").is_err());
        assert!(parse_role("root")
            .is_err_and(|e| e.to_string().contains("submit, cancel, watch, report")));
        assert!(tenant_token("viewer")
            .must_be_admin("draining a site")
            .is_err());
    }

    /// A gateway's token reports demand and reads routes for its services only, and does nothing else: it
    /// submits, cancels and reads no job; it acts for one tenant.
    #[test]
    fn a_gateway_token_serves_its_services_and_nothing_else() {
        let Ok(Role::Grants(grants)) = parse_role("gateway:chat") else {
            panic!("gateway");
        };
        let gw = Principal {
            id: "gw".into(),
            tenant: Some(t("a")),
            admin: false,
            grants: grants.clone(),
        };
        assert_eq!(gw.may_gateway(&t("a"), &"chat".into()), Ok(()));
        assert!(matches!(
            gw.may_gateway(&t("a"), &"search".into()),
            Err(Denied::Forbidden(_))
        ));
        assert!(matches!(
            gw.may_gateway(&t("b"), &"chat".into()),
            Err(Denied::Hidden(_))
        ));
        assert!(gw.may_submit(&t("a"), "default").is_err());
        assert!(gw.may(Verb::Cancel, &t("a"), "default", "job").is_err());
        assert!(gw.may(Verb::Watch, &t("a"), "default", "job").is_err());
        let Ok(Role::Grants(every)) = parse_role("gateway") else {
            panic!("gateway");
        };
        let any = Principal {
            grants: every,
            ..gw
        };
        assert_eq!(any.may_gateway(&t("a"), &"search".into()), Ok(()));
        // Reporting demand changes what runs: a gateway token names its tenant.
        let record = record("gw1", None, grants);
        assert!(record.problem().is_some_and(|p| p.contains("one tenant")));
    }

    /// A token record as an administrator would create it.
    fn record(id: &str, tenant: Option<TenantId>, grants: Vec<Grant>) -> TokenRecord {
        TokenRecord {
            id: id.into(),
            name: String::new(),
            hash: "0".repeat(64),
            tenant,
            admin: false,
            grants,
            created_ms: 1,
            expires_ms: 2,
            created_by: "admin".into(),
            revoked_ms: None,
        }
    }

    #[test]
    fn token_records_are_checked() {
        let mut r = record(
            "abc123",
            Some(t("a")),
            vec![Grant {
                verb: Verb::Watch,
                queues: vec![],
                services: vec![],
            }],
        );
        assert_eq!(r.problem(), None);
        r.grants.clear();
        assert!(r.problem().is_some());
        r.admin = true;
        r.tenant = None;
        assert_eq!(r.problem(), None);
        r.id = "no/slash".into();
        assert!(r.problem().is_some());
    }

    /// A token acting for no tenant that only reads is a federation-wide viewer: it reads every tenant's work
    /// and the operator's read-only calls, and changes nothing. One that could change something must name a
    /// tenant.
    #[test]
    fn a_federation_wide_viewer_reads_everything_and_changes_nothing() {
        let Ok(Role::Grants(grants)) = parse_role("viewer") else {
            panic!("viewer");
        };
        let mut r = record("view1", None, grants);
        assert_eq!(r.problem(), None);
        let v = r.principal();
        assert!(v.is_viewer());
        for tenant in ["a", "b"] {
            assert_eq!(v.may(Verb::Watch, &t(tenant), "train", "job 1"), Ok(()));
            assert_eq!(v.may_for_tenant(Verb::Report, &t(tenant)), Ok(()));
            assert!(matches!(
                v.may(Verb::Cancel, &t(tenant), "train", "job 1"),
                Err(Denied::Forbidden(_))
            ));
            assert!(v.may_submit(&t(tenant), "train").is_err());
        }
        assert_eq!(v.must_read_all("the metrics"), Ok(()));
        assert!(v.must_be_admin("draining a site").is_err());
        // A tenant's viewer is not a federation-wide one.
        let tenant_viewer = tenant_token("viewer");
        assert!(!tenant_viewer.is_viewer());
        assert!(tenant_viewer.must_read_all("the metrics").is_err());
        // A token without a tenant that could submit or cancel is refused.
        let Ok(Role::Grants(submit)) = parse_role("submit") else {
            panic!("submit");
        };
        r.grants.extend(submit);
        assert!(r
            .problem()
            .is_some_and(|p| p.contains("unless it only reads")));
    }
}
