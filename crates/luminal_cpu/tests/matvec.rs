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

// Block-quantized weights read in place: see `tests/quant.rs`.
