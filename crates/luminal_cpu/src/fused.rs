//! Fused elementwise and reduction kernels: a tree of unary/binary primops evaluated by a
//! block interpreter. Each tree op is one tight loop over a block of `BLOCK` elements held in
//! per-thread scratch registers (cache-resident), so a chain of any length makes one pass
//! over memory and allocates nothing per run.

use crate::storage::Storage;
use crate::view::{eval, DimValues, ResolvedView, ViewExprs};
use luminal::op::{BinaryOp, ReduceOp, UnaryOp};
use luminal::shape::CompiledExpression;
use luminal::Result;
use rayon::prelude::*;
use std::cell::RefCell;

/// Elements per interpreter block: registers of all tree ops stay in L1/L2.
pub const BLOCK: usize = 1024;

/// One op of a fused tree, in post-order; operands index earlier instructions.
#[derive(Clone, Debug)]
pub enum Instr {
    /// Read leaf `i` through its view.
    Load(usize),
    /// Constant `i` of the program's constant table.
    Const(usize),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// `x != 0` as 0/1 (a cast to Bool).
    NotZero(usize),
    /// The same value (Contiguous, and casts that are exact in f32).
    Copy(usize),
}

/// A buffer read through a view.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub buf: usize,
    pub exprs: ViewExprs,
    pub view: ResolvedView,
}

/// A constant: a number, or an expression over dynamic dims rounded to f32 at launch.
#[derive(Clone, Debug)]
pub enum ConstSrc {
    Value(f32),
    Expr(CompiledExpression),
}

/// A fused tree over the logical index space of its root.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub instrs: Vec<Instr>,
    pub leaves: Vec<Leaf>,
    pub consts: Vec<ConstSrc>,
    const_values: Vec<f32>,
}

thread_local! {
    /// Interpreter registers; grows to the largest program once, then is reused.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Grows the calling thread's interpreter registers to `instrs` blocks. Called on every
/// pool thread at compile time, so a thread that first helps in a later run does not
/// allocate then.
pub fn reserve_scratch(instrs: usize) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < instrs * BLOCK {
            s.resize(instrs * BLOCK, 0.0);
        }
    });
}

impl Program {
    /// Evaluates views and constants for the current dims, and checks the views against
    /// the buffers they read.
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
            };
        }
        Ok(())
    }

    /// Arithmetic ops per element (for the profile).
    pub fn flops_per_element(&self) -> usize {
        self.instrs
            .iter()
            .filter(|i| matches!(i, Instr::Unary(..) | Instr::Binary(..)))
            .count()
    }

    /// Runs `f` with the root's values for logical elements `z0 .. z0 + n` (`n <= BLOCK`).
    /// `regs` holds one block per instruction; constants are filled by `fill_consts`.
    fn eval_block<'r>(
        &self,
        bufs: &[Storage],
        z0: usize,
        n: usize,
        regs: &'r mut [f32],
    ) -> &'r [f32] {
        for (i, instr) in self.instrs.iter().enumerate() {
            let (prev, rest) = regs.split_at_mut(i * BLOCK);
            let out = &mut rest[..n];
            let reg = |j: usize| &prev[j * BLOCK..j * BLOCK + n];
            match *instr {
                Instr::Load(l) => {
                    let leaf = &self.leaves[l];
                    leaf.view.load(bufs[leaf.buf].as_ref(), z0, out);
                }
                Instr::Const(_) => {} // filled once per task
                Instr::Unary(op, a) => unary(op, reg(a), out),
                Instr::Binary(op, a, b) => binary(op, reg(a), reg(b), out),
                Instr::NotZero(a) => {
                    for (o, &x) in out.iter_mut().zip(reg(a)) {
                        *o = (x != 0.0) as u8 as f32;
                    }
                }
                Instr::Copy(a) => out.copy_from_slice(reg(a)),
            }
        }
        let last = self.instrs.len() - 1;
        &regs[last * BLOCK..last * BLOCK + n]
    }

    /// Runs `f(regs)` with per-thread scratch registers sized for this program, constants
    /// already filled in.
    fn with_regs<R>(&self, f: impl FnOnce(&mut [f32]) -> R) -> R {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let need = self.instrs.len() * BLOCK;
            if s.len() < need {
                s.resize(need, 0.0);
            }
            let regs = &mut s[..need];
            for (i, instr) in self.instrs.iter().enumerate() {
                if let Instr::Const(c) = *instr {
                    regs[i * BLOCK..(i + 1) * BLOCK].fill(self.const_values[c]);
                }
            }
            f(regs)
        })
    }
}

fn unary(op: UnaryOp, a: &[f32], out: &mut [f32]) {
    match op {
        UnaryOp::Exp2 => out.iter_mut().zip(a).for_each(|(o, &x)| *o = x.exp2()),
        UnaryOp::Log2 => out.iter_mut().zip(a).for_each(|(o, &x)| *o = x.log2()),
        UnaryOp::Sin => out.iter_mut().zip(a).for_each(|(o, &x)| *o = x.sin()),
        UnaryOp::Sqrt => out.iter_mut().zip(a).for_each(|(o, &x)| *o = x.sqrt()),
        UnaryOp::Recip => out.iter_mut().zip(a).for_each(|(o, &x)| *o = 1.0 / x),
    }
}

fn binary(op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    let it = out.iter_mut().zip(a.iter().zip(b));
    match op {
        BinaryOp::Add => it.for_each(|(o, (&x, &y))| *o = x + y),
        BinaryOp::Mul => it.for_each(|(o, (&x, &y))| *o = x * y),
        // Rust's `%` on floats is C fmod (sign of the dividend), as the reference.
        BinaryOp::Mod => it.for_each(|(o, (&x, &y))| *o = x % y),
        BinaryOp::LessThan => it.for_each(|(o, (&x, &y))| *o = (x < y) as u8 as f32),
    }
}

/// How many output elements a parallel task should cover, so that each task does at least
/// ~64K element-ops and there are a few tasks per thread.
fn task_len(n_out: usize, work_per_out: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let min_outs = (65536 / work_per_out.max(1)).max(1);
    let per_task = n_out.div_ceil(threads * 4).max(1);
    per_task.max(min_outs)
}

/// An elementwise kernel: the program's root, stored to the node's buffer.
pub fn run_elementwise(prog: &Program, bufs: &[Storage], out: &mut Storage, n: usize) {
    let chunk = task_len(n, 1).next_multiple_of(BLOCK);
    match out {
        Storage::F32(o) => o[..n].par_chunks_mut(chunk).enumerate().for_each(|(t, c)| {
            prog.with_regs(|regs| {
                for (b, dst) in c.chunks_mut(BLOCK).enumerate() {
                    let z0 = t * chunk + b * BLOCK;
                    dst.copy_from_slice(prog.eval_block(bufs, z0, dst.len(), regs));
                }
            })
        }),
        Storage::F64(o) => o[..n].par_chunks_mut(chunk).enumerate().for_each(|(t, c)| {
            prog.with_regs(|regs| {
                for (b, dst) in c.chunks_mut(BLOCK).enumerate() {
                    let z0 = t * chunk + b * BLOCK;
                    let vals = prog.eval_block(bufs, z0, dst.len(), regs);
                    dst.iter_mut().zip(vals).for_each(|(d, &v)| *d = v as f64);
                }
            })
        }),
    }
}

/// Shape of a reduction: `outer` rows of `len` reduced elements, `inner` apart.
#[derive(Clone, Copy, Debug)]
pub struct ReduceShape {
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
}

/// A reduction kernel over the program's values (laid out as `[outer, len, inner]`).
pub fn run_reduce(op: ReduceOp, prog: &Program, bufs: &[Storage], out: &mut [f32], s: ReduceShape) {
    let n_out = s.outer * s.inner;
    let out = &mut out[..n_out];
    if s.len == 0 {
        out.fill(if op == ReduceOp::Sum {
            0.0
        } else {
            f32::NEG_INFINITY
        });
        return;
    }
    if n_out == 0 {
        return;
    }
    if s.inner == 1 {
        let chunk = task_len(n_out, s.len);
        out.par_chunks_mut(chunk).enumerate().for_each(|(t, c)| {
            prog.with_regs(|regs| reduce_rows(op, prog, bufs, t * chunk, c, s.len, regs))
        });
    } else {
        let row = s.inner; // outputs per outer index
        let chunk = task_len(s.outer, s.len * s.inner) * row;
        out.par_chunks_mut(chunk).enumerate().for_each(|(t, c)| {
            prog.with_regs(|regs| reduce_strided(op, prog, bufs, t * chunk, c, s, regs))
        });
    }
}

/// Reduces rows `o0 .. o0 + out.len()` of the last axis (inner == 1). A block may span
/// several short rows or a part of a long one; accumulators carry across blocks.
fn reduce_rows(
    op: ReduceOp,
    prog: &Program,
    bufs: &[Storage],
    o0: usize,
    out: &mut [f32],
    len: usize,
    regs: &mut [f32],
) {
    let (z_start, z_end) = (o0 * len, (o0 + out.len()) * len);
    let mut z = z_start;
    let mut acc = Acc::new(op);
    while z < z_end {
        let n = BLOCK.min(z_end - z);
        let vals = prog.eval_block(bufs, z, n, regs);
        let mut p = 0;
        while p < n {
            let zz = z + p;
            let row = zz / len;
            let row_end = (row + 1) * len;
            let take = (row_end - zz).min(n - p);
            acc.add_slice(&vals[p..p + take]);
            p += take;
            if zz + take == row_end {
                out[row - o0] = acc.finish();
                acc = Acc::new(op);
            }
        }
        z += n;
    }
}

/// Reduces a middle axis: outputs `q0 .. q0 + out.len()` (whole outer rows).
fn reduce_strided(
    op: ReduceOp,
    prog: &Program,
    bufs: &[Storage],
    q0: usize,
    out: &mut [f32],
    s: ReduceShape,
    regs: &mut [f32],
) {
    out.fill(if op == ReduceOp::Sum {
        0.0
    } else {
        f32::NEG_INFINITY
    });
    let p0 = q0 / s.inner;
    let rows = out.len() / s.inner;
    let (z_start, z_end) = (p0 * s.len * s.inner, (p0 + rows) * s.len * s.inner);
    let mut z = z_start;
    while z < z_end {
        let n = BLOCK.min(z_end - z);
        let vals = prog.eval_block(bufs, z, n, regs);
        let mut p = 0;
        while p < n {
            let zz = z + p;
            let (outer, inner) = (zz / (s.len * s.inner), zz % s.inner);
            let take = (s.inner - inner).min(n - p);
            let base = (outer - p0) * s.inner + inner;
            let dst = &mut out[base..base + take];
            let src = &vals[p..p + take];
            match op {
                ReduceOp::Sum => dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x),
                ReduceOp::Max => dst
                    .iter_mut()
                    .zip(src)
                    .for_each(|(d, &x)| *d = max_nan(*d, x)),
            }
            p += take;
        }
        z += n;
    }
}

/// Max that propagates NaN (like the reference and PyTorch).
#[inline]
fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if b > a {
        b
    } else {
        a
    }
}

/// A row accumulator whose inner loop runs over 16 independent lanes, so it vectorises and
/// sums pairwise-ish (more accurate than one serial f32 sum).
struct Acc {
    op: ReduceOp,
    lanes: [f32; 16],
    nan: bool,
}

impl Acc {
    fn new(op: ReduceOp) -> Acc {
        let init = if op == ReduceOp::Sum {
            0.0
        } else {
            f32::NEG_INFINITY
        };
        Acc {
            op,
            lanes: [init; 16],
            nan: false,
        }
    }
    // Indexed lanes keep the 16 accumulators in registers (the point of the loop).
    #[allow(clippy::needless_range_loop)]
    #[inline]
    fn add_slice(&mut self, xs: &[f32]) {
        let mut chunks = xs.chunks_exact(16);
        match self.op {
            ReduceOp::Sum => {
                for c in &mut chunks {
                    for i in 0..16 {
                        self.lanes[i] += c[i];
                    }
                }
                for (i, &x) in chunks.remainder().iter().enumerate() {
                    self.lanes[i] += x;
                }
            }
            ReduceOp::Max => {
                let mut nan = false;
                for c in &mut chunks {
                    for i in 0..16 {
                        let x = c[i];
                        nan |= x.is_nan();
                        self.lanes[i] = if x > self.lanes[i] { x } else { self.lanes[i] };
                    }
                }
                for (i, &x) in chunks.remainder().iter().enumerate() {
                    nan |= x.is_nan();
                    self.lanes[i] = if x > self.lanes[i] { x } else { self.lanes[i] };
                }
                self.nan |= nan;
            }
        }
    }
    fn finish(&self) -> f32 {
        match self.op {
            ReduceOp::Sum => {
                let mut l = self.lanes;
                let mut w = 8;
                while w > 0 {
                    for i in 0..w {
                        l[i] += l[i + w];
                    }
                    w /= 2;
                }
                l[0]
            }
            ReduceOp::Max if self.nan => f32::NAN,
            ReduceOp::Max => self.lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        }
    }
}
