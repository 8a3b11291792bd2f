//! allot's wire types: the JSON bodies of the HTTP API, shared by the server and the client.
//!
//! These are the API's contract and change only compatibly. They are plain data: no logic, no
//! validation (the server validates when it converts them into `allot_core` types).
//!
//! One module per part (`quotas`, `pools`, `apps`, `runs`) and one for the change feed (`watch`),
//! every type re-exported here; this module holds the daemon's own bodies (health, readiness,
//! errors; `codes`: every `ErrorCode`) and the readers shared by all (`object`, `integer`);
//! `spec` reads what allot itself takes from a task's free-form spec.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod access;
mod apps;
mod codes;
mod pools;
mod quotas;
mod runs;
pub mod spec;
mod watch;

pub use access::*;
pub use apps::*;
pub use codes::{ErrorCode, Part};
pub use pools::*;
pub use quotas::*;
pub use runs::*;
pub use watch::*;

/// Nested objects are JSON objects: serde would also read a struct from an array (`[1, 2]` as
/// `{"project": 1, "namespace": 2}`), which the API's document does not allow.
pub mod object {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::value::MapAccessDeserializer;
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

    struct MapOnly<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }

    struct OptionalMap<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for OptionalMap<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object or null")
        }
        fn visit_none<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
            deserializer.deserialize_map(MapOnly(PhantomData)).map(Some)
        }
    }

    /// For an `Option<T>` field whose `T` is a struct.
    pub fn optional<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        deserializer.deserialize_option(OptionalMap(PhantomData))
    }
}

/// Reading integers as JSON Schema defines them: `integer` includes numbers whose fraction is
/// zero (`10.0`, `1e3`), which serde would refuse for a `u64`. Used on every integer a request
/// body carries; a fraction, a negative number or one above `u64::MAX` is still refused.
pub mod integer {
    use serde::de::{self, Deserialize, Deserializer, Visitor};

    struct Integer(u64);

    impl<'de> Deserialize<'de> for Integer {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Integer, D::Error> {
            struct Whole;
            impl Visitor<'_> for Whole {
                type Value = Integer;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a whole number, 0 or more")
                }
                fn visit_u64<E: de::Error>(self, value: u64) -> Result<Integer, E> {
                    Ok(Integer(value))
                }
                fn visit_i64<E: de::Error>(self, value: i64) -> Result<Integer, E> {
                    u64::try_from(value).map(Integer).map_err(|_| E::custom(format!("{value} is negative")))
                }
                fn visit_f64<E: de::Error>(self, value: f64) -> Result<Integer, E> {
                    // 2^64 is the first value above u64::MAX that an f64 holds.
                    if value.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&value) {
                        Ok(Integer(value as u64))
                    } else {
                        Err(E::custom(format!("{value} is not a whole number from 0 to {}", u64::MAX)))
                    }
                }
            }
            deserializer.deserialize_u64(Whole)
        }
    }

    /// For a `u64` field.
    pub fn required<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        Integer::deserialize(deserializer).map(|i| i.0)
    }

    /// For an `Option<u64>` field (`null` or absent is `None`).
    pub fn optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        Option::<Integer>::deserialize(deserializer).map(|i| i.map(|i| i.0))
    }

    /// For a `u32` field.
    pub fn required_u32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        let value = Integer::deserialize(deserializer)?.0;
        u32::try_from(value).map_err(|_| de::Error::custom(format!("{value} is above {}", u32::MAX)))
    }

    /// An `i32` from a JSON number (a whole float too).
    struct Signed(i32);

    impl<'de> Deserialize<'de> for Signed {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Signed, D::Error> {
            struct Whole;
            impl Visitor<'_> for Whole {
                type Value = Signed;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    write!(f, "a whole number from {} to {}", i32::MIN, i32::MAX)
                }
                fn visit_u64<E: de::Error>(self, value: u64) -> Result<Signed, E> {
                    i32::try_from(value).map(Signed).map_err(|_| E::custom(format!("{value} is above {}", i32::MAX)))
                }
                fn visit_i64<E: de::Error>(self, value: i64) -> Result<Signed, E> {
                    i32::try_from(value)
                        .map(Signed)
                        .map_err(|_| E::custom(format!("{value} is not from {} to {}", i32::MIN, i32::MAX)))
                }
                fn visit_f64<E: de::Error>(self, value: f64) -> Result<Signed, E> {
                    if value.fract() == 0.0 && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&value) {
                        Ok(Signed(value as i32))
                    } else {
                        Err(E::custom(format!("{value} is not a whole number from {} to {}", i32::MIN, i32::MAX)))
                    }
                }
            }
            deserializer.deserialize_i64(Whole)
        }
    }

    /// For an `i32` field (such as a priority).
    pub fn signed<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
        Signed::deserialize(deserializer).map(|s| s.0)
    }

    /// For an `Option<i32>` field (`null` or absent is `None`).
    pub fn signed_optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i32>, D::Error> {
        Option::<Signed>::deserialize(deserializer).map(|s| s.map(|s| s.0))
    }
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub backend: String,
    /// What an acknowledged change survives: `disk` (a power loss) or `process` (a crash of the
    /// daemon, not a power loss) on the embedded store; `redis` on Redis (what its persistence
    /// settings keep).
    #[serde(default)]
    pub durability: String,
    pub version: String,
}

/// `GET /readyz`: whether this daemon can serve every part of the API now (200), or not yet (503).
/// `/healthz` only says that the process answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: String,
    pub backend: String,
    /// One per part the daemon serves, in a fixed order: `store` (quotas, pools and runs) and
    /// `applications` (queues, applications and tasks).
    pub checks: Vec<ReadinessCheck>,
}

/// Whether one part of the API can be served now, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadinessCheck {
    pub name: String,
    pub ready: bool,
    /// Why it is not ready (or, when ready, where it is served, e.g. by another daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Every error answer: a stable machine-readable `code` and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// One of the codes listed in the API's description, e.g. `namespace_not_found`.
    pub code: String,
    pub message: String,
    /// With `revision_compacted`: the oldest revision a watch can start after now (etcd's
    /// `compact_revision`); watch from it, or list again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_revision: Option<u64>,
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    struct Units {
        #[serde(deserialize_with = "crate::integer::required")]
        units: u64,
    }

    /// A whole number spelled with a fraction of zero is read exactly, up to 2^53: JSON numbers
    /// are parsed to the nearest float (serde_json's `float_roundtrip`), not one step off.
    #[test]
    fn whole_floats_are_read_exactly() {
        for (text, want) in
            [("4081970639192801.0", 4_081_970_639_192_801), ("1e3", 1000), ("9007199254740991.0", (1 << 53) - 1)]
        {
            let read: Units = serde_json::from_str(&format!(r#"{{"units": {text}}}"#)).unwrap();
            assert_eq!(read.units, want, "{text}");
        }
        assert!(serde_json::from_str::<Units>(r#"{"units": 2.5}"#).is_err());
    }
}
