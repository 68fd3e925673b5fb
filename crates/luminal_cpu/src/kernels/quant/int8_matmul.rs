//! Products `x · Wᵀ` with block-quantized weights and int8 activations (the policy allows
//! int8: `exact == false`; see `mod.rs`'s `takes_int8`). The activation rows are quantized
//! once per product, the weight rows split over the threads by column ranges
//! ([`split_columns`]), and each task walks its range in blocks of weight rows (at most
//! [`PANEL_BYTES`]) that stay in L1/L2 while every chunk of activation rows passes over
//! them:
//!
//! - **skinny** (`M ≤ 8`, decode; [`Int8Rows`], the int8 format of `matmul/skinny.rs`):
//!   formats with a fused dot (`legacy_dot.rs`,
//!   `kquant_dot.rs`, SIMD paths) unpack a weight row in registers once per chunk of up to
//!   four activation rows (`dot_rows`), instead of once per row; the other formats (and the
//!   portable path) unpack each weight row into scratch (`unpack.rs`) for `int8::dot`;
//! - **wide on AMX** (`M > 8`, prefill, where the CPU has AMX-INT8 and `LUMINAL_AMX` is not
//!   `0`): `amx_int8.rs`, activations quantized per block of 32, tile products per 16 or 32
//!   values of K scaled with AVX-512 (~3× the VNNI span kernel below);
//! - **wide** (`M > 8`, prefill, AVX-512 VNNI): activations quantized in the span layout
//!   (`span_acts.rs`, in parallel), blocks of weight rows unpacked into a panel in the same
//!   layout, then `span_dot::dot_rows` for chunks of up to 16 activation rows; the results
//!   of a block and chunk are stored row by row. With AVX2 and no VNNI, register tiles of
//!   4 activation rows × 8 weight rows (`tile_avx2.rs`).

use super::PANEL_BYTES;
use super::{int8, kquant_dot, legacy_dot, prefetch, span_acts, span_dot, tile_avx2, unpack};
use super::{with_unpacked, WeightRef};
use crate::kernels::matmul::skinny::{split_columns, Out, OutPtr, SkinnyWeight, MAX_ROWS};
use crate::simd::PREFETCH_AHEAD;
use luminal::DType;
use std::cell::RefCell;
use std::ops::Range;

thread_local! {
    /// The current product's quantized activation rows (on the thread running the kernel).
    static QACTS: RefCell<int8::QActs> = RefCell::new(int8::QActs::default());
}

thread_local! {
    /// The current wide product's activation rows in the span layout.
    static SPAN_ACTS: RefCell<span_acts::SpanActs> = RefCell::new(span_acts::SpanActs::default());
    /// This thread's panel of weight rows in the span layout: quants, group scales, biases.
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
}

/// `out[at ..][..vals.len()] = vals`.
///
/// # Safety
/// `at .. at + vals.len()` is inside the output and no other task writes it.
#[inline(always)]
unsafe fn put_row(out: &OutPtr, at: usize, vals: &[f32]) {
    std::ptr::copy_nonoverlapping(vals.as_ptr(), out.0.add(at), vals.len());
}

/// Weight rows in the span layout: quants, group scales, group biases.
#[derive(Default)]
struct Panel {
    u: span_acts::Aligned<u8>,
    a: span_acts::Aligned<f32>,
    b: span_acts::Aligned<f32>,
}

/// A wide product on a SIMD path (`span_dot.rs`): the `m` activation rows (`rows(i)`)
/// quantized in the span layout, then each task unpacks blocks of its weight rows into a
/// panel (at most [`PANEL_BYTES`]) and dots every chunk of activation rows with every panel
/// row.
fn wide<'x>(
    path: int8::DotPath,
    w: WeightRef,
    rows: impl Fn(usize) -> &'x [f32] + Sync,
    out: OutPtr,
    m: usize,
    par: bool,
) {
    let (n, k) = (w.n, w.k);
    let rb = w.row_bytes();
    let l = span_acts::Layout::new(k);
    let (su, sg) = (l.spans() * span_acts::SPAN, l.spans() * 16);
    let g = k / unpack::GROUP;
    let signed = unpack::signed_quants(w.dtype);
    let legacy = legacy_dot::has_fused_dot(w.dtype);
    let max_r = span_dot::MAX_R;
    // Panel bytes per row: the quants and two f32 per group of 16. At most 64 rows (the
    // result tile below holds MAX_R × 64 values).
    let block = (PANEL_BYTES / (su + 8 * sg)).clamp(4, 64);
    SPAN_ACTS.with(|q| {
        let mut q = q.borrow_mut();
        q.quantize(l, m, rows, par);
        let q = &*q;
        split_columns(n, par, |j0, j1| {
            let mut res = [0f32; span_dot::MAX_R];
            let mut tile = [0f32; span_dot::MAX_R * 64];
            PANEL.with(|p| {
                let p = &mut *p.borrow_mut();
                if p.u.len() < block * su {
                    p.u.resize(block * su);
                    p.a.resize(block * sg);
                    p.b.resize(block * sg);
                }
                let (pu, pa, pb) = (p.u.as_mut_slice(), p.a.as_mut_slice(), p.b.as_mut_slice());
                let panel = |s: usize| (s * su..(s + 1) * su, s * sg..(s + 1) * sg);
                for jb in (j0..j1).step_by(block) {
                    let je = (jb + block).min(j1);
                    for j in jb..je {
                        let (ru, rg) = panel(j - jb);
                        let (u, a, b) = (&mut pu[ru], &mut pa[rg.clone()], &mut pb[rg]);
                        prefetch(w.bytes, j * rb + PREFETCH_AHEAD, rb);
                        let row = &w.bytes[j * rb..(j + 1) * rb];
                        let (uk, ag, bg) = (&mut u[..k], &mut a[..g], &mut b[..g]);
                        if !(legacy && legacy_dot::unpack_row(w.dtype, row, uk, ag, bg)) {
                            unpack::unpack(w.dtype, row, uk, ag, bg);
                        }
                        span_acts::finish_row(l, signed, u, a, b);
                    }
                    let width = je - jb;
                    for i in (0..m).step_by(max_r) {
                        let r = (m - i).min(max_r);
                        let x = q.rows(i, r);
                        for j in jb..je {
                            let (ru, rg) = panel(j - jb);
                            let row = span_acts::SpanRow {
                                u: &pu[ru],
                                a: &pa[rg.clone()],
                                b: &pb[rg],
                            };
                            span_dot::dot_rows(path, row, x, &mut res[..r]);
                            for (t, &v) in res[..r].iter().enumerate() {
                                tile[t * width + j - jb] = v;
                            }
                        }
                        // The chunk's rows of this block, stored row by row.
                        for (t, vals) in tile[..r * width].chunks_exact(width).enumerate() {
                            // SAFETY: rows i + t < m, columns jb .. je ≤ n of the m·n output;
                            // no other task writes these columns.
                            unsafe { put_row(&out, (i + t) * n + jb, vals) };
                        }
                    }
                }
            })
        });
    });
}

/// A fused multi-row int8 dot, checked at each call ([`dot_rows`]).
type RowsDot = fn(int8::DotPath, DType, &[u8], int8::QRows, &mut [f32]);

/// `out[r] = Σ w·x_r` of one weight row of `dtype` and the rows `x` with the format's fused
/// dot, its operands checked for this one call ([`fused_kernel`]; loops over many weight
/// rows call the kernel it returns instead).
fn dot_rows(path: int8::DotPath, dtype: DType, row: &[u8], x: int8::QRows, out: &mut [f32]) {
    assert_eq!(
        out.len(),
        x.rows,
        "int8 dot: {} results for {} rows",
        out.len(),
        x.rows
    );
    let dot = fused_kernel(path, dtype, row.len(), &x).expect("a format with a fused dot");
    // SAFETY: `fused_kernel` checked `x` and the row length for this call.
    unsafe { dot(row, &x, out) }
}

/// The checked kernel of the fused dot of `dtype` on `path` for the rows `x` and weight rows
/// of `row_len` bytes (`legacy_dot::kernel`, `kquant_dot::kernel`): what a loop over many
/// weight rows calls. `None` where `fused_rows_dot` is.
pub(super) fn fused_kernel(
    path: int8::DotPath,
    dtype: DType,
    row_len: usize,
    x: &int8::QRows,
) -> Option<int8::RowsKernel> {
    match path {
        int8::DotPath::Portable => None,
        _ if legacy_dot::has_fused_dot(dtype) => Some(legacy_dot::kernel(path, dtype, row_len, x)),
        _ if kquant_dot::has_fused_dot(dtype) => Some(kquant_dot::kernel(path, dtype, row_len, x)),
        _ => None,
    }
}

/// The fused multi-row dot of `dtype` on `path` and the most rows it takes, if any.
pub(super) fn fused_rows_dot(path: int8::DotPath, dtype: DType) -> Option<(RowsDot, usize)> {
    match path {
        int8::DotPath::Portable => None,
        _ if legacy_dot::has_fused_dot(dtype) => Some((dot_rows, legacy_dot::MAX_R)),
        _ if kquant_dot::has_fused_dot(dtype) => Some((dot_rows, kquant_dot::MAX_R)),
        _ => None,
    }
}

/// Whether skinny products against `dtype` quantize their activations in two levels
/// (`int8.rs`): where the format's fused dot takes them (the 32-value block formats on the
/// AVX2 and AVX-512 VNNI paths), unless `LUMINAL_CPU_ACT_LEVELS=1` (or
/// `crate::set_activation_levels`) asks for one level everywhere.
pub(crate) fn two_level(path: int8::DotPath, dtype: DType) -> bool {
    static ENV: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    let levels = match LEVELS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *ENV.get_or_init(
            || match std::env::var("LUMINAL_CPU_ACT_LEVELS").as_deref() {
                Ok("1") => 1,
                _ => 2,
            },
        ),
        l => l,
    };
    levels == 2 && path != int8::DotPath::Portable && legacy_dot::has_fused_dot(dtype)
}

/// The process-wide override of `LUMINAL_CPU_ACT_LEVELS` (0: none; see
/// `crate::set_activation_levels`).
pub(crate) static LEVELS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// A block-quantized weight as the skinny product's format with int8 activations
/// (`matmul/skinny.rs`; decode steps): the activation rows quantized once per product
/// (`Acts`), then each task walks its columns in blocks of weight rows (at most
/// [`PANEL_BYTES`]) that stay in L1/L2 while every chunk of up to `max_r` activation rows
/// passes over them, with the format's fused multi-row dot where it has one; the other
/// formats (and the portable path) unpack each weight row into scratch for `int8::dot`.
pub(crate) struct Int8Rows<'w> {
    w: WeightRef<'w>,
    path: int8::DotPath,
}

impl<'w> Int8Rows<'w> {
    pub(crate) fn new(w: WeightRef<'w>) -> Self {
        Int8Rows {
            w,
            path: int8::DotPath::current(),
        }
    }
}

impl SkinnyWeight for Int8Rows<'_> {
    type Acts = int8::QActs;

    fn shape(&self) -> (usize, usize) {
        (self.w.n, self.w.k)
    }

    fn with_acts<R>(&self, rows: &[&[f32]], f: impl FnOnce(&int8::QActs) -> R) -> R {
        QACTS.with(|q| {
            let mut q = q.borrow_mut();
            if two_level(self.path, self.w.dtype) {
                q.quantize_two_level(rows.len(), self.w.k, |i| rows[i]);
            } else {
                q.quantize(rows.len(), self.w.k, |i| rows[i]);
            }
            f(&q)
        })
    }

    fn columns(&self, q: &int8::QActs, rows: &[&[f32]], cols: Range<usize>, out: Out) {
        let (w, path, m) = (self.w, self.path, rows.len());
        let rb = w.row_bytes();
        if let Some((_, max_r)) = fused_rows_dot(path, w.dtype) {
            let block = (PANEL_BYTES / rb).clamp(8, 64);
            let mut res = [0f32; MAX_ROWS];
            for jb in cols.clone().step_by(block) {
                let je = (jb + block).min(cols.end);
                for i in (0..m).step_by(max_r) {
                    let r = (m - i).min(max_r);
                    let x = q.rows(i, r);
                    // The operands are checked once per block and chunk of rows, not once
                    // per weight row.
                    let dot = fused_kernel(path, w.dtype, rb, &x).expect("a fused dot");
                    for j in jb..je {
                        if i == 0 {
                            prefetch(w.bytes, j * rb + PREFETCH_AHEAD, rb);
                        }
                        // SAFETY: `fused_kernel` checked `x` and the row length; the row
                        // is in bounds (j < n) and `res` holds r ≤ max_r values.
                        unsafe { dot(&w.bytes[j * rb..(j + 1) * rb], &x, &mut res[..r]) };
                        for (t, &v) in res[..r].iter().enumerate() {
                            // SAFETY: i + t < m, j < n; no other task writes column j.
                            unsafe { out.put(i + t, j, v) };
                        }
                    }
                }
            }
            return;
        }
        let signed = unpack::signed_quants(w.dtype);
        with_unpacked(w.k, |u, sa, sb| {
            for j in cols {
                prefetch(w.bytes, j * rb + PREFETCH_AHEAD, rb);
                unpack::unpack(w.dtype, &w.bytes[j * rb..(j + 1) * rb], u, sa, sb);
                let wr = int8::URow {
                    u,
                    a: sa,
                    b: sb,
                    signed,
                };
                for i in 0..m {
                    // SAFETY: i < m, j < n; no other task writes column j.
                    unsafe { out.put(i, j, int8::dot(path, wr, q.row(i))) };
                }
            }
        })
    }
}

/// `out[i·n + j] = Σ_k q_i[k] · W[j, k]` for `i < m`, `j < n`, `m > MAX_ROWS` (the wide
/// product; skinny ones take [`Int8Rows`]), with `q_i` row `i` of `a` (from `a_off`, rows
/// `a_row` apart) quantized to int8. The caller checked the lengths.
#[allow(clippy::too_many_arguments)]
pub(super) fn int8_matmul(
    a: &[f32],
    a_off: usize,
    a_row: usize,
    w: WeightRef,
    out: OutPtr,
    m: usize,
    parallel: bool,
) {
    assert!(
        m > MAX_ROWS,
        "int8_matmul: {m} rows take the skinny product"
    );
    let path = int8::DotPath::current();
    let k = w.k;
    let rows = |i: usize| &a[a_off + i * a_row..a_off + i * a_row + k];
    #[cfg(target_arch = "x86_64")]
    if super::amx_int8::takes(path) && super::amx_int8::wide(w, rows, out, m, parallel) {
        return;
    }
    if span_dot::wide_int8(path) {
        return wide(path, w, rows, out, m, parallel);
    }
    assert!(
        tile_avx2::wide_int8(path, w.dtype),
        "wide int8 product without VNNI or AVX2 tiles"
    );
    tile_avx2::wide(w, rows, out, m, parallel)
}

/// Timings of the multi-row dots and of wide products (a measurement that asserts nothing,
/// so ignored by default): `cargo test --release -p luminal_cpu --lib int8_rows --
/// --ignored --nocapture`.
#[cfg(test)]
mod timing {
    use super::super::weight_matmul;
    use super::*;

    #[test]
    #[ignore]
    fn int8_rows() {
        let (n, k) = (1536usize, 576usize);
        for isa in [crate::Isa::Avx2, crate::Isa::Avx512] {
            if crate::set_max_isa(isa) != isa {
                continue;
            }
            let path = int8::DotPath::current();
            for dtype in [
                DType::Q4_0,
                DType::Q4_1,
                DType::Q8_0,
                DType::Q5_0,
                DType::Q4_K,
                DType::Q6_K,
            ] {
                let k = if dtype.block_size() == 256 { 768 } else { k };
                let bytes = crate::kernels::quant::timing::timing_weight(dtype, n, k);
                let m = 128;
                let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut q = int8::QActs::default();
                q.quantize(m, k, |i| &x[i * k..(i + 1) * k]);
                let (dot, max_r) = fused_rows_dot(path, dtype).unwrap();
                let rb = dtype.bytes_for(k).unwrap();
                let mut line = format!("{isa:?} {dtype}: ns/64w/row");
                let mut res = [0f32; 16];
                // 64 weight rows (L1/L2) against every activation row, R at a time.
                for r in 1..=max_r {
                    let t = std::time::Instant::now();
                    let reps = 20;
                    for _ in 0..reps {
                        for i in (0..m - r + 1).step_by(r) {
                            for j in 0..64 {
                                let row = &bytes[j * rb..(j + 1) * rb];
                                dot(path, dtype, row, q.rows(i, r), &mut res[..r]);
                            }
                        }
                    }
                    let rows = (m / r * r * 64 * reps) as f64;
                    let ns = t.elapsed().as_secs_f64() * 1e9 / rows / (k as f64 / 64.0);
                    line += &format!(" R={r} {ns:.2}");
                }
                // The span kernel alone: 16 panel rows against every activation row.
                if !span_dot::wide_int8(path) {
                    println!("{line}");
                    continue;
                }
                let l = span_acts::Layout::new(k);
                let (su, sg) = (l.spans() * span_acts::SPAN, l.spans() * 16);
                let signed = unpack::signed_quants(dtype);
                let mut qs = span_acts::SpanActs::default();
                qs.quantize(l, m, |i| &x[i * k..(i + 1) * k], false);
                let t = std::time::Instant::now();
                qs.quantize(l, m, |i| &x[i * k..(i + 1) * k], false);
                let tq = t.elapsed().as_secs_f64();
                let mut panel = Panel::default();
                panel.u.resize(16 * su);
                panel.a.resize(16 * sg);
                panel.b.resize(16 * sg);
                let (pu, pa, pb) = (
                    panel.u.as_mut_slice(),
                    panel.a.as_mut_slice(),
                    panel.b.as_mut_slice(),
                );
                let g = k / 16;
                let (mut tu, mut tf) = (f64::MAX, f64::MAX);
                for _ in 0..20 {
                    let t = std::time::Instant::now();
                    for j in 0..16 {
                        let (u, a, b) = (
                            &mut pu[j * su..(j + 1) * su],
                            &mut pa[j * sg..(j + 1) * sg],
                            &mut pb[j * sg..(j + 1) * sg],
                        );
                        let row = &bytes[j * rb..(j + 1) * rb];
                        let (uk, ag, bg) = (&mut u[..k], &mut a[..g], &mut b[..g]);
                        if !(legacy_dot::has_fused_dot(dtype)
                            && legacy_dot::unpack_row(dtype, row, uk, ag, bg))
                        {
                            unpack::unpack(dtype, row, uk, ag, bg);
                        }
                    }
                    tu = tu.min(t.elapsed().as_secs_f64() / 16.0);
                    let t = std::time::Instant::now();
                    for j in 0..16 {
                        let (u, a, b) = (
                            &mut pu[j * su..(j + 1) * su],
                            &mut pa[j * sg..(j + 1) * sg],
                            &mut pb[j * sg..(j + 1) * sg],
                        );
                        span_acts::finish_row(l, signed, u, a, b);
                    }
                    tf = tf.min(t.elapsed().as_secs_f64() / 16.0);
                }
                line += &format!(" unpack {:.2} ns/64w", tu * 1e9 / (k as f64 / 64.0));
                // The panel as the kernels read it (filled last above).
                for j in 0..16 {
                    let (u, a, b) = (
                        &mut pu[j * su..(j + 1) * su],
                        &mut pa[j * sg..(j + 1) * sg],
                        &mut pb[j * sg..(j + 1) * sg],
                    );
                    let row = &bytes[j * rb..(j + 1) * rb];
                    unpack::unpack(dtype, row, &mut u[..k], &mut a[..g], &mut b[..g]);
                    span_acts::finish_row(l, signed, u, a, b);
                }
                let mr = span_dot::MAX_R;
                let reps = 20;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    for i in (0..m).step_by(mr) {
                        let xr = qs.rows(i, mr);
                        for j in 0..16 {
                            let row = span_acts::SpanRow {
                                u: &pu[j * su..(j + 1) * su],
                                a: &pa[j * sg..(j + 1) * sg],
                                b: &pb[j * sg..(j + 1) * sg],
                            };
                            span_dot::dot_rows(path, row, xr, &mut res[..mr]);
                        }
                    }
                }
                let ns =
                    t.elapsed().as_secs_f64() * 1e9 / (m * 16 * reps) as f64 / (k as f64 / 64.0);
                line += &format!(
                    " | span R={mr} {ns:.2} (quantize {:.2} ns/value, finish {:.2} ns/64w)",
                    tq * 1e9 / (m * k) as f64,
                    tf * 1e9 / (k as f64 / 64.0)
                );
                let w = WeightRef {
                    dtype,
                    bytes: &bytes,
                    n,
                    k,
                };
                let mut out = vec![0f32; m * n];
                for exact in [false, true] {
                    let mut best = f64::MAX;
                    for _ in 0..3 {
                        let t = std::time::Instant::now();
                        weight_matmul(&x, 0, k, w, &mut out, m, 1, exact);
                        best = best.min(t.elapsed().as_secs_f64());
                    }
                    let ns = best * 1e9 / (m * n) as f64 / (k as f64 / 64.0);
                    line += &format!(" | M=128 {} {ns:.2}", if exact { "f32" } else { "int8" });
                }
                let pool = crate::exec::par::Pool::new(2).unwrap();
                for exact in [false, true] {
                    let mut best = f64::MAX;
                    for _ in 0..3 {
                        let t = std::time::Instant::now();
                        pool.enter(|| weight_matmul(&x, 0, k, w, &mut out, m, 2, exact));
                        best = best.min(t.elapsed().as_secs_f64());
                    }
                    let ns = best * 1e9 / (m * n) as f64 / (k as f64 / 64.0);
                    let what = if exact { "f32" } else { "int8" };
                    line += &format!(" | 2 threads {what} {ns:.2}");
                }
                println!("{line} {}", res[0]);
            }
        }
        crate::set_max_isa(crate::detected_isa());
    }
}
