//! The compiled plan and its runtime, generic over where the kernels run ([`Executor`]): the
//! GPU ([`crate::device::CudaExecutor`]) or the host emulator ([`crate::host`]). Everything
//! but the device calls (buffer sizes, launch shapes, dim bindings, state updates, error
//! checks) is this one code, so the emulator's tests cover it.

use crate::attention::{self, AttnCall, AttnPattern};
use crate::codegen::{self, Kernel, BLOCK};
use crate::gemm::{self, GemmCall, GemmType, Pattern, Side};
use luminal::graph::{GraphData, NodeId, TensorRef};
use luminal::op::Op;
use luminal::passes::live_order;
use luminal::{DType, Expression, HostData, LuminalError, Result, Runtime};
use std::collections::{BTreeSet, HashMap, HashSet};

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
    /// Whether [`Executor::gemm`] runs (cuBLAS loaded); without it products run as kernels.
    fn gemm_available(&self) -> bool {
        false
    }
    /// Whether f32 activations may be rounded to a half weight's type so that cuBLAS reads
    /// the weight in place ([`gemm::find`]'s `round`).
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
    /// Where this kernel's dims start in the dims table.
    dims_at: usize,
    /// For a step whose value depends only on inputs that are not state (weights), on no
    /// dim, through no state write: those inputs. Its result is kept and the step skipped
    /// while none of them has been set again (a weight's dequantizing cast runs once).
    static_deps: Option<Vec<NodeId>>,
    /// A reduction taking its threads per output at launch ([`Kernel::cooperative`]).
    cooperative: bool,
}

/// A buffer a launch reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BufRef {
    Node(NodeId),
    /// A product's rounded operand.
    Scratch(usize),
    Error,
    Dims,
}

/// The key of a product's dequantized weight copy in the plan's scratch buffers (after the
/// products' rounded operands, keyed by the product's index).
const DEQUANT: usize = 1 << 40;

/// The buffer `r` names, among the plan's.
fn buffer_of<'a, B>(
    buffers: &'a HashMap<NodeId, Buffer<B>>,
    scratch: &'a HashMap<usize, Buffer<B>>,
    error: &'a Option<B>,
    dims: &'a Option<Buffer<B>>,
    r: BufRef,
) -> Result<&'a B> {
    match r {
        BufRef::Node(id) => buffers.get(&id).map(|b| &b.buf),
        BufRef::Scratch(p) => scratch.get(&p).map(|b| &b.buf),
        BufRef::Error => error.as_ref(),
        BufRef::Dims => dims.as_ref().map(|b| &b.buf),
    }
    .ok_or_else(|| LuminalError::Backend(format!("no buffer for {r:?}")))
}

/// One launch of a run, prepared before any is issued (so that a run's launches can be
/// compared with the last run's and replayed from a graph).
enum Launch {
    Kernel {
        function: usize,
        grid: u32,
        block: u32,
        buffers: Vec<BufRef>,
        scalars: Vec<i64>,
    },
    Gemm {
        call: GemmCall,
        c: BufRef,
        a: BufRef,
        b: BufRef,
    },
    /// One fused attention (its scratch is the plan's `attn_scratch`; its call is also
    /// written to slot `slot` of the plan's `attn_table`).
    Attention {
        slot: usize,
        call: Box<AttnCall>,
        out: BufRef,
        q: BufRef,
        k: BufRef,
        v: BufRef,
        bias: Option<BufRef>,
    },
}

/// Threads per output of a reduction over `len` elements (each output's row) with `inner`
/// values after the reduced axis, for `outputs` outputs, on a GPU: 1 (one thread loops over
/// the row) when the row is short or strided (`inner > 1`: consecutive threads then read
/// consecutive addresses already); else a power of two from 32 (a warp) to
/// [`codegen::MAX_THREADS_PER_OUTPUT`] (a block), about 16 elements a lane, fewer lanes when
/// there are many outputs (at most 2^21 threads: the grid fills the GPU anyway), more (down
/// to 4 elements a lane) when there are few (a decode step's one row: more loads in flight).
pub fn threads_per_output(outputs: usize, len: usize, inner: usize) -> u32 {
    let max = codegen::MAX_THREADS_PER_OUTPUT as usize;
    if inner != 1 || len < 64 {
        return 1;
    }
    let pow2_floor = |x: usize| if x == 0 { 1 } else { 1 << x.ilog2() };
    let mut t = pow2_floor(len / 16).clamp(32, max);
    while t > 32 && outputs.saturating_mul(t) > 1 << 21 {
        t /= 2;
    }
    while t < max && t * 8 <= len && outputs.saturating_mul(t) < 1 << 16 {
        t *= 2;
    }
    t as u32
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
    /// Live inputs (checked at run).
    inputs_needed: Vec<NodeId>,
    needed_dims: BTreeSet<String>,
    buffers: HashMap<NodeId, Buffer<E::Buffer>>,
    error_buffer: Option<E::Buffer>,
    dims: HashMap<String, i64>,
    /// The distinct kernels (sources) of the plan, for inspection.
    kernels: Vec<Kernel>,
    /// Products that may go to cuBLAS, and their calls at this run's dims (`None`: kernels).
    patterns: Vec<Pattern>,
    calls: Vec<Option<Vec<GemmCall>>>,
    /// Attentions recognised at compile time, and their calls at this run's dims (`None`:
    /// the primop kernels).
    attns: Vec<AttnPattern>,
    attn_calls: Vec<Option<AttnCall>>,
    /// Per product that rounds an f32 operand to a half type: its scratch buffer.
    scratch: HashMap<usize, Buffer<E::Buffer>>,
    /// The rounding kernels (f32 → f16, f32 → bf16) in `functions`, where a product needs them.
    round_fn: HashMap<GemmType, usize>,
    /// Per product over a quantized weight ([`gemm::Pattern::dequant`]): the kernel writing
    /// its f16 copy (into `scratch[DEQUANT + pattern]`), and when it last ran.
    dequant_fn: HashMap<usize, usize>,
    dequant_at: HashMap<usize, u64>,
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
    /// Whether a run has completed (an in-place write's result is then its state's buffer).
    ran: bool,
    /// A counter of `set_data` calls: when each input was last set, and when each static
    /// step last computed its result (0: never).
    generation: u64,
    set_at: HashMap<NodeId, u64>,
    computed_at: Vec<u64>,
    /// Static steps launched by the run being prepared (marked computed once it is issued),
    /// and the products whose weight copy it writes.
    pending_static: Vec<usize>,
    pending_dequant: Vec<usize>,
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
    /// Runs replayed from a graph, and graphs captured, since the runtime was made.
    replays: usize,
    captures: usize,
    /// Print the launches of a run to stderr when they change (`LUMINAL_CUDA_STATS=1`).
    stats: bool,
    /// Also print each run's host time enqueueing the launches and waiting for the device
    /// (`LUMINAL_CUDA_STATS=2`): whether a run is bound by the host's launches or the GPU.
    timings: bool,
}

fn size_of(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::I32 => 4,
        DType::F16 | DType::BF16 => 2,
        _ => 1,
    }
}

/// Bytes of `n` values of `dtype` on the device (whole blocks for the quantized types, as
/// ggml stores them; `None` when `n` is not a whole number of blocks).
fn bytes_of(dtype: DType, n: usize) -> Option<usize> {
    if dtype.is_quantized() {
        dtype.bytes_for(n)
    } else {
        Some(n * size_of(dtype))
    }
}

/// Values that `bytes` bytes of `dtype` hold (rounded down to whole blocks).
fn values_in(dtype: DType, bytes: usize) -> usize {
    bytes / dtype.block_bytes() * dtype.block_size()
}

/// Host data as the bytes of its device buffer (block-quantized data as its raw blocks:
/// kernels dequantize the elements they read).
fn to_bytes(data: HostData) -> Result<Vec<u8>> {
    Ok(match data.into_typed() {
        HostData::Bytes(b) if b.dtype().is_quantized() => b.as_slice().to_vec(),
        HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        other => {
            return Err(LuminalError::Backend(format!(
                "the CUDA backend does not support {} inputs yet",
                other.dtype()
            )))
        }
    })
}

fn from_bytes(dtype: DType, b: &[u8]) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::F16 => HostData::F16(
            b.chunks_exact(2)
                .map(|c| luminal::half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::BF16 => HostData::BF16(
            b.chunks_exact(2)
                .map(|c| luminal::half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::I32 => HostData::I32(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => HostData::Bool(b.iter().map(|&x| x != 0).collect()),
    }
}

impl<E: Executor> PlanRuntime<E> {
    /// Generates the kernels of `graph`'s live nodes, elementwise producers fused into their
    /// consumers, and compiles the distinct ones.
    pub fn new(graph: GraphData, exec: E) -> Result<Self> {
        Self::with_fusion(graph, exec, codegen::Fusion::On)
    }

    /// As [`PlanRuntime::new`] with fusion `mode` ([`codegen::Fusion::Off`]: every node its
    /// own kernel and buffer).
    pub fn with_fusion(graph: GraphData, mut exec: E, mode: codegen::Fusion) -> Result<Self> {
        let (order, needed_dims) = live_order(&graph);
        // Storing into a block-quantized type (a q8_0 KV cache) has no kernels here yet: a
        // typed error naming the op, instead of elementwise code writing a block buffer.
        if let Some(&id) = order.iter().find(|&&id| {
            let n = graph.node(id);
            n.dtype.is_quantized() && !matches!(n.op, luminal::op::Op::Input { .. })
        }) {
            let n = graph.node(id);
            return Err(LuminalError::Backend(format!(
                "the CUDA backend cannot store into {} yet ({} of shape {:?}: a quantized KV \
                 cache); use an f16 or f32 cache",
                n.dtype,
                n.op.name(),
                n.shape
            )));
        }
        let patterns = if exec.gemm_available() {
            gemm::find(&graph, &order, exec.gemm_rounds_activations())
        } else {
            vec![]
        };
        // The products cuBLAS may compute keep their kernels and operand buffers (a bypassed
        // cast's input too: the cast is a barrier, so its input is not fused into it).
        let barriers: HashSet<NodeId> = patterns
            .iter()
            .flat_map(|p| [p.mul, p.reduce].into_iter().chain(p.casts.iter().copied()))
            .collect();
        let attns = if exec.attention_available()
            && std::env::var("LUMINAL_CUDA_ATTENTION").map_or(true, |v| v != "0")
        {
            attention::find(&graph, &order)
        } else {
            vec![]
        };
        if !attns.is_empty() {
            exec.prepare_attention()?;
        }
        let mut fused = codegen::fused_nodes(&graph, &order, &barriers, mode);
        // The attention kernel reads its operands' buffers.
        for p in &attns {
            for n in p.operands() {
                fused.remove(&n);
            }
        }
        let attn_out: HashMap<NodeId, usize> =
            attns.iter().enumerate().map(|(i, p)| (p.out, i)).collect();
        let attn_inner: HashMap<NodeId, usize> = attns
            .iter()
            .enumerate()
            .flat_map(|(i, p)| p.inner.iter().map(move |&n| (n, i)))
            .collect();
        let in_place = codegen::write_in_place(&graph, &order);
        let generated = codegen::generate_all(&graph, &order, &fused, &in_place)
            .map_err(LuminalError::Backend)?;
        let by_reduce: HashMap<NodeId, usize> = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| (p.reduce, i))
            .collect();
        let by_mul: HashMap<NodeId, usize> = patterns
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                std::iter::once((p.mul, i)).chain(p.casts.iter().map(move |&c| (c, i)))
            })
            .collect();
        let mut kernels: Vec<Kernel> = vec![];
        let mut by_source: HashMap<String, usize> = HashMap::new();
        let mut steps = vec![];
        let mut dims_len = 0;
        let mut inputs_needed = vec![];
        for (id, k) in generated {
            let Some((k, inputs)) = k else {
                inputs_needed.push(id);
                continue;
            };
            let function = *by_source.entry(k.source.clone()).or_insert_with(|| {
                kernels.push(k.clone());
                kernels.len() - 1
            });
            steps.push(Step {
                node: id,
                function,
                error_flag: k.error_flag,
                dims: k.dims,
                inputs,
                gemm: by_reduce.get(&id).copied(),
                feeds: by_mul.get(&id).copied(),
                attn_out: attn_out.get(&id).copied(),
                attn_inner: attn_inner.get(&id).copied(),
                in_place: in_place.contains(&id),
                dims_at: dims_len,
                static_deps: None,
                cooperative: k.cooperative,
            });
            // A kernel with dims: their values, then its thread count.
            dims_len += steps.last().map_or(0, |s: &Step| {
                if s.dims.is_empty() {
                    0
                } else {
                    s.dims.len() + 1
                }
            });
        }
        // Static steps: what each node's value depends on, if only on non-state inputs.
        let keep_static = exec.keeps_static_results()
            && std::env::var("LUMINAL_CUDA_STATIC").map_or(true, |v| v != "0");
        let states: HashSet<NodeId> = order
            .iter()
            .filter_map(|&id| match graph.node(id).op {
                Op::WriteSlice { .. } => Some(graph.node(id).inputs[0].node),
                _ => None,
            })
            .collect();
        let step_dims: HashMap<NodeId, bool> = steps
            .iter()
            .map(|s: &Step| (s.node, !s.dims.is_empty()))
            .collect();
        let mut deps: HashMap<NodeId, Option<Vec<NodeId>>> = HashMap::new();
        for &id in &order {
            let node = graph.node(id);
            let d = match node.op {
                Op::Input { .. } => (!states.contains(&id)).then(|| vec![id]),
                Op::WriteSlice { .. } => None,
                _ if step_dims.get(&id).copied().unwrap_or(false)
                    || node.shape.iter().any(|e| e.as_constant().is_none()) =>
                {
                    None
                }
                _ => {
                    let mut all: Vec<NodeId> = vec![];
                    let mut ok = true;
                    for e in &node.inputs {
                        match deps.get(&e.node).cloned().flatten() {
                            Some(v) => all.extend(v),
                            None => ok = false,
                        }
                    }
                    all.sort();
                    all.dedup();
                    ok.then_some(all)
                }
            };
            deps.insert(id, d);
        }
        for step in &mut steps {
            if keep_static {
                step.static_deps = deps.get(&step.node).cloned().flatten();
            }
        }
        let mut round_fn = HashMap::new();
        for t in patterns.iter().filter_map(|p| p.round.map(|r| r.1)) {
            round_fn.entry(t).or_insert_with(|| {
                kernels.push(codegen::round_kernel(t.dtype()));
                kernels.len() - 1
            });
        }
        // Products over a quantized weight: the kernel dequantizing the weight into its f16
        // copy (the weight's cast, to f16).
        let mut dequant_fn = HashMap::new();
        for (i, p) in patterns.iter().enumerate() {
            let Some(side) = p.dequant else { continue };
            let cast = graph.node(p.casts[0]);
            let w = match side {
                Side::A => p.a.node,
                Side::B => p.b.node,
            };
            let node = luminal::graph::Node {
                op: Op::Cast(DType::F16),
                inputs: cast.inputs.clone(),
                dtype: DType::F16,
                shape: cast.shape.clone(),
            };
            let k = codegen::generate(&node, &[graph.node(w).dtype])
                .map_err(LuminalError::Backend)?
                .expect("a cast has a kernel");
            let f = *by_source.entry(k.source.clone()).or_insert_with(|| {
                kernels.push(k);
                kernels.len() - 1
            });
            dequant_fn.insert(i, f);
        }
        let functions = exec.compile(&kernels.iter().collect::<Vec<_>>())?;
        let nsteps = steps.len();
        let graphs = exec.graphs_available()
            && std::env::var("LUMINAL_CUDA_GRAPHS").map_or(true, |v| v != "0");
        Ok(PlanRuntime {
            graph,
            exec,
            functions,
            steps,
            inputs_needed,
            needed_dims,
            buffers: HashMap::new(),
            error_buffer: None,
            dims: HashMap::new(),
            kernels,
            calls: vec![None; patterns.len()],
            patterns,
            attn_calls: vec![None; attns.len()],
            attns,
            scratch: HashMap::new(),
            round_fn,
            dequant_fn,
            dequant_at: HashMap::new(),
            attn_scratch: None,
            attn_table: None,
            attn_host: vec![],
            fused: fused.len(),
            launches: 0,
            ran: false,
            generation: 0,
            set_at: HashMap::new(),
            computed_at: vec![0; nsteps],
            pending_static: vec![],
            pending_dequant: vec![],
            dims_table: None,
            dims_host: vec![0; dims_len],
            graphs,
            last_signature: vec![],
            captured: None,
            replays: 0,
            captures: 0,
            stats: std::env::var("LUMINAL_CUDA_STATS").is_ok_and(|v| v != "0"),
            timings: std::env::var("LUMINAL_CUDA_STATS").is_ok_and(|v| v == "2" || v == "3"),
        })
    }

    /// How many products ran through [`Executor::gemm`] in the last run.
    pub fn gemm_products(&self) -> usize {
        self.calls.iter().filter(|c| c.is_some()).count()
    }

    /// How many attentions ran through [`Executor::attention`] in the last run.
    pub fn attention_calls(&self) -> usize {
        self.attn_calls.iter().filter(|c| c.is_some()).count()
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

    fn eval(&self, e: &Expression) -> Result<i64> {
        luminal::shape::eval_bound(e, &self.dims)
    }

    fn numel(&self, shape: &[Expression]) -> Result<usize> {
        luminal::shape::numel_bound(shape, &self.dims)
    }

    /// Sizes step `s`'s output buffer (allocating or growing it) and appends its launches.
    fn prepare_step(&mut self, s: usize, out: &mut Vec<Launch>) -> Result<()> {
        let step = &self.steps[s];
        if step
            .attn_inner
            .is_some_and(|p| self.attn_calls[p].is_some())
        {
            // Inside an attention computed by one call from its operands.
            return Ok(());
        }
        if step.feeds.is_some_and(|p| self.calls[p].is_some()) {
            // Read only by its product, which cuBLAS computes from the operands.
            return Ok(());
        }
        if let Some(deps) = &step.static_deps {
            let newest = deps
                .iter()
                .map(|d| self.set_at.get(d).copied().unwrap_or(0))
                .max();
            let at = self.computed_at[s];
            if at > 0 && newest.is_none_or(|g| g <= at) && self.buffers.contains_key(&step.node) {
                // Computed from the same inputs before: kept.
                return Ok(());
            }
            self.pending_static.push(s);
        }
        let node = self.graph.node(step.node);
        let n = self.numel(&node.shape)?;
        let bytes = n * size_of(node.dtype);
        if let Op::WriteSlice { axis, start } = &node.op {
            let len = self.eval(&node.inputs[1].view.dims()[*axis])?;
            let size = self.eval(&node.shape[*axis])?;
            let start = self.eval(start)?;
            if start < 0 || start + len > size {
                return Err(LuminalError::IndexOutOfRange {
                    op: "WriteSlice".into(),
                    index: start + len - 1,
                    size,
                });
            }
        }
        let id = step.node;
        // Threads of the launch: one per output element, or per written element in place.
        let mut threads = n;
        if step.in_place {
            // The destination input's buffer becomes the node's for this run (moved back
            // after it); the kernel writes only the slice.
            let dest = node.inputs[0].node;
            let mut b = self
                .buffers
                .remove(&dest)
                .ok_or_else(|| LuminalError::Backend(format!("state {} has no buffer", dest.0)))?;
            b.len = bytes;
            self.buffers.insert(id, b);
            threads = self.numel(&node.inputs[1].view.dims())?;
        }
        // The output buffer, grown when the dims grew (kept otherwise); a buffer that grows
        // again at least doubles, so a dim that grows by one each run (a decode step's cache
        // window) reallocates O(log n) times, not every run.
        let grow = self.buffers.get(&id).is_none_or(|b| b.capacity < bytes);
        if grow {
            let old = self.buffers.get(&id).map_or(0, |b| b.capacity);
            let capacity = if old > 0 {
                bytes.max(2 * old)
            } else {
                bytes.max(4)
            };
            let buf = self.exec.alloc(capacity)?;
            self.buffers.insert(
                id,
                Buffer {
                    buf,
                    capacity,
                    len: bytes,
                },
            );
        }
        self.buffers.get_mut(&id).expect("allocated above").len = bytes;
        if threads == 0 {
            return Ok(());
        }
        if let Some(mut call) = step.attn_out.and_then(|p| self.attn_calls[p]) {
            let slot = step.attn_out.expect("checked");
            self.exec.plan_attention(&mut call);
            let words = call.words();
            if self.attn_host.len() < (slot + 1) * words.len() {
                self.attn_host.resize((slot + 1) * words.len(), 0);
            }
            self.attn_host[slot * words.len()..(slot + 1) * words.len()].copy_from_slice(words);
            let p = &self.attns[slot];
            let (q, k, v) = (p.q.node, p.k.node, p.v.node);
            let bias = p.bias.as_ref().map(|b| BufRef::Node(b.node));
            for n in [q, k, v].into_iter().chain(p.bias.as_ref().map(|b| b.node)) {
                if !self.buffers.contains_key(&n) {
                    return Err(LuminalError::Backend(format!("node {} has no buffer", n.0)));
                }
            }
            let bytes = self.exec.attention_scratch(&call);
            if self
                .attn_scratch
                .as_ref()
                .is_none_or(|b| b.capacity < bytes)
            {
                let capacity = bytes.max(4);
                let buf = self.exec.alloc(capacity)?;
                self.attn_scratch = Some(Buffer {
                    buf,
                    capacity,
                    len: capacity,
                });
            }
            out.push(Launch::Attention {
                slot,
                call: Box::new(call),
                out: BufRef::Node(id),
                q: BufRef::Node(q),
                k: BufRef::Node(k),
                v: BufRef::Node(v),
                bias,
            });
            return Ok(());
        }
        if let Some(pi) = step.gemm.filter(|&p| self.calls[p].is_some()) {
            return self.prepare_gemm(id, pi, out);
        }
        if step.error_flag && self.error_buffer.is_none() {
            self.error_buffer = Some(self.exec.alloc(8)?);
        }
        // Threads per output: several on a GPU for long contiguous rows.
        let per_output = match &node.op {
            Op::Reduce { axis, .. } if step.cooperative && self.exec.cooperative_reductions() => {
                let dims = node.inputs[0].view.dims();
                let len = usize::try_from(self.eval(&dims[*axis])?).unwrap_or(0);
                threads_per_output(threads, len, self.numel(&dims[axis + 1..])?)
            }
            _ => 1,
        };
        let mut scalars = vec![];
        // A kernel with dims reads its thread count from the dims table, and its grid covers
        // the next power of two: the launch stays the same while the count grows within it
        // (a decode step's mask over the keys), so a captured graph keeps replaying.
        let mut launched = threads;
        if step.dims.is_empty() {
            scalars.push(threads as i64);
        } else {
            self.dims_host[step.dims_at + step.dims.len()] = threads as i64;
            launched = threads.next_power_of_two();
        }
        if step.cooperative {
            scalars.push(per_output as i64);
        }
        if !step.dims.is_empty() {
            scalars.push(step.dims_at as i64);
        }
        let mut buffers = vec![BufRef::Node(id)];
        buffers.extend(step.inputs.iter().map(|&i| BufRef::Node(i)));
        if step.error_flag {
            buffers.push(BufRef::Error);
        }
        if !step.dims.is_empty() {
            buffers.push(BufRef::Dims);
        }
        let block = BLOCK.max(per_output);
        let grid = u32::try_from((launched * per_output as usize).div_ceil(block as usize))
            .map_err(|_| {
                LuminalError::Backend(format!("{threads} elements is too many for one launch"))
            })?;
        out.push(Launch::Kernel {
            function: step.function,
            grid,
            block,
            buffers,
            scalars,
        });
        Ok(())
    }
}

impl<E: Executor> PlanRuntime<E> {
    /// Moves the buffers that in-place `WriteSlice`s took for a run back to their state
    /// inputs (which then hold the updated tensors).
    fn return_state(&mut self) {
        for step in self.steps.iter().filter(|s| s.in_place) {
            if let Some(b) = self.buffers.remove(&step.node) {
                let dest = self.graph.node(step.node).inputs[0].node;
                self.buffers.insert(dest, b);
            }
        }
    }

    /// Product `pi` into `id`'s buffer through [`Executor::gemm`], after rounding its f32
    /// operand to the half type where the pattern asks.
    fn prepare_gemm(&mut self, id: NodeId, pi: usize, out: &mut Vec<Launch>) -> Result<()> {
        let p = &self.patterns[pi];
        if let Some(side) = p.dequant {
            // The weight's f16 copy, written when the weight was set since it last was.
            let w = match side {
                Side::A => p.a.node,
                Side::B => p.b.node,
            };
            let node = self.graph.node(w);
            let n = self.numel(&node.shape)?;
            let set = self.set_at.get(&w).copied().unwrap_or(0);
            let key = DEQUANT + pi;
            let fresh = self.scratch.contains_key(&key)
                && self
                    .dequant_at
                    .get(&pi)
                    .is_some_and(|&at| at >= set && at > 0);
            if !fresh {
                if !self.scratch.contains_key(&key) {
                    let buf = self.exec.alloc(2 * n)?;
                    self.scratch.insert(
                        key,
                        Buffer {
                            buf,
                            capacity: 2 * n,
                            len: 2 * n,
                        },
                    );
                }
                let grid = u32::try_from(n.div_ceil(BLOCK as usize)).map_err(|_| {
                    LuminalError::Backend(format!("{n} elements is too many for one launch"))
                })?;
                out.push(Launch::Kernel {
                    function: self.dequant_fn[&pi],
                    grid: grid.max(1),
                    block: BLOCK,
                    buffers: vec![BufRef::Scratch(key), BufRef::Node(w)],
                    scalars: vec![n as i64],
                });
                self.pending_dequant.push(pi);
            }
        }
        let p = &self.patterns[pi];
        if let Some((side, t)) = p.round {
            let src = match side {
                Side::A => p.a.node,
                Side::B => p.b.node,
            };
            let n = self
                .buffers
                .get(&src)
                .ok_or_else(|| LuminalError::Backend(format!("node {} has no buffer", src.0)))?
                .len
                / 4;
            let bytes = n * t.size();
            if self.scratch.get(&pi).is_none_or(|b| b.capacity < bytes) {
                let capacity = bytes.max(4);
                let buf = self.exec.alloc(capacity)?;
                self.scratch.insert(
                    pi,
                    Buffer {
                        buf,
                        capacity,
                        len: bytes,
                    },
                );
            }
            let grid = u32::try_from(n.div_ceil(BLOCK as usize)).map_err(|_| {
                LuminalError::Backend(format!("{n} elements is too many for one launch"))
            })?;
            out.push(Launch::Kernel {
                function: self.round_fn[&t],
                grid: grid.max(1),
                block: BLOCK,
                buffers: vec![BufRef::Scratch(pi), BufRef::Node(src)],
                scalars: vec![n as i64],
            });
        }
        let p = &self.patterns[pi];
        let operand = |side: Side, e: &luminal::graph::Edge| {
            if p.round.is_some_and(|r| r.0 == side) {
                BufRef::Scratch(pi)
            } else if p.dequant == Some(side) {
                BufRef::Scratch(DEQUANT + pi)
            } else {
                BufRef::Node(e.node)
            }
        };
        // cuBLAS's A is our `b`, its B our `a`.
        let (a, b) = (operand(Side::B, &p.b), operand(Side::A, &p.a));
        for call in self.calls[pi].as_ref().expect("resolved") {
            out.push(Launch::Gemm {
                call: *call,
                c: BufRef::Node(id),
                a,
                b,
            });
        }
        Ok(())
    }

    /// The buffer `r` names.
    fn buffer(&self, r: BufRef) -> Result<&E::Buffer> {
        buffer_of(
            &self.buffers,
            &self.scratch,
            &self.error_buffer,
            &self.dims_table,
            r,
        )
    }

    /// What identifies a run's launches: functions, grids, scalars, products and the
    /// addresses of every buffer they touch (dims values excepted: they are read from the
    /// dims table).
    fn signature(&self, launches: &[Launch]) -> Result<Vec<u64>> {
        let mut sig = Vec::with_capacity(launches.len() * 6);
        for l in launches {
            match l {
                Launch::Kernel {
                    function,
                    grid,
                    block,
                    buffers,
                    scalars,
                } => {
                    sig.extend([0, *function as u64, *grid as u64, buffers.len() as u64]);
                    sig.push(*block as u64);
                    for &b in buffers {
                        sig.push(self.exec.addr(self.buffer(b)?));
                    }
                    sig.extend(scalars.iter().map(|&x| x as u64));
                }
                Launch::Gemm { call, c, a, b } => {
                    sig.push(1);
                    for r in [c, a, b] {
                        sig.push(self.exec.addr(self.buffer(*r)?));
                    }
                    let g = call;
                    sig.extend([
                        g.trans_a as u64,
                        g.trans_b as u64,
                        g.m as u64,
                        g.n as u64,
                        g.k as u64,
                        g.lda as u64,
                        g.ldb as u64,
                        g.ldc as u64,
                        g.stride_a as u64,
                        g.stride_b as u64,
                        g.stride_c as u64,
                        g.batch as u64,
                        g.offset_a as u64,
                        g.offset_b as u64,
                        g.offset_c as u64,
                        g.a_type as u64,
                        g.b_type as u64,
                        g.c_type as u64,
                    ]);
                }
                Launch::Attention {
                    slot,
                    call,
                    out,
                    q,
                    k,
                    v,
                    bias,
                } => {
                    sig.push(2);
                    sig.push(*slot as u64);
                    sig.push(
                        self.attn_table
                            .as_ref()
                            .map_or(0, |b| self.exec.addr(&b.buf)),
                    );
                    for r in [out, q, k, v] {
                        sig.push(self.exec.addr(self.buffer(*r)?));
                    }
                    sig.push(match bias {
                        Some(b) => self.exec.addr(self.buffer(*b)?),
                        None => 0,
                    });
                    sig.push(
                        self.attn_scratch
                            .as_ref()
                            .map_or(0, |b| self.exec.addr(&b.buf)),
                    );
                    // What the launches' shapes depend on (grids, kernel, the combine pass);
                    // the rest of the call (the key count, offsets) is read from the table.
                    sig.extend(
                        [
                            call.s,
                            call.d,
                            call.batches(),
                            call.splits,
                            call.k_f16,
                            call.v_f16,
                            call.has_bias,
                        ]
                        .map(|x| x as u64),
                    );
                }
            }
        }
        Ok(sig)
    }

    /// Issues `launches` on the executor (running them, or recording them in a capture).
    fn issue(&mut self, launches: &[Launch]) -> Result<()> {
        let PlanRuntime {
            exec,
            buffers,
            scratch,
            error_buffer,
            dims_table,
            functions,
            attn_scratch,
            attn_table,
            ..
        } = self;
        let get = |r: BufRef| buffer_of(buffers, scratch, error_buffer, dims_table, r);
        for l in launches {
            match l {
                Launch::Kernel {
                    function,
                    grid,
                    block,
                    buffers,
                    scalars,
                } => {
                    let bufs: Vec<&E::Buffer> =
                        buffers.iter().map(|&b| get(b)).collect::<Result<_>>()?;
                    exec.launch(&functions[*function], *grid, *block, &bufs, scalars)?;
                }
                Launch::Gemm { call, c, a, b } => {
                    exec.gemm(call, get(*c)?, get(*a)?, get(*b)?)?;
                }
                Launch::Attention {
                    slot,
                    call,
                    out,
                    q,
                    k,
                    v,
                    bias,
                } => {
                    let scratch = attn_scratch.as_ref().map(|b| &b.buf).ok_or_else(|| {
                        LuminalError::Backend("attention scratch not allocated".into())
                    })?;
                    let table = attn_table.as_ref().map(|b| &b.buf).ok_or_else(|| {
                        LuminalError::Backend("attention parameters not written".into())
                    })?;
                    let bias = bias.map(get).transpose()?;
                    exec.attention(
                        call,
                        table,
                        slot * std::mem::size_of::<AttnCall>(),
                        get(*out)?,
                        get(*q)?,
                        get(*k)?,
                        get(*v)?,
                        bias,
                        scratch,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// How many runs were replayed from a captured graph, and how many graphs were captured.
    pub fn graph_replays(&self) -> (usize, usize) {
        (self.replays, self.captures)
    }
}

impl<E: Executor> Runtime for PlanRuntime<E> {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        self.generation += 1;
        self.set_at.insert(node, self.generation);
        let bytes = to_bytes(data)?;
        let len = bytes.len();
        // A state that an in-place write holds after a failed run comes back first.
        self.return_state();
        // New values of the same size or smaller (a decode step's token) go into the buffer
        // the input already has: no allocation, and the device pointers stay the same.
        if let Some(b) = self.buffers.get_mut(&node) {
            if b.capacity >= len && len > 0 {
                self.exec.write(&mut b.buf, &bytes)?;
                b.len = len;
                return Ok(());
            }
        }
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
    }

    fn run(&mut self) -> Result<()> {
        // A run that failed after an in-place write took its state's buffer: give it back.
        self.return_state();
        if let Some(d) = self
            .needed_dims
            .iter()
            .find(|d| !self.dims.contains_key(*d))
        {
            return Err(LuminalError::UnboundDim(d.clone()));
        }
        for &id in &self.inputs_needed {
            let node = self.graph.node(id);
            let name = match &node.op {
                Op::Input { name } => name.clone(),
                _ => unreachable!("only inputs have no kernel"),
            };
            let have = self
                .buffers
                .get(&id)
                .ok_or_else(|| LuminalError::MissingInput(name.clone()))?
                .len;
            let n = self.numel(&node.shape)?;
            if bytes_of(node.dtype, n) != Some(have) {
                return Err(LuminalError::WrongLength {
                    tensor: name,
                    expected: n,
                    got: values_in(node.dtype, have),
                });
            }
        }
        let dims = &self.dims;
        self.calls = self
            .patterns
            .iter()
            .map(|p| gemm::resolve(p, &|e| e.eval_with(&|n| dims.get(n).copied()).ok()))
            .collect();
        let graph = &self.graph;
        self.attn_calls = self
            .attns
            .iter()
            .map(|p| {
                attention::resolve(p, &|n| graph.node(n).dtype, &|e| {
                    e.eval_with(&|n| dims.get(n).copied()).ok()
                })
            })
            .collect();
        let gathers = self.steps.iter().any(|s| s.error_flag);
        if gathers {
            match self.error_buffer.as_mut() {
                Some(b) => self.exec.write(b, &[0u8; 8])?,
                None => self.error_buffer = Some(self.exec.upload(&[0u8; 8])?),
            }
        }
        // This run's dims, where the kernels read them.
        for step in &self.steps {
            for (i, d) in step.dims.iter().enumerate() {
                self.dims_host[step.dims_at + i] = *self
                    .dims
                    .get(d)
                    .ok_or_else(|| LuminalError::UnboundDim(d.clone()))?;
            }
        }
        let before = self.launches;
        let t0 = std::time::Instant::now();
        let mut launches = Vec::with_capacity(self.steps.len());
        self.pending_static.clear();
        self.pending_dequant.clear();
        for s in 0..self.steps.len() {
            self.prepare_step(s, &mut launches)?;
        }
        self.launches = launches.len();
        // The dims and thread counts, where the kernels read them (before any launch or
        // capture).
        if !self.dims_host.is_empty() {
            let bytes: Vec<u8> = self
                .dims_host
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            match self.dims_table.as_mut() {
                Some(t) => self.exec.write(&mut t.buf, &bytes)?,
                None => {
                    let buf = self.exec.upload(&bytes)?;
                    self.dims_table = Some(Buffer {
                        buf,
                        capacity: bytes.len(),
                        len: bytes.len(),
                    });
                }
            }
        }
        // The attention calls, where the kernels read them (before any launch or capture).
        if launches
            .iter()
            .any(|l| matches!(l, Launch::Attention { .. }))
        {
            let bytes: Vec<u8> = self
                .attn_host
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            match self.attn_table.as_mut() {
                Some(t) if t.capacity >= bytes.len() => self.exec.write(&mut t.buf, &bytes)?,
                _ => {
                    let buf = self.exec.upload(&bytes)?;
                    self.attn_table = Some(Buffer {
                        buf,
                        capacity: bytes.len(),
                        len: bytes.len(),
                    });
                }
            }
        }
        if std::env::var("LUMINAL_CUDA_STATS").is_ok_and(|v| v == "3") {
            // Each launch of the run, by kernel name (for finding what to fuse next).
            let names: Vec<String> = launches
                .iter()
                .map(|l| match l {
                    Launch::Kernel { function, .. } => self
                        .kernels
                        .get(*function)
                        .map_or("round".to_string(), |k| k.name.clone()),
                    Launch::Gemm { .. } => "gemm".into(),
                    Launch::Attention { .. } => "attention".into(),
                })
                .collect();
            eprintln!("luminal_cuda: launches: {}", names.join(" "));
        }
        let prepared = t0.elapsed();
        let replays_before = self.replays;
        if self.graphs {
            let sig = self.signature(&launches)?;
            if self.captured.as_ref().is_some_and(|g| g.0 == sig) {
                self.exec
                    .replay(&self.captured.as_ref().expect("checked").1)?;
                self.replays += 1;
            } else if sig == self.last_signature {
                // The same launches twice in a row: record them once, then replay.
                self.captured = None;
                self.exec.begin_capture()?;
                let issued = self.issue(&launches);
                let graph = self.exec.end_capture();
                issued?;
                let graph = graph?;
                self.exec.replay(&graph)?;
                self.captured = Some((sig, graph));
                self.captures += 1;
                self.replays += 1;
            } else {
                self.issue(&launches)?;
                // `LUMINAL_CUDA_STATS=3`: why this run was not replayed (where its launches
                // first differ from the previous run's).
                if std::env::var("LUMINAL_CUDA_STATS").is_ok_and(|v| v == "3")
                    && !self.last_signature.is_empty()
                {
                    let i = sig
                        .iter()
                        .zip(&self.last_signature)
                        .position(|(a, b)| a != b);
                    eprintln!(
                        "luminal_cuda: launches differ from the last run's at word {i:?} of {} (was {}): {:?}",
                        sig.len(),
                        self.last_signature.len(),
                        i.map(|i| &sig[i.saturating_sub(8)..(i + 4).min(sig.len())])
                    );
                }
                self.last_signature = sig;
            }
        } else {
            self.issue(&launches)?;
        }
        let at = self.generation.max(1);
        for s in std::mem::take(&mut self.pending_static) {
            self.computed_at[s] = at;
        }
        for p in std::mem::take(&mut self.pending_dequant) {
            self.dequant_at.insert(p, at);
        }
        if self.stats && self.launches != before {
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
        if self.timings {
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
            let err = self
                .exec
                .download(self.error_buffer.as_ref().expect("set above"), 8)?;
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
            _ => entry.node,
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
