//! The gradient of a recognised attention in one piece (flash-attention's backward).
//!
//! Rule by rule, the backward of `softmax(q·kᵀ·scale + bias)·v` reads the forward's
//! probabilities `P` (`[batch.., s, t]`), so the forward must keep them and cannot run as
//! one fused kernel. For an attention the shared matcher recognises
//! ([`crate::patterns::AttentionMatch`]), autograd instead builds [`attention_backward`]:
//! the scores and `P` recomputed from q and k, then
//!
//! ```text
//! dP = dO·vᵀ    D = rowsum(P ⊙ dP)    dS = P ⊙ (dP − D)·scale
//! dq = dS·k     dk = dSᵀ·q            dv = Pᵀ·dO
//! ```
//!
//! stacked into one `[3, batch.., s, d]` node (`LUMINAL_ATTENTION_GRAD=0` or
//! [`super::set_attention_grads`] keep the rule-by-rule backward), with a hint in the graph
//! ([`crate::patterns::AttentionGrad`]) so a backend can compute it in one launch that keeps
//! each head's scores in cache. The forward then reads nothing inside the pattern, and
//! stays fusible. The recomputed nodes are tagged as a recomputation: CSE never merges
//! them back into the forward's.

use crate::graph::{GraphTensor, NodeId};
use crate::patterns::{AttentionGrad, AttentionMatch, AttentionRules};
use crate::shape::ShapeTracker;
use crate::DType;
use std::collections::HashMap;

/// The stacked gradient `[dq, dk, dv]` (`[3, batch.., s, d]`) of
/// `softmax(q·kᵀ·scale (+ bias))·v` for the output gradient `d_out`; q, k, v and `d_out`
/// are `[batch.., s, d]` (self-attention), the bias `[batch.., s, s]`. See the module docs.
pub fn attention_backward<'g>(
    q: GraphTensor<'g>,
    k: GraphTensor<'g>,
    v: GraphTensor<'g>,
    bias: Option<GraphTensor<'g>>,
    d_out: GraphTensor<'g>,
    scale: f32,
) -> GraphTensor<'g> {
    let r = q.rank();
    let (s_ax, t_ax) = (r - 2, r - 1);
    let scores = q.matmul(k.transpose(s_ax, t_ax)) * scale;
    let x = match bias {
        Some(b) => scores + b,
        None => scores,
    };
    let p = x.softmax(t_ax);
    let dp = d_out.matmul(v.transpose(s_ax, t_ax));
    let rows = (p * dp).sum_keepdim(t_ax);
    let ds = p * (dp - rows) * scale;
    let dq = ds.matmul(k);
    let dk = ds.transpose(s_ax, t_ax).matmul(q);
    let dv = p.transpose(s_ax, t_ax).matmul(d_out);
    GraphTensor::stack(&[dq, dk, dv], 0)
}

/// `view` without its stride-0 dim `axis`.
fn drop_broadcast(view: &ShapeTracker, axis: usize) -> ShapeTracker {
    let mut v = view.clone();
    v.slice(axis, 0.into(), 1.into());
    v.squeeze(axis);
    v
}

/// What autograd needs to build an attention's gradient in one piece.
pub(super) struct Recognised {
    /// q, k, v as `[batch.., s, d]` views of their nodes.
    pub q: (NodeId, ShapeTracker),
    pub k: (NodeId, ShapeTracker),
    pub v: (NodeId, ShapeTracker),
    pub bias: Option<(NodeId, ShapeTracker)>,
    pub scale: f32,
}

/// The attention whose output is `id`, when its gradient can be built in one piece: f32
/// self-attention (`s = t`) whose intermediates are read only inside it, and a bias (if any)
/// that needs no gradient (`wants_grad` is false for it).
pub(super) fn recognise(
    g: &crate::graph::GraphData,
    uses: &HashMap<NodeId, usize>,
    id: NodeId,
    wants_grad: &dyn Fn(NodeId) -> bool,
) -> Option<Recognised> {
    let no_cast = |_: DType| false;
    let rules = AttentionRules {
        kv_storage: &no_cast,
        bias_unit_keys: false,
    };
    let m = AttentionMatch::find(g, uses, id, &rules)?;
    if m.k_cast.is_some() || m.v_cast.is_some() {
        return None;
    }
    if m.bias.as_ref().is_some_and(|b| wants_grad(b.node)) {
        return None;
    }
    let nb = m.batch_dims;
    let q = drop_broadcast(&m.q.view, nb + 1); // [batch.., s, d]
    let k = drop_broadcast(&m.k.view, nb); // [batch.., t, d]
    let mut v = drop_broadcast(&m.v.view, nb); // [batch.., d, t]
    v.transpose(nb, nb + 1);
    if q.dims() != k.dims() || v.dims() != k.dims() {
        return None;
    }
    Some(Recognised {
        q: (m.q.node, q),
        k: (m.k.node, k),
        v: (m.v.node, v),
        bias: m.bias.map(|b| (b.node, b.view)),
        scale: m.scale,
    })
}

/// Builds the stacked gradient for `d_out` from q, k, v, bias handles, tags its nodes as a
/// recomputation and records the hint. Returns `[dq, dk, dv]`.
pub(super) fn build<'g>(
    cx: &'g crate::graph::Graph,
    (q, k, v, bias): (
        GraphTensor<'g>,
        GraphTensor<'g>,
        GraphTensor<'g>,
        Option<GraphTensor<'g>>,
    ),
    d_out: GraphTensor<'g>,
    scale: f32,
) -> (GraphTensor<'g>, [GraphTensor<'g>; 3]) {
    let start = cx.data().nodes.len() as u32;
    let stacked = attention_backward(q, k, v, bias, d_out, scale);
    let e = stacked.entry();
    let hint = AttentionGrad {
        q: q.edge(),
        k: k.edge(),
        v: v.edge(),
        bias: bias.map(|b| b.edge()),
        d_out: d_out.edge(),
        scale,
    };
    tag_recomputation(cx, start);
    {
        let mut d = cx.data_mut();
        if e.view.is_contiguous() && e.view.dims() == d.node(e.node).shape {
            d.attention_grads.insert(e.node, hint);
        }
    }
    let part = |i: i64| stacked.slice(0, i, i + 1).squeeze(0);
    (stacked, [part(0), part(1), part(2)])
}

/// Tags the nodes made since node id `start` as one recomputation: CSE never merges them
/// with nodes outside it (the forward's), so what the forward computes stays read only by
/// the forward.
pub(super) fn tag_recomputation(cx: &crate::graph::Graph, start: u32) {
    let mut d = cx.data_mut();
    let end = d.nodes.len() as u32;
    let tag = d.recompute.values().copied().max().unwrap_or(0) + 1;
    for raw in start..end {
        let id = NodeId(raw);
        if d.try_node(id).is_some() {
            d.recompute.insert(id, tag);
        }
    }
}

/// When q, k and v are the same view of one node at three offsets evenly apart (the
/// slices of a fused qkv projection), that node read as one `[3, batch.., s, d]` view: the
/// stacked gradient then reaches it through one view transpose (a permuted copy) instead
/// of three padded pieces added together.
pub(super) fn stacked_view(
    (q, k, v): (&ShapeTracker, &ShapeTracker, &ShapeTracker),
) -> Option<ShapeTracker> {
    let same = |a: &ShapeTracker, b: &ShapeTracker| {
        a.dims() == b.dims() && a.strides() == b.strides() && !a.is_masked() && !b.is_masked()
    };
    if !same(q, k) || !same(k, v) {
        return None;
    }
    let step = k.offset() - q.offset();
    if (v.offset() - k.offset()) != step || step.as_constant().is_none_or(|s| s <= 0) {
        return None;
    }
    q.with_leading_dim(3.into(), step)
}
