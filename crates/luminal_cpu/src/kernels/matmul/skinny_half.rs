//! Skinny products over half weights read in place (decode steps with f16 / bf16 weights):
//! the weight is never widened as a whole. Each kernel converts the weight as it streams
//! past (`vcvtph2ps` for f16, a shift for bf16; sixteen at a time with AVX-512, eight with
//! AVX2 + F16C) and accumulates exact products in `f32`, like the f32 kernels of
//! `matvec.rs` and `matmul.rs`:
//!
//! - [`HalfRows`], the f16 / bf16 format of the skinny product (`skinny.rs`): `M ≤ 8` rows against a weight contiguous along K (stored `[N, K]`, how
//!   `Linear` keeps it, and the f16 / bf16 GGUF weights of `quant::weight_matmul`): one dot
//!   product per output, a block of up to four weight rows read together (each activation
//!   load feeds all of them, the outputs reduced together), the weight prefetched 8 KiB
//!   ahead; the threads split the columns;
//! - [`axpy`]: `M = 1` against a weight contiguous along N (stored `[K, N]`): each task owns
//!   a chunk of output columns (in L1) and adds the weight's rows into it, scaled.
//!
//! Without AVX2 + F16C (or with the instruction set capped below AVX2) the same loops run
//! on short blocks widened with `half`'s slice conversions.

use crate::kernels::matmul::skinny::MAX_ROWS;
use crate::simd::half::{fast, half_level, HalfLevel};
use crate::storage::Elem;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::kernels::matmul::skinny::{Out, OutPtr, SkinnyWeight};

/// Elements of `K` widened at a time by the portable kernels (a stack block in L1).
const KC: usize = 256;

/// A half weight type the skinny kernels stream: f16 or bf16.
pub trait Half: Elem {
    /// Sixteen weights at `p`, widened (exactly).
    ///
    /// # Safety
    /// The CPU supports AVX-512 F; `p .. p + 16` is readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
    /// The first lanes of `mask` widened from `p`, the others zero (nothing past them read).
    ///
    /// # Safety
    /// The CPU supports AVX-512 F, BW and VL; the lanes of `mask` are readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16_mask(p: *const Self, mask: __mmask16) -> __m512;
}

#[cfg(target_arch = "x86_64")]
impl Half for half::f16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: forwarded from the caller (AVX-512 F, 32 readable bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load16_mask(p: *const Self, mask: __mmask16) -> __m512 {
        // SAFETY: forwarded from the caller; masked-off lanes are not read.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16)) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Half for half::bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: forwarded from the caller (AVX-512 F, 32 readable bytes).
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
    #[inline(always)]
    unsafe fn load16_mask(p: *const Self, mask: __mmask16) -> __m512 {
        // SAFETY: forwarded from the caller; masked-off lanes are not read.
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p as *const i16));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Half for half::f16 {}
#[cfg(not(target_arch = "x86_64"))]
impl Half for half::bf16 {}

/// Bytes ahead of the weight being read that the skinny kernels prefetch (rows are usually
/// contiguous, so this reaches into the next rows).
/// (1×576·[49152,576]ᵀ f16 on one thread: 11 GB/s at 1.5 KiB, 13 at 8 KiB, fewer at 32.)
const SKINNY_AHEAD: usize = 8192;

/// A half weight (f16 / bf16) of `n` rows of `k` values for the skinny product
/// (`skinny.rs`), row `j` at `b[off + j·row ..]`, streamed at the level `lvl` (which the CPU
/// must support; `None`: portable).
///
/// Each weight row is read once for all `m` activation rows; with AVX-512 or AVX2 a block
/// of up to four weight rows is read together (one activation load feeds each of them) and
/// the block's outputs are reduced together.
pub(crate) struct HalfRows<'b, H> {
    b: &'b [H],
    off: usize,
    row: usize,
    n: usize,
    k: usize,
    lvl: Option<HalfLevel>,
}

impl<'b, H: Half> HalfRows<'b, H> {
    /// At the best level this CPU has. Panics when `b` is too short for `n` rows of `k`.
    pub(crate) fn new(b: &'b [H], at: (usize, usize), n: usize, k: usize) -> Self {
        Self::at_level(half_level(), b, at, n, k)
    }

    /// At the level `lvl` (which the CPU must support; `None`: portable).
    pub(crate) fn at_level(
        lvl: Option<HalfLevel>,
        b: &'b [H],
        (off, row): (usize, usize),
        n: usize,
        k: usize,
    ) -> Self {
        assert!(
            n == 0 || k == 0 || off + (n - 1) * row + k <= b.len(),
            "skinny product: half weight too short"
        );
        HalfRows {
            b,
            off,
            row,
            n,
            k,
            lvl,
        }
    }
}

impl<H: Half> SkinnyWeight for HalfRows<'_, H> {
    type Acts = ();

    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn with_acts<R>(&self, _rows: &[&[f32]], f: impl FnOnce(&()) -> R) -> R {
        f(&())
    }

    fn columns(&self, _: &(), rows: &[&[f32]], cols: std::ops::Range<usize>, out: Out) {
        let HalfRows {
            b,
            off,
            row,
            n,
            k,
            lvl,
        } = *self;
        let m = rows.len();
        #[cfg(target_arch = "x86_64")]
        {
            let mut p = [std::ptr::null::<f32>(); MAX_ROWS];
            for (q, r) in p.iter_mut().zip(rows) {
                *q = r.as_ptr();
            }
            // SAFETY (both): the ISA was detected (`half_level`); every row of `p[..m]` and
            // every weight row `off + j·row`, j < n, holds `k` elements (checked by the
            // driver and `at_level`); `out` holds m·n elements and this task alone writes
            // its columns.
            let w = b[off..].as_ptr();
            match lvl {
                Some(HalfLevel::Avx512) => {
                    unsafe { cols_avx512::<H>(&p, m, w, row, cols, out.ptr, n, k) };
                    return;
                }
                Some(HalfLevel::Avx2) => {
                    unsafe { cols_avx2::<H>(&p, m, w, row, cols, out.ptr, n, k) };
                    return;
                }
                None => {}
            }
        }
        let _ = lvl;
        let w = |j: usize| &b[off + j * row..off + j * row + k];
        for j in cols {
            let d = dots_portable(rows, w(j));
            for (i, v) in d.iter().enumerate().take(m) {
                // SAFETY: i < m, j < n; no other task writes column j.
                unsafe { out.put(i, j, *v) };
            }
        }
    }
}

/// `Σ_q rows[i][q] · w[q]` for every row, widening `w` a block at a time.
fn dots_portable<H: Elem>(rows: &[&[f32]], w: &[H]) -> [f32; MAX_ROWS] {
    let mut acc = [[0f32; 8]; MAX_ROWS];
    let mut tmp = [0f32; KC];
    for (c, wc) in w.chunks(KC).enumerate() {
        let t = &mut tmp[..wc.len()];
        H::widen(wc, t);
        for (i, r) in rows.iter().enumerate() {
            let r = &r[c * KC..c * KC + wc.len()];
            for (x, y) in r.chunks(8).zip(t.chunks(8)) {
                for l in 0..x.len() {
                    acc[i][l] += x[l] * y[l];
                }
            }
        }
    }
    let mut out = [0f32; MAX_ROWS];
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
    out
}

/// Columns `js` of an `m`-row skinny product with AVX-512: picks the register blocking.
///
/// # Safety
/// As [`cols_avx512_rc`], for every `j` in `js`.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
unsafe fn cols_avx512<H: Half>(
    rows: &[*const f32; MAX_ROWS],
    m: usize,
    w: *const H,
    w_row: usize,
    js: std::ops::Range<usize>,
    out: OutPtr,
    n: usize,
    k: usize,
) {
    // `C` weight rows at a time while `C` of them remain, then one at a time.
    macro_rules! go {
        ($r:literal, $c:literal, $u:literal, $u1:literal) => {{
            let j4 = js.start + (js.end - js.start) / $c * $c;
            // SAFETY: forwarded from the caller.
            unsafe {
                cols_avx512_rc::<H, $r, $c, $u>(rows, w, w_row, js.start..j4, out, n, k);
                cols_avx512_rc::<H, $r, 1, $u1>(rows, w, w_row, j4..js.end, out, n, k);
            }
        }};
    }
    match m {
        1 => go!(1, 4, 2, 4),
        2 => go!(2, 4, 1, 4),
        3 => go!(3, 4, 1, 2),
        4 => go!(4, 4, 1, 2),
        5 => go!(5, 2, 1, 1),
        6 => go!(6, 2, 1, 1),
        7 => go!(7, 2, 1, 1),
        _ => go!(8, 2, 1, 1),
    }
}

/// Sums of the lanes of `v[0..4]`, in the four lanes of the result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2")]
#[inline]
unsafe fn hsum4_512(v: [__m512; 4]) -> __m128 {
    let h = |x: __m512| _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps::<1>(x));
    let (a, b, c, d) = (h(v[0]), h(v[1]), h(v[2]), h(v[3]));
    let s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s))
}

/// Columns `js` (a multiple of `C` of them) of an `R`-row skinny product with AVX-512:
/// `C` weight rows at a time, `U` accumulators per (row, column) pair, sixteen weights per
/// load converted in registers, the tail of K with masked loads.
///
/// # Safety
/// The CPU supports AVX-512 F, BW, VL and DQ; `rows[..R]` point at `k` readable floats each;
/// `w + j·w_row .. + k` is readable for every `j` in `js`; `out` holds `R · n` floats,
/// `js.end <= n`, and no other thread writes these columns.
#[allow(clippy::needless_range_loop)] // fixed-size register tiles, indexed on purpose
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn cols_avx512_rc<H: Half, const R: usize, const C: usize, const U: usize>(
    rows: &[*const f32; MAX_ROWS],
    w: *const H,
    w_row: usize,
    js: std::ops::Range<usize>,
    out: OutPtr,
    n: usize,
    k: usize,
) {
    let tail = (k % 16) as u32;
    let mask: __mmask16 = ((1u32 << tail) - 1) as u16;
    let kv = k - k % 16;
    let mut j = js.start;
    // SAFETY (whole loop): every load is at an index below `k` of a row of `rows` or of a
    // weight row `j + c < js.end` (the tail masked to the first `k % 16` lanes), every store
    // at `r · n + j + c < R · n`, per the contract; prefetches are hints.
    unsafe {
        while j + C <= js.end {
            let wp: [*const H; C] = std::array::from_fn(|c| w.add((j + c) * w_row));
            let mut acc = [[[_mm512_setzero_ps(); U]; C]; R];
            let mut q = 0;
            while q + 16 * U <= kv {
                for c in 0..C {
                    crate::simd::prefetch_raw(
                        (wp[c].add(q) as *const u8).wrapping_add(SKINNY_AHEAD),
                        1,
                    );
                }
                for u in 0..U {
                    let wv: [__m512; C] = std::array::from_fn(|c| H::load16(wp[c].add(q + 16 * u)));
                    for r in 0..R {
                        let x = _mm512_loadu_ps(rows[r].add(q + 16 * u));
                        for c in 0..C {
                            acc[r][c][u] = _mm512_fmadd_ps(x, wv[c], acc[r][c][u]);
                        }
                    }
                }
                q += 16 * U;
            }
            while q < kv {
                let wv: [__m512; C] = std::array::from_fn(|c| H::load16(wp[c].add(q)));
                for r in 0..R {
                    let x = _mm512_loadu_ps(rows[r].add(q));
                    for c in 0..C {
                        acc[r][c][0] = _mm512_fmadd_ps(x, wv[c], acc[r][c][0]);
                    }
                }
                q += 16;
            }
            if tail > 0 {
                let wv: [__m512; C] = std::array::from_fn(|c| H::load16_mask(wp[c].add(q), mask));
                for r in 0..R {
                    let x = _mm512_maskz_loadu_ps(mask, rows[r].add(q));
                    for c in 0..C {
                        acc[r][c][0] = _mm512_fmadd_ps(x, wv[c], acc[r][c][0]);
                    }
                }
            }
            // Fold the U accumulators, then reduce the R·C outputs four at a time.
            let mut sums = [_mm512_setzero_ps(); 32];
            for r in 0..R {
                for c in 0..C {
                    let mut s = acc[r][c][0];
                    for u in 1..U {
                        s = _mm512_add_ps(s, acc[r][c][u]);
                    }
                    sums[r * C + c] = s;
                }
            }
            let mut vals = [0f32; 32];
            let mut g = 0;
            while g < R * C {
                let v = hsum4_512([sums[g], sums[g + 1], sums[g + 2], sums[g + 3]]);
                _mm_storeu_ps(vals.as_mut_ptr().add(g), v);
                g += 4;
            }
            for r in 0..R {
                for c in 0..C {
                    *out.0.add(r * n + j + c) = vals[r * C + c];
                }
            }
            j += C;
        }
    }
}

/// Columns `js` of an `m`-row skinny product with AVX2 + F16C: picks the register blocking.
///
/// # Safety
/// As [`cols_avx2_rc`], for every `j` in `js`.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
unsafe fn cols_avx2<H: Half>(
    rows: &[*const f32; MAX_ROWS],
    m: usize,
    w: *const H,
    w_row: usize,
    js: std::ops::Range<usize>,
    out: OutPtr,
    n: usize,
    k: usize,
) {
    macro_rules! go {
        ($r:literal, $c:literal, $u:literal, $u1:literal) => {{
            let j4 = js.start + (js.end - js.start) / $c * $c;
            // SAFETY: forwarded from the caller.
            unsafe {
                cols_avx2_rc::<H, $r, $c, $u>(rows, w, w_row, js.start..j4, out, n, k);
                cols_avx2_rc::<H, $r, 1, $u1>(rows, w, w_row, j4..js.end, out, n, k);
            }
        }};
    }
    match m {
        1 => go!(1, 4, 2, 4),
        2 => go!(2, 4, 1, 2),
        3 => go!(3, 2, 1, 2),
        4 => go!(4, 2, 1, 1),
        5 => go!(5, 1, 1, 1),
        6 => go!(6, 1, 1, 1),
        7 => go!(7, 1, 1, 1),
        _ => go!(8, 1, 1, 1),
    }
}

/// Columns `js` (a multiple of `C` of them) of an `R`-row skinny product with AVX2 + F16C:
/// `C` weight rows at a time, `U` accumulators per (row, column) pair, the tail of K in
/// scalar code.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; otherwise as [`cols_avx512_rc`].
#[allow(clippy::needless_range_loop)] // fixed-size register tiles, indexed on purpose
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_avx2_rc<H: Half, const R: usize, const C: usize, const U: usize>(
    rows: &[*const f32; MAX_ROWS],
    w: *const H,
    w_row: usize,
    js: std::ops::Range<usize>,
    out: OutPtr,
    n: usize,
    k: usize,
) {
    let mut j = js.start;
    // SAFETY (whole loop): every access is at an index below `k` of a row of `rows` or of a
    // weight row `j + c < js.end`, or at `r · n + j + c < R · n` of `out`, per the contract.
    unsafe {
        while j + C <= js.end {
            let wp: [*const H; C] = std::array::from_fn(|c| w.add((j + c) * w_row));
            let mut acc = [[[_mm256_setzero_ps(); U]; C]; R];
            let mut q = 0;
            while q + 8 * U <= k {
                if (q * 2) % 64 < 16 * U {
                    for c in 0..C {
                        crate::simd::prefetch_raw(
                            (wp[c].add(q) as *const u8).wrapping_add(SKINNY_AHEAD),
                            1,
                        );
                    }
                }
                for u in 0..U {
                    let wv: [__m256; C] = std::array::from_fn(|c| H::load8(wp[c].add(q + 8 * u)));
                    for r in 0..R {
                        let x = _mm256_loadu_ps(rows[r].add(q + 8 * u));
                        for c in 0..C {
                            acc[r][c][u] = _mm256_fmadd_ps(x, wv[c], acc[r][c][u]);
                        }
                    }
                }
                q += 8 * U;
            }
            while q + 8 <= k {
                let wv: [__m256; C] = std::array::from_fn(|c| H::load8(wp[c].add(q)));
                for r in 0..R {
                    let x = _mm256_loadu_ps(rows[r].add(q));
                    for c in 0..C {
                        acc[r][c][0] = _mm256_fmadd_ps(x, wv[c], acc[r][c][0]);
                    }
                }
                q += 8;
            }
            let mut tails = [[0f32; C]; R];
            while q < k {
                for c in 0..C {
                    let y = (*wp[c].add(q)).to_f32();
                    for r in 0..R {
                        tails[r][c] = (*rows[r].add(q)).mul_add(y, tails[r][c]);
                    }
                }
                q += 1;
            }
            for r in 0..R {
                for c in 0..C {
                    let mut s = acc[r][c][0];
                    for u in 1..U {
                        s = _mm256_add_ps(s, acc[r][c][u]);
                    }
                    *out.0.add(r * n + j + c) = crate::simd::hsum(s) + tails[r][c];
                }
            }
            j += C;
        }
    }
}

/// An `M = 1` product with the weight contiguous along N:
/// `dst[j] = Σ_q a[a_off + q] · b[b_off + q·b_row + j]` for `j < dst.len()`, `q < k`.
/// Panics (before reading anything) when the operands are too short. Allocates nothing.
pub fn axpy<H: Elem>(
    a: &[f32],
    a_off: usize,
    b: &[H],
    (b_off, b_row): (usize, usize),
    dst: &mut [f32],
    k: usize,
    parallel: bool,
) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    if k == 0 {
        dst.fill(0.0);
        return;
    }
    assert!(a_off + k <= a.len(), "axpy: a too short");
    assert!(b_off + (k - 1) * b_row + n <= b.len(), "axpy: b too short");
    let x = &a[a_off..a_off + k];
    let use_fast = fast();
    // One column chunk per thread (longer row segments stream better than more, shorter
    // tasks), at least 256 wide; the chunk of output stays in L1.
    let threads = if parallel {
        crate::exec::par::threads()
    } else {
        1
    };
    let cols = n.div_ceil(threads).max(256).next_multiple_of(16);
    let task = |t: usize, out: &mut [f32]| {
        let c0 = t * cols;
        let w = out.len();
        let row = |q: usize| &b[b_off + q * b_row + c0..b_off + q * b_row + c0 + w];
        #[cfg(target_arch = "x86_64")]
        if use_fast {
            // SAFETY: AVX2, FMA and F16C were detected; `row(q)` has `out.len()` elements
            // for every q < k = x.len() (checked above).
            unsafe { axpy_avx2(x, &row, out) };
            return;
        }
        let _ = use_fast;
        axpy_portable(x, &row, out);
    };
    if parallel {
        crate::exec::par::for_each_chunk(dst, cols, task);
    } else {
        dst.chunks_mut(cols)
            .enumerate()
            .for_each(|(t, c)| task(t, c));
    }
}

/// `out[c] = Σ_q x[q] · row(q)[c]`, widening the rows a block at a time.
fn axpy_portable<'b, H: Elem>(x: &[f32], row: &impl Fn(usize) -> &'b [H], out: &mut [f32]) {
    out.fill(0.0);
    let mut tmp = [0f32; KC];
    for (q, &xq) in x.iter().enumerate() {
        let r = row(q);
        for (o, rc) in out.chunks_mut(KC).zip(r.chunks(KC)) {
            let t = &mut tmp[..rc.len()];
            H::widen(rc, t);
            for (o, &y) in o.iter_mut().zip(t.iter()) {
                *o += xq * y;
            }
        }
    }
}

/// `out[c] = Σ_q x[q] · row(q)[c]` with AVX2 + F16C: eight rows per pass over the output
/// chunk, summed as a tree (short dependency chains; the chunk is loaded and stored once per
/// eight rows).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `row(q)` has `out.len()` elements for `q < x.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_avx2<'b, H: Elem>(x: &[f32], row: &impl Fn(usize) -> &'b [H], out: &mut [f32]) {
    let (w, k) = (out.len(), x.len());
    out.fill(0.0);
    let o = out.as_mut_ptr();
    let mut q = 0;
    // SAFETY (both loops): column indices stay below `w`, the length of `out` and of every
    // `row(q)`; row indices stay below `k`.
    unsafe {
        while q + 8 <= k {
            let r: [*const H; 8] = std::array::from_fn(|i| row(q + i).as_ptr());
            let xs: [__m256; 8] = std::array::from_fn(|i| _mm256_set1_ps(x[q + i]));
            let mut c = 0;
            while c + 8 <= w {
                let p = |i: usize| _mm256_mul_ps(xs[i], H::load8(r[i].add(c)));
                let s01 = _mm256_fmadd_ps(xs[1], H::load8(r[1].add(c)), p(0));
                let s23 = _mm256_fmadd_ps(xs[3], H::load8(r[3].add(c)), p(2));
                let s45 = _mm256_fmadd_ps(xs[5], H::load8(r[5].add(c)), p(4));
                let s67 = _mm256_fmadd_ps(xs[7], H::load8(r[7].add(c)), p(6));
                let s = _mm256_add_ps(_mm256_add_ps(s01, s23), _mm256_add_ps(s45, s67));
                _mm256_storeu_ps(o.add(c), _mm256_add_ps(_mm256_loadu_ps(o.add(c)), s));
                c += 8;
            }
            while c < w {
                let mut s = 0f32;
                for i in 0..8 {
                    s = x[q + i].mul_add((*r[i].add(c)).to_f32(), s);
                }
                *o.add(c) += s;
                c += 1;
            }
            q += 8;
        }
        while q < k {
            let (xq, rq) = (_mm256_set1_ps(x[q]), row(q).as_ptr());
            let mut c = 0;
            while c + 8 <= w {
                let v = _mm256_fmadd_ps(xq, H::load8(rq.add(c)), _mm256_loadu_ps(o.add(c)));
                _mm256_storeu_ps(o.add(c), v);
                c += 8;
            }
            while c < w {
                *o.add(c) = x[q].mul_add((*rq.add(c)).to_f32(), *o.add(c));
                c += 1;
            }
            q += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::skinny::skinny;
    use crate::kernels::matmul::testing::{assert_matches_f64, vals};
    use half::{bf16, f16};

    /// The levels this CPU runs, the portable one (`None`) first.
    fn levels() -> Vec<Option<HalfLevel>> {
        std::iter::once(None)
            .chain(
                crate::simd::half::detected_half_levels()
                    .into_iter()
                    .map(Some),
            )
            .collect()
    }

    /// The skinny product over [`HalfRows`] against an f64 reference at every level, over odd shapes, strided and
    /// offset operands.
    fn check<H: Half>(from: fn(f32) -> H) {
        for lvl in levels() {
            for m in 1..=MAX_ROWS {
                for &k in &[1usize, 7, 15, 16, 17, 31, 33, 100, 577] {
                    for &n in &[1usize, 3, 5, 13, 37, 70] {
                        let (a_off, a_row) = (3, k + 5);
                        let (b_off, b_row) = (2, k + 3);
                        let a = vals(a_off + m * a_row, (m * 31 + k) as u32);
                        let b: Vec<H> = vals(b_off + n * b_row, (n * 7 + k) as u32)
                            .into_iter()
                            .map(from)
                            .collect();
                        for parallel in [false, true] {
                            let mut dst = vec![f32::NAN; m * n + 2];
                            let w = HalfRows::at_level(lvl, &b, (b_off, b_row), n, k);
                            skinny(&w, &a, (a_off, a_row), &mut dst, m, parallel);
                            assert_matches_f64(
                                &format!("{lvl:?}"),
                                &a,
                                (a_off, a_row),
                                |j, q| b[b_off + j * b_row + q].to_f32(),
                                &dst,
                                (m, n, k),
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn skinny_f16_matches_f64() {
        check::<f16>(f16::from_f32);
    }

    #[test]
    fn skinny_bf16_matches_f64() {
        check::<bf16>(bf16::from_f32);
    }
}
