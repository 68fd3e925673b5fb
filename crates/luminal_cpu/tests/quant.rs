//! Quantized and half weights read in place: every block format in a matmul (`x · Wᵀ`) and
//! a gather (embedding rows), on the CPU at every instruction-set level the host has, and on
//! the reference runtime, against dequantize-then-f64-matmul computed here with the core's
//! decoders (which `luminal_io`'s tests check bit for bit against gguf-py's, fixture
//! `quant_blocks.json`).
//!
//! Bound: the kernels sum f32 products in their own order (and the wide path runs gemm on the
//! decoded rows), so each output may differ from the exact sum by `1e-5 · Σ|x·w|`.
//!
//! With `QuantDots::Int8`, products with block-quantized weights quantize the activations per
//! group of 16 to int8 (ggml's Q8_0 scheme on half blocks: `d = max|x| / 127`,
//! `q = round(x / d)`, ties to even): skinny products (M ≤ 8, decode) at every level, and
//! wide ones (M = 13, 128: prefill) where the level has AVX-512 VNNI (the span layout) or
//! AVX2 (register tiles; every format but Q2_K); elsewhere they keep f32 activations and
//! `gemm`. There each output
//! must equal, within the same `1e-5` bound, the dot of the weights with the activations
//! quantized that way (computed here), and differ from the exact dot by at most
//! `Σ |w| · d / 2` (the activation rounding). Skinny products with the 32-value block
//! formats on the SIMD paths quantize in two levels (`luminal_cpu::skinny_activation_levels`:
//! each rounding residual quantized again with the step `d / 256`, clamped to ±127 steps);
//! the reference here does the same, and the rounding bound is then `Σ |w| · d / 256`
//! (a whole step: a clamped residual). `QuantDots::F32` keeps f32 activations; the
//! default policy refines a product that is a graph output, as here (checked for a wide
//! product below).

mod blocks_common;

use blocks_common::{random_blocks, Rng};
use luminal::prelude::*;
use luminal::quant::decode;
use luminal_cpu::{
    amx_int8, detected_isa, set_activation_levels, set_amx_int8, set_max_isa,
    skinny_activation_levels, CpuBackend, Isa, QuantDots,
};

/// Every quantized dtype, and the half types (the weight formats read in place).
fn formats() -> Vec<DType> {
    luminal::dtype::ALL_DTYPES
        .into_iter()
        .filter(|d| d.is_quantized() || matches!(d, DType::F16 | DType::BF16))
        .collect()
}

fn decoded(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / dtype.block_bytes() * dtype.block_size()];
    decode(dtype, bytes, &mut out);
    out
}

/// Builds `x · W.dequantize()ᵀ` and runs it on `rt`-compatible backends.
fn check_matmul<B: Backend>(
    backend: B,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
    what: &str,
    ablock: Option<usize>,
    levels: usize,
) {
    let mut rng = Rng(seed);
    let wb = random_blocks(dtype, n * k, &mut rng);
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 2.0 - 1.0).collect();
    let w = decoded(dtype, &wb);
    let cx = Graph::new();
    let xt = cx.tensor("x", (m, k));
    let wt = cx.input("w", (n, k), dtype);
    let y = xt.matmul(wt.dequantize().transpose(0, 1)).output();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    rt.set(xt, &x).unwrap();
    rt.set_data(
        wt,
        HostData::from_bytes(dtype, SharedBytes::from_vec(wb)).unwrap(),
    )
    .unwrap();
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(y).unwrap();
    let ablock = ablock.filter(|_| dtype.is_quantized());
    let int8 = ablock.is_some();
    let ab = ablock.unwrap_or(16);
    let (xq, xd) = int8_activations(&x, k, ab, levels);
    for i in 0..m {
        for j in 0..n {
            let (mut want, mut mag, mut want_q, mut mag_q, mut rounding) =
                (0f64, 0f64, 0f64, 0f64, 0f64);
            for kk in 0..k {
                let wv = w[j * k + kk] as f64;
                let p = x[i * k + kk] as f64 * wv;
                want += p;
                mag += p.abs();
                let pq = xq[i * k + kk] as f64 * wv;
                want_q += pq;
                mag_q += pq.abs();
                // Half a step; a whole one when the second level clamped.
                rounding += wv.abs() * xd[(i * k + kk) / ab] * if levels == 2 { 1.0 } else { 0.5 };
            }
            let g = got[i * n + j] as f64;
            if int8 {
                assert!(
                    (g - want_q).abs() <= 1e-5 * mag_q + 1e-6,
                    "{what} {dtype} M={m} N={n} K={k}: [{i},{j}] = {g}, want {want_q} with int8 activations (Σ|xw| = {mag_q})"
                );
                assert!(
                    (g - want).abs() <= rounding * 1.0001 + 1e-5 * mag + 1e-6,
                    "{what} {dtype} M={m} N={n} K={k}: [{i},{j}] = {g}, want {want} within the activation rounding {rounding}"
                );
            } else {
                assert!(
                    (g - want).abs() <= 1e-5 * mag + 1e-6,
                    "{what} {dtype} M={m} N={n} K={k}: [{i},{j}] = {g}, want {want} (Σ|xw| = {mag})"
                );
            }
        }
    }
}

/// `x` (rows of `k`) quantized per group of `ablock` (16, or 32 as ggml's Q8_0) as ggml's
/// Q8_0 does per block of 32, dequantized again; and each group's rounding step.
///
/// Two levels (`levels == 2`, `luminal_cpu::skinny_activation_levels`): each value's
/// rounding residual `r = x − d·q` is quantized again with the step `d / 256` (clamped to
/// ±127 steps), so the value is `d·q + (d / 256)·q₂`; the step is then `d / 256`.
fn int8_activations(x: &[f32], k: usize, ablock: usize, levels: usize) -> (Vec<f32>, Vec<f64>) {
    assert!(k % 32 == 0);
    let (mut xq, mut scales) = (vec![], vec![]);
    for blk in x.chunks(ablock) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for &v in blk {
            let q = (v * id).round_ties_even();
            if levels == 2 {
                let s = if d > 0.0 { 256.0 / d } else { 0.0 };
                let q2 = ((v - d * q) * s).round_ties_even().clamp(-127.0, 127.0);
                xq.push(((d as f64 * q as f64) + (d as f64 / 256.0) * q2 as f64) as f32);
            } else {
                xq.push(d * q);
            }
        }
        scales.push(if levels == 2 {
            d as f64 / 256.0
        } else {
            d as f64
        });
    }
    (xq, scales)
}

/// The shapes of the issue: M = 1, 7, 13, 128; K one block and several blocks (for the 32-value
/// formats, Ks that are not multiples of the 64- and 128-value SIMD steps).
fn shapes(dtype: DType) -> Vec<(usize, usize, usize)> {
    let bs = dtype.block_size().max(32);
    // 32-value formats: also 5 and 18 blocks (the four-block SIMD steps and a tail);
    // super-block formats: 1, 2, 3 and 9 super-blocks (K = 256, 512, 768, 2304).
    let ks = if bs == 32 {
        vec![bs, 3 * bs, 5 * bs, 18 * bs]
    } else {
        vec![bs, 2 * bs, 3 * bs, 9 * bs]
    };
    let mut v = vec![];
    for m in [1, 7, 13, 128] {
        for &k in &ks {
            v.push((m, 37, k));
        }
    }
    v
}

/// Held by the tests that depend on the instruction-set cap (a process-wide setting).
static ISA_CAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The activation block of wide products with `dtype` weights at `isa` (with the current
/// AMX setting), if they take int8 activations: 32 on AMX-INT8 tiles; 16 with AVX-512
/// VNNI, or AVX2 (the register tiles) for every block format but Q2_K.
fn wide_int8(isa: Isa, dtype: DType) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni");
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    let tiles = dtype.is_quantized() && dtype != DType::Q2_K;
    if !dtype.is_quantized() {
        return None;
    }
    if isa == Isa::Avx512 && vnni && amx_int8() {
        return Some(32);
    }
    ((isa == Isa::Avx512 && vnni) || (isa >= Isa::Avx2 && tiles)).then_some(16)
}

/// The instruction-set levels the host has, each with AMX off, and AVX-512 also with AMX
/// on where the host has AMX-INT8 (the AVX-512 VNNI kernels and the AMX tiles both).
fn levels_with_amx(mut levels: Vec<Isa>) -> Vec<(Isa, bool)> {
    set_amx_int8(Some(true));
    set_max_isa(detected_isa());
    let amx = amx_int8();
    set_amx_int8(None);
    if levels.is_empty() {
        levels.push(detected_isa());
    }
    let mut out: Vec<(Isa, bool)> = levels.iter().map(|&l| (l, false)).collect();
    if amx && levels.contains(&Isa::Avx512) {
        out.push((Isa::Avx512, true));
    }
    out
}

/// Every SIMD level the host has, portable first.
fn simd_levels() -> Vec<Isa> {
    [Isa::Generic, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&l| l <= detected_isa())
        .collect()
}

#[test]
fn weight_matmuls_match_dequantize_then_matmul_at_every_isa() {
    let _cap = ISA_CAP.lock().unwrap_or_else(|e| e.into_inner());
    let levels = simd_levels();
    assert_eq!(formats().len(), 12, "10 block types + f16 + bf16");
    let configs = levels_with_amx(levels);
    for ((isa, amx), int8) in configs.into_iter().flat_map(|l| [(l, true), (l, false)]) {
        assert_eq!(set_max_isa(isa), isa);
        set_amx_int8(Some(amx));
        for (f, dtype) in formats().into_iter().enumerate() {
            for (s, &(m, n, k)) in shapes(dtype).iter().enumerate() {
                for threads in [1, 2] {
                    let seed = 1 + (f * 100 + s) as u64;
                    let what = format!("{isa:?} amx={amx} int8={int8} threads={threads}");
                    // The default keeps f32 activations here: the product is the output.
                    let dots = if int8 {
                        QuantDots::Int8
                    } else {
                        QuantDots::F32
                    };
                    check_matmul(
                        CpuBackend::with_threads(threads).quant_dots(dots),
                        dtype,
                        m,
                        n,
                        k,
                        seed,
                        &what,
                        if !int8 {
                            None
                        } else if m <= 8 {
                            Some(16)
                        } else {
                            wide_int8(isa, dtype)
                        },
                        if m <= 8 {
                            luminal_cpu::skinny_activation_levels(dtype)
                        } else {
                            1
                        },
                    );
                }
            }
        }
    }
    set_amx_int8(None);
    set_max_isa(Isa::Avx512);
}

/// One and two activation levels, forced process-wide (`set_activation_levels`), in decode
/// products of a 32-value block format at every SIMD level the host has: each matches the
/// reference quantized with that many levels (and the portable path keeps one).
#[test]
fn activation_levels_can_be_chosen() {
    let _cap = ISA_CAP.lock().unwrap_or_else(|e| e.into_inner());
    let levels = simd_levels();
    for isa in levels {
        assert_eq!(set_max_isa(isa), isa);
        for want in [1u8, 2] {
            set_activation_levels(Some(want));
            let got = skinny_activation_levels(DType::Q4_1);
            let simd = isa != Isa::Generic;
            assert_eq!(got, if simd { want as usize } else { 1 }, "{isa:?}");
            assert_eq!(skinny_activation_levels(DType::Q4_K), 1, "{isa:?}");
            for (m, k) in [(1, 96), (3, 576)] {
                let backend = CpuBackend::with_threads(2).quant_dots(QuantDots::Int8);
                let what = format!("{isa:?} levels={want}");
                check_matmul(backend, DType::Q4_1, m, 37, k, 11, &what, Some(16), got);
            }
        }
    }
    set_activation_levels(None);
    set_max_isa(detected_isa());
}

/// The default policy on a wide product that is a graph output (a prefill's logits): int8
/// activations, then the 32 largest entries of every row recomputed with f32 activations —
/// at least 32 exact entries a row, the rest within the int8 rounding, the argmax the exact
/// one. (A refined entry may fall below an unrefined one: the final top 32 need not all be
/// exact.)
#[test]
fn wide_graph_outputs_are_refined() {
    let _cap = ISA_CAP.lock().unwrap_or_else(|e| e.into_inner());
    set_max_isa(detected_isa());
    let (m, n) = (20, 300);
    for (c, (dtype, k)) in [(DType::Q4_0, 96), (DType::Q6_K, 256)]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng(0x51 + c as u64);
        let wb = random_blocks(dtype, n * k, &mut rng);
        let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 2.0 - 1.0).collect();
        let w = decoded(dtype, &wb);
        let cx = Graph::new();
        let xt = cx.tensor("x", (m, k));
        let wt = cx.input("w", (n, k), dtype);
        let y = xt.matmul(wt.dequantize().transpose(0, 1)).output();
        let backend = CpuBackend::with_threads(2);
        assert_eq!(backend.quant_dots, QuantDots::Int8RefineOutputs);
        let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
        rt.set(xt, &x).unwrap();
        let data = HostData::from_bytes(dtype, SharedBytes::from_vec(wb)).unwrap();
        rt.set_data(wt, data).unwrap();
        rt.run().unwrap();
        let got: Vec<f32> = rt.get(y).unwrap();
        let ab = wide_int8(detected_isa(), dtype).unwrap_or(16);
        let (_, xd) = int8_activations(&x, k, ab, 1);
        let mut total = 0;
        for i in 0..m {
            let mut refined = 0;
            let out = &got[i * n..(i + 1) * n];
            let mut best = (f64::NEG_INFINITY, 0);
            for (j, &g) in out.iter().enumerate() {
                let (mut want, mut mag, mut rounding) = (0f64, 0f64, 0f64);
                for kk in 0..k {
                    let p = x[i * k + kk] as f64 * w[j * k + kk] as f64;
                    want += p;
                    mag += p.abs();
                    rounding += (w[j * k + kk] as f64).abs() * xd[(i * k + kk) / ab] / 2.0;
                }
                if want > best.0 {
                    best = (want, j);
                }
                let g = g as f64;
                refined += ((g - want).abs() <= 1e-5 * mag + 1e-6) as usize;
                assert!(
                    (g - want).abs() <= rounding * 1.0001 + 1e-5 * mag + 1e-6,
                    "{dtype} row {i} [{j}] = {g}, want {want} within {rounding}"
                );
            }
            assert!(refined >= 32, "{dtype} row {i}: {refined} exact entries");
            let argmax = (0..n).max_by(|&p, &q| out[p].total_cmp(&out[q]));
            assert_eq!(argmax, Some(best.1), "{dtype} row {i} argmax");
            total += refined;
        }
        if wide_int8(detected_isa(), dtype).is_some() {
            // The rest carries the int8 rounding (the product did take the int8 path).
            assert!(total < m * n / 2, "{dtype}: {total} of {} exact", m * n);
        } else {
            assert_eq!(total, m * n, "{dtype}: f32 activations");
        }
    }
}

#[test]
fn weights_are_read_in_place() {
    // The cast folds into the consumers: one matmul and one gather kernel, no dequantize.
    let cx = Graph::new();
    let w = cx.input("w", (64, 256), DType::Q4_K);
    let ids = cx.input("ids", (2,), DType::I32);
    let x = w.dequantize().embedding(ids);
    let y = x.matmul(w.dequantize().transpose(0, 1)).output();
    let rt = cx
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    assert_eq!(
        rt.kernel_names(),
        vec!["gather", "matmul"],
        "{:?}",
        rt.kernel_names()
    );
    let _ = y;
}

#[test]
fn reference_runtime_dequantizes() {
    for (f, dtype) in formats().into_iter().enumerate() {
        let bs = dtype.block_size().max(32);
        check_matmul(
            ReferenceBackend,
            dtype,
            3,
            5,
            bs,
            7 + f as u64,
            "reference",
            None,
            1,
        );
    }
}

#[test]
fn gathers_decode_rows_exactly() {
    for (f, dtype) in formats().into_iter().enumerate() {
        let mut rng = Rng(99 + f as u64);
        let (rows, width) = (40, 2 * dtype.block_size().max(32));
        let wb = random_blocks(dtype, rows * width, &mut rng);
        let w = decoded(dtype, &wb);
        let ids: Vec<i32> = vec![3, 0, 39, 3, 17];
        for threads in [1, 2] {
            let cx = Graph::new();
            let table = cx.input("table", (rows, width), dtype);
            let idt = cx.input("ids", (ids.len(),), DType::I32);
            let out = table.dequantize().embedding(idt).output();
            let mut rt = cx
                .compile(CpuBackend::with_threads(threads), CompileOptions::default())
                .unwrap();
            rt.set_data(
                table,
                HostData::from_bytes(dtype, SharedBytes::from_vec(wb.clone())).unwrap(),
            )
            .unwrap();
            rt.set(idt, &ids).unwrap();
            rt.run().unwrap();
            let got: Vec<f32> = rt.get(out).unwrap();
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&r| w[r as usize * width..(r as usize + 1) * width].to_vec())
                .collect();
            assert_eq!(got, want, "{dtype}");
            // Out-of-range ids are a typed error, as on the reference.
            rt.set(idt, &[0, 40, 1, 2, 3]).unwrap();
            assert!(matches!(
                rt.run(),
                Err(LuminalError::IndexOutOfRange { .. })
            ));
        }
    }
}

#[test]
fn other_reads_of_quantized_data_decode_through_the_view() {
    // A transposed elementwise use: neither a matmul nor a gather reads it in place.
    for &dtype in &[DType::Q4_1, DType::Q6_K] {
        let mut rng = Rng(5);
        let (rows, width) = (3, dtype.block_size());
        let wb = random_blocks(dtype, rows * width, &mut rng);
        let w = decoded(dtype, &wb);
        let cx = Graph::new();
        let t = cx.input("t", (rows, width), dtype);
        let out = (t.dequantize().transpose(0, 1) * 2.0).output();
        let mut rt = cx
            .compile(CpuBackend::with_threads(1), CompileOptions::default())
            .unwrap();
        rt.set_data(
            t,
            HostData::from_bytes(dtype, SharedBytes::from_vec(wb)).unwrap(),
        )
        .unwrap();
        rt.run().unwrap();
        let got: Vec<f32> = rt.get(out).unwrap();
        for c in 0..width {
            for r in 0..rows {
                assert_eq!(got[c * rows + r], w[r * width + c] * 2.0, "{dtype}");
            }
        }
    }
}

#[test]
fn bad_quantized_data_is_a_typed_error() {
    let cx = Graph::new();
    let w = cx.input("w", (4, 32), DType::Q4_0);
    let x = cx.tensor("x", (1, 32));
    let _y = x.matmul(w.dequantize().transpose(0, 1)).output();
    let mut rt = cx
        .compile(CpuBackend::default(), CompileOptions::default())
        .unwrap();
    // Not a whole number of blocks.
    let err = HostData::from_bytes(DType::Q4_0, SharedBytes::from_vec(vec![0; 19])).unwrap_err();
    assert!(matches!(err, LuminalError::BadData(_)), "{err}");
    // Three rows' blocks for a four-row weight.
    let short = HostData::from_bytes(DType::Q4_0, SharedBytes::from_vec(vec![0; 3 * 18])).unwrap();
    assert!(matches!(
        rt.set_data(w, short),
        Err(LuminalError::WrongLength { .. })
    ));
    // Another format's blocks.
    let q8 = HostData::from_bytes(DType::Q8_0, SharedBytes::from_vec(vec![0; 4 * 34])).unwrap();
    assert!(matches!(
        rt.set_data(w, q8),
        Err(LuminalError::WrongDType { .. })
    ));
}

#[test]
#[should_panic(expected = "quantized tensors are only read through")]
fn arithmetic_on_quantized_tensors_panics_at_build() {
    let cx = Graph::new();
    let w = cx.input("w", (4, 32), DType::Q4_0);
    let _ = w + w;
}

/// Wide products of every row count from 9 to 17 (chunks of eight rows, tails shared by
/// two, four or eight rows: K = 384, 576, 32; AVX2: tiles of four rows) at the detected
/// level and at AVX2.
#[test]
fn wide_products_of_every_row_count() {
    let _cap = ISA_CAP.lock().unwrap_or_else(|e| e.into_inner());
    let mut levels = vec![detected_isa()];
    if detected_isa() > Isa::Avx2 {
        levels.push(Isa::Avx2);
    }
    for (isa, amx) in levels_with_amx(levels) {
        assert_eq!(set_max_isa(isa), isa);
        set_amx_int8(Some(amx));
        for m in 9..=17 {
            for (dtype, k) in [(DType::Q8_0, 384), (DType::Q4_1, 576), (DType::Q5_0, 32)] {
                let backend = CpuBackend::with_threads(2).quant_dots(QuantDots::Int8);
                let what = format!("{isa:?} amx={amx} rows");
                check_matmul(backend, dtype, m, 40, k, 3, &what, wide_int8(isa, dtype), 1);
            }
        }
    }
    set_amx_int8(None);
    set_max_isa(detected_isa());
}
