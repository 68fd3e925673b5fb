//! A decode step makes no heap allocation: once the buffers have grown to a context length
//! (a first pass over the positions), `Model::forward_into` through the KV cache allocates
//! nothing, on any thread (a counting global allocator sees every allocation). The tiny Q8_0
//! GGUF exercises the default int8 path with its refined logits; the f32 file the f32 one.

use luminal::testing::CountingAlloc;
use luminal_cpu::{CpuBackend, QuantDots};
use luminal_models::{LlamaModel, LoadOptions, Model};
use std::path::PathBuf;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Allocations during the decode steps of a second pass over the same positions.
fn decode_allocations(file: &str, dots: QuantDots, threads: usize) -> usize {
    let backend = CpuBackend::with_threads(threads).quant_dots(dots);
    let opts = LoadOptions {
        max_ctx: 48,
        ..Default::default()
    };
    let (mut model, _) = LlamaModel::load(fixture(file), backend, &opts, |_, _| {}).unwrap();
    // The load reads weights on rayon's global pool, whose threads start asynchronously
    // and allocate their own state as they do: on a busy machine a late one did so inside
    // the counted steps (CI). A job on every one of them waits until all have started;
    // decode itself runs on the backend's own pool.
    rayon::broadcast(|_| ());
    let prompt = [1u32, 5, 9, 3, 7];
    let steps: Vec<u32> = (0..40).map(|i| (i * 7 + 2) % 50).collect();
    let mut logits = Vec::new();
    let mut total = 0;
    for pass in 0..2 {
        model.reset();
        model.forward_into(&prompt, 1, &mut logits).unwrap();
        if pass == 1 {
            GLOBAL.start();
        }
        for &t in &steps {
            model.forward_into(&[t], 1, &mut logits).unwrap();
        }
        total = GLOBAL.stop();
        assert_eq!(logits.len(), model.vocab_size());
        assert!(logits.iter().all(|v| v.is_finite()));
    }
    total
}

#[test]
fn decode_steps_allocate_nothing() {
    for threads in [1, 2] {
        for (file, dots) in [
            ("tiny-llama.q8_0.gguf", QuantDots::default()),
            ("tiny-llama.q8_0.gguf", QuantDots::F32),
            ("tiny-llama.gguf", QuantDots::default()),
        ] {
            let n = decode_allocations(file, dots, threads);
            assert_eq!(
                n, 0,
                "{file} {dots:?} {threads} threads: {n} allocations in 40 steps"
            );
        }
    }
}
