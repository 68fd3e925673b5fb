//! `CpuRuntime`: the kernels, the static buffer plan, and the `Runtime` API with the same
//! semantics (and typed errors) as the reference runtime.

use crate::kernel::HalfScratch;
use crate::kernel::{BufId, Kernel, RunCtx};
use crate::kernels::matmul::gemm_f32::Tiles;
use crate::storage::Storage;
use crate::view::{eval, DimNames, DimValues, MAX_DYN_DIMS};
use luminal::graph::{GraphData, NodeId, TensorRef};
use luminal::op::Op;
use luminal::passes::live_order;
use luminal::shape::CompiledExpression;
use luminal::{Element, HostData, LuminalError, Result, Runtime};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A live input: its node, name, buffer and element count.
struct InputSlot {
    node: NodeId,
    name: String,
    buf: BufId,
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
    node_buf: HashMap<NodeId, (BufId, Option<usize>)>,
    computed: bool,
    pool: std::sync::Arc<crate::exec::par::Pool>,
    threads: usize,
    profile: bool,
    /// Print the memory report after every run (`LUMINAL_MEMORY=1`).
    memory_log: bool,
    timings: Vec<Duration>,
    /// f32 scratch of the f16 / bf16 matmuls, shared by all of them.
    half_scratch: HalfScratch,
    /// Per-launch working memory shared by all kernels (`RunCtx::arena`).
    arena: Vec<f32>,
    /// Whether `run` was called before (the first one releases the compile's free heap).
    ran: bool,
    /// Handles that passed the (allocating, symbolic) whole-tensor check of `set` or
    /// `get_into`: an input stays an input, so later calls check only dtype and length.
    checked: std::sync::Mutex<Vec<(TensorRef, bool)>>,
}

impl CpuRuntime {
    pub(crate) fn new(
        graph: GraphData,
        threads: usize,
        dots: crate::QuantDots,
        disabled_rules: &[&str],
    ) -> Result<CpuRuntime> {
        let (order, needed_dims) = live_order(&graph);
        let all_dims = graph.dynamic_dims();
        if all_dims.len() > MAX_DYN_DIMS {
            return Err(LuminalError::Backend(format!(
                "at most {MAX_DYN_DIMS} dynamic dims are supported, the graph uses {}",
                all_dims.len()
            )));
        }
        let names = DimNames(all_dims.into_iter().collect());
        let mut kernels =
            crate::lower::lower(&graph, &order, &names, threads, dots, disabled_rules)?;
        let plan = crate::exec::memory::plan(&graph, &order, &mut kernels)?;
        let reads: Vec<Vec<BufId>> = kernels.iter().map(|k| k.reads()).collect();
        let mut inputs = vec![];
        for &(id, buf) in &plan.inputs {
            let node = graph.node(id);
            let Op::Input { name } = &node.op else {
                unreachable!("an input slot holds an input")
            };
            inputs.push(InputSlot {
                node: id,
                name: name.clone(),
                buf,
                numel: names.compile(&node.shape.iter().product())?,
                present: false,
                weight_only: weight_only(&kernels, &reads, buf),
            });
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
        let scratch: Vec<_> = kernels.iter().map(|k| k.kind.scratch()).collect();
        let max_instrs = scratch.iter().map(|s| s.instrs).max().unwrap_or(0);
        let gemm = scratch.iter().filter_map(|s| s.gemm).reduce(|a, b| Tiles {
            kc: a.kc.max(b.kc),
            mc: a.mc.max(b.mc),
        });
        pool.enter(|| {
            crate::exec::par::broadcast(|| {
                crate::kernels::fused::reserve_scratch(max_instrs);
                if let Some(tiles) = gemm {
                    crate::kernels::matmul::gemm_f32::reserve_scratch(tiles);
                }
            })
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
            bufs: plan.bufs,
            inputs,
            node_buf: readable,
            computed: false,
            pool,
            threads,
            profile: std::env::var("LUMINAL_PROFILE").is_ok_and(|v| v == "1"),
            memory_log: std::env::var("LUMINAL_MEMORY").is_ok_and(|v| v == "1"),
            timings: vec![Duration::ZERO; n],
            half_scratch: HalfScratch::default(),
            arena: Vec::new(),
            ran: false,
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
    /// Bytes held by the memory plan's buffers now (inputs included; buffers of dynamic
    /// size count as grown by the runs so far): what the plan costs, e.g. to measure what
    /// gradient checkpointing saves.
    pub fn buffer_bytes(&self) -> usize {
        self.bufs
            .iter()
            .map(|b| {
                let elem = match b {
                    Storage::F32(_) => 4,
                    Storage::F16(_) | Storage::BF16(_) => 2,
                    Storage::F64(_) => 8,
                    Storage::Bytes(_) => 1,
                };
                b.len() * elem
            })
            .sum()
    }
    /// What the runtime's memory is made of now: the inputs (weights, caches: total and
    /// largest), the shared launch arena, then every working buffer of the memory plan by
    /// size, largest first, with the kernels whose results live in it. Buffers of dynamic
    /// size count as grown by the runs so far. `LUMINAL_MEMORY=1` prints it after every run.
    pub fn memory_report(&self) -> String {
        let mb = |b: usize| b as f64 / 1e6;
        let mut owners: Vec<Vec<&str>> = vec![vec![]; self.bufs.len()];
        for k in &self.kernels {
            if k.kind.in_place_of().is_none() {
                owners[k.out.idx()].push(&k.name);
            }
            if let Some(s) = k.side {
                owners[s.idx()].push(&k.name);
            }
        }
        let mut inputs: Vec<(usize, &str)> = self
            .inputs
            .iter()
            .map(|s| (self.buf_bytes(s.buf), s.name.as_str()))
            .collect();
        inputs.sort_unstable_by(|a, b| b.cmp(a));
        let input_bytes: usize = inputs.iter().map(|r| r.0).sum();
        let mut rows: Vec<(usize, usize)> = (0..self.bufs.len())
            .filter(|&b| !owners[b].is_empty())
            .map(|b| (self.buf_bytes(BufId(b as u32)), b))
            .collect();
        rows.sort_unstable_by(|a, b| b.cmp(a));
        let working: usize = rows.iter().map(|r| r.0).sum();
        let mut out = format!(
            "memory: {} inputs {:.1} MB (largest: {}), launch arena {:.1} MB, \
             {} working buffers {:.1} MB\n",
            inputs.len(),
            mb(input_bytes),
            inputs
                .iter()
                .take(2)
                .map(|(b, n)| format!("{n} {:.1} MB", mb(*b)))
                .collect::<Vec<_>>()
                .join(", "),
            mb(4 * self.arena.capacity()),
            rows.len(),
            mb(working),
        );
        for (bytes, b) in rows {
            let who = &owners[b];
            out += &format!(
                "{:>10.3} MB  buf {b:<4} {} value(s): {}{}\n",
                mb(bytes),
                who.len(),
                who[..who.len().min(3)].join(", "),
                if who.len() > 3 { ", …" } else { "" }
            );
        }
        out
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
        let rows = self
            .kernels
            .iter()
            .zip(&self.timings)
            .zip(&self.kernel_len)
            .map(|((k, &time), &n)| {
                let read: usize = k.reads().into_iter().map(|b| self.buf_bytes(b)).sum();
                crate::exec::profile::Row {
                    name: &k.name,
                    time,
                    bytes: k.dtype.bytes_for(n).unwrap_or(0) + read,
                    flops: k.kind.flops(n),
                }
            });
        crate::exec::profile::table(rows)
    }

    /// Bytes buffer `b` holds (as the kernels read it: f64-stored ints count 4 bytes).
    pub(crate) fn buf_bytes(&self, b: BufId) -> usize {
        match &self.bufs[b.idx()] {
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
        self.half_scratch.run += 1;
        for (i, k) in self.kernels.iter_mut().enumerate() {
            let start = profile.then(Instant::now);
            let n = eval(&k.numel, &dims)?.max(0) as usize;
            self.kernel_len[i] = n;
            let o = k.out.idx();
            self.bufs[o].ensure_len(n);
            let mut out = std::mem::replace(&mut self.bufs[o], Storage::F32(Vec::new()));
            let mut side = k.side.map(|s| {
                self.bufs[s.idx()].ensure_len(n);
                std::mem::replace(&mut self.bufs[s.idx()], Storage::F32(Vec::new()))
            });
            let cx = RunCtx {
                bufs: &self.bufs,
                n,
                dims: &dims,
                half_scratch: &mut self.half_scratch,
                arena: &mut self.arena,
                side: match &mut side {
                    Some(Storage::F32(v)) => Some(&mut v[..n]),
                    _ => None,
                },
            };
            let res = k.kind.run(cx, &mut out);
            self.bufs[o] = out;
            if let (Some(s), Some(data)) = (k.side, side) {
                self.bufs[s.idx()] = data;
            }
            res?;
            if let Some(s) = start {
                self.timings[i] = s.elapsed();
            }
        }
        Ok(())
    }
}

/// Whether every kernel reading buffer `input` (an input's) reads it as a weight, in place
/// (`reads[i]`: what kernel `i` reads).
fn weight_only(kernels: &[Kernel], reads: &[Vec<BufId>], input: BufId) -> bool {
    let mut any = false;
    for (k, rs) in kernels.iter().zip(reads) {
        for &r in rs.iter().filter(|&&r| r == input) {
            if k.kind.weight_input() != Some(r) {
                return false;
            }
            any = true;
        }
    }
    any
}

impl Runtime for CpuRuntime {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        // An input the outputs do not need has no slot: accept and drop the data.
        if let Some(slot) = self.inputs.iter_mut().find(|s| s.node == node) {
            self.bufs[slot.buf.idx()] = Storage::from_host(data, slot.weight_only);
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
            if !self.bufs[slot.buf.idx()].write_from(data) {
                self.bufs[slot.buf.idx()] = Storage::from_host(T::to_host(data), slot.weight_only);
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
            if let Storage::F32(v) = &self.bufs[buf.idx()] {
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
            if self.bufs[s.buf.idx()].len() != n {
                return Err(LuminalError::WrongLength {
                    tensor: s.name.clone(),
                    expected: n,
                    got: self.bufs[s.buf.idx()].len(),
                });
            }
        }
        self.computed = false;
        if !self.ran {
            self.ran = true;
            // The caller's graph is usually gone by the first run: its freed heap goes
            // back before the run's buffers are allocated.
            luminal::release_free_heap();
        }
        // Kernels run on the caller; their loops fork onto the pool's spinning workers
        // (`par`), sequential for a one-thread runtime.
        let pool = std::sync::Arc::clone(&self.pool);
        pool.enter(|| self.execute())?;
        self.computed = true;
        if self.profile {
            eprintln!("{}", self.profile());
        }
        if self.memory_log {
            eprintln!("{}", self.memory_report());
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
                self.bufs[buf.idx()].len()
            }
        };
        Ok(self.bufs[buf.idx()].to_host(entry.dtype, len))
    }
}
