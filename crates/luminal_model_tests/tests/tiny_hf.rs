//! The Hugging Face folder path on tiny random Llama (GQA, Llama-3 RoPE scaling) and Qwen2
//! (qkv bias, tied embeddings) checkpoints saved by transformers, against transformers'
//! logits (fixtures from `scripts/gen_llama_fixtures.py`).

mod common;

use common::*;

/// Teacher-forced logits at every position of every case.
fn check_logits(name: &str) {
    let (mut model, _) = load(name);
    let (max_diff, agree) = compare_logits(&mut model, &reference(name));
    println!("{name}: max |Δlogit| vs transformers = {max_diff:e}, top-1 agreement {agree}");
    assert!(max_diff < 1e-4, "{name}: max |Δlogit| {max_diff}");
    assert_eq!(agree, 1.0);
}

#[test]
fn tiny_llama_logits_match_transformers() {
    check_logits("tiny-llama");
}

#[test]
fn tiny_qwen2_logits_match_transformers() {
    check_logits("tiny-qwen2");
}

#[test]
fn tiny_llama_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-llama", "tiny-llama", common::CACHE_TOLERANCE);
}

#[test]
fn tiny_qwen2_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-qwen2", "tiny-qwen2", common::CACHE_TOLERANCE);
}

#[test]
fn tiny_llama_tokenizer_and_greedy_match_transformers() {
    check_tokenizer_and_greedy("tiny-llama", "tiny-llama");
}

#[test]
fn tiny_qwen2_tokenizer_and_greedy_match_transformers() {
    check_tokenizer_and_greedy("tiny-qwen2", "tiny-qwen2");
}
