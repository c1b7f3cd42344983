//! Crash-loop backoff (pure): how long a service waits before it starts a replica again where replicas keep
//! exiting. As Kubernetes' CrashLoopBackOff: the first exit waits [`FIRST_DELAY_MS`], each exit in a row after it
//! doubles the wait up to [`MAX_DELAY_MS`], and a replica that ran [`HEALTHY_RUN_MS`] resets the count. A
//! serving replica is not meant to end, so an exit with code 0 counts as one too; a replica the broker
//! cancelled (scale-in, delete) or a site interrupted does not.

use crate::Millis;
use meridian_federation::JobId;

/// The wait after the first exit.
pub const FIRST_DELAY_MS: u64 = 10_000;
/// The longest wait.
pub const MAX_DELAY_MS: u64 = 300_000;
/// A replica that ran this long was healthy: the exits before it are forgotten.
pub const HEALTHY_RUN_MS: u64 = 600_000;

/// How a replica ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub job: JobId,
    pub at_ms: Millis,
    /// How long it ran (0 when it never started).
    pub ran_ms: u64,
    pub exit_code: Option<i32>,
    /// The site's words (`failed: exit code 127 on dc-a`).
    pub reason: String,
}

/// The backoff of one service at one pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashLoop {
    /// Exits in a row since the last healthy run.
    in_a_row: u32,
    /// No replica starts here before then.
    until_ms: Millis,
    last: Option<Exit>,
}

/// The wait after the `n`th exit in a row (`n` ≥ 1).
pub fn delay_ms(n: u32) -> u64 {
    let doublings = n.saturating_sub(1).min(16);
    FIRST_DELAY_MS
        .saturating_mul(1 << doublings)
        .min(MAX_DELAY_MS)
}

impl CrashLoop {
    /// A replica ended by itself.
    pub fn exited(&mut self, exit: Exit) {
        if exit.ran_ms >= HEALTHY_RUN_MS {
            self.in_a_row = 0;
        }
        self.in_a_row += 1;
        self.until_ms = self
            .until_ms
            .max(exit.at_ms.saturating_add(delay_ms(self.in_a_row)));
        self.last = Some(exit);
    }

    /// A replica has been running since `started_ms`: once it has run [`HEALTHY_RUN_MS`] the count is reset.
    pub fn running(&mut self, started_ms: Millis, now: Millis) {
        if now.saturating_sub(started_ms) >= HEALTHY_RUN_MS {
            self.in_a_row = 0;
        }
    }

    /// Whether a new replica must wait.
    pub fn holds(&self, now: Millis) -> bool {
        self.in_a_row > 0 && now < self.until_ms
    }

    /// Exits in a row since the last healthy run.
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }

    /// When a replica may start here again.
    pub fn until_ms(&self) -> Millis {
        self.until_ms
    }

    pub fn last(&self) -> Option<&Exit> {
        self.last.as_ref()
    }

    /// Nothing to remember: no exit in a row and no wait.
    pub fn is_clear(&self) -> bool {
        self.in_a_row == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(at_ms: Millis, ran_ms: u64) -> Exit {
        Exit {
            job: JobId::numbered(1),
            at_ms,
            ran_ms,
            exit_code: Some(127),
            reason: "failed: exit code 127".into(),
        }
    }

    #[test]
    fn the_wait_doubles_from_ten_seconds_to_five_minutes() {
        let waits: Vec<u64> = (1..=8).map(delay_ms).collect();
        assert_eq!(
            waits,
            [10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000, 300_000]
        );
        assert_eq!(delay_ms(u32::MAX), MAX_DELAY_MS);
    }

    #[test]
    fn each_exit_in_a_row_holds_the_pool_longer() {
        let mut c = CrashLoop::default();
        assert!(!c.holds(0));
        c.exited(exit(1_000, 200));
        assert!(c.holds(10_999) && !c.holds(11_000));
        c.exited(exit(12_000, 200));
        assert_eq!((c.in_a_row(), c.until_ms()), (2, 32_000));
        c.exited(exit(33_000, 200));
        assert_eq!((c.in_a_row(), c.until_ms()), (3, 73_000));
        assert_eq!(c.last().map(|e| e.exit_code), Some(Some(127)));
    }

    #[test]
    fn a_replica_that_ran_ten_minutes_resets_the_count() {
        let mut c = CrashLoop::default();
        for at in [0, 20_000, 60_000] {
            c.exited(exit(at, 0));
        }
        assert_eq!(c.in_a_row(), 3);
        // A replica that has run ten minutes since clears it while it runs…
        c.running(100_000, 100_000 + HEALTHY_RUN_MS - 1);
        assert_eq!(c.in_a_row(), 3);
        c.running(100_000, 100_000 + HEALTHY_RUN_MS);
        assert!(c.is_clear() && !c.holds(100_000 + HEALTHY_RUN_MS));
        // …and one that ends after ten minutes waits only the first delay.
        let mut c = CrashLoop::default();
        c.exited(exit(0, 0));
        c.exited(exit(30_000, 0));
        c.exited(exit(2_000_000, HEALTHY_RUN_MS));
        assert_eq!((c.in_a_row(), c.until_ms()), (1, 2_010_000));
    }
}
