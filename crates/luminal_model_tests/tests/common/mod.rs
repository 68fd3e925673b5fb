//! Helpers shared by the model tests: fixtures, reference JSON, and the checks every loading
//! path (HF folder, GGUF) must pass against transformers' outputs.
#![allow(dead_code)]

use luminal_cpu::{CpuBackend, CpuRuntime, QuantDots};
use luminal_models::Model;
use luminal_models::{CacheType, LlamaModel, LoadOptions, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// transformers' reference for the HF folder `model` (`tiny-llama`, `tiny-qwen2`).
pub fn reference(model: &str) -> Value {
    json(fixture(model).join("reference.json"))
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn logits(case: &Value) -> Vec<f32> {
    case["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect()
}

/// A fixture model on two threads with f32 activations (`QuantDots::F32`) and an f32 KV
/// cache: the tight bounds against transformers apply (int8 activations and the default
/// f16 cache are checked on SmolLM2).
pub fn load(file: &str) -> (LlamaModel<CpuRuntime>, Tokenizer) {
    let opts = LoadOptions {
        max_ctx: 64,
        cache_type: CacheType::F32,
    };
    let backend = CpuBackend::with_threads(2).quant_dots(QuantDots::F32);
    LlamaModel::load(fixture(file), backend, &opts, |_, _| {}).unwrap()
}

pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Teacher-forced logits at every position of every case in `want`; returns
/// (max |Δlogit|, fraction of positions whose argmax agrees).
pub fn compare_logits(model: &mut impl Model, want: &Value) -> (f32, f64) {
    let vocab = model.vocab_size();
    let (mut max_diff, mut agree, mut positions) = (0f32, 0usize, 0usize);
    for case in want["cases"].as_array().unwrap() {
        let tokens = ids(&case["ids"]);
        let got = model.logits_all(&tokens).unwrap();
        let want = logits(case);
        assert_eq!(got.len(), tokens.len() * vocab);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            max_diff = max_diff.max((g - w).abs());
        }
        for (g, w) in got.chunks(vocab).zip(want.chunks(vocab)) {
            agree += (argmax(g) == argmax(w)) as usize;
            positions += 1;
        }
    }
    (max_diff, agree as f64 / positions as f64)
}

/// Decoding one token at a time through the KV cache gives the logits of a full recompute.
/// The bound on `check_cache`'s logit differences for f32 weights: a decode step's skinny
/// products and the full recompute's blocked ones sum in different orders. Measured (max
/// |Δlogit| over the tiny models): 4.7e-6 to 6.8e-6 on the AVX2 / AVX-512 kernels, and up to
/// 1.05e-5 on the portable kernels of an x86 build without FMA (`LUMINAL_CPU_ISA=generic`:
/// each multiply and add rounded separately).
pub const CACHE_TOLERANCE: f32 = 2e-5;

pub fn check_cache(file: &str, model_name: &str, tolerance: f32) {
    let r = reference(model_name);
    let (mut model, _) = load(file);
    let vocab = model.vocab_size();
    let tokens = ids(&r["cases"][2]["ids"]);
    let full = model.logits_all(&tokens).unwrap();
    model.reset();
    // A prefill of 5, then one token at a time.
    let mut stepped = model.forward(&tokens[..5], 5).unwrap();
    for &t in &tokens[5..] {
        stepped.extend(model.forward(&[t], 1).unwrap());
    }
    assert_eq!(model.pos(), tokens.len());
    assert_eq!(full.len(), stepped.len());
    assert_eq!(full.len(), tokens.len() * vocab);
    let max_diff = full
        .iter()
        .zip(&stepped)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("{file}: cached vs full recompute max |Δlogit| = {max_diff:e}");
    assert!(
        max_diff < tolerance,
        "{file}: cached vs full max diff {max_diff}"
    );
}

/// The model's tokenizer (tokenizer.json, or the one a GGUF embeds) gives transformers' ids for the reference strings (special tokens,
/// BOS rule, digits, whitespace runs, tabs, unicode, emoji), and greedy decoding from the GGUF
/// model reproduces transformers' generation.
pub fn check_tokenizer_and_greedy(file: &str, model_name: &str) {
    let r = reference(model_name);
    let (mut model, tok) = load(file);
    for case in r["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "{file}: {text:?}");
        let plain = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&plain, false).unwrap(), text, "{file}: decode");
    }
    let g = &r["generation"];
    let prompt = ids(&g["prompt_ids"]);
    assert_eq!(
        tok.encode(g["prompt_text"].as_str().unwrap(), true)
            .unwrap(),
        prompt
    );
    let want = ids(&g["new_ids"]);
    model.reset();
    let mut logits = model.forward(&prompt, 1).unwrap();
    let mut got = vec![];
    for _ in 0..want.len() {
        let next = argmax(&logits);
        got.push(next);
        logits = model.forward(&[next], 1).unwrap();
    }
    assert_eq!(got, want, "{file}: greedy generation");
}

/// The real SmolLM2 GGUF (fetched by `scripts/fetch-models.sh`) on the default CPU backend
/// (int8 activations in the skinny quantized products, the top logits refined) with the
/// default (f16) KV cache, loaded once
/// per test binary and shared; `None` (with a message) when the file is absent.
pub fn smollm2() -> Option<&'static Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>> {
    static MODEL: OnceLock<Option<Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>>> = OnceLock::new();
    MODEL
        .get_or_init(|| load_smollm2(CpuBackend::default(), LoadOptions::default().cache_type))
        .as_ref()
}

/// [`smollm2`] with f32 everywhere: activations (`QuantDots::F32`) and the KV cache (an
/// f16 cache rounds each key and value once; tiny upstream differences then flip some
/// roundings, ~1e-3 in the logits).
pub fn smollm2_f32() -> Option<&'static Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>> {
    static MODEL: OnceLock<Option<Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            load_smollm2(
                CpuBackend::default().quant_dots(QuantDots::F32),
                CacheType::F32,
            )
        })
        .as_ref()
}

/// [`smollm2_f32`] with a q8_0 KV cache (f32 activations: the cache's rounding is all that
/// differs).
pub fn smollm2_q8_0_cache() -> Option<&'static Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>> {
    static MODEL: OnceLock<Option<Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            load_smollm2(
                CpuBackend::default().quant_dots(QuantDots::F32),
                CacheType::Q8_0,
            )
        })
        .as_ref()
}

fn load_smollm2(
    backend: CpuBackend,
    cache_type: CacheType,
) -> Option<Mutex<(LlamaModel<CpuRuntime>, Tokenizer)>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh)",
            path.display()
        );
        return None;
    }
    let opts = LoadOptions {
        max_ctx: 512,
        cache_type,
    };
    Some(Mutex::new(
        LlamaModel::load(&path, backend, &opts, |_, _| {}).unwrap(),
    ))
}
