//! What one SSE event of an OpenAI stream says, read as a JSON parser reads it: its kind (tokens,
//! usage, the end, an error), its usage, the status its error names, its id and where its
//! `model` is written. The one definition of "this event carries generated tokens", shared by the
//! gateway's relay and the load tester, so that the two cannot disagree on a stream's TTFT.
//!
//! Whatever the replica's style — compact JSON as vLLM writes it, `json.dumps`' spaces, pretty
//! JSON over several `data:` lines, CRLF or CR line ends, keys in any order or `\u`-escaped — the
//! answer is the parse's: serde_json reads the event's data (without building a tree, with no
//! allocation for an ordinary chunk), and [`reference`] says the same with `serde_json::Value`, which
//! tests and the `sse_judge` fuzz target hold it equal to.
//!
//! The rules, for an event whose data (its `data:` lines joined, as the SSE specification says) is:
//! - `[DONE]` (blanks around it allowed): [`Kind::Done`];
//! - not a JSON object: [`Kind::Other`];
//! - an object whose `error` is present and not null: [`Kind::Error`];
//! - an object with a choice (`choices` an array of objects) whose `text` is a non-empty string, or
//!   whose `delta` is an object with a non-empty string `content`, `reasoning` (vLLM 0.32) or
//!   `reasoning_content` (older), or a non-empty array `tool_calls`: [`Kind::Tokens`];
//! - an object whose `usage` is an object and whose `choices` is an empty array: [`Kind::Usage`];
//! - anything else (the role chunk, the finish chunk, comments, keep-alives): [`Kind::Other`].
//!
//! A key written twice counts as its last value, as in a parsed object.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::ops::Range;

/// The visit methods of a lenient visitor for the kinds of JSON value it does not read: each is
/// passed over (arrays and objects read to their end) and gives `$value`.
macro_rules! passes_over {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

macro_rules! passes_over_str {
    ($value:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

macro_rules! passes_over_seq {
    ($value:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Skip::seq(seq)?;
            Ok($value)
        }
    };
}

macro_rules! passes_over_map {
    ($value:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            Skip::map(map)?;
            Ok($value)
        }
    };
}

/// A deserialisable type whose visitor is itself (every value of JSON accepted).
macro_rules! any_value {
    ($ty:ty) => {
        impl<'de> de::Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(<$ty>::default())
            }
        }
    };
}

/// What one event of an OpenAI stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `data: [DONE]`.
    Done,
    /// `{"error": …}` in place of a chunk.
    Error,
    /// A chunk carrying generated tokens: text, reasoning or tool-call arguments.
    Tokens,
    /// The usage-only chunk (`"choices":[]` with `usage`).
    Usage,
    /// Anything else.
    Other,
}

/// The token counts of a `usage` object; a count is `None` unless it is a whole number that fits
/// a `u32`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
}

impl Usage {
    /// `(prompt, completion)` as the gateway counts them: the prompt's count is needed, an absent
    /// completion count (an embeddings answer) is 0.
    pub fn pair(&self) -> Option<(u32, u32)> {
        Some((self.prompt_tokens?, self.completion_tokens.unwrap_or(0)))
    }
}

/// The error object of an error event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorInfo {
    /// The status its `code` names (an integer, or digits in a string) when that is 400–599.
    pub status: Option<u16>,
    /// Its `message`, when that is a string.
    pub message: Option<String>,
}

/// An event's data: its `data:` lines joined by line feeds, as the SSE specification reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data<'a> {
    /// One `data:` line: its value, lent from the event, which holds it at `at`.
    Line { value: &'a [u8], at: usize },
    /// Several `data:` lines, joined.
    Joined(Vec<u8>),
}

impl Data<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Data::Line { value, .. } => value,
            Data::Joined(v) => v,
        }
    }
}

/// Everything the gateway and the bench read out of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub kind: Kind,
    /// The top-level `usage`, when it is an object.
    pub usage: Option<Usage>,
    /// The top-level `error`, when it is present and not null.
    pub error: Option<ErrorInfo>,
    /// Where the top-level `id` is written in the data, when it is a string (the JSON string,
    /// quotes included).
    pub id: Option<Range<usize>>,
    /// Where each top-level `model` member's value is written in the data, in order; `None` for
    /// one that is not a string.
    pub models: Models,
    /// For a chunk with tokens: where one non-empty string that carries them is written in the
    /// data (quotes excluded), when it has no escapes. An event that differs from this one only
    /// inside that string, and there by other plain characters, is judged the same: the relay's
    /// short way for a stream's next chunk (`gateway::event::Reader`).
    pub token: Option<Range<usize>>,
}

impl Judgement {
    pub(crate) fn of_kind(kind: Kind) -> Judgement {
        Judgement {
            kind,
            usage: None,
            error: None,
            id: None,
            models: Models::default(),
            token: None,
        }
    }

    /// The id, read from the event's data.
    pub fn id(&self, data: &[u8]) -> Option<String> {
        decode_str(data.get(self.id.clone()?)?)
    }
}

/// The `model` members of an object: nearly always one, so the first is kept without allocating.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Models {
    first: Option<Option<Range<usize>>>,
    more: Vec<Option<Range<usize>>>,
}

impl Models {
    fn push(&mut self, span: Option<Range<usize>>) {
        if self.first.is_none() {
            self.first = Some(span);
        } else {
            self.more.push(span);
        }
    }

    /// Each member's span, `None` for a value that is not a string.
    pub fn iter(&self) -> impl Iterator<Item = &Option<Range<usize>>> {
        self.first.iter().chain(self.more.iter())
    }

    /// The value a parse keeps (the last member's), when it is a string.
    pub fn last(&self, data: &[u8]) -> Option<String> {
        let span = self.iter().last()?.clone()?;
        decode_str(data.get(span)?)
    }
}

/// A JSON string, quotes included, decoded.
pub fn decode_str(json: &[u8]) -> Option<String> {
    serde_json::from_slice::<String>(json).ok()
}

/// Judges one SSE event (its lines, with or without the blank line that ends it).
pub fn judge(event: &[u8]) -> (Judgement, Option<Data<'_>>) {
    match data(event) {
        None => (Judgement::of_kind(Kind::Other), None),
        Some(d) => {
            let j = judge_data(d.bytes());
            (j, Some(d))
        }
    }
}

/// Judges an event's data.
pub fn judge_data(data: &[u8]) -> Judgement {
    judge_json(data, false)
}

/// Judges a whole (non-streamed) answer: as [`judge_data`], but the members it does not read are
/// passed over as serde's `IgnoredAny` does (numbers not converted: an embeddings answer is
/// thousands of them), so an answer a parse would refuse for a number out of range there is still
/// read.
pub fn judge_whole(data: &[u8]) -> Judgement {
    judge_json(data, true)
}

fn judge_json(data: &[u8], lenient: bool) -> Judgement {
    if data.trim_ascii() == b"[DONE]" {
        return Judgement::of_kind(Kind::Done);
    }
    // UTF-8 is checked once, up front (fast), so that serde's reader need not check it again and
    // ignored strings are held to the same rule as read ones.
    let Ok(text) = std::str::from_utf8(data) else {
        return Judgement::of_kind(Kind::Other);
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let mut top = match (TopSeed {
        base: text.as_ptr() as usize,
        lenient,
    })
    .deserialize(&mut de)
    {
        Ok(Some(top)) if de.end().is_ok() => top,
        _ => return Judgement::of_kind(Kind::Other),
    };
    if top.escaped {
        // A string written with escapes is lent by no reader: its place is found by a scan of
        // the (valid) object's top level.
        top.id = top.id.and(member_spans(data, "id").pop().flatten());
        let spans = member_spans(data, "model");
        if spans.len() == top.models.iter().count() {
            let mut models = Models::default();
            for (seen, span) in top.models.iter().zip(spans) {
                models.push(seen.as_ref().and(span));
            }
            top.models = models;
        }
    }
    let choices = top.choices.unwrap_or_default();
    let kind = if top.error {
        Kind::Error
    } else if choices.tokens {
        Kind::Tokens
    } else if top.usage.is_some() && choices.array && choices.empty {
        Kind::Usage
    } else {
        Kind::Other
    };
    let base = text.as_ptr() as usize;
    Judgement {
        kind,
        usage: top.usage,
        error: top.error.then(|| top.error_info.unwrap_or_default()),
        id: top.id,
        models: top.models,
        token: choices
            .at
            .filter(|_| kind == Kind::Tokens)
            .map(|(p, len)| p - base..p - base + len),
    }
}

/// The data of one event per the SSE specification: lines end at CR LF, LF or CR; a `data` field's
/// value loses one leading space; several are joined by line feeds; `None` without a data field.
pub fn data(event: &[u8]) -> Option<Data<'_>> {
    let mut found: Option<Data<'_>> = None;
    for (at, line) in lines(event) {
        let Some(rest) = line.strip_prefix(b"data") else {
            continue;
        };
        let (value, from) = match rest.first() {
            None => (&rest[..0], at + 4),
            Some(b':') => match rest.get(1) {
                Some(b' ') => (&rest[2..], at + 6),
                _ => (&rest[1..], at + 5),
            },
            Some(_) => continue,
        };
        found = Some(match found {
            None => Data::Line { value, at: from },
            Some(before) => {
                let mut joined = match before {
                    Data::Line { value, .. } => value.to_vec(),
                    Data::Joined(v) => v,
                };
                joined.push(b'\n');
                joined.extend_from_slice(value);
                Data::Joined(joined)
            }
        });
    }
    found
}

/// The lines of an event, each with where it starts, ended by CR LF, LF or CR.
pub fn lines(event: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= event.len() {
            return None;
        }
        let start = at;
        let end = memchr::memchr2(b'\n', b'\r', &event[at..]).map_or(event.len(), |i| at + i);
        at = match event.get(end..) {
            Some([b'\r', b'\n', ..]) => end + 2,
            _ => end + 1,
        };
        Some((start, &event[start..end]))
    })
}

/// The top-level members the judgement reads.
#[derive(Default)]
struct Top {
    choices: Option<Choices>,
    usage: Option<Usage>,
    error: bool,
    error_info: Option<ErrorInfo>,
    id: Option<Range<usize>>,
    models: Models,
    /// A string span above was written with escapes: its range is a placeholder until scanned.
    escaped: bool,
}

/// What a `choices` value holds.
#[derive(Default, Clone, Copy)]
struct Choices {
    array: bool,
    empty: bool,
    tokens: bool,
    /// One string that carries tokens, where [`NonEmptyStr`] saw it.
    at: At,
}

/// Reads the top-level value: `Some` for an object, `None` for any other JSON value.
struct TopSeed {
    /// Where the data starts in memory: spans are offsets from it.
    base: usize,
    /// Members not read are passed over without converting their numbers ([`judge_whole`]).
    lenient: bool,
}

impl<'de> DeserializeSeed<'de> for TopSeed {
    type Value = Option<Top>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed {
    type Value = Option<Top>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut top = Top::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Choices => top.choices = Some(map.next_value::<ChoicesValue>()?.0),
                Key::Usage => top.usage = map.next_value::<UsageValue>()?.0,
                Key::Error => {
                    let e = map.next_value::<ErrorValue>()?;
                    top.error = e.present;
                    top.error_info = e.info;
                }
                Key::Id => {
                    let span = map.next_value_seed(SpanSeed { base: self.base })?;
                    top.escaped |= span.escaped;
                    top.id = span.range;
                }
                Key::Model => {
                    let span = map.next_value_seed(SpanSeed { base: self.base })?;
                    top.escaped |= span.escaped;
                    top.models.push(span.range);
                }
                _ if self.lenient => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Some(top))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip::seq(seq)?;
        Ok(None)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Where a string value is written, quotes included, as offsets from `base`: serde_json lends an
/// unescaped string out of the input, so its place is known without a second look; an escaped one
/// is marked for [`member_spans`]. `range` is `None` for a value that is not a string.
struct SpanSeed {
    base: usize,
}

struct Span {
    range: Option<Range<usize>>,
    escaped: bool,
}

impl<'de> DeserializeSeed<'de> for SpanSeed {
    type Value = Span;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SpanSeed {
    type Value = Span;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        let start = (s.as_ptr() as usize).saturating_sub(self.base).saturating_sub(1);
        Ok(Span {
            range: Some(start..start + s.len() + 2),
            escaped: false,
        })
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Span {
            range: Some(0..0),
            escaped: true,
        })
    }
    passes_over!(Span {
        range: None,
        escaped: false
    });
    passes_over_seq!(Span {
        range: None,
        escaped: false
    });
    passes_over_map!(Span {
        range: None,
        escaped: false
    });
}

/// The spans of the values of the top-level members named `name` of a JSON object known to be
/// valid, in order: `Some` for a string (quotes included), `None` for another value.
fn member_spans(data: &[u8], name: &str) -> Vec<Option<Range<usize>>> {
    let blanks = |mut i: usize| {
        while data.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    // Just past the string that starts at `i`.
    let string_end = |mut i: usize| {
        i += 1;
        while let Some(b) = data.get(i) {
            match b {
                b'\\' => i += 2,
                b'"' => return i + 1,
                _ => i += 1,
            }
        }
        i
    };
    // Just past the value that starts at `i`.
    let value_end = |i: usize| match data.get(i) {
        Some(b'"') => string_end(i),
        Some(b'{' | b'[') => {
            let (mut depth, mut j) = (0usize, i);
            while let Some(b) = data.get(j) {
                match b {
                    b'"' => {
                        j = string_end(j);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            j
        }
        _ => {
            let mut j = i;
            while data
                .get(j)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
            {
                j += 1;
            }
            j
        }
    };
    let mut out = Vec::new();
    let mut i = blanks(0);
    if data.get(i) != Some(&b'{') {
        return out;
    }
    i = blanks(i + 1);
    while data.get(i) == Some(&b'"') {
        let key_end = string_end(i);
        let key = decode_str(&data[i..key_end.min(data.len())]);
        let v = blanks(blanks(key_end) + 1);
        let end = value_end(v);
        if key.as_deref() == Some(name) {
            out.push((data.get(v) == Some(&b'"')).then_some(v..end));
        }
        i = blanks(end);
        if data.get(i) != Some(&b',') {
            break;
        }
        i = blanks(i + 1);
    }
    out
}

/// Any JSON value, read as closely as a parse into `serde_json::Value` reads it (serde's
/// `IgnoredAny` is laxer with serde_json: it passes numbers out of range, lone surrogates and any
/// nesting), and kept nowhere.
struct Skip;

impl Skip {
    fn seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(())
    }

    fn map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(())
    }
}

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    passes_over!(Skip);
    passes_over_str!(Skip);
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip::seq(seq)?;
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Skip::map(map)?;
        Ok(Skip)
    }
}

/// The member names the judgement reads, at any level; everything else is `Other`.
enum Key {
    Choices,
    Usage,
    Error,
    Id,
    Model,
    Text,
    Delta,
    Content,
    Reasoning,
    ReasoningContent,
    ToolCalls,
    PromptTokens,
    CompletionTokens,
    Code,
    Message,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "choices" => Key::Choices,
                    "usage" => Key::Usage,
                    "error" => Key::Error,
                    "id" => Key::Id,
                    "model" => Key::Model,
                    "text" => Key::Text,
                    "delta" => Key::Delta,
                    "content" => Key::Content,
                    "reasoning" => Key::Reasoning,
                    "reasoning_content" => Key::ReasoningContent,
                    "tool_calls" => Key::ToolCalls,
                    "prompt_tokens" => Key::PromptTokens,
                    "completion_tokens" => Key::CompletionTokens,
                    "code" => Key::Code,
                    "message" => Key::Message,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// True for a non-empty string, false for any other value.
#[derive(Default)]
struct NonEmptyStr(bool, At);
any_value!(NonEmptyStr);

/// Where a non-empty string that carries tokens is written in memory (its first byte and its
/// length, quotes excluded), when serde_json lent it unescaped out of the input.
type At = Option<(usize, usize)>;

impl<'de> Visitor<'de> for NonEmptyStr {
    type Value = NonEmptyStr;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        let at = (!s.is_empty()).then_some((s.as_ptr() as usize, s.len()));
        Ok(NonEmptyStr(!s.is_empty(), at))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(NonEmptyStr(!s.is_empty(), None))
    }
    passes_over!(NonEmptyStr(false, None));
    passes_over_seq!(NonEmptyStr(false, None));
    passes_over_map!(NonEmptyStr(false, None));
}

/// True for a non-empty array, false for any other value.
#[derive(Default)]
struct NonEmptyArray(bool);
any_value!(NonEmptyArray);

impl<'de> Visitor<'de> for NonEmptyArray {
    type Value = NonEmptyArray;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut any = false;
        while seq.next_element::<Skip>()?.is_some() {
            any = true;
        }
        Ok(NonEmptyArray(any))
    }
    passes_over!(NonEmptyArray(false));
    passes_over_str!(NonEmptyArray(false));
    passes_over_map!(NonEmptyArray(false));
}

/// A whole number that fits a `u32`, else `None`.
#[derive(Default)]
struct Count(Option<u32>);
any_value!(Count);

impl<'de> Visitor<'de> for Count {
    type Value = Count;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Count(u32::try_from(n).ok()))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Count(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Count(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Count(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Count(None))
    }
    passes_over_str!(Count(None));
    passes_over_seq!(Count(None));
    passes_over_map!(Count(None));
}

/// The `choices` member.
#[derive(Default)]
struct ChoicesValue(Choices);
any_value!(ChoicesValue);

impl<'de> Visitor<'de> for ChoicesValue {
    type Value = ChoicesValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut c = Choices {
            array: true,
            empty: true,
            tokens: false,
            at: None,
        };
        while let Some(choice) = seq.next_element::<ChoiceValue>()? {
            c.empty = false;
            c.tokens |= choice.0;
            c.at = choice.1.or(c.at);
        }
        Ok(ChoicesValue(c))
    }
    passes_over!(ChoicesValue::default());
    passes_over_str!(ChoicesValue::default());
    passes_over_map!(ChoicesValue::default());
}

/// One choice: true when it carries generated tokens.
#[derive(Default)]
struct ChoiceValue(bool, At);
any_value!(ChoiceValue);

impl<'de> Visitor<'de> for ChoiceValue {
    type Value = ChoiceValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut text, mut delta) = ((false, None), (false, None));
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Text => {
                    let t = map.next_value::<NonEmptyStr>()?;
                    text = (t.0, t.1);
                }
                Key::Delta => {
                    let d = map.next_value::<DeltaValue>()?;
                    delta = (d.0, d.1);
                }
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(ChoiceValue(text.0 || delta.0, text.1.or(delta.1)))
    }
    passes_over!(ChoiceValue(false, None));
    passes_over_str!(ChoiceValue(false, None));
    passes_over_seq!(ChoiceValue(false, None));
}

/// A choice's `delta`: true when it carries generated tokens.
#[derive(Default)]
struct DeltaValue(bool, At);
any_value!(DeltaValue);

impl<'de> Visitor<'de> for DeltaValue {
    type Value = DeltaValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = [(false, None); 4];
        while let Some(key) = map.next_key::<Key>()? {
            let slot = match key {
                Key::Content => 0,
                Key::Reasoning => 1,
                Key::ReasoningContent => 2,
                Key::ToolCalls => {
                    fields[3] = (map.next_value::<NonEmptyArray>()?.0, None);
                    continue;
                }
                _ => {
                    map.next_value::<Skip>()?;
                    continue;
                }
            };
            let v = map.next_value::<NonEmptyStr>()?;
            fields[slot] = (v.0, v.1);
        }
        let at = fields.iter().find_map(|f| f.1);
        Ok(DeltaValue(fields.iter().any(|f| f.0), at))
    }
    passes_over!(DeltaValue(false, None));
    passes_over_str!(DeltaValue(false, None));
    passes_over_seq!(DeltaValue(false, None));
}

/// The `usage` member: `Some` for an object.
#[derive(Default)]
struct UsageValue(Option<Usage>);
any_value!(UsageValue);

impl<'de> Visitor<'de> for UsageValue {
    type Value = UsageValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut usage = Usage::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::PromptTokens => usage.prompt_tokens = map.next_value::<Count>()?.0,
                Key::CompletionTokens => usage.completion_tokens = map.next_value::<Count>()?.0,
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(UsageValue(Some(usage)))
    }
    passes_over!(UsageValue(None));
    passes_over_str!(UsageValue(None));
    passes_over_seq!(UsageValue(None));
}

/// The `error` member: present unless null; its code and message when it is an object.
#[derive(Default)]
struct ErrorValue {
    present: bool,
    info: Option<ErrorInfo>,
}
any_value!(ErrorValue);

impl<'de> Visitor<'de> for ErrorValue {
    type Value = ErrorValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut info = ErrorInfo::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Code => info.status = map.next_value::<CodeValue>()?.0,
                Key::Message => info.message = map.next_value::<StrValue>()?.0,
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(ErrorValue {
            present: true,
            info: Some(info),
        })
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(ErrorValue::default())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(ErrorValue::present())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(ErrorValue::present())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(ErrorValue::present())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(ErrorValue::present())
    }
    passes_over_str!(ErrorValue::present());
    passes_over_seq!(ErrorValue::present());
}

impl ErrorValue {
    fn present() -> ErrorValue {
        ErrorValue {
            present: true,
            info: None,
        }
    }
}

/// An error's `code` as an HTTP status: an integer, or digits in a string, within 400–599.
#[derive(Default)]
struct CodeValue(Option<u16>);
any_value!(CodeValue);

fn status_of(n: u64) -> Option<u16> {
    u16::try_from(n).ok().filter(|s| (400..600).contains(s))
}

impl<'de> Visitor<'de> for CodeValue {
    type Value = CodeValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(CodeValue(status_of(n)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(CodeValue(s.parse().ok().and_then(status_of)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(CodeValue(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(CodeValue(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(CodeValue(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(CodeValue(None))
    }
    passes_over_seq!(CodeValue(None));
    passes_over_map!(CodeValue(None));
}

/// A string, else `None`.
#[derive(Default)]
struct StrValue(Option<String>);
any_value!(StrValue);

impl<'de> Visitor<'de> for StrValue {
    type Value = StrValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(StrValue(Some(s.to_owned())))
    }
    passes_over!(StrValue(None));
    passes_over_seq!(StrValue(None));
    passes_over_map!(StrValue(None));
}

/// The spans of `data`'s top-level `model` strings that name `from`, in order.
pub fn matching<'a>(
    data: &'a [u8],
    models: &'a Models,
    from: &'a str,
) -> impl Iterator<Item = Range<usize>> + 'a {
    models
        .iter()
        .flatten()
        .filter(move |span| {
            let raw = &data[(*span).clone()];
            // The plain case is a byte comparison; a name written with escapes is decoded first.
            if raw.contains(&b'\\') {
                decode_str(raw).as_deref() == Some(from)
            } else {
                raw.len() == from.len() + 2 && &raw[1..raw.len() - 1] == from.as_bytes()
            }
        })
        .cloned()
}

/// `data` with `to` (a JSON string, quotes included) in place of every top-level `model` string
/// that names `from`; `None` when none does.
pub fn renamed(data: &[u8], models: &Models, from: &str, to: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    for span in matching(data, models, from) {
        let o = out.get_or_insert_with(|| Vec::with_capacity(data.len() + to.len()));
        o.extend_from_slice(&data[copied..span.start]);
        o.extend_from_slice(to);
        copied = span.end;
    }
    let mut o = out?;
    o.extend_from_slice(&data[copied..]);
    Some(o)
}

/// The same judgement made the plain way — the SSE specification's line reading written out
/// again and a whole parse into a tree ([`reference::Value`]) — which the tests and the fuzz target hold [`judge`] equal to.
pub mod reference;

/// [`judge`]'s answer in the reference's terms, for comparing the two.
pub fn summary(event: &[u8]) -> reference::Summary {
    let (j, data) = judge(event);
    let bytes = data.as_ref().map(Data::bytes).unwrap_or_default();
    reference::Summary {
        kind: j.kind,
        usage: j.usage,
        error: j.error.clone(),
        id: j.id(bytes),
        model: j.models.last(bytes),
    }
}

/// Holds [`judge`] and [`renamed`] to the reference on one event: the same summary, and a rename
/// that changes the model a parse reads (when it was `from`) and nothing else. Panics on a
/// disagreement; the fuzz target and the tests call it.
pub fn check(event: &[u8]) {
    let ours = summary(event);
    let theirs = reference::judge(event);
    assert_eq!(ours, theirs, "judgement of {:?}", String::from_utf8_lossy(event));
    let (j, data) = judge(event);
    let Some(data) = data else { return };
    // The name a parse reads is renamed (else a name it does not hold, which must change nothing).
    let from = theirs.model.as_deref().unwrap_or("up");
    if let Some(new) = renamed(data.bytes(), &j.models, from, b"\"public\"") {
        let after = reference::judge_data(&new);
        let expect = reference::Summary {
            model: if theirs.model.as_deref() == Some(from) {
                Some("public".into())
            } else {
                theirs.model.clone()
            },
            ..theirs.clone()
        };
        assert_eq!(after, expect, "renamed {:?}", String::from_utf8_lossy(&new));
    } else {
        assert_ne!(
            theirs.model.as_deref(),
            Some(from),
            "not renamed: {:?}",
            String::from_utf8_lossy(event)
        );
    }
}

#[cfg(test)]
mod tests;
