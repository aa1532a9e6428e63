//! Envoy's `ext_proc` messages as the endpoint picker reads and writes them: headers in and out,
//! the `envoy.lb` metadata of the Endpoint Picker Protocol, body chunks, immediate answers.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::service::ext_proc::v3 as ext;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use ext::processing_response::Response as Reply;
use std::collections::HashMap;

/// The metadata namespace and keys of the Endpoint Picker Protocol.
pub(super) const NAMESPACE: &str = "envoy.lb";
pub(super) const DESTINATION: &str = "x-gateway-destination-endpoint";
pub(super) const SERVED: &str = "x-gateway-destination-endpoint-served";
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
const SUBSET: &str = "x-gateway-destination-endpoint-subset";

/// A body chunk sent back to Envoy is at most this large: some Envoy builds refuse a streamed
/// chunk over 64 KiB.
const MAX_CHUNK: usize = 62_000;

/// `HeaderValueOption.append_action`: OVERWRITE_IF_EXISTS_OR_ADD.
const OVERWRITE: i32 = 2;

/// A request's or response's headers as a map (pseudo-headers such as `:path` kept by name), the
/// values from `raw_value` (what Envoy sends) or `value`; a field that is not a valid header is
/// left out.
pub(super) fn headers(h: &ext::HttpHeaders) -> HeaderMap {
    let mut map = HeaderMap::new();
    let fields = h.headers.as_ref().map(|m| &m.headers[..]);
    for field in fields.unwrap_or_default() {
        let Ok(name) = HeaderName::from_bytes(field.key.as_bytes()) else {
            // `:path` and the other pseudo-headers are not header names to `http`.
            continue;
        };
        let raw = if field.raw_value.is_empty() {
            field.value.as_bytes()
        } else {
            &field.raw_value[..]
        };
        if let Ok(value) = HeaderValue::from_bytes(raw) {
            map.append(name, value);
        }
    }
    map
}

/// One pseudo-header (`:path`, `:method`, `:status`), which [`headers`] leaves out.
pub(super) fn pseudo<'a>(h: &'a ext::HttpHeaders, name: &str) -> Option<&'a str> {
    let fields = h.headers.as_ref()?;
    let field = fields.headers.iter().find(|f| f.key == name)?;
    if field.raw_value.is_empty() {
        Some(field.value.as_str())
    } else {
        std::str::from_utf8(&field.raw_value).ok()
    }
}

/// The endpoints the data plane lets the picker choose from (`envoy.lb.subset_hint`), if it says:
/// a list of strings, or one string of comma-separated `ip:port`.
pub(super) fn subset(req: &ext::ProcessingRequest) -> Option<Vec<String>> {
    let value = req
        .metadata_context
        .as_ref()?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET)?;
    let mut out = Vec::new();
    let mut add = |s: &str| {
        out.extend(
            s.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned),
        );
    };
    match &value.kind {
        Some(Kind::StringValue(s)) => add(s),
        Some(Kind::ListValue(list)) => {
            for v in &list.values {
                if let Some(Kind::StringValue(s)) = &v.kind {
                    add(s);
                }
            }
        }
        _ => {}
    }
    Some(out)
}

/// The endpoint that served the response, as the data plane reports it (`envoy.lb`
/// `x-gateway-destination-endpoint-served`), else Envoy's `upstream.address` attribute.
pub(super) fn served(req: &ext::ProcessingRequest) -> Option<String> {
    let from_metadata = req
        .metadata_context
        .as_ref()
        .and_then(|m| m.filter_metadata.get(NAMESPACE))
        .and_then(|s| s.fields.get(SERVED))
        .and_then(|v| match &v.kind {
            Some(Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        });
    from_metadata.or_else(|| {
        req.attributes.values().find_map(|attrs| {
            match attrs.fields.get("upstream.address").and_then(|v| v.kind.as_ref()) {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            }
        })
    })
}

fn set(name: &str, value: &[u8]) -> core::HeaderValueOption {
    core::HeaderValueOption {
        header: Some(core::HeaderValue {
            key: name.to_owned(),
            raw_value: value.to_vec(),
            ..Default::default()
        }),
        append_action: OVERWRITE,
        ..Default::default()
    }
}

/// Header changes: `(name, value)` set, `remove` removed.
pub(super) fn mutation(setting: &[(&str, &[u8])], remove: &[&str]) -> ext::HeaderMutation {
    ext::HeaderMutation {
        set_headers: setting.iter().map(|(n, v)| set(n, v)).collect(),
        remove_headers: remove.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// The answer to the request's headers once an endpoint is picked: the destination header, and the
/// same list in the `envoy.lb` metadata (the protocol forbids the two to differ); the route is
/// looked up again, as a route may match on the header.
pub(super) fn destination(endpoints: &str, mut headers: ext::HeaderMutation) -> ext::ProcessingResponse {
    headers.set_headers.push(set(DESTINATION, endpoints.as_bytes()));
    let lb = Struct {
        fields: HashMap::from([(DESTINATION.to_owned(), string(endpoints))]),
    };
    ext::ProcessingResponse {
        response: Some(Reply::RequestHeaders(ext::HeadersResponse {
            response: Some(ext::CommonResponse {
                header_mutation: Some(headers),
                clear_route_cache: true,
                ..Default::default()
            }),
        })),
        dynamic_metadata: Some(Struct {
            fields: HashMap::from([(
                NAMESPACE.to_owned(),
                Value {
                    kind: Some(Kind::StructValue(lb)),
                },
            )]),
        }),
        ..Default::default()
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// `headers` set (all but `content-length`, which Envoy frames itself), `remove` removed.
pub(super) fn mutation_of(headers: &HeaderMap, remove: &[&str]) -> ext::HeaderMutation {
    let setting: Vec<(&str, &[u8])> = headers
        .iter()
        .filter(|(n, _)| *n != axum::http::header::CONTENT_LENGTH)
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    mutation(&setting, remove)
}

/// The response headers passed on, with `headers` changed.
pub(super) fn response_headers(headers: ext::HeaderMutation) -> ext::ProcessingResponse {
    ext::ProcessingResponse {
        response: Some(Reply::ResponseHeaders(ext::HeadersResponse {
            response: Some(ext::CommonResponse {
                header_mutation: Some(headers),
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

/// A body in full-duplex mode: what Envoy sends on is only what the picker sends back, in chunks
/// of at most [`MAX_CHUNK`], the last marked as the end if `end`.
pub(super) fn body(request: bool, bytes: &[u8], end: bool, out: &mut Vec<ext::ProcessingResponse>) {
    let mut chunks: Vec<&[u8]> = bytes.chunks(MAX_CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let response = Some(ext::CommonResponse {
            body_mutation: Some(ext::BodyMutation {
                mutation: Some(ext::body_mutation::Mutation::StreamedResponse(
                    ext::StreamedBodyResponse {
                        body: chunk.to_vec(),
                        end_of_stream: end && i == last,
                        ..Default::default()
                    },
                )),
            }),
            ..Default::default()
        });
        let reply = if request {
            Reply::RequestBody(ext::BodyResponse { response })
        } else {
            Reply::ResponseBody(ext::BodyResponse { response })
        };
        out.push(ext::ProcessingResponse {
            response: Some(reply),
            ..Default::default()
        });
    }
}

/// Trailers passed on unchanged.
pub(super) fn trailers(request: bool) -> ext::ProcessingResponse {
    let t = ext::TrailersResponse::default();
    ext::ProcessingResponse {
        response: Some(if request {
            Reply::RequestTrailers(t)
        } else {
            Reply::ResponseTrailers(t)
        }),
        ..Default::default()
    }
}

/// An answer Envoy sends the client in place of the request: `status`, `headers` and `body` (the
/// gateway's own OpenAI-shaped error, `Retry-After` and all).
pub(super) fn immediate(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    details: &str,
) -> ext::ProcessingResponse {
    ext::ProcessingResponse {
        response: Some(Reply::ImmediateResponse(ext::ImmediateResponse {
            status: Some(envoy_types::pb::envoy::r#type::v3::HttpStatus {
                code: i32::from(status.as_u16()),
            }),
            headers: Some(mutation_of(headers, &[])),
            body: body.to_vec(),
            details: details.to_owned(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn request_with(namespace: &str, key: &str, value: Value) -> ext::ProcessingRequest {
        let inner = Struct {
            fields: HashMap::from([(key.to_owned(), value)]),
        };
        ext::ProcessingRequest {
            metadata_context: Some(core::Metadata {
                filter_metadata: HashMap::from([(namespace.to_owned(), inner)]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_subset_is_read_as_a_list_or_as_one_comma_separated_string() {
        let listed = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string("10.0.0.1:8000"), string("10.0.0.2:8000, 10.0.0.3:8000")],
            })),
        };
        let req = request_with(SUBSET_NAMESPACE, SUBSET, listed);
        assert_eq!(
            subset(&req).unwrap(),
            ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
        );
        let req = request_with(SUBSET_NAMESPACE, SUBSET, string("10.0.0.1:8000,"));
        assert_eq!(subset(&req).unwrap(), ["10.0.0.1:8000"]);
        assert_eq!(subset(&ext::ProcessingRequest::default()), None);
    }

    #[test]
    fn the_served_endpoint_comes_from_the_metadata_before_the_attribute() {
        let mut req = request_with(NAMESPACE, SERVED, string("10.0.0.2:8000"));
        req.attributes.insert(
            "envoy.filters.http.ext_proc".into(),
            Struct {
                fields: HashMap::from([("upstream.address".into(), string("10.0.0.9:8000"))]),
            },
        );
        assert_eq!(served(&req).as_deref(), Some("10.0.0.2:8000"));
        req.metadata_context = None;
        assert_eq!(served(&req).as_deref(), Some("10.0.0.9:8000"));
    }

    #[test]
    fn the_destination_is_the_same_in_the_header_and_the_metadata() {
        let r = destination("10.0.0.1:8000,10.0.0.2:8000", mutation(&[], &[]));
        let Some(Reply::RequestHeaders(h)) = &r.response else {
            panic!("{r:?}")
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let set = &common.header_mutation.as_ref().unwrap().set_headers;
        let header = set.iter().find_map(|o| o.header.as_ref()).unwrap();
        assert_eq!(header.key, DESTINATION);
        assert_eq!(header.raw_value, b"10.0.0.1:8000,10.0.0.2:8000");
        let lb = &r.dynamic_metadata.as_ref().unwrap().fields[NAMESPACE];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!()
        };
        assert_eq!(lb.fields[DESTINATION], string("10.0.0.1:8000,10.0.0.2:8000"));
    }

    #[test]
    fn a_large_body_goes_back_in_chunks_the_last_one_ending_it() {
        let mut out = Vec::new();
        body(true, &vec![b'x'; MAX_CHUNK * 2 + 1], true, &mut out);
        let ends: Vec<(usize, bool)> = out
            .iter()
            .map(|r| match &r.response {
                Some(Reply::RequestBody(b)) => match &b.response.as_ref().unwrap().body_mutation {
                    Some(ext::BodyMutation {
                        mutation: Some(ext::body_mutation::Mutation::StreamedResponse(s)),
                    }) => (s.body.len(), s.end_of_stream),
                    m => panic!("{m:?}"),
                },
                r => panic!("{r:?}"),
            })
            .collect();
        assert_eq!(ends, [(MAX_CHUNK, false), (MAX_CHUNK, false), (1, true)]);
        out.clear();
        body(false, b"", true, &mut out);
        assert_eq!(out.len(), 1, "an empty end is still sent");
    }
}
