//! Layer norm over the last axis, one row at a time in one pass over memory: the forward
//! `x̂ = (x − mean)·rstd` (`luminal::patterns::LayerNormMatch`) and the gradient autograd
//! builds for it, `dx = (dy − mean(dy) − x̂·mean(dy·x̂))·rstd` from `x`, `x̂` and `dy`
//! (`luminal::patterns::LayerNormGrad`), `rstd = 1/√(mean((x − mean)²) + eps)`.
//!
//! The row fusion (`fused/rows.rs`) computes the same from the primops, but its
//! interpreter runs a stage per op over each row: for the short rows of a small model's
//! training step (64 features) the per-row overhead dominates (a forward ~3×, a gradient
//! ~4× slower than these loops). Every operand is read one to one (the lowering rule only
//! takes flat identity reads), rows of `len` values back to back.

use crate::kernel::{BufId, CpuKernel, RunCtx, Scratch};
use crate::kernels::fused::{epilogue_chunk, epilogue_into, epilogue_rows, EpiStep, Program};
use crate::simd::{self, Task};
use crate::storage::Storage;
use luminal::shape::CompiledExpression;
use luminal::{LuminalError, Result};

/// A layer norm (`grad` false: reads `x`) or its gradient (reads `x`, `x̂`, `dy`).
#[derive(Debug)]
pub struct LayerNormKernel {
    bufs: Vec<BufId>,
    len: CompiledExpression,
    eps: f32,
    /// An elementwise function of the result written to the kernel's side output
    /// (`Kernel::side`: the norm's affine weight and bias, whose input `x̂` the weight's
    /// gradient reads too), and its ops when it is an affine chain.
    side: Option<(Program, Option<Vec<EpiStep>>)>,
    /// An elementwise function of the result evaluated in place over it (a forward's
    /// affine weight and bias where nothing else reads `x̂`), and its ops when affine.
    epilogue: Option<(Program, Option<Vec<EpiStep>>)>,
}

impl LayerNormKernel {
    /// The forward over `x`'s rows of `len` values.
    pub fn forward(x: BufId, len: CompiledExpression, eps: f32) -> Self {
        LayerNormKernel {
            bufs: vec![x],
            len,
            eps,
            side: None,
            epilogue: None,
        }
    }
    /// The gradient from `x`, the norm's output `x̂` and the output gradient `dy`.
    pub fn grad(x: BufId, xhat: BufId, dy: BufId, len: CompiledExpression, eps: f32) -> Self {
        LayerNormKernel {
            bufs: vec![x, xhat, dy],
            len,
            eps,
            side: None,
            epilogue: None,
        }
    }
}

/// Lane-wise sums (vectorised: no reassociation is needed), folded at the end.
const LANES: usize = 16;

/// The sum of the lanes, as a tree (four dependent adds, not fifteen).
#[inline(always)]
fn fold(v: [f32; LANES]) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = v[i] + v[i + 8];
    }
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}

/// `Σ a`.
#[inline(always)]
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = a.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] += c[j];
        }
    }
    fold(acc) + chunks.remainder().iter().sum::<f32>()
}

/// `(Σ a, Σ b, Σ b·c)` in one pass over three rows of one length.
#[inline(always)]
fn sums3(a: &[f32], b: &[f32], c: &[f32]) -> (f32, f32, f32) {
    let (mut sa, mut sb, mut sbc) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
    let (ca, cb, cc) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let (ra, rb, rc) = (ca.remainder(), cb.remainder(), cc.remainder());
    for ((x, y), z) in ca.zip(cb).zip(cc) {
        for j in 0..LANES {
            sa[j] += x[j];
            sb[j] += y[j];
            sbc[j] += y[j] * z[j];
        }
    }
    let (mut ta, mut tb, mut tbc) = (fold(sa), fold(sb), fold(sbc));
    for ((x, y), z) in ra.iter().zip(rb).zip(rc) {
        ta += x;
        tb += y;
        tbc += y * z;
    }
    (ta, tb, tbc)
}

/// `Σ (x − m)²`.
#[inline(always)]
fn centered_squares(x: &[f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            let d = c[j] - m;
            acc[j] += d * d;
        }
    }
    fold(acc)
        + chunks
            .remainder()
            .iter()
            .map(|&v| (v - m) * (v - m))
            .sum::<f32>()
}

/// Rows `first ..` of one task into `out` (whole rows of `len`).
struct Rows<'a> {
    ins: [&'a [f32]; 3],
    grad: bool,
    first: usize,
    len: usize,
    eps: f32,
    out: &'a mut [f32],
}

impl Task for Rows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let Rows {
            ins,
            grad,
            first,
            len,
            eps,
            out,
        } = self;
        let inv = 1.0 / len as f32;
        for (r, o) in out.chunks_exact_mut(len).enumerate() {
            let at = (first + r) * len;
            let x = &ins[0][at..at + len];
            let (xh, dy): (&[f32], &[f32]) = if grad {
                (&ins[1][at..at + len], &ins[2][at..at + len])
            } else {
                (&[], &[])
            };
            let (sx, sdy, sdyxh) = if grad {
                sums3(x, dy, xh)
            } else {
                (sum(x), 0.0, 0.0)
            };
            let mean = sx * inv;
            let rstd = 1.0 / (centered_squares(x, mean) * inv + eps).sqrt();
            if !grad {
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = (v - mean) * rstd;
                }
                continue;
            }
            let (g1, g2) = (sdy * inv, sdyxh * inv);
            for i in 0..len {
                o[i] = (dy[i] - g1 - xh[i] * g2) * rstd;
            }
        }
    }
}

impl CpuKernel for LayerNormKernel {
    fn reads(&self) -> Vec<BufId> {
        let mut r = self.bufs.clone();
        for (p, _) in [&self.side, &self.epilogue].into_iter().flatten() {
            r.extend(p.reads());
        }
        r
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        for b in &mut self.bufs {
            *b = map(*b);
        }
        for (p, _) in [&mut self.side, &mut self.epilogue].into_iter().flatten() {
            p.remap(map);
        }
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: [&self.side, &self.epilogue]
                .into_iter()
                .flatten()
                .map(|(p, _)| p.instrs.len())
                .max()
                .unwrap_or(0),
            ..Scratch::default()
        }
    }
    fn flops(&self, n: usize) -> usize {
        let extra: usize = [&self.side, &self.epilogue]
            .into_iter()
            .flatten()
            .map(|(p, _)| p.flops_per_element())
            .sum();
        n * (extra + if self.bufs.len() == 3 { 11 } else { 6 })
    }
    fn accepts_side_output(&self) -> bool {
        self.side.is_none() && self.epilogue.is_none()
    }
    fn add_epilogue(&mut self, prog: Program) -> std::result::Result<(), Program> {
        if self.side.is_some() || self.epilogue.is_some() || self.bufs.len() != 1 {
            return Err(prog);
        }
        let ops = prog.affine().filter(|o| !o.is_empty());
        self.epilogue = Some((prog, ops));
        Ok(())
    }
    fn add_side_output(&mut self, prog: Program) -> std::result::Result<(), Program> {
        if self.side.is_some() {
            return Err(prog);
        }
        self.side = Some((prog, None));
        Ok(())
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        let err = |m: &str| LuminalError::Backend(format!("layer norm kernel: {m}"));
        let n = cx.n;
        let len = crate::view::eval(&self.len, cx.dims)?.max(0) as usize;
        let mut ins: [&[f32]; 3] = [&[]; 3];
        for (slot, &b) in ins.iter_mut().zip(&self.bufs) {
            *slot = match &cx.bufs[b] {
                Storage::F32(v) if v.len() >= n => v.as_slice(),
                Storage::F32(_) => return Err(err("an operand is shorter than the output")),
                _ => return Err(err("f32 operands")),
            };
        }
        let Storage::F32(o) = out else {
            return Err(err("f32 output"));
        };
        if n == 0 || len == 0 {
            return Ok(());
        }
        if n % len != 0 {
            return Err(err("the output is not whole rows"));
        }
        let rows = n / len;
        let threads = crate::exec::par::threads();
        // Tasks of whole rows, at least ~16 KB of work each.
        let per_task = rows
            .div_ceil(threads * 4)
            .max((4096 / len).max(1))
            .min(rows);
        let grad = self.bufs.len() == 3;
        let eps = self.eps;
        if let Some((p, ops)) = &mut self.side {
            p.prepare(cx.dims, cx.bufs)?;
            if ops.is_none() {
                *ops = Some(p.affine().unwrap_or_default());
            }
        }
        if let Some((p, _)) = &mut self.epilogue {
            p.prepare(cx.dims, cx.bufs)?;
        }
        let epilogue = self.epilogue.as_ref();
        let side = match (&self.side, cx.side) {
            (Some((p, ops)), Some(s)) => Some((
                p,
                ops.as_deref().filter(|o| !o.is_empty()),
                SidePtr(s.as_mut_ptr()),
            )),
            (None, _) => None,
            (Some(_), None) => return Err(err("no side output buffer")),
        };
        let bufs = cx.bufs;
        crate::exec::par::for_each_chunk(&mut o[..n], per_task * len, |t, chunk| {
            simd::run(Rows {
                ins,
                grad,
                first: t * per_task,
                len,
                eps,
                out: &mut *chunk,
            });
            if let Some((p, ops)) = epilogue {
                let (z0, all) = (t * per_task * len, chunk.len());
                // Affine steps row by row where the leaves allow it, else the interpreter.
                // SAFETY: `chunk` holds `all / len` whole rows back to back, this task's.
                let rows_done = ops.as_deref().is_some_and(|ops| unsafe {
                    let at = chunk.as_mut_ptr();
                    epilogue_rows(p, ops, bufs, z0, (1, all, all), at)
                        || epilogue_rows(p, ops, bufs, z0, (all / len, len, len), at)
                });
                if !rows_done {
                    epilogue_chunk(p, bufs, z0, chunk);
                }
            }
            if let Some((p, ops, s)) = &side {
                let z0 = t * per_task * len;
                // SAFETY: the side output has `n` elements; this task alone writes its
                // rows `z0 .. z0 + chunk.len()`.
                let to = unsafe { std::slice::from_raw_parts_mut(s.0.add(z0), chunk.len()) };
                // An affine side program (weight and bias) runs in place over a copy.
                // Its leaves read as one run when they allow it, else row by row.
                let in_place = ops.is_some_and(|ops| {
                    to.copy_from_slice(chunk);
                    let (all, at) = (chunk.len(), to.as_mut_ptr());
                    // SAFETY: `to` holds `all / len` whole rows back to back.
                    unsafe {
                        epilogue_rows(p, ops, bufs, z0, (1, all, all), at)
                            || epilogue_rows(p, ops, bufs, z0, (all / len, len, len), at)
                    }
                });
                if !in_place {
                    epilogue_into(p, bufs, z0, chunk, to);
                }
            }
        });
        Ok(())
    }
}

/// The side output's data, shared by the row tasks (each writes its own rows).
struct SidePtr(*mut f32);
// SAFETY: tasks write disjoint rows through it.
unsafe impl Sync for SidePtr {}
