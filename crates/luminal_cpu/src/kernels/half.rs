//! Half precision (`f16`, `bf16`): casts between the float types as direct kernels, half
//! matmuls on the f32 matmul paths (or, when skinny, on the half weights in place), and the
//! rules by which half elementwise ops and reductions run in the fused kernels.
//!
//! **Casts** (f32, f16, bf16 in any direction, through any view) convert blocks with
//! `half`'s slice conversions (F16C where the CPU has it). Every conversion is one
//! round-to-nearest-even from the exact input value: the reference's `DType::round`.
//!
//! **Matmul.** The operands' addressed spans are widened (exactly) into `f32` scratch, the
//! product runs through the f32 dispatch of [`MatmulKernel`] (gemm, or the skinny and matvec
//! kernels) on the same strides, and the `f32` result is rounded once to the half type.
//! Products of halves are exact in `f32`, so the only errors are `f32` accumulation and the
//! final rounding. We do not call `gemm`'s own f16 entry point: gemm-f16 0.18 accumulates in
//! `f32` but stores partial sums to the `f16` output between depth blocks, and its gemv paths
//! (M = 1 with `b` contiguous along N, or N = 1 with `a` contiguous along M) round the
//! running sum to `f16` after every term of K; it also allocates its packing buffers on every
//! call, and on a 1024³ product it is slower than widening plus the f32 gemm (see the bench).
//! The scratch is shared by every half matmul of a runtime and grows to the largest one, so
//! runs after the first allocate nothing. Skinny products (decode steps: `M ≤ 8` against a
//! weight contiguous along K, `M = 1` against one contiguous along N) do not widen the
//! weight: only `a`'s rows are widened, and the kernels of `half_matvec.rs` convert the
//! weight as it streams past, with the same exact products and f32 accumulation.
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

use crate::kernel::{BufId, CpuKernel, RunCtx};
use crate::kernels::fused::{task_len, Program, ReduceShape, Regs, RowEnv, BLOCK};
use crate::kernels::matmul::MatmulKernel;
use crate::simd::half::{HalfElem, HalfKind};
use crate::simd::{self, Task};
use crate::storage::{BufRef, Storage, StorageKind};
use crate::view::{DimNames, DimValues, ResolvedView, ViewExprs};
use half::slice::HalfFloatSliceExt;
use luminal::graph::{Edge, GraphData, NodeId};
use luminal::op::{BinaryOp, Op, ReduceOp};
use luminal::{DType, LuminalError, Result};

/// Elements per parallel task of the conversion loops.
const CHUNK: usize = 1 << 16;

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

/// A half type that `f32` slices round into.
trait Half: Copy {
    fn narrow(src: &[f32], dst: &mut [Self]);
}
impl Half for half::f16 {
    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}
impl Half for half::bf16 {
    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

/// Logical elements `z0 .. z0 + out.len()` of `view` over `src`, rounded into `out`.
fn narrow_view<H: Half>(src: BufRef<'_>, view: &ResolvedView, z0: usize, out: &mut [H]) {
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

/// `f32` scratch of the half matmuls: widened operands and the unrounded product.
#[derive(Debug, Default)]
pub struct HalfScratch {
    a: Vec<f32>,
    b: Vec<f32>,
    out: Vec<f32>,
    /// Accumulators of the half reductions.
    acc: Vec<f64>,
}

/// The first `n` elements of `v`, grown (never shrunk: the same dims never reallocate).
fn grown(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// First index and length of the buffer span a view addresses (`(0, 0)` when none).
fn span(view: &ResolvedView) -> (i64, usize) {
    match (view.min_index(), view.max_index()) {
        (Some(lo), Some(hi)) => (lo, (hi - lo + 1) as usize),
        _ => (0, 0),
    }
}

/// Buffer elements `lo .. lo + dst.len()` of `src`, exactly, as `f32`.
fn widen(src: BufRef<'_>, lo: usize, dst: &mut [f32]) {
    crate::exec::par::for_each_chunk(dst, CHUNK, |t, c| src.copy_to_f32(lo + t * CHUNK, c));
}

/// Rounds `src` into the first `src.len()` elements of `out`.
fn narrow_into(src: &[f32], out: &mut Storage) -> Result<()> {
    fn go<H: Half + Send>(src: &[f32], o: &mut [H]) {
        crate::exec::par::for_each_chunk(&mut o[..src.len()], CHUNK, |t, c| {
            H::narrow(&src[t * CHUNK..t * CHUNK + c.len()], c)
        })
    }
    match out {
        Storage::F16(o) => go(src, o),
        Storage::BF16(o) => go(src, o),
        _ => {
            return Err(LuminalError::Backend(
                "half matmul writes an f16 or bf16 buffer".into(),
            ))
        }
    }
    Ok(())
}

/// A matmul whose operands and output are all f16 or all bf16 (see the module docs).
pub fn run_half_matmul(
    k: &MatmulKernel,
    bufs: &[Storage],
    out: &mut Storage,
    scratch: &mut HalfScratch,
) -> Result<()> {
    let (a, b) = (bufs[k.a].as_ref(), bufs[k.b].as_ref());
    let kind = out.kind();
    if !matches!(kind, StorageKind::F16 | StorageKind::BF16)
        || bufs[k.a].kind() != kind
        || bufs[k.b].kind() != kind
    {
        return Err(LuminalError::Backend(format!(
            "matmul needs f32, f16 or bf16 operands and output of one type, got {:?} x {:?} -> {:?}",
            bufs[k.a].kind(),
            bufs[k.b].kind(),
            kind
        )));
    }
    let (batch, m, n, _) = k.shape();
    let total = batch * m * n;
    if total == 0 {
        return Ok(());
    }
    let (a_view, b_view) = k.views();
    let ((a_lo, a_len), (b_lo, b_len)) = (span(a_view), span(b_view));
    let HalfScratch {
        a: wa,
        b: wb,
        out: wo,
        ..
    } = scratch;
    if let Some(path) = SkinnyPath::of(k) {
        // The weight is read in place; only `a` (a few rows) is widened.
        let (wa, wo) = (grown(wa, a_len), grown(wo, total));
        widen(a, a_lo as usize, wa);
        match b {
            BufRef::F16(b) => path.run(k, wa, a_lo, b, wo),
            BufRef::BF16(b) => path.run(k, wa, a_lo, b, wo),
            _ => unreachable!("operand kinds checked above"),
        }
        return narrow_into(wo, out);
    }
    let (wa, wb, wo) = (grown(wa, a_len), grown(wb, b_len), grown(wo, total));
    widen(a, a_lo as usize, wa);
    widen(b, b_lo as usize, wb);
    k.run_f32(wa, wb, (a_lo, b_lo), wo)?;
    narrow_into(wo, out)
}

/// The half kernels that read the weight `b` in place (see `half_matvec.rs`), mirroring the
/// f32 dispatch of [`MatmulKernel::run_f32`].
#[derive(Clone, Copy, Debug)]
enum SkinnyPath {
    /// `M ≤ 8`, both operands contiguous along K.
    Dots,
    /// `M = 1`, `a` contiguous along K and `b` along N.
    Axpy,
}

impl SkinnyPath {
    fn of(k: &MatmulKernel) -> Option<SkinnyPath> {
        let (_, m, n, depth) = k.shape();
        let (av, bv) = k.views();
        let r = av.dims.len();
        let (sa, sb) = (&av.strides, &bv.strides);
        if depth == 0 || sa[r - 1] != 1 || sa[r - 3] < 0 {
            return None;
        }
        if m <= crate::kernels::matmul::skinny_f32::MAX_ROWS && sb[r - 1] == 1 && sb[r - 2] >= 0 {
            Some(SkinnyPath::Dots)
        } else if m == 1 && sb[r - 2] == 1 && sb[r - 1] >= 0 && n > 1 {
            Some(SkinnyPath::Axpy)
        } else {
            None
        }
    }

    /// The product into `dst` (`batch · M · N` floats): `a` is the widened span of `a`'s
    /// buffer from element `a_lo` on, `b` the weight's own buffer.
    fn run<H: HalfElem>(self, k: &MatmulKernel, a: &[f32], a_lo: i64, b: &[H], dst: &mut [f32]) {
        let (batch, m, n, depth) = k.shape();
        let (av, bv) = k.views();
        let r = av.dims.len();
        let (sa, sb) = (&av.strides, &bv.strides);
        let parallel = k.threads > 1 && m * n * depth >= (1 << 15);
        for (i, d) in dst[..batch * m * n].chunks_mut(m * n).enumerate() {
            // Operand offsets of batch `i`: unravel it over the batch dims.
            let (mut oa, mut ob) = (av.offset - a_lo, bv.offset);
            let mut rem = i as i64;
            for dim in (0..r - 3).rev() {
                let c = rem % av.dims[dim];
                rem /= av.dims[dim];
                oa += c * sa[dim];
                ob += c * sb[dim];
            }
            let (oa, ob) = (oa as usize, ob as usize);
            match self {
                SkinnyPath::Dots => crate::kernels::matmul::skinny_half::skinny(
                    a,
                    (oa, sa[r - 3] as usize),
                    b,
                    (ob, sb[r - 2] as usize),
                    d,
                    (m, n, depth),
                    parallel,
                ),
                SkinnyPath::Axpy => crate::kernels::matmul::skinny_half::axpy(
                    a,
                    oa,
                    b,
                    (ob, sb[r - 1] as usize),
                    d,
                    depth,
                    parallel,
                ),
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
