//! Round-trip time from a user population to a site.
//!
//! Where both ends name a region of the measured table (the Azure inter-region P50 table), the measured value
//! is used. Otherwise the round trip is estimated from great-circle distance: light in fibre covers about
//! 200 km per millisecond one way, real routes are about [`ROUTE_FACTOR`] times longer than the great circle,
//! and [`BASE_RTT_MS`] covers last-mile and switching time:
//!
//! `rtt_ms = BASE_RTT_MS + 2 × distance_km × ROUTE_FACTOR / FIBRE_KM_PER_MS`

use geo::{Distance, Haversine, Point};
use meridian_federation::GeoPoint;
use std::collections::HashMap;

/// One-way distance light covers in fibre per millisecond, km.
pub const FIBRE_KM_PER_MS: f64 = 200.0;
/// Path length of real routes over the great circle.
pub const ROUTE_FACTOR: f64 = 1.5;
/// Fixed part of every round trip, ms.
pub const BASE_RTT_MS: f64 = 2.0;

/// Measured round trips between named regions (directional, as measured), by origin then destination, so a
/// lookup by two `&str` allocates nothing (it is on placement's path, once per candidate and user).
#[derive(Clone, Debug, Default)]
pub struct RttTable {
    rtt: HashMap<String, HashMap<String, f64>>,
}

impl RttTable {
    pub fn insert(&mut self, from: &str, to: &str, rtt_ms: f64) {
        self.rtt
            .entry(from.to_owned())
            .or_default()
            .insert(to.to_owned(), rtt_ms);
    }

    pub fn len(&self) -> usize {
        self.rtt.values().map(HashMap::len).sum()
    }

    /// Every measured pair: `(from, to, rtt_ms)`, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str, f64)> {
        self.rtt
            .iter()
            .flat_map(|(f, to)| to.iter().map(move |(t, ms)| (f.as_str(), t.as_str(), *ms)))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The measured round trip, if the table has the pair (in either direction; same region counts as 1 ms).
    pub fn lookup(&self, from: &str, to: &str) -> Option<f64> {
        if from == to {
            return Some(1.0);
        }
        let one_way = |a: &str, b: &str| self.rtt.get(a).and_then(|m| m.get(b)).copied();
        one_way(from, to).or_else(|| one_way(to, from))
    }

    /// Parses the long-format CSV `from_region,to_region,from_id,to_id,rtt_ms`, keyed by the ids.
    pub fn from_azure_csv(text: &str) -> Result<Self, crate::error::CoreError> {
        Self::parse_azure_csv(text).map_err(crate::error::config)
    }

    fn parse_azure_csv(text: &str) -> Result<Self, String> {
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let mut table = RttTable::default();
        for (i, row) in reader.records().enumerate() {
            let row = row.map_err(|e| format!("row {}: {e}", i + 2))?;
            let (Some(from), Some(to), Some(rtt)) = (row.get(2), row.get(3), row.get(4)) else {
                return Err(format!("row {}: expected 5 columns", i + 2));
            };
            let rtt: f64 = rtt
                .trim()
                .parse()
                .map_err(|e| format!("row {}: rtt_ms {rtt:?}: {e}", i + 2))?;
            table.insert(from, to, rtt);
        }
        Ok(table)
    }
}

/// Great-circle distance, km.
pub fn distance_km(a: GeoPoint, b: GeoPoint) -> f64 {
    Haversine.distance(Point::new(a.lon, a.lat), Point::new(b.lon, b.lat)) / 1000.0
}

/// The distance-based estimate of a round trip, ms.
pub fn estimate_rtt_ms(a: GeoPoint, b: GeoPoint) -> f64 {
    BASE_RTT_MS + 2.0 * distance_km(a, b) * ROUTE_FACTOR / FIBRE_KM_PER_MS
}

/// Round trip between a user at `user` (optionally in region `user_region`) and a site.
pub fn rtt_ms(
    table: &RttTable,
    user: GeoPoint,
    user_region: Option<&str>,
    site: GeoPoint,
    site_region: Option<&str>,
) -> f64 {
    match (user_region, site_region) {
        (Some(u), Some(s)) => table
            .lookup(u, s)
            .unwrap_or_else(|| estimate_rtt_ms(user, site)),
        _ => estimate_rtt_ms(user, site),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRANKFURT: GeoPoint = GeoPoint {
        lat: 50.11,
        lon: 8.68,
    };
    const ASHBURN: GeoPoint = GeoPoint {
        lat: 39.04,
        lon: -77.49,
    };

    #[test]
    fn estimate_grows_with_distance() {
        let d = distance_km(FRANKFURT, ASHBURN);
        assert!((6400.0..6700.0).contains(&d), "{d}");
        let rtt = estimate_rtt_ms(FRANKFURT, ASHBURN);
        assert!((90.0..110.0).contains(&rtt), "{rtt}");
        assert!((estimate_rtt_ms(FRANKFURT, FRANKFURT) - BASE_RTT_MS).abs() < 1e-9);
    }

    #[test]
    fn measured_values_win_where_both_ends_are_known() {
        let table = RttTable::from_azure_csv(
            "from_region,to_region,from_id,to_id,rtt_ms\nGermany West Central,East US,germanywestcentral,eastus,88\n",
        )
        .expect("csv");
        let m = rtt_ms(
            &table,
            FRANKFURT,
            Some("germanywestcentral"),
            ASHBURN,
            Some("eastus"),
        );
        assert_eq!(m, 88.0);
        let reverse = rtt_ms(
            &table,
            ASHBURN,
            Some("eastus"),
            FRANKFURT,
            Some("germanywestcentral"),
        );
        assert_eq!(reverse, 88.0);
        let est = rtt_ms(&table, FRANKFURT, None, ASHBURN, Some("eastus"));
        assert_eq!(est, estimate_rtt_ms(FRANKFURT, ASHBURN));
    }

    #[test]
    fn bad_csv_rows_are_named() {
        let err = RttTable::from_azure_csv("a,b,c,d,e\nx,y,x,y,fast\n").expect_err("bad number");
        assert!(err.to_string().contains("row 2"), "{err}");
    }
}
