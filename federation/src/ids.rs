//! Identifier newtypes. Every id is also a single NATS subject token, so it is checked on construction:
//! 1 to 64 characters from `A-Z a-z 0-9 _ -`. The text is shared (`Arc<str>`), so a copy is a reference count.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Longest id accepted, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// What makes a text unusable as an id (or as any name that is a subject token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdProblem {
    #[error("must not be empty")]
    Empty,
    #[error("is {0} bytes long; the limit is {MAX_ID_LEN}")]
    TooLong(usize),
    #[error("contains {0:?}; only letters, digits, '_' and '-' are allowed")]
    Character(char),
}

/// A text that is not a valid id, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid id {id:?}: {problem}")]
pub struct IdError {
    pub id: String,
    pub problem: IdProblem,
}

/// Checks that `s` is a usable id.
pub fn check_id(s: &str) -> Result<(), IdProblem> {
    if s.is_empty() {
        return Err(IdProblem::Empty);
    }
    if s.len() > MAX_ID_LEN {
        return Err(IdProblem::TooLong(s.len()));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(IdProblem::Character(c));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        id_type!(@common $(#[$doc])* #[derive(PartialOrd, Ord)] $name);
    };
    (@common $(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Builds the id, or says why `s` is not a valid one.
            pub fn new(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                match check_id(&s) {
                    Ok(()) => Ok(Self(Arc::from(s))),
                    Err(problem) => Err(IdError { id: s, problem }),
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = crate::names::shared_text(d)?;
                match check_id(&text) {
                    Ok(()) => Ok(Self(text)),
                    Err(problem) => Err(serde::de::Error::custom(IdError {
                        id: text.to_string(),
                        problem,
                    })),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }
    };
}

id_type!(
    /// A site: one datacenter, edge location or cloud region running one agent.
    SiteId
);
id_type!(@common
    /// A job, assigned by the broker. Ordered by length, then text: numbered ids (`j-000123`) sort in the order
    /// they were made, past a million jobs too (`j-999999` < `j-1000000`).
    JobId
);

impl PartialOrd for JobId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for JobId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.cmp(&other.0))
    }
}
id_type!(
    /// A tenant (team or project) that owns jobs.
    TenantId
);

impl JobId {
    /// The id of the `n`-th job a broker creates: `j-` and at least six digits, always a valid id.
    pub fn numbered(n: u64) -> Self {
        JobId(Arc::from(format!("j-{n:06}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_subject_safe_ids() {
        assert!(SiteId::new("dc-virginia_1").is_ok());
    }

    #[test]
    fn rejects_dots_wildcards_spaces_and_length() {
        for bad in ["a.b", "a*", ">", "a b", "", &"x".repeat(65)] {
            let err = SiteId::new(bad).expect_err(bad).to_string();
            assert!(err.contains("invalid id"), "{err}");
        }
    }

    #[test]
    fn numbered_job_ids_sort_in_creation_order_past_a_million() {
        assert!(JobId::numbered(999_999) < JobId::numbered(1_000_000));
        assert!(JobId::numbered(7) < JobId::numbered(12));
    }

    #[test]
    fn deserialising_checks_the_id() {
        let err = serde_json::from_str::<SiteId>("\"a.b\"").expect_err("dot");
        assert!(err.to_string().contains("only letters"), "{err}");
    }
}
