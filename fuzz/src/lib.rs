//! The fuzz targets' bodies, one function per decoder or file parser that takes input from outside: wire
//! messages from agents and API callers, and the files operators write. Each must never panic, whatever the
//! bytes; a wire message it accepts must encode and decode again to the same value.
//!
//! `fuzz/fuzz_targets/*.rs` (cargo fuzz, nightly, libFuzzer) call these; `e2e/tests/fuzz_corpus.rs` includes
//! this file and replays every committed corpus file through them on stable, as an ordinary test.

use meridian_federation::validate::Validate;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target: its name (the corpus folder) and its body.
pub const TARGETS: &[(&str, Target)] = &[
    ("advert", advert),
    ("heartbeat", heartbeat),
    ("status", status),
    ("offer", offer),
    ("offer_reply", offer_reply),
    ("job_spec", job_spec),
    ("site_file", site_file),
    ("tenancy_file", tenancy_file),
    ("federation_file", federation_file),
    ("geojson_region", geojson_region),
];

/// Decodes both ways (tolerant and strict); what is accepted round-trips.
fn wire<T>(data: &[u8])
where
    T: DeserializeOwned + Serialize + Validate + PartialEq + Debug,
{
    let decoded = [
        meridian_federation::decode::<T>(data),
        meridian_federation::decode_strict::<T>(data),
    ];
    for value in decoded.into_iter().flatten() {
        let bytes = meridian_federation::encode(&value)
            .unwrap_or_else(|e| panic!("an accepted {value:?} does not encode: {e}"));
        let again = meridian_federation::decode::<T>(&bytes)
            .unwrap_or_else(|e| panic!("an accepted {value:?} does not decode again: {e}"));
        assert_eq!(again, value, "round trip changed the value");
    }
}

pub fn advert(data: &[u8]) {
    wire::<meridian_federation::SiteAdvert>(data);
}

pub fn heartbeat(data: &[u8]) {
    wire::<meridian_federation::Heartbeat>(data);
}

pub fn status(data: &[u8]) {
    wire::<meridian_federation::JobStatus>(data);
}

pub fn offer(data: &[u8]) {
    wire::<meridian_federation::Offer>(data);
}

pub fn offer_reply(data: &[u8]) {
    wire::<meridian_federation::OfferReply>(data);
}

pub fn job_spec(data: &[u8]) {
    wire::<meridian_federation::JobSpec>(data);
}

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

pub fn site_file(data: &[u8]) {
    if let Some(file) =
        text(data).and_then(|t| meridian_agent_core::config::parse_site_file(t).ok())
    {
        // What the agent derives from an accepted file must not panic either.
        let _ = file.site_info(0);
    }
}

pub fn tenancy_file(data: &[u8]) {
    if let Some(t) = text(data) {
        let _ = meridian_core::quota::Tenancy::from_toml(t);
    }
}

pub fn federation_file(data: &[u8]) {
    if let Some(t) = text(data) {
        let _ = meridian_broker::local::FederationFile::parse(t);
    }
}

pub fn geojson_region(data: &[u8]) {
    if let Some(t) = text(data) {
        if let Ok(area) = meridian_core::regions::parse_geojson(t) {
            let mut regions = meridian_core::regions::Regions::default();
            regions.insert("r", area);
            let _ = regions.contains(
                "r",
                meridian_federation::GeoPoint {
                    lat: 48.1,
                    lon: 11.6,
                },
            );
        }
    }
}
