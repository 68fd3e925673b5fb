//! Fused attention, `softmax(q·kᵀ·scale + bias)·v`, in memory linear in the sequence: the
//! `[s, t]` score matrix is never materialised. Keys are visited in blocks with an online
//! softmax (flash-attention style): each query row keeps its running maximum, its running
//! sum of exponentials and its unnormalised output, rescaled when the maximum grows.
//!
//! - q, k and v are read in place through their views (k and v straight from the KV cache);
//!   query heads that read the same k and v (a grouped-query group: the stride-0 expand of
//!   `causal_attention`) are processed together, so each key block is read once per group.
//! - The bias is optional. When present it is the fused program of the node the graph adds
//!   (the causal / sliding-window mask over `[s, t]`, or a padding bias over `[b, t]`
//!   broadcast over heads and queries), read through its view and evaluated block by block
//!   (see `lower/attention.rs`); a key block the bias hides (`-inf`) from every row of a
//!   query tile is skipped.
//! - Prefill (many query rows): parallel over query tiles × chunks of (batch, head) groups;
//!   the block products run on our packed GEMM (`kernels::matmul::gemm_f32`).
//!   Decode (few rows): the keys are split across threads, each split keeps its own
//!   running state, and a combine step merges them (short key ranges: parallel over groups).

use crate::kernel::{BufId, CpuKernel, RunCtx, Scratch};
use crate::kernels::fused::{Program, RowEnv};
use crate::kernels::matmul::gemm_f32 as mm;
use crate::simd::{self, Task};
use crate::storage::Storage;
use crate::view::{LaunchExpr, ResolvedView, ViewExprs};
use luminal::{LuminalError, Result};

/// Query rows per tile when prefilling.
const QUERY_TILE: usize = 64;
/// Keys per block when prefilling.
const KEY_BLOCK: usize = 256;
/// At most this many query rows count as decoding: one tile, keys split across threads.
const DECODE_ROWS: usize = 8;
/// Lanes of the vectorised reductions (one AVX-512 register of f32).
const LANES: usize = 16;
/// Keys per block when decoding, and the least keys a split gets.
const DECODE_BLOCK: usize = 256;

/// The additive bias: the fused program of the bias node (evaluated at the node's flat
/// element indices) and the view the pattern reads it through, `[batch.., s, t]` with unit
/// stride along `t`.
#[derive(Debug)]
pub struct AttentionBias {
    pub program: Program,
    exprs: ViewExprs,
    view: ResolvedView,
    /// Elements of the bias node (the view must stay inside them).
    numel: LaunchExpr,
}

impl AttentionBias {
    pub fn new(program: Program, exprs: ViewExprs, numel: LaunchExpr) -> AttentionBias {
        AttentionBias {
            program,
            exprs,
            view: ResolvedView::default(),
            numel,
        }
    }
}

#[derive(Debug)]
pub struct AttentionKernel {
    pub q: BufId,
    pub k: BufId,
    pub v: BufId,
    /// q over `[batch.., s, t, d]` (stride 0 along t), k over `[batch.., s, t, d]` (stride 0
    /// along s), v over `[batch.., s, d, t]` (stride 0 along s); unit stride along d.
    q_exprs: ViewExprs,
    k_exprs: ViewExprs,
    v_exprs: ViewExprs,
    q_view: ResolvedView,
    k_view: ResolvedView,
    v_view: ResolvedView,
    /// Number of batch dims (batch, heads, …) before `s`.
    batch_dims: usize,
    pub scale: f32,
    pub bias: Option<AttentionBias>,
    /// Launch state, grown once: per batch index its q, k, v and bias offsets; batch indices
    /// ordered so that those sharing k, v and bias are adjacent; group boundaries in that
    /// order; scratch.
    offsets: Vec<[i64; 4]>,
    order: Vec<u32>,
    groups: Vec<(usize, usize)>,
    arena: Vec<f32>,
}

impl AttentionKernel {
    pub fn new(
        (q, k, v): (BufId, BufId, BufId),
        (q_exprs, k_exprs, v_exprs): (ViewExprs, ViewExprs, ViewExprs),
        batch_dims: usize,
        scale: f32,
        bias: Option<AttentionBias>,
    ) -> AttentionKernel {
        AttentionKernel {
            q,
            k,
            v,
            q_exprs,
            k_exprs,
            v_exprs,
            q_view: ResolvedView::default(),
            k_view: ResolvedView::default(),
            v_view: ResolvedView::default(),
            batch_dims,
            scale,
            bias,
            offsets: vec![],
            order: vec![],
            groups: vec![],
            arena: vec![],
        }
    }
}

/// Sizes of one launch.
#[derive(Clone, Copy, Debug)]
struct Plan {
    batch: usize,
    s: usize,
    t: usize,
    d: usize,
    q_s: usize,
    k_t: usize,
    v_t: usize,
    /// The bias's stride along s (along t it is 1).
    b_s: usize,
    has_bias: bool,
    /// Query rows per tile, keys per block, key splits.
    qt: usize,
    kb: usize,
    splits: usize,
    /// Most batch indices in one group.
    gmax: usize,
    /// Floats of one worker's scratch.
    per_worker: usize,
}

impl Plan {
    /// Rows of the running state a worker keeps: every batch index's when the keys are
    /// split (the combine step reads them), one group's otherwise.
    fn state_rows(&self) -> usize {
        if self.splits > 1 {
            self.batch * self.qt
        } else {
            self.gmax * self.qt
        }
    }

    /// Scratch layout of one worker: q rows, scores, bias, accumulators, maxima, sums.
    fn parts(&self) -> [usize; 6] {
        let rows = self.gmax * self.qt;
        let state = self.state_rows();
        let bias = if self.has_bias {
            self.qt * self.t.div_ceil(self.splits)
        } else {
            self.kb
        };
        [
            rows * self.d,
            rows * self.kb,
            bias,
            state * self.d,
            state,
            state,
        ]
    }
}

fn split_parts<'a>(mut s: &'a mut [f32], parts: [usize; 6]) -> [&'a mut [f32]; 6] {
    let mut out: [&mut [f32]; 6] = Default::default();
    for (o, n) in out.iter_mut().zip(parts) {
        let (a, b) = s.split_at_mut(n);
        *o = a;
        s = b;
    }
    out
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: workers write disjoint output rows (each task's query tile of its groups) and
// disjoint parts of the arena.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

fn backend_err(msg: &str) -> LuminalError {
    LuminalError::Backend(format!("attention: {msg}"))
}

impl CpuKernel for AttentionKernel {
    fn reads(&self) -> Vec<BufId> {
        let mut r = vec![self.q, self.k, self.v];
        if let Some(b) = &self.bias {
            r.extend(b.program.reads());
        }
        r
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.q = map(self.q);
        self.k = map(self.k);
        self.v = map(self.v);
        if let Some(b) = &mut self.bias {
            b.program.remap(map);
        }
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: self.bias.as_ref().map_or(0, |b| b.program.instrs.len()),
        }
    }
    fn flops(&self, n: usize) -> usize {
        // n = batch·s·d outputs, each the sum over t keys of two products (q·k, p·v).
        let t = self
            .q_view
            .dims
            .get(self.batch_dims + 1)
            .copied()
            .unwrap_or(0) as usize;
        4 * n * t
    }

    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        let bufs = cx.bufs;
        let f32_of = |b: BufId| match &bufs[b] {
            Storage::F32(v) => Ok(v.as_slice()),
            _ => Err(backend_err("q, k and v must be f32")),
        };
        let (q, k, v) = (f32_of(self.q)?, f32_of(self.k)?, f32_of(self.v)?);
        self.q_exprs.resolve(cx.dims, &mut self.q_view)?;
        self.k_exprs.resolve(cx.dims, &mut self.k_view)?;
        self.v_exprs.resolve(cx.dims, &mut self.v_view)?;
        self.q_view.check_bounds(q.len())?;
        self.k_view.check_bounds(k.len())?;
        self.v_view.check_bounds(v.len())?;
        let nb = self.batch_dims;
        if let Some(b) = &mut self.bias {
            b.program.prepare(cx.dims, bufs)?;
            b.exprs.resolve(cx.dims, &mut b.view)?;
            // The program is evaluated at the bias node's flat indices: every index the
            // view reads must be one of them.
            b.view
                .check_bounds(b.numel.eval(cx.dims)?.max(0) as usize)?;
            if b.view.masked || (b.view.dims[nb + 1] > 1 && b.view.strides[nb + 1] != 1) {
                return Err(backend_err("the bias must be read unmasked, keys adjacent"));
            }
        }
        // The tile loops and the GEMM step through rows with unsigned strides.
        let bias_view = self.bias.as_ref().map(|b| &b.view);
        if [&self.q_view, &self.k_view, &self.v_view]
            .into_iter()
            .chain(bias_view)
            .any(|v| v.strides.iter().any(|&st| st < 0) || v.offset < 0)
        {
            return Err(backend_err(
                "q, k, v and bias views need non-negative strides",
            ));
        }
        let dims = &self.q_view.dims;
        let (s, t, d) = (
            dims[nb] as usize,
            dims[nb + 1] as usize,
            dims[nb + 2] as usize,
        );
        let batch: usize = dims[..nb].iter().product::<i64>() as usize;
        let Storage::F32(o) = out else {
            return Err(backend_err("f32 output"));
        };
        let o = &mut o[..cx.n];
        if batch * s * d == 0 {
            return Ok(());
        }
        // Offsets of every batch index; order batch indices by the (k, v, bias) they read.
        self.offsets.clear();
        for b in 0..batch {
            let (mut rem, mut off) = (b as i64, [0i64; 4]);
            for i in (0..nb).rev() {
                let n = self.q_view.dims[i];
                let c = rem % n;
                rem /= n;
                off[0] += c * self.q_view.strides[i];
                off[1] += c * self.k_view.strides[i];
                off[2] += c * self.v_view.strides[i];
                off[3] += bias_view.map_or(0, |v| c * v.strides[i]);
            }
            off[0] += self.q_view.offset;
            off[1] += self.k_view.offset;
            off[2] += self.v_view.offset;
            off[3] += bias_view.map_or(0, |v| v.offset);
            self.offsets.push(off);
        }
        self.order.clear();
        self.order.extend(0..batch as u32);
        let offsets = &self.offsets;
        self.order.sort_unstable_by_key(|&b| {
            let o = offsets[b as usize];
            (o[1], o[2], o[3], b)
        });
        self.groups.clear();
        let mut start = 0;
        for p in 1..=batch {
            let same = p < batch && {
                let (a, b) = (
                    offsets[self.order[p - 1] as usize],
                    offsets[self.order[p] as usize],
                );
                a[1..] == b[1..]
            };
            if !same {
                self.groups.push((start, p));
                start = p;
            }
        }
        let threads = crate::exec::par::threads();
        let (qt, kb, splits) = if s <= DECODE_ROWS {
            let splits = if threads > 1 {
                t.div_ceil(DECODE_BLOCK).min(2 * threads).max(1)
            } else {
                1
            };
            (s, DECODE_BLOCK, splits)
        } else {
            (QUERY_TILE, KEY_BLOCK, 1)
        };
        let tiles = s.div_ceil(qt);
        let ngroups = self.groups.len();
        // Enough tasks for the threads: query tiles × chunks of groups (× key splits).
        let chunks = if splits > 1 {
            1
        } else {
            ngroups.min((4 * threads).div_ceil(tiles)).max(1)
        };
        let mut plan = Plan {
            batch,
            s,
            t,
            d,
            q_s: self.q_view.strides[nb] as usize,
            k_t: self.k_view.strides[nb + 1] as usize,
            v_t: self.v_view.strides[nb + 2] as usize,
            b_s: bias_view.map_or(0, |v| v.strides[nb] as usize),
            has_bias: self.bias.is_some(),
            qt,
            kb,
            splits,
            gmax: self.groups.iter().map(|&(a, b)| b - a).max().unwrap_or(1),
            per_worker: 0,
        };
        plan.per_worker = plan.parts().iter().sum();
        let tasks = tiles * chunks * splits;
        // With one split, worker `w` does tasks w, w + W, …; with several, one task each
        // (its scratch then holds the split's partial state for the combine step).
        let workers = if splits > 1 {
            tasks
        } else {
            tasks.min(2 * threads)
        };
        if self.arena.len() < workers * plan.per_worker {
            self.arena.resize(workers * plan.per_worker, 0.0);
        }
        let arena = SendPtr(self.arena.as_mut_ptr());
        let out_ptr = SendPtr(o.as_mut_ptr());
        let bias = self.bias.as_ref().map(|b| &b.program);
        let (order, groups, scale) = (&self.order, &self.groups, self.scale);
        crate::exec::par::for_each(workers, |w| {
            let arena = &arena;
            // SAFETY: worker `w` owns floats `w·per_worker ..` of the arena, which holds
            // `workers · per_worker` floats and is not otherwise touched during the loop.
            let scratch = unsafe {
                std::slice::from_raw_parts_mut(arena.0.add(w * plan.per_worker), plan.per_worker)
            };
            let mut task = w;
            while task < tasks {
                let rest = task / splits;
                let chunk = rest % chunks;
                let cx = TileCx {
                    plan,
                    q,
                    k,
                    v,
                    bufs,
                    bias,
                    scale,
                    order,
                    offsets,
                    groups: &groups[chunk * ngroups / chunks..(chunk + 1) * ngroups / chunks],
                    tile: rest / chunks,
                    split: task % splits,
                    out: out_ptr,
                };
                cx.attend(split_parts(&mut scratch[..], plan.parts()));
                task += if splits > 1 { tasks } else { workers };
            }
        });
        if splits > 1 {
            // Combine the splits' states: out = Σ e^(m_i − M) acc_i / Σ e^(m_i − M) l_i.
            let parts = plan.parts();
            let part = |w: usize| {
                let base = &self.arena[w * plan.per_worker..(w + 1) * plan.per_worker];
                let (acc, rest) = base[parts[0] + parts[1] + parts[2]..].split_at(parts[3]);
                let (m, l) = rest.split_at(parts[4]);
                (acc, m, l)
            };
            for (p, &b) in self.order.iter().enumerate() {
                for ii in 0..s {
                    let r = p * qt + ii;
                    let mx = (0..workers)
                        .map(|w| part(w).1[r])
                        .fold(f32::NEG_INFINITY, f32::max);
                    let dst = &mut o[(b as usize * s + ii) * d..][..d];
                    dst.fill(0.0);
                    let mut sum = 0.0;
                    for w in 0..workers {
                        let (acc, m, l) = part(w);
                        if m[r] == f32::NEG_INFINITY {
                            continue;
                        }
                        let c = ((m[r] - mx) * std::f32::consts::LOG2_E).exp2();
                        sum += c * l[r];
                        for (x, a) in dst.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                            *x += c * a;
                        }
                    }
                    let inv = 1.0 / sum;
                    dst.iter_mut().for_each(|x| *x *= inv);
                }
            }
        }
        Ok(())
    }
}

/// One query tile of some groups over one key split.
struct TileCx<'a> {
    plan: Plan,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    bufs: &'a [Storage],
    bias: Option<&'a Program>,
    scale: f32,
    order: &'a [u32],
    offsets: &'a [[i64; 4]],
    /// The groups this task covers.
    groups: &'a [(usize, usize)],
    tile: usize,
    split: usize,
    out: SendPtr,
}

impl TileCx<'_> {
    /// Runs the task's groups over its key split. With one split each group's rows are
    /// normalised and written to the output; with several, the unnormalised outputs stay
    /// in `acc`, the running maxima in `m` and the sums of exponentials in `l` (row
    /// `p·qt + ii`: batch index `order[p]`, query `tile·qt + ii`) for the combine step.
    fn attend(&self, [qs, sc, bs, acc, m, l]: [&mut [f32]; 6]) {
        let Plan {
            s,
            t,
            d,
            qt,
            kb,
            splits,
            q_s,
            b_s,
            ..
        } = self.plan;
        let i0 = self.tile * qt;
        let nq = qt.min(s - i0);
        let chunk = t.div_ceil(splits);
        let (j0, j1) = (
            (self.split * chunk).min(t),
            ((self.split + 1) * chunk).min(t),
        );
        let span = j1 - j0;
        if self.bias.is_none() {
            bs.fill(0.0);
        }
        // The bias offset whose rows `bs` holds.
        let mut bias_at = None;
        for &(p0, p1) in self.groups {
            let np = p1 - p0;
            let base = if splits > 1 { p0 * qt } else { 0 };
            let rows = base..base + np * qt;
            let (m, l) = (&mut m[rows.clone()], &mut l[rows.clone()]);
            let acc = &mut acc[rows.start * d..rows.end * d];
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            acc.fill(0.0);
            // The tile's query rows, adjacent per batch index.
            for (pp, &b) in self.order[p0..p1].iter().enumerate() {
                let qo = self.offsets[b as usize][0] as usize;
                for ii in 0..nq {
                    let src = &self.q[qo + (i0 + ii) * q_s..][..d];
                    qs[(pp * qt + ii) * d..][..d].copy_from_slice(src);
                }
            }
            let [_, ko, vo, bo] = self.offsets[self.order[p0] as usize];
            // The bias of the tile's rows over the split's keys, in pieces of at most one
            // interpreter block; shared by the group, and by the next while it is the same.
            if let Some(bias) = self.bias {
                if bias_at != Some(bo) {
                    bias_at = Some(bo);
                    bias.with_regs(|mut regs| {
                        for ii in 0..nq {
                            let mut j = j0;
                            while j < j1 {
                                let n = (j1 - j).min(crate::kernels::fused::BLOCK);
                                let dst = &mut bs[ii * span + (j - j0)..][..n];
                                let z0 = bo as usize + (i0 + ii) * b_s + j;
                                if let Some(src) =
                                    bias.eval(self.bufs, RowEnv::NONE, z0, n, &mut regs, dst)
                                {
                                    dst.copy_from_slice(&src[..n]);
                                }
                                j += n;
                            }
                        }
                    });
                }
            }
            self.group(
                &qs[..np * qt * d],
                &mut sc[..np * qt * kb],
                bs,
                (ko as usize, vo as usize),
                (j0, j1, nq),
                (acc, m, l),
            );
            if splits == 1 {
                for (pp, &b) in self.order[p0..p1].iter().enumerate() {
                    for ii in 0..nq {
                        let r = pp * qt + ii;
                        let inv = 1.0 / l[r];
                        let at = (b as usize * s + i0 + ii) * d;
                        // SAFETY: row `i0 + ii` of batch index `b` belongs to this task
                        // only; `at + d <= batch·s·d`, the output's length.
                        let dst = unsafe { std::slice::from_raw_parts_mut(self.out.0.add(at), d) };
                        for (x, a) in dst.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                            *x = a * inv;
                        }
                    }
                }
            }
        }
    }

    /// One group's rows (`q_rows`, `np·qt` of them) over keys `j0..j1`.
    #[allow(clippy::type_complexity)]
    fn group(
        &self,
        q_rows: &[f32],
        sc: &mut [f32],
        bs: &[f32],
        (ko, vo): (usize, usize),
        (j0, j1, nq): (usize, usize, usize),
        (acc, m, l): (&mut [f32], &mut [f32], &mut [f32]),
    ) {
        let Plan {
            d,
            qt,
            kb,
            k_t,
            v_t,
            has_bias,
            ..
        } = self.plan;
        let rows = q_rows.len() / d;
        let span = j1 - j0;
        let mut jb = j0;
        while jb < j1 {
            let n = kb.min(j1 - jb);
            let boff = jb - j0;
            if has_bias
                && !(0..nq).any(|ii| {
                    bs[ii * span + boff..][..n]
                        .iter()
                        .any(|&x| x != f32::NEG_INFINITY)
                })
            {
                jb += n;
                continue;
            }
            let k_rows = &self.k[ko + jb * k_t..];
            let v_rows = &self.v[vo + jb * v_t..];
            if nq <= DECODE_ROWS {
                // Few rows (decoding): direct dot products; packing K for a GEMM would
                // cost as much as the product itself.
                simd::run(Scores {
                    sc,
                    q: q_rows,
                    k: k_rows,
                    k_t,
                    n,
                    kb,
                    d,
                });
            } else {
                // SAFETY: the views were bounds-checked over every (t, d) they address;
                // `q_rows`, `sc` hold `rows × d` and `rows × kb` floats.
                unsafe {
                    mm::sgemm_acc(
                        rows,
                        n,
                        d,
                        mm::Mat {
                            ptr: q_rows.as_ptr(),
                            rs: d as isize,
                            cs: 1,
                        },
                        mm::Mat {
                            ptr: k_rows.as_ptr(),
                            rs: 1,
                            cs: k_t as isize,
                        },
                        sc.as_mut_ptr(),
                        kb,
                        false,
                    );
                }
            }
            let (bs, bstride) = if has_bias {
                (&bs[boff..], span)
            } else {
                (bs, 0)
            };
            simd::run(Softmax {
                sc,
                bs,
                bstride,
                m,
                l,
                acc,
                scale: self.scale,
                qt,
                nq,
                n,
                kb,
                d,
            });
            if nq <= DECODE_ROWS {
                simd::run(Accumulate {
                    acc,
                    p: sc,
                    v: v_rows,
                    v_t,
                    n,
                    kb,
                    d,
                });
            } else {
                // SAFETY: as above; `acc` holds `rows × d` floats.
                unsafe {
                    mm::sgemm_acc(
                        rows,
                        d,
                        n,
                        mm::Mat {
                            ptr: sc.as_ptr(),
                            rs: kb as isize,
                            cs: 1,
                        },
                        mm::Mat {
                            ptr: v_rows.as_ptr(),
                            rs: v_t as isize,
                            cs: 1,
                        },
                        acc.as_mut_ptr(),
                        d,
                        true,
                    );
                }
            }
            jb += n;
        }
    }
}

/// The online-softmax step of one block for the rows of one group: scores become
/// probabilities relative to the new running maximum (in place), and the running sums and
/// accumulators are rescaled to it. Rows past `nq` in a tile (the last, short one) are
/// zeroed so the product adds nothing.
struct Softmax<'a> {
    sc: &'a mut [f32],
    /// The bias of the block's first key for query row 0; rows `bstride` apart.
    bs: &'a [f32],
    bstride: usize,
    m: &'a mut [f32],
    l: &'a mut [f32],
    acc: &'a mut [f32],
    scale: f32,
    qt: usize,
    nq: usize,
    n: usize,
    kb: usize,
    d: usize,
}

impl Task for Softmax<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let rows = self.m.len();
        let log2e = std::f32::consts::LOG2_E;
        for r in 0..rows {
            let ii = r % self.qt;
            let x = &mut self.sc[r * self.kb..r * self.kb + self.n];
            if ii >= self.nq {
                x.fill(0.0);
                continue;
            }
            let b = &self.bs[ii * self.bstride..ii * self.bstride + self.n];
            // Lane-wise maximum and sum, so the loops vectorise.
            let mut lanes = [f32::NEG_INFINITY; LANES];
            let split = x.len() / LANES * LANES;
            let (xm, xt) = x.split_at_mut(split);
            for (xc, bc) in xm.chunks_exact_mut(LANES).zip(b.chunks_exact(LANES)) {
                for i in 0..LANES {
                    let v = simd::fma::<F>(xc[i], self.scale, bc[i]);
                    xc[i] = v;
                    lanes[i] = if v > lanes[i] { v } else { lanes[i] };
                }
            }
            for (i, xv) in xt.iter_mut().enumerate() {
                let v = simd::fma::<F>(*xv, self.scale, b[split + i]);
                *xv = v;
                lanes[i] = if v > lanes[i] { v } else { lanes[i] };
            }
            let mx = lanes
                .iter()
                .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
            let m_new = if mx > self.m[r] { mx } else { self.m[r] };
            if m_new == f32::NEG_INFINITY {
                x.fill(0.0);
                continue;
            }
            let corr = simd::exp2::<F>((self.m[r] - m_new) * log2e);
            let mut sums = [0f32; LANES];
            let (xm, xt) = x.split_at_mut(split);
            for xc in xm.chunks_exact_mut(LANES) {
                for i in 0..LANES {
                    let e = simd::exp2::<F>((xc[i] - m_new) * log2e);
                    xc[i] = e;
                    sums[i] += e;
                }
            }
            for (i, xv) in xt.iter_mut().enumerate() {
                let e = simd::exp2::<F>((*xv - m_new) * log2e);
                *xv = e;
                sums[i] += e;
            }
            let sum: f32 = sums.iter().sum();
            if corr != 1.0 {
                self.acc[r * self.d..(r + 1) * self.d]
                    .iter_mut()
                    .for_each(|a| *a *= corr);
            }
            self.l[r] = self.l[r] * corr + sum;
            self.m[r] = m_new;
        }
    }
}

/// `sc[r][j] = q_r · k_j` for the block's `n` keys (rows of `d` floats, keys `k_t` apart).
struct Scores<'a> {
    sc: &'a mut [f32],
    q: &'a [f32],
    k: &'a [f32],
    k_t: usize,
    n: usize,
    kb: usize,
    d: usize,
}

impl Task for Scores<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        match self.d {
            64 => self.fixed::<F, 64>(),
            128 => self.fixed::<F, 128>(),
            _ => {
                let rows = self.q.len() / self.d;
                for j in 0..self.n {
                    let kj = &self.k[j * self.k_t..j * self.k_t + self.d];
                    for r in 0..rows {
                        let qr = &self.q[r * self.d..(r + 1) * self.d];
                        self.sc[r * self.kb + j] = dot::<F>(qr, kj);
                    }
                }
            }
        }
    }
}

impl Scores<'_> {
    /// Head dim `D` known: fully unrolled dot products.
    #[inline(always)]
    fn fixed<const F: bool, const D: usize>(self) {
        let rows = self.q.len() / D;
        for r in 0..rows {
            let qr: &[f32; D] = self.q[r * D..(r + 1) * D].try_into().unwrap();
            let out = &mut self.sc[r * self.kb..r * self.kb + self.n];
            for (j, o) in out.iter_mut().enumerate() {
                let kj: &[f32; D] = self.k[j * self.k_t..j * self.k_t + D].try_into().unwrap();
                let mut l = [0f32; LANES];
                for c in 0..D / LANES {
                    for i in 0..LANES {
                        l[i] = simd::fma::<F>(qr[c * LANES + i], kj[c * LANES + i], l[i]);
                    }
                }
                *o = hsum(l);
            }
        }
    }
}

/// `a · b` in `LANES` partial sums (vectorised), reduced as a tree.
#[inline(always)]
fn dot<const F: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let mut tail = 0.0;
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        tail = simd::fma::<F>(*x, *y, tail);
    }
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            lanes[i] = simd::fma::<F>(x[i], y[i], lanes[i]);
        }
    }
    hsum(lanes) + tail
}

/// The sum of the lanes, as a tree (constant trip counts: shuffles and vector adds).
#[inline(always)]
fn hsum(mut l: [f32; LANES]) -> f32 {
    for i in 0..8 {
        l[i] += l[i + 8];
    }
    for i in 0..4 {
        l[i] += l[i + 4];
    }
    for i in 0..2 {
        l[i] += l[i + 2];
    }
    l[0] + l[1]
}

/// `acc_r += Σ_j p[r][j] v_j` over the block's `n` keys.
struct Accumulate<'a> {
    acc: &'a mut [f32],
    p: &'a [f32],
    v: &'a [f32],
    v_t: usize,
    n: usize,
    kb: usize,
    d: usize,
}

impl Task for Accumulate<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        match self.d {
            64 => self.fixed::<F, 64>(),
            128 => self.fixed::<F, 128>(),
            _ => self.any::<F>(),
        }
    }
}

impl Accumulate<'_> {
    /// Head dim `D` known: each row's accumulator stays in registers over the block.
    #[inline(always)]
    fn fixed<const F: bool, const D: usize>(self) {
        let rows = self.acc.len() / D;
        for r in 0..rows {
            let ar: &mut [f32; D] = (&mut self.acc[r * D..(r + 1) * D]).try_into().unwrap();
            let mut a = *ar;
            let p = &self.p[r * self.kb..r * self.kb + self.n];
            for (j, &pj) in p.iter().enumerate() {
                let vj: &[f32; D] = self.v[j * self.v_t..j * self.v_t + D].try_into().unwrap();
                for c in 0..D {
                    a[c] = simd::fma::<F>(pj, vj[c], a[c]);
                }
            }
            *ar = a;
        }
    }

    #[inline(always)]
    fn any<const F: bool>(self) {
        let rows = self.acc.len() / self.d;
        for j in 0..self.n {
            let vj = &self.v[j * self.v_t..j * self.v_t + self.d];
            for r in 0..rows {
                let p = self.p[r * self.kb + j];
                let ar = &mut self.acc[r * self.d..(r + 1) * self.d];
                for (a, &x) in ar.iter_mut().zip(vj) {
                    *a = simd::fma::<F>(p, x, *a);
                }
            }
        }
    }
}
