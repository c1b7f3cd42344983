//! An index of sites by accelerator class and spare capacity, so that a decision scores only the sites that
//! could take the job now instead of scanning them all. Sites that are lost or draining are left out.
//!
//! Per accelerator kind it keeps two ordered sets: `(most whole free devices in one pool, site)` for whole-
//! device requests and `(most free milli on one device, site)` for shares; a request takes the range at or
//! above what it needs.
//!
//! For the single-criterion policies it also keeps, per (kind, tier), the pools with room ordered by a lower
//! bound of their objective per reference device-hour — cost: `price / throughput`; carbon:
//! `power × PUE × lowest advertised intensity / throughput` — so that placement can examine pools best-first
//! and stop once no remaining pool can beat the best found (see `placement::place`).

use super::model::Site;
use super::throughput::Throughput;
use meridian_federation::{AcceleratorKind, PoolName, SiteId, Tier};
use rstar::primitives::GeomWithData;
use rstar::RTree;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default)]
pub struct SiteIndex {
    whole: BTreeMap<AcceleratorKind, BTreeSet<(u32, SiteId)>>,
    milli: BTreeMap<AcceleratorKind, BTreeSet<(u32, SiteId)>>,
    /// What each site is filed under, to remove it on update.
    entries: BTreeMap<SiteId, Vec<(AcceleratorKind, u32, u32)>>,
    /// Sites per kind (all, listed or not), for the pruned counts.
    of_kind: BTreeMap<AcceleratorKind, usize>,
    /// Pools with room, best-first by a lower bound of each objective.
    ordered: BTreeMap<OrderKey, BTreeSet<(u64, SiteId, PoolName)>>,
    ordered_entries: BTreeMap<SiteId, Vec<(OrderKey, u64, PoolName)>>,
    /// Pools with room per (kind, tier) in an R-tree over unit vectors, for nearest-first search.
    spatial: BTreeMap<TierKey, RTree<Located>>,
    spatial_entries: BTreeMap<SiteId, Vec<(TierKey, [f64; 3], PoolName)>>,
}

/// Pools of one kind in one tier.
type TierKey = (AcceleratorKind, Tier);

/// A pool of a site at a point of the unit sphere (chord length grows with great-circle distance).
type Located = GeomWithData<[f64; 3], (SiteId, PoolName)>;

/// The unit vector of a point on the globe.
pub fn unit_vector(p: meridian_federation::GeoPoint) -> [f64; 3] {
    let (lat, lon) = (p.lat.to_radians(), p.lon.to_radians());
    [lat.cos() * lon.cos(), lat.cos() * lon.sin(), lat.sin()]
}

impl PartialEq for SiteIndex {
    /// The R-trees are built from `spatial_entries`, which are compared instead.
    fn eq(&self, other: &Self) -> bool {
        self.whole == other.whole
            && self.milli == other.milli
            && self.entries == other.entries
            && self.of_kind == other.of_kind
            && self.ordered == other.ordered
            && self.ordered_entries == other.ordered_entries
            && self.spatial_entries == other.spatial_entries
            && self
                .spatial
                .iter()
                .map(|(k, t)| (*k, t.size()))
                .collect::<Vec<_>>()
                == other
                    .spatial
                    .iter()
                    .map(|(k, t)| (*k, t.size()))
                    .collect::<Vec<_>>()
    }
}

/// One best-first list: pools of a kind in a tier, by one objective.
type OrderKey = (AcceleratorKind, Tier, Objective);

/// The objectives the index orders pools by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Objective {
    Cost,
    Carbon,
}

/// Lower bounds per reference device-hour: (micro-USD, gCO2e).
fn bounds(site: &Site, pool: &super::model::Pool, throughput: &Throughput) -> (f64, f64) {
    let tp = throughput.factor(&pool.model);
    let c = &site.info.carbon;
    let g_min = c
        .forecast
        .iter()
        .copied()
        .chain([c.g_per_kwh])
        .min()
        .unwrap_or(c.g_per_kwh);
    let price = pool
        .price_for(true)
        .map_or(pool.price_micro_usd_per_hour, |spot| {
            spot.min(pool.price_micro_usd_per_hour)
        });
    let cost = price as f64 / tp;
    let carbon = f64::from(pool.power_watts) * site.info.pue * f64::from(g_min) / 1000.0 / tp;
    (cost, carbon)
}

/// The spare capacity of a site per kind: (kind, most whole free devices in a pool, most free milli on a device).
fn spare(site: &Site) -> Vec<(AcceleratorKind, u32, u32)> {
    let mut by_kind: BTreeMap<AcceleratorKind, (u32, u32)> = BTreeMap::new();
    for p in &site.pools {
        let whole = p.devices.iter().filter(|d| d.free_milli() == 1000).count() as u32;
        let milli = if p.milli_sharing || !p.mig_profiles.is_empty() {
            p.devices.iter().map(|d| d.free_milli()).max().unwrap_or(0)
        } else {
            0
        };
        let e = by_kind.entry(p.kind).or_default();
        e.0 = e.0.max(whole);
        e.1 = e.1.max(milli);
    }
    by_kind.into_iter().map(|(k, (w, m))| (k, w, m)).collect()
}

impl SiteIndex {
    /// Files (or refiles) a site after any change to it.
    pub fn update(&mut self, site: &Site, throughput: &Throughput) {
        self.remove(site.id());
        self.remove_ordered(site.id());
        self.remove_spatial(site.id());
        if site.up && !site.draining() {
            let at = unit_vector(site.info.location);
            let mut placed = Vec::new();
            for p in site.pools.iter().filter(|p| p.free_milli() > 0) {
                let key = (p.kind, site.tier());
                self.spatial
                    .entry(key)
                    .or_default()
                    .insert(GeomWithData::new(at, (site.id().clone(), p.name.clone())));
                placed.push((key, at, p.name.clone()));
            }
            self.spatial_entries.insert(site.id().clone(), placed);
            let mut filed = Vec::new();
            for p in site.pools.iter().filter(|p| p.free_milli() > 0) {
                let (cost, carbon) = bounds(site, p, throughput);
                for (obj, v) in [(Objective::Cost, cost), (Objective::Carbon, carbon)] {
                    let key = (p.kind, site.tier(), obj);
                    let bits = v.max(0.0).to_bits();
                    self.ordered.entry(key).or_default().insert((
                        bits,
                        site.id().clone(),
                        p.name.clone(),
                    ));
                    filed.push((key, bits, p.name.clone()));
                }
            }
            self.ordered_entries.insert(site.id().clone(), filed);
        }
        let kinds: BTreeSet<AcceleratorKind> = site.pools.iter().map(|p| p.kind).collect();
        for k in &kinds {
            *self.of_kind.entry(*k).or_default() += 1;
        }
        if !site.up || site.draining() {
            self.entries.insert(
                site.id().clone(),
                kinds.iter().map(|k| (*k, 0, 0)).collect(),
            );
            return;
        }
        let s = spare(site);
        for (k, w, m) in &s {
            if *w > 0 {
                self.whole
                    .entry(*k)
                    .or_default()
                    .insert((*w, site.id().clone()));
            }
            if *m > 0 {
                self.milli
                    .entry(*k)
                    .or_default()
                    .insert((*m, site.id().clone()));
            }
        }
        self.entries.insert(site.id().clone(), s);
    }

    fn remove_spatial(&mut self, id: &SiteId) {
        for (key, at, pool) in self.spatial_entries.remove(id).unwrap_or_default() {
            if let Some(tree) = self.spatial.get_mut(&key) {
                tree.remove(&GeomWithData::new(at, (id.clone(), pool)));
                if tree.size() == 0 {
                    self.spatial.remove(&key);
                }
            }
        }
    }

    /// Pools of `kind` in `tier` with room, nearest first to the point with unit vector `at`.
    pub fn nearest(
        &self,
        kind: AcceleratorKind,
        tier: Tier,
        at: [f64; 3],
    ) -> impl Iterator<Item = (&SiteId, &PoolName)> {
        self.spatial
            .get(&(kind, tier))
            .into_iter()
            .flat_map(move |t| t.nearest_neighbor_iter(&at))
            .map(|g| (&g.data.0, &g.data.1))
    }

    fn remove_ordered(&mut self, id: &SiteId) {
        for (key, bits, pool) in self.ordered_entries.remove(id).unwrap_or_default() {
            if let Some(set) = self.ordered.get_mut(&key) {
                set.remove(&(bits, id.clone(), pool));
                if set.is_empty() {
                    self.ordered.remove(&key);
                }
            }
        }
    }

    /// Pools of `kind` in `tier` with room, best-first by the lower bound of `objective` per reference
    /// device-hour.
    pub fn ordered(
        &self,
        kind: AcceleratorKind,
        tier: Tier,
        objective: Objective,
    ) -> impl Iterator<Item = (f64, &SiteId, &PoolName)> {
        self.ordered
            .get(&(kind, tier, objective))
            .into_iter()
            .flatten()
            .map(|(bits, id, pool)| (f64::from_bits(*bits), id, pool))
    }

    /// The lower bound one pool with room is listed under for `objective` (as [`Self::ordered`] gives it), if it
    /// is listed.
    pub fn bound(
        &self,
        kind: AcceleratorKind,
        tier: Tier,
        objective: Objective,
        id: &SiteId,
        pool: &PoolName,
    ) -> Option<f64> {
        self.ordered_entries
            .get(id)?
            .iter()
            .find_map(|(key, bits, p)| {
                (*key == (kind, tier, objective) && p == pool).then(|| f64::from_bits(*bits))
            })
    }

    fn remove(&mut self, id: &SiteId) {
        if let Some(old) = self.entries.remove(id) {
            for (k, w, m) in old {
                for (map, key) in [(&mut self.whole, w), (&mut self.milli, m)] {
                    if let Some(set) = map.get_mut(&k) {
                        set.remove(&(key, id.clone()));
                        if set.is_empty() {
                            map.remove(&k);
                        }
                    }
                }
                if let Some(n) = self.of_kind.get_mut(&k) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }

    /// Sites that may take `whole` free devices of `kind` in one pool (or a share of `milli`), in site-id order.
    pub fn candidates(
        &self,
        kind: AcceleratorKind,
        whole: u32,
        milli: Option<u32>,
    ) -> Vec<&SiteId> {
        let mut out: Vec<&SiteId> = match milli {
            Some(m) => self
                .milli
                .get(&kind)
                .map(|s| s.range((m, min_id())..).map(|(_, id)| id).collect())
                .unwrap_or_default(),
            None => self
                .whole
                .get(&kind)
                .map(|s| s.range((whole, min_id())..).map(|(_, id)| id).collect())
                .unwrap_or_default(),
        };
        out.sort_unstable();
        out
    }

    /// How many known sites have a pool of `kind`.
    pub fn sites_of_kind(&self, kind: AcceleratorKind) -> usize {
        self.of_kind.get(&kind).copied().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The smallest site id (`-` sorts before every other allowed character), as the lower bound of a range.
fn min_id() -> SiteId {
    SiteId::new("-").unwrap_or_else(|_| unreachable!("literal id"))
}
