//! The offline bound (`meridian sim --bound`): a linear relaxation of placing a trace with hindsight, which no
//! policy that starts each job within its start window can beat, to measure the policies against.
//!
//! Each job that some pool can run (by the same request checks as the independent checker) is split into
//! fractions `x[j,p] ≥ 0` over the pools allowed to it, `Σ_p x[j,p] = 1`. A job on a pool runs for its time on
//! that pool's model and starts in its **start window**: from its arrival (or `window.start_after_ms`) until
//! `max_wait_s` after that — the time in which the broker is asked to start it, bursting to the cloud at the
//! end of it — and on a cloud site not before `max_wait_s` after its arrival, and early enough to end by its
//! deadline. The relaxation keeps, per pool and UTC day, the pool's device-hours: the jobs' device-hours in the
//! day, each at the least it can be over its window, are at most the pool's. Money is exact per job and pool;
//! carbon is the least the job's energy can emit over its window, integrated hour by hour over the site's real
//! series (as the checker meters it). Every schedule whose jobs start in their windows is a feasible point, so
//! the optimum is a lower bound for it; a run that starts jobs later is reported with how many it did
//! ([`outside_window`]).
//!
//! Relaxed away: concurrency within a day (only a day's total device-hours count), whole devices (fractions of
//! jobs on several pools), quotas and preemption, and the knowledge of future jobs.

use super::checker::request_misfits;
use super::engine::{ScheduleEntry, SimJob};
use super::federation::{SimFederation, SimSite, SERIES_EPOCH_MS};
use good_lp::{variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use meridian_core::Millis;
use meridian_federation::{PoolAdvert, Tier};
use serde::Serialize;
use std::collections::BTreeMap;

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// One pool a job may run on, with what running there costs and how much of each day it holds at least.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Index into [`Relaxation::pools`].
    pub pool: usize,
    pub cost_usd: f64,
    /// The least carbon the job emits on this pool over its start window.
    pub co2_kg: f64,
    /// (day index, device-hours the job holds in that day at least), days with none left out.
    pub usage: Vec<(usize, f64)>,
}

/// The relaxation of one workload on one federation, before any objective is chosen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Relaxation {
    /// (site, pool) names, in the federation's order.
    pub pools: Vec<(String, String)>,
    /// Device-hours of each pool in one day.
    pub day_capacity: Vec<f64>,
    /// Days from the first day of any start window.
    pub days: usize,
    /// Per job (index into the jobs): its candidates; empty for a job no pool can run (left out).
    pub candidates: Vec<Vec<Candidate>>,
}

/// What the relaxation minimises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Objective {
    /// Money alone.
    Money,
    /// kgCO2e alone.
    Carbon,
    /// Money plus carbon at this price, USD per tonne (the objective of `carbon-price=…`).
    CarbonPrice(f64),
}

impl Objective {
    fn weights(self) -> (f64, f64) {
        match self {
            Objective::Money => (1.0, 0.0),
            Objective::Carbon => (0.0, 1.0),
            Objective::CarbonPrice(usd_per_t) => (1.0, usd_per_t / 1000.0),
        }
    }
}

/// The relaxation's optimum under one objective, and the money and carbon of the point that reaches it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Optimum {
    pub objective: f64,
    pub cost_usd: f64,
    pub co2_kg: f64,
}

/// The bound as `sim --bound` reports it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BoundReport {
    /// Jobs the relaxation covers (those some pool can run); the runs' figures are over the same jobs.
    pub jobs: usize,
    /// UTC days the start windows and runs span.
    pub days: usize,
    /// The least money any schedule starting every job in its window spends.
    pub cost_usd: f64,
    /// The least kgCO2e any such schedule emits.
    pub co2_kg: f64,
    /// The least `cost + price × CO2` per carbon price asked for (the runs' `carbon-price=…` and, with
    /// `--front`, the sweep's).
    pub objectives: Vec<ObjectiveBound>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ObjectiveBound {
    pub carbon_price_usd_per_t: f64,
    pub objective_usd: f64,
    /// Money and carbon of the relaxation's optimum for this price.
    pub cost_usd: f64,
    pub co2_kg: f64,
}

/// A job's start window on a pool of `tier`: `(earliest, latest)` start, or `None` where it cannot start
/// there in time to meet its deadline.
pub fn start_window(job: &SimJob, tier: Tier, runtime_ms: u64) -> Option<(Millis, Millis)> {
    let spec = &job.spec;
    let max_wait = spec.max_wait_s.saturating_mul(1000);
    let earliest = job.arrival_ms.max(spec.window.start_after_ms.unwrap_or(0));
    let mut latest = earliest.saturating_add(max_wait);
    let first = match tier {
        Tier::Cloud => earliest.max(job.arrival_ms.saturating_add(max_wait)),
        _ => earliest,
    };
    if let Some(deadline) = spec.window.deadline_ms {
        latest = latest.min(deadline.checked_sub(runtime_ms)?);
    }
    (first <= latest).then_some((first, latest))
}

/// A job's run time on a pool: its reference time scaled by the pool model's throughput (as the engine and
/// the checker take it).
pub fn runtime_ms(fed: &SimFederation, job: &SimJob, pool: &PoolAdvert) -> u64 {
    if job.fixed_runtime {
        job.reference_ms
    } else {
        let factor = fed.throughput.factor(&pool.model);
        (job.reference_ms as f64 / factor).round().max(1.0) as u64
    }
}

/// Whether the pool is large enough for the request and can give the share it asks for.
fn sized_for(job: &SimJob, pool: &PoolAdvert) -> bool {
    let r = &job.spec.resources;
    if r.share().is_some_and(|m| m < 1000) {
        let mig = r
            .mig
            .as_ref()
            .is_some_and(|m| pool.sharing.mig_profiles.contains(m));
        return pool.sharing.milli || mig;
    }
    let whole = job.spec.total_milli().div_ceil(1000);
    whole <= u64::from(pool.count)
        && (!r.same_node || u64::from(r.count) <= u64::from(pool.devices_per_node.max(1)))
}

/// The integral of a site's grid intensity from the series' epoch to `t`, in gCO2e/kWh × hours, with the
/// first and last values carried beyond the series as the checker reads it.
struct Intensity<'a> {
    series: Option<&'a [u32]>,
    yearly: f64,
    /// `cum[h]`: the integral over the series' first `h` hours.
    cum: Vec<f64>,
}

impl<'a> Intensity<'a> {
    fn new(site: &'a SimSite) -> Self {
        let series = site.series.as_deref().filter(|s| !s.is_empty());
        let mut cum = vec![0.0];
        for g in series.unwrap_or_default() {
            cum.push(cum[cum.len() - 1] + f64::from(*g));
        }
        Intensity {
            series,
            yearly: f64::from(site.intensity_at(SERIES_EPOCH_MS)),
            cum,
        }
    }

    fn integral(&self, t: Millis) -> f64 {
        let h = (t as f64 - SERIES_EPOCH_MS as f64) / HOUR_MS as f64;
        let Some(s) = self.series else {
            return self.yearly * h;
        };
        let n = s.len();
        if h <= 0.0 {
            f64::from(s[0]) * h
        } else if h >= n as f64 {
            self.cum[n] + f64::from(s[n - 1]) * (h - n as f64)
        } else {
            let i = h.floor() as usize;
            self.cum[i] + f64::from(s[i]) * (h - i as f64)
        }
    }

    /// The least integral over `[s, s + len)` for a start `s` in `[first, latest]`: the integral is linear in
    /// `s` between the starts where `s` or `s + len` meets an hour's boundary, so its least is at one of them.
    fn least_over(&self, first: Millis, latest: Millis, len: u64) -> f64 {
        let over = |s: Millis| self.integral(s + len) - self.integral(s);
        let mut best = over(first).min(over(latest));
        if self.series.is_some() {
            let boundaries = |from: Millis, to: Millis| {
                (from.div_ceil(HOUR_MS)..=to / HOUR_MS).map(|b| b * HOUR_MS)
            };
            for b in boundaries(first, latest) {
                best = best.min(over(b));
            }
            for b in boundaries(first + len, latest + len) {
                best = best.min(over(b - len));
            }
        }
        best
    }
}

/// Device-hours of `[s, s + len)` within `[day_start, day_start + DAY_MS)`.
fn overlap_hours(s: Millis, len: u64, day_start: Millis) -> f64 {
    let from = s.max(day_start);
    let to = (s + len).min(day_start + DAY_MS);
    to.saturating_sub(from) as f64 / HOUR_MS as f64
}

/// Builds the relaxation of `jobs` on `fed`.
pub fn relaxation(fed: &SimFederation, jobs: &[SimJob]) -> Relaxation {
    let mut pools = Vec::new();
    let mut day_capacity = Vec::new();
    let mut at: Vec<(&SimSite, &PoolAdvert, Intensity)> = Vec::new();
    for site in &fed.sites {
        for pool in &site.pools {
            pools.push((site.id.to_string(), pool.name.to_string()));
            day_capacity.push(f64::from(pool.count) * 24.0);
            at.push((site, pool, Intensity::new(site)));
        }
    }
    // Per job and allowed pool: (pool, runtime, window).
    let allowed: Vec<Vec<(usize, u64, Millis, Millis)>> = jobs
        .iter()
        .map(|job| {
            at.iter()
                .enumerate()
                .filter(|(_, (site, pool, _))| {
                    sized_for(job, pool) && request_misfits(fed, site, pool, job).is_empty()
                })
                .filter_map(|(i, (site, pool, _))| {
                    let len = runtime_ms(fed, job, pool);
                    let (first, latest) = start_window(job, site.file.tier, len)?;
                    Some((i, len, first, latest))
                })
                .collect()
        })
        .collect();
    let first_day = allowed
        .iter()
        .flatten()
        .map(|(_, _, first, _)| first / DAY_MS)
        .min()
        .unwrap_or(0);
    let last_day = allowed
        .iter()
        .flatten()
        .map(|(_, len, _, latest)| (latest + len) / DAY_MS)
        .max()
        .unwrap_or(first_day);
    let candidates = jobs
        .iter()
        .zip(&allowed)
        .map(|(job, allowed)| {
            let devices = job.spec.total_milli() as f64 / 1000.0;
            allowed
                .iter()
                .map(|&(i, len, first, latest)| {
                    let (site, pool, intensity) = &at[i];
                    let hours = len as f64 / HOUR_MS as f64;
                    let kw = f64::from(pool.power_watts) / 1000.0 * devices * site.file.pue;
                    let usage = (first / DAY_MS..=(latest + len) / DAY_MS)
                        .filter_map(|d| {
                            let start = d * DAY_MS;
                            let least = overlap_hours(first, len, start)
                                .min(overlap_hours(latest, len, start));
                            (least > 0.0).then(|| ((d - first_day) as usize, least * devices))
                        })
                        .collect();
                    Candidate {
                        pool: i,
                        cost_usd: pool.price_micro_usd_per_hour as f64 / 1e6 * devices * hours,
                        co2_kg: kw * intensity.least_over(first, latest, len) / 1000.0,
                        usage,
                    }
                })
                .collect()
        })
        .collect();
    Relaxation {
        pools,
        day_capacity,
        days: (last_day - first_day + 1) as usize,
        candidates,
    }
}

impl Relaxation {
    /// Jobs the relaxation covers.
    pub fn covered(&self) -> usize {
        self.candidates.iter().filter(|c| !c.is_empty()).count()
    }

    /// Solves the relaxation for `objective` (Clarabel, interior point).
    pub fn solve(&self, objective: Objective) -> anyhow::Result<Optimum> {
        let (wc, wg) = objective.weights();
        let mut vars = ProblemVariables::new();
        let x: Vec<Vec<Variable>> = self
            .candidates
            .iter()
            .map(|cs| cs.iter().map(|_| vars.add(variable().min(0.0))).collect())
            .collect();
        let mut goal = Expression::with_capacity(x.iter().map(Vec::len).sum());
        // Per pool and day: the row, and the device-hours of every job allowed there were they all there.
        let mut rows: BTreeMap<(usize, usize), (Expression, f64)> = BTreeMap::new();
        for (cs, xs) in self.candidates.iter().zip(&x) {
            for (c, v) in cs.iter().zip(xs) {
                goal.add_mul(wc * c.cost_usd + wg * c.co2_kg, *v);
                for &(day, hours) in &c.usage {
                    let row = rows.entry((c.pool, day)).or_default();
                    row.0.add_mul(hours, *v);
                    row.1 += hours;
                }
            }
        }
        let mut model = vars.minimise(goal).using(good_lp::clarabel);
        for xs in x.iter().filter(|xs| !xs.is_empty()) {
            let mut all = Expression::with_capacity(xs.len());
            for v in xs {
                all.add_mul(1.0, *v);
            }
            model.add_constraint(all.eq(1.0));
        }
        // A day of a pool that could hold every job allowed on it at once needs no row: no point can break it.
        for ((pool, _), (row, demand)) in rows {
            if demand > self.day_capacity[pool] {
                model.add_constraint(row.leq(self.day_capacity[pool]));
            }
        }
        let solution = model.solve().map_err(|e| {
            anyhow::anyhow!(
                "the bound's linear program has no solution ({e}): the federation cannot start every job \
                 within its start window even with capacity pooled over each day"
            )
        })?;
        let (mut cost_usd, mut co2_kg) = (0.0, 0.0);
        for (cs, xs) in self.candidates.iter().zip(&x) {
            for (c, v) in cs.iter().zip(xs) {
                let share = solution.value(*v).max(0.0);
                cost_usd += share * c.cost_usd;
                co2_kg += share * c.co2_kg;
            }
        }
        Ok(Optimum {
            objective: wc * cost_usd + wg * co2_kg,
            cost_usd,
            co2_kg,
        })
    }
}

/// Jobs the relaxation covers that a run started after their start window on every pool, or never started:
/// for those the bound does not bind the run.
pub fn outside_window(
    fed: &SimFederation,
    jobs: &[SimJob],
    relaxation: &Relaxation,
    schedule: &[ScheduleEntry],
) -> usize {
    let mut first_start: BTreeMap<usize, Millis> = BTreeMap::new();
    for e in schedule {
        let s = first_start.entry(e.job).or_insert(e.start_ms);
        *s = (*s).min(e.start_ms);
    }
    jobs.iter()
        .enumerate()
        .filter(|(j, _)| relaxation.candidates.get(*j).is_some_and(|c| !c.is_empty()))
        .filter(|(j, job)| match first_start.get(j) {
            None => true,
            Some(&s) => {
                let latest = fed
                    .sites
                    .iter()
                    .flat_map(|site| site.pools.iter().map(move |p| (site, p)))
                    .filter_map(|(site, p)| {
                        start_window(job, site.file.tier, runtime_ms(fed, job, p))
                    })
                    .map(|(_, latest)| latest)
                    .max();
                latest.is_none_or(|latest| s > latest)
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    //! The relaxation on cases small enough to solve by hand, its windows and its carbon, and a run of the
    //! engine measured against it.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::sim::engine::{run, Ranking};
    use meridian_core::throughput::Throughput;
    use meridian_federation::{
        AcceleratorKind, JobKind, JobSpec, Policy, Resources, TenantId, Window,
    };

    const T0: Millis = SERIES_EPOCH_MS;

    /// Two owned sites of one 1-kW device each at PUE 1: `cheap` at 1 USD/h on a 500 g/kWh grid, `clean` at
    /// 3 USD/h on a 100 g/kWh grid; no throughput table (every model at the reference speed).
    fn two_sites() -> SimFederation {
        let path = meridian_broker::local::workspace_root().join("configs/sim/federation.toml");
        let mut fed = SimFederation::load(&path).unwrap();
        fed.throughput = Throughput::default();
        let template = fed
            .sites
            .iter()
            .find(|s| s.file.tier == Tier::Owned)
            .unwrap()
            .clone();
        fed.sites = [("cheap", 1.0, 500), ("clean", 3.0, 100)]
            .into_iter()
            .map(|(id, usd, g)| {
                let mut s = template.clone();
                s.id = id.parse().unwrap();
                s.file.id = s.id.clone();
                s.base.id = s.id.clone();
                s.file.pue = 1.0;
                s.series = None;
                s.base.carbon.g_per_kwh = g;
                let mut pool = s.pools[0].clone();
                pool.count = 1;
                pool.devices.truncate(1);
                pool.power_watts = 1000;
                pool.price_micro_usd_per_hour = (usd * 1e6) as u64;
                s.pools = vec![pool];
                s
            })
            .collect();
        fed
    }

    fn job(key: &str, hours: u64, arrival_ms: Millis, max_wait_s: u64) -> SimJob {
        let mut spec = JobSpec::new(
            TenantId::new("t").unwrap(),
            key,
            JobKind::Batch,
            Resources::whole(AcceleratorKind::Gpu, 1),
            "true",
        );
        spec.duration_s = Some(hours * 3600);
        spec.max_wait_s = max_wait_s;
        SimJob {
            spec,
            arrival_ms,
            reference_ms: hours * HOUR_MS,
            fixed_runtime: false,
            trace_models: Vec::new(),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-4 * b.abs().max(1.0)
    }

    /// Three 10-hour jobs on the two sites: a day of each device holds 2.4 of them. The least money puts 2.4 on
    /// the cheap device and 0.6 on the clean one (24 × 1 + 6 × 3 = 42 USD); the least carbon the other way
    /// round (24 × 0.1 + 6 × 0.5 = 5.4 kg); a carbon price of 0 is the money bound, a very high one the carbon
    /// bound.
    #[test]
    fn the_bound_of_a_small_case_is_its_hand_solved_optimum() {
        let fed = two_sites();
        let jobs: Vec<SimJob> = (0..3)
            .map(|i| job(&format!("j{i}"), 10, T0 + HOUR_MS, 0))
            .collect();
        let rel = relaxation(&fed, &jobs);
        assert_eq!(rel.covered(), 3);
        assert_eq!(rel.days, 1);
        let money = rel.solve(Objective::Money).unwrap();
        assert!(close(money.cost_usd, 42.0), "{money:?}");
        let carbon = rel.solve(Objective::Carbon).unwrap();
        assert!(close(carbon.co2_kg, 5.4), "{carbon:?}");
        let zero = rel.solve(Objective::CarbonPrice(0.0)).unwrap();
        assert!(close(zero.objective, money.objective), "{zero:?}");
        let dear = rel.solve(Objective::CarbonPrice(1e7)).unwrap();
        assert!(close(dear.co2_kg, 5.4), "{dear:?}");
        // Between the two, the optimum trades: at 10,000 USD/t (10 USD/kg) a job-hour on the clean device
        // costs 3 + 1 = 4 USD against 1 + 5 = 6 on the cheap one, so the clean device fills first.
        let mid = rel.solve(Objective::CarbonPrice(10_000.0)).unwrap();
        assert!(close(mid.objective, 24.0 * 4.0 + 6.0 * 6.0), "{mid:?}");
    }

    /// The engine's `cost` run on the same jobs cannot start the third job in its window (two devices, no
    /// cloud, no wait allowed): the bound says so, and still bounds what the run spent on the other two.
    #[test]
    fn a_run_that_starts_a_job_after_its_window_is_counted_outside_it() {
        let fed = two_sites();
        let jobs: Vec<SimJob> = (0..3)
            .map(|i| job(&format!("j{i}"), 10, T0 + HOUR_MS, 0))
            .collect();
        let out = run(&fed, &jobs, &Ranking::Policy(Policy::Cost), T0, None).unwrap();
        let rel = relaxation(&fed, &jobs);
        assert_eq!(
            outside_window(&fed, &jobs, &rel, &out.schedule),
            1,
            "{:#?}",
            out.schedule
        );
        // Two jobs that fit at once: the run starts both in their windows, and pays no less than the bound.
        let two = &jobs[..2];
        let out = run(&fed, two, &Ranking::Policy(Policy::Cost), T0, None).unwrap();
        let rel = relaxation(&fed, two);
        assert_eq!(outside_window(&fed, two, &rel, &out.schedule), 0);
        let checked = crate::sim::checker::check(&fed, two, &out.schedule);
        let money = rel.solve(Objective::Money).unwrap();
        assert!(
            checked.cost_usd >= money.cost_usd - 1e-6,
            "{checked:?} {money:?}"
        );
        assert!(close(money.cost_usd, 20.0), "{money:?}");
    }

    /// A window starts at arrival (or `start_after`) and lasts `max_wait_s`; a cloud site only from
    /// `max_wait_s` after arrival; a deadline ends it early enough to finish, or rules the pool out.
    #[test]
    fn start_windows_follow_max_wait_cloud_burst_and_deadlines() {
        let mut j = job("w", 1, T0, 600);
        assert_eq!(
            start_window(&j, Tier::Owned, HOUR_MS),
            Some((T0, T0 + 600_000))
        );
        assert_eq!(
            start_window(&j, Tier::Cloud, HOUR_MS),
            Some((T0 + 600_000, T0 + 600_000))
        );
        j.spec.window = Window {
            start_after_ms: Some(T0 + HOUR_MS),
            deadline_ms: Some(T0 + 2 * HOUR_MS + 60_000),
        };
        assert_eq!(
            start_window(&j, Tier::Owned, HOUR_MS),
            Some((T0 + HOUR_MS, T0 + HOUR_MS + 60_000))
        );
        j.spec.window.deadline_ms = Some(T0 + HOUR_MS + 59_000);
        assert_eq!(start_window(&j, Tier::Owned, HOUR_MS), None);
    }

    /// Carbon is the least over the window, integrated hour by hour: a one-hour run that may start from 0:30
    /// to 1:30 on a grid at 500 then 100 g/kWh emits least starting at 1:00; one that must start by 0:40,
    /// least at 0:40 (20 minutes at 500, 40 at 100).
    #[test]
    fn carbon_is_integrated_over_the_hours_at_the_best_start_in_the_window() {
        let mut site = two_sites().sites[0].clone();
        site.series = Some(vec![500, 100, 100, 900]);
        let i = Intensity::new(&site);
        let half = HOUR_MS / 2;
        assert!(close(
            i.least_over(T0 + half, T0 + 3 * half, HOUR_MS),
            100.0
        ));
        assert!(close(
            i.least_over(T0 + half, T0 + half + 600_000, HOUR_MS),
            (500.0 + 2.0 * 100.0) / 3.0
        ));
        // Past the series' end its last value holds, as the checker reads it.
        assert!(close(
            i.least_over(T0 + 10 * HOUR_MS, T0 + 10 * HOUR_MS, HOUR_MS),
            900.0
        ));
    }
}
