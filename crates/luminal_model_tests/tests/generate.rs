//! `generate` and `perplexity` on the tiny HF fixtures (against transformers' greedy
//! generation and a direct computation from `logits_all`) and on the real SmolLM2 file
//! (against transformers' perplexity and generation in `fixtures/smollm2_reference.json`;
//! skipped when the model file is absent).

mod common;

use common::{fixture, ids, json, smollm2, smollm2_f32};
use luminal_cpu::{CpuBackend, CpuRuntime};
use luminal_models::generate::{generate, perplexity, token_nll, GenerateOptions, StopReason};
use luminal_models::sampling::SamplerConfig;
use luminal_models::Model;
use luminal_models::{LlamaModel, LoadOptions, ModelError, Tokenizer};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    fixture("")
}

fn load_tiny(max_ctx: usize) -> (LlamaModel<CpuRuntime>, Tokenizer) {
    let opts = LoadOptions {
        max_ctx,
        ..Default::default()
    };
    let backend = CpuBackend::with_threads(2);
    LlamaModel::load(fixtures().join("tiny-llama"), backend, &opts, |_, _| {}).unwrap()
}

/// Runs `generate`, returning the ids, the streamed chunks and the stop reason.
fn run(
    model: &mut LlamaModel<CpuRuntime>,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> (Vec<u32>, Vec<String>, StopReason) {
    let mut chunks = Vec::new();
    let (ids, stats) = generate(model, tok, prompt, opts, |t| chunks.push(t.to_string())).unwrap();
    assert_eq!(stats.prompt_tokens, prompt.len());
    assert_eq!(stats.generated_tokens, ids.len());
    (ids, chunks, stats.stop_reason)
}

#[test]
fn tiny_llama_greedy_generate_matches_transformers() {
    let r = json(fixtures().join("tiny-llama/reference.json"));
    let g = &r["generation"];
    let (mut model, tok) = load_tiny(256);
    let prompt = ids(&g["prompt_ids"]);
    let want = ids(&g["new_ids"]);
    let opts = GenerateOptions {
        max_new_tokens: want.len(),
        ..Default::default()
    };
    let (got, chunks, reason) = run(&mut model, &tok, &prompt, &opts);
    assert_eq!(got, want);
    assert_eq!(reason, StopReason::MaxTokens);
    assert_eq!(chunks.concat(), g["new_text"].as_str().unwrap());
    assert_eq!(chunks.concat(), tok.decode(&want, true).unwrap());

    // A second call resets the cache and gives the same result.
    let (again, _, _) = run(&mut model, &tok, &prompt, &opts);
    assert_eq!(again, want);
}

#[test]
fn tiny_llama_stop_strings_are_never_emitted() {
    let r = json(fixtures().join("tiny-llama/reference.json"));
    let g = &r["generation"];
    let (mut model, tok) = load_tiny(256);
    let prompt = ids(&g["prompt_ids"]);
    let want = ids(&g["new_ids"]);
    let full = g["new_text"].as_str().unwrap().to_string();
    // Every stop string made of 2..=4 characters of the full text, including ones that span
    // token boundaries.
    let bounds: Vec<usize> = full
        .char_indices()
        .map(|(i, _)| i)
        .chain([full.len()])
        .collect();
    let mut checked = 0;
    for a in 0..bounds.len() {
        for len in 2..=4 {
            let Some(&b) = bounds.get(a + len) else {
                continue;
            };
            let stop = full[bounds[a]..b].to_string();
            let before = &full[..full.find(&stop).unwrap()];
            let opts = GenerateOptions {
                max_new_tokens: want.len(),
                stop_strings: vec!["never appears".into(), stop.clone()],
                ..Default::default()
            };
            let (got, chunks, reason) = run(&mut model, &tok, &prompt, &opts);
            assert_eq!(reason, StopReason::StopString(1), "{stop:?}");
            assert_eq!(chunks.concat(), before, "{stop:?}");
            assert!(chunks.iter().all(|c| !c.is_empty()));
            // The ids stop at the token that completed the stop string.
            assert!(want.starts_with(&got), "{stop:?}");
            let text_of_ids = tok.decode(&got, true).unwrap();
            assert!(text_of_ids.contains(&stop), "{stop:?}");
            assert!(!tok
                .decode(&got[..got.len() - 1], true)
                .unwrap()
                .contains(&stop));
            checked += 1;
        }
    }
    assert!(checked > 10);
}

#[test]
fn tiny_llama_stops_cleanly_when_the_context_is_full() {
    let r = json(fixtures().join("tiny-llama/reference.json"));
    let g = &r["generation"];
    let prompt = ids(&g["prompt_ids"]);
    let want = ids(&g["new_ids"]);

    // A context that holds the prompt and 3 more tokens: 3 are fed back, a 4th is sampled
    // from the last logits, then generation stops cleanly.
    let (mut model, tok) = load_tiny(prompt.len() + 3);
    let opts = GenerateOptions {
        max_new_tokens: 100,
        ..Default::default()
    };
    let (got, _, reason) = run(&mut model, &tok, &prompt, &opts);
    assert_eq!(reason, StopReason::ContextFull);
    assert_eq!(got, want[..4]);

    // A prompt that does not fit is an error.
    let long: Vec<u32> = prompt.iter().chain(&prompt).copied().collect();
    let err = generate(&mut model, &tok, &long, &opts, |_| {}).unwrap_err();
    assert!(matches!(err, ModelError::ContextFull { .. }), "{err}");

    // No tokens asked for: nothing is run or printed.
    let (none, stats) = generate(
        &mut model,
        &tok,
        &prompt,
        &GenerateOptions {
            max_new_tokens: 0,
            ..Default::default()
        },
        |_| panic!("no text expected"),
    )
    .unwrap();
    assert!(none.is_empty());
    assert_eq!(stats.stop_reason, StopReason::MaxTokens);
}

#[test]
fn tiny_llama_sampling_is_seeded() {
    let r = json(fixtures().join("tiny-llama/reference.json"));
    let prompt = ids(&r["generation"]["prompt_ids"]);
    let (mut model, tok) = load_tiny(256);
    let opts = |seed| GenerateOptions {
        max_new_tokens: 16,
        sampler: SamplerConfig {
            temperature: 1.0,
            top_k: 40,
            top_p: 0.95,
            seed,
            ..Default::default()
        },
        ..Default::default()
    };
    let (a, _, _) = run(&mut model, &tok, &prompt, &opts(1));
    let (b, _, _) = run(&mut model, &tok, &prompt, &opts(1));
    let (c, _, _) = run(&mut model, &tok, &prompt, &opts(2));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// The protocol computed directly from `logits_all`, window by window.
fn direct_perplexity(model: &mut LlamaModel<CpuRuntime>, ids: &[u32], ctx: usize) -> (f64, usize) {
    let vocab = model.vocab_size();
    let (mut nll, mut n) = (0f64, 0usize);
    for w in ids.chunks(ctx).filter(|w| w.len() >= 2) {
        let logits = model.logits_all(w).unwrap();
        for i in 0..w.len() - 1 {
            nll += token_nll(&logits[i * vocab..(i + 1) * vocab], w[i + 1] as usize);
            n += 1;
        }
    }
    ((nll / n as f64).exp(), n)
}

#[test]
fn tiny_llama_perplexity_equals_direct_computation() {
    let text = std::fs::read_to_string(fixtures().join("ppl.txt")).unwrap();
    let (mut model, tok) = load_tiny(256);
    let ids = tok.encode(&text, false).unwrap();
    for ctx in [2, 3, 64, 100] {
        let got = perplexity(&mut model, &tok, &text, ctx).unwrap();
        let (want, n_scored) = direct_perplexity(&mut model, &ids, ctx);
        assert_eq!(got.n_tokens, ids.len());
        assert_eq!(got.n_scored, n_scored, "ctx {ctx}");
        let full = ids.len() / ctx;
        let partial = (ids.len() % ctx >= 2) as usize;
        assert_eq!(got.n_windows, full + partial, "ctx {ctx}");
        let rel = (got.ppl - want).abs() / want;
        assert!(rel < 1e-5, "ctx {ctx}: {} vs {want}", got.ppl);
    }
    // ppl.txt has no BOS added: the tokenization is the plain one.
    assert_ne!(ids.first(), tok.bos_id().as_ref());
    // Too small a context, too large a context, too short a text.
    assert!(perplexity(&mut model, &tok, &text, 1).is_err());
    assert!(matches!(
        perplexity(&mut model, &tok, &text, 257),
        Err(ModelError::ContextFull { .. })
    ));
    assert!(perplexity(&mut model, &tok, "", 64).is_err());
}

// ---- the real SmolLM2 file -------------------------------------------------------------

/// The relative difference of `model`'s SmolLM2 perplexity from transformers' (printed;
/// the token counts checked).
fn smollm2_perplexity(model: &mut LlamaModel<CpuRuntime>, tok: &Tokenizer, what: &str) -> f64 {
    let r = json(fixtures().join("smollm2_reference.json"));
    let p = &r["perplexity"];
    let ctx = p["ctx"].as_u64().unwrap() as usize;
    let text = std::fs::read_to_string(fixtures().join(p["file"].as_str().unwrap())).unwrap();
    let got = perplexity(model, tok, &text, ctx).unwrap();
    let want = p["ppl"].as_f64().unwrap();
    assert_eq!(got.n_tokens as u64, p["n_tokens"].as_u64().unwrap());
    assert_eq!(got.n_scored as u64, p["n_scored"].as_u64().unwrap());
    assert_eq!(got.n_windows as u64, p["n_windows"].as_u64().unwrap());
    let rel = (got.ppl - want).abs() / want;
    eprintln!(
        "SmolLM2 perplexity ({what}, ctx {ctx}): luminal {:.6}, transformers {want:.6}, relative difference {rel:.2e}",
        got.ppl
    );
    rel
}

#[test]
fn smollm2_perplexity_matches_transformers() {
    let Some(m) = smollm2_f32() else { return };
    let mut guard = m.lock().unwrap();
    let (model, tok) = &mut *guard;
    let rel = smollm2_perplexity(model, tok, "f32 activations");
    // Measured 1.6e-7 (f32 kernels vs transformers' f32); the bound leaves room for
    // kernels that reorder sums.
    assert!(rel < 1e-3, "relative difference {rel:.2e}");
}

#[test]
fn smollm2_default_perplexity_is_within_one_percent_of_transformers() {
    let Some(m) = smollm2() else { return };
    let mut guard = m.lock().unwrap();
    let (model, tok) = &mut *guard;
    let rel = smollm2_perplexity(model, tok, "default: int8 activations");
    // The teacher-forced windows are prefills: with AVX-512 VNNI their products take int8
    // activations too (the logits' top 32 refined). Measured 2.6e-3 there (ours 37.58 vs
    // 37.67), 1.6e-7 where prefill keeps f32 activations.
    assert!(rel < 1e-2, "relative difference {rel:.2e}");
}

/// With f32 activations (the default's int8 prefill picks a near-tie first token here, see
/// `smollm2.rs`).
#[test]
fn smollm2_chat_generation_matches_transformers_and_stops_at_eos() {
    let Some(m) = smollm2_f32() else { return };
    let mut guard = m.lock().unwrap();
    let (model, tok) = &mut *guard;
    let r = json(fixtures().join("smollm2_reference.json"));
    let g = &r["generation"];
    let prompt = ids(&g["prompt_ids"]);
    let new_ids = ids(&g["new_ids"]);
    let eos_at = g["first_eos_index"].as_u64().unwrap() as usize;
    let opts = GenerateOptions {
        max_new_tokens: new_ids.len(),
        ..Default::default()
    };
    let mut text = String::new();
    let (got, stats) = generate(model, tok, &prompt, &opts, |t| text.push_str(t)).unwrap();
    assert_eq!(got, new_ids[..eos_at]);
    assert_eq!(stats.stop_reason, StopReason::StopToken(new_ids[eos_at]));
    assert_eq!(text, "The capital of France is Paris.");
}
