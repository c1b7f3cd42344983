//! The EC2 backend: instances created, used and terminated for the attempts the agent accepts.
//!
//! An attempt is pinned to a node of its pool (Meridian packs devices per node); each node of a pool is one
//! instance of the pool's type while any attempt wants it. An attempt's handle names its instance, so a
//! restarted agent finds both again; instances tagged as this site's that no attempt holds after a restart are
//! terminated. The command runs through the launcher (a local process group under the process backend's shim,
//! which stands for the instance's own execution where the launcher is empty).

#![allow(clippy::disallowed_methods)] // I/O at the edge: paces its reads of EC2 and bills by the clock

use super::api::{self, Client, Credentials, Ec2Error, Instance};
use super::{next_after, pool_name, Ec2Settings, Meter, Next, TypeEntry};
use crate::backend::{Attempt, Backend, Found, Handle, ProcessBackend, ProcessSettings, Seen};
use crate::AdapterError;
use meridian_federation::{
    AcceleratorKind, BackendKind, DeviceState, Interconnect, PoolAdvert, PoolName, Sharing,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The tag every instance of a site carries (its value the site's id), and those of its attempt.
const TAG_SITE: &str = "meridian:site";
const TAG_JOB: &str = "meridian:attempt";
const TAG_POOL: &str = "meridian:pool";

/// How often the instances' states are read at most.
const VIEW_EVERY: Duration = Duration::from_millis(1000);
/// How often instances tagged as the site's that no attempt holds are looked for (and terminated).
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// The most time one launch spends waiting out throttling before it moves on (the agent's loop waits for it).
const THROTTLE_BUDGET: Duration = Duration::from_secs(4);
/// The most time one launch spends in all: past it, the offer is refused with what was tried (the agent's loop,
/// heartbeats included, waits for a launch).
const LAUNCH_BUDGET: Duration = Duration::from_secs(8);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What an attempt's handle carries (as JSON): enough for a restarted agent to find its instance.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Ticket {
    name: String,
    region: String,
    instance: String,
    pool: String,
    node: u32,
    /// When the instance was launched (or, taken over from another attempt, when its bill stood then).
    billed_from_ms: u64,
}

impl Ticket {
    fn handle(&self) -> Handle {
        Handle(serde_json::to_string(self).unwrap_or_default())
    }

    fn of(h: &Handle) -> Option<Ticket> {
        serde_json::from_str(&h.0).ok()
    }
}

/// An instance of this site's.
struct Inst {
    region: String,
    slot: (String, u32),
    usd_per_hour: f64,
    address: Option<String>,
    meter: Meter,
    /// The attempts that hold it.
    holders: BTreeSet<String>,
    /// When the last of them let it go.
    idle_since_ms: Option<u64>,
    /// Terminated by this agent (an end then is not a reclaim).
    terminating: bool,
    /// Seen terminated or shutting down.
    gone: Option<String>,
}

/// An attempt's command, its environment and folder, until it is started on its instance; kept beside the
/// process group files (`<name>.launch.json`) so that an agent restarted while the instance booted starts it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Pending {
    command: String,
    env: Vec<(String, String)>,
    dir: std::path::PathBuf,
}

/// An attempt this agent runs.
struct Run {
    ticket: Ticket,
    /// The command, until it is started on the instance.
    pending: Option<Pending>,
    /// Its process, once started.
    process: Option<Handle>,
    cancelled: bool,
}

pub struct Ec2Backend {
    settings: Ec2Settings,
    site: String,
    client: Result<Client, String>,
    process: ProcessBackend,
    /// The allowed types `DescribeInstanceTypes` describes, by pool name.
    types: BTreeMap<String, (TypeEntry, api::InstanceType)>,
    zones: HashMap<String, Vec<String>>,
    instances: HashMap<String, Inst>,
    slots: HashMap<(String, u32), String>,
    runs: HashMap<String, Run>,
    /// The site's instances as last read, and when.
    view: Option<(Instant, HashMap<String, Instance>)>,
    /// Pools advertised full until then: their type could be created nowhere.
    backoff: HashMap<String, Instant>,
    /// When instances no attempt holds were last looked for (first at the first tick, once the attempts an
    /// earlier run left were taken back).
    swept: Option<Instant>,
}

impl Ec2Backend {
    pub fn new(
        settings: Ec2Settings,
        site: &str,
        process: ProcessSettings,
    ) -> Result<Self, AdapterError> {
        settings.check().map_err(AdapterError::Backend)?;
        // The endpoint as AWS's own tools take it: the site file's, else AWS_ENDPOINT_URL_EC2, else
        // AWS_ENDPOINT_URL, else AWS's for each region.
        let endpoint = settings.endpoint.clone().or_else(|| {
            ["AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"]
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        });
        let client = Credentials::from_environment().map(|c| Client::new(endpoint, c));
        Ok(Ec2Backend {
            settings,
            site: site.to_owned(),
            client,
            process: ProcessBackend::new(process),
            types: BTreeMap::new(),
            zones: HashMap::new(),
            instances: HashMap::new(),
            slots: HashMap::new(),
            runs: HashMap::new(),
            view: None,
            backoff: HashMap::new(),
            swept: None,
        })
    }

    fn client(&self) -> Result<&Client, AdapterError> {
        self.client
            .as_ref()
            .map_err(|e| AdapterError::Backend(e.clone()))
    }

    fn call(
        &self,
        region: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, Ec2Error> {
        let client = self
            .client
            .as_ref()
            .map_err(|e| Ec2Error::Transport(e.clone()))?;
        let started = Instant::now();
        let r = client.call(region, action, params);
        tracing::info!(
            target: "meridian::ec2",
            "EC2 {action} in {region}: {} ({} ms)",
            match &r {
                Ok(_) => "ok".to_owned(),
                Err(e) => e.to_string(),
            },
            started.elapsed().as_millis()
        );
        r
    }

    fn zones(&mut self, region: &str) -> Vec<String> {
        if let Some(z) = self
            .settings
            .regions
            .iter()
            .find(|r| r.name == region)
            .filter(|r| !r.zones.is_empty())
        {
            return z.zones.clone();
        }
        if let Some(z) = self.zones.get(region) {
            return z.clone();
        }
        match self
            .call(region, "DescribeAvailabilityZones", &[])
            .and_then(|x| api::parse_zones(&x))
        {
            Ok(z) => {
                self.zones.insert(region.to_owned(), z.clone());
                z
            }
            Err(e) => {
                tracing::warn!("zones of {region}: {e}");
                Vec::new()
            }
        }
    }

    /// Reads the site's instances again, at most once a second.
    fn refresh(&mut self) {
        if self
            .view
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < VIEW_EVERY)
        {
            return;
        }
        let mut all = HashMap::new();
        let regions = self.region_names();
        for region in regions {
            let params = vec![
                ("Filter.1.Name".to_owned(), format!("tag:{TAG_SITE}")),
                ("Filter.1.Value.1".to_owned(), self.site.clone()),
            ];
            match self
                .call(&region, "DescribeInstances", &params)
                .and_then(|x| api::parse_instances(&x))
            {
                Ok(list) => all.extend(list.into_iter().map(|i| (i.id.clone(), i))),
                // A region that did not answer keeps what was last seen of it.
                Err(e) => {
                    tracing::warn!("instances in {region}: {e}");
                    if let Some((_, old)) = &self.view {
                        for (id, i) in old {
                            all.entry(id.clone()).or_insert_with(|| i.clone());
                        }
                    }
                }
            }
        }
        self.view = Some((Instant::now(), all));
    }

    /// The regions instances may be created in, in the order they are tried.
    fn region_names(&self) -> Vec<String> {
        self.settings
            .regions
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    /// An instance of the site's as last read.
    fn seen(&self, id: &str) -> Option<&Instance> {
        self.view.as_ref().and_then(|(_, v)| v.get(id))
    }

    /// Creates an instance of the pool's type for an attempt: spot first where the job allows it and the type
    /// has a spot price, then on-demand; zone by zone, then region by region, as EC2's errors direct.
    fn launch(&mut self, a: &Attempt<'_>) -> Result<(String, Instance), AdapterError> {
        let Some((entry, _)) = self.types.get(a.pool).cloned() else {
            return Err(AdapterError::Backend(format!(
                "pool {} is no instance type of this site's",
                a.pool
            )));
        };
        let mut tried = Vec::new();
        let mut throttled = Duration::ZERO;
        let started = Instant::now();
        let regions = self.region_names();
        'regions: for region in regions {
            let zones = self.zones(&region);
            let mut markets = Vec::new();
            if a.spot && entry.spot_usd_per_hour.is_some() {
                markets.push(true);
            }
            markets.push(false);
            'markets: for spot in markets {
                for zone in &zones {
                    let mut wait = Duration::from_millis(200);
                    loop {
                        if started.elapsed() > LAUNCH_BUDGET {
                            tried.push(format!("gave up after {} s", LAUNCH_BUDGET.as_secs()));
                            break 'regions;
                        }
                        match self.run_instance(&region, zone, &entry.name, spot, a) {
                            Ok(i) => return Ok((region, i)),
                            Err(e) => {
                                let code = e.code().unwrap_or("unreachable").to_owned();
                                tried.push(format!(
                                    "{zone} {}: {code}",
                                    if spot { "spot" } else { "on-demand" }
                                ));
                                match e.code().map_or(Next::Region, next_after) {
                                    Next::Zone => break,
                                    Next::OnDemand => continue 'markets,
                                    Next::Region => continue 'regions,
                                    Next::Later if throttled + wait <= THROTTLE_BUDGET => {
                                        std::thread::sleep(wait);
                                        throttled += wait;
                                        wait *= 2;
                                    }
                                    Next::Later => continue 'regions,
                                    Next::Stop => {
                                        return Err(AdapterError::Backend(format!(
                                            "EC2 refused {} in {zone}: {e}",
                                            entry.name
                                        )))
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Err(AdapterError::Backend(format!(
            "no EC2 capacity for {}: {}",
            entry.name,
            tried.join("; ")
        )))
    }

    fn run_instance(
        &self,
        region: &str,
        zone: &str,
        instance_type: &str,
        spot: bool,
        a: &Attempt<'_>,
    ) -> Result<Instance, Ec2Error> {
        let mut p: Vec<(String, String)> = [
            ("ImageId", self.settings.image_id.as_str()),
            ("InstanceType", instance_type),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("Placement.AvailabilityZone", zone),
            ("InstanceInitiatedShutdownBehavior", "terminate"),
            ("TagSpecification.1.ResourceType", "instance"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let tags = [
            (TAG_SITE, self.site.as_str()),
            (TAG_JOB, a.name),
            (TAG_POOL, a.pool),
            ("Name", &format!("meridian-{}", a.name)),
        ];
        for (i, (k, v)) in tags.iter().enumerate() {
            p.push((
                format!("TagSpecification.1.Tag.{}.Key", i + 1),
                (*k).to_owned(),
            ));
            p.push((
                format!("TagSpecification.1.Tag.{}.Value", i + 1),
                (*v).to_owned(),
            ));
        }
        if spot {
            p.push(("InstanceMarketOptions.MarketType".into(), "spot".into()));
            p.push((
                "InstanceMarketOptions.SpotOptions.SpotInstanceType".into(),
                "one-time".into(),
            ));
            p.push((
                "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior".into(),
                "terminate".into(),
            ));
        }
        let xml = self.call(region, "RunInstances", &p)?;
        api::parse_instances(&xml)?
            .into_iter()
            .next()
            .ok_or_else(|| Ec2Error::Unreadable("RunInstances named no instance".into()))
    }

    fn terminate(&mut self, id: &str) {
        let Some(region) = self
            .instances
            .get(id)
            .map(|i| i.region.clone())
            .or_else(|| self.seen(id).and_then(|i| self.region_of(i)))
        else {
            return;
        };
        let params = vec![("InstanceId.1".to_owned(), id.to_owned())];
        if let Err(e) = self.call(&region, "TerminateInstances", &params) {
            tracing::warn!("terminating {id}: {e}; tried again later");
            return;
        }
        tracing::info!("instance {id} terminated");
        if let Some(i) = self.instances.remove(id) {
            self.slots.remove(&i.slot);
        }
        if let Some((_, v)) = &mut self.view {
            v.remove(id);
        }
    }

    fn region_of(&self, i: &Instance) -> Option<String> {
        self.settings
            .regions
            .iter()
            .find(|r| i.zone.starts_with(&r.name))
            .map(|r| r.name.clone())
    }

    /// The command line that runs an attempt on its instance.
    fn command_on(&self, command: &str, instance: &str, address: &str) -> String {
        if self.settings.launcher.is_empty() {
            return command.to_owned();
        }
        let mut words: Vec<String> = self
            .settings
            .launcher
            .iter()
            .map(|w| {
                quote(
                    &w.replace("{instance}", instance)
                        .replace("{address}", address),
                )
            })
            .collect();
        words.push(quote(command));
        words.join(" ")
    }

    /// Starts an attempt's command once its instance runs.
    fn start_on_instance(&mut self, name: &str) -> Result<(), AdapterError> {
        let Some(run) = self.runs.get_mut(name) else {
            return Ok(());
        };
        let Some(Pending {
            command,
            mut env,
            dir,
        }) = run.pending.take()
        else {
            return Ok(());
        };
        let instance = run.ticket.instance.clone();
        let address = self
            .instances
            .get(&instance)
            .and_then(|i| i.address.clone())
            .unwrap_or_default();
        env.push(("MERIDIAN_INSTANCE_ID".into(), instance.clone()));
        env.push(("MERIDIAN_INSTANCE_REGION".into(), run.ticket.region.clone()));
        let line = self.command_on(&command, &instance, &address);
        let h = self.process.submit(&Attempt {
            name,
            command: &line,
            env,
            dir: &dir,
            tenant: "",
            pool: "",
            model: "",
            devices: 0,
            time_limit_s: None,
            node: 0,
            spot: false,
        })?;
        tracing::info!("attempt {name} started on instance {instance}");
        let _ = std::fs::remove_file(self.launch_file(name));
        if let Some(run) = self.runs.get_mut(name) {
            run.process = Some(h);
        }
        Ok(())
    }

    fn launch_file(&self, name: &str) -> std::path::PathBuf {
        self.process.run_dir().join(format!("{name}.launch.json"))
    }

    /// Lets go of an attempt's instance: idle from now once no attempt holds it.
    fn release(&mut self, name: &str) {
        let Some(run) = self.runs.remove(name) else {
            return;
        };
        if let Some(i) = self.instances.get_mut(&run.ticket.instance) {
            i.holders.remove(name);
            if i.holders.is_empty() {
                i.idle_since_ms = Some(now_ms());
            }
        }
    }

    /// Instances tagged as this site's that no attempt holds (left by an earlier run, or created by a call
    /// whose answer was lost): terminated.
    fn sweep(&mut self) {
        let held: BTreeSet<String> = self.instances.keys().cloned().collect();
        self.view = None;
        self.refresh();
        let orphans: Vec<String> = self
            .view
            .iter()
            .flat_map(|(_, v)| v.values())
            .filter(|i| !i.gone() && !held.contains(&i.id))
            .map(|i| i.id.clone())
            .collect();
        for id in orphans {
            tracing::info!(
                "instance {id} is tagged as this site's and no attempt holds it; terminating it"
            );
            let region = self.seen(&id).and_then(|i| self.region_of(i));
            if let Some(region) = region {
                let params = vec![("InstanceId.1".to_owned(), id.clone())];
                if let Err(e) = self.call(&region, "TerminateInstances", &params) {
                    tracing::warn!("terminating {id}: {e}");
                    continue;
                }
            }
        }
        self.swept = Some(Instant::now());
    }
}

/// One shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Backend for Ec2Backend {
    fn kind(&self) -> BackendKind {
        BackendKind::Ec2
    }

    fn pools(&mut self) -> Result<Option<Vec<PoolAdvert>>, AdapterError> {
        self.client()?;
        let region = self.settings.regions[0].name.clone();
        let mut params = Vec::new();
        for (i, t) in self.settings.instance_types.iter().enumerate() {
            params.push((format!("InstanceType.{}", i + 1), t.name.clone()));
        }
        let described = self
            .call(&region, "DescribeInstanceTypes", &params)
            .and_then(|x| api::parse_instance_types(&x))
            .map_err(|e| AdapterError::Backend(format!("describing the instance types: {e}")))?;
        let mut pools = Vec::new();
        for entry in &self.settings.instance_types {
            let Some(t) = described.iter().find(|t| t.name == entry.name) else {
                return Err(AdapterError::Backend(format!(
                    "backend.ec2.instance_types: {} is no GPU instance type EC2 knows in {region}",
                    entry.name
                )));
            };
            if t.gpus == 0 {
                continue;
            }
            let per_node = t.gpus;
            let count = self.settings.max_devices / per_node * per_node;
            if count == 0 {
                tracing::warn!(
                    "EC2 type {}: {per_node} GPUs an instance, above max_devices ({}); not advertised",
                    t.name,
                    self.settings.max_devices
                );
                continue;
            }
            let per_device = |usd: f64| (usd / f64::from(per_node) * 1e6).round() as u64;
            let name = pool_name(&t.name);
            tracing::info!(
                "EC2 type {}: {} × {} {} ({} MiB each), up to {count} GPUs",
                t.name,
                per_node,
                t.gpu_manufacturer,
                t.gpu_name,
                t.gpu_memory_mib
            );
            pools.push(PoolAdvert {
                name: PoolName::from(name.clone()),
                kind: AcceleratorKind::Gpu,
                vendor: t.gpu_manufacturer.to_ascii_lowercase(),
                model: t.gpu_name.as_str().into(),
                memory_mib: t.gpu_memory_mib,
                count,
                devices_per_node: per_node,
                interconnect: Interconnect::default(),
                power_watts: entry.gpu_power_watts,
                measured_power_watts: None,
                sharing: Sharing::default(),
                price_micro_usd_per_hour: per_device(entry.usd_per_hour),
                spot_price_micro_usd_per_hour: entry.spot_usd_per_hour.map(per_device),
                devices: DeviceState::all_free(count),
            });
            self.types.insert(name, (entry.clone(), t.clone()));
        }
        Ok(Some(pools))
    }

    fn submit(&mut self, a: &Attempt<'_>) -> Result<Handle, AdapterError> {
        std::fs::create_dir_all(a.dir).map_err(AdapterError::Spawn)?;
        let slot = (a.pool.to_owned(), a.node);
        let now = now_ms();
        let reuse = self
            .slots
            .get(&slot)
            .filter(|id| {
                self.instances
                    .get(*id)
                    .is_some_and(|i| !i.terminating && i.gone.is_none())
            })
            .cloned();
        let (region, instance, billed_from_ms) = match reuse {
            Some(id) => {
                let Some(i) = self.instances.get_mut(&id) else {
                    return Err(AdapterError::Backend(format!("instance {id} vanished")));
                };
                i.holders.insert(a.name.to_owned());
                i.idle_since_ms = None;
                tracing::info!("attempt {} takes instance {id}, already running", a.name);
                (i.region.clone(), id, i.meter.billed_to_ms)
            }
            None => {
                let result = self.launch(a);
                let (region, inst) = match result {
                    Ok(x) => x,
                    Err(e) => {
                        let backoff = Duration::from_secs(self.settings.backoff_s);
                        self.backoff
                            .insert(a.pool.to_owned(), Instant::now() + backoff);
                        return Err(e);
                    }
                };
                let usd_per_hour = self.types.get(a.pool).map_or(0.0, |(e, _)| {
                    if inst.spot {
                        e.spot_usd_per_hour.unwrap_or(e.usd_per_hour)
                    } else {
                        e.usd_per_hour
                    }
                });
                tracing::info!(
                    "instance {} ({}, {}{}) created for attempt {}",
                    inst.id,
                    inst.instance_type,
                    inst.zone,
                    if inst.spot { ", spot" } else { "" },
                    a.name
                );
                self.instances.insert(
                    inst.id.clone(),
                    Inst {
                        region: region.clone(),
                        slot: slot.clone(),
                        usd_per_hour,
                        address: inst.private_ip.clone(),
                        meter: Meter::launched(now),
                        holders: [a.name.to_owned()].into(),
                        idle_since_ms: None,
                        terminating: false,
                        gone: None,
                    },
                );
                self.slots.insert(slot, inst.id.clone());
                // The next read of the instances sees the new one.
                self.view = None;
                (region, inst.id, now)
            }
        };
        let ticket = Ticket {
            name: a.name.to_owned(),
            region,
            instance,
            pool: a.pool.to_owned(),
            node: a.node,
            billed_from_ms,
        };
        let handle = ticket.handle();
        let pending = Pending {
            command: a.command.to_owned(),
            env: a.env.clone(),
            dir: a.dir.to_path_buf(),
        };
        let kept = serde_json::to_vec(&pending)
            .map_err(|e| AdapterError::Backend(e.to_string()))
            .and_then(|b| std::fs::write(self.launch_file(a.name), b).map_err(AdapterError::Spawn));
        if let Err(e) = kept {
            tracing::warn!(
                "attempt {}: its launch is not kept for a restart: {e}",
                a.name
            );
        }
        self.runs.insert(
            a.name.to_owned(),
            Run {
                ticket,
                pending: Some(pending),
                process: None,
                cancelled: false,
            },
        );
        Ok(handle)
    }

    fn cancel(&mut self, h: &Handle) {
        let Some(t) = Ticket::of(h) else { return };
        if let Some(run) = self.runs.get_mut(&t.name) {
            run.cancelled = true;
            if let Some(p) = run.process.clone() {
                self.process.cancel(&p);
            }
        }
    }

    fn poll(&mut self, h: &Handle) -> Seen {
        let Some(t) = Ticket::of(h) else {
            return Seen::Interrupted("an attempt handle that names no instance".into());
        };
        let Some((process, cancelled)) = self
            .runs
            .get(&t.name)
            .map(|r| (r.process.clone(), r.cancelled))
        else {
            return Seen::Interrupted(format!("attempt {} is not known here", t.name));
        };
        self.refresh();
        let seen = self.seen(&t.instance).cloned();
        // (An instance not listed yet was created since the last read.)
        let gone = seen.as_ref().filter(|i| i.gone()).map(|i| i.state.clone());
        let ours = self
            .instances
            .get(&t.instance)
            .is_some_and(|i| i.terminating);
        if let Some(state) = gone.filter(|_| !ours) {
            if let Some(i) = self.instances.get_mut(&t.instance) {
                i.gone = Some(state.clone());
            }
            if let Some(p) = &process {
                self.process.cancel(p);
            }
            return Seen::Interrupted(format!(
                "instance {} was {state} by the provider{}",
                t.instance,
                if seen.as_ref().is_some_and(|i| i.spot) {
                    " (spot capacity reclaimed)"
                } else {
                    ""
                }
            ));
        }
        match process {
            Some(p) => self.process.poll(&p),
            None if cancelled => Seen::Ended(143),
            None => {
                if seen.as_ref().is_some_and(|i| i.state == "running") {
                    if let Some(i) = self.instances.get_mut(&t.instance) {
                        if i.address.is_none() {
                            i.address = seen.as_ref().and_then(|s| s.private_ip.clone());
                        }
                    }
                    if let Err(e) = self.start_on_instance(&t.name) {
                        return Seen::Interrupted(format!(
                            "could not start on instance {}: {e}",
                            t.instance
                        ));
                    }
                }
                Seen::Running
            }
        }
    }

    fn adopt(&mut self, h: &Handle) -> Found {
        let Some(t) = Ticket::of(h) else {
            return Found::Stopped("its record names no instance".into());
        };
        self.refresh();
        let seen = self.seen(&t.instance).cloned();
        let path = self.process.run_dir().join(format!("{}.pgid", t.name));
        let process = path.exists().then(|| Handle(path.display().to_string()));
        let Some(inst) = seen.filter(|i| !i.gone()) else {
            if let Some(p) = &process {
                let _ = self.process.adopt(p);
                self.process.forget(p);
            }
            return Found::Stopped(format!(
                "its instance {} is gone (terminated while the agent was away)",
                t.instance
            ));
        };
        // Not started yet (its instance was booting): its launch was kept beside the group files, and it
        // starts once the instance runs. (An instance nothing holds is terminated by the next sweep.)
        let pending = if process.is_none() {
            std::fs::read(self.launch_file(&t.name))
                .ok()
                .and_then(|b| serde_json::from_slice::<Pending>(&b).ok())
        } else {
            None
        };
        let found = match &process {
            Some(p) => self.process.adopt(p),
            None if pending.is_some() => Found::Running,
            None => {
                return Found::Stopped(format!(
                    "attempt {} had not started on instance {} and its launch was not kept",
                    t.name, t.instance
                ))
            }
        };
        let usd_per_hour = self.types.get(&t.pool).map_or(0.0, |(e, _)| e.usd_per_hour);
        let entry = self
            .instances
            .entry(t.instance.clone())
            .or_insert_with(|| Inst {
                region: t.region.clone(),
                slot: (t.pool.clone(), t.node),
                usd_per_hour,
                address: inst.private_ip.clone(),
                meter: Meter::launched(t.billed_from_ms),
                holders: BTreeSet::new(),
                idle_since_ms: None,
                terminating: false,
                gone: None,
            });
        entry.meter.billed_to_ms = entry.meter.billed_to_ms.min(t.billed_from_ms);
        entry.holders.insert(t.name.clone());
        self.slots
            .insert((t.pool.clone(), t.node), t.instance.clone());
        self.runs.insert(
            t.name.clone(),
            Run {
                ticket: t.clone(),
                pending,
                process: process.clone(),
                cancelled: false,
            },
        );
        if found != Found::Running {
            self.release(&t.name);
        }
        found
    }

    fn forget(&mut self, h: &Handle) {
        let Some(t) = Ticket::of(h) else { return };
        let _ = std::fs::remove_file(self.launch_file(&t.name));
        if let Some(p) = self.runs.get(&t.name).and_then(|r| r.process.clone()) {
            self.process.forget(&p);
        }
        self.release(&t.name);
    }

    fn bill(&mut self, h: &Handle, ended_ms: u64) -> Option<(u64, u64)> {
        let t = Ticket::of(h)?;
        let idle_ms = self.settings.idle_s * 1000;
        let i = self.instances.get_mut(&t.instance)?;
        let last = i.holders.iter().all(|n| n == &t.name);
        let idle = if last && i.gone.is_none() { idle_ms } else { 0 };
        Some(i.meter.bill(ended_ms, idle))
    }

    fn tick(&mut self) {
        if self.client.is_ok() && self.swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
            self.sweep();
        }
        let now = now_ms();
        let idle_ms = self.settings.idle_s * 1000;
        let done: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| {
                i.holders.is_empty() && i.idle_since_ms.is_some_and(|s| now >= s + idle_ms)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            if let Some(i) = self.instances.get_mut(&id) {
                i.terminating = true;
                if i.gone.is_some() {
                    let slot = i.slot.clone();
                    self.instances.remove(&id);
                    self.slots.remove(&slot);
                    continue;
                }
            }
            tracing::info!("instance {id} idle for {} s", self.settings.idle_s);
            self.terminate(&id);
        }
    }

    fn shutdown(&mut self) {
        let idle: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| i.holders.is_empty() && i.gone.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            tracing::info!("instance {id} is idle and the agent stops");
            self.terminate(&id);
        }
    }

    fn free(&mut self, pools: &[PoolAdvert]) -> Option<BTreeMap<PoolName, u32>> {
        let now = Instant::now();
        self.backoff.retain(|_, until| *until > now);
        let spent: f64 = self.instances.values().map(|i| i.usd_per_hour).sum();
        let budget = self.settings.max_usd_per_hour.map(|cap| cap - spent);
        let mut free = BTreeMap::new();
        for p in pools {
            let own_free = p.devices.iter().filter(|d| d.used_milli == 0).count() as u32;
            let n = if self.backoff.contains_key(p.name.as_str()) {
                0
            } else {
                match (budget, self.types.get(p.name.as_str())) {
                    // Over the money cap: only nodes whose instance runs already take more work.
                    (Some(left), Some((e, _))) if left < e.usd_per_hour => {
                        let per = p.devices_per_node.max(1);
                        p.devices
                            .iter()
                            .filter(|d| {
                                d.used_milli == 0
                                    && self
                                        .slots
                                        .contains_key(&(p.name.to_string(), d.index / per))
                            })
                            .count() as u32
                    }
                    _ => own_free,
                }
            };
            free.insert(p.name.clone(), n);
        }
        Some(free)
    }

    fn logs(&self, dir: &Path, lines: usize) -> std::io::Result<String> {
        crate::local::tail(&dir.join("output.log"), lines)
    }
}
