//! Matmul recognised from its primop pattern and run through the `gemm` crate.
//!
//! `a.matmul(b)` is built as `SumReduce(last)` over `Mul(a_view, b_view)` whose views are
//! `[batch.., M, N, K]` with `a` broadcast along `N` (stride 0) and `b` along `M`. `gemm`
//! takes row and column strides, so the operands are read in place whatever their layout
//! (transposed weights, sliced batches, broadcast batch dims): no copies.

use crate::packed::{skinny_packed, PackedMatrix};
use crate::storage::Storage;
use crate::view::{DimValues, ResolvedView, ViewExprs};
use gemm::Parallelism;
use luminal::{LuminalError, Result};
use rayon::prelude::*;

#[derive(Clone, Debug)]
pub struct MatmulKernel {
    pub a: usize,
    pub b: usize,
    pub a_exprs: ViewExprs,
    pub b_exprs: ViewExprs,
    a_view: ResolvedView,
    b_view: ResolvedView,
    /// Threads gemm may use (the runtime's pool size).
    pub threads: usize,
}

/// Batch count, M, N, K of the resolved product shape.
fn mnk(dims: &[i64]) -> (usize, usize, usize, usize) {
    let r = dims.len();
    let batch: i64 = dims[..r - 3].iter().product();
    (
        batch as usize,
        dims[r - 3] as usize,
        dims[r - 2] as usize,
        dims[r - 1] as usize,
    )
}

impl MatmulKernel {
    pub fn new(a: usize, b: usize, a_exprs: ViewExprs, b_exprs: ViewExprs, threads: usize) -> Self {
        MatmulKernel {
            a,
            b,
            a_exprs,
            b_exprs,
            a_view: ResolvedView::default(),
            b_view: ResolvedView::default(),
            threads,
        }
    }

    pub fn prepare(&mut self, dims: &DimValues, bufs: &[Storage]) -> Result<()> {
        self.a_exprs.resolve(dims, &mut self.a_view)?;
        self.b_exprs.resolve(dims, &mut self.b_view)?;
        self.a_view.check_bounds(bufs[self.a].len())?;
        self.b_view.check_bounds(bufs[self.b].len())?;
        Ok(())
    }

    /// Batch, M, N, K for the current dims.
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        mnk(&self.a_view.dims)
    }

    pub fn run(
        &self,
        bufs: &[Storage],
        packed: &[Option<std::sync::Arc<PackedMatrix>>],
        out: &mut Storage,
    ) -> Result<()> {
        let (Storage::F32(a), Storage::F32(b), Storage::F32(dst)) =
            (&bufs[self.a], &bufs[self.b], out)
        else {
            return Err(LuminalError::Backend("matmul needs f32 buffers".into()));
        };
        let (batch, m, n, k) = self.shape();
        let dst = &mut dst[..batch * m * n];
        if dst.is_empty() {
            return Ok(());
        }
        if k == 0 {
            dst.fill(0.0);
            return Ok(());
        }
        let r = self.a_view.dims.len();
        let (sa, sb) = (&self.a_view.strides, &self.b_view.strides);
        // Operand offsets of batch `i`: unravel it over the batch dims.
        let offsets = |i: usize| {
            let (mut oa, mut ob) = (self.a_view.offset, self.b_view.offset);
            let mut rem = i as i64;
            for d in (0..r - 3).rev() {
                let c = rem % self.a_view.dims[d];
                rem /= self.a_view.dims[d];
                oa += c * sa[d];
                ob += c * sb[d];
            }
            (oa, ob)
        };
        let call = |i: usize, d: &mut [f32], par: Parallelism| {
            let (oa, ob) = offsets(i);
            // SAFETY: `prepare` checked that every element the views address (offset plus
            // any in-range index times the strides, for all batches) lies inside `a` and
            // `b`; `d` is exactly the M×N row-major output of this batch, and the stride
            // arguments describe those same layouts. The buffers do not alias (`d` is the
            // kernel's own output buffer, taken out of the buffer table).
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    d.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr().offset(oa as isize),
                    sa[r - 1] as isize,
                    sa[r - 3] as isize,
                    b.as_ptr().offset(ob as isize),
                    sb[r - 2] as isize,
                    sb[r - 1] as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            }
        };
        let flops_per = m * n * k;
        if let Some(w) = packed.get(self.b).and_then(|p| p.as_deref()) {
            // The weight's block-quantized copy, when `b` reads it as the plain `Wᵀ`.
            let plain_wt = batch == 1
                && self.b_view.offset == 0
                && (sb[r - 3] == 0 || m == 1)
                && sb[r - 2] == k as i64
                && sb[r - 1] == 1
                && (w.rows(), w.cols()) == (n, k);
            if plain_wt && m <= crate::matvec::MAX_ROWS && sa[r - 1] == 1 && sa[r - 3] >= 0 {
                let (oa, _) = offsets(0);
                let parallel = self.threads > 1 && flops_per >= (1 << 15);
                skinny_packed(a, oa as usize, sa[r - 3] as usize, w, dst, m, parallel);
                return Ok(());
            }
        }
        if m <= crate::matvec::MAX_ROWS
            && sa[r - 1] == 1
            && sb[r - 1] == 1
            && sa[r - 3] >= 0
            && sb[r - 2] >= 0
        {
            // Skinny product with both operands contiguous along K (decode steps).
            let parallel = self.threads > 1 && flops_per >= (1 << 15);
            for (i, d) in dst.chunks_mut(m * n).enumerate() {
                let (oa, ob) = offsets(i);
                crate::matvec::skinny(
                    a,
                    oa as usize,
                    sa[r - 3] as usize,
                    b,
                    ob as usize,
                    sb[r - 2] as usize,
                    d,
                    m,
                    n,
                    k,
                    parallel,
                );
            }
            return Ok(());
        }
        if batch >= self.threads && flops_per < (1 << 21) && self.threads > 1 {
            // Many small matrices: one gemm per task, each single-threaded.
            dst.par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(i, d)| call(i, d, Parallelism::None));
        } else {
            let par = if flops_per >= (1 << 16) && self.threads > 1 {
                Parallelism::Rayon(self.threads)
            } else {
                Parallelism::None
            };
            for (i, d) in dst.chunks_mut(m * n).enumerate() {
                call(i, d, par);
            }
        }
        Ok(())
    }
}
