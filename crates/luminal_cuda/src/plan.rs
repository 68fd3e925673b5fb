//! The compiled plan and its runtime, generic over where the kernels run ([`Executor`]): the
//! GPU ([`crate::device::CudaExecutor`]) or the host emulator ([`crate::host`]). Everything
//! but the device calls (buffer sizes, launch shapes, dim bindings, state updates, error
//! checks) is this one code, so the emulator's tests cover it.

use crate::attention::{self, AttnCall, AttnPattern};
use crate::codegen::{self, Kernel, BLOCK};
use crate::gemm::{self, GemmCall, Pattern};
use luminal::graph::{GraphData, NodeId, TensorRef};
use luminal::op::Op;
use luminal::passes::live_order;
use luminal::{DType, Expression, HostData, LuminalError, Result, Runtime};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Where the kernels run: device memory and launches.
pub trait Executor {
    type Buffer;
    type Function;
    /// Compiles kernels (at `Backend::compile` time); one function per kernel, in order.
    fn compile(&mut self, kernels: &[&Kernel]) -> Result<Vec<Self::Function>>;
    /// A zeroed buffer of at least `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<Self::Buffer>;
    /// A buffer holding `data`.
    fn upload(&mut self, data: &[u8]) -> Result<Self::Buffer>;
    /// The first `bytes` bytes of `buf` (after the launches so far complete).
    fn download(&self, buf: &Self::Buffer, bytes: usize) -> Result<Vec<u8>>;
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
    /// Whether [`Executor::gemm`] runs (cuBLAS loaded); without it products run as kernels.
    fn gemm_available(&self) -> bool {
        false
    }
    /// One f32 `cublasSgemmStridedBatched` call ([`GemmCall`]: column-major, offsets in
    /// elements) with cuBLAS's `A` in `a`, `B` in `b`, the result in `c`.
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
    /// One fused attention ([`crate::attention`]): `out` (contiguous `[batch.., s, d]`) from
    /// q, k, v (f32 or f16 as `call` says) and the optional bias, read at the call's strides.
    fn attention(
        &mut self,
        call: &AttnCall,
        out: &Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        bias: Option<&Self::Buffer>,
    ) -> Result<()> {
        let _ = (call, out, q, k, v, bias);
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
    /// The product this `Mul` feeds: skipped when that product goes to cuBLAS.
    feeds: Option<usize>,
    /// The attention this node computes (its output) when the call resolves.
    attn_out: Option<usize>,
    /// The attention this node is inside of: skipped (no buffer) when the call resolves.
    attn_inner: Option<usize>,
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
    /// Nodes computed inside their consumer's kernel ([`codegen::fused_nodes`]).
    fused: usize,
    /// Kernel launches and cuBLAS calls of the last run.
    launches: usize,
    /// Print the launches of a run to stderr when they change (`LUMINAL_CUDA_STATS=1`).
    stats: bool,
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
            gemm::find(&graph, &order)
        } else {
            vec![]
        };
        // The products cuBLAS may compute keep their kernels and operand buffers.
        let barriers: HashSet<NodeId> = patterns.iter().flat_map(|p| [p.mul, p.reduce]).collect();
        let attns = if exec.attention_available()
            && std::env::var("LUMINAL_CUDA_ATTENTION").map_or(true, |v| v != "0")
        {
            attention::find(&graph, &order)
        } else {
            vec![]
        };
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
        let generated =
            codegen::generate_all(&graph, &order, &fused).map_err(LuminalError::Backend)?;
        let by_reduce: HashMap<NodeId, usize> = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| (p.reduce, i))
            .collect();
        let by_mul: HashMap<NodeId, usize> = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| (p.mul, i))
            .collect();
        let mut kernels: Vec<Kernel> = vec![];
        let mut by_source: HashMap<String, usize> = HashMap::new();
        let mut steps = vec![];
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
            });
        }
        let functions = exec.compile(&kernels.iter().collect::<Vec<_>>())?;
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
            fused: fused.len(),
            launches: 0,
            stats: std::env::var("LUMINAL_CUDA_STATS").is_ok_and(|v| v != "0"),
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

    fn launch_step(&mut self, s: usize) -> Result<()> {
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
        // The output buffer, grown when the dims grew (kept otherwise).
        let id = step.node;
        let grow = self.buffers.get(&id).is_none_or(|b| b.capacity < bytes);
        if grow {
            let capacity = bytes.max(4);
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
        if n == 0 {
            return Ok(());
        }
        if let Some(call) = step.attn_out.and_then(|p| self.attn_calls[p].as_ref()) {
            let p = &self.attns[step.attn_out.expect("checked")];
            let buf = |id: NodeId| {
                self.buffers
                    .get(&id)
                    .map(|b| &b.buf)
                    .ok_or_else(|| LuminalError::Backend(format!("node {} has no buffer", id.0)))
            };
            let bias = match &p.bias {
                Some(b) => Some(buf(b.node)?),
                None => None,
            };
            let (out, q, k, v) = (buf(id)?, buf(p.q.node)?, buf(p.k.node)?, buf(p.v.node)?);
            self.exec.attention(call, out, q, k, v, bias)?;
            self.launches += 1;
            return Ok(());
        }
        if let Some(calls) = step.gemm.and_then(|p| self.calls[p].as_ref()) {
            let p = &self.patterns[step.gemm.expect("checked")];
            let buf = |id: NodeId| {
                self.buffers
                    .get(&id)
                    .map(|b| &b.buf)
                    .ok_or_else(|| LuminalError::Backend(format!("node {} has no buffer", id.0)))
            };
            let (c, a, b) = (buf(id)?, buf(p.b.node)?, buf(p.a.node)?);
            for call in calls {
                self.exec.gemm(call, c, a, b)?;
            }
            self.launches += calls.len();
            return Ok(());
        }
        if step.error_flag && self.error_buffer.is_none() {
            self.error_buffer = Some(self.exec.alloc(8)?);
        }
        let mut scalars = vec![n as i64];
        for d in &step.dims {
            scalars.push(
                *self
                    .dims
                    .get(d)
                    .ok_or_else(|| LuminalError::UnboundDim(d.clone()))?,
            );
        }
        let mut buffers: Vec<&E::Buffer> = vec![&self.buffers[&id].buf];
        for input in &step.inputs {
            let b = self
                .buffers
                .get(input)
                .ok_or_else(|| LuminalError::Backend(format!("node {} has no buffer", input.0)))?;
            buffers.push(&b.buf);
        }
        if step.error_flag {
            buffers.push(self.error_buffer.as_ref().expect("allocated above"));
        }
        let grid = u32::try_from(n.div_ceil(BLOCK as usize)).map_err(|_| {
            LuminalError::Backend(format!("{n} elements is too many for one launch"))
        })?;
        self.launches += 1;
        self.exec.launch(
            &self.functions[step.function],
            grid,
            BLOCK,
            &buffers,
            &scalars,
        )
    }
}

impl<E: Executor> Runtime for PlanRuntime<E> {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        let bytes = to_bytes(data)?;
        let len = bytes.len();
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
            let zero = self.exec.upload(&[0u8; 8])?;
            self.error_buffer = Some(zero);
        }
        let before = self.launches;
        self.launches = 0;
        for s in 0..self.steps.len() {
            self.launch_step(s)?;
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
        for step in &self.steps {
            let node = self.graph.node(step.node);
            if let Op::WriteSlice { .. } = node.op {
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
        self.exec.synchronize()?;
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
        let buf = self
            .buffers
            .get(&entry.node)
            .ok_or_else(|| LuminalError::NotComputed(entry.label.clone()))?;
        let bytes = self.exec.download(&buf.buf, buf.len)?;
        Ok(from_bytes(entry.dtype, &bytes))
    }

    fn graph_data(&self) -> &GraphData {
        &self.graph
    }
}
