//! The example nats-server configurations in `configs/nats/` are ones the server accepts, secured with a
//! credentials folder that `meridian creds` made (TLS files, the authorization it writes, JetStream's key).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_broker::creds::{Kind, Registry};
use meridian_e2e::*;
use std::path::Path;

/// Where the examples expect the credentials folder.
const EXAMPLE_DIR: &str = "/etc/meridian/creds";

fn check(path: &Path, env: &[(&str, String)]) -> (bool, String) {
    let out = std::process::Command::new(local::find_nats_server().unwrap())
        .arg("-t")
        .arg("-c")
        .arg(path)
        .env_remove("MERIDIAN_JETSTREAM_KEY")
        .env_remove("MERIDIAN_SITE_SEED")
        .envs(env.iter().map(|(k, v)| (k, v)))
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
fn the_example_nats_configurations_are_valid_with_credentials_from_meridian_creds() {
    let tmp = tempfile::tempdir().unwrap();
    let creds = tmp.path().join("creds");
    let hosts = ["n1".to_owned(), "n2".to_owned(), "n3".to_owned()];
    let mut reg = Registry::init(&creds, "example", &hosts).unwrap();
    reg.add(Kind::Broker, "broker-1").unwrap();
    let seed = reg.add(Kind::Site, "edge-frankfurt").unwrap();
    reg.add(Kind::Client, "operator").unwrap();
    let env = [
        (
            "MERIDIAN_JETSTREAM_KEY",
            std::fs::read_to_string(creds.join("jetstream.key")).unwrap(),
        ),
        (
            "MERIDIAN_SITE_SEED",
            std::fs::read_to_string(&seed).unwrap().trim().to_owned(),
        ),
    ];
    let dir = configs().join("nats");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "conf") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for secured in ["tls {", "verify: true", "include \"authorization.conf\""] {
            assert!(text.contains(secured), "{}: no {secured}", path.display());
        }
        // Placed in the credentials folder, as the examples say.
        let placed = creds.join(path.file_name().unwrap());
        std::fs::write(
            &placed,
            text.replace(EXAMPLE_DIR, &creds.display().to_string()),
        )
        .unwrap();
        let (ok, out) = check(&placed, &env);
        assert!(ok, "{}: {out}", path.display());
        // Without its secrets the server refuses it: the check can fail.
        let (ok, _) = check(&placed, &[]);
        assert!(!ok, "{} is valid without its secrets", path.display());
        seen += 1;
    }
    assert_eq!(seen, 3, "single, cluster node and leaf node examples");
    let single = std::fs::read_to_string(creds.join("single.conf")).unwrap();
    assert!(single.contains("cipher: chachapoly"), "encrypted at rest");
    // A broken file is refused.
    let bad = creds.join("bad.conf");
    std::fs::write(&bad, "cluster { routes: [ }\n").unwrap();
    assert!(!check(&bad, &env).0);
}
