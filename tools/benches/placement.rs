//! `cargo bench -p meridian-tools`: one placement decision (with its explanation) over synthetic federations
//! of 100, 1,000 and 10,000 sites, through the site index and by a full scan of every site.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_tools::bench::Bench;
use std::sync::OnceLock;

fn main() {
    divan::main();
}

fn federation(sites: usize) -> &'static Bench {
    static CACHE: OnceLock<std::sync::Mutex<Vec<(usize, &'static Bench)>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap();
    if let Some((_, b)) = c.iter().find(|(n, _)| *n == sites) {
        return b;
    }
    let b: &'static Bench = Box::leak(Box::new(Bench::new(sites, 512, 42)));
    c.push((sites, b));
    b
}

#[divan::bench(args = [100, 1000, 10000])]
fn indexed(bencher: divan::Bencher, sites: usize) {
    let b = federation(sites);
    let mut i = 0usize;
    bencher.bench_local(|| {
        i += 1;
        b.decide(i, true)
    });
}

#[divan::bench(args = [100, 1000, 10000])]
fn full_scan(bencher: divan::Bencher, sites: usize) {
    let b = federation(sites);
    let mut i = 0usize;
    bencher.bench_local(|| {
        i += 1;
        b.decide(i, false)
    });
}
