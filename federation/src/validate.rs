//! Field checks applied to every decoded message. Each failure names the field (as a path) and the problem.

use crate::error::WireError;
use crate::ids::check_id;
use crate::messages::*;
use std::collections::BTreeSet;

/// A message that can check its own field values.
pub trait Validate {
    /// The message's wire version.
    fn version(&self) -> u32;
    /// Checks field values; the first problem found is returned.
    fn validate(&self) -> Result<(), WireError>;
}

/// Most devices one pool may list.
pub const MAX_DEVICES_PER_POOL: u32 = 4096;
/// Most pools per site.
pub const MAX_POOLS: usize = 64;
/// Most datasets per site or job.
pub const MAX_DATASETS: usize = 1024;
/// Most user locations per job.
pub const MAX_USERS: usize = 1000;
/// Highest price per device-hour accepted, micro-USD (1,000 USD).
pub const MAX_PRICE_MICRO_USD: u64 = 1_000_000_000;
/// Longest command line accepted, bytes.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest expected duration, seconds (one year).
pub const MAX_DURATION_S: u64 = 366 * 24 * 3600;
/// Longest run time an attempt may report, ms (ten years): metered amounts stay far from overflow.
pub const MAX_RUNTIME_MS: u64 = 10 * 366 * 24 * 3600 * 1000;
/// Longest value of one environment variable, bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;

type R = Result<(), WireError>;

fn bad(field: impl Into<String>, problem: impl Into<String>) -> R {
    Err(WireError::invalid(field, problem))
}

fn range_f64(field: &str, v: f64, lo: f64, hi: f64) -> R {
    if !v.is_finite() || v < lo || v > hi {
        return bad(field, format!("{v} is outside {lo}..={hi}"));
    }
    Ok(())
}

fn range_u64(field: &str, v: u64, lo: u64, hi: u64) -> R {
    if v < lo || v > hi {
        return bad(field, format!("{v} is outside {lo}..={hi}"));
    }
    Ok(())
}

fn name(field: &str, s: impl AsRef<str>, max: usize) -> R {
    let s = s.as_ref();
    if s.is_empty() {
        return bad(field, "must not be empty");
    }
    if s.len() > max {
        return bad(
            field,
            format!("is {} bytes long; the limit is {max}", s.len()),
        );
    }
    if s.chars().any(|c| c.is_control()) {
        return bad(field, "contains control characters");
    }
    Ok(())
}

fn token(field: &str, s: impl AsRef<str>) -> R {
    check_id(s.as_ref()).map_err(|p| WireError::invalid(field, p.to_string()))
}

fn count_limit(field: &str, len: usize, max: usize) -> R {
    if len > max {
        return bad(field, format!("has {len} entries; the limit is {max}"));
    }
    Ok(())
}

fn location(field: &str, p: &GeoPoint) -> R {
    range_f64(&format!("{field}.lat"), p.lat, -90.0, 90.0)?;
    range_f64(&format!("{field}.lon"), p.lon, -180.0, 180.0)
}

fn price(field: &str, v: u64) -> R {
    range_u64(field, v, 0, MAX_PRICE_MICRO_USD)
}

macro_rules! versioned {
    ($t:ty) => {
        fn version(&self) -> u32 {
            self.v
        }
    };
}

impl Validate for SiteInfo {
    fn version(&self) -> u32 {
        crate::WIRE_VERSION
    }

    fn validate(&self) -> R {
        location("site.location", &self.location)?;
        range_f64("site.pue", self.pue, 1.0, 5.0)?;
        range_u64(
            "site.carbon.g_per_kwh",
            self.carbon.g_per_kwh.into(),
            0,
            3000,
        )?;
        count_limit(
            "site.carbon.forecast",
            self.carbon.forecast.len(),
            MAX_FORECAST_HOURS,
        )?;
        for (i, g) in self.carbon.forecast.iter().enumerate() {
            range_u64(&format!("site.carbon.forecast[{i}]"), (*g).into(), 0, 3000)?;
        }
        count_limit("site.region_tags", self.region_tags.len(), 64)?;
        for (i, t) in self.region_tags.iter().enumerate() {
            name(&format!("site.region_tags[{i}]"), t, 64)?;
        }
        if let Some(r) = &self.rtt_region {
            name("site.rtt_region", r, 64)?;
        }
        range_u64(
            "site.energy_micro_usd_per_kwh",
            self.energy_micro_usd_per_kwh,
            0,
            MAX_PRICE_MICRO_USD,
        )?;
        price("site.egress_micro_usd_per_gb", self.egress_micro_usd_per_gb)?;
        count_limit("site.datasets", self.datasets.len(), MAX_DATASETS)?;
        for (i, d) in self.datasets.iter().enumerate() {
            name(&format!("site.datasets[{i}].name"), &d.name, 128)?;
        }
        Ok(())
    }
}

impl Validate for SiteAdvert {
    versioned!(SiteAdvert);

    fn validate(&self) -> R {
        self.site.validate()?;
        if self.pools.is_empty() {
            return bad("pools", "a site must advertise at least one pool");
        }
        count_limit("pools", self.pools.len(), MAX_POOLS)?;
        let mut names = BTreeSet::new();
        for (i, p) in self.pools.iter().enumerate() {
            let f = |s: &str| format!("pools[{i}].{s}");
            token(&f("name"), &p.name)?;
            if !names.insert(p.name.as_str()) {
                return bad(f("name"), format!("pool name {:?} is used twice", p.name));
            }
            name(&f("vendor"), &p.vendor, 64)?;
            name(&f("model"), &p.model, 64)?;
            range_u64(&f("count"), p.count.into(), 1, MAX_DEVICES_PER_POOL.into())?;
            range_u64(&f("devices_per_node"), p.devices_per_node.into(), 1, 1024)?;
            range_u64(&f("memory_mib"), p.memory_mib, 0, 16 * 1024 * 1024)?;
            range_u64(&f("power_watts"), p.power_watts.into(), 0, 10_000)?;
            price(&f("price_micro_usd_per_hour"), p.price_micro_usd_per_hour)?;
            if let Some(s) = p.spot_price_micro_usd_per_hour {
                price(&f("spot_price_micro_usd_per_hour"), s)?;
            }
            if p.devices.len() != p.count as usize {
                return bad(
                    f("devices"),
                    format!("lists {} devices but count is {}", p.devices.len(), p.count),
                );
            }
            // Checked before any field's path is written out: an advert's devices are its bulk.
            let mut seen = vec![false; p.devices.len()];
            for (j, d) in p.devices.iter().enumerate() {
                let fresh = seen
                    .get_mut(d.index as usize)
                    .is_some_and(|s| !std::mem::replace(s, true));
                if !fresh {
                    return bad(
                        format!("pools[{i}].devices[{j}].index"),
                        format!("{} is out of range or repeated", d.index),
                    );
                }
                if d.used_milli > 1000 {
                    range_u64(
                        &format!("pools[{i}].devices[{j}].used_milli"),
                        d.used_milli.into(),
                        0,
                        1000,
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl Validate for Heartbeat {
    versioned!(Heartbeat);

    fn validate(&self) -> R {
        count_limit("running", self.running.len(), 100_000)?;
        if let Some(i) = &self.inventory {
            i.validate()?;
        }
        Ok(())
    }
}

impl Validate for SiteMetrics {
    versioned!(SiteMetrics);

    fn validate(&self) -> R {
        count_limit(
            "devices",
            self.devices.len(),
            MAX_POOLS * MAX_DEVICES_PER_POOL as usize,
        )?;
        for (i, d) in self.devices.iter().enumerate() {
            let f = |x: &str| format!("devices[{i}].{x}");
            token(&f("pool"), &d.pool)?;
            range_u64(
                &f("index"),
                u64::from(d.index),
                0,
                u64::from(MAX_DEVICES_PER_POOL),
            )?;
            range_u64(&f("allocated_milli"), u64::from(d.allocated_milli), 0, 1000)?;
            if let Some(u) = d.utilization {
                range_f64(&f("utilization"), u, 0.0, 1.0)?;
            }
            if let Some(p) = d.power_watts {
                range_f64(&f("power_watts"), p, 0.0, 100_000.0)?;
            }
        }
        Ok(())
    }
}

impl Validate for Inventory {
    fn version(&self) -> u32 {
        crate::WIRE_VERSION
    }

    fn validate(&self) -> R {
        if let Some(list) = &self.attempts {
            count_limit("inventory.attempts", list.len(), 100_000)?;
            if list.len() != self.count as usize {
                return bad(
                    "inventory.count",
                    format!("is {} but the list holds {}", self.count, list.len()),
                );
            }
        }
        Ok(())
    }
}

impl Validate for InventoryRequest {
    versioned!(InventoryRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for BrokerHello {
    versioned!(BrokerHello);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for ServiceSpec {
    versioned!(ServiceSpec);

    fn validate(&self) -> R {
        token("name", &self.name)?;
        if let Some(q) = &self.queue {
            token("queue", q)?;
        }
        if let Some(p) = &self.priority {
            token("priority", p)?;
        }
        let t = &self.throughput;
        match (t.requests_per_s, t.tokens_per_s) {
            (Some(x), None) => range_f64("throughput.requests_per_s", x, 1e-6, 1e9)?,
            (None, Some(x)) => range_f64("throughput.tokens_per_s", x, 1e-6, 1e12)?,
            _ => {
                return bad(
                    "throughput",
                    "give exactly one of requests_per_s and tokens_per_s",
                )
            }
        }
        range_f64("slo_ms", self.slo_ms, 1.0, 10_000.0)?;
        range_u64("max_replicas", self.max_replicas.into(), 1, 10_000)?;
        if self.min_replicas > self.max_replicas {
            return bad(
                "min_replicas",
                format!(
                    "{} is above max_replicas {}",
                    self.min_replicas, self.max_replicas
                ),
            );
        }
        range_u64("scale_up_delay_s", self.scale_up_delay_s, 0, 24 * 3600)?;
        range_u64(
            "scale_down_delay_s",
            self.scale_down_delay_s,
            0,
            7 * 24 * 3600,
        )?;
        range_u64("demand_window_s", self.demand_window_s, 1, 3600)?;
        range_f64("target_utilization", self.target_utilization, 0.05, 1.0)?;
        if let Some(Policy::Weights(_)) = &self.policy {
            return bad(
                "policy",
                "a service takes cost, green, balanced, latency, carbon_price_usd_per_t or \
                 max_cost_premium, not weights",
            );
        }
        // A replica is a job: its resources, constraints and command are checked as a job's are.
        self.replica_spec(0).validate()
    }
}

impl Validate for JobSpec {
    versioned!(JobSpec);

    fn validate(&self) -> R {
        name("idempotency_key", &self.idempotency_key, 128)?;
        if self.idempotency_key.chars().any(char::is_whitespace) {
            return bad("idempotency_key", "must not contain whitespace");
        }
        if let Some(n) = &self.name {
            name("name", n, 128)?;
        }
        if let Some(q) = &self.queue {
            token("queue", q)?;
        }
        if let Some(svc) = &self.service {
            token("service", svc)?;
        }
        if let Some(p) = &self.priority {
            token("priority", p)?;
        }
        let r = &self.resources;
        if let Some(profile) = &r.mig {
            if crate::messages::mig_milli(profile).is_none() {
                return bad(
                    "resources.mig",
                    format!("{profile:?} is not a profile like 1g.10gb (1 to 7 slices)"),
                );
            }
            if r.milli.is_some() || r.count > 1 {
                return bad(
                    "resources.mig",
                    "a MIG slice is instead of `milli` and whole devices",
                );
            }
        }
        match r.milli.or(r.mig.as_ref().map(|_| 1)) {
            Some(m) => {
                range_u64("resources.milli", m.into(), 1, 999)?;
                if r.count > 1 {
                    return bad(
                        "resources.count",
                        "a milli-share asks for part of one device; count must be 0 or 1",
                    );
                }
            }
            None => range_u64("resources.count", r.count.into(), 1, 4096)?,
        }
        count_limit("resources.models", r.models.len(), 64)?;
        for (i, m) in r.models.iter().enumerate() {
            name(&format!("resources.models[{i}]"), m, 64)?;
        }
        for (m, mib) in &r.model_memory_mib {
            let field = format!("resources.model_memory_mib.{m}");
            if !r.models.iter().any(|x| x.matches(m.as_str())) {
                return bad(
                    field,
                    format!("{m:?} is not one of resources.models {:?}", r.models),
                );
            }
            range_u64(&field, *mib, 1, 16 << 20)?;
        }
        range_u64("replicas", self.replicas.into(), 1, 1024)?;
        if let Some(d) = self.duration_s {
            range_u64("duration_s", d, 1, MAX_DURATION_S)?;
        }
        range_u64("max_wait_s", self.max_wait_s, 0, 30 * 24 * 3600)?;
        if let (Some(start), Some(deadline)) = (self.window.start_after_ms, self.window.deadline_ms)
        {
            if deadline <= start {
                return bad(
                    "window.deadline_ms",
                    format!("{deadline} is not after window.start_after_ms {start}"),
                );
            }
        }
        let c = &self.constraints;
        if let Some(res) = &c.residency {
            token("constraints.residency", res)?;
        }
        if let Some(cap) = c.price_cap_micro_usd_per_hour {
            price("constraints.price_cap_micro_usd_per_hour", cap)?;
        }
        count_limit("constraints.sites", c.sites.len(), 10_000)?;
        count_limit("users", self.users.len(), MAX_USERS)?;
        for (i, u) in self.users.iter().enumerate() {
            location(&format!("users[{i}].location"), &u.location)?;
            range_f64(&format!("users[{i}].weight"), u.weight, 1e-9, 1e9)?;
        }
        count_limit("datasets", self.datasets.len(), 64)?;
        for (i, d) in self.datasets.iter().enumerate() {
            name(&format!("datasets[{i}].name"), &d.name, 128)?;
        }
        if let Some(Policy::Weights(w)) = &self.policy {
            let all = [
                ("cost", w.cost),
                ("energy", w.energy),
                ("carbon", w.carbon),
                ("latency", w.latency),
                ("data", w.data),
            ];
            for (n, x) in all {
                range_f64(&format!("policy.weights.{n}"), x, 0.0, 1e6)?;
            }
            if all.iter().all(|(_, x)| *x == 0.0) {
                return bad("policy.weights", "at least one weight must be above 0");
            }
        }
        if let Some((field, problem)) = self.policy.as_ref().and_then(Policy::problem) {
            return bad(&field, problem);
        }
        if self.run.command.trim().is_empty() {
            return bad("run.command", "must not be empty");
        }
        if self.run.command.len() > MAX_COMMAND_BYTES {
            return bad(
                "run.command",
                format!("is longer than {MAX_COMMAND_BYTES} bytes"),
            );
        }
        // A NUL cannot pass to a process: such a job could never start anywhere.
        if self.run.command.contains('\0') {
            return bad("run.command", "contains a NUL byte");
        }
        for (field, v) in [
            ("run.adapter", &self.run.adapter),
            ("run.image", &self.run.image),
        ] {
            if let Some(v) = v {
                name(field, v, 512)?;
            }
        }
        count_limit("run.env", self.run.env.len(), 256)?;
        for k in self.run.env.keys() {
            let ok = !k.is_empty()
                && k.len() <= 128
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return bad(format!("run.env.{k}"), "is not a valid variable name");
            }
        }
        for (k, v) in &self.run.env {
            if v.contains('\0') {
                return bad(format!("run.env.{k}"), "contains a NUL byte");
            }
            if v.len() > MAX_ENV_VALUE_BYTES {
                return bad(
                    format!("run.env.{k}"),
                    format!(
                        "is {} bytes long; the limit is {MAX_ENV_VALUE_BYTES}",
                        v.len()
                    ),
                );
            }
        }
        Ok(())
    }
}

impl Validate for Offer {
    versioned!(Offer);

    fn validate(&self) -> R {
        token("pool", &self.pool)?;
        if self.devices.is_empty() {
            return bad("devices", "an offer assigns at least one device");
        }
        for (i, d) in self.devices.iter().enumerate() {
            range_u64(&format!("devices[{i}].milli"), d.milli.into(), 1, 1000)?;
        }
        self.spec.validate().map_err(|e| match e {
            WireError::Invalid { field, problem } => {
                WireError::invalid(format!("spec.{field}"), problem)
            }
            other => other,
        })
    }
}

impl Validate for OfferReply {
    versioned!(OfferReply);

    fn validate(&self) -> R {
        if let OfferOutcome::Rejected { reason } = &self.outcome {
            name("reason", reason, 4096)?;
        }
        Ok(())
    }
}

impl Validate for CancelAttempt {
    versioned!(CancelAttempt);

    fn validate(&self) -> R {
        name("reason", &self.reason, 4096)
    }
}

impl Validate for JobStatus {
    versioned!(JobStatus);

    fn validate(&self) -> R {
        if let Some(c) = &self.checkpoint {
            name("checkpoint", c, 4096)?;
        }
        if let Some(r) = self.runtime_ms {
            range_u64("runtime_ms", r, 0, MAX_RUNTIME_MS)?;
        }
        match &self.state {
            AttemptState::Failed { reason, .. }
            | AttemptState::Cancelled { reason }
            | AttemptState::Interrupted { reason } => {
                // Reasons carry what a process said; they are escaped wherever they are shown.
                if reason.len() > 4096 {
                    return bad("reason", "is longer than 4096 bytes");
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl Validate for StatusAck {
    versioned!(StatusAck);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for LogsRequest {
    versioned!(LogsRequest);

    fn validate(&self) -> R {
        range_u64("lines", self.lines.into(), 1, 10_000)
    }
}

impl Validate for LogsReply {
    versioned!(LogsReply);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for JobRef {
    versioned!(JobRef);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for ExplainRequest {
    versioned!(ExplainRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for ScaleInRequest {
    versioned!(ScaleInRequest);

    fn validate(&self) -> R {
        token("service", &self.service)?;
        range_u64("remove", self.remove.into(), 1, 100_000)
    }
}

impl Validate for ServiceRef {
    versioned!(ServiceRef);

    fn validate(&self) -> R {
        if let Some(n) = &self.name {
            token("name", n)?;
        }
        Ok(())
    }
}

impl Validate for RoutesWatchRequest {
    versioned!(RoutesWatchRequest);

    fn validate(&self) -> R {
        token("name", &self.name)?;
        range_u64("lease_s", self.lease_s, 1, 600)
    }
}

impl Validate for DemandReport {
    versioned!(DemandReport);

    fn validate(&self) -> R {
        token("service", &self.service)?;
        count_limit("locations", self.locations.len(), MAX_USERS)?;
        for (i, l) in self.locations.iter().enumerate() {
            name(&format!("locations[{i}].name"), &l.name, 128)?;
            location(&format!("locations[{i}].location"), &l.location)?;
            range_f64(&format!("locations[{i}].per_s"), l.per_s, 0.0, 1e12)?;
            if let Some(r) = &l.rtt_region {
                name(&format!("locations[{i}].rtt_region"), r, 64)?;
            }
        }
        Ok(())
    }
}

impl Validate for TenancyRequest {
    versioned!(TenancyRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for JobListRequest {
    versioned!(JobListRequest);

    fn validate(&self) -> R {
        if let Some(l) = self.limit {
            range_u64("limit", l.into(), 1, MAX_PAGE.into())?;
        }
        if let Some(c) = &self.cursor {
            name("cursor", c, 128)?;
        }
        if let Some(t) = &self.text {
            name("text", t, 200)?;
        }
        Ok(())
    }
}

impl Validate for SiteListRequest {
    versioned!(SiteListRequest);

    fn validate(&self) -> R {
        if let Some(l) = self.limit {
            range_u64("limit", l.into(), 1, MAX_PAGE.into())?;
        }
        Ok(())
    }
}

impl Validate for QueuesRequest {
    versioned!(QueuesRequest);

    fn validate(&self) -> R {
        if let Some(h) = self.head {
            range_u64("head", h.into(), 0, MAX_PAGE.into())?;
        }
        if let Some(q) = &self.queue {
            name("queue", q, 128)?;
        }
        Ok(())
    }
}

impl Validate for FormatRequest {
    versioned!(FormatRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for ReportRequest {
    versioned!(ReportRequest);

    fn validate(&self) -> R {
        if let (Some(f), Some(t)) = (self.from_ms, self.to_ms) {
            if f >= t {
                return bad("to_ms", "must be after from_ms");
            }
        }
        Ok(())
    }
}

impl Validate for HistoryRequest {
    versioned!(HistoryRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for DrainRequest {
    versioned!(DrainRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for TokenCreateRequest {
    versioned!(TokenCreateRequest);

    fn validate(&self) -> R {
        if self.roles.is_empty() || self.roles.len() > 32 {
            return Err(WireError::invalid(
                "roles",
                "name 1 to 32 roles: admin, viewer, submit, cancel, watch, report (optionally :QUEUE,QUEUE), or gateway (optionally :SERVICE,SERVICE)",
            ));
        }
        if let Some(n) = &self.name {
            name("name", n, 128)?;
        }
        Ok(())
    }
}

impl Validate for TokenRevokeRequest {
    versioned!(TokenRevokeRequest);

    fn validate(&self) -> R {
        name("id", &self.id, 32)
    }
}

impl Validate for SiteRevokeRequest {
    versioned!(SiteRevokeRequest);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl Validate for AuditRequest {
    versioned!(AuditRequest);

    fn validate(&self) -> R {
        if let Some(w) = &self.who {
            name("who", w, 128)?;
        }
        Ok(())
    }
}

impl Validate for Empty {
    versioned!(Empty);

    fn validate(&self) -> R {
        Ok(())
    }
}

impl<T> Validate for ApiReply<T> {
    versioned!(ApiReply);

    fn validate(&self) -> R {
        if self.ok.is_some() == self.error.is_some() {
            return bad("ok", "exactly one of `ok` and `error` must be present");
        }
        Ok(())
    }
}
