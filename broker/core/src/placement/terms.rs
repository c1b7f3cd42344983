//! The score terms of a candidate and their normalisation.

use super::View;
use crate::latency::{self, RttTable};
use crate::metering::{self, Rates};
use crate::model::{Pool, Site};
use crate::Millis;
use meridian_federation::{JobSpec, Policy, SiteId, Weights};
use std::collections::{BTreeMap, HashMap};

/// One term of a placement score.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Term {
    /// Money: price × device-hours + egress (micro-USD).
    Cost,
    /// Energy at the wall, PUE included (Wh).
    Energy,
    /// Carbon: energy × grid intensity (gCO2e).
    Carbon,
    /// Weighted mean round trip from the job's users (ms).
    Latency,
    /// Bytes of `prefer` datasets that would move to the site.
    Data,
}

impl Term {
    pub const ALL: [Term; 5] = [
        Term::Cost,
        Term::Energy,
        Term::Carbon,
        Term::Latency,
        Term::Data,
    ];

    /// The floor of the normalisation, in the term's unit: it keeps the ratio to the best finite when the best
    /// is 0 (1 cent, 1 Wh, 1 g, 10 ms — round trips within a metro area are alike — 1 GB).
    pub fn floor(self) -> f64 {
        match self {
            Term::Cost => 10_000.0,
            Term::Energy => 1.0,
            Term::Carbon => 1.0,
            Term::Latency => 10.0,
            Term::Data => 1e9,
        }
    }

    /// The weight of this term in `w`.
    pub fn weight(self, w: &Weights) -> f64 {
        match self {
            Term::Cost => w.cost,
            Term::Energy => w.energy,
            Term::Carbon => w.carbon,
            Term::Latency => w.latency,
            Term::Data => w.data,
        }
    }
}

/// A value per term.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerTerm(pub [f64; 5]);

impl PerTerm {
    pub fn splat(x: f64) -> Self {
        PerTerm([x; 5])
    }

    pub fn get(&self, t: Term) -> f64 {
        self.0[t as usize]
    }

    pub fn set(&mut self, t: Term, x: f64) {
        self.0[t as usize] = x;
    }

    pub fn weights(w: &Weights) -> Self {
        let mut out = PerTerm::splat(0.0);
        for t in Term::ALL {
            out.set(t, t.weight(w));
        }
        out
    }
}

/// The score terms of one candidate. Equal when every term is (a score not yet computed, NaN, equals another).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Terms {
    pub cost_micro_usd: u64,
    pub energy_wh: u64,
    pub co2_g: u64,
    pub latency_ms: f64,
    pub data_bytes_moved: u64,
    /// Weighted normalised score (lower is better); NaN until normalised (stored as null).
    #[serde(with = "crate::nan_as_null")]
    pub score: f64,
}

impl PartialEq for Terms {
    fn eq(&self, other: &Self) -> bool {
        self.cost_micro_usd == other.cost_micro_usd
            && self.energy_wh == other.energy_wh
            && self.co2_g == other.co2_g
            && self.latency_ms == other.latency_ms
            && self.data_bytes_moved == other.data_bytes_moved
            && (self.score == other.score || (self.score.is_nan() && other.score.is_nan()))
    }
}

impl Terms {
    pub fn get(&self, t: Term) -> f64 {
        match t {
            Term::Cost => self.cost_micro_usd as f64,
            Term::Energy => self.energy_wh as f64,
            Term::Carbon => self.co2_g as f64,
            Term::Latency => self.latency_ms,
            Term::Data => self.data_bytes_moved as f64,
        }
    }

    pub fn values(&self) -> PerTerm {
        let mut out = PerTerm::splat(0.0);
        for t in Term::ALL {
            out.set(t, self.get(t));
        }
        out
    }

    /// Terms of nothing (a placeholder that no candidate carries).
    pub(super) fn empty() -> Terms {
        Terms {
            cost_micro_usd: 0,
            energy_wh: 0,
            co2_g: 0,
            latency_ms: 0.0,
            data_bytes_moved: 0,
            score: f64::NAN,
        }
    }
}

/// The normalised term: `(value + floor) / (best + floor) − 1`, 0 for the best candidate and 1 for one twice as
/// bad.
pub fn normalised(t: Term, value: f64, best: f64) -> f64 {
    (value + t.floor()) / (best + t.floor()) - 1.0
}

/// `Σ weight × normalised term` over `terms`.
pub fn score(values: &PerTerm, best: &PerTerm, weights: &PerTerm, terms: &[Term]) -> f64 {
    terms
        .iter()
        .map(|&t| weights.get(t) * normalised(t, values.get(t), best.get(t)))
        .sum()
}

/// The share over the cheapest placements that `balanced` may spend for less carbon, counted over a tenant's
/// `balanced` jobs together (see [`Rule::Knee`] and [`Spent`]).
pub const BALANCED_MAX_PREMIUM: f64 = 0.10;

/// The most `balanced` spends over the cheapest candidate on any one job, whatever its tenant has saved.
pub const BALANCED_MAX_PREMIUM_PER_JOB: f64 = 0.5;

/// What the jobs of one tenant placed under one premium rule have cost so far, against what the cheapest
/// candidate of each would have cost: the premium they may still spend is `(1 + premium) × cheapest − chosen`.
/// A premium left unspent by one job can be spent by a later one, so that the tenant's work as a whole, not each
/// job alone, stays within the premium.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spent {
    pub chosen_micro_usd: u64,
    pub cheapest_micro_usd: u64,
}

impl Spent {
    /// The highest cost a candidate may have when the cheapest costs `min_cost`.
    pub fn limit(&self, rule: Rule, min_cost: f64) -> f64 {
        let Some(premium) = rule.premium() else {
            return f64::INFINITY;
        };
        let banked = (1.0 + premium) * (self.cheapest_micro_usd as f64 + min_cost)
            - self.chosen_micro_usd as f64
            + Term::Cost.floor() * premium;
        let limit = banked.max(min_cost);
        match rule {
            Rule::Knee(_) => limit.min(min_cost * (1.0 + BALANCED_MAX_PREMIUM_PER_JOB)),
            _ => limit,
        }
    }

    pub fn add(&mut self, chosen_micro_usd: u64, cheapest_micro_usd: u64) {
        self.chosen_micro_usd = self.chosen_micro_usd.saturating_add(chosen_micro_usd);
        self.cheapest_micro_usd = self.cheapest_micro_usd.saturating_add(cheapest_micro_usd);
    }
}

/// The first durable format whose `balanced` is [`Rule::Knee`] and which knows the carbon-price and
/// cost-premium policies. A journal in an earlier format keeps the rules it was written under, so that replay
/// places every job where it was placed.
pub const KNEE_FORMAT: u32 = 4;

/// The first durable format whose `max_cost_premium` is [`Rule::Knee`] at its own premium: the premium is spent
/// where it buys the most carbon, as `balanced` spends its 10%, rather than on the least carbon each job can
/// have within what is banked. A journal in an earlier format keeps [`Rule::LeastCarbonWithin`].
pub const PREMIUM_KNEE_FORMAT: u32 = 7;

/// The first durable format in which a carbon price of 0 places exactly as `cost` ([`placed_by`]): the same
/// rule and tie-breaks, and no deferral for carbon. Before it, `cost + 0 × CO2` alone ranked (the first of equal
/// costs in site order, not the cleaner) and a job with a deadline waited for a cleaner hour.
pub const ZERO_PRICE_FORMAT: u32 = 9;

/// The policy a job is placed by under durable format `format`: its own, except that from
/// [`ZERO_PRICE_FORMAT`] carbon at no price is `cost` (decisions still carry the job's own policy's name).
pub fn placed_by(policy: Policy, format: u32) -> Policy {
    match policy {
        Policy::CarbonPriceUsdPerT(p) if p == 0.0 && format >= ZERO_PRICE_FORMAT => Policy::Cost,
        p => p,
    }
}

/// How a policy chooses among the candidates that can take a job now (in the tier chosen from).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// The first term decides, the next ones only break exact ties.
    Lexicographic([Term; 3]),
    /// The lowest `Σ weight × normalised term` (see [`normalised`]).
    Weighted,
    /// The lowest `cost + price × CO2`: carbon internalised at a price in USD per tonne (which is micro-USD per
    /// gram, so the sum is in micro-USD).
    CarbonPrice(f64),
    /// Among the candidates within the premium the tenant may still spend ([`Spent::limit`]), the least carbon
    /// (then the least cost): `max_cost_premium` before durable format 7.
    LeastCarbonWithin(f64),
    /// `balanced` (premium [`BALANCED_MAX_PREMIUM`]) and, from durable format 7, `max_cost_premium` (its own
    /// premium): among the candidates within the premium the tenant may still spend ([`Spent::limit`], and at
    /// most [`BALANCED_MAX_PREMIUM_PER_JOB`] over the cheapest on one job), the lowest `cost / cost₀ + CO2 / CO2₀`
    /// (+ the latency and data terms, normalised as for weights), where `cost₀` and `CO2₀` are those of the
    /// cheapest candidate. Each term counts as a share of the job's own cheapest bill and footprint — one per
    /// cent of the money against one per cent of the carbon — not by how much it varies across sites.
    Knee(f64),
}

impl Rule {
    /// The rule of `policy` under durable format `format`.
    pub fn of(policy: &Policy, format: u32) -> Rule {
        match policy {
            Policy::Cost => Rule::Lexicographic([Term::Cost, Term::Carbon, Term::Latency]),
            Policy::Green => Rule::Lexicographic([Term::Carbon, Term::Energy, Term::Cost]),
            Policy::Latency => Rule::Lexicographic([Term::Latency, Term::Cost, Term::Carbon]),
            Policy::Balanced if format >= KNEE_FORMAT => Rule::Knee(BALANCED_MAX_PREMIUM),
            Policy::Balanced | Policy::Weights(_) => Rule::Weighted,
            Policy::CarbonPriceUsdPerT(p) => Rule::CarbonPrice(*p),
            Policy::MaxCostPremium(p) if format >= PREMIUM_KNEE_FORMAT => Rule::Knee(*p),
            Policy::MaxCostPremium(p) => Rule::LeastCarbonWithin(*p),
        }
    }

    /// The premium over the cheapest candidate this rule may spend, where it has one.
    pub fn premium(self) -> Option<f64> {
        match self {
            Rule::LeastCarbonWithin(p) | Rule::Knee(p) => Some(p),
            _ => None,
        }
    }
}

/// The key a rule ranks a candidate by (lower wins; candidates are compared in site-id order, so the first of
/// equal keys wins) and the score an explanation shows. `cheapest` is the values of the cheapest candidate
/// (by cost, then carbon, then latency) and `best` the best value of each term among the candidates.
pub fn rank(
    rule: Rule,
    values: &PerTerm,
    best: &PerTerm,
    cheapest: &PerTerm,
    weights: &PerTerm,
    spent: &Spent,
) -> (Vec<f64>, f64) {
    let weighted = score(values, best, weights, &Term::ALL);
    // 1 for a candidate beyond what the rule's premium allows: it ranks after every candidate within it.
    let over = if values.get(Term::Cost) <= spent.limit(rule, cheapest.get(Term::Cost)) {
        0.0
    } else {
        1.0
    };
    match rule {
        Rule::Lexicographic(order) => (order.iter().map(|k| values.get(*k)).collect(), weighted),
        Rule::Weighted => (vec![weighted], weighted),
        Rule::CarbonPrice(price) => {
            let priced = values.get(Term::Cost) + price * values.get(Term::Carbon);
            (vec![priced], priced / 1e6)
        }
        Rule::LeastCarbonWithin(_) => (
            vec![
                over,
                values.get(Term::Carbon),
                values.get(Term::Cost),
                values.get(Term::Latency),
            ],
            values.get(Term::Carbon) / 1000.0,
        ),
        Rule::Knee(_) => {
            let share = |t: Term| (values.get(t) + t.floor()) / (cheapest.get(t) + t.floor());
            let rest: f64 = [Term::Latency, Term::Data]
                .iter()
                .map(|&t| weights.get(t) * normalised(t, values.get(t), best.get(t)))
                .sum();
            let knee = share(Term::Cost) + share(Term::Carbon) + rest;
            (vec![over, knee], knee)
        }
    }
}

/// For each `prefer` dataset of the job, the lowest egress price (micro-USD per GB) among up sites holding it.
pub(super) fn cheapest_egress(
    sites: &BTreeMap<SiteId, Site>,
    spec: &JobSpec,
) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    if spec.datasets.is_empty() {
        return out;
    }
    for need in &spec.datasets {
        let price = sites
            .values()
            .filter(|s| s.up && s.holds_dataset(&need.name))
            .map(|s| s.info.egress_micro_usd_per_gb)
            .min();
        if let Some(p) = price {
            out.insert(need.name.clone(), p);
        }
    }
    out
}

pub(super) fn terms(
    view: View<'_>,
    site: &Site,
    pool: &Pool,
    spec: &JobSpec,
    egress: &HashMap<String, u64>,
    now: Millis,
    duration_ms: u64,
) -> Terms {
    // The expected duration is for the reference model; this pool's model runs it faster or slower.
    let duration_ms = view.throughput.runtime_ms(duration_ms, &pool.model);
    let intensity = site.mean_intensity(now, duration_ms).round() as u32;
    let rates: Rates = site.rates(pool, spec.spot, intensity);
    let run = metering::amounts(&rates, spec.total_milli(), duration_ms);
    let mut data_bytes = 0u64;
    let mut egress_cost = 0u64;
    for need in spec
        .datasets
        .iter()
        .filter(|d| !site.holds_dataset(&d.name))
    {
        data_bytes = data_bytes.saturating_add(need.size_bytes);
        let per_gb = egress.get(&need.name).copied().unwrap_or(0);
        egress_cost = egress_cost.saturating_add(
            (u128::from(need.size_bytes) * u128::from(per_gb) / 1_000_000_000) as u64,
        );
    }
    Terms {
        cost_micro_usd: run.cost_micro_usd.saturating_add(egress_cost),
        energy_wh: run.energy_wh,
        co2_g: run.co2_g,
        latency_ms: user_latency(view.rtt, site, spec),
        data_bytes_moved: data_bytes,
        score: f64::NAN,
    }
}

/// Weighted mean round trip from the job's users to the site; 0 when the job names no users.
pub fn user_latency(rtt: &RttTable, site: &Site, spec: &JobSpec) -> f64 {
    let total: f64 = spec.users.iter().map(|u| u.weight).sum();
    if total <= 0.0 {
        return 0.0;
    }
    spec.users
        .iter()
        .map(|u| {
            u.weight
                * latency::rtt_ms(
                    rtt,
                    u.location,
                    u.rtt_region.as_deref(),
                    site.info.location,
                    site.info.rtt_region.as_deref(),
                )
        })
        .sum::<f64>()
        / total
}
