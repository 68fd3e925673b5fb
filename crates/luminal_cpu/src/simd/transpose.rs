//! 16 × 16 f32 tiles transposed in AVX-512 registers (8 × 8 in AVX2 ones) (a head's transposes in the attention
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

/// `dst[c·ds + r] = src[r·ss + c]` for `r, c < 8`: pairs of rows interleaved, then pairs of
/// pairs, then the 128-bit halves exchanged.
///
/// # Safety
/// AVX must be available; the 8 rows of 8 values at `src` (`ss` apart) and at `dst` (`ds`
/// apart) must be readable and writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn tile_avx2(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ss)));
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[4h + 2p + q]: rows 4h..4h + 4, from t[4h + p] and t[4h + 2 + p], lanes q.
    let u: [__m256; 8] = std::array::from_fn(|i| {
        let (h, p, q) = (i / 4, (i / 2) % 2, i % 2);
        let (a, b) = (t[4 * h + p], t[4 * h + 2 + p]);
        if q == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    for c in 0..4 {
        _mm256_storeu_ps(
            dst.add(c * ds),
            _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]),
        );
        _mm256_storeu_ps(
            dst.add((c + 4) * ds),
            _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]),
        );
    }
}
