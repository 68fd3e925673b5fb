//! Preparing a run: each step's output buffer sized, its launches listed (kernels, cuBLAS
//! products with their rounded or dequantized operands, fused attention), in-place state
//! writes and static steps taken care of.

use super::launch::{BufRef, Launch};
use super::{size_of, Buffer, Executor, PlanRuntime};
use crate::codegen::{self, BLOCK};
use crate::gemm::{self, GemmCall, Side};
use luminal::graph::NodeId;
use luminal::op::Op;
use luminal::{LuminalError, Result};

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

/// Rows of a skinny launch's products (its scalars).
fn skinny_rows(scalars: &[i64]) -> i64 {
    (0..codegen::SKINNY_GROUPS)
        .map(|g| scalars[4 + 5 * g])
        .sum()
}

/// The blocks of a skinny launch: `split` warps (its last scalar) per weight row of its
/// products, at most [`codegen::SKINNY_MAX_BLOCKS`] blocks (the kernel's blocks stride over
/// the rest, as evenly as the count allows) unless `LUMINAL_CUDA_SKINNY_PERSIST=0`.
fn skinny_grid(scalars: &[i64], mma: bool) -> u32 {
    if mma {
        let rows: [i64; codegen::SKINNY_GROUPS] = std::array::from_fn(|g| scalars[4 + 5 * g]);
        return codegen::skinny_mma_grid(&rows);
    }
    static CAP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let cap = *CAP.get_or_init(
        || match std::env::var("LUMINAL_CUDA_SKINNY_PERSIST").as_deref() {
            Ok("0") => u32::MAX,
            _ => codegen::SKINNY_MAX_BLOCKS,
        },
    );
    let split = scalars[4 + 5 * codegen::SKINNY_GROUPS];
    // The kernels combine a row's parts within a block (block-quantized ones take whole
    // rows: `push_skinny` and `merge_skinny` keep their split at 1).
    debug_assert!(
        split > 0 && (split as u32).is_power_of_two() && split as u32 <= codegen::SKINNY_WARPS,
        "skinny launch split {split}"
    );
    let blocks = ((skinny_rows(scalars) * split) as u32)
        .div_ceil(codegen::SKINNY_WARPS)
        .max(1);
    blocks.div_ceil(blocks.div_ceil(cap))
}

/// Merges skinny launches (of `skinny`, the plan's skinny kernels) over the same activations
/// into one launch of up to [`codegen::SKINNY_GROUPS`] products: a later launch (within a
/// few) joins an earlier one of the same kernel, activations and `M, K, ldb, ob` when no
/// launch between them writes its weight, activations or output (a layer's q, k, v
/// projections around q's RoPE; gate and up). The joined products then run where the
/// earlier one ran: their operands are ready there (the same activations; weights written
/// before) and nothing between reads their outputs (each node has its own buffer, read only
/// after the node).
pub(super) fn merge_skinny(launches: &mut Vec<Launch>, skinny: &[usize], mma: &[usize]) {
    const LOOK_AHEAD: usize = 8;
    let is_skinny = |l: &Launch| match l {
        Launch::Kernel { function, .. } => skinny.contains(function),
        _ => false,
    };
    // The buffers a launch writes, added to `to`.
    let written = |l: &Launch, to: &mut Vec<BufRef>| match l {
        Launch::Kernel {
            function, buffers, ..
        } if skinny.contains(function) => to.extend(&buffers[..codegen::SKINNY_GROUPS]),
        Launch::Kernel { buffers, .. } => to.push(buffers[0]),
        Launch::Gemm { c, .. } => to.push(*c),
        Launch::Attention { out, .. } => to.push(*out),
    };
    let x_at = 2 * codegen::SKINNY_GROUPS;
    let mut between: Vec<BufRef> = vec![];
    // Launches joined into an earlier one (dropped at the end: no shifting per join).
    let mut gone = vec![false; launches.len()];
    for i in 0..launches.len() {
        if gone[i] || !is_skinny(&launches[i]) {
            continue;
        }
        between.clear();
        let (mut j, mut seen) = (i + 1, 0);
        while j < launches.len() && seen < LOOK_AHEAD {
            if gone[j] {
                j += 1;
                continue;
            }
            seen += 1;
            let (
                Launch::Kernel {
                    function: fi,
                    buffers: bi,
                    scalars: si,
                    ..
                },
                Launch::Kernel {
                    function: fj,
                    buffers: bj,
                    scalars: sj,
                    ..
                },
            ) = (&launches[i], &launches[j])
            else {
                written(&launches[j], &mut between);
                j += 1;
                continue;
            };
            let used = (0..codegen::SKINNY_GROUPS)
                .take_while(|g| si[4 + 5 * g] > 0)
                .count();
            let joins = fi == fj
                && is_skinny(&launches[j])
                && bi[x_at..] == bj[x_at..]
                && si[..4] == sj[..4]
                && sj[9] == 0
                && used < codegen::SKINNY_GROUPS
                && [bj[0], bj[codegen::SKINNY_GROUPS]]
                    .iter()
                    .chain(&bj[x_at..])
                    .all(|b| !between.contains(b));
            if !joins {
                if used == codegen::SKINNY_GROUPS {
                    break;
                }
                written(&launches[j], &mut between);
                j += 1;
                continue;
            }
            let (out, w) = (bj[0], bj[codegen::SKINNY_GROUPS]);
            let mut slot = [0i64; 5];
            slot.copy_from_slice(&sj[4..9]);
            gone[j] = true;
            let Launch::Kernel {
                function,
                grid,
                buffers,
                scalars,
                ..
            } = &mut launches[i]
            else {
                unreachable!("matched above")
            };
            let on_tensor_cores = mma.contains(function);
            buffers[used] = out;
            buffers[codegen::SKINNY_GROUPS + used] = w;
            scalars[4 + 5 * used..9 + 5 * used].copy_from_slice(&slot);
            // More rows want no more warps a row (never more than the first had: 1 stays 1).
            // (The tensor-core kernel's last scalar is unused: 1 stays 1.)
            let split = codegen::skinny_split(skinny_rows(scalars), scalars[1]);
            let last = &mut scalars[4 + 5 * codegen::SKINNY_GROUPS];
            *last = (*last).min(split);
            *grid = skinny_grid(scalars, on_tensor_cores);
            j += 1;
        }
    }
    if gone.iter().any(|&g| g) {
        let mut at = 0;
        launches.retain(|_| {
            at += 1;
            !gone[at - 1]
        });
    }
}

impl<E: Executor> PlanRuntime<E> {
    /// Runs up to three consecutive independent launches of generated one-thread-per-element
    /// kernels as one ([`codegen::combined_kernel`], compiled the first time a combination is
    /// seen): none writes a buffer another of them reads or writes. Their blocks split the
    /// combined grid in order. Off with `LUMINAL_CUDA_COMBINE=0`.
    pub(super) fn combine_launches(&mut self, launches: &mut Vec<Launch>) -> Result<()> {
        let plain = |l: &Launch, kernels: &[codegen::Kernel]| match l {
            Launch::Kernel {
                function, block, ..
            } => {
                *block == BLOCK
                    && kernels
                        .get(*function)
                        .is_some_and(|k| !k.cooperative && k.scalars.is_none())
            }
            _ => false,
        };
        fn buffers_of(l: &Launch) -> &[BufRef] {
            match l {
                Launch::Kernel { buffers, .. } => buffers,
                _ => &[],
            }
        }
        // Launches are moved down over the joined ones (`w` ≤ `i`: the ones at and after `i`
        // are still in place).
        let (n, mut w, mut i) = (launches.len(), 0, 0);
        while i < n {
            let mut len = 1;
            if plain(&launches[i], &self.kernels) {
                while len < 3 {
                    let j = i + len;
                    if j >= n || !plain(&launches[j], &self.kernels) {
                        break;
                    }
                    let bj = buffers_of(&launches[j]);
                    let independent = (i..j).all(|g| {
                        let bg = buffers_of(&launches[g]);
                        !bj[1..].contains(&bg[0]) && !bg.contains(&bj[0])
                    });
                    if !independent {
                        break;
                    }
                    len += 1;
                }
            }
            let combo = if len > 1 {
                let mut fns = [0usize; 3];
                for (f, l) in fns.iter_mut().zip(&launches[i..i + len]) {
                    if let Launch::Kernel { function, .. } = l {
                        *f = *function;
                    }
                }
                self.combo_function(&fns[..len])?
            } else {
                None
            };
            if let Some(combo) = combo {
                // The first member's lists take the others' (whose lists go back to the pool).
                let mut bounds = [0i64; 2];
                let (head, rest) = launches[i..i + len].split_at_mut(1);
                let Launch::Kernel {
                    function,
                    grid,
                    buffers,
                    scalars,
                    ..
                } = &mut head[0]
                else {
                    unreachable!("plain kernels only")
                };
                bounds[0] = *grid as i64;
                for (m, l) in rest.iter_mut().enumerate() {
                    let Launch::Kernel {
                        grid: g,
                        buffers: b,
                        scalars: sc,
                        ..
                    } = l
                    else {
                        unreachable!("plain kernels only")
                    };
                    if m + 1 < bounds.len() {
                        bounds[m + 1] = *g as i64;
                    }
                    *grid = grid
                        .checked_add(*g)
                        .ok_or_else(|| LuminalError::Backend("combined grid too large".into()))?;
                    buffers.append(b);
                    scalars.append(sc);
                }
                scalars.extend_from_slice(&bounds[..len - 1]);
                *function = combo;
            }
            launches.swap(w, i);
            w += 1;
            i += len;
        }
        // What is left past `w`: joined launches (their lists emptied) and moved-from ones.
        let mut tail: Vec<Launch> = launches.drain(w..).collect();
        self.pool.recycle(&mut tail);
        Ok(())
    }

    /// The combined kernel of `fns` (compiled once; `None` where they cannot be combined).
    fn combo_function(&mut self, fns: &[usize]) -> Result<Option<usize>> {
        if let Some(&f) = self.combos.get(fns) {
            return Ok(f);
        }
        let members: Vec<&codegen::Kernel> = fns.iter().map(|&f| &self.kernels[f]).collect();
        let f = match codegen::combined_kernel(&members) {
            Some(k) => {
                let compiled = self.exec.compile(&[&k])?;
                self.functions.extend(compiled);
                self.kernels.push(k);
                Some(self.kernels.len() - 1)
            }
            None => None,
        };
        self.combos.insert(fns.to_vec(), f);
        Ok(f)
    }

    /// Lists every step's launches into `launches` (emptied first), from the state of a run's
    /// start, and keeps a copy of them by step (`prepared`) for [`Self::prepare_changed`].
    pub(super) fn prepare_all(&mut self, launches: &mut Vec<Launch>) -> Result<()> {
        // What a fast path that found a difference did is undone (its in-place writes' buffers
        // back to their states) and redone.
        self.return_state();
        self.pool.recycle(launches);
        self.pending_static.clear();
        self.pending_dequant.clear();
        self.alias.clear();
        self.rounded.iter_mut().for_each(|r| *r = false);
        self.skinny = 0;
        for s in 0..self.steps.len() {
            self.prepared_from[s] = launches.len();
            self.prepare_step(s, launches)?;
        }
        self.prepared_from[self.steps.len()] = launches.len();
        let mut prepared = std::mem::take(&mut self.prepared);
        self.pool.recycle(&mut prepared);
        prepared.extend(launches.iter().map(|l| self.pool.copy(l)));
        self.prepared = prepared;
        Ok(())
    }

    /// A run's fast path, when the last run's launches were prepared (by it or an earlier run)
    /// and issued, and nothing since moved a buffer or set an input a static step reads
    /// (`epoch`): prepares again only the steps whose preparation reads a dim in `changed`
    /// ([`super::Step::host_vars`]; a decode step's attentions and cache writes, where the
    /// position changed), against the last run's state (its elided copies, rounded operands),
    /// and compares their launches with the ones they had ([`Launch::same_work`]). Returns
    /// whether all are the same, with no buffer allocated and no static step run: then the
    /// last run's launches, their attention calls updated, are this run's (the rest of what
    /// changed, thread counts and attention calls, is in the tables the kernels read). Else
    /// the run is prepared in full ([`Self::prepare_all`] undoes what this did).
    pub(super) fn prepare_changed(&mut self, changed: u64) -> Result<bool> {
        let (epoch, skinny) = (self.epoch, self.skinny);
        let mut fresh = std::mem::take(&mut self.fresh);
        let mut same = true;
        for s in 0..self.steps.len() {
            let step = &self.steps[s];
            if step.host_vars & changed == 0 {
                if step.in_place {
                    // Its launch writes its state's buffer, as it did in the last run.
                    let dest = self.graph.node(step.node).inputs[0].node;
                    let Some(b) = self.buffers.remove(&dest) else {
                        same = false;
                        break;
                    };
                    self.buffers.insert(step.node, b);
                }
                continue;
            }
            let prepared = self.prepare_step(s, &mut fresh);
            let was = &self.prepared[self.prepared_from[s]..self.prepared_from[s + 1]];
            same = prepared.is_ok()
                && fresh.len() == was.len()
                && fresh.iter().zip(was).all(|(a, b)| a.same_work(b));
            // The calls' key counts and offsets (also in the table) for launches not replayed.
            for l in fresh.iter() {
                let Launch::Attention { slot, call, .. } = l else {
                    continue;
                };
                match self.attn_at[*slot].and_then(|i| self.launch_list.get_mut(i)) {
                    Some(Launch::Attention {
                        slot: listed,
                        call: c,
                        ..
                    }) if same && listed == slot => **c = **call,
                    _ => same = false,
                }
            }
            self.pool.recycle(&mut fresh);
            if !same {
                prepared?;
                break;
            }
        }
        self.fresh = fresh;
        self.skinny = skinny;
        Ok(same
            && self.epoch == epoch
            && self.pending_static.is_empty()
            && self.pending_dequant.is_empty())
    }

    /// Sizes step `s`'s output buffer (allocating or growing it) and appends its launches.
    pub(super) fn prepare_step(&mut self, s: usize, out: &mut Vec<Launch>) -> Result<()> {
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
        if step
            .norm_skip
            .as_ref()
            .is_some_and(|ps| ps.iter().all(|&p| self.norm_fits(p)))
        {
            // A norm that every reader computes in its product's kernel this run.
            return Ok(());
        }
        if step.causal_mask_of.as_ref().is_some_and(|ps| {
            ps.iter().all(|&p| {
                self.attn_calls[p].is_some_and(|mut c| {
                    self.exec.plan_attention(&mut c);
                    !self.exec.attention_reads_bias(&c)
                })
            })
        }) {
            // A causal mask that every attention reading it computes from the indices.
            return Ok(());
        }
        if let Some(pi) = step.residual_of.filter(|&p| self.takes_mma(p)) {
            // A residual sum its product's kernel computed: read from the product's buffer.
            let product = self.patterns[pi].reduce;
            self.alias.insert(step.node, product);
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
        let n = match step.numel {
            Some(n) => n,
            None => self.numel(&node.shape)?,
        };
        let bytes = n * size_of(node.dtype);
        if let Some(view) = &step.elide {
            // A copy whose source is already laid out as its output at this run's dims (a
            // decode step's attention output, [heads, 1, d] → [1, heads·d]): no launch, its
            // readers read the source's buffer.
            let src = self.resolved(node.inputs[0].node);
            if self.identity_at_dims(view, n)?
                && self.buffers.get(&src).is_some_and(|b| b.len == bytes)
            {
                self.alias.insert(step.node, src);
                return Ok(());
            }
        }
        if let Op::WriteSlice { axis, start } = &node.op {
            let len = self.eval(&step.src_dims.as_ref().expect("set for writes")[*axis])?;
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
            threads = self.numel(step.src_dims.as_ref().expect("set for writes"))?;
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
            self.epoch += 1;
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
            let r = |n: NodeId| self.alias.get(&n).copied().unwrap_or(n);
            let (q, k, v) = (r(p.q.node), r(p.k.node), r(p.v.node));
            // A causal mask the kernel computes is not read (and may have no buffer).
            let reads_bias = self.exec.attention_reads_bias(&call);
            let bias_node = p.bias.as_ref().filter(|_| reads_bias).map(|b| r(b.node));
            let bias = bias_node.map(BufRef::Node);
            for n in [q, k, v].into_iter().chain(bias_node) {
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
                let buf = self.alloc(capacity)?;
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
            self.epoch += 1;
            self.error_buffer = Some(self.exec.alloc(8)?);
        }
        // Threads per output: several on a GPU for long contiguous rows.
        let per_output = match &node.op {
            Op::Reduce { axis, .. } if step.cooperative && self.exec.cooperative_reductions() => {
                let dims = step.src_dims.as_ref().expect("set for reductions");
                let len = usize::try_from(self.eval(&dims[*axis])?).unwrap_or(0);
                threads_per_output(threads, len, self.numel(&dims[axis + 1..])?)
            }
            _ => 1,
        };
        let mut scalars = self.pool.scalars(&[]);
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
        let mut buffers = self.pool.buffers(&[BufRef::Node(id)]);
        buffers.extend(
            step.inputs
                .iter()
                .map(|&i| BufRef::Node(self.alias.get(&i).copied().unwrap_or(i))),
        );
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
    /// Moves the buffers that in-place `WriteSlice`s took for a run back to their state
    /// inputs (which then hold the updated tensors).
    pub(super) fn return_state(&mut self) {
        for step in self.steps.iter().filter(|s| s.in_place) {
            if let Some(b) = self.buffers.remove(&step.node) {
                let dest = self.graph.node(step.node).inputs[0].node;
                self.buffers.insert(dest, b);
            }
        }
    }

    /// The node whose buffer holds `id`'s value this run (a copy elided at these dims reads
    /// as its source).
    pub(super) fn resolved(&self, id: NodeId) -> NodeId {
        self.alias.get(&id).copied().unwrap_or(id)
    }

    /// Whether a view (`dims`, `strides`, `offset`; unmasked) reads `n` elements of its
    /// buffer in row-major order from its start at this run's dims.
    fn identity_at_dims(&self, view: &super::ElideView, n: usize) -> Result<bool> {
        if self.eval(&view.offset)? != 0 {
            return Ok(false);
        }
        let mut expect = 1i64;
        for (d, st) in view.dims.iter().zip(&view.strides).rev() {
            let d = self.eval(d)?;
            if d > 1 && self.eval(st)? != expect {
                return Ok(false);
            }
            expect *= d.max(1);
        }
        Ok(expect as usize == n)
    }

    /// Whether `call` may run as a skinny kernel ([`gemm::skinny`], with at most
    /// `LUMINAL_CUDA_SKINNY` weight elements; by default at most
    /// [`super::SKINNY_MAX_WEIGHTS`], or rows of at most [`super::SKINNY_MAX_K`]).
    fn skinny_fits(&self, c: &GemmCall) -> bool {
        let (max, max_k) = self.skinny_max;
        gemm::skinny(c) && ((c.m.max(0) as u64) * (c.k.max(0) as u64) <= max || c.k <= max_k)
    }

    /// Whether `call` may run on the tensor-core skinny kernel: a skinny call (with the
    /// other kernels' switch on) of at most `skinny_mma_max` weight elements whose rows
    /// [`codegen::skinny_mma_fits`].
    fn skinny_mma_fits(&self, c: &GemmCall) -> bool {
        gemm::skinny(c)
            && self.skinny_max.0 > 0
            && (c.m.max(0) as u64) * (c.k.max(0) as u64) <= self.skinny_mma_max
            && codegen::skinny_mma_fits(
                c.n as i64,
                c.k as i64,
                c.lda as i64,
                c.offset_a,
                c.ldb as i64,
                c.offset_b,
            )
    }

    /// The skinny kernel reading product `p`'s quantized weight in place this run, if it
    /// does: its rows whole blocks and small enough (`skinny_fits`; no f16 copy needed).
    fn quant_in_place(&self, p: usize) -> Option<usize> {
        let calls = self.calls[p].as_ref()?;
        // Rows of whole blocks of the weight's type (32 values, or 256 for K-quants).
        let b = self.graph.node(self.patterns[p].b.node).dtype.block_size() as i64;
        let whole_blocks =
            |c: &GemmCall| c.offset_a % b == 0 && c.lda as i64 % b == 0 && c.k as i64 % b == 0;
        self.skinny_quant_fn[p]
            .filter(|_| calls.iter().all(|c| self.skinny_fits(c) && whole_blocks(c)))
    }

    /// Whether product `p`'s calls this run are computed by its norm kernel
    /// (`skinny_norm`): not read in place as blocks, each fits the tensor-core kernel and
    /// reads whole rows of the norm (its `K` the norm's length, its rows starting at
    /// multiples of it).
    fn norm_fits(&self, p: usize) -> bool {
        let (Some(n), Some(calls)) = (&self.skinny_norm[p], &self.calls[p]) else {
            return false;
        };
        if self.quant_in_place(p).is_some() {
            return false;
        }
        let Ok(len) = self.eval(&n.len) else {
            return false;
        };
        len > 0
            && calls.iter().all(|c| {
                self.skinny_mma_fits(c)
                    && c.k as i64 == len
                    && (c.ldb as i64) % len == 0
                    && c.offset_b % len == 0
            })
    }

    /// Whether product `p` runs on a tensor-core skinny kernel this run (with its norm or
    /// not).
    fn takes_mma(&self, p: usize) -> bool {
        self.quant_in_place(p).is_none()
            && (self.norm_fits(p)
                || (self.skinny_mma_fn[p].is_some()
                    && self.calls[p]
                        .as_ref()
                        .is_some_and(|cs| cs.iter().all(|c| self.skinny_mma_fits(c)))))
    }

    /// Launches of skinny kernel `f` for product `pi`'s calls into `id`'s buffer, weight `w`,
    /// activations `x` (one product a launch; [`merge_skinny`] groups them); `split_rows`: rows
    /// shared between warps ([`codegen::skinny_split`]); `mma`: `f` is the tensor-core kernel.
    fn push_skinny(
        &mut self,
        (f, split_rows, mma): (usize, bool, bool),
        id: NodeId,
        w: BufRef,
        (x, extra): (BufRef, &[BufRef]),
        pi: usize,
        out: &mut Vec<Launch>,
    ) {
        for c in self.calls[pi].as_ref().expect("resolved") {
            let slot = [
                c.m as i64,
                c.lda as i64,
                c.ldc as i64,
                c.offset_a,
                c.offset_c,
            ];
            let mut scalars =
                self.pool
                    .scalars(&[c.n as i64, c.k as i64, c.ldb as i64, c.offset_b]);
            scalars.extend(slot);
            // The other products' slots: no rows.
            for _ in 1..codegen::SKINNY_GROUPS {
                scalars.push(0);
                scalars.extend(&slot[1..]);
            }
            scalars.push(if split_rows {
                codegen::skinny_split(c.m as i64, c.k as i64)
            } else {
                1
            });
            let c_buf = BufRef::Node(id);
            out.push(Launch::Kernel {
                function: f,
                grid: skinny_grid(&scalars, mma),
                block: 32 * codegen::SKINNY_WARPS,
                buffers: {
                    // The products' outputs and weights, the activations, then the extras.
                    let mut b = [c_buf, c_buf, c_buf, w, w, w, x, x, x];
                    b[7..7 + extra.len()].copy_from_slice(extra);
                    self.pool.buffers(&b[..7 + extra.len()])
                },
                scalars,
            });
            self.skinny += 1;
        }
    }

    /// Product `pi` into `id`'s buffer through [`Executor::gemm`], after rounding its f32
    /// operand to the half type where the pattern asks.
    pub(super) fn prepare_gemm(
        &mut self,
        id: NodeId,
        pi: usize,
        out: &mut Vec<Launch>,
    ) -> Result<()> {
        let p = &self.patterns[pi];
        if let Some(f) = self.quant_in_place(pi) {
            let (w, x) = (
                BufRef::Node(p.b.node),
                BufRef::Node(self.resolved(p.a.node)),
            );
            self.push_skinny((f, false, false), id, w, (x, &[]), pi, out);
            return Ok(());
        }
        if let Some(side) = p.dequant {
            // The weight's f16 copy, written when the weight was set since it last was.
            let w = match side {
                Side::A => p.a.node,
                Side::B => p.b.node,
            };
            let node = self.graph.node(w);
            let n = self.numel(&node.shape)?;
            let set = self.set_at.get(&w).copied().unwrap_or(0);
            let key = BufRef::Dequant(pi);
            let fresh = self.scratch.contains_key(&key)
                && self
                    .dequant_at
                    .get(&pi)
                    .is_some_and(|&at| at >= set && at > 0);
            if !fresh {
                if !self.scratch.contains_key(&key) {
                    let buf = self.alloc(2 * n)?;
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
                    buffers: self.pool.buffers(&[key, BufRef::Node(w)]),
                    scalars: self.pool.scalars(&[n as i64]),
                });
                self.pending_dequant.push(pi);
            }
        }
        // Few activation rows: a skinny kernel, the f32 activations (the rounding kernel's
        // input) rounded as they are staged. `a` holds the activations (the f32 source of a
        // rounded operand; a product whose `a` is the weight or is dequantized has no skinny
        // kernel). Tried in order: the tensor-core kernel computing the activations' norm
        // from the norm's input, the tensor-core kernel, the CUDA-core one (one warp a row).
        // A tensor-core kernel adds the product's residual sum as it stores, if it has one.
        let calls = self.calls[pi].as_ref().expect("resolved");
        let p = &self.patterns[pi];
        let residual = self.skinny_residual[pi].as_ref();
        let with_residual = |plain: usize, summing: Option<usize>| match (summing, residual) {
            (Some(f), Some(r)) => (f, Some(r.r)),
            _ => (plain, None),
        };
        // ((function, rows split between warps, tensor cores), activations, extra buffers).
        let chosen = if self.norm_fits(pi) {
            let n = self.skinny_norm[pi].as_ref().expect("norm_fits");
            let (f, r) = with_residual(n.function, residual.and_then(|r| r.norm_function));
            Some(((f, false, true), n.x, [n.weight, r]))
        } else if let Some(f) =
            self.skinny_mma_fn[pi].filter(|_| calls.iter().all(|c| self.skinny_mma_fits(c)))
        {
            let (f, r) = with_residual(f, residual.and_then(|r| r.function));
            Some(((f, false, true), p.a.node, [None, r]))
        } else {
            self.skinny_fn[pi]
                .filter(|_| calls.iter().all(|c| self.skinny_fits(c)))
                .map(|f| ((f, true, false), p.a.node, [None, None]))
        };
        if let Some((f, x, extra)) = chosen {
            let w = if p.dequant == Some(Side::B) {
                BufRef::Dequant(pi)
            } else {
                BufRef::Node(self.resolved(p.b.node))
            };
            let x = BufRef::Node(self.resolved(x));
            let mut bufs = [x; 2];
            let mut n = 0;
            for node in extra.into_iter().flatten() {
                bufs[n] = BufRef::Node(self.resolved(node));
                n += 1;
            }
            self.push_skinny(f, id, w, (x, &bufs[..n]), pi, out);
            return Ok(());
        }
        let p = &self.patterns[pi];
        // The rounded copy is shared by the products rounding the same operand to the same
        // type (a layer's q, k and v; gate and up): written by the first of them that runs.
        let owner = self.round_owner[pi];
        if let Some((side, t)) = p.round.filter(|_| !self.rounded[owner]) {
            let src = self.resolved(match side {
                Side::A => p.a.node,
                Side::B => p.b.node,
            });
            let n = self
                .buffers
                .get(&src)
                .ok_or_else(|| LuminalError::Backend(format!("node {} has no buffer", src.0)))?
                .len
                / 4;
            let bytes = n * t.size();
            let key = BufRef::Scratch(owner);
            if self.scratch.get(&key).is_none_or(|b| b.capacity < bytes) {
                let capacity = bytes.max(4);
                let buf = self.alloc(capacity)?;
                self.scratch.insert(
                    key,
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
                buffers: self.pool.buffers(&[key, BufRef::Node(src)]),
                scalars: self.pool.scalars(&[n as i64]),
            });
            self.rounded[owner] = true;
        }
        let p = &self.patterns[pi];
        let operand = |side: Side, e: &luminal::graph::Edge| {
            if p.round.is_some_and(|r| r.0 == side) {
                BufRef::Scratch(owner)
            } else if p.dequant == Some(side) {
                BufRef::Dequant(pi)
            } else {
                BufRef::Node(self.alias.get(&e.node).copied().unwrap_or(e.node))
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
}
