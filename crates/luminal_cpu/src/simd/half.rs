//! Vectorised f16 / bf16 conversions for the half kernels: widening (exact), narrowing
//! (round to nearest even, the reference's single rounding of an `f32` value), and rounding
//! an `f32` block to half precision in place of a store and reload.
//!
//! bf16 conversions are integer shifts and adds, written as plain loops that vectorise for
//! whatever instruction set the caller is compiled for. f16 uses F16C (`vcvtph2ps`,
//! `vcvtps2ph`) when the CPU has it and the kernels run at AVX2 or above (see
//! [`crate::simd::set_max_isa`]), and `half`'s conversions otherwise.

#[cfg(test)]
use half::bf16;
use half::f16;
use luminal::DType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One of the two half types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfKind {
    F16,
    BF16,
}

impl HalfKind {
    /// The half type of `dtype`, if it is one.
    pub fn of(dtype: DType) -> Option<HalfKind> {
        match dtype {
            DType::F16 => Some(HalfKind::F16),
            DType::BF16 => Some(HalfKind::BF16),
            _ => None,
        }
    }
}

/// Whether the AVX2 + F16C kernels may run: the CPU has both and the instruction-set cap
/// allows AVX2.
#[inline]
pub fn fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::simd::isa() >= crate::simd::Isa::Avx2 && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The vector level of the kernels that read half weights in place (`matmul/skinny_half.rs`,
/// `matmul/half/gemm.rs`): AVX-512, or AVX2 + F16C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HalfLevel {
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The level the CPU and the instruction-set cap allow; `None` below AVX2 + F16C (the
/// portable paths).
pub(crate) fn half_level() -> Option<HalfLevel> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::isa() >= crate::simd::Isa::Avx512 {
            return Some(HalfLevel::Avx512);
        }
        if fast() {
            return Some(HalfLevel::Avx2);
        }
    }
    None
}

/// Every level this CPU has, whatever the cap (the kernel tests run each).
#[cfg(test)]
pub(crate) fn detected_half_levels() -> Vec<HalfLevel> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let d = crate::simd::detected_isa();
        if d >= crate::simd::Isa::Avx2 && std::arch::is_x86_feature_detected!("f16c") {
            v.push(HalfLevel::Avx2);
        }
        if d >= crate::simd::Isa::Avx512 {
            v.push(HalfLevel::Avx512);
        }
    }
    v
}

/// The bf16 bits of `x`, rounded to nearest even; NaN stays NaN (quieted, as `half` does).
#[inline(always)]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) | 0x40) as u16;
    if x.is_nan() {
        nan
    } else {
        rounded
    }
}

/// `x` rounded to bf16 precision (as `f32`).
#[inline(always)]
fn bf16_round(x: f32) -> f32 {
    f32::from_bits((bf16_bits(x) as u32) << 16)
}

/// `src` widened into `dst` with F16C.
///
/// # Safety
/// The CPU supports AVX2 and F16C; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn widen_f16_f16c(src: &[f16], dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n elements of both slices.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i) as *const __m128i));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}

/// `src` rounded into `dst` with F16C (round to nearest even, whatever MXCSR says).
///
/// # Safety
/// The CPU supports AVX2 and F16C; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn narrow_f16_f16c(src: &[f32], dst: &mut [f16]) {
    let n = dst.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n elements of both slices.
        unsafe {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// `src` rounded to f16 precision into `dst`, with F16C.
///
/// # Safety
/// The CPU supports AVX2 and F16C; `src.len() >= dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn round_f16_f16c(src: &[f32], dst: &mut [f32]) {
    let n = dst.len();
    assert!(src.len() >= n);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n elements of both slices.
        unsafe {
            let x = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]).to_f32();
    }
}

/// `x` rounded to the precision of `kind` (to nearest even; overflow to ±inf, NaN stays NaN).
#[inline(always)]
pub fn round_one(kind: HalfKind, x: f32) -> f32 {
    match kind {
        HalfKind::F16 => f16::from_f32(x).to_f32(),
        HalfKind::BF16 => bf16_round(x),
    }
}

/// `dst[i] = round_one(kind, src[i])` for `i < dst.len()`.
#[inline(always)]
pub fn round_block(kind: HalfKind, src: &[f32], dst: &mut [f32]) {
    let n = dst.len();
    let src = &src[..n];
    match kind {
        HalfKind::BF16 => {
            for i in 0..n {
                dst[i] = bf16_round(src[i]);
            }
        }
        HalfKind::F16 => {
            #[cfg(target_arch = "x86_64")]
            if fast() {
                // SAFETY: AVX2 and F16C were detected; `src` holds `n` elements.
                unsafe { round_f16_f16c(src, dst) };
                return;
            }
            for i in 0..n {
                dst[i] = f16::from_f32(src[i]).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Elem;

    /// Every f32 class: zeros, subnormals, ties of both half types, overflow, NaN.
    fn values() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            65504.0,
            65519.0,
            65520.0,
            f32::from_bits(0x7F7F_8000),
            f32::from_bits(0x7F7F_7FFF),
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(1),
            f32::from_bits(0x0000_8000),
            f32::from_bits(0x0001_8000),
            2f32.powi(-25),
            3.0 * 2f32.powi(-25),
        ];
        let mut s = 0x1234_5678u32;
        for _ in 0..5000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s));
        }
        v
    }

    fn same(a: f32, b: f32) -> bool {
        (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
    }

    #[test]
    fn conversions_match_half() {
        let xs = values();
        let n = xs.len();
        let (mut r16, mut rb) = (vec![0f32; n], vec![0f32; n]);
        round_block(HalfKind::F16, &xs, &mut r16);
        round_block(HalfKind::BF16, &xs, &mut rb);
        let (mut h16, mut hb) = (vec![f16::ZERO; n], vec![bf16::ZERO; n]);
        f16::narrow(&xs, &mut h16);
        bf16::narrow(&xs, &mut hb);
        let (mut w16, mut wb) = (vec![0f32; n], vec![0f32; n]);
        f16::widen(&h16, &mut w16);
        bf16::widen(&hb, &mut wb);
        for i in 0..n {
            let x = xs[i];
            let (e16, eb) = (f16::from_f32(x), bf16::from_f32(x));
            assert!(same(r16[i], e16.to_f32()), "f16 round {x:e}");
            assert!(same(rb[i], eb.to_f32()), "bf16 round {x:e}");
            assert!(same(round_one(HalfKind::F16, x), e16.to_f32()));
            assert!(same(round_one(HalfKind::BF16, x), eb.to_f32()));
            assert!(same(h16[i].to_f32(), e16.to_f32()), "f16 narrow {x:e}");
            assert!(same(hb[i].to_f32(), eb.to_f32()), "bf16 narrow {x:e}");
            assert!(same(w16[i], e16.to_f32()) && same(wb[i], eb.to_f32()));
        }
    }
}
