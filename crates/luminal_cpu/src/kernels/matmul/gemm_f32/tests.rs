//! Checks of the f32 GEMM against f64 products.

use super::*;

fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                c[i * n + j] += a[i * k + kk] as f64 * b[kk * n + j] as f64;
            }
        }
    }
    c
}

fn vals(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(747796405).wrapping_add(2891336453);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(747796405).wrapping_add(2891336453);
            ((s >> 9) as f32 / (1u32 << 23) as f32) - 0.5
        })
        .collect()
}

/// `sgemm_acc` on slices: operands as (data, row stride, column stride).
fn product(
    (m, n, k): (usize, usize, usize),
    (a, a_rs, a_cs): (&[f32], usize, usize),
    (b, b_rs, b_cs): (&[f32], usize, usize),
    c: &mut [f32],
    c_rs: usize,
    accumulate: bool,
) {
    assert!(c.len() >= (m - 1) * c_rs + n);
    let mat = |p: &[f32], rs: usize, cs: usize| Mat {
        ptr: p.as_ptr(),
        rs: rs as isize,
        cs: cs as isize,
    };
    // SAFETY: the strides address `m × k` / `k × n` elements inside `a` / `b` (the test
    // builds them so), and `c` holds the `m × n` output rows `c_rs` apart (asserted).
    unsafe {
        sgemm_acc(
            m,
            n,
            k,
            mat(a, a_rs, a_cs),
            mat(b, b_rs, b_cs),
            c.as_mut_ptr(),
            c_rs,
            accumulate,
        )
    }
}

/// Every level the CPU has, edge tiles in M, N and K, strided and transposed operands.
#[test]
fn matches_a_naive_product() {
    let levels = [Isa::Generic, Isa::Avx2, Isa::Avx512];
    let before = isa();
    for &level in &levels {
        if crate::simd::set_max_isa(level) != level {
            continue;
        }
        for &(m, n, k) in &[
            (1, 1, 1),
            (5, 7, 3),
            (16, 32, 256),
            (17, 33, 257),
            (150, 70, 300),
            (40, 1030, 20),
            (3, 2049, 9),
            // At most 64 columns: A is read in place (row- or column-major), in
            // row blocks (tall ones: several blocks, a partial last tile, K slices).
            (64, 16, 64),
            (30, 64, 100),
            (7, 40, 520),
            (300, 64, 70),
            (1030, 40, 300),
        ] {
            let a = vals(m * k, 1);
            let b = vals(k * n, 2);
            let want = naive(m, n, k, &a, &b);
            // Row-major A and B.
            let mut c = vec![f32::NAN; m * n];
            product((m, n, k), (&a, k, 1), (&b, n, 1), &mut c, n, false);
            // Transposed storage of both (A column-major, B as Bᵀ row-major), output
            // with a row stride wider than n.
            let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
            let mut c2 = vec![f32::NAN; m * (n + 3)];
            product((m, n, k), (&at, 1, m), (&bt, 1, k), &mut c2, n + 3, false);
            // Accumulating into the first result doubles it.
            let mut c3 = c.clone();
            product((m, n, k), (&a, k, 1), (&b, n, 1), &mut c3, n, true);
            for i in 0..m * n {
                let w = 2.0 * want[i];
                assert!(
                    (c3[i] as f64 - w).abs() <= 2e-5 * (k as f64).sqrt() + 2e-6,
                    "{level:?} {m}×{n}×{k} accumulate [{i}]: {} vs {w}",
                    c3[i]
                );
            }
            for i in 0..m {
                for j in 0..n {
                    let w = want[i * n + j];
                    let tol = 1e-5 * (k as f64).sqrt() + 1e-6;
                    for (got, what) in [
                        (c[i * n + j], "row-major"),
                        (c2[i * (n + 3) + j], "transposed"),
                    ] {
                        assert!(
                            (got as f64 - w).abs() <= tol,
                            "{level:?} {m}×{n}×{k} {what} [{i},{j}]: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }
    crate::simd::set_max_isa(before);
}

/// A row's result does not depend on how many rows are computed with it, at every
/// level: the first 10 rows of a 34-row product equal a 10-row product bit for bit (a
/// prefill of 10 tokens against a full recompute; with a quantized KV cache a last-bit
/// difference can move a key across a rounding boundary). Shapes include a quantized
/// product's decoded tile (n = 16, K = 1536), products whose A is read in place (at most
/// 64 columns) and one whose A is packed (80 columns).
#[test]
fn rows_do_not_depend_on_the_rows_beside_them() {
    let before = isa();
    for level in [Isa::Generic, Isa::Avx2, Isa::Avx512] {
        if crate::simd::set_max_isa(level) != level {
            continue;
        }
        for &(n, k) in &[(16, 1536), (40, 300), (64, 576), (33, 257), (80, 300)] {
            let a = vals(34 * k, 3);
            let b = vals(k * n, 4);
            // B row-major, and as Bᵀ row-major (a weight's rows, as the quantized
            // products decode them).
            for (b_rs, b_cs) in [(n, 1), (1, k)] {
                let mut all = vec![f32::NAN; 34 * n];
                let mut few = vec![f32::NAN; 10 * n];
                product((34, n, k), (&a, k, 1), (&b, b_rs, b_cs), &mut all, n, false);
                product((10, n, k), (&a, k, 1), (&b, b_rs, b_cs), &mut few, n, false);
                let same = all[..10 * n]
                    .iter()
                    .zip(&few)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{level:?} n {n} k {k} B strides ({b_rs}, {b_cs}): 10 rows differ from the first 10 of 34"
                );
            }
        }
    }
    crate::simd::set_max_isa(before);
}
