//! Offers: the pools a service could run replicas on, and what a replica costs and emits there.

use super::*;

/// Where a group of interchangeable replicas runs: one pool of one site, on-demand or spot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ReplicaKey {
    pub site: SiteId,
    pub pool: PoolName,
    pub spot: bool,
}

impl std::fmt::Display for ReplicaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.site, self.pool)?;
        if self.spot {
            write!(f, " (spot)")?;
        }
        Ok(())
    }
}

/// A pool that can run replicas of the service, with what one replica there costs and serves.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    pub key: ReplicaKey,
    pub tier: Tier,
    pub location: GeoPoint,
    pub rtt_region: Option<String>,
    /// The most replicas of this service the pool can hold, those it runs now included.
    pub room: u32,
    pub usd_per_hour: f64,
    /// Power drawn by one replica with the site's overhead: power × share × PUE, kW.
    pub kw: f64,
    /// Grams of CO2e per hour of one replica: `kw` × grid intensity.
    pub g_co2_per_hour: f64,
    /// Demand one replica here serves at full throughput, in the service's unit (requests/s or tokens/s).
    pub capacity: f64,
}

impl Offer {
    pub(super) fn usd_per_unit(&self) -> f64 {
        self.usd_per_hour / self.capacity.max(1e-9)
    }

    pub(super) fn g_per_unit(&self) -> f64 {
        self.g_co2_per_hour / self.capacity.max(1e-9)
    }
}

/// The offers of the sites in `view` for a replica whose job is `replica` and which serves `per_replica` (in the
/// service's unit) on the reference model: one per pool it can run on, and a second one at the spot price where
/// the pool has one and `spot` is allowed. `room` is what the pool holds in all (its healthy devices); the
/// caller takes off what other work uses. Grid intensity is the site's current figure.
pub fn offers(view: View<'_>, replica: &JobSpec, per_replica: f64, spot: bool) -> Vec<Offer> {
    let share = replica.resources.milli_per_replica().max(1);
    let mut out = Vec::new();
    for site in view.sites.values() {
        if !site.up || site.draining() {
            continue;
        }
        for pool in &site.pools {
            if never_fits(view, site, pool, replica).is_some() {
                continue;
            }
            let room: u64 = match replica.resources.share() {
                Some(_) => pool
                    .devices
                    .iter()
                    .filter(|d| d.healthy)
                    .map(|_| 1000 / share)
                    .sum(),
                None => pool.healthy_devices() as u64 / u64::from(replica.resources.count.max(1)),
            };
            if room == 0 {
                continue;
            }
            let devices = share as f64 / 1000.0;
            let kw = f64::from(pool.power_watts) * devices * site.info.pue / 1000.0;
            let g = kw * f64::from(site.info.carbon.g_per_kwh);
            let mut prices = vec![(false, pool.price_micro_usd_per_hour)];
            if let Some(p) = pool.spot_price_micro_usd_per_hour.filter(|_| spot) {
                prices.push((true, p));
            }
            for (is_spot, price) in prices {
                if replica
                    .constraints
                    .price_cap_micro_usd_per_hour
                    .is_some_and(|cap| price > cap)
                {
                    continue;
                }
                out.push(Offer {
                    key: ReplicaKey {
                        site: site.id().clone(),
                        pool: pool.name.clone(),
                        spot: is_spot,
                    },
                    tier: site.tier(),
                    location: site.info.location,
                    rtt_region: site.info.rtt_region.clone(),
                    room: u32::try_from(room).unwrap_or(u32::MAX),
                    usd_per_hour: price as f64 / 1e6 * devices,
                    kw,
                    g_co2_per_hour: g,
                    capacity: per_replica * view.throughput.factor(&pool.model),
                });
            }
        }
    }
    out
}
