//! The Hugging Face folder path on tiny random Llama (GQA, Llama-3 RoPE scaling) and Qwen2
//! (qkv bias, tied embeddings) checkpoints saved by transformers, against transformers'
//! logits (fixtures from `scripts/gen_llama_fixtures.py`).

use luminal_models::{LlamaModel, LoadOptions};
use serde_json::Value;
use std::path::PathBuf;

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn load(name: &str) -> (LlamaModel, luminal_models::Tokenizer) {
    let opts = LoadOptions {
        threads: Some(2),
        max_ctx: 64,
    };
    LlamaModel::load(fixture_dir(name), &opts, |_, _| {}).unwrap()
}

/// Teacher-forced logits at every position of every case.
fn check_logits(name: &str) {
    let r = reference(name);
    let (mut model, _) = load(name);
    let vocab = model.vocab_size();
    let mut max_diff = 0f32;
    for case in r["cases"].as_array().unwrap() {
        let tokens = ids(&case["ids"]);
        let got = model.logits_all(&tokens).unwrap();
        let want: Vec<f32> = case["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        assert_eq!(got.len(), tokens.len() * vocab);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            max_diff = max_diff.max((g - w).abs());
        }
    }
    println!("{name}: max |Δlogit| vs transformers = {max_diff:e}");
    assert!(max_diff < 1e-4, "{name}: max |Δlogit| {max_diff}");
}

#[test]
fn tiny_llama_logits_match_transformers() {
    check_logits("tiny-llama");
}

#[test]
fn tiny_qwen2_logits_match_transformers() {
    check_logits("tiny-qwen2");
}

/// Decoding one token at a time through the KV cache gives the logits of a full recompute.
fn check_cache(name: &str) {
    let r = reference(name);
    let (mut model, _) = load(name);
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
    let max_diff = full
        .iter()
        .zip(&stepped)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert_eq!(full.len(), stepped.len());
    assert_eq!(full.len(), tokens.len() * vocab);
    assert!(
        max_diff < 1e-5,
        "{name}: cached vs full max diff {max_diff}"
    );
}

#[test]
fn tiny_llama_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-llama");
}

#[test]
fn tiny_qwen2_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-qwen2");
}

/// Tokenizer (tokenizer.json) ids and greedy generation against transformers.
fn check_tokenizer_and_greedy(name: &str) {
    let r = reference(name);
    let (mut model, tok) = load(name);
    for case in r["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&case["ids"]),
            "{text:?}"
        );
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
    assert_eq!(got, want);
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn tiny_llama_tokenizer_and_greedy_match_transformers() {
    check_tokenizer_and_greedy("tiny-llama");
}

#[test]
fn tiny_qwen2_tokenizer_and_greedy_match_transformers() {
    check_tokenizer_and_greedy("tiny-qwen2");
}
