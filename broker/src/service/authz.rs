//! The one place that decides what a caller may do:
//!
//! - [`may_call`]: a call's access as the call table declares it (`api::calls`), before its handler runs;
//! - what a read reaches: a tenant's token is held to its tenant, another tenant's job or service is "not
//!   found" ([`scope_to_own_tenant`], [`may_watch`], [`may_report`], …);
//! - [`authorize`]: a change, judged in the reactor task against the state it would apply to (so the check
//!   and the change see the same jobs and tenancy), and what of it the audit records ([`describe`]);
//! - a service's routes and demand, judged there against the service ([`may_feed`], [`may_route`]).

use super::api::Access;
use meridian_core::access::{Denied, Principal, Verb};
use meridian_core::journal::Journal;
use meridian_core::reactor::{Event, Reactor, Response, StepError};
use meridian_federation::{JobView, ServiceName, ServiceRef, ServiceSpec, TenantId};

/// Whether the caller may make a call of this access at all (what it reaches is judged further on).
pub fn may_call(who: &Principal, access: &Access) -> Result<(), Denied> {
    match access {
        Access::ReadAll(what) => who.must_read_all(what),
        Access::Admin(what) => who.must_be_admin(what),
        Access::Read | Access::Change | Access::Gateway => Ok(()),
    }
}

/// A listing or report of one tenant or all: a tenant's token is held to its own tenant (naming another is
/// refused, saying `what`); an administrator and a federation-wide viewer may name any tenant, or none.
pub fn scope_to_own_tenant(
    who: &Principal,
    tenant: &mut Option<TenantId>,
    what: &str,
) -> Result<(), Denied> {
    if let (false, Some(own)) = (who.admin, &who.tenant) {
        if let Some(asked) = tenant.as_ref().filter(|asked| *asked != own) {
            return Err(Denied::Forbidden(format!(
                "token {} acts for tenant {own}; it cannot read tenant {asked}'s {what}",
                who.id
            )));
        }
        *tenant = Some(own.clone());
    }
    Ok(())
}

/// A listing of jobs: held to the caller's tenant, which it must be allowed to watch.
pub fn may_list_jobs(who: &Principal, tenant: &mut Option<TenantId>) -> Result<(), Denied> {
    scope_to_own_tenant(who, tenant, "jobs")?;
    match (who.admin, &*tenant) {
        (false, Some(t)) => who.may_for_tenant(Verb::Watch, t),
        _ => Ok(()),
    }
}

/// Whether the caller may read a job (as a view says it is): another tenant's is "not found".
pub fn may_watch(who: &Principal, v: &JobView) -> Result<(), Denied> {
    who.may(
        Verb::Watch,
        &v.tenant,
        queue_of(v.queue.as_ref()),
        &format!("job {}", v.job),
    )
}

/// The metering report of one tenant (`report` on it) or of all (`report` anywhere, or an administrator).
pub fn may_report(who: &Principal, tenant: Option<&TenantId>) -> Result<(), Denied> {
    match tenant {
        Some(t) => who.may_for_tenant(Verb::Report, t),
        None if who.admin || who.grants.iter().any(|g| g.verb == Verb::Report) => Ok(()),
        None => Err(Denied::Forbidden(format!(
            "token {} lacks the permission `report`",
            who.id
        ))),
    }
}

/// The tenant and name of a `ServiceRef` that must name one service: a tenant's token names its own tenant.
pub fn named_service(
    who: &Principal,
    mut r: ServiceRef,
) -> Result<(TenantId, ServiceName), super::api::ApiError> {
    use super::api::ApiError;
    scope_to_own_tenant(who, &mut r.tenant, "services")?;
    let tenant = r
        .tenant
        .ok_or_else(|| ApiError::invalid("tenant", "name the service's tenant"))?;
    let name = r
        .name
        .ok_or_else(|| ApiError::invalid("name", "name the service"))?;
    Ok((tenant, name))
}

/// Whether the caller may report the service's demand: its gateway (the `gateway` role for it), or a caller
/// that may submit to its queue (its owner).
pub fn may_feed(who: &Principal, spec: &ServiceSpec) -> Result<(), StepError> {
    let queue = queue_of(spec.queue.as_ref());
    who.may_gateway(&spec.tenant, &spec.name)
        .or_else(|_| who.may_submit(&spec.tenant, queue))
        .map_err(|_| {
            StepError::Refused(format!(
                "token {} lacks the permission `gateway` on service {} (or `submit` on its queue {queue})",
                who.id, spec.name
            ))
        })
}

/// The service, if the caller may route by it: whoever may report its demand, and whoever may read it.
pub fn may_route<'a, J: Journal>(
    reactor: &'a Reactor<J>,
    who: &Principal,
    tenant: &TenantId,
    name: &ServiceName,
) -> Result<&'a ServiceSpec, StepError> {
    let spec = visible_service(reactor, who, tenant, name)?;
    who.may_for_tenant(Verb::Watch, tenant)
        .map_err(refused)
        .or_else(|_| may_feed(who, spec))?;
    Ok(spec)
}

/// A service the caller sees (another tenant's is "not found").
pub fn visible_service<'a, J: Journal>(
    reactor: &'a Reactor<J>,
    who: &Principal,
    tenant: &TenantId,
    name: &ServiceName,
) -> Result<&'a ServiceSpec, StepError> {
    let hidden = || StepError::NotFound {
        what: format!("service {name}"),
    };
    if !who.sees(tenant) {
        return Err(hidden());
    }
    reactor
        .state()
        .services()
        .get(&(tenant.clone(), name.clone()))
        .ok_or_else(hidden)
}

/// Whether the caller reads a service in a listing: one it just deployed, or one of a tenant it may watch.
pub fn lists_service(who: &Principal, tenant: &TenantId, deployed: bool) -> bool {
    who.sees(tenant) && (deployed || who.may_for_tenant(Verb::Watch, tenant).is_ok())
}

/// The queue a job is filed under for permissions: the one it names, else `default`.
pub fn queue_of(queue: Option<&meridian_federation::QueueName>) -> &str {
    queue.map_or("default", meridian_federation::QueueName::as_str)
}

fn refused(d: Denied) -> StepError {
    match d {
        Denied::Hidden(what) => StepError::NotFound { what },
        Denied::Forbidden(why) => StepError::Refused(why),
    }
}

/// Whether `who` may make the change `event` describes.
pub fn authorize<J: Journal>(
    reactor: &Reactor<J>,
    who: &Principal,
    event: &Event,
) -> Result<(), StepError> {
    let st = reactor.state();
    let allowed = match event {
        Event::Submit(spec) => who.may_submit(&spec.tenant, queue_of(spec.queue.as_ref())),
        Event::Cancel(id) => match st.jobs().get(id) {
            Some(j) => who.may(
                Verb::Cancel,
                &j.spec.tenant,
                queue_of(j.spec.queue.as_ref()),
                &format!("job {id}"),
            ),
            // The step says it is not found.
            None => Ok(()),
        },
        Event::ScaleIn { tenant, .. } => {
            if who.sees(tenant) {
                who.may_for_tenant(Verb::Cancel, tenant)
            } else {
                Err(Denied::Hidden(format!("services of tenant {tenant}")))
            }
        }
        Event::ServiceDeployed(spec) => who.may_submit(&spec.tenant, queue_of(spec.queue.as_ref())),
        Event::ServiceDeleted { tenant, service } => {
            if who.sees(tenant) {
                who.may_for_tenant(Verb::Cancel, tenant)
            } else {
                Err(Denied::Hidden(format!("service {service}")))
            }
        }
        Event::Drain { drain, .. } => who.must_be_admin(if *drain {
            "draining a site"
        } else {
            "undraining a site"
        }),
        Event::SetTenancy { .. } => who.must_be_admin("changing the tenancy"),
        Event::UpgradeFormat { .. } => who.must_be_admin("upgrading the journal's format"),
        Event::TokenCreated(_) | Event::TokenRevoked { .. } => {
            who.must_be_admin("managing API tokens")
        }
        Event::SiteRevoked { .. } | Event::SiteRestored { .. } => {
            who.must_be_admin("revoking or restoring a site")
        }
        // Everything else comes from sites and the broker's own clock, never from API callers.
        _ => who.must_be_admin("this call"),
    };
    allowed.map_err(refused)
}

/// The audit's name for a change and what it was done to.
pub fn describe(event: &Event) -> Option<(&'static str, Option<String>)> {
    Some(match event {
        Event::Submit(spec) => (
            "submit",
            Some(format!(
                "tenant {} key {}",
                spec.tenant, spec.idempotency_key
            )),
        ),
        Event::Cancel(id) => ("cancel", Some(format!("job {id}"))),
        Event::ServiceDeployed(spec) => (
            "service_deploy",
            Some(format!("service {} of tenant {}", spec.name, spec.tenant)),
        ),
        Event::ServiceDeleted { tenant, service } => (
            "service_delete",
            Some(format!("service {service} of tenant {tenant}")),
        ),
        Event::Drain { site, drain } => (
            if *drain { "drain" } else { "undrain" },
            Some(format!("site {site}")),
        ),
        Event::ScaleIn {
            tenant,
            service,
            remove,
        } => (
            "scale_in",
            Some(format!(
                "service {service} of tenant {tenant}, {remove} replicas"
            )),
        ),
        Event::SetTenancy { from_file, .. } => (
            "tenancy",
            from_file.then(|| "from the broker's tenancy file".to_owned()),
        ),
        Event::UpgradeFormat { to } => ("upgrade_format", Some(format!("format {to}"))),
        Event::TokenCreated(t) => (
            "token_create",
            Some(format!(
                "token {}{}",
                t.id,
                t.tenant
                    .as_ref()
                    .map(|t| format!(" of tenant {t}"))
                    .unwrap_or_else(|| " (administrator)".into())
            )),
        ),
        Event::TokenRevoked { id } => ("token_revoke", Some(format!("token {id}"))),
        Event::SiteRevoked { site } => ("site_revoke", Some(format!("site {site}"))),
        Event::SiteRestored { site } => ("site_restore", Some(format!("site {site}"))),
        _ => return None,
    })
}

/// The target as it ended up (a submission's job id).
pub fn outcome_target(target: Option<String>, r: &Result<Response, StepError>) -> Option<String> {
    match r {
        Ok(Response::Submitted(s)) => Some(format!("job {}", s.job)),
        _ => target,
    }
}
