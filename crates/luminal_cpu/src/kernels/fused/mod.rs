//! Fused elementwise and reduction kernels: a tree of unary/binary primops evaluated by a
//! block interpreter. Each tree op is one tight, vectorised loop over a block of `BLOCK`
//! elements held in per-thread scratch registers (cache-resident), so a chain of any length
//! makes one pass over memory and allocates nothing per run.
//!
//! Before the first launch a program is compiled into [`Step`]s:
//! - values that are the same for every element of a block (constants, per-row reduce
//!   results of a row kernel, and ops of those) become *scalar* steps, computed once per
//!   block, and vector ops take them as broadcast operands;
//! - chains of elementwise ops on one running value fuse into one `Chain` pass, over
//!   register-held tiles (see [`Compiler`] and [`simd::chain`]);
//! - registers are reference-counted, so a long chain cycles through a few cache-resident
//!   blocks;
//! - a leaf whose block is a contiguous run of an f32 buffer is read in place (no copy);
//! - the root op writes straight into the output (large outputs: non-temporal stores).
//!
//! Evaluation and the kernel loops are compiled per instruction set (`simd::run`).

pub(crate) mod compile;
mod epilogue;
pub(crate) mod kernel;
mod reduce;
pub(crate) mod rows;

pub use epilogue::{epilogue_chunk, epilogue_into, epilogue_rows, run_epilogue, EpiStep};
pub use reduce::{run_reduce, ReduceShape};

use crate::kernels::fused::compile::{Compiler, Operand, Src, Step, DST, MAX_CHAIN};
use crate::simd::half::HalfKind;
use crate::simd::{self, reduce_identity, Acc, ChainOp, Task};
use crate::storage::Elem;
use crate::storage::{BufRef, Storage};
use crate::view::{eval, DimValues, ResolvedView, ViewExprs};
use luminal::op::{BinaryOp, ReduceOp, UnaryOp};
use luminal::shape::CompiledExpression;
use luminal::{DType, Result};
use std::cell::RefCell;

/// Elements per interpreter block: registers of all tree ops stay in L1/L2, and blocks are
/// long enough that the per-block dispatch is noise (measured: 4096 beat 1024 by ~20% on
/// streaming kernels).
pub const BLOCK: usize = 4096;

/// Rows at most this long are reduced whole, several at once (see `reduce_rows`).
const SHORT_ROWS: usize = 512;

/// Leaves beyond this index are always copied into a register (the per-block table of
/// in-place leaf reads lives on the stack).
const MAX_DIRECT_LEAVES: usize = 32;

/// One op of a fused tree, in post-order; operands index earlier instructions.
#[derive(Clone, Debug)]
pub enum Instr {
    /// Read leaf `i` through its view.
    Load(usize),
    /// Constant `i` of the program's constant table.
    Const(usize),
    Unary(UnaryOp, usize),
    /// A recognised function of one value (see [`simd::FnOp`]).
    Fn(simd::FnOp, usize),
    Binary(BinaryOp, usize, usize),
    /// `x != 0` as 0/1 (a cast to Bool).
    NotZero(usize),
    /// NaN-propagating maximum (`maximum`'s pair `MaxReduce`, lowered elementwise).
    Max(usize, usize),
    /// The same value (Contiguous, and casts that are exact in f32).
    Copy(usize),
    /// The value rounded to f16 / bf16 precision: what a half op (or a cast to a half type)
    /// stores, kept as f32 (see `halves.rs`).
    Round(HalfKind, usize),
    /// Row kernels: the current row's result of reduce stage `i` (same for the whole row).
    RowScalar(usize),
    /// Row kernels: the current row's values of row register `i` (an earlier stage).
    RowReg(usize),
}

/// A buffer read through a view.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub buf: crate::storage::BufId,
    pub exprs: ViewExprs,
    pub view: ResolvedView,
}

/// A constant: a number, or an expression over dynamic dims rounded to f32 at launch.
#[derive(Clone, Debug)]
pub enum ConstSrc {
    Value(f32),
    Expr(CompiledExpression),
    /// An expression's value rounded once to a half type (a half constant).
    HalfExpr(CompiledExpression, DType),
}

/// A fused tree over the logical index space of its root.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub instrs: Vec<Instr>,
    pub leaves: Vec<Leaf>,
    pub consts: Vec<ConstSrc>,
    const_values: Vec<f32>,
    /// Compiled form of `instrs` (built at the first `prepare`).
    steps: Vec<Step>,
    root: Option<Src>,
    n_regs: usize,
    n_slots: usize,
    /// The ops of the compiled program's `Chain` steps.
    chains: Vec<(ChainOp, Operand)>,
    /// The register each leaf is gathered into when it cannot be read in place.
    leaf_reg: Vec<u32>,
}

/// What a block's evaluation may read besides the program's own buffers: the row state of
/// a row kernel.
#[derive(Clone, Copy)]
pub struct RowEnv<'a> {
    /// Results of the row's reduce stages so far (indexed by `Instr::RowScalar`).
    pub scalars: &'a [f32],
    /// The row registers, `len` elements each (indexed by `Instr::RowReg`).
    pub regs: &'a [f32],
    pub len: usize,
    /// Logical index of the row's first element.
    pub base: usize,
}

impl<'a> RowEnv<'a> {
    pub const NONE: RowEnv<'static> = RowEnv {
        scalars: &[],
        regs: &[],
        len: 0,
        base: 0,
    };
}

thread_local! {
    /// Interpreter scratch (scalar slots, registers); grows to the largest
    /// program once, then is reused.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Scratch floats a program of `instrs` instructions may need (registers <= instrs).
fn scratch_len(instrs: usize) -> usize {
    (instrs + 1) * BLOCK + instrs.next_multiple_of(16)
}

/// Grows the calling thread's interpreter scratch for programs of up to `instrs`
/// instructions. Called on every pool thread at compile time, so a thread that first helps
/// in a later run does not allocate then.
pub fn reserve_scratch(instrs: usize) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let need = scratch_len(instrs);
        if s.len() < need {
            s.resize(need, 0.0);
        }
    });
}

/// Per-thread working memory of one program: scalar slots and registers.
pub struct Regs<'s> {
    slots: &'s mut [f32],
    regs: &'s mut [f32],
}

/// Runs `f` with per-thread scratch of `slots` scalar slots and `regs` registers.
pub fn with_scratch<R>(slots: usize, regs: usize, f: impl FnOnce(Regs<'_>) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let slots = slots.next_multiple_of(16);
        let need = slots + regs * BLOCK;
        if s.len() < need {
            s.resize(need, 0.0);
        }
        let (slots, regs) = s[..need].split_at_mut(slots);
        f(Regs { slots, regs })
    })
}

impl Program {
    /// Evaluates views and constants for the current dims, and checks the views against
    /// the buffers they read. Compiles the program on first use.
    pub fn prepare(&mut self, dims: &DimValues, bufs: &[Storage]) -> Result<()> {
        for leaf in &mut self.leaves {
            leaf.exprs.resolve(dims, &mut leaf.view)?;
            leaf.view.check_bounds(bufs[leaf.buf].len())?;
        }
        self.const_values.resize(self.consts.len(), 0.0);
        for (v, c) in self.const_values.iter_mut().zip(&self.consts) {
            *v = match c {
                ConstSrc::Value(x) => *x,
                ConstSrc::Expr(e) => eval(e, dims)? as f32,
                ConstSrc::HalfExpr(e, dt) => dt.round(eval(e, dims)? as f64) as f32,
            };
        }
        if self.root.is_none() {
            self.compile();
        }
        Ok(())
    }

    /// Arithmetic ops per element (for the profile).
    pub fn flops_per_element(&self) -> usize {
        self.instrs
            .iter()
            .filter(|i| matches!(i, Instr::Unary(..) | Instr::Binary(..) | Instr::Max(..)))
            .count()
    }

    /// Builds `steps` (see [`Compiler`]).
    fn compile(&mut self) {
        let c = Compiler::run(&self.instrs, self.leaves.len());
        self.steps = c.steps;
        self.root = Some(c.root);
        self.n_regs = c.n_regs as usize;
        self.n_slots = c.n_slots as usize;
        self.leaf_reg = c.leaf_reg;
        self.chains = c.chains;
    }

    /// Scalar slots and registers the compiled program uses.
    pub fn scratch_shape(&self) -> (usize, usize) {
        (self.n_slots, self.n_regs)
    }

    /// Element-ops per output element, for sizing parallel tasks ([`task_len`]): one per
    /// instruction and one per leaf read (a strided or broadcast read costs like an op).
    pub fn work_per_element(&self) -> usize {
        (self.instrs.len() + self.leaves.len()).max(1)
    }

    /// Runs `f` with per-thread scratch sized for this program.
    #[inline(always)]
    pub fn with_regs<R>(&self, f: impl FnOnce(Regs<'_>) -> R) -> R {
        with_scratch(self.n_slots, self.n_regs, f)
    }

    /// Prefetches what leaves read in place for logical elements `z0 .. z0 + n`.
    #[inline]
    pub fn prefetch(&self, bufs: &[Storage], z0: usize, n: usize) {
        for l in &self.leaves {
            if let (Storage::F32(v), Some(start)) = (&bufs[l.buf], l.view.direct_start(z0, n)) {
                if let Some(s) = v.get(start..start + n) {
                    simd::prefetch(s);
                }
            }
        }
    }

    /// Evaluates logical elements `z0 .. z0 + n` (`n <= BLOCK`). The root's values go to
    /// `dst` (returns `None`), or, when the root is a value already in memory (a leaf read
    /// in place, a row register, a register), that slice is returned and `dst` is untouched.
    /// A scalar root is broadcast into `dst`.
    ///
    /// Compiled once per instruction set (not inlined into every kernel loop).
    #[inline]
    pub fn eval<'a>(
        &'a self,
        bufs: &'a [Storage],
        row: RowEnv<'a>,
        z0: usize,
        n: usize,
        regs: &'a mut Regs<'_>,
        dst: &mut [f32],
    ) -> Option<&'a [f32]> {
        simd::run(EvalTask {
            prog: self,
            bufs,
            row,
            z0,
            n,
            regs,
            dst,
            sink: None,
        })
    }

    /// Like [`Program::eval`], but the block's values end in `out` (`n` elements), written
    /// with non-temporal stores as they are computed; `tmp` is a block of scratch.
    #[inline]
    pub fn eval_streamed(
        &self,
        bufs: &[Storage],
        row: RowEnv<'_>,
        z0: usize,
        regs: &mut Regs<'_>,
        tmp: &mut [f32],
        out: &mut [f32],
    ) {
        let n = out.len();
        simd::run(EvalTask {
            prog: self,
            bufs,
            row,
            z0,
            n,
            regs,
            dst: tmp,
            sink: Some(out),
        });
    }

    #[inline(always)]
    fn eval_impl<'a, const F: bool>(
        &self,
        bufs: &'a [Storage],
        row: RowEnv<'a>,
        z0: usize,
        n: usize,
        regs: &'a mut Regs<'_>,
        dst: &mut [f32],
        mut sink: Option<&mut [f32]>,
    ) -> Option<&'a [f32]> {
        let dst = &mut dst[..n];
        let mut direct = [usize::MAX; MAX_DIRECT_LEAVES];
        let slots = &mut *regs.slots;
        let rg = &mut *regs.regs;
        let last = self.steps.len().wrapping_sub(1);
        // Only the AVX2 chain tiles stream (see `simd::chain`).
        let streams = sink.is_some() && crate::simd::half::fast();
        for (s, step) in self.steps.iter().enumerate() {
            if let Step::Load { leaf, reg } = *step {
                let l = &self.leaves[leaf as usize];
                let buf = bufs[l.buf].as_ref();
                if let (BufRef::F32(_), Some(start), true) = (
                    buf,
                    l.view.direct_start(z0, n),
                    (leaf as usize) < MAX_DIRECT_LEAVES,
                ) {
                    direct[leaf as usize] = start;
                } else {
                    let r = reg as usize * BLOCK;
                    l.view.load(buf, z0, &mut rg[r..r + n]);
                }
            } else if !self.scalar_step::<F>(step, slots, &row) {
                // The root chain streams straight into the sink.
                let sink = match (*step, &mut sink) {
                    (Step::Chain { out: DST, .. }, Some(out)) if s == last && streams => {
                        Some(&mut **out)
                    }
                    _ => None,
                };
                let streamed = sink.is_some();
                self.vector_step::<F>(step, bufs, &row, &direct, slots, rg, dst, sink, z0, n);
                if streamed {
                    return None;
                }
            }
        }
        match self.root.expect("prepared") {
            Src::Scalar(s) => {
                dst.fill(slots[s as usize]);
                if let Some(out) = sink {
                    simd::stream_copy(out, dst);
                }
                None
            }
            Src::Reg(DST) => {
                if let Some(out) = sink {
                    simd::stream_copy(out, dst);
                }
                None
            }
            root => {
                let rg: &'a [f32] = &regs.regs[..];
                let ctx = Others {
                    lo: rg,
                    hi: &[],
                    out: u32::MAX - 1,
                };
                Some(ctx.get(self, bufs, &row, &direct, root, z0, n))
            }
        }
    }

    /// Runs `step` if it is a scalar step (true), else does nothing (false; loads are
    /// neither).
    #[inline(always)]
    fn scalar_step<const F: bool>(&self, step: &Step, slots: &mut [f32], row: &RowEnv<'_>) -> bool {
        match *step {
            Step::Const { c, slot } => slots[slot as usize] = self.const_values[c as usize],
            Step::RowScalar { stage, slot } => slots[slot as usize] = row.scalars[stage as usize],
            Step::SUnary { op, a, out } => {
                slots[out as usize] = simd::unary_one::<F>(op, slots[a as usize])
            }
            Step::SBinary { op, a, b, out } => {
                slots[out as usize] = simd::binary_one(op, slots[a as usize], slots[b as usize])
            }
            Step::SMax { a, b, out } => {
                slots[out as usize] = simd::max_one(slots[a as usize], slots[b as usize])
            }
            Step::SNotZero { a, out } => {
                slots[out as usize] = (slots[a as usize] != 0.0) as u8 as f32
            }
            Step::SFn { f, a, out } => {
                slots[out as usize] = simd::fn_one::<F>(f, slots[a as usize])
            }
            Step::SRound { kind, a, out } => {
                slots[out as usize] = crate::simd::half::round_one(kind, slots[a as usize])
            }
            _ => return false,
        }
        true
    }

    /// Runs `step` if it is a vector step, over elements `off .. off + len` of the block
    /// (which starts at logical element `z0`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn vector_step<const F: bool>(
        &self,
        step: &Step,
        bufs: &[Storage],
        row: &RowEnv<'_>,
        direct: &[usize; MAX_DIRECT_LEAVES],
        slots: &[f32],
        rg: &mut [f32],
        dst: &mut [f32],
        sink: Option<&mut [f32]>,
        z0: usize,
        n: usize,
    ) {
        match *step {
            Step::Round { kind, a, out } => {
                let (o, ctx) = split_out(rg, out, dst, n);
                let a = ctx.get(self, bufs, row, direct, a, z0, n);
                crate::simd::half::round_block(kind, a, o);
            }
            Step::Unary { op, a, out } => {
                let (o, ctx) = split_out(rg, out, dst, n);
                let a = ctx.get(self, bufs, row, direct, a, z0, n);
                simd::unary::<F>(op, a, o);
            }
            Step::NotZero { a, out } => {
                let (o, ctx) = split_out(rg, out, dst, n);
                let a = ctx.get(self, bufs, row, direct, a, z0, n);
                simd::not_zero(a, o);
            }
            Step::Chain { a, start, len, out } => {
                let (o, ctx) = split_out(rg, out, dst, n);
                let get = |x: Src| ctx.get(self, bufs, row, direct, x, z0, n);
                let ops = &self.chains[start as usize..(start + len) as usize];
                let mut resolved = [(ChainOp::NotZero, simd::Operand::None); MAX_CHAIN];
                for (r, &(op, b)) in resolved.iter_mut().zip(ops) {
                    let b = match b {
                        Operand::None => simd::Operand::None,
                        Operand::Slot(k) => simd::Operand::Scalar(slots[k as usize]),
                        Operand::Vector(x) => simd::Operand::Vector(get(x)),
                    };
                    *r = (op, b);
                }
                let ops = &resolved[..ops.len()];
                match sink {
                    Some(out) => simd::chain::<F>(get(a), ops, out, true),
                    None => simd::chain::<F>(get(a), ops, o, false),
                }
            }
            Step::Max { a, b, out } => {
                let (o, ctx) = split_out(rg, out, dst, n);
                match (a, b) {
                    (Src::Scalar(s), x) | (x, Src::Scalar(s)) => {
                        let x = ctx.get(self, bufs, row, direct, x, z0, n);
                        simd::max_scalar(x, slots[s as usize], o);
                    }
                    _ => {
                        let a = ctx.get(self, bufs, row, direct, a, z0, n);
                        let b = ctx.get(self, bufs, row, direct, b, z0, n);
                        simd::max(a, b, o);
                    }
                }
            }
            Step::Binary { op, a, b, out } => {
                let (o, ctx) = split_out(rg, out, dst, n);
                match (a, b) {
                    (Src::Scalar(s), x) | (x, Src::Scalar(s)) => {
                        let first = matches!(a, Src::Scalar(_));
                        let x = ctx.get(self, bufs, row, direct, x, z0, n);
                        simd::binary_scalar(op, x, slots[s as usize], first, o);
                    }
                    _ => {
                        let a = ctx.get(self, bufs, row, direct, a, z0, n);
                        let b = ctx.get(self, bufs, row, direct, b, z0, n);
                        simd::binary(op, a, b, o);
                    }
                }
            }
            _ => {}
        }
    }
}

/// [`Program::eval`] as a task, so its body is compiled per instruction set.
struct EvalTask<'a, 's, 'd> {
    prog: &'a Program,
    bufs: &'a [Storage],
    row: RowEnv<'a>,
    z0: usize,
    n: usize,
    regs: &'a mut Regs<'s>,
    dst: &'d mut [f32],
    /// Where the values finally go, with non-temporal stores (`dst` is then scratch).
    sink: Option<&'d mut [f32]>,
}

impl<'a> Task for EvalTask<'a, '_, '_> {
    type Output = Option<&'a [f32]>;
    #[inline(always)]
    fn run<const F: bool>(self) -> Self::Output {
        let EvalTask {
            prog,
            bufs,
            row,
            z0,
            n,
            regs,
            dst,
            sink,
        } = self;
        match sink {
            None => prog.eval_impl::<F>(bufs, row, z0, n, regs, dst, None),
            Some(out) => {
                if let Some(v) = prog.eval_impl::<F>(bufs, row, z0, n, regs, dst, Some(out)) {
                    simd::stream_copy(out, v);
                }
                None
            }
        }
    }
}

/// The registers other than a step's output.
struct Others<'r> {
    lo: &'r [f32],
    hi: &'r [f32],
    out: u32,
}

/// Splits the output block (a register, or `dst`) from the other registers.
#[inline(always)]
fn split_out<'r>(
    rg: &'r mut [f32],
    out: u32,
    dst: &'r mut [f32],
    n: usize,
) -> (&'r mut [f32], Others<'r>) {
    if out == DST {
        return (
            &mut dst[..n],
            Others {
                lo: rg,
                hi: &[],
                out,
            },
        );
    }
    let (lo, hi) = rg.split_at_mut(out as usize * BLOCK);
    let (o, hi) = hi.split_at_mut(BLOCK);
    (&mut o[..n], Others { lo, hi, out })
}

impl<'r> Others<'r> {
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    /// Source `s` for the block of `n` elements starting at logical `z0`.
    fn get<'x>(
        &self,
        prog: &Program,
        bufs: &'x [Storage],
        row: &RowEnv<'x>,
        direct: &[usize; MAX_DIRECT_LEAVES],
        s: Src,
        z0: usize,
        n: usize,
    ) -> &'x [f32]
    where
        'r: 'x,
    {
        let reg = |r: u32| -> &'x [f32] {
            let r = r as usize;
            let (regs, r) = if (r as u32) < self.out {
                (self.lo, r)
            } else {
                (self.hi, r - self.out as usize - 1)
            };
            &regs[r * BLOCK..r * BLOCK + n]
        };
        match s {
            Src::Reg(r) => reg(r),
            Src::Leaf(l) => {
                let d = direct.get(l as usize).copied().unwrap_or(usize::MAX);
                if d != usize::MAX {
                    match &bufs[prog.leaves[l as usize].buf] {
                        Storage::F32(v) => &v[d..d + n],
                        _ => unreachable!("direct leaves are f32"),
                    }
                } else {
                    reg(prog.leaf_reg[l as usize])
                }
            }
            Src::Row(i) => {
                let start = i as usize * row.len + (z0 - row.base);
                &row.regs[start..start + n]
            }
            Src::Scalar(_) => unreachable!("scalars are broadcast by the caller"),
        }
    }
}

/// How many output elements a parallel task should cover, so that each task does at least
/// ~64K element-ops and there are a few tasks per thread.
pub fn task_len(n_out: usize, work_per_out: usize) -> usize {
    let threads = crate::exec::par::threads();
    let min_outs = (65536 / work_per_out.max(1)).max(1);
    let per_task = n_out.div_ceil(threads * 4).max(1);
    per_task.max(min_outs)
}

/// One parallel task of an elementwise kernel: logical elements `z0 ..` into `out`.
struct ElementwiseTask<'a, 'o, 'r, 's> {
    prog: &'a Program,
    bufs: &'a [Storage],
    z0: usize,
    /// Write the output with non-temporal stores.
    stream: bool,
    out: OutChunk<'o>,
    regs: &'r mut Regs<'s>,
}

enum OutChunk<'o> {
    F32(&'o mut [f32]),
    F64(&'o mut [f64]),
    F16(&'o mut [half::f16]),
    BF16(&'o mut [half::bf16]),
}

impl Task for ElementwiseTask<'_, '_, '_, '_> {
    type Output = ();
    // Everything below is inlined into the per-ISA wrappers: no closures, plain loops.
    #[inline(always)]
    fn run<const F: bool>(self) {
        let ElementwiseTask {
            prog,
            bufs,
            z0,
            stream,
            out,
            regs,
        } = self;
        match out {
            OutChunk::F32(o) if stream => {
                let mut tmp = [0f32; BLOCK];
                let mut start = 0;
                while start < o.len() {
                    let n = BLOCK.min(o.len() - start);
                    prog.eval_streamed(
                        bufs,
                        RowEnv::NONE,
                        z0 + start,
                        regs,
                        &mut tmp,
                        &mut o[start..start + n],
                    );
                    start += n;
                }
                simd::store_fence();
            }
            OutChunk::F32(o) => {
                let mut start = 0;
                while start < o.len() {
                    let n = BLOCK.min(o.len() - start);

                    let dst = &mut o[start..start + n];
                    if let Some(v) = prog.eval(bufs, RowEnv::NONE, z0 + start, n, regs, dst) {
                        dst.copy_from_slice(v);
                    }
                    start += n;
                }
            }
            OutChunk::F64(o) => {
                let mut tmp = [0f32; BLOCK];
                let mut start = 0;
                while start < o.len() {
                    let n = BLOCK.min(o.len() - start);
                    let v = match prog.eval(bufs, RowEnv::NONE, z0 + start, n, regs, &mut tmp) {
                        Some(v) => v,
                        None => &tmp[..n],
                    };
                    for (d, &x) in o[start..start + n].iter_mut().zip(v) {
                        *d = x as f64;
                    }
                    start += n;
                }
            }
            OutChunk::F16(o) => narrow_blocks(prog, bufs, z0, o, regs),
            OutChunk::BF16(o) => narrow_blocks(prog, bufs, z0, o, regs),
        }
    }
}

/// Evaluates blocks of `prog` from logical element `z0` on and rounds them into `out` (a
/// half output: the root's value rounded once, or stored exactly when a half op already
/// rounded it).
#[inline(always)]
fn narrow_blocks<H: Elem>(
    prog: &Program,
    bufs: &[Storage],
    z0: usize,
    out: &mut [H],
    regs: &mut Regs<'_>,
) {
    let mut tmp = [0f32; BLOCK];
    let mut start = 0;
    while start < out.len() {
        let n = BLOCK.min(out.len() - start);
        let v = match prog.eval(bufs, RowEnv::NONE, z0 + start, n, regs, &mut tmp) {
            Some(v) => v,
            None => &tmp[..n],
        };
        H::narrow(v, &mut out[start..start + n]);
        start += n;
    }
}

/// One parallel task of an elementwise kernel per output type.
macro_rules! elementwise_tasks {
    ($prog:ident, $bufs:ident, $o:ident, $n:ident, $chunk:ident, $stream:expr, $variant:ident) => {
        crate::exec::par::for_each_chunk(&mut $o[..$n], $chunk, |t, c| {
            $prog.with_regs(|mut regs| {
                simd::run(ElementwiseTask {
                    prog: $prog,
                    bufs: $bufs,
                    z0: t * $chunk,
                    stream: $stream,
                    out: OutChunk::$variant(c),
                    regs: &mut regs,
                })
            })
        })
    };
}

/// A piece of an output that a program's values are stored into (see [`eval_into`]).
pub enum Dst<'o> {
    F32(&'o mut [f32]),
    F16(&'o mut [half::f16]),
    BF16(&'o mut [half::bf16]),
}

/// The program's values at logical elements `z0 .. z0 + out.len()` stored into `out` (a
/// half output rounded once), on the calling thread.
pub fn eval_into(prog: &Program, bufs: &[Storage], z0: usize, out: Dst<'_>) {
    let out = match out {
        Dst::F32(o) => OutChunk::F32(o),
        Dst::F16(o) => OutChunk::F16(o),
        Dst::BF16(o) => OutChunk::BF16(o),
    };
    prog.with_regs(|mut regs| {
        simd::run(ElementwiseTask {
            prog,
            bufs,
            z0,
            stream: false,
            out,
            regs: &mut regs,
        })
    })
}

/// The program's values at logical elements `0 .. out.len()` stored into `out`, in
/// parallel tasks of whole blocks.
pub fn eval_par(prog: &Program, bufs: &[Storage], out: &mut [f32]) {
    let chunk = task_len(out.len(), prog.work_per_element()).next_multiple_of(BLOCK);
    crate::exec::par::for_each_chunk(out, chunk, |t, c| {
        eval_into(prog, bufs, t * chunk, Dst::F32(c))
    });
}

/// An elementwise kernel: the program's root, stored to the node's buffer.
pub fn run_elementwise(prog: &Program, bufs: &[Storage], out: &mut Storage, n: usize) {
    let chunk = task_len(n, prog.work_per_element()).next_multiple_of(BLOCK);
    let stream = n * 4 >= simd::stream_threshold_bytes();
    match out {
        Storage::F32(o) => crate::exec::par::for_each_chunk(&mut o[..n], chunk, |t, c| {
            prog.with_regs(|mut regs| {
                simd::run(ElementwiseTask {
                    prog,
                    bufs,
                    z0: t * chunk,
                    stream,
                    out: OutChunk::F32(c),
                    regs: &mut regs,
                })
            })
        }),
        Storage::F64(o) => crate::exec::par::for_each_chunk(&mut o[..n], chunk, |t, c| {
            prog.with_regs(|mut regs| {
                simd::run(ElementwiseTask {
                    prog,
                    bufs,
                    z0: t * chunk,
                    stream: false,
                    out: OutChunk::F64(c),
                    regs: &mut regs,
                })
            })
        }),
        Storage::F16(o) => elementwise_tasks!(prog, bufs, o, n, chunk, false, F16),
        Storage::BF16(o) => elementwise_tasks!(prog, bufs, o, n, chunk, false, BF16),
        Storage::Bytes(_) => unreachable!("no kernel writes a weight buffer"),
    }
}
