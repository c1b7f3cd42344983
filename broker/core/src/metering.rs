//! Money, energy and carbon of running some milli-devices for some time, in integers.
//!
//! One function serves estimates (expected duration, forecast intensity) and metering (measured run time), so
//! the two always agree on units and rounding; from durable format 8 a run's carbon is metered over the
//! intensities its site advertised while it ran ([`amounts_integrated`]).

use meridian_federation::Amounts;

const MS_PER_HOUR: u128 = 3_600_000;

/// What a job costs at a site.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Price of one device-hour, micro-USD.
    pub price_micro_usd_per_hour: u64,
    /// Power draw of one device, watts.
    pub power_watts: u32,
    /// Facility overhead: total energy / IT energy.
    pub pue: f64,
    /// Grid carbon intensity, gCO2e per kWh.
    pub g_per_kwh: u32,
}

/// Amounts for `milli` milli-devices over `runtime_ms`. Each amount is rounded down once, from exact
/// integer products, so amounts for the same inputs are always equal.
pub fn amounts(rates: &Rates, milli: u64, runtime_ms: u64) -> Amounts {
    let device_milli_ms = u128::from(milli) * u128::from(runtime_ms);
    let pue_milli = (rates.pue * 1000.0).round().max(0.0) as u128;
    let cost = u128::from(rates.price_micro_usd_per_hour) * device_milli_ms / (1000 * MS_PER_HOUR);
    // watt × milli-device × ms × milli-PUE → Wh: divide by 1000 (milli) × 3.6e6 (ms per h) × 1000 (milli-PUE).
    let energy_scaled = u128::from(rates.power_watts) * device_milli_ms * pue_milli;
    let energy_div = 1000 * MS_PER_HOUR * 1000;
    let energy_wh = energy_scaled / energy_div;
    let co2_g = energy_scaled * u128::from(rates.g_per_kwh) / (energy_div * 1000);
    Amounts {
        cost_micro_usd: clamp(cost),
        energy_wh: clamp(energy_wh),
        co2_g: clamp(co2_g),
    }
}

/// Amounts for `milli` milli-devices over stretches of run time, each `(ms, g_per_kwh)` at its own grid
/// intensity (`rates.g_per_kwh` is not read). Carbon is summed exactly over the stretches and rounded down once,
/// so one stretch of the whole run gives exactly [`amounts`].
pub fn amounts_integrated(rates: &Rates, milli: u64, stretches: &[(u64, u32)]) -> Amounts {
    let runtime_ms: u64 = stretches.iter().map(|(ms, _)| *ms).sum();
    let whole = amounts(rates, milli, runtime_ms);
    let pue_milli = (rates.pue * 1000.0).round().max(0.0) as u128;
    let energy_div = 1000 * MS_PER_HOUR * 1000;
    let co2_scaled: u128 = stretches
        .iter()
        .map(|(ms, g)| {
            u128::from(rates.power_watts)
                * u128::from(milli)
                * u128::from(*ms)
                * pue_milli
                * u128::from(*g)
        })
        .sum();
    Amounts {
        co2_g: clamp(co2_scaled / (energy_div * 1000)),
        ..whole
    }
}

fn clamp(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Adds two amounts, saturating.
pub fn add(a: Amounts, b: Amounts) -> Amounts {
    Amounts {
        cost_micro_usd: a.cost_micro_usd.saturating_add(b.cost_micro_usd),
        energy_wh: a.energy_wh.saturating_add(b.energy_wh),
        co2_g: a.co2_g.saturating_add(b.co2_g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gpu_hour() {
        let r = Rates {
            price_micro_usd_per_hour: 2_000_000,
            power_watts: 400,
            pue: 1.5,
            g_per_kwh: 300,
        };
        let a = amounts(&r, 1000, 3_600_000);
        assert_eq!(a.cost_micro_usd, 2_000_000);
        assert_eq!(a.energy_wh, 600);
        assert_eq!(a.co2_g, 180);
    }

    #[test]
    fn an_hour_at_two_intensities_is_charged_half_at_each() {
        let r = Rates {
            price_micro_usd_per_hour: 2_000_000,
            power_watts: 400,
            pue: 1.5,
            g_per_kwh: 0,
        };
        let a = amounts_integrated(&r, 1000, &[(1_800_000, 100), (1_800_000, 500)]);
        assert_eq!(a.cost_micro_usd, 2_000_000);
        assert_eq!(a.energy_wh, 600);
        // 300 Wh at 100 g/kWh and 300 Wh at 500 g/kWh.
        assert_eq!(a.co2_g, 30 + 150);
        // One stretch is the plain rule, to the gram.
        let one = Rates {
            g_per_kwh: 300,
            ..r
        };
        assert_eq!(
            amounts_integrated(&r, 700, &[(5_432_100, 300)]),
            amounts(&one, 700, 5_432_100)
        );
    }

    #[test]
    fn half_a_gpu_for_half_an_hour() {
        let r = Rates {
            price_micro_usd_per_hour: 1_000_000,
            power_watts: 300,
            pue: 1.2,
            g_per_kwh: 500,
        };
        let a = amounts(&r, 500, 1_800_000);
        assert_eq!(a.cost_micro_usd, 250_000);
        assert_eq!(a.energy_wh, 90);
        assert_eq!(a.co2_g, 45);
    }
}
