//! The skinny product, one kernel for every weight format: `M ≤ MAX_ROWS` activation rows
//! (a decode step, a short speculative or batched step) against a weight read in place,
//! one weight row per output column, `dst[i·n + j] = Σ_q a_i[q] · W[j, q]`.
//!
//! The driver ([`skinny`]) owns what is the same for every format: the shape and bound
//! checks, the activation rows, preparing them once per product, and splitting the output
//! columns over the threads (a few tasks a thread, multiples of 4 columns, see
//! [`split_columns`]) so each weight row is read once for all `M` rows. A format
//! ([`SkinnyWeight`]) supplies only how one task computes its range of columns: its inner
//! loops per instruction set.
//!
//! | format | where | activations | inner loop |
//! |---|---|---|---|
//! | f32 | `skinny_f32.rs` | f32 | four weight rows per activation load (AVX2 / AVX-512), else one |
//! | f16, bf16 | `skinny_half.rs` | f32 | the weight widened in registers as it streams |
//! | block-quantized, `exact` | `quant/mod.rs` | f32 | fused format dots, or rows unpacked / decoded into scratch |
//! | block-quantized | `quant/int8_matmul.rs` | int8, quantized once per product | fused multi-row int8 dots, or rows unpacked into scratch |

use std::ops::Range;

/// Most activation rows of a skinny product.
pub const MAX_ROWS: usize = 8;

/// The output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint elements (their own column range of each row).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Runs `cols(j0, j1)` over column ranges covering `0 .. n`: split over the threads (a
/// few tasks per thread, multiples of 4 columns) when `parallel`, else one range.
pub(crate) fn split_columns(n: usize, parallel: bool, cols: impl Fn(usize, usize) + Sync) {
    let threads = crate::exec::par::threads();
    if parallel && threads > 1 && n >= 32 {
        let chunk = n.div_ceil(threads * 4).max(16).next_multiple_of(4);
        crate::exec::par::for_each(n.div_ceil(chunk), |c| {
            cols(c * chunk, ((c + 1) * chunk).min(n))
        });
    } else {
        cols(0, n);
    }
}

/// The `m × n` row-major output of a skinny product, as a task writes it.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    pub ptr: OutPtr,
    /// Columns (the output's row length).
    pub n: usize,
}

impl Out {
    /// `out[i, j] = v`.
    ///
    /// # Safety
    /// `i < m`, `j < n`, and no other task writes column `j`.
    #[inline(always)]
    pub unsafe fn put(&self, i: usize, j: usize, v: f32) {
        *self.ptr.0.add(i * self.n + j) = v;
    }
}

/// A weight format the skinny product streams: `n` rows of `k` values, read in place.
pub(crate) trait SkinnyWeight: Sync {
    /// What every task reads besides the activation rows, prepared once per product (the
    /// rows quantized to int8; `()` for formats that dot f32 rows directly).
    type Acts: Sync;

    /// Weight rows (output columns) and values per row.
    fn shape(&self) -> (usize, usize);

    /// Runs `f` with the activations prepared for this product (`rows`: `m ≥ 1` rows of
    /// `k` values).
    fn with_acts<R>(&self, rows: &[&[f32]], f: impl FnOnce(&Self::Acts) -> R) -> R;

    /// `out[i, j]` for every row `i` and column `j` in `cols`. The driver calls it once per
    /// task, with disjoint column ranges.
    fn columns(&self, acts: &Self::Acts, rows: &[&[f32]], cols: Range<usize>, out: Out);
}

/// `dst[i·n + j] = Σ_q a[a_off + i·a_row + q] · W[j, q]` for `i < m ≤ MAX_ROWS`, `j < n`,
/// with `(n, k)` the weight's shape: the columns split over the threads when `parallel`.
/// Panics (before reading anything) when `m` is out of range or the activation or output
/// is too short for these indices (the weight format checked its own rows when it was
/// made). Allocates nothing once the formats' per-thread scratch has grown.
pub(crate) fn skinny<W: SkinnyWeight>(
    w: &W,
    a: &[f32],
    (a_off, a_row): (usize, usize),
    dst: &mut [f32],
    m: usize,
    parallel: bool,
) {
    let (n, k) = w.shape();
    assert!(
        (1..=MAX_ROWS).contains(&m),
        "skinny product: {m} activation rows (1 to {MAX_ROWS})"
    );
    assert!(dst.len() >= m * n, "skinny product: output too short");
    if n == 0 {
        return;
    }
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    assert!(
        a_off + (m - 1) * a_row + k <= a.len(),
        "skinny product: activation too short"
    );
    let mut rows: [&[f32]; MAX_ROWS] = [&[]; MAX_ROWS];
    for (i, r) in rows.iter_mut().enumerate().take(m) {
        *r = &a[a_off + i * a_row..a_off + i * a_row + k];
    }
    let rows = &rows[..m];
    let out = Out {
        ptr: OutPtr(dst.as_mut_ptr()),
        n,
    };
    w.with_acts(rows, |acts| {
        split_columns(n, parallel, |j0, j1| w.columns(acts, rows, j0..j1, out))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::skinny_f32::F32Rows;
    use crate::kernels::matmul::testing::{assert_matches_f64, vals};
    use crate::simd::{isa, set_max_isa, Isa};

    /// The f32 format through the driver at every level this CPU has, against an f64
    /// reference: every row count, odd K and N (the grouped columns' remainders), strided and
    /// offset operands, one task and split columns. (The half formats' test is in
    /// `skinny_half.rs`, the quantized ones' in `quant/`.)
    #[test]
    fn f32_rows_match_f64_at_every_level() {
        let before = isa();
        for level in [Isa::Generic, Isa::Avx2, Isa::Avx512] {
            if set_max_isa(level) != level {
                continue;
            }
            for m in 1..=MAX_ROWS {
                for &k in &[1usize, 15, 64, 577] {
                    for &n in &[1usize, 5, 37, 70] {
                        let (a_off, a_row) = (3, k + 5);
                        let (b_off, b_row) = (2, k + 3);
                        let a = vals(a_off + m * a_row, (m * 31 + k) as u32);
                        let b = vals(b_off + n * b_row, (n * 7 + k) as u32);
                        for parallel in [false, true] {
                            let mut dst = vec![f32::NAN; m * n + 2];
                            let w = F32Rows::new(&b, (b_off, b_row), n, k);
                            skinny(&w, &a, (a_off, a_row), &mut dst, m, parallel);
                            assert_matches_f64(
                                &format!("{level:?}"),
                                &a,
                                (a_off, a_row),
                                |j, q| b[b_off + j * b_row + q],
                                &dst,
                                (m, n, k),
                            );
                            assert!(dst[m * n..].iter().all(|v| v.is_nan()), "wrote past m·n");
                        }
                    }
                }
            }
        }
        set_max_isa(before);
    }

    /// Bad shapes are refused before anything is read.
    #[test]
    #[should_panic(expected = "activation too short")]
    fn short_activations_panic() {
        let b = vec![1f32; 4 * 8];
        let w = F32Rows::new(&b, (0, 8), 4, 8);
        let mut dst = vec![0f32; 8];
        skinny(&w, &[1f32; 12], (0, 8), &mut dst, 2, false);
    }
}
