//! Fused int8 dots for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): the quants
//! are unpacked in registers and multiplied with the quantized activations (`int8.rs`) at
//! once, without the scratch row the other formats go through.
//!
//! A block contributes `d_w · Σ_g d_g · Σ u·q + b_w · Σ_g d_g · Σ q` over its two groups
//! `g` of 16 activations, with `u` and `b_w` as in `unpack.rs` (Q8_0: signed `u`, no bias). AVX-512 VNNI takes two blocks per `vpdpbusd`;
//! AVX2 one block per `vpmaddubsw` + `vpmaddwd`.

use super::int8::{DotPath, QRow};
use luminal::DType;

/// Formats with a fused dot.
pub(crate) fn has_fused_dot(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
    )
}

/// `Σ w·x` of one weight row (whole blocks of `dtype`, a [`has_fused_dot`] format) and a
/// quantized activation row of the same length, on a SIMD path (`path` is not portable).
pub(crate) fn dot(path: DotPath, dtype: DType, row: &[u8], x: QRow) -> f32 {
    let nb = x.q.len() / 32;
    assert!(
        row.len() == nb * dtype.block_bytes() && x.dg.len() == 2 * nb && x.sb.len() == nb,
        "int8 dot: {} bytes of {dtype} against {} activations",
        row.len(),
        x.q.len()
    );
    macro_rules! go {
        ($f:ident) => {
            match dtype {
                DType::Q4_0 => $f::<0>(row, x),
                DType::Q4_1 => $f::<1>(row, x),
                DType::Q5_0 => $f::<2>(row, x),
                DType::Q5_1 => $f::<3>(row, x),
                _ => $f::<4>(row, x),
            }
        };
    }
    match path {
        // SAFETY: the path's features were detected at run time; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        DotPath::Vnni512 => unsafe { go!(dot_vnni) },
        #[cfg(target_arch = "x86_64")]
        DotPath::Avx2 => unsafe { go!(dot_avx2) },
        _ => unreachable!("fused int8 dot on the portable path"),
    }
}

/// Block bytes of format `F` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
const fn block_bytes(f: u8) -> usize {
    [18, 20, 22, 24, 34][f as usize]
}

/// The weight bias of a block of format `F` at `blk` with scale `d`, per unit of
/// `d_x · Σ q`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bias<const F: u8>(blk: *const u8, d: f32) -> f32 {
    match F {
        0 => -8.0 * d,
        2 => -16.0 * d,
        // Q4_1 / Q5_1 blocks store their minimum at bytes 2..4.
        1 | 3 => half(blk.add(2)),
        _ => 0.0,
    }
}

/// The f16 at `p` by F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    use std::arch::x86_64::*;
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The fifth bits of a Q5 block (`qh` at `p`).
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

/// The 16-bit value at `p`.
#[inline(always)]
unsafe fn bits16(p: *const u8) -> i16 {
    (p as *const i16).read_unaligned()
}

/// AVX-512 VNNI: four blocks an iteration — their scales converted, doubled and multiplied
/// by the eight group scales of the activations as one vector, then two `vpdpbusd` of two
/// blocks each (a 128-bit lane of the product is one group of 16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_vnni<const F: u8>(row: &[u8], x: QRow) -> f32 {
    use std::arch::x86_64::*;
    let bb = block_bytes(F);
    let nb = x.q.len() / 32;
    let (wp, qp) = (row.as_ptr(), x.q.as_ptr());
    let zero = _mm512_setzero_si512();
    let low = _mm512_set1_epi8(15);
    // Per 128-bit lane: the low nibbles (elements 0-15), then the high ones (16-31).
    let four = 0x0004_0004_0004_0004;
    let shifts = _mm512_setr_epi64(0, 0, four, four, 0, 0, four, four);
    // Lanes of groups 0-3 (blocks 0 and 1) and 4-7 (blocks 2 and 3) of eight scales.
    let lanes01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let lanes23 = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    let twice = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    // Two blocks of weights (`b0`, `b0 + bb`) as 64 bytes.
    let pair = |b0: *const u8| -> __m512i {
        let b1 = b0.add(bb);
        if F == 4 {
            let lo = _mm256_loadu_si256(b0.add(2) as *const __m256i);
            let hi = _mm256_loadu_si256(b1.add(2) as *const __m256i);
            return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        let q0 = _mm_loadu_si128(b0.add(bb - 16) as *const __m128i);
        let q1 = _mm_loadu_si128(b1.add(bb - 16) as *const __m128i);
        let z = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(q0), 0xFF00, q1);
        let w = _mm512_and_si512(_mm512_srlv_epi16(z, shifts), low);
        if F == 2 || F == 3 {
            let at = if F == 2 { 2 } else { 4 };
            let bits = fifth_bits(b0.add(at)) as u64 | (fifth_bits(b1.add(at)) as u64) << 32;
            return _mm512_or_si512(w, _mm512_maskz_set1_epi8(bits, 0x10));
        }
        w
    };
    let product = |w: __m512i, at: usize| -> __m512 {
        let mut w = w;
        let mut xv = _mm512_loadu_si512(qp.add(at) as *const _);
        if F == 4 {
            let neg = _mm512_movepi8_mask(w);
            xv = _mm512_mask_sub_epi8(xv, neg, zero, xv);
            w = _mm512_abs_epi8(w);
        }
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, w, xv))
    };
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut bacc = _mm_setzero_ps();
    let mut b = 0;
    while b + 4 <= nb {
        let blk = wp.add(b * bb);
        let d = _mm_cvtph_ps(_mm_setr_epi16(
            bits16(blk),
            bits16(blk.add(bb)),
            bits16(blk.add(2 * bb)),
            bits16(blk.add(3 * bb)),
            0,
            0,
            0,
            0,
        ));
        let c = _mm512_castps256_ps512(_mm256_mul_ps(
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), twice),
            _mm256_loadu_ps(x.dg.as_ptr().add(2 * b)),
        ));
        let sb = _mm_loadu_ps(x.sb.as_ptr().add(b));
        match F {
            0 | 2 => bacc = _mm_fmadd_ps(d, sb, bacc),
            1 | 3 => {
                let m = _mm_cvtph_ps(_mm_setr_epi16(
                    bits16(blk.add(2)),
                    bits16(blk.add(bb + 2)),
                    bits16(blk.add(2 * bb + 2)),
                    bits16(blk.add(3 * bb + 2)),
                    0,
                    0,
                    0,
                    0,
                ));
                bacc = _mm_fmadd_ps(m, sb, bacc);
            }
            _ => {}
        }
        let p0 = product(pair(blk), 32 * b);
        let p1 = product(pair(blk.add(2 * bb)), 32 * b + 64);
        acc0 = _mm512_fmadd_ps(p0, _mm512_permutexvar_ps(lanes01, c), acc0);
        acc1 = _mm512_fmadd_ps(p1, _mm512_permutexvar_ps(lanes23, c), acc1);
        b += 4;
    }
    // Q4_0 / Q5_0: the bias is −8d / −16d.
    let bscale = match F {
        0 => -8.0,
        2 => -16.0,
        _ => 1.0,
    };
    let bias = _mm_mul_ps(bacc, _mm_set1_ps(bscale));
    let b2 = _mm_add_ps(bias, _mm_movehl_ps(bias, bias));
    let b1 = _mm_add_ss(b2, _mm_shuffle_ps(b2, b2, 1));
    let mut total = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + _mm_cvtss_f32(b1);
    if b < nb {
        total += dot_avx2::<F>(&row[b * bb..], x.tail(b));
    }
    total
}

/// `v`'s 32 bits as 32 bytes, `0xFF` where the bit is set.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bytes_from_bits(v: u32) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let rep = _mm256_shuffle_epi8(
        _mm256_set1_epi32(v as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<const F: u8>(row: &[u8], x: QRow) -> f32 {
    use std::arch::x86_64::*;
    let bb = block_bytes(F);
    let nb = x.q.len() / 32;
    let (wp, qp) = (row.as_ptr(), x.q.as_ptr());
    let low = _mm256_set1_epi8(15);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut bsum = 0f32;
    for b in 0..nb {
        let blk = wp.add(b * bb);
        let mut w = if F == 4 {
            _mm256_loadu_si256(blk.add(2) as *const __m256i)
        } else {
            let q = _mm_loadu_si128(blk.add(bb - 16) as *const __m128i);
            let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
            let mut w = _mm256_and_si256(both, low);
            if F == 2 || F == 3 {
                let at = if F == 2 { 2 } else { 4 };
                let high = bytes_from_bits(fifth_bits(blk.add(at)));
                w = _mm256_or_si256(w, _mm256_and_si256(high, _mm256_set1_epi8(0x10)));
            }
            w
        };
        let mut xv = _mm256_loadu_si256(qp.add(32 * b) as *const __m256i);
        if F == 4 {
            xv = _mm256_sign_epi8(xv, w);
            w = _mm256_abs_epi8(w);
        }
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
        let d = half(blk);
        // Lanes 0-3 hold the first group of 16, lanes 4-7 the second.
        let s = _mm256_mul_ps(
            _mm256_set1_ps(d),
            _mm256_set_m128(
                _mm_set1_ps(*x.dg.get_unchecked(2 * b + 1)),
                _mm_set1_ps(*x.dg.get_unchecked(2 * b)),
            ),
        );
        acc[b % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[b % 2]);
        if F != 4 {
            bsum += bias::<F>(blk, d) * *x.sb.get_unchecked(b);
        }
    }
    let sum = _mm256_add_ps(acc[0], acc[1]);
    crate::half_matvec::hsum(sum) + bsum
}
