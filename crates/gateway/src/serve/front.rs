//! The public port's HTTP/1.1 for the requests that make up the hot path (a POST to one of the
//! two completion endpoints or to `/v1/embeddings`, with a `Content-Length` body), served by `http1::server` on the
//! connection's own task. This is the glue: which heads the gateway serves there, the request as
//! the request path takes it, and hyper for everything else, which then answers it as it always
//! did (the first such request hands it the connection, with every byte read so far).

use crate::path::api::Api;
use crate::path::hints::READ_HEADERS;
use crate::path::relay::Relay;
use crate::path::respond::ResponseBody;
use crate::serve::router::HyperService;
use crate::state::Gateway;
use crate::table::Table;
use axum::http::{HeaderMap, Method, Uri, Version};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http1::server::{Chunks, ClientIo, Framed, Limits, Load, RequestHead, Served, StreamCut, Upload};
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// What a connection's task needs besides its socket: the gateway's side of `http1::server`.
pub(crate) struct Serving {
    pub(crate) gateway: Arc<Gateway>,
    pub(crate) front: HyperService,
    pub(crate) hyper: Arc<auto::Builder<TokioExecutor>>,
    /// For the connection once it is hyper's.
    pub(crate) watcher: Watcher,
    /// True once the listener has closed: idle connections close, busy ones after their answer.
    pub(crate) closing: watch::Receiver<bool>,
}

/// Serves one client connection until it closes, the drain closes it, or it is handed to hyper.
pub(crate) async fn serve(tcp: TcpStream, s: Serving) {
    let io = client_io(tcp, &s.gateway);
    http1::server::serve(io, s).await;
}

impl http1::server::Handler<TcpStream> for Serving {
    /// The request, and the table its head was read for.
    type Request = (FrontRequest, Arc<Table>);
    type Stream = Box<Relay>;
    type Body = axum::body::Body;

    fn limits(&self) -> Limits {
        let server = &self.gateway.config.server;
        Limits {
            header_timeout: server.header_timeout,
            body_timeout: server.body_timeout,
            // hyper's own limit on a head; past it, hyper answers 431 itself.
            max_head: server.max_head_buffer(),
        }
    }

    fn load(&self) -> Arc<Load> {
        self.gateway.load.clone()
    }

    fn head(&mut self, head: &Bytes) -> Option<Served<Self::Request>> {
        let server = &self.gateway.config.server;
        // The table in force says which headers its routes' rules read.
        let table = self.gateway.table();
        let request = FrontRequest::from_head(head, &table.rule_headers, server.max_header_bytes)?;
        if request.content_length > server.max_body_bytes {
            // hyper's path answers 413 before any `100 Continue`, reading no more than the limit.
            return None;
        }
        Some(Served {
            content_length: request.content_length,
            close: request.close,
            request: (request, table),
        })
    }

    fn call(
        &mut self,
        head: &Bytes,
        (request, read_for): Self::Request,
        body: Upload,
    ) -> impl Future<Output = Response<ResponseBody>> + Send {
        // The request is served by the table in force once its body is in, as on hyper's path (a
        // key a reload removed meanwhile is refused). A reload that changed the rules' headers
        // meanwhile has the head read again for them.
        let table = self.gateway.table();
        let request = if Arc::ptr_eq(&table, &read_for) || table.rule_headers == read_for.rule_headers {
            request
        } else {
            let limit = self.gateway.config.server.max_header_bytes;
            FrontRequest::from_head(head, &table.rule_headers, limit).unwrap_or(request)
        };
        drop(read_for);
        let api = request.api;
        crate::path::completion(self.gateway.clone(), Some(table), api, request.with_body(body))
    }

    async fn closed(&mut self) {
        let _ = self.closing.wait_for(|closing| *closing).await;
    }

    fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    async fn hand_off(self, io: ClientIo<TcpStream>) {
        if *self.closing.borrow() {
            // hyper would be told to stop before it read the request: close instead.
            return;
        }
        // hyper's drain watches it from here on.
        drop(self.closing);
        let serving = self.hyper.serve_connection(TokioIo::new(io), self.front);
        // Boxed: hyper's connection would otherwise make every connection's task that large.
        let _ = Box::pin(self.watcher.watch(serving)).await;
    }
}

/// A stream's relay, framed straight from its buffer: no piece of it split off, boxed or
/// dropped per chunk.
impl Chunks for Box<Relay> {
    fn poll_chunk_into(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>> {
        std::task::ready!(self.poll_out(cx));
        http1::server::encode_chunk(out, self.out());
        self.written();
        Poll::Ready(Ok(if self.is_done() { Framed::End } else { Framed::More }))
    }

    fn head_fields(&self, each: &mut dyn FnMut(&[u8], &[u8])) {
        crate::path::respond::stream_fields(self.ledger(), &mut |name, value| {
            each(name.as_str().as_bytes(), value);
        });
    }
}

/// A completion request's head, parsed once: what the front acts on, and the headers the
/// request path reads, their values sharing the head's bytes.
pub(crate) struct FrontRequest {
    pub(crate) api: Api,
    pub(crate) uri: Uri,
    headers: HeaderMap,
    pub(crate) content_length: usize,
    /// The client asked to close after the answer.
    pub(crate) close: bool,
}

impl FrontRequest {
    /// `None` for a head hyper answers instead ([`RequestHead::parse`] says which), one that is
    /// not a completion POST, and one over `max_header_bytes` (431, as `path::identified` counts a head).
    /// Of the headers, only those the request path reads are kept ([`READ_HEADERS`] and
    /// `rule_headers`).
    pub(crate) fn from_head(
        head: &Bytes,
        rule_headers: &[String],
        max_header_bytes: usize,
    ) -> Option<FrontRequest> {
        let parsed = RequestHead::parse(head, |name| {
            let read = |n: &&str| name.eq_ignore_ascii_case(n);
            READ_HEADERS.iter().any(read) || rule_headers.iter().any(|n| read(&n.as_str()))
        })?;
        if parsed.method != Method::POST || parsed.size > max_header_bytes {
            return None;
        }
        let api = Api::at(parsed.uri.path())?;
        Some(FrontRequest {
            api,
            uri: parsed.uri,
            headers: parsed.headers,
            content_length: parsed.content_length,
            close: parsed.close,
        })
    }

    /// The request as the request path takes it.
    fn with_body(self, body: Upload) -> axum::http::Request<Upload> {
        let mut req = axum::http::Request::new(body);
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri;
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = self.headers;
        req
    }
}

/// A client connection's socket, for `front` or for hyper from its start (a connection over
/// `server.max_connections`, or `server.http1: hyper`): writes cut after `server.send_timeout`.
pub(crate) fn client_io(tcp: TcpStream, gateway: &Gateway) -> ClientIo<TcpStream> {
    ClientIo::new(tcp, gateway.config.server.send_timeout, gateway.send_cut.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http1::server::MAX_HEADERS;
    use hyper::body::Body as _;

    fn head(lines: &str) -> Option<FrontRequest> {
        FrontRequest::from_head(&Bytes::from(format!("{lines}\r\n\r\n")), &[], usize::MAX)
    }

    #[test]
    fn only_plain_completion_posts_are_served_here() {
        let r = head("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12").unwrap();
        assert_eq!((r.api, r.content_length, r.close), (Api::Chat, 12, false));
        let r =
            head("POST /v1/completions?a=b HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nConnection: keep-alive, Close")
                .unwrap();
        assert_eq!((r.api, r.content_length, r.close), (Api::Completions, 0, true));
        let r = head("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 5").unwrap();
        assert_eq!((r.api, r.content_length), (Api::Embeddings, 5));
        for other in [
            "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/chat/completions/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +1",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: Upgrade",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nUpgrade: h2c",
        ] {
            assert!(head(other).is_none(), "{other}");
        }
        // Up to MAX_HEADERS headers are read here; a head with more goes to hyper, whose own limit
        // answers it.
        let with = |n: usize| {
            let extra: String = (3..=n).map(|i| format!("\r\nx-h{i}: {i}")).collect();
            head(&format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3{extra}"
            ))
        };
        let r = with(MAX_HEADERS).unwrap();
        assert_eq!(r.content_length, 3);
        assert!(with(MAX_HEADERS + 1).is_none());
    }

    /// RFC 9112 §3.2 (B03: a missing, repeated or invalid Host was served): such a head goes to
    /// hyper's path, which answers 400.
    #[test]
    fn a_head_without_exactly_one_valid_host_is_not_served_here() {
        let with = |hosts: &str| {
            head(&format!(
                "POST /v1/completions HTTP/1.1\r\n{hosts}Content-Length: 0"
            ))
        };
        for good in [
            "Host: x\r\n",
            "host: gw.example:8080\r\n",
            "Host: [::1]:80\r\n",
            "Host: \r\n",
        ] {
            assert!(with(good).is_some(), "{good:?}");
        }
        for bad in [
            "",
            "Host: a\r\nHost: a\r\n",
            "Host: a b\r\n",
            "Host: user@gw\r\n",
            "Host: gw:port\r\n",
            "Host: gw/path\r\n",
        ] {
            assert!(with(bad).is_none(), "{bad:?}");
        }
    }

    /// The request-head checklist (after pingora's tests of its HTTP/1 server), each head read
    /// in two pieces cut at every byte, as a connection reads it: what `front` serves itself,
    /// and what it leaves to hyper (`None`), which answers it as it always did.
    #[test]
    fn heads_scan_and_parse_alike_however_they_are_cut() {
        // A head, and what `front` reads of it: its length and `close`, or `None` for hyper's.
        type Case = (&'static str, &'static str, Option<(usize, bool)>);
        let cases: [Case; 14] = [
            (
                "plain",
                "POST /v1/chat/completions HTTP/1.1
Host: x
Content-Length: 2

",
                Some((2, false)),
            ),
            (
                "blank lines first",
                "

POST /v1/completions HTTP/1.1
Host: x
Content-Length: 0

",
                Some((0, false)),
            ),
            (
                "bare LF lines",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 3

",
                Some((3, false)),
            ),
            (
                "close",
                "POST /v1/completions HTTP/1.1
Host: x
Connection: close
Content-Length: 1

",
                Some((1, true)),
            ),
            (
                "length with leading zeros",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 007

",
                Some((7, false)),
            ),
            (
                "two lengths",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 1
Content-Length: 1

",
                None,
            ),
            (
                "signed length",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: +1

",
                None,
            ),
            (
                "length list",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 1, 1

",
                None,
            ),
            (
                "length and chunked",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 1
Transfer-Encoding: chunked

",
                None,
            ),
            (
                "chunked not last",
                "POST /v1/completions HTTP/1.1
Host: x
Transfer-Encoding: chunked, gzip

",
                None,
            ),
            (
                "HTTP/1.0",
                "POST /v1/completions HTTP/1.0
Host: x
Content-Length: 1

",
                None,
            ),
            (
                "obs-fold",
                "POST /v1/completions HTTP/1.1
Host: x
X-A: 1
 folded
Content-Length: 1

",
                None,
            ),
            (
                "space before colon",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length : 1

",
                None,
            ),
            (
                "no length",
                "POST /v1/completions HTTP/1.1
Host: x

",
                None,
            ),
        ];
        for (name, head, want) in cases {
            let wire = format!("{head}body");
            for cut in 0..=wire.len() {
                let got = crate::fuzzing::front_head(wire.as_bytes(), cut);
                let got = got.map(|h| {
                    assert_eq!(h.body_offset, head.len(), "{name}, cut at {cut}");
                    (h.content_length, h.close)
                });
                assert_eq!(got, want, "{name}, cut at {cut}");
            }
        }
    }

    #[test]
    fn the_request_shares_the_heads_bytes_and_keeps_the_headers_read() {
        let raw = Bytes::from_static(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nX-Request-Id: abc\r\nX-Tag: 1\r\nX-Tag: 2\r\nAuthorization: Bearer k\r\nX-Spillway-Priority: low\r\nContent-Length: 2\r\n\r\n",
        );
        let r = FrontRequest::from_head(&raw, &[], usize::MAX).unwrap();
        let req = r.with_body(Upload::Whole(Some(Bytes::from_static(b"{}"))));
        assert_eq!(req.uri().path(), "/v1/chat/completions");
        assert_eq!(req.uri().query(), Some("x=1"));
        assert_eq!(req.headers()["x-request-id"], "abc");
        assert_eq!(req.headers()["authorization"], "Bearer k");
        assert_eq!(req.headers()[crate::path::hints::PRIORITY_HEADER], "low");
        assert_eq!(req.headers().len(), 3, "{:?}", req.headers());
        assert_eq!(req.body().size_hint().exact(), Some(2));
        // A header a routing or class rule names is kept, every line of it.
        let r = FrontRequest::from_head(&raw, &["x-tag".to_string()], usize::MAX).unwrap();
        assert_eq!(r.headers.get_all("x-tag").iter().count(), 2);
        assert!(!r.headers.contains_key("host"));
    }

    #[test]
    fn a_head_over_max_header_bytes_goes_to_hyper_counted_as_server_counts_it() {
        let raw = Bytes::from_static(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nX-Tag: 1\r\nContent-Length: 2\r\n\r\n",
        );
        // The path and query, then each header's name and value and 4: 24 + 10 + 10 + 19, every
        // header counted, kept or not.
        assert!(FrontRequest::from_head(&raw, &[], 63).is_some());
        assert!(FrontRequest::from_head(&raw, &[], 62).is_none());
    }
}
