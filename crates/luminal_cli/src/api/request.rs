//! Parsing and checking a request body.

use super::{ApiError, Kind, Prompt, Request};
use axum::http::StatusCode;
use luminal_models::chat::ChatMessage;
use luminal_models::generate::GenerateOptions;
use luminal_models::sampling::SamplerConfig;
use serde_json::{Map, Value};

/// Parses and checks a request body.
pub fn parse(kind: Kind, body: &[u8], now: u64) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(obj) = value else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        ));
    };
    let model = match obj.get("model") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => return Err(ApiError::invalid("`model` is required", "model")),
        Some(_) => return Err(ApiError::invalid("`model` must be a string", "model")),
    };
    let prompt = match kind {
        Kind::Completion => parse_prompt(obj.get("prompt"))?,
        Kind::Chat => Prompt::Messages(parse_messages(obj.get("messages"))?),
    };
    if let Some(n) = uint(&obj, "n", 1, 128)? {
        if n != 1 {
            return Err(ApiError::invalid("only n = 1 is supported", "n"));
        }
    }
    if let Some(n) = uint(&obj, "best_of", 1, 128)? {
        if n != 1 {
            return Err(ApiError::invalid(
                "only best_of = 1 is supported",
                "best_of",
            ));
        }
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if let Some(x) = number(&obj, key, -2.0, 2.0)? {
            if x != 0.0 {
                return Err(ApiError::invalid(format!("`{key}` is not supported"), key));
            }
        }
    }
    // Features a plain text model cannot honour are refused, not silently ignored.
    for key in [
        "tools",
        "functions",
        "tool_choice",
        "function_call",
        "audio",
    ] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(_) => return Err(ApiError::invalid(format!("`{key}` is not supported"), key)),
        }
    }
    match obj.get("response_format") {
        None | Some(Value::Null) => {}
        Some(f) if f.get("type").and_then(Value::as_str) == Some("text") => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "only `response_format` {\"type\": \"text\"} is supported",
                "response_format",
            ))
        }
    }
    if boolean(&obj, "echo")? == Some(true) {
        return Err(ApiError::invalid("`echo` is not supported", "echo"));
    }
    let stream = boolean(&obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid(
                "`stream_options` must be an object",
                "stream_options",
            ))
        }
    };
    let max_tokens = match kind {
        Kind::Completion => Some(uint(&obj, "max_tokens", 0, u32::MAX as u64)?.unwrap_or(16)),
        Kind::Chat => match uint(&obj, "max_completion_tokens", 0, u32::MAX as u64)? {
            Some(n) => Some(n),
            None => uint(&obj, "max_tokens", 0, u32::MAX as u64)?,
        },
    }
    .map(|n| n as usize);
    let temperature = number(&obj, "temperature", 0.0, 2.0)?.unwrap_or(1.0);
    let top_p = number(&obj, "top_p", 0.0, 1.0)?.unwrap_or(1.0);
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => now ^ 0x9e37_79b9_7f4a_7c15,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => return Err(ApiError::invalid("`seed` must be an integer", "seed")),
        },
        Some(_) => return Err(ApiError::invalid("`seed` must be an integer", "seed")),
    };
    let stop_strings = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    _ => {
                        return Err(ApiError::invalid(
                            "`stop` must be a string or a list of strings",
                            "stop",
                        ))
                    }
                }
            }
            if out.len() > 4 {
                return Err(ApiError::invalid("`stop` holds at most 4 strings", "stop"));
            }
            out
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "`stop` must be a string or a list of strings",
                "stop",
            ))
        }
    };
    if stop_strings.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("a stop string is empty", "stop"));
    }
    let logprobs = match kind {
        // `logprobs: n` returns the n most likely tokens too.
        Kind::Completion => uint(&obj, "logprobs", 0, 5)?.map(|n| n as usize),
        Kind::Chat => {
            let top = uint(&obj, "top_logprobs", 0, 20)?.map(|n| n as usize);
            match (boolean(&obj, "logprobs")?, top) {
                (Some(true), top) => Some(top.unwrap_or(0)),
                (_, Some(_)) => {
                    return Err(ApiError::invalid(
                        "`top_logprobs` needs `logprobs` set to true",
                        "top_logprobs",
                    ))
                }
                _ => None,
            }
        }
    };
    let sampler = SamplerConfig {
        temperature: temperature as f32,
        top_p: top_p as f32,
        seed,
        ..Default::default()
    };
    Ok(Request {
        kind,
        model,
        prompt,
        stream,
        include_usage,
        max_tokens,
        opts: GenerateOptions {
            max_new_tokens: 0,
            sampler,
            stop_strings,
            logprobs,
        },
        logprobs: logprobs.is_some(),
        created: now,
        id: 0,
        prompt_tokens: 0,
    })
}

fn parse_prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "`prompt` must be a string, a list of one string, or a list of token ids",
            "prompt",
        )
    };
    match v {
        None | Some(Value::Null) => Err(ApiError::invalid("`prompt` is required", "prompt")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(ids)] => token_ids(ids).map(Prompt::Ids).ok_or_else(bad),
            [] => Err(ApiError::invalid("`prompt` is an empty list", "prompt")),
            items if items.iter().all(|i| i.is_string() || i.is_array()) => Err(ApiError::invalid(
                "only one prompt per request is supported",
                "prompt",
            )),
            items => token_ids(items).map(Prompt::Ids).ok_or_else(bad),
        },
        Some(_) => Err(bad()),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|i| i.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match v {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("`messages` is required", "messages"))
        }
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => return Err(ApiError::invalid("`messages` is empty", "messages")),
        Some(_) => return Err(ApiError::invalid("`messages` must be a list", "messages")),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Value::Object(m) = item else {
            return Err(ApiError::invalid(
                format!("`{param}` must be an object"),
                &param,
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => match r.as_str() {
                "system" | "user" | "assistant" => r.clone(),
                // OpenAI's newer name for the system role.
                "developer" => "system".into(),
                other => {
                    return Err(ApiError::invalid(
                        format!(
                        "`{param}.role` {other:?} is not one of system, developer, user, assistant"
                    ),
                        &format!("{param}.role"),
                    ))
                }
            },
            _ => {
                return Err(ApiError::invalid(
                    format!("`{param}.role` must be a string"),
                    &format!("{param}.role"),
                ))
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" => String::new(),
            // Content parts: only text parts are understood.
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                format!("`{param}.content`: only text parts are supported"),
                                &format!("{param}.content"),
                            ))
                        }
                    }
                }
                text
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("`{param}.content` must be a string or a list of text parts"),
                    &format!("{param}.content"),
                ))
            }
        };
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

/// An optional number in `[min, max]` (null = absent).
fn number(
    obj: &Map<String, Value>,
    key: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
            _ => Err(ApiError::invalid(
                format!("`{key}` must be between {min} and {max}, got {n}"),
                key,
            )),
        },
        Some(_) => Err(ApiError::invalid(format!("`{key}` must be a number"), key)),
    }
}

/// An optional integer in `[min, max]` (null = absent).
fn uint(obj: &Map<String, Value>, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
            _ => Err(ApiError::invalid(
                format!("`{key}` must be an integer between {min} and {max}, got {n}"),
                key,
            )),
        },
        Some(_) => Err(ApiError::invalid(
            format!("`{key}` must be an integer"),
            key,
        )),
    }
}

fn boolean(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            format!("`{key}` must be true or false"),
            key,
        )),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: Kind, body: &str) -> ApiError {
        parse(kind, body.as_bytes(), 0).unwrap_err()
    }

    #[test]
    fn parses_a_chat_request() {
        let r = parse(
            Kind::Chat,
            br#"{"model":"m","messages":[{"role":"developer","content":"Be brief."},
                {"role":"user","content":[{"type":"text","text":"Hi"}]}],
                "max_tokens":7,"temperature":0,"top_p":0.5,"stop":"END","seed":3,
                "logprobs":true,"top_logprobs":2,"stream":true,
                "stream_options":{"include_usage":true},"user":"ignored"}"#,
            9,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Messages(vec![
                ChatMessage::system("Be brief."),
                ChatMessage::user("Hi")
            ])
        );
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.opts.sampler.temperature, 0.0);
        assert_eq!(r.opts.sampler.top_p, 0.5);
        assert_eq!(r.opts.sampler.seed, 3);
        assert_eq!(r.opts.stop_strings, vec!["END".to_string()]);
        assert_eq!(r.opts.logprobs, Some(2));
        assert!(r.stream && r.include_usage && r.logprobs);
    }

    #[test]
    fn parses_completion_prompts() {
        let p = |body: &str| parse(Kind::Completion, body.as_bytes(), 0).map(|r| r.prompt);
        assert_eq!(
            p(r#"{"model":"m","prompt":"Hi"}"#).unwrap(),
            Prompt::Text("Hi".into())
        );
        assert_eq!(
            p(r#"{"model":"m","prompt":["Hi"]}"#).unwrap(),
            Prompt::Text("Hi".into())
        );
        assert_eq!(
            p(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap(),
            Prompt::Ids(vec![1, 2, 3])
        );
        assert_eq!(
            p(r#"{"model":"m","prompt":[[4,5]]}"#).unwrap(),
            Prompt::Ids(vec![4, 5])
        );
        let r = parse(Kind::Completion, br#"{"model":"m","prompt":"x"}"#, 0).unwrap();
        assert_eq!(r.max_tokens, Some(16), "OpenAI's default");
        assert_eq!(r.opts.sampler.temperature, 1.0, "OpenAI's default");
    }

    #[test]
    fn bad_requests_name_the_parameter() {
        let cases: &[(Kind, &str, Option<&str>, &str)] = &[
            (Kind::Chat, "{not json", None, "not valid JSON"),
            (Kind::Chat, "[1,2]", None, "must be a JSON object"),
            (Kind::Chat, r#"{"messages":[]}"#, Some("model"), "required"),
            (Kind::Chat, r#"{"model":"m"}"#, Some("messages"), "required"),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[]}"#,
                Some("messages"),
                "empty",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#,
                Some("messages[0].role"),
                "robot",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                Some("messages[0].content"),
                "string",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                Some("temperature"),
                "between 0 and 2",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                Some("temperature"),
                "number",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1.5}"#,
                Some("top_p"),
                "between",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
                Some("max_tokens"),
                "integer",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":2}"#,
                Some("n"),
                "n = 1",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]}"#,
                Some("stop"),
                "strings",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                Some("top_logprobs"),
                "logprobs",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                Some("stream"),
                "true or false",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#,
                Some("tools"),
                "not supported",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#,
                Some("response_format"),
                "text",
            ),
            (
                Kind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
                Some("messages[0].content"),
                "only text",
            ),
            (
                Kind::Completion,
                r#"{"model":"m"}"#,
                Some("prompt"),
                "required",
            ),
            (
                Kind::Completion,
                r#"{"model":"m","prompt":["a","b"]}"#,
                Some("prompt"),
                "one prompt",
            ),
            (
                Kind::Completion,
                r#"{"model":"m","prompt":[1,-2]}"#,
                Some("prompt"),
                "token ids",
            ),
            (
                Kind::Completion,
                r#"{"model":"m","prompt":"x","logprobs":9}"#,
                Some("logprobs"),
                "between 0 and 5",
            ),
        ];
        for (kind, body, param, text) in cases {
            let e = err(*kind, body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), *param, "{body}: {e:?}");
            assert!(e.message.contains(text), "{body}: {}", e.message);
            let b = e.body();
            assert_eq!(b["error"]["type"], "invalid_request_error");
            assert_eq!(b["error"]["message"], e.message.as_str());
        }
    }
}
