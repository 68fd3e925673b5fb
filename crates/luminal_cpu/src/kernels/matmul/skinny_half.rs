//! Skinny products over half weights read in place (decode steps with f16 / bf16 weights):
//! the weight is never widened as a whole. Each kernel converts the weight eight elements at
//! a time as it streams past (F16C `vcvtph2ps` for f16, a shift for bf16) and accumulates
//! exact products in `f32`, like the f32 kernels of `matvec.rs` and `matmul.rs`:
//!
//! - [`skinny`]: `M ≤ 8` rows against a weight contiguous along K (stored `[N, K]`, how
//!   `Linear` keeps it): one dot product per output, the threads split the columns;
//! - [`axpy`]: `M = 1` against a weight contiguous along N (stored `[K, N]`): each task owns
//!   a chunk of output columns (in L1) and adds the weight's rows into it, scaled.
//!
//! Without AVX2 + F16C (or with the instruction set capped below AVX2) the same loops run
//! on short blocks widened with `half`'s slice conversions.

use crate::kernels::matmul::skinny_f32::MAX_ROWS;
use crate::simd::half::fast;
use crate::storage::Elem;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::kernels::matmul::skinny_f32::OutPtr;

/// Elements of `K` widened at a time by the portable kernels (a stack block in L1).
const KC: usize = 256;

/// One skinny product: `dst[i·n + j] = Σ_q a[a_off + i·a_row + q] · b[b_off + j·b_row + q]`
/// for `i < m ≤ MAX_ROWS`, `j < n`, `q < k`. Panics (before reading anything) when the
/// operands are too short for those indices. Allocates nothing.
#[allow(clippy::too_many_arguments)]
pub fn skinny<H: Elem>(
    a: &[f32],
    (a_off, a_row): (usize, usize),
    b: &[H],
    (b_off, b_row): (usize, usize),
    dst: &mut [f32],
    (m, n, k): (usize, usize, usize),
    parallel: bool,
) {
    assert!((1..=MAX_ROWS).contains(&m) && dst.len() >= m * n);
    if n == 0 {
        return;
    }
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    assert!(
        a_off + (m - 1) * a_row + k <= a.len(),
        "skinny: a too short"
    );
    assert!(
        b_off + (n - 1) * b_row + k <= b.len(),
        "skinny: b too short"
    );
    let mut rows: [&[f32]; MAX_ROWS] = [&[]; MAX_ROWS];
    for (i, r) in rows.iter_mut().enumerate().take(m) {
        *r = &a[a_off + i * a_row..a_off + i * a_row + k];
    }
    let out = OutPtr(dst.as_mut_ptr());
    let use_fast = fast();
    let cols = |j0: usize, j1: usize| {
        // The whole `OutPtr` (Send), not its raw pointer field, is captured.
        #[allow(clippy::redundant_locals)]
        let out = out;
        let w = |j: usize| &b[b_off + j * b_row..b_off + j * b_row + k];
        #[cfg(target_arch = "x86_64")]
        if use_fast {
            // SAFETY: AVX2, FMA and F16C were detected (`fast`); every row of `rows` and
            // every weight row `w(j)`, j < n, holds `k` elements (checked above); `out`
            // holds m·n elements and this task alone writes columns j0..j1.
            unsafe { skinny_cols_avx2(&rows[..m], &w, j0..j1, out, n, k) };
            return;
        }
        let _ = use_fast;
        for j in j0..j1 {
            let d = dots_portable(&rows[..m], w(j));
            for (i, v) in d.iter().enumerate().take(m) {
                // SAFETY: i < m, j < n, and `out` holds m·n elements; no other task writes
                // column j.
                unsafe { *out.0.add(i * n + j) = *v };
            }
        }
    };
    crate::kernels::matmul::skinny_f32::split_columns(n, parallel, cols);
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

/// The skinny column loop with AVX2 + F16C: picks the register blocking for `rows.len()`.
///
/// # Safety
/// As [`skinny_cols_avx2_r`].
#[cfg(target_arch = "x86_64")]
unsafe fn skinny_cols_avx2<'w, H: Elem>(
    rows: &[&[f32]],
    w: &impl Fn(usize) -> &'w [H],
    js: std::ops::Range<usize>,
    out: OutPtr,
    n: usize,
    k: usize,
) {
    let mut p = [std::ptr::null::<f32>(); MAX_ROWS];
    for (q, r) in p.iter_mut().zip(rows) {
        *q = r.as_ptr();
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        match rows.len() {
            1 => skinny_cols_avx2_r::<H, 1, 4>(&p, w, js, out, n, k),
            2 => skinny_cols_avx2_r::<H, 2, 2>(&p, w, js, out, n, k),
            3 => skinny_cols_avx2_r::<H, 3, 2>(&p, w, js, out, n, k),
            4 => skinny_cols_avx2_r::<H, 4, 1>(&p, w, js, out, n, k),
            5 => skinny_cols_avx2_r::<H, 5, 1>(&p, w, js, out, n, k),
            6 => skinny_cols_avx2_r::<H, 6, 1>(&p, w, js, out, n, k),
            7 => skinny_cols_avx2_r::<H, 7, 1>(&p, w, js, out, n, k),
            _ => skinny_cols_avx2_r::<H, 8, 1>(&p, w, js, out, n, k),
        }
    }
}

/// Columns `js` of an `R`-row skinny product, `U` independent accumulators per row (so
/// that at least four FMA chains are in flight).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `rows[..R]` point at `k` readable floats each;
/// `w(j)` has `k` elements for every `j` in `js`; `out` holds `R · n` floats, `js.end <= n`,
/// and no other thread writes these columns.
#[allow(clippy::needless_range_loop)] // fixed-size register tiles, indexed on purpose
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn skinny_cols_avx2_r<'w, H: Elem, const R: usize, const U: usize>(
    rows: &[*const f32; MAX_ROWS],
    w: &impl Fn(usize) -> &'w [H],
    js: std::ops::Range<usize>,
    out: OutPtr,
    n: usize,
    k: usize,
) {
    for j in js {
        let wj = w(j);
        debug_assert_eq!(wj.len(), k);
        let wp = wj.as_ptr();
        // Rows are usually contiguous: fetch the weight a few rows ahead (as `quant`).
        crate::simd::prefetch_raw(
            (wp as *const u8).wrapping_add(crate::simd::PREFETCH_AHEAD),
            2 * k,
        );
        // SAFETY (whole block): every access is at an index below `k` of a row of `rows`
        // or of `wj`, or at `r · n + j < R · n` of `out`, per the function's contract.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); U]; R];
            let mut q = 0;
            while q + 8 * U <= k {
                for u in 0..U {
                    let wv = H::load8(wp.add(q + 8 * u));
                    for r in 0..R {
                        let x = _mm256_loadu_ps(rows[r].add(q + 8 * u));
                        acc[r][u] = _mm256_fmadd_ps(x, wv, acc[r][u]);
                    }
                }
                q += 8 * U;
            }
            while q + 8 <= k {
                let wv = H::load8(wp.add(q));
                for r in 0..R {
                    let x = _mm256_loadu_ps(rows[r].add(q));
                    acc[r][0] = _mm256_fmadd_ps(x, wv, acc[r][0]);
                }
                q += 8;
            }
            let mut tail = [0f32; R];
            while q < k {
                let y = wj[q].to_f32();
                for r in 0..R {
                    tail[r] = (*rows[r].add(q)).mul_add(y, tail[r]);
                }
                q += 1;
            }
            for r in 0..R {
                let mut s = acc[r][0];
                for u in 1..U {
                    s = _mm256_add_ps(s, acc[r][u]);
                }
                *out.0.add(r * n + j) = crate::simd::hsum(s) + tail[r];
            }
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
