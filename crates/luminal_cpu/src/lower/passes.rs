//! The passes around the lowering rules: shared producers computed inside their fused root
//! (before lowering), and over the lowered kernel list elementwise kernels as in-place
//! epilogues of a layer norm, the order of in-place state writes, and side outputs.

use super::*;

/// Fusable nodes with several consumers whose every read is an identity edge from inside
/// the same fused root: they are computed once inside that root's program instead of as a
/// kernel of their own (GELU's erf polynomial reads `t` eight times; before this, each such
/// node was a separate pass over memory). Returns node -> root.
pub(super) fn absorb_shared(lw: &Lowering<'_>, live_order: &[NodeId]) -> HashMap<NodeId, NodeId> {
    let g = lw.g;
    // Who reads what, as the lowering emits it: a `maximum` pair reads its two operands
    // through the re-viewed edges of [`pair_max`], and its private `Add` is never computed.
    let pair_adds: HashSet<NodeId> = lw
        .pair_max
        .keys()
        .map(|&m| g.node(m).inputs[0].node)
        .collect();
    let mut consumers: HashMap<NodeId, Vec<(NodeId, &Edge)>> = HashMap::new();
    for &id in live_order {
        if pair_adds.contains(&id) {
            continue;
        }
        let edges = match lw.pair_max.get(&id) {
            Some(pair) => &pair[..],
            None => &g.node(id).inputs[..],
        };
        for e in edges {
            consumers.entry(e.node).or_default().push((id, e));
        }
    }
    let mut absorbed: HashMap<NodeId, NodeId> = HashMap::new();
    // The kernel root each node's value is computed in (itself when it is a root).
    let mut root_of: HashMap<NodeId, NodeId> = HashMap::new();
    for &id in live_order.iter().rev() {
        let node = g.node(id);
        let cs = consumers.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let candidate = lw.fusable(id)
            && !matches!(node.op, Op::Constant { .. } | Op::Input { .. })
            && !g.outputs.contains(&id)
            && !pair_adds.contains(&id)
            && !(matches!(node.op, Op::Cast(_)) && HalfKind::of(node.dtype).is_some());
        let root = if candidate && cs.len() == 1 && flat_identity_edge(g, cs[0].1) {
            // Single-use: inlined into its consumer (the existing rule).
            root_of.get(&cs[0].0).copied()
        } else if candidate && cs.len() > 1 {
            let roots: Vec<Option<NodeId>> = cs
                .iter()
                .map(|(c, e)| {
                    let consumer_fused = lw.fusable(*c)
                        || matches!(g.node(*c).op, Op::Reduce { .. })
                            && g.node(*c).dtype.is_float();
                    (flat_identity_edge(g, e) && consumer_fused)
                        .then(|| root_of.get(c).copied())
                        .flatten()
                })
                .collect();
            match roots[0] {
                Some(r) if roots.iter().all(|x| *x == Some(r)) => {
                    absorbed.insert(id, r);
                    Some(r)
                }
                _ => None,
            }
        } else {
            None
        };
        root_of.insert(id, root.unwrap_or(id));
    }
    absorbed
}

/// Elementwise kernels of one kernel's result computed by that kernel as a side output
/// ([`Kernel::side`]), over each block of the result while it is in cache, instead of
/// reading it back afterwards, where the result has other readers (so it is not an
/// epilogue): a training step's GELU, whose input (the pre-activation) its gradient reads
/// too, a layer norm's weight and bias, whose input `x̂` the weight's gradient reads.
/// Products and layer norms take side outputs (`CpuKernel::add_side_output`). The
/// elementwise kernel must read the result through the identity view and otherwise only
/// values that exist unchanged by the time the producing kernel runs; its node must not be
/// a graph output.
pub(super) fn side_outputs(g: &GraphData, mut kernels: Vec<Kernel>) -> Vec<Kernel> {
    let producer: HashMap<BufId, usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| (k.out, i))
        .collect();
    let writes: Vec<Option<BufId>> = kernels.iter().map(|k| k.kind.in_place_of()).collect();
    let mut gone = vec![false; kernels.len()];
    for e in 0..kernels.len() {
        let ek = &kernels[e];
        if ek.dtype != DType::F32
            || ek.side.is_some()
            || writes[e].is_some()
            || g.outputs.contains(&ek.node)
        {
            continue;
        }
        let Some(crate::kernel::Fused::Elementwise(prog)) = ek.kind.fused() else {
            continue;
        };
        // The one leaf that reads a product's result.
        let mut found = None;
        for (l, leaf) in prog.leaves.iter().enumerate() {
            if let Some(&p) = producer.get(&leaf.buf) {
                let pk = &kernels[p];
                if pk.dtype == DType::F32
                    && pk.side.is_none()
                    && !gone[p]
                    && pk.kind.accepts_side_output()
                {
                    if found.is_some() {
                        found = None;
                        break;
                    }
                    found = Some((l, p));
                }
            }
        }
        let Some((l, p)) = found else { continue };
        let at = Site {
            g,
            kernels: &kernels,
            producer: &producer,
            writes: &writes,
        };
        let Some(side) = at.over_result(prog, e, l, p) else {
            continue;
        };
        let (name, out) = (ek.name.clone(), ek.out);
        if kernels[p].kind.add_side_output(side).is_ok() {
            let pk = &mut kernels[p];
            pk.side = Some(out);
            pk.name = format!("{}+side:{}", pk.name, name);
            gone[e] = true;
        }
    }
    kernels
        .into_iter()
        .zip(gone)
        .filter_map(|(k, gone)| (!gone).then_some(k))
        .collect()
}

/// What [`side_outputs`] and [`epilogues`] check before an elementwise kernel's program
/// becomes a program of its producer's result.
struct Site<'a> {
    g: &'a GraphData,
    kernels: &'a [Kernel],
    producer: &'a HashMap<BufId, usize>,
    writes: &'a [Option<BufId>],
}

impl Site<'_> {
    /// Elementwise kernel `e`'s program `prog` over the result of kernel `p`, which its
    /// leaf `l` reads: where that leaf reads the result through the identity view (and is
    /// the only leaf reading it), and every other leaf holds its value by the time `p` runs
    /// and keeps it until `e`.
    fn over_result(&self, prog: &Program, e: usize, l: usize, p: usize) -> Option<Program> {
        let numel =
            |k: usize| -> Expression { self.g.node(self.kernels[k].node).shape.iter().product() };
        let leaf = &prog.leaves[l];
        let p_numel = numel(p);
        let identity = leaf.exprs.view.is_contiguous()
            && leaf.exprs.view.n_elements() == p_numel
            && numel(e) == p_numel;
        let ready = prog
            .leaves
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != l)
            .all(|(_, x)| {
                self.producer.get(&x.buf).is_none_or(|&q| q < p)
                    && !self.writes[p..=e].contains(&Some(x.buf))
            });
        let once = prog.leaves.iter().filter(|x| x.buf == leaf.buf).count() == 1;
        (identity && ready && once).then(|| prog.over_result_of(l))
    }
}

/// Elementwise kernels run as epilogues of their producer, in place over its result while
/// it is in cache (`CpuKernel::add_epilogue`; a layer norm's affine weight and bias), where
/// nothing else reads that result: the producer then computes the elementwise kernel's
/// node into its buffer, and the elementwise kernel is gone. The conditions of
/// [`side_outputs`] on the elementwise kernel, except that it may be a graph output (its
/// node moves to the producer), plus: the producer's result has no other reader and is not
/// a graph output. Each leaf that reads such a producer is tried in turn.
pub(super) fn epilogues(g: &GraphData, mut kernels: Vec<Kernel>) -> Vec<Kernel> {
    let producer: HashMap<BufId, usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| (k.out, i))
        .collect();
    let mut readers: HashMap<BufId, usize> = HashMap::new();
    for k in &kernels {
        let mut reads = k.reads();
        reads.sort_unstable();
        reads.dedup();
        for b in reads {
            *readers.entry(b).or_default() += 1;
        }
    }
    let writes: Vec<Option<BufId>> = kernels.iter().map(|k| k.kind.in_place_of()).collect();
    let mut gone = vec![false; kernels.len()];
    for e in 0..kernels.len() {
        let ek = &kernels[e];
        if ek.dtype != DType::F32 || ek.side.is_some() || writes[e].is_some() {
            continue;
        }
        let Some(crate::kernel::Fused::Elementwise(prog)) = ek.kind.fused() else {
            continue;
        };
        // The leaves reading a producer whose result has no other reader.
        let candidates: Vec<(usize, usize)> = prog
            .leaves
            .iter()
            .enumerate()
            .filter_map(|(l, leaf)| {
                let &p = producer.get(&leaf.buf)?;
                let pk = &kernels[p];
                let only = readers.get(&pk.out) == Some(&1) && !g.outputs.contains(&pk.node);
                (only && pk.dtype == DType::F32 && pk.side.is_none() && !gone[p]).then_some((l, p))
            })
            .collect();
        // Each candidate's epilogue program, in leaf order.
        let at = Site {
            g,
            kernels: &kernels,
            producer: &producer,
            writes: &writes,
        };
        let attempts: Vec<_> = candidates
            .into_iter()
            .filter_map(|(l, p)| Some((p, at.over_result(prog, e, l, p)?)))
            .collect();
        let (name, out, node) = (ek.name.clone(), ek.out, ek.node);
        for (p, epi) in attempts {
            if kernels[p].kind.add_epilogue(epi).is_ok() {
                let pk = &mut kernels[p];
                let steps = name.strip_prefix("elementwise").unwrap_or(&name);
                pk.name = format!("{}+{}", pk.name, steps);
                (pk.out, pk.node) = (out, node);
                gone[e] = true;
                break;
            }
        }
    }
    kernels
        .into_iter()
        .zip(gone)
        .filter_map(|(k, gone)| (!gone).then_some(k))
        .collect()
}

/// Orders every in-place state write (`WriteSlice`) after the other kernels that read its
/// state input, which must see the value from before the run (an optimizer reads a weight,
/// then writes its update over it). A stable topological sort of the launch list with
/// those extra edges; an error when a reader of the old value also depends on the new one.
pub(super) fn order_state_writes(kernels: Vec<Kernel>) -> Result<Vec<Kernel>> {
    let reads: Vec<Vec<BufId>> = kernels.iter().map(|k| k.reads()).collect();
    let writes: Vec<(usize, BufId)> = kernels
        .iter()
        .enumerate()
        .filter_map(|(i, k)| Some((i, k.kind.in_place_of()?)))
        .collect();
    // Extra edges: reader of a state input -> the write into it.
    let mut extra: Vec<(usize, usize)> = vec![];
    for &(w, dest) in &writes {
        for (r, rd) in reads.iter().enumerate() {
            if r != w && rd.contains(&dest) {
                extra.push((r, w));
            }
        }
    }
    if extra.iter().all(|&(r, w)| r < w) {
        return Ok(kernels);
    }
    let producer: HashMap<BufId, usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| (k.out, i))
        .collect();
    let n = kernels.len();
    let mut succ: Vec<Vec<usize>> = vec![vec![]; n];
    let mut indeg = vec![0usize; n];
    let mut edge = |a: usize, b: usize, succ: &mut Vec<Vec<usize>>| {
        succ[a].push(b);
        indeg[b] += 1;
    };
    for (i, rd) in reads.iter().enumerate() {
        for b in rd {
            if let Some(&p) = producer.get(b) {
                if p != i {
                    edge(p, i, &mut succ);
                }
            }
        }
    }
    for &(r, w) in &extra {
        edge(r, w, &mut succ);
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&i| indeg[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &j in &succ[i] {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                ready.push(std::cmp::Reverse(j));
            }
        }
    }
    if order.len() < n {
        let (w, dest) = writes
            .iter()
            .find(|&&(w, _)| indeg[w] > 0)
            .copied()
            .unwrap_or(writes[0]);
        return Err(luminal::LuminalError::Backend(format!(
            "WriteSlice #{}: state input #{} is read both before and after its update in \
             the same run; read the new value through the write's result only",
            kernels[w].node.0, dest.0
        )));
    }
    let mut slots: Vec<Option<Kernel>> = kernels.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().unwrap())
        .collect())
}
