//! Weight rows of ggml blocks unpacked for the int8 dot products (`int8.rs`): every format
//! becomes small unsigned integers `u` with one scale `a` and one bias `b` per group of 16
//! values, so that element `i` of group `g` is `a[g] · u[i] + b[g]` — the value the reference
//! decoder gives, up to f32 rounding. Q8_0 is the exception: its quants are signed bytes
//! (`b = 0`), and the dot handles their sign (see [`signed_quants`]).
//!
//! | format | `u` | `a` (per group) | `b` (per group) |
//! |---|---|---|---|
//! | Q4_0 / Q5_0 | 4 / 5-bit quant | `d` | `−8d` / `−16d` |
//! | Q4_1 / Q5_1 | 4 / 5-bit quant | `d` | `m` |
//! | Q8_0 | signed quant | `d` | 0 |
//! | Q2_K | 2-bit quant | `d · scale` | `−dmin · min` |
//! | Q3_K | 3-bit quant | `d · scale` | `−4 · a` |
//! | Q4_K / Q5_K | 4 / 5-bit quant | `d · scale` | `−dmin · min` |
//! | Q6_K | 6-bit quant | `d · scale` | `−32 · a` |
//!
//! `u` never exceeds 63 for the unsigned formats, which keeps AVX2's saturating
//! `maddubs` exact.

use crate::simd::Task;
use luminal::quant::{f16_at, k4_scale_min, q3_k_scales};
use luminal::DType;

/// Values per scale/bias group.
pub(crate) const GROUP: usize = 16;

/// Formats the int8 path unpacks (every block-quantized GGUF weight type).
pub(crate) fn has_int8_dot(dtype: DType) -> bool {
    dtype.is_quantized()
}

/// Whether `dtype`'s unpacked quants are signed bytes (Q8_0) rather than small unsigned
/// integers.
pub(crate) fn signed_quants(dtype: DType) -> bool {
    dtype == DType::Q8_0
}

/// One weight row (`row`: whole blocks of `dtype`) unpacked into `u` (one byte per value),
/// `a` and `b` (one per [`GROUP`] values).
///
/// # Panics
/// If the lengths disagree (`u.len()` values, `u.len() / 16` groups, whole blocks).
pub(crate) fn unpack(dtype: DType, row: &[u8], u: &mut [u8], a: &mut [f32], b: &mut [f32]) {
    let k = u.len();
    assert!(
        dtype.is_quantized()
            && k.is_multiple_of(dtype.block_size())
            && Some(row.len()) == dtype.bytes_for(k)
            && a.len() == k / GROUP
            && b.len() == k / GROUP,
        "unpack {dtype}: {} bytes into {k} values, {} scales, {} biases",
        row.len(),
        a.len(),
        b.len()
    );
    crate::simd::run(Unpack {
        dtype,
        row,
        u,
        a,
        b,
    });
}

struct Unpack<'a> {
    dtype: DType,
    row: &'a [u8],
    u: &'a mut [u8],
    a: &'a mut [f32],
    b: &'a mut [f32],
}

impl Task for Unpack<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let Unpack {
            dtype,
            row,
            u,
            a,
            b,
        } = self;
        match dtype {
            DType::Q4_0 => blocks::<18, 32, 0>(row, u, a, b),
            DType::Q4_1 => blocks::<20, 32, 1>(row, u, a, b),
            DType::Q5_0 => blocks::<22, 32, 2>(row, u, a, b),
            DType::Q5_1 => blocks::<24, 32, 3>(row, u, a, b),
            DType::Q8_0 => blocks::<34, 32, 4>(row, u, a, b),
            DType::Q2_K => blocks::<84, 256, 5>(row, u, a, b),
            DType::Q3_K => blocks::<110, 256, 6>(row, u, a, b),
            DType::Q4_K => blocks::<144, 256, 7>(row, u, a, b),
            DType::Q5_K => blocks::<176, 256, 8>(row, u, a, b),
            DType::Q6_K => blocks::<210, 256, 9>(row, u, a, b),
            _ => unreachable!("unpack: {dtype} is not block-quantized"),
        }
    }
}

/// The format's unpacking for every block of `BB` bytes and `BS` values (`F`: the format, in
/// the order of [`Unpack::run`]'s match; a constant, so each instance is one straight loop).
#[inline(always)]
fn blocks<const BB: usize, const BS: usize, const F: u8>(
    row: &[u8],
    u: &mut [u8],
    a: &mut [f32],
    b: &mut [f32],
) {
    let gpb = BS / GROUP;
    let (row, _) = row.as_chunks::<BB>();
    let (u, _) = u.as_chunks_mut::<BS>();
    let groups = a.chunks_exact_mut(gpb).zip(b.chunks_exact_mut(gpb));
    for ((blk, u), (a, b)) in row.iter().zip(u).zip(groups) {
        match F {
            0 => legacy::<false, false>(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            1 => legacy::<true, false>(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            2 => legacy::<false, true>(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            3 => legacy::<true, true>(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            4 => q8_0(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            5 => q2_k(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            6 => q3_k(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            7 => q45_k::<false>(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            8 => q45_k::<true>(blk, u.as_mut_slice().try_into().unwrap(), a, b),
            _ => q6_k(blk, u.as_mut_slice().try_into().unwrap(), a, b),
        }
    }
}

#[inline(always)]
fn legacy<const MIN: bool, const FIVE: bool>(
    blk: &[u8],
    u: &mut [u8; 32],
    a: &mut [f32],
    b: &mut [f32],
) {
    let d = f16_at(blk, 0);
    let bias = if MIN {
        f16_at(blk, 2)
    } else if FIVE {
        -16.0 * d
    } else {
        -8.0 * d
    };
    let at = blk.len() - 16;
    let qs: &[u8; 16] = blk[at..].try_into().unwrap();
    for j in 0..16 {
        u[j] = qs[j] & 15;
        u[j + 16] = qs[j] >> 4;
    }
    if FIVE {
        let qh = u32::from_le_bytes([blk[at - 4], blk[at - 3], blk[at - 2], blk[at - 1]]);
        for (j, v) in u.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) << 4) as u8;
        }
    }
    a.fill(d);
    b.fill(bias);
}

#[inline(always)]
fn q8_0(blk: &[u8], u: &mut [u8; 32], a: &mut [f32], b: &mut [f32]) {
    u.copy_from_slice(&blk[2..34]);
    a.fill(f16_at(blk, 0));
    b.fill(0.0);
}

#[inline(always)]
fn q2_k(blk: &[u8], u: &mut [u8; 256], a: &mut [f32], b: &mut [f32]) {
    let (scales, qs) = (&blk[0..16], &blk[16..80]);
    let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
    for half in 0..2 {
        for shift in 0..4 {
            for part in 0..2 {
                let sub = 8 * half + 2 * shift + part;
                let q = &qs[32 * half + 16 * part..32 * half + 16 * part + 16];
                for (v, &q) in u[16 * sub..16 * sub + 16].iter_mut().zip(q) {
                    *v = (q >> (2 * shift)) & 3;
                }
            }
        }
    }
    for (g, &s) in scales.iter().enumerate() {
        a[g] = d * (s & 15) as f32;
        b[g] = -(dmin * (s >> 4) as f32);
    }
}

#[inline(always)]
fn q3_k(blk: &[u8], u: &mut [u8; 256], a: &mut [f32], b: &mut [f32]) {
    let (hmask, qs) = (&blk[0..32], &blk[32..96]);
    let scales = q3_k_scales(&blk[96..108]);
    let d = f16_at(blk, 108);
    for half in 0..2 {
        for shift in 0..4 {
            let bit = 4 * half + shift;
            for part in 0..2 {
                let sub = 8 * half + 2 * shift + part;
                let r = 16 * part..16 * part + 16;
                let q = &qs[32 * half..32 * half + 32][r.clone()];
                let h = &hmask[r];
                for ((v, &q), &h) in u[16 * sub..16 * sub + 16].iter_mut().zip(q).zip(h) {
                    *v = ((q >> (2 * shift)) & 3) | (((h >> bit) & 1) << 2);
                }
            }
        }
    }
    for g in 0..16 {
        a[g] = d * scales[g] as f32;
        b[g] = -4.0 * a[g];
    }
}

/// Q4_K, and Q5_K when `FIVE`.
#[inline(always)]
fn q45_k<const FIVE: bool>(blk: &[u8], u: &mut [u8; 256], a: &mut [f32], b: &mut [f32]) {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let packed = &blk[4..16];
    let (qh, qs) = if FIVE {
        (&blk[16..48], &blk[48..176])
    } else {
        (&blk[0..32], &blk[16..144])
    };
    for sub in 0..8 {
        let bytes = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
        let shift = 4 * (sub % 2);
        let out = &mut u[32 * sub..32 * sub + 32];
        for l in 0..32 {
            let high = if FIVE { ((qh[l] >> sub) & 1) << 4 } else { 0 };
            out[l] = ((bytes[l] >> shift) & 15) | high;
        }
        let (scale, min) = k4_scale_min(packed, sub);
        let (sa, sb) = (d * scale as f32, -(dmin * min as f32));
        a[2 * sub..2 * sub + 2].fill(sa);
        b[2 * sub..2 * sub + 2].fill(sb);
    }
}

#[inline(always)]
fn q6_k(blk: &[u8], u: &mut [u8; 256], a: &mut [f32], b: &mut [f32]) {
    let (ql, qh, scales) = (&blk[0..128], &blk[128..192], &blk[192..208]);
    let d = f16_at(blk, 208);
    for half in 0..2 {
        for k in 0..4 {
            let ql = &ql[64 * half + 32 * (k % 2)..64 * half + 32 * (k % 2) + 32];
            let qh = &qh[32 * half..32 * half + 32];
            // Elements 128·half + 32·k + l, l < 32: sub-blocks 8·half + 2·k and the next.
            let out = &mut u[128 * half + 32 * k..128 * half + 32 * k + 32];
            for l in 0..32 {
                let low = (ql[l] >> (4 * (k / 2))) & 15;
                let high = (qh[l] >> (2 * k)) & 3;
                out[l] = low | (high << 4);
            }
        }
    }
    for g in 0..16 {
        a[g] = d * (scales[g] as i8) as f32;
        b[g] = -32.0 * a[g];
    }
}
