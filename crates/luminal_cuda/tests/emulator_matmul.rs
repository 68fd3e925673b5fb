//! f32 products through cuBLAS: `hl_ops::matmul`'s broadcast-multiply + last-axis sum
//! recognised and resolved into `cublasSgemmStridedBatched` calls, on the host emulator (its
//! cuBLAS is a loop over the same calls) against the reference runtime; shapes and layouts of
//! every kind (odd sizes, transposed and sliced operands, batched with a broadcast weight,
//! attention-like products over a dynamic cache window, vectors). `gpu_products` runs them on
//! a GPU through cuBLAS itself.

mod common;

use common::matmul as cases;
use luminal_cuda::{HostEmulatorBackend, HostEmulatorKernelsOnly};

#[test]
fn products_through_the_emulated_cublas() {
    cases::all(|| HostEmulatorBackend, true);
}

#[test]
fn products_as_kernels_without_cublas() {
    cases::all(|| HostEmulatorKernelsOnly, false);
}

#[test]
fn half_products_through_the_emulated_cublas() {
    cases::halves(|| HostEmulatorBackend, true, true);
}

#[test]
fn half_products_as_kernels() {
    cases::halves(|| HostEmulatorKernelsOnly, false, false);
}

#[test]
fn op_suite_nn_family_with_products_as_kernels() {
    luminal::testing::run_family("nn", || HostEmulatorKernelsOnly);
}

#[test]
fn gpu_products() {
    match luminal_cuda::CudaBackend::new(0) {
        Ok(b) if b.has_cublas() => {
            cases::all(|| b.clone(), true);
            cases::all(|| b.clone().without_cublas(), false);
            cases::halves(|| b.clone(), true, true);
            cases::halves(|| b.clone().without_half_products(), true, false);
            cases::all_tf32(|| b.clone().with_tf32());
            // For information: one 256×1024·1024×1024 product, cuBLAS against the kernels
            // (which materialise the 256·1024·1024 broadcast product first).
            for b in [b.clone(), b.without_cublas()] {
                println!("{}", cases::time_product(b, 256, 1024, 1024));
            }
        }
        Ok(_) => eprintln!("skipping the GPU products: cuBLAS did not load"),
        Err(e) => eprintln!("skipping the GPU products: {e}"),
    }
}
