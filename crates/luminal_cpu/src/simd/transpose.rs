//! 16 × 16 f32 tiles transposed in AVX-512 registers (a head's transposes in the attention
//! kernels, transposing views' gather tables): four rounds of shuffles instead of a store
//! per value.

/// `dst[c·ds + r] = src[r·ss + c]` for `r, c < 16`.
///
/// # Safety
/// AVX-512F must be available; the 16 rows of 16 values at `src` (`ss` apart) and at `dst`
/// (`ds` apart) must be readable and writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn tile_avx512(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    let mut r = [_mm512_setzero_ps(); 16];
    for (i, x) in r.iter_mut().enumerate() {
        *x = _mm512_loadu_ps(src.add(i * ss));
    }
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        let (a, b, c, e) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
        r[4 * i] = _mm512_shuffle_ps::<0x44>(a, c);
        r[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(a, c);
        r[4 * i + 2] = _mm512_shuffle_ps::<0x44>(b, e);
        r[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(b, e);
    }
    for h in 0..2 {
        for j in 0..4 {
            let (a, b) = (r[8 * h + j], r[8 * h + 4 + j]);
            t[8 * h + j] = _mm512_shuffle_f32x4::<0x88>(a, b);
            t[8 * h + 4 + j] = _mm512_shuffle_f32x4::<0xDD>(a, b);
        }
    }
    for j in 0..8 {
        r[j] = _mm512_shuffle_f32x4::<0x88>(t[j], t[8 + j]);
        r[8 + j] = _mm512_shuffle_f32x4::<0xDD>(t[j], t[8 + j]);
    }
    for (c, x) in r.iter().enumerate() {
        _mm512_storeu_ps(dst.add(c * ds), *x);
    }
}
