//! Compiling a graph into a plan: the products, attentions, fused nodes, in-place state
//! writes and static steps found, the kernels generated and compiled once.

use super::{dim_bit, Executor, IdMap, NormProduct, PlanRuntime, Residual, Step};
use crate::attention;
use crate::codegen::{self, Kernel};
use crate::gemm::{self, GemmType, Side};
use luminal::graph::{GraphData, NodeId};
use luminal::op::Op;
use luminal::passes::live_order;
use luminal::{DType, LuminalError, Result};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The most weight elements (N·K) a weight may have for its decode product to run as a
/// CUDA-core skinny kernel by default, whatever its row length (`LUMINAL_CUDA_SKINNY`
/// overrides it; see also [`SKINNY_MAX_K`]; products that take the tensor-core kernel,
/// [`crate::codegen::skinny_mma_kernel`], have no bound by default). It holds for Q8_0/Q4_0/Q4_1 weights read in place too: above it
/// they go to cuBLAS through their f16 copy. On an H200 (benches/README.md) the skinny kernel
/// beat cuBLAS on a SmolLM2-shaped F16 model (every product ≤ 0.9M weights but `lm_head`: 403
/// vs 357 t/s) and lost on a Llama-3.2-1B-shaped one (≥ 1.05M weights each: 390 vs 456 t/s;
/// after the kernel's double-buffered loads, 492–549 vs 573); at the 1B model's FFN shapes,
/// blocks read in place ran 2.3× slower than cuBLAS on the f16 copy (Q8_0: 0.514 vs 0.219 ms
/// for 16 products).
pub const SKINNY_MAX_WEIGHTS: u64 = 1_000_000;

/// Rows of at most this many weights go to the skinny kernel whatever their number (a
/// SmolLM2-shaped model's `lm_head`, 49152 rows of 576: on an H200, 565 t/s with it skinny
/// against 504 through cuBLAS).
pub const SKINNY_MAX_K: i32 = 1024;

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
        let elide_copies = std::env::var("LUMINAL_CUDA_ELIDE").map_or(true, |v| v != "0");
        for (id, k) in generated {
            let Some((k, inputs)) = k else {
                // A constant shape's length is checked by `set_data` (no dims to change it).
                let fixed = graph
                    .node(id)
                    .shape
                    .iter()
                    .all(|d| d.as_constant().is_some());
                inputs_needed.push((id, fixed));
                continue;
            };
            let function = *by_source.entry(k.source.clone()).or_insert_with(|| {
                kernels.push(k.clone());
                kernels.len() - 1
            });
            // A plain copy of a computed node through an unmasked view: elided in runs where
            // the view is the identity.
            let elide = {
                let node = graph.node(id);
                let e = &node.inputs.first();
                match (&node.op, e) {
                    (Op::Contiguous, Some(e))
                        if inputs.as_slice() == [e.node]
                            && !in_place.contains(&id)
                            && !e.view.is_masked()
                            && graph.node(e.node).dtype == node.dtype
                            && !matches!(graph.node(e.node).op, Op::Input { .. })
                            && elide_copies =>
                    {
                        Some(super::ElideView::of(&e.view))
                    }
                    _ => None,
                }
            };
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
                norm_skip: None,
                causal_mask_of: None,
                residual_of: None,
                dims_at: dims_len,
                host_vars: 0,
                static_deps: None,
                cooperative: k.cooperative,
                elide,
                src_dims: match graph.node(id).op {
                    Op::WriteSlice { .. } => Some(graph.node(id).inputs[1].view.dims()),
                    Op::Reduce { .. } => Some(graph.node(id).inputs[0].view.dims()),
                    _ => None,
                },
                numel: graph
                    .node(id)
                    .shape
                    .iter()
                    .map(|d| d.as_constant().map(|v| v.max(0) as usize))
                    .product(),
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
        let mut watched: Vec<NodeId> = steps
            .iter()
            .flat_map(|s| s.static_deps.iter().flatten().copied())
            .chain(patterns.iter().filter_map(|p| match p.dequant? {
                Side::A => Some(p.a.node),
                Side::B => Some(p.b.node),
            }))
            .collect();
        watched.sort();
        watched.dedup();
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
            let cast = graph.node(p.dequant_cast.expect("set with dequant"));
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
        // Products with few activation rows (decode): one warp per weight row
        // ([`codegen::skinny_kernel`]), the f32 activations rounded in registers.
        // `LUMINAL_CUDA_SKINNY`: `0` none, `all`, or the most weight elements (N·K) of a
        // skinny product (larger ones go to cuBLAS); unset, the default bound or rows of at
        // most `SKINNY_MAX_K` (`skinny_max`: the bound and that row length, 0 for none).
        let skinny_max = match std::env::var("LUMINAL_CUDA_SKINNY").as_deref() {
            Ok("0") | Ok("off") => (0, 0),
            Ok("all") => (u64::MAX, 0),
            Ok(v) => match v.parse() {
                Ok(n) => (n, 0),
                Err(_) => (SKINNY_MAX_WEIGHTS, SKINNY_MAX_K),
            },
            Err(_) => (SKINNY_MAX_WEIGHTS, SKINNY_MAX_K),
        };
        let skinny_on = skinny_max.0 > 0;
        let mut skinny_fn = vec![None; patterns.len()];
        for (i, p) in patterns.iter().enumerate() {
            let x = match p.round {
                Some((Side::A, t)) => Some((GemmType::F32, Some(t))),
                Some((Side::B, _)) => None,
                None => Some((p.a_type, None)),
            };
            let Some((x, round)) = x.filter(|_| skinny_on && p.dequant != Some(Side::A)) else {
                continue;
            };
            let k = codegen::skinny_kernel(
                p.b_type.dtype(),
                x.dtype(),
                round.map(|t| t.dtype()),
                p.c_type.dtype(),
            );
            skinny_fn[i] = Some(*by_source.entry(k.source.clone()).or_insert_with(|| {
                kernels.push(k);
                kernels.len() - 1
            }));
        }
        // The same products on tensor cores where the weight is f16/bf16 and the activations
        // are (rounded to) its type (`LUMINAL_CUDA_SKINNY_MMA=0`: none, for comparisons).
        let mut skinny_mma_fn = vec![None; patterns.len()];
        if exec.skinny_mma() {
            for (i, p) in patterns.iter().enumerate() {
                let w = p.b_type.dtype();
                let x = match p.round {
                    Some((Side::A, t)) if t.dtype() == w => DType::F32,
                    None if p.a_type.dtype() == w => w,
                    _ => continue,
                };
                if skinny_fn[i].is_none() {
                    continue;
                }
                if let Some(k) = codegen::skinny_mma_kernel(w, x, p.c_type.dtype()) {
                    skinny_mma_fn[i] =
                        Some(*by_source.entry(k.source.clone()).or_insert_with(|| {
                            kernels.push(k);
                            kernels.len() - 1
                        }));
                }
            }
        }
        // Of those, products whose activations are an RMSNorm of f32 rows: the kernel that
        // computes the norm as it stages them (`LUMINAL_CUDA_SKINNY_NORM=0`: none). A norm
        // all of whose readers are such products has no launch of its own in runs where they
        // take that path (its steps' `norm_skip`).
        let mut skinny_norm: Vec<Option<NormProduct>> = vec![None; patterns.len()];
        if std::env::var("LUMINAL_CUDA_SKINNY_NORM").as_deref() != Ok("0") {
            for (i, p) in patterns.iter().enumerate() {
                if skinny_mma_fn[i].is_none() || !matches!(p.round, Some((Side::A, _))) {
                    continue;
                }
                // The norm's input and weight must have buffers (not be fused into the norm).
                let Some(m) = luminal::patterns::RmsNormMatch::find(&graph, p.a.node).filter(|m| {
                    std::iter::once(&m.x)
                        .chain(&m.weight)
                        .all(|e| !fused.contains(&e.node))
                }) else {
                    continue;
                };
                let norm = codegen::SkinnyNorm {
                    weight: m.weight.is_some(),
                    scale: m.scale,
                    eps: m.eps,
                };
                let Some(k) =
                    codegen::skinny_mma_norm_kernel(p.b_type.dtype(), p.c_type.dtype(), norm)
                else {
                    continue;
                };
                let Some(len) = graph.node(p.a.node).shape.last().cloned() else {
                    continue;
                };
                let function = *by_source.entry(k.source.clone()).or_insert_with(|| {
                    kernels.push(k);
                    kernels.len() - 1
                });
                skinny_norm[i] = Some(NormProduct {
                    function,
                    norm,
                    x: m.x.node,
                    weight: m.weight.map(|e| e.node),
                    len,
                });
            }
        }
        // Each node's step, if it has one (steps are in launch order).
        let step_of: HashMap<NodeId, usize> = steps
            .iter()
            .enumerate()
            .map(|(s, st)| (st.node, s))
            .collect();
        mark_norm_steps(&mut steps, &step_of, &graph, &patterns, &skinny_norm);
        // Products whose only reader is a residual sum `product + r` (f32, both read one to
        // one, the sum and `r` with buffers of their own): the tensor-core kernels adding `r`
        // as they store (`LUMINAL_CUDA_SKINNY_RESIDUAL=0`: none).
        let mut skinny_residual: Vec<Option<Residual>> = vec![None; patterns.len()];
        if std::env::var("LUMINAL_CUDA_SKINNY_RESIDUAL").as_deref() != Ok("0") {
            let mut readers: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
            for &id in &order {
                for e in &graph.node(id).inputs {
                    readers.entry(e.node).or_default().push(id);
                }
            }
            for (i, p) in patterns.iter().enumerate() {
                if skinny_mma_fn[i].is_none() || p.c_type != GemmType::F32 {
                    continue;
                }
                let out = p.reduce;
                let Some([add]) = readers.get(&out).map(|r| r.as_slice()) else {
                    continue;
                };
                let a = graph.node(*add);
                let Some(r) = (match (&a.op, a.inputs.as_slice()) {
                    (Op::Binary(luminal::op::BinaryOp::Add), [e0, e1])
                        if a.dtype == DType::F32
                            && e0.node != e1.node
                            && luminal::patterns::flat_identity_edge(&graph, e0)
                            && luminal::patterns::flat_identity_edge(&graph, e1) =>
                    {
                        if e0.node == out {
                            Some(e1.node)
                        } else {
                            Some(e0.node)
                        }
                    }
                    _ => None,
                }) else {
                    continue;
                };
                // `r` must be ready when the product runs: an input, or a step before the
                // product's (a product summed with a later one, `x1·W1ᵀ + x2·W2ᵀ`, adds its
                // own result to the later one's instead); one product a sum.
                let r_ready = match (step_of.get(&r), step_of.get(&out)) {
                    (Some(rs), Some(ps)) => rs < ps,
                    (None, Some(_)) => matches!(graph.node(r).op, Op::Input { .. }),
                    _ => false,
                };
                let Some(&add_step) = step_of.get(add) else {
                    continue;
                };
                if graph.outputs.contains(&out)
                    || fused.contains(add)
                    || fused.contains(&r)
                    || !r_ready
                    || graph.node(r).dtype != DType::F32
                    || graph.node(r).shape != a.shape
                    || graph.node(out).shape != a.shape
                    || steps[add_step].residual_of.is_some()
                {
                    continue;
                }
                let mut compile = |k: Option<Kernel>| {
                    k.map(|k| {
                        *by_source.entry(k.source.clone()).or_insert_with(|| {
                            kernels.push(k);
                            kernels.len() - 1
                        })
                    })
                };
                let w = p.b_type.dtype();
                let x = if matches!(p.round, Some((Side::A, _))) {
                    DType::F32
                } else {
                    w
                };
                let function = compile(codegen::skinny_mma_residual_kernel(w, x, None));
                let norm_function = compile(skinny_norm[i].as_ref().and_then(|n| {
                    codegen::skinny_mma_residual_kernel(w, DType::F32, Some(n.norm))
                }));
                if function.is_none() || (skinny_norm[i].is_some() && norm_function.is_none()) {
                    continue;
                }
                skinny_residual[i] = Some(Residual {
                    r,
                    function,
                    norm_function,
                });
                steps[add_step].residual_of = Some(i);
            }
        }
        // An explicit `LUMINAL_CUDA_SKINNY` bounds the tensor-core kernel's products too.
        let skinny_mma_max = match std::env::var("LUMINAL_CUDA_SKINNY") {
            Ok(_) => skinny_max.0,
            Err(_) => u64::MAX,
        };
        // Products over a Q8_0/Q4_0/Q4_1 or K-quant weight: the skinny kernel reading its blocks
        // (`LUMINAL_CUDA_SKINNY_QUANT=0`: the f16 copy instead, for comparisons).
        let quant_in_place = std::env::var("LUMINAL_CUDA_SKINNY_QUANT").as_deref() != Ok("0");
        let mut skinny_quant_fn = vec![None; patterns.len()];
        for (i, p) in patterns.iter().enumerate() {
            if !skinny_on || !quant_in_place || p.dequant != Some(Side::B) {
                continue;
            }
            let q = graph.node(p.b.node).dtype;
            if let Some(k) = codegen::skinny_quant_kernel(q, p.c_type.dtype()) {
                skinny_quant_fn[i] =
                    Some(*by_source.entry(k.source.clone()).or_insert_with(|| {
                        kernels.push(k);
                        kernels.len() - 1
                    }));
            }
        }
        // Every tensor-core kernel (their launches take one grid rule).
        let skinny_mma_fns: Vec<usize> = {
            let mut f: Vec<usize> = skinny_mma_fn
                .iter()
                .flatten()
                .copied()
                .chain(skinny_norm.iter().flatten().map(|n| n.function))
                .chain(
                    skinny_residual
                        .iter()
                        .flatten()
                        .flat_map(|r| r.function.into_iter().chain(r.norm_function)),
                )
                .collect();
            f.sort();
            f.dedup();
            f
        };
        let functions = exec.compile(&kernels.iter().collect::<Vec<_>>())?;
        let mut dim_names: Vec<String> = vec![];
        let mut dim_slots = vec![];
        for step in &steps {
            for (i, d) in step.dims.iter().enumerate() {
                let at = dim_names.iter().position(|n| n == d).unwrap_or_else(|| {
                    dim_names.push(d.clone());
                    dim_names.len() - 1
                });
                dim_slots.push((step.dims_at + i, at));
            }
        }
        // The dims host-side expressions read: products' and attentions' operand views,
        // and what each step's preparation evaluates; a run resolves and prepares again only
        // what reads a dim that changed ([`PlanRuntime::prepare_changed`]).
        let gemm_vars: Vec<BTreeSet<String>> = patterns
            .iter()
            .map(|p| {
                let mut vars = BTreeSet::new();
                for e in [&p.a, &p.b] {
                    for x in e.view.strides().iter().chain([&e.view.offset()]) {
                        vars.extend(x.variables());
                    }
                }
                for x in &p.dims {
                    vars.extend(x.variables());
                }
                vars
            })
            .collect();
        let attn_exprs: Vec<attention::AttnExprs> = attns
            .iter()
            .map(|p| attention::AttnExprs::of(p, &graph))
            .collect();
        // An attention resolved as an earlier one (the same views and types: another layer).
        let attn_twin: Vec<Option<usize>> = (0..attns.len())
            .map(|i| {
                (0..i).find(|&j| {
                    attention::resolves_alike(
                        (&attns[i], &attn_exprs[i]),
                        (&attns[j], &attn_exprs[j]),
                        &|n| graph.node(n).dtype,
                    )
                })
            })
            .collect();
        mark_causal_masks(&mut steps, &step_of, &graph, &attns, &attn_exprs);
        let attn_vars: Vec<BTreeSet<String>> = attn_exprs.iter().map(|x| x.variables()).collect();
        let step_vars: Vec<BTreeSet<String>> = steps
            .iter()
            .map(|s| step_vars(s, &graph, &patterns, &gemm_vars, &attn_vars))
            .collect();
        let host_dims: Vec<String> = step_vars
            .iter()
            .chain(&gemm_vars)
            .chain(&attn_vars)
            .flatten()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .cloned()
            .collect();
        let mask = |vars: &BTreeSet<String>| {
            vars.iter().fold(0, |m, v| {
                m | dim_bit(host_dims.iter().position(|d| d == v).expect("listed"))
            })
        };
        for (step, vars) in steps.iter_mut().zip(&step_vars) {
            step.host_vars = mask(vars);
        }
        let gemm_mask = gemm_vars.iter().map(mask).collect();
        let attn_mask = attn_vars.iter().map(mask).collect();
        let nsteps = steps.len();
        let graphs = exec.graphs_available()
            && std::env::var("LUMINAL_CUDA_GRAPHS").map_or(true, |v| v != "0");
        // The first product rounding the same operand to the same type (shared scratch).
        let round_owner: Vec<usize> = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let source = |q: &gemm::Pattern| {
                    q.round.map(|(side, t)| {
                        let e = match side {
                            Side::A => &q.a,
                            Side::B => &q.b,
                        };
                        (e.node, t)
                    })
                };
                patterns
                    .iter()
                    .position(|q| source(q).is_some() && source(q) == source(p))
                    .unwrap_or(i)
            })
            .collect();
        Ok(PlanRuntime {
            graph,
            exec,
            functions,
            steps,
            inputs_needed,
            needed_dims,
            buffers: IdMap::default(),
            error_buffer: None,
            dims: HashMap::new(),
            dim_list: vec![],
            dim_values: vec![],
            kernels,
            calls: vec![None; patterns.len()],
            gemm_mask,
            attn_mask,
            host_dims,
            resolved_dims: None,
            dim_names,
            dim_slots,
            patterns,
            attn_calls: vec![None; attns.len()],
            attn_exprs,
            attn_at: vec![None; attns.len()],
            attn_twin,
            attns,
            scratch: IdMap::default(),
            rounded: vec![false; round_owner.len()],
            round_owner,
            round_fn,
            skinny_fns: {
                let mut f: Vec<usize> = skinny_fn
                    .iter()
                    .chain(&skinny_quant_fn)
                    .flatten()
                    .copied()
                    .chain(skinny_mma_fns.iter().copied())
                    .collect();
                f.sort();
                f.dedup();
                f
            },
            skinny_mma_fns,
            skinny_fn,
            skinny_quant_fn,
            skinny_mma_fn,
            skinny_mma_max,
            skinny_norm,
            skinny_residual,
            skinny_max,
            skinny: 0,
            dequant_fn,
            dequant_at: IdMap::default(),
            attn_scratch: None,
            attn_table: None,
            attn_host: vec![],
            fused: fused.len(),
            launches: 0,
            launch_list: vec![],
            prepared: vec![],
            prepared_from: vec![0; nsteps + 1],
            fresh: vec![],
            epoch: 0,
            prepared_at: None,
            alias: IdMap::default(),
            pool: Default::default(),
            combine: std::env::var("LUMINAL_CUDA_COMBINE").map_or(true, |v| v != "0"),
            combos: HashMap::new(),
            ran: false,
            generation: 0,
            set_at: IdMap::default(),
            computed_at: vec![0; nsteps],
            watched,
            pending_static: vec![],
            pending_dequant: vec![],
            dequantized: 0,
            dims_table: None,
            dims_host: vec![0; dims_len],
            graphs,
            last_signature: vec![],
            captured: None,
            captured_last: false,
            table_bytes: vec![],
            error_zero: false,
            replays: 0,
            captures: 0,
            stats: std::env::var("LUMINAL_CUDA_STATS")
                .map_or(0, |v| v.parse().unwrap_or(if v.is_empty() { 0 } else { 1 })),
        })
    }
}

/// The dims whose values preparing `step` reads ([`PlanRuntime::prepare_step`]): those of its
/// shape, of its source view (a reduction's or `WriteSlice`'s), of an elided copy's view and
/// its source's shape (whose buffer length it compares), of a `WriteSlice`'s start, and of its
/// attention's or product's operand views (`attn_vars`, `gemm_vars`; their calls, which decide
/// whether the step runs) and operands' shapes (a dequantized weight's length, a rounded
/// operand's buffer length). A run where none of them changed prepares the step's launches as
/// the last run did.
fn step_vars(
    step: &Step,
    graph: &GraphData,
    patterns: &[gemm::Pattern],
    gemm_vars: &[BTreeSet<String>],
    attn_vars: &[BTreeSet<String>],
) -> BTreeSet<String> {
    let node = graph.node(step.node);
    let mut exprs: Vec<&luminal::Expression> = node.shape.iter().collect();
    exprs.extend(step.src_dims.iter().flatten());
    if let Some(view) = &step.elide {
        exprs.extend(view.dims.iter().chain(&view.strides).chain([&view.offset]));
        exprs.extend(&graph.node(node.inputs[0].node).shape);
    }
    if let Op::WriteSlice { start, .. } = &node.op {
        exprs.push(start);
    }
    let mut vars: BTreeSet<String> = BTreeSet::new();
    for p in step.gemm.iter().chain(&step.feeds) {
        for e in [&patterns[*p].a, &patterns[*p].b] {
            exprs.extend(&graph.node(e.node).shape);
        }
        vars.extend(gemm_vars[*p].iter().cloned());
    }
    for a in step.attn_out.iter().chain(&step.attn_inner) {
        vars.extend(attn_vars[*a].iter().cloned());
    }
    // Whether a norm's steps are skipped depends on its products' calls, a causal mask's on
    // its attentions'.
    for p in step.norm_skip.iter().flatten().chain(&step.residual_of) {
        vars.extend(gemm_vars[*p].iter().cloned());
    }
    for a in step.causal_mask_of.iter().flatten() {
        vars.extend(attn_vars[*a].iter().cloned());
    }
    for e in exprs {
        vars.extend(e.variables());
    }
    vars
}

/// Marks the step of each causal mask (an attention bias that `causal_limit` recognises) whose
/// every reader is inside the attentions it is the bias of and which is not a graph output:
/// skipped in runs where none of their calls reads it.
fn mark_causal_masks(
    steps: &mut [Step],
    step_of: &HashMap<NodeId, usize>,
    graph: &GraphData,
    attns: &[attention::AttnPattern],
    exprs: &[attention::AttnExprs],
) {
    let mut by_mask: std::collections::BTreeMap<NodeId, Vec<usize>> = Default::default();
    for (i, (p, x)) in attns.iter().zip(exprs).enumerate() {
        if let (Some(b), true) = (&p.bias, x.causal()) {
            by_mask.entry(b.node).or_default().push(i);
        }
    }
    for (mask, ps) in by_mask {
        let Some(&ms) = step_of.get(&mask) else {
            continue;
        };
        let inside = |s: &Step| s.attn_inner.is_some_and(|a| ps.contains(&a));
        let readers_inside = steps
            .iter()
            .filter(|s| s.inputs.contains(&mask))
            .all(inside);
        if readers_inside && !graph.outputs.contains(&mask) && steps[ms].attn_out.is_none() {
            steps[ms].causal_mask_of = Some(ps);
        }
    }
}

/// Marks the steps of each RMSNorm whose every reader is a product computing it in its
/// skinny kernel (`skinny_norm`): the norm's own step (read only by those products' `Mul`
/// steps, not a graph output) and, from there, every step read only by marked steps of the
/// same products (its sum of squares).
fn mark_norm_steps(
    steps: &mut [Step],
    step_of: &HashMap<NodeId, usize>,
    graph: &GraphData,
    patterns: &[gemm::Pattern],
    skinny_norm: &[Option<NormProduct>],
) {
    let mut readers: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for (s, step) in steps.iter().enumerate() {
        for &n in &step.inputs {
            readers.entry(n).or_default().push(s);
        }
    }
    let roots: BTreeSet<NodeId> = patterns
        .iter()
        .zip(skinny_norm)
        .filter(|(_, n)| n.is_some())
        .map(|(p, _)| p.a.node)
        .collect();
    for root in roots {
        let Some(&rs) = step_of.get(&root) else {
            continue;
        };
        if graph.outputs.contains(&root) {
            continue;
        }
        let mut products = vec![];
        let all_products = readers.get(&root).is_some_and(|rd| {
            rd.iter().all(|&r| {
                steps[r].feeds.is_some_and(|p| {
                    products.push(p);
                    skinny_norm[p].is_some() && patterns[p].a.node == root
                })
            })
        });
        if !all_products || products.is_empty() {
            continue;
        }
        products.sort();
        products.dedup();
        // The norm's input (which its kernels read) and its weight are never skipped; only
        // nodes on a path from the input to the norm are (its sum of squares).
        let Some(x) = products
            .iter()
            .find_map(|&p| skinny_norm[p].as_ref().map(|n| n.x))
        else {
            continue;
        };
        let inside = between(graph, x, root);
        let mut marked = vec![rs];
        steps[rs].norm_skip = Some(products.clone());
        // Steps read only by marked ones (the sum of squares), until none is added.
        loop {
            let next = steps.iter().enumerate().position(|(s, st)| {
                st.norm_skip.is_none()
                    && inside.contains(&st.node)
                    && !st.in_place
                    && st.gemm.is_none()
                    && st.attn_out.is_none()
                    && !graph.outputs.contains(&st.node)
                    && readers
                        .get(&st.node)
                        .is_some_and(|rd| rd.iter().all(|r| marked.contains(r)))
                    && marked.iter().any(|&m| steps[m].inputs.contains(&st.node))
                    && s != rs
            });
            let Some(s) = next else { break };
            steps[s].norm_skip = Some(products.clone());
            marked.push(s);
        }
    }
}

/// The nodes strictly between `from` and `to`: ancestors of `to` (not through `from`) that
/// have `from` as an ancestor.
fn between(graph: &GraphData, from: NodeId, to: NodeId) -> HashSet<NodeId> {
    // Ancestors of `to`, not expanding `from`.
    let mut ancestors: Vec<NodeId> = vec![];
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut stack = vec![to];
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || n == from {
            continue;
        }
        ancestors.push(n);
        stack.extend(graph.node(n).inputs.iter().map(|e| e.node));
    }
    // Which of them reach `from` (memoised, inputs first).
    let mut reaches: HashMap<NodeId, bool> = HashMap::new();
    fn reach(g: &GraphData, n: NodeId, from: NodeId, memo: &mut HashMap<NodeId, bool>) -> bool {
        if n == from {
            return true;
        }
        if let Some(&r) = memo.get(&n) {
            return r;
        }
        memo.insert(n, false);
        let r = g
            .node(n)
            .inputs
            .iter()
            .any(|e| reach(g, e.node, from, memo));
        memo.insert(n, r);
        r
    }
    ancestors
        .into_iter()
        .filter(|&n| n != to && reach(graph, n, from, &mut reaches))
        .collect()
}
