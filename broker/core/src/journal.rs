//! The journal: every change of broker state is recorded here before it is applied. Replaying the records
//! into an empty reactor rebuilds the same state. Liveness (heartbeats, repeated adverts of an unchanged
//! generation) is soft state and is not journaled: after a replay it is refreshed by the next heartbeats.

use super::reactor::Event;
use super::Millis;

/// One journaled step: when it happened and what happened. Stored as JSON (the events are made of wire types).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub at_ms: Millis,
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JournalError {
    /// The journal could not store the record; the step was not applied. Retryable.
    #[error("journal unavailable: {0}")]
    Unavailable(String),
}

/// Where records go. An implementation must have stored the record when `append` returns `Ok`.
pub trait Journal {
    fn append(&mut self, record: &Record) -> Result<(), JournalError>;
}

/// Keeps records in memory (until durable state on JetStream lands).
#[derive(Debug, Default)]
pub struct MemoryJournal {
    pub records: Vec<Record>,
}

impl Journal for MemoryJournal {
    fn append(&mut self, record: &Record) -> Result<(), JournalError> {
        self.records.push(record.clone());
        Ok(())
    }
}

/// Drops every record: for simulations, whose state lives only as long as the run.
#[derive(Debug, Default)]
pub struct NullJournal;

impl Journal for NullJournal {
    fn append(&mut self, _record: &Record) -> Result<(), JournalError> {
        Ok(())
    }
}

/// Holds records until the shell has made them durable (see `service::journal`): the reactor appends, the
/// shell takes them and stores them before it acts on the step.
#[derive(Debug, Default)]
pub struct BufferJournal {
    pending: Vec<Record>,
}

impl BufferJournal {
    pub fn take(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.pending)
    }
}

impl Journal for BufferJournal {
    fn append(&mut self, record: &Record) -> Result<(), JournalError> {
        self.pending.push(record.clone());
        Ok(())
    }
}
