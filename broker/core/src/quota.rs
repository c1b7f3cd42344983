//! Queues, quotas and cohorts across the whole federation (pure).
//!
//! A tenant owns queues; each queue has a nominal quota per resource class — an accelerator kind and model
//! (`gpu:H100`) or a kind and any model (`gpu:*`) — counted in milli-devices over every site at once. Queues in
//! a cohort lend their idle quota to each other: a queue may run beyond its nominal quota (borrow, up to its
//! borrowing limit) while the cohort as a whole stays within the sum of its members' quotas. A lender whose own
//! work arrives while its quota is lent out reclaims it by preempting borrowers' jobs — only from queues above
//! their nominal quota, lowest priority first, checkpointable jobs first, the most recently started first. A
//! queue at its quota may also preempt its own jobs of lower priority.
//!
//! A class that no queue of the cohort names is not limited.

use super::error::{config, CoreError};
use super::Millis;
use meridian_federation::{
    AcceleratorKind, JobId, ModelName, PoolName, QueueName, SiteId, TenantId,
};
use std::collections::{BTreeMap, BTreeSet};

/// A resource class quotas count against: an accelerator kind and model (`gpu:H100`) or a kind and any model
/// (`gpu:*`). Ordered as its text. Models match in any case (as placement matches them), so a class keeps its
/// model in upper case: `gpu:h100` in a tenancy file, a job asking for `h100` and an `H100` pool are one class.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Class(String);

impl Class {
    /// The class of `model` devices of `kind` (`*` for any model).
    pub fn of(kind: AcceleratorKind, model: &str) -> Class {
        Class(format!("{}:{}", kind.as_str(), model.to_ascii_uppercase()))
    }

    /// The class of every model of `kind`.
    pub fn any(kind: AcceleratorKind) -> Class {
        Class::of(kind, "*")
    }

    /// Reads `KIND:MODEL` or `KIND:*` as a tenancy file writes it.
    fn parse(s: &str) -> Result<Class, String> {
        let (kind, model) = s
            .split_once(':')
            .ok_or_else(|| format!("class {s:?}: expected KIND:MODEL or KIND:*"))?;
        if !matches!(kind, "gpu" | "npu" | "dpu" | "cpu") {
            return Err(format!("class {s:?}: kind must be gpu, npu, dpu or cpu"));
        }
        if model.is_empty() {
            return Err(format!("class {s:?}: empty model (use * for any)"));
        }
        Ok(Class(format!("{kind}:{}", model.to_ascii_uppercase())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for Class {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The classes a share of a pool of `kind`/`model` counts against: its model's and its kind's.
pub fn classes_of(kind: AcceleratorKind, model: &str) -> [Class; 2] {
    [Class::of(kind, model), Class::any(kind)]
}

/// The tenancy file (TOML): priority classes and queues.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenancyFile {
    #[serde(default)]
    pub priority_classes: Vec<PriorityClassFile>,
    /// The priority class of a job that names none.
    #[serde(default)]
    pub default_priority: Option<String>,
    #[serde(default)]
    pub queues: Vec<QueueFile>,
    /// At most one per tenant.
    #[serde(default)]
    pub budgets: Vec<super::budget::BudgetFile>,
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorityClassFile {
    pub name: String,
    /// Higher runs first and may preempt lower.
    pub value: i32,
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueFile {
    pub name: String,
    pub tenant: String,
    #[serde(default)]
    pub cohort: Option<String>,
    /// Nominal quota per class, in devices (fractions allowed: 0.5 = 500 milli).
    #[serde(default)]
    pub quota: BTreeMap<String, f64>,
    /// The most this queue may borrow beyond its quota, per class, in devices (unlimited when absent).
    #[serde(default)]
    pub borrowing_limit: BTreeMap<String, f64>,
    /// Caps at single sites: site id → class → devices this queue may hold there at most.
    #[serde(default)]
    pub site_caps: BTreeMap<String, BTreeMap<String, f64>>,
    /// The placement policy of the queue's jobs that name none (`"green"`, `{ carbon_price_usd_per_t = 190 }`,
    /// `{ max_cost_premium = 0.05 }`, …). (Durable format 4.)
    #[serde(default)]
    pub policy: Option<meridian_federation::Policy>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Queue {
    pub name: QueueName,
    pub tenant: TenantId,
    pub cohort: Option<String>,
    pub nominal: BTreeMap<Class, u64>,
    pub borrowing_limit: BTreeMap<Class, u64>,
    pub site_caps: BTreeMap<SiteId, BTreeMap<Class, u64>>,
    /// The policy of its jobs that name none.
    pub policy: Option<meridian_federation::Policy>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tenancy {
    pub queues: BTreeMap<QueueName, Queue>,
    pub priorities: BTreeMap<String, i32>,
    pub default_priority: i32,
    pub budgets: BTreeMap<TenantId, super::budget::Budget>,
}

fn milli(class: &Class, devices: f64, what: &str) -> Result<u64, String> {
    if !devices.is_finite() || devices < 0.0 {
        return Err(format!(
            "{what} for {class}: {devices} is not a number of devices"
        ));
    }
    Ok((devices * 1000.0).round() as u64)
}

impl Tenancy {
    /// Reads a tenancy file; errors name the queue and field.
    pub fn from_toml(text: &str) -> Result<Tenancy, CoreError> {
        Self::parse(text).map_err(config)
    }

    fn parse(text: &str) -> Result<Tenancy, String> {
        let file: TenancyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut t = Tenancy::default();
        for p in &file.priority_classes {
            if t.priorities.insert(p.name.clone(), p.value).is_some() {
                return Err(format!("priority class {:?} is defined twice", p.name));
            }
        }
        if let Some(d) = &file.default_priority {
            t.default_priority = *t
                .priorities
                .get(d)
                .ok_or_else(|| format!("default_priority {d:?} is not a priority class"))?;
        }
        for q in &file.queues {
            let at = |e: String| format!("queue {:?}: {e}", q.name);
            let tenant = TenantId::new(&q.tenant).map_err(|e| at(format!("tenant: {e}")))?;
            let mut nominal = BTreeMap::new();
            for (c, d) in &q.quota {
                let c = Class::parse(c).map_err(at)?;
                nominal.insert(c.clone(), milli(&c, *d, "quota").map_err(at)?);
            }
            let mut borrowing_limit = BTreeMap::new();
            for (c, d) in &q.borrowing_limit {
                let c = Class::parse(c).map_err(at)?;
                borrowing_limit.insert(c.clone(), milli(&c, *d, "borrowing_limit").map_err(at)?);
            }
            let mut site_caps = BTreeMap::new();
            for (site, caps) in &q.site_caps {
                let id =
                    SiteId::new(site).map_err(|e| at(format!("site_caps: site {site:?}: {e}")))?;
                let mut m = BTreeMap::new();
                for (c, d) in caps {
                    let c = Class::parse(c).map_err(at)?;
                    m.insert(c.clone(), milli(&c, *d, "site cap").map_err(at)?);
                }
                site_caps.insert(id, m);
            }
            if let Some((field, problem)) = q.policy.as_ref().and_then(|p| p.problem()) {
                return Err(at(format!("{field}: {problem}")));
            }
            let queue = Queue {
                name: QueueName::from(q.name.as_str()),
                tenant,
                cohort: q.cohort.clone(),
                nominal,
                borrowing_limit,
                site_caps,
                policy: q.policy.clone(),
            };
            if t.queues
                .insert(QueueName::from(q.name.as_str()), queue)
                .is_some()
            {
                return Err(format!("queue {:?} is defined twice", q.name));
            }
        }
        for b in &file.budgets {
            let budget = super::budget::Budget::from_file(b).map_err(|e| e.to_string())?;
            if t.budgets.insert(budget.tenant.clone(), budget).is_some() {
                return Err(format!("tenant {:?} has two budgets", b.tenant));
            }
        }
        Ok(t)
    }

    /// The queue a job of `tenant` naming `queue` (or none: the queue named after the tenant) goes to.
    pub fn queue_of(
        &self,
        tenant: &TenantId,
        queue: Option<&QueueName>,
    ) -> Result<&Queue, CoreError> {
        let name = queue.map_or(tenant.as_str(), QueueName::as_str);
        let q = self.queues.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.queues.keys().map(QueueName::as_str).collect();
            CoreError::UnknownQueue {
                queue: name.into(),
                known: known.join(", "),
            }
        })?;
        if &q.tenant != tenant {
            return Err(CoreError::ForeignQueue {
                queue: name.into(),
                owner: q.tenant.clone(),
                tenant: tenant.clone(),
            });
        }
        Ok(q)
    }

    pub fn priority_of(&self, name: Option<&str>) -> Result<i32, CoreError> {
        match name {
            None => Ok(self.default_priority),
            Some(n) => self.priorities.get(n).copied().ok_or_else(|| {
                let known: Vec<&str> = self.priorities.keys().map(String::as_str).collect();
                CoreError::UnknownPriority {
                    class: n.to_owned(),
                    known: known.join(", "),
                }
            }),
        }
    }

    /// The queues sharing quota with `queue` (itself included).
    fn cohort<'a>(&'a self, queue: &'a Queue) -> Vec<&'a Queue> {
        match &queue.cohort {
            None => vec![queue],
            Some(c) => self
                .queues
                .values()
                .filter(|q| q.cohort.as_deref() == Some(c.as_str()))
                .collect(),
        }
    }
}

/// A job that holds devices, as quota accounting sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Holding {
    pub job: JobId,
    pub queue: QueueName,
    /// Where it holds them.
    pub site: SiteId,
    pub priority: i32,
    pub checkpointable: bool,
    /// When its current attempt was offered (the most recent are preempted first).
    pub since_ms: Millis,
    /// Milli-devices per class.
    pub usage: BTreeMap<Class, u64>,
}

/// What quota decisions look at: the jobs holding devices, their use per (queue, class), and the demand of the
/// jobs waiting, by queue. Computed once per scheduling pass and again after each change it covers.
#[derive(Clone, Debug, Default)]
pub struct QuotaView {
    pub holdings: Vec<Holding>,
    pub usage: BTreeMap<(QueueName, Class), u64>,
    pub waiting: Vec<(QueueName, BTreeMap<Class, u64>)>,
}

impl QuotaView {
    pub fn new(holdings: Vec<Holding>, waiting: Vec<(QueueName, BTreeMap<Class, u64>)>) -> Self {
        QuotaView {
            usage: usage(&holdings),
            holdings,
            waiting,
        }
    }
}

/// Milli-devices in use per (queue, class).
pub fn usage(holdings: &[Holding]) -> BTreeMap<(QueueName, Class), u64> {
    let mut u = BTreeMap::new();
    for h in holdings {
        for (c, m) in &h.usage {
            *u.entry((h.queue.clone(), c.clone())).or_default() += m;
        }
    }
    u
}

/// The pools a job of `queue` taking `milli` must not be placed in, because the queue's cap at their site
/// (for the pool's class) would be exceeded. `pools` lists (site, pool, kind, model).
pub fn capped_pools<'a>(
    queue: &Queue,
    holdings: &[Holding],
    pools: impl IntoIterator<Item = (&'a SiteId, &'a PoolName, AcceleratorKind, &'a ModelName)>,
    milli: u64,
) -> Vec<(SiteId, PoolName)> {
    if queue.site_caps.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (site, pool, kind, model) in pools {
        let Some(caps) = queue.site_caps.get(site) else {
            continue;
        };
        let over = classes_of(kind, model.as_str()).iter().any(|c| {
            caps.get(c).is_some_and(|cap| {
                let used: u64 = holdings
                    .iter()
                    .filter(|h| h.queue == queue.name && &h.site == site)
                    .filter_map(|h| h.usage.get(c))
                    .sum();
                used + milli > *cap
            })
        });
        if over {
            out.push((site.clone(), pool.clone()));
        }
    }
    out
}

/// What quota says about a job that placement could put somewhere now.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    Admit,
    /// Admit after stopping these jobs (requeued), for the stated reason.
    Preempt {
        victims: Vec<JobId>,
        reason: String,
        /// Whether any of it reclaims quota lent to the cohort (else: priority within the queue).
        reclaim: bool,
    },
    /// Wait: which quota holds it, in words.
    Wait(String),
}

fn devices(m: u64) -> String {
    format!("{}.{:03}", m / 1000, m % 1000)
}

/// Decides whether a job of `queue` with `priority` may take `demand` (milli-devices per class) given what
/// runs now.
///
/// `waiting` lists the demand of pending jobs by queue: a queue does not borrow while another queue of its
/// cohort has work waiting that its own quota covers (the borrowed share would only be preempted again).
pub fn admit(
    tenancy: &Tenancy,
    view: &QuotaView,
    queue: &Queue,
    priority: i32,
    demand: &BTreeMap<Class, u64>,
) -> Admission {
    let (holdings, waiting, used) = (&view.holdings, &view.waiting, &view.usage);
    let used_by =
        |q: &QueueName, c: &Class| used.get(&(q.clone(), c.clone())).copied().unwrap_or(0);
    let cohort = tenancy.cohort(queue);
    let mut victims: BTreeSet<JobId> = BTreeSet::new();
    let mut reasons = Vec::new();
    let mut reclaim = false;
    for (class, &d) in demand {
        if !cohort.iter().any(|q| q.nominal.contains_key(class)) {
            continue; // nobody limits this class
        }
        let nominal = queue.nominal.get(class).copied().unwrap_or(0);
        let own = used_by(&queue.name, class);
        let total_nominal: u64 = cohort
            .iter()
            .map(|q| q.nominal.get(class).copied().unwrap_or(0))
            .sum();
        let total_used: u64 = cohort.iter().map(|q| used_by(&q.name, class)).sum();
        let borrow = (own + d).saturating_sub(nominal);
        if let Some(limit) = queue.borrowing_limit.get(class) {
            if borrow > *limit {
                return Admission::Wait(format!(
                    "waiting for quota: queue {} would borrow {} {class} beyond its quota of {}, over its borrowing limit of {}",
                    queue.name,
                    devices(borrow),
                    devices(nominal),
                    devices(*limit)
                ));
            }
        }
        if borrow > 0 {
            let lender = waiting.iter().find(|(q, w)| {
                q != &queue.name
                    && cohort.iter().any(|c| &c.name == q)
                    && w.get(class).is_some_and(|m| {
                        let n = tenancy
                            .queues
                            .get(q)
                            .and_then(|x| x.nominal.get(class))
                            .copied()
                            .unwrap_or(0);
                        used_by(q, class) + m <= n
                    })
            });
            if let Some((q, _)) = lender {
                return Admission::Wait(format!(
                    "waiting for quota: queue {} has {class} work waiting within its own quota; queue {} does not borrow meanwhile",
                    q, queue.name
                ));
            }
        }
        if total_used + d <= total_nominal {
            continue; // within the cohort's quota (borrowing what others leave idle, if need be)
        }
        let short = total_used + d - total_nominal;
        let reclaiming = own + d <= nominal;
        let chosen = if reclaiming {
            // Within its own quota: take back what it lent.
            let excess: BTreeMap<&str, u64> = cohort
                .iter()
                .filter(|q| q.name != queue.name)
                .map(|q| {
                    let n = q.nominal.get(class).copied().unwrap_or(0);
                    (q.name.as_str(), used_by(&q.name, class).saturating_sub(n))
                })
                .collect();
            pick(
                holdings,
                class,
                short,
                |h| h.queue != queue.name && excess.get(h.queue.as_str()).is_some_and(|e| *e > 0),
                &excess,
            )
            .map(|v| {
                (
                    v,
                    format!(
                        "reclaiming {class} quota queue {} lent to its cohort",
                        queue.name
                    ),
                )
            })
        } else {
            // At or over its own quota: only its own lower-priority work can make room.
            let own_excess: BTreeMap<&str, u64> = [(queue.name.as_str(), u64::MAX)].into();
            pick(
                holdings,
                class,
                short,
                |h| h.queue == queue.name && h.priority < priority,
                &own_excess,
            )
            .map(|v| {
                (
                    v,
                    format!(
                        "a higher-priority job of queue {} needs its {class} quota",
                        queue.name
                    ),
                )
            })
        };
        match chosen {
            Some((v, why)) => {
                victims.extend(v);
                reasons.push(why);
                reclaim |= reclaiming;
            }
            None => {
                let cohort = match &queue.cohort {
                    Some(c) => format!(
                        "; cohort {c} uses {} of {}",
                        devices(total_used),
                        devices(total_nominal)
                    ),
                    None => String::new(),
                };
                return Admission::Wait(format!(
                    "waiting for quota: queue {} uses {} of its {} {class}{cohort}; {} short",
                    queue.name,
                    devices(own),
                    devices(nominal),
                    devices(short)
                ));
            }
        }
    }
    if victims.is_empty() {
        Admission::Admit
    } else {
        Admission::Preempt {
            victims: victims.into_iter().collect(),
            reason: reasons.join("; "),
            reclaim,
        }
    }
}

/// Jobs to stop so that at least `short` milli of `class` is freed: among `eligible` holdings, lowest priority,
/// checkpointable, most recent first, never taking a queue below its nominal quota (`excess` = how far each
/// queue is above it). `None` if they cannot free enough.
fn pick(
    holdings: &[Holding],
    class: &Class,
    short: u64,
    eligible: impl Fn(&Holding) -> bool,
    excess: &BTreeMap<&str, u64>,
) -> Option<Vec<JobId>> {
    let mut candidates: Vec<&Holding> = holdings
        .iter()
        .filter(|h| eligible(h) && h.usage.get(class).is_some_and(|m| *m > 0))
        .collect();
    candidates.sort_by_key(|h| {
        (
            h.priority,
            !h.checkpointable,
            std::cmp::Reverse(h.since_ms),
            std::cmp::Reverse(h.job.clone()),
        )
    });
    let mut left: BTreeMap<&str, u64> = excess.clone();
    let mut freed = 0;
    let mut out = Vec::new();
    for h in candidates {
        if freed >= short {
            break;
        }
        let m = h.usage.get(class).copied().unwrap_or(0);
        let room = left.get(h.queue.as_str()).copied().unwrap_or(0);
        if m > room {
            continue;
        }
        left.insert(h.queue.as_str(), room.saturating_sub(m));
        freed += m;
        out.push(h.job.clone());
    }
    (freed >= short).then_some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_tenancy_file_reads() {
        let t = super::Tenancy::from_toml(include_str!("../../../configs/tenancy.toml"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.queues.len(), 3);
        assert_eq!(t.priorities.len(), 4);
        assert_eq!(t.default_priority, 100);
        assert_eq!(t.queues["search"].nominal["gpu:H100"], 8000);
        assert_eq!(t.budgets.len(), 1);
    }
}
