//! A value that changes in steps over time (a site's grid intensity as it advertised it), kept so that what
//! ran across several steps is metered at each step's value for the time it held.

use crate::Millis;
use serde::{Deserialize, Serialize};

/// The steps of one value, oldest first: each holds from its time until the next one's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Steps<T> {
    steps: Vec<(Millis, T)>,
}

impl<T: Copy + PartialEq> Steps<T> {
    /// The value holds from `at` on. A value equal to the one in force adds no step; a second value at the same
    /// instant replaces the first. Times do not go back: a step before the last one is taken at the last one's
    /// time.
    pub fn set(&mut self, at: Millis, value: T) {
        match self.steps.last_mut() {
            Some((_, v)) if *v == value => {}
            Some((t, v)) if *t >= at => *v = value,
            _ => self.steps.push((at, value)),
        }
    }

    /// The steps, oldest first: `(from, value)`.
    pub fn steps(&self) -> &[(Millis, T)] {
        &self.steps
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// How long each value held within `[from, to)`, in order: `(ms, value)`. Before the first step, the first
    /// value (the earliest known) is taken. Nothing for an empty log or an empty span.
    pub fn stretches(&self, from: Millis, to: Millis) -> Vec<(u64, T)> {
        let mut out: Vec<(u64, T)> = Vec::new();
        if from >= to {
            return out;
        }
        let Some(first) = self.steps.first() else {
            return out;
        };
        // The step in force at `from`.
        let mut i = self.steps.partition_point(|(t, _)| *t <= from);
        let mut t = from;
        let mut value = match i {
            0 => first.1,
            _ => self.steps[i - 1].1,
        };
        while t < to {
            let next = self.steps.get(i).map_or(to, |(at, _)| (*at).min(to));
            if next > t {
                match out.last_mut() {
                    Some((ms, v)) if *v == value => *ms += next - t,
                    _ => out.push((next - t, value)),
                }
                t = next;
            }
            if let Some((_, v)) = self.steps.get(i) {
                value = *v;
            }
            i += 1;
        }
        out
    }

    /// Forgets the steps no span from `t` on can reach: every step before the one in force at `t`.
    pub fn prune_before(&mut self, t: Millis) {
        let in_force = self.steps.partition_point(|(at, _)| *at <= t);
        if in_force > 1 {
            self.steps.drain(..in_force - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(steps: &[(Millis, u32)]) -> Steps<u32> {
        let mut s = Steps::default();
        for (t, v) in steps {
            s.set(*t, *v);
        }
        s
    }

    #[test]
    fn a_span_is_cut_where_the_value_changed() {
        let s = log(&[(1_000, 100), (5_000, 500), (9_000, 200)]);
        assert_eq!(
            s.stretches(3_000, 10_000),
            [(2_000, 100), (4_000, 500), (1_000, 200)]
        );
        assert_eq!(s.stretches(5_000, 6_000), [(1_000, 500)]);
        // Before the first step: the earliest value known.
        assert_eq!(s.stretches(0, 2_000), [(2_000, 100)]);
        assert_eq!(s.stretches(7_000, 7_000), []);
        assert!(Steps::<u32>::default().stretches(0, 10).is_empty());
    }

    #[test]
    fn an_unchanged_value_adds_no_step_and_a_second_one_at_the_same_instant_replaces_the_first() {
        let mut s = log(&[(1_000, 100), (2_000, 100), (3_000, 300)]);
        assert_eq!(s.len(), 2);
        s.set(3_000, 400);
        assert_eq!(s.stretches(0, 4_000), [(3_000, 100), (1_000, 400)]);
        // Back to the value before: a step, and stretches of one value stay whole.
        s.set(3_500, 100);
        assert_eq!(s.stretches(3_000, 4_000), [(500, 400), (500, 100)]);
    }

    #[test]
    fn pruning_keeps_the_step_in_force_and_what_follows() {
        let mut s = log(&[(1_000, 100), (5_000, 500), (9_000, 200)]);
        let before = s.stretches(6_000, 12_000);
        s.prune_before(6_000);
        assert_eq!(s.len(), 2);
        assert_eq!(s.stretches(6_000, 12_000), before);
        s.prune_before(100);
        assert_eq!(s.len(), 2);
    }
}
