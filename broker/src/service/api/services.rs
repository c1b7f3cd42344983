//! Services: deploy, read, delete, scale in, routes (read and watched) and a gateway's demand. What needs
//! the autoscaler's soft state is asked of the reactor task ([`ServiceCall`]).

use super::{ApiError, ApiResult};
use crate::service::reply::Inbox;
use crate::service::services::ServiceCall;
use crate::service::{authz, BrokerHandle};
use meridian_core::access::Principal;
use meridian_core::reactor::{Event, Response, StepError};
use meridian_federation::{
    DemandReport, Empty, RoutesUpdate, RoutesView, RoutesWatchRequest, ScaleInReply,
    ScaleInRequest, ServiceRef, ServiceSpec, ServiceView, WIRE_VERSION,
};
use serde::Serialize;

/// Sends a call on services to the reactor task and waits for its answer.
async fn ask<T>(
    h: &BrokerHandle,
    call: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, StepError>>) -> ServiceCall,
) -> ApiResult<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    h.services(call(tx));
    match rx.await {
        Ok(r) => r.map_err(ApiError::from),
        Err(_) => Err(ApiError::unavailable()),
    }
}

/// Services the caller reads (one when `name` is given), from the reactor task.
async fn views(
    h: &BrokerHandle,
    who: &Principal,
    r: ServiceRef,
    deployed: bool,
) -> ApiResult<Vec<ServiceView>> {
    ask(h, |reply| ServiceCall::Show {
        tenant: r.tenant,
        name: r.name,
        who: who.clone(),
        deployed,
        reply,
    })
    .await
}

/// The reply to a change that stops replicas (scale-in, a service deleted).
fn stopping(r: Response) -> ApiResult<ScaleInReply> {
    match r {
        Response::Stopping(stopping) => Ok(ScaleInReply { stopping }),
        other => Err(ApiError::internal(format!("unexpected {other:?}"))),
    }
}

pub async fn deploy(
    h: &BrokerHandle,
    who: &Principal,
    spec: ServiceSpec,
) -> ApiResult<ServiceView> {
    let named = ServiceRef {
        v: WIRE_VERSION,
        tenant: Some(spec.tenant.clone()),
        name: Some(spec.name.clone()),
    };
    h.step_as(who, Event::ServiceDeployed(spec)).await?;
    views(h, who, named, true)
        .await?
        .into_iter()
        .next()
        .ok_or_else(ApiError::unavailable)
}

/// One service, or the list.
#[derive(Serialize)]
#[serde(untagged)]
pub enum OneOrAll {
    One(Box<ServiceView>),
    All(Vec<ServiceView>),
}

pub async fn show(h: &BrokerHandle, who: &Principal, mut r: ServiceRef) -> ApiResult<OneOrAll> {
    authz::scope_to_own_tenant(who, &mut r.tenant, "services")?;
    let one = r.name.is_some();
    let mut v = views(h, who, r, false).await?;
    Ok(if one && !v.is_empty() {
        OneOrAll::One(Box::new(v.swap_remove(0)))
    } else {
        OneOrAll::All(v)
    })
}

pub async fn delete(h: &BrokerHandle, who: &Principal, r: ServiceRef) -> ApiResult<ScaleInReply> {
    let (tenant, service) = authz::named_service(who, r)?;
    stopping(
        h.step_as(who, Event::ServiceDeleted { tenant, service })
            .await?,
    )
}

pub async fn scale_in(
    h: &BrokerHandle,
    who: &Principal,
    r: ScaleInRequest,
) -> ApiResult<ScaleInReply> {
    let event = Event::ScaleIn {
        tenant: r.tenant,
        service: r.service,
        remove: r.remove,
    };
    stopping(h.step_as(who, event).await?)
}

pub async fn routes(h: &BrokerHandle, who: &Principal, r: ServiceRef) -> ApiResult<RoutesView> {
    let (tenant, name) = authz::named_service(who, r)?;
    ask(h, |reply| ServiceCall::Routes {
        tenant,
        name,
        who: who.clone(),
        reply,
    })
    .await
}

pub async fn watch(
    h: &BrokerHandle,
    who: &Principal,
    mut r: RoutesWatchRequest,
    deliver: Inbox,
) -> ApiResult<RoutesUpdate> {
    authz::scope_to_own_tenant(who, &mut r.tenant, "services")?;
    let tenant = r
        .tenant
        .ok_or_else(|| ApiError::invalid("tenant", "name the service's tenant"))?;
    ask(h, |reply| ServiceCall::Watch {
        tenant,
        name: r.name,
        who: who.clone(),
        deliver,
        lease_ms: r.lease_s * 1000,
        reply,
    })
    .await
}

pub async fn demand(h: &BrokerHandle, who: &Principal, report: DemandReport) -> ApiResult<Empty> {
    ask(h, |reply| ServiceCall::Demand {
        report,
        who: who.clone(),
        reply,
    })
    .await?;
    Ok(Empty { v: WIRE_VERSION })
}
