//! The agent's pure core: which devices are in use and what it answered to each offer. An offer repeated for
//! the same job and attempt gets the same answer and never a second run.

use meridian_federation::{
    AttemptRef, JobId, Offer, OfferOutcome, OfferReply, PoolAdvert, SiteAdvert, SiteInfo,
    WIRE_VERSION,
};
use std::collections::BTreeMap;

/// How many finished attempts are remembered for answering repeats.
const REMEMBERED: usize = 10_000;

/// Why the agent refuses an offer (its text is the reply's `reason`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("offer is for site {0}, this is {1}")]
    OtherSite(meridian_federation::SiteId, meridian_federation::SiteId),
    #[error("site is draining")]
    Draining,
    #[error("no pool {0}")]
    NoPool(meridian_federation::PoolName),
    #[error("pool {0} holds {1} devices")]
    WrongKind(meridian_federation::PoolName, &'static str),
    #[error("no device {0} in pool {1}")]
    NoDevice(u32, meridian_federation::PoolName),
    #[error("device {0} is unhealthy")]
    Unhealthy(u32),
    #[error("device {device} has {free} milli free, offer needs {needs}")]
    Full { device: u32, free: u32, needs: u32 },
    #[error("pool {0} sells no spot capacity")]
    NoSpot(meridian_federation::PoolName),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    pub reply: OfferReply,
    pub pool: meridian_federation::PoolName,
    pub devices: Vec<meridian_federation::DeviceShare>,
    /// Runs on spot capacity: the provider may take it back.
    pub spot: bool,
    /// Holds devices (accepted and not yet finished).
    pub active: bool,
    pub finished_seq: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct AgentCore {
    pub info: SiteInfo,
    pub pools: Vec<PoolAdvert>,
    pub generation: u64,
    pub draining: bool,
    attempts: BTreeMap<(JobId, u32), Attempt>,
    finished: u64,
    /// Changes of the set of attempts held (accepted, adopted, ended): part of the inventory mark.
    pub changes: u64,
    /// Whole devices of each pool that the site's own scheduler has given to work that is not Meridian's:
    /// advertised as in use.
    held_by_site: BTreeMap<meridian_federation::PoolName, u32>,
}

impl AgentCore {
    pub fn new(info: SiteInfo, pools: Vec<PoolAdvert>, draining: bool) -> Self {
        AgentCore {
            info,
            pools,
            generation: 1,
            draining,
            attempts: BTreeMap::new(),
            finished: 0,
            changes: 0,
            held_by_site: BTreeMap::new(),
        }
    }

    pub fn advert(&self, now_ms: u64) -> SiteAdvert {
        let mut pools = self.pools.clone();
        // Devices the site's scheduler gave to others show as in use: the free ones with the highest indices.
        for p in &mut pools {
            let mut held = self.held_by_site.get(&p.name).copied().unwrap_or(0);
            for d in p.devices.iter_mut().rev() {
                if held == 0 {
                    break;
                }
                if d.healthy && d.used_milli == 0 {
                    d.used_milli = 1000;
                    held -= 1;
                }
            }
        }
        SiteAdvert {
            v: WIRE_VERSION,
            site: self.info.clone(),
            pools,
            generation: self.generation,
            draining: self.draining,
            sent_at_ms: now_ms,
        }
    }

    /// Attempts holding devices here.
    /// What the agent reports of its devices: the share of each it has given to jobs, and, for NVIDIA devices,
    /// what NVML read (`samples`, by NVML index).
    pub fn metrics(
        &self,
        now_ms: u64,
        samples: &[meridian_adapters::probe::DeviceSample],
    ) -> meridian_federation::SiteMetrics {
        let devices = self
            .pools
            .iter()
            .flat_map(|p| {
                p.devices.iter().map(move |d| {
                    let sample = (p.vendor == "nvidia")
                        .then(|| samples.iter().find(|s| s.index == d.index))
                        .flatten();
                    meridian_federation::DeviceMetrics {
                        pool: p.name.clone(),
                        index: d.index,
                        allocated_milli: d.used_milli.min(1000),
                        utilization: sample.and_then(|s| s.utilization),
                        power_watts: sample.and_then(|s| s.power_watts),
                    }
                })
            })
            .collect();
        meridian_federation::SiteMetrics {
            v: WIRE_VERSION,
            site: self.info.id.clone(),
            sent_at_ms: now_ms,
            devices,
        }
    }

    /// The running spot attempts the provider takes back with a notice naming `pools` (all pools when empty).
    pub fn reclaimed(&self, pools: &[meridian_federation::PoolName]) -> Vec<AttemptRef> {
        self.attempts
            .iter()
            .filter(|(_, a)| a.active && a.spot && (pools.is_empty() || pools.contains(&a.pool)))
            .map(|((job, attempt), _)| AttemptRef {
                job: job.clone(),
                attempt: *attempt,
            })
            .collect()
    }

    pub fn running(&self) -> Vec<AttemptRef> {
        self.attempts
            .iter()
            .filter(|(_, a)| a.active)
            .map(|((job, attempt), _)| AttemptRef {
                job: job.clone(),
                attempt: *attempt,
            })
            .collect()
    }

    /// Answers an offer. Returns the reply and whether the attempt must be started now (only the first time).
    pub fn on_offer(&mut self, offer: &Offer) -> (OfferReply, bool) {
        let key = (offer.job.clone(), offer.attempt);
        if let Some(a) = self.attempts.get(&key) {
            return (a.reply.clone(), false);
        }
        let outcome = match self.check(offer) {
            Ok(()) => OfferOutcome::Accepted,
            Err(refusal) => OfferOutcome::Rejected {
                reason: refusal.to_string(),
            },
        };
        let accepted = outcome == OfferOutcome::Accepted;
        if accepted {
            self.use_devices(&offer.pool, &offer.devices, true);
        }
        let reply = OfferReply {
            v: WIRE_VERSION,
            job: offer.job.clone(),
            attempt: offer.attempt,
            outcome,
            mark: None,
        };
        if accepted {
            self.changes += 1;
        }
        self.attempts.insert(
            key,
            Attempt {
                reply: reply.clone(),
                pool: offer.pool.clone(),
                devices: offer.devices.clone(),
                spot: offer.spec.spot,
                active: accepted,
                finished_seq: (!accepted).then_some(self.finished),
            },
        );
        self.forget_old();
        (reply, accepted)
    }

    fn check(&self, offer: &Offer) -> Result<(), Refusal> {
        if offer.site != self.info.id {
            return Err(Refusal::OtherSite(offer.site.clone(), self.info.id.clone()));
        }
        if self.draining {
            return Err(Refusal::Draining);
        }
        let pool = self
            .pools
            .iter()
            .find(|p| p.name == offer.pool)
            .ok_or_else(|| Refusal::NoPool(offer.pool.clone()))?;
        if pool.kind != offer.spec.resources.kind {
            return Err(Refusal::WrongKind(pool.name.clone(), pool.kind.as_str()));
        }
        if offer.spec.spot && pool.spot_price_micro_usd_per_hour.is_none() {
            return Err(Refusal::NoSpot(pool.name.clone()));
        }
        for share in &offer.devices {
            let d = pool
                .devices
                .iter()
                .find(|d| d.index == share.index)
                .ok_or_else(|| Refusal::NoDevice(share.index, pool.name.clone()))?;
            if !d.healthy {
                return Err(Refusal::Unhealthy(d.index));
            }
            if d.used_milli + share.milli > 1000 {
                return Err(Refusal::Full {
                    device: d.index,
                    free: 1000 - d.used_milli,
                    needs: share.milli,
                });
            }
        }
        Ok(())
    }

    fn use_devices(
        &mut self,
        pool: &meridian_federation::PoolName,
        devices: &[meridian_federation::DeviceShare],
        add: bool,
    ) {
        if let Some(p) = self.pools.iter_mut().find(|p| &p.name == pool) {
            for share in devices {
                if let Some(d) = p.devices.iter_mut().find(|d| d.index == share.index) {
                    d.used_milli = if add {
                        (d.used_milli + share.milli).min(1000)
                    } else {
                        d.used_milli.saturating_sub(share.milli)
                    };
                }
            }
        }
        self.generation += 1;
    }

    /// The attempt ended; its devices are free again.
    pub fn on_finished(&mut self, job: &JobId, attempt: u32) {
        let key = (job.clone(), attempt);
        let Some(a) = self.attempts.get_mut(&key) else {
            return;
        };
        if !a.active {
            return;
        }
        a.active = false;
        a.finished_seq = Some(self.finished);
        self.finished += 1;
        self.changes += 1;
        let (pool, devices) = (a.pool.clone(), a.devices.clone());
        self.use_devices(&pool, &devices, false);
    }

    /// Withdraws an acceptance whose attempt could not be started (its backend could not run it): its devices
    /// are free again, and this offer, and any repeat of it, is answered as refused for `reason`.
    pub fn withdraw(&mut self, job: &JobId, attempt: u32, reason: String) -> OfferReply {
        self.on_finished(job, attempt);
        let reply = OfferReply {
            v: WIRE_VERSION,
            job: job.clone(),
            attempt,
            outcome: OfferOutcome::Rejected { reason },
            mark: None,
        };
        if let Some(a) = self.attempts.get_mut(&(job.clone(), attempt)) {
            a.reply = reply.clone();
        }
        reply
    }

    /// Takes back an attempt an earlier run of this agent accepted and left running (its process outlived the
    /// agent): it holds its devices again, and a repeated offer for it is answered as accepted.
    pub fn adopt(
        &mut self,
        job: &JobId,
        attempt: u32,
        pool: &meridian_federation::PoolName,
        devices: &[meridian_federation::DeviceShare],
        spot: bool,
    ) {
        let key = (job.clone(), attempt);
        if self.attempts.contains_key(&key) {
            return;
        }
        self.use_devices(pool, devices, true);
        self.attempts.insert(
            key,
            Attempt {
                reply: OfferReply {
                    v: WIRE_VERSION,
                    job: job.clone(),
                    attempt,
                    outcome: OfferOutcome::Accepted,
                    mark: None,
                },
                pool: pool.to_owned(),
                devices: devices.to_vec(),
                spot,
                active: true,
                finished_seq: None,
            },
        );
        self.changes += 1;
    }

    pub fn attempt(&self, job: &JobId, attempt: u32) -> Option<&Attempt> {
        self.attempts.get(&(job.clone(), attempt))
    }

    /// What the site's own scheduler reports free (whole devices per pool): the devices it gave to work that
    /// is not Meridian's are advertised as in use. Returns whether that changed.
    pub fn site_reports_free(
        &mut self,
        free: &BTreeMap<meridian_federation::PoolName, u32>,
    ) -> bool {
        let mut changed = false;
        for p in &self.pools {
            let Some(&free) = free.get(&p.name) else {
                continue;
            };
            let own = p.devices.iter().filter(|d| d.used_milli > 0).count() as u32;
            let held = (p.devices.len() as u32)
                .saturating_sub(free)
                .saturating_sub(own);
            let before = self.held_by_site.insert(p.name.clone(), held).unwrap_or(0);
            changed |= before != held;
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// The grid feed's latest text (`[agent] carbon_file`): the site's carbon from now on, if it is a valid
    /// `carbon` object. `Ok(true)` when it changed what the site advertises (a new generation), `Ok(false)` when
    /// it did not; an error says what is wrong with the text, and nothing changes.
    pub fn follow_grid(&mut self, text: &str) -> Result<bool, String> {
        let carbon: meridian_federation::Carbon =
            serde_json::from_str(text).map_err(|e| format!("not a carbon object: {e}"))?;
        let mut info = self.info.clone();
        info.carbon = carbon;
        meridian_federation::validate::Validate::validate(&info).map_err(|e| e.to_string())?;
        if info.carbon == self.info.carbon {
            return Ok(false);
        }
        self.info = info;
        self.generation += 1;
        Ok(true)
    }

    pub fn set_draining(&mut self, draining: bool) {
        if self.draining != draining {
            self.draining = draining;
            self.generation += 1;
        }
    }

    fn forget_old(&mut self) {
        if self.attempts.len() <= REMEMBERED {
            return;
        }
        let cutoff = self.finished.saturating_sub(REMEMBERED as u64 / 2);
        self.attempts
            .retain(|_, a| a.active || a.finished_seq.is_none_or(|s| s >= cutoff));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_site_file;
    use meridian_federation::*;

    fn core() -> AgentCore {
        let f = parse_site_file(
            r#"
id = "s"
kind = "datacenter"
tier = "owned"
latitude = 1.0
longitude = 1.0
pue = 1.2
carbon_g_per_kwh = 100
[[pools]]
name = "gpu"
kind = "gpu"
vendor = "nvidia"
model = "A100"
memory_gib = 80
count = 2
power_watts = 400
shareable = true
price_usd_per_hour = 1.0
"#,
        )
        .expect("site");
        AgentCore::new(
            f.site_info(0).expect("info"),
            f.pools().expect("pools"),
            false,
        )
    }

    #[test]
    fn a_grid_feed_changes_the_advertised_carbon_and_a_bad_one_changes_nothing() {
        let mut c = core();
        let g = c.generation;
        assert_eq!(
            c.follow_grid(r#"{"g_per_kwh": 100}"#),
            Ok(false),
            "the same value"
        );
        assert_eq!(c.generation, g);
        assert_eq!(
            c.follow_grid(r#"{"g_per_kwh": 420, "forecast_start_ms": 0, "forecast": [400, 380]}"#),
            Ok(true)
        );
        assert_eq!(c.generation, g + 1);
        assert_eq!(c.advert(0).site.carbon.g_per_kwh, 420);
        assert_eq!(c.advert(0).site.carbon.forecast, [400, 380]);
        for bad in [r#"{"g_per_kwh": 9000}"#, "not json", r#"{"grams": 1}"#] {
            let e = c.follow_grid(bad).expect_err(bad);
            assert!(!e.is_empty());
            assert_eq!(c.advert(0).site.carbon.g_per_kwh, 420, "{bad}");
            assert_eq!(c.generation, g + 1);
        }
        assert!(c
            .follow_grid(r#"{"g_per_kwh": 9000}"#)
            .unwrap_err()
            .contains("g_per_kwh"));
    }

    fn offer(job: &str, attempt: u32, index: u32, milli: u32) -> Offer {
        Offer {
            v: 1,
            job: JobId::new(job).expect("id"),
            attempt,
            site: SiteId::new("s").expect("id"),
            pool: "gpu".into(),
            devices: vec![DeviceShare { index, milli }],
            spec: JobSpec {
                v: 1,
                tenant: TenantId::new("t").expect("id"),
                idempotency_key: job.into(),
                name: None,
                kind: JobKind::Batch,
                queue: None,
                priority: None,
                resources: Resources {
                    kind: AcceleratorKind::Gpu,
                    models: vec![],
                    count: 1,
                    milli: None,
                    memory_mib: None,
                    model_memory_mib: Default::default(),
                    same_node: false,
                    mig: None,
                },
                replicas: 1,
                duration_s: None,
                max_wait_s: 0,
                window: Default::default(),
                service: None,
                spot: false,
                checkpointable: false,
                constraints: Constraints::default(),
                users: vec![],
                datasets: vec![],
                policy: None,
                run: RunSpec {
                    command: "true".into(),
                    ..RunSpec::default()
                },
            },
            resume_from: None,
        }
    }

    /// Devices the site's scheduler gave to others are advertised in use, besides Meridian's own; the count
    /// follows what the scheduler reports, and an unchanged report changes nothing.
    #[test]
    fn what_the_site_gives_others_is_advertised_in_use() {
        let mut c = core();
        let used = |c: &AgentCore| -> Vec<u32> {
            c.advert(0).pools[0]
                .devices
                .iter()
                .map(|d| d.used_milli)
                .collect()
        };
        let free = |n: u32| BTreeMap::from([(PoolName::from("gpu"), n)]);
        assert!(c.site_reports_free(&free(1)));
        assert_eq!(used(&c), vec![0, 1000]);
        let generation = c.generation;
        assert!(!c.site_reports_free(&free(1)));
        assert_eq!(c.generation, generation);
        // Meridian's own attempt on device 0 is in what Slurm gave out: nothing else is held by the site.
        c.on_offer(&offer("j1", 1, 0, 1000));
        assert!(c.site_reports_free(&free(1)));
        assert_eq!(used(&c), vec![1000, 0]);
        assert!(c.site_reports_free(&free(0)));
        assert_eq!(used(&c), vec![1000, 1000]);
        // The agent's own count of its devices is not changed by it.
        assert_eq!(c.pools[0].devices[1].used_milli, 0);
    }

    #[test]
    fn a_repeated_offer_gets_the_same_answer_and_no_second_start() {
        let mut c = core();
        let (r1, start1) = c.on_offer(&offer("j1", 1, 0, 1000));
        let (r2, start2) = c.on_offer(&offer("j1", 1, 0, 1000));
        assert_eq!(r1.outcome, OfferOutcome::Accepted);
        assert_eq!(r1, r2);
        assert!(start1 && !start2);
        assert_eq!(c.pools[0].devices[0].used_milli, 1000);
    }

    #[test]
    fn spot_is_taken_only_where_sold_and_a_notice_takes_back_only_spot_attempts() {
        let mut c = core();
        let mut spot = offer("j-spot", 1, 0, 500);
        spot.spec.spot = true;
        let (r, start) = c.on_offer(&spot);
        assert!(!start);
        assert!(
            matches!(r.outcome, OfferOutcome::Rejected { ref reason } if reason.contains("no spot")),
            "{r:?}"
        );
        c.pools[0].spot_price_micro_usd_per_hour = Some(400_000);
        let mut spot = offer("j-spot", 2, 0, 500);
        spot.spec.spot = true;
        assert!(c.on_offer(&spot).1);
        assert!(c.on_offer(&offer("j-on-demand", 1, 1, 500)).1);
        let taken = c.reclaimed(&[]);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].job.as_str(), "j-spot");
        assert_eq!(c.reclaimed(&["gpu".into()]), taken);
        assert!(c.reclaimed(&["other".into()]).is_empty());
        c.on_finished(&JobId::new("j-spot").expect("id"), 2);
        assert!(c.reclaimed(&[]).is_empty());
    }

    #[test]
    fn offers_beyond_free_capacity_are_refused_with_a_reason() {
        let mut c = core();
        c.on_offer(&offer("j1", 1, 0, 600));
        let (r, start) = c.on_offer(&offer("j2", 1, 0, 600));
        assert!(!start);
        assert!(
            matches!(r.outcome, OfferOutcome::Rejected { ref reason } if reason.contains("400 milli free"))
        );
        let (r, _) = c.on_offer(&offer("j3", 1, 0, 400));
        assert_eq!(r.outcome, OfferOutcome::Accepted);
        c.on_finished(&JobId::new("j1").expect("id"), 1);
        assert_eq!(c.pools[0].devices[0].used_milli, 400);
        assert_eq!(c.running().len(), 1);
    }

    #[test]
    fn a_draining_site_refuses_new_work() {
        let mut c = core();
        c.set_draining(true);
        let (r, _) = c.on_offer(&offer("j1", 1, 0, 1000));
        assert!(matches!(r.outcome, OfferOutcome::Rejected { .. }));
    }
}
