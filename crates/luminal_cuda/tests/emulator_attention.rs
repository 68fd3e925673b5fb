//! Fused attention (`luminal_cuda::attention`): `luminal_nn`'s attention graphs recognised
//! and resolved into one call, on the host emulator (its attention is a plain loop over the
//! same call) against the reference runtime: prefill, decoding over a KV cache (f32 and f16),
//! grouped queries 3:1 and 4:1, head dims 64, 128, odd and large, padding bias and none.
//! `gpu_attention` runs the same cases through the CUDA kernels.

mod common;

use common::attention as cases;
use luminal_cuda::{HostEmulatorBackend, HostEmulatorCooperative, HostEmulatorKernelsOnly};

/// The tolerance of cases the f16 kernel runs (q and the probabilities rounded to f16).
const HALF_TOL: f32 = 2e-3;

#[test]
fn attention_through_the_emulated_kernel() {
    cases::all(|| HostEmulatorBackend, true, 1e-4);
}

#[test]
fn attention_as_primop_kernels() {
    cases::all(|| HostEmulatorKernelsOnly, false, 1e-4);
}

#[test]
fn attention_through_the_f16_kernel_on_the_cooperative_emulator() {
    cases::all(|| HostEmulatorCooperative, true, HALF_TOL);
}

#[test]
fn the_cooperative_emulator_runs_f16_calls_on_the_f16_kernel() {
    // Causal over an f16 cache with grouped queries: the f16 kernel with the mask computed
    // and the groups packed (both runs); over f16 k/v with a padding bias or none: the f16
    // kernel reading the bias; over an f32 cache: not.
    use luminal::prelude::*;
    type Build = fn(&Graph) -> (Vec<GraphTensor<'_>>, Vec<GraphTensor<'_>>);
    let cases: [(Build, &[&[(&str, usize)]], (usize, usize, usize)); 4] = [
        (
            |cx| cases::cached(cx, 8, 2, 64, 320, luminal_nn::CacheType::F16),
            &[&[("s", 20), ("p", 0)], &[("s", 1), ("p", 20)]],
            (2, 2, 2),
        ),
        (
            |cx| cases::half_kv(cx, (2, 3, 9, 40, 64), Some(30)),
            &[&[]],
            (1, 0, 0),
        ),
        (
            |cx| cases::half_kv(cx, (1, 2, 9, 40, 64), None),
            &[&[]],
            (1, 0, 0),
        ),
        (
            |cx| cases::cached(cx, 8, 2, 64, 320, luminal_nn::CacheType::F32),
            &[&[("s", 20), ("p", 0)]],
            (0, 0, 0),
        ),
    ];
    for (i, (build, bindings, want)) in cases.into_iter().enumerate() {
        let cx = Graph::new();
        let (inputs, _) = build(&cx);
        let mut rt = cx
            .compile(HostEmulatorCooperative, CompileOptions::default())
            .unwrap();
        run_at(&mut rt, &inputs, bindings);
        assert_eq!(rt.executor().half_attentions(), want, "case {i}");
        // The causal mask of case 0 is never computed (the f16 kernel computes it); case 3's
        // is (the 3xTF32 path reads it).
        let masks = [(1, 0), (0, 0), (0, 0), (1, 1)][i];
        assert_eq!(rt.causal_masks(), masks, "case {i}");
    }
    // Where the mask is read (the emulated attention reads the bias), it is computed.
    let cx = Graph::new();
    let (inputs, _) = cases::cached(&cx, 8, 2, 64, 320, luminal_nn::CacheType::F16);
    let mut rt = cx
        .compile(HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    run_at(&mut rt, &inputs, &[&[("s", 4), ("p", 0)]]);
    assert_eq!(rt.causal_masks(), (1, 1));
}

/// Binds each of `bindings` in turn, sets every input to 0.5 and runs.
fn run_at<R: luminal::prelude::Runtime>(
    rt: &mut R,
    inputs: &[luminal::prelude::GraphTensor<'_>],
    bindings: &[&[(&str, usize)]],
) {
    for dims in bindings {
        for (d, v) in dims.iter() {
            rt.set_dim(d, *v);
        }
        for &t in inputs {
            cases::set_values(rt, t, &vec![0.5; cases::elements(t, dims)]);
        }
        rt.run().unwrap();
    }
}

#[test]
fn gpu_attention() {
    match luminal_cuda::CudaBackend::new(0) {
        Ok(b) => {
            cases::all(|| b.clone(), true, HALF_TOL);
            cases::all(|| b.clone().without_half_attention(), true, 1e-4);
            cases::all(|| b.clone().without_attention_mma(), true, 1e-4);
            cases::all(|| b.clone().without_flash_attention(), false, 1e-4);
        }
        Err(e) => eprintln!("skipping the GPU attention: {e}"),
    }
}

#[test]
fn attention_kernels_compile_with_nvrtc() {
    // Where NVRTC loads (a GPU machine, or the NVRTC wheel on LD_LIBRARY_PATH), the attention
    // source compiles for Hopper; elsewhere this prints a line and passes.
    if !luminal_cuda::nvrtc_available() {
        eprintln!("skipping: NVRTC is not loadable here");
        return;
    }
    let ptx =
        luminal_cuda::device::nvrtc_source_ptx(luminal_cuda::attention::CUDA_SOURCE, "compute_90")
            .unwrap_or_else(|e| panic!("{e}"));
    for name in luminal_cuda::attention::KERNEL_NAMES {
        assert!(ptx.contains(name), "{name} missing from the PTX");
    }
    // The f16 kernels (one module), for Ampere and Hopper.
    let half: Vec<_> = luminal_cuda::device::half_kernels().iter().collect();
    for arch in ["compute_80", "compute_90"] {
        let ptx = luminal_cuda::device::nvrtc_ptx(&half, arch).unwrap_or_else(|e| panic!("{e}"));
        for k in &half {
            assert!(ptx.contains(&k.name), "{} missing from the PTX", k.name);
        }
        assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
        // For `ptxas -v` (registers, spills) on a machine without a GPU.
        if let Ok(dir) = std::env::var("LUMINAL_PTX_OUT") {
            std::fs::write(format!("{dir}/attention_h16_{arch}.ptx"), &ptx).unwrap();
        }
    }
}
