//! The NVML probe against a stand-in for `libnvidia-ml.so` built here from `tests/fake-nvml/fake_nvml.c` (no
//! registry ships a fake NVML, and these machines have no GPU): the probe reads the devices' names, memory
//! and power limits, groups them into pools by model, samples utilization and power, and turns every failure
//! of the library — absent, a driver not loaded, a call that fails, a function it lacks — into an error,
//! never a crash. The library is loaded by path, as `Nvml::builder().lib_path(..)` loads a real one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_adapters::probe::{group_into_pools, DeviceProbe, NvmlProbe};
use meridian_adapters::AdapterError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds one stand-in library: `devices` as the C file's `FAKE_DEVICES`, failing `fail`; `fail = "old"`
/// builds one that lacks `nvmlDeviceGetPowerUsage`.
fn fake_nvml(dir: &Path, case: &str, devices: &str, fail: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/fake_nvml.c");
    let out = dir.join(format!("libnvidia-ml-{case}.so"));
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(format!("-DFAKE_DEVICES=\"{devices}\""))
        .arg(format!("-DFAKE_FAIL=\"{fail}\""))
        .args((fail == "old").then_some("-DOLD_LIBRARY"))
        .arg(&source)
        .status()
        .expect("a C compiler (cc) runs");
    assert!(built.success(), "building {}", out.display());
    out
}

#[test]
fn the_probe_reads_what_nvml_reports_and_every_failure_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let four =
        "NVIDIA H100 80GB HBM3|81559|700000|37|312500;NVIDIA H100 80GB HBM3|81559|700000|0|90000;\
                NVIDIA A100-SXM4-40GB|40960|400000|100|0;NVIDIA A100-SXM4-40GB|40960|0|5|51000";
    let probe = NvmlProbe::with_library(fake_nvml(dir.path(), "four", four, ""));
    let devices = probe.probe().unwrap();
    assert_eq!(devices.len(), 4);
    assert_eq!(devices[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(devices[0].memory_mib, 81559);
    assert_eq!(devices[0].power_watts, Some(700));
    // A power limit NVML does not report is left out, not guessed.
    assert_eq!(devices[3].power_watts, None);
    let pools = group_into_pools(&devices);
    let shapes: Vec<(String, u64, Vec<u32>)> = pools
        .iter()
        .map(|p| (p.model.to_string(), p.memory_mib, p.indices.clone()))
        .collect();
    assert!(
        shapes.contains(&("H100".into(), 81559, vec![0, 1])),
        "{shapes:?}"
    );
    assert!(
        shapes.contains(&("A100".into(), 40960, vec![2, 3])),
        "{shapes:?}"
    );
    let samples = probe.sample().unwrap();
    assert_eq!(samples.len(), 4);
    assert_eq!(samples[0].utilization, Some(0.37));
    assert_eq!(samples[0].power_watts, Some(312.5));
    assert_eq!(samples[2].utilization, Some(1.0));
    // A reading the device does not support is left out.
    assert_eq!(samples[2].power_watts, None);

    // A library that lacks a function: that reading is left out, the others are read.
    let old = NvmlProbe::with_library(fake_nvml(dir.path(), "old", four, "old"));
    let samples = old.sample().unwrap();
    assert!(
        samples.iter().all(|s| s.power_watts.is_none()),
        "{samples:?}"
    );
    assert_eq!(samples[0].utilization, Some(0.37));
    assert_eq!(old.probe().unwrap().len(), 4);

    // No device: an empty inventory, not an error.
    let none = NvmlProbe::with_library(fake_nvml(dir.path(), "none", "", ""));
    assert!(none.probe().unwrap().is_empty());

    // The driver not loaded: the probe is unavailable (the site file's pools are used instead).
    let no_driver = NvmlProbe::with_library(fake_nvml(dir.path(), "init", four, "init"));
    assert!(matches!(
        no_driver.probe(),
        Err(AdapterError::ProbeUnavailable { .. })
    ));
    // A call that fails after a good start: the probe failed, with NVML's reason.
    for call in ["count", "handle", "name"] {
        let broken = NvmlProbe::with_library(fake_nvml(dir.path(), call, four, call));
        match broken.probe() {
            Err(AdapterError::ProbeFailed { reason, .. }) => {
                assert!(!reason.is_empty(), "{call}")
            }
            other => panic!("{call}: expected a failed probe, got {other:?}"),
        }
    }
    // No library at all.
    let absent = NvmlProbe::with_library(dir.path().join("libnvidia-ml-absent.so"));
    assert!(matches!(
        absent.probe(),
        Err(AdapterError::ProbeUnavailable { .. })
    ));
}
