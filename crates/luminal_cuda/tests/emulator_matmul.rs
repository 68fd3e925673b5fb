//! f32 products through cuBLAS: `hl_ops::matmul`'s broadcast-multiply + last-axis sum
//! recognised and resolved into `cublasSgemmStridedBatched` calls, on the host emulator (its
//! cuBLAS is a loop over the same calls) against the reference runtime; shapes and layouts of
//! every kind (odd sizes, transposed and sliced operands, batched with a broadcast weight,
//! attention-like products over a dynamic cache window, vectors). `gpu_products` runs them on
//! a GPU through cuBLAS itself.

mod common;

use common::matmul as cases;
use luminal_cuda::{HostEmulatorBackend, HostEmulatorCooperative, HostEmulatorKernelsOnly};

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
fn skinny_products_on_the_emulator() {
    cases::skinny(|| HostEmulatorBackend, true);
}

#[test]
fn skinny_products_with_warps_emulated() {
    // The kernels' GPU branch (16-byte pieces per lane, warp butterflies) on OpenMP threads.
    cases::skinny(|| HostEmulatorCooperative, true);
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
            cases::skinny(|| b.clone(), true);
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

#[test]
fn skinny_kernels_compile_with_nvrtc() {
    // Every type combination NVRTC accepts for Hopper, with 16-byte loads of the weight rows
    // and the PTX conversions (the tensor-core kernels with their `mma`); where NVRTC does
    // not load, this prints a line and passes. `LUMINAL_PTX_OUT=<file>` keeps the PTX (for
    // `ptxas -v`: registers and spills).
    use luminal::DType::{BF16, F16, F32};
    if !luminal_cuda::nvrtc_available() {
        eprintln!("skipping: NVRTC is not loadable here");
        return;
    }
    let kernels: Vec<_> = [
        (F32, F32, None, F32),
        (F16, F32, Some(F16), F32),
        (BF16, F32, Some(BF16), F32),
        (F16, F16, None, F16),
        (BF16, BF16, None, BF16),
    ]
    .into_iter()
    .map(|(w, x, r, c)| luminal_cuda::codegen::skinny_kernel(w, x, r, c))
    .chain(
        [
            luminal::DType::Q8_0,
            luminal::DType::Q4_0,
            luminal::DType::Q4_1,
            luminal::DType::Q3_K,
            luminal::DType::Q4_K,
            luminal::DType::Q5_K,
            luminal::DType::Q6_K,
        ]
        .map(|q| luminal_cuda::codegen::skinny_quant_kernel(q, F32).unwrap()),
    )
    .chain(
        [
            (F16, F32, F32),
            (BF16, F32, F32),
            (F16, F16, F16),
            (BF16, BF16, F32),
        ]
        .map(|(w, x, c)| luminal_cuda::codegen::skinny_mma_kernel(w, x, c).unwrap()),
    )
    .chain({
        // The norm and residual variants (with and without a norm weight).
        use luminal_cuda::codegen::{skinny_mma_norm_kernel, skinny_mma_residual_kernel};
        let norm = |weight| luminal_cuda::codegen::SkinnyNorm {
            weight,
            scale: 1.0 / 2048.0,
            eps: 1e-5,
        };
        [
            skinny_mma_norm_kernel(F16, F32, norm(true)),
            skinny_mma_norm_kernel(BF16, F32, norm(false)),
            skinny_mma_residual_kernel(F16, F32, None),
            skinny_mma_residual_kernel(F16, F32, Some(norm(true))),
        ]
        .map(Option::unwrap)
    })
    .collect();
    let ptx =
        luminal_cuda::device::nvrtc_ptx(&kernels.iter().collect::<Vec<_>>(), "compute_90").unwrap();
    if let Ok(path) = std::env::var("LUMINAL_PTX_OUT") {
        std::fs::write(path, &ptx).unwrap();
    }
    for k in &kernels {
        let body = ptx
            .split(".entry ")
            .find(|b| b.starts_with(&k.name))
            .unwrap_or_else(|| panic!("{} not in the PTX", k.name));
        if !k.name.contains("_q") {
            assert!(body.contains(".v4."), "{}: no 16-byte loads", k.name);
        }
    }
    assert!(ptx.contains("cvt.rn.f16.f32") && ptx.contains("cvt.rn.bf16.f32"));
    for k in kernels.iter().filter(|k| k.name.contains("_mma_")) {
        let body = ptx
            .split(".entry ")
            .find(|b| b.starts_with(&k.name))
            .unwrap();
        assert!(
            body.contains("mma.sync.aligned.m16n8k16"),
            "{}: no mma",
            k.name
        );
    }
}

#[test]
fn decode_products_of_any_size_run_on_tensor_cores() {
    // Half weights (and a Q8_0 weight too large to read in place, through its f16 copy) take
    // the tensor-core skinny kernel whatever their size, the outputs each row's sum of the
    // weight's (decoded, f16-rounded) values times ones. (Without it, the routing by size of
    // `emulator_skinny_cuda_cores.rs` holds.)
    use luminal::prelude::*;
    let max_k = luminal_cuda::plan::SKINNY_MAX_K as usize;
    for (n, k, dtype) in [
        (513, 2 * max_k, DType::F16),
        (513, 2 * max_k, DType::Q8_0),
        (1025, max_k, DType::BF16),
    ] {
        assert!((n * k) as u64 > luminal_cuda::plan::SKINNY_MAX_WEIGHTS);
        let (out, data, skinny) = cases::ones_product(n, k, dtype);
        let HostData::Bytes(bytes) = &data else {
            panic!("random_storage gives bytes")
        };
        let halves = bytes
            .as_slice()
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]));
        let values: Vec<f32> = match dtype {
            DType::F16 => halves
                .map(|h| luminal::half::f16::from_bits(h).to_f32())
                .collect(),
            DType::BF16 => halves
                .map(|h| luminal::half::bf16::from_bits(h).to_f32())
                .collect(),
            _ => {
                let mut v = vec![0f32; n * k];
                luminal::quant::decode(dtype, bytes.as_slice(), &mut v);
                v.iter()
                    .map(|&x| luminal::half::f16::from_f32(x).to_f32())
                    .collect()
            }
        };
        for (i, &o) in out.iter().enumerate() {
            let row = &values[i * k..(i + 1) * k];
            let want: f64 = row.iter().map(|&v| v as f64).sum();
            let abs: f64 = row.iter().map(|&v| v.abs() as f64).sum();
            assert!(
                (o as f64 - want).abs() <= 1e-5 * abs + 1e-6,
                "{dtype} {n} x {k} row {i}: want {want}, got {o}"
            );
        }
        assert_eq!(skinny, 1, "{dtype} {n} x {k}");
    }
}
