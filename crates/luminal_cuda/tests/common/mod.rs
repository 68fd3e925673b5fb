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
