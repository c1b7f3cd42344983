//! Trace readers (pure: text in, records out) and the weighted city list that gives requests and jobs an
//! origin.
//!
//! Alibaba GPU trace v2023 semantics:
//! - arrival = `creation_time` (seconds from the trace start), mapped onto the simulation's start date;
//! - duration = `deletion_time − scheduled_time`, taken as the run time on the reference model (A100) and scaled
//!   by the throughput table on other models;
//! - rows without `scheduled_time` never ran: they are counted (`never_ran`) and not submitted;
//! - rows with `num_gpu = 0` ask for no accelerator: counted (`cpu_only`) and not submitted;
//! - the request is `num_gpu` whole GPUs, or `gpu_milli` of one GPU when `num_gpu = 1` and `gpu_milli < 1000`;
//!   `gpu_spec` is a `|`-separated list of allowed models (empty = any).

use meridian_federation::{GeoPoint, ModelName};
use std::collections::BTreeMap;

/// One GPU task of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceTask {
    pub name: String,
    pub arrival_s: u64,
    pub duration_s: u64,
    pub gpus: u32,
    pub milli: Option<u32>,
    pub models: Vec<String>,
    pub qos: String,
}

/// What a trace file held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub tasks: Vec<TraceTask>,
    pub never_ran: usize,
    pub cpu_only: usize,
}

/// Why a trace cannot be read: the header, or a row (numbered as a spreadsheet would, the header being 1).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("header: {0}")]
    Header(String),
    #[error("row {line}: {problem}")]
    Row { line: usize, problem: String },
}

/// Parses an Alibaba v2023 pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
/// creation_time,deletion_time,scheduled_time`). Errors name the row.
pub fn parse_alibaba(text: &str) -> Result<Trace, TraceError> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| TraceError::Header(e.to_string()))?
        .clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| TraceError::Header(format!("no column {name}")))
    };
    let (c_name, c_gpu, c_milli, c_spec, c_qos, c_created, c_deleted, c_sched) = (
        col("name")?,
        col("num_gpu")?,
        col("gpu_milli")?,
        col("gpu_spec")?,
        col("qos")?,
        col("creation_time")?,
        col("deletion_time")?,
        col("scheduled_time")?,
    );
    let mut trace = Trace::default();
    for (i, row) in reader.records().enumerate() {
        let line = i + 2;
        let row = row.map_err(|e| TraceError::Row {
            line,
            problem: e.to_string(),
        })?;
        let get = |c: usize| row.get(c).unwrap_or("").trim();
        let num = |c: usize, what: &str| -> Result<u64, TraceError> {
            get(c).parse::<u64>().map_err(|e| TraceError::Row {
                line,
                problem: format!("{what} {:?}: {e}", get(c)),
            })
        };
        let gpus = num(c_gpu, "num_gpu")? as u32;
        if gpus == 0 {
            trace.cpu_only += 1;
            continue;
        }
        if get(c_sched).is_empty() {
            trace.never_ran += 1;
            continue;
        }
        let scheduled = num(c_sched, "scheduled_time")?;
        let deleted = num(c_deleted, "deletion_time")?;
        let milli = num(c_milli, "gpu_milli")? as u32;
        trace.tasks.push(TraceTask {
            name: get(c_name).to_owned(),
            arrival_s: num(c_created, "creation_time")?,
            duration_s: deleted.saturating_sub(scheduled).max(1),
            gpus,
            milli: (gpus == 1 && milli > 0 && milli < 1000).then_some(milli),
            models: get(c_spec)
                .split('|')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            qos: get(c_qos).to_owned(),
        });
    }
    Ok(trace)
}

/// The model constraint a trace's `gpu_spec` alternatives state: the models allowed, and for each model whose
/// every alternative carries a memory suffix, the least memory they allow (MiB). `V100M32` is a V100 with at least
/// 32 GiB per device; `V100M16|V100M32` is a V100 with at least 16 GiB; `T4|V100M32` is any T4 or a V100 with
/// 32 GiB; the undisclosed models `G1`, `G2`, `G3` are model names like any other.
pub fn model_constraint(alternatives: &[String]) -> (Vec<ModelName>, BTreeMap<ModelName, u64>) {
    let mut models: Vec<ModelName> = Vec::new();
    let mut memory: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for alt in alternatives {
        let (model, gib) = split_memory_suffix(alt);
        if !models.iter().any(|m| m.matches(&model)) {
            models.push(model.as_str().into());
        }
        let entry = memory.entry(model).or_insert(gib);
        *entry = match (*entry, gib) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        };
    }
    let memory = memory
        .into_iter()
        .filter_map(|(m, gib)| gib.map(|g| (ModelName::from(m), g * 1024)))
        .collect();
    (models, memory)
}

/// `V100M32` → (`V100`, 32); a name without a memory suffix is the model itself. A suffix is `M` and digits after
/// a name that ends in a digit (`MI300` and `A100` have none).
fn split_memory_suffix(alt: &str) -> (String, Option<u64>) {
    if let Some(i) = alt.rfind(['M', 'm']) {
        let (head, tail) = (&alt[..i], &alt[i + 1..]);
        let digits = !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit());
        if digits && head.ends_with(|c: char| c.is_ascii_digit()) {
            if let Ok(gib) = tail.parse::<u64>() {
                return (head.to_owned(), Some(gib));
            }
        }
    }
    (alt.to_owned(), None)
}

/// Parses the Azure LLM inference trace (`TIMESTAMP,ContextTokens,GeneratedTokens`) into request times in
/// milliseconds from the first request.
pub fn parse_azure_llm(text: &str) -> Result<Vec<u64>, String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let mut times = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.map_err(|e| format!("row {}: {e}", i + 2))?;
        let ts = row.get(0).unwrap_or("");
        times.push(
            parse_timestamp_ms(ts).ok_or_else(|| format!("row {}: timestamp {ts:?}", i + 2))?,
        );
    }
    times.sort_unstable();
    let first = times.first().copied().unwrap_or(0);
    Ok(times.into_iter().map(|t| t - first).collect())
}

/// `2023-11-16 18:17:03.9799600` → milliseconds since the Unix epoch.
pub fn parse_timestamp_ms(s: &str) -> Option<u64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (hh, mm) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let secs: f64 = t.next()?.parse().ok()?;
    let days = days_from_civil(y, m, day);
    let ms = (days * 86_400 + hh * 3600 + mm * 60) * 1000 + (secs * 1000.0).round() as i64;
    u64::try_from(ms).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// User populations: large metro areas with weights proportional to their population in millions (UN World
/// Urbanization Prospects 2018, rounded). Coordinates come from the city list (wondernetwork-servers); the
/// figures here are that list's values, kept so that a bare clone works.
pub const CITIES: [(&str, f64, f64, f64); 14] = [
    ("NewYork", 18.8, 40.7269, -73.6497),
    ("LosAngeles", 12.5, 34.0522, -118.2428),
    ("Chicago", 8.9, 41.85, -87.65),
    ("Dallas", 6.3, 32.7828, -96.8039),
    ("Washington", 5.2, 38.9694, -77.3864),
    ("Atlanta", 5.6, 33.7489, -84.3881),
    ("Seattle", 3.4, 47.6097, -122.3331),
    ("Toronto", 6.1, 43.6481, -79.4042),
    ("London", 9.0, 51.5171, -0.1062),
    ("Paris", 10.9, 48.8742, 2.347),
    ("Frankfurt", 2.3, 50.1167, 8.6833),
    ("Amsterdam", 1.1, 52.3, 4.7),
    ("Madrid", 6.5, 40.4, -3.6833),
    ("Tokyo", 37.4, 35.6833, 139.7667),
];

/// A deterministic random source (SplitMix64): the same seed gives the same draws on every build.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A float in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index drawn with probability proportional to `weights`.
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut x = self.next_f64() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len().saturating_sub(1)
    }
}

/// A city's name and location.
pub fn city(i: usize) -> (&'static str, GeoPoint) {
    let (name, _, lat, lon) = CITIES[i % CITIES.len()];
    (name, GeoPoint { lat, lon })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibaba_rows_are_read_with_stated_semantics() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
            p0,1,1,1,1000,,LS,Running,0,100,10\n\
            p1,1,1,1,460,V100M16|V100M32,BE,Running,5,50,5\n\
            p2,1,1,0,0,,BE,Running,5,50,5\n\
            p3,1,1,2,1000,,BE,Pending,7,,\n";
        let t = parse_alibaba(text).expect("trace");
        assert_eq!(t.tasks.len(), 2);
        assert_eq!(t.never_ran, 1);
        assert_eq!(t.cpu_only, 1);
        assert_eq!(t.tasks[0].duration_s, 90);
        assert_eq!(t.tasks[1].milli, Some(460));
        assert_eq!(t.tasks[1].models, vec!["V100M16", "V100M32"]);
        let err = parse_alibaba(&text.replace("p0,1,1,1,", "p0,1,1,x,"))
            .expect_err("bad count")
            .to_string();
        assert!(err.contains("row 2"), "{err}");
    }

    #[test]
    fn model_constraints_are_kept_as_the_trace_states_them() {
        let c = |alts: &[&str]| {
            model_constraint(&alts.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        let (models, memory) = c(&["V100M16", "V100M32"]);
        assert_eq!(models, vec!["V100"]);
        assert_eq!(memory.get("V100"), Some(&(16 * 1024)));
        let (models, memory) = c(&["V100M32"]);
        assert_eq!(
            (models, memory.get("V100")),
            (vec![ModelName::from("V100")], Some(&(32 * 1024)))
        );
        let (models, memory) = c(&["T4", "V100M32", "G2"]);
        assert_eq!(models, vec!["T4", "V100", "G2"]);
        assert_eq!(memory.len(), 1);
        assert_eq!(memory.get("V100"), Some(&(32 * 1024)));
        // A V100 named both bare and with memory: any V100 will do.
        let (_, memory) = c(&["V100", "V100M32"]);
        assert!(memory.is_empty());
        let (models, memory) = c(&["G1", "G3", "MI300", "A100"]);
        assert_eq!(models, vec!["G1", "G3", "MI300", "A100"]);
        assert!(memory.is_empty());
    }

    #[test]
    fn azure_timestamps_become_offsets() {
        let times = parse_azure_llm(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.0319600,1,1\n2023-11-16 18:17:03.9799600,1,1\n",
        )
        .expect("trace");
        assert_eq!(times, vec![0, 52]);
        assert_eq!(
            parse_timestamp_ms("2022-01-01 00:00:00.0"),
            Some(1_640_995_200_000)
        );
    }

    #[test]
    fn the_random_source_is_stable() {
        let mut r = SplitMix64::new(1);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        let mut again = SplitMix64::new(1);
        assert_eq!(first, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
        let picks: Vec<usize> = (0..1000).map(|_| r.weighted(&[1.0, 0.0, 3.0])).collect();
        assert!(!picks.contains(&1));
        let threes = picks.iter().filter(|&&p| p == 2).count();
        assert!((650..850).contains(&threes), "{threes}");
    }
}
