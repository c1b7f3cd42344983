//! Where the shared public data lives: `$MERIDIAN_DATA`, else `../shared/data` beside the workspace root.
//! Under `CI=true` a missing file is an error, never a silent fallback.

use std::path::{Path, PathBuf};

pub fn data_dir() -> PathBuf {
    match std::env::var_os("MERIDIAN_DATA") {
        Some(d) => PathBuf::from(d),
        None => crate::local::workspace_root().join("../shared/data"),
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The data file at `rel` under the data folder: `Ok(None)` when it is absent (outside CI; with a warning).
pub fn data_file(rel: &Path) -> anyhow::Result<Option<PathBuf>> {
    let p = data_dir().join(rel);
    if p.exists() {
        return Ok(Some(p));
    }
    if in_ci() {
        anyhow::bail!(
            "data file {} is missing (CI=true: shared data must be present)",
            p.display()
        );
    }
    // Said, not silent: what uses it falls back to a smaller input (a yearly carbon figure for an hourly
    // series, the distance estimate for measured round trips), and results differ.
    tracing::warn!(
        "data file {} is missing: using the fallback; set MERIDIAN_DATA to the data folder",
        p.display()
    );
    Ok(None)
}
