//! Checks shared by the emulator and GPU test binaries.
#![allow(dead_code)]

pub mod attention;
pub mod matmul;
pub mod quant;

/// Deterministic values in [-2, 2) that are not all small integers (xorshift32).
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 4000) as f32 / 1000.0 - 2.0
        })
        .collect()
}

/// Linear layers over the same activations: `x [m, k]` (f32) and one `[n, k]` weight of
/// `dtype` per entry of `rows`, each read as `x · Wᵀ` through a widening cast (a layer's q, k,
/// v projections). Returns `x`, the weights and the outputs.
pub fn shared_linears<'g>(
    cx: &'g luminal::prelude::Graph,
    (m, k): (usize, usize),
    rows: &[usize],
    dtype: luminal::DType,
) -> (
    luminal::prelude::GraphTensor<'g>,
    Vec<luminal::prelude::GraphTensor<'g>>,
    Vec<luminal::prelude::GraphTensor<'g>>,
) {
    use luminal::DType;
    let x = cx.tensor("x", (m, k));
    let ws: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, &n)| cx.input(&format!("w{i}"), (n, k), dtype))
        .collect();
    let ys = ws
        .iter()
        .map(|w| x.matmul(w.cast(DType::F32).permute([1, 0])).output())
        .collect();
    (x, ws, ys)
}
