//! f32 matrix products through cuBLAS (`cublasSgemmStridedBatched`).
//!
//! `hl_ops::matmul` builds `SumReduce(last)` of a `Mul` whose operands are broadcast views:
//! `a` (`[.., M, K]`) expanded along N and `b` (`[.., K, N]` transposed to `[.., N, K]`)
//! expanded along M, both seen as `[batch.., M, N, K]`. [`find`] recognises that pattern at
//! compile time (f32 throughout, the `Mul` read only by the reduction, unmasked operand
//! views); at run time, when the dims are bound, [`resolve`] turns the operands' strides and
//! offsets into cuBLAS calls, or gives `None` when a layout is not one cuBLAS can read (a
//! stride that is neither 1 nor a valid leading dimension), and the plan then runs the two
//! generated kernels as before. The `Mul` buffer (`M·N·K` values) is never materialised on the
//! cuBLAS path.
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

/// A recognised product: `SumReduce(last)` of `Mul(a, b)`.
#[derive(Clone, Debug)]
pub struct Pattern {
    /// The reduction (its output is `C`, contiguous `[batch.., M, N]`).
    pub reduce: NodeId,
    /// The product, not computed on the cuBLAS path.
    pub mul: NodeId,
    /// The operand broadcast along N: `a[.., m, k]`.
    pub a: Edge,
    /// The operand broadcast along M: `b[.., n, k]`.
    pub b: Edge,
    /// `[batch.., M, N, K]`.
    pub dims: Vec<Expression>,
}

/// One `cublasSgemmStridedBatched` call (column-major; offsets in f32 elements).
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
}

/// The products of `order` (live nodes, topological) that can go to cuBLAS.
pub fn find(graph: &GraphData, order: &[NodeId]) -> Vec<Pattern> {
    let live: HashSet<NodeId> = order.iter().copied().collect();
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in order {
        for e in &graph.node(id).inputs {
            *uses.entry(e.node).or_default() += 1;
        }
    }
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
        let f32s = node.dtype == DType::F32
            && mul.dtype == DType::F32
            && mul
                .inputs
                .iter()
                .all(|x| graph.node(x.node).dtype == DType::F32);
        if r < 3
            || axis != r - 1
            || mul.op != Op::Binary(BinaryOp::Mul)
            || !f32s
            || !live.contains(&e.node)
            || uses.get(&e.node) != Some(&1)
            || graph.outputs.contains(&e.node)
            || !e.view.is_contiguous()
            || e.view.dims() != mul.shape
        {
            continue;
        }
        let dims = e.view.dims();
        let Some((a, b)) = luminal::hl_ops::product_operands(&mul.inputs, &dims) else {
            continue;
        };
        out.push(Pattern {
            reduce: id,
            mul: e.node,
            a: a.clone(),
            b: b.clone(),
            dims,
        });
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
        });
    }
    Some(calls)
}

/// One call on host memory (the emulator's cuBLAS): `C = op(A)·op(B)` per batch, accumulated
/// in f64.
///
/// # Safety
/// `a`, `b`, `c` must hold every element the call addresses.
pub unsafe fn host_gemm(g: &GemmCall, a: *const f32, b: *const f32, c: *mut f32) {
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
                        *a.offset((pa + p + i * lda) as isize)
                    } else {
                        *a.offset((pa + i + p * lda) as isize)
                    };
                    let y = if g.trans_b {
                        *b.offset((pb + j + p * ldb) as isize)
                    } else {
                        *b.offset((pb + p + j * ldb) as isize)
                    };
                    acc += x as f64 * y as f64;
                }
                *c.offset((pc + i + j * ldc) as isize) = acc as f32;
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
