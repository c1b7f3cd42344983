//! Name newtypes for the things the domain names: pools, queues, device models and services.
//!
//! Unlike ids ([`crate::ids`]), a name is not checked on construction: the message that carries it is checked
//! field by field ([`crate::validate`]), so the error names the field (`pools[2].name`, `resources.models[0]`).
//! A name serialises as its bare text, so the wire and the journal are unchanged by the types; what they add
//! is that a pool name cannot be passed where a model or a queue is meant. The text is shared (`Arc<str>`):
//! placement copies names into every candidate it explains, and a copy is a reference count.

use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// Text read into shared storage with one allocation (none in between, where the input lends it).
pub(crate) fn shared_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = Arc<str>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Arc<str>, E> {
            Ok(Arc::from(v))
        }
    }
    d.deserialize_str(Text)
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl Into<String>) -> Self {
                Self(Arc::from(s.into()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(Arc::from(s))
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(Arc::from(s))
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0.to_string()
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                shared_text(d).map(Self)
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        impl fmt::Display for $name {
            /// The text, padded as the format asks (`{:<8}` in a table).
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }
    };
}

name_type!(
    /// A pool of identical accelerators, unique within its site.
    PoolName
);
name_type!(
    /// A tenant's queue, unique within the federation's tenancy.
    QueueName
);
name_type!(
    /// A device model (`H100`, `V100`, `T4`). Jobs name the models they allow case-insensitively:
    /// compare with [`ModelName::matches`].
    ModelName
);
name_type!(
    /// An inference service; its replicas are jobs that name it.
    ServiceName
);

impl ModelName {
    /// Whether `self` and `other` name the same model, ignoring ASCII case, as jobs name models.
    pub fn matches(&self, other: &str) -> bool {
        self.0.eq_ignore_ascii_case(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_serialise_as_their_bare_text() {
        let p = PoolName::from("h100-sxm");
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"h100-sxm\"");
        let back: PoolName = serde_json::from_str("\"h100-sxm\"").unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn names_pad_in_tables() {
        assert_eq!(format!("[{:<6}]", PoolName::from("gpu")), "[gpu   ]");
    }

    #[test]
    fn models_match_ignoring_case() {
        assert!(ModelName::from("H100").matches("h100"));
        assert!(!ModelName::from("H100").matches("H200"));
    }

    #[test]
    fn a_map_keyed_by_name_is_looked_up_by_text() {
        let mut m = std::collections::BTreeMap::new();
        m.insert(QueueName::from("research"), 1);
        assert_eq!(m.get("research"), Some(&1));
    }
}
