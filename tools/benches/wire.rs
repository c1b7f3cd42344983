//! `cargo bench -p meridian-tools --bench wire`: what the broker's site listener pays to read one message of
//! a site, an advert of a synthetic site (one or two pools of 8-64 devices) and a heartbeat, through the
//! tolerant decoder every site message goes through.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use meridian_federation::{decode, encode, Heartbeat, SiteAdvert, WIRE_VERSION};
use meridian_tools::bench::synthetic_advert;
use meridian_tools::sim::trace::SplitMix64;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

fn adverts() -> Vec<Vec<u8>> {
    let mut rng = SplitMix64::new(42);
    (0..64)
        .map(|i| encode(&synthetic_advert(i, &mut rng)).unwrap())
        .collect()
}

#[divan::bench]
fn advert(bencher: divan::Bencher) {
    let bodies = adverts();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % bodies.len();
        decode::<SiteAdvert>(divan::black_box(&bodies[i])).unwrap()
    });
}

#[divan::bench]
fn heartbeat(bencher: divan::Bencher) {
    let mut rng = SplitMix64::new(42);
    let site = synthetic_advert(0, &mut rng).site.id;
    let body = encode(&Heartbeat {
        v: WIRE_VERSION,
        site,
        seq: 12,
        sent_at_ms: 1_765_000_000_000,
        generation: 3,
        running: Vec::new(),
        inventory: None,
    })
    .unwrap();
    bencher.bench_local(|| decode::<Heartbeat>(divan::black_box(&body)).unwrap());
}
