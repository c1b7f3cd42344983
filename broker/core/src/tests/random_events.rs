//! The events of the random event-sequence test ([`super::random`]): what each step may be, and how proptest
//! draws them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use proptest::prelude::*;

/// A step of a sequence, with its targets picked among what exists when it is played.
#[derive(Clone, Debug)]
pub(super) enum Action {
    Advert {
        site: usize,
        used: u8,
        drain: bool,
    },
    Heartbeat {
        site: usize,
        stale: bool,
    },
    Submit(Submission),
    Answer {
        pick: usize,
        accept: bool,
    },
    Status {
        pick: usize,
        kind: u8,
        runtime_s: u32,
        stale: bool,
    },
    Advance {
        ms: u32,
    },
    Cancel {
        pick: usize,
    },
    Drain {
        site: usize,
        on: bool,
    },
    /// An administrator revokes a site (`on`) or lets it back in.
    Revoke {
        site: usize,
        on: bool,
    },
    Tenancy {
        which: usize,
    },
    ScaleIn {
        remove: u32,
    },
    Resume,
    /// The shell archives finished jobs older than `retention_s`.
    Archive {
        retention_s: u32,
    },
    /// The site's agent restarts and has lost every attempt it ran.
    AgentRestart {
        site: usize,
    },
    /// team-a deploys (or replaces) its service `chat`, or deletes it (its replicas stop).
    Service {
        deploy: bool,
        spot: bool,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Submission {
    pub(super) tenant: usize,
    pub(super) gpus: u32,
    pub(super) milli: Option<u32>,
    pub(super) replicas: u32,
    pub(super) policy: u8,
    pub(super) max_wait_s: u64,
    pub(super) checkpointable: bool,
    pub(super) service: bool,
    /// On spot capacity (only the cloud sells it).
    pub(super) spot: bool,
    pub(super) priority: Option<usize>,
    pub(super) deadline_h: Option<u64>,
    /// Reuse an earlier key (same spec, or a different one: a conflict).
    pub(super) key: u8,
}

pub(super) const TENANTS: [&str; 3] = ["team-a", "team-b", "team-c"];

/// Tenancies the sequence switches between: two cohorts of queues; one without team-c's queue (its waiting
/// jobs lose their queue); none at all (nothing limited).
pub(super) const TENANCIES: [Option<&str>; 3] = [
    Some(
        r#"
default_priority = "low"
priority_classes = [{ name = "high", value = 100 }, { name = "low", value = 0 }]
[[queues]]
name = "team-a"
tenant = "team-a"
cohort = "all"
quota = { "gpu:*" = 4 }
borrowing_limit = { "gpu:*" = 4 }
[[queues]]
name = "team-b"
tenant = "team-b"
cohort = "all"
quota = { "gpu:*" = 4 }
[[queues]]
name = "team-c"
tenant = "team-c"
quota = { "gpu:*" = 2 }
"#,
    ),
    Some(
        r#"
default_priority = "low"
priority_classes = [{ name = "high", value = 100 }, { name = "low", value = 0 }]
[[queues]]
name = "team-a"
tenant = "team-a"
quota = { "gpu:*" = 3 }
[[queues]]
name = "team-b"
tenant = "team-b"
quota = { "gpu:*" = 3 }
"#,
    ),
    None,
];

pub(super) fn sites() -> Vec<SiteAdvert> {
    vec![
        site("owned-a", Tier::Owned, 45.0, -120.0)
            .gpus("H100", 4, 4.0)
            .carbon(60)
            .build(),
        site("owned-b", Tier::Owned, 50.1, 8.7)
            .gpus("L4", 2, 0.7)
            .carbon(400)
            .build(),
        site("partner", Tier::Partner, 53.3, -6.3)
            .gpus("A100", 3, 2.0)
            .build(),
        site("cloud", Tier::Cloud, 37.4, -79.8)
            .gpus("A100", 8, 3.7)
            .spot(1.2)
            .carbon(420)
            .build(),
    ]
}

fn submission() -> impl Strategy<Value = Submission> {
    (
        (
            0..3usize,
            1..=3u32,
            prop::option::weighted(0.2, 100..=900u32),
            1..=2u32,
        ),
        (
            0..5u8,
            prop_oneof![Just(0u64), Just(30), Just(600)],
            any::<bool>(),
        ),
        (
            prop::bool::weighted(0.2),
            prop::option::weighted(0.3, 0..2usize),
            prop::option::weighted(0.15, 1..=30u64),
            0..24u8,
            prop::bool::weighted(0.15),
        ),
    )
        .prop_map(
            |(
                (tenant, gpus, milli, replicas),
                (policy, max_wait_s, checkpointable),
                (service, priority, deadline_h, key, spot),
            )| Submission {
                tenant,
                gpus,
                milli,
                replicas,
                policy,
                max_wait_s,
                checkpointable,
                service,
                spot,
                priority,
                deadline_h,
                key,
            },
        )
}

pub(super) fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        2 => (0..4usize, 0..3u8, prop::bool::weighted(0.1))
            .prop_map(|(site, used, drain)| Action::Advert { site, used, drain }),
        3 => (0..4usize, prop::bool::weighted(0.2))
            .prop_map(|(site, stale)| Action::Heartbeat { site, stale }),
        5 => submission().prop_map(Action::Submit),
        4 => (0..8usize, prop::bool::weighted(0.8))
            .prop_map(|(pick, accept)| Action::Answer { pick, accept }),
        4 => (0..8usize, 0..6u8, 0..7_200u32, prop::bool::weighted(0.1))
            .prop_map(|(pick, kind, runtime_s, stale)| Action::Status { pick, kind, runtime_s, stale }),
        3 => prop_oneof![0..3_000u32, 3_000..15_000u32].prop_map(|ms| Action::Advance { ms }),
        1 => (0..32usize).prop_map(|pick| Action::Cancel { pick }),
        1 => (0..4usize, any::<bool>()).prop_map(|(site, on)| Action::Drain { site, on }),
        1 => (0..4usize, prop::bool::weighted(0.4)).prop_map(|(site, on)| Action::Revoke { site, on }),
        1 => (0..3usize).prop_map(|which| Action::Tenancy { which }),
        1 => (1..3u32).prop_map(|remove| Action::ScaleIn { remove }),
        1 => Just(Action::Resume),
        1 => (0..30u32).prop_map(|retention_s| Action::Archive { retention_s }),
        1 => (0..4usize).prop_map(|site| Action::AgentRestart { site }),
        1 => (prop::bool::weighted(0.7), any::<bool>())
            .prop_map(|(deploy, spot)| Action::Service { deploy, spot }),
    ]
}
