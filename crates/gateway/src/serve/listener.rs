//! Connections: the accept loop, a cap on client connections below the open-files limit (over it,
//! a connection still gets `/health`, `/ready` and `/metrics`, and a 503 for anything else),
//! deadlines for request heads and bodies, and the drain: refuse new requests, stop accepting, let
//! streams finish, and cut with an SSE error whatever is still open when the drain time runs out.
//! With `server.tls`, each connection's TLS handshake comes first, and hyper serves it whole.

use crate::config::MetricsExposure;
use crate::error::GatewayError;
use crate::serve::router::HyperService;
use crate::state::{AbortOnDrop, Gateway, StopProbes};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// File descriptors kept back from client connections: the admin listener, health probes,
/// scrapes, the config file, logs.
const RESERVED_FDS: u64 = 128;
/// After the drain runs out, how long cut streams get to flush their error event.
const CUT_GRACE: Duration = Duration::from_millis(500);
/// A connection over the limit must send its request head within this long: it holds a
/// descriptor the gateway is short of.
const OVER_LIMIT_HEADER_TIMEOUT: Duration = Duration::from_secs(1);

/// Connections the kernel may hold, handshake done, until the accept loop takes them (capped by
/// `net.core.somaxconn`). `TcpListener::bind` asks for 128: a burst of clients past that has its
/// handshakes dropped and retried a second later, a second added to their first token.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the gateway's listeners: address reuse, as `TcpListener::bind` sets, and a backlog of
/// 4,096 (`LISTEN_BACKLOG`). (`spillway engine` has the same in `engine::server::listen`.)
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Client connections allowed by default: half of what the open-files limit leaves after a
/// reserve, since each client stream also holds an upstream connection.
pub(crate) fn default_max_connections() -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    usize::try_from(soft.saturating_sub(RESERVED_FDS) / 2)
        .unwrap_or(usize::MAX)
        .max(16)
}

/// Serves until `shutdown` resolves, then drains: `/ready` fails and new requests get 503 for
/// `server.drain_delay`, the listener closes, and streams in flight get up to
/// `server.drain_timeout` to finish before they are cut.
pub async fn run(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let server = gateway.config.server.clone();
    let accepting = Accepting::new(&gateway);
    let max = accepting.max;
    gateway.start_probes();
    let _shared = gateway.start_shared();
    let _stop_probes = StopProbes(&gateway);
    let _admin = serve_admin(&gateway)?;
    let _picker = serve_picker(&gateway, &accepting)?;
    let ports = Ports::new(&gateway, max);
    let graceful = GracefulShutdown::new();
    // The connections `front` serves hold a receiver each; the drain waits for them all to go.
    let (closing, _) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut drain_started: Option<Instant> = None;
    loop {
        let until_close = drain_started.map(|t| t + server.drain_delay);
        let accepted = tokio::select! {
            _ = &mut shutdown, if drain_started.is_none() => {
                gateway.drain();
                tracing::info!(in_flight = gateway.in_flight(), "draining: not ready, refusing new requests");
                drain_started = Some(Instant::now());
                continue;
            }
            _ = sleep_until(until_close) => break,
            a = accepting.accept(&listener) => a,
        };
        ports.spawn(&gateway, accepted, graceful.watcher(), &closing);
    }
    drop(listener);
    drain(&gateway, graceful, closing).await;
    // The access log's last lines go out before the process does.
    let access = gateway.access.clone();
    let _ = tokio::task::spawn_blocking(move || access.flush(std::time::Duration::from_secs(2))).await;
    // So do the spans of the last requests.
    if let Some(tracer) = gateway.tracer.clone() {
        let _ = tokio::task::spawn_blocking(move || tracer.flush(std::time::Duration::from_secs(2))).await;
    }
    Ok(())
}

/// The admin API on its own listener, if configured, until dropped.
fn serve_admin(gateway: &Arc<Gateway>) -> std::io::Result<Option<AbortOnDrop>> {
    let Some(a) = &gateway.config.admin else {
        return Ok(None);
    };
    let admin = bind(a.listen)?;
    let _ = gateway.admin_addr.set(admin.local_addr()?);
    let app = crate::serve::admin::router(gateway.clone());
    Ok(Some(AbortOnDrop(tokio::spawn(async move {
        let _ = axum::serve(admin, app).await;
    }))))
}

/// The endpoint picker on its own listener, if configured, counted by `accepting` with the
/// public port's connections, until dropped.
fn serve_picker(gateway: &Arc<Gateway>, accepting: &Accepting) -> std::io::Result<Option<AbortOnDrop>> {
    let Some(p) = &gateway.config.endpoint_picker else {
        return Ok(None);
    };
    if cfg!(not(feature = "picker")) {
        return Err(std::io::Error::other(
            "endpoint_picker is configured, but this build has no endpoint picker (the gateway's `picker` feature)",
        ));
    }
    let listener = bind(p.listen)?;
    let _ = gateway.picker_addr.set(listener.local_addr()?);
    let fallbacks = p.fallbacks;
    let (g, accepting) = (gateway.clone(), accepting.clone());
    Ok(Some(AbortOnDrop(tokio::spawn(async move {
        #[cfg(feature = "picker")]
        crate::serve::picker::serve(listener, g, accepting, fallbacks).await;
        #[cfg(not(feature = "picker"))]
        let _ = (listener, g, accepting, fallbacks);
    }))))
}

/// What serves the public port's connections: hyper's services and builders for those within
/// the limit and those over it.
struct Ports {
    app: HyperService,
    overloaded: HyperService,
    builder: Arc<auto::Builder<TokioExecutor>>,
    over_limit_builder: Arc<auto::Builder<TokioExecutor>>,
}

impl Ports {
    fn new(gateway: &Arc<Gateway>, max: usize) -> Ports {
        let server = &gateway.config.server;
        Ports {
            app: HyperService::new(
                gateway.clone(),
                true,
                crate::serve::router::router(gateway.clone()),
            ),
            overloaded: HyperService::new(gateway.clone(), false, overloaded_router(gateway.clone(), max)),
            builder: Arc::new(connection_builder(server, server.header_timeout)),
            over_limit_builder: Arc::new(connection_builder(
                server,
                server.header_timeout.min(OVER_LIMIT_HEADER_TIMEOUT),
            )),
        }
    }

    /// Serves one accepted connection on a task of its own: over TLS (hyper, after the
    /// handshake), over the limit (the overloaded router), by hyper from its start
    /// (`server.http1: hyper`), or by `front`.
    fn spawn(
        &self,
        gateway: &Arc<Gateway>,
        accepted: Accepted,
        watcher: Watcher,
        closing: &tokio::sync::watch::Sender<bool>,
    ) {
        let Accepted { tcp, conn, over } = accepted;
        let server = &gateway.config.server;
        if let Some(tls) = &gateway.tls {
            let (service, builder) = if over {
                (self.overloaded.clone(), self.over_limit_builder.clone())
            } else {
                (self.app.clone(), self.builder.clone())
            };
            let (acceptor, gateway, within) = (tls.acceptor(), gateway.clone(), server.header_timeout);
            tokio::spawn(async move {
                let _conn = conn;
                let deadline = Instant::now() + within;
                if tokio::time::timeout_at(deadline, plain_http(&tcp)).await == Ok(true) {
                    let _ = tokio::time::timeout_at(deadline, refuse_plain_http(tcp)).await;
                    return;
                }
                let io = crate::serve::front::client_io(tcp, &gateway);
                let handshake = handshake(acceptor, io, deadline.saturating_duration_since(Instant::now()));
                if let Some(io) = handshake.await {
                    let serving = builder.serve_connection(TokioIo::new(io), service);
                    let _ = Box::pin(watcher.watch(serving)).await;
                }
            });
        } else if over {
            let (service, builder) = (self.overloaded.clone(), self.over_limit_builder.clone());
            let io = TokioIo::new(crate::serve::front::client_io(tcp, gateway));
            tokio::spawn(async move {
                let _conn = conn;
                let serving = builder.serve_connection(io, service);
                let _ = watcher.watch(serving).await;
            });
        } else if server.http1 == crate::config::Http1::Hyper {
            let (service, builder) = (self.app.clone(), self.builder.clone());
            let io = TokioIo::new(crate::serve::front::client_io(tcp, gateway));
            tokio::spawn(async move {
                let _conn = conn;
                // Boxed, as `front` boxes it once a connection is hyper's.
                let serving = builder.serve_connection(io, service);
                let _ = Box::pin(watcher.watch(serving)).await;
            });
        } else {
            let serving = crate::serve::front::Serving {
                gateway: gateway.clone(),
                front: self.app.clone(),
                hyper: self.builder.clone(),
                watcher,
                closing: closing.subscribe(),
            };
            tokio::spawn(async move {
                let _conn = conn;
                crate::serve::front::serve(tcp, serving).await;
            });
        }
    }
}

/// The listener has closed: streams in flight get up to `server.drain_timeout` to finish (on
/// either port), then the drain's signal cuts what is still open, with `CUT_GRACE` to say so.
async fn drain(gateway: &Gateway, graceful: GracefulShutdown, closing: tokio::sync::watch::Sender<bool>) {
    tracing::info!(
        in_flight = gateway.in_flight(),
        "closed the listener; waiting for streams in flight"
    );
    closing.send_replace(true);
    let drain = async {
        tokio::join!(graceful.shutdown(), closing.closed(), picker_streams(gateway));
    };
    let mut drain = std::pin::pin!(drain);
    if tokio::time::timeout(gateway.config.server.drain_timeout, &mut drain)
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = gateway.in_flight(),
            "drain timeout: cutting the streams still open"
        );
        gateway.stop.send_replace(true);
        let _ = tokio::time::timeout(CUT_GRACE, drain).await;
    }
}

/// Resolves once no endpoint picker stream is open (Envoy's requests end as the clients' do).
async fn picker_streams(gateway: &Gateway) {
    while gateway.picker_streams.load(Ordering::Acquire) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// HTTP/1 and HTTP/2 on one port, with the server's limits on heads.
fn connection_builder(
    server: &crate::config::ServerConfig,
    header_timeout: Duration,
) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(server.max_head_buffer());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(server.max_header_bytes * 4).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)));
    builder
}

/// Whether a connection to the TLS listener opens with plain HTTP: a request line begins with
/// an upper-case method (`GET`, `POST`, h2's `PRI`), a TLS record with 0x16.
async fn plain_http(tcp: &tokio::net::TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(tcp.peek(&mut first).await, Ok(1) if first[0].is_ascii_uppercase())
}

/// nginx's answer to plain HTTP on its TLS port, so that a client that forgot `https://` reads
/// why (it read the TLS alert as an HTTP/0.9 body): the head is read first (up to 16 KiB), so that
/// closing with unread bytes does not reset the connection under the answer.
async fn refuse_plain_http(mut tcp: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY: &str = "The plain HTTP request was sent to HTTPS port: use https://\n";
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tcp.write_all(answer.as_bytes()).await;
    let _ = tcp.shutdown().await;
}

/// A TLS connection's handshake, within the time its request head has (`server.header_timeout`),
/// on either port: then hyper serves it, HTTP/1.1 or h2 as the client speaks (ALPN offers both),
/// or tonic the picker's gRPC.
pub(crate) async fn handshake<IO>(
    acceptor: tokio_rustls::TlsAcceptor,
    io: IO,
    within: Duration,
) -> Option<tokio_rustls::server::TlsStream<IO>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(within, acceptor.accept(io)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake not done within server.header_timeout");
            None
        }
    }
}

/// The accept loop both ports share (the public one and the endpoint picker's): one count of
/// client connections against `server.max_connections`, failed accepts counted and waited out,
/// and at most one warning a second.
#[derive(Clone)]
pub(crate) struct Accepting {
    open: Arc<AtomicUsize>,
    max: usize,
    metrics: Arc<crate::metrics::Metrics>,
    last_warning: Arc<std::sync::Mutex<Option<Instant>>>,
}

/// A connection just accepted: its socket, its place in the count (given back when dropped), and
/// whether it is over `server.max_connections`.
pub(crate) struct Accepted {
    pub(crate) tcp: tokio::net::TcpStream,
    pub(crate) conn: Connection,
    pub(crate) over: bool,
}

impl Accepting {
    pub(crate) fn new(gateway: &Gateway) -> Accepting {
        let max = gateway
            .config
            .server
            .max_connections
            .unwrap_or_else(default_max_connections);
        Accepting {
            open: Arc::new(AtomicUsize::new(0)),
            max,
            metrics: gateway.metrics.clone(),
            last_warning: Arc::default(),
        }
    }

    /// The next connection on `listener`. Out of descriptors (or another transient failure),
    /// the failure is counted and said, and connections in flight get a moment to end instead of
    /// a spin. Cancel-safe: nothing is taken until it returns.
    pub(crate) async fn accept(&self, listener: &TcpListener) -> Accepted {
        loop {
            match listener.accept().await {
                Ok((tcp, _)) => return self.admit(tcp),
                Err(e) => {
                    self.metrics.accept_errors.inc();
                    self.warn("cannot accept a connection", e.to_string());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    fn admit(&self, tcp: tokio::net::TcpStream) -> Accepted {
        let _ = tcp.set_nodelay(true);
        let count = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.connections.set(count as i64);
        let conn = Connection {
            open: self.open.clone(),
            gauge: self.metrics.connections.clone(),
        };
        let over = count > self.max;
        if over {
            self.metrics.connections_over_limit.inc();
            self.warn(
                "over server.max_connections: answering 503 and closing",
                format!("{count} open, limit {}", self.max),
            );
        }
        Accepted { tcp, conn, over }
    }

    /// At most one line a second: a flood must not become a flood of logs.
    fn warn(&self, what: &str, detail: String) {
        let now = Instant::now();
        let mut last = self.last_warning.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| now - t >= Duration::from_secs(1)) {
            *last = Some(now);
            tracing::warn!(detail, "{what}");
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Counts a client connection while it lives.
pub(crate) struct Connection {
    open: Arc<AtomicUsize>,
    gauge: prometheus::IntGauge,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let left = self.open.fetch_sub(1, Ordering::Relaxed) - 1;
        self.gauge.set(left as i64);
    }
}

/// What a connection over the limit gets: the probes still answer, anything else is a 503, and
/// the connection closes after its answer.
fn overloaded_router(gateway: Arc<Gateway>, max: usize) -> Router {
    let mut router = Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(|| async { StatusCode::SERVICE_UNAVAILABLE }));
    if gateway.config.server.metrics == MetricsExposure::Public {
        router = router.route("/metrics", get(crate::serve::router::metrics));
    }
    router
        .fallback(
            move |State(g): State<Arc<Gateway>>, req: axum::extract::Request| async move {
                let id = crate::serve::router::settled_id(&req);
                crate::path::refused(&g, id, GatewayError::TooManyConnections(max))
            },
        )
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            crate::serve::router::request_id,
        ))
        .layer(axum::middleware::map_response(
            |mut r: axum::response::Response| async move {
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                r
            },
        ))
        .with_state(gateway)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of clients while the accept loop is busy: every handshake completes in the kernel's
    /// queue, none waits for a retried SYN. With `TcpListener::bind`'s 128, 129 got in and the
    /// rest were still waiting after 3 s.
    #[tokio::test]
    async fn a_burst_of_connections_is_queued_not_dropped() {
        let burst = 400;
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn <= burst {
            println!("skipped: net.core.somaxconn is {somaxconn}, at most {burst} (it caps the backlog)");
            return;
        }
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        // Nothing accepts while they connect.
        let connects = (0..burst)
            .map(|_| tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr)));
        let done = futures::future::join_all(connects).await;
        let connected = done.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
        assert_eq!(
            connected, burst as usize,
            "every handshake completed without an accept"
        );
    }
}
