//! Device probes. A probe returns plain [`ProbedDevice`] values; [`group_into_pools`] turns them into pools.
//! Machines without the NVIDIA library use the pools declared in the site file.

use crate::AdapterError;
use meridian_federation::ModelName;

/// One device as a probe saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbedDevice {
    pub index: u32,
    pub vendor: String,
    /// The device's own name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub memory_mib: u64,
    /// Power limit, watts, where known.
    pub power_watts: Option<u32>,
    pub healthy: bool,
}

/// Identical devices grouped: one pool per (vendor, model, memory).
#[derive(Clone, Debug, PartialEq)]
pub struct ProbedPool {
    pub vendor: String,
    pub model: ModelName,
    pub memory_mib: u64,
    pub power_watts: Option<u32>,
    /// Device indices as the probe numbered them (the values for `CUDA_VISIBLE_DEVICES`).
    pub indices: Vec<u32>,
    pub healthy: Vec<bool>,
}

pub trait DeviceProbe {
    fn name(&self) -> &'static str;
    fn probe(&self) -> Result<Vec<ProbedDevice>, AdapterError>;
}

/// NVIDIA GPUs through NVML. `probe` fails with `ProbeUnavailable` where the library is not installed.
#[derive(Debug, Default)]
pub struct NvmlProbe {
    /// The NVML library to load: the system's `libnvidia-ml.so` when `None`.
    pub library: Option<std::path::PathBuf>,
}

/// What NVML reads of one device now.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSample {
    /// NVML's device index (the pool's device index for probed pools).
    pub index: u32,
    /// Busy fraction over NVML's last sample period (0..=1).
    pub utilization: Option<f64>,
    /// Power draw, watts.
    pub power_watts: Option<f64>,
}

impl NvmlProbe {
    /// NVML from this library file (a driver installed elsewhere; the tests' stand-in).
    pub fn with_library(path: impl Into<std::path::PathBuf>) -> Self {
        NvmlProbe {
            library: Some(path.into()),
        }
    }

    fn init(&self) -> Result<nvml_wrapper::Nvml, AdapterError> {
        let mut builder = nvml_wrapper::Nvml::builder();
        if let Some(path) = &self.library {
            builder.lib_path(path.as_os_str());
        }
        builder.init().map_err(|e| AdapterError::ProbeUnavailable {
            probe: "nvml",
            reason: e.to_string(),
        })
    }

    /// Reads utilization and power of every NVIDIA device now; fails like `probe` where NVML is absent. A
    /// reading a device does not support is left out.
    pub fn sample(&self) -> Result<Vec<DeviceSample>, AdapterError> {
        let nvml = self.init()?;
        let count = nvml.device_count().map_err(|e| AdapterError::ProbeFailed {
            probe: "nvml",
            reason: e.to_string(),
        })?;
        Ok((0..count)
            .filter_map(|index| {
                let d = nvml.device_by_index(index).ok()?;
                Some(DeviceSample {
                    index,
                    utilization: d
                        .utilization_rates()
                        .ok()
                        .map(|u| (f64::from(u.gpu) / 100.0).clamp(0.0, 1.0)),
                    power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                })
            })
            .collect())
    }
}

impl DeviceProbe for NvmlProbe {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn probe(&self) -> Result<Vec<ProbedDevice>, AdapterError> {
        let nvml = self.init()?;
        let failed = |e: nvml_wrapper::error::NvmlError| AdapterError::ProbeFailed {
            probe: "nvml",
            reason: e.to_string(),
        };
        let count = nvml.device_count().map_err(failed)?;
        let mut out = Vec::new();
        for index in 0..count {
            let d = nvml.device_by_index(index).map_err(failed)?;
            let name = d.name().map_err(failed)?;
            let memory_mib = d
                .memory_info()
                .map(|m| m.total / (1024 * 1024))
                .unwrap_or(0);
            let power_watts = d.enforced_power_limit().ok().map(|mw| mw / 1000);
            out.push(ProbedDevice {
                index,
                vendor: "nvidia".into(),
                name,
                memory_mib,
                power_watts,
                healthy: true,
            });
        }
        Ok(out)
    }
}

/// The model name of a device name: `NVIDIA A100-SXM4-80GB` → `A100`, `Tesla V100-SXM2-16GB` → `V100`,
/// `NVIDIA GeForce RTX 4090` → `RTX4090`, `NVIDIA H100 80GB HBM3` → `H100`.
pub fn model_of(name: &str) -> ModelName {
    let mut words = name.split_whitespace().filter(|w| {
        !matches!(
            w.to_ascii_lowercase().as_str(),
            "nvidia" | "tesla" | "geforce" | "quadro"
        )
    });
    let first = words.next().unwrap_or(name);
    let head = first.split('-').next().unwrap_or(first);
    if head.eq_ignore_ascii_case("rtx") {
        if let Some(next) = words.next() {
            return format!("RTX{}", next.split('-').next().unwrap_or(next)).into();
        }
    }
    head.into()
}

/// Groups devices into pools of identical model and memory, in order of first appearance.
pub fn group_into_pools(devices: &[ProbedDevice]) -> Vec<ProbedPool> {
    let mut pools: Vec<ProbedPool> = Vec::new();
    for d in devices {
        let model = model_of(&d.name);
        match pools
            .iter_mut()
            .find(|p| p.vendor == d.vendor && p.model == model && p.memory_mib == d.memory_mib)
        {
            Some(p) => {
                p.indices.push(d.index);
                p.healthy.push(d.healthy);
            }
            None => pools.push(ProbedPool {
                vendor: d.vendor.clone(),
                model,
                memory_mib: d.memory_mib,
                power_watts: d.power_watts,
                indices: vec![d.index],
                healthy: vec![d.healthy],
            }),
        }
    }
    pools
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names as NVML reports them on real machines.
    #[test]
    fn model_names_from_real_device_names() {
        for (name, model) in [
            ("NVIDIA A100-SXM4-80GB", "A100"),
            ("NVIDIA H100 80GB HBM3", "H100"),
            ("NVIDIA H200", "H200"),
            ("Tesla V100-SXM2-16GB", "V100"),
            ("Tesla T4", "T4"),
            ("NVIDIA L4", "L4"),
            ("NVIDIA GeForce RTX 4090", "RTX4090"),
            ("NVIDIA A10", "A10"),
        ] {
            assert_eq!(model_of(name), model, "{name}");
        }
    }

    #[test]
    fn grouping_keeps_indices_and_splits_by_memory() {
        let dev = |index, name: &str, mem| ProbedDevice {
            index,
            vendor: "nvidia".into(),
            name: name.into(),
            memory_mib: mem,
            power_watts: Some(700),
            healthy: index != 2,
        };
        let pools = group_into_pools(&[
            dev(0, "NVIDIA H100 80GB HBM3", 81_559),
            dev(1, "NVIDIA H100 80GB HBM3", 81_559),
            dev(2, "NVIDIA H100 80GB HBM3", 81_559),
            dev(3, "NVIDIA A100-SXM4-40GB", 40_960),
        ]);
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].model, "H100");
        assert_eq!(pools[0].indices, vec![0, 1, 2]);
        assert_eq!(pools[0].healthy, vec![true, true, false]);
        assert_eq!(pools[1].indices, vec![3]);
    }

    #[test]
    fn nvml_absence_is_an_error_not_a_panic() {
        // On machines without the NVIDIA driver this reports unavailability; with one, it lists devices.
        match NvmlProbe::default().probe() {
            Ok(devices) => assert!(devices.iter().all(|d| !d.name.is_empty())),
            Err(e) => assert!(e.to_string().contains("nvml"), "{e}"),
        }
    }
}
