//! Decoding and encoding of wire messages: size limit, JSON syntax and shape, version, then field values.

use crate::error::WireError;
use crate::validate::Validate;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest message accepted, in bytes. Adverts of big sites are the largest messages; 1 MiB is NATS's default
/// payload limit.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Decodes and validates one message.
pub fn decode<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge {
            size: bytes.len(),
            limit: MAX_MESSAGE_BYTES,
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        WireError::Malformed {
            path,
            message: inner.to_string(),
        }
    })?;
    de.end().map_err(|e| WireError::Malformed {
        path: ".".into(),
        message: e.to_string(),
    })?;
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

/// Encodes a message as JSON.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    serde_json::to_vec(value).map_err(|e| WireError::Encode(e.to_string()))
}
