//! The compiled plan and its runtime, generic over where the kernels run ([`Executor`]): the
//! GPU ([`crate::device::CudaExecutor`]) or the host emulator ([`crate::host`]). Everything
//! but the device calls (buffer sizes, launch shapes, dim bindings, state updates, error
//! checks) is this one code, so the emulator's tests cover it.
//!
//! - [`compile`](PlanRuntime::new): the graph's products, attentions and fused nodes found,
//!   kernels generated and compiled;
//! - `prepare`: a run's buffers sized and its launches listed;
//! - `launch`: the listed launches compared with the last run's, issued or replayed;
//! - this module: the runtime's state and the `Runtime` interface.

mod bytes;
mod compile;
mod executor;
mod launch;
mod prepare;

pub use compile::{SKINNY_MAX_K, SKINNY_MAX_WEIGHTS};
pub use executor::Executor;
pub use prepare::threads_per_output;

use crate::attention::{self, AttnCall, AttnPattern};
use crate::codegen::Kernel;
use crate::gemm::{self, GemmCall, GemmType, Pattern};
use bytes::{bytes_of, from_bytes, size_of, to_bytes, values_in};
use luminal::graph::{GraphData, NodeId, TensorRef};
use luminal::op::Op;
use luminal::{Expression, HostData, LuminalError, Result, Runtime};
use std::collections::{BTreeSet, HashMap};

/// A hasher for the plan's small integer keys (node ids, buffer references), looked up for
/// every launch of every run: one multiply per word instead of SipHash.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64)
    }
}

/// A map keyed by node ids or buffer references ([`IdHasher`]).
pub(crate) type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

/// The bit of the `i`th of the plan's host dims ([`PlanRuntime`]'s `host_dims`) in a mask of
/// dims; dims past the 63rd share the last bit (a change to one of them counts as a change
/// to all of them).
pub(super) fn dim_bit(i: usize) -> u64 {
    1 << i.min(63)
}

/// One kernel launch of the plan.
struct Step {
    node: NodeId,
    /// Index into the plan's functions.
    function: usize,
    error_flag: bool,
    dims: Vec<String>,
    /// The nodes whose buffers the kernel reads, in parameter order (after the output).
    inputs: Vec<NodeId>,
    /// The product this reduction computes, through cuBLAS when it resolves ([`gemm`]).
    gemm: Option<usize>,
    /// The product this `Mul` (or bypassed cast) feeds: skipped when that product goes to
    /// cuBLAS.
    feeds: Option<usize>,
    /// The attention this node computes (its output) when the call resolves.
    attn_out: Option<usize>,
    /// The attention this node is inside of: skipped (no buffer) when the call resolves.
    attn_inner: Option<usize>,
    /// A `WriteSlice` into its destination input's buffer ([`codegen::write_in_place`]).
    in_place: bool,
    /// A step of an RMSNorm whose every reader is one of these products (through their
    /// tensor-core kernel's norm prologue, [`NormProduct`]), or only read by such a step:
    /// skipped (no buffer) in runs where all of them take that path.
    norm_skip: Option<Vec<usize>>,
    /// A causal mask (`luminal::patterns::causal_limit`) read only inside these attentions:
    /// skipped (no buffer) in runs where every one of their calls computes the mask from the
    /// indices ([`Executor::attention_reads_bias`]).
    causal_mask_of: Option<Vec<usize>>,
    /// A residual sum `product + r` that this product's tensor-core kernel computes as it
    /// stores ([`Residual`]): skipped in runs where the product takes that kernel, its
    /// readers reading the product's buffer.
    residual_of: Option<usize>,
    /// Where this kernel's dims start in the dims table.
    dims_at: usize,
    /// The dims its preparation reads ([`dim_bit`]s of the plan's `host_dims`,
    /// `compile::step_vars`): while none changes, it prepares the same launches.
    host_vars: u64,
    /// For a step whose value depends only on inputs that are not state (weights), on no
    /// dim, through no state write: those inputs. Its result is kept and the step skipped
    /// while none of them has been set again (a weight's dequantizing cast runs once).
    static_deps: Option<Vec<NodeId>>,
    /// A reduction taking its threads per output at launch ([`Kernel::cooperative`]).
    cooperative: bool,
    /// The output's element count when its shape has no dims (not evaluated every run).
    numel: Option<usize>,
    /// The dims of a `WriteSlice`'s source view or a reduction's input view (views build
    /// their expressions anew on every `dims()`).
    src_dims: Option<Vec<luminal::Expression>>,
    /// For a plain copy of a computed node through an unmasked view: that view, to elide the
    /// copy in runs where it is the identity ([`PlanRuntime::resolved`]).
    elide: Option<ElideView>,
}

/// A product whose activations are an RMSNorm (`luminal::patterns::RmsNormMatch`) of
/// rows of `len` (the norm's last axis), computed by `function`
/// ([`crate::codegen::skinny_mma_norm_kernel`]) from the norm's input `x` and its `weight`.
#[derive(Clone)]
pub(super) struct NormProduct {
    function: usize,
    norm: crate::codegen::SkinnyNorm,
    x: NodeId,
    weight: Option<NodeId>,
    len: Expression,
}

/// A product whose only reader is `product + r` (both read one to one, f32): its
/// tensor-core kernels with the residual added as they store (`function` for plain
/// activations, `norm_function` with its [`NormProduct`]'s norm;
/// [`crate::codegen::skinny_mma_residual_kernel`]).
#[derive(Clone)]
pub(super) struct Residual {
    r: NodeId,
    function: Option<usize>,
    norm_function: Option<usize>,
}

/// An unmasked view's expressions (a copy elided when they are the identity at a run's dims).
pub(super) struct ElideView {
    dims: Vec<luminal::Expression>,
    strides: Vec<luminal::Expression>,
    offset: luminal::Expression,
}

impl ElideView {
    fn of(view: &luminal::ShapeTracker) -> ElideView {
        ElideView {
            dims: view.dims(),
            strides: view.strides(),
            offset: view.offset(),
        }
    }
}

struct Buffer<B> {
    buf: B,
    /// Bytes the buffer holds (its capacity).
    capacity: usize,
    /// Bytes of the current value.
    len: usize,
}

/// A compiled graph on an [`Executor`]: inputs uploaded once and kept, one buffer per
/// computed node (grown when the dims grow), kernels launched in order.
pub struct PlanRuntime<E: Executor> {
    graph: GraphData,
    exec: E,
    functions: Vec<E::Function>,
    steps: Vec<Step>,
    /// Live inputs (checked at run), and whether their shape is constant (its length was
    /// checked when set).
    inputs_needed: Vec<(NodeId, bool)>,
    needed_dims: BTreeSet<String>,
    buffers: IdMap<NodeId, Buffer<E::Buffer>>,
    error_buffer: Option<E::Buffer>,
    dims: HashMap<String, i64>,
    /// The same dims, in the order they were first set (looked up by [`PlanRuntime::dim`]).
    dim_list: Vec<(String, i64)>,
    /// The dims the kernels read, once each, and for every slot of `dims_host` holding a
    /// dim's value, that slot and the dim's index in `dim_names` (filled each run without
    /// looking up each kernel's dims by name).
    dim_names: Vec<String>,
    dim_slots: Vec<(usize, usize)>,
    /// Scratch for the values of `dim_names`.
    dim_values: Vec<i64>,
    /// The dims host-side expressions read (products' and attentions' operand views, the
    /// steps' shapes and views: [`Step::host_vars`]), and their values when the calls were
    /// last resolved (`None` before the first run).
    host_dims: Vec<String>,
    resolved_dims: Option<Vec<Option<i64>>>,
    /// The dims each product's and each attention's operand views read ([`dim_bit`]s):
    /// unchanged values keep the calls (a decode step's linear layers are not resolved again).
    gemm_mask: Vec<u64>,
    attn_mask: Vec<u64>,
    /// The distinct kernels (sources) of the plan, for inspection.
    kernels: Vec<Kernel>,
    /// Products that may go to cuBLAS, and their calls at this run's dims (`None`: kernels).
    patterns: Vec<Pattern>,
    calls: Vec<Option<Vec<GemmCall>>>,
    /// Attentions recognised at compile time, and their calls at this run's dims (`None`:
    /// the primop kernels).
    attns: Vec<AttnPattern>,
    /// Their operands' expressions ([`attention::AttnExprs`]).
    attn_exprs: Vec<attention::AttnExprs>,
    attn_calls: Vec<Option<AttnCall>>,
    /// Where each attention's launch is in `launch_list` (when it has one), and the earlier
    /// attention it resolves as ([`attention::resolves_alike`]).
    attn_at: Vec<Option<usize>>,
    attn_twin: Vec<Option<usize>>,
    /// Products' own buffers: an f32 operand rounded to a half type (`BufRef::Scratch`), a
    /// quantized weight's f16 copy (`BufRef::Dequant`).
    scratch: IdMap<launch::BufRef, Buffer<E::Buffer>>,
    /// The rounding kernels (f32 → f16, f32 → bf16) in `functions`, where a product needs them.
    /// Per product, the first product rounding the same operand to the same type (whose
    /// scratch buffer holds the rounded copy), and whether that copy was written this run.
    round_owner: Vec<usize>,
    rounded: Vec<bool>,
    round_fn: HashMap<GemmType, usize>,
    /// Per product, the [`crate::codegen::skinny_kernel`] in `functions` that computes its calls
    /// with few activation rows ([`gemm::skinny`]) instead of cuBLAS, and how many launches
    /// of the last run were such products.
    skinny_fn: Vec<Option<usize>>,
    /// Per product over a Q8_0/Q4_0/Q4_1 or Q3_K-Q6_K weight, the
    /// [`crate::codegen::skinny_quant_kernel`] reading its blocks in place (tried before the
    /// f16 copy; rows must be whole blocks of the weight's type).
    skinny_quant_fn: Vec<Option<usize>>,
    /// Per product over an f16/bf16 weight (its activations of that type or f32 rounded to
    /// it), the [`crate::codegen::skinny_mma_kernel`] that computes its skinny calls on
    /// tensor cores where their rows allow ([`crate::codegen::skinny_mma_fits`]), tried
    /// first; with the most weight elements it takes (no bound by default; an explicit
    /// `LUMINAL_CUDA_SKINNY` bounds it as the other kernels).
    skinny_mma_fn: Vec<Option<usize>>,
    skinny_mma_max: u64,
    /// Per product whose activations are an RMSNorm, the tensor-core kernel computing the
    /// norm as it stages them ([`crate::codegen::skinny_mma_norm_kernel`]), tried first.
    skinny_norm: Vec<Option<NormProduct>>,
    /// Per product read only by a residual sum, the tensor-core kernels that add it.
    skinny_residual: Vec<Option<Residual>>,
    /// Every skinny kernel in `functions` (launches of one merge), and the tensor-core ones.
    skinny_fns: Vec<usize>,
    skinny_mma_fns: Vec<usize>,
    /// The most weight elements of a skinny product, and the row length up to which any
    /// product runs skinny (`LUMINAL_CUDA_SKINNY`; 0: no row rule).
    skinny_max: (u64, i32),
    skinny: usize,
    /// Per product over a quantized weight ([`gemm::Pattern::dequant`]): the kernel writing
    /// its f16 copy (into `scratch[BufRef::Dequant(pattern)]`), and when it last ran.
    dequant_fn: HashMap<usize, usize>,
    dequant_at: IdMap<usize, u64>,
    /// Split-KV partial results of the attention calls ([`Executor::attention_scratch`]).
    attn_scratch: Option<Buffer<E::Buffer>>,
    /// The attention calls of a run in device memory (one slot per pattern), written before
    /// the run's launches, and its host copy.
    attn_table: Option<Buffer<E::Buffer>>,
    attn_host: Vec<i64>,
    /// Nodes computed inside their consumer's kernel ([`codegen::fused_nodes`]).
    fused: usize,
    /// Kernel launches and cuBLAS calls of the last run.
    launches: usize,
    /// The last run's launches (their lists reused by the next run's, [`launch::ListPool`]).
    launch_list: Vec<launch::Launch>,
    /// The launches the last fully prepared run listed, before they were merged and
    /// combined: step `s`'s are `prepared[prepared_from[s]..prepared_from[s + 1]]`
    /// (compared with a step's launches when it is prepared again,
    /// [`PlanRuntime::prepare_changed`]), and scratch for those.
    prepared: Vec<launch::Launch>,
    prepared_from: Vec<usize>,
    fresh: Vec<launch::Launch>,
    /// A counter of changes that can make preparing a run list other launches than the last
    /// run's at the same dims: a buffer allocated or reallocated (its address changes), an
    /// input set to a new length, or one that a static step or a weight's copy reads set
    /// again. And its value when the last run's launches were prepared and issued (`None`
    /// when that run failed, or ran a static step or wrote a weight's copy).
    epoch: u64,
    prepared_at: Option<u64>,
    /// Copies elided this run: the node whose buffer each one reads as.
    alias: IdMap<NodeId, NodeId>,
    pool: launch::ListPool,
    /// Consecutive independent elementwise launches run as one (`LUMINAL_CUDA_COMBINE`, on by
    /// default), and the combined kernels compiled so far (by their members' functions).
    combine: bool,
    combos: HashMap<Vec<usize>, Option<usize>>,
    /// Whether a run has completed (an in-place write's result is then its state's buffer).
    ran: bool,
    /// A counter of `set_data` calls: when each input was last set, and when each static
    /// step last computed its result (0: never).
    generation: u64,
    set_at: IdMap<NodeId, u64>,
    computed_at: Vec<u64>,
    /// The inputs static steps and weights' copies read (sorted): setting one changes what a
    /// run launches (`epoch`).
    watched: Vec<NodeId>,
    /// Static steps launched by the run being prepared (marked computed once it is issued),
    /// and the products whose weight copy it writes.
    pending_static: Vec<usize>,
    pending_dequant: Vec<usize>,
    /// Quantized weights' f16 copies written by the last run.
    dequantized: usize,
    /// The dims of every kernel, in device memory (written before each run; kernels read
    /// their dims here, so a replayed graph sees this run's values), and its host copy.
    dims_table: Option<Buffer<E::Buffer>>,
    dims_host: Vec<i64>,
    /// Runs are captured into a graph and replayed ([`Executor::graphs_available`] and not
    /// `LUMINAL_CUDA_GRAPHS=0`).
    graphs: bool,
    /// The last run's launches (buffer addresses, grids, scalars, products): a run with the
    /// same signature as the one before is captured, and replayed while it stays the same.
    last_signature: Vec<u64>,
    captured: Option<(Vec<u64>, E::Graph)>,
    /// Whether the last run's signature is the captured graph's (it replayed or captured it).
    captured_last: bool,
    /// Scratch for a table's bytes.
    table_bytes: Vec<u8>,
    /// Whether the gathers' error buffer is known to hold zeros (allocated zeroed, or read
    /// back as zeros after the last launches): a run then need not clear it.
    error_zero: bool,
    /// Runs replayed from a graph, and graphs captured, since the runtime was made.
    replays: usize,
    captures: usize,
    /// `LUMINAL_CUDA_STATS` (0 when unset): 1 prints a run's launches when they change, 2
    /// also each run's host time preparing, enqueueing and waiting for the device (whether a
    /// run is bound by the host's launches or the GPU), 3 also each launch by kernel name and
    /// why a run was not replayed.
    stats: u8,
}

impl<E: Executor> PlanRuntime<E> {
    /// How many products ran through [`Executor::gemm`] in the last run.
    pub fn gemm_products(&self) -> usize {
        self.calls.iter().filter(|c| c.is_some()).count()
    }

    /// How many attentions ran through [`Executor::attention`] in the last run.
    pub fn attention_calls(&self) -> usize {
        self.attn_calls.iter().filter(|c| c.is_some()).count()
    }

    /// Quantized weights dequantized into their f16 copies by the last run (each once per
    /// value the weight is set to, [`gemm::Pattern::dequant`]).
    pub fn dequantized_copies(&self) -> usize {
        self.dequantized
    }

    /// Products of the last run computed by the skinny kernel ([`gemm::skinny`]: a decode
    /// step's linear layers) rather than cuBLAS.
    pub fn skinny_products(&self) -> usize {
        self.skinny
    }

    /// Attentions recognised at compile time (run fused when their views resolve).
    pub fn attention_patterns(&self) -> usize {
        self.attns.len()
    }

    /// How many products of the last run cuBLAS computed from f16/bf16 operand buffers (half
    /// inputs, bypassed widening casts, rounded activations).
    pub fn half_products(&self) -> usize {
        self.calls
            .iter()
            .zip(&self.patterns)
            .filter(|(c, p)| c.is_some() && p.a_type != GemmType::F32)
            .count()
    }

    /// `WriteSlice`s that write into their state input's buffer in place (a KV cache's
    /// appends: no copy of the whole cache per run).
    pub fn writes_in_place(&self) -> usize {
        self.steps.iter().filter(|s| s.in_place).count()
    }

    /// Products recognised at compile time (run through cuBLAS when their layouts resolve).
    pub fn gemm_patterns(&self) -> usize {
        self.patterns.len()
    }

    /// Nodes computed inside their consumer's kernel (no buffer, no launch of their own).
    pub fn fused_nodes(&self) -> usize {
        self.fused
    }

    /// Causal masks read only by attentions (each skipped in runs where every one of those
    /// computes it from the indices), and how many of them have been computed (hold a
    /// buffer).
    pub fn causal_masks(&self) -> (usize, usize) {
        let marked = self.steps.iter().filter(|s| s.causal_mask_of.is_some());
        let computed = marked
            .clone()
            .filter(|s| self.buffers.contains_key(&s.node))
            .count();
        (marked.count(), computed)
    }

    /// Kernel launches (cuBLAS calls included) of the last run.
    pub fn launches(&self) -> usize {
        self.launches
    }

    /// The distinct generated kernels of the plan.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// The executor (device handles).
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// A dim's value: a scan of the few bound dims (`dim_list`), cheaper than hashing the name.
    fn dim(&self, name: &str) -> Option<i64> {
        self.dim_list
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
    }

    /// `e` at the bound dims, as [`luminal::shape::eval_bound`].
    fn eval(&self, e: &Expression) -> Result<i64> {
        e.eval_with(&|n| self.dim(n)).map_err(|err| match err {
            luminal::shape::ExprError::UnboundVariable(v) => LuminalError::UnboundDim(v),
            other => LuminalError::Expression(other.to_string()),
        })
    }

    /// The element count of `shape` at the bound dims, as [`luminal::shape::numel_bound`].
    fn numel(&self, shape: &[Expression]) -> Result<usize> {
        shape
            .iter()
            .try_fold(1usize, |acc, d| Ok(acc * self.eval(d)?.max(0) as usize))
    }

    /// Every input the plan reads is set, with the length its shape has at the bound dims.
    fn check_inputs(&self) -> Result<()> {
        for &(id, fixed) in &self.inputs_needed {
            let node = self.graph.node(id);
            let name = || match &node.op {
                Op::Input { name } => name.clone(),
                _ => unreachable!("only inputs have no kernel"),
            };
            let have = self
                .buffers
                .get(&id)
                .ok_or_else(|| LuminalError::MissingInput(name()))?
                .len;
            if fixed {
                continue;
            }
            let name = name();
            let n = self.numel(&node.shape)?;
            if bytes_of(node.dtype, n) != Some(have) {
                return Err(LuminalError::WrongLength {
                    tensor: name,
                    expected: n,
                    got: values_in(node.dtype, have),
                });
            }
        }
        Ok(())
    }

    /// The out-of-range index a gather reported in the error buffer, if any, as a typed error.
    fn gather_error(&self) -> Result<()> {
        let err = self
            .exec
            .download(self.error_buffer.as_ref().expect("allocated by run"), 8)?;
        if err[0..4] != [0; 4] {
            let index = i32::from_le_bytes([err[4], err[5], err[6], err[7]]) as i64;
            // The table's rows, for the message (first gather's).
            let size = self
                .steps
                .iter()
                .find(|s| s.error_flag)
                .map(|s| self.graph.node(s.node).inputs[0].view.dims()[0].clone())
                .map_or(Ok(0), |e| self.eval(&e))?;
            return Err(LuminalError::IndexOutOfRange {
                op: "Gather".into(),
                index,
                size,
            });
        }
        Ok(())
    }
}

impl<E: Executor> PlanRuntime<E> {
    /// A new buffer (`epoch` counts it: addresses the last run's launches named may have
    /// changed).
    fn alloc(&mut self, bytes: usize) -> Result<E::Buffer> {
        self.epoch += 1;
        self.exec.alloc(bytes)
    }

    /// Takes this run's values of the host dims and resolves again the products and
    /// attentions whose operand views read one that changed since they were last resolved.
    /// Returns the changed dims ([`dim_bit`]s; all on the first run).
    fn resolve_calls(&mut self) -> u64 {
        let mut values = self.resolved_dims.take();
        let mut changed = 0;
        match values.as_mut() {
            Some(values) => {
                for (i, (name, value)) in self.host_dims.iter().zip(values).enumerate() {
                    let now = self.dim(name);
                    if *value != now {
                        *value = now;
                        changed |= dim_bit(i);
                    }
                }
            }
            None => {
                values = Some(self.host_dims.iter().map(|d| self.dim(d)).collect());
                changed = u64::MAX;
            }
        }
        self.resolved_dims = values;
        let dims = &self.dim_list;
        let dim = |n: &str| dims.iter().find(|(d, _)| d == n).map(|&(_, v)| v);
        let eval = |e: &Expression| e.eval_with(&dim).ok();
        for (pi, p) in self.patterns.iter().enumerate() {
            if self.gemm_mask[pi] & changed != 0 || changed == u64::MAX {
                self.calls[pi] = gemm::resolve(p, &eval);
            }
        }
        let graph = &self.graph;
        for (i, (p, x)) in self.attns.iter().zip(&self.attn_exprs).enumerate() {
            if self.attn_mask[i] & changed != 0 || changed == u64::MAX {
                self.attn_calls[i] = match self.attn_twin[i] {
                    // Resolved above (it reads the same dims).
                    Some(j) => self.attn_calls[j],
                    None => attention::resolve(p, x, &|n| graph.node(n).dtype, &eval),
                };
            }
        }
        changed
    }
}

impl<E: Executor> Runtime for PlanRuntime<E> {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        self.generation += 1;
        self.set_at.insert(node, self.generation);
        if self.watched.binary_search(&node).is_ok() {
            self.epoch += 1;
        }
        let bytes = to_bytes(data)?;
        let len = bytes.len();
        // A state that an in-place write holds after a failed run comes back first.
        self.return_state();
        // New values of the same size or smaller (a decode step's token) go into the buffer
        // the input already has: no allocation, and the device pointers stay the same.
        if let Some(b) = self.buffers.get_mut(&node) {
            if b.capacity >= len && len > 0 {
                self.exec.write(&mut b.buf, &bytes)?;
                if b.len != len {
                    self.epoch += 1;
                }
                b.len = len;
                return Ok(());
            }
        }
        self.epoch += 1;
        let buf = self.exec.upload(&bytes)?;
        self.buffers.insert(
            node,
            Buffer {
                buf,
                capacity: len,
                len,
            },
        );
        Ok(())
    }

    fn set_dim(&mut self, name: &str, value: usize) {
        self.dims.insert(name.to_string(), value as i64);
        match self.dim_list.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = value as i64,
            None => self.dim_list.push((name.to_string(), value as i64)),
        }
    }

    fn run(&mut self) -> Result<()> {
        // Host time preparing the run (checks, products and attentions resolved, dims,
        // launches listed), for `LUMINAL_CUDA_STATS=2`.
        let t0 = std::time::Instant::now();
        // Whether the last run's launches may be this run's (unless it completes, not).
        let prepared_at = self.prepared_at.take();
        // A run that failed after an in-place write took its state's buffer: give it back.
        self.return_state();
        if let Some(d) = self.needed_dims.iter().find(|d| self.dim(d).is_none()) {
            return Err(LuminalError::UnboundDim(d.clone()));
        }
        self.check_inputs()?;
        let changed = self.resolve_calls();
        let gathers = self.steps.iter().any(|s| s.error_flag);
        if gathers && !self.error_zero {
            match self.error_buffer.as_mut() {
                Some(b) => self.exec.write(b, &[0u8; 8])?,
                None => self.error_buffer = Some(self.alloc(8)?),
            }
            self.error_zero = true;
        }
        // This run's dims, where the kernels read them.
        let mut values = std::mem::take(&mut self.dim_values);
        values.clear();
        for d in &self.dim_names {
            values.push(
                self.dim(d)
                    .ok_or_else(|| LuminalError::UnboundDim(d.clone()))?,
            );
        }
        for &(slot, d) in &self.dim_slots {
            self.dims_host[slot] = values[d];
        }
        self.dim_values = values;
        let before = self.launches;
        // The last run's launches where only dims that no launch depends on changed (a decode
        // step's position, read from the tables), else all of them listed again.
        let same = prepared_at == Some(self.epoch) && self.prepare_changed(changed)?;
        let mut launches = std::mem::take(&mut self.launch_list);
        if !same {
            self.prepare_all(&mut launches)?;
            if self.skinny > 1 {
                prepare::merge_skinny(&mut launches, &self.skinny_fns, &self.skinny_mma_fns);
            }
            if self.combine {
                self.combine_launches(&mut launches)?;
            }
            self.launches = launches.len();
            self.attn_at.iter_mut().for_each(|a| *a = None);
            for (i, l) in launches.iter().enumerate() {
                if let launch::Launch::Attention { slot, .. } = l {
                    self.attn_at[*slot] = Some(i);
                }
            }
        }
        let prepared = t0.elapsed();
        let replays_before = self.replays;
        self.error_zero &= !gathers;
        let executed = self.execute(&launches, same);
        self.launch_list = launches;
        executed?;
        if self.pending_static.is_empty() && self.pending_dequant.is_empty() {
            self.prepared_at = Some(self.epoch);
        }
        let at = self.generation.max(1);
        for s in std::mem::take(&mut self.pending_static) {
            self.computed_at[s] = at;
        }
        self.dequantized = self.pending_dequant.len();
        for p in std::mem::take(&mut self.pending_dequant) {
            self.dequant_at.insert(p, at);
        }
        if self.stats >= 1 && self.launches != before {
            eprintln!(
                "luminal_cuda: {} launches per run ({} kernels, {} nodes fused, {} of {} \
                 attentions fused)",
                self.launches,
                self.kernels.len(),
                self.fused,
                self.attention_calls(),
                self.attns.len()
            );
        }
        // State written by `WriteSlice`s: the destination inputs take the updated tensors after
        // the run (their other readers in this run saw the values from before it).
        self.return_state();
        self.ran = true;
        for step in &self.steps {
            let node = self.graph.node(step.node);
            if let Op::WriteSlice { .. } = node.op {
                if step.in_place {
                    continue;
                }
                let dest = node.inputs[0].node;
                let mut d = self.buffers.remove(&dest).expect("inputs checked above");
                let src = &self.buffers[&step.node];
                if d.capacity < src.len {
                    self.epoch += 1;
                    d.buf = self.exec.alloc(src.len)?;
                    d.capacity = src.len;
                }
                self.exec.copy(&src.buf, &mut d.buf, src.len)?;
                d.len = src.len;
                self.buffers.insert(dest, d);
            }
        }
        let enqueued = t0.elapsed();
        self.exec.synchronize()?;
        if self.stats >= 2 {
            eprintln!(
                "luminal_cuda: run of {} launches ({}): {:.1} µs preparing, {:.1} µs enqueueing, {:.1} µs waiting for the device",
                self.launches,
                if self.replays > replays_before { "replayed" } else { "launched" },
                prepared.as_secs_f64() * 1e6,
                (enqueued - prepared).as_secs_f64() * 1e6,
                (t0.elapsed() - enqueued).as_secs_f64() * 1e6
            );
        }
        if gathers {
            self.gather_error()?;
            self.error_zero = true;
        }
        Ok(())
    }

    fn get_data(&self, tensor: impl Into<TensorRef>) -> Result<HostData> {
        let entry = self.graph.check_output(tensor)?;
        // An in-place write's result is its state input's buffer after the run.
        let node = match self
            .steps
            .iter()
            .find(|s| s.in_place && s.node == entry.node)
        {
            Some(s) if self.ran && !self.buffers.contains_key(&s.node) => {
                self.graph.node(s.node).inputs[0].node
            }
            _ => self.resolved(entry.node),
        };
        let buf = self
            .buffers
            .get(&node)
            .ok_or_else(|| LuminalError::NotComputed(entry.label.clone()))?;
        let bytes = self.exec.download(&buf.buf, buf.len)?;
        Ok(from_bytes(entry.dtype, &bytes))
    }

    fn graph_data(&self) -> &GraphData {
        &self.graph
    }
}

#[cfg(test)]
mod tests {
    use super::threads_per_output;

    #[test]
    fn threads_per_output_follow_the_row() {
        // Short or strided rows: one thread per output.
        assert_eq!(threads_per_output(4096, 16, 1), 1);
        assert_eq!(threads_per_output(1, 4096, 8), 1);
        // A warp for medium rows, more lanes for long ones, fewer when outputs are many.
        assert_eq!(threads_per_output(1 << 16, 64, 1), 32);
        assert_eq!(threads_per_output(4096, 8192, 1), 512);
        assert_eq!(threads_per_output(1 << 16, 8192, 1), 32);
        // Few outputs: up to a block of 512 threads, at least 4 elements a lane.
        assert_eq!(threads_per_output(1, 4096, 1), 512);
        assert_eq!(threads_per_output(3, 5000, 1), 512);
        assert_eq!(threads_per_output(7, 1000, 1), 128);
        // The cases of tests/emulator_reduce.rs.
        assert_eq!(threads_per_output(5, 1023, 1), 128);
        assert_eq!(threads_per_output(1101, 600, 1), 64);
        assert_eq!(threads_per_output(37, 100, 1), 32);
        assert_eq!(threads_per_output(4, 33, 1), 1);
        for (n, len) in [
            (1, 64),
            (5, 100_000),
            (1 << 20, 1 << 20),
            (usize::MAX, 1 << 30),
        ] {
            let t = threads_per_output(n, len, 1);
            assert!(
                t.is_power_of_two() && (32..=512).contains(&t),
                "{n} {len}: {t}"
            );
        }
    }
}
