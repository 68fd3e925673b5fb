//! Fused attention (`luminal_cuda::attention`): `luminal_nn`'s attention graphs recognised
//! and resolved into one call, on the host emulator (its attention is a plain loop over the
//! same call) against the reference runtime: prefill, decoding over a KV cache (f32 and f16),
//! grouped queries 3:1 and 4:1, head dims 64, 128, odd and large, padding bias and none.
//! `gpu_attention` runs the same cases through the CUDA kernels.

mod common;

use common::attention as cases;
use luminal_cuda::{HostEmulatorBackend, HostEmulatorKernelsOnly};

#[test]
fn attention_through_the_emulated_kernel() {
    cases::all(|| HostEmulatorBackend, true);
}

#[test]
fn attention_as_primop_kernels() {
    cases::all(|| HostEmulatorKernelsOnly, false);
}

#[test]
fn gpu_attention() {
    match luminal_cuda::CudaBackend::new(0) {
        Ok(b) => {
            cases::all(|| b.clone(), true);
            cases::all(|| b.clone().without_attention_mma(), true);
            cases::all(|| b.clone().without_flash_attention(), false);
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
}
