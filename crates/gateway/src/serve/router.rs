//! The public port's router and the endpoints around the request path (`/v1/models`, `/health`,
//! `/ready`, `/metrics`), and the hyper service that sends the two completion endpoints and
//! `/v1/embeddings` straight to [`crate::path`] and everything else through the router.

use crate::config::MetricsExposure;
use crate::error::{GatewayError, Invalid};
use crate::path::api::Api;
use crate::path::respond::into_hyper;
use crate::path::stored::Ask;
use crate::path::{auth, completion, handle, identified, refused, stamp};
use crate::state::Gateway;
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The gateway's public router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let mut router = Router::new();
    for api in Api::ALL {
        let serve = move |State(g): State<Arc<Gateway>>, req: Request| async move {
            let id = settled_id(&req);
            into_hyper(handle(&g, None, api, id, req).await)
        };
        router = router.route(api.path(), post(serve));
    }
    router = router
        .route("/v1/responses/{id}", get(read_response))
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready));
    if gateway.config.server.metrics == MetricsExposure::Public {
        router = router.route("/metrics", get(metrics));
    }
    router
        .fallback(|State(g): State<Arc<Gateway>>, req: Request| async move {
            refused(&g, settled_id(&req), GatewayError::NotFound(UNKNOWN_PATH.into()))
        })
        .method_not_allowed_fallback(|State(g): State<Arc<Gateway>>, req: Request| async move {
            let e = GatewayError::MethodNotAllowed("this endpoint does not take that method");
            refused(&g, settled_id(&req), e)
        })
        .layer(axum::middleware::from_fn_with_state(gateway.clone(), request_id))
        .with_state(gateway)
}

/// The request's ID, as the middleware settled it.
#[derive(Clone)]
struct RequestId(String);

/// The router's side of [`identified`]: the ID goes into the request for the handlers.
pub(crate) async fn request_id(State(g): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    identified(&g, req, |id, mut req| async move {
        req.extensions_mut().insert(RequestId(id.clone()));
        let mut response = next.run(req).await;
        stamp(&mut response, &id);
        response
    })
    .await
}

/// Ready unless draining or some route has no replica that answered its last connection attempt.
async fn ready(State(g): State<Arc<Gateway>>) -> StatusCode {
    if g.is_draining() || !g.table().routes.iter().all(|r| r.has_reachable_replica()) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

pub(crate) async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
    g.refresh_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        g.metrics.encode(),
    )
        .into_response()
}

/// The 404's message for a path the gateway does not serve (here, and through the endpoint picker).
pub(crate) const UNKNOWN_PATH: &str = "no such endpoint: the gateway serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses (and GET /v1/responses/{id}, POST /v1/responses/{id}/cancel), /v1/messages, /v1/messages/count_tokens and /v1/models";

/// `GET /v1/responses/{id}`: from the replica that made it.
async fn read_response(State(g): State<Arc<Gateway>>, Path(id): Path<String>, req: Request) -> Response {
    crate::path::stored::serve(&g, Ask::Read, &id, req.headers(), settled_id(&req)).await
}

/// `POST /v1/responses/{id}/cancel`: on the replica that made it.
async fn cancel_response(State(g): State<Arc<Gateway>>, Path(id): Path<String>, req: Request) -> Response {
    crate::path::stored::serve(&g, Ask::Cancel, &id, req.headers(), settled_id(&req)).await
}

async fn models(State(g): State<Arc<Gateway>>, req: Request) -> Response {
    match model_list(&g, req.headers()) {
        Ok(list) => axum::Json(list).into_response(),
        Err(e) => refused(&g, settled_id(&req), e),
    }
}

/// `/v1/models`: the public models the caller's key may use, as OpenAI lists them (the proxy's
/// route and the endpoint picker's answer alike).
pub(crate) fn model_list(
    g: &Gateway,
    headers: &HeaderMap,
) -> Result<serde_json::Value, crate::error::GatewayError> {
    let table = g.table();
    let tenant = table.tenants.identify(auth(headers).as_deref())?;
    let data: Vec<_> = table
        .routes
        .iter()
        .filter(|r| tenant.may_use(&r.config.model))
        .map(|r| {
            let mut card = serde_json::json!({"id": r.config.model, "object": "model", "created": 0, "owned_by": "spillway"});
            // The smallest the replicas stated: a request that fits it fits wherever it goes.
            if let Some(len) = r.replicas.iter().filter_map(|x| x.max_model_len()).min() {
                card["max_model_len"] = len.into();
            }
            card
        })
        .collect();
    Ok(serde_json::json!({"object": "list", "data": data}))
}

/// The request ID the middleware settled (or a new one, for a router without it).
pub(crate) fn settled_id(req: &Request) -> String {
    match req.extensions().get::<RequestId>() {
        Some(RequestId(id)) => id.clone(),
        None => crate::path::hints::request_id(req.headers()),
    }
}

/// The public listener's service. The two completion endpoints and `/v1/embeddings` go straight
/// to the request path: axum's routing, middleware and body boxing cost allocations and dynamic
/// calls per request (bench/runs/2026-12-03-rust-2core-hand-written-readers.md), which the hot
/// path does without. Every other request, and any other method on those paths, goes through the
/// [`router`], which answers them as before.
#[derive(Clone)]
pub(crate) struct HyperService {
    gateway: Arc<Gateway>,
    /// False on connections over the limit: the router answers everything there.
    completions: bool,
    router: TowerToHyperService<Router>,
}

impl HyperService {
    /// With `completions`, the completion endpoints go straight to the request path.
    pub(crate) fn new(gateway: Arc<Gateway>, completions: bool, router: Router) -> HyperService {
        HyperService {
            gateway,
            completions,
            router: TowerToHyperService::new(router),
        }
    }
}

impl hyper::service::Service<axum::http::Request<Incoming>> for HyperService {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn call(&self, req: axum::http::Request<Incoming>) -> Self::Future {
        if let Err(e) = host_checked(&req) {
            let response = refused(&self.gateway, crate::path::hints::request_id(req.headers()), e);
            return Box::pin(std::future::ready(Ok(response)));
        }
        let api = (req.method() == Method::POST)
            .then(|| Api::at(req.uri().path()))
            .flatten();
        match api {
            Some(api) if self.completions => {
                let g = self.gateway.clone();
                Box::pin(async move { Ok(into_hyper(completion(g, None, api, req).await)) })
            }
            _ => Box::pin(self.router.call(req)),
        }
    }
}

/// RFC 9112 §3.2: an HTTP/1.1 request has one `Host` header, and an HTTP/1 request's `Host`, if
/// any, is valid; HTTP/2 names its authority otherwise. `front` hands such heads over to be
/// answered here.
fn host_checked<B>(req: &axum::http::Request<B>) -> Result<(), GatewayError> {
    let version = req.version();
    if version > axum::http::Version::HTTP_11 {
        return Ok(());
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let message = match (hosts.next(), hosts.next()) {
        (None, _) if version == axum::http::Version::HTTP_11 => "an HTTP/1.1 request must have a Host header",
        (None, _) => return Ok(()),
        (Some(_), Some(_)) => "a request must have one Host header, not several",
        (Some(h), None) if !http1::server::valid_host(h.as_bytes()) => {
            "the Host header is not a valid host[:port]"
        }
        (Some(_), None) => return Ok(()),
    };
    Err(GatewayError::bad_request(Invalid::Host, message, None))
}
