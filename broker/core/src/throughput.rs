//! Relative throughput of accelerator models: a job's expected duration is given for the reference model and
//! scales by `1 / factor(model)` on other hardware. The table lives in `configs/throughput.toml` with sources.

use meridian_federation::ModelName;
use std::collections::HashMap;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Throughput {
    by_model: HashMap<String, f64>,
}

impl Throughput {
    /// Speed of `model` relative to the reference (1.0 for models not in the table).
    pub fn factor(&self, model: &ModelName) -> f64 {
        // Keys are lower case; a model named in lower case (or an empty table) needs no copy of the name (this
        // is on placement's path, once per pool judged).
        if self.by_model.is_empty() {
            return 1.0;
        }
        let name = model.as_str();
        let found = match name.bytes().any(|b| b.is_ascii_uppercase()) {
            true => self.by_model.get(&name.to_ascii_lowercase()),
            false => self.by_model.get(name),
        };
        found.copied().unwrap_or(1.0)
    }

    /// Run time on `model` of work that takes `reference_ms` on the reference model.
    pub fn runtime_ms(&self, reference_ms: u64, model: &ModelName) -> u64 {
        (reference_ms as f64 / self.factor(model)).round() as u64
    }

    pub fn insert(&mut self, model: &str, factor: f64) {
        self.by_model.insert(model.to_ascii_lowercase(), factor);
    }

    /// Parses `[models]` of a throughput file: `MODEL = factor` (> 0).
    pub fn from_toml(text: &str) -> Result<Self, crate::error::CoreError> {
        Self::parse(text).map_err(crate::error::config)
    }

    fn parse(text: &str) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct File {
            models: HashMap<String, f64>,
        }
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut t = Throughput::default();
        for (model, factor) in f.models {
            if !factor.is_finite() || factor <= 0.0 || factor > 1000.0 {
                return Err(format!(
                    "models.{model}: {factor} is not a factor in (0, 1000]"
                ));
            }
            t.insert(&model, factor);
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_runtime_and_defaults_to_one() {
        let t = Throughput::from_toml("[models]\nH100 = 2.0\n").expect("table");
        assert_eq!(t.runtime_ms(3_600_000, &"h100".into()), 1_800_000);
        assert_eq!(t.runtime_ms(3_600_000, &"unknown".into()), 3_600_000);
        assert!(Throughput::from_toml("[models]\nX = 0\n").is_err());
    }
}
