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
