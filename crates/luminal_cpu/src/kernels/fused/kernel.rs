//! The fused elementwise and reduce kernels as plan launches.

use super::{run_elementwise, run_reduce, Program, ReduceShape};
use crate::kernel::{BufId, CpuKernel, Fused, RunCtx, Scratch};
use crate::storage::Storage;
use crate::view::eval;
use luminal::op::ReduceOp;
use luminal::shape::CompiledExpression;
use luminal::Result;

/// A fused elementwise tree stored to the node's buffer (any float or bool output).
#[derive(Debug)]
pub struct ElementwiseKernel {
    pub prog: Program,
}

/// A reduction over a fused tree's values, laid out as `[outer, len, inner]`.
#[derive(Debug)]
pub struct ReduceKernel {
    pub op: ReduceOp,
    pub prog: Program,
    /// Reduced length and inner size (outer = numel / inner).
    pub len: CompiledExpression,
    pub inner: CompiledExpression,
    /// Not a reduction along the rows of its node's axis: the reduced axis was moved in
    /// front of contiguous output dims (see `lower::column_position`), or a chain of
    /// reductions was merged into one (`lower::reduce_chain`). Never merged into a row
    /// kernel.
    pub no_rows: bool,
}

impl Program {
    /// The buffers its leaves read.
    pub fn reads(&self) -> impl Iterator<Item = BufId> + '_ {
        self.leaves.iter().map(|l| l.buf)
    }
    /// Points its leaves at their assigned buffers.
    pub fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.leaves.iter_mut().for_each(|l| l.buf = map(l.buf));
    }
}

impl CpuKernel for ElementwiseKernel {
    fn reads(&self) -> Vec<BufId> {
        self.prog.reads().collect()
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.prog.remap(map)
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: self.prog.instrs.len(),
            ..Scratch::default()
        }
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.prog.prepare(cx.dims, cx.bufs)?;
        run_elementwise(&self.prog, cx.bufs, out, cx.n);
        Ok(())
    }
    fn flops(&self, n: usize) -> usize {
        n * self.prog.flops_per_element()
    }
    fn fused(&self) -> Option<Fused<'_>> {
        Some(Fused::Elementwise(&self.prog))
    }
}

impl CpuKernel for ReduceKernel {
    fn reads(&self) -> Vec<BufId> {
        self.prog.reads().collect()
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.prog.remap(map)
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: self.prog.instrs.len(),
            ..Scratch::default()
        }
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.prog.prepare(cx.dims, cx.bufs)?;
        let len = eval(&self.len, cx.dims)?.max(0) as usize;
        let inner = (eval(&self.inner, cx.dims)?.max(0) as usize).max(1);
        let shape = ReduceShape {
            outer: cx.n / inner,
            len,
            inner,
        };
        match out {
            Storage::F32(o) => run_reduce(self.op, &self.prog, cx.bufs, o, shape),
            _ => crate::kernels::half::run_half_reduce(
                self.op,
                &self.prog,
                cx.bufs,
                out,
                shape,
                cx.half_scratch,
            )?,
        }
        Ok(())
    }
    fn flops(&self, n: usize) -> usize {
        // Every reduced element passes the tree once and is combined once.
        let elems: usize = self
            .prog
            .leaves
            .first()
            .map(|l| l.view.dims.iter().product::<i64>().max(0) as usize)
            .unwrap_or(n);
        elems * (self.prog.flops_per_element() + 1)
    }
    fn fused(&self) -> Option<Fused<'_>> {
        (!self.no_rows).then_some(Fused::Reduce(self.op, &self.prog))
    }
}
