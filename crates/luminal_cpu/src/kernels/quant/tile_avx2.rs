//! Wide int8 products (prefill, `M > 8`) with block-quantized weights on AVX2 (no VNNI):
//! register tiles of 4 activation rows × 8 weight rows, the weights interleaved
//! so that one 32-bit lane of a vector is one weight row.
//!
//! A *strip* is 8 weight rows unpacked (`unpack.rs`: small integers `u`, per group of 16 a
//! scale `a` and a bias `b`) and stored per block of 32 values as eight 32-byte chunks, chunk
//! `c` holding bytes `4c .. 4c + 4` of each of the 8 rows (an 8 × 8 transpose of 32-bit
//! words), then two 8-lane factors. Four activation bytes broadcast to every lane make
//! `vpmaddubsw` + `vpmaddwd` give, in lane `t`, row `t`'s dot over those four values: a
//! group of 16 is four chunks whose 16-bit sums add up before one `vpmaddwd` (they cannot
//! overflow for `u ≤ 15` or `31`; for `u ≤ 63`, two and two). The group's integer dots of 8
//! weight rows then take one conversion and one multiply-add together: the per-group
//! scaling (what made the span layout of `span_dot.rs` slower than `gemm` on AVX2, where it
//! is paid per group and weight row) is shared by 8 outputs, and each loaded chunk serves
//! [`RM`] activation rows.
//!
//! Q8_0's quants are signed on both sides, which `vpmaddubsw` takes only with the signs
//! moved onto the activations (`vpsignb`, per chunk and activation row) and no 16-bit sums
//! (`2 · 128 · 127` is near `2¹⁵`): both sides are widened to 16 bits instead (chunks of two
//! values of the 8 rows) and multiplied by `vpmaddwd` alone, 13% faster (1.01 against 1.16
//! ns per 64 weights and row, M = 128, N = K = 2048).
//!
//! A weight group's value is `a_g · u + b_g` and an activation group's `dg_g · q`, so a
//! group contributes `a_g · dg_g · P_g + b_g · sg_g` (`P_g = Σ u·q`, `sg_g = dg_g · Σ q`).
//! Per block of 32 (groups `g0`, `g1`) the formats fall into three classes:
//!
//! - **tied** (Q4_0, Q5_0, Q8_0): `a` the same for both groups, `b = c · a` with a constant
//!   `c` (−8, −16, 0): `a · (dg0 · P0 + dg1 · P1 + c · (sg0 + sg1))`, two multiply-adds and
//!   one more for the weight scale;
//! - **min** (Q4_1, Q5_1, Q4_K, Q5_K): `a` and `b` the same for both groups:
//!   `a · (dg0 · P0 + dg1 · P1) + b · (sg0 + sg1)`;
//! - **grouped** (Q3_K, Q6_K): `a` per group, `b = c · a` (−4, −32):
//!   `a0 · (dg0 · P0 + c · sg0) + a1 · (dg1 · P1 + c · sg1)`.
//!
//! The activation-side terms (`c · (sg0 + sg1)`, `sg0 + sg1` or `c · sg`) are computed once
//! per row when the activations are quantized ([`TileActs`]); the activations are quantized
//! per group of 16 exactly as for the other int8 paths (`int8.rs`), so the results equal
//! theirs up to f32 summation order.

use super::int8::{quantize_row, DotPath};
use super::span_acts::Aligned;
use super::unpack::{self, GROUP};
use super::{legacy_dot, WeightRef};
use crate::kernels::matmul::skinny::OutPtr;
use luminal::DType;
use std::cell::RefCell;

/// Weight rows of a strip (the lanes of a vector).
const STRIP: usize = 8;
/// Activation rows of a tile (one strip wide: with two strips, 4 × 2 and 3 × 2 tiles ran
/// 5–15% slower, 2 × 2 and 2 × 3 20–30%; 5 × 1 and 6 × 1 about as fast as 4 × 1).
const RM: usize = 4;

// The formats (a const generic of the kernels).
const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const Q8_0: u8 = 2;
const Q4_1: u8 = 3;
const Q5_1: u8 = 4;
const Q4_K: u8 = 5;
const Q5_K: u8 = 6;
const Q3_K: u8 = 7;
const Q6_K: u8 = 8;

/// How a format's block of 32 is scaled (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Tied,
    Min,
    Grouped,
}

const fn class(f: u8) -> Class {
    match f {
        Q4_0 | Q5_0 | Q8_0 => Class::Tied,
        Q4_1 | Q5_1 | Q4_K | Q5_K => Class::Min,
        _ => Class::Grouped,
    }
}

/// `c` of the tied and grouped formats (`b = c · a`).
const fn tie(f: u8) -> f32 {
    match f {
        Q4_0 => -8.0,
        Q5_0 => -16.0,
        Q3_K => -4.0,
        Q6_K => -32.0,
        _ => 0.0,
    }
}

/// Chunks of four values whose 16-bit `vpmaddubsw` sums may be added before `vpmaddwd`:
/// each sum is at most `2 · 127 · max u` in magnitude (4 · 2 · 127 · 31 < 2¹⁵).
const fn summed(f: u8) -> usize {
    match f {
        Q6_K => 2,
        _ => 4,
    }
}

/// Bytes of a strip's block of 32 values in format `f`: eight chunks of 32 bytes (Q8_0:
/// sixteen, of 16-bit quants), then two factors of eight f32.
const fn block_bytes(f: u8) -> usize {
    if f == Q8_0 {
        2 * 256 + 64
    } else {
        256 + 64
    }
}

/// The kernel format of `dtype`, if it has one.
fn format(dtype: DType) -> Option<u8> {
    Some(match dtype {
        DType::Q4_0 => Q4_0,
        DType::Q5_0 => Q5_0,
        DType::Q8_0 => Q8_0,
        DType::Q4_1 => Q4_1,
        DType::Q5_1 => Q5_1,
        DType::Q4_K => Q4_K,
        DType::Q5_K => Q5_K,
        DType::Q3_K => Q3_K,
        DType::Q6_K => Q6_K,
        _ => return None,
    })
}

/// Whether the kernel can compute products with `dtype` weights (every format but Q2_K,
/// whose biases are per group and not tied to its scales).
pub(crate) fn supports(dtype: DType) -> bool {
    format(dtype).is_some()
}

/// Whether wide products with `dtype` weights take these tiles on `path`: AVX2 without
/// VNNI (VNNI takes `span_dot.rs`), every supported format. One thread, M = 128, ns per
/// 64 weights and activation row against `gemm` on f32 activations (`tile_timing` below),
/// N = 2048, K = 2048: Q4_0 0.68 vs 1.91, Q8_0 1.01 vs 1.88, Q4_K 0.66 vs 1.86, Q6_K 0.73
/// vs 1.99; every other supported format 2–3× faster.
pub(crate) fn wide_int8(path: DotPath, dtype: DType) -> bool {
    path == DotPath::Avx2 && supports(dtype)
}

/// Activation rows quantized for the tiles: row `i`'s quants at `q[i · k ..]` (Q8_0: also
/// widened to 16 bits, `q16`), its group
/// scales at `dg[i · k / 16 ..]` and the activation-side bias terms (see the module docs)
/// at `e[i · k / 16 ..]` (tied, min: at the even groups, one a block). Kept and reused.
#[derive(Default)]
pub(crate) struct TileActs {
    k: usize,
    q: Vec<i8>,
    /// Q8_0: the quants widened to 16 bits (`vpmaddwd` operands).
    q16: Vec<i16>,
    dg: Vec<f32>,
    e: Vec<f32>,
}

/// Raw parts of [`TileActs`] for tasks quantizing disjoint rows.
struct ActParts {
    q: *mut i8,
    q16: *mut i16,
    dg: *mut f32,
    e: *mut f32,
}
// SAFETY: only used to hand disjoint rows to tasks (see `TileActs::quantize`).
unsafe impl Sync for ActParts {}

impl TileActs {
    /// Quantizes `m` rows of `k` values (a multiple of 32; row `i` is `row(i)`) for
    /// format `f`, in parallel over rows when `parallel`.
    fn quantize<'x>(
        &mut self,
        f: u8,
        m: usize,
        k: usize,
        row: impl Fn(usize) -> &'x [f32] + Sync,
        parallel: bool,
    ) {
        assert!(k.is_multiple_of(32), "tile activations: {k} values");
        let g = k / GROUP;
        self.k = k;
        self.q.resize(m * k, 0);
        self.q16.resize(if f == Q8_0 { m * k } else { 0 }, 0);
        self.dg.resize(m * g, 0.0);
        self.e.resize(m * g, 0.0);
        let parts = ActParts {
            q: self.q.as_mut_ptr(),
            q16: self.q16.as_mut_ptr(),
            dg: self.dg.as_mut_ptr(),
            e: self.e.as_mut_ptr(),
        };
        let (c, cl) = (tie(f), class(f));
        let one = |i: usize| {
            let parts = &parts;
            use std::slice::from_raw_parts_mut as part;
            // SAFETY: the buffers hold `m` rows (resized above) and outlive the loop; each
            // row is written by one task only.
            let (q, dg, e) = unsafe {
                (
                    part(parts.q.add(i * k), k),
                    part(parts.dg.add(i * g), g),
                    part(parts.e.add(i * g), g),
                )
            };
            // `e` first receives the group sums `sg`.
            quantize_row(&row(i)[..k], q, dg, e);
            if f == Q8_0 {
                // SAFETY: as above.
                let q16 = unsafe { part(parts.q16.add(i * k), k) };
                q16.iter_mut()
                    .zip(q.iter())
                    .for_each(|(w, &v)| *w = v as i16);
            }
            match cl {
                Class::Grouped => e.iter_mut().for_each(|v| *v *= c),
                _ => {
                    let s = if cl == Class::Tied { c } else { 1.0 };
                    for p in e.chunks_exact_mut(2) {
                        p[0] = s * (p[0] + p[1]);
                    }
                }
            }
        };
        let tasks = if parallel {
            crate::exec::par::threads().min(m).max(1)
        } else {
            1
        };
        let per = m.div_ceil(tasks);
        crate::exec::par::for_each(m.div_ceil(per.max(1)), |t| {
            (t * per..((t + 1) * per).min(m)).for_each(&one)
        });
    }
}

/// Activation rows of a tile: row `r`'s quants at `q + r · k`, its groups at `dg + r · k /
/// 16`, `e + r · k / 16`.
#[derive(Clone, Copy)]
struct Rows {
    q: *const i8,
    q16: *const i16,
    dg: *const f32,
    e: *const f32,
    k: usize,
}

thread_local! {
    static ACTS: RefCell<TileActs> = RefCell::new(TileActs::default());
    /// This thread's strips and the unpacked rows they are made of.
    static STRIPS: RefCell<Strips> = RefCell::new(Strips::default());
}

#[derive(Default)]
struct Strips {
    panel: Aligned<u8>,
    u: Vec<u8>,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Strips {
    /// The strip of weight rows `j0 .. j0 + 8` (those `≥ n` zero) of `w` in format `f`.
    fn fill(&mut self, f: u8, w: WeightRef, j0: usize) {
        let (n, k) = (w.n, w.k);
        let (nb, g) = (k / 32, k / GROUP);
        let (rb, bb) = (w.row_bytes(), block_bytes(f));
        self.u.resize(STRIP * k, 0);
        self.a.resize(STRIP * g, 0.0);
        self.b.resize(STRIP * g, 0.0);
        self.panel.resize(nb * bb);
        let legacy = legacy_dot::has_fused_dot(w.dtype);
        for t in 0..STRIP {
            let (u, a, b) = (
                &mut self.u[t * k..(t + 1) * k],
                &mut self.a[t * g..(t + 1) * g],
                &mut self.b[t * g..(t + 1) * g],
            );
            let j = j0 + t;
            if j >= n {
                u.fill(0);
                a.fill(0.0);
                b.fill(0.0);
                continue;
            }
            let row = &w.bytes[j * rb..(j + 1) * rb];
            if !(legacy && legacy_dot::unpack_row(w.dtype, row, u, a, b)) {
                unpack::unpack(w.dtype, row, u, a, b);
            }
        }
        let cl = class(f);
        let chunks = bb - 64;
        for (bi, blk) in self.panel.as_mut_slice().chunks_exact_mut(bb).enumerate() {
            // SAFETY: AVX2 was detected (the only caller is the AVX2 path); every row holds
            // `k ≥ 32 · (bi + 1)` bytes and the block `chunks` bytes of chunks.
            let p = blk.as_mut_ptr();
            if f == Q8_0 {
                // SAFETY: as above (`chunks` = 512: the two groups, widened).
                unsafe {
                    transpose_rows::<true>(&self.u, k, 32 * bi, p);
                    transpose_rows::<true>(&self.u, k, 32 * bi + 16, p.add(256));
                }
            } else {
                // SAFETY: as above.
                unsafe { transpose_rows::<false>(&self.u, k, 32 * bi, p) };
            }
            let (f0, f1) = blk[chunks..].split_at_mut(32);
            for t in 0..STRIP {
                let (a, b) = (&self.a[t * g..], &self.b[t * g..]);
                let (s0, s1) = match cl {
                    Class::Tied => (a[2 * bi], 0.0),
                    Class::Min => (a[2 * bi], b[2 * bi]),
                    Class::Grouped => (a[2 * bi], a[2 * bi + 1]),
                };
                f0[4 * t..4 * t + 4].copy_from_slice(&s0.to_le_bytes());
                f1[4 * t..4 * t + 4].copy_from_slice(&s1.to_le_bytes());
            }
        }
    }
}

/// The 32 bytes at `at` of each of the 8 rows of `u` (rows `k` bytes apart) as eight chunks
/// at `dst`: chunk `c` holds bytes `4c .. 4c + 4` of rows 0 to 7 (an 8 × 8 transpose of
/// words). `WIDE`: the 16 signed bytes at `at` of each row widened to 16 bits first (chunk
/// `c`: values `2c`, `2c + 1`).
///
/// # Safety
/// AVX2; `at + 32 ≤ k` (`WIDE`: `at + 16 ≤ k`), `u` holds 8 rows, `dst` 256 writable bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_rows<const WIDE: bool>(u: &[u8], k: usize, at: usize, dst: *mut u8) {
    use std::arch::x86_64::*;
    debug_assert!(at + if WIDE { 16 } else { 32 } <= k && u.len() >= STRIP * k);
    let r: [__m256i; 8] = std::array::from_fn(|t| {
        let p = u.as_ptr().add(t * k + at);
        if WIDE {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i))
        } else {
            _mm256_loadu_si256(p as *const __m256i)
        }
    });
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    // Words c and c + 4 of rows 0-3 (u0..u3) and rows 4-7 (u4..u7).
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    let out = [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ];
    for (c, v) in out.into_iter().enumerate() {
        _mm256_storeu_si256(dst.add(32 * c) as *mut __m256i, v);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose_rows<const WIDE: bool>(_: &[u8], _: usize, _: usize, _: *mut u8) {
    unreachable!("AVX2 tiles on another architecture")
}

/// Row `t`'s integer dots with one group of 16 activations (`x`) for the 8 rows of a strip,
/// lane `t` for row `t`: `w` addresses the group's four chunks (unsigned quants).
///
/// # Safety
/// AVX2; `w` holds 128 bytes, `x` 16.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn group_dot<const F: u8>(w: *const u8, x: *const i8) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let chunk = |c: usize| {
        let wv = _mm256_loadu_si256(w.add(32 * c) as *const __m256i);
        let xv = _mm256_set1_epi32((x.add(4 * c) as *const i32).read_unaligned());
        _mm256_maddubs_epi16(wv, xv)
    };
    let p: [__m256i; 4] = std::array::from_fn(chunk);
    match summed(F) {
        4 => _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
            ones,
        ),
        _ => _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), ones),
            _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), ones),
        ),
    }
}

/// One tile: `out[r · os + t] = Σ w·x` of activation row `r < R` of `x` and row `t` of the
/// strip `w`, over `nb` blocks of 32.
///
/// # Safety
/// AVX2 and FMA; `x` addresses `R` rows of `32 · nb` values, `w` a strip of `nb` blocks
/// of format `F`, `out` `R` rows of 8 writable values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const F: u8, const R: usize>(
    x: Rows,
    w: *const u8,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    use std::arch::x86_64::*;
    let gs = x.k / GROUP;
    let bb = block_bytes(F);
    let chunks = bb - 64;
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let wb = w.add(b * bb);
        let f0 = _mm256_loadu_ps(wb.add(chunks) as *const f32);
        let f1 = _mm256_loadu_ps(wb.add(chunks + 32) as *const f32);
        if F == Q8_0 {
            // Per group, eight chunks of two 16-bit values, each loaded once for all rows.
            let mut s = [[_mm256_setzero_si256(); R]; 2];
            for h in 0..2 {
                for c in 0..8 {
                    let wv = _mm256_loadu_si256(wb.add(256 * h + 32 * c) as *const __m256i);
                    for_rows!(R, |r| {
                        let at = x.q16.add(r * x.k + 32 * b + 16 * h + 2 * c);
                        let xv = _mm256_set1_epi32((at as *const i32).read_unaligned());
                        s[h][r] = _mm256_add_epi32(s[h][r], _mm256_madd_epi16(wv, xv));
                    });
                }
            }
            for_rows!(R, |r| {
                let dg = x.dg.add(r * gs + 2 * b);
                let (d0, d1) = (_mm256_broadcast_ss(&*dg), _mm256_broadcast_ss(&*dg.add(1)));
                let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s[0][r]), d0);
                let t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[1][r]), d1, t);
                acc[r] = _mm256_fmadd_ps(t, f0, acc[r]);
            });
            continue;
        }
        for_rows!(R, |r| {
            let q = x.q.add(r * x.k + 32 * b);
            let dg = x.dg.add(r * gs + 2 * b);
            let e = x.e.add(r * gs + 2 * b);
            let (d0, d1) = (_mm256_broadcast_ss(&*dg), _mm256_broadcast_ss(&*dg.add(1)));
            let p0 = _mm256_cvtepi32_ps(group_dot::<F>(wb, q));
            let p1 = _mm256_cvtepi32_ps(group_dot::<F>(wb.add(128), q.add(16)));
            let a = &mut acc[r];
            match class(F) {
                Class::Tied => {
                    let t = _mm256_fmadd_ps(p0, d0, _mm256_broadcast_ss(&*e));
                    *a = _mm256_fmadd_ps(_mm256_fmadd_ps(p1, d1, t), f0, *a);
                }
                Class::Min => {
                    let t = _mm256_fmadd_ps(p1, d1, _mm256_mul_ps(p0, d0));
                    *a = _mm256_fmadd_ps(t, f0, *a);
                    *a = _mm256_fmadd_ps(f1, _mm256_broadcast_ss(&*e), *a);
                }
                Class::Grouped => {
                    let t0 = _mm256_fmadd_ps(p0, d0, _mm256_broadcast_ss(&*e));
                    let t1 = _mm256_fmadd_ps(p1, d1, _mm256_broadcast_ss(&*e.add(1)));
                    *a = _mm256_fmadd_ps(t0, f0, *a);
                    *a = _mm256_fmadd_ps(t1, f1, *a);
                }
            }
        });
    }
    for (r, v) in acc.iter().enumerate() {
        _mm256_storeu_ps(out.add(r * os), *v);
    }
}

/// [`tile`] for `r ≤ RM` rows.
///
/// # Safety
/// As [`tile`].
#[cfg(target_arch = "x86_64")]
unsafe fn tile_rows<const F: u8>(
    r: usize,
    x: Rows,
    w: *const u8,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    match r {
        1 => tile::<F, 1>(x, w, nb, out, os),
        2 => tile::<F, 2>(x, w, nb, out, os),
        3 => tile::<F, 3>(x, w, nb, out, os),
        _ => tile::<F, RM>(x, w, nb, out, os),
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_rows<const F: u8>(_: usize, _: Rows, _: *const u8, _: usize, _: *mut f32, _: usize) {
    unreachable!("AVX2 tiles on another architecture")
}

/// `out[i·n + j] = Σ_k q_i[k] · W[j, k]` for `i < m`, `j < n` with `q_i` row `i` (`rows(i)`)
/// quantized to int8, by register tiles (see the module docs): the weight rows in strips
/// of 8 split over the threads, each strip unpacked once and dotted with every chunk of
/// [`RM`] activation rows. The caller checked that the CPU has AVX2 and FMA, that
/// [`supports`]`(w.dtype)`, and the lengths.
pub(crate) fn wide<'x>(
    w: WeightRef,
    rows: impl Fn(usize) -> &'x [f32] + Sync,
    out: OutPtr,
    m: usize,
    parallel: bool,
) {
    let f = format(w.dtype).expect("AVX2 tiles: unsupported format");
    let (n, k) = (w.n, w.k);
    let nb = k / 32;
    ACTS.with(|acts| {
        let mut acts = acts.borrow_mut();
        acts.quantize(f, m, k, rows, parallel);
        let acts = &*acts;
        let strips = n.div_ceil(STRIP);
        let threads = if parallel {
            crate::exec::par::threads()
        } else {
            1
        };
        // A few tasks per thread.
        let per = if threads > 1 {
            strips.div_ceil(4 * threads).max(1)
        } else {
            strips.max(1)
        };
        crate::exec::par::for_each(strips.div_ceil(per), |t| {
            let out = out;
            STRIPS.with(|panel| {
                let panel = &mut *panel.borrow_mut();
                let mut temp = [0f32; RM * STRIP];
                for s in t * per..((t + 1) * per).min(strips) {
                    let j0 = s * STRIP;
                    panel.fill(f, w, j0);
                    let cols = (n - j0).min(STRIP);
                    let wp = panel.panel.as_slice().as_ptr();
                    for i in (0..m).step_by(RM) {
                        let r = (m - i).min(RM);
                        let x = Rows {
                            q: acts.q[i * k..].as_ptr(),
                            q16: acts
                                .q16
                                .get(i * k..)
                                .map_or(std::ptr::null(), |v| v.as_ptr()),
                            dg: acts.dg[i * k / GROUP..].as_ptr(),
                            e: acts.e[i * k / GROUP..].as_ptr(),
                            k,
                        };
                        let (dst, os) = if cols == STRIP {
                            // SAFETY: row i < m, column j0 + 8 ≤ n.
                            (unsafe { out.0.add(i * n + j0) }, n)
                        } else {
                            (temp.as_mut_ptr(), STRIP)
                        };
                        // SAFETY: AVX2 and FMA (the caller's check); `x` holds rows i .. i
                        // + r of k values, the panel a strip of `nb` blocks of format `f`;
                        // `dst` addresses r rows of 8 columns: this task's own columns of
                        // the output, or the temporary tile.
                        unsafe {
                            match f {
                                Q4_0 => tile_rows::<Q4_0>(r, x, wp, nb, dst, os),
                                Q5_0 => tile_rows::<Q5_0>(r, x, wp, nb, dst, os),
                                Q8_0 => tile_rows::<Q8_0>(r, x, wp, nb, dst, os),
                                Q4_1 => tile_rows::<Q4_1>(r, x, wp, nb, dst, os),
                                Q5_1 => tile_rows::<Q5_1>(r, x, wp, nb, dst, os),
                                Q4_K => tile_rows::<Q4_K>(r, x, wp, nb, dst, os),
                                Q5_K => tile_rows::<Q5_K>(r, x, wp, nb, dst, os),
                                Q3_K => tile_rows::<Q3_K>(r, x, wp, nb, dst, os),
                                _ => tile_rows::<Q6_K>(r, x, wp, nb, dst, os),
                            }
                        }
                        if cols < STRIP {
                            for rr in 0..r {
                                // SAFETY: row i + rr < m, columns j0 .. j0 + cols ≤ n of the
                                // m·n output; no other task writes them.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        temp.as_ptr().add(rr * STRIP),
                                        out.0.add((i + rr) * n + j0),
                                        cols,
                                    )
                                };
                            }
                        }
                    }
                }
            })
        });
    });
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Random blocks of `dtype` (random quants, f16 scale fields of magnitude 0.001–0.1).
    pub(super) fn random_weight(dtype: DType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut bytes: Vec<u8> = (0..dtype.bytes_for(n * k).unwrap())
            .map(|_| next() as u8)
            .collect();
        for blk in bytes.chunks_mut(dtype.block_bytes()) {
            for &at in dtype.half_fields() {
                let v = ((next() >> 40) as f32 / (1u64 << 24) as f32 * 0.1 + 0.001)
                    * if next() & 1 == 0 { 1.0 } else { -1.0 };
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        bytes
    }

    /// `x` quantized per group of 16 as the int8 paths do, dequantized, and each group's
    /// scale.
    fn int8_activations(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (mut xq, mut d) = (vec![], vec![]);
        for grp in x.chunks(GROUP) {
            let amax = grp.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = amax / 127.0;
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            xq.extend(
                grp.iter()
                    .map(|&v| (s * (v * inv).round_ties_even()) as f64),
            );
            d.push(s as f64);
        }
        (xq, d)
    }

    /// `wide` against the f64 product of the decoded weights with the activations: within
    /// `1e-5 · Σ|x_q·w|` of the product with the int8-rounded activations `x_q` (the
    /// kernel's integer dots are exact; only f32 scaling and summation order differ), and
    /// within the activation rounding `Σ |w| · d / 2` of the exact product.
    fn check(dtype: DType, m: usize, n: usize, k: usize, threads: usize) {
        let wb = random_weight(dtype, n, k, 0x9E37_79B9 ^ (m * 1000 + n * 10 + k) as u64);
        let mut wd = vec![0f32; n * k];
        luminal::quant::decode(dtype, &wb, &mut wd);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1.0 + (i % 5) as f32))
            .collect();
        let w = WeightRef {
            dtype,
            bytes: &wb,
            n,
            k,
        };
        let mut out = vec![f32::NAN; m * n];
        let rows = |i: usize| &x[i * k..(i + 1) * k];
        let o = OutPtr(out.as_mut_ptr());
        if threads > 1 {
            let pool = crate::exec::par::Pool::new(threads).unwrap();
            pool.enter(|| wide(w, rows, o, m, true));
        } else {
            wide(w, rows, o, m, false);
        }
        let (xq, xd) = int8_activations(&x);
        for i in 0..m {
            for j in 0..n {
                let (mut want, mut mag, mut want_q, mut mag_q, mut rounding) =
                    (0f64, 0f64, 0f64, 0f64, 0f64);
                for kk in 0..k {
                    let wv = wd[j * k + kk] as f64;
                    want += x[i * k + kk] as f64 * wv;
                    mag += (x[i * k + kk] as f64 * wv).abs();
                    want_q += xq[i * k + kk] * wv;
                    mag_q += (xq[i * k + kk] * wv).abs();
                    rounding += wv.abs() * xd[(i * k + kk) / GROUP] / 2.0;
                }
                let g = out[i * n + j] as f64;
                let what = format!("{dtype} M={m} N={n} K={k} threads={threads} [{i},{j}] = {g}");
                assert!(
                    (g - want_q).abs() <= 1e-5 * mag_q + 1e-6,
                    "{what}, want {want_q} with int8 activations"
                );
                assert!(
                    (g - want).abs() <= rounding * 1.0001 + 1e-5 * mag + 1e-6,
                    "{what}, want {want} within the activation rounding {rounding}"
                );
            }
        }
    }

    /// Every supported format; row counts that are not multiples of the tile's four (and
    /// one below it), column counts that leave a partial strip or a lone strip, K of one
    /// block, SmolLM2's 576 (not a multiple of 256) and several super-blocks.
    #[test]
    fn tiles_match_the_f64_product() {
        if !avx2() {
            return;
        }
        for dtype in [
            DType::Q4_0,
            DType::Q5_0,
            DType::Q8_0,
            DType::Q4_1,
            DType::Q5_1,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q3_K,
            DType::Q6_K,
        ] {
            assert!(supports(dtype));
            let ks: &[usize] = if dtype.block_size() == 32 {
                &[32, 576]
            } else {
                &[256, 768]
            };
            for &k in ks {
                for (m, n) in [(9, 37), (13, 8), (3, 21), (18, 16), (33, 3)] {
                    check(dtype, m, n, k, 1);
                }
                check(dtype, 22, 75, k, 2);
            }
        }
        assert!(!supports(DType::Q2_K));
    }

    /// The word transpose of a strip block.
    #[test]
    fn strip_chunks_hold_four_bytes_of_each_row_or_two_widened() {
        if !avx2() {
            return;
        }
        let k = 64;
        let u: Vec<u8> = (0..STRIP * k).map(|i| (i * 37 % 251) as u8).collect();
        let mut dst = [0u8; 256];
        // SAFETY: AVX2 detected; 8 rows of 64 bytes, 256 bytes out.
        unsafe { transpose_rows::<false>(&u, k, 32, dst.as_mut_ptr()) };
        for c in 0..8 {
            for t in 0..STRIP {
                for j in 0..4 {
                    assert_eq!(dst[32 * c + 4 * t + j], u[t * k + 32 + 4 * c + j]);
                }
            }
        }
        // Widened: chunk c holds values 2c, 2c + 1 of each row as 16-bit integers.
        // SAFETY: as above, 16 bytes a row read.
        unsafe { transpose_rows::<true>(&u, k, 16, dst.as_mut_ptr()) };
        for c in 0..8 {
            for t in 0..STRIP {
                for j in 0..2 {
                    let at = 32 * c + 4 * t + 2 * j;
                    let got = i16::from_le_bytes([dst[at], dst[at + 1]]);
                    assert_eq!(got, u[t * k + 16 + 2 * c + j] as i8 as i16);
                }
            }
        }
    }
}

/// The tiles against the f32 path they replace (`gemm` on decoded weights, what AVX2 runs
/// without them), one thread, in one process, alternating (a measurement that asserts
/// nothing, so ignored by default): `cargo test --release -p luminal_cpu --lib tile_timing
/// -- --ignored --nocapture`.
#[cfg(all(test, target_arch = "x86_64"))]
mod tile_timing {
    use super::*;

    #[test]
    #[ignore]
    fn tiles_against_gemm() {
        if crate::set_max_isa(crate::Isa::Avx2) != crate::Isa::Avx2 {
            return;
        }
        let reps: usize = std::env::var("TILE_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        let m: usize = std::env::var("TILE_M")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(128);
        let all = [
            DType::Q4_0,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q5_K,
            DType::Q3_K,
        ];
        let formats = if std::env::var("TILE_ALL").is_ok() {
            &all[..]
        } else {
            &all[..4]
        };
        for &dtype in formats {
            for (n, k) in [(1536usize, 2048usize), (2048, 2048), (1536, 576)] {
                if dtype.block_size() == 256 && k % 256 != 0 {
                    continue;
                }
                let bytes = super::tests::random_weight(dtype, n, k, 7);
                let w = WeightRef {
                    dtype,
                    bytes: &bytes,
                    n,
                    k,
                };
                let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut out = vec![0f32; m * n];
                let (mut old, mut new) = (f64::MAX, f64::MAX);
                for _ in 0..reps {
                    let t = std::time::Instant::now();
                    super::super::weight_matmul(&x, 0, k, w, &mut out, m, 1, true);
                    old = old.min(t.elapsed().as_secs_f64());
                    let t = std::time::Instant::now();
                    wide(
                        w,
                        |i| &x[i * k..(i + 1) * k],
                        OutPtr(out.as_mut_ptr()),
                        m,
                        false,
                    );
                    new = new.min(t.elapsed().as_secs_f64());
                }
                let per = |t: f64| t * 1e9 / (m * n) as f64 / (k as f64 / 64.0);
                println!(
                    "{dtype} M={m} N={n} K={k}: f32 gemm {:.3} ns/64w/row, int8 tiles {:.3} ({:.2}x) {}",
                    per(old),
                    per(new),
                    old / new,
                    out[7]
                );
            }
        }
        crate::set_max_isa(crate::detected_isa());
    }
}
