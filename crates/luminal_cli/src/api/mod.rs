//! The OpenAI API's request and response bodies, for `luminal serve`: parsing and checking
//! a `/v1/completions` or `/v1/chat/completions` request, and writing the completion, the
//! streamed chunks and the errors in OpenAI's shapes.

mod request;
mod response;

pub use request::parse;
pub use response::{full_body, stream_end, stream_piece, stream_start};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use luminal_models::chat::ChatMessage;
use luminal_models::generate::GenerateOptions;
use serde_json::{json, Value};

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// The prompt of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// `/v1/completions` with a string.
    Text(String),
    /// `/v1/completions` with token ids.
    Ids(Vec<u32>),
    /// `/v1/chat/completions`.
    Messages(Vec<ChatMessage>),
}

/// A checked request.
#[derive(Clone, Debug)]
pub struct Request {
    pub kind: Kind,
    pub model: String,
    pub prompt: Prompt,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// `max_tokens` (or `max_completion_tokens`), when given.
    pub max_tokens: Option<usize>,
    /// Sampler, stop strings and logprobs (`max_new_tokens` is set when queued).
    pub opts: GenerateOptions,
    /// Whether the response carries logprobs.
    pub logprobs: bool,
    pub created: u64,
    /// Set when queued: the number in the response id.
    pub id: u64,
    /// Set when queued: tokens in the prompt.
    pub prompt_tokens: usize,
}

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 about the parameter `param`.
    pub fn invalid(message: impl Into<String>, param: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message).param(param)
    }

    /// A 500: the model failed.
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn param(mut self, param: &str) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn code(mut self, code: &str) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn body(&self) -> Value {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
