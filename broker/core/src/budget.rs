//! Budgets per tenant per period, in USD and kgCO2e (pure).
//!
//! What a tenant has used in a period is what its attempts offered in the period were metered at, plus what the
//! attempts still holding devices are expected to cost (their placement estimates). A job's expected spend is
//! the estimate at the placement the broker would choose for it. A job that would take the tenant over a budget
//! is refused at submission, or held until the next period, as the budget says.

use super::model::Job;
use super::Millis;
use meridian_federation::{Amounts, TenantId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenExceeded {
    /// The submission is refused with the reason.
    Refuse,
    /// The job is accepted and waits for the next period.
    Hold,
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetFile {
    pub tenant: String,
    pub period: Period,
    #[serde(default)]
    pub usd: Option<f64>,
    #[serde(default)]
    pub kgco2e: Option<f64>,
    pub when_exceeded: WhenExceeded,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    pub tenant: TenantId,
    pub period: Period,
    pub cost_micro_usd: Option<u64>,
    pub co2_g: Option<u64>,
    pub when_exceeded: WhenExceeded,
}

impl Budget {
    pub fn from_file(b: &BudgetFile) -> Result<Budget, crate::error::CoreError> {
        Self::read(b).map_err(crate::error::config)
    }

    fn read(b: &BudgetFile) -> Result<Budget, String> {
        let at = |e: String| format!("budget of {:?}: {e}", b.tenant);
        let tenant = TenantId::new(&b.tenant).map_err(|e| at(format!("tenant: {e}")))?;
        let amount = |x: Option<f64>, scale: f64, what: &str| -> Result<Option<u64>, String> {
            match x {
                None => Ok(None),
                Some(v) if v.is_finite() && v >= 0.0 => Ok(Some((v * scale).round() as u64)),
                Some(v) => Err(at(format!("{what} {v} is not an amount"))),
            }
        };
        let budget = Budget {
            tenant,
            period: b.period,
            cost_micro_usd: amount(b.usd, 1e6, "usd")?,
            co2_g: amount(b.kgco2e, 1e3, "kgco2e")?,
            when_exceeded: b.when_exceeded,
        };
        if budget.cost_micro_usd.is_none() && budget.co2_g.is_none() {
            return Err(at("set usd, kgco2e or both".into()));
        }
        Ok(budget)
    }
}

/// Days since 1970-01-01 → (year, month 1-12). (H. Hinnant's civil-from-days.)
fn civil(days: i64) -> (i64, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m as u32)
}

/// (year, month 1-12) → days since 1970-01-01 of its first day.
fn days_from_civil(y: i64, m: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

const DAY: u64 = 86_400_000;

/// The period containing `now`: `[start, end)` in ms since the Unix epoch (UTC).
pub fn period(now: Millis, p: Period) -> (Millis, Millis) {
    match p {
        Period::Day => {
            let start = now - now % DAY;
            (start, start + DAY)
        }
        Period::Month => {
            let (y, m) = civil((now / DAY) as i64);
            let start = days_from_civil(y, m) as u64 * DAY;
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (start, days_from_civil(ny, nm) as u64 * DAY)
        }
    }
}

/// What `tenant` has used in the period `[from, to)`: metered attempts offered in it, plus the estimates of the
/// attempts still holding devices (not metered yet).
pub fn used<'a>(
    jobs: impl IntoIterator<Item = &'a Job>,
    tenant: &TenantId,
    from: Millis,
    to: Millis,
) -> Amounts {
    let mut a = Amounts::default();
    for job in jobs.into_iter().filter(|j| &j.spec.tenant == tenant) {
        for run in job
            .runs
            .iter()
            .filter(|r| r.offered_ms >= from && r.offered_ms < to)
        {
            if run.metered {
                a.cost_micro_usd += run.amounts.cost_micro_usd;
                a.energy_wh += run.amounts.energy_wh;
                a.co2_g += run.amounts.co2_g;
            } else if job.holds_devices() && job.attempt == run.attempt {
                if let Some(e) = &job.estimate {
                    a.cost_micro_usd += e.cost_micro_usd;
                    a.energy_wh += e.energy_wh;
                    a.co2_g += e.co2_g;
                }
            }
        }
    }
    a
}

/// Why a job expected to cost `expected` would take the tenant over `b`, having used `used`; `None` if it fits.
pub fn over(b: &Budget, used: &Amounts, expected: &Amounts) -> Option<String> {
    let period = match b.period {
        Period::Day => "day",
        Period::Month => "month",
    };
    if let Some(limit) = b.cost_micro_usd {
        if used.cost_micro_usd + expected.cost_micro_usd > limit {
            return Some(format!(
                "over budget: tenant {} has {:.2} of its {:.2} USD for this {period} left; the job is expected to cost {:.2} USD where the broker would place it",
                b.tenant,
                limit.saturating_sub(used.cost_micro_usd) as f64 / 1e6,
                limit as f64 / 1e6,
                expected.cost_micro_usd as f64 / 1e6
            ));
        }
    }
    if let Some(limit) = b.co2_g {
        if used.co2_g + expected.co2_g > limit {
            return Some(format!(
                "over budget: tenant {} has {:.3} of its {:.3} kgCO2e for this {period} left; the job is expected to emit {:.3} kgCO2e where the broker would place it",
                b.tenant,
                limit.saturating_sub(used.co2_g) as f64 / 1e3,
                limit as f64 / 1e3,
                expected.co2_g as f64 / 1e3
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_calendar_days_and_months_in_utc() {
        // 2024-02-29T12:00Z (a leap day).
        let t = 1_709_208_000_000;
        assert_eq!(
            period(t, Period::Day),
            (1_709_164_800_000, 1_709_251_200_000)
        );
        // February 2024: 2024-02-01 .. 2024-03-01.
        assert_eq!(
            period(t, Period::Month),
            (1_706_745_600_000, 1_709_251_200_000)
        );
        // December rolls into January: 2023-12-31T23:59:59Z.
        assert_eq!(
            period(1_704_067_199_000, Period::Month),
            (1_701_388_800_000, 1_704_067_200_000)
        );
        assert_eq!(period(0, Period::Month), (0, 31 * DAY));
    }
}
