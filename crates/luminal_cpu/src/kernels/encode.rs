//! Casts into a block-quantized type (`x.cast(DType::Q8_0)`, the new rows of a quantized KV
//! cache): the values are read through the input's view into the launch arena as f32, then
//! encoded block by block with the core's encoder (`luminal::quant::encode`, ggml's
//! reference quantizer), which is the reference semantics itself, so the blocks are the
//! reference's bit for bit. The output buffer holds the blocks (`Storage::Bytes`), written
//! in place once allocated.

use crate::kernel::{BufId, CpuKernel, RunCtx};
use crate::kernels::half::CastKernel;
use crate::storage::Storage;
use crate::view::DimNames;
use luminal::graph::{GraphData, NodeId};
use luminal::op::Op;
use luminal::{ByteData, DType, LuminalError, Result};

/// Blocks encoded per parallel task.
const BLOCKS_PER_TASK: usize = 256;

#[derive(Debug)]
pub struct EncodeKernel {
    dtype: DType,
    /// Reads the input's values (any float type, any view) as f32.
    pub cast: CastKernel,
}

impl EncodeKernel {
    /// The kernel for node `id` when it is a cast of a float tensor to a quantized type.
    pub(crate) fn try_new(g: &GraphData, id: NodeId, names: &DimNames) -> Result<Option<Self>> {
        let node = g.node(id);
        let Op::Cast(to) = node.op else {
            return Ok(None);
        };
        if !to.is_quantized() || luminal::quant::encoder(to).is_none() {
            return Ok(None);
        }
        Ok(Some(EncodeKernel {
            dtype: to,
            cast: CastKernel::reading(&node.inputs[0], names)?,
        }))
    }
}

impl CpuKernel for EncodeKernel {
    fn reads(&self) -> Vec<BufId> {
        vec![self.cast.input]
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.cast.input = map(self.cast.input);
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        let (n, dt) = (cx.n, self.dtype);
        let bytes = dt.bytes_for(n).ok_or_else(|| {
            LuminalError::Backend(format!("cast to {dt}: {n} values are not whole blocks"))
        })?;
        self.cast.prepare(cx.dims, cx.bufs)?;
        // The f32 values, staged in the shared arena (given back after).
        let mut vals = Storage::F32(std::mem::take(cx.arena));
        vals.ensure_len(n);
        let staged = self
            .cast
            .run_from(cx.bufs[self.cast.input].as_ref(), &mut vals, n);
        let Storage::F32(vals) = vals else {
            unreachable!("staged as f32")
        };
        let result = staged.and_then(|()| {
            let Storage::Bytes(b) = out else {
                return Err(LuminalError::Backend(format!(
                    "cast to {dt}: the output buffer does not hold blocks"
                )));
            };
            if b.dtype() != dt || b.as_slice().len() != bytes {
                *b = ByteData::zeros(dt, n);
            }
            let dst = b.make_mut();
            let (bs, bb) = (dt.block_size(), dt.block_bytes());
            crate::exec::par::for_each_chunk(dst, BLOCKS_PER_TASK * bb, |t, chunk| {
                let first = t * BLOCKS_PER_TASK * bs;
                let len = chunk.len() / bb * bs;
                luminal::quant::encode(dt, &vals[first..first + len], chunk);
            });
            Ok(())
        });
        *cx.arena = vals;
        result
    }
    fn flops(&self, n: usize) -> usize {
        4 * n
    }
}
