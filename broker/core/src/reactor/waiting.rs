//! The waiting jobs, indexed by what they need, so that a scheduling pass looks at the jobs freed or added
//! capacity could serve rather than at every waiting job.
//!
//! Jobs are filed in groups of jobs that placement and quota cannot tell apart: same queue (or tenant), same
//! priority, same shape (resources, replicas, constraints, required datasets, start window and, with a
//! deadline, expected duration). A job with refusals of its own (sites that refused it lately) is a group of
//! its own. When a pass finds the first job of a group blocked — no site has room for its shape, no site fits
//! it at all, or its queue's quota holds it before placement — every job of the group is blocked the same way,
//! and the pass moves on. Timers (retry and burst times, refusals running out) are kept in time order.
//!
//! The index also keeps, per queue and quota class, the demands of the waiting jobs, which quota admission
//! asks about ("does a lender have work waiting within its own quota?").

use crate::quota::Class;
use crate::Millis;
use meridian_federation::{JobId, QueueName, TenantId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What tells groups apart (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct GroupKey {
    /// The queue (with a tenancy) or the tenant.
    pub owner: String,
    pub priority: i32,
    /// The job's shape, encoded.
    pub shape: Vec<u8>,
    /// Set for a job that is a group of its own.
    pub solo: Option<JobId>,
}

#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub key: GroupKey,
    /// The queue, when the owner is one whose quota applies.
    pub queue: Option<QueueName>,
    pub jobs: BTreeSet<JobId>,
}

/// Where a waiting job is filed.
#[derive(Clone, Debug)]
struct Filed {
    group: u32,
    /// When it was filed, in filing order: a pass tries only jobs filed before it began.
    stamp: u64,
    timer: Option<Millis>,
    /// The quota classes its demand counts against, with the demand.
    demand: Vec<(QueueName, Class, u64)>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Waiting {
    groups: BTreeMap<u32, Group>,
    ids: HashMap<GroupKey, u32>,
    next_group: u32,
    filed: HashMap<JobId, Filed>,
    stamps: u64,
    timers: BTreeSet<(Millis, JobId)>,
    /// (queue, class) → waiting demand (milli) → how many jobs.
    demand: BTreeMap<(QueueName, Class), BTreeMap<u64, usize>>,
}

impl PartialEq for Waiting {
    /// Two indexes are equal when they file the same jobs in the same groups with the same timers (ids of
    /// groups and stamps are bookkeeping).
    fn eq(&self, other: &Self) -> bool {
        let by_key = |w: &Waiting| -> BTreeMap<GroupKey, BTreeSet<JobId>> {
            w.groups
                .values()
                .filter(|g| !g.jobs.is_empty())
                .map(|g| (g.key.clone(), g.jobs.clone()))
                .collect()
        };
        by_key(self) == by_key(other) && self.timers == other.timers && self.demand == other.demand
    }
}

impl Waiting {
    pub fn is_empty(&self) -> bool {
        self.filed.is_empty()
    }

    pub fn contains(&self, id: &JobId) -> bool {
        self.filed.contains_key(id)
    }

    /// Makes room for `n` more jobs (before filing many at once).
    pub fn reserve(&mut self, n: usize) {
        self.filed.reserve(n);
    }

    /// Files (or files again) a waiting job.
    pub fn file(
        &mut self,
        id: &JobId,
        key: GroupKey,
        queue: Option<QueueName>,
        timer: Option<Millis>,
        demand: Vec<(QueueName, Class, u64)>,
    ) {
        self.remove(id);
        let group = match self.ids.get(&key) {
            Some(g) => *g,
            None => {
                self.next_group += 1;
                let g = self.next_group;
                self.ids.insert(key.clone(), g);
                self.groups.insert(
                    g,
                    Group {
                        key,
                        queue,
                        jobs: BTreeSet::new(),
                    },
                );
                g
            }
        };
        if let Some(g) = self.groups.get_mut(&group) {
            g.jobs.insert(id.clone());
        }
        if let Some(t) = timer {
            self.timers.insert((t, id.clone()));
        }
        for (q, c, m) in &demand {
            *self
                .demand
                .entry((q.clone(), c.clone()))
                .or_default()
                .entry(*m)
                .or_default() += 1;
        }
        self.stamps += 1;
        self.filed.insert(
            id.clone(),
            Filed {
                group,
                stamp: self.stamps,
                timer,
                demand,
            },
        );
    }

    /// Takes a job out (it was placed, cancelled, or is filed again).
    pub fn remove(&mut self, id: &JobId) {
        let Some(f) = self.filed.remove(id) else {
            return;
        };
        if let Some(g) = self.groups.get_mut(&f.group) {
            g.jobs.remove(id);
            if g.jobs.is_empty() {
                self.ids.remove(&g.key);
                self.groups.remove(&f.group);
            }
        }
        if let Some(t) = f.timer {
            self.timers.remove(&(t, id.clone()));
        }
        for (q, c, m) in f.demand {
            let key = (q, c);
            if let Some(counts) = self.demand.get_mut(&key) {
                if let Some(n) = counts.get_mut(&m) {
                    *n -= 1;
                    if *n == 0 {
                        counts.remove(&m);
                    }
                }
                if counts.is_empty() {
                    self.demand.remove(&key);
                }
            }
        }
    }

    /// The jobs whose timer is due at `now`, in id order.
    pub fn due(&self, now: Millis) -> Vec<JobId> {
        let mut due: Vec<JobId> = self
            .timers
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, id)| id.clone())
            .collect();
        due.sort();
        due.dedup();
        due
    }

    /// The timer a waiting job is filed with.
    pub fn timer_of(&self, id: &JobId) -> Option<Millis> {
        self.filed.get(id).and_then(|f| f.timer)
    }

    /// Whether some job's timer is due at `now`.
    pub fn timer_due(&self, now: Millis) -> bool {
        self.timers.first().is_some_and(|(t, _)| *t <= now)
    }

    /// The current filing stamp: jobs filed from now on have a greater one.
    pub fn stamp(&self) -> u64 {
        self.stamps
    }

    /// The groups.
    pub fn groups(&self) -> impl Iterator<Item = (u32, &Group)> {
        self.groups.iter().map(|(g, group)| (*g, group))
    }

    pub fn group(&self, g: u32) -> Option<&Group> {
        self.groups.get(&g)
    }

    /// The first job of group `g` after `after` (from the start with `None`) that was filed no later than
    /// `stamp`.
    pub fn next_in(&self, g: u32, after: Option<&JobId>, stamp: u64) -> Option<JobId> {
        let group = self.groups.get(&g)?;
        let mut range = match after {
            Some(a) => group
                .jobs
                .range::<JobId, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => group.jobs.range::<JobId, _>(..),
        };
        range
            .find(|id| self.filed.get(*id).is_some_and(|f| f.stamp <= stamp))
            .cloned()
    }

    /// The group a job is filed in.
    pub fn group_of(&self, id: &JobId) -> Option<u32> {
        self.filed.get(id).map(|f| f.group)
    }

    /// Per queue, the smallest waiting demand of each class.
    pub fn smallest_demands(&self) -> Vec<(QueueName, BTreeMap<Class, u64>)> {
        let mut out: BTreeMap<QueueName, BTreeMap<Class, u64>> = BTreeMap::new();
        for ((q, c), counts) in &self.demand {
            if let Some((m, _)) = counts.iter().next() {
                out.entry(q.clone()).or_default().insert(c.clone(), *m);
            }
        }
        out.into_iter().collect()
    }
}

/// A tenant as the owner of a group, when no queue applies.
pub(crate) fn tenant_owner(t: &TenantId) -> String {
    format!("tenant {t}")
}
