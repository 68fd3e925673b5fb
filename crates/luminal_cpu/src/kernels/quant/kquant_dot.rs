//! Fused int8 dots for Q4_K and Q6_K (the two types of llama-quantize's Q4_K_M): the quants
//! of a super-block (256 values) are unpacked in registers and multiplied with the quantized
//! activations (`int8.rs`) at once, without the scratch row of `unpack.rs`. Each kernel
//! takes `R ≤ 4` activation rows (a const generic) and unpacks a super-block once for all
//! of them; with one row the arithmetic is the single-row kernel's (with several, AVX2 adds
//! the bias terms into the accumulators, a different summation order).
//!
//! A weight group `g` of 16 values is `w = a_g · u + b_g` (as in `unpack.rs`), so a
//! super-block contributes `Σ_g a_g · dg_g · Σ u·q + Σ_g b_g · sg_g` over its 16 groups:
//!
//! - **Q4_K** (144 bytes: `d`, `dmin` (f16), 12 bytes of packed 6-bit scales and mins, 128
//!   bytes of nibbles): sub-block `j` (32 values, groups `2j`, `2j + 1`) has `a = d · sc_j`,
//!   `b = −dmin · m_j`; its quants are the low (`j` even) or high (`j` odd) nibbles of
//!   `qs[32·(j/2) ..][..32]`. The bias is `−dmin · Σ_j m_j · sb_j` (`sb`: per 32 values).
//! - **Q6_K** (210 bytes: `ql[128]`, `qh[64]`, 16 signed scales, `d` (f16)): group `g` has
//!   `a = d · sc_g`, `b = −32 · a`, `u = q6 ∈ [0, 63]`. Values `128·h + 32·k + l` (`h < 2`,
//!   `k < 4`, `l < 32`) take the low (`k < 2`) or high nibble of `ql[64·h + 32·(k % 2) + l]`
//!   and bits `2k, 2k + 1` of `qh[32·h + l]` as bits 4 and 5.
//!
//! Both keep `u ≤ 63`, so AVX2's saturating `vpmaddubsw` (pairs of `u · q`, `|q| ≤ 127`)
//! stays exact.
//!
//! Lane mapping. AVX-512 VNNI: a super-block is four vectors of 64 values; `vpdpbusd` lane
//! `l` sums bytes `4l .. 4l + 3`, so in vector `t` lanes `4h .. 4h + 3` hold group `4t + h`,
//! and the per-group factor `a_g · dg_g` (one 16-lane vector per super-block) is spread over
//! them by `vpermps`. AVX2: eight vectors of 32 values; after `vpmaddubsw` + `vpmaddwd`,
//! lanes 0-3 of vector `t` hold group `2t` and lanes 4-7 group `2t + 1`.

use super::int8::{DotPath, QRows, RowsKernel};
#[cfg(target_arch = "x86_64")]
use super::{int8::lane_groups, legacy_dot::half};
use luminal::DType;

/// Values per super-block.
const QK: usize = 256;
/// Bytes of a Q4_K / Q6_K block.
const Q4K_BYTES: usize = 144;
const Q6K_BYTES: usize = 210;

/// Formats with a fused K-quant dot.
pub(crate) fn has_fused_dot(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_K | DType::Q6_K)
}

/// Most activation rows one call dots with a weight row (see [`kernel`]).
pub(crate) const MAX_R: usize = 4;

/// The kernel computing `out[r] = Σ w·x_r` of one weight row (`row_len` bytes of `dtype`,
/// a [`has_fused_dot`] format) and each of the `x.rows ≤ MAX_R` quantized activation rows,
/// on a SIMD path, after checking the operands (as `legacy_dot::kernel`). Each super-block
/// is unpacked in registers once and multiplied with every row.
pub(crate) fn kernel(path: DotPath, dtype: DType, row_len: usize, x: &QRows) -> RowsKernel {
    let nb = x.k / QK;
    assert!(
        has_fused_dot(dtype)
            && x.is_valid()
            && !x.two_level()
            && x.k == nb * QK
            && row_len == nb * dtype.block_bytes()
            && x.rows <= MAX_R,
        "int8 dot: {row_len} bytes of {dtype} against {} rows of {} activations",
        x.rows,
        x.k
    );
    macro_rules! rows {
        ($f:ident) => {
            match x.rows {
                1 => $f::<1> as RowsKernel,
                2 => $f::<2>,
                3 => $f::<3>,
                _ => $f::<4>,
            }
        };
    }
    match (path, dtype) {
        #[cfg(target_arch = "x86_64")]
        (DotPath::Vnni512, DType::Q4_K) => rows!(kernel_q4_k_vnni),
        #[cfg(target_arch = "x86_64")]
        (DotPath::Vnni512, _) => rows!(kernel_q6_k_vnni),
        #[cfg(target_arch = "x86_64")]
        (DotPath::Avx2, DType::Q4_K) => rows!(kernel_q4_k_avx2),
        #[cfg(target_arch = "x86_64")]
        (DotPath::Avx2, _) => rows!(kernel_q6_k_avx2),
        _ => unreachable!("fused K-quant dot on the portable path"),
    }
}

/// The [`RowsKernel`]s: each dot into `out` (`R` values).
macro_rules! kernels {
    ($($name:ident = $dot:ident, $features:literal;)*) => {
        $(
            /// The dot of the same name into `out`.
            ///
            /// # Safety
            /// As that dot.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $features)]
            unsafe fn $name<const R: usize>(row: &[u8], x: &QRows, out: &mut [f32]) {
                out[..R].copy_from_slice(&$dot::<R>(row, x));
            }
        )*
    };
}

kernels! {
    kernel_q4_k_vnni = q4_k_vnni, "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c";
    kernel_q6_k_vnni = q6_k_vnni, "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c";
    kernel_q4_k_avx2 = q4_k_avx2, "avx2,fma,f16c";
    kernel_q6_k_avx2 = q6_k_avx2, "avx2,fma,f16c";
}

/// The eight 6-bit scales and the eight 6-bit mins of a Q4_K block (`packed`: its bytes
/// 4..16), one per byte (sub-block `j` in byte `j`, little-endian). Sub-blocks 0-3 keep
/// their scale and min in the low six bits of bytes 0-3 and 4-7; sub-blocks 4-7 take
/// their low four bits from the nibbles of bytes 8-11 and their top two bits from the
/// top bits of bytes 0-3 (scales) and 4-7 (mins).
#[inline(always)]
fn q4_k_scales_mins(packed: &[u8; 12]) -> (u64, u64) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let word = |i: usize| {
        u32::from_le_bytes([
            packed[4 * i],
            packed[4 * i + 1],
            packed[4 * i + 2],
            packed[4 * i + 3],
        ])
    };
    let (p0, p1, p2) = (word(0), word(1), word(2));
    let scales_hi = (p2 & LOW4) | ((p0 >> 6) & TOP2) << 4;
    let mins_hi = ((p2 >> 4) & LOW4) | ((p1 >> 6) & TOP2) << 4;
    (
        (p0 & LOW6) as u64 | (scales_hi as u64) << 32,
        (p1 & LOW6) as u64 | (mins_hi as u64) << 32,
    )
}

/// The scales and mins of the Q4_K block at `blk`.
///
/// # Safety
/// `blk` points to a whole Q4_K block.
#[inline(always)]
unsafe fn scales_mins_at(blk: *const u8) -> (u64, u64) {
    q4_k_scales_mins(&*(blk.add(4) as *const [u8; 12]))
}

#[cfg(target_arch = "x86_64")]
const LANE_GROUPS: [[i32; 16]; 4] = [
    lane_groups(0),
    lane_groups(1),
    lane_groups(2),
    lane_groups(3),
];

/// Ternary-logic table of `(a & b) | c`.
#[cfg(target_arch = "x86_64")]
const AND_OR: i32 = 0xEA;

/// AVX-512 VNNI Q4_K: per super-block, the 16 group factors `d · sc_{g/2} · dg_g` as one
/// vector per activation row, then four `vpdpbusd` of 64 values per row: 32 bytes of `qs`
/// broadcast to both halves, the upper half shifted right by 4, masked to nibbles
/// (sub-blocks `2t`, `2t + 1`), unpacked once for all `R` rows.
///
/// # Safety
/// The CPU has the enabled features; `row` holds `x.k / 256` blocks and `x` is valid
/// (checked by [`kernel`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_vnni<const R: usize>(row: &[u8], x: &QRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let nb = x.k / QK;
    let wp = row.as_ptr();
    let zero = _mm512_setzero_si512();
    let low = _mm512_set1_epi8(15);
    let idx = LANE_GROUPS.map(|v| _mm512_loadu_si512(v.as_ptr() as *const _));
    // One row: four accumulators; more rows: one each (the rows interleave).
    let slots = if R == 1 { 4 } else { 1 };
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    let mut macc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let blk = wp.add(b * Q4K_BYTES);
        // Lane 0: d, lane 1: dmin.
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
        let (sc, mn) = scales_mins_at(blk);
        let sc = _mm_cvtsi64_si128(sc as i64);
        // Each sub-block scale twice: one per group of 16.
        let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sc, sc)));
        let a = _mm512_mul_ps(sc, _mm512_broadcastss_ps(dm));
        let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64)));
        let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
        let mn = _mm256_mul_ps(mn, dmin);
        let mut c = [_mm512_setzero_ps(); R];
        for_rows!(R, |r| {
            c[r] = _mm512_mul_ps(a, _mm512_loadu_ps(x.dg_at(r).add(16 * b)));
            macc[r] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(x.sb_at(r).add(8 * b)), macc[r]);
        });
        for t in 0..4 {
            let q = _mm256_loadu_si256(blk.add(16 + 32 * t) as *const __m256i);
            let z = _mm512_broadcast_i64x4(q);
            let w = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(z, 0xFFFF_0000, z), low);
            for_rows!(R, |r| {
                let xv = _mm512_loadu_si512(x.q_at(r).add(QK * b + 64 * t) as *const _);
                let p = _mm512_dpbusd_epi32(zero, w, xv);
                let scale = _mm512_permutexvar_ps(idx[t], c[r]);
                let a = &mut acc[r][t % slots];
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *a);
            });
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let a = &acc[r];
        let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        out[r] = _mm512_reduce_add_ps(sum) - crate::simd::hsum(macc[r]);
    }
    out
}

/// AVX-512 VNNI Q6_K: per super-block, the 16 group factors `d · sc_g · dg_g` and the bias
/// term `d · sc_g · sg_g` (times −32 at the end) as vectors per activation row; per half
/// `h`, 64 bytes of `ql` give vectors `2h` (low nibbles) and `2h + 1` (high nibbles), and 32
/// bytes of `qh` broadcast to both halves (the upper half shifted right by 2) give their bits
/// 4 and 5; unpacked once for all `R` rows.
///
/// # Safety
/// As [`q4_k_vnni`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_vnni<const R: usize>(row: &[u8], x: &QRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let nb = x.k / QK;
    let wp = row.as_ptr();
    let zero = _mm512_setzero_si512();
    let nib = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    let idx = LANE_GROUPS.map(|v| _mm512_loadu_si512(v.as_ptr() as *const _));
    let slots = if R == 1 { 4 } else { 1 };
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    let mut bacc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let blk = wp.add(b * Q6K_BYTES);
        let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(192) as *const __m128i));
        let a = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(half(blk.add(208))));
        let mut c = [_mm512_setzero_ps(); R];
        for_rows!(R, |r| {
            c[r] = _mm512_mul_ps(a, _mm512_loadu_ps(x.dg_at(r).add(16 * b)));
            bacc[r] = _mm512_fmadd_ps(a, _mm512_loadu_ps(x.sg_at(r).add(16 * b)), bacc[r]);
        });
        for h in 0..2 {
            let l = _mm512_loadu_si512(blk.add(64 * h) as *const _);
            let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
            let qh = _mm512_broadcast_i64x4(qh);
            // Lower half: qh, upper half: qh >> 2 (bits 0-1 / 2-3 of the low-nibble values,
            // bits 4-5 / 6-7 of the high-nibble ones, at bits 0-1 / 4-5).
            let s = _mm512_mask_srli_epi16::<2>(qh, 0xFFFF_0000, qh);
            let ha = _mm512_and_si512(_mm512_slli_epi16::<4>(s), bits45);
            let hb = _mm512_and_si512(s, bits45);
            let wa = _mm512_ternarylogic_epi32::<AND_OR>(l, nib, ha);
            let wb = _mm512_ternarylogic_epi32::<AND_OR>(_mm512_srli_epi16::<4>(l), nib, hb);
            for (v, w) in [(2 * h, wa), (2 * h + 1, wb)] {
                for_rows!(R, |r| {
                    let xv = _mm512_loadu_si512(x.q_at(r).add(QK * b + 64 * v) as *const _);
                    let p = _mm512_dpbusd_epi32(zero, w, xv);
                    let scale = _mm512_permutexvar_ps(idx[v], c[r]);
                    let a = &mut acc[r][v % slots];
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *a);
                });
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let a = &acc[r];
        let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        out[r] = _mm512_reduce_add_ps(sum) - 32.0 * _mm512_reduce_add_ps(bacc[r]);
    }
    out
}

/// `vpermps` indices for the AVX2 vector `t` (of 32 values) within its half of the 16
/// group factors: lanes 0-3 take group `2t`, lanes 4-7 group `2t + 1` (`t < 4`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_lanes(t: i32) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let (g0, g1) = (2 * t, 2 * t + 1);
    _mm256_setr_epi32(g0, g0, g0, g0, g1, g1, g1, g1)
}

/// `Σ u·q` of 32 unsigned weights and 32 activations as eight lanes (four per group of
/// 16), scaled by the lanes of `scale` into `acc`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn madd_scaled(
    w: std::arch::x86_64::__m256i,
    q: *const i8,
    scale: std::arch::x86_64::__m256,
    acc: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let xv = _mm256_loadu_si256(q as *const __m256i);
    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), _mm256_set1_epi16(1));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc)
}

/// AVX2 Q4_K: per super-block and half (groups 0-7, 8-15), the group factors as one vector
/// per activation row; each 32 bytes of `qs` give two vectors of 32 values (low, then high
/// nibbles), unpacked once for all `R` rows. With several rows the bias goes straight into
/// the accumulators (fewer registers live).
///
/// # Safety
/// As [`q4_k_vnni`] (AVX2, FMA, F16C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_avx2<const R: usize>(row: &[u8], x: &QRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let nb = x.k / QK;
    let wp = row.as_ptr();
    let low = _mm256_set1_epi8(15);
    let lanes = [pair_lanes(0), pair_lanes(1), pair_lanes(2), pair_lanes(3)];
    let slots = if R == 1 { 4 } else { 1 };
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let mut macc = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = wp.add(b * Q4K_BYTES);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
        let d = _mm256_broadcastss_ps(dm);
        let (sc, mn) = scales_mins_at(blk);
        let sc = _mm_cvtsi64_si128(sc as i64);
        let sc = _mm_unpacklo_epi8(sc, sc);
        let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64)));
        let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
        let mn = _mm256_mul_ps(mn, dmin);
        for_rows!(R, |r| {
            let sb = _mm256_loadu_ps(x.sb_at(r).add(8 * b));
            if R == 1 {
                macc = _mm256_fmadd_ps(mn, sb, macc);
            } else {
                acc[r][0] = _mm256_fnmadd_ps(mn, sb, acc[r][0]);
            }
        });
        for h in 0..2 {
            let sc = if h == 0 {
                sc
            } else {
                _mm_unpackhi_epi64(sc, sc)
            };
            let a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)), d);
            let mut c = [_mm256_setzero_ps(); R];
            for_rows!(R, |r| {
                c[r] = _mm256_mul_ps(a, _mm256_loadu_ps(x.dg_at(r).add(16 * b + 8 * h)));
            });
            for i in 2 * h..2 * h + 2 {
                let bytes = _mm256_loadu_si256(blk.add(16 + 32 * i) as *const __m256i);
                let lo = _mm256_and_si256(bytes, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low);
                // Vectors 2i and 2i + 1: groups 4i .. 4i + 3, in half i / 2 of the factors.
                let (t0, t1) = (2 * (i % 2), 2 * (i % 2) + 1);
                for_rows!(R, |r| {
                    let q = x.q_at(r).add(QK * b + 64 * i);
                    let s0 = _mm256_permutevar8x32_ps(c[r], lanes[t0]);
                    let s1 = _mm256_permutevar8x32_ps(c[r], lanes[t1]);
                    let a = &mut acc[r];
                    a[t0 % slots] = madd_scaled(lo, q, s0, a[t0 % slots]);
                    a[t1 % slots] = madd_scaled(hi, q.add(32), s1, a[t1 % slots]);
                });
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let a = &acc[r];
        let sum = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        out[r] = crate::simd::hsum(sum) - crate::simd::hsum(macc);
    }
    out
}

/// AVX2 Q6_K: per half `h`, 64 bytes of `ql` (two vectors) and 32 of `qh` give four
/// vectors of 32 values (`k = 0 .. 3`: low nibbles of each `ql` vector, then high ones,
/// with bits `2k, 2k + 1` of `qh` at bits 4 and 5), unpacked once for all `R` rows. With
/// several rows the bias goes straight into the accumulators.
///
/// # Safety
/// As [`q4_k_vnni`] (AVX2, FMA, F16C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_avx2<const R: usize>(row: &[u8], x: &QRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let nb = x.k / QK;
    let wp = row.as_ptr();
    let nib = _mm256_set1_epi8(0x0F);
    let bits45 = _mm256_set1_epi8(0x30);
    let lanes = [pair_lanes(0), pair_lanes(1), pair_lanes(2), pair_lanes(3)];
    let slots = if R == 1 { 4 } else { 1 };
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let mut bacc = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = wp.add(b * Q6K_BYTES);
        let d = _mm256_set1_ps(half(blk.add(208)));
        let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
        for h in 0..2 {
            let sc = if h == 0 {
                sc
            } else {
                _mm_unpackhi_epi64(sc, sc)
            };
            let a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
            let mut c = [_mm256_setzero_ps(); R];
            for_rows!(R, |r| {
                let (dg, sg) = (
                    x.dg_at(r).add(16 * b + 8 * h),
                    x.sg_at(r).add(16 * b + 8 * h),
                );
                c[r] = _mm256_mul_ps(a, _mm256_loadu_ps(dg));
                if R == 1 {
                    bacc = _mm256_fmadd_ps(a, _mm256_loadu_ps(sg), bacc);
                } else {
                    let a32 = _mm256_mul_ps(a, _mm256_set1_ps(32.0));
                    acc[r][0] = _mm256_fnmadd_ps(a32, _mm256_loadu_ps(sg), acc[r][0]);
                }
            });
            let l0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
            let l1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
            let w = [
                (l0, _mm256_slli_epi16::<4>(qh)),
                (l1, _mm256_slli_epi16::<2>(qh)),
                (_mm256_srli_epi16::<4>(l0), qh),
                (_mm256_srli_epi16::<4>(l1), _mm256_srli_epi16::<2>(qh)),
            ];
            for (k, (l, hb)) in w.into_iter().enumerate() {
                let w = _mm256_or_si256(_mm256_and_si256(l, nib), _mm256_and_si256(hb, bits45));
                // Vector 4h + k: groups 8h + 2k and the next, in half h of the factors.
                for_rows!(R, |r| {
                    let s = _mm256_permutevar8x32_ps(c[r], lanes[k]);
                    let q = x.q_at(r).add(QK * b + 128 * h + 32 * k);
                    let a = &mut acc[r][k % slots];
                    *a = madd_scaled(w, q, s, *a);
                });
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let a = &acc[r];
        let sum = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        out[r] = crate::simd::hsum(sum) - 32.0 * crate::simd::hsum(bacc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use luminal::quant::k4_scale_min;

    #[test]
    fn q4_k_scales_and_mins_match_the_reference_decoder() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1000 {
            let mut packed = [0u8; 12];
            for p in &mut packed {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *p = s as u8;
            }
            let (sc, mn) = q4_k_scales_mins(&packed);
            for j in 0..8 {
                let want = k4_scale_min(&packed, j);
                assert_eq!(((sc >> (8 * j)) as u8, (mn >> (8 * j)) as u8), want, "{j}");
            }
        }
    }
}
