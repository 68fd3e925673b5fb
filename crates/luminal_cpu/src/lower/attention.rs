//! The `attention` rule: `softmax(q·kᵀ·scale + bias)·v` as the core's hl_ops build it
//! (`luminal_nn::causal_attention`, `luminal_nn::attention`) becomes one fused kernel (`kernels/attention/`) that
//! never materialises the `[s, t]` scores.
//!
//! The primop pattern, matched from the final product down (every node in it private to it):
//!
//! ```text
//! out = Sum_t( P[.., s, ·, t] * V[.., ·, d, t] )         P·V
//! P   = E * Recip(Sum_t(E))[.., s, ·]                    softmax
//! E   = Exp2((X + Max_t(X)[.., s, ·] * -1) * log2 e)
//! X   = Sum_d(Q[.., s, ·, d] * K[.., ·, t, d]) * scale (+ bias[.., s, t])
//! ```
//!
//! q, k and v may be any views with unit stride along `d` (the kernel reads them in place);
//! k and v may also be f16 or block-quantized values widened by a cast as the last step (an
//! f16 or q8_0 KV cache, `luminal_nn::scores_product` / `values_product`): the kernel then
//! reads the f16 data or decodes the blocks, a block of rows at a time.
//! The bias is optional (`luminal_nn::attention` without a mask has none); when present it
//! is any f32 node read unmasked with unit stride along the keys — the causal mask `[s, t]`
//! broadcast over heads, or a padding bias `[b, 1, 1, t]` broadcast over heads and queries —
//! computed inside the kernel by its fused program, block by block.

use super::{flat_identity_edge, Broadcast, Lowered, Lowering};
use crate::kernel::BufId;
use crate::kernels::attention::{AttentionBias, AttentionKernel};
use crate::kernels::fused::{Instr, Leaf, Program};
use crate::view::{LaunchExpr, ResolvedView, ViewExprs};
use luminal::graph::{Edge, NodeId};
use luminal::op::{BinaryOp, ConstValue, Op, ReduceOp, UnaryOp};
use luminal::{DType, Expression, Result, ShapeTracker};
use std::collections::HashMap;

/// What the pattern binds.
pub(super) struct Match {
    q: Edge,
    k: Edge,
    v: Edge,
    /// The additive bias, read over `[batch.., s, t]`; none when the scores are only scaled.
    bias: Option<Edge>,
    scale: f32,
    batch_dims: usize,
}

/// Storage the kernel reads keys and values from besides f32: f16, and the block types a
/// tensor can be cast to (a quantized KV cache), decoded a block of rows at a time.
fn kv_storage(dt: DType) -> bool {
    dt == DType::F16 || (dt.is_quantized() && luminal::quant::encoder(dt).is_some())
}

fn is_one(d: &Expression) -> bool {
    d.as_constant() == Some(1)
}

impl Lowering<'_> {
    fn f32_node(&self, id: NodeId, op: Op) -> bool {
        let n = self.g.node(id);
        n.op == op && n.dtype == DType::F32
    }

    /// The value of an f32 constant read through an unmasked view.
    fn const_value(&self, e: &Edge) -> Option<f32> {
        let n = self.g.node(e.node);
        match n.op {
            Op::Constant {
                value: ConstValue::Float(v),
            } if n.dtype == DType::F32 && !e.view.is_masked() => Some(v as f32),
            _ => None,
        }
    }

    /// The two inputs of binary `id`, in the order `first` accepts (either order).
    fn operands<'e>(
        &'e self,
        id: NodeId,
        first: impl Fn(&Edge) -> bool,
    ) -> Option<(&'e Edge, &'e Edge)> {
        let ins = &self.g.node(id).inputs;
        if ins.len() != 2 {
            return None;
        }
        if first(&ins[0]) {
            Some((&ins[0], &ins[1]))
        } else if first(&ins[1]) {
            Some((&ins[1], &ins[0]))
        } else {
            None
        }
    }

    /// `e` reads its producer (shape `[.., s]` or `[.., s, 1]`, a row reduction) broadcast
    /// along the last of `full`'s dims and one to one along the others.
    fn row_broadcast(&self, e: &Edge, full: &[Expression]) -> bool {
        let p = self.g.node(e.node);
        let Some(b) = Broadcast::of(&e.view, &p.shape) else {
            return false;
        };
        let last = full.len() - 1;
        b.v_dims == full
            && (0..last).all(|j| !b.new_dim[j] || is_one(&full[j]))
            && (b.new_dim[last] || is_one(&full[last]))
    }

    /// Reduce `op` over the last axis of a node read through the identity.
    fn last_axis_reduce(&self, id: NodeId, op: ReduceOp) -> Option<NodeId> {
        let n = self.g.node(id);
        match n.op {
            Op::Reduce { op: o, axis }
                if o == op
                    && n.dtype == DType::F32
                    && axis + 1 == n.inputs[0].view.rank()
                    && flat_identity_edge(self.g, &n.inputs[0]) =>
            {
                Some(n.inputs[0].node)
            }
            _ => None,
        }
    }

    /// Where the kernel reads k or v from the product's operand `e`: an f32 node through
    /// `e`'s view, or, when `e` reads (one to one) a private cast to f32 of an f16 or
    /// quantized value (`luminal_nn::scores_product` over an f16 or q8_0 KV cache), that
    /// value through the cast's input view. Returns the edge and the cast node, if any.
    fn kv_source(&self, e: &Edge) -> Option<(Edge, Option<NodeId>)> {
        let n = self.g.node(e.node);
        match n.op {
            _ if n.dtype != DType::F32 => None,
            Op::Cast(DType::F32)
                if kv_storage(self.g.node(n.inputs[0].node).dtype)
                    && flat_identity_edge(self.g, e)
                    && !self.g.outputs.contains(&e.node)
                    && self.uses.get(&e.node) == Some(&1) =>
            {
                Some((n.inputs[0].clone(), Some(e.node)))
            }
            Op::Cast(_) => None,
            _ => Some((e.clone(), None)),
        }
    }

    pub(super) fn match_attention(&self, id: NodeId) -> Option<Match> {
        let g = self.g;
        let mul = |n: NodeId| self.f32_node(n, Op::Binary(BinaryOp::Mul));
        let add = |n: NodeId| self.f32_node(n, Op::Binary(BinaryOp::Add));
        // out = Sum_t(P * V)
        let pv = self.last_axis_reduce(id, ReduceOp::Sum)?;
        if !mul(pv) {
            return None;
        }
        let pv_edge = &g.node(id).inputs[0];
        let dims = pv_edge.view.dims(); // [batch.., s, d, t]
        let r = dims.len();
        if r < 3 {
            return None;
        }
        let nb = r - 3;
        let mut st: Vec<Expression> = dims[..nb + 1].to_vec();
        st.push(dims[r - 1].clone()); // [batch.., s, t]
        let (pe, ve) = self.operands(pv, |e| {
            mul(e.node) && g.node(e.node).shape == st && e.view.strides()[r - 2].is_zero()
        })?;
        // P read as itself with d inserted (stride 0).
        let p_view = {
            let mut v = ShapeTracker::new(st.clone());
            v.expand(r - 2, dims[r - 2].clone());
            v
        };
        let same_view = |a: &ShapeTracker, b: &ShapeTracker| {
            !a.is_masked()
                && a.dims() == b.dims()
                && a.strides() == b.strides()
                && a.offset() == b.offset()
        };
        let unit_d = |v: &ShapeTracker, at: usize| v.strides()[at].as_constant() == Some(1);
        let (ve, v_cast) = self.kv_source(ve)?;
        if !same_view(&pe.view, &p_view)
            || ve.view.is_masked()
            || !ve.view.strides()[r - 3].is_zero()
            || !unit_d(&ve.view, r - 2)
        {
            return None;
        }
        let p = pe.node;
        // P = E * Recip(Sum_t(E))
        let (ee, re) = self.operands(p, |e| {
            self.f32_node(e.node, Op::Unary(UnaryOp::Exp2)) && flat_identity_edge(g, e)
        })?;
        let e_node = ee.node;
        let recip = g.node(re.node);
        if !self.f32_node(re.node, Op::Unary(UnaryOp::Recip)) || !self.row_broadcast(re, &st) {
            return None;
        }
        let sum_e = recip.inputs[0].node;
        let mut keep = st[..nb + 1].to_vec();
        keep.push(Expression::one());
        if !self.row_broadcast(&recip.inputs[0], &recip.shape)
            || recip.shape != keep
            || self.last_axis_reduce(sum_e, ReduceOp::Sum) != Some(e_node)
        {
            return None;
        }
        // E = Exp2((X + Max_t(X) * -1) * log2 e)
        let a44 = &g.node(e_node).inputs[0];
        if !mul(a44.node) || !flat_identity_edge(g, a44) {
            return None;
        }
        let (ae, ce) = self.operands(a44.node, |e| add(e.node) && flat_identity_edge(g, e))?;
        if self.const_value(ce) != Some(std::f32::consts::LOG2_E) {
            return None;
        }
        let a42 = ae.node;
        // X is the operand the other (`Max_t(X) * -1`, row-broadcast) reduces: an Add when
        // there is a bias, the scaling Mul when not.
        let a42_ins = &g.node(a42).inputs;
        if a42_ins.len() != 2 {
            return None;
        }
        let (xe, ne) = [(&a42_ins[0], &a42_ins[1]), (&a42_ins[1], &a42_ins[0])]
            .into_iter()
            .find(|(xe, ne)| {
                (add(xe.node) || mul(xe.node))
                    && flat_identity_edge(g, xe)
                    && mul(ne.node)
                    && self.row_broadcast(ne, &st)
                    && self
                        .operands(ne.node, |e| self.const_value(e).is_none())
                        .is_some_and(|(me, _)| {
                            self.last_axis_reduce(me.node, ReduceOp::Max) == Some(xe.node)
                        })
            })?;
        let x = xe.node;
        let neg = ne.node;
        let (me, minus) = self.operands(neg, |e| self.const_value(e).is_none())?;
        if self.const_value(minus) != Some(-1.0)
            || !self.row_broadcast(me, &g.node(neg).shape)
            || g.node(neg).shape != keep
            || self.last_axis_reduce(me.node, ReduceOp::Max) != Some(x)
        {
            return None;
        }
        let max_x = me.node;
        // X = S * scale + bias, or X = S * scale
        let scaled = |e: &Edge| {
            mul(e.node)
                && flat_identity_edge(g, e)
                && self
                    .operands(e.node, |c| self.const_value(c).is_some())
                    .is_some()
        };
        let (s_node, bias) = if add(x) {
            let (se, be) = self.operands(x, scaled)?;
            (se.node, Some(be.clone()))
        } else if mul(x) {
            (x, None)
        } else {
            return None;
        };
        if let Some(be) = &bias {
            // Any f32 node read unmasked with the keys adjacent (its own program is
            // evaluated at the element indices the view gives); batch / query strides free.
            let bv = &be.view;
            if g.node(be.node).dtype != DType::F32
                || bv.is_masked()
                || bv.dims() != st
                || !(bv.strides()[nb + 1].as_constant() == Some(1) || is_one(&st[nb + 1]))
            {
                return None;
            }
        }
        let (re2, sce) = self.operands(s_node, |e| {
            flat_identity_edge(g, e) && self.const_value(e).is_none()
        })?;
        let scale = self.const_value(sce)?;
        let qk = self.last_axis_reduce(re2.node, ReduceOp::Sum)?;
        let sum_qk = re2.node;
        if !mul(qk) {
            return None;
        }
        let qk_dims = g.node(sum_qk).inputs[0].view.dims(); // [batch.., s, t, d]
        if qk_dims.len() != r || qk_dims[..r - 1] != st[..] || qk_dims[r - 1] != dims[r - 2] {
            return None;
        }
        let (qe, ke) = self.operands(qk, |e| e.view.strides()[r - 2].is_zero())?;
        if g.node(qe.node).dtype != DType::F32 {
            return None;
        }
        let (ke, k_cast) = self.kv_source(ke)?;
        for (e, zero) in [(qe, r - 2), (&ke, r - 3)] {
            if e.view.is_masked() || !e.view.strides()[zero].is_zero() || !unit_d(&e.view, r - 1) {
                return None;
            }
        }
        // Every node of the pattern is private to it: its reads all come from inside.
        let mut inner = vec![
            pv, p, e_node, re.node, sum_e, a44.node, a42, neg, max_x, x, sum_qk, qk,
        ];
        if s_node != x {
            inner.push(s_node);
        }
        inner.extend(k_cast.into_iter().chain(v_cast));
        let mut reads: HashMap<NodeId, usize> = HashMap::new();
        for n in inner.iter().chain([&id]) {
            for e in &g.node(*n).inputs {
                *reads.entry(e.node).or_default() += 1;
            }
        }
        if inner
            .iter()
            .any(|n| g.outputs.contains(n) || self.uses.get(n) != reads.get(n))
        {
            return None;
        }
        Some(Match {
            q: qe.clone(),
            k: ke,
            v: ve,
            bias,
            scale,
            batch_dims: nb,
        })
    }

    /// The fused attention kernel (see the module docs).
    pub(super) fn attention(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(m) = self.match_attention(id) else {
            return Ok(None);
        };
        let bias = match &m.bias {
            None => None,
            Some(be) => {
                let bn = self.g.node(be.node);
                let mut program = Program::default();
                if self.fusable(be.node) && !matches!(bn.op, Op::Constant { .. }) {
                    self.begin_root(be.node);
                    let r = self.emit_node(be.node, &mut program, &mut vec![]);
                    self.root.set(None);
                    if r?.is_none() {
                        return Ok(None);
                    }
                } else {
                    program.leaves.push(Leaf {
                        buf: BufId::of(be.node),
                        exprs: ViewExprs::new(&ShapeTracker::new(bn.shape.clone()), self.names)?,
                        view: ResolvedView::default(),
                    });
                    program.instrs.push(Instr::Load(0));
                }
                let numel = LaunchExpr::new(&bn.shape.iter().product(), self.names)?;
                Some(AttentionBias::new(
                    program,
                    ViewExprs::new(&be.view, self.names)?,
                    numel,
                ))
            }
        };
        let views = (
            ViewExprs::new(&m.q.view, self.names)?,
            ViewExprs::new(&m.k.view, self.names)?,
            ViewExprs::new(&m.v.view, self.names)?,
        );
        let k = AttentionKernel::new(
            (
                BufId::of(m.q.node),
                BufId::of(m.k.node),
                BufId::of(m.v.node),
            ),
            views,
            m.batch_dims,
            m.scale,
            bias,
        );
        Ok(Some(("attention".into(), Box::new(k))))
    }
}
