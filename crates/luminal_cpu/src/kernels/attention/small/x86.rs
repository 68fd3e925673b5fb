//! The x86 register code of the short-sequence attention kernels (`super`): the small
//! products on AVX-512 / AVX2 register blocks, the key-major backward's vector passes, and
//! a head's 16 × 16 transposes. Each computes what the portable loops of `super` compute,
//! in the same order and with the same roundings.

use super::W;

/// The row blocks of an x86 [`super::gemm`]: blocks of `mr_max` rows (8 or 4: a block never
/// straddles a 16-row boundary, where `k_of`'s causal extents change), each checked once
/// against the operands and handed to `block(rows, k0, k1, a, b, c)` per 16 columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_rows(
    (m, n): (usize, usize),
    mr_max: usize,
    k_of: &dyn Fn(usize, usize) -> (usize, usize),
    (a, ars, acs): (&[f32], usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    block: impl Fn(usize, (usize, usize), *const f32, *const f32, *mut f32),
) {
    assert!(
        n % 16 == 0,
        "small products take whole 16-column blocks, not {n}"
    );
    let mut r0 = 0;
    while r0 < m {
        let mr = (m - r0).min(mr_max);
        let (k0, k1) = k_of(r0, mr);
        if k1 <= k0 {
            for r in r0..r0 + mr {
                c[r * ldc..r * ldc + n].fill(0.0);
            }
            r0 += mr;
            continue;
        }
        // The block's reads: A rows r0.., columns k0..k1; B rows k0..k1, columns ..n;
        // C rows r0.., columns ..n.
        let last_a = (r0 + mr - 1) * ars + (k1 - 1) * acs;
        assert!(last_a < a.len() && (k1 - 1) * ldb + n <= b.len());
        assert!((r0 + mr - 1) * ldc + n <= c.len());
        // SAFETY: in bounds (checked above).
        let (ap, cp) = unsafe { (a.as_ptr().add(r0 * ars), c.as_mut_ptr().add(r0 * ldc)) };
        for j0 in (0..n).step_by(16) {
            // SAFETY: j0 + 16 <= n, in bounds as above.
            let (bp, cj) = unsafe { (b.as_ptr().add(j0), cp.add(j0)) };
            block(mr, (k0, k1), ap, bp, cj);
        }
        r0 += mr;
    }
}

/// [`super::gemm`] on AVX-512 registers: blocks of up to 8 rows by one vector, each B row
/// loaded once per step and A's values broadcast from memory (the portable blocks
/// compiled to a load of B per FMA and a bounds check per A value: a third of the rate).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm_avx512(
    mn: (usize, usize),
    k_of: &dyn Fn(usize, usize) -> (usize, usize),
    (a, ars, acs): (&[f32], usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    gemm_rows(
        mn,
        8,
        k_of,
        (a, ars, acs),
        (b, ldb),
        (c, ldc),
        |mr, k, ap, bp, cp| {
            let (a, b, c) = ((ap, ars, acs), (bp, ldb), (cp, ldc));
            // SAFETY: AVX-512 is enabled here; the block is in bounds (`gemm_rows`).
            unsafe {
                match mr {
                    8 => block_avx512::<8>(k, a, b, c),
                    7 => block_avx512::<7>(k, a, b, c),
                    6 => block_avx512::<6>(k, a, b, c),
                    5 => block_avx512::<5>(k, a, b, c),
                    4 => block_avx512::<4>(k, a, b, c),
                    3 => block_avx512::<3>(k, a, b, c),
                    2 => block_avx512::<2>(k, a, b, c),
                    _ => block_avx512::<1>(k, a, b, c),
                }
            }
        },
    );
}

/// `MR` rows by 16 columns of [`gemm_avx512`]: `c[r·ldc ..] = Σ_{p in k0..k1} a[r·ars +
/// p·acs] · b[p·ldb ..]`, every index in bounds (checked by the caller).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn block_avx512<const MR: usize>(
    (k0, k1): (usize, usize),
    (a, ars, acs): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
) {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); MR];
    for p in k0..k1 {
        let bv = _mm512_loadu_ps(b.add(p * ldb));
        let ar = a.add(p * acs);
        for (r, x) in acc.iter_mut().enumerate() {
            *x = _mm512_fmadd_ps(_mm512_set1_ps(*ar.add(r * ars)), bv, *x);
        }
    }
    for (r, x) in acc.iter().enumerate() {
        _mm512_storeu_ps(c.add(r * ldc), *x);
    }
}

/// [`super::gemm`] on AVX2 registers: blocks of up to 4 rows by two vectors (8 accumulators of
/// the 16 registers).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_avx2(
    mn: (usize, usize),
    k_of: &dyn Fn(usize, usize) -> (usize, usize),
    (a, ars, acs): (&[f32], usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    gemm_rows(
        mn,
        4,
        k_of,
        (a, ars, acs),
        (b, ldb),
        (c, ldc),
        |mr, k, ap, bp, cp| {
            let (a, b, c) = ((ap, ars, acs), (bp, ldb), (cp, ldc));
            // SAFETY: AVX2 and FMA are enabled here; the block is in bounds (`gemm_rows`).
            unsafe {
                match mr {
                    4 => block_avx2::<4>(k, a, b, c),
                    3 => block_avx2::<3>(k, a, b, c),
                    2 => block_avx2::<2>(k, a, b, c),
                    _ => block_avx2::<1>(k, a, b, c),
                }
            }
        },
    );
}

/// [`block_avx512`] with two AVX2 vectors a row.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn block_avx2<const MR: usize>(
    (k0, k1): (usize, usize),
    (a, ars, acs): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for p in k0..k1 {
        let b0 = _mm256_loadu_ps(b.add(p * ldb));
        let b1 = _mm256_loadu_ps(b.add(p * ldb + 8));
        let ar = a.add(p * acs);
        for (r, x) in acc.iter_mut().enumerate() {
            let av = _mm256_set1_ps(*ar.add(r * ars));
            x[0] = _mm256_fmadd_ps(av, b0, x[0]);
            x[1] = _mm256_fmadd_ps(av, b1, x[1]);
        }
    }
    for (r, x) in acc.iter().enumerate() {
        _mm256_storeu_ps(c.add(r * ldc), x[0]);
        _mm256_storeu_ps(c.add(r * ldc + 8), x[1]);
    }
}

/// Rows `..jn` (`sp` apart) of a block of 16 query columns of `Sᵀ`: `x·scale + bias`
/// (rounded as the portable loop: a product, then a sum), stored, and folded into the
/// column maxima `mx`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scale_bias_max(
    pt: *mut f32,
    bt: *const f32,
    (sp, jn): (usize, usize),
    scale: f32,
    mx: &mut [f32; W],
) {
    use std::arch::x86_64::*;
    let sc = _mm512_set1_ps(scale);
    let mut m = _mm512_loadu_ps(mx.as_ptr());
    for j in 0..jn {
        let x = pt.add(j * sp);
        let v = _mm512_add_ps(
            _mm512_mul_ps(_mm512_loadu_ps(x), sc),
            _mm512_loadu_ps(bt.add(j * sp)),
        );
        _mm512_storeu_ps(x, v);
        // `v > m ? v : m`, as the portable loop (a NaN score leaves the maximum).
        m = _mm512_max_ps(v, m);
    }
    _mm512_storeu_ps(mx.as_mut_ptr(), m);
}

/// Rows `..jn` of a block of 16 query columns: `Pᵀ` normalised by the columns' `1 / Σ`
/// (`il`) while `D = Σ_j Pᵀ ⊙ dPᵀ` is summed, then `dSᵀ = Pᵀ ⊙ (dPᵀ − D)·scale` in place
/// of `dPᵀ` (the portable loops' operations and roundings).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn probabilities_grad(
    pt: *mut f32,
    dst: *mut f32,
    (sp, jn): (usize, usize),
    il: &[f32; W],
    scale: f32,
) {
    use std::arch::x86_64::*;
    let il = _mm512_loadu_ps(il.as_ptr());
    let mut dsum = _mm512_setzero_ps();
    for j in 0..jn {
        let p = _mm512_mul_ps(_mm512_loadu_ps(pt.add(j * sp)), il);
        _mm512_storeu_ps(pt.add(j * sp), p);
        dsum = _mm512_fmadd_ps(p, _mm512_loadu_ps(dst.add(j * sp)), dsum);
    }
    let sc = _mm512_set1_ps(scale);
    for j in 0..jn {
        let x = dst.add(j * sp);
        let p = _mm512_loadu_ps(pt.add(j * sp));
        let v = _mm512_mul_ps(
            _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(x), dsum)),
            sc,
        );
        _mm512_storeu_ps(x, v);
    }
}

/// [`scale_bias_max`] with two AVX2 vectors a row.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scale_bias_max_avx2(
    pt: *mut f32,
    bt: *const f32,
    (sp, jn): (usize, usize),
    scale: f32,
    mx: &mut [f32; W],
) {
    use std::arch::x86_64::*;
    let sc = _mm256_set1_ps(scale);
    for h in [0, 8] {
        let mut m = _mm256_loadu_ps(mx.as_ptr().add(h));
        for j in 0..jn {
            let x = pt.add(j * sp + h);
            let v = _mm256_add_ps(
                _mm256_mul_ps(_mm256_loadu_ps(x), sc),
                _mm256_loadu_ps(bt.add(j * sp + h)),
            );
            _mm256_storeu_ps(x, v);
            m = _mm256_max_ps(v, m);
        }
        _mm256_storeu_ps(mx.as_mut_ptr().add(h), m);
    }
}

/// [`probabilities_grad`] with two AVX2 vectors a row.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn probabilities_grad_avx2(
    pt: *mut f32,
    dst: *mut f32,
    (sp, jn): (usize, usize),
    il: &[f32; W],
    scale: f32,
) {
    use std::arch::x86_64::*;
    let sc = _mm256_set1_ps(scale);
    for h in [0, 8] {
        let il = _mm256_loadu_ps(il.as_ptr().add(h));
        let mut dsum = _mm256_setzero_ps();
        for j in 0..jn {
            let p = _mm256_mul_ps(_mm256_loadu_ps(pt.add(j * sp + h)), il);
            _mm256_storeu_ps(pt.add(j * sp + h), p);
            dsum = _mm256_fmadd_ps(p, _mm256_loadu_ps(dst.add(j * sp + h)), dsum);
        }
        for j in 0..jn {
            let x = dst.add(j * sp + h);
            let p = _mm256_loadu_ps(pt.add(j * sp + h));
            let v = _mm256_mul_ps(
                _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(x), dsum)),
                sc,
            );
            _mm256_storeu_ps(x, v);
        }
    }
}

/// `tr[c·tp + r] = src[r·d + c]` for `r < tp`, `c < d` (both multiples of 16), in 16 × 16
/// tiles transposed in registers (the scalar loop stored one value at a time).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose_avx512(src: &[f32], tr: &mut [f32], tp: usize, d: usize) {
    for r0 in (0..tp).step_by(16) {
        for c0 in (0..d).step_by(16) {
            let at = src.as_ptr().add(r0 * d + c0);
            crate::simd::transpose::tile_avx512(at, d, tr.as_mut_ptr().add(c0 * tp + r0), tp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    struct Probe<'a> {
        a: &'a [f32],
        b: &'a [f32],
        c: &'a mut [f32],
        reps: usize,
        ars: usize,
        acs: usize,
    }
    impl Task for Probe<'_> {
        type Output = f64;
        #[inline(always)]
        fn run<const F: bool>(self) -> f64 {
            let t0 = std::time::Instant::now();
            for _ in 0..self.reps {
                gemm::<F>(
                    (64, 16),
                    &|_, _| (0, 64),
                    (self.a, self.ars, self.acs),
                    (self.b, 16),
                    (&mut *self.c, 16),
                );
            }
            t0.elapsed().as_secs_f64()
        }
    }

    /// The register transpose equals the scalar one.
    #[test]
    fn head_transpose_matches_scalar() {
        for (rows, d) in [(64usize, 16usize), (37, 32), (16, 16), (5, 48)] {
            let tp = rows.next_multiple_of(W);
            let src: Vec<f32> = (0..rows * d).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut dst = vec![0f32; tp * d];
            let mut tr = vec![f32::NAN; d * tp];
            // The transposes' padding columns start at zero, as in `launch`.
            for c in 0..d {
                tr[c * tp + rows..(c + 1) * tp].fill(0.0);
            }
            gather(&src, 0, d, (rows, d), &mut dst, Some(&mut tr));
            for r in 0..tp {
                for c in 0..d {
                    let want = if r < rows { src[r * d + c] } else { 0.0 };
                    assert_eq!(tr[c * tp + r], want, "{rows}x{d}: ({r}, {c})");
                    assert_eq!(dst[r * d + c], want, "{rows}x{d}: ({r}, {c})");
                }
            }
        }
    }

    #[test]
    #[ignore]
    fn small_gemm_rate() {
        let a: Vec<f32> = (0..64 * 64).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..64 * 16).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0f32; 64 * 16];
        for (ars, acs) in [(1, 64), (64, 1)] {
            let reps = 20000;
            let secs = simd::run(Probe {
                a: &a,
                b: &b,
                c: &mut c,
                reps,
                ars,
                acs,
            });
            let fl = 2.0 * 64.0 * 16.0 * 64.0 * reps as f64;
            println!(
                "ars {ars} acs {acs}: {:.1} GFLOP/s, {:.2} µs per product",
                fl / secs / 1e9,
                secs / reps as f64 * 1e6
            );
        }
    }
}
