//! The live work summed up: per queue (counts, why jobs wait, the waiting jobs in the order they are tried), per
//! site, and per place its users are. One pass over the jobs a caller may see, so a dashboard's counts and map
//! cover every live job, not a page of them.

use crate::model::Job;
use crate::quota::Tenancy;
use meridian_federation::{
    FlowView, GeoPoint, JobId, JobPhase, QueueView, QueuedJobView, QueuesRequest, QueuesView,
    SiteId, SiteLoadView, MAX_PAGE,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// Waiting jobs listed per queue when the request does not say.
pub const DEFAULT_HEAD: u32 = 10;

/// The queue a job is counted under: the one it names, else its tenant's name (as the pending gauge does).
pub fn queue_label(job: &Job) -> String {
    job.spec
        .queue
        .as_ref()
        .map_or_else(|| job.spec.tenant.to_string(), |q| q.to_string())
}

/// A job's priority: its class's with a tenancy (the default class when it names none or one not there),
/// 0 without one.
pub fn priority(job: &Job, tenancy: Option<&Tenancy>) -> i32 {
    tenancy.map_or(0, |t| {
        t.priority_of(job.spec.priority.as_deref())
            .unwrap_or(t.default_priority)
    })
}

/// Where a waiting job stands in its queue: higher priority first, then the oldest.
type Rank = (Reverse<i32>, u64, JobId);

/// A waiting job with its rank, ordered by the rank alone.
struct Ranked<'a>(Rank, &'a Job);

impl PartialEq for Ranked<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Ranked<'_> {}

impl PartialOrd for Ranked<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

#[derive(Default)]
struct Tally<'a> {
    view: QueueView,
    /// The first waiting jobs by rank (a max-heap kept to the head's size).
    head: BinaryHeap<Ranked<'a>>,
}

/// Sums up `jobs` (the live jobs the caller may see) as `req` asks.
pub fn queues<'a>(
    jobs: impl IntoIterator<Item = &'a Job>,
    tenancy: Option<&Tenancy>,
    req: &QueuesRequest,
) -> QueuesView {
    let head = req.head.unwrap_or(DEFAULT_HEAD).min(MAX_PAGE) as usize;
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let mut sites: BTreeMap<SiteId, SiteLoadView> = BTreeMap::new();
    let mut flows: BTreeMap<(i64, i64, SiteId), FlowView> = BTreeMap::new();
    for job in jobs {
        if req.tenant.as_ref().is_some_and(|t| t != &job.spec.tenant) {
            continue;
        }
        let label = queue_label(job);
        if req.queue.as_ref().is_some_and(|q| q != &label) {
            continue;
        }
        let t = tallies.entry(label).or_default();
        match job.phase {
            JobPhase::Pending => {
                t.view.pending += 1;
                *t.view
                    .reasons
                    .entry(crate::observe::wait_reason(job).to_owned())
                    .or_default() += 1;
                if head > 0 {
                    let rank = (
                        Reverse(priority(job, tenancy)),
                        job.submitted_ms,
                        job.id.clone(),
                    );
                    let better = t.head.len() < head || t.head.peek().is_some_and(|r| rank < r.0);
                    if better {
                        t.head.push(Ranked(rank, job));
                        if t.head.len() > head {
                            t.head.pop();
                        }
                    }
                }
            }
            JobPhase::Offered | JobPhase::Running => {
                let running = job.phase == JobPhase::Running;
                if running {
                    t.view.running += 1;
                } else {
                    t.view.offered += 1;
                }
                let Some(a) = &job.assignment else {
                    continue;
                };
                let load = sites.entry(a.site.clone()).or_insert_with(|| SiteLoadView {
                    site: a.site.clone(),
                    running: 0,
                    offered: 0,
                });
                if running {
                    load.running += 1;
                } else {
                    load.offered += 1;
                }
                for u in &job.spec.users {
                    let key = (
                        (u.location.lat * 100.0).round() as i64,
                        (u.location.lon * 100.0).round() as i64,
                        a.site.clone(),
                    );
                    flows
                        .entry(key)
                        .or_insert_with(|| FlowView {
                            from: GeoPoint {
                                lat: (u.location.lat * 100.0).round() / 100.0,
                                lon: (u.location.lon * 100.0).round() / 100.0,
                            },
                            site: a.site.clone(),
                            jobs: 0,
                        })
                        .jobs += 1;
                }
            }
            _ => {}
        }
    }
    let queues = tallies
        .into_iter()
        .map(|(label, t)| {
            let mut view = t.view;
            view.queue = label;
            let mut first = t.head.into_vec();
            first.sort();
            view.waiting = first
                .into_iter()
                .enumerate()
                .map(
                    |(i, Ranked((Reverse(priority), _, _), job))| QueuedJobView {
                        position: i as u64 + 1,
                        job: job.id.clone(),
                        tenant: job.spec.tenant.clone(),
                        name: job.spec.name.clone(),
                        priority,
                        milli: job.spec.total_milli(),
                        submitted_at_ms: job.submitted_ms,
                        wait_reason: crate::observe::wait_reason(job).to_owned(),
                        why: job.why.clone(),
                    },
                )
                .collect();
            view
        })
        .collect();
    QueuesView {
        queues,
        sites: sites.into_values().collect(),
        flows: flows.into_values().collect(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testkit::job;
    use meridian_federation::{QueueName, UserLocation};

    fn live(id: &str, phase: JobPhase, submitted: u64) -> Job {
        let mut j = Job::new(JobId::new(id).unwrap(), job(id, 1), submitted);
        j.phase = phase;
        j
    }

    const TENANCY: &str = r#"
default_priority = "normal"
priority_classes = [
  { name = "high", value = 100 },
  { name = "normal", value = 0 },
]
[[queues]]
name = "team-a"
tenant = "team-a"
"#;

    #[test]
    fn every_job_counts_and_the_head_is_in_the_order_jobs_are_tried() {
        let mut jobs: Vec<Job> = (0..50)
            .map(|i| live(&format!("j-{i:06}"), JobPhase::Pending, 1_000 + i))
            .collect();
        jobs[40].spec.priority = Some("high".into());
        jobs[3].unsatisfiable = true;
        let mut running = live("j-000100", JobPhase::Running, 10);
        let london = UserLocation {
            name: None,
            location: GeoPoint {
                lat: 51.5,
                lon: -0.12,
            },
            weight: 1.0,
            rtt_region: None,
        };
        running.spec.users = vec![london.clone(), london];
        running.assignment = Some(crate::model::Assignment {
            site: SiteId::new("eu").unwrap(),
            pool: "gpu".into(),
            tier: meridian_federation::Tier::Owned,
            devices: Vec::new(),
        });
        jobs.push(running);
        let req = QueuesRequest {
            head: Some(3),
            ..QueuesRequest::default()
        };

        // Without a tenancy every priority is 0: the oldest first.
        let v = queues(&jobs, None, &req);
        assert_eq!(v.queues.len(), 1);
        let q = &v.queues[0];
        assert_eq!(q.queue, "team-a");
        assert_eq!((q.pending, q.running, q.offered), (50, 1, 0));
        assert_eq!(q.reasons["not_tried"], 49);
        assert_eq!(q.reasons["no_site_fits"], 1);
        let ids: Vec<&str> = q.waiting.iter().map(|w| w.job.as_str()).collect();
        assert_eq!(ids, ["j-000000", "j-000001", "j-000002"]);
        assert_eq!(
            q.waiting.iter().map(|w| w.position).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(q.waiting[0].milli, 1000);
        assert_eq!(v.sites.len(), 1);
        assert_eq!(v.sites[0].running, 1);
        assert_eq!(v.flows.len(), 1, "two users at one place are one line");
        assert_eq!(v.flows[0].jobs, 2);

        // With a tenancy, the later high-priority job is tried first.
        let t = Tenancy::from_toml(TENANCY).unwrap();
        let v = queues(&jobs, Some(&t), &req);
        let ids: Vec<&str> = v.queues[0].waiting.iter().map(|w| w.job.as_str()).collect();
        assert_eq!(ids, ["j-000040", "j-000000", "j-000001"]);
        assert_eq!(v.queues[0].waiting[0].priority, 100);

        // A filter by queue counts only that queue.
        jobs[10].spec.queue = Some(QueueName::from("other"));
        let only = QueuesRequest {
            queue: Some("other".into()),
            ..QueuesRequest::default()
        };
        let v = queues(&jobs, None, &only);
        assert_eq!(v.queues.len(), 1);
        assert_eq!(v.queues[0].pending, 1);
        assert!(v.sites.is_empty());
    }
}
