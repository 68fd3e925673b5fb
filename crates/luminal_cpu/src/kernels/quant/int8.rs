//! Int8 dot products of quantized activations with unpacked weight rows (`unpack.rs`) — the
//! skinny product's inner loop for block-quantized weights, as llama.cpp computes it.
//!
//! Activations are quantized per group of 16 values to signed bytes in `[−127, 127]` with
//! one f32 scale `d = max|x| / 127` (round to nearest, ties to even): the error of each value
//! is at most `d / 2`. A weight group `g` (16 values, `w = a_g · u + b_g`) then contributes
//! `a_g · d_g · Σ u·q + b_g · d_g · Σ q`: the integer sums are exact, and `d_g · Σ q` is
//! computed once per activation row (`sg`).
//!
//! ggml quantizes per block of 32. Half blocks cost one more scale multiply per 16 products
//! and halve the reach of an outlier (a large value coarsens only its own 15 neighbours):
//! on SmolLM2 Q4_1 decode over 512 tokens, the mean KL divergence from f32 activations falls
//! from 0.0025 to 0.0014 and the perplexity excess from +0.41% to +0.23%.
//!
//! **Two levels** ([`QActs::quantize_two_level`]): each group also keeps its rounding
//! residual `r = x − d·q` (`|r| ≤ d / 2`) as a second byte `q₂ = round(256 · r / d)`
//! (clamped to ±127), so `x ≈ (d / 256) · (256 · q + q₂)`: 16 bits a value instead of 8,
//! with the integer sums still exact (`256 · Σ u·q + Σ u·q₂` stays below 2²⁴, so its f32
//! conversion is exact too). The fused dots (`legacy_dot.rs`) keep the per-group float work
//! of one level: AVX-512 VNNI runs a second `vpdpbusd` into the first's sums shifted left
//! by 8; AVX2 multiplies the combined values, which fit in i16, with the weights widened to
//! i16 (`vpmaddwd`). Used by the skinny products of the 32-value block formats (decode
//! steps; `two_level` in `int8_matmul.rs`). On SmolLM2 Q4_1 decode the rounding's error in
//! the logits falls from ~1.1 to ~0.03 (transformers' top-1 over 534 teacher-forced steps:
//! 523 → 533 with VNNI, 520 → 534 with AVX2), for 6-16% of the decode speed.
//!
//! Paths, chosen at run time: AVX-512 VNNI (`vpdpbusd`, 64 products an instruction), AVX2
//! (`vpmaddubsw` + `vpmaddwd`; exact because unpacked quants stay ≤ 63, and Q8_0 uses the
//! sign trick so both factors stay ≤ 128 in magnitude), and portable integer code.

use super::unpack::GROUP;
use crate::simd::{isa, Isa, Task};

/// Activation rows are whole blocks of this many values (the weight blocks' size); each
/// has two scales, one per group of 16.
pub(crate) const ABLOCK: usize = 32;

/// Whether the CPU has AVX-512 VNNI (checked once).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| is_x86_feature_detected!("avx512vnni"))
}

/// The int8 path for the current instruction-set cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DotPath {
    Portable,
    Avx2,
    Vnni512,
}

impl DotPath {
    pub(crate) fn current() -> DotPath {
        match isa() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if has_vnni() => DotPath::Vnni512,
            Isa::Avx512 | Isa::Avx2 => DotPath::Avx2,
            Isa::Generic => DotPath::Portable,
        }
    }
}

/// Activation rows quantized for the int8 dots (kept and reused: no allocation once grown).
#[derive(Default)]
pub(crate) struct QActs {
    k: usize,
    q: Vec<i8>,
    /// Per group of 16: its scale.
    dg: Vec<f32>,
    /// Per group of 16: `dg · Σ q` over the group.
    sg: Vec<f32>,
    /// Per block of 32: `Σ dg · Σ q` over its two groups.
    sb: Vec<f32>,
    /// Per block of 32, eight lanes (the AVX2 fused dots' layout, `legacy_dot.rs`): the two
    /// group scales, each four times.
    dg8: Vec<f32>,
    /// Per block of 32, eight lanes: the two group sums `dg · Σ q` over 4, each four times
    /// (the lanes add up to the block's sum `sb`; dividing by 4 is exact).
    sq8: Vec<f32>,
    /// Two-level rows: the second level's quants (`x ≈ dg · (256 · q + q2)`, `dg` and the
    /// sums then of the combined value); empty for one level.
    q2: Vec<i8>,
    /// Two-level rows: the combined values `256 · q + q2` as i16 (they fit), each block of
    /// 32 in the order 0-7, 16-23, 8-15, 24-31 (see [`q16_slot`]); empty for one level.
    q16: Vec<i16>,
}

/// Where value `t` of a block of 32 sits in the block's `q16` entries: the AVX2 two-level
/// dot multiplies the weights unpacked with `vpunpck{l,h}bw` (values 0-7 | 16-23, then
/// 8-15 | 24-31 per 128-bit lane) with them, so that adding the two `vpmaddwd` results
/// leaves group 0 in lanes 0-3 and group 1 in lanes 4-7, as the one-level kernel's sums.
pub(crate) const fn q16_slot(t: usize) -> usize {
    let (g, i) = (t / 16, t % 16);
    (i / 8) * 16 + g * 8 + i % 8
}

/// A fused multi-row dot with its operands already checked (`legacy_dot::kernel`,
/// `kquant_dot::kernel`): one weight row against the rows `x`, `x.rows` results into `out`.
///
/// # Safety
/// `x` is the rows the `kernel` call that returned this checked (or a copy of them), `row`
/// has the length checked there, and the CPU has the path's features (it was chosen from
/// them). `out` shorter than `x.rows` panics.
pub(crate) type RowsKernel = unsafe fn(row: &[u8], x: &QRows, out: &mut [f32]);

/// One quantized activation row.
#[derive(Clone, Copy)]
pub(crate) struct QRow<'a> {
    pub q: &'a [i8],
    pub dg: &'a [f32],
    pub sg: &'a [f32],
}

/// `rows` consecutive quantized activation rows of `k` values each (`k` a multiple of 32),
/// `stride` values apart: row `r` is `q[r · stride ..][..k]`, its group scales and sums
/// `dg`, `sg` from `r · stride / 16` on and its block sums `sb` from `r · stride / 32` on.
/// What the multi-row fused dots read (`legacy_dot.rs`, `kquant_dot.rs`).
#[derive(Clone, Copy)]
pub(crate) struct QRows<'a> {
    pub q: &'a [i8],
    pub dg: &'a [f32],
    pub sg: &'a [f32],
    pub sb: &'a [f32],
    /// Eight lanes per block (see `QActs::dg8` / `sq8`), from `r · stride / 4` on.
    pub dg8: &'a [f32],
    pub sq8: &'a [f32],
    /// The second level's quants of two-level rows (same layout as `q`); empty otherwise.
    pub q2: &'a [i8],
    /// The combined values of two-level rows (`QActs::q16`'s layout); empty otherwise.
    pub q16: &'a [i16],
    pub k: usize,
    pub stride: usize,
    pub rows: usize,
}

impl<'a> QRows<'a> {
    /// Whether the slices hold every value the rows address (what the kernels assume).
    pub(crate) fn is_valid(&self) -> bool {
        let span = (self.rows.max(1) - 1) * self.stride + self.k;
        self.rows >= 1
            && self.k.is_multiple_of(ABLOCK)
            && self.stride.is_multiple_of(ABLOCK)
            && (self.rows == 1 || self.stride >= self.k)
            && self.q.len() >= span
            && self.dg.len() >= span / GROUP
            && self.sg.len() >= span / GROUP
            && self.sb.len() >= span / ABLOCK
            && self.dg8.len() >= span / 4
            && self.sq8.len() >= span / 4
            && (self.q2.is_empty() || (self.q2.len() >= span && self.q16.len() >= span))
    }

    /// Whether the rows carry a second level (`q2`).
    #[inline(always)]
    pub(crate) fn two_level(&self) -> bool {
        !self.q2.is_empty()
    }

    /// The rows from block `b` (of 32 values) on.
    pub(crate) fn tail(self, b: usize) -> QRows<'a> {
        QRows {
            q: &self.q[32 * b..],
            dg: &self.dg[2 * b..],
            sg: &self.sg[2 * b..],
            sb: &self.sb[b..],
            dg8: &self.dg8[8 * b..],
            sq8: &self.sq8[8 * b..],
            q2: if self.two_level() {
                &self.q2[32 * b..]
            } else {
                &[]
            },
            q16: if self.two_level() {
                &self.q16[32 * b..]
            } else {
                &[]
            },
            k: self.k - 32 * b,
            ..self
        }
    }

    /// Row `r`'s second-level quants (two-level rows only).
    #[inline(always)]
    pub(crate) fn q2_at(&self, r: usize) -> *const i8 {
        self.q2.as_ptr().wrapping_add(r * self.stride)
    }

    /// Row `r`'s combined two-level values (two-level rows only).
    #[inline(always)]
    pub(crate) fn q16_at(&self, r: usize) -> *const i16 {
        self.q16.as_ptr().wrapping_add(r * self.stride)
    }

    /// Row `r`'s quants.
    #[inline(always)]
    pub(crate) fn q_at(&self, r: usize) -> *const i8 {
        self.q.as_ptr().wrapping_add(r * self.stride)
    }

    /// Row `r`'s group scales.
    #[inline(always)]
    pub(crate) fn dg_at(&self, r: usize) -> *const f32 {
        self.dg.as_ptr().wrapping_add(r * self.stride / GROUP)
    }

    /// Row `r`'s group sums `dg · Σ q`.
    #[inline(always)]
    pub(crate) fn sg_at(&self, r: usize) -> *const f32 {
        self.sg.as_ptr().wrapping_add(r * self.stride / GROUP)
    }

    /// Row `r`'s block sums.
    #[inline(always)]
    pub(crate) fn sb_at(&self, r: usize) -> *const f32 {
        self.sb.as_ptr().wrapping_add(r * self.stride / ABLOCK)
    }

    /// Row `r`'s group scales, eight lanes a block.
    #[inline(always)]
    pub(crate) fn dg8_at(&self, r: usize) -> *const f32 {
        self.dg8.as_ptr().wrapping_add(r * self.stride / 4)
    }

    /// Row `r`'s group sums over 4, eight lanes a block.
    #[inline(always)]
    pub(crate) fn sq8_at(&self, r: usize) -> *const f32 {
        self.sq8.as_ptr().wrapping_add(r * self.stride / 4)
    }
}

impl QActs {
    /// Quantizes `m` rows of `k` values (`k` a multiple of 32), row `i` being `row(i)`.
    pub(crate) fn quantize<'x>(&mut self, m: usize, k: usize, row: impl Fn(usize) -> &'x [f32]) {
        assert!(k.is_multiple_of(ABLOCK), "int8 activations: {k} values");
        self.k = k;
        self.q.resize(m * k, 0);
        self.dg.resize(m * k / GROUP, 0.0);
        self.sg.resize(m * k / GROUP, 0.0);
        self.sb.resize(m * k / ABLOCK, 0.0);
        self.dg8.resize(m * k / 4, 0.0);
        self.sq8.resize(m * k / 4, 0.0);
        self.q2.clear();
        self.q16.clear();
        let g = k / GROUP;
        for i in 0..m {
            quantize_row(
                &row(i)[..k],
                &mut self.q[i * k..(i + 1) * k],
                &mut self.dg[i * g..(i + 1) * g],
                &mut self.sg[i * g..(i + 1) * g],
            );
            self.derive_sums(i);
        }
    }

    /// Quantizes `m` rows of `k` values in two levels (see the module docs): the first as
    /// [`QActs::quantize`], then each group's rounding residual.
    pub(crate) fn quantize_two_level<'x>(
        &mut self,
        m: usize,
        k: usize,
        row: impl Fn(usize) -> &'x [f32],
    ) {
        self.quantize(m, k, &row);
        self.q2.resize(m * k, 0);
        self.q16.resize(m * k, 0);
        let g = k / GROUP;
        for i in 0..m {
            let span = i * k..(i + 1) * k;
            crate::simd::run(Residual {
                x: &row(i)[..k],
                q: &self.q[span.clone()],
                q2: &mut self.q2[span.clone()],
                q16: &mut self.q16[span],
                dg: &mut self.dg[i * g..(i + 1) * g],
                sg: &mut self.sg[i * g..(i + 1) * g],
            });
            self.derive_sums(i);
        }
    }

    /// Row `i`'s block sums and eight-lane scales and sums, from its group scales and sums.
    fn derive_sums(&mut self, i: usize) {
        let (k, g, nb) = (self.k, self.k / GROUP, self.k / ABLOCK);
        let sg = &self.sg[i * g..(i + 1) * g];
        for (b, s) in self.sb[i * nb..(i + 1) * nb].iter_mut().enumerate() {
            *s = sg[2 * b] + sg[2 * b + 1];
        }
        let dg = &self.dg[i * g..(i + 1) * g];
        let lanes = (i * k / 4)..((i + 1) * k / 4);
        let (dg8, sq8) = (&mut self.dg8[lanes.clone()], &mut self.sq8[lanes]);
        for (t, (d8, s8)) in dg8.iter_mut().zip(sq8.iter_mut()).enumerate() {
            // Lane `t % 8` of block `t / 8`: group `2 · (t / 8) + (t % 8) / 4`.
            let grp = t / 4;
            *d8 = dg[grp];
            *s8 = sg[grp] * 0.25;
        }
    }

    /// Rows `i .. i + rows`.
    pub(crate) fn rows(&self, i: usize, rows: usize) -> QRows<'_> {
        let (k, g, nb) = (self.k, self.k / GROUP, self.k / ABLOCK);
        QRows {
            q: &self.q[i * k..(i + rows) * k],
            dg: &self.dg[i * g..(i + rows) * g],
            sg: &self.sg[i * g..(i + rows) * g],
            sb: &self.sb[i * nb..(i + rows) * nb],
            dg8: &self.dg8[i * k / 4..(i + rows) * k / 4],
            sq8: &self.sq8[i * k / 4..(i + rows) * k / 4],
            q2: if self.q2.is_empty() {
                &[]
            } else {
                &self.q2[i * k..(i + rows) * k]
            },
            q16: if self.q16.is_empty() {
                &[]
            } else {
                &self.q16[i * k..(i + rows) * k]
            },
            k,
            stride: k,
            rows,
        }
    }

    /// Row `i` (one-level rows: the dots that take a [`QRow`] know no second level).
    pub(crate) fn row(&self, i: usize) -> QRow<'_> {
        assert!(self.q2.is_empty(), "int8 dot: a two-level row");
        let (k, g) = (self.k, self.k / GROUP);
        QRow {
            q: &self.q[i * k..(i + 1) * k],
            dg: &self.dg[i * g..(i + 1) * g],
            sg: &self.sg[i * g..(i + 1) * g],
        }
    }
}

/// One row quantized per group of 16 (`x` whole groups; `q`, `dg`, `sg` its quants,
/// scales and scaled sums): SIMD for the groups of finite values, else [`Quantize`] (the
/// reference, which the SIMD code reproduces bit for bit).
pub(crate) fn quantize_row(x: &[f32], q: &mut [i8], dg: &mut [f32], sg: &mut [f32]) {
    let g = x.len() / GROUP;
    assert!(q.len() == x.len() && dg.len() == g && sg.len() == g && x.len() == g * GROUP);
    let done = match isa() {
        // SAFETY: the features were detected at run time; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { quantize_avx512(x, q, dg, sg) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { quantize_avx2(x, q, dg, sg) },
        _ => false,
    };
    if !done {
        crate::simd::run(Quantize { x, q, dg, sg });
    }
}

/// The group's scale and its inverse (`amax / 127`, `1 / d` or 0), as [`Quantize`].
#[inline(always)]
fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// AVX-512: one group a vector. Returns false (nothing trusted) when a group holds a value
/// that is not finite, or its scale's inverse is not: the caller then runs the reference
/// code.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/DQ; lengths as [`quantize_row`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn quantize_avx512(x: &[f32], q: &mut [i8], dg: &mut [f32], sg: &mut [f32]) -> bool {
    use std::arch::x86_64::*;
    for g in 0..dg.len() {
        let v = _mm512_loadu_ps(x.as_ptr().add(GROUP * g));
        let amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
        let (d, id) = scale_of(amax);
        // Not finite: an infinity or NaN in the group, or a scale so small its inverse
        // overflows (the conversions would then differ from Rust's saturating casts).
        if !id.is_finite() || !amax.is_finite() || _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) != 0 {
            return false;
        }
        // Round to nearest, ties to even (the default rounding mode).
        let qi = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)));
        _mm_storeu_si128(
            q.as_mut_ptr().add(GROUP * g) as *mut __m128i,
            _mm512_cvtsepi32_epi8(qi),
        );
        dg[g] = d;
        sg[g] = d * _mm512_reduce_add_epi32(qi) as f32;
    }
    true
}

/// AVX2: one group as two vectors; as [`quantize_avx512`].
///
/// # Safety
/// The CPU has AVX2; lengths as [`quantize_row`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32], q: &mut [i8], dg: &mut [f32], sg: &mut [f32]) -> bool {
    use std::arch::x86_64::*;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for g in 0..dg.len() {
        let p = x.as_ptr().add(GROUP * g);
        let (v0, v1) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
        let unordered = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v0, v0),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v1, v1),
        );
        let m = _mm256_max_ps(_mm256_and_ps(v0, abs), _mm256_and_ps(v1, abs));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let (d, id) = scale_of(amax);
        if !id.is_finite() || !amax.is_finite() || _mm256_movemask_ps(unordered) != 0 {
            return false;
        }
        let s = _mm256_set1_ps(id);
        let q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, s));
        let q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, s));
        let h0 = _mm_packs_epi32(
            _mm256_castsi256_si128(q0),
            _mm256_extracti128_si256::<1>(q0),
        );
        let h1 = _mm_packs_epi32(
            _mm256_castsi256_si128(q1),
            _mm256_extracti128_si256::<1>(q1),
        );
        _mm_storeu_si128(
            q.as_mut_ptr().add(GROUP * g) as *mut __m128i,
            _mm_packs_epi16(h0, h1),
        );
        let t = _mm256_add_epi32(q0, q1);
        let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
        dg[g] = d;
        sg[g] = d * _mm_cvtsi128_si32(t) as f32;
    }
    true
}

/// The reference quantizer (portable; also every group's result on the SIMD paths).
struct Quantize<'a> {
    x: &'a [f32],
    q: &'a mut [i8],
    dg: &'a mut [f32],
    sg: &'a mut [f32],
}

impl Task for Quantize<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let blocks = self
            .x
            .chunks_exact(ABLOCK)
            .zip(self.q.chunks_exact_mut(ABLOCK));
        let groups = self.dg.chunks_exact_mut(2).zip(self.sg.chunks_exact_mut(2));
        for ((x, q), (dg, sg)) in blocks.zip(groups) {
            for (h, (x, q)) in x
                .chunks_exact(GROUP)
                .zip(q.chunks_exact_mut(GROUP))
                .enumerate()
            {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let (d, id) = scale_of(amax);
                for (q, &v) in q.iter_mut().zip(x) {
                    *q = (v * id).round_ties_even() as i8;
                }
                let sum: i32 = q.iter().map(|&v| v as i32).sum();
                dg[h] = d;
                sg[h] = d * sum as f32;
            }
        }
    }
}

/// The second level of one quantized row (see [`QActs::quantize_two_level`]): from the
/// values `x` and their first-level quants `q` and group scales `dg`, the residuals' quants
/// `q2` and the combined values `q16` (`256 · q + q2`, in [`q16_slot`] order); `dg` and
/// `sg` then become the combined value's (`dg / 256`, `dg / 256 · Σ (256 · q + q2)`).
struct Residual<'a> {
    x: &'a [f32],
    q: &'a [i8],
    q2: &'a mut [i8],
    q16: &'a mut [i16],
    dg: &'a mut [f32],
    sg: &'a mut [f32],
}

impl Task for Residual<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let groups = self.x.chunks_exact(GROUP).zip(self.q.chunks_exact(GROUP));
        let outs = self.q2.chunks_exact_mut(GROUP);
        let scales = self.dg.iter_mut().zip(self.sg.iter_mut());
        for (gi, (((x, q), q2), (dg, sg))) in groups.zip(outs).zip(scales).enumerate() {
            let d = *dg;
            // 256 / d, or 0 for an all-zero group (whose residuals are zero).
            let s = if d > 0.0 { 256.0 / d } else { 0.0 };
            // This group's block of combined values, and its first value's place in it.
            let (block, t0) = (&mut self.q16[gi / 2 * ABLOCK..][..ABLOCK], gi % 2 * GROUP);
            let mut sum = 0i32;
            for (t, ((&x, &q), q2)) in x.iter().zip(q).zip(q2.iter_mut()).enumerate() {
                let r = x - d * q as f32;
                let v = (r * s).round_ties_even().clamp(-127.0, 127.0) as i8;
                *q2 = v;
                let c = 256 * q as i16 + v as i16;
                block[q16_slot(t0 + t)] = c;
                sum += c as i32;
            }
            *dg = d * (1.0 / 256.0);
            *sg = *dg * sum as f32;
        }
    }
}

/// One unpacked weight row (see `unpack.rs`).
#[derive(Clone, Copy)]
pub(crate) struct URow<'a> {
    pub u: &'a [u8],
    pub a: &'a [f32],
    pub b: &'a [f32],
    /// `u` holds signed bytes (Q8_0).
    pub signed: bool,
}

/// `Σ w·x` of an unpacked weight row and a quantized activation row of the same length.
#[inline]
pub(crate) fn dot(path: DotPath, w: URow, x: QRow) -> f32 {
    let k = w.u.len();
    assert!(
        k.is_multiple_of(ABLOCK)
            && x.q.len() == k
            && w.a.len() == k / GROUP
            && w.b.len() == k / GROUP
            && x.dg.len() == k / GROUP
            && x.sg.len() == k / GROUP,
        "int8 dot: {k} weights against {} activations",
        x.q.len()
    );
    match (path, w.signed) {
        // SAFETY: the path was chosen from run-time detected features; lengths checked.
        #[cfg(target_arch = "x86_64")]
        (DotPath::Vnni512, false) => unsafe { dot_vnni::<false>(w, x) },
        #[cfg(target_arch = "x86_64")]
        (DotPath::Vnni512, true) => unsafe { dot_vnni::<true>(w, x) },
        #[cfg(target_arch = "x86_64")]
        (DotPath::Avx2, false) => unsafe { dot_avx2::<false>(w, x) },
        #[cfg(target_arch = "x86_64")]
        (DotPath::Avx2, true) => unsafe { dot_avx2::<true>(w, x) },
        _ => dot_portable(w, x),
    }
}

fn dot_portable(w: URow, x: QRow) -> f32 {
    let mut acc = 0f32;
    let mut bias = 0f32;
    let chunks = w.u.chunks_exact(GROUP).zip(x.q.chunks_exact(GROUP));
    for (g, (u, q)) in chunks.enumerate() {
        let s: i32 = if w.signed {
            u.iter()
                .zip(q)
                .map(|(&u, &q)| u as i8 as i32 * q as i32)
                .sum()
        } else {
            u.iter().zip(q).map(|(&u, &q)| u as i32 * q as i32).sum()
        };
        acc += w.a[g] * x.dg[g] * s as f32;
        bias += w.b[g] * x.sg[g];
    }
    acc + bias
}

/// Lane `l` of the 64-value chunk `t` of a 256-value span belongs to group `4t + l / 4`
/// (`vpermps` indices spreading 16 group factors over a `vpdpbusd` result).
#[cfg(target_arch = "x86_64")]
pub(crate) const fn lane_groups(t: i32) -> [i32; 16] {
    let mut idx = [0; 16];
    let mut l = 0;
    while l < 16 {
        idx[l] = 4 * t + l as i32 / 4;
        l += 1;
    }
    idx
}

/// AVX-512 VNNI: spans of 256 values (16 groups, scales computed as one vector), four
/// `vpdpbusd` of 64 values each; partial spans masked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
unsafe fn dot_vnni<const SIGNED: bool>(w: URow, x: QRow) -> f32 {
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [
        lane_groups(0),
        lane_groups(1),
        lane_groups(2),
        lane_groups(3),
    ];
    let k = w.u.len();
    let ng = k / GROUP;
    let (up, qp) = (w.u.as_ptr(), x.q.as_ptr());
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut bacc = _mm512_setzero_ps();
    let mut g = 0;
    while g < ng {
        let n = (ng - g).min(16);
        let gm: __mmask16 = if n == 16 { !0 } else { (1u16 << n) - 1 };
        let c = _mm512_mul_ps(
            _mm512_maskz_loadu_ps(gm, w.a.as_ptr().add(g)),
            _mm512_maskz_loadu_ps(gm, x.dg.as_ptr().add(g)),
        );
        bacc = _mm512_fmadd_ps(
            _mm512_maskz_loadu_ps(gm, w.b.as_ptr().add(g)),
            _mm512_maskz_loadu_ps(gm, x.sg.as_ptr().add(g)),
            bacc,
        );
        for (t, acc) in acc.iter_mut().enumerate().take(n.div_ceil(4)) {
            let at = g * GROUP + 64 * t;
            let rem = k - at;
            let (mut wv, mut xv) = if rem >= 64 {
                (
                    _mm512_loadu_si512(up.add(at) as *const _),
                    _mm512_loadu_si512(qp.add(at) as *const _),
                )
            } else {
                let bm: __mmask64 = (1u64 << rem) - 1;
                (
                    _mm512_maskz_loadu_epi8(bm, up.add(at) as *const i8),
                    _mm512_maskz_loadu_epi8(bm, qp.add(at)),
                )
            };
            if SIGNED {
                let neg = _mm512_movepi8_mask(wv);
                xv = _mm512_mask_sub_epi8(xv, neg, zero, xv);
                wv = _mm512_abs_epi8(wv);
            }
            let p = _mm512_dpbusd_epi32(zero, wv, xv);
            let idx = _mm512_loadu_si512(IDX[t].as_ptr() as *const _);
            let scale = _mm512_permutexvar_ps(idx, c);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *acc);
        }
        g += 16;
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(_mm512_add_ps(sum, bacc))
}

/// AVX2: spans of 128 values (8 groups), `vpmaddubsw` + `vpmaddwd` per 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<const SIGNED: bool>(w: URow, x: QRow) -> f32 {
    use std::arch::x86_64::*;
    let k = w.u.len();
    let ng = k / GROUP;
    let (up, qp) = (w.u.as_ptr(), x.q.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut bacc = _mm256_setzero_ps();
    let mut g = 0;
    while g < ng {
        let n = (ng - g).min(8);
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
        let c = _mm256_mul_ps(
            _mm256_maskload_ps(w.a.as_ptr().add(g), mask),
            _mm256_maskload_ps(x.dg.as_ptr().add(g), mask),
        );
        bacc = _mm256_fmadd_ps(
            _mm256_maskload_ps(w.b.as_ptr().add(g), mask),
            _mm256_maskload_ps(x.sg.as_ptr().add(g), mask),
            bacc,
        );
        // `n` is even: the length is a multiple of 32.
        for (t, acc) in acc.iter_mut().enumerate().take(n / 2) {
            let at = g * GROUP + 32 * t;
            let mut wv = _mm256_loadu_si256(up.add(at) as *const __m256i);
            let mut xv = _mm256_loadu_si256(qp.add(at) as *const __m256i);
            if SIGNED {
                xv = _mm256_sign_epi8(xv, wv);
                wv = _mm256_abs_epi8(wv);
            }
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
            let t2 = 2 * t as i32;
            let idx = _mm256_setr_epi32(t2, t2, t2, t2, t2 + 1, t2 + 1, t2 + 1, t2 + 1);
            let scale = _mm256_permutevar8x32_ps(c, idx);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, *acc);
        }
        g += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let sum = _mm256_add_ps(sum, bacc);
    crate::simd::hsum(sum)
}

/// `Σ w·x` of an unpacked weight row and f32 activations (no activation rounding): each
/// group's weights are rebuilt in registers as `a_g · u + b_g` and multiplied in f32. The
/// f32-activation path of the formats without a fused f32 dot (the K-quants, Q5_x).
#[inline]
pub(crate) fn dot_f32(path: DotPath, w: URow, x: &[f32]) -> f32 {
    let k = w.u.len();
    assert!(
        k.is_multiple_of(GROUP) && x.len() == k && w.a.len() == k / GROUP && w.b.len() == k / GROUP,
        "f32 dot: {k} weights against {} activations",
        x.len()
    );
    match path {
        // SAFETY: the path was chosen from run-time detected features; lengths checked.
        #[cfg(target_arch = "x86_64")]
        DotPath::Vnni512 => unsafe { dot_f32_avx512(w, x) },
        #[cfg(target_arch = "x86_64")]
        DotPath::Avx2 => unsafe { dot_f32_avx2(w, x) },
        _ => dot_f32_portable(w, x),
    }
}

fn dot_f32_portable(w: URow, x: &[f32]) -> f32 {
    let mut acc = 0f32;
    let groups = w.u.chunks_exact(GROUP).zip(x.chunks_exact(GROUP));
    for (g, (u, x)) in groups.enumerate() {
        let (a, b) = (w.a[g], w.b[g]);
        for (&u, &x) in u.iter().zip(x) {
            let q = if w.signed { u as i8 as f32 } else { u as f32 };
            acc += x * a.mul_add(q, b);
        }
    }
    acc
}

/// AVX-512: one group of 16 per vector, four accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn dot_f32_avx512(w: URow, x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let ng = w.u.len() / GROUP;
    let (up, xp) = (w.u.as_ptr(), x.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    for g in 0..ng {
        let bytes = _mm_loadu_si128(up.add(g * GROUP) as *const __m128i);
        let q = if w.signed {
            _mm512_cvtepi8_epi32(bytes)
        } else {
            _mm512_cvtepu8_epi32(bytes)
        };
        let wv = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(q),
            _mm512_set1_ps(*w.a.get_unchecked(g)),
            _mm512_set1_ps(*w.b.get_unchecked(g)),
        );
        let xv = _mm512_loadu_ps(xp.add(g * GROUP));
        acc[g % 4] = _mm512_fmadd_ps(xv, wv, acc[g % 4]);
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(s)
}

/// AVX2: one group of 16 as two vectors of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(w: URow, x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let ng = w.u.len() / GROUP;
    let (up, xp) = (w.u.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    for g in 0..ng {
        let (a, b) = (
            _mm256_set1_ps(*w.a.get_unchecked(g)),
            _mm256_set1_ps(*w.b.get_unchecked(g)),
        );
        for h in 0..2 {
            let at = g * GROUP + 8 * h;
            let bytes = _mm_loadl_epi64(up.add(at) as *const __m128i);
            let q = if w.signed {
                _mm256_cvtepi8_epi32(bytes)
            } else {
                _mm256_cvtepu8_epi32(bytes)
            };
            let wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), a, b);
            let xv = _mm256_loadu_ps(xp.add(at));
            acc[2 * (g % 2) + h] = _mm256_fmadd_ps(xv, wv, acc[2 * (g % 2) + h]);
        }
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    crate::simd::hsum(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD quantizers give the reference's quants, scales and sums bit for bit, and
    /// decline groups they would get wrong (non-finite values, an overflowing inverse).
    #[test]
    fn simd_quantizers_match_the_reference() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut x: Vec<f32> = (0..64 * GROUP).map(|_| next() * 3.0).collect();
        // Zeros, a tiny group, halves that round to even, a group of one sign.
        x[..GROUP].fill(0.0);
        x[GROUP..2 * GROUP].iter_mut().for_each(|v| *v *= 1e-30);
        for (i, v) in x[2 * GROUP..3 * GROUP].iter_mut().enumerate() {
            *v = (i as f32 - 7.5) * 127.0 / 8.5;
        }
        x[3 * GROUP..4 * GROUP]
            .iter_mut()
            .for_each(|v| *v = v.abs());
        let reference = |x: &[f32]| {
            let g = x.len() / GROUP;
            let (mut q, mut dg, mut sg) = (vec![0i8; x.len()], vec![0f32; g], vec![0f32; g]);
            Quantize {
                x,
                q: &mut q,
                dg: &mut dg,
                sg: &mut sg,
            }
            .run::<false>();
            (q, dg, sg)
        };
        type Simd = unsafe fn(&[f32], &mut [i8], &mut [f32], &mut [f32]) -> bool;
        let mut paths: Vec<(&str, Simd)> = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::detected_isa() >= Isa::Avx512 {
                paths.push(("avx512", quantize_avx512));
            }
            if crate::detected_isa() >= Isa::Avx2 {
                paths.push(("avx2", quantize_avx2));
            }
        }
        for (name, f) in paths {
            let want = reference(&x);
            let g = x.len() / GROUP;
            let (mut q, mut dg, mut sg) = (vec![0i8; x.len()], vec![0f32; g], vec![0f32; g]);
            // SAFETY: the features were detected; the lengths agree.
            assert!(unsafe { f(&x, &mut q, &mut dg, &mut sg) }, "{name}");
            assert_eq!((q, dg, sg), want, "{name}");
            // A subnormal scale (its inverse overflows), an infinity, a NaN: declined.
            for bad in [1e-40f32, f32::INFINITY, f32::NAN] {
                let mut y = x[..GROUP].to_vec();
                y[3] = bad;
                let (mut q, mut dg, mut sg) = (vec![0i8; GROUP], [0f32], [0f32]);
                // SAFETY: as above.
                assert!(!unsafe { f(&y, &mut q, &mut dg, &mut sg) }, "{name} {bad}");
            }
        }
    }
}
