//! Tests of the core: placement choices, reactor scenarios by concern, journal replay, and oracles.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod journal;
mod ledger;
mod lifecycle;
mod oracle;
mod placement;
mod random;
mod random_events;
mod state_eq;
mod tenancy;
mod trust;

use crate::latency::RttTable;
use crate::model::Site;
use crate::placement::{place, Outcome, Reject, Request, View, Wait};
use crate::reactor::{Command, Event, Response};
use crate::testkit::*;
use meridian_federation::*;
use std::collections::BTreeMap;

pub(super) fn sites(adverts: Vec<SiteAdvert>) -> BTreeMap<SiteId, Site> {
    adverts
        .iter()
        .map(|a| (a.site.id.clone(), Site::from_advert(a, 0)))
        .collect()
}

pub(super) fn choose(adverts: Vec<SiteAdvert>, spec: &JobSpec, waited_ms: u64) -> Outcome {
    decide_on(&sites(adverts), spec, &Default::default(), None, waited_ms).outcome
}

pub(super) fn choose_indexed(adverts: Vec<SiteAdvert>, spec: &JobSpec, waited_ms: u64) -> Outcome {
    let sites = sites(adverts);
    let mut index = crate::index::SiteIndex::default();
    for s in sites.values() {
        index.update(s, &Default::default());
    }
    decide_on(&sites, spec, &Default::default(), Some(&index), waited_ms).outcome
}

/// One decision over `sites`, with no measured round trips, the test regions, and this throughput and index.
pub(super) fn decide_on(
    sites: &BTreeMap<SiteId, Site>,
    spec: &JobSpec,
    throughput: &crate::throughput::Throughput,
    index: Option<&crate::index::SiteIndex>,
    waited_ms: u64,
) -> crate::placement::Decision {
    decide_in_format(
        sites,
        spec,
        throughput,
        index,
        waited_ms,
        crate::durable::FORMAT_VERSION,
    )
}

/// [`decide_on`] under the placement rules of durable format `format`.
pub(super) fn decide_in_format(
    sites: &BTreeMap<SiteId, Site>,
    spec: &JobSpec,
    throughput: &crate::throughput::Throughput,
    index: Option<&crate::index::SiteIndex>,
    waited_ms: u64,
    format: u32,
) -> crate::placement::Decision {
    let (rtt, regions) = (RttTable::default(), regions());
    let view = View {
        sites,
        rtt: &rtt,
        regions: &regions,
        throughput,
        index,
        format,
    };
    let request = Request {
        spec,
        waited_ms,
        refused: &[],
        capped: &[],
        baseline: None,
        spent: Default::default(),
        queue_policy: None,
    };
    place(view, request, 0)
}

pub(super) fn chosen_site(o: &Outcome) -> &str {
    match o {
        Outcome::Place(c) => c.site.as_str(),
        Outcome::Wait(w) => panic!("expected a placement, got wait: {w}"),
    }
}

/// Two owned sites: A cheap and dirty, B dear and clean, C far away and mid.
pub(super) fn trio() -> Vec<SiteAdvert> {
    vec![
        site("a-cheap", Tier::Owned, 39.0, -77.5)
            .gpus("A100", 8, 1.0)
            .carbon(400)
            .build(),
        site("b-green", Tier::Owned, 45.6, -121.2)
            .gpus("H100", 8, 3.0)
            .carbon(50)
            .build(),
        site("c-frankfurt", Tier::Owned, 50.1, 8.7)
            .gpus("A100", 8, 2.0)
            .carbon(300)
            .build(),
    ]
}
