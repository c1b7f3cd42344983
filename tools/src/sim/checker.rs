//! The independent checker: replays a run's schedule against the site files and the job requests, counts
//! broken hard constraints and computes the totals. It shares no code with placement or the reactor: it reads
//! the federation's own files, and meters carbon from the real hourly series.

use super::engine::{ScheduleEntry, SimJob};
use super::federation::{SimFederation, SimSite};
use meridian_core::Millis;
use meridian_federation::PoolAdvert;
use meridian_federation::{JobKind, PoolName, Tier};
use std::collections::BTreeMap;

const HOUR_MS: u64 = 3_600_000;

/// Per device (site, pool, index): the intervals it was used and the milli-share of each.
type Usage = BTreeMap<(String, PoolName, u32), Vec<(Millis, Millis, u32)>>;

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checked {
    pub violations: Vec<String>,
    pub cost_usd: f64,
    pub energy_kwh: f64,
    pub co2_kg: f64,
    /// Waits (start − arrival) of the non-inference jobs, seconds.
    pub waits_s: Vec<f64>,
    pub device_hours: f64,
    pub cloud_device_hours: f64,
    /// Per tenant: waits (as `waits_s`) and device-hours.
    pub tenants: BTreeMap<String, (Vec<f64>, f64)>,
    /// Mean share of free owned/partner capacity that sits on partly used devices, sampled hourly.
    pub fragmentation: f64,
}

/// Replays the schedule.
pub fn check(fed: &SimFederation, jobs: &[SimJob], schedule: &[ScheduleEntry]) -> Checked {
    let mut out = Checked::default();
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut completed: BTreeMap<usize, usize> = BTreeMap::new();
    let mut spans: BTreeMap<usize, Vec<(Millis, Millis)>> = BTreeMap::new();
    // A job's wait runs to its first start.
    let mut first_start: BTreeMap<usize, Millis> = BTreeMap::new();
    for e in schedule {
        let s = first_start.entry(e.job).or_insert(e.start_ms);
        *s = (*s).min(e.start_ms);
    }
    // (site, pool, device) → [(start, end, milli)]
    let mut usage: Usage = BTreeMap::new();
    for e in schedule {
        let Some(job) = jobs.get(e.job) else {
            out.violations.push(format!("{}: unknown job", e.job_id));
            continue;
        };
        *seen.entry(e.job).or_default() += 1;
        if !e.stopped {
            *completed.entry(e.job).or_default() += 1;
        }
        spans.entry(e.job).or_default().push((e.start_ms, e.end_ms));
        let spec = &job.spec;
        let Some(site) = fed.sites.iter().find(|s| s.id == e.site) else {
            out.violations
                .push(format!("{}: unknown site {}", e.job_id, e.site));
            continue;
        };
        let Some(pool) = site.pools.iter().find(|p| p.name == e.pool) else {
            out.violations
                .push(format!("{}: unknown pool {}/{}", e.job_id, e.site, e.pool));
            continue;
        };
        let mut bad = |what: String| {
            out.violations
                .push(format!("{} on {}: {what}", e.job_id, e.site))
        };
        for why in request_misfits(fed, site, pool, job) {
            bad(why);
        }
        let asked: u64 = spec.total_milli();
        let given: u64 = e.devices.iter().map(|d| u64::from(d.milli)).sum();
        if asked != given {
            bad(format!("given {given} milli, asked {asked}"));
        }
        if e.devices.iter().any(|d| d.milli < 1000) && !pool.sharing.milli && !mig_met(job, pool) {
            bad("shares a device of a pool that does not share".into());
        }
        if site.file.tier == Tier::Cloud && e.start_ms < job.arrival_ms + spec.max_wait_s * 1000 {
            bad("burst to cloud before max_wait".into());
        }
        if e.start_ms < job.arrival_ms {
            bad("started before it arrived".into());
        }
        let expected = if job.fixed_runtime {
            job.reference_ms
        } else {
            let factor = fed.throughput.factor(&pool.model);
            (job.reference_ms as f64 / factor).round().max(1.0) as u64
        };
        // A stopped (preempted) attempt ran less; the one that completes runs exactly its time.
        let ran = e.end_ms - e.start_ms;
        if (e.stopped && ran > expected) || (!e.stopped && ran != expected) {
            bad(format!("ran {ran} ms, expected {expected}"));
        }
        for d in &e.devices {
            if d.index >= pool.count {
                bad(format!("device {} does not exist", d.index));
            }
            usage
                .entry((site.id.to_string(), pool.name.clone(), d.index))
                .or_default()
                .push((e.start_ms, e.end_ms, d.milli));
        }
        // Totals, from the site file and the real series.
        let milli = given as f64 / 1000.0;
        let hours = (e.end_ms - e.start_ms) as f64 / HOUR_MS as f64;
        let power_kw = f64::from(pool.power_watts) / 1000.0;
        let cost_usd = pool.price_micro_usd_per_hour as f64 / 1e6 * milli * hours;
        out.cost_usd += cost_usd;
        // The broker's metering of the attempt must agree with the site file (to its integer rounding).
        let energy_wh = power_kw * milli * site.file.pue * hours * 1000.0;
        let off = |metered: u64, want: f64| (metered as f64 - want).abs() > 1.0 + want * 1e-6;
        if off(e.metered.cost_micro_usd, cost_usd * 1e6) {
            bad(format!(
                "metered {} micro-USD, the site's price gives {:.0}",
                e.metered.cost_micro_usd,
                cost_usd * 1e6
            ));
        }
        if off(e.metered.energy_wh, energy_wh) {
            bad(format!(
                "metered {} Wh, the site's power and PUE give {energy_wh:.0}",
                e.metered.energy_wh
            ));
        }
        out.device_hours += milli * hours;
        if site.file.tier == Tier::Cloud {
            out.cloud_device_hours += milli * hours;
        }
        let mut t = e.start_ms;
        let mut co2_g = 0.0;
        while t < e.end_ms {
            let step = (HOUR_MS - t % HOUR_MS).min(e.end_ms - t);
            let kwh = power_kw * milli * site.file.pue * step as f64 / HOUR_MS as f64;
            out.energy_kwh += kwh;
            co2_g += kwh * f64::from(site.intensity_at(t));
            t += step;
        }
        out.co2_kg += co2_g / 1000.0;
        // ...and its carbon with the real hourly series over the hours it ran (format 8 meters each hour at its
        // own intensity).
        if off(e.metered.co2_g, co2_g) {
            bad(format!(
                "metered {} gCO2e, the site's hourly intensities over its run give {co2_g:.0}",
                e.metered.co2_g
            ));
        }
        let tenant = out.tenants.entry(spec.tenant.to_string()).or_default();
        tenant.1 += milli * hours;
        if spec.kind != JobKind::Inference && first_start.get(&e.job) == Some(&e.start_ms) {
            let wait = (e.start_ms.saturating_sub(job.arrival_ms)) as f64 / 1000.0;
            out.waits_s.push(wait);
            tenant.0.push(wait);
        }
    }
    // Each job completes once; attempts stopped before it do not overlap it or each other.
    for (job, n) in &seen {
        let completed = completed.get(job).copied().unwrap_or(0);
        if completed != 1 {
            out.violations.push(format!(
                "job {job} placed {n} times, completed {completed} times"
            ));
        }
    }
    for (job, mut spans) in spans {
        spans.sort();
        if spans.windows(2).any(|w| w[1].0 < w[0].1) {
            out.violations.push(format!("job {job}: attempts overlap"));
        }
    }
    // Device capacity over time.
    for ((site, pool, index), mut intervals) in usage.clone() {
        let mut events: Vec<(Millis, i64)> = Vec::new();
        for (s, e, m) in intervals.drain(..) {
            events.push((s, i64::from(m)));
            events.push((e, -i64::from(m)));
        }
        events.sort_by_key(|(t, d)| (*t, *d));
        let mut level = 0i64;
        for (t, d) in events {
            level += d;
            if level > 1000 {
                out.violations
                    .push(format!("{site}/{pool}/{index} holds {level} milli at {t}"));
                break;
            }
        }
    }
    out.fragmentation = fragmentation(fed, &usage);
    out
}

/// What keeps `job` off `pool` of `site` whatever the schedule: accelerator kind, model, memory, the trace's
/// `gpu_spec`, MIG profile, price cap, tiers, sites and residency (the size and sharing of what it was given are
/// the schedule's, checked by [`check`]). Empty when the request allows the pool.
pub fn request_misfits(
    fed: &SimFederation,
    site: &SimSite,
    pool: &PoolAdvert,
    job: &SimJob,
) -> Vec<String> {
    let spec = &job.spec;
    let mut out = Vec::new();
    if pool.kind != spec.resources.kind {
        out.push(format!("pool kind {:?}", pool.kind));
    }
    if !spec.resources.models.is_empty()
        && !spec
            .resources
            .models
            .iter()
            .any(|m| m.matches(pool.model.as_str()))
    {
        out.push(format!("model {} not allowed", pool.model));
    }
    if let Some(mem) = spec.resources.memory_mib {
        if pool.memory_mib < mem {
            out.push("too little memory".into());
        }
    }
    if !job.trace_models.is_empty()
        && !job
            .trace_models
            .iter()
            .any(|alt| trace_alternative_met(alt, pool.model.as_str(), pool.memory_mib))
    {
        out.push(format!(
            "the trace's gpu_spec {} is not met by {} with {} MiB",
            job.trace_models.join("|"),
            pool.model,
            pool.memory_mib
        ));
    }
    if spec.resources.mig.is_some() && !mig_met(job, pool) {
        out.push("MIG profile not offered by the pool".into());
    }
    let c = &spec.constraints;
    if let Some(cap) = c.price_cap_micro_usd_per_hour {
        if pool.price_micro_usd_per_hour > cap {
            out.push("price above cap".into());
        }
    }
    if !c.tiers.is_empty() && !c.tiers.contains(&site.file.tier) {
        out.push("tier not allowed".into());
    }
    if !c.sites.is_empty() && !c.sites.contains(&site.id) {
        out.push("site not allowed".into());
    }
    if let Some(r) = &c.residency {
        let loc = meridian_federation::GeoPoint {
            lat: site.file.latitude,
            lon: site.file.longitude,
        };
        if fed.regions.contains(r, loc) != Some(true) {
            out.push(format!("outside residency {r}"));
        }
    }
    out
}

/// Whether the job asks for a MIG profile the pool offers.
fn mig_met(job: &SimJob, pool: &PoolAdvert) -> bool {
    job.spec
        .resources
        .mig
        .as_ref()
        .is_some_and(|m| pool.sharing.mig_profiles.contains(m))
}

/// Mean, over hourly samples, of the share of free owned/partner milli-capacity that lies on devices already
/// partly in use (free room that a whole-device job cannot use).
fn fragmentation(fed: &SimFederation, usage: &Usage) -> f64 {
    let Some(first) = usage.values().flatten().map(|u| u.0).min() else {
        return 0.0;
    };
    let last = usage.values().flatten().map(|u| u.1).max().unwrap_or(first);
    let mut sum = 0.0;
    let mut samples = 0u64;
    let mut t = first - first % HOUR_MS + HOUR_MS;
    while t < last {
        let (mut free, mut partial) = (0u64, 0u64);
        for s in fed.sites.iter().filter(|s| s.file.tier != Tier::Cloud) {
            for p in &s.pools {
                for d in 0..p.count {
                    let used: u32 = usage
                        .get(&(s.id.to_string(), p.name.clone(), d))
                        .map(|v| {
                            v.iter()
                                .filter(|(a, b, _)| *a <= t && t < *b)
                                .map(|x| x.2)
                                .sum()
                        })
                        .unwrap_or(0);
                    let f = u64::from(1000u32.saturating_sub(used));
                    free += f;
                    if used > 0 {
                        partial += f;
                    }
                }
            }
        }
        if free > 0 {
            sum += partial as f64 / free as f64;
        }
        samples += 1;
        t += HOUR_MS;
    }
    if samples == 0 {
        0.0
    } else {
        sum / samples as f64
    }
}

/// Whether a pool of `model` with `memory_mib` per device meets one alternative of a trace's `gpu_spec` as the
/// trace writes it: the model's name (`T4`, `G2`), or the name followed by `M` and the memory in GiB (`V100M32`:
/// a V100 with at least 32 GiB).
fn trace_alternative_met(alternative: &str, model: &str, memory_mib: u64) -> bool {
    if alternative.eq_ignore_ascii_case(model) {
        return true;
    }
    let Some(rest) = alternative
        .get(..model.len())
        .filter(|head| head.eq_ignore_ascii_case(model))
        .and_then(|_| alternative.get(model.len()..))
    else {
        return false;
    };
    rest.strip_prefix(['M', 'm'])
        .and_then(|gib| gib.parse::<u64>().ok())
        .is_some_and(|gib| memory_mib >= gib * 1024)
}

#[cfg(test)]
mod tests {
    //! The checker must catch what it is there to catch: a correct schedule passes, and each kind of wrong
    //! schedule (or wrong request) is reported.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::sim::engine::{run, Ranking};
    use meridian_federation::{AcceleratorKind, JobSpec, Policy, Resources, TenantId};

    const START: Millis = super::super::federation::SERIES_EPOCH_MS;

    fn federation() -> SimFederation {
        let path = meridian_broker::local::workspace_root().join("configs/sim/federation.toml");
        SimFederation::load(&path).unwrap()
    }

    /// Twelve one-GPU batch jobs of an hour, all arriving at the start.
    fn jobs() -> Vec<SimJob> {
        (0..12)
            .map(|i| {
                let mut spec = JobSpec::new(
                    TenantId::new("team").unwrap(),
                    format!("k{i}"),
                    JobKind::Batch,
                    Resources::whole(AcceleratorKind::Gpu, 1),
                    "true",
                );
                spec.duration_s = Some(3600);
                spec.max_wait_s = 600;
                SimJob {
                    spec,
                    arrival_ms: START,
                    reference_ms: HOUR_MS,
                    fixed_runtime: false,
                    trace_models: Vec::new(),
                }
            })
            .collect()
    }

    fn schedule(fed: &SimFederation, jobs: &[SimJob]) -> Vec<ScheduleEntry> {
        let out = run(fed, jobs, &Ranking::Policy(Policy::Cost), START, None).unwrap();
        assert_eq!(out.schedule.len(), jobs.len());
        out.schedule
    }

    fn found(c: &Checked, what: &str) -> bool {
        c.violations.iter().any(|v| v.contains(what))
    }

    #[test]
    fn a_correct_schedule_passes_and_each_kind_of_wrong_one_is_caught() {
        let fed = federation();
        let jobs = jobs();
        let good = schedule(&fed, &jobs);
        let ok = check(&fed, &jobs, &good);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);

        // An over-committed device: a second attempt put on a device another holds at the same time.
        let mut s = good.clone();
        let (a, b) = (0..s.len())
            .flat_map(|i| (0..s.len()).map(move |j| (i, j)))
            .find(|(i, j)| i != j && s[*i].site == s[*j].site && s[*i].pool == s[*j].pool)
            .expect("two attempts on one pool");
        s[b].devices = s[a].devices.clone();
        assert!(found(&check(&fed, &jobs, &s), "milli at"), "over-commit");

        // A job run twice.
        let mut s = good.clone();
        let mut again = s[0].clone();
        again.start_ms = s[0].end_ms + HOUR_MS;
        again.end_ms = again.start_ms + (s[0].end_ms - s[0].start_ms);
        s.push(again);
        assert!(
            found(&check(&fed, &jobs, &s), "completed 2 times"),
            "run twice"
        );

        // A residency breach: the job asked for the EU and ran in the US.
        let mut j = jobs.clone();
        j[good[0].job].spec.constraints.residency = Some("eu".into());
        assert!(
            found(&check(&fed, &j, &good), "outside residency eu"),
            "residency"
        );

        // A model constraint broken.
        let mut j = jobs.clone();
        j[good[0].job].spec.resources.models = vec!["V100".into()];
        assert!(found(&check(&fed, &j, &good), "not allowed"), "model");

        // A trace constraint broken: the task asked for more memory per device than its pool has (`A100M80`
        // on a 40 GiB A100), or for undisclosed models only.
        let site = fed.site(&good[0].site).unwrap();
        let pool = site.pools.iter().find(|p| p.name == good[0].pool).unwrap();
        let gib = pool.memory_mib / 1024;
        let mut j = jobs.clone();
        j[good[0].job].trace_models = vec![format!("{}M{}", pool.model, gib + 1), "G3".into()];
        assert!(found(&check(&fed, &j, &good), "gpu_spec"), "trace memory");
        j[good[0].job].trace_models = vec!["G2".into()];
        assert!(found(&check(&fed, &j, &good), "gpu_spec G2"), "trace model");
        j[good[0].job].trace_models = vec!["G2".into(), format!("{}M{gib}", pool.model)];
        assert!(check(&fed, &j, &good).violations.is_empty(), "met");

        // A wrong total: the attempt metered at another price than the site's.
        let mut s = good.clone();
        s[0].metered.cost_micro_usd += 10_000;
        assert!(found(&check(&fed, &jobs, &s), "micro-USD"), "cost");
        let mut s = good.clone();
        s[0].metered.energy_wh += 5;
        assert!(found(&check(&fed, &jobs, &s), "Wh"), "energy");
        // Carbon metered at one intensity where the run's hours had others.
        let mut s = good;
        s[0].metered.co2_g += 5;
        assert!(found(&check(&fed, &jobs, &s), "gCO2e"), "carbon");
    }
}
