//! Any bytes as SSE events (whole, and as the splitter cuts them): the gateway's judgement of an
//! event (`protocol::judge`: its kind, usage, error, id and model) is what a parse into
//! `serde_json::Value` says, a rename changes the model a parse reads and nothing else, and the
//! gateway's own rewrite of the event (`Event::append`) keeps every other answer of the parse.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| spillway_gateway::event::check(data));
