//! Deferral of flexible work to a cleaner hour.

use super::Wait;
use crate::model::Site;
use crate::Millis;

/// Hours ahead a deferrable job looks for a cleaner start (the length of an advertised forecast).
pub const DEFER_HORIZON_H: u64 = 72;
/// A later start must cut the run's mean grid intensity by at least this share to be worth waiting for.
pub const DEFER_MIN_SAVING: f64 = 0.10;

/// The cleaner start for a deferrable run at `site`: the whole hour, up to [`DEFER_HORIZON_H`] ahead and no
/// later than `deadline − runtime`, whose forecast mean intensity over the run is lowest, if it beats starting
/// now by [`DEFER_MIN_SAVING`].
pub(super) fn defer(site: &Site, runtime_ms: u64, now: Millis, deadline: Millis) -> Option<Wait> {
    const HOUR: u64 = 3_600_000;
    let latest = deadline.checked_sub(runtime_ms)?;
    let now_g = site.mean_intensity(now, runtime_ms);
    let mut best: Option<(Millis, f64)> = None;
    let mut t = now - now % HOUR + HOUR;
    while t <= latest && t <= now + DEFER_HORIZON_H * HOUR {
        let g = site.mean_intensity(t, runtime_ms);
        if best.is_none_or(|(_, b)| g < b) {
            best = Some((t, g));
        }
        t += HOUR;
    }
    let (until_ms, then_g) = best?;
    (then_g < now_g * (1.0 - DEFER_MIN_SAVING)).then(|| Wait::Deferred {
        site: site.id().clone(),
        until_ms,
        now_g_per_kwh: now_g,
        then_g_per_kwh: then_g,
    })
}
