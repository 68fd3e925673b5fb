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
