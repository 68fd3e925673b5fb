//! The one kernel abstraction: every launch of a compiled plan is a [`Kernel`] whose work
//! is a boxed [`CpuKernel`]. Lowering rules (`lower/`) build them; the runtime (`exec/`)
//! plans their buffers through [`CpuKernel::reads`] / [`CpuKernel::remap`], reserves
//! their [`CpuKernel::scratch`], launches [`CpuKernel::run`] and profiles their
//! [`CpuKernel::flops`]. Nothing outside a kernel's own module knows its type.

use crate::kernels::fused::Program;
pub use crate::storage::BufId;
use crate::storage::Storage;
use crate::view::DimValues;
use luminal::graph::NodeId;
use luminal::op::ReduceOp;
use luminal::shape::CompiledExpression;
use luminal::{DType, Result};

/// Scratch shared by the kernels of a runtime (they run one at a time): the f16 / bf16
/// matmuls' widened operands and unrounded product, the half reductions' accumulators
/// (see `kernels/half.rs`), the rows of RMSNorms computed by products. Grows to the largest
/// use, then is reused.
#[derive(Debug, Default)]
pub struct HalfScratch {
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) out: Vec<f32>,
    /// Accumulators of the half reductions.
    pub(crate) acc: Vec<f64>,
    /// The normalised activation rows of a product with an RMSNorm prologue
    /// (`MatmulKernel::norm`), and what they were computed from: the next product of the
    /// same run that reads the same norm of the same rows (q after k and v, up after gate)
    /// reuses them.
    pub(crate) norm: Vec<f32>,
    pub(crate) norm_of: Option<crate::kernels::matmul::NormRows>,
    /// Runs of the runtime so far (a key of `norm_of`).
    pub(crate) run: u64,
    /// The K slices of an f32 product split along its depth over threads, before they are
    /// added, and the result of a product computed transposed, before it is transposed
    /// back (`MatmulKernel::staging`).
    pub(crate) partials: Vec<f32>,
}

/// What a launch sees besides its output buffer.
pub struct RunCtx<'a> {
    /// Every buffer of the plan (the output's slot holds an empty placeholder).
    pub bufs: &'a [Storage],
    /// Output elements of this launch.
    pub n: usize,
    /// Values of the dynamic dims.
    pub dims: &'a DimValues,
    /// f32 scratch of the f16 / bf16 products, shared by all kernels of a runtime.
    pub half_scratch: &'a mut HalfScratch,
    /// Working memory of one launch (attention's per-worker tiles), shared by every kernel
    /// of a runtime since they run one at a time: grown to the largest use, never shrunk.
    /// A kernel keeping such scratch itself holds it for the whole run, once per layer.
    pub arena: &'a mut Vec<f32>,
    /// The kernel's side output ([`Kernel::side`]), `n` elements, when it has one.
    pub side: Option<&'a mut [f32]>,
}

/// Per-thread scratch a kernel needs, reserved on every pool thread at compile time so no
/// launch allocates.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scratch {
    /// Instructions of the largest fused program it interprets.
    pub instrs: usize,
    /// The cache blocking of the f32 products it runs on the SIMD path, whose packing
    /// buffers are per thread (a worker may first get a block of a product in any later
    /// run: tasks go to whichever thread claims them first).
    pub gemm: Option<crate::kernels::matmul::gemm_f32::Tiles>,
}

/// A fused program as the later lowering passes (row fusion, concat detection) see it.
pub enum Fused<'a> {
    Elementwise(&'a Program),
    Reduce(ReduceOp, &'a Program),
}

/// One kind of launch. Implemented by every kernel family in `kernels/`.
pub trait CpuKernel: std::fmt::Debug + Send {
    /// The buffers it reads (any order; duplicates allowed).
    fn reads(&self) -> Vec<BufId>;
    /// Points it at its assigned buffers.
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId);
    /// Per-thread scratch it needs.
    fn scratch(&self) -> Scratch {
        Scratch::default()
    }
    /// Computes its `cx.n` output elements into `out`.
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()>;
    /// Arithmetic operations of its last launch of `n` output elements (for the profile).
    fn flops(&self, n: usize) -> usize;
    /// The buffer it reads in place as a weight (quantized or half blocks; see `quant/`).
    fn weight_input(&self) -> Option<BufId> {
        None
    }
    /// The state input it writes in place: its result is that input's own buffer.
    fn in_place_of(&self) -> Option<BufId> {
        None
    }
    /// The fused program it evaluates, for the lowering passes that merge kernels.
    fn fused(&self) -> Option<Fused<'_>> {
        None
    }
    /// Takes `prog`, an elementwise program of this kernel's result (its row register 0
    /// holds the result, as in an epilogue), to evaluate over each finished part of the
    /// result into the side output ([`Kernel::side`]); gives it back if the kernel cannot.
    fn add_side_output(
        &mut self,
        prog: crate::kernels::fused::Program,
    ) -> std::result::Result<(), crate::kernels::fused::Program> {
        Err(prog)
    }
    /// Whether [`CpuKernel::add_side_output`] would take a program now.
    fn accepts_side_output(&self) -> bool {
        false
    }
    /// Takes `prog`, an elementwise program of this kernel's result (row register 0, as
    /// for [`CpuKernel::add_side_output`]), to evaluate in place over each finished part of
    /// the result: the kernel then computes `prog` of what it computed before (its one
    /// reader's value; `lower::epilogues`). Gives it back if the kernel cannot.
    fn add_epilogue(
        &mut self,
        prog: crate::kernels::fused::Program,
    ) -> std::result::Result<(), crate::kernels::fused::Program> {
        Err(prog)
    }
}

/// One launch: kernel `kind` computes node `node` into buffer `out`.
#[derive(Debug)]
pub struct Kernel {
    pub name: String,
    pub node: NodeId,
    pub dtype: DType,
    pub out: BufId,
    pub numel: CompiledExpression,
    pub kind: Box<dyn CpuKernel>,
    /// A second f32 result of `numel` elements: an elementwise function of this kernel's
    /// result that another kernel computed before (`lower::side_outputs`), written while
    /// the result is in cache (the value of that kernel's node).
    pub side: Option<BufId>,
}

impl Kernel {
    /// The buffers it reads.
    pub fn reads(&self) -> Vec<BufId> {
        self.kind.reads()
    }
}
