//! Single-axis baselines the simulator compares the policies against.

use super::{Candidate, View};

/// Single-axis rankings the simulator compares Meridian's policies against. They share every filter, the
/// capacity, queue and burst rules; only the ranking of the candidates that can run the job differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The first candidate that fits, in tier then site-id order.
    FifoFirstFit,
    /// The lowest round trip to the job's users.
    Nearest,
    /// The lowest cost of this job: price × run time on the pool's model, with egress.
    Cheapest,
    /// The lowest carbon of this job: power × PUE × grid intensity over the expected run × run time on the
    /// pool's model.
    Greenest,
    /// The lowest list price per device-hour (ignoring run time on the model and egress).
    CheapestListPrice,
    /// The lowest current grid intensity × PUE (ignoring forecasts, power and run time).
    GreenestGrid,
}

impl Baseline {
    pub const ALL: [Baseline; 6] = [
        Baseline::FifoFirstFit,
        Baseline::Nearest,
        Baseline::Cheapest,
        Baseline::Greenest,
        Baseline::CheapestListPrice,
        Baseline::GreenestGrid,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Baseline::FifoFirstFit => "fifo-first-fit",
            Baseline::Nearest => "nearest",
            Baseline::Cheapest => "cheapest",
            Baseline::Greenest => "greenest",
            Baseline::CheapestListPrice => "cheapest-list-price",
            Baseline::GreenestGrid => "greenest-grid",
        }
    }

    pub fn parse(s: &str) -> Option<Baseline> {
        Baseline::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// The ranking key of a baseline (lower wins).
pub(super) fn baseline_key(
    view: View<'_>,
    c: &Candidate,
    b: Baseline,
    latency_ms: f64,
) -> Vec<f64> {
    let site = view.sites.get(&c.site);
    let pool = site.and_then(|s| c.pool.as_ref().and_then(|p| s.pool(p)));
    match (b, site, pool) {
        (Baseline::FifoFirstFit, _, _) => vec![0.0],
        (Baseline::Nearest, _, _) => vec![latency_ms],
        (Baseline::Cheapest, _, _) => c
            .terms
            .as_ref()
            .map_or(vec![f64::INFINITY], |t| vec![t.cost_micro_usd as f64]),
        (Baseline::Greenest, _, _) => c
            .terms
            .as_ref()
            .map_or(vec![f64::INFINITY], |t| vec![t.co2_g as f64]),
        (Baseline::CheapestListPrice, _, Some(p)) => vec![p.price_micro_usd_per_hour as f64],
        (Baseline::GreenestGrid, Some(s), _) => {
            vec![f64::from(s.info.carbon.g_per_kwh) * s.info.pue]
        }
        _ => vec![f64::INFINITY],
    }
}
