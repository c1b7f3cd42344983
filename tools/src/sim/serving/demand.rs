//! The demand a simulated service sees: the Alibaba GenAI QPS curve (one day of a production service) spread over
//! user cities, each city's day shifted by its time zone.
//!
//! The model's assumptions, stated where they are made:
//! - the service's total rate is the per-minute sum of the containers' reported QPS (each container's last
//!   report held until its next, dropped after three silent minutes);
//! - the 22.3 hours of the curve are stretched onto a 24-hour day, and the curve's first minute is taken as
//!   09:00 local time (its long near-zero stretch then falls at night);
//! - every city has the same share of users; a city's local time is UTC + longitude / 15° hours;
//! - the requests of a city in a minute are Poisson around the curve (drawn by a normal approximation), and with
//!   a service that counts tokens, each request's size is drawn from the Azure LLM trace (context + generated
//!   tokens; the minute's sum by the same approximation);
//! - cities with no site of the federation within the SLO are left out and counted.

use crate::sim::trace::SplitMix64;
use meridian_federation::GeoPoint;
use std::collections::BTreeMap;

pub const DAY_MIN: usize = 1440;
/// The local time of the curve's first minute.
pub const CURVE_START_LOCAL_MIN: i64 = 9 * 60;

/// Per-minute total QPS of the curve's generative requests.
pub fn parse_qps_curve(text: &str) -> Result<Vec<f64>, String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let mut samples: Vec<(f64, String, f64)> = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.map_err(|e| format!("row {}: {e}", i + 2))?;
        if row.get(3) != Some("Generative Requests") {
            continue;
        }
        let field = |k: usize, name: &str| -> Result<f64, String> {
            let v = row.get(k).unwrap_or("");
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("row {}: {name} {v:?} is not a number", i + 2))
        };
        samples.push((
            field(0, "timestamp_anon")?,
            row.get(2).unwrap_or("").to_owned(),
            field(1, "value")?,
        ));
    }
    if samples.is_empty() {
        return Err("no `Generative Requests` rows".to_owned());
    }
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    let t0 = samples[0].0;
    let minutes = ((samples[samples.len() - 1].0 - t0) / 60.0).floor() as usize + 1;
    let mut curve = vec![0.0; minutes];
    // Each container's last report, held for three minutes.
    let mut last: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    let mut next = 0;
    for (m, slot) in curve.iter_mut().enumerate() {
        while next < samples.len() && ((samples[next].0 - t0) / 60.0) as usize <= m {
            let (_, c, v) = &samples[next];
            last.insert(c.as_str(), (m, *v));
            next += 1;
        }
        *slot = last
            .values()
            .filter(|(at, _)| m - at <= 3)
            .map(|(_, v)| v)
            .sum();
    }
    Ok(curve)
}

/// The curve stretched onto 1,440 minutes and normalised to a peak of 1.
pub fn day_shape(curve: &[f64]) -> Vec<f64> {
    let n = curve.len().max(1);
    let day: Vec<f64> = (0..DAY_MIN)
        .map(|d| curve.get(d * n / DAY_MIN).copied().unwrap_or(0.0))
        .collect();
    let peak = day.iter().copied().fold(0.0, f64::max).max(1e-12);
    day.into_iter().map(|x| x / peak).collect()
}

/// The cities of the WonderNetwork server list: name and location.
pub fn parse_cities(text: &str) -> Result<Vec<(String, GeoPoint)>, String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let mut out = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.map_err(|e| format!("row {}: {e}", i + 2))?;
        let num = |k: usize, name: &str| -> Result<f64, String> {
            let v = row.get(k).unwrap_or("");
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("row {}: {name} {v:?} is not a number", i + 2))
        };
        let (lat, lon) = (num(8, "latitude")?, num(9, "longitude")?);
        if !(-90.0..=90.0).contains(&lat) || !(-180.0..=180.0).contains(&lon) {
            return Err(format!("row {}: ({lat}, {lon}) is not a location", i + 2));
        }
        out.push((row.get(2).unwrap_or("").to_owned(), GeoPoint { lat, lon }));
    }
    Ok(out)
}

/// The local minute of the day at UTC minute `utc_min` for a city at longitude `lon`.
pub fn local_minute(utc_min: usize, lon: f64) -> usize {
    let offset = (lon / 15.0 * 60.0).round() as i64;
    (utc_min as i64 + offset).rem_euclid(DAY_MIN as i64) as usize
}

/// Request sizes (context + generated tokens) of the Azure LLM trace: mean and standard deviation.
pub fn token_sizes(text: &str) -> Result<(f64, f64), String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let (mut n, mut sum, mut sq) = (0f64, 0f64, 0f64);
    for (i, row) in reader.records().enumerate() {
        let row = row.map_err(|e| format!("row {}: {e}", i + 2))?;
        let mut tokens = 0.0;
        for k in [1, 2] {
            let v = row.get(k).unwrap_or("");
            tokens += v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("row {}: token count {v:?}", i + 2))?;
        }
        n += 1.0;
        sum += tokens;
        sq += tokens * tokens;
    }
    if n == 0.0 {
        return Err("no requests".to_owned());
    }
    let mean = sum / n;
    Ok((mean, (sq / n - mean * mean).max(0.0).sqrt()))
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u = rng.next_f64().max(1e-300);
    let v = rng.next_f64();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The demand of every city in every minute, in the service's unit per minute.
#[derive(Clone, Debug)]
pub struct DemandMatrix {
    pub minutes: usize,
    pub cities: usize,
    /// `[minute × cities + city]`.
    pub amount: Vec<f64>,
    /// The expected rate (unit per second) of the busiest minute, all cities together.
    pub peak_rate: f64,
}

impl DemandMatrix {
    pub fn at(&self, minute: usize, city: usize) -> f64 {
        self.amount[minute * self.cities + city]
    }

    pub fn minute(&self, minute: usize) -> &[f64] {
        &self.amount[minute * self.cities..(minute + 1) * self.cities]
    }

    /// Draws `days` of demand. `peak_rate` is the expected total rate (unit per second) at the busiest minute of
    /// the day; `tokens` the request size (mean, sd) when the service counts tokens.
    pub fn draw(
        shape: &[f64],
        lons: &[f64],
        days: usize,
        peak_rate: f64,
        tokens: Option<(f64, f64)>,
        seed: u64,
    ) -> DemandMatrix {
        let cities = lons.len();
        let expected = |m: usize, c: usize| -> f64 {
            let local = local_minute(m % DAY_MIN, lons[c]);
            let curve_min = (local + DAY_MIN - CURVE_START_LOCAL_MIN as usize) % DAY_MIN;
            shape[curve_min]
        };
        // The day's busiest minute over all cities fixes the scale.
        let busiest = (0..DAY_MIN)
            .map(|m| (0..cities).map(|c| expected(m, c)).sum::<f64>())
            .fold(0.0, f64::max)
            .max(1e-12);
        let per_request = tokens.map_or(1.0, |(mean, _)| mean);
        // Requests per second at a shape value of 1, for one city.
        let scale = peak_rate / per_request / busiest;
        let minutes = days * DAY_MIN;
        let mut rng = SplitMix64::new(seed ^ 0x5e41_ce00);
        let mut amount = Vec::with_capacity(minutes * cities);
        for m in 0..minutes {
            for c in 0..cities {
                let mean = expected(m, c) * scale * 60.0;
                let requests = (mean + mean.sqrt() * normal(&mut rng)).max(0.0);
                let value = match tokens {
                    None => requests,
                    Some((size, sd)) => {
                        (requests * size + requests.sqrt() * sd * normal(&mut rng)).max(0.0)
                    }
                };
                amount.push(value);
            }
        }
        DemandMatrix {
            minutes,
            cities,
            amount,
            peak_rate,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_curve_holds_each_containers_last_report() {
        let csv = "timestamp_anon,value,container_ip,request_type\n\
                   0,1.0,a,Generative Requests\n\
                   30,2.0,b,Generative Requests\n\
                   61,9.0,,API Requests\n\
                   65,3.0,a,Generative Requests\n\
                   400,1.0,b,Generative Requests\n";
        let c = parse_qps_curve(csv).unwrap();
        // Minute 0: a=1, b=2; minute 1: a=3, b=2 held; 4: b silent for over 3 minutes; 5: a too; 6: b again.
        assert_eq!(c[0], 3.0);
        assert_eq!(c[1], 5.0);
        assert_eq!(c[3], 5.0);
        assert_eq!(c[4], 3.0);
        assert_eq!(c[5], 0.0);
        assert_eq!(c[6], 1.0);
        assert!(parse_qps_curve(
            "timestamp_anon,value,container_ip,request_type\n0,x,a,Generative Requests\n"
        )
        .is_err());
    }

    #[test]
    fn local_time_follows_longitude() {
        assert_eq!(local_minute(0, 0.0), 0);
        assert_eq!(local_minute(0, 135.0), 9 * 60);
        assert_eq!(local_minute(60, -75.0), DAY_MIN - 4 * 60);
    }

    #[test]
    fn the_drawn_demand_peaks_at_the_asked_rate_and_follows_the_sun() {
        let mut shape = vec![0.0; DAY_MIN];
        // Busy only in the curve's first hour (09:00–10:00 local).
        for x in shape.iter_mut().take(60) {
            *x = 1.0;
        }
        let d = DemandMatrix::draw(&shape, &[0.0, 90.0], 1, 100.0, None, 7);
        // London-like city busy 09:00–10:00 UTC; the one at 90°E busy 03:00–04:00 UTC, each at 100 req/s.
        let rate = |m: usize, c: usize| d.at(m, c) / 60.0;
        assert!((rate(9 * 60 + 30, 0) - 100.0).abs() < 10.0);
        assert_eq!(rate(3 * 60 + 30, 0), 0.0);
        assert!((rate(3 * 60 + 30, 1) - 100.0).abs() < 10.0);
        let total: f64 = d.amount.iter().sum();
        assert!(
            (total / (2.0 * 3600.0 * 100.0) - 1.0).abs() < 0.02,
            "{total}"
        );
    }
}
