//! `luminal serve` end to end over real HTTP (a small HTTP/1.1 client on `TcpStream`):
//! answers checked against transformers' greedy generation (the tiny fixture) and against
//! `luminal generate` (the real SmolLM2 file, skipped when absent), several clients at
//! once, streaming, and OpenAI-style errors for malformed requests.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_llama() -> PathBuf {
    root().join("crates/luminal_model_tests/tests/fixtures/tiny-llama")
}

fn smollm2() -> Option<PathBuf> {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

/// A running `luminal serve`, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts the server on a free port and waits for its "serving … on http://addr" line.
    fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_luminal"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
            .args(["--threads", "2"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("luminal serve starts");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let port = loop {
            let line = lines
                .next()
                .expect("the server prints its address")
                .unwrap();
            if let Some(at) = line.find("http://") {
                let addr = line[at + 7..].split('/').next().unwrap();
                break addr.rsplit(':').next().unwrap().parse().unwrap();
            }
        };
        // Keep draining stderr so that the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Server { child, port }
    }

    /// Sends one request; returns the status and the (de-chunked) body.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        (status, if chunked { dechunk(body) } else { body.into() })
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.request("POST", path, body.to_string().as_bytes());
        (status, serde_json::from_str(&text).expect(&text))
    }

    /// A streamed request: the `data:` payloads, in order.
    fn post_stream(&self, path: &str, body: &Value) -> Vec<String> {
        let (status, text) = self.request("POST", path, body.to_string().as_bytes());
        assert_eq!(status, 200, "{text}");
        text.lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
}

/// Joins the text of a stream's chunks; returns it, the finish reason and the usage.
fn join_stream(chunks: &[String], chat: bool) -> (String, String, Option<Value>) {
    assert_eq!(
        chunks.last().map(String::as_str),
        Some("[DONE]"),
        "{chunks:?}"
    );
    let (mut text, mut finish, mut usage) = (String::new(), String::new(), None);
    for c in &chunks[..chunks.len() - 1] {
        let v: Value = serde_json::from_str(c).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        let Some(choice) = v["choices"].get(0) else {
            continue;
        };
        let piece = if chat {
            choice["delta"]["content"].as_str()
        } else {
            choice["text"].as_str()
        };
        text.push_str(piece.unwrap_or(""));
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish, usage)
}

fn error_of(status: u16, v: &Value, want_status: u16, param: Option<&str>) -> String {
    assert_eq!(status, want_status, "{v}");
    let e = &v["error"];
    assert!(e["type"].is_string() && e["message"].is_string(), "{v}");
    assert_eq!(e["param"].as_str(), param, "{v}");
    e["message"].as_str().unwrap().to_string()
}

#[test]
fn tiny_model_chat_matches_transformers_and_bad_requests_get_openai_errors() {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(tiny_llama().join("reference.json")).unwrap(),
    )
    .unwrap();
    let g = &reference["generation"];
    let server = Server::start(&tiny_llama(), &["--ctx", "64", "--max-body", "4000"]);
    let model = "tiny-llama";

    let (status, body) = server.request("GET", "/v1/models", b"");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], model);

    // transformers' greedy answer to the template applied to "Hello there" (8 tokens).
    let req = json!({"model": model, "messages": [{"role": "user", "content": "Hello there"}],
                     "max_tokens": 8, "temperature": 0});
    let (status, v) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], g["new_text"]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let n_prompt = g["prompt_ids"].as_array().unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["total_tokens"], n_prompt + 8);

    // The same, streamed: the pieces join to the same text; the usage comes last.
    let mut stream_req = req.clone();
    stream_req["stream"] = json!(true);
    stream_req["stream_options"] = json!({"include_usage": true});
    let chunks = server.post_stream("/v1/chat/completions", &stream_req);
    let first: Value = serde_json::from_str(&chunks[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (text, finish, usage) = join_stream(&chunks, true);
    assert_eq!(text, g["new_text"].as_str().unwrap());
    assert_eq!(finish, "length");
    assert_eq!(usage.unwrap()["completion_tokens"], 8);

    // Completions from token ids: the same continuation.
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"model": model, "prompt": g["prompt_ids"], "max_tokens": 8, "temperature": 0,
                "logprobs": 2}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], g["new_text"]);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 8);
    assert!(lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x.as_f64().unwrap() <= 0.0));
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);

    // A seed makes sampling repeatable.
    let sampled = json!({"model": model, "prompt": "Hello", "max_tokens": 12,
                         "temperature": 1.0, "top_p": 0.9, "seed": 7});
    let a = server.post("/v1/completions", &sampled).1;
    let b = server.post("/v1/completions", &sampled).1;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    // Malformed and invalid requests: OpenAI-style errors, never a crash.
    let (status, body) = server.request("POST", "/v1/chat/completions", b"{\"model\": ");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(error_of(status, &v, 400, None).contains("not valid JSON"));
    let (status, body) = server.request("POST", "/v1/completions", &[0xff, 0xfe, 0x00]);
    let v: Value = serde_json::from_str(&body).unwrap();
    error_of(status, &v, 400, None);
    let cases = [
        (json!({"model": "gpt-4", "prompt": "x"}), 404, Some("model")),
        (json!({"model": model}), 400, Some("prompt")),
        (
            json!({"model": model, "prompt": "x", "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (
            json!({"model": model, "prompt": "x", "max_tokens": "many"}),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": model, "prompt": [1, 99999]}),
            400,
            Some("prompt"),
        ),
        (
            json!({"model": model, "prompt": "word ".repeat(200)}),
            400,
            Some("messages"),
        ),
    ];
    for (req, want, param) in cases {
        let (status, v) = server.post("/v1/completions", &req);
        error_of(status, &v, want, param);
    }
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"model": model, "prompt": "word ".repeat(200)}),
    );
    assert_eq!(
        v["error"]["code"], "context_length_exceeded",
        "{status} {v}"
    );
    let (status, v) = server.post(
        "/v1/chat/completions",
        &json!({"model": model, "messages": [{"role": "tool", "content": "x"}]}),
    );
    error_of(status, &v, 400, Some("messages[0].role"));
    // Too large a body (--max-body 4000).
    let big = json!({"model": model, "prompt": "x".repeat(5000)});
    let (status, body) = server.request("POST", "/v1/completions", big.to_string().as_bytes());
    let v: Value = serde_json::from_str(&body).unwrap();
    error_of(status, &v, 413, None);
    // Wrong method, unknown route.
    let (status, body) = server.request("GET", "/v1/chat/completions", b"");
    error_of(status, &serde_json::from_str(&body).unwrap(), 405, None);
    let (status, body) = server.request("POST", "/v2/anything", b"{}");
    error_of(status, &serde_json::from_str(&body).unwrap(), 404, None);

    // Still serving, and still right.
    let (status, v) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200);
    assert_eq!(v["choices"][0]["message"]["content"], g["new_text"]);
}

/// `luminal generate --no-echo` on the same prompt: the single-client reference.
fn cli_greedy(model: &Path, prompt: &str, n: usize) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_luminal"))
        .args(["generate", "--model", model.to_str().unwrap(), "--no-echo"])
        .args(["--threads", "2", "-n", &n.to_string(), "--prompt", prompt])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    out.strip_suffix('\n').unwrap().to_string()
}

#[test]
fn smollm2_serves_concurrent_clients_each_their_own_answer() {
    let Some(path) = smollm2() else { return };
    // Prompts with different first tokens: none reuses another's cached tokens, so each
    // is computed exactly as a lone `luminal generate` computes it.
    let prompts = [
        "The capital of France is",
        "Once upon a time, there was",
        "In mathematics, a prime number",
        "My favourite recipe for soup",
    ];
    let n = 16;
    let want: Vec<String> = prompts.iter().map(|p| cli_greedy(&path, p, n)).collect();
    for (i, a) in want.iter().enumerate() {
        for b in &want[i + 1..] {
            assert_ne!(a, b, "the prompts should give different answers");
        }
    }

    let server = Server::start(&path, &[]);
    let model = "SmolLM2-135M-Instruct.Q4_1";
    // Every client at once, twice each (streamed and not), in parallel threads.
    let got: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || {
                    let req = json!({"model": model, "prompt": p, "max_tokens": n,
                                     "temperature": 0, "stream": true});
                    let (text, finish, _) =
                        join_stream(&server.post_stream("/v1/completions", &req), false);
                    let mut plain = req.clone();
                    plain["stream"] = json!(false);
                    let (status, v) = server.post("/v1/completions", &plain);
                    assert_eq!(status, 200, "{v}");
                    assert_eq!(v["choices"][0]["finish_reason"], finish.as_str());
                    (text, v["choices"][0]["text"].as_str().unwrap().to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((streamed, plain), want) in got.iter().zip(&want) {
        assert_eq!(streamed, want);
        assert_eq!(plain, want);
    }
}

#[test]
fn smollm2_chat_completion_matches_generate_chat() {
    let Some(path) = smollm2() else { return };
    let question = "What is the capital of France?";
    let o = Command::new(env!("CARGO_BIN_EXE_luminal"))
        .args(["generate", "--model", path.to_str().unwrap(), "--chat"])
        .args(["--threads", "2", "-n", "24", "--prompt", question])
        .output()
        .unwrap();
    assert!(o.status.success());
    let want = String::from_utf8(o.stdout).unwrap();
    let want = want.strip_suffix('\n').unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);

    let server = Server::start(&path, &[]);
    let (status, v) = server.post(
        "/v1/chat/completions",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": question}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want);
    // The CLI says why it stopped; the server's finish reason agrees.
    let finish = if stderr.contains("stopped: end of text") {
        "stop"
    } else {
        assert!(stderr.contains("stopped: token limit"), "{stderr}");
        "length"
    };
    assert_eq!(v["choices"][0]["finish_reason"], finish);
}

#[test]
fn a_corrupt_model_is_a_server_error_not_a_crash() {
    let Some(path) = smollm2() else { return };
    // A copy whose final norm weights are NaN: every logit is NaN.
    let file = luminal_io::GgufFile::open(&path).unwrap();
    let info = file.tensor_info("output_norm.weight").unwrap();
    let at = (file.data_offset() + info.offset()) as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    for i in 0..info.n_elements() as usize {
        bytes[at + 4 * i..at + 4 * i + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    }
    let dir = std::env::temp_dir().join(format!("luminal_serve_nan_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("nan.gguf");
    std::fs::write(&bad, bytes).unwrap();

    let server = Server::start(&bad, &[]);
    let req = json!({"model": "nan", "prompt": "Hello", "max_tokens": 4});
    let (status, v) = server.post("/v1/completions", &req);
    assert_eq!(status, 500, "{v}");
    assert_eq!(v["error"]["type"], "server_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("non-finite logits (NaN) during the prompt"),
        "{v}"
    );
    // Streamed: the error arrives as an event, then the stream ends.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let chunks = server.post_stream("/v1/completions", &streamed);
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    let e: Value = serde_json::from_str(&chunks[chunks.len() - 2]).unwrap();
    assert_eq!(e["error"]["type"], "server_error", "{chunks:?}");
    // The server is still up.
    assert_eq!(server.request("GET", "/v1/models", b"").0, 200);
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_full_queue_answers_429_and_a_client_that_leaves_frees_it() {
    let Some(path) = smollm2() else { return };
    let server = Server::start(&path, &["--max-queue", "1"]);
    let model = "SmolLM2-135M-Instruct.Q4_1";
    // A long streamed answer: read its first event, then keep the connection open.
    let body = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 1000,
                      "temperature": 0, "stream": true})
    .to_string();
    let mut long = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        long,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = long.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    // The queue holds one request: the next one is refused.
    let short = json!({"model": model, "prompt": "Hi", "max_tokens": 2});
    let (status, v) = server.post("/v1/completions", &short);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    // The first client leaves: its generation is cancelled and the queue frees up.
    drop(long);
    let mut tries = 0;
    loop {
        let (status, v) = server.post("/v1/completions", &short);
        if status == 200 {
            assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
            eprintln!("the queue freed up after {tries} refusals");
            break;
        }
        assert_eq!(status, 429, "{v}");
        tries += 1;
        assert!(tries < 600, "the queue never freed up");
        std::thread::sleep(Duration::from_millis(100));
    }
}
