//! Decoding and encoding of wire messages: size limit, nesting depth, JSON syntax and shape, version, then
//! field values.
//!
//! Two strictnesses. What people type — API requests, job specs — is decoded with [`decode_strict`]: a field
//! the message type does not have is an error that names its path (`constraints.residancy`), so a typo never
//! silently changes where work runs. Between components (agents and brokers of the same major wire version)
//! [`decode`] ignores unknown fields, so a peer one release ahead or behind keeps working; each one is counted
//! ([`unknown_fields`]) and logged once.

use crate::error::WireError;
use crate::validate::Validate;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Largest message accepted, in bytes. Adverts of big sites are the largest messages; 1 MiB is NATS's default
/// payload limit.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Deepest nesting of JSON arrays and objects accepted (the deepest message, an offer, nests 6 deep).
pub const MAX_DEPTH: usize = 32;

/// Longest JSON string accepted, as written (escapes included): twice the longest field a message may hold
/// (a job's command, 64 KiB), so a string's length is bounded before anything is allocated for it.
pub const MAX_STRING_BYTES: usize = 128 * 1024;

/// Unknown fields seen in tolerant decoding, by message type and path.
static UNKNOWN: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// How many times each unknown field was ignored, as `Type.path` → count.
pub fn unknown_fields() -> Vec<(String, u64)> {
    UNKNOWN
        .lock()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
        .unwrap_or_default()
}

/// Decodes and validates one message from another component; unknown fields are ignored, counted and logged
/// once per type and path.
pub fn decode<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, WireError> {
    let (value, unknown) = parse::<T>(bytes)?;
    if !unknown.is_empty() {
        let kind = short_type_name::<T>();
        if let Ok(mut seen) = UNKNOWN.lock() {
            for path in unknown {
                let key = format!("{kind}.{path}");
                let n = seen.entry(key.clone()).or_insert(0);
                if *n == 0 {
                    tracing::warn!(
                        "ignored an unknown field {key:?} (a peer of a newer release?); counted, logged once"
                    );
                }
                *n += 1;
            }
        }
    }
    check(value)
}

/// Decodes and validates one message that a person wrote (API requests, job specs): an unknown field is an
/// error naming its path.
pub fn decode_strict<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, WireError> {
    let (value, unknown) = parse::<T>(bytes)?;
    if let Some(path) = unknown.into_iter().next() {
        return Err(WireError::UnknownField { path });
    }
    check(value)
}

fn check<T: Validate>(value: T) -> Result<T, WireError> {
    let v = value.version();
    if v != crate::WIRE_VERSION {
        return Err(WireError::UnsupportedVersion {
            found: v,
            supported: crate::WIRE_VERSION,
        });
    }
    value.validate()?;
    Ok(value)
}

/// Size, depth, then the JSON into `T`, collecting the paths of fields `T` does not have.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, Vec<String>), WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge {
            size: bytes.len(),
            limit: MAX_MESSAGE_BYTES,
        });
    }
    let (depth, longest) = shape(bytes);
    if depth > MAX_DEPTH {
        return Err(WireError::TooDeep {
            depth,
            limit: MAX_DEPTH,
        });
    }
    if longest > MAX_STRING_BYTES {
        return Err(WireError::TooLong {
            length: longest,
            limit: MAX_STRING_BYTES,
        });
    }
    // Most messages are well formed: read without tracking the path, and read again with it to say where
    // one is not.
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(ignored_path(&path));
    let fast: Result<T, _> = T::deserialize(serde_ignored::Deserializer::new(&mut de, &mut note));
    if let Ok(value) = fast {
        if de.end().is_ok() {
            return Ok((value, unknown));
        }
    }
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(ignored_path(&path));
    let ignoring = serde_ignored::Deserializer::new(&mut de, &mut note);
    let value: T = serde_path_to_error::deserialize(ignoring).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        WireError::Malformed {
            path: field_path(&path, &message),
            message,
        }
    })?;
    de.end().map_err(|e| WireError::Malformed {
        path: ".".into(),
        message: e.to_string(),
    })?;
    Ok((value, unknown))
}

/// An ignored field's path written as every other error path is: `users[0].location.alt`.
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => {
            let head = ignored_path(parent);
            if head.is_empty() {
                key.clone()
            } else {
                format!("{head}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

/// The path an error is about: for a missing field, the field itself (serde reports the object holding it).
fn field_path(path: &str, message: &str) -> String {
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    match missing {
        Some(name) if path == "." || path.is_empty() => name.to_owned(),
        Some(name) => format!("{path}.{name}"),
        None => path.to_owned(),
    }
}

/// The deepest nesting of arrays and objects, counted outside strings, and the longest string as written (a
/// malformed text gets some numbers; the parser then says what is wrong with it).
fn shape(bytes: &[u8]) -> (usize, usize) {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    let (mut len, mut longest) = (0usize, 0usize);
    for &b in bytes {
        if in_string {
            len += 1;
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    longest = longest.max(len - 1);
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                len = 0;
            }
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if in_string {
        longest = longest.max(len);
    }
    (max, longest)
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Encodes a message as JSON.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    serde_json::to_vec(value).map_err(|e| WireError::Encode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_only_outside_strings() {
        assert_eq!(shape(br#"{"a":[1,{"b":"[[[{{{"}]}"#), (3, 6));
        assert_eq!(shape(br#"{"a":"\"{"}"#), (1, 3));
    }

    #[test]
    fn an_overlong_string_is_refused_before_it_is_decoded() {
        let long = format!(
            "{{\"v\":1,\"job\":\"{}\"}}",
            "x".repeat(MAX_STRING_BYTES + 1)
        );
        let e = decode::<crate::JobRef>(long.as_bytes())
            .err()
            .map(|e| e.to_string());
        assert!(e.as_deref().is_some_and(|e| e.contains("string")), "{e:?}");
    }

    #[test]
    fn an_unknown_field_inside_a_list_is_named_with_its_index() {
        #[derive(Debug, serde::Deserialize)]
        struct Location {
            #[allow(dead_code)]
            lat: f64,
        }
        #[derive(Debug, serde::Deserialize)]
        struct User {
            #[allow(dead_code)]
            location: Location,
        }
        #[derive(Debug, serde::Deserialize)]
        struct Users {
            #[allow(dead_code)]
            users: Vec<User>,
        }
        let (_, unknown) = parse::<Users>(
            br#"{"users": [{"location": {"lat": 1.0}}, {"location": {"lat": 2.0, "alt": 3}}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(unknown, vec!["users[1].location.alt".to_owned()]);
    }

    #[test]
    fn a_missing_field_is_named_with_its_path() {
        assert_eq!(field_path(".", "missing field `tenant`"), "tenant");
        assert_eq!(
            field_path("resources", "missing field `kind` at line 1"),
            "resources.kind"
        );
        assert_eq!(field_path("users[0]", "invalid type"), "users[0]");
    }
}
