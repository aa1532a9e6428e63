//! Field types that accept any JSON value and keep only what the bench reads, so that one field
//! of an unexpected type (a number where a string was expected) costs that field, not the event.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Whether the value is a non-empty string: a delta that carries generated text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Text(pub bool);

/// A count: a whole number that fits a `u32`, else `None`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count(pub Option<u32>);

/// A string, else `None`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Str(pub Option<String>);

/// An error's code or type read as the status it names ([`super::status_named`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status(pub Option<u16>);

/// The visit methods every lenient visitor shares: arrays and objects are read to their end and
/// give the default; so do the scalars a visitor does not override.
macro_rules! lenient {
    ($ty:ident, $what:literal, { $($visits:tt)* }) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_bool<E: de::Error>(self, _: bool) -> Result<$ty, E> {
                        Ok($ty::default())
                    }
                    fn visit_f64<E: de::Error>(self, _: f64) -> Result<$ty, E> {
                        Ok($ty::default())
                    }
                    fn visit_unit<E: de::Error>(self) -> Result<$ty, E> {
                        Ok($ty::default())
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<$ty, A::Error> {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        Ok($ty::default())
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$ty, A::Error> {
                        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                        Ok($ty::default())
                    }
                    $($visits)*
                }
                d.deserialize_any(V)
            }
        }
    };
}

lenient!(Text, "any JSON value", {
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
        Ok(Text(!v.is_empty()))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Text, E> {
        Ok(Text(false))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Text, E> {
        Ok(Text(false))
    }
});

lenient!(Count, "any JSON value", {
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Count, E> {
        Ok(Count(None))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
        Ok(Count(u32::try_from(v).ok()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
        Ok(Count(u32::try_from(v).ok()))
    }
});

lenient!(Str, "any JSON value", {
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Str, E> {
        Ok(Str(Some(v.to_owned())))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Str, E> {
        Ok(Str(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Str, E> {
        Ok(Str(None))
    }
});

lenient!(Status, "any JSON value", {
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Status, E> {
        Ok(Status(super::status_named(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Status, E> {
        Ok(Status(
            u16::try_from(v)
                .ok()
                .and_then(|n| super::status_named(&n.to_string())),
        ))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Status, E> {
        Ok(Status(
            u16::try_from(v)
                .ok()
                .and_then(|n| super::status_named(&n.to_string())),
        ))
    }
});

/// The error object of an error event or body, in any of the shapes: OpenAI's `{message, type,
/// code}` (vLLM's `code` the status as a number) and Anthropic's `{type, message}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct ErrorObject {
    pub message: Str,
    pub code: Status,
    #[serde(rename = "type")]
    pub kind: Status,
}

impl ErrorObject {
    /// The status its code names, else the one its type names.
    pub(crate) fn info(self) -> protocol::judge::ErrorInfo {
        protocol::judge::ErrorInfo {
            status: self.code.0.or(self.kind.0),
            message: self.message.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_json_value_reads_without_failing() {
        let values = [
            "\"x\"",
            "\"\"",
            "3",
            "-1",
            "4294967296",
            "1.5",
            "true",
            "null",
            "[1,[2]]",
            "{\"a\":{}}",
        ];
        for v in values {
            assert!(serde_json::from_str::<Text>(v).is_ok(), "{v}");
            assert!(serde_json::from_str::<Count>(v).is_ok(), "{v}");
            assert!(serde_json::from_str::<Str>(v).is_ok(), "{v}");
            assert!(serde_json::from_str::<Status>(v).is_ok(), "{v}");
        }
        assert_eq!(serde_json::from_str::<Text>("\"x\"").unwrap(), Text(true));
        assert_eq!(serde_json::from_str::<Text>("\"\"").unwrap(), Text(false));
        assert_eq!(serde_json::from_str::<Count>("7").unwrap(), Count(Some(7)));
        assert_eq!(serde_json::from_str::<Count>("-1").unwrap(), Count(None));
        assert_eq!(serde_json::from_str::<Status>("503").unwrap(), Status(Some(503)));
        assert_eq!(
            serde_json::from_str::<Status>("\"429\"").unwrap(),
            Status(Some(429))
        );
        assert_eq!(serde_json::from_str::<Status>("70000").unwrap(), Status(None));
    }
}
