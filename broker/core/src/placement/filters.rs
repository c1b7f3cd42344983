//! Hard constraints and fit: one judgement of a (site, pool) pair, used by the indexed search and the full scan
//! alike, so the two paths cannot drift apart.

use super::terms::{terms, Terms};
use super::{Reject, Request, View};
use crate::model::{Device, Pool, Site};
use crate::Millis;
use meridian_federation::{BackendKind, DeviceShare, JobSpec, Locality};
use std::collections::HashMap;

/// What a pool of a site that passed [`site_reject`] is to a job now.
pub(super) enum PoolJudgement {
    /// A hard constraint (or a recent refusal, or its queue's cap at the site) rules it out.
    Rejected(Reject),
    /// The job's shape fits, but not its size right now.
    Busy(Terms),
    /// The job can run here now, on these devices.
    Ready(Terms, Vec<DeviceShare>),
}

/// Judges one pool of a site for the job at `now`. `duration_ms` is the expected run time on the reference
/// model; `egress` the cheapest egress price of each `prefer` dataset.
pub(super) fn judge_pool(
    view: View<'_>,
    req: Request<'_>,
    now: Millis,
    site: &Site,
    pool: &Pool,
    duration_ms: u64,
    egress: &HashMap<String, u64>,
) -> PoolJudgement {
    let spec = req.spec;
    if let Some(r) = pool_reject(pool, spec) {
        return PoolJudgement::Rejected(r);
    }
    if let Some(deadline) = spec.window.deadline_ms {
        let finish = now + view.throughput.runtime_ms(duration_ms, &pool.model);
        if finish > deadline {
            return PoolJudgement::Rejected(Reject::MissesDeadline {
                late_by_ms: finish - deadline,
            });
        }
    }
    if req.refused.contains(site.id()) {
        return PoolJudgement::Rejected(Reject::RefusedRecently);
    }
    if req
        .capped
        .iter()
        .any(|(s, p)| s == site.id() && p == &pool.name)
    {
        return PoolJudgement::Rejected(Reject::QueueCapped);
    }
    let fit = fit_now(pool, spec);
    let terms = terms(view, site, pool, spec, egress, now, duration_ms);
    match fit {
        Some(devices) => PoolJudgement::Ready(terms, devices),
        None => PoolJudgement::Busy(terms),
    }
}

impl Reject {
    /// Whether the rejection is about the job's shape or constraints (a "miss" worth naming when no site fits),
    /// rather than the site's state or recent history.
    pub(super) fn is_miss(&self) -> bool {
        !matches!(
            self,
            Reject::SiteLost | Reject::Draining | Reject::RefusedRecently | Reject::QueueCapped
        )
    }
}

/// Site-level hard constraints.
pub(super) fn site_reject(view: View<'_>, site: &Site, spec: &JobSpec) -> Option<Reject> {
    let c = &spec.constraints;
    if !site.up {
        return Some(Reject::SiteLost);
    }
    if site.draining() {
        return Some(Reject::Draining);
    }
    if !c.tiers.is_empty() && !c.tiers.contains(&site.tier()) {
        return Some(Reject::TierNotAllowed(site.tier()));
    }
    if !c.sites.is_empty() && !c.sites.contains(site.id()) {
        return Some(Reject::SiteNotAllowed);
    }
    if let Some(region) = &c.residency {
        if view.regions.contains(region, site.info.location) != Some(true) {
            return Some(Reject::OutsideResidency(region.clone()));
        }
    }
    // A site whose agent does not say how it runs work (an earlier release) is taken as before.
    let wants = spec.run.adapter.as_deref().and_then(BackendKind::named);
    if let (Some(wants), Some(has)) = (wants, site.info.backend) {
        if wants != has {
            return Some(Reject::Backend { wants, has });
        }
    }
    spec.datasets
        .iter()
        .find(|d| d.locality == Locality::Must && !site.holds_dataset(&d.name))
        .map(|d| Reject::MissingDataset(d.name.clone()))
}

/// Why `spec` can never run on this pool of this site (its constraints, the pool's shape), or `None` if it can
/// when there is room: what placement checks before it looks at the load.
pub fn never_fits(view: View<'_>, site: &Site, pool: &Pool, spec: &JobSpec) -> Option<Reject> {
    if pool.kind != spec.resources.kind {
        return Some(Reject::NoPoolOfKind(spec.resources.kind));
    }
    site_reject(view, site, spec).or_else(|| pool_reject(pool, spec))
}

/// Pool-level hard constraints (the job's shape, not the pool's current load).
fn pool_reject(pool: &Pool, spec: &JobSpec) -> Option<Reject> {
    let r = &spec.resources;
    if !pool.model_allowed(&r.models) {
        return Some(Reject::ModelNotAllowed(pool.model.clone()));
    }
    let for_model = r
        .model_memory_mib
        .iter()
        .find(|(m, _)| m.matches(pool.model.as_str()))
        .map(|(_, mib)| *mib);
    if let Some(need) = r.memory_mib.into_iter().chain(for_model).max() {
        if pool.memory_mib < need {
            return Some(Reject::TooLittleMemory {
                has_mib: pool.memory_mib,
                needs_mib: need,
            });
        }
    }
    match &r.mig {
        Some(profile) if !pool.mig_profiles.iter().any(|p| p == profile) => {
            return Some(Reject::NoMigProfile(profile.clone()));
        }
        None if r.milli.is_some() && !pool.milli_sharing => return Some(Reject::NoMilliSharing),
        _ => {}
    }
    let needs_devices = match r.share() {
        Some(_) => 1,
        None => u64::from(r.count) * u64::from(spec.replicas),
    };
    if r.same_node && u64::from(pool.devices_per_node) < needs_devices {
        return Some(Reject::NodeTooSmall {
            per_node: pool.devices_per_node,
            needs: needs_devices,
        });
    }
    if (pool.healthy_devices() as u64) < needs_devices {
        return Some(Reject::TooFewDevices {
            has: pool.healthy_devices(),
            needs: needs_devices,
        });
    }
    let Some(price) = pool.price_for(spec.spot) else {
        return Some(Reject::NoSpot);
    };
    if let Some(cap) = spec.constraints.price_cap_micro_usd_per_hour {
        if price > cap {
            return Some(Reject::PriceAboveCap { price, cap });
        }
    }
    None
}

/// Devices for the job if the pool can take it now. Whole devices: the lowest-numbered free ones. Shares:
/// best fit, the device with the least free room that still holds the share, to keep whole devices free.
pub fn fit_now(pool: &Pool, spec: &JobSpec) -> Option<Vec<DeviceShare>> {
    if spec.resources.same_node {
        // The first node (in index order) that holds the whole job.
        let per = pool.devices_per_node.max(1) as usize;
        return pool
            .devices
            .chunks(per)
            .find_map(|node| fit_devices(node, spec));
    }
    fit_devices(&pool.devices, spec)
}

fn fit_devices(devices: &[Device], spec: &JobSpec) -> Option<Vec<DeviceShare>> {
    let r = &spec.resources;
    match r.share() {
        None => {
            let need = (r.count as usize) * (spec.replicas as usize);
            let devices: Vec<DeviceShare> = devices
                .iter()
                .filter(|d| d.free_milli() == 1000)
                .take(need)
                .map(|d| DeviceShare {
                    index: d.index,
                    milli: 1000,
                })
                .collect();
            (devices.len() == need).then_some(devices)
        }
        Some(share) => {
            let mut free: Vec<(u32, u32)> =
                devices.iter().map(|d| (d.index, d.free_milli())).collect();
            let mut out: Vec<DeviceShare> = Vec::new();
            for _ in 0..spec.replicas {
                let slot = free
                    .iter_mut()
                    .filter(|(_, f)| *f >= share)
                    .min_by_key(|(i, f)| (*f, *i))?;
                slot.1 -= share;
                match out.iter_mut().find(|d| d.index == slot.0) {
                    Some(d) => d.milli += share,
                    None => out.push(DeviceShare {
                        index: slot.0,
                        milli: share,
                    }),
                }
            }
            Some(out)
        }
    }
}
