//! The GGUF path on files written by llama.cpp's own converter (`convert_hf_to_gguf.py`, via
//! `scripts/gen_tiny_gguf_fixtures.py`) from the tiny Hugging Face checkpoints of
//! `tests/fixtures/tiny-{llama,qwen2}`, against transformers' logits for those checkpoints:
//!
//! - `tiny-llama.gguf` (f32): q/k rows permuted for llama.cpp's interleaved RoPE, and the
//!   llama3 `rope_scaling` stored as the tensor `rope_freqs.weight` (Llama 3.1+/3.2 layout).
//!   Without the factors the logits would be off by up to 2.5 (measured with transformers),
//!   so the 1e-4 bound below checks they are applied.
//! - `tiny-llama.q8_0.gguf`: the same with Q8_0 weights, against transformers run on the
//!   gguf-py-dequantized Q8_0 weights (`tiny-llama.q8_0.reference.json`).
//! - `tiny-qwen2.gguf` (f32): qkv bias, tied embeddings, NeoX RoPE (no permutation).

mod common;

use common::*;
use luminal::ReferenceBackend;
use luminal_cpu::CpuBackend;
use luminal_models::{CacheType, LlamaModel, LoadOptions, Model};
use luminal_nn::RopeLayout;

#[test]
fn configs_come_from_the_converted_metadata() {
    let (llama, _) = load("tiny-llama.gguf");
    let c = llama.config();
    assert_eq!(c.architecture, "llama");
    assert!(c.rope_freq_factors, "tiny-llama.gguf has rope_freqs.weight");
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.rope_layout, RopeLayout::Interleaved);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (4, 2, 16));
    assert!(!c.tie_word_embeddings);

    let (qwen, _) = load("tiny-qwen2.gguf");
    let c = qwen.config();
    assert_eq!(c.architecture, "qwen2");
    assert!(!c.rope_freq_factors);
    assert_eq!(c.rope_layout, RopeLayout::NeoX);
    assert!(c.qkv_bias && c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 1e6);
}

#[test]
fn tiny_llama_f32_gguf_logits_match_transformers() {
    let (mut model, _) = load("tiny-llama.gguf");
    let (max_diff, top1) = compare_logits(&mut model, &reference("tiny-llama"));
    println!("tiny-llama.gguf (f32): max |Δlogit| vs transformers = {max_diff:e}, top-1 {top1}");
    assert!(max_diff < 1e-4, "tiny-llama.gguf: max |Δlogit| {max_diff}");
    assert_eq!(top1, 1.0);
}

#[test]
fn tiny_qwen2_f32_gguf_logits_match_transformers() {
    let (mut model, _) = load("tiny-qwen2.gguf");
    let (max_diff, top1) = compare_logits(&mut model, &reference("tiny-qwen2"));
    println!("tiny-qwen2.gguf (f32): max |Δlogit| vs transformers = {max_diff:e}, top-1 {top1}");
    assert!(max_diff < 1e-4, "tiny-qwen2.gguf: max |Δlogit| {max_diff}");
    assert_eq!(top1, 1.0);
}

/// Q8_0 weights against transformers on the same weights dequantized by gguf-py. The loader
/// hands the blocks over as they are in the file (Q8_0 graph inputs read through
/// `.dequantize()`); with f32 activations (`load` asks for them) the CPU backend
/// dequantizes them in registers, so the model is the same function as the reference and
/// the f32 bound applies (measured: ~5e-6). The default int8 activations (as llama.cpp's
/// q8 dot products) would need a looser bound here; SmolLM2's tests check them. The distance to the f32 model (Q8_0 rounding of the weights, ~0.19) is
/// printed for information.
#[test]
fn tiny_llama_q8_0_gguf_logits_match_transformers_on_dequantized_weights() {
    let (mut model, _) = load("tiny-llama.q8_0.gguf");
    let want = json(fixture("tiny-llama.q8_0.reference.json"));
    let (max_diff, top1) = compare_logits(&mut model, &want);
    let (vs_f32, top1_f32) = compare_logits(&mut model, &reference("tiny-llama"));
    println!(
        "tiny-llama.q8_0.gguf: max |Δlogit| vs transformers on dequantized Q8_0 = {max_diff:e} \
         (top-1 {top1}); vs the f32 model = {vs_f32:e} (top-1 {top1_f32})"
    );
    assert!(max_diff < Q8_TOLERANCE, "q8_0: max |Δlogit| {max_diff}");
    assert_eq!(top1, 1.0);
}

/// See the Q8_0 logits test's comment.
const Q8_TOLERANCE: f32 = 1e-4;

/// The same model code on the reference backend (`luminal_models` names no backend: the
/// caller picks one): the quantized weights go through the core's reference dequantization,
/// and the logits match transformers, and the CPU backend, within the same bound.
#[test]
fn the_same_model_code_runs_on_the_reference_backend() {
    // An f32 KV cache, as `load` uses: the bound is against transformers' f32 logits.
    let opts = LoadOptions {
        max_ctx: 64,
        cache_type: CacheType::F32,
    };
    let path = fixture("tiny-llama.q8_0.gguf");
    let (mut on_ref, _) = LlamaModel::load(&path, ReferenceBackend, &opts, |_, _| {}).unwrap();
    let (mut on_cpu, _) = load("tiny-llama.q8_0.gguf");
    let want = json(fixture("tiny-llama.q8_0.reference.json"));
    let case = want["cases"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|c| c["ids"].as_array().unwrap().len())
        .unwrap();
    let tokens = ids(&case["ids"]);
    assert!(tokens.len() >= 4, "a case of at least 4 tokens");
    let got = on_ref.logits_all(&tokens).unwrap();
    let cpu = on_cpu.logits_all(&tokens).unwrap();
    let (mut vs_hf, mut vs_cpu) = (0f32, 0f32);
    for ((g, c), w) in got.iter().zip(&cpu).zip(logits(case)) {
        vs_hf = vs_hf.max((g - w).abs());
        vs_cpu = vs_cpu.max((g - c).abs());
    }
    println!("reference backend: max |Δlogit| vs transformers {vs_hf:e}, vs CPU {vs_cpu:e}");
    assert_eq!(got.len(), tokens.len() * on_ref.vocab_size());
    assert!(
        vs_hf < Q8_TOLERANCE,
        "reference backend vs transformers: {vs_hf}"
    );
    assert!(vs_cpu < Q8_TOLERANCE, "reference backend vs CPU: {vs_cpu}");
    // Decoding through the cache works there too.
    on_ref.reset();
    let first = on_ref.forward(&tokens[..3], 1).unwrap();
    let step = on_ref.forward(&tokens[3..4], 1).unwrap();
    let v = on_ref.vocab_size();
    let near = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4);
    assert!(near(&first, &got[2 * v..3 * v]) && near(&step, &got[3 * v..4 * v]));
}

#[test]
fn tiny_llama_gguf_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-llama.gguf", "tiny-llama", common::CACHE_TOLERANCE);
}

#[test]
fn tiny_qwen2_gguf_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-qwen2.gguf", "tiny-qwen2", common::CACHE_TOLERANCE);
}

/// Prefill (the f32 copy of the weights) and decode (the Q8_0 blocks) take different matmul
/// kernels here.
#[test]
fn tiny_llama_q8_0_gguf_kv_cache_decode_equals_full_recompute() {
    check_cache("tiny-llama.q8_0.gguf", "tiny-llama", Q8_TOLERANCE);
}

#[test]
fn tiny_llama_gguf_tokenizer_and_greedy_match_transformers() {
    check_tokenizer_and_greedy("tiny-llama.gguf", "tiny-llama");
}

#[test]
fn tiny_qwen2_gguf_tokenizer_and_greedy_match_transformers() {
    check_tokenizer_and_greedy("tiny-qwen2.gguf", "tiny-qwen2");
}

/// A `rope_freqs.weight` holding a zero (here: the converter's factors overwritten in a copy
/// of tiny-llama.gguf) is a typed load error, not NaN logits.
#[test]
fn zero_rope_freq_factor_is_a_load_error() {
    let mut bytes = std::fs::read(fixture("tiny-llama.gguf")).unwrap();
    // The converter's factors for tiny-llama: 1, smoothed, smoothed, then 4 (the factor).
    let file = luminal_io::GgufFile::open(fixture("tiny-llama.gguf")).unwrap();
    let factors = file.tensor_f32("rope_freqs.weight").unwrap();
    assert_eq!(factors.len(), 8);
    assert_eq!((factors[0], factors[7]), (1.0, 4.0));
    let pattern: Vec<u8> = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice())
        .expect("rope_freqs.weight data in the file");
    bytes[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("luminal-zero-rope-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let opts = LoadOptions {
        max_ctx: 8,
        ..Default::default()
    };
    let backend = CpuBackend::with_threads(1);
    let err = LlamaModel::load(&path, backend, &opts, |_, _| {}).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    let msg = err.to_string();
    assert!(msg.contains("rope_freqs.weight"), "{msg}");
}

/// A block-quantized KV cache stores whole 32-value blocks of a head's row: tiny-llama's
/// head dim of 16 cannot, which is a typed load error naming both (not a graph panic).
#[test]
fn quantized_cache_needs_whole_blocks_per_head() {
    let opts = LoadOptions {
        max_ctx: 8,
        cache_type: CacheType::Q8_0,
    };
    let err = LlamaModel::load(
        fixture("tiny-llama.gguf"),
        CpuBackend::with_threads(1),
        &opts,
        |_, _| {},
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("q8_0") && msg.contains("head dim is 16"),
        "{msg}"
    );
}
