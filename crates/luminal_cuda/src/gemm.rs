//! Matrix products through cuBLAS (`cublasGemmStridedBatchedEx`): f32 (optionally TF32),
//! f16 and bf16 operands with f32 accumulation.
//!
//! `hl_ops::matmul` builds `SumReduce(last)` of a `Mul` whose operands are broadcast views:
//! `a` (`[.., M, K]`) expanded along N and `b` (`[.., K, N]` transposed to `[.., N, K]`)
//! expanded along M, both seen as `[batch.., M, N, K]`. [`find`] recognises that pattern at
//! compile time (the `Mul` read only by the reduction, unmasked operand views); at run time,
//! when the dims are bound, [`resolve`] turns the operands' strides and offsets into cuBLAS
//! calls, or gives `None` when a layout is not one cuBLAS can read (a stride that is neither 1
//! nor a valid leading dimension), and the plan then runs the two generated kernels as before.
//! The `Mul` buffer (`M·N·K` values) is never materialised on the cuBLAS path.
//!
//! Element types ([`GemmType`]):
//! - all f32: f32 products (TF32 tensor cores only where the backend asks for them);
//! - the multiply and the sum in f16 or bf16 with operands of that type: the half type in
//!   and out, products and sums in f32 (as cuBLAS and PyTorch compute them: the products are
//!   not rounded to the half type one by one as the primops' semantics would);
//! - an f32 product whose operand is a widening cast from f16/bf16 (a half weight, an f16 KV
//!   cache) read only by the multiply, through a plain contiguous view: cuBLAS reads the half
//!   buffer before the cast (the cast's kernel does not run and no f32 copy is made). When both
//!   operands are such casts of the same type this is exact (a product of two halves is exact
//!   in f32). When only one is, the other (f32 activations) is rounded to that half type
//!   first ([`Pattern::round`], one small kernel), as PyTorch's autocast does; a backend that
//!   does not allow this ([`find`]'s `round`) widens the half operand as before.
//! - an f32 product whose operand is a widening cast of a block-quantized weight input
//!   (Q8_0, Q4_K, …): the plan dequantizes the weight into an f16 copy once (again only when
//!   the input is set again, [`Pattern::dequant`]) and cuBLAS multiplies that copy with the
//!   activations rounded to f16 — half the bytes per weight of an f32 copy, and no per-run
//!   dequantization.
//!
//! The calls are in cuBLAS's column-major terms: the row-major `C[m, n] = Σ_k a[m, k]·b[n, k]`
//! is the column-major `Cᵀ (N×M) = op(B) (N×K) · op(Aᵀ) (K×M)`, so cuBLAS's `A` is our `b`
//! and its `B` our `a`. The host emulator runs the same calls with a plain loop
//! ([`host_gemm`]), so the pattern matching and the parameter resolution are tested without a
//! GPU.

use luminal::graph::{Edge, GraphData, NodeId};
use luminal::op::{BinaryOp, Op, ReduceOp};
use luminal::{DType, Expression};
use std::collections::{HashMap, HashSet};

/// The element type of a cuBLAS operand or result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    F32,
    F16,
    BF16,
}

impl GemmType {
    /// The type of a buffer of `dtype`, if cuBLAS reads it.
    pub fn of(dtype: DType) -> Option<GemmType> {
        match dtype {
            DType::F32 => Some(GemmType::F32),
            DType::F16 => Some(GemmType::F16),
            DType::BF16 => Some(GemmType::BF16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            GemmType::F32 => 4,
            GemmType::F16 | GemmType::BF16 => 2,
        }
    }

    /// The luminal dtype.
    pub fn dtype(self) -> DType {
        match self {
            GemmType::F32 => DType::F32,
            GemmType::F16 => DType::F16,
            GemmType::BF16 => DType::BF16,
        }
    }
}

/// Which operand of a [`Pattern`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// A recognised product: `SumReduce(last)` of `Mul(a, b)`.
#[derive(Clone, Debug)]
pub struct Pattern {
    /// The reduction (its output is `C`, contiguous `[batch.., M, N]`).
    pub reduce: NodeId,
    /// The product, not computed on the cuBLAS path.
    pub mul: NodeId,
    /// The operand broadcast along N: `a[.., m, k]` (the buffer cuBLAS reads: a bypassed
    /// cast's input, through the multiply's view).
    pub a: Edge,
    /// The operand broadcast along M: `b[.., n, k]`.
    pub b: Edge,
    /// `[batch.., M, N, K]`.
    pub dims: Vec<Expression>,
    /// The element types of `a`'s and `b`'s buffers and of the result.
    pub a_type: GemmType,
    pub b_type: GemmType,
    pub c_type: GemmType,
    /// An f32 operand rounded to a half type (into a scratch buffer) before the call.
    pub round: Option<(Side, GemmType)>,
    /// Widening casts the multiply reads that cuBLAS bypasses: not launched when the product
    /// goes to cuBLAS (their kernels run when it falls back to the kernels).
    pub casts: Vec<NodeId>,
    /// The operand that is a block-quantized weight input (`a`/`b` then name the input, read
    /// through the multiply's view): the plan dequantizes it into an f16 copy once per value
    /// the input is set to, and cuBLAS reads that copy (the other operand rounded to f16).
    pub dequant: Option<Side>,
    /// That weight's cast (whose view the f16 copy's kernel reads the blocks through).
    pub dequant_cast: Option<NodeId>,
}

/// One `cublasGemmStridedBatchedEx` call (column-major; offsets in elements of each buffer's
/// type; f32 accumulation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmCall {
    /// `op(A) = Aᵀ` (else `A`).
    pub trans_a: bool,
    /// `op(B) = Bᵀ` (else `B`).
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub batch: i32,
    pub offset_a: i64,
    pub offset_b: i64,
    pub offset_c: i64,
    /// Element types of cuBLAS's `A` (our `b`), `B` (our `a`) and `C`.
    pub a_type: GemmType,
    pub b_type: GemmType,
    pub c_type: GemmType,
}

impl GemmCall {
    /// Every field, as integers (a run's signature).
    pub fn words(&self) -> [i64; 18] {
        [
            self.trans_a as i64,
            self.trans_b as i64,
            self.m as i64,
            self.n as i64,
            self.k as i64,
            self.lda as i64,
            self.ldb as i64,
            self.ldc as i64,
            self.stride_a,
            self.stride_b,
            self.stride_c,
            self.batch as i64,
            self.offset_a,
            self.offset_b,
            self.offset_c,
            self.a_type as i64,
            self.b_type as i64,
            self.c_type as i64,
        ]
    }
}

/// The most activation rows (cuBLAS's `n`) a call may have to run as a
/// [`crate::codegen::skinny_kernel`].
pub const SKINNY_ROWS: i32 = 4;

/// Whether `call` fits the skinny kernel: one batch, at most [`SKINNY_ROWS`] activation rows,
/// the weight (cuBLAS's `A`) read transposed (`K` contiguous) and the activations not.
pub fn skinny(call: &GemmCall) -> bool {
    call.batch == 1 && call.n <= SKINNY_ROWS && call.trans_a && !call.trans_b
}

/// The products of `order` (live nodes, topological) that can go to cuBLAS. `round`: an f32
/// operand may be rounded to the half type of the other (a half weight) so that cuBLAS reads
/// the weight in place.
pub fn find(graph: &GraphData, order: &[NodeId], round: bool) -> Vec<Pattern> {
    let live: HashSet<NodeId> = order.iter().copied().collect();
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in order {
        for e in &graph.node(id).inputs {
            *uses.entry(e.node).or_default() += 1;
        }
    }
    let private = |id: NodeId| uses.get(&id) == Some(&1) && !graph.outputs.contains(&id);
    // A widening cast from a half type, read only by the product or of a weight input (a
    // tied embedding, also gathered), of a buffer read as a whole: the operand cuBLAS may read
    // in place (the edge re-pointed at the cast's input; a cast with other readers still
    // runs for them, so it is not among the bypassed `casts`).
    let bypass = |e: &Edge| -> Option<(Edge, GemmType, Option<NodeId>)> {
        let cast = graph.node(e.node);
        if !matches!(cast.op, Op::Cast(DType::F32)) || cast.dtype != DType::F32 {
            return None;
        }
        let input = &cast.inputs[0];
        let t = GemmType::of(graph.node(input.node).dtype)?;
        let weight = matches!(graph.node(input.node).op, Op::Input { .. });
        (t != GemmType::F32
            && (private(e.node) || weight)
            && input.view.is_contiguous()
            && input.view.dims() == cast.shape)
            .then(|| {
                (
                    Edge {
                        node: input.node,
                        view: e.view.clone(),
                    },
                    t,
                    private(e.node).then_some(e.node),
                )
            })
    };
    // A widening cast of a block-quantized weight input (constant shape) through a plain
    // contiguous view: dequantized once into an f16 copy (a cast with other readers, a tied
    // embedding's, still runs for them).
    let quantized = |e: &Edge| -> Option<Edge> {
        let cast = graph.node(e.node);
        if !matches!(cast.op, Op::Cast(DType::F32)) || cast.dtype != DType::F32 {
            return None;
        }
        let input = &cast.inputs[0];
        let w = graph.node(input.node);
        (matches!(w.op, Op::Input { .. })
            && w.dtype.is_quantized()
            && input.view.is_contiguous()
            && input.view.dims() == cast.shape
            && cast.shape.iter().all(|d| d.as_constant().is_some()))
        .then(|| Edge {
            node: input.node,
            view: e.view.clone(),
        })
    };
    let mut out = vec![];
    for &id in order {
        let node = graph.node(id);
        let Op::Reduce {
            op: ReduceOp::Sum,
            axis,
        } = node.op
        else {
            continue;
        };
        let e = &node.inputs[0];
        let r = e.view.rank();
        let mul = graph.node(e.node);
        let Some(c_type) = GemmType::of(node.dtype) else {
            continue;
        };
        if r < 3
            || axis != r - 1
            || mul.op != Op::Binary(BinaryOp::Mul)
            || mul.dtype != node.dtype
            || !live.contains(&e.node)
            || !private(e.node)
            || !e.view.is_contiguous()
            || e.view.dims() != mul.shape
        {
            continue;
        }
        let dims = e.view.dims();
        let Some((a, b)) = luminal::hl_ops::product_operands(&mul.inputs, &dims) else {
            continue;
        };
        let (ta, tb) = (graph.node(a.node).dtype, graph.node(b.node).dtype);
        if ta != node.dtype || tb != node.dtype {
            continue;
        }
        let mut p = Pattern {
            reduce: id,
            mul: e.node,
            a: a.clone(),
            b: b.clone(),
            dims,
            a_type: c_type,
            b_type: c_type,
            c_type,
            round: None,
            casts: vec![],
            dequant: None,
            dequant_cast: None,
        };
        if c_type == GemmType::F32 {
            match (bypass(a), bypass(b)) {
                (Some((ea, t, ca)), Some((eb, u, cb))) if t == u => {
                    (p.a, p.b, p.a_type, p.b_type) = (ea, eb, t, t);
                    p.casts = ca.into_iter().chain(cb).collect();
                }
                (Some((ea, t, ca)), None) if round => {
                    (p.a, p.a_type, p.b_type) = (ea, t, t);
                    p.round = Some((Side::B, t));
                    p.casts = ca.into_iter().collect();
                }
                (None, Some((eb, t, cb))) if round => {
                    (p.b, p.a_type, p.b_type) = (eb, t, t);
                    p.round = Some((Side::A, t));
                    p.casts = cb.into_iter().collect();
                }
                (None, None) if round => {
                    let t = GemmType::F16;
                    match (quantized(a), quantized(b)) {
                        (Some(ea), None) if graph.node(b.node).dtype == DType::F32 => {
                            (p.a, p.a_type, p.b_type) = (ea, t, t);
                            p.round = Some((Side::B, t));
                            p.casts = private(a.node).then_some(a.node).into_iter().collect();
                            p.dequant = Some(Side::A);
                            p.dequant_cast = Some(a.node);
                        }
                        (None, Some(eb)) if graph.node(a.node).dtype == DType::F32 => {
                            (p.b, p.a_type, p.b_type) = (eb, t, t);
                            p.round = Some((Side::A, t));
                            p.casts = private(b.node).then_some(b.node).into_iter().collect();
                            p.dequant = Some(Side::B);
                            p.dequant_cast = Some(b.node);
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        out.push(p);
    }
    out
}

/// A matrix operand `[rows, K]` with strides `(s_row, s_k)`: whether it is read transposed
/// from a column-major buffer (`k_contiguous`: element `(row, k)` at `k + row·ld`) and its
/// leading dimension; `None` if neither layout holds. Strides of size-1 dims do not matter.
fn layout(rows: i64, k: i64, s_row: i64, s_k: i64) -> Option<(bool, i64)> {
    if k == 1 || s_k == 1 {
        let ld = if rows == 1 { k.max(1) } else { s_row };
        if ld >= k.max(1) {
            return Some((true, ld));
        }
    }
    if rows == 1 || s_row == 1 {
        let ld = if k == 1 { rows.max(1) } else { s_k };
        if ld >= rows.max(1) {
            return Some((false, ld));
        }
    }
    None
}

/// The cuBLAS calls of `p` at the current dims (`eval` evaluates an expression), or `None`
/// when its operands' layouts are not cuBLAS's (the plan then runs the kernels).
pub fn resolve(p: &Pattern, eval: &dyn Fn(&Expression) -> Option<i64>) -> Option<Vec<GemmCall>> {
    let r = p.dims.len();
    let dims: Vec<i64> = p.dims.iter().map(eval).collect::<Option<_>>()?;
    let (m, n, k) = (dims[r - 3], dims[r - 2], dims[r - 1]);
    if m <= 0 || n <= 0 || k <= 0 {
        return None;
    }
    let sa: Vec<i64> = p.a.view.strides().iter().map(eval).collect::<Option<_>>()?;
    let sb: Vec<i64> = p.b.view.strides().iter().map(eval).collect::<Option<_>>()?;
    let (oa, ob) = (eval(&p.a.view.offset())?, eval(&p.b.view.offset())?);
    if oa < 0 || ob < 0 || sa.iter().chain(&sb).any(|&s| s < 0) {
        return None;
    }
    // cuBLAS's A is `b` ([N, K]), its B is `a` ([M, K]).
    let (b_k_contiguous, lda) = layout(n, k, sb[r - 2], sb[r - 1])?;
    let (a_k_contiguous, ldb) = layout(m, k, sa[r - 3], sa[r - 1])?;
    let i32_of = |v: i64| i32::try_from(v).ok();
    let nb = r - 3;
    // The last batch dim is cuBLAS's batch; the others are looped over.
    let (batch, stride_a, stride_b) = if nb == 0 {
        (1, 0, 0)
    } else {
        let size = dims[nb - 1];
        let (s_b, s_a) = if size == 1 {
            (0, 0)
        } else {
            (sb[nb - 1], sa[nb - 1])
        };
        (size, s_b, s_a)
    };
    let outer: i64 = dims[..nb.saturating_sub(1)].iter().product();
    let mut calls = vec![];
    for o in 0..outer {
        // Offsets of batch index `o` over dims[..nb-1] (row-major).
        let (mut rest, mut off_a, mut off_b, mut off_c) = (o, oa, ob, 0i64);
        let mut c_stride = m * n * batch;
        for d in (0..nb.saturating_sub(1)).rev() {
            let i = rest % dims[d];
            rest /= dims[d];
            off_a += i * sa[d];
            off_b += i * sb[d];
            off_c += i * c_stride;
            c_stride *= dims[d];
        }
        calls.push(GemmCall {
            trans_a: b_k_contiguous,
            trans_b: !a_k_contiguous,
            m: i32_of(n)?,
            n: i32_of(m)?,
            k: i32_of(k)?,
            lda: i32_of(lda)?,
            ldb: i32_of(ldb)?,
            ldc: i32_of(n)?,
            stride_a,
            stride_b,
            stride_c: m * n,
            batch: i32_of(batch)?,
            offset_a: off_b,
            offset_b: off_a,
            offset_c: off_c,
            a_type: p.b_type,
            b_type: p.a_type,
            c_type: p.c_type,
        });
    }
    Some(calls)
}

/// Element `i` of a buffer of type `t` as f64.
///
/// # Safety
/// `p` must hold element `i`.
unsafe fn read(t: GemmType, p: *const u8, i: i64) -> f64 {
    match t {
        GemmType::F32 => *(p as *const f32).offset(i as isize) as f64,
        GemmType::F16 => {
            luminal::half::f16::from_bits(*(p as *const u16).offset(i as isize)).to_f64()
        }
        GemmType::BF16 => {
            luminal::half::bf16::from_bits(*(p as *const u16).offset(i as isize)).to_f64()
        }
    }
}

/// One call on host memory (the emulator's cuBLAS): `C = op(A)·op(B)` per batch, accumulated
/// in f64, rounded to f32 and then to C's type.
///
/// # Safety
/// `a`, `b`, `c` must hold every element the call addresses (in the call's types).
pub unsafe fn host_gemm(g: &GemmCall, a: *const u8, b: *const u8, c: *mut u8) {
    let (m, n, k) = (g.m as i64, g.n as i64, g.k as i64);
    let (lda, ldb, ldc) = (g.lda as i64, g.ldb as i64, g.ldc as i64);
    for t in 0..g.batch as i64 {
        let (pa, pb, pc) = (
            g.offset_a + t * g.stride_a,
            g.offset_b + t * g.stride_b,
            g.offset_c + t * g.stride_c,
        );
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0f64;
                for p in 0..k {
                    let x = if g.trans_a {
                        read(g.a_type, a, pa + p + i * lda)
                    } else {
                        read(g.a_type, a, pa + i + p * lda)
                    };
                    let y = if g.trans_b {
                        read(g.b_type, b, pb + j + p * ldb)
                    } else {
                        read(g.b_type, b, pb + p + j * ldb)
                    };
                    acc += x * y;
                }
                let at = (pc + i + j * ldc) as isize;
                let v = acc as f32;
                match g.c_type {
                    GemmType::F32 => *(c as *mut f32).offset(at) = v,
                    GemmType::F16 => {
                        *(c as *mut u16).offset(at) = luminal::half::f16::from_f32(v).to_bits()
                    }
                    GemmType::BF16 => {
                        *(c as *mut u16).offset(at) = luminal::half::bf16::from_f32(v).to_bits()
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        // Row-major [rows, K]: k contiguous, ld = row stride.
        assert_eq!(layout(5, 7, 7, 1), Some((true, 7)));
        // Transposed view of a [K, rows] buffer.
        assert_eq!(layout(5, 7, 1, 5), Some((false, 5)));
        // A single row: its stride does not matter.
        assert_eq!(layout(1, 7, 0, 1), Some((true, 7)));
        // Broadcast rows (stride 0 with several rows) cannot be a cuBLAS operand.
        assert_eq!(layout(5, 7, 0, 1), None);
        // Strides that overlap rows.
        assert_eq!(layout(5, 7, 3, 1), None);
    }
}
