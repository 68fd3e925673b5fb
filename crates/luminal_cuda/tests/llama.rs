//! A Llama-family model on the CUDA backend's plan: `LlamaModel::load` (weights handed over
//! as bytes, quantized or not; the KV cache as `WriteSlice` state in f16, the default; the
//! dynamic dims `s`, `p`, `n_out`), teacher-forced logits and cached decoding, against the
//! CPU backend on the same GGUF (the tiny fixtures of `luminal_model_tests`). On the host
//! emulator here; on a GPU when one loads (skipped, with a line, otherwise).

use luminal::prelude::*;
use luminal_cpu::{CpuBackend, QuantDots};
use luminal_cuda::{
    CudaBackend, HostEmulatorBackend, HostEmulatorCooperative, HostEmulatorUnfused,
};
use luminal_models::{LlamaModel, LoadOptions, Model};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../luminal_model_tests/tests/fixtures")
        .join(name)
}

fn options() -> LoadOptions {
    LoadOptions {
        max_ctx: 64,
        ..LoadOptions::default()
    }
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Token ids of the checks: a prompt of 19 (from the fixture's reference cases) and a
/// pseudo-random one of 24 within the vocabulary.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut s = 12345u32;
    let random: Vec<u32> = (0..24)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s % vocab as u32
        })
        .collect();
    vec![
        (0..19).map(|i| (i * 29 + 7) % vocab as u32).collect(),
        random,
    ]
}

/// Teacher-forced logits of every prompt, then the first prompt again as a prefill of 5 and
/// one token at a time through the KV cache.
fn logits<M: Model>(model: &mut M) -> Vec<Vec<f32>> {
    let mut out = vec![];
    for p in prompts(model.vocab_size()) {
        model.reset();
        out.push(model.logits_all(&p).unwrap());
    }
    let p = &prompts(model.vocab_size())[0];
    model.reset();
    let mut stepped = model.forward(&p[..5], 5).unwrap();
    for &t in &p[5..] {
        stepped.extend(model.forward(&[t], 1).unwrap());
    }
    out.push(stepped);
    out
}

/// Loads `file` on `backend` and on the CPU backend (f32 activations, the same f16 cache)
/// and compares the logits: max |Δ| and top-1 agreement (issue 14's check: ≥ 99%).
/// Whether attention runs on the f16 tensor-core kernel (the GPU's default over the f16 KV
/// cache, and the cooperative emulator's).
const F16_ATTENTION: bool = true;

fn check<B: Backend>(file: &str, backend: B, label: &str, f16_attention: bool)
where
    B::Runtime: Runtime,
{
    // Files with f16/bf16 or block-quantized weights: through cuBLAS the CUDA plan rounds the
    // activations to f16/bf16 (the weight's type, or f16 for a quantized weight's f16 copy; as
    // PyTorch's autocast), the CPU backend multiplies them in f32.
    // Attention through the f16 tensor-core kernel (the GPU's default over the f16 KV cache,
    // and the cooperative emulator's) rounds q and the probabilities to f16, as PyTorch's
    // f16 SDPA does.
    let tol = if file.contains("f16") || file.contains("q8_0") {
        0.1
    } else if f16_attention {
        1e-2
    } else {
        2e-3
    };
    let (mut model, _) = LlamaModel::load(fixture(file), backend, &options(), |_, _| {})
        .unwrap_or_else(|e| panic!("{label}: loading {file}: {e}"));
    let cpu = CpuBackend::with_threads(2).quant_dots(QuantDots::F32);
    let (mut want_model, _) = LlamaModel::load(fixture(file), cpu, &options(), |_, _| {}).unwrap();
    let vocab = model.vocab_size();
    let got = logits(&mut model);
    let want = logits(&mut want_model);
    let (mut max_diff, mut agree, mut rows) = (0f32, 0usize, 0usize);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "{label} {file}: non-finite logit");
            max_diff = max_diff.max((a - b).abs());
        }
        for (a, b) in g.chunks(vocab).zip(w.chunks(vocab)) {
            agree += (argmax(a) == argmax(b)) as usize;
            rows += 1;
        }
    }
    let top1 = agree as f64 / rows as f64;
    println!(
        "{label} {file}: {rows} positions, max |Δlogit| vs the CPU backend {max_diff:e}, \
         top-1 agreement {:.1}%",
        100.0 * top1
    );
    assert!(max_diff < tol, "{label} {file}: max |Δlogit| {max_diff}");
    assert!(top1 >= 0.99, "{label} {file}: top-1 agreement {top1}");
}

#[test]
fn tiny_llama_f32_on_the_emulator_matches_the_cpu_backend() {
    check("tiny-llama.gguf", HostEmulatorBackend, "emulator", false);
}

#[test]
fn tiny_llama_q8_0_on_the_emulator_matches_the_cpu_backend() {
    check(
        "tiny-llama.q8_0.gguf",
        HostEmulatorBackend,
        "emulator",
        false,
    );
}

#[test]
fn tiny_llama_half_weights_on_the_emulator_match_the_cpu_backend() {
    for file in ["tiny-llama.f16.gguf", "tiny-llama.bf16.gguf"] {
        check(file, HostEmulatorBackend, "emulator", false);
    }
}

#[test]
fn tiny_llama_on_the_cooperative_emulator_matches_the_cpu_backend() {
    // Attention through the f16 tensor-core kernel (q and the probabilities rounded to f16),
    // reductions as a GPU runs them.
    check(
        "tiny-llama.gguf",
        HostEmulatorCooperative,
        "cooperative emulator (f16 attention)",
        true,
    );
}

#[test]
fn tiny_qwen2_on_the_emulator_matches_the_cpu_backend() {
    check("tiny-qwen2.gguf", HostEmulatorBackend, "emulator", false);
}

#[test]
fn the_kv_cache_is_written_in_place() {
    let (model, _) = LlamaModel::load(
        fixture("tiny-llama.gguf"),
        HostEmulatorBackend,
        &options(),
        |_, _| {},
    )
    .unwrap();
    // One key and one value cache per layer, each appended without copying the cache.
    let layers = model.config().n_layers;
    assert_eq!(model.runtime().writes_in_place(), 2 * layers);
}

#[test]
fn model_kernels_compile_with_nvrtc() {
    // Every generated kernel of a model's plan (f32, f16 and q8_0 weights) is accepted by
    // NVRTC for Hopper, where NVRTC loads (a GPU machine, or the NVRTC wheel on
    // LD_LIBRARY_PATH); elsewhere this prints a line and passes.
    if !luminal_cuda::nvrtc_available() {
        eprintln!("skipping: NVRTC is not loadable here");
        return;
    }
    for file in [
        "tiny-llama.gguf",
        "tiny-llama.f16.gguf",
        "tiny-llama.bf16.gguf",
        "tiny-llama.q8_0.gguf",
    ] {
        let (mut model, _) =
            LlamaModel::load(fixture(file), HostEmulatorBackend, &options(), |_, _| {}).unwrap();
        // A prefill and decode steps first: combined and skinny kernels are made at run time.
        let p = &prompts(model.vocab_size())[0];
        model.forward(&p[..5], 1).unwrap();
        for &tok in &p[5..8] {
            model.forward(&[tok], 1).unwrap();
        }
        let kernels: Vec<_> = model.runtime().kernels().iter().collect();
        assert!(
            kernels.iter().any(|k| k.name.starts_with("lum_combo")),
            "{file}: no combined kernel"
        );
        let ptx = luminal_cuda::device::nvrtc_ptx(&kernels, "compute_90")
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        // Every kernel waits for the one launched before it (programmatic dependent launch):
        // one wait per entry, before the body's first instruction that touches memory.
        for body in ptx.split(".entry ").skip(1) {
            let wait = body.find("griddepcontrol.wait");
            let memory = ["ld.global", "st.global"]
                .iter()
                .filter_map(|op| body.find(op))
                .min();
            assert!(
                wait.is_some_and(|w| memory.is_none_or(|m| w < m)),
                "{file}: {} does not wait first",
                &body[..body.find('(').unwrap_or(body.len())]
            );
        }
    }
}

#[test]
fn decode_steps_replay_a_captured_graph() {
    // A decode step's launches are the same at every position (positions and the key count
    // are read from device tables), so after two steps the rest replay one captured graph.
    let (mut model, _) = LlamaModel::load(
        fixture("tiny-llama.gguf"),
        HostEmulatorBackend,
        &options(),
        |_, _| {},
    )
    .unwrap();
    let p = &prompts(model.vocab_size())[0];
    model.forward(&p[..5], 1).unwrap();
    for &tok in &p[5..15] {
        model.forward(&[tok], 1).unwrap();
    }
    let (replays, captures) = model.runtime().graph_replays();
    println!("10 decode steps: {replays} replayed, {captures} captured");
    assert!(
        replays >= 8 && captures >= 1,
        "{replays} replays, {captures} captures"
    );
}

#[test]
fn tiny_llama_unfused_on_the_emulator_matches_the_cpu_backend() {
    check(
        "tiny-llama.gguf",
        HostEmulatorUnfused,
        "emulator unfused",
        false,
    );
}

/// Launches of a 16-token prefill and of one decode step (after it) on `backend`.
fn launches<B: Backend<Runtime = luminal_cuda::host::HostRuntime>>(
    file: &str,
    backend: B,
) -> (usize, usize) {
    let (mut model, _) = LlamaModel::load(fixture(file), backend, &options(), |_, _| {}).unwrap();
    let p = &prompts(model.vocab_size())[0];
    model.forward(&p[..16], 1).unwrap();
    let prefill = model.runtime().launches();
    model.forward(&p[16..17], 1).unwrap();
    (prefill, model.runtime().launches())
}

#[test]
fn fusion_cuts_the_launches_of_a_decode_step() {
    for file in ["tiny-llama.gguf", "tiny-llama.q8_0.gguf"] {
        let fused = launches(file, HostEmulatorBackend);
        let unfused = launches(file, HostEmulatorUnfused);
        println!(
            "emulator {file}: launches per 16-token prefill / decode step: fused {} / {}, \
             unfused {} / {}",
            fused.0, fused.1, unfused.0, unfused.1
        );
        assert!(fused.1 < unfused.1, "{fused:?} vs {unfused:?}");
    }
}

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("skipping the GPU model test: {e}");
            None
        }
    }
}

#[test]
fn tiny_models_on_the_gpu_match_the_cpu_backend() {
    if let Some(b) = gpu() {
        println!("gpu: {:?} {}", b, b.device_name().unwrap_or_default());
        for file in [
            "tiny-llama.gguf",
            "tiny-llama.q8_0.gguf",
            "tiny-qwen2.gguf",
            "tiny-llama.f16.gguf",
            "tiny-llama.bf16.gguf",
        ] {
            check(file, b.clone(), "gpu (f16 attention)", F16_ATTENTION);
        }
        check(
            "tiny-llama.gguf",
            b.clone().without_half_attention(),
            "gpu 3xTF32 attention",
            false,
        );
        check(
            "tiny-llama.f16.gguf",
            b.clone().without_half_products(),
            "gpu f32 products",
            F16_ATTENTION,
        );
        check(
            "tiny-llama.q8_0.gguf",
            b.clone().without_fusion(),
            "gpu unfused",
            F16_ATTENTION,
        );
        // For information: load (NVRTC included), a prefill and decode steps, wall clock,
        // with products through cuBLAS and as kernels.
        let broadcast = b
            .clone()
            .with_fusion(luminal_cuda::codegen::Fusion::Broadcast);
        check(
            "tiny-qwen2.gguf",
            broadcast.clone(),
            "gpu broadcast-fused (f16 attention)",
            F16_ATTENTION,
        );
        for (mode, b) in [
            ("fused", b.clone()),
            ("unfused", b.clone().without_fusion()),
            ("broadcast-fused", broadcast),
            ("fused, no cuBLAS", b.without_cublas()),
        ] {
            let t = std::time::Instant::now();
            let (mut model, _) =
                LlamaModel::load(fixture("tiny-llama.q8_0.gguf"), b, &options(), |_, _| {})
                    .unwrap();
            let load = t.elapsed();
            let p = &prompts(model.vocab_size())[0];
            model.forward(&p[..16], 1).unwrap();
            model.reset();
            let t = std::time::Instant::now();
            model.forward(&p[..16], 1).unwrap();
            let prefill = t.elapsed();
            let t = std::time::Instant::now();
            for &tok in &p[..16] {
                model.forward(&[tok], 1).unwrap();
            }
            let step = t.elapsed() / 16;
            println!(
                "gpu tiny-llama.q8_0.gguf ({mode}, {} of {} products through cuBLAS): \
                 load {load:?}, 16-token prefill {prefill:?}, decode step {step:?} \
                 ({} launches)",
                model.runtime().gemm_products(),
                model.runtime().gemm_patterns(),
                model.runtime().launches(),
            );
        }
    }
}
