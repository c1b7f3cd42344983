//! The scaler ([`Scaler::step`]): the desired counts turned into targets, with the delays as hysteresis.

use super::*;

/// Replicas of one key as they are now: serving, and started but not serving yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Present {
    pub ready: u32,
    pub starting: u32,
}

impl Present {
    pub fn total(self) -> u32 {
        self.ready + self.starting
    }
}

/// Why a count changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Demand stayed above what the replicas serve for the whole scale-up delay.
    DemandRose,
    /// Demand stayed below for the whole scale-down delay.
    DemandFell,
    /// A location with demand had no replica within the SLO: covered at once.
    Uncovered,
}

/// One change of a key's replica count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub key: ReplicaKey,
    pub from: u32,
    pub to: u32,
    pub why: Why,
}

/// The demand one location has been seen at recently, and the level the scaler plans for.
#[derive(Clone, Debug, Default)]
pub(super) struct Window {
    /// Rates as reported.
    pub(super) raw: VecDeque<(Millis, f64)>,
    /// The mean over the demand window at each step.
    pub(super) seen: VecDeque<(Millis, f64)>,
    pub(super) planned: f64,
    /// The level planned for at each step of the last scale-down delay.
    pub(super) plans: VecDeque<(Millis, f64)>,
    /// When the mean was last above zero.
    pub(super) last_demand_ms: Option<Millis>,
}

/// The rate a location is planned for while it has had no demand for less than a scale-down delay: it stays
/// covered (a replica within the SLO is kept for it) without asking for throughput.
pub(super) const COVER_RATE: f64 = 1e-6;

impl Window {
    /// The level seen over the whole of `[now - delay, now]`, by `pick` (min or max), or `None` if what was seen
    /// does not reach back that far.
    pub(super) fn level(&self, now: Millis, delay: u64, pick: fn(f64, f64) -> f64) -> Option<f64> {
        let start = now.saturating_sub(delay);
        let first = self.seen.iter().rposition(|(t, _)| *t <= start)?;
        self.seen.iter().skip(first).map(|(_, r)| *r).reduce(pick)
    }
}

/// The hysteresis of one service. Per location: a location is planned for the lowest rate its sliding mean
/// kept over the whole scale-up delay when that is above its plan (a location seen with demand for the first
/// time at once, and a mean back at a level it held within the scale-down delay at once, up to that level), and
/// for its mean when that is below; one whose demand stopped stays covered for a scale-down delay (a replica
/// within the SLO is kept for it). Down, per service ([`Scaler::kept`]): replicas are kept beyond the plan only
/// while its total is below the most it wanted within the scale-down delay, and only where it wanted them then.
/// Holding what the service needed at once — not the sum of each location's own highest level — keeps fewer
/// replicas where several locations' demand peaks at different times, and lets a move stop the old replicas as
/// soon as the new ones serve. Soft state: a new scaler (after a restart or a takeover) removes nothing until it has seen a full
/// scale-down delay of demand.
#[derive(Clone, Debug, Default)]
pub struct Scaler {
    windows: BTreeMap<String, Window>,
    since: Option<Millis>,
    /// The plan at each step of the last scale-down delay: its total and its count per key.
    wanted: VecDeque<(Millis, u32, BTreeMap<ReplicaKey, u32>)>,
}

impl Scaler {
    /// The demand to plan for now, from what was just measured.
    pub(super) fn planned(
        &mut self,
        now: Millis,
        measured: &[LocationDemand],
        s: &Settings,
    ) -> Vec<LocationDemand> {
        let keep_from = now.saturating_sub(s.up_delay_ms);
        let plans_from = now.saturating_sub(s.down_delay_ms);
        measured
            .iter()
            .map(|d| {
                let w = self.windows.entry(d.name.clone()).or_default();
                w.raw.push_back((now, d.rate.max(0.0)));
                while w.raw.front().is_some_and(|(t, _)| *t + s.window_ms <= now) {
                    w.raw.pop_front();
                }
                let mean = w.raw.iter().map(|(_, r)| r).sum::<f64>() / w.raw.len().max(1) as f64;
                w.seen.push_back((now, mean));
                while w.seen.len() > 1 && w.seen[1].0 <= keep_from {
                    w.seen.pop_front();
                }
                let up = w.level(now, s.up_delay_ms, f64::min);
                // Back at once to a level planned for within the scale-down delay: demand that returns is not
                // a spike.
                let recent = w.plans.iter().map(|(_, r)| *r).fold(0.0, f64::max);
                let back = mean.min(recent);
                w.planned = if w.planned <= 0.0 && mean > 0.0 {
                    mean
                } else if let Some(u) = up.filter(|u| *u > w.planned) {
                    u.max(back)
                } else if back > w.planned {
                    back
                } else {
                    w.planned.min(mean)
                };
                w.plans.push_back((now, w.planned));
                while w.plans.front().is_some_and(|(t, _)| *t < plans_from) {
                    w.plans.pop_front();
                }
                if mean > 0.0 {
                    w.last_demand_ms = Some(now);
                }
                let covered = w
                    .last_demand_ms
                    .is_some_and(|t| now.saturating_sub(t) < s.down_delay_ms);
                LocationDemand {
                    rate: if covered {
                        w.planned.max(COVER_RATE)
                    } else {
                        w.planned
                    },
                    ..d.clone()
                }
            })
            .collect()
    }

    /// Where replicas should be for the demand just measured, and the changes to make now given what runs.
    /// A count goes up at once; it goes down only when no location the pool reaches waits for a replica that is
    /// starting (make before break) and the scaler has seen a full scale-down delay.
    pub fn step(
        &mut self,
        now: Millis,
        offers: &[Offer],
        measured: &[LocationDemand],
        present: &BTreeMap<ReplicaKey, Present>,
        rtt: &RttTable,
        s: &Settings,
    ) -> (Desired, Vec<Change>) {
        let since = *self.since.get_or_insert(now);
        let planned = self.planned(now, measured, s);
        let running: BTreeMap<ReplicaKey, u32> = present
            .iter()
            .map(|(k, p)| (k.clone(), p.total()))
            .collect();
        let want = desired_from(offers, &planned, rtt, s, &running);
        // Keys serving a location that has demand and nothing within reach now.
        let mut urgent: BTreeSet<&ReplicaKey> = BTreeSet::new();
        for (l, reach) in want.reach.iter().enumerate() {
            let covered = reach
                .iter()
                .any(|i| present.get(&offers[*i].key).is_some_and(|p| p.total() > 0));
            if planned[l].rate > 0.0 && !covered {
                urgent.extend(want.served[l].iter().map(|(i, _)| &offers[*i].key));
            }
        }
        // Make before break, per neighbourhood: a pool gives up replicas only when no location it reaches is
        // waiting for a replica that is starting, or is about to start in this step.
        let starting = |i: &usize| {
            let key = &offers[*i].key;
            let have = present.get(key).copied().unwrap_or_default();
            have.starting > 0 || want.replicas.get(key).copied().unwrap_or(0) > have.total()
        };
        let mut held: BTreeSet<&ReplicaKey> = BTreeSet::new();
        for reach in &want.reach {
            if reach.iter().any(starting) {
                held.extend(reach.iter().map(|i| &offers[*i].key));
            }
        }
        let window_seen = now >= since + s.down_delay_ms;
        let keys: BTreeSet<&ReplicaKey> = present.keys().chain(want.replicas.keys()).collect();
        let kept = self.kept(now, offers, present, &want, s);
        let mut changes = Vec::new();
        for key in keys {
            let from = present.get(key).map_or(0, |p| p.total());
            let to = want.replicas.get(key).copied().unwrap_or(0);
            let to = if to < from {
                (to + kept.get(key).copied().unwrap_or(0))
                    .max(self.wanted_within(now, key, s.up_delay_ms))
                    .min(from)
            } else {
                to
            };
            let why = if to > from && urgent.contains(key) {
                Why::Uncovered
            } else if to > from {
                Why::DemandRose
            } else if to < from && window_seen && !held.contains(key) {
                Why::DemandFell
            } else {
                continue;
            };
            changes.push(Change {
                key: key.clone(),
                from,
                to,
                why,
            });
        }
        (want, changes)
    }

    /// The most replicas the plan wanted of `key` at any step of the last `delay`: a pool's count falls only to
    /// that, so a fall must hold as long as a rise must (a one-minute dip at one location, while another's
    /// demand keeps the service's total up, stops no replica that the next minute would start again).
    pub(super) fn wanted_within(&self, now: Millis, key: &ReplicaKey, delay: u64) -> u32 {
        let from = now.saturating_sub(delay);
        self.wanted
            .iter()
            .filter(|(t, _, _)| *t >= from)
            .map(|(_, _, w)| w.get(key).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    /// Replicas kept beyond the plan, per key, because demand fell less than a scale-down delay ago: the plan's
    /// total now may fall short of the most it wanted at any step of the delay by at most that many, and each
    /// key keeps at most what the plan wanted of it over the delay (the best kept first, in reverse removal
    /// order). A move (the plan wants as many elsewhere) keeps nothing: the old replicas stop once the new ones
    /// serve. Before the scaler has seen a whole delay, every running replica is kept.
    pub(super) fn kept(
        &mut self,
        now: Millis,
        offers: &[Offer],
        present: &BTreeMap<ReplicaKey, Present>,
        want: &Desired,
        s: &Settings,
    ) -> BTreeMap<ReplicaKey, u32> {
        let keep_from = now.saturating_sub(s.down_delay_ms);
        let total: u32 = want.replicas.values().sum();
        self.wanted.push_back((now, total, want.replicas.clone()));
        while self.wanted.len() > 1 && self.wanted[1].0 <= keep_from {
            self.wanted.pop_front();
        }
        let reaches_back = self.wanted.front().is_some_and(|(t, _, _)| *t <= keep_from);
        if !reaches_back {
            return present
                .iter()
                .map(|(k, p)| (k.clone(), p.total()))
                .collect();
        }
        let most_total = self.wanted.iter().map(|(_, t, _)| *t).max().unwrap_or(0);
        let mut allowance = most_total.saturating_sub(total);
        let mut kept = BTreeMap::new();
        if allowance == 0 {
            return kept;
        }
        for i in removal_order(offers, s.objective).into_iter().rev() {
            if allowance == 0 {
                break;
            }
            let key = &offers[i].key;
            let have = present.get(key).map_or(0, |p| p.total());
            let now_wanted = want.replicas.get(key).copied().unwrap_or(0);
            if have <= now_wanted {
                continue;
            }
            let most = self
                .wanted
                .iter()
                .map(|(_, _, w)| w.get(key).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            let keep = most.min(have).saturating_sub(now_wanted).min(allowance);
            if keep > 0 {
                kept.insert(key.clone(), keep);
                allowance -= keep;
            }
        }
        kept
    }
}
