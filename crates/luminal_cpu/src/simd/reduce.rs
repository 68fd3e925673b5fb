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

/// [`Acc::add_slice`] with AVX intrinsics: four 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn add_slice_avx<const MAX: bool>(l: &mut [f32; LANES], xs: &[f32]) {
    use std::arch::x86_64::*;
    #[inline(always)]
    unsafe fn step<const MAX: bool>(a: __m256, x: __m256) -> __m256 {
        if MAX {
            // x > a, or x is NaN: take x (NaN sticks: nothing compares greater than NaN
            // and a NaN accumulator is never replaced by a number).
            let take = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(x, a),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
            );
            _mm256_blendv_ps(a, x, take)
        } else {
            _mm256_add_ps(a, x)
        }
    }
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
        a0 = step::<MAX>(a0, _mm256_loadu_ps(q));
        a1 = step::<MAX>(a1, _mm256_loadu_ps(q.add(8)));
        a2 = step::<MAX>(a2, _mm256_loadu_ps(q.add(16)));
        a3 = step::<MAX>(a3, _mm256_loadu_ps(q.add(24)));
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
