//! Dot products of an f32 activation row with one weight row of ggml blocks, read in place
//! (the decode step's inner loop): Q4_0, Q4_1 and Q8_0 dequantize in registers, formed as
//! the reference decoder forms each weight (`d·q + m`, `d·(q − 8)`, `d·q`), so the only
//! difference from dequantize-then-dot is the order of the f32 sums. Other formats decode a
//! row into scratch first (see `super::weight_matmul`).

use crate::simd::Isa;
use luminal::quant::f16_at;
use luminal::DType;

/// Formats with an in-register dot.
pub(crate) fn has_fused_dot(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// `Σ x[k] · w[k]` over one row of `w` (`x.len() / 32` blocks of `dtype`, one of
/// [`has_fused_dot`]'s formats).
#[inline]
pub(crate) fn dot(isa: Isa, dtype: DType, x: &[f32], w: &[u8]) -> f32 {
    let nb = x.len() / 32;
    assert!(
        x.len() == nb * 32 && w.len() >= nb * dtype.block_bytes(),
        "quantized dot: {} values against {} bytes of {dtype}",
        x.len(),
        w.len()
    );
    match isa {
        // SAFETY: the features were detected at run time; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { dot_avx512(dtype, x, w) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { dot_avx2(dtype, x, w) },
        _ => dot_portable(dtype, x, w),
    }
}

/// Byte offset of the quants in a block (after the f16 scale, and Q4_1's f16 minimum).
fn quants_at(dtype: DType) -> usize {
    if dtype == DType::Q4_1 {
        4
    } else {
        2
    }
}

#[inline(always)]
fn dot_portable(dtype: DType, x: &[f32], w: &[u8]) -> f32 {
    // `mul_add` only where FMA is native: elsewhere it is a slow library call.
    let fma = crate::simd::fma::<{ crate::simd::NATIVE_FMA }>;
    let bb = dtype.block_bytes();
    let qo = quants_at(dtype);
    let mut acc = [0f32; 16];
    for (b, xs) in x.chunks_exact(32).enumerate() {
        let blk = &w[b * bb..(b + 1) * bb];
        let d = f16_at(blk, 0);
        match dtype {
            DType::Q4_1 => {
                let m = f16_at(blk, 2);
                for l in 0..16 {
                    let q = blk[qo + l];
                    acc[l] = fma(xs[l], d * (q & 15) as f32 + m, acc[l]);
                    acc[l] = fma(xs[l + 16], d * (q >> 4) as f32 + m, acc[l]);
                }
            }
            DType::Q4_0 => {
                for l in 0..16 {
                    let q = blk[qo + l];
                    acc[l] = fma(xs[l], d * ((q & 15) as i32 - 8) as f32, acc[l]);
                    acc[l] = fma(xs[l + 16], d * ((q >> 4) as i32 - 8) as f32, acc[l]);
                }
            }
            _ => {
                for l in 0..16 {
                    acc[l] = fma(xs[l], d * blk[qo + l] as i8 as f32, acc[l]);
                    acc[l] = fma(xs[l + 16], d * blk[qo + l + 16] as i8 as f32, acc[l]);
                }
            }
        }
    }
    let mut width = 16;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// The f16 at `b[at..at + 2]` by F16C (exact, as the reference's conversion).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
unsafe fn half_at(b: &[u8], at: usize) -> f32 {
    use std::arch::x86_64::*;
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// AVX-512: two blocks per iteration into four independent accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn dot_avx512(dtype: DType, x: &[f32], w: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let nb = x.len() / 32;
    let bb = dtype.block_bytes();
    let qo = quants_at(dtype);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let low = _mm_set1_epi8(15);
    let eight = _mm512_set1_epi32(8);
    let mut acc = [_mm512_setzero_ps(); 4];
    // The 32 weights of block `b` as two vectors of 16, formed as the decoder does.
    let weights = |b: usize| -> (__m512, __m512) {
        let blk = std::slice::from_raw_parts(wp.add(b * bb), bb);
        let d = _mm512_set1_ps(half_at(blk, 0));
        let qp = blk.as_ptr().add(qo);
        match dtype {
            DType::Q8_0 => {
                let q0 = _mm_loadu_si128(qp as *const __m128i);
                let q1 = _mm_loadu_si128(qp.add(16) as *const __m128i);
                let w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0));
                let w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1));
                (_mm512_mul_ps(d, w0), _mm512_mul_ps(d, w1))
            }
            _ => {
                let q = _mm_loadu_si128(qp as *const __m128i);
                let mut lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, low));
                let mut hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low));
                if dtype == DType::Q4_0 {
                    lo = _mm512_sub_epi32(lo, eight);
                    hi = _mm512_sub_epi32(hi, eight);
                }
                let (lo, hi) = (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi));
                if dtype == DType::Q4_1 {
                    let m = _mm512_set1_ps(half_at(blk, 2));
                    (
                        _mm512_add_ps(_mm512_mul_ps(d, lo), m),
                        _mm512_add_ps(_mm512_mul_ps(d, hi), m),
                    )
                } else {
                    (_mm512_mul_ps(d, lo), _mm512_mul_ps(d, hi))
                }
            }
        }
    };
    let mut b = 0;
    while b + 2 <= nb {
        for u in 0..2 {
            let (w0, w1) = weights(b + u);
            let xs = xp.add((b + u) * 32);
            acc[2 * u] = _mm512_fmadd_ps(_mm512_loadu_ps(xs), w0, acc[2 * u]);
            acc[2 * u + 1] = _mm512_fmadd_ps(_mm512_loadu_ps(xs.add(16)), w1, acc[2 * u + 1]);
        }
        b += 2;
    }
    if b < nb {
        let (w0, w1) = weights(b);
        let xs = xp.add(b * 32);
        acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(xs), w0, acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(xs.add(16)), w1, acc[1]);
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(sum)
}

/// AVX2 + FMA: a block is four vectors of 8, each with its own accumulator.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(dtype: DType, x: &[f32], w: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let nb = x.len() / 32;
    let bb = dtype.block_bytes();
    let qo = quants_at(dtype);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let low = _mm_set1_epi8(15);
    let eight = _mm256_set1_epi32(8);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(wp.add(b * bb), bb);
        let d = _mm256_set1_ps(half_at(blk, 0));
        let qp = blk.as_ptr().add(qo);
        // The block's 32 quants as four vectors of 8 i32 (elements 0-7, 8-15, 16-23, 24-31).
        let q: [__m256i; 4] = match dtype {
            DType::Q8_0 => {
                let q0 = _mm_loadu_si128(qp as *const __m128i);
                let q1 = _mm_loadu_si128(qp.add(16) as *const __m128i);
                [
                    _mm256_cvtepi8_epi32(q0),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8)),
                    _mm256_cvtepi8_epi32(q1),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8)),
                ]
            }
            _ => {
                let q = _mm_loadu_si128(qp as *const __m128i);
                let lo = _mm_and_si128(q, low);
                let hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
                let mut v = [
                    _mm256_cvtepu8_epi32(lo),
                    _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                    _mm256_cvtepu8_epi32(hi),
                    _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)),
                ];
                if dtype == DType::Q4_0 {
                    for x in &mut v {
                        *x = _mm256_sub_epi32(*x, eight);
                    }
                }
                v
            }
        };
        let m = (dtype == DType::Q4_1).then(|| _mm256_set1_ps(half_at(blk, 2)));
        for (u, qu) in q.iter().enumerate() {
            let mut wv = _mm256_mul_ps(d, _mm256_cvtepi32_ps(*qu));
            if let Some(m) = m {
                wv = _mm256_add_ps(wv, m);
            }
            acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(b * 32 + 8 * u)), wv, acc[u]);
        }
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    crate::simd::hsum(sum)
}
