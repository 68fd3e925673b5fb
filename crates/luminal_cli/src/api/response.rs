//! Response bodies: a whole completion, and the chunks of a stream.

use super::{Kind, Request};
use luminal_models::generate::{Generation, StopReason, TokenLogprob};
use luminal_models::Tokenizer;
use serde_json::{json, Map, Value};

/// OpenAI's `finish_reason`: `stop` (end of text or a stop string), `length` (token limit
/// or full context).
pub fn finish_reason(reason: &StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        _ => "stop",
    }
}

fn response_id(req: &Request) -> String {
    match req.kind {
        Kind::Completion => format!("cmpl-{}-{}", req.created, req.id),
        Kind::Chat => format!("chatcmpl-{}-{}", req.created, req.id),
    }
}

fn usage(req: &Request, g: &Generation) -> Value {
    let completion = g.stats.generated_tokens;
    json!({
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": req.prompt_tokens + completion,
    })
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// The `logprobs` object of a choice (`null` when not asked for).
fn logprobs_value(req: &Request, tok: &Tokenizer, lps: &[TokenLogprob], offset: usize) -> Value {
    if !req.logprobs {
        return Value::Null;
    }
    match req.kind {
        Kind::Completion => {
            let mut text_offset = Vec::with_capacity(lps.len());
            let mut at = offset;
            let tokens: Vec<String> = lps
                .iter()
                .map(|lp| {
                    let t = token_text(tok, lp.id);
                    text_offset.push(at);
                    at += t.len();
                    t
                })
                .collect();
            let top: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let mut m = Map::new();
                    for &(id, x) in &lp.top {
                        m.insert(token_text(tok, id), json!(x));
                    }
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": tokens,
                "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": text_offset,
            })
        }
        Kind::Chat => {
            let entry = |id: u32, x: f32| {
                let t = token_text(tok, id);
                json!({"token": t, "logprob": x, "bytes": t.as_bytes()})
            };
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let mut e = entry(lp.id, lp.logprob);
                    e["top_logprobs"] =
                        Value::Array(lp.top.iter().map(|&(id, x)| entry(id, x)).collect());
                    e
                })
                .collect();
            json!({ "content": content })
        }
    }
}

/// The body of a non-streamed response.
pub fn full_body(
    req: &Request,
    model: &str,
    tok: &Tokenizer,
    text: &str,
    lps: &[TokenLogprob],
    g: &Generation,
) -> Value {
    let finish = finish_reason(&g.stats.stop_reason);
    let logprobs = logprobs_value(req, tok, lps, 0);
    let choice = match req.kind {
        Kind::Completion => json!({
            "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
        }),
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish,
        }),
    };
    json!({
        "id": response_id(req),
        "object": if req.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": req.created,
        "model": model,
        "choices": [choice],
        "usage": usage(req, g),
    })
}

fn chunk(req: &Request, model: &str, choices: Value) -> Value {
    json!({
        "id": response_id(req),
        "object": if req.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
        "created": req.created,
        "model": model,
        "choices": choices,
    })
}

/// The first chunk of a stream (chat: the assistant's role), if any.
pub fn stream_start(req: &Request, model: &str) -> Option<Value> {
    (req.kind == Kind::Chat).then(|| {
        chunk(
            req,
            model,
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null}]),
        )
    })
}

/// A chunk carrying a piece of text.
pub fn stream_piece(
    req: &Request,
    model: &str,
    tok: &Tokenizer,
    text: &str,
    lps: &[TokenLogprob],
) -> Value {
    let logprobs = logprobs_value(req, tok, lps, 0);
    let choice = match req.kind {
        Kind::Completion => {
            json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": null})
        }
        Kind::Chat => json!({"index": 0, "delta": {"content": text},
                             "logprobs": logprobs, "finish_reason": null}),
    };
    chunk(req, model, json!([choice]))
}

/// The last chunks of a stream: the finish reason, then the usage when asked for.
pub fn stream_end(req: &Request, model: &str, g: &Generation) -> Vec<Value> {
    let finish = finish_reason(&g.stats.stop_reason);
    let choice = match req.kind {
        Kind::Completion => {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish})
        }
        Kind::Chat => {
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish})
        }
    };
    let mut out = vec![chunk(req, model, json!([choice]))];
    if req.include_usage {
        let mut last = chunk(req, model, json!([]));
        last["usage"] = usage(req, g);
        out.push(last);
    }
    out
}
