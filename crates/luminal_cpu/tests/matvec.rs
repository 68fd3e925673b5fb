//! The skinny-product kernel (M ≤ 8, decode steps) against the reference runtime, over odd
//! sizes, batched heads, and thread counts.

use luminal::prelude::*;
use luminal_cpu::CpuBackend;

fn values(n: usize, seed: u32) -> Vec<f32> {
    // A small LCG: deterministic, no dependency.
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn check(batch: usize, m: usize, n: usize, k: usize, threads: usize) {
    let cx = Graph::new();
    let x = cx.tensor("x", (batch, m, k));
    let w = cx.tensor("w", (batch, n, k)); // [out, in] rows: K-contiguous like weights
    let y = x.matmul(w.transpose(1, 2)).output();
    let (xd, wd) = (values(batch * m * k, 1), values(batch * n * k, 2));
    let mut want_rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    want_rt.set(x, &xd).unwrap();
    want_rt.set(w, &wd).unwrap();
    want_rt.run().unwrap();
    rt.set(x, &xd).unwrap();
    rt.set(w, &wd).unwrap();
    rt.run().unwrap();
    let (want, got) = (want_rt.get::<f32>(y).unwrap(), rt.get::<f32>(y).unwrap());
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        let tol = 1e-5 * (k as f32).sqrt() + 1e-5 * e.abs();
        assert!(
            (g - e).abs() <= tol,
            "batch {batch} m {m} n {n} k {k} threads {threads}: element {i} got {g}, want {e}"
        );
    }
}

#[test]
fn skinny_products_match_reference() {
    for &(batch, m, n, k) in &[
        (1, 1, 1, 1),
        (1, 1, 17, 63),
        (1, 1, 300, 64),
        (1, 1, 1536, 577),
        (2, 2, 33, 65),
        (9, 1, 40, 64),
        (1, 3, 129, 130),
        (1, 8, 64, 200),
        (1, 9, 20, 20), // just past the skinny path: gemm
    ] {
        for threads in [1, 2] {
            check(batch, m, n, k, threads);
        }
    }
}

/// Random blocks of `format` with f16 scales of moderate size (no inf/NaN).
fn random_blocks(
    format: luminal_cpu::PackedFormat,
    rows: usize,
    cols: usize,
    seed: u32,
) -> Vec<u8> {
    let bb = format.block_bytes();
    let raw = values(rows * cols / 32 * bb, seed);
    let mut bytes: Vec<u8> = raw.iter().map(|v| ((v + 0.5) * 255.0) as u8).collect();
    let n_f16 = if format == luminal_cpu::PackedFormat::Q4_1 {
        2
    } else {
        1
    };
    for (b, chunk) in bytes.chunks_exact_mut(bb).enumerate() {
        for h in 0..n_f16 {
            let v = half::f16::from_f32(
                0.01 + 0.002 * ((b * 7 + h * 3) % 11) as f32 - 0.005 * h as f32,
            );
            chunk[2 * h..2 * h + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    bytes
}

/// Decode steps that read a weight's block-quantized copy give the product with its f32
/// dequantization (decoded by luminal_io, which is checked against gguf-py).
#[test]
fn packed_weights_match_their_dequantization() {
    use luminal_cpu::{PackedFormat, PackedMatrix};
    use luminal_io::GgmlType;
    for (format, ty) in [
        (PackedFormat::Q4_0, GgmlType::Q4_0),
        (PackedFormat::Q4_1, GgmlType::Q4_1),
        (PackedFormat::Q8_0, GgmlType::Q8_0),
    ] {
        for &(m, n, k) in &[(1, 1, 32), (1, 300, 576), (3, 65, 64), (8, 40, 96)] {
            let bytes = random_blocks(format, n, k, 3);
            let mut wd = vec![0f32; n * k];
            luminal_io::quant::dequantize(ty, &bytes, &mut wd).unwrap();
            let cx = Graph::new();
            let x = cx.tensor("x", (1, m, k));
            let w = cx.tensor("w", (n, k));
            let y = x.matmul(w.transpose(0, 1)).output();
            let xd = values(m * k, 4);
            let mut reference = cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap();
            reference.set(x, &xd).unwrap();
            reference.set(w, &wd).unwrap();
            reference.run().unwrap();
            let want = reference.get::<f32>(y).unwrap();
            for threads in [1, 2] {
                let mut rt = cx
                    .compile(CpuBackend::with_threads(threads), CompileOptions::default())
                    .unwrap();
                rt.set(x, &xd).unwrap();
                rt.set(w, &wd).unwrap();
                rt.set_packed(w, PackedMatrix::new(format, n, k, bytes.clone()).unwrap())
                    .unwrap();
                rt.run().unwrap();
                let got = rt.get::<f32>(y).unwrap();
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-5 + 1e-5 * e.abs(),
                        "{format:?} m {m} n {n} k {k}: element {i} got {g}, want {e}"
                    );
                }
            }
        }
    }
    // Shape mismatch is a typed error.
    let cx = Graph::new();
    let w = cx.tensor("w", (4, 64));
    let _ = cx.tensor("x", (1, 64)).matmul(w.transpose(0, 1)).output();
    let mut rt = cx
        .compile(CpuBackend::default(), CompileOptions::default())
        .unwrap();
    let p = PackedMatrix::new(PackedFormat::Q8_0, 2, 64, vec![0; 2 * 2 * 34]).unwrap();
    assert!(rt.set_packed(w, p).is_err());
    assert!(PackedMatrix::new(PackedFormat::Q8_0, 2, 64, vec![0; 5]).is_err());
}
