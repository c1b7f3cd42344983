//! The example nats-server configurations in `configs/nats/` are ones the server accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_e2e::*;

fn check(path: &std::path::Path) -> (bool, String) {
    let out = std::process::Command::new(local::find_nats_server().unwrap())
        .arg("-t")
        .arg("-c")
        .arg(path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.contains("is valid"), text)
}

#[test]
fn the_example_nats_configurations_are_valid() {
    let dir = configs().join("nats");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "conf") {
            let (ok, text) = check(&path);
            assert!(ok, "{}: {text}", path.display());
            seen += 1;
        }
    }
    assert_eq!(seen, 3, "single, cluster node and leaf node examples");
    // The check can fail: a broken file is refused.
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), "cluster { routes: [ }\n").unwrap();
    assert!(!check(bad.path()).0);
}
