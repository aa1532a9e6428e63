//! The same judgement made the plain way — the SSE specification's line reading written out
//! again and a whole parse into a tree ([`Value`]) — which the tests and the fuzz target hold
//! [`super::judge`] equal to.

use super::{ErrorInfo, Kind, Usage};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;

/// A parsed JSON value, as `serde_json::Value` holds one (a key written twice keeps its last
/// value), built by serde_json's own parser but by a visitor of its own: `Value`'s reads a
/// private marker key specially when serde_json's `raw_value` feature is on, which JSON
/// does not.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// A number: its value when it is a whole number that fits a `u64`.
    Number(Option<u64>),
    String(String),
    Array(Vec<Value>),
    Object(BTreeMap<String, Value>),
}

impl Value {
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(m) => m.get(key),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) => *n,
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&Vec<Value>> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
    pub fn is_object(&self) -> bool {
        matches!(self, Value::Object(_))
    }
}

impl<'de> de::Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(Some(n)))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Number(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Number(None))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// What a reader of the event would say of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub kind: Kind,
    pub usage: Option<Usage>,
    pub error: Option<ErrorInfo>,
    pub id: Option<String>,
    /// The top-level `model`, when it is a string.
    pub model: Option<String>,
}

/// The event's data, read line by line as the SSE specification's algorithm does.
pub fn data(event: &[u8]) -> Option<Vec<u8>> {
    let mut lines = Vec::new();
    let mut line = Vec::new();
    let mut bytes = event.iter().peekable();
    let mut ended = false;
    while let Some(&b) = bytes.next() {
        match b {
            b'\r' => {
                if bytes.peek() == Some(&&b'\n') {
                    bytes.next();
                }
                lines.push(std::mem::take(&mut line));
                ended = true;
            }
            b'\n' => {
                lines.push(std::mem::take(&mut line));
                ended = true;
            }
            _ => {
                line.push(b);
                ended = false;
            }
        }
    }
    if !ended && !line.is_empty() {
        lines.push(line);
    }
    let mut buffer: Option<Vec<u8>> = None;
    for l in lines {
        let (field, value) = match l.iter().position(|b| *b == b':') {
            Some(0) => continue,
            Some(i) => {
                let v = &l[i + 1..];
                (&l[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&l[..], &l[l.len()..]),
        };
        if field == b"data" {
            let b = buffer.get_or_insert_with(Vec::new);
            b.extend_from_slice(value);
            b.push(b'\n');
        }
    }
    buffer.map(|mut b| {
        b.pop();
        b
    })
}

/// The judgement of one event.
pub fn judge(event: &[u8]) -> Summary {
    match data(event) {
        None => summary(Kind::Other),
        Some(d) => judge_data(&d),
    }
}

fn summary(kind: Kind) -> Summary {
    Summary {
        kind,
        usage: None,
        error: None,
        id: None,
        model: None,
    }
}

fn non_empty_str(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| !s.is_empty())
}

fn count(v: Option<&Value>) -> Option<u32> {
    v.and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok())
}

/// The judgement of an event's data.
pub fn judge_data(data: &[u8]) -> Summary {
    if data.trim_ascii() == b"[DONE]" {
        return summary(Kind::Done);
    }
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(data) else {
        return summary(Kind::Other);
    };
    let error = top.get("error").filter(|e| !e.is_null()).map(|e| ErrorInfo {
        status: e.get("code").and_then(|c| {
            let n = c.as_u64().or_else(|| c.as_str().and_then(|s| s.parse().ok()))?;
            u16::try_from(n).ok().filter(|s| (400..600).contains(s))
        }),
        message: e.get("message").and_then(Value::as_str).map(str::to_owned),
    });
    let choices = top.get("choices").and_then(Value::as_array);
    let tokens = choices.is_some_and(|cs| {
        cs.iter().any(|c| {
            non_empty_str(c.get("text"))
                || c.get("delta").filter(|d| d.is_object()).is_some_and(|d| {
                    non_empty_str(d.get("content"))
                        || non_empty_str(d.get("reasoning"))
                        || non_empty_str(d.get("reasoning_content"))
                        || d.get("tool_calls")
                            .and_then(Value::as_array)
                            .is_some_and(|t| !t.is_empty())
                })
        })
    });
    let usage = top.get("usage").filter(|u| u.is_object()).map(|u| Usage {
        prompt_tokens: count(u.get("prompt_tokens")),
        completion_tokens: count(u.get("completion_tokens")),
    });
    let kind = if error.is_some() {
        Kind::Error
    } else if tokens {
        Kind::Tokens
    } else if usage.is_some() && choices.is_some_and(Vec::is_empty) {
        Kind::Usage
    } else {
        Kind::Other
    };
    Summary {
        kind,
        usage,
        error,
        id: top.get("id").and_then(Value::as_str).map(str::to_owned),
        model: top.get("model").and_then(Value::as_str).map(str::to_owned),
    }
}
