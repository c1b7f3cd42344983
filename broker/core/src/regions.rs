//! Residency regions: named (multi)polygons from GeoJSON, and the point-in-region test.

use geo::{Contains, MultiPolygon, Point};
use meridian_federation::GeoPoint;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default)]
pub struct Regions {
    by_name: BTreeMap<String, MultiPolygon<f64>>,
}

impl Regions {
    pub fn insert(&mut self, name: &str, area: MultiPolygon<f64>) {
        self.by_name.insert(name.to_owned(), area);
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn knows(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Whether `p` lies in region `name`; `None` when the region is unknown.
    pub fn contains(&self, name: &str, p: GeoPoint) -> Option<bool> {
        self.by_name
            .get(name)
            .map(|area| area.contains(&Point::new(p.lon, p.lat)))
    }
}

/// Parses a GeoJSON Feature, FeatureCollection or Geometry made of polygons into one multipolygon.
pub fn parse_geojson(text: &str) -> Result<MultiPolygon<f64>, crate::error::CoreError> {
    geojson_area(text).map_err(crate::error::config)
}

fn geojson_area(text: &str) -> Result<MultiPolygon<f64>, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not GeoJSON: {e}"))?;
    check_positions(&json, "")?;
    let gj: geojson::GeoJson =
        serde_json::from_value(json).map_err(|e| format!("not GeoJSON: {e}"))?;
    let mut polygons = Vec::new();
    let mut push = |g: &geojson::Geometry| -> Result<(), String> {
        let geom: geo::Geometry<f64> = g
            .clone()
            .try_into()
            .map_err(|e| format!("unusable geometry: {e}"))?;
        match geom {
            geo::Geometry::Polygon(p) => polygons.push(p),
            geo::Geometry::MultiPolygon(mp) => polygons.extend(mp.0),
            other => {
                return Err(format!("expected polygons, found {other:?}")
                    .chars()
                    .take(120)
                    .collect())
            }
        }
        Ok(())
    };
    match &gj {
        geojson::GeoJson::Geometry(g) => push(g)?,
        geojson::GeoJson::Feature(f) => {
            push(f.geometry.as_ref().ok_or("feature without geometry")?)?
        }
        geojson::GeoJson::FeatureCollection(fc) => {
            for f in &fc.features {
                push(f.geometry.as_ref().ok_or("feature without geometry")?)?;
            }
        }
    }
    if polygons.is_empty() {
        return Err("no polygon found".into());
    }
    Ok(MultiPolygon(polygons))
}

/// Every position under a `coordinates` member holds a longitude and a latitude, finite numbers (the geojson
/// crate's conversion indexes them without checking).
fn check_positions(v: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let here = format!("{path}.{k}");
                if k == "coordinates" {
                    check_coordinates(v, &here)?;
                } else {
                    check_positions(v, &here)?;
                }
            }
            Ok(())
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_positions(v, &format!("{path}[{i}]"))),
        _ => Ok(()),
    }
}

fn check_coordinates(v: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    let Value::Array(a) = v else {
        return Err(format!("{path}: coordinates must be arrays"));
    };
    if a.first().is_some_and(Value::is_number) || a.is_empty() && path.ends_with(']') {
        // A position.
        let ok =
            (2..=3).contains(&a.len()) && a.iter().all(|n| n.as_f64().is_some_and(f64::is_finite));
        if !ok {
            return Err(format!(
                "{path}: a position is [longitude, latitude] (optionally an altitude), finite numbers"
            ));
        }
        return Ok(());
    }
    a.iter()
        .enumerate()
        .try_for_each(|(i, v)| check_coordinates(v, &format!("{path}[{i}]")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_without_a_latitude_is_an_error_not_a_panic() {
        // Found by the geojson_region fuzz target.
        let e = parse_geojson(
            r#"{"type":"Polygon","coordinates":[[[0,40],[20,40],[19],[0,60],[0,40]]]}"#,
        )
        .err()
        .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("coordinates[0][2]") && e.contains("longitude")),
            "{e:?}"
        );
        assert!(
            parse_geojson(r#"{"type":"Polygon","coordinates":[[[0,"x"],[1,2],[0,0]]]}"#).is_err()
        );
    }

    #[test]
    fn point_in_square() {
        let area = parse_geojson(
            r#"{"type":"Polygon","coordinates":[[[0,40],[20,40],[20,60],[0,60],[0,40]]]}"#,
        )
        .expect("polygon");
        let mut r = Regions::default();
        r.insert("eu", area);
        assert_eq!(
            r.contains(
                "eu",
                GeoPoint {
                    lat: 50.0,
                    lon: 8.0
                }
            ),
            Some(true)
        );
        assert_eq!(
            r.contains(
                "eu",
                GeoPoint {
                    lat: 39.0,
                    lon: -77.0
                }
            ),
            Some(false)
        );
        assert_eq!(
            r.contains(
                "us",
                GeoPoint {
                    lat: 39.0,
                    lon: -77.0
                }
            ),
            None
        );
    }

    #[test]
    fn lines_are_refused() {
        let err = parse_geojson(r#"{"type":"LineString","coordinates":[[0,0],[1,1]]}"#)
            .expect_err("line");
        assert!(err.to_string().contains("expected polygons"), "{err}");
    }
}
