//! An index of sites by accelerator class and spare capacity, so that a decision scores only the sites that
//! could take the job now instead of scanning them all. Sites that are lost or draining are left out.
//!
//! Per accelerator kind it keeps two ordered sets: `(most whole free devices in one pool, site)` for whole-
//! device requests and `(most free milli on one device, site)` for shares; a request takes the range at or
//! above what it needs.

use super::model::Site;
use meridian_federation::{AcceleratorKind, SiteId};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SiteIndex {
    whole: BTreeMap<AcceleratorKind, BTreeSet<(u32, SiteId)>>,
    milli: BTreeMap<AcceleratorKind, BTreeSet<(u32, SiteId)>>,
    /// What each site is filed under, to remove it on update.
    entries: BTreeMap<SiteId, Vec<(AcceleratorKind, u32, u32)>>,
    /// Sites per kind (all, listed or not), for the pruned counts.
    of_kind: BTreeMap<AcceleratorKind, usize>,
}

/// The spare capacity of a site per kind: (kind, most whole free devices in a pool, most free milli on a device).
fn spare(site: &Site) -> Vec<(AcceleratorKind, u32, u32)> {
    let mut by_kind: BTreeMap<AcceleratorKind, (u32, u32)> = BTreeMap::new();
    for p in &site.pools {
        let whole = p.devices.iter().filter(|d| d.free_milli() == 1000).count() as u32;
        let milli = if p.milli_sharing {
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
    pub fn update(&mut self, site: &Site) {
        self.remove(site.id());
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
