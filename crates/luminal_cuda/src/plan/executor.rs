//! Where a plan's kernels run: the device calls a [`super::PlanRuntime`] makes.

use crate::attention::AttnCall;
use crate::codegen::Kernel;
use crate::gemm::GemmCall;
use luminal::{LuminalError, Result};

/// Where the kernels run: device memory and launches.
pub trait Executor {
    type Buffer;
    type Function;
    /// A recorded run ([`Executor::end_capture`]).
    type Graph;
    /// Compiles kernels (at `Backend::compile` time); one function per kernel, in order.
    fn compile(&mut self, kernels: &[&Kernel]) -> Result<Vec<Self::Function>>;
    /// A zeroed buffer of at least `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<Self::Buffer>;
    /// A buffer holding `data`.
    fn upload(&mut self, data: &[u8]) -> Result<Self::Buffer>;
    /// The first `bytes` bytes of `buf` (after the launches so far complete).
    fn download(&self, buf: &Self::Buffer, bytes: usize) -> Result<Vec<u8>>;
    /// Overwrites the start of `buf` (at least `data.len()` bytes) with `data`, ordered after
    /// the launches so far.
    fn write(&mut self, buf: &mut Self::Buffer, data: &[u8]) -> Result<()>;
    /// Copies `bytes` bytes from `src` to `dst`.
    fn copy(&mut self, src: &Self::Buffer, dst: &mut Self::Buffer, bytes: usize) -> Result<()>;
    /// Launches `f` on a 1-D grid: `buffers` in parameter order (output first), then `scalars`.
    fn launch(
        &mut self,
        f: &Self::Function,
        grid: u32,
        block: u32,
        buffers: &[&Self::Buffer],
        scalars: &[i64],
    ) -> Result<()>;
    /// Waits for every launch.
    fn synchronize(&mut self) -> Result<()>;
    /// Whether a step that depends only on inputs not set since it last ran (a weight's
    /// dequantizing cast) keeps its result instead of running again (off for benchmarks that
    /// time repeated runs over the same inputs).
    fn keeps_static_results(&self) -> bool {
        true
    }
    /// Whether runs may be captured into graphs and replayed ([`Executor::begin_capture`]).
    fn graphs_available(&self) -> bool {
        false
    }
    /// Starts recording the launches and products that follow instead of running them.
    fn begin_capture(&mut self) -> Result<()> {
        Err(LuminalError::Backend("this executor has no graphs".into()))
    }
    /// Ends a recording: the graph of everything launched since [`Executor::begin_capture`].
    fn end_capture(&mut self) -> Result<Self::Graph> {
        Err(LuminalError::Backend("this executor has no graphs".into()))
    }
    /// Runs a recorded graph (with the buffers' current contents).
    fn replay(&mut self, graph: &Self::Graph) -> Result<()> {
        let _ = graph;
        Err(LuminalError::Backend("this executor has no graphs".into()))
    }
    /// The buffer's address (identifies it in a run's signature).
    fn addr(&self, buf: &Self::Buffer) -> u64;
    /// Whether reduction kernels may run several threads per output (a GPU); the host
    /// emulator runs threads one after another, so one thread computes each output there.
    fn cooperative_reductions(&self) -> bool {
        false
    }
    /// Whether skinny products over half weights may run on tensor cores
    /// ([`crate::codegen::skinny_mma_kernel`]: sm_80 or newer).
    fn skinny_mma(&self) -> bool {
        false
    }
    /// Whether [`Executor::gemm`] runs (cuBLAS loaded); without it products run as kernels.
    fn gemm_available(&self) -> bool {
        false
    }
    /// Whether f32 activations may be rounded to a half weight's type so that cuBLAS reads
    /// the weight in place ([`crate::gemm::find`]'s `round`).
    fn gemm_rounds_activations(&self) -> bool {
        false
    }
    /// One `cublasGemmStridedBatchedEx` call ([`GemmCall`]: column-major, offsets in
    /// elements of each buffer's type, f32 accumulation) with cuBLAS's `A` in `a`, `B` in
    /// `b`, the result in `c`.
    fn gemm(
        &mut self,
        call: &GemmCall,
        c: &Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
    ) -> Result<()> {
        let _ = (call, c, a, b);
        Err(LuminalError::Backend("this executor has no gemm".into()))
    }
    /// Whether [`Executor::attention`] runs; without it attention runs as the primop kernels.
    fn attention_available(&self) -> bool {
        false
    }
    /// Bytes of scratch [`Executor::attention`] needs for `call` (split-KV partial results).
    fn attention_scratch(&self, call: &AttnCall) -> usize {
        let _ = call;
        0
    }
    /// Completes `call` with the executor's launch choices (the key split of a decode step),
    /// before it is written to the parameter table.
    fn plan_attention(&self, call: &mut AttnCall) {
        let _ = call;
    }
    /// Whether [`Executor::attention`] reads the bias of `call` (planned by
    /// [`Executor::plan_attention`]); a kernel computing a causal mask from the indices does
    /// not, and the plan then need not compute the mask.
    fn attention_reads_bias(&self, call: &AttnCall) -> bool {
        call.has_bias != 0
    }
    /// Compiles the attention kernels (at `Backend::compile` time, so that none is compiled
    /// while a run is captured into a graph).
    fn prepare_attention(&mut self) -> Result<()> {
        Ok(())
    }
    /// One fused attention ([`crate::attention`]): `out` (contiguous `[batch.., s, d]`) from
    /// q, k, v (f32 or f16 as `call` says) and the optional bias, read at the call's strides;
    /// `scratch` holds at least [`Executor::attention_scratch`] bytes. `params` holds `call`
    /// (planned by [`Executor::plan_attention`]) at byte `params_at`, where the GPU kernels
    /// read it (so that a replayed graph reads this run's call).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        call: &AttnCall,
        params: &Self::Buffer,
        params_at: usize,
        out: &Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        bias: Option<&Self::Buffer>,
        scratch: &Self::Buffer,
    ) -> Result<()> {
        let _ = (call, params, params_at, out, q, k, v, bias, scratch);
        Err(LuminalError::Backend(
            "this executor has no attention".into(),
        ))
    }
}
