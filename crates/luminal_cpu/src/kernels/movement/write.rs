//! `WriteSlice`: copies the new rows into the state buffer in place (a KV cache append);
//! the rest of the buffer is not touched.
//!
//! When the new rows are a private elementwise tree (a decode step's keys: RoPE over the
//! key projection, then the cast to the cache's f16), the kernel evaluates that tree
//! straight into the destination rows: the tree gets no kernel and no buffer of its own
//! (one launch instead of three per cache and layer).

use crate::kernel::{BufId, CpuKernel, RunCtx, Scratch};
use crate::kernels::fused::{eval_into, task_len, Dst, Program, BLOCK};
use crate::storage::Storage;
use crate::view::{eval, DimNames, DimValues};
use luminal::graph::{GraphData, NodeId};
use luminal::op::Op;
use luminal::shape::CompiledExpression;
use luminal::{Expression, LuminalError, Result};

#[derive(Debug)]
pub struct WriteSliceKernel {
    /// The destination input's buffer.
    dest: BufId,
    /// The contiguous source buffer (unused with `prog`).
    src: BufId,
    /// The source's elementwise tree, evaluated into the destination (its leaves are what
    /// the kernel reads); `None`: the source buffer is copied.
    prog: Option<Program>,
    outer: CompiledExpression,
    len: CompiledExpression,
    inner: CompiledExpression,
    size: CompiledExpression,
    start: CompiledExpression,
}

impl WriteSliceKernel {
    /// The write of node `id`, evaluating `prog` (the source node's tree, whose logical
    /// elements are the source's row-major elements) instead of reading the source buffer
    /// when given.
    pub fn new(
        g: &GraphData,
        id: NodeId,
        names: &DimNames,
        prog: Option<Program>,
    ) -> Result<WriteSliceKernel> {
        let node = g.node(id);
        let Op::WriteSlice { axis, start } = &node.op else {
            unreachable!("not a WriteSlice")
        };
        let (dest, src) = (&node.inputs[0], &node.inputs[1]);
        if !src.view.is_contiguous() {
            return Err(LuminalError::Backend(
                "WriteSlice: the source must be contiguous".into(),
            ));
        }
        let dims = src.view.dims();
        Ok(WriteSliceKernel {
            dest: BufId::of(dest.node),
            src: BufId::of(src.node),
            prog,
            outer: names.compile(&dims[..*axis].iter().product::<Expression>())?,
            len: names.compile(&dims[*axis])?,
            inner: names.compile(&dims[axis + 1..].iter().product::<Expression>())?,
            size: names.compile(&node.shape[*axis])?,
            start: names.compile(start)?,
        })
    }

    /// Writes `src` into `out` (the destination's own buffer).
    fn write(&mut self, bufs: &[Storage], out: &mut Storage, dims: &DimValues) -> Result<()> {
        let [outer, len, inner, size] = [&self.outer, &self.len, &self.inner, &self.size]
            .map(|e| eval(e, dims).map(|v| v.max(0) as usize));
        let (outer, len, inner, size) = (outer?, len?, inner?, size?);
        let start = eval(&self.start, dims)?;
        if start < 0 || start as usize + len > size {
            return Err(LuminalError::IndexOutOfRange {
                op: "WriteSlice".into(),
                index: start + len as i64 - 1,
                size: size as i64,
            });
        }
        let start = start as usize;
        let block = len * inner;
        fn copy<T: Copy>(
            src: &[T],
            dst: &mut [T],
            outer: usize,
            block: usize,
            at: usize,
            row: usize,
        ) {
            for o in 0..outer {
                dst[o * row + at..o * row + at + block]
                    .copy_from_slice(&src[o * block..(o + 1) * block]);
            }
        }
        let (at, row) = (start * inner, size * inner);
        let need_dst = if outer == 0 {
            0
        } else {
            (outer - 1) * row + at + block
        };
        if let Some(prog) = &mut self.prog {
            prog.prepare(dims, bufs)?;
            let span = Span {
                outer,
                block,
                at,
                row,
            };
            return match out {
                Storage::F32(d) if d.len() >= need_dst => {
                    Ok(span.eval(prog, bufs, d, |p| Dst::F32(p)))
                }
                Storage::F16(d) if d.len() >= need_dst => {
                    Ok(span.eval(prog, bufs, d, |p| Dst::F16(p)))
                }
                Storage::BF16(d) if d.len() >= need_dst => {
                    Ok(span.eval(prog, bufs, d, |p| Dst::BF16(p)))
                }
                _ => Err(LuminalError::Backend(
                    "WriteSlice: destination buffer has the wrong size or kind".into(),
                )),
            };
        }
        match (&bufs[self.src], out) {
            (Storage::F32(s), Storage::F32(d))
                if s.len() >= outer * block && d.len() >= need_dst =>
            {
                copy(s, d, outer, block, at, row)
            }
            (Storage::F64(s), Storage::F64(d))
                if s.len() >= outer * block && d.len() >= need_dst =>
            {
                copy(s, d, outer, block, at, row)
            }
            (Storage::F16(s), Storage::F16(d))
                if s.len() >= outer * block && d.len() >= need_dst =>
            {
                copy(s, d, outer, block, at, row)
            }
            (Storage::BF16(s), Storage::BF16(d))
                if s.len() >= outer * block && d.len() >= need_dst =>
            {
                copy(s, d, outer, block, at, row)
            }
            // Whole blocks (the written rows span the last axis, a whole number of blocks):
            // the same copy in bytes.
            (Storage::Bytes(s), Storage::Bytes(d))
                if s.dtype() == d.dtype()
                    && [block, at, row]
                        .iter()
                        .all(|v| v % s.dtype().block_size() == 0)
                    && s.len() >= outer * block
                    && d.len() >= need_dst =>
            {
                let (bs, bb) = (s.dtype().block_size(), s.dtype().block_bytes());
                let b = |v: usize| v / bs * bb;
                copy(s.as_slice(), d.make_mut(), outer, b(block), b(at), b(row))
            }
            _ => {
                return Err(LuminalError::Backend(
                    "WriteSlice: source or destination buffer has the wrong size or kind".into(),
                ))
            }
        }
        Ok(())
    }
}

/// Most new elements evaluated at once into a stack buffer and copied to their pieces (a
/// decode step's keys or values: KV heads × head dim, 192 for SmolLM2, 1024 for Llama-3
/// 8B); more are evaluated in place by parallel tasks.
const SMALL: usize = 1024;

/// Where the written rows go: `outer` pieces of `block` elements, piece `o` at
/// `o · row + at` of the destination.
struct Span {
    outer: usize,
    block: usize,
    at: usize,
    row: usize,
}

impl Span {
    /// `prog`'s values at source elements `o · block ..` stored at `o · row + at ..` for
    /// every piece `o`, in parallel tasks of whole blocks within a piece.
    fn eval<T: Send + Copy + Default>(
        &self,
        prog: &Program,
        bufs: &[Storage],
        dst: &mut [T],
        wrap: fn(&mut [T]) -> Dst<'_>,
    ) {
        let Span {
            outer,
            block,
            at,
            row,
        } = *self;
        if outer == 0 || block == 0 {
            return;
        }
        let total = outer * block;
        if total <= SMALL {
            // A decode step's few rows: evaluated at once on the calling thread, then copied
            // to their pieces.
            let mut tmp = [T::default(); SMALL];
            eval_into(prog, bufs, 0, wrap(&mut tmp[..total]));
            for o in 0..outer {
                dst[o * row + at..o * row + at + block]
                    .copy_from_slice(&tmp[o * block..(o + 1) * block]);
            }
            return;
        }
        let want = task_len(total, prog.work_per_element());
        let chunk = want.next_multiple_of(BLOCK).min(block);
        let per = block.div_ceil(chunk);
        let base = DstPtr(dst.as_mut_ptr());
        crate::exec::par::for_each(outer * per, |t| {
            let (o, c) = (t / per, t % per);
            let start = c * chunk;
            let len = chunk.min(block - start);
            let base = &base;
            // SAFETY: `write` checked that the destination holds `(outer - 1) · row + at +
            // block` elements; task `t` writes elements `o · row + at + start ..` of length
            // `len ≤ block - start`, disjoint from every other task's (pieces do not overlap:
            // `at + block ≤ row`, checked against the axis size), and `dst` is borrowed
            // mutably for the whole loop.
            let piece =
                unsafe { std::slice::from_raw_parts_mut(base.0.add(o * row + at + start), len) };
            eval_into(prog, bufs, o * block + start, wrap(piece));
        });
    }
}

struct DstPtr<T>(*mut T);
// SAFETY: hands disjoint pieces of a `&mut [T: Send]` to the tasks (see `Span::eval`).
unsafe impl<T: Send> Sync for DstPtr<T> {}

impl CpuKernel for WriteSliceKernel {
    fn reads(&self) -> Vec<BufId> {
        match &self.prog {
            Some(p) => p.reads().chain([self.dest]).collect(),
            None => vec![self.src, self.dest],
        }
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.dest = map(self.dest);
        match &mut self.prog {
            Some(p) => p.remap(map),
            None => self.src = map(self.src),
        }
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: self.prog.as_ref().map_or(0, |p| p.instrs.len()),
            ..Scratch::default()
        }
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.write(cx.bufs, out, cx.dims)
    }
    fn flops(&self, _n: usize) -> usize {
        0
    }
    fn in_place_of(&self) -> Option<BufId> {
        Some(self.dest)
    }
}
