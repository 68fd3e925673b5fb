//! The `luminal` binary end to end: generate, perplexity, bench and inspect on the tiny HF
//! fixtures and the GGUF reader fixture, the real SmolLM2 file when present
//! (`scripts/fetch-models.sh`), and the error paths (truncated file, missing file, usage).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_llama() -> PathBuf {
    root().join("crates/luminal_model_tests/tests/fixtures/tiny-llama")
}

fn model_fixtures() -> PathBuf {
    root().join("crates/luminal_model_tests/tests/fixtures")
}

fn tiny_gguf() -> PathBuf {
    root().join("crates/luminal_io/tests/fixtures/tiny.gguf")
}

/// The real model, or `None` (with a message) when it has not been fetched.
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

fn luminal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_luminal"))
        .args(args)
        .output()
        .expect("the luminal binary runs")
}

/// [`luminal`] with f32 activations in every quantized product (`LUMINAL_CPU_QDOT=f32`):
/// what transformers computes, up to summation order. The default also quantizes the
/// activations of prefill products to int8 (with AVX-512 VNNI), which moves logits slightly
/// (see `luminal_model_tests/tests/smollm2.rs`).
fn luminal_f32(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_luminal"))
        .env("LUMINAL_CPU_QDOT", "f32")
        .args(args)
        .output()
        .expect("the luminal binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> &Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        stderr(o)
    );
    o
}

fn read_json(path: impl AsRef<Path>) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Asserts the run failed with exit code 1 and exactly one stderr line `error: …`; returns it.
fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(o));
    assert!(
        o.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err:?}");
    assert!(lines[0].starts_with("error: "), "{err:?}");
    lines[0].to_string()
}

// ---- generate ----------------------------------------------------------------------------

#[test]
fn generate_greedy_on_tiny_llama_matches_transformers() {
    let r = read_json(tiny_llama().join("reference.json"));
    let g = &r["generation"];
    let prompt = g["prompt_text"].as_str().unwrap();
    let new_text = g["new_text"].as_str().unwrap();
    let new_ids: Vec<u64> = g["new_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let n = new_ids.len().to_string();
    let o = luminal(&[
        "generate",
        "--model",
        s(&tiny_llama()),
        "--prompt",
        prompt,
        "-n",
        &n,
        "--threads",
        "2",
        "--print-ids",
    ]);
    ok(&o);
    // The prompt is echoed, then the completion, then a newline.
    assert_eq!(stdout(&o), format!("{prompt}{new_text}\n"));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("generated ids: {new_ids:?}")),
        "{err}"
    );
    let stats = err.lines().last().unwrap();
    let n_prompt = g["prompt_ids"].as_array().unwrap().len();
    assert!(
        stats.starts_with(&format!("prompt: {n_prompt} tokens, "))
            && stats.contains(" tok/s | generation: 8 tokens, ")
            && stats.contains(" tok/s | load: ")
            && stats.ends_with(" s"),
        "{stats}"
    );

    // --no-echo prints the completion only.
    let o = luminal(&[
        "generate",
        "--model",
        s(&tiny_llama()),
        "--prompt",
        prompt,
        "-n",
        &n,
        "--no-echo",
    ]);
    assert_eq!(stdout(ok(&o)), format!("{new_text}\n"));
}

#[test]
fn generate_chat_applies_the_template() {
    // The reference prompt is the tiny model's chat template applied to "Hello there".
    let r = read_json(tiny_llama().join("reference.json"));
    let g = &r["generation"];
    assert_eq!(
        g["prompt_text"].as_str().unwrap(),
        "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    );
    let o = luminal(&[
        "generate",
        "--model",
        s(&tiny_llama()),
        "--chat",
        "--prompt",
        "Hello there",
        "-n",
        "8",
    ]);
    // With --chat the prompt is not echoed.
    assert_eq!(
        stdout(ok(&o)),
        format!("{}\n", g["new_text"].as_str().unwrap())
    );
}

#[test]
fn generate_chat_on_smollm2_answers_and_stops_at_eos() {
    let Some(model) = smollm2() else { return };
    // f32 activations: the default's int8 prefill picks a near-tie first token here
    // (transformers' logits 25.33 vs 25.24, see `smollm2.rs`).
    let o = luminal_f32(&[
        "generate",
        "--model",
        s(&model),
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "-n",
        "16",
    ]);
    // transformers' greedy answer, cut at <|im_end|> (smollm2_reference.json).
    assert_eq!(stdout(ok(&o)), "The capital of France is Paris.\n");
    assert!(
        stderr(&o).contains("| generation: 7 tokens, "),
        "{}",
        stderr(&o)
    );
}

#[test]
fn generate_rejects_bad_sampling_values() {
    let o = luminal(&[
        "generate",
        "--model",
        s(&tiny_llama()),
        "--temperature",
        "-1",
    ]);
    let line = one_line_error(&o);
    assert!(line.contains("temperature"), "{line}");
}

// ---- perplexity --------------------------------------------------------------------------

fn last_line_perplexity(o: &Output) -> f64 {
    let out = stdout(ok(o));
    let last = out.lines().last().unwrap();
    let value = last
        .strip_prefix("perplexity: ")
        .unwrap_or_else(|| panic!("last line is {last:?}"));
    value.parse().unwrap()
}

#[test]
fn perplexity_prints_its_value_as_the_last_line() {
    let file = model_fixtures().join("ppl.txt");
    let o = luminal(&[
        "perplexity",
        "--model",
        s(&tiny_llama()),
        "--file",
        s(&file),
        "--ctx",
        "64",
    ]);
    let ppl = last_line_perplexity(&o);
    // A random tiny model is close to uniform over its 391 tokens.
    assert!(ppl.is_finite() && ppl > 1.0 && ppl < 5000.0, "{ppl}");
    assert!(stdout(&o).contains("[1/"));
}

/// `--cache-type f16` (the default) and `f32` both run; rounding the cached keys and values to
/// f16 moves the perplexity only slightly; an unknown type is a clear error.
#[test]
fn perplexity_takes_the_kv_cache_type() {
    let file = model_fixtures().join("ppl.txt");
    let run = |cache: &str| {
        luminal(&[
            "perplexity",
            "--model",
            s(&tiny_llama()),
            "--file",
            s(&file),
            "--ctx",
            "64",
            "--cache-type",
            cache,
        ])
    };
    let (f32_ppl, f16_ppl) = (
        last_line_perplexity(&run("f32")),
        last_line_perplexity(&run("f16")),
    );
    assert!(
        ((f16_ppl - f32_ppl) / f32_ppl).abs() < 0.01,
        "f16 {f16_ppl} vs f32 {f32_ppl}"
    );
    let o = run("q3");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("q3"), "{}", stderr(&o));
}

#[test]
fn perplexity_of_smollm2_matches_transformers() {
    let Some(model) = smollm2() else { return };
    let r = read_json(model_fixtures().join("smollm2_reference.json"));
    let p = &r["perplexity"];
    let ctx = p["ctx"].as_u64().unwrap().to_string();
    let file = model_fixtures().join(p["file"].as_str().unwrap());
    let args = [
        "perplexity",
        "--model",
        s(&model),
        "--file",
        s(&file),
        "--ctx",
        &ctx,
    ];
    let want = p["ppl"].as_f64().unwrap();
    // The default: the windows' products take int8 activations (with AVX-512 VNNI).
    // Measured 2.6e-3 there.
    let got = last_line_perplexity(&luminal(&args));
    let rel = (got - want).abs() / want;
    eprintln!(
        "default: luminal perplexity {got}, transformers {want}, relative difference {rel:.2e}"
    );
    assert!(rel < 1e-2, "{got} vs {want}");
    let o = luminal_f32(&args);
    let got = last_line_perplexity(&o);
    let rel = (got - want).abs() / want;
    eprintln!("f32: luminal perplexity {got}, transformers {want}, relative difference {rel:.2e}");
    // Measured 1.6e-7 (f32 kernels vs transformers' f32); the bound leaves room for
    // kernels that reorder sums.
    assert!(rel < 1e-3, "{got} vs {want}");
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "tokens: {}, windows: {}",
            p["n_tokens"], p["n_windows"]
        )),
        "{out}"
    );
}

#[test]
fn perplexity_of_a_missing_text_file_is_one_error_line() {
    let o = luminal(&[
        "perplexity",
        "--model",
        s(&tiny_llama()),
        "--file",
        "/nonexistent/luminal/text.txt",
    ]);
    let line = one_line_error(&o);
    assert!(line.contains("/nonexistent/luminal/text.txt"), "{line}");
}

// ---- bench -------------------------------------------------------------------------------

#[test]
fn bench_json_has_pp_and_tg_records() {
    let o = luminal(&[
        "bench",
        "--model",
        s(&tiny_llama()),
        "-p",
        "16",
        "-n",
        "8",
        "-r",
        "2",
        "--threads",
        "2",
        "-o",
        "json",
    ]);
    let records: Value = serde_json::from_str(&stdout(ok(&o))).unwrap();
    let records = records.as_array().unwrap();
    let tests: Vec<&str> = records
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp16", "tg8"]);
    for r in records {
        assert_eq!(r["n_threads"], 2);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0, "{r}");
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert_eq!(r["model_n_params"], 124096);
        // llama-bench's field names.
        assert_eq!(r["backends"], "CPU");
        assert_eq!(r["n_depth"], 0);
        let t = r["test_time"].as_str().unwrap();
        assert!(
            t.len() == 20 && t.starts_with("20") && t.ends_with('Z'),
            "{t}"
        );
        for key in [
            "build_commit",
            "cpu_info",
            "model_type",
            "model_size",
            "avg_ns",
            "stddev_ns",
        ] {
            assert!(r.get(key).is_some(), "{key} missing from {r}");
        }
    }
    assert_eq!(records[0]["n_prompt"], 16);
    assert_eq!(records[1]["n_gen"], 8);
}

/// The model type names the file's quantisation as llama-bench does (from
/// `general.file_type`), not by the type holding most bytes: the Q6_K file that
/// `scripts/bench-vs-llamacpp.sh` makes keeps its embedding in Q8_0, and llama-bench calls it
/// `Q6_K`. Runs where that file has been made.
#[test]
fn bench_names_the_file_type_as_llama_bench() {
    let p = root().join("models/SmolLM2-135M-Instruct.Q6_K.gguf");
    if !p.exists() {
        eprintln!("skipping: {} is absent", p.display());
        return;
    }
    let o = luminal(&[
        "bench",
        "--model",
        s(&p),
        "-p",
        "4",
        "-n",
        "0",
        "-r",
        "1",
        "-o",
        "json",
    ]);
    let records: Value = serde_json::from_str(&stdout(ok(&o))).unwrap();
    assert_eq!(records[0]["model_type"], "llama 135M Q6_K");
}

#[test]
fn bench_markdown_table() {
    let o = luminal(&[
        "bench",
        "--model",
        s(&tiny_llama()),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
    ]);
    let out = stdout(ok(&o));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let cells = |l: &str| -> Vec<String> {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    assert_eq!(
        cells(lines[0]),
        ["model", "size", "params", "backend", "threads", "test", "t/s"]
    );
    assert_eq!(cells(lines[2])[5], "pp8");
    assert_eq!(cells(lines[3])[5], "tg4");
    assert!(cells(lines[3])[6].contains(" ± "), "{out}");
}

// ---- inspect -----------------------------------------------------------------------------

/// Sums the element counts of the tensor list and reads the `parameters:` line.
fn inspect_counts(out: &str) -> (usize, u64, u64) {
    let mut in_tensors = false;
    let (mut n, mut sum) = (0usize, 0u64);
    let mut params = None;
    for line in out.lines() {
        if line.starts_with("tensors (") {
            in_tensors = true;
            continue;
        }
        if in_tensors && line.starts_with("  ") {
            let shape = &line[line.rfind('[').unwrap() + 1..line.rfind(']').unwrap()];
            sum += shape
                .split(", ")
                .map(|d| d.parse::<u64>().unwrap())
                .product::<u64>();
            n += 1;
        } else {
            in_tensors = false;
        }
        if let Some(rest) = line.strip_prefix("parameters: ") {
            params = Some(rest.split(' ').next().unwrap().parse().unwrap());
        }
    }
    (n, sum, params.expect("a parameters: line"))
}

#[test]
fn inspect_gguf_lists_metadata_tensors_and_parameters() {
    let o = luminal(&["inspect", "--model", s(&tiny_gguf())]);
    let out = stdout(ok(&o));
    assert!(out.contains("format: GGUF v3"), "{out}");
    assert!(out.contains("  general.architecture: \"llama\"\n"), "{out}");
    assert!(
        out.contains("  test.array.nested_i32: [[1, 2], [3], [4, 5, 6]]\n"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["blk.0.ffn_up.weight", "Q4_K", "[2,", "256]"]),
        "{out}"
    );
    let (n, sum, params) = inspect_counts(&out);
    assert_eq!(n, 8);
    assert_eq!(sum, params);
}

#[test]
fn inspect_smollm2_summarises_long_arrays() {
    let Some(model) = smollm2() else { return };
    let o = luminal(&["inspect", "--model", s(&model)]);
    let out = stdout(ok(&o));
    assert!(
        out.contains("  tokenizer.ggml.tokens: [49152 items: \"<|endoftext|>\", \"<|im_start|>\""),
        "{out}"
    );
    let (n, sum, params) = inspect_counts(&out);
    assert_eq!(n, 272);
    assert_eq!(sum, params);
    assert_eq!(params, 134_515_008);
}

#[test]
fn inspect_hf_folder_shows_config_and_tensors() {
    let o = luminal(&["inspect", "--model", s(&tiny_llama())]);
    let out = stdout(ok(&o));
    assert!(out.contains("config.json:"), "{out}");
    assert!(out.contains("\"num_hidden_layers\""), "{out}");
    let (n, sum, params) = inspect_counts(&out);
    assert!(n > 0);
    assert_eq!(sum, params);
    // Tied embeddings: every parameter the model loads is a tensor of the file.
    assert_eq!(params, 124096);
}

// ---- errors ------------------------------------------------------------------------------

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("luminal_cli_{name}_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn truncated_gguf_is_one_error_line_naming_the_truncation() {
    let dir = temp_dir("truncated");
    let bytes = std::fs::read(tiny_gguf()).unwrap();
    // Cut inside the tensor data (a few bytes past its start, which `inspect` reports).
    let out = stdout(ok(&luminal(&["inspect", "--model", s(&tiny_gguf())])));
    let data_at: usize = out
        .split("data at byte ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no data offset in {out}"));
    let len = data_at + 40;
    let cut = dir.join("cut_data.gguf");
    std::fs::write(&cut, &bytes[..len]).unwrap();
    for cmd in ["inspect", "generate", "bench"] {
        let line = one_line_error(&luminal(&[cmd, "--model", s(&cut)]));
        assert!(
            line.contains("model file is truncated: tensor"),
            "{cmd}: {line}"
        );
        assert!(
            line.contains(&format!("but the file has {len} bytes")),
            "{line}"
        );
    }
    // Cut inside the metadata.
    let cut = dir.join("cut_header.gguf");
    std::fs::write(&cut, &bytes[..600]).unwrap();
    let line = one_line_error(&luminal(&["generate", "--model", s(&cut)]));
    assert!(line.contains("truncated"), "{line}");

    if let Some(model) = smollm2() {
        // The first 1 MB of the real file (cut inside the tokenizer's metadata), and the
        // first 4 MB (cut inside the tensor data).
        let real = std::fs::read(model).unwrap();
        for (name, len) in [("smol_1mb.gguf", 1 << 20), ("smol_4mb.gguf", 4 << 20)] {
            let cut = dir.join(name);
            std::fs::write(&cut, &real[..len]).unwrap();
            let line = one_line_error(&luminal(&["generate", "--model", s(&cut)]));
            assert!(line.contains("truncated"), "{line}");
            eprintln!("{name}: {line}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_model_file_is_one_clear_error_line() {
    for cmd in ["generate", "bench", "inspect"] {
        let line = one_line_error(&luminal(&[cmd, "--model", "/nonexistent/model.gguf"]));
        assert_eq!(line, "error: model file not found: /nonexistent/model.gguf");
    }
    let line = one_line_error(&luminal(&[
        "perplexity",
        "--model",
        "/nonexistent/model.gguf",
        "--file",
        s(&model_fixtures().join("ppl.txt")),
    ]));
    assert_eq!(line, "error: model file not found: /nonexistent/model.gguf");
}

#[test]
fn not_a_gguf_file_is_one_error_line() {
    let line = one_line_error(&luminal(&[
        "inspect",
        "--model",
        s(&model_fixtures().join("ppl.txt")),
    ]));
    assert!(line.contains("not a GGUF file"), "{line}");
}

#[test]
fn usage_errors_exit_with_code_2() {
    let o = luminal(&["generate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--model"));
    let o = luminal(&["bench", "--model", "x", "-o", "yaml"]);
    assert_eq!(o.status.code(), Some(2));
    let o = luminal(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

// ---- embed -------------------------------------------------------------------------------

fn tiny_bert() -> PathBuf {
    model_fixtures().join("tiny-bert")
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn float_rows(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// `-o json` gives sentence-transformers' embeddings (scripts/gen_bert_fixtures.py) in input
/// order, texts from --text and --file together.
#[test]
fn embed_json_matches_sentence_transformers_in_input_order() {
    let r = read_json(model_fixtures().join("tiny-bert.reference.json"));
    let sentences: Vec<&str> = r["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let dir = temp_dir("embed");
    let file = dir.join("texts.txt");
    std::fs::write(&file, format!("{}\n\n{}\n", sentences[2], sentences[3])).unwrap();
    let model = tiny_bert();
    let o = luminal(&[
        "embed",
        "--model",
        s(&model),
        "--text",
        sentences[0],
        "--text",
        sentences[1],
        "--file",
        s(&file),
        "-o",
        "json",
        "--batch-size",
        "3",
    ]);
    let got = float_rows(&serde_json::from_str(&stdout(ok(&o))).unwrap());
    let want = float_rows(&r["embeddings"]);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), 128);
        assert!(
            cosine(g, w) >= 0.9999,
            "embedding {i}: cosine {}",
            cosine(g, w)
        );
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1e-5, "embedding {i}: max |error| {worst}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Plain output: one line of values per text, then the symmetric cosine matrix with a unit
/// diagonal.
#[test]
fn embed_text_prints_a_cosine_matrix_for_two_or_more_texts() {
    let model = tiny_bert();
    let o = luminal(&[
        "embed",
        "--model",
        s(&model),
        "--text",
        "the cat sat",
        "--text",
        "a dog ran",
    ]);
    let out = stdout(ok(&o));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("embedding 0 (128 values) of \"the cat sat\""),
        "{out}"
    );
    assert_eq!(lines[1].split_whitespace().count(), 128);
    assert_eq!(lines[4], "cosine similarity:");
    let row = |l: &str| -> Vec<f64> {
        l.split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect()
    };
    let (r0, r1) = (row(lines[6]), row(lines[7]));
    assert_eq!((r0[0], r1[1]), (1.0, 1.0));
    assert_eq!(r0[1], r1[0]);
    assert!(r0[1] < 0.9999);
    // One text: no matrix.
    let o = luminal(&["embed", "--model", s(&model), "--text", "the cat sat"]);
    assert!(!stdout(ok(&o)).contains("cosine"));
}

#[test]
fn embed_with_all_minilm_l6_v2_when_fetched() {
    let p = root().join("models/all-MiniLM-L6-v2");
    if !p.join("model.safetensors").exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh minilm)",
            p.display()
        );
        return;
    }
    let r = read_json(model_fixtures().join("minilm_reference.json"));
    let (a, b) = (
        r["sentences"][1].as_str().unwrap(),
        r["sentences"][2].as_str().unwrap(),
    );
    let o = luminal(&[
        "embed",
        "--model",
        s(&p),
        "--text",
        a,
        "--text",
        b,
        "-o",
        "json",
        "-t",
        "2",
    ]);
    let got = float_rows(&serde_json::from_str(&stdout(ok(&o))).unwrap());
    for (g, w) in got.iter().zip(float_rows(&r["embeddings"])[1..].iter()) {
        assert!(cosine(g, w) >= 0.9999);
    }
}

#[test]
fn embed_errors_are_one_line() {
    let model = tiny_bert();
    let err = one_line_error(&luminal(&["embed", "--model", s(&model)]));
    assert!(err.contains("no text to embed"), "{err}");
    let err = one_line_error(&luminal(&[
        "embed",
        "--model",
        "/no/such/folder",
        "--text",
        "x",
    ]));
    assert!(err.contains("not found"), "{err}");
    let long = "the cat ".repeat(20);
    let err = one_line_error(&luminal(&["embed", "--model", s(&model), "--text", &long]));
    assert!(err.contains("42 tokens") && err.contains("32"), "{err}");
    // --truncate embeds it instead.
    ok(&luminal(&[
        "embed",
        "--model",
        s(&model),
        "--text",
        &long,
        "--truncate",
    ]));
    let err = one_line_error(&luminal(&[
        "embed",
        "--model",
        s(&tiny_llama()),
        "--text",
        "x",
    ]));
    assert!(err.contains("unsupported model"), "{err}");
    let dir = temp_dir("embed_missing");
    for f in ["config.json", "modules.json"] {
        std::fs::copy(tiny_bert().join(f), dir.join(f)).unwrap();
    }
    let err = one_line_error(&luminal(&["embed", "--model", s(&dir), "--text", "x"]));
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- transcribe --------------------------------------------------------------------------

/// The tiny random Whisper fixture prints what transformers' greedy loop decodes
/// (`scripts/gen_whisper_fixtures.py`), here with --max-tokens 5.
#[test]
fn transcribe_tiny_whisper_and_errors() {
    let model = model_fixtures().join("tiny-whisper");
    let wav = model_fixtures().join("audio/tones.wav");
    let o = luminal(&[
        "transcribe",
        "--model",
        s(&model),
        s(&wav),
        "--max-tokens",
        "5",
        "-t",
        "2",
    ]);
    let out = stdout(ok(&o));
    assert_eq!(out.lines().count(), 1, "{out:?}");
    // Resampled input (22.05 kHz stereo) runs too.
    let stereo = model_fixtures().join("audio/tones_stereo_22k.wav");
    ok(&luminal(&[
        "transcribe",
        "--model",
        s(&model),
        s(&stereo),
        "--max-tokens",
        "3",
    ]));
    let err = one_line_error(&luminal(&[
        "transcribe",
        "--model",
        s(&model),
        "/no/such.wav",
    ]));
    assert!(err.contains("not found"), "{err}");
    let dir = temp_dir("transcribe_bad");
    let bad = dir.join("bad.wav");
    std::fs::write(&bad, b"RIFF....WAVEjunk").unwrap();
    let err = one_line_error(&luminal(&["transcribe", "--model", s(&model), s(&bad)]));
    assert!(err.contains("WAV"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--timestamps` on the real Whisper tiny.en prints transformers' segment
/// (`fixtures/whisper_tiny_en.timestamps.json`, `scripts/gen_whisper_timestamps_fixture.py`).
#[test]
fn transcribe_with_timestamps_prints_segments() {
    let model = root().join("models/whisper-tiny.en");
    if !model.join("model.safetensors").exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh whisper-tiny-en)",
            model.display()
        );
        return;
    }
    let wav = model_fixtures().join("audio/speech_fox.wav");
    let o = luminal(&["transcribe", "--model", s(&model), s(&wav), "--timestamps"]);
    assert_eq!(
        stdout(ok(&o)).trim(),
        "[0.00 --> 3.00] The quick brown fox jump over the lazy nog."
    );
}
