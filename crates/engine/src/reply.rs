//! What every route answers alike: the served model's check and vLLM's error answer.

use crate::engine::Engine;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::ApiError;

/// vLLM's error answer: its status, its OpenAI-shaped body.
pub(crate) fn error_response(err: &ApiError) -> Response {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        err.to_json(),
    )
        .into_response()
}

/// A JSON body with 200.
pub(crate) fn json(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// vLLM refuses a model it does not serve with 404 before reading anything else.
pub(crate) fn check_model(engine: &Engine, model: &str) -> Result<(), ApiError> {
    if model == engine.model() {
        Ok(())
    } else {
        Err(ApiError::vllm(
            404,
            "NotFoundError",
            format!("The model `{model}` does not exist."),
            Some("model"),
        ))
    }
}
