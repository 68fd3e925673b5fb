//! The `terms` rule: nodes a search asked to compute with one of the backend's fused terms
//! ([`luminal::FusedTerm`], see `Tunable::compile_terms` in `search.rs`). The search names
//! the node and the term's operands, so nothing here matches a pattern: the operands are
//! only checked against what the kernel can read, and a term it cannot run is left to the
//! other rules (its primop subgraph is still in the graph).
//!
//! - `"online_attention"`, inputs `[q, k, v]` or `[q, k, v, bias]`, params `[scale]`: the
//!   views the scores product reads q (`[.., s, t, d]`, stride 0 along `t`) and k
//!   (`[.., s, t, d]`, stride 0 along `s`) with, the view the product with the values reads v
//!   (`[.., s, d, t]`, stride 0 along `s`), and the bias `[.., s, t]` read from an `[s, t]`
//!   node broadcast over the batch dims (k and v f32 or f16, as the hand rule reads an f16
//!   KV cache): the tiled online-softmax kernel
//!   (`kernels/attention.rs`).

use super::{Lowered, Lowering};
use crate::kernel::BufId;
use crate::kernels::attention::{AttentionBias, AttentionKernel};
use crate::view::{LaunchExpr, ViewExprs};
use luminal::graph::Edge;
use luminal::{DType, FusedTerm, NodeId, Result};
use std::cell::RefCell;

thread_local! {
    /// The fused terms of the compile running on this thread (lowering runs on the thread
    /// that compiles; `with_terms` scopes them to one compile).
    static TERMS: RefCell<Vec<FusedTerm>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` (a compile) with `terms` visible to the lowering.
pub(crate) fn with_terms<R>(terms: &[FusedTerm], f: impl FnOnce() -> R) -> R {
    struct Reset(Vec<FusedTerm>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let old = std::mem::take(&mut self.0);
            TERMS.with(|t| *t.borrow_mut() = old);
        }
    }
    let old = TERMS.with(|t| std::mem::replace(&mut *t.borrow_mut(), terms.to_vec()));
    let _reset = Reset(old);
    f()
}

/// The matrix products' schedule knobs of a compile (`CpuBackend::matmul_threads`,
/// `matmul_split`, `matmul_tiles`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MatmulKnobs {
    pub threads: Option<usize>,
    pub split: crate::kernels::matmul::Split,
    pub tiles: Option<crate::kernels::matmul::gemm_f32::Tiles>,
    pub precision: crate::kernels::matmul::gemm_f32::MatmulPrecision,
}

thread_local! {
    /// The matrix products' knobs of the compile running on this thread.
    static MATMUL_KNOBS: std::cell::Cell<MatmulKnobs> = std::cell::Cell::new(MatmulKnobs::default());
}

/// Runs `f` (a compile) with the products scheduled by `knobs`.
pub(crate) fn with_matmul_knobs<R>(knobs: MatmulKnobs, f: impl FnOnce() -> R) -> R {
    struct Reset(MatmulKnobs);
    impl Drop for Reset {
        fn drop(&mut self) {
            MATMUL_KNOBS.with(|t| t.set(self.0));
        }
    }
    let _reset = Reset(MATMUL_KNOBS.with(|t| t.replace(knobs)));
    f()
}

/// The products' thread count for a plan on `pool` threads.
pub(super) fn matmul_threads(pool: usize) -> usize {
    MATMUL_KNOBS
        .with(|t| t.get().threads)
        .map_or(pool, |n| n.clamp(1, pool.max(1)))
}

/// The products' split axis, cache blocking and precision in the compile on this thread.
pub(super) fn matmul_layout() -> (
    crate::kernels::matmul::Split,
    crate::kernels::matmul::gemm_f32::Tiles,
    crate::kernels::matmul::gemm_f32::MatmulPrecision,
) {
    let k = MATMUL_KNOBS.with(|t| t.get());
    (k.split, k.tiles.unwrap_or_default(), k.precision)
}

fn term_of(id: NodeId) -> Option<FusedTerm> {
    TERMS.with(|t| t.borrow().iter().find(|f| f.node == id).cloned())
}

/// Whether node `id` is computed by a fused term in the compile on this thread.
pub(super) fn is_term(id: NodeId) -> bool {
    TERMS.with(|t| t.borrow().iter().any(|f| f.node == id))
}

impl Lowering<'_> {
    /// The kernel of a node the search named as a fused term (see the module docs).
    pub(super) fn fused_term(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(term) = term_of(id) else {
            return Ok(None);
        };
        match term.term.as_str() {
            "online_attention" => self.online_attention(id, &term),
            _ => Ok(None),
        }
    }

    fn online_attention(&self, id: NodeId, t: &FusedTerm) -> Result<Option<Lowered>> {
        let g = self.g;
        let (Some(q), Some(k), Some(v), Some(&scale)) = (
            t.inputs.first(),
            t.inputs.get(1),
            t.inputs.get(2),
            t.params.first(),
        ) else {
            return Ok(None);
        };
        let r = q.view.rank();
        let out = &g.node(id).shape;
        let (qd, vd) = (q.view.dims(), v.view.dims());
        let zero = |e: &Edge, at: usize| e.view.strides()[at].is_zero();
        let unit = |e: &Edge, at: usize| e.view.strides()[at].as_constant() == Some(1);
        let f32_edge = |e: &Edge| g.node(e.node).dtype == DType::F32 && !e.view.is_masked();
        // Keys and values may be f16 (an f16 KV cache, widened inside the term).
        let kv_edge = |e: &Edge| {
            matches!(g.node(e.node).dtype, DType::F32 | DType::F16) && !e.view.is_masked()
        };
        if r < 3
            || k.view.dims() != qd
            || vd.len() != r
            || vd[..r - 2] != qd[..r - 2]
            || vd[r - 2] != qd[r - 1]
            || vd[r - 1] != qd[r - 2]
            || out[..] != vd[..r - 1]
            || !f32_edge(q)
            || !kv_edge(k)
            || !kv_edge(v)
            || !zero(q, r - 2)
            || !zero(k, r - 3)
            || !zero(v, r - 3)
            || !unit(q, r - 1)
            || !unit(k, r - 1)
            || !unit(v, r - 2)
        {
            return Ok(None);
        }
        let nb = r - 3;
        let (s_dim, t_dim) = (&qd[nb], &qd[nb + 1]);
        let bias_edge = t.inputs.get(3);
        let mut bias = None;
        if let Some(b) = bias_edge {
            // The kernel evaluates the bias per [s, t] tile: an [s, t] node broadcast
            // over the batch dims only.
            let bn = g.node(b.node);
            let bs = b.view.strides();
            let one = |d: &luminal::Expression| d.as_constant() == Some(1);
            if bn.dtype != DType::F32
                || bn.shape != [s_dim.clone(), t_dim.clone()]
                || b.view.is_masked()
                || !b.view.offset().is_zero()
                || (0..nb).any(|j| !bs[j].is_zero() && !one(&qd[j]))
                || !(bs[nb] == *t_dim || one(s_dim))
                || bs[nb + 1].as_constant() != Some(1)
            {
                return Ok(None);
            }
            let Some(program) = self.node_program(b.node)? else {
                return Ok(None);
            };
            bias = Some(AttentionBias::new(
                program,
                ViewExprs::new(&b.view, self.names)?,
                LaunchExpr::new(&bn.shape.iter().product(), self.names)?,
            ));
        }
        let views = (
            ViewExprs::new(&q.view, self.names)?,
            ViewExprs::new(&k.view, self.names)?,
            ViewExprs::new(&v.view, self.names)?,
        );
        let kernel = AttentionKernel::new(
            (BufId::of(q.node), BufId::of(k.node), BufId::of(v.node)),
            views,
            nb,
            scale as f32,
            bias,
        );
        Ok(Some(("online_attention".into(), Box::new(kernel))))
    }
}
