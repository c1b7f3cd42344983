//! The site file: one TOML document that describes a site and its agent. Parsing is a pure function.

use meridian_federation::{
    AcceleratorKind, Carbon, Dataset, DeviceState, GeoPoint, Interconnect, ModelName, PoolAdvert,
    PoolName, Sharing, SiteId, SiteInfo, SiteKind, Tier,
};
use serde::Deserialize;
use std::path::PathBuf;

/// A site file. Money is written in USD here, for people; the wire carries micro-USD.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteFile {
    /// Site id: 1-64 of `A-Z a-z 0-9 _ -`.
    pub id: SiteId,
    pub kind: SiteKind,
    /// Spill-over tier: `owned`, `partner` or `cloud`.
    pub tier: Tier,
    pub latitude: f64,
    pub longitude: f64,
    #[serde(default)]
    pub region_tags: Vec<String>,
    /// Name of the site's region in the measured round-trip table (an Azure region id).
    #[serde(default)]
    pub rtt_region: Option<String>,
    /// Power usage effectiveness.
    pub pue: f64,
    /// Grid carbon intensity, gCO2e/kWh.
    pub carbon_g_per_kwh: u32,
    /// Hourly forecast (gCO2e/kWh) starting at the hour the agent starts; optional.
    #[serde(default)]
    pub carbon_forecast: Vec<u32>,
    /// Hourly grid-carbon series (a CSV of `us-grid-carbon-hourly-2022`, relative to the data folder), used by
    /// the simulator to drive the site's intensity hour by hour; the agent itself uses `carbon_g_per_kwh`.
    #[serde(default)]
    pub carbon_series: Option<String>,
    /// Energy tariff, USD/kWh.
    #[serde(default)]
    pub energy_usd_per_kwh: f64,
    /// Egress price, USD/GB.
    #[serde(default)]
    pub egress_usd_per_gb: f64,
    #[serde(default)]
    pub datasets: Vec<DatasetEntry>,
    /// The site's pools (none for an `ec2` site: its pools are the instance types it may create).
    #[serde(default)]
    pub pools: Vec<PoolEntry>,
    #[serde(default)]
    pub agent: AgentSettings,
    /// How the site runs the work it accepts.
    #[serde(default)]
    pub backend: BackendSection,
}

/// `[backend]`: how the site runs the attempts its agent accepts.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// `process` (each attempt a process group on the agent's host; the default), `slurm` (each attempt a
    /// batch job of the site's Slurm cluster), `ec2` (each attempt on a cloud instance created for it) or
    /// `noop` (accepted and reported running, nothing started).
    /// The command line's `--executor` wins.
    #[serde(default)]
    pub kind: meridian_federation::BackendKind,
    /// `[backend.slurm]`: the Slurm backend's settings (command prefix, partitions, accounts).
    #[serde(default)]
    pub slurm: meridian_adapters::slurm::SlurmSettings,
    /// `[backend.ec2]`: the EC2 backend's settings (regions, image, instance types and prices, caps, idle
    /// time, launcher). Its pools are the instance types, as EC2 describes their GPUs.
    #[serde(default)]
    pub ec2: meridian_adapters::ec2::Ec2Settings,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetEntry {
    pub name: String,
    pub size_gb: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolEntry {
    pub name: PoolName,
    pub kind: AcceleratorKind,
    pub vendor: String,
    pub model: ModelName,
    pub memory_gib: f64,
    pub count: u32,
    #[serde(default = "one")]
    pub devices_per_node: u32,
    #[serde(default)]
    pub interconnect: Interconnect,
    /// Rated power per device, watts.
    pub power_watts: u32,
    /// Whether devices may be shared in milli-units.
    #[serde(default)]
    pub shareable: bool,
    #[serde(default)]
    pub mig_profiles: Vec<String>,
    /// Price per device-hour, USD (on-demand for cloud sites, the internal rate for owned ones).
    pub price_usd_per_hour: f64,
    #[serde(default)]
    pub spot_price_usd_per_hour: Option<f64>,
}

fn one() -> u32 {
    1
}

/// How the agent behaves; every field has a default.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// NATS server URL (the command line's `--nats` wins).
    pub nats_url: String,
    /// The CA that signs the NATS servers' certificates (`--ca` wins); TLS is required when set.
    pub ca: Option<PathBuf>,
    /// This site's NATS identity, its NKey seed file from `meridian creds add site <id>` (`--creds` wins).
    pub creds: Option<PathBuf>,
    /// Folder for job logs and process-group records (the command line's `--work-dir` wins).
    pub work_dir: Option<PathBuf>,
    /// Heartbeat period, ms.
    pub heartbeat_ms: u64,
    /// Period of adverts sent even when nothing changed, ms. A change is advertised at once (at the latest with
    /// the next heartbeat, which names the advert's generation: a broker that missed it asks for it).
    pub advert_interval_ms: u64,
    /// Time a cancelled job gets between SIGTERM and SIGKILL, ms.
    pub grace_ms: u64,
    /// How long running jobs outlive a stopped or crashed agent, for a restarted agent to take them back, ms.
    /// An agent upgrade within this is not an outage of the site; past it, the jobs are stopped. Keep it below
    /// the broker's `site_lost_after_ms` (10,000 by default): once the broker declares the site lost it runs
    /// the jobs elsewhere, and the old attempts must be gone by then.
    pub readopt_ms: u64,
    /// Ask NVML for NVIDIA GPUs at start (`auto`) or never (`off`).
    pub nvml: NvmlMode,
    /// Period of the device metrics sent to the broker (`meridian.v1.site.<S>.metrics`), ms; 0 sends none.
    pub metrics_ms: u64,
    /// Also show the latest device report on `GET http://ADDR/metrics` (plain HTTP; `127.0.0.1:0` picks a free
    /// port, written to `metrics.addr` in the work folder). Off by default: the broker re-exports every site's
    /// report, and a listener at every site is attack surface — bind it to loopback or a management network.
    pub metrics_listen: Option<String>,
    /// Stop taking new work (running work finishes).
    pub draining: bool,
    /// Where the provider's spot reclaim notice is written (relative to the work folder), as a cloud's
    /// instance-action notice: when the file appears, the agent stops the spot attempts of the pools it names,
    /// one per line (every pool when it names none), reports them interrupted and removes the file.
    pub spot_notice: Option<PathBuf>,
    /// A grid feed: a JSON file (relative to the work folder) holding the advert's `carbon` object
    /// (`{"g_per_kwh": 120, "forecast_start_ms": …, "forecast": […]}`), read every heartbeat. A change is
    /// advertised at once; a file that is not such an object, or out of range, is logged and ignored (the last
    /// good value holds). Without it the site advertises `carbon_g_per_kwh`.
    pub carbon_file: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NvmlMode {
    #[default]
    Auto,
    Off,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            nats_url: "nats://127.0.0.1:4222".into(),
            ca: None,
            creds: None,
            work_dir: None,
            heartbeat_ms: 1000,
            advert_interval_ms: 60_000,
            grace_ms: 3000,
            readopt_ms: 8_000,
            nvml: NvmlMode::Auto,
            metrics_ms: 15_000,
            metrics_listen: None,
            draining: false,
            spot_notice: None,
            carbon_file: None,
        }
    }
}

/// Why a site file is not acceptable; the text names the line or field.
#[derive(Debug, thiserror::Error)]
pub enum SiteFileError {
    /// Not TOML, or TOML of the wrong shape.
    #[error(transparent)]
    Syntax(#[from] toml::de::Error),
    /// A price that is not a number of USD in range.
    #[error("{field}: {usd} is not a price in 0..=1000000 USD")]
    Price { field: String, usd: f64 },
    /// The advert it makes breaks the wire's rules for site data.
    #[error(transparent)]
    Invalid(#[from] meridian_federation::WireError),
    /// A backend's settings that cannot work.
    #[error("{0}")]
    Backend(String),
}

fn usd_to_micro(field: &str, usd: f64) -> Result<u64, SiteFileError> {
    if !usd.is_finite() || !(0.0..=1e6).contains(&usd) {
        return Err(SiteFileError::Price {
            field: field.to_owned(),
            usd,
        });
    }
    Ok((usd * 1e6).round() as u64)
}

/// Parses and checks a site file. Errors name the line and field.
pub fn parse_site_file(text: &str) -> Result<SiteFile, SiteFileError> {
    let file: SiteFile = toml::from_str(text)?;
    if file.backend.kind == meridian_federation::BackendKind::Ec2 {
        // Its pools are the instance types EC2 describes at start; the site's own data is checked here.
        if !file.pools.is_empty() {
            return Err(SiteFileError::Backend(
                "pools: an ec2 site declares none (its pools are backend.ec2.instance_types)"
                    .into(),
            ));
        }
        file.backend.ec2.check().map_err(SiteFileError::Backend)?;
        meridian_federation::validate::Validate::validate(&file.site_info(0)?)?;
        return Ok(file);
    }
    // The advert's validation is the one set of rules for site data; check it here too, at start.
    let advert = file.advert(0, 0)?;
    meridian_federation::validate::Validate::validate(&advert)?;
    Ok(file)
}

impl SiteFile {
    pub fn site_info(&self, forecast_start_ms: u64) -> Result<SiteInfo, SiteFileError> {
        Ok(SiteInfo {
            id: self.id.clone(),
            kind: self.kind,
            tier: self.tier,
            location: GeoPoint {
                lat: self.latitude,
                lon: self.longitude,
            },
            region_tags: self.region_tags.clone(),
            rtt_region: self.rtt_region.clone(),
            pue: self.pue,
            carbon: Carbon {
                g_per_kwh: self.carbon_g_per_kwh,
                forecast_start_ms,
                forecast: self.carbon_forecast.clone(),
            },
            energy_micro_usd_per_kwh: usd_to_micro("energy_usd_per_kwh", self.energy_usd_per_kwh)?,
            egress_micro_usd_per_gb: usd_to_micro("egress_usd_per_gb", self.egress_usd_per_gb)?,
            datasets: self
                .datasets
                .iter()
                .map(|d| Dataset {
                    name: d.name.clone(),
                    size_bytes: (d.size_gb.max(0.0) * 1e9) as u64,
                })
                .collect(),
            backend: Some(self.backend.kind),
        })
    }

    /// The declared pools, all devices free and healthy.
    pub fn pools(&self) -> Result<Vec<PoolAdvert>, SiteFileError> {
        self.pools
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Ok(PoolAdvert {
                    name: p.name.clone(),
                    kind: p.kind,
                    vendor: p.vendor.clone(),
                    model: p.model.clone(),
                    memory_mib: (p.memory_gib.max(0.0) * 1024.0) as u64,
                    count: p.count,
                    devices_per_node: p.devices_per_node,
                    interconnect: p.interconnect,
                    power_watts: p.power_watts,
                    measured_power_watts: None,
                    sharing: Sharing {
                        milli: p.shareable,
                        mig_profiles: p.mig_profiles.clone(),
                    },
                    price_micro_usd_per_hour: usd_to_micro(
                        &format!("pools[{i}].price_usd_per_hour"),
                        p.price_usd_per_hour,
                    )?,
                    spot_price_micro_usd_per_hour: p
                        .spot_price_usd_per_hour
                        .map(|s| usd_to_micro(&format!("pools[{i}].spot_price_usd_per_hour"), s))
                        .transpose()?,
                    devices: DeviceState::all_free(p.count),
                })
            })
            .collect()
    }

    /// An advert of the declared inventory.
    pub fn advert(
        &self,
        generation: u64,
        now_ms: u64,
    ) -> Result<meridian_federation::SiteAdvert, SiteFileError> {
        Ok(meridian_federation::SiteAdvert {
            v: meridian_federation::WIRE_VERSION,
            site: self.site_info(now_ms - now_ms % 3_600_000)?,
            pools: self.pools()?,
            generation,
            draining: self.agent.draining,
            sent_at_ms: now_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = r#"
id = "edge-fra"
kind = "edge"
tier = "owned"
latitude = 50.11
longitude = 8.68
pue = 1.6
carbon_g_per_kwh = 380
egress_usd_per_gb = 0.05

[[pools]]
name = "l4"
kind = "gpu"
vendor = "nvidia"
model = "L4"
memory_gib = 24
count = 2
power_watts = 72
shareable = true
price_usd_per_hour = 0.8
"#;

    /// Every site file the repository ships parses: the examples, the demo's (its Slurm and EC2 sites among
    /// them) and the simulator's.
    #[test]
    fn every_shipped_site_file_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut seen = Vec::new();
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("configs") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let is_site = path.extension().is_some_and(|e| e == "toml")
                    && text.lines().any(|l| l.starts_with("id = "))
                    && text.lines().any(|l| l.starts_with("tier = "));
                if is_site {
                    if let Err(e) = parse_site_file(&text) {
                        panic!("{}: {e}", path.display());
                    }
                    seen.push(path);
                }
            }
        }
        let kinds: Vec<_> = seen
            .iter()
            .filter_map(|p| parse_site_file(&std::fs::read_to_string(p).ok()?).ok())
            .map(|f| f.backend.kind)
            .collect();
        assert!(kinds.contains(&meridian_federation::BackendKind::Slurm));
        assert!(kinds.contains(&meridian_federation::BackendKind::Ec2));
        assert!(seen.len() > 10, "{seen:?}");
    }

    #[test]
    fn an_ec2_site_declares_no_pools_and_names_its_regions() {
        let ec2 = |extra: &str| {
            format!(
                "id = \"burst\"\nkind = \"cloud\"\ntier = \"cloud\"\nlatitude = 39.0\nlongitude = -77.5\n\
                 pue = 1.1\ncarbon_g_per_kwh = 400\n{extra}\n[backend]\nkind = \"ec2\"\n[backend.ec2]\n\
                 image_id = \"ami-1\"\nregions = [{{ name = \"us-east-1\" }}]\n\
                 instance_types = [{{ name = \"g5.xlarge\", usd_per_hour = 1.0, gpu_power_watts = 300 }}]\n"
            )
        };
        let f = parse_site_file(&ec2("")).expect("an EC2 site");
        assert_eq!(f.backend.ec2.idle_s, 60);
        let with_pool = ec2(&SITE[SITE.find("[[pools]]").unwrap_or(0)..]);
        let e = parse_site_file(&with_pool).expect_err("pools").to_string();
        assert!(e.contains("an ec2 site declares none"), "{e}");
        let e = parse_site_file(
            &ec2("").replace("regions = [{ name = \"us-east-1\" }]", "regions = []"),
        )
        .expect_err("regions")
        .to_string();
        assert!(e.contains("backend.ec2.regions"), "{e}");
    }

    #[test]
    fn parses_a_site() {
        let f = parse_site_file(SITE).expect("valid");
        let a = f.advert(1, 7_200_123).expect("advert");
        assert_eq!(a.pools[0].price_micro_usd_per_hour, 800_000);
        assert_eq!(a.pools[0].memory_mib, 24 * 1024);
        assert_eq!(a.site.egress_micro_usd_per_gb, 50_000);
        assert_eq!(a.site.carbon.forecast_start_ms, 7_200_000);
    }

    #[test]
    fn errors_name_the_problem() {
        let err = parse_site_file(&SITE.replace("latitude = 50.11", "latitude = 200.0"))
            .expect_err("lat")
            .to_string();
        assert!(err.contains("site.location.lat"), "{err}");
        let err = parse_site_file(&SITE.replace("kind = \"gpu\"", "kind = \"tpu\""))
            .expect_err("kind")
            .to_string();
        assert!(err.contains("tpu"), "{err}");
        let err = parse_site_file(&SITE.replace("pue = 1.6", "pue = 1.6\ncolour = 3"))
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("colour"), "{err}");
        let err = parse_site_file(&format!("{SITE}\n[backend]\nkind = \"kubernetes\"\n"))
            .expect_err("backend")
            .to_string();
        assert!(
            err.contains("kubernetes") && err.contains("process"),
            "{err}"
        );
    }

    #[test]
    fn a_site_says_how_it_runs_its_work() {
        let f = parse_site_file(SITE).expect("valid");
        let a = f.advert(1, 0).expect("advert");
        assert_eq!(
            a.site.backend,
            Some(meridian_federation::BackendKind::Process)
        );
        let f = parse_site_file(&format!("{SITE}\n[backend]\nkind = \"noop\"\n")).expect("noop");
        let a = f.advert(1, 0).expect("advert");
        assert_eq!(a.site.backend, Some(meridian_federation::BackendKind::Noop));
    }
}
