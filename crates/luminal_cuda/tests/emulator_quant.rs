//! Quantized and half weights: raw blocks uploaded as bytes (`HostData::Bytes`) and read only
//! by a cast to a float type (`w.dequantize()`), through the cast's view. The generated
//! kernels (the prelude's `lum_deq_<type>`) must give the core's decoders' values bit for bit;
//! run by the host emulator against the reference runtime, which dequantizes with those
//! decoders. `gpu_dequantizing_casts` runs the same checks on a GPU.

use luminal::prelude::*;
use luminal_cuda::HostEmulatorBackend;

mod common;
use common::quant as quant_cases;

#[test]
fn every_block_type_dequantizes_bit_exactly() {
    quant_cases::every_block_type(|| HostEmulatorBackend);
}

#[test]
fn dequantize_through_views_and_into_half() {
    quant_cases::views_and_half(|| HostEmulatorBackend);
}

#[test]
fn quantized_embedding_gather_and_matmul() {
    quant_cases::gather_and_matmul(|| HostEmulatorBackend);
}

#[test]
fn wrong_byte_lengths_are_typed_errors() {
    let cx = Graph::new();
    let w = cx.input("w", (2, 32), DType::Q8_0);
    let _ = w.dequantize().output();
    let mut rt = cx
        .compile(HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    // One block where the shape needs two.
    let data =
        HostData::from_bytes(DType::Q8_0, luminal::SharedBytes::from_vec(vec![0; 34])).unwrap();
    assert!(rt.set_data(w, data).is_err());
}

/// The same checks on a GPU (NVRTC's compile of the dequantizers, `__fmul_rn` products);
/// skipped, with a line, where no device loads.
#[test]
fn gpu_dequantizing_casts() {
    match luminal_cuda::CudaBackend::new(0) {
        Ok(b) => {
            quant_cases::every_block_type(|| b.clone());
            quant_cases::views_and_half(|| b.clone());
            quant_cases::gather_and_matmul(|| b.clone());
        }
        Err(e) => eprintln!("skipping the GPU dequantization checks: {e}"),
    }
}
