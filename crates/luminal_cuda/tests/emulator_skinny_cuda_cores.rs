//! The CUDA-core skinny kernels (`codegen::skinny_kernel`) over half weights, as they run
//! with the tensor-core kernel switched off (`LUMINAL_CUDA_SKINNY_MMA=0`, set by every test
//! of this binary before it compiles a graph; by default aligned half products take the
//! tensor-core kernel), and their routing by size: above `SKINNY_MAX_WEIGHTS` weight elements
//! with rows longer than `SKINNY_MAX_K` a decode product goes to (emulated) cuBLAS, a Q8_0
//! weight's through its f16 copy; with short rows it stays skinny.

mod common;

use common::matmul as cases;
use luminal::prelude::*;
use luminal_cuda::{HostEmulatorBackend, HostEmulatorCooperative};

/// Sets the switch once, before any test of the binary compiles a graph (every test calls
/// this first; the others wait in `call_once` while it is set).
fn cuda_cores() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| std::env::set_var("LUMINAL_CUDA_SKINNY_MMA", "0"));
}

#[test]
fn skinny_products_on_the_emulator() {
    cuda_cores();
    cases::skinny(|| HostEmulatorBackend, true);
}

#[test]
fn skinny_products_with_warps_emulated() {
    // The kernels' GPU branch (16-byte pieces per lane, warp butterflies) on OpenMP threads.
    cuda_cores();
    cases::skinny(|| HostEmulatorCooperative, true);
}

#[test]
fn large_float_weights_go_to_cublas_in_decode() {
    cuda_cores();
    let max_k = luminal_cuda::plan::SKINNY_MAX_K as usize;
    for (n, k, dtype, skinny) in [
        (513, 2 * max_k, DType::F16, false),
        (513, 2 * max_k, DType::Q8_0, false),
        (1025, max_k, DType::F16, true),
        (1025, max_k, DType::Q8_0, true),
        (8, 2 * max_k, DType::Q8_0, true),
    ] {
        assert_eq!(
            (n * k) as u64 > luminal_cuda::plan::SKINNY_MAX_WEIGHTS,
            n > 8,
            "{n} x {k}"
        );
        let (_, _, skinny_products) = cases::ones_product(n, k, dtype);
        assert_eq!(skinny_products > 0, skinny, "{dtype} {n} x {k}");
    }
}
