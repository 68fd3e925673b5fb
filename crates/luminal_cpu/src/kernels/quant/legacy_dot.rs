//! Fused int8 dots for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): the quants
//! are unpacked in registers and multiplied with the quantized activations (`int8.rs`) at
//! once, without the scratch row the other formats go through.
//!
//! A block contributes `d_w · Σ_g d_g · Σ u·q + b_w · Σ_g d_g · Σ q` over its two groups
//! `g` of 16 activations, with `u` and `b_w` as in `unpack.rs` (Q8_0: signed `u`, no bias).
//! AVX-512 VNNI takes two blocks per `vpdpbusd`; AVX2 one block per `vpmaddubsw` +
//! `vpmaddwd`. Each kernel takes `R ≤ 4` activation rows (a const generic): the blocks are
//! unpacked once and dotted with every row (one accumulator set per row), so a skinny
//! product of `M` rows unpacks each weight row `⌈M / 4⌉` times, not `M` times; with one row
//! the arithmetic is the single-row kernel's.

use super::int8::{DotPath, QRows, RowsKernel};
use luminal::DType;

/// Formats with a fused dot.
pub(crate) fn has_fused_dot(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
    )
}

/// Most activation rows one call dots with a weight row (see [`kernel`]).
pub(crate) const MAX_R: usize = 4;

/// The kernel computing `out[r] = Σ w·x_r` of one weight row (whole blocks of `dtype`, a
/// [`has_fused_dot`] format, `row_len` bytes) and each of the `x.rows ≤ MAX_R` quantized
/// activation rows `x_r`, on a SIMD path (`path` is not portable), after checking the
/// operands: a product's loop over many weight rows checks once, then calls it for each
/// (with `x` and an `out` of `x.rows` values). The weight's blocks are unpacked in
/// registers once and multiplied with every row.
pub(crate) fn kernel(path: DotPath, dtype: DType, row_len: usize, x: &QRows) -> RowsKernel {
    let nb = x.k / 32;
    assert!(
        has_fused_dot(dtype)
            && x.is_valid()
            && row_len == nb * dtype.block_bytes()
            && x.rows <= MAX_R,
        "int8 dot: {row_len} bytes of {dtype} against {} rows of {} activations",
        x.rows,
        x.k
    );
    macro_rules! rows {
        ($f:ident, $t:literal) => {
            match (x.rows, x.two_level()) {
                (1, false) => $f::<$t, 1, false> as RowsKernel,
                (2, false) => $f::<$t, 2, false>,
                (3, false) => $f::<$t, 3, false>,
                (_, false) => $f::<$t, 4, false>,
                (1, true) => $f::<$t, 1, true>,
                (2, true) => $f::<$t, 2, true>,
                (3, true) => $f::<$t, 3, true>,
                (_, true) => $f::<$t, 4, true>,
            }
        };
    }
    macro_rules! formats {
        ($f:ident) => {
            match dtype {
                DType::Q4_0 => rows!($f, 0),
                DType::Q4_1 => rows!($f, 1),
                DType::Q5_0 => rows!($f, 2),
                DType::Q5_1 => rows!($f, 3),
                _ => rows!($f, 4),
            }
        };
    }
    match path {
        #[cfg(target_arch = "x86_64")]
        DotPath::Vnni512 => formats!(kernel_vnni),
        #[cfg(target_arch = "x86_64")]
        DotPath::Avx2 => formats!(kernel_avx2),
        _ => unreachable!("fused int8 dot on the portable path"),
    }
}

/// [`dot_vnni`] into `out` (`R` values).
///
/// # Safety
/// As [`dot_vnni`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn kernel_vnni<const F: u8, const R: usize, const L2: bool>(
    row: &[u8],
    x: &QRows,
    out: &mut [f32],
) {
    out[..R].copy_from_slice(&dot_vnni::<F, R, L2>(row, x));
}

/// [`dot_avx2`] into `out` (`R` values).
///
/// # Safety
/// As [`dot_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_avx2<const F: u8, const R: usize, const L2: bool>(
    row: &[u8],
    x: &QRows,
    out: &mut [f32],
) {
    out[..R].copy_from_slice(&dot_avx2::<F, R, L2>(row, x));
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
///
/// # Safety
/// `p .. p + 2` is readable and the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn half(p: *const u8) -> f32 {
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
/// blocks each (a 128-bit lane of the product is one group of 16). The weights are unpacked
/// once per iteration for all `R` activation rows. Two-level rows (`L2`): the second
/// level's `vpdpbusd` accumulates into the first's sums shifted left by 8 (see `int8.rs`).
///
/// # Safety
/// The CPU has the enabled features; `row` holds `x.k / 32` blocks and `x` is valid
/// (checked by [`kernel`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_vnni<const F: u8, const R: usize, const L2: bool>(row: &[u8], x: &QRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let bb = block_bytes(F);
    let nb = x.k / 32;
    let wp = row.as_ptr();
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
    // `Σ u·q` per lane of unsigned weights `w` (Q8_0: `|w|`, with `neg` its negative
    // bytes) and the 64 activations at `q` (two-level: `256 · Σ u·q + Σ u·q₂`, `q₂` at
    // `q2`).
    let product = |w: __m512i, neg: __mmask64, q: *const i8, q2: *const i8| -> __m512 {
        let load = |p: *const i8| {
            let xv = _mm512_loadu_si512(p as *const _);
            if F == 4 {
                _mm512_mask_sub_epi8(xv, neg, zero, xv)
            } else {
                xv
            }
        };
        let p = _mm512_dpbusd_epi32(zero, w, load(q));
        if L2 {
            let p = _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(p), w, load(q2));
            return _mm512_cvtepi32_ps(p);
        }
        _mm512_cvtepi32_ps(p)
    };
    // Q8_0: the weights' signs moved onto the activations.
    let unsigned = |w: __m512i| -> (__m512i, __mmask64) {
        if F == 4 {
            (_mm512_abs_epi8(w), _mm512_movepi8_mask(w))
        } else {
            (w, 0)
        }
    };
    // One row: two accumulators; more rows: one each (the rows interleave).
    let second = if R == 1 { 1 } else { 0 };
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut bacc = [_mm_setzero_ps(); R];
    // The f16 fields at byte `at` of `count ≤ 4` blocks from `blk` (the rest zero), and the
    // factor of `sb` in the bias: d (Q4_0 / Q5_0), the minimum (Q4_1 / Q5_1).
    let halves = |blk: *const u8, at: usize, count: usize| {
        let h = |i: usize| {
            if i < count {
                bits16(blk.add(i * bb + at))
            } else {
                0
            }
        };
        _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0))
    };
    let bias_factor = |blk: *const u8, count: usize, d: __m128| match F {
        1 | 3 => halves(blk, 2, count),
        _ => d,
    };
    let mut b = 0;
    while b + 4 <= nb {
        let blk = wp.add(b * bb);
        let d = halves(blk, 0, 4);
        let d2 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), twice);
        let bw = bias_factor(blk, 4, d);
        let (w0, n0) = unsigned(pair(blk));
        let (w1, n1) = unsigned(pair(blk.add(2 * bb)));
        for_rows!(R, |r| {
            let c =
                _mm512_castps256_ps512(_mm256_mul_ps(d2, _mm256_loadu_ps(x.dg_at(r).add(2 * b))));
            if F != 4 {
                bacc[r] = _mm_fmadd_ps(bw, _mm_loadu_ps(x.sb_at(r).add(b)), bacc[r]);
            }
            let q = x.q_at(r).add(32 * b);
            let q2 = x.q2_at(r).wrapping_add(32 * b);
            let p0 = product(w0, n0, q, q2);
            let p1 = product(w1, n1, q.add(64), q2.wrapping_add(64));
            let a = &mut acc[r];
            a[0] = _mm512_fmadd_ps(p0, _mm512_permutexvar_ps(lanes01, c), a[0]);
            a[second] = _mm512_fmadd_ps(p1, _mm512_permutexvar_ps(lanes23, c), a[second]);
        });
        b += 4;
    }
    // Two blocks left (K = 576: 18 blocks): one more 64-value step on the upper half of the
    // same lanes, instead of the AVX2 tail below.
    if b + 2 <= nb {
        let blk = wp.add(b * bb);
        let d = halves(blk, 0, 2);
        // d0 d0 d1 d1: one scale per group of 16.
        let d2 = _mm_unpacklo_ps(d, d);
        let bw = bias_factor(blk, 2, d);
        let (w0, n0) = unsigned(pair(blk));
        for_rows!(R, |r| {
            // Four groups' scales (two blocks); only two block sums remain in the row.
            let dg = _mm_loadu_ps(x.dg_at(r).add(2 * b));
            let c = _mm512_castps128_ps512(_mm_mul_ps(d2, dg));
            if F != 4 {
                let sb = _mm_maskz_loadu_ps(0b11, x.sb_at(r).add(b));
                bacc[r] = _mm_fmadd_ps(bw, sb, bacc[r]);
            }
            let p0 = product(
                w0,
                n0,
                x.q_at(r).add(32 * b),
                x.q2_at(r).wrapping_add(32 * b),
            );
            let a = &mut acc[r];
            a[0] = _mm512_fmadd_ps(p0, _mm512_permutexvar_ps(lanes01, c), a[0]);
        });
        b += 2;
    }
    // Q4_0 / Q5_0: the bias is −8d / −16d.
    let bscale = _mm_set1_ps(match F {
        0 => -8.0,
        2 => -16.0,
        _ => 1.0,
    });
    let mut out = [0f32; R];
    for r in 0..R {
        let bias = _mm_mul_ps(bacc[r], bscale);
        let b2 = _mm_add_ps(bias, _mm_movehl_ps(bias, bias));
        let b1 = _mm_add_ss(b2, _mm_shuffle_ps(b2, b2, 1));
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) + _mm_cvtss_f32(b1);
    }
    if b < nb {
        let tail = dot_avx2::<F, R, L2>(&row[b * bb..], &x.tail(b));
        for (o, t) in out.iter_mut().zip(tail) {
            *o += t;
        }
    }
    out
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

/// f16 → f32 of every bit pattern (256 KiB, built on first use): the AVX2 dots broadcast a
/// block's scale straight from it (two loads) instead of converting it in vector registers
/// (`vmovd`, `vcvtph2ps`, a broadcast: three shuffle-port µops a block).
#[cfg(target_arch = "x86_64")]
fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Box<[f32]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    })
}

/// AVX2: one block a step (`vpmaddubsw` + `vpmaddwd`), unpacked once for all `R` rows
/// (two-level rows: the weights widened to i16 once, then two `vpmaddwd` a row with the
/// combined values `256 · q + q₂`, which fit in i16).
/// Per block and row: the integer products scaled by `d ·` the row's eight-lane group scales
/// (`dg8`), and the bias (`d` or the minimum, times the eight-lane group sums `sq8`)
/// accumulated as vectors; two accumulators of each a row for one or two rows (alternate
/// blocks), one for more.
///
/// # Safety
/// As [`dot_vnni`] (AVX2, FMA, F16C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<const F: u8, const R: usize, const L2: bool>(row: &[u8], x: &QRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let table = f16_table().as_ptr();
    let scale = |p: *const u8| {
        _mm256_broadcast_ss(&*table.add((p as *const u16).read_unaligned() as usize))
    };
    let bb = block_bytes(F);
    let nb = x.k / 32;
    let wp = row.as_ptr();
    let low = _mm256_set1_epi8(15);
    let ones = _mm256_set1_epi16(1);
    let alternate = R <= 2;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut bacc = [[_mm256_setzero_ps(); 2]; R];
    for b2 in (0..nb).step_by(2) {
        for h in 0..2 {
            let b = b2 + h;
            if b >= nb {
                break;
            }
            let blk = wp.add(b * bb);
            let w = if F == 4 {
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
            // Q8_0: the weights' signs moved onto the activations.
            let wu = if F == 4 { _mm256_abs_epi8(w) } else { w };
            // Two levels: the weights as i16, values 0-7 | 16-23 and 8-15 | 24-31 (the
            // activations' `q16` order), sign-extended for Q8_0.
            let (wa, wb) = if L2 {
                let ext = if F == 4 {
                    _mm256_cmpgt_epi8(_mm256_setzero_si256(), w)
                } else {
                    _mm256_setzero_si256()
                };
                (_mm256_unpacklo_epi8(w, ext), _mm256_unpackhi_epi8(w, ext))
            } else {
                (w, w)
            };
            let dv = scale(blk);
            // The factor of `sq8` in the bias: d (Q4_0 / Q5_0; −8 / −16 applied at the
            // end), the minimum (Q4_1 / Q5_1).
            let bv = if F == 1 || F == 3 {
                scale(blk.add(2))
            } else {
                dv
            };
            let slot = if alternate { h } else { 0 };
            for_rows!(R, |r| {
                let p = if L2 {
                    // `256 · Σ u·q + Σ u·q₂` as i16 products, the groups' sums in the
                    // lanes of the one-level kernel.
                    let q16 = x.q16_at(r).wrapping_add(32 * b);
                    let xa = _mm256_loadu_si256(q16 as *const __m256i);
                    let xb = _mm256_loadu_si256(q16.wrapping_add(16) as *const __m256i);
                    _mm256_add_epi32(_mm256_madd_epi16(wa, xa), _mm256_madd_epi16(wb, xb))
                } else {
                    let mut xv = _mm256_loadu_si256(x.q_at(r).add(32 * b) as *const __m256i);
                    if F == 4 {
                        xv = _mm256_sign_epi8(xv, w);
                    }
                    _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xv), ones)
                };
                let s = _mm256_mul_ps(dv, _mm256_loadu_ps(x.dg8_at(r).add(8 * b)));
                acc[r][slot] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][slot]);
                if F != 4 {
                    bacc[r][slot] =
                        _mm256_fmadd_ps(bv, _mm256_loadu_ps(x.sq8_at(r).add(8 * b)), bacc[r][slot]);
                }
            });
        }
    }
    let bscale = match F {
        0 => -8.0,
        2 => -16.0,
        _ => 1.0,
    };
    let mut out = [0f32; R];
    for r in 0..R {
        let sum = _mm256_add_ps(acc[r][0], acc[r][1]);
        out[r] = crate::simd::hsum(sum);
        if F != 4 {
            out[r] += bscale * crate::simd::hsum(_mm256_add_ps(bacc[r][0], bacc[r][1]));
        }
    }
    out
}

/// [`unpack::unpack`](super::unpack::unpack) of a row of a [`has_fused_dot`] format with
/// AVX2 (the wide products' panel fill, which runs with AVX-512 VNNI): the same bytes, scales
/// and biases, one block a step instead of one value (Q5_0 16.5 -> ~3 ns per 64 weights).
/// Returns false (nothing written) without AVX2 and F16C.
pub(crate) fn unpack_row(
    dtype: DType,
    row: &[u8],
    u: &mut [u8],
    a: &mut [f32],
    b: &mut [f32],
) -> bool {
    let nb = u.len() / 32;
    assert!(
        has_fused_dot(dtype)
            && u.len() == nb * 32
            && row.len() == nb * dtype.block_bytes()
            && a.len() == 2 * nb
            && b.len() == 2 * nb,
        "unpack {dtype}: {} bytes into {} values",
        row.len(),
        u.len()
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        // SAFETY: the features were detected; lengths checked above.
        unsafe {
            match dtype {
                DType::Q4_0 => unpack_avx2::<0>(row, u, a, b),
                DType::Q4_1 => unpack_avx2::<1>(row, u, a, b),
                DType::Q5_0 => unpack_avx2::<2>(row, u, a, b),
                DType::Q5_1 => unpack_avx2::<3>(row, u, a, b),
                _ => unpack_avx2::<4>(row, u, a, b),
            }
        }
        return true;
    }
    false
}

/// # Safety
/// AVX2 and F16C; `row` holds `u.len() / 32` blocks of format `F`, `a` and `b` two groups
/// a block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_avx2<const F: u8>(row: &[u8], u: &mut [u8], a: &mut [f32], b: &mut [f32]) {
    use std::arch::x86_64::*;
    let bb = block_bytes(F);
    let low = _mm256_set1_epi8(15);
    for blk_i in 0..u.len() / 32 {
        let blk = row.as_ptr().add(blk_i * bb);
        let w = if F == 4 {
            _mm256_loadu_si256(blk.add(2) as *const __m256i)
        } else {
            let q = _mm_loadu_si128(blk.add(bb - 16) as *const __m128i);
            let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low);
            if F == 2 || F == 3 {
                let at = if F == 2 { 2 } else { 4 };
                let high = bytes_from_bits(fifth_bits(blk.add(at)));
                _mm256_or_si256(w, _mm256_and_si256(high, _mm256_set1_epi8(0x10)))
            } else {
                w
            }
        };
        _mm256_storeu_si256(u.as_mut_ptr().add(32 * blk_i) as *mut __m256i, w);
        let d = half(blk);
        let bias = match F {
            4 => 0.0,
            _ => bias::<F>(blk, d),
        };
        a[2 * blk_i] = d;
        a[2 * blk_i + 1] = d;
        b[2 * blk_i] = bias;
        b[2 * blk_i + 1] = bias;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_unpack_matches_the_reference() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
        ] {
            let nb = 7;
            let mut row: Vec<u8> = (0..nb * dtype.block_bytes())
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            // Finite scales (and minimums): 0x2E66 ≈ 0.1, sign from the random bit.
            for blk in row.chunks_mut(dtype.block_bytes()) {
                for &at in dtype.half_fields() {
                    blk[at] = 0x66;
                    blk[at + 1] = 0x2E | (blk[at + 1] & 0x80);
                }
            }
            let want = {
                let (mut u, mut a, mut b) =
                    (vec![0u8; 32 * nb], vec![0f32; 2 * nb], vec![0f32; 2 * nb]);
                super::super::unpack::unpack(dtype, &row, &mut u, &mut a, &mut b);
                (u, a, b)
            };
            let (mut u, mut a, mut b) =
                (vec![0u8; 32 * nb], vec![0f32; 2 * nb], vec![0f32; 2 * nb]);
            if unpack_row(dtype, &row, &mut u, &mut a, &mut b) {
                assert_eq!((u, a, b), want, "{dtype}");
            }
        }
    }
}
