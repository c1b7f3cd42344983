//! Whether two reactor states agree on everything durable (liveness, which is not journaled, aside): what the
//! random event-sequence test compares a live reactor with its replica by.

use crate::reactor::State;
use meridian_federation::{JobId, JobPhase};

/// Whether two states agree on everything durable (liveness, which is not journaled, aside); if not, the first
/// field where they differ.
pub(super) fn same(a: &State, b: &State) -> Result<(), String> {
    durable_eq(a, b).map_err(|what| {
        let (x, y) = (
            serde_json::to_value(a.snapshot(0, 0)).unwrap_or_default(),
            serde_json::to_value(b.snapshot(0, 0)).unwrap_or_default(),
        );
        format!("{what}: {}", first_difference(&x, &y, ""))
    })
}

fn first_difference(a: &serde_json::Value, b: &serde_json::Value, path: &str) -> String {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                if k == "last_seen_ms" {
                    continue;
                }
                let w = y.get(k).unwrap_or(&Value::Null);
                if v != w {
                    return first_difference(v, w, &format!("{path}.{k}"));
                }
            }
            format!("{path}: keys differ")
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find(|(_, (v, w))| v != w)
            .map_or(format!("{path}: equal"), |(i, (v, w))| {
                first_difference(v, w, &format!("{path}[{i}]"))
            }),
        _ => format!("{path}: live {a} but replay {b}"),
    }
}

fn durable_eq(a: &State, b: &State) -> Result<(), String> {
    if a.dirty != b.dirty {
        return Err("whether capacity changed since waiting jobs were tried".into());
    }
    if a.next_job != b.next_job || a.format() != b.format() {
        return Err("job counter or format".into());
    }
    if a.tenancy_toml != b.tenancy_toml || a.tenancy_file_toml != b.tenancy_file_toml {
        return Err("tenancy".into());
    }
    if a.services != b.services {
        return Err("services".into());
    }
    if a.intensity != b.intensity {
        return Err("the sites' intensity logs".into());
    }
    // The offered set may hold jobs that left that phase until it is pruned; what it holds in it counts.
    let live = |st: &State, set: &std::collections::BTreeSet<JobId>| -> Vec<JobId> {
        set.iter()
            .filter(|id| {
                st.jobs
                    .get(*id)
                    .is_some_and(|j| j.phase == JobPhase::Offered)
            })
            .cloned()
            .collect()
    };
    if a.by_key != b.by_key || a.waiting != b.waiting || live(a, &a.offered) != live(b, &b.offered)
    {
        return Err("idempotency map, waiting index or offered set".into());
    }
    if a.metered_by_day != b.metered_by_day
        || a.archived_keys != b.archived_keys
        || a.recent_runs != b.recent_runs
        || a.with_runs != b.with_runs
        || a.finished != b.finished
    {
        return Err("metering by day, archived keys, recent runs or their indexes".into());
    }
    for (id, j) in &a.jobs {
        match b.jobs.get(id) {
            Some(k) if k == j => {}
            Some(_) => return Err(format!("job {id}")),
            None => return Err(format!("job {id} missing")),
        }
    }
    if a.jobs.len() != b.jobs.len() {
        return Err("job count".into());
    }
    for (id, s) in &a.sites {
        let Some(t) = b.sites.get(id) else {
            return Err(format!("site {id} missing"));
        };
        let mut t = t.clone();
        t.last_seen_ms = s.last_seen_ms;
        t.inventory_asked_ms = s.inventory_asked_ms;
        if &t != s {
            return Err(format!("site {id}"));
        }
    }
    Ok(())
}
