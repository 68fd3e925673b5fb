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
//!   scores are kept key-major so the softmax runs across query rows in vector lanes and
//!   the block products read k and v in place (q is transposed once per tile).
//!   Decode (few rows): the keys are split across threads, each split keeps its own
//!   running state, and a combine step merges them (short key ranges: parallel over groups).

mod decode;
#[cfg(target_arch = "x86_64")]
mod fast;
mod prefill;
pub mod small;

use crate::kernel::{BufId, CpuKernel, RunCtx, Scratch};
use crate::kernels::fused::{eval_par, Program, RowEnv};
use crate::simd;
use crate::storage::Storage;
use crate::view::{LaunchExpr, ResolvedView, ViewExprs};
use decode::{Accumulate, Scores, Softmax};
use luminal::{LuminalError, Result};
use prefill::{tiles, AccumulateT, BiasT, ScoresT, SoftmaxT};
pub use small::AttentionGradKernel;
pub use small::{MAX_D as SMALL_MAX_D, MAX_T as SMALL_MAX_T};

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

/// `op` over the lanes as a tree (constant trip counts: shuffles and vector ops; a left
/// fold is 16 dependent steps).
#[inline(always)]
fn fold_lanes(mut a: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            a[i] = op(a[i], a[i + w]);
        }
        w /= 2;
    }
    a[0]
}

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

/// The fused program of the q node and its element count (see `AttentionKernel::q_source`).
#[derive(Debug)]
pub struct QSource {
    pub program: Program,
    pub numel: LaunchExpr,
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
    /// When set, q is not read from a buffer: this private elementwise tree (a decode
    /// step's rotary embedding over the query projection) is evaluated at the q node's flat
    /// indices into the head of the launch arena, and `q_view` reads it there.
    pub q_source: Option<QSource>,
    /// Launch state, grown once: per batch index its q, k, v and bias offsets; batch indices
    /// ordered so that those sharing k, v and bias are adjacent; group boundaries in that
    /// order.
    offsets: Vec<[i64; 4]>,
    order: Vec<u32>,
    groups: Vec<(usize, usize)>,
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
            q_source: None,
            offsets: vec![],
            order: vec![],
            groups: vec![],
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
    /// Keys / values stored as f16 or in quantized blocks (widened block by block).
    k_wide: bool,
    v_wide: bool,
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

    /// Scratch layout of one worker: q rows, scores, bias, accumulators, maxima, sums, and
    /// (f16 or quantized keys / values) one block of keys and one of values widened to f32.
    fn parts(&self) -> [usize; 8] {
        let rows = self.gmax * self.qt;
        let state = self.state_rows();
        let bias = if self.has_bias {
            self.qt * self.t.div_ceil(self.splits)
        } else {
            self.kb
        };
        let widened = |wide: bool| if wide { self.kb * self.d } else { 0 };
        [
            rows * self.d,
            rows * self.kb,
            bias,
            state * self.d,
            state,
            state,
            widened(self.k_wide),
            widened(self.v_wide),
        ]
    }
}

fn split_parts<'a>(mut s: &'a mut [f32], parts: [usize; 8]) -> [&'a mut [f32]; 8] {
    let mut out: [&mut [f32]; 8] = Default::default();
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
        let mut r = vec![self.k, self.v];
        match &self.q_source {
            Some(q) => r.extend(q.program.reads()),
            None => r.push(self.q),
        }
        if let Some(b) = &self.bias {
            r.extend(b.program.reads());
        }
        r
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        if self.q_source.is_none() {
            self.q = map(self.q);
        }
        self.k = map(self.k);
        self.v = map(self.v);
        if let Some(q) = &mut self.q_source {
            q.program.remap(map);
        }
        if let Some(b) = &mut self.bias {
            b.program.remap(map);
        }
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: [
                &self.bias.as_ref().map(|b| &b.program),
                &self.q_source.as_ref().map(|q| &q.program),
            ]
            .into_iter()
            .flatten()
            .map(|p| p.instrs.len())
            .max()
            .unwrap_or(0),
            ..Scratch::default()
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
        // Per-worker tiles live in the runtime's shared launch arena: one per runtime, not
        // one per layer (30 × 8 MB at a 512-token chunk of SmolLM2 before).
        let shared = cx.arena;
        // q evaluated into the head of the arena (its tiles follow), or read in place.
        let q_len = match &mut self.q_source {
            Some(src) => {
                src.program.prepare(cx.dims, bufs)?;
                let n = src.numel.eval(cx.dims)?.max(0) as usize;
                if shared.len() < n {
                    shared.resize(n, 0.0);
                }
                eval_par(&src.program, bufs, &mut shared[..n]);
                n
            }
            None => 0,
        };
        let q_buf = match &self.q_source {
            Some(_) => None,
            None => match &bufs[self.q] {
                Storage::F32(v) => Some(v.as_slice()),
                _ => return Err(backend_err("q must be f32")),
            },
        };
        let rows_of = |b: BufId| match &bufs[b] {
            Storage::F32(v) => Ok(KvRows::F32(v)),
            Storage::F16(v) => Ok(KvRows::F16(v)),
            Storage::Bytes(b) if luminal::quant::decoder(b.dtype()).is_some() => {
                Ok(KvRows::Blocks(b.dtype(), b.as_slice()))
            }
            _ => Err(backend_err("k and v must be f32, f16 or quantized blocks")),
        };
        let (k, v) = (rows_of(self.k)?, rows_of(self.v)?);
        self.q_exprs.resolve(cx.dims, &mut self.q_view)?;
        self.k_exprs.resolve(cx.dims, &mut self.k_view)?;
        self.v_exprs.resolve(cx.dims, &mut self.v_view)?;
        self.q_view.check_bounds(q_buf.map_or(q_len, |q| q.len()))?;
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
        // The tile loops step through rows with unsigned strides.
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
        // Quantized keys / values are read a row at a time in whole blocks: every row
        // must start at a block boundary (the head dim is a whole number of blocks).
        for (rows, view, unit) in [(&k, &self.k_view, nb + 2), (&v, &self.v_view, nb + 1)] {
            if let KvRows::Blocks(dt, _) = rows {
                let bs = dt.block_size() as i64;
                let aligned = view.offset % bs == 0
                    && view.dims[unit] % bs == 0
                    && (0..view.dims.len())
                        .filter(|&i| i != unit)
                        .all(|i| view.strides[i] % bs == 0);
                if !aligned {
                    return Err(backend_err(&format!(
                        "{dt} keys or values must be read in whole blocks along the head dim"
                    )));
                }
            }
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
        // Short heads over a few hundred positions (a small model in training): one head
        // at a time in cache (`small.rs`).
        if let (Some(qd), KvRows::F32(kd), KvRows::F32(vd)) = (q_buf, k, v) {
            let short = s <= small::MAX_T && (1..=small::MAX_T).contains(&t);
            if s > DECODE_ROWS && d <= small::MAX_FORWARD_D && short {
                let rows = (
                    small::Rows::of(qd, &self.q_view, nb, nb),
                    small::Rows::of(kd, &self.k_view, nb, nb + 1),
                    small::Rows::of(vd, &self.v_view, nb, nb + 2),
                );
                let bias = self
                    .bias
                    .as_ref()
                    .map(|b| (b, small::Rows::of(&[], &b.view, nb, nb)));
                let sh = small::Shape { batch, s, t, d };
                small::launch(rows, None, bias, bufs, sh, self.scale, shared, o);
                return Ok(());
            }
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
            k_wide: !matches!(k, KvRows::F32(_)),
            v_wide: !matches!(v, KvRows::F32(_)),
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
        if shared.len() < q_len + workers * plan.per_worker {
            shared.resize(q_len + workers * plan.per_worker, 0.0);
        }
        let (q_head, shared) = shared.split_at_mut(q_len);
        let q = q_buf.unwrap_or(q_head);
        let arena = SendPtr(shared.as_mut_ptr());
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
                let base = &shared[w * plan.per_worker..(w + 1) * plan.per_worker];
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

/// Keys or values as stored: f32 (read in place), f16 (an f16 KV cache) or the blocks of
/// a quantized type (a q8_0 KV cache; rows start at block boundaries).
#[derive(Clone, Copy)]
enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    Blocks(luminal::DType, &'a [u8]),
}

impl<'a> KvRows<'a> {
    /// Number of values.
    fn len(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::F16(v) => v.len(),
            KvRows::Blocks(dt, b) => b.len() / dt.block_bytes() * dt.block_size(),
        }
    }

    /// Keys or values the intrinsic block steps read as they are (f32, f16, q8_0 blocks
    /// decoded in registers): other block types are decoded into the worker's buffer first
    /// ([`KvRows::block`]).
    #[cfg(target_arch = "x86_64")]
    fn in_place(&self) -> bool {
        !matches!(self, KvRows::Blocks(dt, _) if *dt != luminal::DType::Q8_0)
    }

    /// `n` rows of `d` elements from `start`, `stride` apart, as f32 with their stride:
    /// f32 data in place, f16 data widened and quantized blocks decoded into `buf` (rows
    /// `d` apart).
    fn block<'b>(
        &self,
        start: usize,
        n: usize,
        stride: usize,
        d: usize,
        buf: &'b mut [f32],
    ) -> (&'b [f32], usize)
    where
        'a: 'b,
    {
        match *self {
            KvRows::F32(v) => (&v[start..], stride),
            KvRows::F16(v) => {
                use crate::storage::Elem;
                if stride == d {
                    // Adjacent rows (a cache head's positions): one conversion.
                    half::f16::widen(&v[start..start + n * d], &mut buf[..n * d]);
                } else {
                    for j in 0..n {
                        let src = &v[start + j * stride..][..d];
                        half::f16::widen(src, &mut buf[j * d..][..d]);
                    }
                }
                (&buf[..n * d], d)
            }
            KvRows::Blocks(dt, b) => {
                let (bs, bb) = (dt.block_size(), dt.block_bytes());
                let row_bytes = d / bs * bb;
                for j in 0..n {
                    let at = (start + j * stride) / bs * bb;
                    luminal::quant::decode(dt, &b[at..at + row_bytes], &mut buf[j * d..][..d]);
                }
                (&buf[..n * d], d)
            }
        }
    }
}

/// One query tile of some groups over one key split.
struct TileCx<'a> {
    plan: Plan,
    q: &'a [f32],
    k: KvRows<'a>,
    v: KvRows<'a>,
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
    fn attend(&self, [qs, sc, bs, acc, m, l, kw, vw]: [&mut [f32]; 8]) {
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
        for (gi, &(p0, p1)) in self.groups.iter().enumerate() {
            if s > DECODE_ROWS {
                if let Some(&(next, _)) = self.groups.get(gi + 1) {
                    self.prefetch_group(next, i0, nq, j0, j1);
                }
            }
            let np = p1 - p0;
            let base = if splits > 1 { p0 * qt } else { 0 };
            let state = base..base + np * qt;
            let (m, l) = (&mut m[state.clone()], &mut l[state.clone()]);
            let acc = &mut acc[state.start * d..state.end * d];
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            acc.fill(0.0);
            let prefill = s > DECODE_ROWS;
            let rows = np * qt;
            // The tile's query rows, adjacent per batch index: row-major when decoding,
            // transposed (element (c, r) at c·rows + r) when prefilling. Rows past the
            // sequence's end (a short last tile) read zeros.
            for (pp, &b) in self.order[p0..p1].iter().enumerate() {
                let qo = self.offsets[b as usize][0] as usize;
                let first = if prefill && nq == qt {
                    let src = &self.q[qo + i0 * q_s..];
                    let ok = tiles::transpose(&mut qs[pp * qt..], rows, src, q_s, nq, d);
                    if ok {
                        qt
                    } else {
                        0
                    }
                } else {
                    0
                };
                for ii in first..qt {
                    let r = pp * qt + ii;
                    if ii < nq {
                        let src = &self.q[qo + (i0 + ii) * q_s..][..d];
                        if prefill {
                            for (c, &x) in src.iter().enumerate() {
                                qs[c * rows + r] = x;
                            }
                        } else {
                            qs[r * d..][..d].copy_from_slice(src);
                        }
                    } else if prefill {
                        for c in 0..d {
                            qs[c * rows + r] = 0.0;
                        }
                    }
                }
            }
            let [_, ko, vo, bo] = self.offsets[self.order[p0] as usize];
            // The bias of the tile's rows over the split's keys, in pieces of at most one
            // interpreter block; shared by the group, and by the next while it is the same.
            // Row-major when decoding, transposed (key-major, `qt` per key) when prefilling.
            if let Some(bias) = self.bias {
                if bias_at != Some(bo) {
                    bias_at = Some(bo);
                    bias.with_regs(|mut regs| {
                        // Prefill with one bias row for every query (a key padding mask):
                        // that row once, one value per key (`BiasT::Keys`).
                        if prefill && b_s == 0 {
                            let mut j = j0;
                            while j < j1 {
                                let n = (j1 - j).min(crate::kernels::fused::BLOCK);
                                let dst = &mut bs[j - j0..][..n];
                                let z0 = bo as usize + j;
                                if let Some(src) =
                                    bias.eval(self.bufs, RowEnv::NONE, z0, n, &mut regs, dst)
                                {
                                    dst.copy_from_slice(&src[..n]);
                                }
                                j += n;
                            }
                            return;
                        }
                        // Prefill over every key with the bias rows adjacent (a causal mask
                        // over `[s, t]`): whole rows per evaluation, not one call per row
                        // (the per-call cost was most of a short-head launch).
                        let per = crate::kernels::fused::BLOCK / span.max(1);
                        if prefill && span == t && b_s == t && per > 1 {
                            let mut ii = 0;
                            while ii < nq {
                                let nr = per.min(nq - ii);
                                let n = nr * span;
                                let z0 = bo as usize + (i0 + ii) * b_s;
                                let tmp = &mut sc[..n];
                                let src = bias
                                    .eval(self.bufs, RowEnv::NONE, z0, n, &mut regs, tmp)
                                    .unwrap_or(tmp);
                                for r in 0..nr {
                                    for (jj, &x) in src[r * span..][..span].iter().enumerate() {
                                        bs[jj * qt + ii + r] = x;
                                    }
                                }
                                ii += nr;
                            }
                            return;
                        }
                        for ii in 0..nq {
                            let mut j = j0;
                            while j < j1 {
                                let n = (j1 - j).min(crate::kernels::fused::BLOCK);
                                let z0 = bo as usize + (i0 + ii) * b_s + j;
                                if prefill {
                                    // `sc` is free until the group's product.
                                    let tmp = &mut sc[..n];
                                    let src = bias
                                        .eval(self.bufs, RowEnv::NONE, z0, n, &mut regs, tmp)
                                        .unwrap_or(tmp);
                                    for (jj, &x) in src[..n].iter().enumerate() {
                                        bs[(j - j0 + jj) * qt + ii] = x;
                                    }
                                } else {
                                    let dst = &mut bs[ii * span + (j - j0)..][..n];
                                    if let Some(src) =
                                        bias.eval(self.bufs, RowEnv::NONE, z0, n, &mut regs, dst)
                                    {
                                        dst.copy_from_slice(&src[..n]);
                                    }
                                }
                                j += n;
                            }
                        }
                    });
                }
            }
            let (q_rows, sc) = (&qs[..rows * d], &mut sc[..rows * kb]);
            let keys = (ko as usize, vo as usize, &mut *kw, &mut *vw);
            let state = (&mut *acc, &mut *m, &mut *l);
            if prefill {
                self.group_prefill(q_rows, sc, bs, keys, (j0, j1, nq), state);
            } else {
                self.group(q_rows, sc, bs, keys, (j0, j1, nq), state);
            }
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

    /// Asks for the query rows, keys and values (f32) of the group whose first batch index
    /// is `order[p]` to be brought towards the cache while the current group runs: a
    /// prefill tile's rows are `q_s` apart (the heads of a projection side by side), a
    /// stride the hardware prefetchers do not follow across pages.
    fn prefetch_group(&self, p: usize, i0: usize, nq: usize, j0: usize, j1: usize) {
        let Plan {
            d, q_s, k_t, v_t, ..
        } = self.plan;
        let [qo, ko, vo, _] = self.offsets[self.order[p] as usize].map(|o| o as usize);
        let rows = |base: *const f32, from: usize, n: usize, stride: usize| {
            for i in 0..n {
                simd::prefetch_raw(base.wrapping_add(from + i * stride) as *const u8, d * 4);
            }
        };
        rows(self.q.as_ptr(), qo + i0 * q_s, nq, q_s);
        if let (KvRows::F32(k), KvRows::F32(v)) = (self.k, self.v) {
            rows(k.as_ptr(), ko + j0 * k_t, j1 - j0, k_t);
            rows(v.as_ptr(), vo + j0 * v_t, j1 - j0, v_t);
        }
    }

    /// Decoding: one group's rows (`q_rows`, row-major, `np·qt` of them) over keys
    /// `j0..j1`, with direct dot products (packing K for a GEMM would cost as much as the
    /// product itself).
    #[allow(clippy::type_complexity)]
    fn group(
        &self,
        q_rows: &[f32],
        sc: &mut [f32],
        bs: &[f32],
        (ko, vo, kw, vw): (usize, usize, &mut [f32], &mut [f32]),
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
        let span = j1 - j0;
        // Head dims 32, 64, 96 and 128 on AVX2 / AVX-512: the intrinsic block steps (keys
        // and values widened in registers); otherwise the portable loops.
        #[cfg(target_arch = "x86_64")]
        let isa = simd::isa();
        #[cfg(target_arch = "x86_64")]
        let intrinsics = fast::handles(isa, d);
        #[cfg(not(target_arch = "x86_64"))]
        let intrinsics = false;
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
            if intrinsics {
                #[cfg(target_arch = "x86_64")]
                if self.k.in_place() {
                    fast::block_scores(isa, q_rows, self.k, ko + jb * k_t, k_t, n, d, sc, kb);
                } else {
                    let (k, k_t) = self.k.block(ko + jb * k_t, n, k_t, d, kw);
                    fast::block_scores(isa, q_rows, KvRows::F32(k), 0, k_t, n, d, sc, kb);
                }
            } else {
                let (k, k_t) = self.k.block(ko + jb * k_t, n, k_t, d, kw);
                simd::run(Scores {
                    sc,
                    q: q_rows,
                    k,
                    k_t,
                    n,
                    kb,
                    d,
                });
            }
            let (bs, bstride) = if has_bias {
                (&bs[boff..], span)
            } else {
                (bs, 0)
            };
            if intrinsics {
                #[cfg(target_arch = "x86_64")]
                fast::block_softmax(
                    isa,
                    sc,
                    has_bias.then_some((bs, bstride)),
                    m,
                    l,
                    acc,
                    self.scale,
                    (qt, nq, n, kb, d),
                );
            } else {
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
            }
            if intrinsics {
                #[cfg(target_arch = "x86_64")]
                if self.v.in_place() {
                    fast::block_accumulate(isa, acc, sc, kb, self.v, vo + jb * v_t, v_t, n, d);
                } else {
                    let (v, v_t) = self.v.block(vo + jb * v_t, n, v_t, d, vw);
                    fast::block_accumulate(isa, acc, sc, kb, KvRows::F32(v), 0, v_t, n, d);
                }
            } else {
                let (v, v_t) = self.v.block(vo + jb * v_t, n, v_t, d, vw);
                simd::run(Accumulate {
                    acc,
                    p: sc,
                    v,
                    v_t,
                    n,
                    kb,
                    d,
                });
            }
            jb += n;
        }
    }

    /// Prefilling: one group's rows (`np·qt` of them, a multiple of [`prefill::ROW_CHUNK`]; q
    /// transposed in `q_t`) over keys `j0..j1`. Scores and probabilities are kept
    /// key-major (`sc[j·rows + r]`), so the softmax runs across query rows in vector lanes
    /// and neither product packs anything: q is transposed once per tile, k and v are read
    /// in place.
    #[allow(clippy::type_complexity)]
    fn group_prefill(
        &self,
        q_t: &[f32],
        sc: &mut [f32],
        bs: &[f32],
        (ko, vo, kw, vw): (usize, usize, &mut [f32], &mut [f32]),
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
        let rows = q_t.len() / d;
        let mut jb = j0;
        while jb < j1 {
            let n = kb.min(j1 - jb);
            let boff = jb - j0;
            let bias = has_bias.then(|| {
                if self.plan.b_s == 0 {
                    BiasT::Keys(&bs[boff..boff + n])
                } else {
                    BiasT::Rows(&bs[boff * qt..(boff + n) * qt])
                }
            });
            if bias.is_some_and(|b| b.hides_all(qt, nq)) {
                jb += n;
                continue;
            }
            let sc = &mut sc[..n * rows];
            let (k, k_t) = self.k.block(ko + jb * k_t, n, k_t, d, kw);
            if !tiles::scores(sc, q_t, k, k_t, n, rows, d) {
                simd::run(ScoresT {
                    sc,
                    q_t,
                    k,
                    k_t,
                    n,
                    rows,
                    d,
                });
            }
            if !tiles::softmax(sc, bias, qt, m, l, acc, self.scale, n, d) {
                simd::run(SoftmaxT {
                    sc,
                    bias,
                    qt,
                    m,
                    l,
                    acc,
                    scale: self.scale,
                    n,
                    d,
                });
            }
            let (v, v_t) = self.v.block(vo + jb * v_t, n, v_t, d, vw);
            if !tiles::accumulate(acc, sc, v, v_t, n, rows, d) {
                simd::run(AccumulateT {
                    acc,
                    p: sc,
                    v,
                    v_t,
                    n,
                    rows,
                    d,
                });
            }
            jb += n;
        }
    }
}

#[cfg(test)]
mod timing;
