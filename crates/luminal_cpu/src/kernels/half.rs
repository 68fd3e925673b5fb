//! Half precision (`f16`, `bf16`): casts between the float types as direct kernels, and the
//! rules by which half elementwise ops and reductions run in the fused kernels (half
//! matmuls: `kernels/matmul/half.rs`).
//!
//! **Casts** (f32, f16, bf16 in any direction, through any view) convert blocks with
//! `half`'s slice conversions (F16C where the CPU has it). Every conversion is one
//! round-to-nearest-even from the exact input value: the reference's `DType::round`.
//!
//! **Elementwise.** A half op is computed in f32 on the exact (widened) half values and its
//! result rounded to the half type before anything reads it (`Instr::Round`; a half output
//! rounds as it is stored). For `+`, `×`, `%`, `sqrt` and `1/x` this is exactly the
//! reference's result (the f64 result rounded once): f32 is correctly rounded and carries
//! at least `2p + 2` bits of a `p`-bit half type (f16: p = 11, bf16: p = 8), so rounding
//! first to f32 and then to the half type is innocuous; products and remainders of halves
//! are even exact in f32. Subnormal and overflowing half results round on the same grid as
//! the reference's. `exp2`, `log2` and `sin` are the f32 polynomials (within 2 f32 ulps), so
//! their half results differ from the reference's only next to a rounding tie (by one half
//! ulp). Comparisons and `maximum` are exact.
//!
//! **Reductions** over halves accumulate in f64 in the reference's order and round once,
//! matching the reference bit for bit: an f32 accumulation would round partial sums, which
//! the reference does not. f16 sums of at most 2^13 terms are exact in f64 whatever the
//! order (multiples of 2^-24 below 2^29), so they use several lanes; longer f16 rows and
//! bf16 (whose exponent range no f64 sum holds exactly) are summed in order.

use crate::kernel::{BufId, CpuKernel, HalfScratch, RunCtx};
use crate::kernels::fused::{task_len, Program, ReduceShape, Regs, RowEnv, BLOCK};
use crate::simd::half::HalfKind;
use crate::simd::{self, Task};
use crate::storage::Elem;
use crate::storage::{BufRef, Storage};
use crate::view::{DimNames, DimValues, ResolvedView, ViewExprs};
use luminal::graph::{Edge, GraphData, NodeId};
use luminal::op::{BinaryOp, Op, ReduceOp};
use luminal::{DType, LuminalError, Result};

/// Elements per parallel task of the conversion loops.
pub(crate) const CHUNK: usize = 1 << 16;

fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// `Cast` between two of f32, f16 and bf16, reading its input through any view.
#[derive(Clone, Debug)]
pub struct CastKernel {
    /// The input's buffer.
    pub input: BufId,
    exprs: ViewExprs,
    view: ResolvedView,
}

impl CastKernel {
    /// The kernel for node `id` when it is a cast between float types; `None` otherwise.
    pub fn try_new(g: &GraphData, id: NodeId, names: &DimNames) -> Result<Option<CastKernel>> {
        let node = g.node(id);
        let Op::Cast(to) = node.op else {
            return Ok(None);
        };
        let e = &node.inputs[0];
        let from = g.node(e.node).dtype;
        if from == to || !is_float(from) || !is_float(to) {
            return Ok(None);
        }
        Ok(Some(CastKernel::reading(e, names)?))
    }

    /// A conversion of whatever float data is read through `e` (see [`CastKernel::run_from`]).
    pub fn reading(e: &Edge, names: &DimNames) -> Result<CastKernel> {
        Ok(CastKernel {
            input: BufId::of(e.node),
            exprs: ViewExprs::new(&e.view, names)?,
            view: ResolvedView::default(),
        })
    }

    pub fn prepare(&mut self, dims: &DimValues, bufs: &[Storage]) -> Result<()> {
        self.exprs.resolve(dims, &mut self.view)?;
        self.view.check_bounds(bufs[self.input].len())
    }

    /// Writes the `n` converted elements of `src` read through the input's view into `out`.
    pub fn run_from(&self, src: BufRef<'_>, out: &mut Storage, n: usize) -> Result<()> {
        if matches!(src, BufRef::F64(_)) {
            return Err(LuminalError::Backend(
                "cast kernel reads a float buffer".into(),
            ));
        }
        let view = &self.view;
        match out {
            Storage::F32(o) => crate::exec::par::for_each_chunk(&mut o[..n], CHUNK, |t, c| {
                for (j, blk) in c.chunks_mut(BLOCK).enumerate() {
                    view.load(src, t * CHUNK + j * BLOCK, blk);
                }
            }),
            Storage::F16(o) => crate::exec::par::for_each_chunk(&mut o[..n], CHUNK, |t, c| {
                narrow_view(src, view, t * CHUNK, c)
            }),
            Storage::BF16(o) => crate::exec::par::for_each_chunk(&mut o[..n], CHUNK, |t, c| {
                narrow_view(src, view, t * CHUNK, c)
            }),
            Storage::F64(_) | Storage::Bytes(_) => {
                return Err(LuminalError::Backend(
                    "cast kernel writes a float buffer".into(),
                ))
            }
        }
        Ok(())
    }
}

impl CpuKernel for CastKernel {
    fn reads(&self) -> Vec<BufId> {
        vec![self.input]
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.input = map(self.input);
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.prepare(cx.dims, cx.bufs)?;
        self.run_from(cx.bufs[self.input].as_ref(), out, cx.n)
    }
    fn flops(&self, _n: usize) -> usize {
        0
    }
}

/// Logical elements `z0 .. z0 + out.len()` of `view` over `src`, rounded into `out`.
fn narrow_view<H: Elem>(src: BufRef<'_>, view: &ResolvedView, z0: usize, out: &mut [H]) {
    let mut tmp = [0f32; BLOCK];
    for (j, blk) in out.chunks_mut(BLOCK).enumerate() {
        let (z, len) = (z0 + j * BLOCK, blk.len());
        match (src, view.direct_start(z, len)) {
            // An f32 run read in place: one conversion pass, no staging copy.
            (BufRef::F32(v), Some(s)) => H::narrow(&v[s..s + len], blk),
            _ => {
                view.load(src, z, &mut tmp[..len]);
                H::narrow(&tmp[..len], blk);
            }
        }
    }
}

// ---------------------------------------------------------------- elementwise and reduce

/// Whether node `id` is a half op the fused interpreter evaluates: a unary or binary op,
/// `Contiguous` or a constant in f16 / bf16, `LessThan` of two halves, or a cast to a half
/// type from f32, f16, bf16 or bool (exact in f32, so the one rounding is the reference's).
/// Values are computed in f32 and each op's result is rounded to its half type (see
/// [`rounds_to`] and the module docs).
pub fn fusable(g: &GraphData, id: NodeId) -> bool {
    let node = g.node(id);
    let in_dt = |i: usize| g.node(node.inputs[i].node).dtype;
    let half = HalfKind::of(node.dtype).is_some();
    match &node.op {
        Op::Unary(_) | Op::Contiguous => half && in_dt(0) == node.dtype,
        Op::Binary(BinaryOp::LessThan) => {
            node.dtype == DType::Bool && HalfKind::of(in_dt(0)).is_some() && in_dt(1) == in_dt(0)
        }
        Op::Binary(_) => half && in_dt(0) == node.dtype && in_dt(1) == node.dtype,
        Op::Cast(_) => {
            half && matches!(
                in_dt(0),
                DType::F32 | DType::F16 | DType::BF16 | DType::Bool
            )
        }
        Op::Constant { .. } => half,
        _ => false,
    }
}

/// The half type a fused node's f32 result must be rounded to before anything reads it:
/// unary and binary half ops, and casts into a half type. `None` for ops whose result is
/// already a value of their type (`Contiguous`, `LessThan`, constants, f32 ops).
pub fn rounds_to(g: &GraphData, id: NodeId) -> Option<HalfKind> {
    let node = g.node(id);
    let kind = HalfKind::of(node.dtype)?;
    match &node.op {
        Op::Unary(_) | Op::Binary(_) => Some(kind),
        Op::Cast(_) if g.node(node.inputs[0].node).dtype != node.dtype => Some(kind),
        _ => None,
    }
}

/// Most elements of an f16 sum whose every partial sum is exact in f64, whatever the
/// order: f16 values are multiples of 2^-24 below 2^16 in magnitude, so any partial sum of
/// at most 2^13 of them is a multiple of 2^-24 below 2^29, which f64's 53 bits hold.
const EXACT_F16_SUM: usize = 1 << 13;

/// `acc` combined with every value of `vals`, in order, with the reference's semantics
/// ([`ReduceOp::combine`] in f64). `any_order`: every partial sum is exact, so a sum may
/// use several lanes (same result).
#[inline(always)]
fn fold(op: ReduceOp, any_order: bool, acc: f64, vals: &[f32]) -> f64 {
    match op {
        ReduceOp::Sum if any_order => {
            let mut lanes = [0f64; 4];
            let chunks = vals.chunks_exact(4);
            let rest = chunks.remainder();
            for c in chunks {
                for l in 0..4 {
                    lanes[l] += c[l] as f64;
                }
            }
            let mut s = acc + ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
            for &v in rest {
                s += v as f64;
            }
            s
        }
        ReduceOp::Sum => vals.iter().fold(acc, |a, &v| a + v as f64),
        ReduceOp::Max => vals.iter().fold(acc, |a, &v| op.combine(a, v as f64)),
    }
}

/// A reduction with an f16 / bf16 output, with the reference's semantics exactly: the
/// program's values (half values, exact in f32) are combined in f64 in the reference's
/// order and rounded once. An f32 accumulation would not do: a sum of halves is not exact
/// in f32, and its rounding would differ from the reference's single one. The f64
/// accumulators live in `scratch` (no allocation after the first run).
pub fn run_half_reduce(
    op: ReduceOp,
    prog: &Program,
    bufs: &[Storage],
    out: &mut Storage,
    s: ReduceShape,
    scratch: &mut HalfScratch,
) -> Result<()> {
    let dtype = match out {
        Storage::F16(_) => DType::F16,
        Storage::BF16(_) => DType::BF16,
        _ => {
            return Err(LuminalError::Backend(
                "half reduce writes an f16 or bf16 buffer".into(),
            ))
        }
    };
    let n_out = s.outer * s.inner;
    if scratch.acc.len() < n_out {
        scratch.acc.resize(n_out, 0.0);
    }
    let acc = &mut scratch.acc[..n_out];
    acc.fill(op.identity(dtype));
    let any_order = dtype == DType::F16 && s.len <= EXACT_F16_SUM;
    if s.len > 0 && n_out > 0 {
        // Whole rows per task (`inner` outputs each), a few tasks per thread.
        let chunk = task_len(s.outer, s.len * s.inner) * s.inner;
        crate::exec::par::for_each_chunk(acc, chunk, |t, c| {
            prog.with_regs(|mut regs| {
                simd::run(HalfReduceTask {
                    op,
                    any_order,
                    prog,
                    bufs,
                    q0: t * chunk,
                    acc: c,
                    s,
                    regs: &mut regs,
                })
            })
        });
    }
    match out {
        Storage::F16(o) => {
            for (d, &v) in o[..n_out].iter_mut().zip(acc.iter()) {
                *d = luminal::dtype::f16_from_f64(v);
            }
        }
        Storage::BF16(o) => {
            for (d, &v) in o[..n_out].iter_mut().zip(acc.iter()) {
                *d = luminal::dtype::bf16_from_f64(v);
            }
        }
        _ => unreachable!("checked above"),
    }
    Ok(())
}

/// Outputs `q0 .. q0 + acc.len()` of a half reduction (whole outer rows when `inner > 1`),
/// combined into `acc`.
struct HalfReduceTask<'a, 'r, 's> {
    op: ReduceOp,
    any_order: bool,
    prog: &'a Program,
    bufs: &'a [Storage],
    q0: usize,
    acc: &'a mut [f64],
    s: ReduceShape,
    regs: &'r mut Regs<'s>,
}

impl Task for HalfReduceTask<'_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let HalfReduceTask {
            op,
            any_order,
            prog,
            bufs,
            q0,
            acc,
            s,
            regs,
        } = self;
        // Logical elements `z_start .. z_end` feed these outputs: element `z` is
        // (outer, k, inner) = (z / (len·inner), z / inner % len, z % inner).
        let p0 = q0 / s.inner;
        let rows = acc.len() / s.inner;
        let (z_start, z_end) = (p0 * s.len * s.inner, (p0 + rows) * s.len * s.inner);
        let mut tmp = [0f32; BLOCK];
        let mut z = z_start;
        while z < z_end {
            let n = BLOCK.min(z_end - z);
            let vals = match prog.eval(bufs, RowEnv::NONE, z, n, regs, &mut tmp) {
                Some(v) => v,
                None => &tmp[..n],
            };
            let mut p = 0;
            while p < n {
                let zz = z + p;
                if s.inner == 1 {
                    // A run of one row.
                    let row = zz / s.len;
                    let take = ((row + 1) * s.len - zz).min(n - p);
                    let a = &mut acc[row - q0];
                    *a = fold(op, any_order, *a, &vals[p..p + take]);
                    p += take;
                } else {
                    // A run along `inner` at one (outer, k): one value per output.
                    let (outer, inner) = (zz / (s.len * s.inner), zz % s.inner);
                    let take = (s.inner - inner).min(n - p);
                    let base = (outer - p0) * s.inner + inner;
                    let (a, v) = (&mut acc[base..base + take], &vals[p..p + take]);
                    match op {
                        ReduceOp::Sum => a.iter_mut().zip(v).for_each(|(a, &v)| *a += v as f64),
                        ReduceOp::Max => a
                            .iter_mut()
                            .zip(v)
                            .for_each(|(a, &v)| *a = op.combine(*a, v as f64)),
                    }
                    p += take;
                }
            }
            z += n;
        }
    }
}
