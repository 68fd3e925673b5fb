//! Splitting f32 operands into their bf16 pieces and packing them into tiles: A into
//! 16-row panels, B into 16-column panels in AMX's pair-interleaved layout.

use super::{Mat, TILE};

/// The three bf16 pieces of `x` (as raw bits): `x ≈ h + m + l` to 24 bits.
#[inline(always)]
pub(super) fn split(x: f32) -> [u16; 3] {
    let h = bf16(x);
    if !x.is_finite() {
        return [h, 0, 0];
    }
    let r = x - f32::from_bits((h as u32) << 16);
    let m = bf16(r);
    let r = r - f32::from_bits((m as u32) << 16);
    [h, m, bf16(r)]
}

/// `x` rounded to bf16 (nearest, ties to even), as bits; finite inputs.
#[inline(always)]
pub(super) fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) as u16 | 0x40;
    }
    (b.wrapping_add(0x7fff + (b >> 16 & 1)) >> 16) as u16
}

/// The three pieces of 16 floats: per piece, the 16 values' bf16 bits in the low 16 bits of
/// each 32-bit lane (`lo`) and in the high 16 bits (`hi`).
#[inline(always)]
unsafe fn split16(
    v: std::arch::x86_64::__m512,
) -> [(std::arch::x86_64::__m512i, std::arch::x86_64::__m512i); 3] {
    use std::arch::x86_64::*;
    // (No closure here: closures do not inherit the caller's target features, and the
    // intrinsics then stay calls.)
    let mut x = v;
    let mut out = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 3];
    for o in &mut out {
        let b = _mm512_castps_si512(x);
        // Round to nearest even at bit 16 (finite values; the scalar path guards the rest).
        let odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
        let hi = _mm512_and_si512(r, _mm512_set1_epi32(0xffff0000u32 as i32));
        x = _mm512_sub_ps(x, _mm512_castsi512_ps(hi));
        *o = (_mm512_srli_epi32(r, 16), hi);
    }
    out
}

/// Values the pieces carry: finite, and small enough that rounding to bf16 stays finite
/// (bf16's largest finite value is 3.3895e38).
pub(super) const PIECES_MAX: f32 = 3.0e38;

/// Whether `x` is one of the values the pieces carry ([`PIECES_MAX`]).
#[inline(always)]
fn plain(x: f32) -> bool {
    x.abs() <= PIECES_MAX
}

/// Whether all 16 values are [`plain`] (the vector split assumes it).
#[inline(always)]
unsafe fn plain16(v: std::arch::x86_64::__m512) -> bool {
    use std::arch::x86_64::*;
    // Ordered and not greater: false for NaN.
    _mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(PIECES_MAX)) == 0xffff
}

/// Packs A (`m × k`; rows past `m` and columns past `k` are zeros) into `mp` 16-row panels
/// of `kb` tiles per piece, for the first `pieces` pieces. False (stopping) at a value that
/// is not [`plain`].
#[target_feature(enable = "avx512f,avx512bw")]
#[inline(never)]
pub(super) unsafe fn pack_a(
    a: Mat,
    m: usize,
    k: usize,
    mp: usize,
    kb: usize,
    pieces: usize,
    out: &mut [u16],
) -> bool {
    use std::arch::x86_64::*;
    let o = out.as_mut_ptr();
    // Word offsets of tile rows 0..16 (a tile row is 16 32-bit words).
    let rows16 = _mm512_setr_epi32(
        0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
    );
    // Row-major A is read along its rows (panels outer), column-major A along its columns
    // (K blocks outer).
    for t in 0..mp * kb {
        let (q, x) = if a.rs == 1 && a.cs != 1 {
            (t % mp, t / mp)
        } else {
            (t / kb, t % kb)
        };
        {
            let tiles: [usize; 3] = std::array::from_fn(|p| ((p * mp + q) * kb + x) * TILE);
            if a.rs == 1 && (q + 1) * 16 <= m && (x + 1) * 32 <= k {
                // Column-major: a column's 16 rows are contiguous. Columns 2c and 2c+1 make
                // one 32-bit word per row (tile word r·16 + c), scattered down the tile.
                let mut ok = true;
                for c in 0..16 {
                    let src = a
                        .ptr
                        .offset((q * 16) as isize + (x * 32 + 2 * c) as isize * a.cs);
                    let (v0, v1) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.offset(a.cs)));
                    if !(plain16(v0) && plain16(v1)) {
                        ok = false;
                        break;
                    }
                    let (s0, s1) = (split16(v0), split16(v1));
                    for p in 0..pieces {
                        let w = _mm512_or_si512(s0[p].0, s1[p].1);
                        _mm512_i32scatter_epi32::<4>(
                            (o.add(tiles[p]) as *mut i32).add(c),
                            rows16,
                            w,
                        );
                    }
                }
                if ok {
                    continue;
                }
            }
            for r in 0..16 {
                let i = q * 16 + r;
                let full = i < m && (x + 1) * 32 <= k && a.cs == 1;
                if full {
                    let src = a.ptr.offset(i as isize * a.rs + (x * 32) as isize);
                    let (v0, v1) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16)));
                    if plain16(v0) && plain16(v1) {
                        let (s0, s1) = (split16(v0), split16(v1));
                        for p in 0..pieces {
                            let d = o.add(tiles[p] + r * 32);
                            _mm256_storeu_si256(d as *mut __m256i, _mm512_cvtepi32_epi16(s0[p].0));
                            _mm256_storeu_si256(
                                d.add(16) as *mut __m256i,
                                _mm512_cvtepi32_epi16(s1[p].0),
                            );
                        }
                        continue;
                    }
                }
                for c in 0..32 {
                    let kk = x * 32 + c;
                    let v = if i < m && kk < k {
                        let x = a.at(i, kk);
                        if !plain(x) {
                            return false;
                        }
                        split(x)
                    } else {
                        [0; 3]
                    };
                    for p in 0..pieces {
                        *o.add(tiles[p] + r * 32 + c) = v[p];
                    }
                }
            }
        }
    }
    true
}

/// Packs B (`k × n`) into `np` 16-column panels of `kb` tiles per piece (the first
/// `pieces`), pair-interleaved: tile row `p`, slot `2j + e` holds `B[32x + 2p + e][16q + j]`
/// (zero-padded). False (stopping) at a value that is not [`plain`].
#[target_feature(enable = "avx512f,avx512bw")]
#[inline(never)]
pub(super) unsafe fn pack_b(
    b: Mat,
    k: usize,
    n: usize,
    np: usize,
    kb: usize,
    pieces: usize,
    out: &mut [u16],
) -> bool {
    use std::arch::x86_64::*;
    let o = out.as_mut_ptr();
    // Word offsets of tile rows 0..16 (a tile row is 16 32-bit words).
    let rows16 = _mm512_setr_epi32(
        0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
    );
    // Row-major B is read along its rows (K block outer, panels inner), column-major B
    // along its columns: the source streams instead of striding across pages.
    for t in 0..np * kb {
        let (q, x) = if b.cs == 1 {
            (t % np, t / np)
        } else {
            (t / kb, t % kb)
        };
        {
            let tiles: [usize; 3] = std::array::from_fn(|p| ((p * np + q) * kb + x) * TILE);
            let full = (q + 1) * 16 <= n && (x + 1) * 32 <= k;
            if full && b.cs == 1 {
                // Rows 2p and 2p+1, 16 columns each: one tile row per piece.
                let mut ok = true;
                for pr in 0..16 {
                    let r0 = b
                        .ptr
                        .offset((x * 32 + 2 * pr) as isize * b.rs + (q * 16) as isize);
                    let (v0, v1) = (_mm512_loadu_ps(r0), _mm512_loadu_ps(r0.offset(b.rs)));
                    if !(plain16(v0) && plain16(v1)) {
                        ok = false;
                        break;
                    }
                    let (s0, s1) = (split16(v0), split16(v1));
                    for p in 0..pieces {
                        let w = _mm512_or_si512(s0[p].0, s1[p].1);
                        _mm512_storeu_si512(o.add(tiles[p] + pr * 32) as *mut _, w);
                    }
                }
                if ok {
                    continue;
                }
            } else if full && b.rs == 1 {
                // Column j's 32 values are contiguous: its 16 pair-words go down column j
                // of the tile (word p·16 + j).
                let mut ok = true;
                for j in 0..16 {
                    let c0 = b
                        .ptr
                        .offset((q * 16 + j) as isize * b.cs + (x * 32) as isize);
                    let (v0, v1) = (_mm512_loadu_ps(c0), _mm512_loadu_ps(c0.add(16)));
                    if !(plain16(v0) && plain16(v1)) {
                        ok = false;
                        break;
                    }
                    let (s0, s1) = (split16(v0), split16(v1));
                    for p in 0..pieces {
                        // 32 bf16 in k order = 16 pair-words.
                        let lo = _mm512_cvtepi32_epi16(s0[p].0);
                        let hi = _mm512_cvtepi32_epi16(s1[p].0);
                        let words = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                        _mm512_i32scatter_epi32::<4>(
                            (o.add(tiles[p]) as *mut i32).add(j),
                            rows16,
                            words,
                        );
                    }
                }
                if ok {
                    continue;
                }
            }
            for kk in 0..32 {
                let kg = x * 32 + kk;
                for j in 0..16 {
                    let col = q * 16 + j;
                    let v = if kg < k && col < n {
                        let x = b.at(kg, col);
                        if !plain(x) {
                            return false;
                        }
                        split(x)
                    } else {
                        [0; 3]
                    };
                    let at = (kk / 2) * 32 + 2 * j + kk % 2;
                    for p in 0..pieces {
                        *o.add(tiles[p] + at) = v[p];
                    }
                }
            }
        }
    }
    true
}
