//! `cargo bench -p meridian-tools`: one placement decision (with its explanation) over synthetic federations
//! of 100, 1,000 and 10,000 sites, through the site index and by a full scan of every site; and one decision
//! per policy through the index at 1,000 and 10,000 sites, so a regression of one policy shows on its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_tools::bench::{Bench, POLICIES};
use std::sync::OnceLock;

/// The `meridian` binary's allocator, so the figures are the broker's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    let b: &'static Bench = Box::leak(Box::new(Bench::new(sites, JOBS, 42)));
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

const JOBS: usize = 512;

/// The jobs of the request mix that ask for `policy` (requests cycle through [`POLICIES`]).
fn jobs_of(policy: &str) -> Vec<usize> {
    let at = POLICIES.iter().position(|(n, _)| *n == policy).unwrap();
    (at..JOBS).step_by(POLICIES.len()).collect()
}

#[divan::bench(args = POLICIES.map(|(n, _)| n))]
fn policy_at_1000_sites(bencher: divan::Bencher, policy: &str) {
    per_policy(bencher, 1000, policy);
}

#[divan::bench(args = POLICIES.map(|(n, _)| n))]
fn policy_at_10000_sites(bencher: divan::Bencher, policy: &str) {
    per_policy(bencher, 10000, policy);
}

fn per_policy(bencher: divan::Bencher, sites: usize, policy: &str) {
    let b = federation(sites);
    let jobs = jobs_of(policy);
    let mut i = 0usize;
    bencher.bench_local(|| {
        i += 1;
        b.decide(jobs[i % jobs.len()], true)
    });
}
