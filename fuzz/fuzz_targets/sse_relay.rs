//! Any byte stream, cut anywhere: the SSE splitter loses and invents nothing, and classifying,
//! reading usage and renaming never panic.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use spillway_gateway::event::{Event, Rename, classify, parse_usage};
use spillway_protocol::sse::{EventSplitter, data as event_data};

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, stream)) = data.split_first() else {
        return;
    };
    let rename = Rename::new("up", "public");
    let mut s = EventSplitter::default();
    let mut out = Vec::new();
    let step = usize::from(cuts % 17) + 1;
    for piece in stream.chunks(step) {
        s.feed(piece, |e| {
            let _ = classify(&e);
            let _ = parse_usage(&e);
            let _ = event_data(&e);
            let mut renamed = BytesMut::new();
            Event::read(&e).append(Some(&rename), &mut renamed);
            assert!(!renamed.is_empty() || e.is_empty());
            let _ = rename.apply(e.clone());
            out.extend_from_slice(&e);
        });
    }
    out.extend_from_slice(&s.rest());
    assert_eq!(
        out, stream,
        "the splitter must hand back exactly the bytes it was given"
    );
    let _ = Bytes::from(out);
});
