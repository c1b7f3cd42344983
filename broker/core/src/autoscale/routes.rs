//! The routing table: per location with demand, the pools with ready replicas within the SLO, weighted.

use super::*;

/// Replicas of one pool that a location may be routed to, with the share of its requests to send there.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteTo {
    pub key: ReplicaKey,
    pub replicas: u32,
    pub rtt_ms: f64,
    /// Shares of one location's routes add up to 1.
    pub weight: f64,
}

/// The routes of one location: every pool with ready replicas within the SLO.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocationRoutes {
    pub location: String,
    pub routes: Vec<RouteTo>,
}

/// The routing table a gateway or DNS follows: for each location, the pools with ready replicas within the SLO,
/// weighted by their spare capacity — a pool's ready throughput divided by the demand of all the locations that
/// can reach it, so that a pool many locations share gets a smaller share of each. A location with none in
/// reach gets an empty list (the gateway's fallback is its own).
pub fn routes(
    offers: &[Offer],
    ready: &BTreeMap<ReplicaKey, u32>,
    demand: &[LocationDemand],
    rtt: &RttTable,
    slo_ms: f64,
) -> Vec<LocationRoutes> {
    let live: Vec<(&Offer, u32)> = offers
        .iter()
        .filter_map(|o| ready.get(&o.key).filter(|n| **n > 0).map(|n| (o, *n)))
        .collect();
    let reach: Vec<Vec<(usize, f64)>> = demand
        .iter()
        .map(|d| {
            live.iter()
                .enumerate()
                .map(|(k, (o, _))| {
                    let r = rtt_ms(
                        rtt,
                        d.location,
                        d.rtt_region.as_deref(),
                        o.location,
                        o.rtt_region.as_deref(),
                    );
                    (k, r)
                })
                .filter(|(_, r)| *r <= slo_ms)
                .collect()
        })
        .collect();
    let mut sharing = vec![0.0f64; live.len()];
    for (l, near) in reach.iter().enumerate() {
        for (k, _) in near {
            sharing[*k] += demand[l].rate.max(1e-9);
        }
    }
    demand
        .iter()
        .zip(&reach)
        .map(|(d, near)| {
            let raw: Vec<f64> = near
                .iter()
                .map(|(k, _)| {
                    let (o, n) = live[*k];
                    f64::from(n) * o.capacity / sharing[*k].max(1e-9)
                })
                .collect();
            let total: f64 = raw.iter().sum::<f64>().max(1e-12);
            LocationRoutes {
                location: d.name.clone(),
                routes: near
                    .iter()
                    .zip(raw)
                    .map(|((k, r), w)| RouteTo {
                        key: live[*k].0.key.clone(),
                        replicas: live[*k].1,
                        rtt_ms: *r,
                        weight: w / total,
                    })
                    .collect(),
            }
        })
        .collect()
}
