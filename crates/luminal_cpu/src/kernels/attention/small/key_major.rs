//! The key-major kernels of short-sequence attention (heads `d` a multiple of 16; see
//! `super`'s docs): scores kept transposed (`Sᵀ = k·qᵀ`, 16 query rows per vector), so the
//! softmax and its gradient are plain vector ops down the keys, and the small products
//! skip the zero parts of a causal `P`.

#[cfg(target_arch = "x86_64")]
use super::x86::{
    probabilities_grad, probabilities_grad_avx2, scale_bias_max, scale_bias_max_avx2,
};
use super::{gemm, Shape, W};
use crate::simd::{self, Task};

/// The bias transposed (`tp × sp`: key-major, 16 query rows per vector) with the padding
/// the key-major kernels need — `-inf` for padding keys of real rows, 0 for padding rows
/// (they stay finite and, with zero q and dO rows, contribute nothing) — and each block of
/// 16 query rows' key extent (`jn`, a multiple of [`W`]: keys past every row's last
/// visible key are skipped).
pub(super) fn transposed_bias(
    bias: Option<&[f32]>,
    ends: &[f32],
    (s, t): (usize, usize),
    bt: &mut [f32],
    jn: &mut [f32],
) {
    let (sp, tp) = (s.next_multiple_of(W), t.next_multiple_of(W));
    for j in 0..tp {
        let row = &mut bt[j * sp..(j + 1) * sp];
        for (i, x) in row.iter_mut().enumerate() {
            *x = if i >= s {
                0.0
            } else if j >= t {
                f32::NEG_INFINITY
            } else {
                bias.map_or(0.0, |b| b[i * t + j])
            };
        }
    }
    for (blk, e) in jn.iter_mut().enumerate() {
        let rows = blk * W..((blk + 1) * W).min(s);
        let end = rows
            .map(|i| if bias.is_some() { ends[i] as usize } else { t })
            .max()
            .unwrap_or(0);
        *e = end.next_multiple_of(W).clamp(W, tp) as f32;
    }
}

/// The transposed bias of a head ([`transposed_bias`]): the launch's shared one, or its
/// own built in `own`.
pub(super) fn key_major_bias<'a>(
    use_shared: bool,
    shared: (&'a [f32], &'a [f32]),
    (brow, ends): (Option<&[f32]>, &[f32]),
    st: (usize, usize),
    own: (&'a mut [f32], &'a mut [f32]),
) -> (&'a [f32], &'a [f32]) {
    if use_shared {
        shared
    } else {
        transposed_bias(brow, ends, st, own.0, own.1);
        (own.0, own.1)
    }
}

/// One head's operands for the key-major kernels: q and dO padded to `sp` rows (zeros),
/// row-major and transposed (`d × sp`), k and v padded to `tp` rows.
pub(super) struct HeadT<'a> {
    pub(super) q: &'a [f32],
    pub(super) qt: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
    /// The transposed bias and key extents ([`transposed_bias`]).
    pub(super) bt: &'a [f32],
    pub(super) jn: &'a [f32],
}

/// `Pᵀ` (`tp × sp`) of one head, key-major: for each block of 16 query rows, the scores
/// `k·qᵀ·scale + biasᵀ` over the block's keys, then the softmax down each column (every
/// step a vector op over the 16 rows: no per-row reductions). Columns' `1 / Σ` go to
/// `inv`, or (`inv` None) the columns are normalised. Keys past a block's extent read 0.
#[inline(always)]
fn probabilities_t<const F: bool>(
    h: &HeadT<'_>,
    (s, t, d): (usize, usize, usize),
    scale: f32,
    pt: &mut [f32],
    mut inv: Option<&mut [f32]>,
) {
    let (sp, tp) = (s.next_multiple_of(W), t.next_multiple_of(W));
    let log2e = std::f32::consts::LOG2_E;
    for (blk, &jn) in h.jn.iter().enumerate() {
        let (i0, jn) = (blk * W, jn as usize);
        // Scores of eight keys at a time in registers, scaled, biased and folded into the
        // column maxima before they are stored.
        let mut mx = [f32::NEG_INFINITY; W];
        if !scores_x86::<F>(h, (i0, sp, jn, d), scale, pt, &mut mx) {
            let mut j0 = 0;
            while j0 < jn {
                let at = (h, i0, j0, (sp, d), scale);
                match (jn - j0).min(8) {
                    1 => scores_t::<F, 1>(at, pt, &mut mx),
                    2 => scores_t::<F, 2>(at, pt, &mut mx),
                    3 => scores_t::<F, 3>(at, pt, &mut mx),
                    4 => scores_t::<F, 4>(at, pt, &mut mx),
                    5 => scores_t::<F, 5>(at, pt, &mut mx),
                    6 => scores_t::<F, 6>(at, pt, &mut mx),
                    7 => scores_t::<F, 7>(at, pt, &mut mx),
                    _ => scores_t::<F, 8>(at, pt, &mut mx),
                }
                j0 += 8;
            }
        }
        let mut sum = [0f32; W];
        for j in 0..jn {
            let x = &mut pt[j * sp + i0..j * sp + i0 + W];
            for l in 0..W {
                let e = simd::exp2_softmax::<F>((x[l] - mx[l]) * log2e);
                x[l] = e;
                sum[l] += e;
            }
        }
        let mut il = [0f32; W];
        for l in 0..W {
            il[l] = 1.0 / sum[l];
        }
        match inv.as_deref_mut() {
            Some(inv) => inv[i0..i0 + W].copy_from_slice(&il),
            None => {
                for j in 0..jn {
                    let x = &mut pt[j * sp + i0..j * sp + i0 + W];
                    for l in 0..W {
                        x[l] *= il[l];
                    }
                }
            }
        }
        for j in jn..tp {
            pt[j * sp + i0..j * sp + i0 + W].fill(0.0);
        }
    }
}

/// Rows `j0 .. j0 + MR` of `Sᵀ` for the 16 queries from `i0`: `k·qᵀ·scale + biasᵀ`, stored
/// in `pt`, their maxima folded into `mx`.
#[inline(always)]
fn scores_t<const F: bool, const MR: usize>(
    (h, i0, j0, (sp, d), scale): (&HeadT<'_>, usize, usize, (usize, usize), f32),
    pt: &mut [f32],
    mx: &mut [f32; W],
) {
    let mut acc = [[0f32; W]; MR];
    for c in 0..d {
        let qc = &h.qt[c * sp + i0..c * sp + i0 + W];
        for (r, ar) in acc.iter_mut().enumerate() {
            let kv = h.k[(j0 + r) * d + c];
            for l in 0..W {
                ar[l] = simd::fma::<F>(kv, qc[l], ar[l]);
            }
        }
    }
    for (r, ar) in acc.iter().enumerate() {
        let at = (j0 + r) * sp + i0;
        let (x, b) = (&mut pt[at..at + W], &h.bt[at..at + W]);
        for l in 0..W {
            let v = ar[l] * scale + b[l];
            x[l] = v;
            mx[l] = if v > mx[l] { v } else { mx[l] };
        }
    }
}

/// The forward of one head, key-major (`d` a multiple of [`W`]).
pub(super) struct ForwardT<'a> {
    pub(super) head: HeadT<'a>,
    pub(super) shape: Shape,
    pub(super) scale: f32,
    pub(super) pt: &'a mut [f32],
    pub(super) inv: &'a mut [f32],
    pub(super) out: &'a mut [f32],
}

impl Task for ForwardT<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let Shape { s, t, d, .. } = self.shape;
        let sp = s.next_multiple_of(W);
        let h = &self.head;
        probabilities_t::<F>(h, (s, t, d), self.scale, self.pt, Some(&mut *self.inv));
        // out = P·v: row i of P is column i of Pᵀ; a block of rows stops at its extent.
        let jn = h.jn;
        let k_of = |r0: usize, _: usize| (0, jn[r0 / W] as usize);
        gemm::<F>(
            (s, d),
            &k_of,
            (self.pt, 1, sp),
            (h.v, d),
            (&mut *self.out, d),
        );
        for i in 0..s {
            let il = self.inv[i];
            self.out[i * d..(i + 1) * d]
                .iter_mut()
                .for_each(|x| *x *= il);
        }
    }
}

/// The backward of one head, key-major (`d` a multiple of [`W`]; `s = t`).
pub(super) struct BackwardT<'a> {
    pub(super) head: HeadT<'a>,
    /// dO padded to `sp` rows, and transposed (`d × sp`).
    pub(super) d_out: &'a [f32],
    pub(super) d_out_t: &'a [f32],
    pub(super) shape: Shape,
    pub(super) scale: f32,
    pub(super) pt: &'a mut [f32],
    pub(super) dst: &'a mut [f32],
    pub(super) inv: &'a mut [f32],
    pub(super) dq: &'a mut [f32],
    pub(super) dk: &'a mut [f32],
    pub(super) dv: &'a mut [f32],
}

impl Task for BackwardT<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let Shape { s, t, d, .. } = self.shape;
        let (sp, tp) = (s.next_multiple_of(W), t.next_multiple_of(W));
        let h = &self.head;
        probabilities_t::<F>(h, (s, t, d), self.scale, self.pt, Some(&mut *self.inv));
        for (blk, &jn) in h.jn.iter().enumerate() {
            let (i0, jn) = (blk * W, jn as usize);
            // dPᵀ = v·dOᵀ, then P normalised on the way while D = Σ_j Pᵀ ⊙ dPᵀ is summed,
            // then dSᵀ = Pᵀ ⊙ (dPᵀ − D)·scale.
            gemm::<F>(
                (jn, W),
                &|_, _| (0, d),
                (h.v, d, 1),
                (&self.d_out_t[i0..], sp),
                (&mut self.dst[i0..], sp),
            );
            let mut il = [0f32; W];
            il.copy_from_slice(&self.inv[i0..i0 + W]);
            if !grad_passes_x86(self.pt, self.dst, (i0, sp, jn), &il, self.scale) {
                let mut dsum = [0f32; W];
                for j in 0..jn {
                    let (p, dp) = (
                        &mut self.pt[j * sp + i0..j * sp + i0 + W],
                        &self.dst[j * sp + i0..j * sp + i0 + W],
                    );
                    for l in 0..W {
                        p[l] *= il[l];
                        dsum[l] = simd::fma::<F>(p[l], dp[l], dsum[l]);
                    }
                }
                for j in 0..jn {
                    let p = &self.pt[j * sp + i0..j * sp + i0 + W];
                    let x = &mut self.dst[j * sp + i0..j * sp + i0 + W];
                    for l in 0..W {
                        x[l] = p[l] * (x[l] - dsum[l]) * self.scale;
                    }
                }
            }
            for j in jn..tp {
                self.dst[j * sp + i0..j * sp + i0 + W].fill(0.0);
            }
        }
        let jn = h.jn;
        let k_of = |r0: usize, _: usize| (0, jn[r0 / W] as usize);
        // dq = dS·k, dk = dSᵀ·q, dv = Pᵀ·dO.
        gemm::<F>(
            (s, d),
            &k_of,
            (self.dst, 1, sp),
            (h.k, d),
            (&mut *self.dq, d),
        );
        // Key rows from r0 need the query blocks whose extent reaches past r0 (earlier
        // blocks read zeros there).
        let from = |r0: usize, _: usize| {
            let first = jn.iter().position(|&e| e as usize > r0).unwrap_or(jn.len());
            (first * W, sp)
        };
        gemm::<F>(
            (t, d),
            &from,
            (self.dst, sp, 1),
            (h.q, d),
            (&mut *self.dk, d),
        );
        gemm::<F>(
            (t, d),
            &from,
            (self.pt, sp, 1),
            (self.d_out, d),
            (&mut *self.dv, d),
        );
    }
}

/// The backward's passes over rows `..jn` of the block of 16 query columns from `i0`
/// (`P` normalised by `il` while `D` is summed, then `dS`) in x86 vector code; false
/// (nothing done) without AVX2: the portable loops run them.
#[inline(always)]
fn grad_passes_x86(
    pt: &mut [f32],
    dst: &mut [f32],
    (i0, sp, jn): (usize, usize, usize),
    il: &[f32; W],
    scale: f32,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if W == 16 && crate::simd::isa() >= crate::simd::Isa::Avx2 {
        assert!(jn == 0 || (jn - 1) * sp + i0 + W <= pt.len().min(dst.len()));
        let (p, ds) = (pt[i0..].as_mut_ptr(), dst[i0..].as_mut_ptr());
        // SAFETY: the ISA level never exceeds the detected one; rows `..jn` of the block
        // lie in `pt` and `dst` (checked).
        unsafe {
            if crate::simd::isa() == crate::simd::Isa::Avx512 {
                probabilities_grad(p, ds, (sp, jn), il, scale)
            } else {
                probabilities_grad_avx2(p, ds, (sp, jn), il, scale)
            }
        }
        return true;
    }
    let _ = (pt, dst, i0, sp, jn, il, scale);
    false
}

/// Rows `..jn` of `Sᵀ` for the 16 queries from `i0` ([`scores_t`]'s values) in x86 vector
/// code: the scores as a small product into `pt`, then scaled, biased and folded into the
/// maxima in one pass over the block (in L1); false (nothing done) without AVX2.
#[inline(always)]
fn scores_x86<const F: bool>(
    h: &HeadT<'_>,
    (i0, sp, jn, d): (usize, usize, usize, usize),
    scale: f32,
    pt: &mut [f32],
    mx: &mut [f32; W],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if W == 16 && crate::simd::isa() >= crate::simd::Isa::Avx2 {
        gemm::<F>(
            (jn, W),
            &|_, _| (0, d),
            (h.k, d, 1),
            (&h.qt[i0..], sp),
            (&mut pt[i0..], sp),
        );
        assert!(jn == 0 || (jn - 1) * sp + i0 + W <= pt.len().min(h.bt.len()));
        let (x, b) = (pt[i0..].as_mut_ptr(), h.bt[i0..].as_ptr());
        // SAFETY: the ISA level never exceeds the detected one; rows `..jn` of the block
        // lie in `pt` and `bt` (checked).
        unsafe {
            if crate::simd::isa() == crate::simd::Isa::Avx512 {
                scale_bias_max(x, b, (sp, jn), scale, mx)
            } else {
                scale_bias_max_avx2(x, b, (sp, jn), scale, mx)
            }
        }
        return true;
    }
    let _ = (h, i0, sp, jn, d, scale, pt, mx);
    false
}
