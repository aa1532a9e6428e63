//! The endpoint picker of the Gateway API Inference Extension: Envoy's `ext_proc` over gRPC, with
//! `grpc.health.v1` on the same port. Envoy (Envoy Gateway, Istio, kgateway, GKE …) stays the
//! proxy; per request it asks here where to send it, and this gateway's admission decides — the
//! same stages, gates and limits as its own HTTP path, which it keeps serving beside.

mod envoy;
mod exchange;

use crate::error::GatewayError;
use crate::route::{ReplicaGuard, Route};
use crate::serve::listener::{Accepted, Accepting, Connection, handshake};
use crate::state::Gateway;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures::Stream;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

/// Replies waiting to go to Envoy, per stream: a full-duplex body arrives faster than a slow
/// Envoy may read, and the stream waits rather than hold more.
const REPLIES: usize = 16;

/// How often replica host names are looked up again (a pod that restarts gets a new address).
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// The services a probe may name: the protocol's liveness and readiness, and the processor's own.
const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// What every stream shares: the gateway, the replicas' addresses, the fallbacks to name.
pub(crate) struct Picker {
    g: Arc<Gateway>,
    /// Each replica URL's `ip:port`, as Envoy knows the endpoint.
    addresses: RwLock<HashMap<Arc<str>, SocketAddr>>,
    fallbacks: usize,
}

impl Picker {
    fn requests(&self, result: &str) {
        self.g.metrics.picker_requests.with_label_values(&[result]).inc();
    }

    /// A replica's address, as Envoy will be told it; `None` until its host name resolves.
    fn address(&self, url: &str) -> Option<SocketAddr> {
        let found = self.addresses.read().ok()?.get(url).copied();
        found.or_else(|| literal(url))
    }

    /// The first replica `pick` chooses (holding it) and up to `fallbacks` more from `pool` by the
    /// route's balancer, as a comma-separated `ip:port` list. Replicas whose address is unknown,
    /// or outside the data plane's `subset`, are never named. `Err(None)`: no replica is left.
    /// A request `pinned` to the replica holding its state gets no fallback.
    fn endpoints(
        &self,
        route: &Route,
        pool: &[usize],
        prefix_key: u64,
        pinned: bool,
        subset: Option<&[String]>,
        mut pick: impl FnMut(&[usize]) -> Result<Option<ReplicaGuard>, GatewayError>,
    ) -> Result<(String, ReplicaGuard), Option<GatewayError>> {
        // Read in place: nothing below waits, and a copy would cost every request an allocation.
        let addresses = self.addresses.read().unwrap_or_else(|e| e.into_inner());
        // An IP literal needs no lookup: a replica a reload just added is named at once.
        let address = |i: usize| {
            let url = &route.replicas[i].url;
            addresses.get(url).copied().or_else(|| literal(url))
        };
        let allowed = |a: SocketAddr| {
            subset.is_none_or(|s| {
                s.iter().any(|e| match e.parse::<SocketAddr>() {
                    Ok(x) => x == a,
                    // The protocol lets a subset name a bare IP: any port of it.
                    Err(_) => e.parse::<IpAddr>() == Ok(a.ip()),
                })
            })
        };
        let mut tried: Vec<usize> = pool
            .iter()
            .copied()
            .filter(|i| !address(*i).is_some_and(allowed))
            .collect();
        let first = pick(&tried).map_err(Some)?.ok_or(None)?;
        let mut list = address(first.index).map(|a| a.to_string()).unwrap_or_default();
        tried.push(first.index);
        let now = Instant::now();
        let fallbacks = if pinned { 0 } else { self.fallbacks };
        for _ in 0..fallbacks {
            // Held only while chosen: the request is counted on the replica that serves it.
            let Some(next) = route.pick(pool, &tried, prefix_key, now) else {
                break;
            };
            tried.push(next.index);
            if let Some(a) = address(next.index) {
                list.push(',');
                list.push_str(&a.to_string());
            }
        }
        Ok((list, first))
    }

    /// Looks up every replica's host now; an address that does not resolve keeps its last one.
    async fn resolve(&self) {
        let table = self.g.table();
        let urls: Vec<Arc<str>> = table
            .routes
            .iter()
            .flat_map(|r| r.replicas.iter().map(|x| x.url.clone()))
            .collect();
        let mut found = HashMap::new();
        for url in urls {
            if let Some(a) = lookup(&url).await {
                found.insert(url, a);
            } else if let Some(old) = self.address(&url) {
                found.insert(url, old);
            }
        }
        if let Ok(mut a) = self.addresses.write() {
            *a = found;
        }
    }
}

/// A replica URL's host and port (the scheme's default if none).
fn host_port(url: &str) -> Option<(String, u16)> {
    let uri: hyper::Uri = url.parse().ok()?;
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    Some((host, port))
}

/// A replica URL's address when its host is an IP.
fn literal(url: &str) -> Option<SocketAddr> {
    let (host, port) = host_port(url)?;
    Some(SocketAddr::new(host.parse::<IpAddr>().ok()?, port))
}

/// A replica URL's address: its IP and port, or the first address its host name resolves to.
async fn lookup(url: &str) -> Option<SocketAddr> {
    if let Some(a) = literal(url) {
        return Some(a);
    }
    let (host, port) = host_port(url)?;
    let host = host.as_str();
    let found = tokio::time::timeout(Duration::from_secs(2), tokio::net::lookup_host((host, port)));
    let mut addrs: Vec<SocketAddr> = found.await.ok()?.ok()?.collect();
    // IPv4 first, where a name has both: Envoy's pod endpoints are IPv4 in most clusters.
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs.first().copied()
}

struct Service(Arc<Picker>);

type Replies = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = Replies;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Replies>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(REPLIES);
        let picker = self.0.clone();
        let g = picker.g.clone();
        let open = OpenStream::new(&g);
        tokio::spawn(async move {
            let _open = open;
            // A stream whose handler failed must not end as if answered: Envoy would then send
            // the request on unpicked, FailClose or not.
            let failed = tx.clone();
            let handler = tokio::spawn(exchange::run(g, picker, request.into_inner(), tx));
            if handler.await.is_err() {
                let _ = failed
                    .send(Err(Status::internal(
                        "the endpoint picker failed on this request",
                    )))
                    .await;
            }
        });
        let replies = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// Counts a picker stream open until dropped, so that the drain waits for it.
struct OpenStream(Arc<Gateway>);

impl OpenStream {
    fn new(g: &Arc<Gateway>) -> OpenStream {
        g.picker_streams.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        OpenStream(g.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0
            .picker_streams
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A connection to the picker, plain or over TLS, as tonic takes one; counted among the
/// gateway's client connections while it lives.
struct Conn {
    io: Box<dyn Io>,
    _counted: Connection,
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Connections accepted on `listener` by the gateway's accept loop ([`Accepting`]: the one
/// count against `server.max_connections`; one over it is closed at once), each after its TLS
/// handshake where the picker has a certificate (within `timeout`, on a task of its own, so that
/// a slow one holds up no other; a failed handshake is dropped).
fn incoming(
    listener: TcpListener,
    accepting: Accepting,
    tls: Option<Arc<rustls::ServerConfig>>,
    timeout: Duration,
) -> impl Stream<Item = std::io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Conn>(64);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            // The server gone (the receiver dropped), the listener goes with this task.
            let accepted = tokio::select! {
                a = accepting.accept(&listener) => a,
                () = tx.closed() => return,
            };
            let Accepted { tcp, conn, over } = accepted;
            if over {
                // gRPC has no answer to give before its own handshake: the connection closes.
                continue;
            }
            let (acceptor, sender) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let io: Box<dyn Io> = match acceptor {
                    None => Box::new(tcp),
                    Some(acceptor) => match handshake(acceptor, tcp, timeout).await {
                        Some(tls) => Box::new(tls),
                        None => return,
                    },
                };
                let _ = sender.send(Conn { io, _counted: conn }).await;
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) })
}

/// Serves the picker on `listener` until the process ends; its health turns `NOT_SERVING`
/// (but liveness) once the gateway drains.
pub(crate) async fn serve(listener: TcpListener, g: Arc<Gateway>, accepting: Accepting, fallbacks: u8) {
    let picker = Arc::new(Picker {
        g: g.clone(),
        addresses: RwLock::default(),
        fallbacks: usize::from(fallbacks),
    });
    picker.resolve().await;
    let resolver = picker.clone();
    let _resolving = crate::state::AbortOnDrop(tokio::spawn(async move {
        loop {
            tokio::time::sleep(RESOLVE_EVERY).await;
            resolver.resolve().await;
        }
    }));
    let (reporter, health) = tonic_health::server::health_reporter();
    for service in ["", "liveness", "readiness", EXT_PROC] {
        reporter.set_service_status(service, ServingStatus::Serving).await;
    }
    let draining = g.clone();
    let _health = crate::state::AbortOnDrop(tokio::spawn(async move {
        while !draining.is_draining() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for service in ["", "readiness", EXT_PROC] {
            reporter
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
    }));
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(health)
        .add_service(ExternalProcessorServer::new(Service(picker)));
    let timeout = g.config.server.header_timeout;
    let incoming = incoming(listener, accepting, g.picker_tls.clone(), timeout);
    let result = router.serve_with_incoming(incoming).await;
    if let Err(e) = result {
        tracing::error!(error = %e, "the endpoint picker stopped");
    }
}
