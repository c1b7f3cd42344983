//! `meridian plan`: a capacity what-if from real history. The jobs the broker recorded over the last days (live
//! and archived, from the history API) are replayed through the simulator, each under its own policy and the
//! tenancy in force, on today's federation and on a changed one; the independent checker's figures of the two
//! runs are compared. Turning history into simulator jobs and changing a federation are pure.

use super::engine::{self, Ranking, SimJob};
use super::federation::SimFederation;
use super::{checker, run_report, RunReport};
use meridian_core::throughput::Throughput;
use meridian_federation::{HistoryView, JobId, JobPhase, ModelName, SiteId};
use serde::Serialize;
use std::path::PathBuf;

const DAY_MS: u64 = 24 * 3_600_000;

/// Settings of one `meridian plan`.
#[derive(Clone, Debug, clap::Args)]
pub struct PlanOptions {
    /// Today's federation from a federation file (its sites' pools, prices, carbon) instead of the running
    /// broker's: by default the what-if runs on the sites the broker counts up now, as they last advertised
    /// themselves, with the broker's regions, round-trip and throughput tables.
    #[arg(long)]
    pub federation: Option<PathBuf>,
    /// Replay the jobs submitted in the last N days.
    #[arg(long, default_value_t = 7)]
    pub days: u64,
    /// Add devices: SITE:MODEL:COUNT (to the site's pool of that model, or a new pool priced like the
    /// federation's first pool of that model). Repeatable.
    #[arg(long, value_parser = parse_devices)]
    pub add: Vec<Devices>,
    /// Remove devices: SITE:MODEL:COUNT. Repeatable.
    #[arg(long, value_parser = parse_devices)]
    pub remove: Vec<Devices>,
    /// Take a site out (drained for good). Repeatable.
    #[arg(long)]
    pub drain: Vec<SiteId>,
}

impl PlanOptions {
    /// The changes asked for, in the order they are applied: additions, removals, drains.
    pub fn changes(&self) -> Vec<Change> {
        let mut out: Vec<Change> = self.add.iter().cloned().map(Change::Add).collect();
        out.extend(self.remove.iter().cloned().map(Change::Remove));
        out.extend(self.drain.iter().cloned().map(Change::Drain));
        out
    }
}

/// `SITE:MODEL:COUNT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Devices {
    pub site: SiteId,
    pub model: ModelName,
    pub count: u32,
}

pub fn parse_devices(s: &str) -> Result<Devices, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [site, model, count] = parts[..] else {
        return Err(format!(
            "{s:?}: expected SITE:MODEL:COUNT, e.g. dc-oregon:H100:32"
        ));
    };
    let site = SiteId::new(site).map_err(|e| format!("{s:?}: site: {e}"))?;
    let model = model.trim();
    if model.is_empty()
        || model.len() > 64
        || !model
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!("{s:?}: model {model:?}: 1-64 of A-Z a-z 0-9 - _ ."));
    }
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: count {count:?}: {e}"))?;
    if count == 0 {
        return Err(format!("{s:?}: count must be at least 1"));
    }
    Ok(Devices {
        site,
        model: ModelName::new(model),
        count,
    })
}

/// One change to the federation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Add(Devices),
    Remove(Devices),
    Drain(SiteId),
}

/// The federation with the changes made, and what each change did, in words.
pub fn apply(
    fed: &SimFederation,
    changes: &[Change],
) -> anyhow::Result<(SimFederation, Vec<String>)> {
    let mut out = fed.clone();
    let mut said = Vec::new();
    let known = |f: &SimFederation, site: &SiteId| -> anyhow::Result<usize> {
        f.sites.iter().position(|s| &s.id == site).ok_or_else(|| {
            let ids: Vec<&str> = f.sites.iter().map(|s| s.id.as_str()).collect();
            anyhow::anyhow!(
                "no site {site} in the federation (its sites: {})",
                ids.join(", ")
            )
        })
    };
    for change in changes {
        match change {
            Change::Add(d) => {
                let i = known(&out, &d.site)?;
                let file = &mut out.sites[i].file;
                match file
                    .pools
                    .iter_mut()
                    .find(|p| p.model.matches(d.model.as_str()))
                {
                    Some(pool) => {
                        pool.count = pool.count.saturating_add(d.count);
                        said.push(format!(
                            "add {} × {} to {} pool {} (now {})",
                            d.count, pool.model, d.site, pool.name, pool.count
                        ));
                    }
                    None => {
                        let (from, template) = fed
                            .sites
                            .iter()
                            .find_map(|s| {
                                s.file
                                    .pools
                                    .iter()
                                    .find(|p| p.model.matches(d.model.as_str()))
                                    .map(|p| (s.id.clone(), p.clone()))
                            })
                            .ok_or_else(|| {
                                anyhow::anyhow!(
                                    "no pool of model {} anywhere in the federation to take its price, power and \
                                     memory from; add to a model the federation has",
                                    d.model
                                )
                            })?;
                        let mut pool = template;
                        pool.name = meridian_federation::PoolName::new(format!(
                            "{}-added",
                            pool.model.as_str().to_ascii_lowercase()
                        ));
                        pool.count = d.count;
                        said.push(format!(
                            "add {} × {} to {} as new pool {} (price and power as at {from})",
                            d.count, pool.model, d.site, pool.name
                        ));
                        file.pools.push(pool);
                    }
                }
                refresh(&mut out, i)?;
            }
            Change::Remove(d) => {
                let i = known(&out, &d.site)?;
                let file = &mut out.sites[i].file;
                let has: u32 = file
                    .pools
                    .iter()
                    .filter(|p| p.model.matches(d.model.as_str()))
                    .map(|p| p.count)
                    .sum();
                if has < d.count {
                    anyhow::bail!(
                        "{} has {has} {} device(s): cannot remove {}",
                        d.site,
                        d.model,
                        d.count
                    );
                }
                let mut left = d.count;
                for pool in file
                    .pools
                    .iter_mut()
                    .rev()
                    .filter(|p| p.model.matches(d.model.as_str()))
                {
                    let take = left.min(pool.count);
                    pool.count -= take;
                    left -= take;
                }
                file.pools.retain(|p| p.count > 0);
                said.push(format!(
                    "remove {} × {} from {} (now {})",
                    d.count,
                    d.model,
                    d.site,
                    has - d.count
                ));
                if out.sites[i].file.pools.is_empty() {
                    out.sites.remove(i);
                } else {
                    refresh(&mut out, i)?;
                }
            }
            Change::Drain(site) => {
                let i = known(&out, site)?;
                out.sites.remove(i);
                said.push(format!("drain {site}: nothing runs there"));
            }
        }
    }
    Ok((out, said))
}

/// The site's advertised pools, from its changed file.
fn refresh(fed: &mut SimFederation, i: usize) -> anyhow::Result<()> {
    let site = &mut fed.sites[i];
    site.pools = site.file.pools()?;
    Ok(())
}

/// The history as simulator jobs, and the jobs left out with why.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    pub jobs: Vec<SimJob>,
    pub skipped: Vec<Skipped>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Skipped {
    pub job: JobId,
    pub why: String,
}

/// Each recorded job arrives when it was submitted, with the spec it was submitted with (its idempotency key
/// made its id, so no two replayed jobs merge), and runs for what it ran: its last attempt's run time once
/// that ended, scaled back to the reference model by the throughput table; for an attempt still running, the
/// longer of its run time so far and the job's `duration_s`; for a job that never ran, its `duration_s`. A job
/// with none of these, or cancelled before it ran, is left out and said so.
pub fn replay_jobs(h: &HistoryView, throughput: &Throughput) -> Replay {
    let mut out = Replay::default();
    for j in &h.jobs {
        let declared = j.spec.duration_s.map(|s| s.saturating_mul(1000));
        let ran = j.runs.last().and_then(|r| {
            let factor = throughput.factor(&r.model);
            let scaled = |ms: u64| (ms as f64 * factor).round() as u64;
            if r.ended {
                (r.runtime_ms > 0).then(|| scaled(r.runtime_ms))
            } else {
                r.started_ms
                    .map(|s| scaled(h.now_ms.saturating_sub(s)).max(declared.unwrap_or(0)))
            }
        });
        let reference = match (ran, declared) {
            (Some(ms), _) => Some(ms),
            (None, _) if j.phase == JobPhase::Cancelled => {
                out.skipped.push(Skipped {
                    job: j.job.clone(),
                    why: "cancelled before it ran".into(),
                });
                continue;
            }
            (None, d) => d,
        };
        let Some(reference_ms) = reference.filter(|ms| *ms > 0) else {
            out.skipped.push(Skipped {
                job: j.job.clone(),
                why: "no run time known: it never ran and gives no duration_s".into(),
            });
            continue;
        };
        let mut spec = j.spec.clone();
        spec.idempotency_key = j.job.to_string();
        out.jobs.push(SimJob {
            trace_models: spec
                .resources
                .models
                .iter()
                .map(|m| m.as_str().to_owned())
                .collect(),
            fixed_runtime: spec.service.is_some(),
            spec,
            arrival_ms: j.submitted_ms,
            reference_ms,
        });
    }
    out
}

/// What `meridian plan` prints.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PlanReport {
    pub days: u64,
    pub from_ms: u64,
    /// Jobs replayed.
    pub jobs: usize,
    pub skipped: Vec<Skipped>,
    pub changes: Vec<String>,
    pub today: RunReport,
    pub changed: RunReport,
}

/// Replays the history on today's federation and on the changed one.
pub fn plan(opts: &PlanOptions, history: &HistoryView) -> anyhow::Result<PlanReport> {
    let today = match (&opts.federation, &history.federation) {
        (Some(file), _) => SimFederation::load(file)?,
        (None, Some(view)) => SimFederation::from_view(view)?,
        (None, None) => anyhow::bail!(
            "this broker does not say what its federation is (an earlier release): give it with --federation FILE"
        ),
    };
    let changes = opts.changes();
    if changes.is_empty() {
        anyhow::bail!("nothing to compare: give --add, --remove or --drain");
    }
    let (changed, said) = apply(&today, &changes)?;
    let replay = replay_jobs(history, &today.throughput);
    let from_ms = history
        .now_ms
        .saturating_sub(opts.days.saturating_mul(DAY_MS));
    let Some(start_ms) = replay.jobs.iter().map(|j| j.arrival_ms).min() else {
        anyhow::bail!(
            "no job submitted in the last {} day(s) can be replayed ({} left out): nothing to compare",
            opts.days,
            replay.skipped.len()
        );
    };
    let tenancy = history.tenancy_toml.as_deref();
    let progress =
        crate::progress::Progress::runs(2, &format!("replaying {} jobs:", replay.jobs.len()));
    let run = |fed: &SimFederation, name: &str| -> anyhow::Result<RunReport> {
        progress.start(&format!("the {name} federation"));
        let out = engine::run(fed, &replay.jobs, &Ranking::AsSubmitted, start_ms, tenancy)?;
        progress.done();
        let checked = checker::check(fed, &replay.jobs, &out.schedule);
        for v in checked.violations.iter().take(5) {
            tracing::warn!("{name}: violation: {v}");
        }
        Ok(run_report(
            name.to_owned(),
            replay.jobs.len(),
            &checked,
            &out,
            tenancy.is_some(),
        ))
    };
    Ok(PlanReport {
        days: opts.days,
        from_ms,
        jobs: replay.jobs.len(),
        skipped: replay.skipped.clone(),
        changes: said,
        today: run(&today, "today")?,
        changed: run(&changed, "changed")?,
    })
}

/// The two runs side by side.
pub fn table(r: &PlanReport) -> String {
    let mut s = format!(
        "what-if over {} job(s) submitted in the last {} day(s){}\n",
        r.jobs,
        r.days,
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(" ({} left out: {})", r.skipped.len(), r.skipped[0].why)
        }
    );
    for c in &r.changes {
        s.push_str(&format!("  {c}\n"));
    }
    s.push_str(&format!(
        "{:<22} {:>12} {:>12} {:>10}\n",
        "", "TODAY", "CHANGED", "CHANGE"
    ));
    let (a, b) = (&r.today, &r.changed);
    let rows: [(&str, f64, f64); 8] = [
        ("wait p50 (s)", a.wait_p50_s, b.wait_p50_s),
        ("wait p95 (s)", a.wait_p95_s, b.wait_p95_s),
        ("cost (USD)", a.cost_usd, b.cost_usd),
        ("energy (kWh)", a.energy_kwh, b.energy_kwh),
        ("carbon (kgCO2e)", a.co2_kg, b.co2_kg),
        (
            "burst share (%)",
            a.cloud_gpu_hours_share * 100.0,
            b.cloud_gpu_hours_share * 100.0,
        ),
        ("never placed", a.unplaced as f64, b.unplaced as f64),
        ("violations", a.violations as f64, b.violations as f64),
    ];
    for (name, x, y) in rows {
        let change = if x == 0.0 {
            if y == 0.0 {
                "=".to_owned()
            } else {
                format!("{:+.1}", y - x)
            }
        } else {
            format!("{:+.1}%", (y / x - 1.0) * 100.0)
        };
        s.push_str(&format!("{name:<22} {x:>12.2} {y:>12.2} {change:>10}\n"));
    }
    s.push_str("figures from the simulator's independent checker; each job under its own policy\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_federation::{HistoryJob, HistoryRun};

    fn history(jobs: Vec<HistoryJob>) -> HistoryView {
        HistoryView {
            now_ms: 100_000,
            tenancy_toml: None,
            jobs,
            federation: None,
        }
    }

    fn job(
        id: &str,
        phase: JobPhase,
        duration_s: Option<u64>,
        runs: Vec<HistoryRun>,
    ) -> HistoryJob {
        let mut spec = meridian_federation::JobSpec::new(
            meridian_federation::TenantId::new("team").unwrap_or_else(|_| unreachable!("test id")),
            id,
            meridian_federation::JobKind::Batch,
            meridian_federation::Resources::whole(meridian_federation::AcceleratorKind::Gpu, 1),
            "true",
        );
        spec.duration_s = duration_s;
        HistoryJob {
            job: JobId::new(id).unwrap_or_else(|_| unreachable!("test id")),
            phase,
            submitted_ms: 1_000,
            spec,
            runs,
        }
    }

    fn run(model: &str, started: Option<u64>, runtime_ms: u64, ended: bool) -> HistoryRun {
        HistoryRun {
            attempt: 1,
            site: SiteId::new("a").unwrap_or_else(|_| unreachable!("test id")),
            model: ModelName::new(model),
            started_ms: started,
            runtime_ms,
            ended,
        }
    }

    #[test]
    fn history_becomes_jobs_that_run_for_what_they_ran() {
        let mut t = Throughput::default();
        t.insert("H100", 2.0);
        let h = history(vec![
            // Ran 30 s on an H100 (twice the reference): 60 s of reference work.
            job(
                "done",
                JobPhase::Succeeded,
                Some(5),
                vec![run("H100", Some(2_000), 30_000, true)],
            ),
            // Still running since 40 s ago; declared 100 s: the longer counts.
            job(
                "running",
                JobPhase::Running,
                Some(100),
                vec![run("A100", Some(60_000), 0, false)],
            ),
            job(
                "running-long",
                JobPhase::Running,
                Some(10),
                vec![run("A100", Some(60_000), 0, false)],
            ),
            job("waiting", JobPhase::Pending, Some(7), vec![]),
            job("unknown", JobPhase::Pending, None, vec![]),
            job("cancelled", JobPhase::Cancelled, Some(9), vec![]),
        ]);
        let r = replay_jobs(&h, &t);
        let got: Vec<(String, u64)> = r
            .jobs
            .iter()
            .map(|j| (j.spec.idempotency_key.clone(), j.reference_ms))
            .collect();
        assert_eq!(
            got,
            vec![
                ("done".to_owned(), 60_000),
                ("running".to_owned(), 100_000),
                ("running-long".to_owned(), 40_000),
                ("waiting".to_owned(), 7_000),
            ]
        );
        let skipped: Vec<&str> = r.skipped.iter().map(|s| s.job.as_str()).collect();
        assert_eq!(skipped, vec!["unknown", "cancelled"]);
        assert!(r.jobs.iter().all(|j| j.arrival_ms == 1_000));
    }

    fn count(f: &SimFederation, site: &str, model: &str) -> u32 {
        f.sites
            .iter()
            .filter(|s| s.id.as_str() == site)
            .flat_map(|s| s.pools.iter())
            .filter(|p| p.model.matches(model))
            .map(|p| p.count)
            .sum()
    }

    #[test]
    fn changes_add_remove_and_drain_what_they_say_and_refuse_the_impossible() {
        let path = meridian_broker::local::workspace_root().join("configs/sim/federation.toml");
        let fed = SimFederation::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
        let d = |s: &str| parse_devices(s).unwrap_or_else(|e| panic!("{e}"));
        let site = |s: &str| SiteId::new(s).unwrap_or_else(|_| unreachable!("test id"));
        let (changed, said) = apply(
            &fed,
            &[
                Change::Add(d("dc-oregon:H100:32")),
                Change::Add(d("dc-oregon:a100:2")),
                Change::Remove(d("dc-virginia:A100:2")),
                Change::Drain(site("edge-london")),
            ],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(count(&fed, "dc-oregon", "H100"), 3);
        assert_eq!(count(&changed, "dc-oregon", "H100"), 35, "{said:?}");
        // A model the site lacks: a new pool, priced like the federation's first pool of that model.
        assert_eq!(count(&changed, "dc-oregon", "A100"), 2);
        let added = changed
            .sites
            .iter()
            .find(|s| s.id.as_str() == "dc-oregon")
            .map(|s| {
                s.file
                    .pools
                    .iter()
                    .find(|p| p.name.as_str() == "a100-added")
                    .cloned()
            });
        let template = fed
            .sites
            .iter()
            .find_map(|s| s.file.pools.iter().find(|p| p.model.matches("A100")));
        assert_eq!(
            added
                .flatten()
                .map(|p| (p.price_usd_per_hour, p.power_watts)),
            template.map(|p| (p.price_usd_per_hour, p.power_watts))
        );
        assert_eq!(count(&changed, "dc-virginia", "A100"), 4);
        assert!(changed.sites.iter().all(|s| s.id.as_str() != "edge-london"));
        assert_eq!(changed.sites.len(), fed.sites.len() - 1);
        assert_eq!(said.len(), 4);
        // What cannot be done is refused, naming why.
        for (bad, says) in [
            (Change::Add(d("nowhere:H100:1")), "no site nowhere"),
            (Change::Add(d("dc-oregon:TPU9:1")), "no pool of model TPU9"),
            (Change::Remove(d("dc-oregon:H100:4")), "cannot remove 4"),
            (Change::Drain(site("nowhere")), "no site nowhere"),
        ] {
            let e = apply(&fed, &[bad])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(says), "{e}");
        }
    }

    /// A what-if on the federation a broker describes (its sites as advertised, the tables it read) is the
    /// what-if on the federation file it was started from.
    #[test]
    fn a_what_if_on_the_broker_s_federation_is_the_one_on_its_file() {
        let path = meridian_broker::local::workspace_root().join("configs/federation-demo.toml");
        let fed = SimFederation::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
        let (file, base) =
            meridian_broker::local::FederationFile::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
        let read =
            |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{e}"));
        let view = meridian_federation::FederationView {
            sites: fed
                .sites
                .iter()
                .map(|s| meridian_federation::FederationSite {
                    info: s.base.clone(),
                    pools: s.pools.clone(),
                    up: true,
                })
                .collect(),
            regions: file
                .broker
                .regions
                .iter()
                .map(|(name, rel)| (name.clone(), read(base.join(rel))))
                .collect(),
            // The pairs that touch a site's region, as a broker sends them.
            rtt: file
                .broker
                .rtt_table
                .as_deref()
                .and_then(|rel| {
                    meridian_broker::data::data_file(rel).unwrap_or_else(|e| panic!("{e:#}"))
                })
                .map(|p| {
                    let table = meridian_core::latency::RttTable::from_azure_csv(&read(p))
                        .unwrap_or_else(|e| panic!("{e}"));
                    let at: std::collections::BTreeSet<&str> = fed
                        .sites
                        .iter()
                        .filter_map(|s| s.base.rtt_region.as_deref())
                        .collect();
                    table
                        .entries()
                        .filter(|(f, t, _)| at.contains(f) || at.contains(t))
                        .map(|(f, t, ms)| meridian_federation::RttView {
                            from: f.to_owned(),
                            to: t.to_owned(),
                            rtt_ms: ms,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            throughput_toml: file
                .broker
                .throughput
                .as_deref()
                .map(|rel| read(base.join(rel))),
        };
        let from_broker = SimFederation::from_view(&view).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(from_broker.sites.len(), fed.sites.len());
        for (a, b) in fed.sites.iter().zip(&from_broker.sites) {
            assert_eq!(a.id, b.id);
            assert_eq!(a.pools, b.pools, "{}", a.id);
            assert_eq!(a.base, b.base, "{}", a.id);
        }
        // The same what-if, both ways: a few one-GPU jobs, then 8 more H100s at dc-oregon.
        let jobs = (0..6)
            .map(|i| job(&format!("j-{i:06}"), JobPhase::Succeeded, Some(600), vec![]))
            .collect();
        let mut with_view = history(jobs);
        let opts = |federation: Option<std::path::PathBuf>| PlanOptions {
            federation,
            days: 1,
            add: vec![parse_devices("dc-oregon:H100:8").unwrap_or_else(|e| panic!("{e}"))],
            remove: Vec::new(),
            drain: Vec::new(),
        };
        let on_file =
            plan(&opts(Some(path.clone())), &with_view).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            plan(&opts(None), &with_view).is_err(),
            "no file and no federation from the broker: an error"
        );
        with_view.federation = Some(view);
        let on_view = plan(&opts(None), &with_view).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(on_file.jobs, 6);
        assert_eq!(
            serde_json::to_value(&on_file).unwrap_or_default(),
            serde_json::to_value(&on_view).unwrap_or_default()
        );
        // A site the broker counts down is not part of today's federation.
        let mut one_down = with_view.federation.clone().unwrap_or_default();
        one_down.sites[0].up = false;
        let fewer = SimFederation::from_view(&one_down).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(fewer.sites.len(), fed.sites.len() - 1);
    }

    #[test]
    fn device_changes_are_parsed_with_the_field_named() {
        let d = parse_devices("dc-oregon:H100:32").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (d.site.as_str(), d.model.as_str(), d.count),
            ("dc-oregon", "H100", 32)
        );
        for (bad, says) in [
            ("dc-oregon:H100", "SITE:MODEL:COUNT"),
            ("dc-oregon:H100:0", "at least 1"),
            ("dc-oregon:H100:many", "count"),
            ("dc oregon:H100:1", "site"),
            ("dc-oregon::1", "model"),
        ] {
            let e = parse_devices(bad).err().unwrap_or_default();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
