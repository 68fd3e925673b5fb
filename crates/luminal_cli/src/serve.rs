//! `luminal serve`: an OpenAI-compatible HTTP server (axum + tokio).
//!
//! Routes: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (both with
//! `stream: true` as server-sent events), `GET /health`. One model serves every client:
//! requests wait in a first-in first-out queue and run one at a time on a worker thread
//! that owns the model (a CPU run already uses every core), so answers are never mixed up.
//! The worker keeps its KV cache between requests ([`Session`]): a request that starts with
//! the previous one's tokens (the next turn of a chat) prefills only what is new.
//!
//! Bad requests get OpenAI-style JSON errors (`{"error": {"message", "type", "param",
//! "code"}}`) with 400 (invalid body or parameter), 404 (unknown model or route), 405
//! (wrong method), 413 (body too large); a failure of the model (such as non-finite logits)
//! is a 500. A client that disconnects cancels its generation.

use crate::api::{self, ApiError, Kind, Request};
use crate::common::{load_model, CliError, CliModel, CliResult, Device};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use luminal_models::chat::ChatTemplate;
use luminal_models::generate::{GenerateEvent, Generation, TokenLogprob};
use luminal_models::session::{end_of_turn_text, Session};
use luminal_models::{Model, Tokenizer};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc as tmpsc;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF file or Hugging Face folder
    #[arg(short, long)]
    model: PathBuf,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port; the address is printed on stderr)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's name in the API (default: the file name without extension)
    #[arg(long)]
    model_name: Option<String>,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// Context size in tokens (prompt + answer of one request)
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
    /// Largest request body in bytes
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Most requests waiting or running at once; more get 429 (OpenAI's "too many requests")
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
}

/// What the handlers share.
struct AppState {
    model_name: String,
    created: u64,
    tok: Tokenizer,
    template: ChatTemplate,
    end_of_turn: Option<String>,
    max_ctx: usize,
    jobs: mpsc::Sender<Job>,
    next_id: AtomicU64,
    /// Requests queued or running (the worker counts them down).
    in_queue: Arc<AtomicUsize>,
    max_queue: usize,
}

/// One request for the worker.
struct Job {
    prompt_ids: Vec<u32>,
    opts: luminal_models::GenerateOptions,
    events: tmpsc::UnboundedSender<WorkerEvent>,
}

/// What the worker sends back for a job, in order: text pieces, then `Done` or `Failed`.
enum WorkerEvent {
    /// Text, and the tokens sampled since the previous piece (with their logprobs when
    /// asked for).
    Text(String, Vec<TokenLogprob>),
    Done(Generation),
    Failed(String),
}

pub fn run(args: ServeArgs) -> CliResult {
    let (model, tok) = load_model(
        &args.model,
        args.device,
        args.threads,
        args.ctx,
        luminal_models::LoadOptions::default().cache_type,
    )?;
    let model_name = args.model_name.clone().unwrap_or_else(|| {
        args.model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let template = ChatTemplate::for_tokenizer(&tok)?;
    let (jobs, queue) = mpsc::channel::<Job>();
    let in_queue = Arc::new(AtomicUsize::new(0));
    let worker_count = in_queue.clone();
    let state = Arc::new(AppState {
        model_name,
        created: unix_now(),
        end_of_turn: end_of_turn_text(&template, &tok),
        template,
        max_ctx: model.max_ctx(),
        tok: tok.clone(),
        jobs,
        next_id: AtomicU64::new(1),
        in_queue,
        max_queue: args.max_queue.max(1),
    });
    std::thread::Builder::new()
        .name("luminal-worker".into())
        .spawn(move || worker(Session::new(model, tok), queue, &worker_count))?;

    let app = router(state.clone(), args.max_body);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| {
                CliError::msg(format!("cannot listen on {}:{}: {e}", args.host, args.port))
            })?;
        let addr = listener.local_addr()?;
        eprintln!(
            "serving {} on http://{addr}/v1 (context {} tokens)",
            state.model_name, state.max_ctx
        );
        axum::serve(listener, app).await?;
        Ok(())
    })
}

/// Runs the queued jobs one at a time, keeping the KV cache between them.
fn worker(mut session: Session<CliModel>, queue: mpsc::Receiver<Job>, in_queue: &AtomicUsize) {
    for job in queue {
        run_job(&mut session, &job);
        in_queue.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs one job, streaming its events; stops early when its client has gone.
fn run_job(session: &mut Session<CliModel>, job: &Job) {
    if job.events.is_closed() {
        return; // The client left while waiting.
    }
    let mut pending: Vec<TokenLogprob> = Vec::new();
    let events = &job.events;
    let result = session.generate(&job.prompt_ids, &job.opts, |event| {
        match event {
            GenerateEvent::Token { logprob, .. } => pending.extend(logprob.cloned()),
            GenerateEvent::Text(t) => {
                let piece = WorkerEvent::Text(t.to_string(), std::mem::take(&mut pending));
                if events.send(piece).is_err() {
                    return ControlFlow::Break(());
                }
            }
        }
        if events.is_closed() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    let _ = job.events.send(match result {
        Ok(g) => WorkerEvent::Done(g),
        Err(e) => WorkerEvent::Failed(e.to_string()),
    });
}

fn router(state: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/health", get(|| async { "ok" }))
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("unknown route {}", uri.path()),
            )
            .code("not_found")
        })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn model_object(state: &AppState) -> Value {
    json!({
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "luminal",
        "context_length": state.max_ctx,
    })
}

async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&state)]})).into_response()
}

async fn get_model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id == state.model_name {
        axum::Json(model_object(&state)).into_response()
    } else {
        unknown_model(&id).into_response()
    }
}

fn unknown_model(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("the model `{id}` does not exist"),
    )
    .param("model")
    .code("model_not_found")
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, Kind::Completion, body).await
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, Kind::Chat, body).await
}

async fn handle(state: Arc<AppState>, kind: Kind, body: Result<Bytes, BytesRejection>) -> Response {
    match prepare(&state, kind, body) {
        Ok((req, job_rx)) => {
            if req.stream {
                stream_response(state, req, job_rx).into_response()
            } else {
                full_response(state, req, job_rx).await
            }
        }
        Err(e) => e.into_response(),
    }
}

/// Parses and checks the request, tokenizes its prompt and queues it.
fn prepare(
    state: &AppState,
    kind: Kind,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Request, tmpsc::UnboundedReceiver<WorkerEvent>), ApiError> {
    let body = body.map_err(|e| {
        let status = e.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is too large".to_string()
        } else {
            format!("cannot read the request body: {e}")
        };
        ApiError::new(status, message)
    })?;
    let mut req = api::parse(kind, &body, unix_now())?;
    if req.model != state.model_name {
        return Err(unknown_model(&req.model));
    }
    let prompt_ids = match &req.prompt {
        api::Prompt::Text(text) => encode(&state.tok, text)?,
        api::Prompt::Ids(ids) => {
            let vocab = state.tok.vocab_size();
            if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                    "prompt",
                ));
            }
            ids.clone()
        }
        api::Prompt::Messages(messages) => {
            let text = state
                .template
                .apply(messages, true)
                .map_err(|e| ApiError::invalid(e.to_string(), "messages"))?;
            encode(&state.tok, &text)?
        }
    };
    if prompt_ids.is_empty() && state.tok.bos_id().is_none() {
        return Err(ApiError::invalid("the prompt is empty", "prompt"));
    }
    let n_prompt = prompt_ids.len().max(1);
    if n_prompt >= state.max_ctx {
        return Err(ApiError::invalid(
            format!(
                "the prompt has {n_prompt} tokens; this server's context holds {} (prompt and answer together)",
                state.max_ctx
            ),
            "messages",
        )
        .code("context_length_exceeded"));
    }
    req.prompt_tokens = n_prompt;
    if kind == Kind::Chat {
        req.opts.stop_strings.extend(state.end_of_turn.clone());
    }
    // Without max_tokens a chat answer may fill the context.
    req.opts.max_new_tokens = req
        .max_tokens
        .unwrap_or(state.max_ctx)
        .min(state.max_ctx - n_prompt);
    req.id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let waiting = state.in_queue.fetch_add(1, Ordering::SeqCst);
    if waiting >= state.max_queue {
        state.in_queue.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{waiting} requests are already queued: try again later"),
        )
        .code("queue_full"));
    }
    let (events, job_rx) = tmpsc::unbounded_channel();
    state
        .jobs
        .send(Job {
            prompt_ids,
            opts: req.opts.clone(),
            events,
        })
        .map_err(|_| {
            state.in_queue.fetch_sub(1, Ordering::SeqCst);
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model worker stopped")
        })?;
    Ok((req, job_rx))
}

fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    luminal_models::session::encode_prompt(tok, text)
        .map_err(|e| ApiError::invalid(format!("cannot tokenize the prompt: {e}"), "prompt"))
}

async fn full_response(
    state: Arc<AppState>,
    req: Request,
    mut rx: tmpsc::UnboundedReceiver<WorkerEvent>,
) -> Response {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            WorkerEvent::Text(t, lps) => {
                text.push_str(&t);
                logprobs.extend(lps);
            }
            WorkerEvent::Done(g) => {
                // Logprobs of tokens whose text never came (held back, or a stop string).
                logprobs = g.logprobs.clone();
                let body =
                    api::full_body(&req, &state.model_name, &state.tok, &text, &logprobs, &g);
                return axum::Json(body).into_response();
            }
            WorkerEvent::Failed(message) => return ApiError::server(message).into_response(),
        }
    }
    ApiError::server("the model worker stopped").into_response()
}

fn stream_response(
    state: Arc<AppState>,
    req: Request,
    rx: tmpsc::UnboundedReceiver<WorkerEvent>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let req = Arc::new(req);
    // First chunk (chat: the assistant's role), then one per piece of text, then the
    // finish reason, the usage when asked for, and `[DONE]`.
    let first: Vec<Value> = api::stream_start(&req, &state.model_name)
        .into_iter()
        .collect();
    let stream = futures_util::stream::unfold(
        (rx, first, false),
        move |(mut rx, mut queued, mut finished)| {
            let state = state.clone();
            let req = req.clone();
            async move {
                loop {
                    if !queued.is_empty() {
                        let v = queued.remove(0);
                        let data = if v.is_string() {
                            v.as_str().unwrap_or("").to_string()
                        } else {
                            v.to_string()
                        };
                        return Some((Ok(Event::default().data(data)), (rx, queued, finished)));
                    }
                    if finished {
                        return None;
                    }
                    match rx.recv().await {
                        Some(WorkerEvent::Text(t, lps)) => {
                            queued.push(api::stream_piece(
                                &req,
                                &state.model_name,
                                &state.tok,
                                &t,
                                &lps,
                            ));
                        }
                        Some(WorkerEvent::Done(g)) => {
                            queued.extend(api::stream_end(&req, &state.model_name, &g));
                            queued.push(Value::String("[DONE]".into()));
                            finished = true;
                        }
                        Some(WorkerEvent::Failed(message)) => {
                            queued.push(ApiError::server(message).body());
                            queued.push(Value::String("[DONE]".into()));
                            finished = true;
                        }
                        None => {
                            queued.push(ApiError::server("the model worker stopped").body());
                            finished = true;
                        }
                    }
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}
