//! RoPE scaling (linear, YaRN) and Mistral's sliding window, end to end through both loaders,
//! against a float64 numpy reference (`scripts/gen_rope_swa_fixtures.py`, fixtures in
//! `tests/fixtures/scaling/`): tiny random models whose config.json / GGUF metadata carry
//!
//! - `tiny-yarn/`, `tiny-yarn.gguf`: YaRN factor 4 over an original context of 2048 with the
//!   default betas (ramp over frequency pairs 2..6) and attention factor 0.1·ln 4 + 1;
//! - `tiny-yarn-custom.gguf`: YaRN with `yarn_beta_fast` 16, `yarn_beta_slow` 2 and
//!   `rope.scaling.attn_factor` 0.9 (multiplying the default attention factor, as llama.cpp);
//! - `tiny-linear.gguf`: `rope.scaling.type = linear`, factor 2;
//! - `tiny-mistral/`, `tiny-mistral.gguf` (GGUF arch `mistral`): a sliding window of 4 over
//!   12 tokens.
//!
//! Logits are compared teacher-forced (one call over all 12 tokens) and decoded through the KV
//! cache (a prefill of 5, then one token per call, so the window and the positions are taken
//! relative to a cached past `p`), at `TOLERANCE` max |Δlogit| (logits have a spread of ~2;
//! measured differences are printed). The reference also records how far each model's logits
//! move under a mistaken definition (window off by one or ignored, scaling or attention factor
//! ignored, YaRN's range untruncated, default betas, …); every such distance is checked to
//! exceed the tolerance a hundredfold, so each of those mistakes would fail these tests.

mod common;

use common::*;
use luminal::ReferenceBackend;
use luminal_models::{CacheType, LlamaModel, LoadOptions, Model};
use luminal_nn::{RopeLayout, RopeScaling, YarnScaling};
use serde_json::Value;

/// Max |Δlogit| against the f64 reference (f32 compute; measured ≲ 1e-5).
const TOLERANCE: f32 = 1e-4;

fn reference(name: &str) -> Value {
    let all = json(fixture("scaling/reference.json"));
    let r = all["models"][name].clone();
    assert!(!r.is_null(), "no reference for {name}");
    r
}

fn rows(v: &Value) -> Vec<f32> {
    v.as_array()
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

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Teacher-forced and cached-decode logits of `file` against the reference of `model`.
fn check(file: &str, model: &str) {
    let r = reference(model);
    for (mutation, d) in r["mutation_max_abs_diff"].as_object().unwrap() {
        let d = d.as_f64().unwrap() as f32;
        assert!(
            d > 100.0 * TOLERANCE,
            "{model}: the mutation {mutation} moves the logits by only {d}"
        );
    }
    let (mut m, _) = load(&format!("scaling/{file}"));
    let tokens = ids(&r["ids"]);
    let vocab = m.vocab_size();
    let want = rows(&r["logits"]);
    assert_eq!(want.len(), tokens.len() * vocab);

    let full = m.logits_all(&tokens).unwrap();
    let d_full = max_diff(&full, &want);

    let prefill = r_prefill();
    m.reset();
    let mut stepped = m.forward(&tokens[..prefill], prefill).unwrap();
    for &t in &tokens[prefill..] {
        stepped.extend(m.forward(&[t], 1).unwrap());
    }
    assert_eq!(m.pos(), tokens.len());
    let d_step = max_diff(&stepped, &rows(&r["decode_logits"]));
    let top1 = full
        .chunks(vocab)
        .zip(want.chunks(vocab))
        .all(|(g, w)| argmax(g) == argmax(w));
    println!("{file}: max |Δlogit| vs numpy: teacher-forced {d_full:e}, cached decode {d_step:e}");
    assert!(
        d_full < TOLERANCE,
        "{file}: teacher-forced max |Δlogit| {d_full}"
    );
    assert!(
        d_step < TOLERANCE,
        "{file}: cached decode max |Δlogit| {d_step}"
    );
    assert!(top1, "{file}: argmax differs from the reference");
}

fn r_prefill() -> usize {
    json(fixture("scaling/reference.json"))["prefill"]
        .as_u64()
        .unwrap() as usize
}

fn yarn_of(c: &luminal_models::LlamaConfig) -> YarnScaling {
    match c.rope_scaling {
        Some(RopeScaling::Yarn(y)) => y,
        other => panic!("expected YaRN, got {other:?}"),
    }
}

#[test]
fn configs_read_scaling_and_window_from_config_json_and_gguf() {
    let default_attn = 0.1 * 4f32.ln() + 1.0;
    for file in ["tiny-yarn", "tiny-yarn.gguf"] {
        let (m, _) = load(&format!("scaling/{file}"));
        let c = m.config();
        let y = yarn_of(c);
        assert_eq!(
            (y.factor, y.original_max_position_embeddings),
            (4.0, 2048.0)
        );
        assert_eq!((y.beta_fast, y.beta_slow, y.truncate), (32.0, 1.0, true));
        assert!((y.attention_factor - default_attn).abs() < 1e-6, "{file}");
        assert_eq!(y.correction_range(c.head_dim, c.rope_theta), (2.0, 6.0));
        assert_eq!(c.sliding_window, None);
        assert_eq!(c.context_length, 8192);
    }
    let (m, _) = load("scaling/tiny-yarn-custom.gguf");
    let y = yarn_of(m.config());
    assert_eq!((y.beta_fast, y.beta_slow), (16.0, 2.0));
    assert!((y.attention_factor - 0.9 * default_attn).abs() < 1e-6);

    let (m, _) = load("scaling/tiny-linear.gguf");
    assert_eq!(
        m.config().rope_scaling,
        Some(RopeScaling::Linear { factor: 2.0 })
    );

    let (hf, _) = load("scaling/tiny-mistral");
    let (gguf, _) = load("scaling/tiny-mistral.gguf");
    for (c, layout) in [
        (hf.config(), RopeLayout::NeoX),
        (gguf.config(), RopeLayout::Interleaved),
    ] {
        assert_eq!(c.architecture, "mistral");
        assert_eq!(c.sliding_window, Some(4));
        assert_eq!(c.rope_scaling, None);
        assert_eq!(c.rope_layout, layout);
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (2, 1, 16));
    }
}

#[test]
fn yarn_hf_logits_match_reference() {
    check("tiny-yarn", "tiny-yarn");
}

#[test]
fn yarn_gguf_logits_match_reference() {
    check("tiny-yarn.gguf", "tiny-yarn");
}

#[test]
fn yarn_gguf_with_betas_and_attn_factor_logits_match_reference() {
    check("tiny-yarn-custom.gguf", "tiny-yarn-custom");
}

#[test]
fn linear_gguf_logits_match_reference() {
    check("tiny-linear.gguf", "tiny-linear");
}

#[test]
fn sliding_window_hf_logits_match_reference() {
    check("tiny-mistral", "tiny-mistral");
}

#[test]
fn sliding_window_gguf_logits_match_reference() {
    check("tiny-mistral.gguf", "tiny-mistral");
}

/// The same graphs on the core's reference backend: the window and YaRN are plain graph ops
/// (no backend kernel of their own), so every backend runs them.
#[test]
fn reference_backend_runs_window_and_yarn() {
    for (file, model) in [
        ("tiny-mistral.gguf", "tiny-mistral"),
        ("tiny-yarn.gguf", "tiny-yarn"),
    ] {
        let r = reference(model);
        // An f32 KV cache: the fixtures are transformers' f32 logits.
        let opts = LoadOptions {
            max_ctx: 16,
            cache_type: CacheType::F32,
        };
        let path = fixture(&format!("scaling/{file}"));
        let (mut m, _) = LlamaModel::load(&path, ReferenceBackend, &opts, |_, _| {}).unwrap();
        let tokens = ids(&r["ids"]);
        let d = max_diff(&m.logits_all(&tokens).unwrap(), &rows(&r["logits"]));
        println!("{file} on the reference backend: max |Δlogit| {d:e}");
        assert!(d < TOLERANCE, "{file}: {d}");
        // The last token through the cache.
        m.reset();
        m.forward(&tokens[..tokens.len() - 1], 1).unwrap();
        let last = m.forward(&tokens[tokens.len() - 1..], 1).unwrap();
        let want = rows(&r["logits"]);
        let d = max_diff(&last, &want[want.len() - last.len()..]);
        assert!(d < TOLERANCE, "{file}: cached last token {d}");
    }
}
