//! The f32 weight format of the skinny product (`skinny.rs`: `M ≤ 8` rows, the decode step
//! of a language model): each output is a dot product of a row of `a` with a row of `b`
//! stored along `K`. `gemm` is slow at this shape (it packs `b` and runs at a few GFLOP/s
//! for `M = 1`).

use crate::kernels::matmul::skinny::{Out, SkinnyWeight};
use crate::simd::{isa, Isa};
use std::ops::Range;

/// Largest weight (bytes) the skinny kernel reads four rows at a time (see [`F32Rows`]).
const GROUPED_MAX_BYTES: usize = 8 << 20;

/// `Σ a[i]·b[i]` with 64 independent lanes so the compiler keeps vector registers busy.
/// `F`: fused multiply-adds (where the CPU has them; without, `mul_add` is a slow library
/// call and a multiply and an add are used instead).
#[inline(always)]
pub(crate) fn dot_lanes<const F: bool>(a: &[f32], b: &[f32]) -> f32 {
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

/// An f32 weight of `n` rows of `k` values, row `j` at `b[off + j·row ..]` (a weight stored
/// `[N, K]`, or any operand contiguous along K).
pub(crate) struct F32Rows<'b> {
    b: &'b [f32],
    off: usize,
    row: usize,
    n: usize,
    k: usize,
}

impl<'b> F32Rows<'b> {
    /// Panics when `b` is too short for `n` rows of `k` values.
    pub(crate) fn new(b: &'b [f32], (off, row): (usize, usize), n: usize, k: usize) -> Self {
        assert!(
            n == 0 || k == 0 || off + (n - 1) * row + k <= b.len(),
            "skinny product: f32 weight too short"
        );
        F32Rows { b, off, row, n, k }
    }
}

impl SkinnyWeight for F32Rows<'_> {
    type Acts = ();

    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn with_acts<R>(&self, _rows: &[&[f32]], f: impl FnOnce(&()) -> R) -> R {
        f(&())
    }

    fn columns(&self, _: &(), rows: &[&[f32]], cols: Range<usize>, out: Out) {
        let F32Rows { b, off, row, n, k } = *self;
        let isa = isa();
        let (j0, j1) = (cols.start, cols.end);
        let col = |j: usize| &b[off + j * row..off + j * row + k];
        let mut j = j0;
        // Four columns at a time (each load of `a` feeds four weight rows) while the weight
        // is cache-sized: 1×576·[1536,576] 72 → 57 µs. A weight streamed from DRAM reads
        // faster as one sequential stream than as four interleaved ones
        // (1×576·[49152,576]: 6.6 → 8.7 ms with four).
        if n * k * 4 <= GROUPED_MAX_BYTES {
            let groups = (j1 - j0) / 4;
            let args = (rows, (off, row), (j0, groups), (out.ptr.0, n));
            // SAFETY: the output holds m·n elements and j0 + 4·groups <= j1 <= n; no other
            // task writes this task's columns. The AVX2 features were detected at run time.
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
            for (i, r) in rows.iter().enumerate() {
                // SAFETY: i < m, j < n; this task alone writes column j.
                unsafe { out.put(i, j, dot(isa, r, col(j))) };
            }
        }
    }
}
