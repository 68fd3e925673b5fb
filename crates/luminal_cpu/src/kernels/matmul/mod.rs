//! Matmul recognised from its primop pattern and run through our packed GEMM
//! ([`gemm_f32`]: AVX-512 / AVX2 microkernels; the `gemm` crate without AVX2).
//!
//! `a.matmul(b)` is built as `SumReduce(last)` over `Mul(a_view, b_view)` whose views are
//! `[batch.., M, N, K]` with `a` broadcast along `N` (stride 0) and `b` along `M`. The GEMM
//! takes row and column strides, so the operands are read in place whatever their layout
//! (transposed weights, sliced batches, broadcast batch dims): no copies besides packing.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub(crate) mod gemm_f32;
pub(crate) mod half;
pub(crate) mod skinny;
pub(crate) mod skinny_f32;
pub(crate) mod skinny_half;

use crate::kernel::{BufId, CpuKernel, RunCtx, Scratch};
use crate::kernels::quant::{weight_matmul, WeightRef};
use crate::storage::Storage;
use crate::view::{DimValues, ResolvedView, ViewExprs};
use luminal::{DType, LuminalError, Result};

use crate::kernels::fused::{run_epilogue, Program};
use crate::simd::{self, Task};
use luminal::graph::NodeId;
use std::ops::Range;

#[derive(Debug)]
pub struct MatmulKernel {
    pub a: BufId,
    pub b: BufId,
    pub a_exprs: ViewExprs,
    pub b_exprs: ViewExprs,
    a_view: ResolvedView,
    b_view: ResolvedView,
    /// Threads gemm may use (the runtime's pool size).
    pub threads: usize,
    /// Which axis a single large f32 product is split along across threads, and its cache
    /// blocking: schedule choices of the search (`split=`, `tiles=`, see `search.rs`).
    pub split: Split,
    pub tiles: gemm_f32::Tiles,
    /// The f32 products' precision (`CpuBackend::matmul_precision`).
    pub precision: gemm_f32::MatmulPrecision,
    /// An elementwise consumer fused as an epilogue: run in place over the product, which
    /// it reads as row register 0 (`Instr::RowReg(0)`); the kernel's output is its result.
    pub epilogue: Option<Program>,
    /// `b` is a quantized or half weight input `W: [N, K]` read in place as `Wᵀ` (the cast
    /// of `w.dequantize()` folded in, see `quant/`): its dtype.
    pub weight: Option<DType>,
    /// Keep f32 activations in the quantized-weight products (no int8 quantization, see
    /// `quant/int8.rs`): set for products whose result is a graph output (the logits),
    /// where the activation rounding reaches the result undamped.
    pub exact: bool,
    /// With int8 activations: recompute the `refine` largest entries of each output row
    /// with f32 activations (0 = none). Set for graph outputs (the logits): the likely
    /// tokens come out exact (argmax, top-k, their log-probabilities) at int8 speed.
    pub refine: usize,
    /// An RMSNorm computed as the product's input (weight products only, see
    /// [`NormPrologue`]): `a` is then the norm's input `x`, read through `a`'s view, and
    /// the product runs on the normalised rows.
    pub norm: Option<NormPrologue>,
    /// An elementwise function of the result (after the epilogue) written to the kernel's
    /// side output (`Kernel::side`) over each finished block (`lower::side_outputs`): row
    /// register 0 is the result.
    pub side: Option<Program>,
    /// The side program's ops when it is an affine chain (as `affine`).
    side_affine: Option<Option<Vec<crate::kernels::fused::EpiStep>>>,
    /// The epilogue's ops when it is a bias / residual / scale chain
    /// ([`Program::affine`]), found at the first `prepare` (`None` until then).
    affine: Option<Option<Vec<crate::kernels::fused::EpiStep>>>,
}

/// `rows = x · recip(sqrt(Σ x² · scale + eps)) [· w]` per activation row, computed by the
/// product that reads the rows (a decode step's q, k, v or gate, up products each normalise
/// the one row themselves instead of waiting for a norm kernel; see
/// `luminal::patterns::RmsNormMatch`).
#[derive(Clone, Copy, Debug)]
pub struct NormPrologue {
    /// The learned scale (`K` f32 values), if any.
    pub weight: Option<BufId>,
    pub scale: f32,
    pub eps: f32,
    /// The norm's input is a value computed in the run (not an input, which an in-place
    /// write could change between two products): products of the same run may share the
    /// normalised rows.
    pub shared: bool,
    /// The norm's node: products that read the same norm share its rows (buffers are
    /// reused through a run, so the input's buffer alone does not name the values).
    pub node: NodeId,
}

/// Which rows the shared scratch holds (`HalfScratch::norm_of`): the run, the norm and the
/// rows of its input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormRows {
    run: u64,
    node: NodeId,
    /// First element, row stride, rows, row length.
    at: (usize, usize, usize, usize),
}

/// Normalises rows `rows` of `x` (each `k` values, `row` apart from `off`) into `out`
/// (`rows.len() · k` values), compiled per instruction set (`simd::run`).
struct NormTask<'a> {
    norm: &'a NormPrologue,
    x: &'a [f32],
    w: Option<&'a [f32]>,
    off: usize,
    row: usize,
    rows: Range<usize>,
    out: &'a mut [f32],
}

impl Task for NormTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let k = self.out.len() / self.rows.len().max(1);
        for (i, out) in self.rows.zip(self.out.chunks_exact_mut(k)) {
            self.norm
                .row::<F>(&self.x[self.off + i * self.row..][..k], self.w, out);
        }
    }
}

impl NormPrologue {
    /// `out = norm(x)` for one row (`x`, `out`: `K` values; `w`: the scale). The graph's
    /// ops in its order: `(Σ x²)·scale + eps`, `sqrt`, `recip`, then `(x · r) · w`; the
    /// sum of squares as the skinny f32 product sums a dot (`dot_lanes`).
    #[inline(always)]
    fn row<const F: bool>(&self, x: &[f32], w: Option<&[f32]>, out: &mut [f32]) {
        let sum = skinny_f32::dot_lanes::<F>(x, x);
        let r = 1.0 / (sum * self.scale + self.eps).sqrt();
        match w {
            Some(w) => {
                for ((o, &v), &s) in out.iter_mut().zip(x).zip(w) {
                    *o = v * r * s;
                }
            }
            None => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = v * r;
                }
            }
        }
    }
}

/// How a single large f32 product is shared between threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Split {
    /// Along N in multiples of 16 columns when N is wide enough (32 columns a thread) and
    /// at least M, else along M: a split along N has every thread pack all of A, one along M
    /// all of B, so the smaller operand is the one packed by every thread (a training
    /// step's `[tokens, features]` products, tokens ≫ features: 10% faster).
    #[default]
    Auto,
    /// Along M: each thread packs all of B and its own rows of A.
    Rows,
    /// Along N (multiples of 16 columns): each thread packs all of A and its own columns of B.
    Cols,
    /// Along K, in whole `kc` slices: each thread reads its own slices of A and B, and the
    /// slices are added afterwards in the sequential product's order.
    Depth,
}

/// The most scratch (floats) a product split along K keeps for its slices (16 MiB).
const MAX_PARTIALS: usize = 1 << 22;

/// Entries of each logits row a refined int8 product recomputes exactly.
pub const REFINE_TOP: usize = 32;

/// Batch count, M, N, K of the resolved product shape.
fn mnk(dims: &[i64]) -> (usize, usize, usize, usize) {
    let r = dims.len();
    let batch: i64 = dims[..r - 3].iter().product();
    (
        batch as usize,
        dims[r - 3] as usize,
        dims[r - 2] as usize,
        dims[r - 1] as usize,
    )
}

impl MatmulKernel {
    pub fn new(a: BufId, b: BufId, a_exprs: ViewExprs, b_exprs: ViewExprs, threads: usize) -> Self {
        MatmulKernel {
            a,
            b,
            a_exprs,
            b_exprs,
            a_view: ResolvedView::default(),
            b_view: ResolvedView::default(),
            threads,
            split: Split::Auto,
            tiles: gemm_f32::Tiles::DEFAULT,
            precision: gemm_f32::MatmulPrecision::Highest,
            epilogue: None,
            weight: None,
            exact: false,
            refine: 0,
            norm: None,
            side: None,
            side_affine: None,
            affine: None,
        }
    }

    pub fn prepare(&mut self, dims: &DimValues, bufs: &[Storage]) -> Result<()> {
        self.a_exprs.resolve(dims, &mut self.a_view)?;
        self.b_exprs.resolve(dims, &mut self.b_view)?;
        self.a_view.check_bounds(bufs[self.a].len())?;
        self.b_view.check_bounds(bufs[self.b].len())?;
        if let Some(e) = &mut self.epilogue {
            e.prepare(dims, bufs)?;
            if self.affine.is_none() {
                self.affine = Some(e.affine());
            }
        }
        if let Some(p) = &mut self.side {
            p.prepare(dims, bufs)?;
            if self.side_affine.is_none() {
                self.side_affine = Some(p.affine());
            }
        }
        Ok(())
    }

    /// Batch, M, N, K for the current dims.
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        mnk(&self.a_view.dims)
    }

    /// The resolved views of `a` and `b`.
    pub fn views(&self) -> (&ResolvedView, &ResolvedView) {
        (&self.a_view, &self.b_view)
    }

    /// Runs the product into `out` (f32 directly, f16 and bf16 through `scratch`, see
    /// `half.rs`), then the epilogue (if any) over it, in place, and the side program (if
    /// any) from it into `side`, the kernel's side output.
    fn product(
        &self,
        bufs: &[Storage],
        out: &mut Storage,
        scratch: &mut crate::kernel::HalfScratch,
        side: Option<&mut [f32]>,
    ) -> Result<()> {
        if self.side.is_some() && side.is_none() {
            return Err(LuminalError::Backend(
                "matmul kernel: no side output buffer".into(),
            ));
        }
        let (batch, m, n, _) = self.shape();
        let len = batch * m * n;
        // The side output over the whole result, where the product did not write it block
        // by block.
        let whole_side = |dst: &[f32], side: Option<&mut [f32]>| {
            if let (Some(p), Some(side)) = (&self.side, side) {
                let chunk = crate::kernels::fused::task_len(len, p.work_per_element())
                    .next_multiple_of(crate::kernels::fused::BLOCK);
                crate::exec::par::for_each_chunk(&mut side[..len], chunk, |t, to| {
                    let from = &dst[t * chunk..][..to.len()];
                    crate::kernels::fused::epilogue_into(p, bufs, t * chunk, from, to);
                });
            }
        };
        if let Some(dtype) = self.weight {
            let Storage::F32(dst) = out else {
                return Err(LuminalError::Backend("weight matmul writes f32".into()));
            };
            self.run_weight(bufs, dtype, dst, scratch)?;
            if let Some(e) = &self.epilogue {
                run_epilogue(e, bufs, &mut dst[..len]);
            }
            whole_side(dst, side);
            return Ok(());
        }
        match (&bufs[self.a], &bufs[self.b], out) {
            (Storage::F32(a), Storage::F32(b), Storage::F32(dst)) => {
                let epi = self.epilogue.as_ref().map(|e| (e, bufs));
                let mut side = self.side.as_ref().zip(side);
                let done = self.run_f32_then(
                    a,
                    b,
                    (0, 0),
                    dst,
                    epi,
                    Some(&mut scratch.partials),
                    side.as_mut().map(|(p, s)| (*p, bufs, &mut **s)),
                )?;
                if !done {
                    if let Some(e) = &self.epilogue {
                        run_epilogue(e, bufs, &mut dst[..len]);
                    }
                    whole_side(dst, side.map(|(_, s)| s));
                }
                Ok(())
            }
            // Epilogues are only fused into f32 products (see `Lowering::epilogue_matmul`).
            // (Half products write half outputs: never a side output's producer.)
            (_, _, out) => half::run_half_matmul(self, bufs, out, scratch),
        }
    }

    /// The product over f32 data: `a` and `b` hold the operands' buffers from element
    /// `shift.0` / `shift.1` on (the views' offsets are taken relative to those).
    pub fn run_f32(&self, a: &[f32], b: &[f32], shift: (i64, i64), dst: &mut [f32]) -> Result<()> {
        self.run_f32_then(a, b, shift, dst, None, None, None)
            .map(|_| ())
    }

    /// [`MatmulKernel::run_f32`], running `epilogue` (the program and the buffers it reads)
    /// over each finished block of the output right after it, in the same task (the output
    /// is still in cache: a batch of attention score products with their scale and mask),
    /// and then `side` (the side program, the buffers it reads and the side output) from
    /// it. `partials` is scratch for products computed in stages (`staging`; `None`: none
    /// are). Returns whether it ran the epilogue and side program; when not, the caller
    /// runs them over the whole output.
    pub fn run_f32_then(
        &self,
        a: &[f32],
        b: &[f32],
        shift: (i64, i64),
        dst: &mut [f32],
        epilogue: Option<(&Program, &[Storage])>,
        partials: Option<&mut Vec<f32>>,
        side: Option<(&Program, &[Storage], &mut [f32])>,
    ) -> Result<bool> {
        let (a_offset, b_offset) = (self.a_view.offset - shift.0, self.b_view.offset - shift.1);
        let (batch, m, n, k) = self.shape();
        let dst = &mut dst[..batch * m * n];
        if dst.is_empty() {
            return Ok(false);
        }
        if k == 0 {
            dst.fill(0.0);
            return Ok(false);
        }
        let r = self.a_view.dims.len();
        let (sa, sb) = (&self.a_view.strides, &self.b_view.strides);
        // A batch of products against one B (a weight broadcast over the batch) whose A rows
        // are laid out uniformly across the batch (`[batch.., m, k]` row-major, or any
        // strides that continue the row stride) is one product of `batch·m` rows: B is
        // packed once instead of once per batch item (BERT's `[32, 128, 384]` activations:
        // 32 packings of each weight per product before).
        let (batch, m) = {
            let dims = &self.a_view.dims;
            let b_shared = (0..r - 3).all(|d| dims[d] == 1 || sb[d] == 0);
            let mut expect = m as i64 * sa[r - 3];
            let mut uniform = sa[r - 3] > 0;
            for d in (0..r - 3).rev() {
                uniform &= dims[d] == 1 || sa[d] == expect;
                expect *= dims[d];
            }
            if batch > 1 && b_shared && uniform {
                (1, batch * m)
            } else {
                (batch, m)
            }
        };
        let offsets = |i: usize| self.batch_offsets(i, (a_offset, b_offset));
        // AMX or not, for the whole product (a thread's block may be narrower). M plays no
        // part where A is read along its rows (activations: a row's result must not depend
        // on the rows computed with it); an A read down its columns (a transposed
        // activation: a weight gradient `dYᵀ·X`, whose rows are features) also needs
        // `amx::MIN_DIM` rows, as N and K do: for fewer, splitting and packing the deep B
        // into pieces costs more than the tile products save (`64×256×1024` in a training
        // step: ~230 µs on AMX, ~160 transposed on the SIMD kernel, 2 threads).
        let amx = (gemm_f32::amx_for(n, k) && (sa[r - 1] == 1 || m >= amx::MIN_DIM))
            .then_some(self.precision);
        // The epilogue over rows `r0..r1` × columns `c0..c1` of batch item `i`'s output
        // (at `d`), run by the task that computed them, while they are in cache.
        // A bias / residual / scale epilogue runs in place row by row (`epilogue_rows`).
        // (`affine` describes `self.epilogue`, the only epilogue callers pass.)
        debug_assert!(epilogue
            .is_none_or(|(e, _)| self.epilogue.as_ref().is_some_and(|s| std::ptr::eq(e, s))));
        let affine = self.affine.as_ref().and_then(|a| a.as_deref());
        // The side output (`Kernel::side`): the side program over each finished block.
        let side = side.map(|(p, b, out)| (p, b, skinny::OutPtr(out.as_mut_ptr())));
        let finishing = epilogue.is_some() || side.is_some();
        let finish = |i: usize, d: *mut f32, (r0, r1): (usize, usize), (c0, c1): (usize, usize)| {
            let base = i * m * n;
            // Runs `f(z, len)` over the block's rows `z .. z + len` (batch item offsets).
            let pieces = |f: &dyn Fn(usize, usize)| {
                if c0 == 0 && c1 == n {
                    f(r0 * n, (r1 - r0) * n);
                } else {
                    for r in r0..r1 {
                        f(r * n + c0, c1 - c0);
                    }
                }
            };
            let epilogue_over_block = || {
                let Some((e, bufs)) = epilogue else {
                    return;
                };
                if let Some(ops) = affine {
                    // SAFETY: rows `r0..r1` × columns `c0..c1` of this batch item's `m × n`
                    // output at `d`, which the calling task computed and no other touches.
                    let done = unsafe {
                        crate::kernels::fused::epilogue_rows(
                            e,
                            ops,
                            bufs,
                            base + r0 * n + c0,
                            (r1 - r0, c1 - c0, n),
                            d.add(r0 * n + c0),
                        )
                    };
                    if done {
                        return;
                    }
                }
                pieces(&|z, len| {
                    // SAFETY: `z .. z + len` lies inside this batch item's `m × n` output
                    // at `d`, in rows the calling task computed and no other task touches.
                    let data = unsafe { std::slice::from_raw_parts_mut(d.add(z), len) };
                    crate::kernels::fused::epilogue_chunk(e, bufs, base + z, data);
                });
            };
            epilogue_over_block();
            if let Some((p, bufs, out)) = &side {
                // An affine side program (a GELU) runs in place over a copy of the rows.
                let side_ops = self.side_affine.as_ref().and_then(|a| a.as_deref());
                let in_place = side_ops.is_some_and(|ops| {
                    pieces(&|z, len| {
                        // SAFETY: as below.
                        unsafe { std::ptr::copy_nonoverlapping(d.add(z), out.0.add(base + z), len) }
                    });
                    // SAFETY: rows `r0..r1` × columns `c0..c1` of the side output, which
                    // this task alone writes (as one run when they are whole rows and the
                    // leaves allow it).
                    let (z, at) = (base + r0 * n + c0, out.0.wrapping_add(base + r0 * n + c0));
                    let whole = (r1 - r0) * n;
                    unsafe {
                        (c0 == 0
                            && c1 == n
                            && crate::kernels::fused::epilogue_rows(
                                p,
                                ops,
                                bufs,
                                z,
                                (1, whole, whole),
                                at,
                            ))
                            || crate::kernels::fused::epilogue_rows(
                                p,
                                ops,
                                bufs,
                                z,
                                (r1 - r0, c1 - c0, n),
                                at,
                            )
                    }
                });
                if in_place {
                    return;
                }
                pieces(&|z, len| {
                    // SAFETY: as above for the result; the side output has the result's
                    // length and layout, and this task alone writes these positions of it.
                    let (data, to) = unsafe {
                        (
                            std::slice::from_raw_parts(d.add(z), len),
                            std::slice::from_raw_parts_mut(out.0.add(base + z), len),
                        )
                    };
                    crate::kernels::fused::epilogue_into(p, bufs, base + z, data, to);
                });
            }
        };
        // Block `[i0, i1) × [j0, j1)` of batch `i`'s product over depth `k0..k1` into `d`
        // (an M×N row-major output), single-threaded, then the epilogue over it if `epi`.
        let span = |i: usize,
                    d: *mut f32,
                    (i0, i1): (usize, usize),
                    (j0, j1): (usize, usize),
                    (k0, k1): (usize, usize),
                    epi: bool| {
            let hook = |r0: usize, r1: usize, c0: usize, c1: usize| {
                finish(i, d, (i0 + r0, i0 + r1), (j0 + c0, j0 + c1))
            };
            let done: gemm_f32::Done<'_> = match epilogue {
                _ if epi && finishing => Some(&hook),
                _ => None,
            };
            let (oa, ob) = offsets(i);
            let oa = oa + i0 as i64 * sa[r - 3] + k0 as i64 * sa[r - 1];
            let ob = ob + j0 as i64 * sb[r - 2] + k0 as i64 * sb[r - 1];
            // SAFETY: `prepare` checked that every element the views address (offset plus
            // any in-range index times the strides, for all batches) lies inside `a` and
            // `b`, and the block's rows/columns are in range; `d` points at the M×N
            // row-major output of this batch, and the block writes only its own rows
            // `i0..i1` × columns `j0..j1` of it, which no other task writes. The buffers
            // do not alias (`d` is the kernel's own output buffer, taken out of the buffer
            // table).
            unsafe {
                gemm_f32::sgemm_tiled(
                    i1 - i0,
                    j1 - j0,
                    k1 - k0,
                    gemm_f32::Mat {
                        ptr: a.as_ptr().offset(oa as isize),
                        rs: sa[r - 3] as isize,
                        cs: sa[r - 1] as isize,
                    },
                    gemm_f32::Mat {
                        ptr: b.as_ptr().offset(ob as isize),
                        rs: sb[r - 1] as isize,
                        cs: sb[r - 2] as isize,
                    },
                    d.add(i0 * n + j0),
                    n,
                    self.tiles,
                    amx,
                    done,
                )
            }
        };
        let block = |i: usize, d: *mut f32, rows: (usize, usize), cols: (usize, usize)| {
            span(i, d, rows, cols, (0, k), true)
        };
        let call = |i: usize, d: &mut [f32]| block(i, d.as_mut_ptr(), (0, m), (0, n));
        let flops_per = m * n * k;
        // M = 1 with the weight contiguous along N: gemm's gemv is single-threaded (and
        // ~20% faster than `matvec_axpy` on one thread), so ours only when parallel.
        if m == 1 && self.threads > 1 && sa[r - 1] == 1 && sb[r - 2] == 1 && sb[r - 1] >= 0 && n > 1
        {
            self.matvec_axpy(a, b, dst, batch, n, k, &offsets);
            return Ok(false);
        }
        if m <= skinny::MAX_ROWS
            && sa[r - 1] == 1
            && sb[r - 1] == 1
            && sa[r - 3] >= 0
            && sb[r - 2] >= 0
        {
            // Skinny product with both operands contiguous along K (decode steps).
            let parallel = self.threads > 1 && flops_per >= (1 << 15);
            for (i, d) in dst.chunks_mut(m * n).enumerate() {
                let (oa, ob) = offsets(i);
                let w = skinny_f32::F32Rows::new(b, (ob as usize, sb[r - 2] as usize), n, k);
                skinny::skinny(&w, a, (oa as usize, sa[r - 3] as usize), d, m, parallel);
            }
            return Ok(false);
        }
        let staged = self.staging(
            batch,
            (m, n, k),
            amx,
            (sa[r - 3], sa[r - 1]),
            (sb[r - 2], sb[r - 1]),
        );
        if batch >= self.threads && flops_per < (1 << 21) && self.threads > 1 {
            // Many small matrices: one gemm per task, each single-threaded (and the
            // epilogue, through `finish`, over its output while it is in cache).
            crate::exec::par::for_each_chunk(dst, m * n, call);
        } else if let (Some(partials), Some((parts, transposed))) = (partials, staged) {
            // Computed in stages through `partials` (see `staging`): the product split
            // along K over the threads and/or computed transposed (`Cᵀ = Bᵀ·Aᵀ`),
            // then the slices added in order, the result transposed back and the epilogue
            // run, a block of output rows per task.
            //
            // Along K, part 0 sums its `kc` slices as the whole product would, every later
            // slice is computed alone (from zero in registers), and the slices are added to
            // part 0's sum in order: `((P₀ + P₁) + P₂) + …`, the sequential product's own
            // sums, so the result does not depend on the thread count. Transposed, each
            // element is the same FMA sequence over K (the two factors of each product
            // swapped), so neither depends on the path.
            let kc = self.tiles.kc.max(1);
            let blocks = k.div_ceil(kc);
            let start = |t: usize| t * blocks / parts;
            let slots = blocks - start(1);
            let first = if transposed { m * n } else { 0 };
            if partials.len() < first + slots * m * n {
                partials.resize(first + slots * m * n, 0.0);
            }
            let (d, p) = (
                skinny::OutPtr(dst.as_mut_ptr()),
                skinny::OutPtr(partials.as_mut_ptr()),
            );
            // The product over rows `rows` of the computed result (C, or Cᵀ: `n × m`) and
            // depth `k0..k1` into `into` (that result's layout, rows `m` or `n` long).
            let piece = |into: *mut f32, rows: (usize, usize), ks: (usize, usize)| {
                if !transposed {
                    return span(0, into, rows, (0, n), ks, false);
                }
                let ((j0, j1), (k0, k1)) = (rows, ks);
                let (oa, ob) = offsets(0);
                // SAFETY: as `span`'s product, with the operands' roles swapped: rows
                // `j0..j1` of `Bᵀ` (columns of B) and all of `Aᵀ` over depth `k0..k1`,
                // into rows `j0..j1` of the `n × m` block at `into`.
                unsafe {
                    gemm_f32::sgemm_tiled(
                        j1 - j0,
                        m,
                        k1 - k0,
                        gemm_f32::Mat {
                            ptr: b.as_ptr().offset(
                                (ob + j0 as i64 * sb[r - 2] + k0 as i64 * sb[r - 1]) as isize,
                            ),
                            rs: sb[r - 2] as isize,
                            cs: sb[r - 1] as isize,
                        },
                        gemm_f32::Mat {
                            ptr: a.as_ptr().offset((oa + k0 as i64 * sa[r - 1]) as isize),
                            rs: sa[r - 1] as isize,
                            cs: sa[r - 3] as isize,
                        },
                        into.add(j0 * m),
                        m,
                        self.tiles,
                        None,
                        None,
                    )
                }
            };
            let computed_rows = if transposed { n } else { m };
            let sum = skinny::OutPtr(if transposed { p.0 } else { d.0 });
            if parts > 1 {
                crate::exec::par::for_each(parts, |t| {
                    let (sum, p) = (&sum, &p);
                    let (b0, b1) = (start(t), start(t + 1));
                    if t == 0 {
                        piece(sum.0, (0, computed_rows), (0, (b1 * kc).min(k)));
                    } else {
                        for j in b0..b1 {
                            let slot = p.0.wrapping_add(first + (j - start(1)) * m * n);
                            piece(slot, (0, computed_rows), (j * kc, ((j + 1) * kc).min(k)));
                        }
                    }
                });
            } else {
                // Transposed only: rows of Cᵀ a thread.
                let h = computed_rows.div_ceil(crate::exec::par::threads());
                crate::exec::par::for_each(computed_rows.div_ceil(h), |t| {
                    let sum = &sum;
                    piece(sum.0, (t * h, ((t + 1) * h).min(computed_rows)), (0, k));
                });
            }
            let rows = m.div_ceil(crate::exec::par::threads());
            crate::exec::par::for_each(m.div_ceil(rows), |t| {
                let (d, p) = (&d, &p);
                let (r0, r1) = (t * rows, ((t + 1) * rows).min(m));
                // SAFETY: rows `r0..r1` of the `m × n` output, which no other task of this
                // loop touches; `partials` holds Cᵀ (when transposed) and then `slots`
                // `m × n` slices, only read here.
                let out = unsafe { std::slice::from_raw_parts_mut(d.0.add(r0 * n), (r1 - r0) * n) };
                let (all, slices) = unsafe {
                    (
                        std::slice::from_raw_parts(p.0, first + slots * m * n),
                        std::slice::from_raw_parts(p.0.add(first), slots * m * n),
                    )
                };
                if transposed {
                    for (i, row) in (r0..r1).zip(out.chunks_exact_mut(n)) {
                        for (j, o) in row.iter_mut().enumerate() {
                            let mut v = all[j * m + i];
                            for s in 0..slots {
                                v += slices[s * m * n + j * m + i];
                            }
                            *o = v;
                        }
                    }
                } else {
                    for s in 0..slots {
                        let add = &slices[s * m * n + r0 * n..][..(r1 - r0) * n];
                        for (o, &v) in out.iter_mut().zip(add) {
                            *o += v;
                        }
                    }
                }
                finish(0, d.0, (r0, r1), (0, n));
            });
        } else if flops_per >= (1 << 16) && crate::exec::par::threads() > 1 {
            // One product at a time, split into one block per thread: along N in
            // multiples of 16 columns when it is wide enough and at least M, else along M
            // (`Split::Auto`; a schedule may fix the axis).
            let threads = crate::exec::par::threads();
            let cols = match self.split {
                Split::Auto => n >= 32 * threads && n >= m,
                Split::Cols => n >= 16 * threads.min(2),
                Split::Rows | Split::Depth => false,
            };
            let out = skinny::OutPtr(dst.as_mut_ptr());
            for i in 0..batch {
                let d = out.0.wrapping_add(i * m * n);
                let d = skinny::OutPtr(d);
                if cols {
                    let w = n.div_ceil(threads).next_multiple_of(16);
                    crate::exec::par::for_each(n.div_ceil(w), |t| {
                        let d = d;
                        block(i, d.0, (0, m), (t * w, ((t + 1) * w).min(n)))
                    });
                } else {
                    let h = m.div_ceil(threads);
                    crate::exec::par::for_each(m.div_ceil(h), |t| {
                        let d = d;
                        block(i, d.0, (t * h, ((t + 1) * h).min(m)), (0, n))
                    });
                }
            }
        } else {
            for (i, d) in dst.chunks_mut(m * n).enumerate() {
                call(i, d);
            }
        }
        // Every gemm above ran the epilogue over the blocks it finished.
        Ok(finishing)
    }
}

impl MatmulKernel {
    /// How a single f32 product on the SIMD kernel is computed in stages (`None`: directly):
    /// the number of parts its depth is split into, a thread each, and whether it is
    /// computed transposed.
    ///
    /// Along K: products at least twice as deep as they are long and wide (a training
    /// step's weight gradients, `dYᵀ·X` over the tokens), or where the schedule says so,
    /// with at least one `kc` slice a part; a split along M or N would have every thread
    /// pack or stream all of the deep operand.
    ///
    /// Transposed (`Cᵀ = Bᵀ·Aᵀ`): products of at most two column panels of rows and more
    /// columns (`xᵀ·dY` with 64 features against 256), where the kernel then reads the
    /// large operand in place and packs the small one instead of packing the large one.
    fn staging(
        &self,
        batch: usize,
        (m, n, k): (usize, usize, usize),
        amx: Option<gemm_f32::MatmulPrecision>,
        (a_m, a_k): (i64, i64),
        (b_n, b_k): (i64, i64),
    ) -> Option<(usize, bool)> {
        if batch != 1 || amx.is_some() || m * n * k < 1 << 16 {
            return None;
        }
        let threads = crate::exec::par::threads().min(self.threads.max(1));
        let deep = match self.split {
            Split::Auto => k >= 2 * m.max(n),
            Split::Depth => true,
            Split::Rows | Split::Cols => false,
        };
        // One `m × n` slice of scratch for each `kc` slice after part 0's (to keep the
        // sequential sum order): at most `MAX_PARTIALS` floats of them.
        let blocks = k.div_ceil(self.tiles.kc.max(1));
        let parts = threads.min(blocks);
        let slots = blocks - blocks / parts.max(1);
        let parts = if deep && parts > 1 && slots * m * n <= MAX_PARTIALS {
            parts
        } else {
            1
        };
        let transposed = !gemm_f32::reads_narrow_a_in_place(n, a_m, a_k)
            && gemm_f32::reads_narrow_a_in_place(m, b_n, b_k)
            && m < n;
        (parts > 1 || transposed).then_some((parts, transposed))
    }

    /// Operand offsets of batch `i` (unravelled over the batch dims) from `base`.
    fn batch_offsets(&self, i: usize, base: (i64, i64)) -> (i64, i64) {
        let (sa, sb) = (&self.a_view.strides, &self.b_view.strides);
        let (mut oa, mut ob) = base;
        let mut rem = i as i64;
        for d in (0..self.a_view.dims.len() - 3).rev() {
            let c = rem % self.a_view.dims[d];
            rem /= self.a_view.dims[d];
            oa += c * sa[d];
            ob += c * sb[d];
        }
        (oa, ob)
    }

    /// The product with `b` a weight `W: [N, K]` of `dtype` read in place (the lowering
    /// checked that `b`'s view is the plain `Wᵀ`, shared by every batch).
    fn run_weight(
        &self,
        bufs: &[Storage],
        dtype: DType,
        dst: &mut [f32],
        scratch: &mut crate::kernel::HalfScratch,
    ) -> Result<()> {
        let crate::kernel::HalfScratch {
            norm: norm_rows,
            norm_of,
            run,
            ..
        } = scratch;
        let (batch, m, n, k) = self.shape();
        let w = WeightRef::of(&bufs[self.b], dtype, n, k).ok_or_else(|| {
            LuminalError::Backend(format!(
                "weight matmul: the weight buffer does not hold a [{n}, {k}] {dtype} matrix"
            ))
        })?;
        let Storage::F32(a) = &bufs[self.a] else {
            return Err(LuminalError::Backend(
                "weight matmul reads f32 activations".into(),
            ));
        };
        let dst = &mut dst[..batch * m * n];
        let r = self.a_view.dims.len();
        let sa = &self.a_view.strides;
        let mut rows = vec![];
        let refine = self.refine.min(n);
        let refine = if !crate::kernels::quant::takes_int8(dtype, m, self.exact) {
            0
        } else {
            refine
        };
        for (i, d) in dst.chunks_mut((m * n).max(1)).enumerate() {
            let (oa, _) = self.batch_offsets(i, (self.a_view.offset, 0));
            let (x, x_off, x_row) = if let Some(norm) = &self.norm {
                // The rows normalised first (the lowering checked that `a`'s view reads
                // whole rows of K contiguous values).
                let w = match norm.weight.map(|w| &bufs[w]) {
                    None => None,
                    Some(Storage::F32(w)) if w.len() >= k => Some(&w[..k]),
                    Some(_) => {
                        return Err(LuminalError::Backend(format!(
                            "RMSNorm prologue: the scale is not {k} f32 values"
                        )))
                    }
                };
                let (off, row) = (oa as usize, sa[r - 3] as usize);
                let key = NormRows {
                    run: *run,
                    node: norm.node,
                    at: (off, row, m, k),
                };
                if !(norm.shared && *norm_of == Some(key)) {
                    if norm_rows.len() < m * k {
                        norm_rows.resize(m * k, 0.0);
                    }
                    let task = |rows: Range<usize>, out: &mut [f32]| {
                        let (x, norm) = (&a[..], norm);
                        simd::run(NormTask {
                            norm,
                            x,
                            w,
                            off,
                            row,
                            rows,
                            out,
                        })
                    };
                    let threads = crate::exec::par::threads();
                    if m > skinny::MAX_ROWS && threads > 1 {
                        let per = m.div_ceil(threads * 2);
                        crate::exec::par::for_each_chunk(
                            &mut norm_rows[..m * k],
                            per * k,
                            |c, out| task(c * per..(c * per + out.len() / k), out),
                        );
                    } else {
                        task(0..m, &mut norm_rows[..m * k]);
                    }
                    *norm_of = norm.shared.then_some(key);
                }
                (&norm_rows[..], 0, k)
            } else if sa[r - 1] == 1 && sa[r - 3] >= 0 {
                (&a[..], oa as usize, sa[r - 3] as usize)
            } else {
                // Rows not contiguous along K (a transposed activation): gathered first.
                rows.clear();
                for row in 0..m as i64 {
                    for kk in 0..k as i64 {
                        rows.push(a[(oa + row * sa[r - 3] + kk * sa[r - 1]) as usize]);
                    }
                }
                (&rows[..], 0, k)
            };
            weight_matmul(x, x_off, x_row, w, d, m, self.threads, self.exact);
            if refine > 0 {
                // Rows in parallel (a prefill's logits: one task per row).
                crate::exec::par::for_each_chunk(d, n, |row, out| {
                    refine_row(&x[x_off + row * x_row..][..k], w, out, refine)
                });
            }
        }
        Ok(())
    }
}

/// Recomputes the `top` largest entries of `out` (one output row of `x · Wᵀ` computed with
/// int8 activations) as f32-activation dots. No allocation (`top ≤ REFINE_TOP`).
fn refine_row(x: &[f32], w: WeightRef, out: &mut [f32], top: usize) {
    let top = top.min(REFINE_TOP);
    // The `top` largest so far, ascending by value (a small insertion-sorted array).
    let mut best = [(f32::NEG_INFINITY, 0usize); REFINE_TOP];
    let best = &mut best[..top];
    for (j, &v) in out.iter().enumerate() {
        if v > best[0].0 {
            let mut p = 0;
            while p + 1 < top && best[p + 1].0 < v {
                best[p] = best[p + 1];
                p += 1;
            }
            best[p] = (v, j);
        }
    }
    let rb = w.row_bytes();
    for &(v, j) in best.iter() {
        if v == f32::NEG_INFINITY {
            continue;
        }
        let row = WeightRef {
            dtype: w.dtype,
            bytes: &w.bytes[j * rb..(j + 1) * rb],
            n: 1,
            k: w.k,
        };
        let mut exact = [0f32];
        weight_matmul(x, 0, w.k, row, &mut exact, 1, 1, true);
        out[j] = exact[0];
    }
}

/// Axpy-form matvec task: columns `c0 .. c0 + out.len()` of batch `i`, accumulating rows of
/// `b` (weights stored `[K, N]`) scaled by `a`'s elements; the output chunk stays in L1.
struct AxpyTask<'a> {
    a: &'a [f32],
    b: &'a [f32],
    out: &'a mut [f32],
    c0: usize,
    k: usize,
    /// Stride of `b` between rows (along K).
    sb_k: usize,
    oa: usize,
    ob: usize,
}

impl Task for AxpyTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let AxpyTask {
            a,
            b,
            out,
            c0,
            k,
            sb_k,
            oa,
            ob,
        } = self;
        let w = out.len();
        out.fill(0.0);
        let row = |q: usize| {
            let s = ob + q * sb_k + c0;
            &b[s..s + w]
        };
        // Eight rows of `b` per pass over the output chunk, summed as a tree (short
        // dependency chains; the chunk is loaded and stored once per eight rows).
        let mut q = 0;
        while q + 8 <= k {
            let x = &a[oa + q..oa + q + 8];
            let r = [
                row(q),
                row(q + 1),
                row(q + 2),
                row(q + 3),
                row(q + 4),
                row(q + 5),
                row(q + 6),
                row(q + 7),
            ];
            for c in 0..w {
                let s01 = simd::fma::<F>(x[1], r[1][c], x[0] * r[0][c]);
                let s23 = simd::fma::<F>(x[3], r[3][c], x[2] * r[2][c]);
                let s45 = simd::fma::<F>(x[5], r[5][c], x[4] * r[4][c]);
                let s67 = simd::fma::<F>(x[7], r[7][c], x[6] * r[6][c]);
                out[c] += (s01 + s23) + (s45 + s67);
            }
            q += 8;
        }
        while q < k {
            let (x0, r0) = (a[oa + q], row(q));
            for c in 0..w {
                out[c] = simd::fma::<F>(x0, r0[c], out[c]);
            }
            q += 1;
        }
    }
}

impl MatmulKernel {
    /// `M == 1` products whose weight is contiguous along N (stored `[K, N]`): memory-bound,
    /// so parallelised over output columns with an axpy loop (each task's output chunk
    /// stays in L1 while the rows of `b` stream past), instead of gemm's tiled path, which
    /// runs on one thread at this shape. (Weights contiguous along K take `matvec::skinny`.)
    #[allow(clippy::too_many_arguments)]
    fn matvec_axpy(
        &self,
        a: &[f32],
        b: &[f32],
        dst: &mut [f32],
        batch: usize,
        n: usize,
        k: usize,
        offsets: &(impl Fn(usize) -> (i64, i64) + Sync),
    ) {
        let r = self.b_view.strides.len();
        let sb_k = self.b_view.strides[r - 1];
        // One column chunk per thread (longer row segments stream better than more,
        // shorter tasks), at least 256 wide.
        let cols = n
            .div_ceil(crate::exec::par::threads())
            .max(256)
            .next_multiple_of(16);
        crate::exec::par::for_each_chunk(&mut dst[..batch * n], n, |i, row_out| {
            let (oa, ob) = offsets(i);
            crate::exec::par::for_each_chunk(row_out, cols, |t, out| {
                simd::run(AxpyTask {
                    a,
                    b,
                    out,
                    c0: t * cols,
                    k,
                    sb_k: sb_k as usize,
                    oa: oa as usize,
                    ob: ob as usize,
                })
            })
        });
    }
}

impl CpuKernel for MatmulKernel {
    fn reads(&self) -> Vec<BufId> {
        let mut r = vec![self.a, self.b];
        if let Some(e) = &self.epilogue {
            r.extend(e.reads());
        }
        r.extend(self.norm.and_then(|n| n.weight));
        if let Some(p) = &self.side {
            r.extend(p.reads());
        }
        r
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.a = map(self.a);
        self.b = map(self.b);
        if let Some(NormPrologue {
            weight: Some(w), ..
        }) = &mut self.norm
        {
            *w = map(*w);
        }
        if let Some(e) = &mut self.epilogue {
            e.remap(map);
        }
        if let Some(p) = &mut self.side {
            p.remap(map);
        }
    }
    fn scratch(&self) -> Scratch {
        let instrs = |p: &Option<Program>| p.as_ref().map_or(0, |p| p.instrs.len());
        Scratch {
            instrs: instrs(&self.epilogue).max(instrs(&self.side)),
            gemm: self.weight.is_none().then_some(self.tiles),
        }
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.prepare(cx.dims, cx.bufs)?;
        self.product(cx.bufs, out, cx.half_scratch, cx.side)
    }
    fn flops(&self, _n: usize) -> usize {
        let (b, m, n, k) = self.shape();
        let per = |p: &Option<Program>| p.as_ref().map_or(0, |p| p.flops_per_element());
        b * m * n * (2 * k + per(&self.epilogue) + per(&self.side))
    }
    fn accepts_side_output(&self) -> bool {
        self.side.is_none() && self.weight.is_none() && self.norm.is_none() && self.refine == 0
    }
    fn add_side_output(&mut self, prog: Program) -> std::result::Result<(), Program> {
        if !self.accepts_side_output() {
            return Err(prog);
        }
        self.side = Some(prog);
        Ok(())
    }
    fn weight_input(&self) -> Option<BufId> {
        self.weight.map(|_| self.b)
    }
}

/// Helpers of the kernel tests of this module's products.
#[cfg(test)]
pub(crate) mod testing {
    /// `n` values in [−1, 1], a xorshift stream seeded by `seed`.
    pub(crate) fn vals(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// `dst[i·n + j]` equals `Σ_q a[a_off + i·a_row + q] · w(j, q)` computed in f64, within
    /// `1e-6 · Σ|products|`, for `i < m`, `j < n`; and `dst[m·n]` (a NaN guard) is untouched.
    pub(crate) fn assert_matches_f64(
        what: &str,
        a: &[f32],
        (a_off, a_row): (usize, usize),
        w: impl Fn(usize, usize) -> f32,
        dst: &[f32],
        (m, n, k): (usize, usize, usize),
    ) {
        for i in 0..m {
            for j in 0..n {
                let (mut want, mut mag) = (0f64, 0f64);
                for q in 0..k {
                    let p = a[a_off + i * a_row + q] as f64 * w(j, q) as f64;
                    want += p;
                    mag += p.abs();
                }
                let got = dst[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * mag + 1e-30,
                    "{what} m={m} n={n} k={k} [{i},{j}]: {got} vs {want}"
                );
            }
        }
        assert!(dst[m * n].is_nan(), "{what}: wrote past m·n");
    }
}
