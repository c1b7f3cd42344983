//! Whether a caller may make a change, judged in the reactor task against the state the change would apply to
//! (so the check and the change see the same jobs and tenancy), and what of each change the audit records.

use meridian_core::access::{Denied, Principal, Verb};
use meridian_core::journal::Journal;
use meridian_core::reactor::{Event, Reactor, Response, StepError};

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
