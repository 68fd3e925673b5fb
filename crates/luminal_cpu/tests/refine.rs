//! The default int8 policy refines graph outputs: a skinny product with a quantized weight
//! whose result is a graph output (the logits) is computed with int8 activations, then the
//! 32 largest entries of each row are recomputed with f32 activations. Checked against the
//! exact dot of the dequantized weights (the core's decoders) computed here in f64: the 32
//! largest returned entries are exact (f32 summation bound `1e-5 · Σ|x·w|`), every other
//! entry stays within the int8 rounding bound `Σ|w| · d / 2` (`d` per group of 16), and the
//! argmax is the exact one.

mod blocks_common;

use blocks_common::Rng;
use half::f16;
use luminal::prelude::*;
use luminal::quant::decode;
use luminal_cpu::{detected_isa, set_max_isa, CpuBackend, Isa, QuantDots};

/// Random blocks (random quants; the f16 scale at `scale_at` made small and finite).
fn random_blocks(dtype: DType, n: usize, scale_at: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b: Vec<u8> = (0..dtype.bytes_for(n).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    for blk in b.chunks_exact_mut(dtype.block_bytes()) {
        let s = f16::from_f32(rng.uniform() * 0.1 + 0.001);
        blk[scale_at..scale_at + 2].copy_from_slice(&s.to_bits().to_le_bytes());
    }
    b
}

#[test]
fn refined_logits_are_exact_where_they_matter() {
    let mut levels = vec![Isa::Generic, Isa::Avx2, Isa::Avx512];
    levels.retain(|&l| l <= detected_isa());
    let cases = [
        (DType::Q4_0, 0, 96),
        (DType::Q8_0, 0, 64),
        (DType::Q6_K, 208, 256),
    ];
    for isa in levels {
        set_max_isa(isa);
        for (c, &(dtype, scale_at, k)) in cases.iter().enumerate() {
            for (m, threads) in [(1, 1), (3, 2)] {
                let n = 300;
                let mut rng = Rng(0x9e37 + c as u64);
                let wb = random_blocks(dtype, n * k, scale_at, &mut rng);
                let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 2.0 - 1.0).collect();
                let mut w = vec![0f32; n * k];
                decode(dtype, &wb, &mut w);
                let cx = Graph::new();
                let xt = cx.tensor("x", (m, k));
                let wt = cx.input("w", (n, k), dtype);
                let y = xt.matmul(wt.dequantize().transpose(0, 1)).output();
                let backend = CpuBackend::with_threads(threads);
                assert_eq!(backend.quant_dots, QuantDots::Int8RefineOutputs);
                let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
                rt.set(xt, &x).unwrap();
                let data = HostData::from_bytes(dtype, SharedBytes::from_vec(wb)).unwrap();
                rt.set_data(wt, data).unwrap();
                rt.run().unwrap();
                let got: Vec<f32> = rt.get(y).unwrap();
                let what = format!("{isa:?} {dtype} M={m} threads={threads}");
                for i in 0..m {
                    let row = &x[i * k..(i + 1) * k];
                    // Per group of 16: the int8 scale the kernel uses.
                    let d: Vec<f64> = row
                        .chunks(16)
                        .map(|g| g.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0)
                        .collect();
                    let mut exact = vec![];
                    for j in 0..n {
                        let wr = &w[j * k..(j + 1) * k];
                        let dot: f64 = row.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mag: f64 = row
                            .iter()
                            .zip(wr)
                            .map(|(&a, &b)| (a * b).abs() as f64)
                            .sum();
                        let rounding: f64 = wr
                            .iter()
                            .enumerate()
                            .map(|(q, v)| v.abs() as f64 * d[q / 16] / 2.0)
                            .sum();
                        exact.push((dot, mag, rounding));
                    }
                    let out = &got[i * n..(i + 1) * n];
                    let mut order: Vec<usize> = (0..n).collect();
                    order.sort_by(|&p, &q| out[q].total_cmp(&out[p]));
                    for (rank, &j) in order.iter().enumerate() {
                        let (want, mag, rounding) = exact[j];
                        let g = out[j] as f64;
                        if rank < 32 {
                            assert!(
                                (g - want).abs() <= 1e-5 * mag + 1e-6,
                                "{what}: row {i} rank {rank} [{j}] = {g}, want exactly {want}"
                            );
                        } else {
                            assert!(
                                (g - want).abs() <= rounding * 1.0001 + 1e-5 * mag + 1e-6,
                                "{what}: row {i} [{j}] = {g}, want {want} within {rounding}"
                            );
                        }
                    }
                    let best = (0..n).max_by(|&p, &q| exact[p].0.total_cmp(&exact[q].0));
                    assert_eq!(Some(order[0]), best, "{what}: row {i} argmax");
                }
            }
        }
    }
    set_max_isa(detected_isa());
}
