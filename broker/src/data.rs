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

/// The data file at `rel` under the data folder: `Ok(None)` when it is absent (outside CI).
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
    Ok(None)
}
