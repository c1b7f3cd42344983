//! A federation for the simulator: the same federation and site files as `meridian up`, plus each site's
//! hourly carbon series where it names one.
//!
//! Carbon honesty: at hour `h` a site advertises the real value of hour `h` as "now" and, as its forecast for
//! the next 24 hours, the values of the same hours of the day before (`h − 24 …`): placement never sees a
//! future value of the real series. Metering (the checker) uses the real series.

use anyhow::Context;
use meridian_agent_core::config::{parse_site_file, SiteFile};
use meridian_broker::local::FederationFile;
use meridian_core::latency::RttTable;
use meridian_core::regions::{parse_geojson, Regions};
use meridian_core::throughput::Throughput;
use meridian_core::Millis;
use meridian_federation::{PoolAdvert, SiteId, SiteInfo};
use std::path::Path;

/// 2022-01-01T00:00Z, the first hour of the carbon series, in ms since the Unix epoch.
pub const SERIES_EPOCH_MS: u64 = 1_640_995_200_000;
const HOUR_MS: u64 = 3_600_000;

#[derive(Clone, Debug)]
pub struct SimSite {
    pub id: SiteId,
    pub file: SiteFile,
    pub pools: Vec<PoolAdvert>,
    /// Hourly gCO2e/kWh from [`SERIES_EPOCH_MS`].
    pub series: Option<Vec<u32>>,
    pub(crate) base: SiteInfo,
}

impl SimSite {
    /// Real intensity of the hour holding `t` (the yearly figure where there is no series).
    pub fn intensity_at(&self, t: Millis) -> u32 {
        match &self.series {
            Some(s) if !s.is_empty() => {
                let h = (t.saturating_sub(SERIES_EPOCH_MS) / HOUR_MS) as usize;
                s[h.min(s.len() - 1)]
            }
            _ => self.base.carbon.g_per_kwh,
        }
    }

    /// The site's facts at `t`: the hour's real intensity now, yesterday's same hours as the forecast.
    pub fn info_at(&self, t: Millis) -> SiteInfo {
        let mut info = self.base.clone();
        if let Some(s) = &self.series {
            let hour_start = t - t % HOUR_MS;
            info.carbon.g_per_kwh = self.intensity_at(t);
            info.carbon.forecast_start_ms = hour_start;
            info.carbon.forecast = (0..24u64)
                .map(|i| {
                    let past = (hour_start + i * HOUR_MS).saturating_sub(24 * HOUR_MS);
                    if past < SERIES_EPOCH_MS || s.is_empty() {
                        self.base.carbon.g_per_kwh
                    } else {
                        self.intensity_at(past)
                    }
                })
                .collect();
        }
        info
    }
}

#[derive(Clone, Debug)]
pub struct SimFederation {
    pub sites: Vec<SimSite>,
    pub rtt: RttTable,
    pub regions: Regions,
    pub throughput: Throughput,
}

impl SimFederation {
    pub fn site(&self, id: &SiteId) -> Option<&SimSite> {
        self.sites.iter().find(|s| &s.id == id)
    }

    /// Loads a federation file and everything it names.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let (fed, base) = FederationFile::load(path)?;
        let mut regions = Regions::default();
        for (name, file) in &fed.broker.regions {
            let p = base.join(file);
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            regions.insert(
                name,
                parse_geojson(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            );
        }
        let rtt = match &fed.broker.rtt_table {
            Some(rel) => match meridian_broker::data::data_file(rel)? {
                Some(p) => RttTable::from_azure_csv(&std::fs::read_to_string(&p)?)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
                None => RttTable::default(),
            },
            None => RttTable::default(),
        };
        let throughput = match &fed.broker.throughput {
            Some(rel) => {
                let p = base.join(rel);
                Throughput::from_toml(
                    &std::fs::read_to_string(&p)
                        .with_context(|| format!("reading {}", p.display()))?,
                )
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
            }
            None => Throughput::default(),
        };
        let mut sites = Vec::new();
        for rel in &fed.sites {
            let p = base.join(rel);
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            let file =
                parse_site_file(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            let series = match &file.carbon_series {
                Some(rel) => match meridian_broker::data::data_file(Path::new(rel))? {
                    Some(sp) => Some(
                        parse_carbon_series(&std::fs::read_to_string(&sp)?)
                            .map_err(|e| anyhow::anyhow!("{}: {e}", sp.display()))?,
                    ),
                    None => None,
                },
                None => None,
            };
            let base_info = file
                .site_info(SERIES_EPOCH_MS)
                .map_err(anyhow::Error::msg)?;
            sites.push(SimSite {
                id: file.id.clone(),
                pools: file.pools()?,
                series,
                base: base_info,
                file,
            });
        }
        Ok(SimFederation {
            sites,
            rtt,
            regions,
            throughput,
        })
    }
}

impl SimFederation {
    /// The federation a broker places on (`HistoryView::federation`): its sites as they last advertised
    /// themselves (those it counts up), and the tables it was started with. A what-if on it needs no file.
    pub fn from_view(view: &meridian_federation::FederationView) -> anyhow::Result<Self> {
        let mut regions = Regions::default();
        for (name, text) in &view.regions {
            regions.insert(
                name,
                parse_geojson(text)
                    .map_err(|e| anyhow::anyhow!("the broker's region {name}: {e}"))?,
            );
        }
        let mut rtt = RttTable::default();
        for r in &view.rtt {
            rtt.insert(&r.from, &r.to, r.rtt_ms);
        }
        let throughput = match &view.throughput_toml {
            Some(text) => Throughput::from_toml(text)
                .map_err(|e| anyhow::anyhow!("the broker's throughput table: {e}"))?,
            None => Throughput::default(),
        };
        let sites = view
            .sites
            .iter()
            .filter(|s| s.up)
            .map(|s| {
                let file = site_file_of(s);
                let base = file
                    .site_info(SERIES_EPOCH_MS)
                    .map_err(anyhow::Error::msg)?;
                Ok(SimSite {
                    id: s.info.id.clone(),
                    pools: file.pools()?,
                    series: None,
                    base,
                    file,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if sites.is_empty() {
            anyhow::bail!("the broker counts no site up: nothing to replay on");
        }
        Ok(SimFederation {
            sites,
            rtt,
            regions,
            throughput,
        })
    }
}

/// The site file that says what a broker's view of a site says (the units of a file: USD, GiB, GB).
fn site_file_of(s: &meridian_federation::FederationSite) -> SiteFile {
    use meridian_agent_core::config::{BackendSection, DatasetEntry, PoolEntry};
    let usd = |micro: u64| micro as f64 / 1e6;
    let i = &s.info;
    SiteFile {
        id: i.id.clone(),
        kind: i.kind,
        tier: i.tier,
        latitude: i.location.lat,
        longitude: i.location.lon,
        region_tags: i.region_tags.clone(),
        rtt_region: i.rtt_region.clone(),
        pue: i.pue,
        carbon_g_per_kwh: i.carbon.g_per_kwh,
        carbon_forecast: i.carbon.forecast.clone(),
        carbon_series: None,
        energy_usd_per_kwh: usd(i.energy_micro_usd_per_kwh),
        egress_usd_per_gb: usd(i.egress_micro_usd_per_gb),
        datasets: i
            .datasets
            .iter()
            .map(|d| DatasetEntry {
                name: d.name.clone(),
                size_gb: d.size_bytes as f64 / 1e9,
            })
            .collect(),
        pools: s
            .pools
            .iter()
            .map(|p| PoolEntry {
                name: p.name.clone(),
                kind: p.kind,
                vendor: p.vendor.clone(),
                model: p.model.clone(),
                // A whole number of MiB over 1024, and a little over it, so that the file's rounding down
                // gives the same MiB back.
                memory_gib: (p.memory_mib as f64 + 0.5) / 1024.0,
                count: p.count,
                devices_per_node: p.devices_per_node,
                interconnect: p.interconnect,
                power_watts: p.power_watts,
                shareable: p.sharing.milli,
                mig_profiles: p.sharing.mig_profiles.clone(),
                price_usd_per_hour: usd(p.price_micro_usd_per_hour),
                spot_price_usd_per_hour: p.spot_price_micro_usd_per_hour.map(usd),
            })
            .collect(),
        agent: Default::default(),
        backend: BackendSection {
            kind: i.backend.unwrap_or_default(),
            ..Default::default()
        },
    }
}

/// Reads the `avg_CI` column (the last) of an hourly series, rounded to whole grams. An empty cell repeats the
/// hour before (three such cells in CISO and MISO, 23 in PJM).
pub fn parse_carbon_series(text: &str) -> Result<Vec<u32>, String> {
    let mut out: Vec<u32> = Vec::with_capacity(8760);
    for (i, line) in text.lines().enumerate().skip(1) {
        let cell = line.rsplit(',').next().unwrap_or("").trim();
        if cell.is_empty() {
            out.push(out.last().copied().unwrap_or(0));
            continue;
        }
        let v: f64 = cell
            .parse()
            .map_err(|e| format!("row {}: avg_CI {cell:?}: {e}", i + 1))?;
        if !(0.0..=3000.0).contains(&v) {
            return Err(format!("row {}: avg_CI {v} out of range", i + 1));
        }
        out.push(v.round() as u32);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_fill_gaps_and_reject_garbage() {
        let s =
            parse_carbon_series("timestamp,avg_CI\n2022-01-01 00:00:00+00:00,100.4\nx,\ny,200.6\n")
                .expect("series");
        assert_eq!(s, vec![100, 100, 201]);
        assert!(parse_carbon_series("t,avg_CI\na,hot\n").is_err());
    }
}
