//! How the request path reaches a replica: TCP for `http://` URLs, TLS over TCP for `https://`
//! ones (the server name from the URL's host), both pooled by `http1::client`.

use crate::tls::ReplicaTrust;
use rustls::pki_types::ServerName;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A replica's pool of connections, its answer, and the answer's body.
pub(crate) type Conns = http1::client::Conns<Upstream>;
pub(crate) type Response = http1::client::Response<Upstream>;
pub(crate) type Body = http1::client::Body<Upstream>;

/// A replica's address, and the TLS it is reached with, if any.
pub(crate) struct Upstream {
    host: String,
    port: u16,
    security: Security,
}

enum Security {
    Plain,
    Tls(tokio_rustls::TlsConnector, ServerName<'static>),
    /// An `https://` URL that cannot be checked: never reached in plain text instead.
    Unusable(String),
}

impl Upstream {
    /// The pool of the replica at `url` (`http[s]://host[:port][/prefix]`, as configuration
    /// checked it); an `https://` URL is trusted as `trust` says.
    pub(crate) fn conns(url: &str, trust: Option<&ReplicaTrust>) -> Conns {
        let uri: hyper::Uri = url.parse().unwrap_or_default();
        // Host and port only: never credentials a URL might carry.
        let authority = uri.authority().map_or_else(String::new, |a| {
            let s = a.as_str();
            s.rsplit_once('@').map_or(s, |(_, hostport)| hostport).to_owned()
        });
        let https = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .unwrap_or("localhost")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let security = match (https, trust) {
            (false, _) => Security::Plain,
            (true, Some(trust)) => match ServerName::try_from(host.clone()) {
                Ok(name) => Security::Tls(tokio_rustls::TlsConnector::from(trust.client.clone()), name),
                Err(e) => {
                    Security::Unusable(format!("'{host}' cannot be checked against a certificate: {e}"))
                }
            },
            (true, None) => Security::Unusable("no trust was built for this https:// replica".into()),
        };
        let upstream = Upstream {
            port: uri.port_u16().unwrap_or(if https { 443 } else { 80 }),
            host,
            security,
        };
        http1::client::Conns::with(upstream, authority, uri.path())
    }
}

/// A connection to a replica. The plain one is read and written as before; the match is the
/// whole cost of TLS to a route without it.
pub(crate) enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl http1::client::Transport for Upstream {
    type Stream = UpstreamStream;

    async fn connect(&self) -> io::Result<UpstreamStream> {
        let tls = match &self.security {
            Security::Plain => None,
            Security::Tls(connector, name) => Some((connector, name)),
            Security::Unusable(why) => return Err(io::Error::other(why.clone())),
        };
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
        // Each SSE event must leave at once, not wait for the previous one's ACK.
        tcp.set_nodelay(true)?;
        match tls {
            None => Ok(UpstreamStream::Plain(tcp)),
            Some((connector, name)) => {
                let tls = connector.connect(name.clone(), tcp).await?;
                Ok(UpstreamStream::Tls(Box::new(tls)))
            }
        }
    }

    /// Asked of the socket itself (see `http1::client::Tcp`). Under TLS, any record waiting
    /// unasked on an idle connection (a `close_notify`) is a reason not to reuse it either.
    fn looks_open(stream: &UpstreamStream) -> bool {
        let tcp = match stream {
            UpstreamStream::Plain(tcp) => tcp,
            UpstreamStream::Tls(tls) => tls.get_ref().0,
        };
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        matches!(socket2::SockRef::from(tcp).peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// An `https://` URL the gateway cannot check is refused at connect, never tried in plain text.
    #[tokio::test]
    async fn an_https_replica_without_trust_is_not_reached_in_plain_text() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let conns = Arc::new(Upstream::conns(&url, None));
        let body = bytes::Bytes::from_static(b"{}");
        let request = http1::client::Request {
            method: "POST",
            path: "/v1/embeddings",
            headers: &[],
            body: &body,
        };
        let sent = http1::client::send(&conns, &request, std::time::Duration::from_secs(1)).await;
        match sent {
            Err(e) => assert!(e.is_connect() && e.to_string().contains("no trust"), "{e}"),
            Ok(_) => panic!("answered"),
        }
        let accepted = tokio::time::timeout(std::time::Duration::from_millis(50), listener.accept()).await;
        assert!(accepted.is_err(), "no TCP connection was opened");
    }
}
