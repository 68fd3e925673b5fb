//! `WriteSlice`: copies the new rows into the state buffer in place (a KV cache append);
//! the rest of the buffer is not touched.

use crate::kernel::{BufId, CpuKernel, RunCtx};
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
    /// The contiguous source buffer.
    src: BufId,
    outer: CompiledExpression,
    len: CompiledExpression,
    inner: CompiledExpression,
    size: CompiledExpression,
    start: CompiledExpression,
}

impl WriteSliceKernel {
    pub fn new(g: &GraphData, id: NodeId, names: &DimNames) -> Result<WriteSliceKernel> {
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
            outer: names.compile(&dims[..*axis].iter().product::<Expression>())?,
            len: names.compile(&dims[*axis])?,
            inner: names.compile(&dims[axis + 1..].iter().product::<Expression>())?,
            size: names.compile(&node.shape[*axis])?,
            start: names.compile(start)?,
        })
    }

    /// Writes `src` into `out` (the destination's own buffer).
    fn write(&self, bufs: &[Storage], out: &mut Storage, dims: &DimValues) -> Result<()> {
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

impl CpuKernel for WriteSliceKernel {
    fn reads(&self) -> Vec<BufId> {
        vec![self.src, self.dest]
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.dest = map(self.dest);
        self.src = map(self.src);
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
