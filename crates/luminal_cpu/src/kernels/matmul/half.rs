//! Half-precision products (f16, bf16 operands).
//!
//! The operands' addressed spans are widened (exactly) into `f32` scratch, the
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
//! weight: only `a`'s rows are widened, and the kernels of `skinny_half.rs` convert the
//! weight as it streams past, with the same exact products and f32 accumulation.
//!

pub(crate) mod gemm;

use super::{skinny, skinny_half, MatmulKernel};
use crate::kernel::HalfScratch;
use crate::kernels::half::CHUNK;
use crate::storage::Elem;
use crate::storage::{BufRef, Storage, StorageKind};
use crate::view::ResolvedView;
use luminal::{LuminalError, Result};

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
    fn go<H: Elem>(src: &[f32], o: &mut [H]) {
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
        if m <= crate::kernels::matmul::skinny::MAX_ROWS && sb[r - 1] == 1 && sb[r - 2] >= 0 {
            Some(SkinnyPath::Dots)
        } else if m == 1 && sb[r - 2] == 1 && sb[r - 1] >= 0 && n > 1 {
            Some(SkinnyPath::Axpy)
        } else {
            None
        }
    }

    /// The product into `dst` (`batch · M · N` floats): `a` is the widened span of `a`'s
    /// buffer from element `a_lo` on, `b` the weight's own buffer.
    fn run<H: crate::kernels::matmul::skinny_half::Half>(
        self,
        k: &MatmulKernel,
        a: &[f32],
        a_lo: i64,
        b: &[H],
        dst: &mut [f32],
    ) {
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
                SkinnyPath::Dots => {
                    let w = skinny_half::HalfRows::new(b, (ob, sb[r - 2] as usize), n, depth);
                    skinny::skinny(&w, a, (oa, sa[r - 3] as usize), d, m, parallel)
                }
                SkinnyPath::Axpy => {
                    skinny_half::axpy(a, oa, b, (ob, sb[r - 1] as usize), d, depth, parallel)
                }
            }
        }
    }
}
