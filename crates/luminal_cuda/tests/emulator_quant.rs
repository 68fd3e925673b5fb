//! Quantized and half weights: raw blocks uploaded as bytes (`HostData::Bytes`) and read only
//! by a cast to a float type (`w.dequantize()`), through the cast's view. The generated
//! kernels (the prelude's `lum_deq_<type>`) must give the core's decoders' values bit for bit;
//! run by the host emulator against the reference runtime, which dequantizes with those
//! decoders. `gpu_dequantizing_casts` runs the same checks on a GPU.

use luminal::prelude::*;
use luminal_cuda::{HostEmulatorBackend, HostEmulatorCooperative};

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

/// The block types the linear-layer cases run over: those the skinny kernel reads in place
/// (the legacy 32-value blocks, Q3_K-Q6_K) and Q2_K, which goes through the f16 copy.
const LINEAR_TYPES: [DType; 8] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

/// A linear layer over each block type: the weight dequantized once into an f16 copy that the
/// (emulated) cuBLAS reads with f16-rounded activations, again only after the weight is set
/// again; as the cast + f32 product without half products.
fn quantized_linear_layers<E, B>(backend: impl Fn() -> B, rounds: bool)
where
    E: luminal_cuda::plan::Executor,
    B: Backend<Runtime = luminal_cuda::plan::PlanRuntime<E>>,
{
    for dt in LINEAR_TYPES {
        let (copies, half) = quant_cases::quantized_linear(backend(), dt);
        println!("{dt} linear: f16 copies written per run {copies:?}, half products {half}");
        assert_eq!(half, rounds, "{dt}: products through the f16 copy");
        // The weight is dequantized when it was set (runs 0 and 2) only.
        let want = if rounds { [1, 0, 1] } else { [0, 0, 0] };
        assert_eq!(copies, want, "{dt}");
    }
}

/// Decode-shaped products over each block type: Q8_0/Q4_0/Q4_1 and Q3_K-Q6_K blocks read in
/// place by one grouped skinny launch, Q2_K through an f16 copy (a dequantizing launch before each
/// product in the first run, then one grouped launch).
fn quantized_decode_products<E, B>(backend: impl Fn() -> B)
where
    E: luminal_cuda::plan::Executor,
    B: Backend<Runtime = luminal_cuda::plan::PlanRuntime<E>>,
{
    for dt in LINEAR_TYPES {
        // Rows of 10 blocks (not whole 16-byte pieces: the block-a-lane path), and of 40
        // (the chunked path: a full chunk of 32 blocks and a partial one).
        let ks = [2 * dt.block_size().max(160), 1280];
        for (m, k) in [1, 3].into_iter().flat_map(|m| ks.map(|k| (m, k))) {
            let (launches, skinny) = quant_cases::quantized_decode(backend(), dt, m, k);
            println!(
                "{dt} decode m {m} k {k}: launches per run {launches:?}, {skinny} skinny products"
            );
            assert_eq!(skinny, 3, "{dt} m {m} k {k}");
            let in_place = matches!(
                dt,
                DType::Q8_0
                    | DType::Q4_0
                    | DType::Q4_1
                    | DType::Q3_K
                    | DType::Q4_K
                    | DType::Q5_K
                    | DType::Q6_K
            );
            assert_eq!(
                launches,
                [if in_place { 1 } else { 6 }, 1],
                "{dt} m {m} k {k}"
            );
        }
    }
}

#[test]
fn quantized_decode_products_read_blocks_in_place() {
    quantized_decode_products(|| HostEmulatorBackend);
}

#[test]
fn quantized_decode_products_with_warps_emulated() {
    // The skinny kernels' GPU branch (block decoding per lane) on OpenMP threads.
    quantized_decode_products(|| HostEmulatorCooperative);
}

#[test]
fn k_quant_views_read_in_place_only_on_whole_super_blocks() {
    // Decode products over column slices of a [24, 512] K-quant weight, on the cooperative
    // emulator: at 256..512 the rows are whole super-blocks (read in place); at 32..288 they
    // are not (dequantized first). Both against the reference.
    for dt in [DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        for (start, in_place) in [(256, true), (32, false)] {
            let cx = Graph::new();
            let x = cx.tensor("x", (2, 256));
            let w = cx.input("w", (24, 512), dt);
            let y = x
                .matmul(
                    w.cast(DType::F32)
                        .slice(1, start, start + 256)
                        .permute([1, 0]),
                )
                .output();
            let mut rt = cx
                .compile(HostEmulatorCooperative, CompileOptions::default())
                .unwrap();
            let inputs = [
                (w, quant_cases::random_storage(dt, 24 * 512, 5)),
                (x, HostData::F32(common::data(2 * 256, 6))),
            ];
            let (want, got) = quant_cases::run_both(&cx, HostEmulatorCooperative, &inputs, &[y])
                .pop()
                .unwrap();
            for (t, d) in &inputs {
                rt.set_data(*t, d.clone()).unwrap();
            }
            rt.run().unwrap();
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                // Activations rounded to f16 (2^-11 relative) over 256 products.
                assert!(
                    (a - b).abs() <= 2e-3 * scale.max(1e-6),
                    "{dt} columns {start}..: element {i}: want {a}, got {b}"
                );
            }
            // In place: the skinny launch alone; else the f16 copy's launch before it.
            let launches = rt.launches();
            assert_eq!(
                launches == 1,
                in_place,
                "{dt} columns {start}..: {launches} launches"
            );
        }
    }
}

#[test]
fn quantized_weights_are_dequantized_once_into_f16() {
    quantized_linear_layers(|| HostEmulatorBackend, true);
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
            quantized_linear_layers(|| b.clone(), true);
            quantized_linear_layers(|| b.clone().without_half_products(), false);
            quantized_decode_products(|| b.clone());
        }
        Err(e) => eprintln!("skipping the GPU dequantization checks: {e}"),
    }
}
