//! Cloud burst through EC2's API: a site whose capacity is elastic. Its agent advertises what it could create
//! (the GPU instance types the site file allows, as `DescribeInstanceTypes` describes their GPUs), creates an
//! instance for an accepted attempt (`RunInstances`: spot first where the job allows it, then on-demand; zone
//! by zone, then region by region), runs the attempt on it through a launcher, and terminates it once no
//! attempt has wanted it for the idle time. Instance-seconds from launch to termination are billed to the
//! attempts that used it, boot and idle included ([`Meter`]).
//!
//! - [`api`]: the signed EC2 Query API client.
//! - [`Ec2Backend`] (`backend.rs`): the [`crate::backend::Backend`] the agent drives.
//! - Here: the settings and the pure rules (which error sends a launch where, who pays which seconds).

pub mod api;
mod backend;

pub use backend::Ec2Backend;
use serde::Deserialize;

/// `[backend.ec2]` in a site file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ec2Settings {
    /// An EC2-compatible endpoint for every region (another cloud's, or a test's); when absent, the
    /// environment's `AWS_ENDPOINT_URL_EC2` or `AWS_ENDPOINT_URL`, else AWS's own per region.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The regions instances may be created in, tried in this order.
    #[serde(default)]
    pub regions: Vec<RegionEntry>,
    /// The machine image instances boot.
    #[serde(default)]
    pub image_id: String,
    /// The instance types the site may create, with their prices (EC2's API publishes no on-demand prices).
    #[serde(default)]
    pub instance_types: Vec<TypeEntry>,
    /// The most GPUs of each type running at once.
    #[serde(default = "default_max_devices")]
    pub max_devices: u32,
    /// The most the site's instances may cost together, USD per hour; no cap when absent.
    #[serde(default)]
    pub max_usd_per_hour: Option<f64>,
    /// How long an instance no attempt uses is kept for the next one before it is terminated, seconds.
    #[serde(default = "default_idle_s")]
    pub idle_s: u64,
    /// How long a type that could be created nowhere is advertised full, seconds.
    #[serde(default = "default_backoff_s")]
    pub backoff_s: u64,
    /// Put before an attempt's command to run it on its instance, `{instance}` and `{address}` (its private
    /// address) replaced: `["ssh", "-o", "SendEnv=MERIDIAN_*", "ubuntu@{address}"]`. Empty: the command runs on
    /// the agent's host with the instance's id in its environment — the stand-in the tests use, where
    /// instances run nothing.
    #[serde(default)]
    pub launcher: Vec<String>,
}

fn default_max_devices() -> u32 {
    8
}

fn default_idle_s() -> u64 {
    60
}

fn default_backoff_s() -> u64 {
    60
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionEntry {
    pub name: String,
    /// Its zones, tried in this order; those `DescribeAvailabilityZones` lists as available when empty.
    #[serde(default)]
    pub zones: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeEntry {
    /// `p5.48xlarge`, `g5.xlarge`, …
    pub name: String,
    /// On-demand price of one instance, USD per hour.
    pub usd_per_hour: f64,
    /// Spot price of one instance, USD per hour; spot is not tried for this type when absent.
    #[serde(default)]
    pub spot_usd_per_hour: Option<f64>,
    /// Rated power of one of its GPUs, watts.
    pub gpu_power_watts: u32,
}

impl Ec2Settings {
    /// What is wrong with the settings, if anything (each problem names its field).
    pub fn check(&self) -> Result<(), String> {
        if self.regions.is_empty() {
            return Err("backend.ec2.regions: name at least one region".into());
        }
        if self.image_id.is_empty() {
            return Err("backend.ec2.image_id: name the machine image instances boot".into());
        }
        if self.instance_types.is_empty() {
            return Err("backend.ec2.instance_types: name at least one instance type".into());
        }
        for (i, t) in self.instance_types.iter().enumerate() {
            if !(t.usd_per_hour.is_finite() && t.usd_per_hour > 0.0) {
                return Err(format!(
                    "backend.ec2.instance_types[{i}].usd_per_hour: a price above 0, not {}",
                    t.usd_per_hour
                ));
            }
            if let Some(s) = t.spot_usd_per_hour {
                if !(s.is_finite() && s > 0.0) {
                    return Err(format!(
                        "backend.ec2.instance_types[{i}].spot_usd_per_hour: a price above 0, not {s}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The pool a type is advertised as (`p4d.24xlarge` → `p4d-24xlarge`: pool names take no dots).
pub fn pool_name(instance_type: &str) -> String {
    instance_type.replace('.', "-")
}

/// What a failed `RunInstances` means for where to try next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// No capacity of the type there: the next zone.
    Zone,
    /// The account's spot quota is spent in the region: on-demand there.
    OnDemand,
    /// A quota of the account's in the region: the next region.
    Region,
    /// Throttled: the same call again, later.
    Later,
    /// Anything else (a bad image, credentials): trying elsewhere would fail the same way.
    Stop,
}

/// Where to try after an error of this code.
pub fn next_after(code: &str) -> Next {
    match code {
        "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "SpotMaxPriceTooLow"
        | "Unsupported"
        | "InsufficientCapacityOnHost" => Next::Zone,
        "MaxSpotInstanceCountExceeded" => Next::OnDemand,
        "VcpuLimitExceeded" | "InstanceLimitExceeded" | "InsufficientReservedInstanceCapacity" => {
            Next::Region
        }
        "RequestLimitExceeded" | "Throttling" | "ServiceUnavailable" | "InternalError" => {
            Next::Later
        }
        _ => Next::Stop,
    }
}

/// Who pays for an instance's seconds. Each second from its launch to its termination is billed exactly once,
/// to an attempt that used it: an ending attempt pays from where the instance's bill stood to its end, and,
/// when it leaves the instance idle, for the idle time the instance is then kept (a next attempt that takes
/// the instance within it is billed from where that paid time ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meter {
    /// Up to when the instance's seconds are billed, ms since the epoch (its launch, at first).
    pub billed_to_ms: u64,
}

impl Meter {
    pub fn launched(at_ms: u64) -> Self {
        Meter {
            billed_to_ms: at_ms,
        }
    }

    /// Bills an attempt that ended at `end_ms`: the span it pays for. `idle_ms` is the idle time the
    /// instance is kept after it when no other attempt runs there (0 when one does, or the instance is gone).
    pub fn bill(&mut self, end_ms: u64, idle_ms: u64) -> (u64, u64) {
        let from = self.billed_to_ms;
        let to = from.max(end_ms.saturating_add(idle_ms));
        self.billed_to_ms = to;
        (from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_send_the_next_launch_where_ec2_says() {
        assert_eq!(next_after("InsufficientInstanceCapacity"), Next::Zone);
        assert_eq!(next_after("MaxSpotInstanceCountExceeded"), Next::OnDemand);
        assert_eq!(next_after("VcpuLimitExceeded"), Next::Region);
        assert_eq!(next_after("RequestLimitExceeded"), Next::Later);
        assert_eq!(next_after("InvalidAMIID.NotFound"), Next::Stop);
        assert_eq!(next_after("AuthFailure"), Next::Stop);
    }

    #[test]
    fn every_instance_second_is_billed_once() {
        // Launched at 0; the first attempt ends at 100 s and leaves it idle for 60 s.
        let mut m = Meter::launched(0);
        assert_eq!(
            m.bill(100_000, 60_000),
            (0, 160_000),
            "boot and idle included"
        );
        // A second attempt took it at 130 s (within the paid idle) and ends at 200 s, leaving it idle again.
        assert_eq!(m.bill(200_000, 60_000), (160_000, 260_000));
        // The instance is then terminated at 260 s: 260 s billed in all, once each.
        // Two attempts side by side: the first to end pays the common span, the last the rest and the idle.
        let mut m = Meter::launched(1_000);
        assert_eq!(m.bill(5_000, 0), (1_000, 5_000));
        assert_eq!(m.bill(9_000, 2_000), (5_000, 11_000));
        // One that ends within time already paid for pays nothing more.
        assert_eq!(m.bill(10_000, 0), (11_000, 11_000));
    }

    #[test]
    fn settings_say_what_is_missing() {
        let s = Ec2Settings::default();
        assert!(s.check().unwrap_err().contains("backend.ec2.regions"));
        let s = Ec2Settings {
            regions: vec![RegionEntry {
                name: "us-east-1".into(),
                zones: vec![],
            }],
            image_id: "ami-1".into(),
            instance_types: vec![TypeEntry {
                name: "g5.xlarge".into(),
                usd_per_hour: -1.0,
                spot_usd_per_hour: None,
                gpu_power_watts: 300,
            }],
            ..Ec2Settings::default()
        };
        assert!(s
            .check()
            .unwrap_err()
            .contains("instance_types[0].usd_per_hour"));
        assert_eq!(pool_name("p4d.24xlarge"), "p4d-24xlarge");
    }
}
