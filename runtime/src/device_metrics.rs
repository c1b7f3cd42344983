//! The device metric families an agent's report ([`meridian_federation::SiteMetrics`]) is shown under, in
//! Prometheus's text format: the broker re-exports every site's report with them, and an agent's own optional
//! `/metrics` shows its own. One definition, so both say the same names.

use meridian_federation::SiteMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SitePoolDevice {
    site: String,
    pool: String,
    device: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// `meridian_device_allocated_ratio`, `meridian_device_utilization_ratio` and `meridian_device_power_watts`,
/// labelled by site, pool and device.
#[derive(Clone, Default)]
pub struct DeviceFamilies {
    allocated: Family<SitePoolDevice, FloatGauge>,
    utilization: Family<SitePoolDevice, FloatGauge>,
    power: Family<SitePoolDevice, FloatGauge>,
}

impl DeviceFamilies {
    /// The families, registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        let f = DeviceFamilies::default();
        r.register_with_unit(
            "meridian_device_allocated",
            "Share of a device its agent has given to jobs",
            Unit::Other("ratio".into()),
            f.allocated.clone(),
        );
        r.register_with_unit(
            "meridian_device_utilization",
            "Busy fraction of a device as NVML reads it",
            Unit::Other("ratio".into()),
            f.utilization.clone(),
        );
        r.register_with_unit(
            "meridian_device_power",
            "Power draw of a device as NVML reads it",
            Unit::Other("watts".into()),
            f.power.clone(),
        );
        f
    }

    /// Forgets every series (before the reports of a scrape are set).
    pub fn clear(&self) {
        self.allocated.clear();
        self.utilization.clear();
        self.power.clear();
    }

    /// Sets the series of one site's report.
    pub fn set(&self, m: &SiteMetrics) {
        for d in &m.devices {
            let l = SitePoolDevice {
                site: m.site.to_string(),
                pool: d.pool.to_string(),
                device: d.index.to_string(),
            };
            self.allocated
                .get_or_create(&l)
                .set(f64::from(d.allocated_milli) / 1000.0);
            if let Some(u) = d.utilization {
                self.utilization.get_or_create(&l).set(u);
            }
            if let Some(p) = d.power_watts {
                self.power.get_or_create(&l).set(p);
            }
        }
    }
}

/// One site's report alone, as Prometheus text (an agent's own `/metrics`); the families without series before
/// the first report.
pub fn render(m: Option<&SiteMetrics>) -> String {
    let mut r = Registry::default();
    let f = DeviceFamilies::register(&mut r);
    if let Some(m) = m {
        f.set(m);
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &r) {
        tracing::error!("encoding metrics: {e}");
    }
    out
}
