//! The decode path's block products written with x86-64 intrinsics (AVX-512 and AVX2, both
//! with F16C), for head dims 32, 64, 96 and 128:
//!
//! - f16 keys and values are widened in registers as they are read (`vcvtph2ps`), never
//!   through a scratch buffer;
//! - each key (value) row is loaded once for up to four query rows of a grouped-query group,
//!   whose q rows stay in registers;
//! - a score's dot product ends as a vector of partial sums, and those of `L` keys (the
//!   lanes of a register) are reduced together by a transpose-and-add tree (`sums`): about
//!   3 shuffles and adds per key and row instead of a horizontal sum each;
//! - the output accumulators of up to four rows × `W` registers of the head dim stay in
//!   registers over the block;
//! - the online softmax between the two products ([`block_softmax`]) is
//!   [`super::decode::Softmax`]'s step with the exponentials in vector registers (the same
//!   polynomial as [`simd::exp2`], bit for bit);
//! - key and value rows are prefetched a few rows ahead (a model's cache streams from the
//!   last-level cache).
//!
//! Measured on SmolLM2-135M's layout (3 query rows per group, head dim 64, f16 cache, one
//! AVX-512 thread of a 2-vCPU Xeon; `timing`): scores 4.3, softmax 1.3, accumulate 2.8 ns
//! per key and group, near the throughput of the two vector ports (per key: 24 FMAs, 8
//! conversions of two µops, ~8 shuffles and adds of the reductions). A whole decode step
//! over 2048 keys (3 groups) takes ~80 µs where the portable loops took ~300 µs.

use super::KvRows;
use crate::simd::{self, Isa};
use half::f16;
use std::arch::x86_64::*;

/// One vector register of f32 lanes.
trait Simd: Copy {
    const L: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn load_f16(p: *const f16) -> Self;
    /// `L` signed bytes at `p`, widened and times `scale` (a q8_0 block's values).
    unsafe fn load_q8(p: *const i8, scale: f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    /// `a · b + c`.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn hsum(self) -> f32;
    unsafe fn max(a: Self, b: Self) -> Self;
    unsafe fn hmax(self) -> f32;
    /// [`simd::exp2_softmax`] lane-wise (the same operations, so the same results).
    unsafe fn exp2_softmax(self) -> Self;
    /// `L` vectors at `p`: the vector whose lane `j` is the sum of vector `j`'s lanes.
    unsafe fn sums(p: *const Self) -> Self;
}

#[derive(Clone, Copy)]
struct Z(__m512);

#[derive(Clone, Copy)]
struct Y(__m256);

// SAFETY (every method of both impls): only called from the `#[target_feature]` functions
// below, which enable AVX-512 F (Z) or AVX2 + FMA (Y) and F16C; pointers are valid for
// the lanes read or written (the callers' bounds checks).
impl Simd for Z {
    const L: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Z {
        unsafe { Z(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Z {
        unsafe { Z(_mm512_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Z {
        unsafe { Z(_mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Z {
        unsafe { Z(_mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))) }
    }
    #[inline(always)]
    unsafe fn load_q8(p: *const i8, scale: f32) -> Z {
        unsafe {
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i));
            Z(_mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale)))
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn mul(a: Z, b: Z) -> Z {
        unsafe { Z(_mm512_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn add(a: Z, b: Z) -> Z {
        unsafe { Z(_mm512_add_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn sub(a: Z, b: Z) -> Z {
        unsafe { Z(_mm512_sub_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Z, b: Z, c: Z) -> Z {
        unsafe { Z(_mm512_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        unsafe { _mm512_reduce_add_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn max(a: Z, b: Z) -> Z {
        unsafe { Z(_mm512_max_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        unsafe { _mm512_reduce_max_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn exp2_softmax(self) -> Z {
        unsafe { Z(simd::exp2_softmax_avx512(self.0)) }
    }
    #[inline(always)]
    unsafe fn sums(p: *const Z) -> Z {
        unsafe {
            let v = |i: usize| p.add(i);
            // Level 1 (`half`): 512 → 256 bits per key, two keys per vector (keys m and
            // m + 4, m + 8 and m + 12). Level 2 (`quarter`): 256 → 128 bits: `u[m]`'s
            // 128-bit block b holds key 4b + m.
            let mut u = [_mm512_setzero_ps(); 4];
            for (m, u) in u.iter_mut().enumerate() {
                *u = quarter(
                    half((*v(m)).0, (*v(m + 4)).0),
                    half((*v(m + 8)).0, (*v(m + 12)).0),
                );
            }
            // Levels 3 and 4, inside 128-bit blocks: lane 4b + m = key 4b + m.
            let w01 = _mm512_add_ps(
                _mm512_unpacklo_ps(u[0], u[1]),
                _mm512_unpackhi_ps(u[0], u[1]),
            );
            let w23 = _mm512_add_ps(
                _mm512_unpacklo_ps(u[2], u[3]),
                _mm512_unpackhi_ps(u[2], u[3]),
            );
            Z(_mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(w01, w23),
                _mm512_shuffle_ps::<0xEE>(w01, w23),
            ))
        }
    }
}

/// `[a₀ + a₂, a₁ + a₃, b₀ + b₂, b₁ + b₃]` in 128-bit blocks.
#[inline(always)]
unsafe fn half(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is enabled in every caller.
    unsafe {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    }
}

/// `[a₀ + a₁, a₂ + a₃, b₀ + b₁, b₂ + b₃]` in 128-bit blocks.
#[inline(always)]
unsafe fn quarter(a: __m512, b: __m512) -> __m512 {
    // SAFETY: AVX-512 F is enabled in every caller.
    unsafe {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    }
}

impl Simd for Y {
    const L: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Y {
        unsafe { Y(_mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Y {
        unsafe { Y(_mm256_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Y {
        unsafe { Y(_mm256_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Y {
        unsafe { Y(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn load_q8(p: *const i8, scale: f32) -> Y {
        unsafe {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
            Y(_mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(scale)))
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn mul(a: Y, b: Y) -> Y {
        unsafe { Y(_mm256_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn add(a: Y, b: Y) -> Y {
        unsafe { Y(_mm256_add_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn sub(a: Y, b: Y) -> Y {
        unsafe { Y(_mm256_sub_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Y, b: Y, c: Y) -> Y {
        unsafe { Y(_mm256_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        unsafe { simd::hsum(self.0) }
    }
    #[inline(always)]
    unsafe fn max(a: Y, b: Y) -> Y {
        unsafe { Y(_mm256_max_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        unsafe {
            let v = self.0;
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
            _mm_cvtss_f32(m)
        }
    }
    #[inline(always)]
    unsafe fn exp2_softmax(self) -> Y {
        unsafe { Y(simd::exp2_softmax_avx2(self.0)) }
    }
    #[inline(always)]
    unsafe fn sums(p: *const Y) -> Y {
        unsafe {
            let v = |i: usize| p.add(i);
            // Per 128-bit half: lane m of `h0123` sums that half of key m (m < 4).
            let h0123 = _mm256_hadd_ps(
                _mm256_hadd_ps((*v(0)).0, (*v(1)).0),
                _mm256_hadd_ps((*v(2)).0, (*v(3)).0),
            );
            let h4567 = _mm256_hadd_ps(
                _mm256_hadd_ps((*v(4)).0, (*v(5)).0),
                _mm256_hadd_ps((*v(6)).0, (*v(7)).0),
            );
            Y(_mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(h0123, h4567),
                _mm256_permute2f128_ps::<0x31>(h0123, h4567),
            ))
        }
    }
}

/// Key and value storage: f32, f16 widened as loaded, or q8_0 blocks decoded as loaded.
/// Positions are in elements: [`Kv::at`] steps a pointer by elements (to a row start, for
/// q8_0 a block boundary), [`Kv::ld`] loads `L` elements from an element offset of it.
trait Kv: Copy {
    /// `i` elements after `p` (wrapping: the result may only be prefetched).
    fn at(p: *const Self, i: usize) -> *const Self;
    /// Bytes that `n` elements from a row start take.
    fn bytes(n: usize) -> usize;
    /// The `L` elements `i ..` after `p` (`i` a multiple of `L`) as f32.
    unsafe fn ld<S: Simd>(p: *const Self, i: usize) -> S;
}

impl Kv for f32 {
    #[inline(always)]
    fn at(p: *const f32, i: usize) -> *const f32 {
        p.wrapping_add(i)
    }
    fn bytes(n: usize) -> usize {
        4 * n
    }
    #[inline(always)]
    unsafe fn ld<S: Simd>(p: *const f32, i: usize) -> S {
        unsafe { S::load(p.add(i)) }
    }
}

impl Kv for f16 {
    #[inline(always)]
    fn at(p: *const f16, i: usize) -> *const f16 {
        p.wrapping_add(i)
    }
    fn bytes(n: usize) -> usize {
        2 * n
    }
    #[inline(always)]
    unsafe fn ld<S: Simd>(p: *const f16, i: usize) -> S {
        unsafe { S::load_f16(p.add(i)) }
    }
}

/// A byte of q8_0 blocks (34 bytes per 32 values: an f16 scale, then 32 signed quants).
/// Rows start at block boundaries (checked by the kernel), so a row's element `i` is
/// quant `i % 32` of its block `i / 32`.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(super) struct Q8(u8);

impl Kv for Q8 {
    #[inline(always)]
    fn at(p: *const Q8, i: usize) -> *const Q8 {
        p.wrapping_add(i / 32 * 34)
    }
    fn bytes(n: usize) -> usize {
        n.div_ceil(32) * 34
    }
    #[inline(always)]
    unsafe fn ld<S: Simd>(p: *const Q8, i: usize) -> S {
        unsafe {
            let blk = (p as *const u8).add(i / 32 * 34);
            let bits = (blk as *const u16).read_unaligned();
            let scale = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)));
            S::load_q8(blk.add(2 + i % 32) as *const i8, scale)
        }
    }
}

/// Rows ahead of the one being read that the products prefetch into L1 (a model's keys
/// and values come from the last-level cache or memory: a cache of 30 layers does not stay
/// in L2). 16 rows: ~3% off a warm step over 2048 keys; 32 to 256 rows ahead into L2 did
/// no better when the cache comes from memory (`timing`, `ATTN_COLD=600`).
const AHEAD: usize = 16;

/// Prefetches `len` elements of the row [`AHEAD`] rows after `p` (rows `t` apart).
#[inline(always)]
fn prefetch<K: Kv>(p: *const K, t: usize, len: usize) {
    simd::prefetch_raw(K::at(p, AHEAD * t) as *const u8, K::bytes(len));
}

/// The most query rows one pass over a block serves.
const ROWS: usize = 4;

/// `sc[r·kb + j] = q_r · k_j` for `R` rows (`d = NC·L` apart) and `n` keys (`k_t` apart).
/// `tmp` holds `R·L` vectors.
#[inline(always)]
unsafe fn scores<S: Simd, K: Kv, const R: usize, const NC: usize>(
    q: *const f32,
    k: *const K,
    k_t: usize,
    n: usize,
    sc: *mut f32,
    kb: usize,
    tmp: *mut S,
) {
    unsafe {
        let d = NC * S::L;
        let mut qr = [[S::zero(); NC]; R];
        for (r, qr) in qr.iter_mut().enumerate() {
            for (c, x) in qr.iter_mut().enumerate() {
                *x = S::load(q.add(r * d + c * S::L));
            }
        }
        let full = n - n % S::L;
        let mut j = 0;
        while j < full {
            for jj in 0..S::L {
                let kp = K::at(k, (j + jj) * k_t);
                prefetch(kp, k_t, NC * S::L);
                let a = dot(&qr, kp);
                for (r, a) in a.into_iter().enumerate() {
                    *tmp.add(r * S::L + jj) = a;
                }
            }
            for r in 0..R {
                S::sums(tmp.add(r * S::L)).store(sc.add(r * kb + j));
            }
            j += S::L;
        }
        for j in full..n {
            let a = dot(&qr, K::at(k, j * k_t));
            for (r, a) in a.into_iter().enumerate() {
                *sc.add(r * kb + j) = a.hsum();
            }
        }
    }
}

/// One key's partial sums (a vector each) for `R` rows: `Σ_c q_r[c·L ..] · k[c·L ..]`.
#[inline(always)]
unsafe fn dot<S: Simd, K: Kv, const R: usize, const NC: usize>(
    qr: &[[S; NC]; R],
    kp: *const K,
) -> [S; R] {
    unsafe {
        let mut kv = [S::zero(); NC];
        for (c, x) in kv.iter_mut().enumerate() {
            *x = K::ld(kp, c * S::L);
        }
        let mut out = [S::zero(); R];
        for (r, o) in out.iter_mut().enumerate() {
            let mut a = S::mul(qr[r][0], kv[0]);
            for c in 1..NC {
                a = S::fma(qr[r][c], kv[c], a);
            }
            *o = a;
        }
        out
    }
}

/// One value row into `R` rows' accumulators: `a[r][w] += p[r·kb] · v[w·L ..]`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `a` is indexed by both loops
unsafe fn step<S: Simd, K: Kv, const R: usize, const W: usize>(
    a: &mut [[S; W]; R],
    p: *const f32,
    kb: usize,
    vp: *const K,
) {
    unsafe {
        let mut pj = [S::zero(); R];
        for (r, x) in pj.iter_mut().enumerate() {
            *x = S::splat(*p.add(r * kb));
        }
        for w in 0..W {
            let x = K::ld(vp, w * S::L);
            for r in 0..R {
                a[r][w] = S::fma(pj[r], x, a[r][w]);
            }
        }
    }
}

/// `acc_r[c0 .. c0 + W·L] += Σ_j p[r·kb + j] v_j[c0 ..]` for `R` rows (`d` apart) over `n`
/// values (`v_t` apart), for every `c0` in steps of `W·L` below `d`.
#[inline(always)]
unsafe fn accumulate<S: Simd, K: Kv, const R: usize, const W: usize>(
    p: *const f32,
    kb: usize,
    v: *const K,
    v_t: usize,
    n: usize,
    acc: *mut f32,
    d: usize,
) {
    unsafe {
        let mut c0 = 0;
        while c0 < d {
            let mut a = [[S::zero(); W]; R];
            // One row: two sets of accumulators (even and odd keys) to hide the latency.
            let mut b = [S::zero(); W];
            for (r, a) in a.iter_mut().enumerate() {
                for (w, x) in a.iter_mut().enumerate() {
                    *x = S::load(acc.add(r * d + c0 + w * S::L));
                }
            }
            let mut j = 0;
            if R == 1 {
                while j + 2 <= n {
                    let vp = K::at(v, j * v_t + c0);
                    prefetch(vp, v_t, W * S::L);
                    prefetch(K::at(vp, v_t), v_t, W * S::L);
                    step(&mut a, p.add(j), kb, vp);
                    let vp = K::at(v, (j + 1) * v_t + c0);
                    let pj = S::splat(*p.add(j + 1));
                    for (w, x) in b.iter_mut().enumerate() {
                        *x = S::fma(pj, K::ld(vp, w * S::L), *x);
                    }
                    j += 2;
                }
            }
            while j < n {
                let vp = K::at(v, j * v_t + c0);
                prefetch(vp, v_t, W * S::L);
                step(&mut a, p.add(j), kb, vp);
                j += 1;
            }
            for (r, a) in a.iter().enumerate() {
                for (w, &x) in a.iter().enumerate() {
                    let x = if R == 1 { S::add(x, b[w]) } else { x };
                    x.store(acc.add(r * d + c0 + w * S::L));
                }
            }
            c0 += W * S::L;
        }
    }
}

/// The online-softmax step of one block, as [`super::decode::Softmax`] does it: for every
/// row, the scores become `scale·x + bias`, then probabilities relative to the new running
/// maximum (in place), and the row's running sum and accumulator are rescaled to it. Rows
/// past `nq` in a tile are zeroed.
#[inline(always)]
unsafe fn softmax<S: Simd>(sc: *mut f32, bias: Option<(*const f32, usize)>, st: Step) {
    unsafe {
        let Step {
            m,
            l,
            acc,
            rows,
            scale,
            qt,
            nq,
            n,
            kb,
            d,
        } = st;
        let log2e = std::f32::consts::LOG2_E;
        let full = n - n % S::L;
        for r in 0..rows {
            let ii = r % qt;
            let x = sc.add(r * kb);
            if ii >= nq {
                std::ptr::write_bytes(x, 0, n);
                continue;
            }
            let b = bias.map(|(b, stride)| b.add(ii * stride));
            let vs = S::splat(scale);
            let mut vmax = S::splat(f32::NEG_INFINITY);
            let mut j = 0;
            while j < full {
                let v = match b {
                    Some(b) => S::fma(S::load(x.add(j)), vs, S::load(b.add(j))),
                    None => S::mul(S::load(x.add(j)), vs),
                };
                v.store(x.add(j));
                vmax = S::max(vmax, v);
                j += S::L;
            }
            let mut mx = vmax.hmax();
            for j in full..n {
                let v = (*x.add(j)).mul_add(scale, b.map_or(0.0, |b| *b.add(j)));
                *x.add(j) = v;
                mx = if v > mx { v } else { mx };
            }
            let m_old = *m.add(r);
            let m_new = if mx > m_old { mx } else { m_old };
            if m_new == f32::NEG_INFINITY {
                std::ptr::write_bytes(x, 0, n);
                continue;
            }
            let corr = simd::exp2::<true>((m_old - m_new) * log2e);
            let (vm, vl) = (S::splat(m_new), S::splat(log2e));
            let mut vsum = S::zero();
            let mut j = 0;
            while j < full {
                let e = S::mul(S::sub(S::load(x.add(j)), vm), vl).exp2_softmax();
                e.store(x.add(j));
                vsum = S::add(vsum, e);
                j += S::L;
            }
            let mut sum = vsum.hsum();
            for j in full..n {
                let e = simd::exp2_softmax::<true>((*x.add(j) - m_new) * log2e);
                *x.add(j) = e;
                sum += e;
            }
            if corr != 1.0 {
                let (a, vc) = (acc.add(r * d), S::splat(corr));
                for c in (0..d).step_by(S::L) {
                    S::mul(S::load(a.add(c)), vc).store(a.add(c));
                }
            }
            *l.add(r) = *l.add(r) * corr + sum;
            *m.add(r) = m_new;
        }
    }
}

/// The running state and sizes of a softmax step (raw parts of [`block_softmax`]'s
/// arguments).
#[derive(Clone, Copy)]
struct Step {
    m: *mut f32,
    l: *mut f32,
    acc: *mut f32,
    rows: usize,
    scale: f32,
    qt: usize,
    nq: usize,
    n: usize,
    kb: usize,
    d: usize,
}

/// [`super::decode::Softmax`] where [`handles`]`(isa, d)`: `sc` holds the rows'
/// scores (rows `kb` apart), `bias` the bias of the block's first key for query row 0 and
/// the stride between query rows (`None`: no bias).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_softmax(
    isa: Isa,
    sc: &mut [f32],
    bias: Option<(&[f32], usize)>,
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    scale: f32,
    (qt, nq, n, kb, d): (usize, usize, usize, usize, usize),
) {
    let rows = m.len();
    assert!(handles(isa, d) && n <= kb && qt > 0);
    assert!(sc.len() >= rows * kb && l.len() >= rows && acc.len() >= rows * d);
    if let Some((b, stride)) = bias {
        assert!(nq == 0 || (nq - 1) * stride + n <= b.len());
    }
    let st = Step {
        m: m.as_mut_ptr(),
        l: l.as_mut_ptr(),
        acc: acc.as_mut_ptr(),
        rows,
        scale,
        qt,
        nq,
        n,
        kb,
        d,
    };
    let bias = bias.map(|(b, stride)| (b.as_ptr(), stride));
    // SAFETY: the instruction set was detected on this CPU (`handles`); every row, bias row and
    // accumulator read or written lies inside the slices (checked above).
    unsafe {
        if isa >= Isa::Avx512 {
            softmax_z(sc.as_mut_ptr(), bias, st)
        } else {
            softmax_y(sc.as_mut_ptr(), bias, st)
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
unsafe fn softmax_z(sc: *mut f32, bias: Option<(*const f32, usize)>, st: Step) {
    unsafe { softmax::<Z>(sc, bias, st) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_y(sc: *mut f32, bias: Option<(*const f32, usize)>, st: Step) {
    unsafe { softmax::<Y>(sc, bias, st) }
}

/// Whether the block steps here handle head dim `d` at instruction set `isa` (AVX2 or
/// AVX-512, and at most [`simd::isa`]: what this CPU has and the cap allows).
pub(super) fn handles(isa: Isa, d: usize) -> bool {
    // Against the CPU's own level, not the current cap: what makes the intrinsics sound is
    // the hardware (the caller dispatches with the capped level; a cap another thread sets
    // meanwhile, as tests do, must not turn a running step into a panic).
    isa >= Isa::Avx2 && isa <= simd::detected_isa() && matches!(d, 32 | 64 | 96 | 128)
}

/// A block's rows of `d` elements, `t` apart, from element `start`: checked against the
/// storage, as a raw pointer.
fn rows_ptr<T>(s: &[T], start: usize, n: usize, t: usize, d: usize) -> *const T {
    assert!(
        n == 0 || start + (n - 1) * t + d <= s.len(),
        "attention block"
    );
    s[start..].as_ptr()
}

/// [`rows_ptr`] for q8_0 blocks: rows of `d` values (whole blocks) from value `start`, `t`
/// values apart, every row starting at a block boundary.
fn q8_rows(b: &[u8], start: usize, n: usize, t: usize, d: usize) -> *const Q8 {
    assert!(
        start % 32 == 0 && t % 32 == 0 && d % 32 == 0,
        "q8_0 attention rows must start at block boundaries"
    );
    assert!(
        n == 0 || (start + (n - 1) * t + d) / 32 * 34 <= b.len(),
        "attention block"
    );
    b[start / 32 * 34..].as_ptr() as *const Q8
}

/// `sc[r·kb + j] = q_r · k_j` for every row of `q` (rows of `d`) and the `n` keys of the
/// block at `start` (`k_t` apart). Only when [`handles`]`(d)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scores(
    isa: Isa,
    q: &[f32],
    k: KvRows<'_>,
    start: usize,
    k_t: usize,
    n: usize,
    d: usize,
    sc: &mut [f32],
    kb: usize,
) {
    let rows = q.len() / d;
    assert!(handles(isa, d) && n <= kb && sc.len() >= rows * kb);
    let (q, sc) = (q.as_ptr(), sc.as_mut_ptr());
    let avx512 = isa >= Isa::Avx512;
    // SAFETY: the instruction set was detected on this CPU (`handles`); q holds `rows`
    // rows of d, sc `rows` rows of kb ≥ n, and the key rows were checked by `rows_ptr`.
    unsafe {
        match (k, avx512) {
            (KvRows::F32(s), true) => {
                scores_z::<f32>(q, rows, d, rows_ptr(s, start, n, k_t, d), k_t, n, sc, kb)
            }
            (KvRows::F16(s), true) => {
                scores_z::<f16>(q, rows, d, rows_ptr(s, start, n, k_t, d), k_t, n, sc, kb)
            }
            (KvRows::F32(s), false) => {
                scores_y::<f32>(q, rows, d, rows_ptr(s, start, n, k_t, d), k_t, n, sc, kb)
            }
            (KvRows::F16(s), false) => {
                scores_y::<f16>(q, rows, d, rows_ptr(s, start, n, k_t, d), k_t, n, sc, kb)
            }
            (KvRows::Blocks(luminal::DType::Q8_0, b), true) => {
                scores_z::<Q8>(q, rows, d, q8_rows(b, start, n, k_t, d), k_t, n, sc, kb)
            }
            (KvRows::Blocks(luminal::DType::Q8_0, b), false) => {
                scores_y::<Q8>(q, rows, d, q8_rows(b, start, n, k_t, d), k_t, n, sc, kb)
            }
            (KvRows::Blocks(..), _) => {
                unreachable!("other block types are decoded before the block steps")
            }
        }
    }
}

/// `acc_r += Σ_j p[r·kb + j] v_j` for every row of `acc` (rows of `d`) over the `n` values
/// of the block at `start` (`v_t` apart). Only when [`handles`]`(isa, d)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_accumulate(
    isa: Isa,
    acc: &mut [f32],
    p: &[f32],
    kb: usize,
    v: KvRows<'_>,
    start: usize,
    v_t: usize,
    n: usize,
    d: usize,
) {
    let rows = acc.len() / d;
    assert!(handles(isa, d) && n <= kb && p.len() >= rows * kb);
    let (acc, p) = (acc.as_mut_ptr(), p.as_ptr());
    let avx512 = isa >= Isa::Avx512;
    // SAFETY: as in `block_scores`.
    unsafe {
        match (v, avx512) {
            (KvRows::F32(s), true) => {
                accumulate_z::<f32>(acc, rows, d, p, kb, rows_ptr(s, start, n, v_t, d), v_t, n)
            }
            (KvRows::F16(s), true) => {
                accumulate_z::<f16>(acc, rows, d, p, kb, rows_ptr(s, start, n, v_t, d), v_t, n)
            }
            (KvRows::F32(s), false) => {
                accumulate_y::<f32>(acc, rows, d, p, kb, rows_ptr(s, start, n, v_t, d), v_t, n)
            }
            (KvRows::F16(s), false) => {
                accumulate_y::<f16>(acc, rows, d, p, kb, rows_ptr(s, start, n, v_t, d), v_t, n)
            }
            (KvRows::Blocks(luminal::DType::Q8_0, b), true) => {
                accumulate_z::<Q8>(acc, rows, d, p, kb, q8_rows(b, start, n, v_t, d), v_t, n)
            }
            (KvRows::Blocks(luminal::DType::Q8_0, b), false) => {
                accumulate_y::<Q8>(acc, rows, d, p, kb, q8_rows(b, start, n, v_t, d), v_t, n)
            }
            (KvRows::Blocks(..), _) => {
                unreachable!("other block types are decoded before the block steps")
            }
        }
    }
}

/// Dispatch over the rows of a chunk (1 ..= ROWS) and a const head-dim parameter.
macro_rules! by_rows {
    ($rr:expr, $f:ident::<$s:ty, $k:ty, _, $c:tt>($($arg:expr),*)) => {
        match $rr {
            1 => $f::<$s, $k, 1, $c>($($arg),*),
            2 => $f::<$s, $k, 2, $c>($($arg),*),
            3 => $f::<$s, $k, 3, $c>($($arg),*),
            _ => $f::<$s, $k, 4, $c>($($arg),*),
        }
    };
}

macro_rules! scores_isa {
    ($name:ident, $s:ty, $feat:literal, [$($d:literal => $nc:literal),*]) => {
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<K: Kv>(
            q: *const f32,
            rows: usize,
            d: usize,
            k: *const K,
            k_t: usize,
            n: usize,
            sc: *mut f32,
            kb: usize,
        ) {
            unsafe {
                let mut tmp = [<$s>::zero(); ROWS * <$s>::L];
                let tmp = tmp.as_mut_ptr();
                let mut r0 = 0;
                while r0 < rows {
                    let rr = (rows - r0).min(ROWS);
                    let (q, sc) = (q.add(r0 * d), sc.add(r0 * kb));
                    match d {
                        $($d => by_rows!(rr, scores::<$s, K, _, $nc>(q, k, k_t, n, sc, kb, tmp)),)*
                        _ => unreachable!(),
                    }
                    r0 += rr;
                }
            }
        }
    };
}

macro_rules! accumulate_isa {
    ($name:ident, $s:ty, $feat:literal, [$($d:literal => $w:literal),*]) => {
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<K: Kv>(
            acc: *mut f32,
            rows: usize,
            d: usize,
            p: *const f32,
            kb: usize,
            v: *const K,
            v_t: usize,
            n: usize,
        ) {
            unsafe {
                let mut r0 = 0;
                while r0 < rows {
                    let rr = (rows - r0).min(ROWS);
                    let (acc, p) = (acc.add(r0 * d), p.add(r0 * kb));
                    match d {
                        $($d => by_rows!(rr, accumulate::<$s, K, _, $w>(p, kb, v, v_t, n, acc, d)),)*
                        _ => unreachable!(),
                    }
                    r0 += rr;
                }
            }
        }
    };
}

scores_isa!(
    scores_z,
    Z,
    "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c",
    [32 => 2, 64 => 4, 96 => 6, 128 => 8]
);
scores_isa!(
    scores_y,
    Y,
    "avx2,fma,f16c",
    [32 => 4, 64 => 8, 96 => 12, 128 => 16]
);
accumulate_isa!(
    accumulate_z,
    Z,
    "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c",
    [32 => 2, 64 => 4, 96 => 2, 128 => 4]
);
accumulate_isa!(
    accumulate_y,
    Y,
    "avx2,fma,f16c",
    [32 => 4, 64 => 4, 96 => 4, 128 => 4]
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Task;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i.wrapping_mul(2654435761).wrapping_add(seed * 7919)) % 10007;
                x as f32 / 10007.0 * 4.0 - 2.0
            })
            .collect()
    }

    /// The levels this CPU runs.
    fn levels() -> Vec<Isa> {
        [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&isa| isa <= simd::detected_isa())
            .collect()
    }

    /// Keys / values as stored: `n` rows of `d`, `t` apart (padding between rows when
    /// `t > d`), from element `start`.
    fn kv(half: bool, len: usize, seed: usize) -> (Vec<f32>, Vec<f16>) {
        let x: Vec<f32> = data(len, seed)
            .into_iter()
            .map(|v| f16::from_f32(v).to_f32())
            .collect();
        let h = x.iter().map(|&v| f16::from_f32(v)).collect();
        (if half { vec![] } else { x.clone() }, h)
    }

    #[test]
    fn scores_and_accumulate_match_f64() {
        for isa in levels() {
            for d in [32, 64, 96, 128] {
                for rows in [1, 2, 3, 4, 5, 9] {
                    for n in [1, 7, 16, 17, 40, 256] {
                        // Storage 0: f32, 1: f16, 2: q8_0 blocks (rows a whole number of
                        // blocks apart).
                        for (kind, t) in [(0, d), (1, d), (1, 3 * d + 8), (2, d), (2, 3 * d + 32)] {
                            let kb = 256;
                            let start = 5 * t;
                            let len = start + n * t;
                            let (x32, x16) = kv(kind == 1, len, d + rows);
                            let (mut q8, mut x8) = (vec![0u8; len / 32 * 34], vec![0f32; len]);
                            if kind == 2 {
                                let x: Vec<f32> = x16.iter().map(|v| v.to_f32()).collect();
                                luminal::quant::encode(luminal::DType::Q8_0, &x, &mut q8);
                                luminal::quant::decode(luminal::DType::Q8_0, &q8, &mut x8);
                            }
                            let rows_of = || match kind {
                                0 => KvRows::F32(&x32),
                                1 => KvRows::F16(&x16),
                                _ => KvRows::Blocks(luminal::DType::Q8_0, &q8),
                            };
                            let elem = |i: usize| {
                                if kind == 2 {
                                    x8[i] as f64
                                } else {
                                    x16[i].to_f32() as f64
                                }
                            };
                            let q = data(rows * d, n);
                            let mut sc = vec![f32::NAN; rows * kb];
                            block_scores(isa, &q, rows_of(), start, t, n, d, &mut sc, kb);
                            for r in 0..rows {
                                for j in 0..n {
                                    let (mut want, mut mag) = (0f64, 0f64);
                                    for c in 0..d {
                                        let p = q[r * d + c] as f64 * elem(start + j * t + c);
                                        want += p;
                                        mag += p.abs();
                                    }
                                    let got = sc[r * kb + j] as f64;
                                    assert!(
                                        (got - want).abs() <= 1e-6 * mag + 1e-30,
                                        "{isa:?} scores d {d} rows {rows} n {n} t {t} \
                                         [{r}, {j}]: {got} vs {want}"
                                    );
                                }
                            }
                            let p = data(rows * kb, 3);
                            let acc0 = data(rows * d, 4);
                            let mut acc = acc0.clone();
                            block_accumulate(isa, &mut acc, &p, kb, rows_of(), start, t, n, d);
                            for r in 0..rows {
                                for c in 0..d {
                                    let (mut want, mut mag) =
                                        (acc0[r * d + c] as f64, acc0[r * d + c].abs() as f64);
                                    for j in 0..n {
                                        let x = p[r * kb + j] as f64 * elem(start + j * t + c);
                                        want += x;
                                        mag += x.abs();
                                    }
                                    let got = acc[r * d + c] as f64;
                                    assert!(
                                        (got - want).abs() <= 1e-6 * mag + 1e-30,
                                        "{isa:?} accumulate d {d} rows {rows} n {n} t {t} \
                                         [{r}, {c}]: {got} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Against the portable step ([`super::super::decode::Softmax`]): masked keys, fully
    /// masked rows, rows past `nq`, a growing maximum across two blocks.
    #[test]
    fn softmax_matches_portable() {
        for isa in levels() {
            for d in [32, 64] {
                for (rows, qt, nq) in [(1, 1, 1), (3, 1, 1), (6, 2, 1), (4, 2, 2)] {
                    for n in [1, 5, 16, 33, 256] {
                        let kb = 256;
                        let bstride = n + 3;
                        let bias: Vec<f32> = (0..qt * bstride)
                            .map(|i| match i % 7 {
                                0 => f32::NEG_INFINITY,
                                1 => -0.5,
                                _ => 0.0,
                            })
                            .collect();
                        let mut bias_rows_masked = bias.clone();
                        bias_rows_masked[..n].fill(f32::NEG_INFINITY);
                        for (b, with_bias) in
                            [(&bias, true), (&bias_rows_masked, true), (&bias, false)]
                        {
                            let mut want_sc = data(rows * kb, n);
                            let mut want_acc = data(rows * d, 2);
                            let mut want_m = vec![f32::NEG_INFINITY; rows];
                            want_m[0] = 1.5;
                            let mut want_l = vec![0.5f32; rows];
                            let (mut sc, mut acc, mut m, mut l) = (
                                want_sc.clone(),
                                want_acc.clone(),
                                want_m.clone(),
                                want_l.clone(),
                            );
                            let zeros = vec![0f32; bstride * qt];
                            let (bs, bst) = if with_bias { (b, bstride) } else { (&zeros, 0) };
                            super::super::decode::Softmax {
                                sc: &mut want_sc,
                                bs,
                                bstride: bst,
                                m: &mut want_m,
                                l: &mut want_l,
                                acc: &mut want_acc,
                                scale: 0.7,
                                qt,
                                nq,
                                n,
                                kb,
                                d,
                            }
                            .run::<true>();
                            block_softmax(
                                isa,
                                &mut sc,
                                with_bias.then_some((&b[..], bstride)),
                                &mut m,
                                &mut l,
                                &mut acc,
                                0.7,
                                (qt, nq, n, kb, d),
                            );
                            let close = |a: f32, b: f32| {
                                a == b || (a - b).abs() <= 2e-6 * a.abs().max(b.abs())
                            };
                            let what = format!("{isa:?} d {d} rows {rows} qt {qt} nq {nq} n {n}");
                            for r in 0..rows {
                                assert!(close(m[r], want_m[r]), "{what}: m[{r}]");
                                assert!(close(l[r], want_l[r]), "{what}: l[{r}]");
                                for j in 0..n {
                                    let (a, b) = (sc[r * kb + j], want_sc[r * kb + j]);
                                    assert!(close(a, b), "{what}: p[{r}][{j}] {a} vs {b}");
                                }
                                for c in 0..d {
                                    let (a, b) = (acc[r * d + c], want_acc[r * d + c]);
                                    assert!(close(a, b), "{what}: acc[{r}][{c}] {a} vs {b}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The vector softmax exponential is the scalar `simd::exp2_softmax` bit for bit (so a
    /// row's tail, done in scalar code, agrees with its body), which is `simd::exp2` for
    /// `x` in `[-126, 126]` and 0 below -127.
    #[test]
    fn vector_exp2_softmax_is_the_scalar_one() {
        let mut xs: Vec<f32> = (0..200_000)
            .map(|i| -160.0 + i as f32 * (300.0 / 200_000.0))
            .collect();
        xs.extend([
            0.0,
            -0.0,
            -126.0,
            -126.5,
            -127.0,
            -150.0,
            129.0,
            200.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 1.0);
        for isa in levels() {
            let mut got = vec![0f32; xs.len()];
            // SAFETY: the level was detected on this CPU.
            unsafe {
                if isa >= Isa::Avx512 {
                    exp2_softmax_z(&xs, &mut got)
                } else {
                    exp2_softmax_y(&xs, &mut got)
                }
            }
            for (&x, &g) in xs.iter().zip(&got) {
                let want = simd::exp2_softmax::<true>(x);
                assert!(
                    g.to_bits() == want.to_bits() || g.is_nan() && want.is_nan(),
                    "{isa:?} exp2_softmax({x}) = {g}, want {want}"
                );
                if (-126.0..=126.0).contains(&x) {
                    let full = simd::exp2::<true>(x);
                    assert_eq!(g.to_bits(), full.to_bits(), "exp2_softmax({x})");
                } else if x < -127.0 {
                    assert_eq!(g, 0.0, "exp2_softmax({x})");
                } else if x.is_nan() {
                    assert!(g.is_nan(), "exp2_softmax(NaN) = {g}");
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
    unsafe fn exp2_softmax_z(x: &[f32], out: &mut [f32]) {
        for (x, o) in x.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
            // SAFETY: 16 lanes of each.
            unsafe { Z::load(x.as_ptr()).exp2_softmax().store(o.as_mut_ptr()) }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp2_softmax_y(x: &[f32], out: &mut [f32]) {
        for (x, o) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
            // SAFETY: 8 lanes of each.
            unsafe { Y::load(x.as_ptr()).exp2_softmax().store(o.as_mut_ptr()) }
        }
    }
}
