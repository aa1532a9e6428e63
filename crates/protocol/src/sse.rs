//! Server-Sent Events framing for streamed completions (`data: <json>\n\n`, ended by `[DONE]`).

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

/// The terminal event of an OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Appends one `data:` event holding `value` as JSON.
pub fn write_event<T: Serialize>(buf: &mut BytesMut, value: &T) {
    buf.put_slice(b"data: ");
    // Writing into a BytesMut cannot fail, and our wire types always serialise.
    let _ = serde_json::to_writer((&mut *buf).writer(), value);
    buf.put_slice(b"\n\n");
}

/// One `data:` event as its own buffer.
pub fn event<T: Serialize>(value: &T) -> Bytes {
    let mut buf = BytesMut::with_capacity(256);
    write_event(&mut buf, value);
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_is_one_data_line_and_a_blank_line() {
        let e = event(&serde_json::json!({"a": 1}));
        assert_eq!(&e[..], b"data: {\"a\":1}\n\n");
    }
}
