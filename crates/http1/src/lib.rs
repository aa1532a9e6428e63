//! Spillway's own HTTP/1.1 for the requests of the hot path, on the request's own task, without
//! a task or a channel per connection: [`client`] talks to the replicas, [`server`] is the public
//! port's half for completion requests. Both are generic over the connection (`AsyncRead +
//! AsyncWrite`), so their tests script the bytes, and neither knows the gateway's types: the
//! gateway drives them through [`client::Transport`] and [`server::Handler`].
//!
//! Parsing untrusted bytes is httparse's (fuzzed upstream); what is written here decides framing
//! and is fuzzed against hyper (`fuzz/`: `front_head`, `upstream_answer`). The gateway's
//! `server.http1: hyper` serves every request with hyper instead.

pub mod client;
pub mod server;
