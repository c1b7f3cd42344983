//! The durable formats: journal batches and snapshots, each with a format version.
//!
//! A batch (one journal message) and a snapshot carry `format`: the version of the record types they hold.
//! [`FORMAT_VERSION`] is the newest this code reads and writes; a broker writes the format in force in its
//! journal (see `Event::UpgradeFormat`), which changes only when an operator upgrades it, so a standby of the
//! previous release can keep reading. Reading a batch or snapshot of a newer format than [`FORMAT_VERSION`] is an
//! error that names both versions: the broker stops rather than misread it.
//!
//! Format 1 is the format of the first durable broker, which wrote no `format` field: a batch or snapshot
//! without one is format 1. Fixtures of every format live in `tests/fixtures/format-N/` and are replayed by
//! `tests/formats.rs`; they are never regenerated. A change to a journaled type (an event, a job or site
//! record, or a wire type inside them) bumps [`FORMAT_VERSION`] and adds a fixture.

use crate::journal::Record;
use crate::snapshot::Snapshot;
use serde::{Deserialize, Serialize};

/// The newest durable format this code knows.
pub const FORMAT_VERSION: u32 = 9;

/// The format of batches and snapshots written before formats were numbered.
pub const FIRST_FORMAT: u32 = 1;

pub(crate) fn first_format() -> u32 {
    FIRST_FORMAT
}

/// One journal message: the records of a batch of steps, and who wrote it. A batch without records marks a
/// broker's takeover.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// The format of `records`.
    #[serde(default = "first_format")]
    pub format: u32,
    /// The writing broker's instance name.
    pub leader: String,
    /// The writer's batch number (with `leader`, identifies a retried append).
    pub n: u64,
    pub records: Vec<Record>,
    /// Journal messages an operator set aside because no broker could read them (`meridian journal
    /// quarantine`): replay skips them. Kept in the stream, unread, for whoever investigates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<u64>,
}

/// Why a batch or snapshot cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Written by a newer broker: this one must not guess at it. Not retryable; upgrade the broker.
    #[error("written in durable format {found}, newer than the newest this broker knows ({known}): run a broker release that knows format {found}")]
    Newer { found: u32, known: u32 },
    /// Not a batch or snapshot of a known format (corrupt, or not written by a broker). Not retryable.
    #[error("unreadable: {0}")]
    Unreadable(String),
}

/// Reads the format first, so that a newer batch is reported as newer rather than as unreadable.
fn check_format(bytes: &[u8]) -> Result<u32, FormatError> {
    #[derive(Deserialize)]
    struct Head {
        #[serde(default = "first_format")]
        format: u32,
    }
    let head: Head =
        serde_json::from_slice(bytes).map_err(|e| FormatError::Unreadable(e.to_string()))?;
    if head.format > FORMAT_VERSION {
        return Err(FormatError::Newer {
            found: head.format,
            known: FORMAT_VERSION,
        });
    }
    if head.format < FIRST_FORMAT {
        return Err(FormatError::Unreadable(format!(
            "format {} is not a durable format",
            head.format
        )));
    }
    Ok(head.format)
}

pub fn decode_batch(bytes: &[u8]) -> Result<Batch, FormatError> {
    check_format(bytes)?;
    serde_json::from_slice(bytes).map_err(|e| FormatError::Unreadable(e.to_string()))
}

pub fn encode_batch(batch: &Batch) -> Result<Vec<u8>, FormatError> {
    serde_json::to_vec(batch).map_err(|e| FormatError::Unreadable(e.to_string()))
}

pub fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot, FormatError> {
    // Decoded first and its format checked after, rather than the format read first as a batch's is: reading
    // the format alone is a scan of the whole snapshot, a second or more at a million jobs. A snapshot that
    // does not decode is then checked for its format, so that a newer one is still reported as newer.
    match serde_json::from_slice::<Snapshot>(bytes) {
        Ok(snap) if snap.format > FORMAT_VERSION => Err(FormatError::Newer {
            found: snap.format,
            known: FORMAT_VERSION,
        }),
        Ok(snap) if snap.format < FIRST_FORMAT => Err(FormatError::Unreadable(format!(
            "format {} is not a durable format",
            snap.format
        ))),
        Ok(snap) => Ok(snap),
        Err(e) => {
            check_format(bytes)?;
            Err(FormatError::Unreadable(e.to_string()))
        }
    }
}

pub fn encode_snapshot(snapshot: &Snapshot) -> Result<Vec<u8>, FormatError> {
    serde_json::to_vec(snapshot).map_err(|e| FormatError::Unreadable(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_batch_without_a_format_is_format_1_and_a_newer_one_is_refused_by_name() {
        let b = decode_batch(br#"{"leader":"a","n":1,"records":[]}"#).unwrap();
        assert_eq!(b.format, 1);
        let newer = format!(
            r#"{{"format":{},"leader":"a","n":1,"records":[{{"at_ms":1,"event":"from_the_future"}}]}}"#,
            FORMAT_VERSION + 1
        );
        let e = decode_batch(newer.as_bytes()).unwrap_err();
        assert_eq!(
            e,
            FormatError::Newer {
                found: FORMAT_VERSION + 1,
                known: FORMAT_VERSION
            }
        );
        assert!(e
            .to_string()
            .contains("newer than the newest this broker knows"));
        assert!(matches!(
            decode_batch(b"seven b"),
            Err(FormatError::Unreadable(_))
        ));
    }

    #[test]
    fn a_snapshot_of_a_newer_format_is_refused_by_name_whether_or_not_it_decodes() {
        let fixture = include_str!("../tests/fixtures/format-9/snapshot.json");
        let mut v: serde_json::Value = serde_json::from_str(fixture).unwrap();
        v["format"] = (FORMAT_VERSION + 1).into();
        let decodes = serde_json::to_vec(&v).unwrap();
        v["jobs"][0]["phase"] = "from_the_future".into();
        let does_not = serde_json::to_vec(&v).unwrap();
        for bytes in [decodes, does_not] {
            assert_eq!(
                decode_snapshot(&bytes).unwrap_err(),
                FormatError::Newer {
                    found: FORMAT_VERSION + 1,
                    known: FORMAT_VERSION
                }
            );
        }
        v["format"] = 0.into();
        assert!(matches!(
            decode_snapshot(&serde_json::to_vec(&v).unwrap()),
            Err(FormatError::Unreadable(_))
        ));
        assert!(matches!(
            decode_snapshot(b"{\"format\":8,"),
            Err(FormatError::Unreadable(_))
        ));
    }
}
