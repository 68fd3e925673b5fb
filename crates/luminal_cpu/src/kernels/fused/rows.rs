//! Row fusion: a reduction over the last axis, fused with the kernels that feed it and
//! consume it, evaluated one row at a time while the row sits in L1/L2.
//!
//! Softmax lowers to four kernels — max-reduce, `exp(x - max)` (read twice, so
//! materialised), sum-reduce, normalise — that make six passes over memory. Each works on
//! rows of the same length `C` along the last axis, and the intermediate results are only
//! read by the others, by element (`exp`) or broadcast along the row (`max`, `sum`). This
//! pass merges such a group into one *row kernel*: per row, each member runs as a stage —
//! a reduce stage leaves one scalar, an elementwise stage fills a row register (`C` floats
//! of per-thread scratch) — and the last member writes the output. The intermediates never
//! reach memory: softmax, log_softmax, rms_norm and layer_norm read their input once and
//! write their output once.

use crate::kernel::{BufId, CpuKernel, Fused, Kernel, RunCtx, Scratch};
use crate::kernels::fused::{task_len, Instr, Program, RowEnv, BLOCK};
use crate::simd::{self, reduce_identity, Acc, Task};
use crate::storage::Storage;
use crate::view::{eval, DimNames, DimValues};
use luminal::graph::GraphData;
use luminal::op::{Op, ReduceOp};
use luminal::shape::CompiledExpression;
use luminal::{DType, Expression, LuminalError, Result, ShapeTracker};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// Most members of one row kernel (the per-row scalars live on the stack).
const MAX_STAGES: usize = 16;

/// Rows longer than this (when known at compile time) are not fused when a stage needs a
/// row register: `C` floats per register per thread would no longer stay in cache.
const MAX_STATIC_ROW: i64 = 1 << 16;

/// What a stage leaves behind for the later ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageKind {
    /// A reduction of the row: one scalar (`Instr::RowScalar(stage)`).
    Scalar(ReduceOp),
    /// The row's values in row register `i` (`Instr::RowReg(i)`).
    Row(usize),
    /// The kernel's output row.
    Out,
    /// The kernel's output: one reduced value per row.
    OutReduce(ReduceOp),
}

#[derive(Clone, Debug)]
pub struct RowStage {
    pub kind: StageKind,
    pub prog: Program,
}

/// A fused group of row-wise kernels.
#[derive(Debug)]
pub struct RowKernel {
    pub stages: Vec<RowStage>,
    /// Row length `C`.
    pub len: CompiledExpression,
    n_row_regs: usize,
    /// The stages for short rows, run over several rows at once (see [`Batched`]).
    batched: Batched,
    /// Scratch already reserved on every pool thread: (row floats, program instrs).
    reserved: (usize, usize),
    /// Rows and row length of the last run (for the profile).
    last_shape: (usize, usize),
}

/// The stages rewritten to run over a batch of short rows at once (a row of attention
/// scores is 64 floats; one evaluation per row and stage made the per-call dispatch the
/// cost). Each reduce stage's per-row results are expanded into a register of the batch's
/// length (the value repeated along its row), read where the per-row version reads the
/// scalar; row registers follow those. Same operations per element, same per-row
/// summation: results are identical to the row-at-a-time stages.
#[derive(Debug)]
struct Batched {
    progs: Vec<Program>,
    /// The expanded register of each reduce stage.
    scalar_reg: Vec<Option<usize>>,
    /// Registers: expanded scalars first, then the row registers.
    n_regs: usize,
    n_scalars: usize,
}

impl Batched {
    fn new(stages: &[RowStage], n_row_regs: usize) -> Batched {
        let mut scalar_reg = vec![None; stages.len()];
        let mut n_scalars = 0;
        for (s, st) in stages.iter().enumerate() {
            if let StageKind::Scalar(_) = st.kind {
                scalar_reg[s] = Some(n_scalars);
                n_scalars += 1;
            }
        }
        let progs = stages
            .iter()
            .map(|st| {
                let mut p = st.prog.clone();
                for ins in &mut p.instrs {
                    match *ins {
                        Instr::RowScalar(k) => {
                            *ins = Instr::RowReg(scalar_reg[k].expect("a scalar stage"))
                        }
                        Instr::RowReg(r) => *ins = Instr::RowReg(n_scalars + r),
                        _ => {}
                    }
                }
                p.root = None;
                p
            })
            .collect();
        Batched {
            progs,
            scalar_reg,
            n_regs: n_scalars + n_row_regs,
            n_scalars,
        }
    }
}

/// Rows at most this long run in batches ([`Batched`]).
const BATCH_ROW: usize = BLOCK / 2;

/// How a kernel walks rows: `rows` rows of `len` along the last axis.
struct RowShape {
    reduce: Option<ReduceOp>,
    rows: Expression,
    len: Expression,
}

fn product(d: &[Expression]) -> Expression {
    d.iter().product()
}

fn row_shape(g: &GraphData, k: &Kernel) -> Option<RowShape> {
    if k.dtype != DType::F32 {
        return None;
    }
    let node = g.node(k.node);
    match (k.kind.fused()?, &node.op) {
        (Fused::Reduce(..), Op::Reduce { op, axis }) => {
            let dims = node.inputs[0].view.dims();
            (*axis + 1 == dims.len()).then(|| RowShape {
                reduce: Some(*op),
                rows: product(&node.shape),
                len: dims[*axis].clone(),
            })
        }
        (Fused::Elementwise(_), _) => {
            let (last, lead) = node.shape.split_last()?;
            Some(RowShape {
                reduce: None,
                rows: product(lead),
                len: last.clone(),
            })
        }
        _ => None,
    }
}

fn is_one(e: &Expression) -> bool {
    e.as_constant() == Some(1)
}

/// The view reads element `z / len` of a buffer of `rows` elements (a per-row value
/// broadcast along the row): `[.., len]` with stride 0 last, row-major before.
fn reads_row_scalar(v: &ShapeTracker, rows: &Expression, len: &Expression) -> bool {
    let (dims, strides) = (v.dims(), v.strides());
    let Some((last, lead)) = dims.split_last() else {
        return false;
    };
    if v.is_masked() || !v.offset().is_zero() || last != len {
        return false;
    }
    if !(strides[dims.len() - 1].is_zero() || is_one(last)) || product(lead) != *rows {
        return false;
    }
    (0..lead.len()).all(|i| is_one(&lead[i]) || strides[i] == product(&lead[i + 1..]))
}

/// The view reads element `z` of a buffer of `n` elements.
fn reads_identity(v: &ShapeTracker, n: &Expression) -> bool {
    v.is_contiguous() && v.n_elements() == *n
}

fn program(k: &Kernel) -> &Program {
    match k.kind.fused() {
        Some(Fused::Elementwise(p) | Fused::Reduce(_, p)) => p,
        None => unreachable!("row members are elementwise or reduce kernels"),
    }
}

/// Merges row-wise groups (see the module docs) in a kernel list in launch order whose
/// buffers are still node indices.
pub fn fuse_rows(g: &GraphData, kernels: Vec<Kernel>, names: &DimNames) -> Result<Vec<Kernel>> {
    let shapes: Vec<Option<RowShape>> = kernels.iter().map(|k| row_shape(g, k)).collect();
    let producer: HashMap<BufId, usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| (k.out, i))
        .collect();
    let mut readers: HashMap<BufId, BTreeSet<usize>> = HashMap::new();
    for (i, k) in kernels.iter().enumerate() {
        for r in k.reads() {
            readers.entry(r).or_default().insert(i);
        }
    }
    let is_output = |k: &Kernel| g.outputs.contains(&k.node);
    let mut taken = vec![false; kernels.len()];
    let mut groups: Vec<Vec<usize>> = vec![];
    for root in (0..kernels.len()).rev() {
        let Some(rs) = &shapes[root] else { continue };
        if taken[root] {
            continue;
        }
        let mut members: BTreeSet<usize> = BTreeSet::from([root]);
        loop {
            let mut added = None;
            'search: for &m in &members {
                for leaf in &program(&kernels[m]).leaves {
                    let Some(&p) = producer.get(&leaf.buf) else {
                        continue;
                    };
                    if members.contains(&p) || taken[p] || is_output(&kernels[p]) {
                        continue;
                    }
                    let Some(ps) = &shapes[p] else { continue };
                    if ps.len != rs.len || ps.rows != rs.rows {
                        continue;
                    }
                    let buf = kernels[p].out;
                    if !readers[&buf].iter().all(|r| members.contains(r)) {
                        continue;
                    }
                    let n = &rs.rows * &rs.len;
                    let ok = readers[&buf].iter().all(|&r| {
                        program(&kernels[r])
                            .leaves
                            .iter()
                            .filter(|l| l.buf == buf)
                            .all(|l| match ps.reduce {
                                Some(_) => reads_row_scalar(&l.exprs.view, &rs.rows, &rs.len),
                                None => reads_identity(&l.exprs.view, &n),
                            })
                    });
                    if ok {
                        added = Some(p);
                        break 'search;
                    }
                }
            }
            match added {
                Some(p) if members.len() < MAX_STAGES => {
                    members.insert(p);
                }
                _ => break,
            }
        }
        let has_reduce = members
            .iter()
            .any(|&m| shapes[m].as_ref().unwrap().reduce.is_some());
        let has_row_reg = members
            .iter()
            .any(|&m| m != root && shapes[m].as_ref().unwrap().reduce.is_none());
        let too_long = rs.len.as_constant().is_some_and(|c| c > MAX_STATIC_ROW);
        if members.len() < 2 || !has_reduce || (has_row_reg && too_long) {
            continue;
        }
        for &m in &members {
            taken[m] = true;
        }
        groups.push(members.into_iter().collect());
    }
    if groups.is_empty() {
        return Ok(kernels);
    }
    // Build each group's kernel at its root's position; drop the other members.
    let mut group_of_root: HashMap<usize, Vec<usize>> = HashMap::new();
    for grp in groups {
        group_of_root.insert(*grp.last().unwrap(), grp);
    }
    let mut slots: Vec<Option<Kernel>> = kernels.into_iter().map(Some).collect();
    let mut out = vec![];
    for i in 0..slots.len() {
        if let Some(grp) = group_of_root.get(&i) {
            let members: Vec<Kernel> = grp.iter().map(|&m| slots[m].take().unwrap()).collect();
            let len = shapes[i].as_ref().unwrap().len.clone();
            out.push(build(members, &len, names)?);
        } else if !taken[i] {
            out.push(slots[i].take().unwrap());
        }
    }
    Ok(out)
}

/// One row kernel from its members (launch order; the last is the root).
fn build(members: Vec<Kernel>, len: &Expression, names: &DimNames) -> Result<Kernel> {
    let n = members.len();
    // What each internal buffer becomes.
    let mut internal: HashMap<BufId, Instr> = HashMap::new();
    let mut stages = vec![];
    let mut n_row_regs = 0;
    let mut parts = vec![];
    for (s, k) in members.iter().enumerate() {
        let root = s + 1 == n;
        let (mut prog, kind) = match k.kind.fused() {
            Some(Fused::Reduce(op, prog)) => (
                prog.clone(),
                if root {
                    StageKind::OutReduce(op)
                } else {
                    StageKind::Scalar(op)
                },
            ),
            Some(Fused::Elementwise(prog)) => (
                prog.clone(),
                if root {
                    StageKind::Out
                } else {
                    n_row_regs += 1;
                    StageKind::Row(n_row_regs - 1)
                },
            ),
            _ => unreachable!(),
        };
        // Loads of internal buffers become row scalars / row registers; the other leaves
        // are renumbered.
        let mut leaf_map = vec![usize::MAX; prog.leaves.len()];
        let mut leaves = vec![];
        for (l, leaf) in prog.leaves.iter().enumerate() {
            if !internal.contains_key(&leaf.buf) {
                leaf_map[l] = leaves.len();
                leaves.push(leaf.clone());
            }
        }
        let old_leaves = std::mem::take(&mut prog.leaves);
        for ins in &mut prog.instrs {
            if let Instr::Load(l) = *ins {
                *ins = match internal.get(&old_leaves[l].buf) {
                    Some(x) => x.clone(),
                    None => Instr::Load(leaf_map[l]),
                };
            }
        }
        prog.leaves = leaves;
        match kind {
            StageKind::Scalar(_) => {
                internal.insert(k.out, Instr::RowScalar(s));
            }
            StageKind::Row(r) => {
                internal.insert(k.out, Instr::RowReg(r));
            }
            _ => {}
        }
        parts.push(k.name.clone());
        stages.push(RowStage { kind, prog });
    }
    let root = members.last().unwrap();
    Ok(Kernel {
        name: format!("rows[{}]", parts.join("; ")),
        node: root.node,
        dtype: root.dtype,
        out: root.out,
        numel: root.numel.clone(),
        kind: Box::new(RowKernel {
            batched: Batched::new(&stages, n_row_regs),
            stages,
            len: names.compile(len)?,
            n_row_regs,
            reserved: (0, 0),
            last_shape: (0, 0),
        }),
        side: None,
    })
}

thread_local! {
    /// Row registers of the row kernels.
    static ROW_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn reserve_rows(n: usize) {
    ROW_SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < n {
            s.resize(n, 0.0);
        }
    });
}

impl RowKernel {
    pub fn programs_mut(&mut self) -> impl Iterator<Item = &mut Program> {
        self.stages.iter_mut().map(|s| &mut s.prog)
    }

    pub fn programs(&self) -> impl Iterator<Item = &Program> {
        self.stages.iter().map(|s| &s.prog)
    }

    /// Arithmetic ops of the last run (every stage passes every element of every row).
    pub fn flops(&self) -> usize {
        let (rows, c) = self.last_shape;
        self.stages
            .iter()
            .map(|s| {
                let reduce = matches!(s.kind, StageKind::Scalar(_) | StageKind::OutReduce(_));
                rows * c * (s.prog.flops_per_element() + reduce as usize)
            })
            .sum()
    }

    pub fn prepare(&mut self, dims: &DimValues, bufs: &[Storage]) -> Result<()> {
        let c = eval(&self.len, dims)?.max(0) as usize;
        if c <= BATCH_ROW {
            for p in &mut self.batched.progs {
                p.prepare(dims, bufs)?;
            }
        } else {
            for p in self.programs_mut() {
                p.prepare(dims, bufs)?;
            }
        }
        Ok(())
    }

    /// Runs the kernel: `n` output elements (rows × C, or rows for a reducing root).
    fn run_rows(
        &mut self,
        bufs: &[Storage],
        out: &mut Storage,
        n: usize,
        dims: &DimValues,
    ) -> Result<()> {
        let Storage::F32(out) = out else {
            return Err(LuminalError::Backend(
                "row kernel needs an f32 output".into(),
            ));
        };
        let c = eval(&self.len, dims)?.max(0) as usize;
        let last = *self.stages.last().map(|s| &s.kind).unwrap();
        let rows = match last {
            StageKind::OutReduce(_) => n,
            _ if c == 0 => 0,
            _ => n / c,
        };
        self.last_shape = (rows, c);
        if rows == 0 {
            return Ok(());
        }
        if c == 0 {
            if let StageKind::OutReduce(op) = last {
                out[..n].fill(reduce_identity(op));
            }
            return Ok(());
        }
        // Scratch on every pool thread, grown only when the dims grow (so later runs with
        // the same dims allocate nothing, whichever threads pick up the rows).
        let batch = c <= BATCH_ROW;
        let row_floats = if batch {
            self.batched.n_regs * BLOCK
        } else {
            self.n_row_regs * c
        };
        let need = (
            row_floats,
            self.programs().map(|p| p.instrs.len()).max().unwrap_or(0),
        );
        if need.0 > self.reserved.0 || need.1 > self.reserved.1 {
            // Doubling headroom: a row length that grows every run (attention over a
            // growing KV cache) re-reserves only logarithmically often.
            let grow = (
                need.0.max(self.reserved.0 * 2).max(1024),
                need.1.max(self.reserved.1),
            );
            crate::exec::par::broadcast(|| {
                reserve_rows(grow.0);
                crate::kernels::fused::reserve_scratch(grow.1);
            });
            self.reserved = grow;
        }
        // Scratch of the programs that run (the others are not compiled).
        let widest = |a: (usize, usize), p: &Program| {
            let b = p.scratch_shape();
            (a.0.max(b.0), a.1.max(b.1))
        };
        let (slots, regs) = if batch {
            self.batched.progs.iter().fold((0, 0), widest)
        } else {
            self.programs().fold((0, 0), widest)
        };
        let chunk = task_len(rows, c * self.stages.len());
        let per_row = if matches!(last, StageKind::OutReduce(_)) {
            1
        } else {
            c
        };
        let this = &*self;
        let stream = rows * per_row * 4 >= simd::stream_threshold_bytes();
        crate::exec::par::for_each_chunk(&mut out[..rows * per_row], chunk * per_row, |t, o| {
            ROW_SCRATCH.with(|rs| {
                let mut rs = rs.borrow_mut();
                if rs.len() < row_floats {
                    rs.resize(row_floats, 0.0);
                }
                crate::kernels::fused::with_scratch(slots, regs, |mut regs| {
                    simd::run(RowTask {
                        k: this,
                        bufs,
                        o0: t * chunk,
                        c,
                        out: o,
                        stream,
                        batch,
                        regs: &mut regs,
                        row_regs: &mut rs[..row_floats],
                    })
                })
            })
        });
        Ok(())
    }
}

struct RowTask<'a, 'r, 's> {
    k: &'a RowKernel,
    bufs: &'a [Storage],
    o0: usize,
    c: usize,
    out: &'a mut [f32],
    /// Write output rows with non-temporal stores.
    stream: bool,
    /// Run batches of rows through the [`Batched`] stages (rows of at most `BATCH_ROW`).
    batch: bool,
    regs: &'r mut crate::kernels::fused::Regs<'s>,
    row_regs: &'r mut [f32],
}

impl Task for RowTask<'_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let stream = self.stream;
        if self.batch {
            self.batches();
        } else {
            self.rows();
        }
        if stream {
            simd::store_fence();
        }
    }
}

/// Evaluates `prog` over logical elements `base .. base + dst.len()` into `dst`, a block at
/// a time.
#[inline(always)]
fn eval_into(
    prog: &Program,
    bufs: &[Storage],
    env: RowEnv<'_>,
    base: usize,
    regs: &mut crate::kernels::fused::Regs<'_>,
    dst: &mut [f32],
) {
    for (j, piece) in dst.chunks_mut(BLOCK).enumerate() {
        let n = piece.len();
        if let Some(v) = prog.eval(bufs, env, base + j * BLOCK, n, regs, piece) {
            piece.copy_from_slice(v);
        }
    }
}

/// [`eval_into`] for an output row: with non-temporal stores when `stream`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn eval_out(
    prog: &Program,
    bufs: &[Storage],
    env: RowEnv<'_>,
    base: usize,
    regs: &mut crate::kernels::fused::Regs<'_>,
    tmp: &mut [f32; BLOCK],
    dst: &mut [f32],
    stream: bool,
) {
    if !stream {
        return eval_into(prog, bufs, env, base, regs, dst);
    }
    for (j, piece) in dst.chunks_mut(BLOCK).enumerate() {
        prog.eval_streamed(bufs, env, base + j * BLOCK, regs, tmp, piece);
    }
}

impl RowTask<'_, '_, '_> {
    /// One row at a time, every stage in turn.
    #[inline(always)]
    fn rows(self) {
        let RowTask {
            k,
            bufs,
            o0,
            c,
            out,
            stream,
            regs,
            row_regs,
            ..
        } = self;
        let reducing = matches!(k.stages.last().unwrap().kind, StageKind::OutReduce(_));
        let rows = if reducing { out.len() } else { out.len() / c };
        let mut tmp = [0f32; BLOCK];
        for r in 0..rows {
            let base = (o0 + r) * c;
            let mut scalars = [0f32; MAX_STAGES];
            let ns = k.stages.len();
            for (s, st) in k.stages.iter().enumerate() {
                // The first stage reads the row from memory, the others from cache: fetch a
                // share of the next row's first-stage inputs during each stage, so memory
                // stays busy while the row computes (measured ~10% on softmax / rms_norm;
                // prefetching it all at once, or in the elementwise kernels, was slower).
                let (a, b) = (s * c / ns, (s + 1) * c / ns);
                k.stages[0].prog.prefetch(bufs, base + c + a, b - a);
                match st.kind {
                    StageKind::Scalar(op) | StageKind::OutReduce(op) => {
                        let env = RowEnv {
                            scalars: &scalars,
                            regs: row_regs,
                            len: c,
                            base,
                        };
                        let v = crate::with_reduce!(op, |MAX| {
                            let mut acc = Acc::<MAX>::new();
                            let mut c0 = 0;
                            while c0 < c {
                                let n = BLOCK.min(c - c0);
                                let v = match st.prog.eval(bufs, env, base + c0, n, regs, &mut tmp)
                                {
                                    Some(v) => v,
                                    None => &tmp[..n],
                                };
                                acc.add_slice(v);
                                c0 += n;
                            }
                            acc.finish()
                        });
                        if let StageKind::OutReduce(_) = st.kind {
                            out[r] = v;
                        } else {
                            scalars[s] = v;
                        }
                    }
                    StageKind::Row(i) => {
                        let (prev, cur) = row_regs.split_at_mut(i * c);
                        let env = RowEnv {
                            scalars: &scalars,
                            regs: prev,
                            len: c,
                            base,
                        };
                        eval_into(&st.prog, bufs, env, base, regs, &mut cur[..c]);
                    }
                    StageKind::Out => {
                        let env = RowEnv {
                            scalars: &scalars,
                            regs: row_regs,
                            len: c,
                            base,
                        };
                        let dst = &mut out[r * c..(r + 1) * c];
                        eval_out(&st.prog, bufs, env, base, regs, &mut tmp, dst, stream);
                    }
                }
            }
        }
    }

    /// Batches of short rows through the [`Batched`] stages: each stage evaluates a whole
    /// batch at once.
    #[inline(always)]
    fn batches(self) {
        let RowTask {
            k,
            bufs,
            o0,
            c,
            out,
            stream,
            regs,
            row_regs,
            ..
        } = self;
        let b = &k.batched;
        let reducing = matches!(k.stages.last().unwrap().kind, StageKind::OutReduce(_));
        let rows = if reducing { out.len() } else { out.len() / c };
        let per_batch = (BLOCK / c).max(1);
        let mut tmp = [0f32; BLOCK];
        // Per-row results of a reduce stage.
        let mut results = [0f32; BLOCK];
        let mut r0 = 0;
        while r0 < rows {
            let nb = per_batch.min(rows - r0);
            let len = nb * c;
            let base = (o0 + r0) * c;
            let ns = k.stages.len();
            for (s, (st, prog)) in k.stages.iter().zip(&b.progs).enumerate() {
                let (a, e) = (s * len / ns, (s + 1) * len / ns);
                b.progs[0].prefetch(bufs, base + len + a, e - a);
                match st.kind {
                    StageKind::Scalar(op) | StageKind::OutReduce(op) => {
                        let env = RowEnv {
                            scalars: &[],
                            regs: row_regs,
                            len,
                            base,
                        };
                        let v = match prog.eval(bufs, env, base, len, regs, &mut tmp) {
                            Some(v) => v,
                            None => &tmp[..len],
                        };
                        crate::with_reduce!(op, |MAX| simd::reduce_short_rows::<MAX>(
                            v,
                            c,
                            &mut results[..nb]
                        ));
                        match b.scalar_reg[s] {
                            None => out[r0..r0 + nb].copy_from_slice(&results[..nb]),
                            Some(i) => {
                                let reg = &mut row_regs[i * len..(i + 1) * len];
                                for (piece, &x) in reg.chunks_exact_mut(c).zip(&results[..nb]) {
                                    piece.fill(x);
                                }
                            }
                        }
                    }
                    StageKind::Row(i) => {
                        let (prev, cur) = row_regs.split_at_mut((b.n_scalars + i) * len);
                        let env = RowEnv {
                            scalars: &[],
                            regs: prev,
                            len,
                            base,
                        };
                        eval_into(prog, bufs, env, base, regs, &mut cur[..len]);
                    }
                    StageKind::Out => {
                        let env = RowEnv {
                            scalars: &[],
                            regs: row_regs,
                            len,
                            base,
                        };
                        let dst = &mut out[r0 * c..r0 * c + len];
                        eval_out(prog, bufs, env, base, regs, &mut tmp, dst, stream);
                    }
                }
            }
            r0 += nb;
        }
    }
}

impl CpuKernel for RowKernel {
    fn reads(&self) -> Vec<BufId> {
        self.programs().flat_map(|p| p.reads()).collect()
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.programs_mut().for_each(|p| p.remap(map));
        self.batched.progs.iter_mut().for_each(|p| p.remap(map));
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: self.programs().map(|p| p.instrs.len()).max().unwrap_or(0),
            ..Scratch::default()
        }
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.prepare(cx.dims, cx.bufs)?;
        self.run_rows(cx.bufs, out, cx.n, cx.dims)
    }
    fn flops(&self, _n: usize) -> usize {
        self.flops()
    }
}
