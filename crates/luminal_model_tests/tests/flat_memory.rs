//! Memory stays flat while generating: on the real SmolLM2-135M Q4_1 GGUF, the resident set
//! after a long decode is within 5% of the one after 64 tokens, plus the KV cache rows
//! written in between (the cache is reserved for the whole context at load, and its pages
//! become resident as positions are written). Before the fused attention kernel, every
//! layer copied its grouped keys and values out of the cache each step, in buffers that
//! grew with the context (about 138 KB per token for this model).
//!
//! One test in its own binary, so no other test shares the process's resident set. Skips
//! (with a message) when the model file is absent.

use luminal_cpu::CpuBackend;
use luminal_models::{LlamaModel, LoadOptions, Model};
use std::path::PathBuf;

/// Resident set size in bytes (`VmRSS` of /proc/self/status), if the platform has it.
fn rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn decode_memory_is_flat_in_the_context() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh)",
            path.display()
        );
        return;
    }
    if rss().is_none() {
        eprintln!("skipping: no /proc/self/status on this platform");
        return;
    }
    // Long enough that per-token growth would show (1,000 steps × 138 KB = 138 MB), short
    // enough for a 2-core CI machine. `LUMINAL_FLAT_MEMORY_CTX=8192` runs the long
    // generation instead (minutes; its numbers are in benches/README.md).
    let max_ctx = std::env::var("LUMINAL_FLAT_MEMORY_CTX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024)
        .max(128);
    let opts = LoadOptions {
        max_ctx,
        ..Default::default()
    };
    let (mut model, _) = LlamaModel::load(&path, CpuBackend::default(), &opts, |_, _| {}).unwrap();
    let vocab = model.vocab_size() as u32;
    let token = |i: usize| ((i as u64 * 2654435761) % vocab as u64) as u32;
    let mut logits = Vec::new();
    model
        .forward_into(&(0..32).map(token).collect::<Vec<_>>(), 1, &mut logits)
        .unwrap();
    for i in 32..64 {
        model.forward_into(&[token(i)], 1, &mut logits).unwrap();
    }
    let at_64 = rss().unwrap();
    for i in 64..max_ctx {
        model.forward_into(&[token(i)], 1, &mut logits).unwrap();
    }
    let at_end = rss().unwrap();
    // KV cache rows written after position 64: layers × (k, v) × kv heads × head dim × f32.
    let c = model.config();
    let kv_rows = c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4 * (max_ctx - 64);
    let allowed = at_64 + at_64 / 20 + kv_rows;
    eprintln!(
        "RSS after 64 tokens: {:.1} MB, after {max_ctx}: {:.1} MB (allowed {:.1} MB, \
         of which KV rows {:.1} MB)",
        at_64 as f64 / 1e6,
        at_end as f64 / 1e6,
        allowed as f64 / 1e6,
        kv_rows as f64 / 1e6
    );
    assert!(
        at_end <= allowed,
        "RSS grew from {at_64} to {at_end} bytes over {} tokens (allowed {allowed})",
        max_ctx - 64
    );
}
