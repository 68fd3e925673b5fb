//! Fused attention: `softmax(q·kᵀ·scale (+ bias))·v` in one flash-attention kernel that never
//! materialises the `[s, t]` scores, in the style of [`crate::gemm`]: [`find`] recognises the
//! pattern at compile time, [`resolve`] turns its views into strides, offsets and sizes at
//! run time (`None`: the plan runs the primop kernels instead), and the executor runs one
//! [`AttnCall`] (the GPU kernel [`CUDA_SOURCE`], or [`host_attention`] on the emulator).
//!
//! The primop pattern, as the core's hl_ops build it (`luminal_nn::causal_attention`,
//! `luminal_nn::attention`), matched by the core's [`luminal::patterns::AttentionMatch`] (the
//! same matcher as the CPU backend's), from the final product down, every node in it private
//! to it:
//!
//! ```text
//! out = Sum_t( P[.., s, ·, t] * V[.., ·, d, t] )         P·V
//! P   = E * Recip(Sum_t(E))[.., s, ·]                    softmax
//! E   = Exp2((X + Max_t(X)[.., s, ·] * -1) * log2 e)
//! X   = Sum_d(Q[.., s, ·, d] * K[.., ·, t, d]) * scale (+ bias[.., s, t])
//! ```
//!
//! K and V may be f16 values widened by a private cast (an f16 KV cache,
//! `luminal_nn::scores_product` / `values_product`): the kernel reads the f16 buffer. Grouped
//! query attention is a stride-0 batch axis of K and V (`k.expand(2, groups)`). The bias (the
//! causal mask `[s, t]` broadcast over heads, or a padding bias) keeps its own node and
//! buffer; the kernel reads it through its view's strides. q, k and v need unit stride along
//! `d`.
//!
//! The GPU kernel: a block of 4 warps takes 32 query rows (8 a warp) of one batch index;
//! it walks the keys in tiles of 32 staged in shared memory (a lane a key for the scores, a
//! lane a column of `d` for the output), with an online softmax in f32. A key tile whose
//! bias is `-inf` for every row of the block (above a causal diagonal) is skipped. When the
//! blocks are too few to fill the device (decoding: one query row), the keys are split
//! across blocks (split-KV, flash-decoding) and a second kernel combines the partial
//! results. Head dims up to 128 run the tiled kernel (64 or 128 columns of shared memory);
//! larger ones a simple kernel (a warp a query row). Calls over f16 keys and values run the
//! f16 tensor-core kernel of [`half`] (with the causal mask computed from the indices where
//! [`luminal::patterns::causal_limit`] recognises it).

pub mod half;

use luminal::graph::{GraphData, NodeId};
use luminal::patterns::{causal_limit, AttentionMatch, AttentionRules};
use luminal::{DType, Expression};
use std::collections::{HashMap, HashSet};

/// Batch dims a call takes (more: the plan runs the kernels).
pub const MAX_BATCH_DIMS: usize = 4;
/// Query rows per block of the tiled kernel.
pub const BQ: i64 = 64;
/// Keys per tile of the tiled kernel.
pub const BK: i64 = 32;
/// Threads per block (both kernels).
pub const THREADS: u32 = 256;

/// A recognised attention (the core's matcher; batch dims at most [`MAX_BATCH_DIMS`]).
pub type AttnPattern = AttentionMatch;

/// One attention call at bound dims. Every field is an `i64` (`#[repr(C)]`): the plan writes it
/// into a table in device memory before each run and the GPU kernels read it there as
/// `LumAttnParams` (so a CUDA graph replays a decode step with the new key count). Offsets and strides are in elements of each
/// buffer; batch dims are padded with size-1 dims in front to [`MAX_BATCH_DIMS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AttnCall {
    pub batch: [i64; MAX_BATCH_DIMS],
    pub s: i64,
    pub t: i64,
    pub d: i64,
    pub q_off: i64,
    pub k_off: i64,
    pub v_off: i64,
    pub b_off: i64,
    pub q_b: [i64; MAX_BATCH_DIMS],
    pub k_b: [i64; MAX_BATCH_DIMS],
    pub v_b: [i64; MAX_BATCH_DIMS],
    pub b_b: [i64; MAX_BATCH_DIMS],
    /// Stride of q along `s`, of k and v along `t`, of the bias along `s` and `t`.
    pub q_s: i64,
    pub k_t: i64,
    pub v_t: i64,
    pub b_s: i64,
    pub b_t: i64,
    pub has_bias: i64,
    /// The scale's f32 bits.
    pub scale_bits: i64,
    /// Key splits (set by [`launch_plan`]; 1: the kernel writes the output itself).
    pub splits: i64,
    /// Keys per split (a multiple of [`BK`]; of [`half::KEYS`] for the f16 kernel).
    pub keys_per_split: i64,
    /// Whether k and v are f16 (else f32).
    pub k_f16: i64,
    pub v_f16: i64,
    /// Whether the bias is a causal mask (`luminal::patterns::causal_limit`): key `j` is
    /// visible from query row `i` where `j − i < causal_lt`. The f16 kernel computes it from
    /// the indices; the others read the bias.
    pub causal: i64,
    pub causal_lt: i64,
    /// Set by the f16 kernel's plan ([`half::plan`]) when it packs grouped queries: the
    /// query rows of one kv head's group are one sequence of `s · groups` rows, and row `r`
    /// is query position `r % group_rows` (for the mask and the bias). 0: not packed.
    pub group_rows: i64,
}

impl AttnCall {
    /// Product of the batch dims.
    pub fn batches(&self) -> i64 {
        self.batch.iter().product()
    }
    pub fn scale(&self) -> f32 {
        f32::from_bits(self.scale_bits as u32)
    }
    /// Every field, in order (a run's signature).
    pub fn words(&self) -> &[i64] {
        // SAFETY: `AttnCall` is `#[repr(C)]` and made of `i64`s only (arrays of them
        // included), so it is `size_of::<Self>() / 8` initialised, aligned `i64`s.
        unsafe {
            std::slice::from_raw_parts(
                self as *const AttnCall as *const i64,
                std::mem::size_of::<AttnCall>() / 8,
            )
        }
    }
}

/// The attentions of `order` (live nodes, topological), no two sharing a node.
pub fn find(graph: &GraphData, order: &[NodeId]) -> Vec<AttnPattern> {
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in order {
        for e in &graph.node(id).inputs {
            *uses.entry(e.node).or_default() += 1;
        }
    }
    // The kernels read f32 or f16 keys and values, any bias view.
    let rules = AttentionRules {
        kv_storage: &|dt| dt == DType::F16,
        bias_unit_keys: false,
    };
    let mut taken: HashSet<NodeId> = HashSet::new();
    let mut out = vec![];
    for &id in order {
        let found = AttentionMatch::find(graph, &uses, id, &rules)
            .filter(|m| m.batch_dims <= MAX_BATCH_DIMS);
        if let Some(p) = found {
            if p.inner.iter().chain([&p.out]).any(|n| taken.contains(n)) {
                continue;
            }
            taken.extend(p.inner.iter().copied().chain([p.out]));
            out.push(p);
        }
    }
    out
}

/// The expressions a call is resolved from (the operands' dims, strides and offsets), built
/// once per pattern: views build them anew (simplified) on every call of `dims()`,
/// `strides()`, `offset()`, which a decode step would otherwise pay per attention per step.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnExprs {
    q_dims: Vec<Expression>,
    strides: [Vec<Expression>; 4],
    offsets: [Expression; 4],
    /// The bias's causal limit, when it is a causal mask.
    causal: Option<Expression>,
}

impl AttnExprs {
    pub fn of(p: &AttnPattern, graph: &GraphData) -> AttnExprs {
        let edges = [Some(&p.q), Some(&p.k), Some(&p.v), p.bias.as_ref()];
        AttnExprs {
            q_dims: p.q.view.dims(),
            strides: edges.map(|e| e.map_or(vec![], |e| e.view.strides())),
            offsets: edges.map(|e| e.map_or(Expression::from(0), |e| e.view.offset())),
            causal: p.bias.as_ref().and_then(|b| causal_limit(graph, b)),
        }
    }

    /// Whether the bias is a causal mask (`luminal::patterns::causal_limit`).
    pub fn causal(&self) -> bool {
        self.causal.is_some()
    }

    /// The dims [`resolve`] reads.
    pub fn variables(&self) -> std::collections::BTreeSet<String> {
        self.q_dims
            .iter()
            .chain(self.strides.iter().flatten())
            .chain(&self.offsets)
            .chain(&self.causal)
            .flat_map(|e| e.variables())
            .collect()
    }
}

/// Whether [`resolve`] gives `p` (with expressions `x`) and `q` (`y`) the same call at any
/// dims: it reads only these (the layers of a model, whose attentions are alike, are then
/// resolved once a run).
pub fn resolves_alike(
    (p, x): (&AttnPattern, &AttnExprs),
    (q, y): (&AttnPattern, &AttnExprs),
    dtype_of: &dyn Fn(NodeId) -> DType,
) -> bool {
    let types = |p: &AttnPattern| {
        (
            [p.q.node, p.k.node, p.v.node].map(dtype_of),
            p.bias.as_ref().map(|b| dtype_of(b.node)),
        )
    };
    x == y
        && p.batch_dims == q.batch_dims
        && p.scale.to_bits() == q.scale.to_bits()
        && types(p) == types(q)
}

/// `p`'s call at the current dims (`eval` evaluates an expression; `dtype_of` gives a node's
/// dtype), or `None` when something does not resolve (the plan then runs the kernels).
pub fn resolve(
    p: &AttnPattern,
    x: &AttnExprs,
    dtype_of: &dyn Fn(NodeId) -> DType,
    eval: &dyn Fn(&Expression) -> Option<i64>,
) -> Option<AttnCall> {
    let nb = p.batch_dims;
    let r = nb + 3;
    let dims: Vec<i64> = x.q_dims.iter().map(eval).collect::<Option<_>>()?;
    let (s, t, d) = (dims[nb], dims[nb + 1], dims[nb + 2]);
    if s <= 0 || t <= 0 || d <= 0 || nb > MAX_BATCH_DIMS {
        return None;
    }
    let strides = |i: usize| -> Option<Vec<i64>> {
        x.strides[i].iter().map(eval).collect::<Option<Vec<_>>>()
    };
    let (sq, sk, sv) = (strides(0)?, strides(1)?, strides(2)?);
    if sq.len() != r || sk.len() != r || sv.len() != r {
        return None;
    }
    // Unit stride along d (checked at compile time unless d is 1, where it does not matter).
    if d > 1 && (sq[r - 1] != 1 || sk[r - 1] != 1 || sv[r - 2] != 1) {
        return None;
    }
    let kind = |n: NodeId| match dtype_of(n) {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        _ => None,
    };
    let mut c = AttnCall {
        s,
        t,
        d,
        q_off: eval(&x.offsets[0])?,
        k_off: eval(&x.offsets[1])?,
        v_off: eval(&x.offsets[2])?,
        q_s: sq[nb],
        k_t: sk[nb + 1],
        v_t: sv[nb + 2],
        scale_bits: p.scale.to_bits() as i64,
        splits: 1,
        keys_per_split: cdiv(t, BK) * BK,
        k_f16: kind(p.k.node)?,
        v_f16: kind(p.v.node)?,
        batch: [1; MAX_BATCH_DIMS],
        ..Default::default()
    };
    if dtype_of(p.q.node) != DType::F32 {
        return None;
    }
    let pad = MAX_BATCH_DIMS - nb;
    c.batch[pad..].copy_from_slice(&dims[..nb]);
    c.q_b[pad..].copy_from_slice(&sq[..nb]);
    c.k_b[pad..].copy_from_slice(&sk[..nb]);
    c.v_b[pad..].copy_from_slice(&sv[..nb]);
    if let Some(b) = &p.bias {
        let sb = strides(3)?;
        if sb.len() != nb + 2 || dtype_of(b.node) != DType::F32 {
            return None;
        }
        c.has_bias = 1;
        if let Some(lt) = &x.causal {
            c.causal = 1;
            c.causal_lt = eval(lt)?;
        }
        c.b_off = eval(&x.offsets[3])?;
        c.b_s = sb[nb];
        c.b_t = sb[nb + 1];
        c.b_b[pad..].copy_from_slice(&sb[..nb]);
    }
    if [c.q_off, c.k_off, c.v_off, c.b_off].iter().any(|&o| o < 0) {
        return None;
    }
    // The grid: query tiles × batches × splits.
    if c.batches() > 65535 || cdiv(s, BQ) > i32::MAX as i64 {
        return None;
    }
    Some(c)
}

/// Which GPU kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The tiled kernel with `dmax` (64 or 128) columns of shared memory.
    Tiled { dmax: i64 },
    /// The tensor-core kernel (3xTF32 `mma.sync`, sm_80+): 64 query rows a block (4 warps
    /// of 16), `dmax` (64 or 128) columns.
    Mma { dmax: i64 },
    /// A warp a query row, any head dim.
    Simple,
    /// The f16 tensor-core kernel ([`half`]: f16 keys and values, head dims up to 128) with
    /// `dmax` (64 or 128) columns.
    Half { dmax: i64 },
}

/// The kernel, grid and key split of `c` on a device with `sms` multiprocessors, with the
/// tensor-core kernels where `mma` (sm_80+) and, for f16 keys and values, the f16 one where
/// `half` too (sets `c.splits` and `c.keys_per_split`). Returns the variant, the grid, the
/// threads a block and the dynamic shared memory in bytes.
pub fn launch_plan(
    c: &mut AttnCall,
    sms: i64,
    mma: bool,
    half: bool,
) -> (Variant, (u32, u32, u32), u32, u32) {
    if mma && half && half::eligible(c) {
        let blocks = half::plan(c, sms);
        let dmax = half::dmax(c);
        let smem = half::shared_bytes(dmax);
        return (Variant::Half { dmax }, (blocks, 1, 1), half::THREADS, smem);
    }
    let batches = c.batches();
    if c.d > 128 {
        c.splits = 1;
        c.keys_per_split = c.t;
        let rows_per_block = (THREADS / 32) as i64;
        let grid = (cdiv(c.s, rows_per_block) as u32, batches as u32, 1);
        return (Variant::Simple, grid, THREADS, 0);
    }
    let dmax = if c.d <= 64 { 64 } else { 128 };
    let qtiles = cdiv(c.s, if mma { MMA_BQ } else { BQ });
    let blocks = qtiles * batches;
    let tiles = cdiv(c.t, BK);
    // Split the keys when the blocks would not fill the device twice over, keeping at
    // least 4 key tiles per split.
    let want = cdiv(2 * sms.max(1), blocks.max(1));
    let splits = want.min(tiles / 4).clamp(1, 1024);
    let tiles_per_split = cdiv(tiles, splits);
    c.keys_per_split = tiles_per_split * BK;
    c.splits = cdiv(c.t, c.keys_per_split);
    let grid = (qtiles as u32, batches as u32, c.splits as u32);
    if mma {
        (
            Variant::Mma { dmax },
            grid,
            MMA_THREADS,
            mma_shared_bytes(dmax) as u32,
        )
    } else {
        (
            Variant::Tiled { dmax },
            grid,
            THREADS,
            shared_bytes(dmax) as u32,
        )
    }
}

/// Whether the kernel `launch_plan` picks for `c` reads its bias: all but the f16 kernel over
/// a causal mask, which it computes from the indices.
pub fn reads_bias(c: &AttnCall, sms: i64, mma: bool, half: bool) -> bool {
    let mut c = *c;
    let variant = launch_plan(&mut c, sms, mma, half).0;
    c.has_bias != 0 && !(matches!(variant, Variant::Half { .. }) && c.causal != 0)
}

/// Dynamic shared memory of the tiled kernel with `dmax` columns: q `[BQ][dmax]`, k
/// `[BK][dmax + 1]`, v `[BK][dmax]`, the bias tile `[BQ][BK + 1]`, the probabilities
/// `[BQ][BK]` (floats).
pub fn shared_bytes(dmax: i64) -> i64 {
    4 * (BQ * dmax + BK * (dmax + 1) + BK * dmax + BQ * (BK + 1) + BQ * BK)
}

/// Query rows a block of the tensor-core kernel.
pub const MMA_BQ: i64 = 64;
/// Threads a block of the tensor-core kernel.
pub const MMA_THREADS: u32 = 128;

/// Dynamic shared memory of the tensor-core kernel with `dmax` columns: q `[64][dmax + 4]`,
/// k `[32][dmax + 4]`, v `[32][dmax + 8]`, the probabilities `[4][16][36]` (floats).
pub fn mma_shared_bytes(dmax: i64) -> i64 {
    4 * (MMA_BQ * (dmax + 4) + BK * (dmax + 4) + BK * (dmax + 8) + 4 * 16 * (BK + 4))
}

/// Floats of split-KV scratch a call needs: partial outputs and (max, sum) pairs.
pub fn scratch_floats(c: &AttnCall) -> i64 {
    if c.splits <= 1 {
        0
    } else {
        c.splits * c.batches() * c.s * (c.d + 2)
    }
}

/// Element offsets of batch index `bi` (row-major over `c.batch`) in each strided operand:
/// `(q, k, v, bias)`.
pub fn batch_offsets(c: &AttnCall, bi: i64) -> (i64, i64, i64, i64) {
    let (mut rest, mut o) = (bi, (c.q_off, c.k_off, c.v_off, c.b_off));
    for j in (0..MAX_BATCH_DIMS).rev() {
        let i = rest % c.batch[j];
        rest /= c.batch[j];
        o.0 += i * c.q_b[j];
        o.1 += i * c.k_b[j];
        o.2 += i * c.v_b[j];
        o.3 += i * c.b_b[j];
    }
    o
}

/// The emulator's attention: `c` on host memory, each row's softmax in f64 (two passes).
/// `k` and `v` are f32 or f16 values as `c` says; `out` is contiguous `[batch.., s, d]`.
///
/// # Safety
/// Every buffer must hold every element the call addresses (the plan resolved it from the
/// operands' views at this run's dims); `bias` is read only when `c.has_bias` is set.
pub unsafe fn host_attention(
    c: &AttnCall,
    out: *mut f32,
    q: *const f32,
    k: *const u8,
    v: *const u8,
    bias: *const f32,
) {
    let read = |p: *const u8, f16: bool, i: i64| -> f64 {
        if f16 {
            luminal::half::f16::from_bits(*(p as *const u16).offset(i as isize)).to_f64()
        } else {
            *(p as *const f32).offset(i as isize) as f64
        }
    };
    let (s, t, d) = (c.s, c.t, c.d);
    let scale = c.scale() as f64;
    let mut x = vec![0f64; t as usize];
    for bi in 0..c.batches() {
        let (qo, ko, vo, bo) = batch_offsets(c, bi);
        for row in 0..s {
            let mut max = f64::NEG_INFINITY;
            for (j, xj) in x.iter_mut().enumerate() {
                let j = j as i64;
                let mut dot = 0f64;
                for e in 0..d {
                    dot += *q.offset((qo + row * c.q_s + e) as isize) as f64
                        * read(k, c.k_f16 != 0, ko + j * c.k_t + e);
                }
                let b = if c.has_bias != 0 {
                    *bias.offset((bo + row * c.b_s + j * c.b_t) as isize) as f64
                } else {
                    0.0
                };
                *xj = dot * scale + b;
                max = max.max(*xj);
            }
            let mut sum = 0f64;
            for xj in x.iter_mut() {
                *xj = (*xj - max).exp();
                sum += *xj;
            }
            for e in 0..d {
                let mut acc = 0f64;
                for (j, p) in x.iter().enumerate() {
                    acc += p * read(v, c.v_f16 != 0, vo + j as i64 * c.v_t + e);
                }
                *out.offset(((bi * s + row) * d + e) as isize) = (acc / sum) as f32;
            }
        }
    }
}

/// The GPU kernels (one NVRTC module, compiled once per backend). Entry points:
/// `lum_attn_tiled_{64,128}_{f32,f16}` (the tiled kernel, 128 threads, dynamic shared
/// memory [`shared_bytes`]) and `lum_attn_simple_{f32,f16}` (a warp a row, 128 threads). A
/// call split across blocks is combined by [`half::combine_kernel`].
/// k and v share one storage type per entry point; a call with mixed k/v dtypes is not
/// resolved to these (see [`kernel_name`]).
pub const CUDA_SOURCE: &str = r#"
struct LumAttnParams {
    long long batch[4];
    long long s, t, d;
    long long q_off, k_off, v_off, b_off;
    long long q_b[4], k_b[4], v_b[4], b_b[4];
    long long q_s, k_t, v_t, b_s, b_t;
    long long has_bias, scale_bits, splits, keys_per_split, k_f16, v_f16;
};

#define LUM_BQ 64
#define LUM_BK 32
#define LUM_WARPS 8
#define LUM_ROWS 8
#define LUM_LOG2E 1.4426950408889634f
#define LUM_NEG_INF __int_as_float(0xff800000)

static __device__ __forceinline__ float lum_attn_h2f(unsigned short h) {
    unsigned sign = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
    if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return sign ? -v : v; }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
static __device__ __forceinline__ float lum_attn_ld(const float* p, long long i) { return p[i]; }
static __device__ __forceinline__ float lum_attn_ld(const unsigned short* p, long long i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i])); /* exact: every half is an f32 */
    return f;
}


static __device__ __forceinline__ float lum_attn_h(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
static __device__ __forceinline__ float4 lum_attn_ld4(const float* p, long long i) { return *(const float4*)(p + i); }
static __device__ __forceinline__ float4 lum_attn_ld4(const unsigned short* p, long long i) {
    uint2 u = *(const uint2*)(p + i);
    float4 r;
    r.x = lum_attn_h((unsigned short)(u.x & 0xffffu));
    r.y = lum_attn_h((unsigned short)(u.x >> 16));
    r.z = lum_attn_h((unsigned short)(u.y & 0xffffu));
    r.w = lum_attn_h((unsigned short)(u.y >> 16));
    return r;
}

/* Raw prefetched storage of 4 values of k or v (converted when stored to shared memory). */
template <typename KV> struct LumRaw;
template <> struct LumRaw<float> { float4 x; };
template <> struct LumRaw<unsigned short> { uint2 x; };
static __device__ __forceinline__ void lum_raw_ld(LumRaw<float>& r, const float* p, long long i) { r.x = *(const float4*)(p + i); }
static __device__ __forceinline__ void lum_raw_ld(LumRaw<unsigned short>& r, const unsigned short* p, long long i) { r.x = *(const uint2*)(p + i); }
static __device__ __forceinline__ void lum_raw_zero(LumRaw<float>& r) { r.x.x = r.x.y = r.x.z = r.x.w = 0.0f; }
static __device__ __forceinline__ void lum_raw_zero(LumRaw<unsigned short>& r) { r.x.x = r.x.y = 0u; }
static __device__ __forceinline__ float4 lum_raw_f4(const LumRaw<float>& r) { return r.x; }
static __device__ __forceinline__ float4 lum_raw_f4(const LumRaw<unsigned short>& r) {
    float4 f;
    f.x = lum_attn_h((unsigned short)(r.x.x & 0xffffu));
    f.y = lum_attn_h((unsigned short)(r.x.x >> 16));
    f.z = lum_attn_h((unsigned short)(r.x.y & 0xffffu));
    f.w = lum_attn_h((unsigned short)(r.x.y >> 16));
    return f;
}

/* Stages keys kt .. kt+31 (zeros past k_end and past d) into sk[j * KSTR + c] and
   sv[j * VSTR + c], c < DMAX, with NT threads. Every load of a group is issued before any
   store to shared memory (a generic pointer could alias it, so the compiler would not
   reorder them): the loads' latencies overlap. `vec`: d, the offsets and the row strides
   are multiples of 4, so a thread loads 4 columns at once. */
template <int DMAX, int NT, int KSTR, int VSTR, typename KV>
static __device__ __forceinline__ void lum_attn_stage(const KV* k, const KV* v, long long ko,
        long long vo, long long k_t, long long v_t, long long kt, long long k_end, long long d,
        bool vec, float* sk, float* sv, int tid) {
    if (vec) {
        const int CH = DMAX / 4, RPP = NT / CH, PASSES = 32 / RPP;
        const int c = (tid % CH) * 4, j0 = tid / CH;
#pragma unroll
        for (int p0 = 0; p0 < PASSES; p0 += 4) {
            float4 kr[4], vr[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int j = j0 + (p0 + i) * RPP;
                const long long key = kt + j;
                kr[i].x = kr[i].y = kr[i].z = kr[i].w = 0.0f;
                vr[i] = kr[i];
                if (p0 + i < PASSES && key < k_end && c < d) {
                    kr[i] = lum_attn_ld4(k, ko + key * k_t + c);
                    vr[i] = lum_attn_ld4(v, vo + key * v_t + c);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int j = j0 + (p0 + i) * RPP;
                if (p0 + i < PASSES) {
                    float* kd = sk + j * KSTR + c;
                    float* vd = sv + j * VSTR + c;
                    kd[0] = kr[i].x; kd[1] = kr[i].y; kd[2] = kr[i].z; kd[3] = kr[i].w;
                    vd[0] = vr[i].x; vd[1] = vr[i].y; vd[2] = vr[i].z; vd[3] = vr[i].w;
                }
            }
        }
    } else {
        const int RPP = NT / DMAX, PASSES = 32 / RPP;
        const int c = tid % DMAX, j0 = tid / DMAX;
#pragma unroll
        for (int p0 = 0; p0 < PASSES; p0 += 8) {
            float kr[8], vr[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const long long key = kt + j0 + (p0 + i) * RPP;
                kr[i] = 0.0f;
                vr[i] = 0.0f;
                if (p0 + i < PASSES && key < k_end && c < d) {
                    kr[i] = lum_attn_ld(k, ko + key * k_t + c);
                    vr[i] = lum_attn_ld(v, vo + key * v_t + c);
                }
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int j = j0 + (p0 + i) * RPP;
                if (p0 + i < PASSES) {
                    sk[j * KSTR + c] = kr[i];
                    sv[j * VSTR + c] = vr[i];
                }
            }
        }
    }
}

static __device__ __forceinline__ void lum_attn_offsets(const LumAttnParams& p, long long bi,
        long long* qo, long long* ko, long long* vo, long long* bo) {
    long long q = p.q_off, k = p.k_off, v = p.v_off, b = p.b_off;
    for (int j = 3; j >= 0; --j) {
        long long i = bi % p.batch[j];
        bi /= p.batch[j];
        q += i * p.q_b[j]; k += i * p.k_b[j]; v += i * p.v_b[j]; b += i * p.b_b[j];
    }
    *qo = q; *ko = k; *vo = v; *bo = b;
}

static __device__ __forceinline__ float lum_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
static __device__ __forceinline__ float lum_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Block: LUM_WARPS warps, LUM_BQ query rows (LUM_ROWS a warp) of batch blockIdx.y, keys of
   split blockIdx.z. Every __syncthreads is reached by every thread of the block (the loop
   bounds depend only on the block's indices). */
template <int DMAX, typename KV>
static __device__ __forceinline__ void lum_attn_tiled(LumAttnParams p, float* out,
        float* part, const float* q, const KV* k, const KV* v, const float* bias) {
    extern __shared__ float4 lum_smem4[]; /* float4: 16-byte aligned */
    float* sq = (float*)lum_smem4;                        /* [BQ][DMAX] */
    float* sk = sq + LUM_BQ * DMAX;                /* [BK][DMAX + 1] */
    float* sv = sk + LUM_BK * (DMAX + 1);          /* [BK][DMAX] */
    float* sb = sv + LUM_BK * DMAX;                /* [BQ][BK + 1] */
    float* sp = sb + LUM_BQ * (LUM_BK + 1);        /* [BQ][BK] */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long s = p.s, d = p.d;
    const long long q0 = (long long)blockIdx.x * LUM_BQ;
    const long long bi = blockIdx.y, split = blockIdx.z;
    const long long k_begin = split * p.keys_per_split;
    const long long k_end = (k_begin + p.keys_per_split < p.t) ? k_begin + p.keys_per_split : p.t;
    const float scale = __int_as_float((int)p.scale_bits);
    long long qo, ko, vo, bo;
    lum_attn_offsets(p, bi, &qo, &ko, &vo, &bo);
    const bool vec = ((d | ko | vo | p.k_t | p.v_t) & 3) == 0;
    for (int i = tid; i < LUM_BQ * DMAX; i += LUM_WARPS * 32) {
        int r = i / DMAX, c = i % DMAX;
        long long row = q0 + r;
        sq[i] = (row < s && c < d) ? q[qo + row * p.q_s + c] : 0.0f;
    }
    float o[LUM_ROWS][DMAX / 32];
    float m[LUM_ROWS], l[LUM_ROWS];
    for (int rr = 0; rr < LUM_ROWS; ++rr) {
        m[rr] = LUM_NEG_INF;
        l[rr] = 0.0f;
        for (int c = 0; c < DMAX / 32; ++c) o[rr][c] = 0.0f;
    }
    for (long long kt = k_begin; kt < k_end; kt += LUM_BK) {
        __syncthreads(); /* the previous tile's reads (and the q tile's writes) are done */
        /* The bias tile (-inf outside the rows and keys), and whether any of it is visible. */
        int vis = 0;
        for (int i = tid; i < LUM_BQ * LUM_BK; i += LUM_WARPS * 32) {
            int r = i / LUM_BK, j = i % LUM_BK;
            long long row = q0 + r, key = kt + j;
            float b = LUM_NEG_INF;
            if (row < s && key < k_end) {
                b = p.has_bias ? bias[bo + row * p.b_s + key * p.b_t] : 0.0f;
            }
            sb[r * (LUM_BK + 1) + j] = b;
            vis |= (b != LUM_NEG_INF);
        }
        if (!__syncthreads_or(vis)) continue; /* the same value in every thread */
        lum_attn_stage<DMAX, LUM_WARPS * 32, DMAX + 1, DMAX>(k, v, ko, vo, p.k_t, p.v_t, kt, k_end, d, vec, sk, sv, tid);
        __syncthreads();
        /* A warp whose rows are all past s computes nothing (warp-uniform; no block barrier
           until the next tile). */
        if (q0 + warp * LUM_ROWS >= s) continue;
        /* Scores: lane = key of the tile, LUM_ROWS rows of this warp. */
        float sc[LUM_ROWS];
        for (int rr = 0; rr < LUM_ROWS; ++rr) sc[rr] = 0.0f;
        const float* kr = sk + lane * (DMAX + 1);
        for (int c = 0; c < DMAX; c += 4) {
            float k0 = kr[c], k1 = kr[c + 1], k2 = kr[c + 2], k3 = kr[c + 3];
            for (int rr = 0; rr < LUM_ROWS; ++rr) {
                float4 qv = *(const float4*)(sq + (warp * LUM_ROWS + rr) * DMAX + c);
                sc[rr] += qv.x * k0 + qv.y * k1 + qv.z * k2 + qv.w * k3;
            }
        }
        float* spw = sp + warp * LUM_ROWS * LUM_BK;
        for (int rr = 0; rr < LUM_ROWS; ++rr) {
            float b = sb[(warp * LUM_ROWS + rr) * (LUM_BK + 1) + lane];
            float x = (b == LUM_NEG_INF) ? LUM_NEG_INF : sc[rr] * scale + b;
            float mn = fmaxf(m[rr], lum_warp_max(x));
            float base = (mn == LUM_NEG_INF) ? 0.0f : mn;
            float pr = exp2f((x - base) * LUM_LOG2E);
            float corr = exp2f((m[rr] - base) * LUM_LOG2E);
            l[rr] = l[rr] * corr + lum_warp_sum(pr);
            m[rr] = mn;
            for (int c = 0; c < DMAX / 32; ++c) o[rr][c] *= corr;
            spw[rr * LUM_BK + lane] = pr;
        }
        __syncwarp();
        /* Output: lane = columns lane, lane + 32, ... */
        for (int j = 0; j < LUM_BK; j += 4) {
            float vv[4][DMAX / 32];
            for (int jj = 0; jj < 4; ++jj)
                for (int c = 0; c < DMAX / 32; ++c) vv[jj][c] = sv[(j + jj) * DMAX + lane + 32 * c];
            for (int rr = 0; rr < LUM_ROWS; ++rr) {
                float4 pv = *(const float4*)(spw + rr * LUM_BK + j);
                for (int c = 0; c < DMAX / 32; ++c)
                    o[rr][c] += pv.x * vv[0][c] + pv.y * vv[1][c] + pv.z * vv[2][c] + pv.w * vv[3][c];
            }
        }
        __syncwarp();
    }
    for (int rr = 0; rr < LUM_ROWS; ++rr) {
        long long row = q0 + warp * LUM_ROWS + rr;
        if (row >= s) continue;
        if (p.splits <= 1) {
            float* orow = out + (bi * s + row) * d;
            for (int c = 0; c < DMAX / 32; ++c) {
                long long col = lane + 32 * c;
                if (col < d) orow[col] = o[rr][c] / l[rr];
            }
        } else {
            long long base = (split * p.batch[0] * p.batch[1] * p.batch[2] * p.batch[3] + bi) * s + row;
            float* po = part + base * d;
            for (int c = 0; c < DMAX / 32; ++c) {
                long long col = lane + 32 * c;
                if (col < d) po[col] = o[rr][c];
            }
            if (lane == 0) {
                long long nall = p.splits * p.batch[0] * p.batch[1] * p.batch[2] * p.batch[3] * s;
                float* ml = part + nall * d + base * 2;
                ml[0] = m[rr];
                ml[1] = l[rr];
            }
        }
    }
}

/* A warp a query row (any head dim): the output row accumulates in place. */
template <typename KV>
static __device__ __forceinline__ void lum_attn_simple(LumAttnParams p, float* out,
        const float* q, const KV* k, const KV* v, const float* bias) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long s = p.s, t = p.t, d = p.d;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp, bi = blockIdx.y;
    if (row >= s) return; /* a whole warp; no block barriers below */
    const float scale = __int_as_float((int)p.scale_bits);
    long long qo, ko, vo, bo;
    lum_attn_offsets(p, bi, &qo, &ko, &vo, &bo);
    const float* qr = q + qo + row * p.q_s;
    float* orow = out + (bi * s + row) * d;
    for (long long c = lane; c < d; c += 32) orow[c] = 0.0f;
    float m = LUM_NEG_INF, l = 0.0f;
    for (long long key = 0; key < t; ++key) {
        float b = p.has_bias ? bias[bo + row * p.b_s + key * p.b_t] : 0.0f;
        if (b == LUM_NEG_INF) continue; /* the same in every lane */
        float dot = 0.0f;
        for (long long c = lane; c < d; c += 32) dot += qr[c] * lum_attn_ld(k, ko + key * p.k_t + c);
        float x = lum_warp_sum(dot) * scale + b;
        float mn = fmaxf(m, x);
        float pr = exp2f((x - mn) * LUM_LOG2E);
        float corr = exp2f((m - mn) * LUM_LOG2E);
        l = l * corr + pr;
        m = mn;
        for (long long c = lane; c < d; c += 32)
            orow[c] = orow[c] * corr + pr * lum_attn_ld(v, vo + key * p.v_t + c);
    }
    for (long long c = lane; c < d; c += 32) orow[c] = orow[c] / l;
}

extern "C" __global__ void lum_attn_tiled_64_f32(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const float* k, const float* v, const float* bias) { lum_attn_tiled<64, float>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_tiled_128_f32(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const float* k, const float* v, const float* bias) { lum_attn_tiled<128, float>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_tiled_64_f16(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const unsigned short* k, const unsigned short* v, const float* bias) { lum_attn_tiled<64, unsigned short>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_tiled_128_f16(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const unsigned short* k, const unsigned short* v, const float* bias) { lum_attn_tiled<128, unsigned short>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_simple_f32(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const float* k, const float* v, const float* bias) { lum_attn_simple<float>(*lum_pp, out, q, k, v, bias); }
extern "C" __global__ void lum_attn_simple_f16(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const unsigned short* k, const unsigned short* v, const float* bias) { lum_attn_simple<unsigned short>(*lum_pp, out, q, k, v, bias); }

/* ---- Tensor cores: 3xTF32 mma.sync (sm_80+). Each product a·b is computed as
   a_big·b_big + a_big·b_small + a_small·b_big with x = x_big + x_small split into two tf32
   values (cvt.rna), which keeps f32 accuracy (the dropped a_small·b_small is ~2^-22 of a·b).
   Fragment layouts of m16n8k8 (.tf32, row.col), g = lane / 4, c = lane % 4:
   A (16x8): a0 (g, c), a1 (g+8, c), a2 (g, c+4), a3 (g+8, c+4);
   B (8x8):  b0 (k c, n g), b1 (k c+4, n g);
   C (16x8): c0 (g, 2c), c1 (g, 2c+1), c2 (g+8, 2c), c3 (g+8, 2c+1). */
#define LUM_MQ 64
#define LUM_MK 32 /* 4 column tiles of 8 keys (lum_mma3x4) */
#define LUM_MWARPS 4
static __device__ __forceinline__ unsigned lum_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
static __device__ __forceinline__ void lum_mma_tf32(float* d, const unsigned* a, const unsigned* b) {
    /* Not volatile: the compiler may interleave independent products (a chain of dependent
       mma.sync in program order leaves the tensor cores idle for their latency). */
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* x = big + small, both tf32 (n values). */
static __device__ __forceinline__ void lum_split(const float* x, unsigned* big, unsigned* small, int n) {
    for (int i = 0; i < n; ++i) {
        big[i] = lum_tf32(x[i]);
        small[i] = lum_tf32(x[i] - __uint_as_float(big[i]));
    }
}
/* d[n] += a·b[n] in 3xTF32 for 4 column tiles n, a and b split by lum_split; the three
   passes are outermost so that consecutive products are independent. */
static __device__ __forceinline__ void lum_mma3x4(float (*d)[4], const unsigned* ab,
        const unsigned* as, const unsigned (*bb)[2], const unsigned (*bs)[2]) {
#pragma unroll
    for (int n = 0; n < 4; ++n) lum_mma_tf32(d[n], as, bb[n]);
#pragma unroll
    for (int n = 0; n < 4; ++n) lum_mma_tf32(d[n], ab, bs[n]);
#pragma unroll
    for (int n = 0; n < 4; ++n) lum_mma_tf32(d[n], ab, bb[n]);
}

/* Block: 4 warps, 64 query rows (16 a warp) of batch blockIdx.y, keys of split blockIdx.z in
   tiles of 32. Shared memory (floats): q [64][DMAX+4], k [32][DMAX+4], v [32][DMAX+8],
   p [4 warps][16][36] (strides chosen so that fragment loads hit 32 distinct banks). Every
   __syncthreads is reached by all threads (loop bounds depend on block indices only). */
template <int DMAX, typename KV>
static __device__ __forceinline__ void lum_attn_mma(LumAttnParams p, float* out,
        float* part, const float* q, const KV* k, const KV* v, const float* bias) {
    const int QS = DMAX + 4, KS = DMAX + 4, VS = DMAX + 8, PS = LUM_MK + 4;
    extern __shared__ float4 lum_smem4[];
    float* sq = (float*)lum_smem4;
    float* sk = sq + LUM_MQ * QS;
    float* sv = sk + LUM_MK * KS;
    float* sp = sv + LUM_MK * VS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const long long s = p.s, d = p.d;
    const long long q0 = (long long)blockIdx.x * LUM_MQ;
    const long long bi = blockIdx.y, split = blockIdx.z;
    const long long k_begin = split * p.keys_per_split;
    const long long k_end = (k_begin + p.keys_per_split < p.t) ? k_begin + p.keys_per_split : p.t;
    const float scale = __int_as_float((int)p.scale_bits);
    long long qo, ko, vo, bo;
    lum_attn_offsets(p, bi, &qo, &ko, &vo, &bo);
    const bool vec = ((d | ko | vo | p.k_t | p.v_t) & 3) == 0;
    for (int i = tid; i < LUM_MQ * DMAX; i += LUM_MWARPS * 32) {
        int r = i / DMAX, c = i % DMAX;
        long long row = q0 + r;
        sq[r * QS + c] = (row < s && c < d) ? q[qo + row * p.q_s + c] : 0.0f;
    }
    const long long r0 = q0 + warp * 16 + g, r1 = r0 + 8;
    const bool warp_live = q0 + warp * 16 < s;
    float o[DMAX / 8][4];
    for (int nt = 0; nt < DMAX / 8; ++nt)
        for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
    float m0 = LUM_NEG_INF, m1 = LUM_NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const float* qw = sq + warp * 16 * QS;
    float* spw = sp + warp * 16 * PS;
    /* Software pipeline: the next tile's bias values and (when `vec`) its keys and values are
       loaded into registers while this tile computes, then stored to shared memory at the
       top of the next iteration. Layout of the staged keys/values as lum_attn_stage's vec
       path: a thread loads 4 columns (c4) of rows j0 + i * RPP. */
    const int CH = DMAX / 4, RPP = LUM_MWARPS * 32 / CH, PASSES = LUM_MK / RPP;
    const int c4 = (tid % CH) * 4, j0 = tid / CH;
    LumRaw<KV> pk[PASSES], pv[PASSES];
    float pb[LUM_MK / 8][4];
    auto issue = [&](long long kt) {
        for (int nt = 0; nt < LUM_MK / 8; ++nt)
            for (int e = 0; e < 4; ++e) {
                long long row = (e < 2) ? r0 : r1, key = kt + nt * 8 + 2 * tg + (e & 1);
                float b = LUM_NEG_INF;
                if (row < s && key < k_end) b = p.has_bias ? bias[bo + row * p.b_s + key * p.b_t] : 0.0f;
                pb[nt][e] = b;
            }
        if (vec) {
#pragma unroll
            for (int i = 0; i < PASSES; ++i) {
                const long long key = kt + j0 + i * RPP;
                lum_raw_zero(pk[i]);
                lum_raw_zero(pv[i]);
                if (key < k_end && c4 < d) {
                    lum_raw_ld(pk[i], k, ko + key * p.k_t + c4);
                    lum_raw_ld(pv[i], v, vo + key * p.v_t + c4);
                }
            }
        }
    };
    if (k_begin < k_end) issue(k_begin);
    for (long long kt = k_begin; kt < k_end; kt += LUM_MK) {
        __syncthreads(); /* the previous tile's reads (and the q tile's writes) are done */
        if (vec) {
#pragma unroll
            for (int i = 0; i < PASSES; ++i) {
                const float4 kx = lum_raw_f4(pk[i]), vx = lum_raw_f4(pv[i]);
                float* kd = sk + (j0 + i * RPP) * KS + c4;
                float* vd = sv + (j0 + i * RPP) * VS + c4;
                kd[0] = kx.x; kd[1] = kx.y; kd[2] = kx.z; kd[3] = kx.w;
                vd[0] = vx.x; vd[1] = vx.y; vd[2] = vx.z; vd[3] = vx.w;
            }
        } else {
            lum_attn_stage<DMAX, LUM_MWARPS * 32, DMAX + 4, DMAX + 8>(k, v, ko, vo, p.k_t, p.v_t, kt, k_end, d, vec, sk, sv, tid);
        }
        /* This thread's bias values (C layout), -inf outside the rows and keys. */
        float sc[LUM_MK / 8][4];
        int vis = 0;
        for (int nt = 0; nt < LUM_MK / 8; ++nt)
            for (int e = 0; e < 4; ++e) {
                sc[nt][e] = pb[nt][e];
                vis |= (pb[nt][e] != LUM_NEG_INF);
            }
        if (kt + LUM_MK < k_end) issue(kt + LUM_MK);
        /* The same value in every thread; also the barrier after the stores above. */
        if (!__syncthreads_or(vis)) continue;
        if (!warp_live) continue; /* warp-uniform; no block barrier until the next tile */
        /* S = Q·Kᵀ: 16 rows x 32 keys a warp. */
        float acc[LUM_MK / 8][4];
        for (int nt = 0; nt < LUM_MK / 8; ++nt)
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
        for (int ks = 0; ks < DMAX; ks += 8) {
            float a[4] = {qw[g * QS + ks + tg], qw[(g + 8) * QS + ks + tg],
                          qw[g * QS + ks + tg + 4], qw[(g + 8) * QS + ks + tg + 4]};
            unsigned ab[4], as[4];
            lum_split(a, ab, as, 4);
            unsigned bb[4][2], bs[4][2]; /* LUM_MK / 8 == 4 column tiles */
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                float b[2] = {sk[(nt * 8 + g) * KS + ks + tg], sk[(nt * 8 + g) * KS + ks + tg + 4]};
                lum_split(b, bb[nt], bs[nt], 2);
            }
            lum_mma3x4(acc, ab, as, bb, bs);
        }
        /* Online softmax over rows r0 (e 0, 1) and r1 (e 2, 3); a row's 32 keys are spread
           over the 4 threads of a group (lanes 4g .. 4g+3). */
        float mx0 = m0, mx1 = m1;
        for (int nt = 0; nt < LUM_MK / 8; ++nt)
            for (int e = 0; e < 4; ++e) {
                float b = sc[nt][e];
                float x = (b == LUM_NEG_INF) ? LUM_NEG_INF : acc[nt][e] * scale + b;
                sc[nt][e] = x;
                if (e < 2) mx0 = fmaxf(mx0, x); else mx1 = fmaxf(mx1, x);
            }
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float base0 = (mx0 == LUM_NEG_INF) ? 0.0f : mx0, base1 = (mx1 == LUM_NEG_INF) ? 0.0f : mx1;
        const float corr0 = exp2f((m0 - base0) * LUM_LOG2E), corr1 = exp2f((m1 - base1) * LUM_LOG2E);
        float sum0 = 0.0f, sum1 = 0.0f;
        for (int nt = 0; nt < LUM_MK / 8; ++nt)
            for (int e = 0; e < 4; ++e) {
                float pr = exp2f((sc[nt][e] - ((e < 2) ? base0 : base1)) * LUM_LOG2E);
                if (e < 2) sum0 += pr; else sum1 += pr;
                spw[((e < 2) ? g : g + 8) * PS + nt * 8 + 2 * tg + (e & 1)] = pr;
            }
        for (int off = 1; off < 4; off <<= 1) {
            sum0 += __shfl_xor_sync(0xffffffffu, sum0, off);
            sum1 += __shfl_xor_sync(0xffffffffu, sum1, off);
        }
        l0 = l0 * corr0 + sum0;
        l1 = l1 * corr1 + sum1;
        m0 = mx0;
        m1 = mx1;
        for (int nt = 0; nt < DMAX / 8; ++nt) {
            o[nt][0] *= corr0; o[nt][1] *= corr0;
            o[nt][2] *= corr1; o[nt][3] *= corr1;
        }
        __syncwarp();
        /* O += P·V: 16 rows x DMAX columns a warp. */
        for (int ks = 0; ks < LUM_MK; ks += 8) {
            float a[4] = {spw[g * PS + ks + tg], spw[(g + 8) * PS + ks + tg],
                          spw[g * PS + ks + tg + 4], spw[(g + 8) * PS + ks + tg + 4]};
            unsigned ab[4], as[4];
            lum_split(a, ab, as, 4);
#pragma unroll
            for (int n0 = 0; n0 < DMAX / 8; n0 += 4) {
                unsigned bb[4][2], bs[4][2];
#pragma unroll
                for (int n = 0; n < 4; ++n) {
                    const int nt = n0 + n;
                    float b[2] = {sv[(ks + tg) * VS + nt * 8 + g], sv[(ks + tg + 4) * VS + nt * 8 + g]};
                    lum_split(b, bb[n], bs[n], 2);
                }
                lum_mma3x4(o + n0, ab, as, bb, bs);
            }
        }
        __syncwarp(); /* p is rewritten by the next tile */
    }
    const long long nbs = p.batch[0] * p.batch[1] * p.batch[2] * p.batch[3] * s;
    for (int hf = 0; hf < 2; ++hf) {
        const long long row = hf ? r1 : r0;
        if (row >= s) continue;
        const float l = hf ? l1 : l0, m = hf ? m1 : m0;
        const long long base = split * nbs + bi * s + row;
        for (int nt = 0; nt < DMAX / 8; ++nt)
            for (int e = 0; e < 2; ++e) {
                long long col = nt * 8 + 2 * tg + e;
                if (col >= d) continue;
                float x = o[nt][2 * hf + e];
                if (p.splits <= 1) out[(bi * s + row) * d + col] = x / l;
                else part[base * d + col] = x;
            }
        if (p.splits > 1 && tg == 0) {
            float* ml = part + p.splits * nbs * d + base * 2;
            ml[0] = m;
            ml[1] = l;
        }
    }
}

extern "C" __global__ void lum_attn_mma_64_f32(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const float* k, const float* v, const float* bias) { lum_attn_mma<64, float>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_mma_128_f32(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const float* k, const float* v, const float* bias) { lum_attn_mma<128, float>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_mma_64_f16(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const unsigned short* k, const unsigned short* v, const float* bias) { lum_attn_mma<64, unsigned short>(*lum_pp, out, part, q, k, v, bias); }
extern "C" __global__ void lum_attn_mma_128_f16(const LumAttnParams* __restrict__ lum_pp, float* out, float* part, const float* q, const unsigned short* k, const unsigned short* v, const float* bias) { lum_attn_mma<128, unsigned short>(*lum_pp, out, part, q, k, v, bias); }
"#;

/// The entry point of [`CUDA_SOURCE`] that runs `c` as `variant`, or `None` when k and v
/// differ in dtype (the plan then runs the kernels).
pub fn kernel_name(c: &AttnCall, variant: Variant) -> Option<String> {
    if c.k_f16 != c.v_f16 {
        return None;
    }
    let ty = if c.k_f16 != 0 { "f16" } else { "f32" };
    Some(match variant {
        Variant::Tiled { dmax } => format!("lum_attn_tiled_{dmax}_{ty}"),
        Variant::Mma { dmax } => format!("lum_attn_mma_{dmax}_{ty}"),
        Variant::Simple => format!("lum_attn_simple_{ty}"),
        Variant::Half { dmax } => format!("lum_attn_h16_{dmax}"),
    })
}

/// Every entry point of [`CUDA_SOURCE`].
pub const KERNEL_NAMES: [&str; 10] = [
    "lum_attn_mma_64_f32",
    "lum_attn_mma_128_f32",
    "lum_attn_mma_64_f16",
    "lum_attn_mma_128_f16",
    "lum_attn_tiled_64_f32",
    "lum_attn_tiled_128_f32",
    "lum_attn_tiled_64_f16",
    "lum_attn_tiled_128_f16",
    "lum_attn_simple_f32",
    "lum_attn_simple_f16",
];

// SAFETY: `AttnCall` is `#[repr(C)]` plain `i64`s (no padding, no pointers): its bytes are
// the `LumAttnParams` struct the kernels take by value.
unsafe impl cudarc::driver::DeviceRepr for AttnCall {}

/// `ceil(a / b)` for positive `b` (`i64::div_ceil` is not stable).
pub fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_plans() {
        // Prefill: enough blocks, no split.
        let mut c = AttnCall {
            batch: [1, 1, 1, 32],
            s: 1024,
            t: 1024,
            d: 128,
            ..Default::default()
        };
        let (v, grid, threads, smem) = launch_plan(&mut c, 132, false, false);
        assert_eq!(v, Variant::Tiled { dmax: 128 });
        assert_eq!((grid, threads), ((16, 32, 1), THREADS));
        assert_eq!(c.splits, 1);
        assert_eq!(smem as i64, shared_bytes(128));
        let (v, grid, threads, smem) = launch_plan(&mut c, 132, true, false);
        assert_eq!(v, Variant::Mma { dmax: 128 });
        assert_eq!((grid, threads), ((16, 32, 1), MMA_THREADS));
        assert_eq!(smem as i64, mma_shared_bytes(128));
        assert!(mma_shared_bytes(128) <= 227 * 1024 && shared_bytes(128) <= 227 * 1024);
        // Decode: one row, long keys: split, every key covered once.
        let mut c = AttnCall {
            batch: [1, 1, 3, 3],
            s: 1,
            t: 1000,
            d: 64,
            ..Default::default()
        };
        let (_, grid, _, _) = launch_plan(&mut c, 132, true, false);
        assert!(c.splits > 1 && c.keys_per_split % BK == 0);
        assert!(c.splits * c.keys_per_split >= c.t && (c.splits - 1) * c.keys_per_split < c.t);
        assert_eq!(grid.2 as i64, c.splits);
        // f16 keys and values: the f16 kernel where `half` (and `mma`), its 1-D grid of query
        // tiles × batches × splits, its shared memory, and scratch for its split.
        let mut c = AttnCall {
            batch: [1, 1, 4, 2],
            s: 1,
            t: 3000,
            d: 128,
            k_f16: 1,
            v_f16: 1,
            ..Default::default()
        };
        let (v, grid, threads, smem) = launch_plan(&mut c, 132, true, true);
        assert_eq!(v, Variant::Half { dmax: 128 });
        assert_eq!((threads, smem), (half::THREADS, half::shared_bytes(128)));
        assert!(smem <= 227 * 1024 && c.splits > 1 && c.keys_per_split % half::KEYS == 0);
        assert_eq!(grid, ((8 * c.splits) as u32, 1, 1));
        assert_eq!(scratch_floats(&c), c.splits * 8 * (128 + 2));
        assert_eq!(kernel_name(&c, v).unwrap(), "lum_attn_h16_128");
        assert_eq!(
            launch_plan(&mut c, 132, true, false).0,
            Variant::Mma { dmax: 128 }
        );
        assert_eq!(
            launch_plan(&mut c, 132, false, true).0,
            Variant::Tiled { dmax: 128 }
        );
        c.k_f16 = 0;
        assert_eq!(
            launch_plan(&mut c, 132, true, true).0,
            Variant::Mma { dmax: 128 }
        );
        // Large head dim: the simple kernel.
        let mut c = AttnCall {
            batch: [1, 1, 1, 2],
            s: 5,
            t: 7,
            d: 200,
            ..Default::default()
        };
        assert_eq!(launch_plan(&mut c, 132, true, false).0, Variant::Simple);
    }
}
