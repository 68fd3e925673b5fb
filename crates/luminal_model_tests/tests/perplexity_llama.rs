//! `perplexity_llama_cpp` (`luminal perplexity --protocol llama-cpp`) against llama.cpp's own
//! `llama-perplexity` on the tiny f32 GGUF and the perplexity text fixture
//! (`scripts/gen_llama_ppl_fixture.sh` → `fixtures/tiny-llama.llama-perplexity.json`): same
//! chunks, same scored positions, same number. The f32 file and f32 activations make both
//! programs compute nearly the same function; llama.cpp keeps its KV cache in f16 by
//! default, which is most of the measured 4.3e-5 relative difference (bound 1e-4; scoring
//! one position more per chunk moves it by 1.2e-2).

mod common;

use common::{fixture, json, load};
use luminal_models::generate::perplexity_llama_cpp;

#[test]
fn llama_cpp_protocol_matches_llama_perplexity() {
    let want = json(fixture("tiny-llama.llama-perplexity.json"));
    let (mut model, tok) = load(want["model"].as_str().unwrap());
    let text = std::fs::read_to_string(fixture(want["text"].as_str().unwrap())).unwrap();
    let ctx = want["ctx"].as_u64().unwrap() as usize;
    let mut chunks = 0;
    let got = perplexity_llama_cpp(&mut model, &tok, &text, ctx, |_, n, _| chunks = n).unwrap();
    let ppl = want["ppl"].as_f64().unwrap();
    let rel = (got.ppl - ppl).abs() / ppl;
    println!(
        "tiny-llama llama.cpp protocol: luminal {:.4}, llama-perplexity {ppl:.4}, relative {rel:.1e}",
        got.ppl
    );
    assert_eq!(got.n_windows as u64, want["chunks"].as_u64().unwrap());
    assert_eq!(chunks, got.n_windows);
    assert_eq!(got.n_scored, got.n_windows * (ctx - 1 - ctx / 2));
    assert!(rel < 1e-4, "{} vs llama-perplexity {ppl}", got.ppl);
    // Too short a text is an error, as in llama-perplexity (fewer than 2 × ctx tokens).
    assert!(perplexity_llama_cpp(&mut model, &tok, "a b c", ctx, |_, _, _| {}).is_err());
}
