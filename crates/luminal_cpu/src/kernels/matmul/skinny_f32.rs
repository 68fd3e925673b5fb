//! Skinny products (`M ≤ 8` rows, the decode step of a language model): each output is a
//! dot product of a row of `a` with a row of `b` stored along `K`, so the weights stream from
//! memory once, split over the threads by output column. `gemm` is slow at this shape (it
//! packs `b` and runs at a few GFLOP/s for `M = 1`).

use crate::simd::{isa, Isa};

/// Largest weight (bytes) the skinny kernel reads four rows at a time (see [`skinny`]).
const GROUPED_MAX_BYTES: usize = 8 << 20;

/// Most rows of `a` handled by the skinny kernel.
pub const MAX_ROWS: usize = 8;

/// `Σ a[i]·b[i]` with 64 independent lanes so the compiler keeps vector registers busy.
/// `F`: fused multiply-adds (where the CPU has them; without, `mul_add` is a slow library
/// call and a multiply and an add are used instead).
#[inline(always)]
fn dot_lanes<const F: bool>(a: &[f32], b: &[f32]) -> f32 {
    let fma = crate::simd::fma::<F>;
    const W: usize = 64;
    let mut acc = [0f32; W];
    let (ac, bc) = (a.chunks_exact(W), b.chunks_exact(W));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..W {
            acc[l] = fma(x[l], y[l], acc[l]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail = fma(*x, *y, tail);
    }
    // Pairwise sum of the lanes.
    let mut w = W;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0] + tail
}

/// `Σ a[i]·b[c][i]` for four `b`s at once, so each load of `a` feeds four products; two
/// 8-lane accumulators per product, in registers (written out: the compiler spills a
/// portable version of this loop).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot4_avx2(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let k = a.len();
    let b = [&b[0][..k], &b[1][..k], &b[2][..k], &b[3][..k]];
    let mut acc = [_mm256_setzero_ps(); 8];
    let full = k / 16 * 16;
    let mut p = 0;
    while p < full {
        // SAFETY: `p + 16 <= k` and every slice holds `k` elements.
        unsafe {
            let x0 = _mm256_loadu_ps(a.as_ptr().add(p));
            let x1 = _mm256_loadu_ps(a.as_ptr().add(p + 8));
            for c in 0..4 {
                let y = b[c].as_ptr().add(p);
                acc[2 * c] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(y), acc[2 * c]);
                acc[2 * c + 1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(y.add(8)), acc[2 * c + 1]);
            }
        }
        p += 16;
    }
    let mut out = [0f32; 4];
    for c in 0..4 {
        let v = _mm256_add_ps(acc[2 * c], acc[2 * c + 1]);
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_movehdup_ps(v));
        let mut tail = 0f32;
        for q in full..k {
            tail = a[q].mul_add(b[c][q], tail);
        }
        out[c] = _mm_cvtss_f32(v) + tail;
    }
    out
}

/// `dst[i·n + j] = rows[i] · b[b_off + j·b_row ..][..k]` for the `groups` groups of four
/// columns from `j0`, each group's four dots by `dot4`.
///
/// # Safety
/// `dst` must hold `rows.len()·n` elements with `j0 + 4·groups <= n`, and no other thread
/// may write these columns.
#[inline(always)]
unsafe fn groups_with(
    rows: &[&[f32]],
    b: &[f32],
    (b_off, b_row): (usize, usize),
    k: usize,
    (j0, groups): (usize, usize),
    (dst, n): (*mut f32, usize),
    dot4: impl Fn(&[f32], [&[f32]; 4]) -> [f32; 4],
) {
    for g in 0..groups {
        let j = j0 + 4 * g;
        let col = |t: usize| &b[b_off + (j + t) * b_row..b_off + (j + t) * b_row + k];
        let cols = [col(0), col(1), col(2), col(3)];
        for (i, row) in rows.iter().enumerate() {
            let v = dot4(row, cols);
            for (t, v) in v.into_iter().enumerate() {
                // SAFETY: i < rows.len(), j + t < n (the caller's contract).
                unsafe { *dst.add(i * n + j + t) = v };
            }
        }
    }
}

/// [`groups_with`] compiled for AVX2 + FMA with [`dot4_avx2`] inlined (a group costs no
/// call).
///
/// # Safety
/// AVX2 and FMA must be available, and [`groups_with`]'s contract holds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn groups_avx2(
    rows: &[&[f32]],
    b: &[f32],
    b_at: (usize, usize),
    k: usize,
    cols: (usize, usize),
    dst: (*mut f32, usize),
) {
    // SAFETY: the caller's contract; AVX2 and FMA are enabled here.
    unsafe { groups_with(rows, b, b_at, k, cols, dst, |a, b| dot4_avx2(a, b)) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<true>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<true>(a, b)
}

#[inline(always)]
pub(crate) fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    match isa {
        // SAFETY: the feature was detected at run time.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { dot_avx2(a, b) },
        _ => dot_lanes::<{ crate::simd::NATIVE_FMA }>(a, b),
    }
}

/// The output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint elements (their own column range of each row).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Runs `cols(j0, j1)` over column ranges covering `0 .. n`: split over the threads (a
/// few tasks per thread, multiples of 4 columns) when `parallel`, else one range.
pub(crate) fn split_columns(n: usize, parallel: bool, cols: impl Fn(usize, usize) + Sync) {
    let threads = crate::exec::par::threads();
    if parallel && threads > 1 && n >= 32 {
        let chunk = n.div_ceil(threads * 4).max(16).next_multiple_of(4);
        crate::exec::par::for_each(n.div_ceil(chunk), |c| {
            cols(c * chunk, ((c + 1) * chunk).min(n))
        });
    } else {
        cols(0, n);
    }
}

/// One skinny product: `dst[i·n + j] = Σ_k a[a_off + i·a_row + k] · b[b_off + j·b_row + k]`
/// for `i < m ≤ MAX_ROWS`, `j < n`. Both operands are contiguous along `K`. Panics (slice
/// bounds) rather than reading out of bounds; the caller checked the views beforehand.
/// Allocates nothing.
#[allow(clippy::too_many_arguments)]
pub fn skinny(
    a: &[f32],
    a_off: usize,
    a_row: usize,
    b: &[f32],
    b_off: usize,
    b_row: usize,
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    parallel: bool,
) {
    assert!(m <= MAX_ROWS);
    let isa = isa();
    let mut rows: [&[f32]; MAX_ROWS] = [&[]; MAX_ROWS];
    for (i, r) in rows.iter_mut().enumerate().take(m) {
        *r = &a[a_off + i * a_row..a_off + i * a_row + k];
    }
    let col = |j: usize| &b[b_off + j * b_row..b_off + j * b_row + k];
    assert!(dst.len() >= m * n);
    let out = OutPtr(dst.as_mut_ptr());
    // Four columns at a time (each load of `a` feeds four weight rows) while the weight is
    // cache-sized: 1×576·[1536,576] 72 → 57 µs. A weight streamed from DRAM reads faster as
    // one sequential stream than as four interleaved ones (1×576·[49152,576]: 6.6 → 8.7 ms
    // with four).
    let grouped = n * k * 4 <= GROUPED_MAX_BYTES;
    split_columns(n, parallel, |j0, j1| {
        let out = out;
        let mut j = j0;
        if grouped {
            let groups = (j1 - j0) / 4;
            let args = (&rows[..m], (b_off, b_row), (j0, groups), (out.0, n));
            // SAFETY: dst holds m·n elements and j0 + 4·groups <= j1 <= n; no other task
            // writes this task's columns. The AVX2 features were detected at run time.
            unsafe {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 | Isa::Avx2 => groups_avx2(args.0, b, args.1, k, args.2, args.3),
                    _ => groups_with(args.0, b, args.1, k, args.2, args.3, |a, b| {
                        b.map(|b| dot_lanes::<{ crate::simd::NATIVE_FMA }>(a, b))
                    }),
                }
            }
            j = j0 + 4 * groups;
        }
        for j in j..j1 {
            for (i, row) in rows.iter().enumerate().take(m) {
                let v = dot(isa, row, col(j));
                // SAFETY: as above.
                unsafe { *out.0.add(i * n + j) = v };
            }
        }
    });
}
