//! `CpuRuntime`: the kernels, the static buffer plan, and the `Runtime` API with the same
//! semantics (and typed errors) as the reference runtime.

use crate::kernels::fused::{run_elementwise, run_reduce, ReduceShape};
use crate::kernels::half::HalfScratch;
use crate::lower::{Kernel, KernelKind};
use crate::storage::{Storage, StorageKind};
use crate::view::{eval, DimNames, DimValues, MAX_DYN_DIMS};
use luminal::graph::{GraphData, NodeId, TensorRef};
use luminal::op::Op;
use luminal::passes::live_nodes;
use luminal::shape::CompiledExpression;
use luminal::{Element, HostData, LuminalError, Result, Runtime};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A live input: its node, name, buffer and element count.
struct InputSlot {
    node: NodeId,
    name: String,
    buf: usize,
    numel: CompiledExpression,
    present: bool,
    /// Only weight kernels read it (see `quant/`): raw float data is kept as is.
    weight_only: bool,
}

pub struct CpuRuntime {
    graph: GraphData,
    names: DimNames,
    /// Dims the live graph uses (checked bound before a run, like the reference).
    needed_dims: BTreeSet<String>,
    dims: HashMap<String, i64>,
    dim_values: DimValues,
    kernels: Vec<Kernel>,
    /// Element count each kernel produced in the last run.
    kernel_len: Vec<usize>,
    bufs: Vec<Storage>,
    inputs: Vec<InputSlot>,
    /// Buffer and producing kernel of every node whose buffer is readable by `get`.
    node_buf: HashMap<NodeId, (usize, Option<usize>)>,
    computed: bool,
    pool: std::sync::Arc<crate::exec::par::Pool>,
    threads: usize,
    profile: bool,
    timings: Vec<Duration>,
    /// f32 scratch of the f16 / bf16 matmuls, shared by all of them.
    half_scratch: HalfScratch,
    /// Handles that passed the (allocating, symbolic) whole-tensor check of `set` or
    /// `get_into`: an input stays an input, so later calls check only dtype and length.
    checked: std::sync::Mutex<Vec<(TensorRef, bool)>>,
}

impl CpuRuntime {
    pub(crate) fn new(
        graph: GraphData,
        threads: usize,
        dots: crate::QuantDots,
    ) -> Result<CpuRuntime> {
        let live = live_nodes(&graph);
        let order: Vec<NodeId> = graph
            .toposort()
            .into_iter()
            .filter(|id| live.contains(id))
            .collect();
        let mut sub = graph.clone();
        for (i, n) in sub.nodes.iter_mut().enumerate() {
            if !live.contains(&NodeId(i as u32)) {
                *n = None;
            }
        }
        let needed_dims = sub.dynamic_dims();
        let all_dims = graph.dynamic_dims();
        if all_dims.len() > MAX_DYN_DIMS {
            return Err(LuminalError::Backend(format!(
                "at most {MAX_DYN_DIMS} dynamic dims are supported, the graph uses {}",
                all_dims.len()
            )));
        }
        let names = DimNames(all_dims.into_iter().collect());
        let mut kernels = crate::lower::lower(&graph, &order, &names, threads)?;
        for k in &mut kernels {
            if let KernelKind::Matmul(m) = &mut k.kind {
                let output = graph.outputs.contains(&k.node);
                m.exact = match dots {
                    crate::QuantDots::F32 => true,
                    crate::QuantDots::Int8 | crate::QuantDots::Int8RefineOutputs => false,
                    crate::QuantDots::Int8ExceptOutputs => output,
                };
                if dots == crate::QuantDots::Int8RefineOutputs && output {
                    m.refine = crate::kernels::matmul::REFINE_TOP;
                }
            }
        }

        // Static memory plan: inputs own their buffers; each kernel output takes a free
        // buffer of its storage kind, and buffers return to the pool after their last read.
        // Outputs are never reused, so they stay readable after the run.
        let mut bufs: Vec<Storage> = vec![];
        let mut node_buf: HashMap<usize, usize> = HashMap::new();
        let mut inputs = vec![];
        for &id in &order {
            let node = graph.node(id);
            if let Op::Input { name } = &node.op {
                node_buf.insert(id.0 as usize, bufs.len());
                inputs.push(InputSlot {
                    node: id,
                    name: name.clone(),
                    buf: bufs.len(),
                    numel: names.compile(&node.shape.iter().product())?,
                    present: false,
                    weight_only: weight_only(&kernels, id.0 as usize),
                });
                bufs.push(Storage::empty(node.dtype));
            }
        }
        let mut last_read: HashMap<usize, usize> = HashMap::new();
        for (i, k) in kernels.iter().enumerate() {
            for &r in &k.reads {
                last_read.insert(r, i);
            }
        }
        let is_input = |n: usize| matches!(graph.node(NodeId(n as u32)).op, Op::Input { .. });
        let mut free: Vec<usize> = vec![];
        for (i, k) in kernels.iter().enumerate() {
            if let KernelKind::WriteSlice(w) = &k.kind {
                // Written in place: the result is the state input's own buffer.
                node_buf.insert(k.out, node_buf[&w.dest]);
                continue;
            }
            let kind = StorageKind::of(k.dtype);
            let slot = if graph.outputs.contains(&k.node) {
                None
            } else {
                free.iter().position(|&b| bufs[b].kind() == kind)
            };
            let buf = match slot {
                Some(p) => free.swap_remove(p),
                None => {
                    bufs.push(Storage::empty(k.dtype));
                    bufs.len() - 1
                }
            };
            node_buf.insert(k.out, buf);
            let mut reads = k.reads.clone();
            reads.sort_unstable();
            reads.dedup();
            for r in reads {
                if last_read.get(&r) == Some(&i)
                    && !is_input(r)
                    && !graph.outputs.contains(&NodeId(r as u32))
                {
                    free.push(node_buf[&r]);
                }
            }
        }
        for k in &mut kernels {
            let map = |n: usize| node_buf[&n];
            k.out = map(k.out);
            k.reads.iter_mut().for_each(|r| *r = map(*r));
            match &mut k.kind {
                KernelKind::Elementwise(p) | KernelKind::Reduce { prog: p, .. } => {
                    p.leaves.iter_mut().for_each(|l| l.buf = map(l.buf))
                }
                KernelKind::Matmul(m) => {
                    m.a = map(m.a);
                    m.b = map(m.b);
                    if let Some(e) = &mut m.epilogue {
                        e.leaves.iter_mut().for_each(|l| l.buf = map(l.buf));
                    }
                }
                KernelKind::Fallback(f) => f.remap_bufs(&map),
                KernelKind::Direct(d) => d.remap_bufs(&map),
                KernelKind::Cast(c) => c.input = map(c.input),
                KernelKind::Dequant(d) => d.cast.input = map(d.cast.input),
                KernelKind::WriteSlice(w) => {
                    w.dest = map(w.dest);
                    w.src = map(w.src);
                }
                KernelKind::Rows(r) => r
                    .programs_mut()
                    .for_each(|p| p.leaves.iter_mut().for_each(|l| l.buf = map(l.buf))),
            }
        }
        let mut readable = HashMap::new();
        for (i, k) in kernels.iter().enumerate() {
            if graph.outputs.contains(&k.node) {
                readable.insert(k.node, (k.out, Some(i)));
            }
        }
        for s in &inputs {
            readable.insert(s.node, (s.buf, None));
        }
        let pool = crate::exec::par::Pool::new(threads)
            .map_err(|e| LuminalError::Backend(format!("thread pool: {e}")))?;
        let max_instrs = kernels
            .iter()
            .map(|k| match &k.kind {
                KernelKind::Elementwise(p) | KernelKind::Reduce { prog: p, .. } => p.instrs.len(),
                KernelKind::Matmul(m) => m.epilogue.as_ref().map_or(0, |p| p.instrs.len()),
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        pool.enter(|| {
            crate::exec::par::broadcast(|| crate::kernels::fused::reserve_scratch(max_instrs))
        });
        let pool = std::sync::Arc::new(pool);
        let n = kernels.len();
        Ok(CpuRuntime {
            graph,
            names,
            needed_dims,
            dims: HashMap::new(),
            dim_values: [0; MAX_DYN_DIMS + 1],
            kernels,
            kernel_len: vec![0; n],
            bufs,
            inputs,
            node_buf: readable,
            computed: false,
            pool,
            threads,
            profile: std::env::var("LUMINAL_PROFILE").is_ok_and(|v| v == "1"),
            timings: vec![Duration::ZERO; n],
            half_scratch: HalfScratch::default(),
            checked: Default::default(),
        })
    }

    /// The compiled graph (after the generic passes).
    pub fn graph(&self) -> &GraphData {
        &self.graph
    }
    /// Number of kernels launched per run.
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }
    /// Kernel names in launch order (e.g. `elementwise[Mul,Exp2]`, `matmul`).
    pub fn kernel_names(&self) -> Vec<String> {
        self.kernels.iter().map(|k| k.name.clone()).collect()
    }
    /// Number of distinct buffers of the static memory plan (inputs included).
    pub fn buffer_count(&self) -> usize {
        self.bufs.len()
    }
    /// Whether `t` passed the whole-input (`output: false`, `set`) or whole-output
    /// (`get_into`) check before.
    fn checked_handle(&self, t: TensorRef, output: bool) -> bool {
        let seen = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        seen.contains(&(t, output))
    }
    fn remember_handle(&self, t: TensorRef, output: bool) {
        let mut seen = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        seen.push((t, output));
    }

    /// Threads of the runtime's pool.
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// Turns per-kernel timing on or off (also on with `LUMINAL_PROFILE=1`).
    pub fn set_profile(&mut self, on: bool) {
        self.profile = on;
    }

    /// The per-kernel profile of the last run: name, time, bytes moved, FLOPs.
    pub fn profile(&self) -> String {
        crate::exec::profile::table(self)
    }

    pub(crate) fn profile_rows(&self) -> impl Iterator<Item = (&Kernel, Duration, usize)> {
        self.kernels
            .iter()
            .zip(&self.timings)
            .zip(&self.kernel_len)
            .map(|((k, &t), &n)| (k, t, n))
    }
    /// Bytes buffer `b` holds (as the kernels read it: f64-stored ints count 4 bytes).
    pub(crate) fn buf_bytes(&self, b: usize) -> usize {
        match &self.bufs[b] {
            Storage::Bytes(d) => d.as_slice().len(),
            Storage::F16(v) => 2 * v.len(),
            Storage::BF16(v) => 2 * v.len(),
            s => 4 * s.len(),
        }
    }

    fn numel(&self, e: &CompiledExpression) -> Result<usize> {
        Ok(eval(e, &self.dim_values)?.max(0) as usize)
    }

    /// Launches every kernel in order (inside the runtime's thread pool).
    fn execute(&mut self) -> Result<()> {
        let dims = self.dim_values;
        let profile = self.profile;
        for (i, k) in self.kernels.iter_mut().enumerate() {
            let start = profile.then(Instant::now);
            let n = eval(&k.numel, &dims)?.max(0) as usize;
            self.kernel_len[i] = n;
            self.bufs[k.out].ensure_len(n);
            let mut out = std::mem::replace(&mut self.bufs[k.out], Storage::F32(Vec::new()));
            let scratch = &mut self.half_scratch;
            let res = run_kernel(k, &self.bufs, &mut out, n, &dims, scratch);
            self.bufs[k.out] = out;
            res?;
            if let Some(s) = start {
                self.timings[i] = s.elapsed();
            }
        }
        Ok(())
    }
}

/// Whether every kernel reading node `input` (an input) reads it as a weight, in place.
fn weight_only(kernels: &[Kernel], input: usize) -> bool {
    let mut any = false;
    for k in kernels {
        for &r in k.reads.iter().filter(|&&r| r == input) {
            if k.weight_input() != Some(r) {
                return false;
            }
            any = true;
        }
    }
    any
}

fn run_kernel(
    k: &mut Kernel,
    bufs: &[Storage],
    out: &mut Storage,
    n: usize,
    dims: &DimValues,
    half_scratch: &mut HalfScratch,
) -> Result<()> {
    match &mut k.kind {
        KernelKind::Elementwise(p) => {
            p.prepare(dims, bufs)?;
            run_elementwise(p, bufs, out, n);
        }
        KernelKind::Reduce {
            op,
            prog,
            len,
            inner,
        } => {
            prog.prepare(dims, bufs)?;
            let len = eval(len, dims)?.max(0) as usize;
            let inner = (eval(inner, dims)?.max(0) as usize).max(1);
            let shape = ReduceShape {
                outer: n / inner,
                len,
                inner,
            };
            match out {
                Storage::F32(o) => run_reduce(*op, prog, bufs, o, shape),
                _ => crate::kernels::half::run_half_reduce(
                    *op,
                    prog,
                    bufs,
                    out,
                    shape,
                    half_scratch,
                )?,
            }
        }
        KernelKind::Matmul(m) => {
            m.prepare(dims, bufs)?;
            m.run(bufs, out, half_scratch)?;
        }
        KernelKind::Cast(c) => {
            c.prepare(dims, bufs)?;
            c.run(bufs, out, n)?;
        }
        KernelKind::Fallback(f) => f.run(bufs, out, n, dims)?,
        KernelKind::Dequant(d) => {
            d.prepare(dims, bufs)?;
            d.run(bufs, out, n)?;
        }
        KernelKind::Direct(d) => d.run(bufs, out, n, dims)?,
        KernelKind::WriteSlice(w) => w.run(bufs, out, dims)?,
        KernelKind::Rows(r) => {
            r.prepare(dims, bufs)?;
            r.run(bufs, out, n, dims)?;
        }
    }
    Ok(())
}

impl Runtime for CpuRuntime {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        // An input the outputs do not need has no slot: accept and drop the data.
        if let Some(slot) = self.inputs.iter_mut().find(|s| s.node == node) {
            self.bufs[slot.buf] = Storage::from_host(data, slot.weight_only);
            slot.present = true;
        }
        Ok(())
    }

    fn set_dim(&mut self, name: &str, value: usize) {
        match self.dims.get_mut(name) {
            Some(v) => *v = value as i64,
            None => {
                self.dims.insert(name.to_string(), value as i64);
            }
        }
    }

    /// Copies `data` into the input's buffer when it already holds that element kind (no
    /// allocation once it has grown: the tokens of a decode step); otherwise as `set_data`.
    fn set<T: Element>(&mut self, tensor: impl Into<TensorRef>, data: &[T]) -> Result<()> {
        let tensor: TensorRef = tensor.into();
        // The symbolic whole-tensor check allocates: done once per handle.
        let node = if self.checked_handle(tensor, false) {
            let entry = self.graph.tensor_entry(tensor)?;
            self.graph
                .check_input_data(entry, T::DTYPE, data.len(), &self.dims)?;
            entry.node
        } else {
            let node = self
                .graph
                .check_input_as(tensor, T::DTYPE, data.len(), &self.dims)?;
            self.remember_handle(tensor, false);
            node
        };
        if let Some(slot) = self.inputs.iter_mut().find(|s| s.node == node) {
            if !self.bufs[slot.buf].write_from(data) {
                self.bufs[slot.buf] = Storage::from_host(T::to_host(data), slot.weight_only);
            }
            slot.present = true;
        }
        Ok(())
    }

    /// Copies an f32 output straight from its buffer (no allocation once `out` has grown).
    fn get_into<T: Element>(&self, tensor: impl Into<TensorRef>, out: &mut Vec<T>) -> Result<()> {
        let tensor: TensorRef = tensor.into();
        let entry = if self.checked_handle(tensor, true) {
            self.graph.tensor_entry(tensor)?
        } else {
            let entry = self.graph.check_output(tensor)?;
            self.remember_handle(tensor, true);
            entry
        };
        if let (Some(&(buf, Some(k))), true) = (self.node_buf.get(&entry.node), self.computed) {
            if let Storage::F32(v) = &self.bufs[buf] {
                if let Some(src) = crate::storage::as_elements::<T, _>(&v[..self.kernel_len[k]]) {
                    out.clear();
                    out.extend_from_slice(src);
                    return Ok(());
                }
            }
        }
        *out = self.get(tensor)?;
        Ok(())
    }

    fn run(&mut self) -> Result<()> {
        if let Some(d) = self
            .needed_dims
            .iter()
            .find(|d| !self.dims.contains_key(*d))
        {
            return Err(LuminalError::UnboundDim(d.clone()));
        }
        for (i, name) in self.names.0.iter().enumerate() {
            self.dim_values[i + 1] = self.dims.get(name).copied().unwrap_or(0);
        }
        for s in &self.inputs {
            if !s.present {
                return Err(LuminalError::MissingInput(s.name.clone()));
            }
            let n = self.numel(&s.numel)?;
            if self.bufs[s.buf].len() != n {
                return Err(LuminalError::WrongLength {
                    tensor: s.name.clone(),
                    expected: n,
                    got: self.bufs[s.buf].len(),
                });
            }
        }
        self.computed = false;
        // Kernels run on the caller; their loops fork onto the pool's spinning workers
        // (`par`), sequential for a one-thread runtime.
        let pool = std::sync::Arc::clone(&self.pool);
        pool.enter(|| self.execute())?;
        self.computed = true;
        if self.profile {
            eprintln!("{}", self.profile());
        }
        Ok(())
    }

    fn graph_data(&self) -> &GraphData {
        &self.graph
    }

    fn get_data(&self, tensor: impl Into<TensorRef>) -> Result<HostData> {
        let entry = self.graph.check_output(tensor)?;
        let not_computed = || LuminalError::NotComputed(entry.label.clone());
        let &(buf, kernel) = self.node_buf.get(&entry.node).ok_or_else(not_computed)?;
        let len = match kernel {
            Some(k) if self.computed => self.kernel_len[k],
            Some(_) => return Err(not_computed()),
            None => {
                let slot = self.inputs.iter().find(|s| s.node == entry.node);
                if !slot.is_some_and(|s| s.present) {
                    return Err(not_computed());
                }
                self.bufs[buf].len()
            }
        };
        Ok(self.bufs[buf].to_host(entry.dtype, len))
    }
}
