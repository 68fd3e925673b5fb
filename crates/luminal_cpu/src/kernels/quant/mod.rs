//! Weights read in place: block-quantized (`Q4_0` … `Q6_K`) and half (`f16`, `bf16`) weight
//! inputs consumed through `w.dequantize()` by a matmul (`x · Wᵀ`) or a gather (embedding
//! rows). The lowering folds the cast into the consumer (see [`dequantized_weight`]), so no
//! f32 copy of a weight exists at any time:
//!
//! - **int8 products** (block-quantized weights, unless the product is `exact`):
//!   activations quantized per group of 16 (`int8.rs`), each weight row's dot with each
//!   activation row in integer arithmetic (`int8_matmul.rs`). Skinny products (`M ≤ 8`,
//!   decode): Q4_0 … Q8_0 (`legacy_dot.rs`) and Q4_K, Q6_K (`kquant_dot.rs`) unpacked in
//!   registers once per chunk of up to four activation rows, the other formats into a
//!   scratch row (`unpack.rs`). Wide products (prefill) with AVX-512 VNNI: blocks of weight
//!   rows unpacked into a panel in the span layout (`span_acts.rs`, `span_dot.rs`), one
//!   lane a group, shared by all `M` rows; with AVX2 (no VNNI): strips of 8 weight rows,
//!   one lane a row, in register tiles with 4 activation rows (`tile_avx2.rs`);
//! - **skinny exact products** (`M ≤ 8` rows, decode steps, f32 activations): Q4_0, Q4_1
//!   and Q8_0 dequantize in registers (`dot.rs`), the other formats are unpacked to bytes
//!   (`int8::dot_f32`), halves convert in registers as they stream past
//!   (`matmul/skinny_half.rs`, a block of weight rows at a time);
//! - **wide f32 products** (prefill with f32 activations or below AVX2, Q2_K without
//!   VNNI, and halves):
//!   tiles of weight rows are decoded into scratch and multiplied by `gemm`, so the decode
//!   cost is shared by all `M` rows;
//! - **gather**: the picked rows are decoded straight into the output.
//!
//! Decoding is the core's reference decoder ([`luminal::quant::decode`]); anything else
//! reading a quantized input goes through [`DequantKernel`] (decode, then read the view).

/// `$body` for `$r` = 0, 1, … `$n − 1` (`$n` a constant ≤ 8), unrolled: with `$r` a
/// literal, per-row accumulator arrays stay in registers (a loop over rows may not be
/// unrolled by the compiler, and then indexes them in memory).
macro_rules! for_rows {
    ($n:expr, |$r:ident| $body:block) => {
        for_rows!(@ $n, $r, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $n:expr, $r:ident, $body:block, $($i:literal)*) => {
        $(
            if $i < $n {
                let $r: usize = $i;
                $body
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
mod amx_int8;
mod dot;
pub(crate) mod int8;
pub(crate) mod int8_matmul;
mod kquant_dot;
mod legacy_dot;
pub(crate) mod span_acts;
mod span_dot;
mod tile_avx2;
mod unpack;

use crate::kernel::{BufId, CpuKernel, RunCtx};
use crate::kernels::half::CastKernel;
use crate::kernels::matmul::skinny::{skinny, Out, OutPtr, SkinnyWeight, MAX_ROWS};
use crate::simd::isa;
use crate::storage::Elem;
use crate::storage::{BufRef, Storage};
use crate::view::DimNames;
use half::{bf16, f16};
use luminal::graph::{Edge, GraphData, NodeId};
use luminal::op::Op;
use luminal::{DType, LuminalError, Result};
use std::cell::RefCell;

/// Dtypes a weight kernel reads in place.
pub(crate) fn is_weight_dtype(dtype: DType) -> bool {
    dtype.is_quantized() || matches!(dtype, DType::F16 | DType::BF16)
}

/// `e` reads `w.dequantize()` (a cast to f32) of a rank-2 quantized or half input `w`,
/// read whole: the input node and its dtype. Kernels that consume such an edge read the
/// input's blocks in place instead of the cast's output.
pub(crate) fn dequantized_weight(g: &GraphData, e: &Edge) -> Option<(NodeId, DType)> {
    let cast = g.node(e.node);
    if cast.op != Op::Cast(DType::F32) {
        return None;
    }
    let src = &cast.inputs[0];
    let w = g.node(src.node);
    let whole = src.view.is_contiguous() && src.view.dims() == w.shape;
    (matches!(w.op, Op::Input { .. }) && is_weight_dtype(w.dtype) && whole && w.shape.len() == 2)
        .then_some((src.node, w.dtype))
}

/// A `[n, k]` row-major weight of `dtype`, as raw bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WeightRef<'a> {
    pub dtype: DType,
    pub bytes: &'a [u8],
    pub n: usize,
    pub k: usize,
}

/// `v` as bytes.
fn half_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: f16 / bf16 are plain 2-byte values with no padding; every byte is initialised
    // and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl<'a> WeightRef<'a> {
    /// The weight held by `s` (raw blocks, or a typed half buffer), `None` when `s` holds
    /// another storage or too few bytes for `[n, k]`.
    pub(crate) fn of(s: &'a Storage, dtype: DType, n: usize, k: usize) -> Option<WeightRef<'a>> {
        let bytes = match s {
            Storage::Bytes(b) if b.dtype() == dtype => b.as_slice(),
            Storage::F16(v) if dtype == DType::F16 => half_bytes(v),
            Storage::BF16(v) if dtype == DType::BF16 => half_bytes(v),
            _ => return None,
        };
        let w = WeightRef { dtype, bytes, n, k };
        (k.is_multiple_of(dtype.block_size()) && bytes.len() >= n * w.row_bytes()).then_some(w)
    }

    pub(crate) fn row_bytes(&self) -> usize {
        self.k / self.dtype.block_size() * self.dtype.block_bytes()
    }

    /// Rows `j0 .. j0 + out.len() / k` decoded into `out`.
    pub(crate) fn decode_rows(&self, j0: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let rows = out.len() / self.k.max(1);
        decode(self.dtype, &self.bytes[j0 * rb..(j0 + rows) * rb], out);
    }
}

/// `bytes` (whole blocks of `dtype`) decoded into `out`: the reference decoder, with the
/// vectorised half widening where the data is aligned.
fn decode(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    // SAFETY: any 2-byte pattern is a valid f16 / bf16; `align_to` only yields the aligned
    // middle part.
    match dtype {
        DType::F16 => {
            let (pre, mid, post) = unsafe { bytes.align_to::<f16>() };
            if pre.is_empty() && post.is_empty() {
                return f16::widen(mid, out);
            }
        }
        DType::BF16 => {
            let (pre, mid, post) = unsafe { bytes.align_to::<bf16>() };
            if pre.is_empty() && post.is_empty() {
                return bf16::widen(mid, out);
            }
        }
        _ => {}
    }
    luminal::quant::decode(dtype, bytes, out)
}

thread_local! {
    /// Decoded weight rows of this thread's current task (grows once, then reused).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

thread_local! {
    /// This thread's unpacked weight rows: quants, group scales, group biases.
    static UNPACKED: RefCell<(Vec<u8>, Vec<f32>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// `f` on this thread's unpacked-row scratch for `k` values (`k / 16` groups).
fn with_unpacked<R>(k: usize, f: impl FnOnce(&mut [u8], &mut [f32], &mut [f32]) -> R) -> R {
    UNPACKED.with(|s| {
        let (u, a, b) = &mut *s.borrow_mut();
        let g = k / unpack::GROUP;
        if u.len() < k {
            u.resize(k, 0);
        }
        if a.len() < g {
            a.resize(g, 0.0);
            b.resize(g, 0.0);
        }
        f(&mut u[..k], &mut a[..g], &mut b[..g])
    })
}

/// Bytes of decoded weight rows a wide-product tile holds (fits in L2 with room for the
/// activation panel).
const TILE_BYTES: usize = 512 << 10;

/// Whether wide int8 products take the AMX tiles now (`amx_int8.rs`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_int8_active() -> bool {
    amx_int8::takes(int8::DotPath::current())
}

/// Bytes of weight rows an int8 product with many activation rows keeps hot while every
/// activation row passes over them (see `int8_matmul.rs`).
const PANEL_BYTES: usize = 64 << 10;

/// Prefetches `bytes[at .. at + len]` (see [`crate::simd::prefetch_raw`]).
#[inline(always)]
fn prefetch(bytes: &[u8], at: usize, len: usize) {
    crate::simd::prefetch_raw(bytes.as_ptr().wrapping_add(at), len);
}

/// Whether [`weight_matmul`] computes an `m`-row product with a `dtype` weight with int8
/// activations: block-quantized weights, not `exact`, and a skinny product, a CPU with
/// AVX-512 VNNI (`span_dot.rs`), or AVX2 and a format of its tiles (`tile_avx2.rs`: all but
/// Q2_K; elsewhere wide products keep f32 activations and `gemm`).
pub(crate) fn takes_int8(dtype: DType, m: usize, exact: bool) -> bool {
    let path = int8::DotPath::current();
    !exact
        && unpack::has_int8_dot(dtype)
        && (m <= MAX_ROWS || span_dot::wide_int8(path) || tile_avx2::wide_int8(path, dtype))
}

/// A block-quantized weight (or an f32 / half one read through `WeightRef`) as the skinny
/// product's format with f32 activations (`exact` products, and formats without int8
/// dots): per weight row, the format's fused f32 dot where it has one (`dot.rs`), else
/// the row unpacked to bytes and group scales (`int8::dot_f32`) where the format unpacks,
/// else the row decoded to f32 (scratch) and dotted with each activation row.
pub(crate) struct QuantRows<'w> {
    w: WeightRef<'w>,
}

impl<'w> QuantRows<'w> {
    pub(crate) fn new(w: WeightRef<'w>) -> Self {
        QuantRows { w }
    }
}

impl SkinnyWeight for QuantRows<'_> {
    type Acts = ();

    fn shape(&self) -> (usize, usize) {
        (self.w.n, self.w.k)
    }

    fn with_acts<R>(&self, _rows: &[&[f32]], f: impl FnOnce(&()) -> R) -> R {
        f(&())
    }

    fn columns(&self, _: &(), rows: &[&[f32]], cols: std::ops::Range<usize>, out: Out) {
        let w = self.w;
        let (k, rb) = (w.k, w.row_bytes());
        let row = |j: usize| {
            prefetch(w.bytes, j * rb + crate::simd::PREFETCH_AHEAD, rb);
            &w.bytes[j * rb..(j + 1) * rb]
        };
        if dot::has_fused_dot(w.dtype) {
            let isa = isa();
            for j in cols {
                let r = row(j);
                for (i, x) in rows.iter().enumerate() {
                    // SAFETY: i < m, j < n; this task alone writes column j.
                    unsafe { out.put(i, j, dot::dot(isa, w.dtype, x, r)) };
                }
            }
        } else if unpack::has_int8_dot(w.dtype) {
            let path = int8::DotPath::current();
            let signed = unpack::signed_quants(w.dtype);
            with_unpacked(k, |u, sa, sb| {
                for j in cols {
                    unpack::unpack(w.dtype, row(j), u, sa, sb);
                    let wr = int8::URow {
                        u,
                        a: sa,
                        b: sb,
                        signed,
                    };
                    for (i, x) in rows.iter().enumerate() {
                        // SAFETY: as above.
                        unsafe { out.put(i, j, int8::dot_f32(path, wr, x)) };
                    }
                }
            })
        } else {
            let isa = isa();
            with_scratch(k, |s| {
                for j in cols {
                    decode(w.dtype, row(j), s);
                    for (i, x) in rows.iter().enumerate() {
                        let v = crate::kernels::matmul::skinny_f32::dot(isa, x, s);
                        // SAFETY: as above.
                        unsafe { out.put(i, j, v) };
                    }
                }
            })
        }
    }
}

/// `dst[i·n + j] = Σ_k a[a_off + i·a_row + k] · W[j, k]` for `i < m`, `j < n`: the product
/// `x · Wᵀ` with `W` read in place. Allocates nothing once the per-thread scratch has grown.
/// Products with block-quantized weights take int8 dots (activations quantized per group
/// of 16, see `int8.rs`) unless `exact` (see [`takes_int8`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn weight_matmul(
    a: &[f32],
    a_off: usize,
    a_row: usize,
    w: WeightRef,
    dst: &mut [f32],
    m: usize,
    threads: usize,
    exact: bool,
) {
    let (n, k) = (w.n, w.k);
    assert!(dst.len() >= m * n, "weight matmul: output too short");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    assert!(
        m == 0 || a.len() >= a_off + (m - 1) * a_row + k,
        "weight matmul: activation too short"
    );
    let out = OutPtr(dst.as_mut_ptr());
    let parallel = threads > 1 && m * n * k >= (1 << 15);
    if m <= MAX_ROWS {
        // The skinny product (`matmul/skinny.rs`), int8 or f32 activations.
        if takes_int8(w.dtype, m, exact) {
            skinny(
                &int8_matmul::Int8Rows::new(w),
                a,
                (a_off, a_row),
                dst,
                m,
                parallel,
            );
        } else if !half_product(a, (a_off, a_row), w, dst, m, parallel) {
            skinny(&QuantRows::new(w), a, (a_off, a_row), dst, m, parallel);
        }
        return;
    }
    if takes_int8(w.dtype, m, exact) {
        int8_matmul::int8_matmul(a, a_off, a_row, w, out, m, parallel);
        return;
    }
    if half_product(a, (a_off, a_row), w, dst, m, parallel) {
        return;
    }
    // Wide: tiles of `tile` weight rows decoded, then one gemm per tile into its columns.
    let tile = (TILE_BYTES / (4 * k)).clamp(16, 256) / 16 * 16;
    let tasks = n.div_ceil(tile);
    let run_tile = |t: usize| {
        let out = out;
        let (j0, j1) = (t * tile, ((t + 1) * tile).min(n));
        with_scratch((j1 - j0) * k, |s| {
            w.decode_rows(j0, s);
            // SAFETY: the activation rows lie inside `a` (asserted above); `s` holds the
            // `j1 - j0` decoded rows of `k` values, read as the `k × (j1 - j0)` matrix Wᵀ;
            // the destination is columns `j0 .. j1` of the `m × n` row-major output, which
            // no other task writes.
            unsafe {
                crate::kernels::matmul::gemm_f32::sgemm(
                    m,
                    j1 - j0,
                    k,
                    crate::kernels::matmul::gemm_f32::Mat {
                        ptr: a.as_ptr().add(a_off),
                        rs: a_row as isize,
                        cs: 1,
                    },
                    crate::kernels::matmul::gemm_f32::Mat {
                        ptr: s.as_ptr(),
                        rs: 1,
                        cs: k as isize,
                    },
                    out.0.add(j0),
                    n,
                )
            }
        });
    };
    if parallel && tasks > 1 {
        crate::exec::par::for_each(tasks, run_tile);
    } else {
        (0..tasks).for_each(run_tile);
    }
}

/// A product with an f16 or bf16 weight read in place: skinny (`M ≤ MAX_ROWS`) through
/// `matmul/skinny_half.rs` (the weight converted in registers as it streams past, several
/// rows at a time), wide through `matmul/half/gemm.rs` (the weight widened once per task in
/// its own layout, the activations packed once per product). Whether it ran: `false` for
/// other dtypes, a half weight whose bytes are not 2-byte aligned, or a wide product on a
/// CPU without AVX2 + F16C.
fn half_product(
    a: &[f32],
    a_at: (usize, usize),
    w: WeightRef,
    dst: &mut [f32],
    m: usize,
    parallel: bool,
) -> bool {
    use crate::kernels::matmul::half::gemm::weight_gemm;
    use crate::kernels::matmul::skinny_half::{Half, HalfRows};
    fn go<H: Half>(
        h: &[H],
        a: &[f32],
        a_at: (usize, usize),
        dst: &mut [f32],
        (m, n, k): (usize, usize, usize),
        parallel: bool,
    ) -> bool {
        if m <= MAX_ROWS {
            skinny(&HalfRows::new(h, (0, k), n, k), a, a_at, dst, m, parallel);
            return true;
        }
        weight_gemm(a, a_at, h, dst, (m, n, k), parallel)
    }
    let mnk = (m, w.n, w.k);
    match w.dtype {
        DType::F16 => halves::<f16>(&w).is_some_and(|h| go(h, a, a_at, dst, mnk, parallel)),
        DType::BF16 => halves::<bf16>(&w).is_some_and(|h| go(h, a, a_at, dst, mnk, parallel)),
        _ => false,
    }
}

/// `w` as a slice of its half type `H` (`None` when its bytes are not 2-byte aligned).
fn halves<'a, H: crate::kernels::matmul::skinny_half::Half>(w: &WeightRef<'a>) -> Option<&'a [H]> {
    // SAFETY: any 2-byte pattern is a valid f16 / bf16; `align_to` only yields the aligned
    // middle part.
    let (pre, mid, _) = unsafe { w.bytes.align_to::<H>() };
    (pre.is_empty() && mid.len() >= w.n * w.k).then(|| &mid[..w.n * w.k])
}

/// Rows `picked[s]` of the `[rows, width]` weight decoded into `out` (row `s` at
/// `out[s·width ..]`), in parallel over rows when there is enough data.
pub(crate) fn gather_rows(w: WeightRef, picked: &[usize], out: &mut [f32]) {
    let width = w.k;
    if width == 0 {
        return;
    }
    let per_task = (1usize << 16).div_ceil(width).max(1);
    crate::exec::par::for_each_chunk(out, per_task * width, |t, chunk| {
        for (s, dst) in chunk.chunks_mut(width).enumerate() {
            w.decode_rows(picked[t * per_task + s], dst);
        }
    });
}

/// A cast of a quantized input to a float type read through any view (the general case the
/// weight kernels do not cover): the input is decoded whole into the runtime's shared
/// launch arena (`RunCtx::arena`, not a copy kept per kernel), which the float cast kernel
/// then reads through the view (padding reads 0; halves round once).
#[derive(Debug)]
pub struct DequantKernel {
    dtype: DType,
    /// Reads the decoded values; its `input` is the quantized input's buffer.
    pub cast: CastKernel,
}

impl DequantKernel {
    /// The kernel for node `id` when it is a cast of a quantized tensor.
    pub(crate) fn try_new(g: &GraphData, id: NodeId, names: &DimNames) -> Result<Option<Self>> {
        let node = g.node(id);
        let Op::Cast(_) = node.op else {
            return Ok(None);
        };
        let e = &node.inputs[0];
        let dtype = g.node(e.node).dtype;
        if !dtype.is_quantized() {
            return Ok(None);
        }
        Ok(Some(DequantKernel {
            dtype,
            cast: CastKernel::reading(e, names)?,
        }))
    }
}

impl CpuKernel for DequantKernel {
    fn reads(&self) -> Vec<BufId> {
        vec![self.cast.input]
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.cast.input = map(self.cast.input);
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        // The view is checked against the input's value count.
        self.cast.prepare(cx.dims, cx.bufs)?;
        let Storage::Bytes(b) = &cx.bufs[self.cast.input] else {
            return Err(LuminalError::Backend(format!(
                "dequantize: the input buffer does not hold {} blocks",
                self.dtype
            )));
        };
        let decoded = cx.arena;
        if decoded.len() < b.len() {
            decoded.resize(b.len(), 0.0);
        }
        luminal::quant::decode(self.dtype, b.as_slice(), &mut decoded[..b.len()]);
        self.cast
            .run_from(BufRef::F32(&decoded[..b.len()]), out, cx.n)
    }
    fn flops(&self, _n: usize) -> usize {
        0
    }
}

/// Kernel timings of the skinny quantized products (a measurement that asserts nothing, so
/// ignored by default; quoted in `benches/README.md`): `cargo test --release -p luminal_cpu
/// --lib timing -- --ignored --nocapture`.
#[cfg(test)]
pub(crate) mod timing {
    use super::*;

    /// `n × k` values of `dtype` as deterministic pseudo-random blocks whose f16 scale (and
    /// min) fields are set to 0.1: ordinary numbers for the timing loops.
    pub(crate) fn timing_weight(dtype: DType, n: usize, k: usize) -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..dtype.bytes_for(n * k).unwrap())
            .map(|i| (i * 7919 % 251) as u8)
            .collect();
        for blk in bytes.chunks_mut(dtype.block_bytes()) {
            for &o in dtype.half_fields() {
                blk[o] = 0x66;
                blk[o + 1] = 0x2E;
            }
        }
        bytes
    }
    #[test]
    #[ignore]
    fn int8_parts() {
        let (n, k) = (1536usize, 576usize);
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q8_0,
            DType::Q5_0,
            DType::Q4_K,
            DType::Q6_K,
        ] {
            let k = if dtype.block_size() == 256 { 768 } else { k };
            let bytes = timing_weight(dtype, n, k);
            let w = WeightRef {
                dtype,
                bytes: &bytes,
                n,
                k,
            };
            let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut u = vec![0u8; k];
            let (mut a, mut b) = (vec![0f32; k / 16], vec![0f32; k / 16]);
            let rb = w.row_bytes();
            let reps = 200;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for j in 0..n {
                    unpack::unpack(dtype, &bytes[j * rb..(j + 1) * rb], &mut u, &mut a, &mut b);
                }
            }
            let tu = t.elapsed().as_secs_f64() / reps as f64;
            let mut q = int8::QActs::default();
            q.quantize(1, k, |_| &x);
            let path = int8::DotPath::current();
            let t = std::time::Instant::now();
            let mut s = 0.0;
            for _ in 0..reps {
                for _ in 0..n {
                    s += int8::dot(
                        path,
                        int8::URow {
                            u: &u,
                            a: &a,
                            b: &b,
                            signed: false,
                        },
                        q.row(0),
                    );
                }
            }
            let td = t.elapsed().as_secs_f64() / reps as f64;
            let t = std::time::Instant::now();
            if let Some((fused, _)) = int8_matmul::fused_rows_dot(path, dtype) {
                let mut o = [0f32];
                for _ in 0..reps {
                    for j in 0..n {
                        fused(
                            path,
                            dtype,
                            &bytes[j * rb..(j + 1) * rb],
                            q.rows(0, 1),
                            &mut o,
                        );
                        s += o[0];
                    }
                }
            }
            let tl = t.elapsed().as_secs_f64() / reps as f64;
            let mut out = vec![0f32; n];
            let t = std::time::Instant::now();
            for _ in 0..reps {
                weight_matmul(&x, 0, k, w, &mut out, 1, 1, false);
            }
            let tm = t.elapsed().as_secs_f64() / reps as f64;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                weight_matmul(&x, 0, k, w, &mut out, 1, 1, true);
            }
            let tf = t.elapsed().as_secs_f64() / reps as f64;
            let nw = (n * k) as f64;
            println!(
                "{dtype}: unpack {:.2} ns/64w, dot {:.2} ns/64w, fused {:.2}, matmul int8 {:.2} ns/64w, f32 {:.2} ns/64w {s}",
                tu / nw * 64e9, td / nw * 64e9, tl / nw * 64e9, tm / nw * 64e9, tf / nw * 64e9
            );
        }
    }

    /// Streaming from memory: one pass over a 128 MiB weight (no cache reuse), one thread.
    #[test]
    #[ignore]
    fn int8_stream() {
        for (dtype, k) in [
            (DType::Q4_1, 576usize),
            (DType::Q4_1, 1536),
            (DType::Q4_0, 576),
            (DType::Q8_0, 576),
            (DType::Q4_K, 2048),
            (DType::Q6_K, 2048),
        ] {
            let rb = dtype.bytes_for(k).unwrap();
            let n = (128usize << 20) / rb;
            let bytes = timing_weight(dtype, n, k);
            let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut q = int8::QActs::default();
            q.quantize(1, k, |_| &x);
            let path = int8::DotPath::current();
            let (dot, _) = int8_matmul::fused_rows_dot(path, dtype).unwrap();
            let mut s = 0.0;
            let mut best = f64::MAX;
            let mut o = [0f32];
            for _ in 0..5 {
                let t = std::time::Instant::now();
                for j in 0..n {
                    dot(
                        path,
                        dtype,
                        &bytes[j * rb..(j + 1) * rb],
                        q.rows(0, 1),
                        &mut o,
                    );
                    s += o[0];
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let w = WeightRef {
                dtype,
                bytes: &bytes,
                n,
                k,
            };
            let mut out = vec![0f32; n];
            let mut best_m = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                weight_matmul(&x, 0, k, w, &mut out, 1, 1, false);
                best_m = best_m.min(t.elapsed().as_secs_f64());
            }
            let nw = (n * k) as f64;
            println!(
                "{dtype} K={k}: dot loop {:.2} ns/64w ({:.2} GB/s), weight_matmul {:.2} ns/64w ({:.2} GB/s) {s}",
                best / nw * 64e9,
                bytes.len() as f64 / best / 1e9,
                best_m / nw * 64e9,
                bytes.len() as f64 / best_m / 1e9
            );
        }
    }
}
