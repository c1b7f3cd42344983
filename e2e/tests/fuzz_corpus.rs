//! Every committed corpus file (`fuzz/corpus/<target>/`) through its target, on stable: what the fuzzer found
//! interesting stays tested in every build, and a crash it once found stays fixed.

use std::path::PathBuf;

/// The fuzz targets' bodies, the very file cargo fuzz builds.
#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod targets;

#[test]
fn every_corpus_file_passes_its_target() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut total = 0;
    for (name, target) in targets::TARGETS {
        let dir = root.join(name);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (every target has a corpus)", dir.display()));
        let mut n = 0;
        for entry in entries.flatten() {
            let data = std::fs::read(entry.path()).unwrap_or_default();
            target(&data);
            n += 1;
        }
        assert!(n > 0, "{name}: empty corpus");
        total += n;
    }
    println!("{total} corpus files replayed");
}
