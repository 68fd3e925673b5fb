//! Sum / max reductions over slices, with many lanes so they vectorise.

use super::*;

/// Lanes of a row accumulator: independent partial results, so the loop vectorises (and
/// sums pairwise-ish, more accurately than one serial f32 sum).
pub(crate) const LANES: usize = 32;

/// The value a reduction of nothing gives.
#[inline(always)]
pub fn reduce_identity(op: ReduceOp) -> f32 {
    if op == ReduceOp::Sum {
        0.0
    } else {
        f32::NEG_INFINITY
    }
}

/// A running sum (`MAX = false`) or max (`MAX = true`) over slices. The op is a type
/// parameter so the loops compile to plain vector adds / maxes with the lanes in
/// registers. A max lane that meets a NaN stays NaN (NaN propagates, like the reference
/// and PyTorch).
#[derive(Clone, Copy)]
pub struct Acc<const MAX: bool> {
    lanes: [f32; LANES],
}

/// One max step: NaN in either operand gives NaN, and a NaN accumulator stays NaN.
#[inline(always)]
pub(crate) fn max_step(acc: f32, x: f32) -> f32 {
    if x > acc || x.is_nan() {
        x
    } else {
        acc
    }
}

impl<const MAX: bool> Acc<MAX> {
    const IDENTITY: f32 = if MAX { f32::NEG_INFINITY } else { 0.0 };

    #[inline(always)]
    pub fn new() -> Self {
        Acc {
            lanes: [Self::IDENTITY; LANES],
        }
    }

    #[inline(always)]
    fn step(a: f32, x: f32) -> f32 {
        if MAX {
            max_step(a, x)
        } else {
            a + x
        }
    }

    #[inline(always)]
    pub fn add_slice(&mut self, xs: &[f32]) {
        // The auto-vectoriser splits these lanes unpredictably depending on the
        // surrounding code; with AVX the loop is written out with intrinsics.
        #[cfg(target_arch = "x86_64")]
        if isa() >= Isa::Avx2 {
            // SAFETY: `isa()` reports AVX2 (hence AVX) was detected on this CPU.
            unsafe { add_slice_avx::<MAX>(&mut self.lanes, xs) };
            return;
        }
        self.add_slice_generic(xs)
    }

    // Indexed lanes keep the accumulators in registers (the point of the loop).
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn add_slice_generic(&mut self, xs: &[f32]) {
        let mut chunks = xs.chunks_exact(LANES);
        let mut l = self.lanes;
        for c in &mut chunks {
            for i in 0..LANES {
                l[i] = Self::step(l[i], c[i]);
            }
        }
        // The tail goes through an identity-padded copy: indexing `l` only by constants
        // keeps the accumulators in registers.
        let rem = chunks.remainder();
        let mut tail = [Self::IDENTITY; LANES];
        tail[..rem.len()].copy_from_slice(rem);
        for i in 0..LANES {
            l[i] = Self::step(l[i], tail[i]);
        }
        self.lanes = l;
    }

    #[inline(always)]
    pub fn add_one(&mut self, x: f32) {
        self.lanes[0] = Self::step(self.lanes[0], x);
    }

    #[inline(always)]
    pub fn finish(&self) -> f32 {
        // Fold 8-lane groups first (the same shape as the main loop's vectors, so the
        // vectoriser keeps whole-register lanes), then the last 8 in order.
        let l = self.lanes;
        let mut g = [Self::IDENTITY; 8];
        for j in 0..LANES / 8 {
            for i in 0..8 {
                g[i] = Self::step(g[i], l[j * 8 + i]);
            }
        }
        let mut r = Self::IDENTITY;
        for x in g {
            r = Self::step(r, x);
        }
        r
    }
}

/// One accumulator step on eight lanes: a sum, or a max where x > a or x is NaN takes x (NaN
/// sticks: nothing compares greater than NaN and a NaN accumulator is never replaced by a
/// number). The callers enable AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step_avx<const MAX: bool>(
    a: std::arch::x86_64::__m256,
    x: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if MAX {
        let take = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, a),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
        );
        _mm256_blendv_ps(a, x, take)
    } else {
        _mm256_add_ps(a, x)
    }
}

/// [`Acc::add_slice`] with AVX intrinsics: four 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn add_slice_avx<const MAX: bool>(l: &mut [f32; LANES], xs: &[f32]) {
    use std::arch::x86_64::*;
    let p = l.as_mut_ptr();
    let (mut a0, mut a1, mut a2, mut a3) = (
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    );
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        let q = c.as_ptr();
        a0 = step_avx::<MAX>(a0, _mm256_loadu_ps(q));
        a1 = step_avx::<MAX>(a1, _mm256_loadu_ps(q.add(8)));
        a2 = step_avx::<MAX>(a2, _mm256_loadu_ps(q.add(16)));
        a3 = step_avx::<MAX>(a3, _mm256_loadu_ps(q.add(24)));
    }
    _mm256_storeu_ps(p, a0);
    _mm256_storeu_ps(p.add(8), a1);
    _mm256_storeu_ps(p.add(16), a2);
    _mm256_storeu_ps(p.add(24), a3);
    for (i, &x) in chunks.remainder().iter().enumerate() {
        l[i] = Acc::<MAX>::step(l[i], x);
    }
}

/// Runs `$body` with `$M` bound to the const `MAX` flag of reduce op `$op`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_reduce {
    ($op:expr, |$M:ident| $body:expr) => {
        match $op {
            luminal::op::ReduceOp::Sum => {
                const $M: bool = false;
                $body
            }
            luminal::op::ReduceOp::Max => {
                const $M: bool = true;
                $body
            }
        }
    };
}

/// `dst[i] = dst[i] op src[i]` (the strided reduction's combine step).
#[inline(always)]
pub fn combine(op: ReduceOp, dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    let src = &src[..n];
    match op {
        ReduceOp::Sum => {
            for i in 0..n {
                dst[i] += src[i];
            }
        }
        ReduceOp::Max => {
            for i in 0..n {
                dst[i] = max_nan(dst[i], src[i]);
            }
        }
    }
}

/// Max that propagates NaN (like the reference and PyTorch).
#[inline(always)]
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if b > a {
        b
    } else {
        a
    }
}

/// `out[r]` = the reduction of row `r` of `vals` (rows of `c ≥ 1` contiguous values,
/// `out.len()` of them), each exactly as a fresh [`Acc`] fed the row with one
/// [`Acc::add_slice`] and [`Acc::finish`]ed gives it (same steps in the same order: results
/// are identical). With AVX2 eight rows go at once: a row's 32 lanes in four 8-wide
/// registers, its 8-lane fold per row, and the last in-order fold of those 8 lanes across
/// the eight rows after a transpose (one register holds the eight results). A row of
/// attention scores (64 values) was ~60% overhead through the accumulator's setup, spills
/// and scalar fold.
#[inline(always)]
pub fn reduce_short_rows<const MAX: bool>(vals: &[f32], c: usize, out: &mut [f32]) {
    assert!(
        c >= 1 && vals.len() >= c * out.len(),
        "reduce_short_rows: {} rows of {c} from {} values",
        out.len(),
        vals.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2 {
        // SAFETY: AVX2 was detected (`isa`); lengths checked above.
        unsafe { reduce_short_rows_avx2::<MAX>(vals, c, out) };
        return;
    }
    for (o, row) in out.iter_mut().zip(vals.chunks_exact(c)) {
        let mut acc = Acc::<MAX>::new();
        acc.add_slice(row);
        *o = acc.finish();
    }
}

/// [`reduce_short_rows`] with AVX2.
///
/// # Safety
/// AVX2 must be available; `vals` holds at least `c · out.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_short_rows_avx2<const MAX: bool>(vals: &[f32], c: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let id = _mm256_set1_ps(Acc::<MAX>::IDENTITY);
    let full = c / LANES;
    let rem = c % LANES;
    // Lane masks of the remainder, per 8-lane quarter (lanes `< rem` step, the others keep
    // their value, as `add_slice_avx`'s scalar tail).
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let masks: [__m256i; 4] = std::array::from_fn(|q| {
        _mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32 - 8 * q as i32), lane)
    });
    // The 8-lane fold of row `r`: its lanes, then `g = step(..step_avx::<MAX>(id, l[0..8]).., l[24..32])`.
    let fold = |r: usize| -> __m256 {
        let p = vals.as_ptr().add(r * c);
        let mut a = [id; 4];
        for j in 0..full {
            for (q, x) in a.iter_mut().enumerate() {
                *x = step_avx::<MAX>(*x, _mm256_loadu_ps(p.add(j * LANES + 8 * q)));
            }
        }
        if rem > 0 {
            let t = p.add(full * LANES);
            for (q, x) in a.iter_mut().enumerate() {
                if 8 * q < rem {
                    let v = _mm256_maskload_ps(t.add(8 * q), masks[q]);
                    *x =
                        _mm256_blendv_ps(*x, step_avx::<MAX>(*x, v), _mm256_castsi256_ps(masks[q]));
                }
            }
        }
        let mut g = id;
        for x in a {
            g = step_avx::<MAX>(g, x);
        }
        g
    };
    let rows = out.len();
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(8);
        let g: [__m256; 8] = std::array::from_fn(|i| if i < nr { fold(r0 + i) } else { id });
        // Transpose: t[k] holds lane k of the eight rows' folds.
        let t0 = _mm256_unpacklo_ps(g[0], g[1]);
        let t1 = _mm256_unpackhi_ps(g[0], g[1]);
        let t2 = _mm256_unpacklo_ps(g[2], g[3]);
        let t3 = _mm256_unpackhi_ps(g[2], g[3]);
        let t4 = _mm256_unpacklo_ps(g[4], g[5]);
        let t5 = _mm256_unpackhi_ps(g[4], g[5]);
        let t6 = _mm256_unpacklo_ps(g[6], g[7]);
        let t7 = _mm256_unpackhi_ps(g[6], g[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        let t = [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ];
        let mut acc = id;
        for x in t {
            acc = step_avx::<MAX>(acc, x);
        }
        let mut res = [0f32; 8];
        _mm256_storeu_ps(res.as_mut_ptr(), acc);
        out[r0..r0 + nr].copy_from_slice(&res[..nr]);
        r0 += nr;
    }
}
