//! Primop patterns that backends recognise and compute with one kernel: attention as
//! `luminal_nn` builds it (the matrix product's operands are `hl_ops::product_operands`).
//! One matcher for every backend (the CPU's `attention` rule, the CUDA plan's flash
//! attention), so what counts as attention is decided once.

use crate::graph::{Edge, GraphData, NodeId};
use crate::op::{BinaryOp, ConstValue, Op, ReduceOp, UnaryOp};
use crate::{DType, Expression, ShapeTracker};
use std::collections::{HashMap, HashSet};

fn is_one(d: &Expression) -> bool {
    d.as_constant() == Some(1)
}

/// Whether `e` reads its producer one to one (contiguous, every element once).
pub fn flat_identity_edge(g: &GraphData, e: &Edge) -> bool {
    e.view.is_contiguous()
        && e.view.n_elements() == g.node(e.node).shape.iter().product::<Expression>()
}

/// Whether view `v` reads a producer of shape `p_shape` only broadcast (the `keepdim` +
/// expand pattern of softmax and norms): its dims are the producer's non-1 dims in order,
/// row-major, plus stride-0 (or size-1) new dims. Returns which of `v`'s dims are new.
pub fn broadcast_of(v: &ShapeTracker, p_shape: &[Expression]) -> Option<Vec<bool>> {
    if v.is_masked() || !v.offset().is_zero() {
        return None;
    }
    let (dims, strides) = (v.dims(), v.strides());
    let mut row_major = vec![Expression::one(); p_shape.len()];
    for i in (0..p_shape.len().saturating_sub(1)).rev() {
        row_major[i] = &row_major[i + 1] * &p_shape[i + 1];
    }
    let p_nonone: Vec<usize> = (0..p_shape.len())
        .filter(|&i| !is_one(&p_shape[i]))
        .collect();
    let (mut k, mut new_dim) = (0, vec![]);
    for j in 0..dims.len() {
        if strides[j].is_zero() || is_one(&dims[j]) {
            new_dim.push(true);
            continue;
        }
        let pi = *p_nonone.get(k)?;
        if dims[j] != p_shape[pi] || strides[j] != row_major[pi] {
            return None;
        }
        new_dim.push(false);
        k += 1;
    }
    (k == p_nonone.len()).then_some(new_dim)
}

/// The limit `c` of a causal mask read by attention edge `e` (over `[batch.., s, t]`): `e`
/// reads a node `[s, t]` (broadcast over the batch dims) whose element `(i, j)` is `0` where
/// `j − i < c` and `−inf` elsewhere, as `luminal_nn::causal_attention` builds it:
/// `log2(cast_f32(arange(t)[·, j] − arange(s)[i, ·] < c))`. A kernel may then compute the
/// mask from the indices instead of reading it. `None` for any other bias (a sliding window,
/// padding).
pub fn causal_limit(g: &GraphData, e: &Edge) -> Option<Expression> {
    let mask = g.node(e.node);
    let rank = e.view.rank();
    let new_dim = broadcast_of(&e.view, &mask.shape)?;
    if mask.shape.len() != 2 || rank < 2 || new_dim[rank - 2] || new_dim[rank - 1] {
        return None;
    }
    let (s, t) = (&mask.shape[0], &mask.shape[1]);
    // One input read one to one, through `op`.
    let unary = |id: NodeId, op: Op, dtype: DType| -> Option<NodeId> {
        let n = g.node(id);
        (n.op == op
            && n.dtype == dtype
            && n.inputs.len() == 1
            && flat_identity_edge(g, &n.inputs[0]))
        .then(|| n.inputs[0].node)
    };
    let binary = |id: NodeId, op: BinaryOp| -> Option<(&Edge, &Edge)> {
        let n = g.node(id);
        (n.op == Op::Binary(op) && n.inputs.len() == 2).then(|| (&n.inputs[0], &n.inputs[1]))
    };
    // A constant (a number or an expression of the dims) read broadcast.
    let constant = |e: &Edge| -> Option<Expression> {
        let n = g.node(e.node);
        if e.view.is_masked() || !e.view.strides().iter().all(|x| x.is_zero()) {
            return None;
        }
        match &n.op {
            Op::Constant {
                value: ConstValue::Float(v),
            } if v.fract() == 0.0 && v.abs() < 1e15 => Some(Expression::from(*v as i64)),
            Op::Constant {
                value: ConstValue::Expr(x),
            } => Some(x.clone()),
            _ => None,
        }
    };
    // `arange(len)` as f32 (`cast_f32(iota(z))`), read through `e` as `[s, t]` with unit
    // stride along axis `axis` and stride 0 along the other.
    let arange_along = |e: &Edge, axis: usize, len: &Expression| -> bool {
        let n = g.node(e.node);
        let dims = e.view.dims();
        let strides = e.view.strides();
        let unit = |x: &Expression| x.as_constant() == Some(1);
        if e.view.is_masked() || !e.view.offset().is_zero() || dims.len() != 2 {
            return false;
        }
        if &dims[0] != s || &dims[1] != t || !unit(&strides[axis]) || !strides[1 - axis].is_zero() {
            return false;
        }
        let Some(iota) = unary(e.node, Op::Cast(DType::F32), DType::F32) else {
            return false;
        };
        let i = g.node(iota);
        n.shape.len() == 1
            && &n.shape[0] == len
            && i.op
                == (Op::Iota {
                    expr: Expression::var("z"),
                })
            && i.shape.len() == 1
    };
    let visible = unary(e.node, Op::Unary(UnaryOp::Log2), DType::F32)?;
    let less = unary(visible, Op::Cast(DType::F32), DType::F32)?;
    let (offset, limit) = binary(less, BinaryOp::LessThan)?;
    let limit = constant(limit)?;
    if !flat_identity_edge(g, offset) || g.node(offset.node).dtype != DType::F32 {
        return None;
    }
    // offset = key + query · (−1), either order.
    let (a, b) = binary(offset.node, BinaryOp::Add)?;
    let negated_query = |e: &Edge| -> bool {
        if !flat_identity_edge(g, e) || g.node(e.node).dtype != DType::F32 {
            return false;
        }
        let Some((x, y)) = binary(e.node, BinaryOp::Mul) else {
            return false;
        };
        let minus_one = |e: &Edge| constant(e).and_then(|c| c.as_constant()) == Some(-1);
        (arange_along(x, 0, s) && minus_one(y)) || (arange_along(y, 0, s) && minus_one(x))
    };
    ((arange_along(a, 1, t) && negated_query(b)) || (arange_along(b, 1, t) && negated_query(a)))
        .then_some(limit)
}

/// What a backend's attention kernel accepts besides the pattern itself.
pub struct AttentionRules<'a> {
    /// Storage types the kernel reads keys and values from when they arrive through a
    /// private widening cast to f32 (an f16 or quantized KV cache); f32 is always accepted.
    pub kv_storage: &'a dyn Fn(DType) -> bool,
    /// The bias must have unit stride along the keys (or one key).
    pub bias_unit_keys: bool,
}

/// A recognised `softmax(q·kᵀ·scale (+ bias))·v`:
///
/// ```text
/// out = Sum_t( P[.., s, ·, t] * V[.., ·, d, t] )         P·V
/// P   = E * Recip(Sum_t(E))[.., s, ·]                    softmax
/// E   = Exp2((X + Max_t(X)[.., s, ·] * -1) * log2 e)
/// X   = Sum_d(Q[.., s, ·, d] * K[.., ·, t, d]) * scale (+ bias[.., s, t])
/// ```
#[derive(Clone, Debug)]
pub struct AttentionMatch {
    /// The final reduction (contiguous `[batch.., s, d]`).
    pub out: NodeId,
    /// The pattern's other nodes, each read only inside the pattern and not an output.
    pub inner: Vec<NodeId>,
    /// `q` over `[batch.., s, t, d]` (stride 0 along `t`, unit stride along `d`).
    pub q: Edge,
    /// `k` over `[batch.., s, t, d]` (stride 0 along `s`, unit stride along `d`), before its
    /// widening cast when there is one (`k_cast`).
    pub k: Edge,
    /// `v` over `[batch.., s, d, t]` (stride 0 along `s`, unit stride along `d`), before its
    /// widening cast when there is one (`v_cast`).
    pub v: Edge,
    pub k_cast: Option<NodeId>,
    pub v_cast: Option<NodeId>,
    /// The additive bias over `[batch.., s, t]` (an f32 node, read unmasked).
    pub bias: Option<Edge>,
    pub scale: f32,
    pub batch_dims: usize,
}

impl AttentionMatch {
    /// The nodes whose buffers a fused kernel reads: q, k, v (before their casts) and the
    /// bias.
    pub fn operands(&self) -> Vec<NodeId> {
        let mut v = vec![self.q.node, self.k.node, self.v.node];
        v.extend(self.bias.as_ref().map(|b| b.node));
        v
    }

    /// The attention whose output is `id`, if any. `uses[n]`: how many edges read node `n`
    /// among the nodes being compiled.
    pub fn find(
        g: &GraphData,
        uses: &HashMap<NodeId, usize>,
        id: NodeId,
        rules: &AttentionRules<'_>,
    ) -> Option<AttentionMatch> {
        Matcher { g, uses, rules }.attention(id)
    }
}

struct Matcher<'a> {
    g: &'a GraphData,
    uses: &'a HashMap<NodeId, usize>,
    rules: &'a AttentionRules<'a>,
}

impl Matcher<'_> {
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
    fn operands(&self, id: NodeId, first: impl Fn(&Edge) -> bool) -> Option<(&Edge, &Edge)> {
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

    /// `e` reads its producer (a row reduction) broadcast along the last of `full`'s dims and
    /// one to one along the others.
    fn row_broadcast(&self, e: &Edge, full: &[Expression]) -> bool {
        let p = self.g.node(e.node);
        let Some(new_dim) = broadcast_of(&e.view, &p.shape) else {
            return false;
        };
        let last = full.len() - 1;
        e.view.dims() == full
            && (0..last).all(|j| !new_dim[j] || is_one(&full[j]))
            && (new_dim[last] || is_one(&full[last]))
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

    /// k or v as the kernel reads it: an f32 node through `e`'s view, or the storage of a
    /// private widening cast read one to one (an f16 or quantized KV cache). Returns the
    /// edge and the cast node, if any.
    fn kv_source(&self, e: &Edge) -> Option<(Edge, Option<NodeId>)> {
        let n = self.g.node(e.node);
        match n.op {
            _ if n.dtype != DType::F32 => None,
            Op::Cast(DType::F32)
                if (self.rules.kv_storage)(self.g.node(n.inputs[0].node).dtype)
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

    fn attention(&self, id: NodeId) -> Option<AttentionMatch> {
        let g = self.g;
        let mul = |n: NodeId| self.f32_node(n, Op::Binary(BinaryOp::Mul));
        let add = |n: NodeId| self.f32_node(n, Op::Binary(BinaryOp::Add));
        // out = Sum_t(P * V)
        let pv = self.last_axis_reduce(id, ReduceOp::Sum)?;
        if !mul(pv) {
            return None;
        }
        let dims = g.node(id).inputs[0].view.dims(); // [batch.., s, d, t]
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
        // The maximum may come through the copy `detach` makes (softmax detaches it; a
        // graph that autograd has not seen through CSE still has it).
        let copied = |id: NodeId| {
            let n = g.node(id);
            (n.op == Op::Contiguous && n.dtype == DType::F32 && flat_identity_edge(g, &n.inputs[0]))
                .then(|| n.inputs[0].node)
        };
        let max_of = |id: NodeId| {
            self.last_axis_reduce(id, ReduceOp::Max)
                .or_else(|| copied(id).and_then(|m| self.last_axis_reduce(m, ReduceOp::Max)))
        };
        let (xe, ne) = [(&a42_ins[0], &a42_ins[1]), (&a42_ins[1], &a42_ins[0])]
            .into_iter()
            .find(|(xe, ne)| {
                (add(xe.node) || mul(xe.node))
                    && flat_identity_edge(g, xe)
                    && mul(ne.node)
                    && self.row_broadcast(ne, &st)
                    && self
                        .operands(ne.node, |e| self.const_value(e).is_none())
                        .is_some_and(|(me, _)| max_of(me.node) == Some(xe.node))
            })?;
        let x = xe.node;
        let neg = ne.node;
        let (me, minus) = self.operands(neg, |e| self.const_value(e).is_none())?;
        if self.const_value(minus) != Some(-1.0)
            || !self.row_broadcast(me, &g.node(neg).shape)
            || g.node(neg).shape != keep
            || max_of(me.node) != Some(x)
        {
            return None;
        }
        let (max_x, max_copy) = match copied(me.node) {
            Some(m) if self.last_axis_reduce(me.node, ReduceOp::Max).is_none() => {
                (m, Some(me.node))
            }
            _ => (me.node, None),
        };
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
            // Any f32 node read unmasked over [batch.., s, t]; batch / query strides free.
            let bv = &be.view;
            if g.node(be.node).dtype != DType::F32
                || bv.is_masked()
                || bv.dims() != st
                || (self.rules.bias_unit_keys
                    && !(bv.strides()[nb + 1].as_constant() == Some(1) || is_one(&st[nb + 1])))
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
        inner.extend(max_copy);
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
        // The operands are not inside the pattern (a degenerate graph could make them so).
        let inner_set: HashSet<NodeId> = inner.iter().copied().collect();
        if [
            Some(qe.node),
            Some(ke.node),
            Some(ve.node),
            bias.as_ref().map(|b| b.node),
        ]
        .into_iter()
        .flatten()
        .any(|n| inner_set.contains(&n) || n == id)
        {
            return None;
        }
        Some(AttentionMatch {
            out: id,
            inner,
            q: qe.clone(),
            k: ke,
            v: ve,
            k_cast,
            v_cast,
            bias,
            scale,
            batch_dims: nb,
        })
    }
}

/// The gradient of one attention, `softmax(q·kᵀ·scale (+ bias))·v`, as
/// [`crate::autograd::Autograd`] builds it: one node `[3, batch.., s, d]` stacking `dq`,
/// `dk` and `dv` (self-attention: `s = t`), computed from the tensors below by the primops
/// of [`attention_backward`](crate::autograd::attention_backward) — the scores and
/// probabilities recomputed, nothing kept from the forward pass but q, k and v. A backend
/// with a fused kernel computes the node in one launch (flash-attention's backward); the
/// nodes are the semantics, and [`AttentionGrad::find`] checks them before a backend may
/// rely on the hint.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrad {
    /// `q [batch.., s, d]`, `k [batch.., t, d]`, `v [batch.., t, d]` as read.
    pub q: Edge,
    pub k: Edge,
    pub v: Edge,
    /// The additive bias `[batch.., s, t]` (a mask: no gradient flows into it).
    pub bias: Option<Edge>,
    /// The gradient of the attention's output, `[batch.., s, d]`.
    pub d_out: Edge,
    pub scale: f32,
}

/// A checked [`AttentionGrad`]: the hint, and the nodes that compute it besides its root.
#[derive(Clone, Debug)]
pub struct AttentionGradMatch {
    pub grad: AttentionGrad,
    pub inner: Vec<NodeId>,
}

impl AttentionGrad {
    pub(crate) fn remap(&mut self, f: &dyn Fn(NodeId) -> NodeId) {
        for e in [&mut self.q, &mut self.k, &mut self.v, &mut self.d_out]
            .into_iter()
            .chain(self.bias.as_mut())
        {
            e.node = f(e.node);
        }
    }

    /// The attention gradient whose stacked `[3, batch.., s, d]` result is node `id`, if the
    /// graph holds a hint for it and the nodes under `id` are still exactly what
    /// [`attention_backward`](crate::autograd::attention_backward) builds from the hint's
    /// tensors (a pass that rewrote any of them voids the hint). The check rebuilds the
    /// backward from the hint in a scratch graph and compares it with the nodes, op by op.
    pub fn find(g: &GraphData, id: NodeId) -> Option<AttentionGradMatch> {
        let hint = g.attention_grads.get(&id)?;
        let mut leaves = vec![
            hint.q.clone(),
            hint.k.clone(),
            hint.v.clone(),
            hint.d_out.clone(),
        ];
        leaves.extend(hint.bias.clone());
        let inner = rebuilt_match(g, id, &leaves, |t| {
            let (q, k, v, d_out, bias) = (t[0], t[1], t[2], t[3], t.get(4).copied());
            let (qs, ks) = (q.shape(), k.shape());
            let r = qs.len();
            let shapes_ok = r >= 2
                && ks == qs
                && v.shape() == qs
                && d_out.shape() == qs
                && bias.is_none_or(|b| b.shape() == [&qs[..r - 1], &ks[r - 2..r - 1]].concat())
                && t.iter().all(|t| t.dtype() == DType::F32);
            shapes_ok.then(|| crate::autograd::attention_backward(q, k, v, bias, d_out, hint.scale))
        })?;
        Some(AttentionGradMatch {
            grad: hint.clone(),
            inner,
        })
    }
}

/// Whether node `id` is exactly what `build` makes from tensors read through `leaves`
/// (each leaf's node as a scratch input of its shape and dtype, read through the leaf's
/// view): `build` runs in a scratch graph, and its result is compared with `id` op by op,
/// down to the leaves (views, shapes, dtypes and constants equal; identity copies that
/// compilation dropped are skipped). Returns the nodes under `id` that are not leaves, or
/// `None` (also when `build` returns `None`).
pub fn rebuilt_match(
    g: &GraphData,
    id: NodeId,
    leaves: &[Edge],
    build: impl for<'s> FnOnce(
        &[crate::graph::GraphTensor<'s>],
    ) -> Option<crate::graph::GraphTensor<'s>>,
) -> Option<Vec<NodeId>> {
    if leaves.iter().any(|e| g.try_node(e.node).is_none()) || g.try_node(id).is_none() {
        return None;
    }
    let scratch = crate::graph::Graph::new();
    let mut inputs: HashMap<NodeId, NodeId> = HashMap::new(); // real → scratch
    let mut real_of: HashMap<NodeId, NodeId> = HashMap::new(); // scratch → real
    let handles: Vec<_> = leaves
        .iter()
        .map(|e| {
            let n = g.node(e.node);
            let name = format!("leaf{}", inputs.len());
            let s = *inputs.entry(e.node).or_insert_with(|| {
                let t = scratch.input(&name, n.shape.clone(), n.dtype);
                t.node()
            });
            real_of.insert(s, e.node);
            scratch.new_handle(crate::graph::TensorEntry {
                node: s,
                view: e.view.clone(),
                dtype: n.dtype,
                label: "leaf".into(),
            })
        })
        .collect();
    let built = build(&handles)?.output();
    let built_entry = built.entry();
    if !built_entry.view.is_contiguous() {
        return None;
    }
    // As built (autograd matches before compilation), else as the generic passes leave it
    // (a compiled graph: constants folded, duplicates merged).
    let sd = scratch.snapshot();
    if let Some(inner) = compare_rebuilt(g, id, &sd, built_entry.node, &real_of) {
        return Some(inner);
    }
    let mut sd = sd;
    crate::passes::Pass::run(&mut crate::passes::GenericPasses::default(), &mut sd);
    let root = *sd.outputs.iter().next()?;
    // The passes keep inputs' ids; the leaves map as before.
    compare_rebuilt(g, id, &sd, root, &real_of)
}

/// The op-by-op comparison of [`rebuilt_match`]: scratch node `built` of `sd` against `id`
/// of `g`, scratch inputs standing for the real nodes in `real_of`.
fn compare_rebuilt(
    g: &GraphData,
    id: NodeId,
    sd: &GraphData,
    built: NodeId,
    real_of: &HashMap<NodeId, NodeId>,
) -> Option<Vec<NodeId>> {
    if sd.node(built).shape != g.node(id).shape {
        return None;
    }
    let built_entry = crate::graph::TensorEntry {
        node: built,
        view: ShapeTracker::new(sd.node(built).shape.clone()),
        dtype: sd.node(built).dtype,
        label: String::new(),
    };
    let mut memo: HashMap<NodeId, NodeId> = HashMap::new(); // scratch → real
    let mut stack = vec![(built_entry.node, id)];
    while let Some((mut s, r)) = stack.pop() {
        // Compilation drops identity copies (the one `detach` makes in softmax).
        while sd.node(s).op == Op::Contiguous
            && g.try_node(r).is_some_and(|n| n.op != Op::Contiguous)
            && flat_identity_edge(sd, &sd.node(s).inputs[0])
        {
            s = sd.node(s).inputs[0].node;
        }
        if let Some(&seen) = memo.get(&s).or(real_of.get(&s)) {
            if seen != r {
                return None;
            }
            continue;
        }
        let (sn, rn) = (sd.node(s), g.try_node(r)?);
        if sn.op != rn.op
            || sn.dtype != rn.dtype
            || sn.shape != rn.shape
            || sn.inputs.len() != rn.inputs.len()
            || matches!(sn.op, Op::Input { .. })
        {
            return None;
        }
        memo.insert(s, r);
        for (se, re) in sn.inputs.iter().zip(&rn.inputs) {
            if se.view != re.view {
                return None;
            }
            stack.push((se.node, re.node));
        }
    }
    let leaf_nodes: HashSet<NodeId> = real_of.values().copied().collect();
    let mut inner: Vec<NodeId> = memo
        .values()
        .copied()
        .filter(|n| *n != id && !leaf_nodes.contains(n))
        .collect();
    inner.sort();
    inner.dedup();
    Some(inner)
}

/// Which elementwise function a [`GeluMatch`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeluFn {
    /// `x.gelu_tanh()`.
    Tanh,
    /// `x.gelu_tanh_grad()`, its derivative.
    TanhGrad,
    /// `x.gelu()` (the erf form).
    Erf,
}

/// [`GraphTensor::gelu`](crate::graph::GraphTensor::gelu),
/// [`GraphTensor::gelu_tanh`](crate::graph::GraphTensor::gelu_tanh) or the latter's
/// derivative [`GraphTensor::gelu_tanh_grad`](crate::graph::GraphTensor::gelu_tanh_grad) of
/// one f32 tensor, recognised from the primops they build (each checked by rebuilding it
/// from `x` and comparing, op by op). A backend evaluates the function in one step instead
/// of its 8 to 25 primops; autograd differentiates a recognised `gelu_tanh` as
/// `dy · x.gelu_tanh_grad()`.
#[derive(Clone, Debug)]
pub struct GeluMatch {
    pub f: GeluFn,
    /// `x` as the function reads it (every read of `x` inside is this view).
    pub x: Edge,
    /// The function's nodes besides its root.
    pub inner: Vec<NodeId>,
}

impl GeluMatch {
    /// The function whose result is node `id`, if it is one.
    pub fn find(g: &GraphData, id: NodeId) -> Option<GeluMatch> {
        let node = g.try_node(id)?;
        if node.dtype != DType::F32 {
            return None;
        }
        let is = |e: &Edge, op: Op| g.node(e.node).op == op;
        let rebuild = |f: GeluFn, x: &Edge| {
            let inner = rebuilt_match(g, id, std::slice::from_ref(x), |t| {
                (t[0].dtype() == DType::F32).then(|| match f {
                    GeluFn::Tanh => t[0].gelu_tanh(),
                    GeluFn::TanhGrad => t[0].gelu_tanh_grad(),
                    GeluFn::Erf => t[0].gelu(),
                })
            })?;
            Some(GeluMatch {
                f,
                x: x.clone(),
                inner,
            })
        };
        match node.op {
            // The tanh forms end in `_ · recip(exp2(w) + 1)` (value) or
            // `recip(exp2(w) + 1) · _` (derivative): `w = x · (…)` gives the candidates.
            Op::Binary(BinaryOp::Mul) => {
                for (f, s_side) in [(GeluFn::Tanh, 1), (GeluFn::TanhGrad, 0)] {
                    let se = &node.inputs[s_side];
                    if !is(se, Op::Unary(UnaryOp::Recip)) || !flat_identity_edge(g, se) {
                        continue;
                    }
                    let add = &g.node(se.node).inputs[0];
                    if !is(add, Op::Binary(BinaryOp::Add)) {
                        continue;
                    }
                    for ae in &g.node(add.node).inputs {
                        if !is(ae, Op::Unary(UnaryOp::Exp2)) {
                            continue;
                        }
                        let we = &g.node(ae.node).inputs[0];
                        if !is(we, Op::Binary(BinaryOp::Mul)) {
                            continue;
                        }
                        for x in &g.node(we.node).inputs {
                            if let Some(m) = rebuild(f, x) {
                                return Some(m);
                            }
                        }
                    }
                }
                None
            }
            // The erf form ends in `(x + |x|) · ½ + c·q·½`.
            Op::Binary(BinaryOp::Add) => {
                for h in &node.inputs {
                    if !is(h, Op::Binary(BinaryOp::Mul)) {
                        continue;
                    }
                    for a in &g.node(h.node).inputs {
                        // `x + |x|`, `|x|` a `maximum` (a max-reduce of a stacked pair).
                        let abs_in = |a: &Edge| {
                            g.node(a.node).inputs.iter().any(|e| {
                                matches!(
                                    g.node(e.node).op,
                                    Op::Reduce {
                                        op: ReduceOp::Max,
                                        ..
                                    }
                                )
                            })
                        };
                        if !is(a, Op::Binary(BinaryOp::Add)) || !abs_in(a) {
                            continue;
                        }
                        for x in &g.node(a.node).inputs {
                            if let Some(m) = rebuild(GeluFn::Erf, x) {
                                return Some(m);
                            }
                        }
                    }
                }
                None
            }
            _ => None,
        }
    }
}

/// `x.layer_norm(-1, eps)` of an f32 tensor (`(x − mean) · recip(sqrt(var + eps))` over the
/// last axis, no affine), recognised from its primops (checked by rebuilding it from `x`
/// and comparing, op by op). Autograd differentiates it as one expression
/// ([`GraphTensor::layer_norm_grad`](crate::graph::GraphTensor::layer_norm_grad)), so its
/// intermediates are read only inside it.
#[derive(Clone, Debug)]
pub struct LayerNormMatch {
    /// `x` as the norm reads it.
    pub x: Edge,
    pub eps: f32,
    /// The norm's nodes besides its root.
    pub inner: Vec<NodeId>,
}

impl LayerNormMatch {
    /// The layer norm whose result is node `id`, if it is one.
    pub fn find(g: &GraphData, id: NodeId) -> Option<LayerNormMatch> {
        let node = g.try_node(id)?;
        if node.op != Op::Binary(BinaryOp::Mul) || node.dtype != DType::F32 {
            return None;
        }
        let is = |e: &Edge, op: Op| g.node(e.node).op == op;
        // `centered · recip(sqrt(var + eps))`: eps from the sum, `x` from `centered`.
        for (ci, ri) in [(0, 1), (1, 0)] {
            let re = &node.inputs[ri];
            if !is(re, Op::Unary(UnaryOp::Recip)) {
                continue;
            }
            let se = &g.node(re.node).inputs[0];
            if !is(se, Op::Unary(UnaryOp::Sqrt)) {
                continue;
            }
            let ae = &g.node(se.node).inputs[0];
            if !is(ae, Op::Binary(BinaryOp::Add)) {
                continue;
            }
            let eps = g
                .node(ae.node)
                .inputs
                .iter()
                .find_map(|e| match g.node(e.node).op {
                    Op::Constant {
                        value: ConstValue::Float(v),
                    } => Some(v as f32),
                    _ => None,
                });
            let Some(eps) = eps else { continue };
            let ce = &node.inputs[ci];
            if !is(ce, Op::Binary(BinaryOp::Add)) {
                continue;
            }
            // `centered = x + mean · (−1)`: `x` is the input that is not the negated mean.
            let negated = |e: &Edge| {
                is(e, Op::Binary(BinaryOp::Mul))
                    && g.node(e.node).inputs.iter().any(|c| {
                        g.node(c.node).op
                            == Op::Constant {
                                value: ConstValue::Float(-1.0),
                            }
                    })
            };
            let ins = &g.node(ce.node).inputs;
            for (x, other) in [(&ins[0], &ins[1]), (&ins[1], &ins[0])] {
                if !negated(other) {
                    continue;
                }
                let inner = rebuilt_match(g, id, std::slice::from_ref(x), |t| {
                    (t[0].dtype() == DType::F32 && t[0].rank() > 0)
                        .then(|| t[0].layer_norm(-1, eps))
                });
                if let Some(inner) = inner {
                    return Some(LayerNormMatch {
                        x: x.clone(),
                        eps,
                        inner,
                    });
                }
            }
        }
        None
    }
}

/// The gradient of a layer norm as autograd builds it:
/// [`GraphTensor::layer_norm_grad`](crate::graph::GraphTensor::layer_norm_grad) of `x`,
/// the norm's output `xhat` and the output gradient `dy` (f32, one shape). A hint in the
/// graph (`GraphData::layer_norm_grads`); [`LayerNormGrad::find`] checks it against the
/// nodes before a backend relies on it.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormGrad {
    pub x: Edge,
    pub xhat: Edge,
    pub dy: Edge,
    pub eps: f32,
}

impl LayerNormGrad {
    /// The layer-norm gradient whose result is node `id`, if the graph holds a hint for it
    /// and the nodes under `id` are still exactly what `layer_norm_grad` builds from the
    /// hint's tensors.
    pub fn find(g: &GraphData, id: NodeId) -> Option<LayerNormGrad> {
        let hint = g.layer_norm_grads.get(&id)?;
        let leaves = [hint.x.clone(), hint.xhat.clone(), hint.dy.clone()];
        rebuilt_match(g, id, &leaves, |t| {
            (t.iter().all(|t| t.dtype() == DType::F32)
                && t[0].rank() > 0
                && t[0].shape() == t[1].shape()
                && t[0].shape() == t[2].shape())
            .then(|| t[0].layer_norm_grad(t[1], t[2], hint.eps))
        })?;
        Some(hint.clone())
    }
}

/// RMSNorm over the last axis as `hl_ops::rms_norm` and `luminal_nn::RmsNorm` build it:
/// `x · recip(sqrt(Σ x² · scale + eps)) [· w]`, recognised from its primops (operands of
/// the commutative ops in either order). Backends compute it where its result is read (the
/// input rows of a decode product) instead of as a kernel of its own.
#[derive(Clone, Debug)]
pub struct RmsNormMatch {
    /// `x` as the pattern reads it: every read of `x` in the pattern is this one flat
    /// identity view (the producer's buffer, in order, as the norm's shape: an embedding's
    /// `[s, d]` read as `[1, s, d]`).
    pub x: Edge,
    /// The learned scale: a rank-1 node of the last axis' length, read broadcast over the
    /// rows (`None`: no scale).
    pub weight: Option<Edge>,
    /// The factor of the sum of squares (`1/len` for the mean) and the epsilon.
    pub scale: f32,
    pub eps: f32,
}

impl RmsNormMatch {
    /// The RMSNorm whose result is node `id`, if it is one (f32 throughout).
    pub fn find(g: &GraphData, id: NodeId) -> Option<RmsNormMatch> {
        let node = g.node(id);
        if node.op != Op::Binary(BinaryOp::Mul) || node.dtype != DType::F32 {
            return None;
        }
        let r = node.shape.len();
        if r == 0 {
            return None;
        }
        // With a weight: `normed · w` (either order).
        for (normed, w) in [(0, 1), (1, 0)] {
            let (ne, we) = (&node.inputs[normed], &node.inputs[w]);
            if !flat_identity_edge(g, ne) || g.node(ne.node).shape != node.shape {
                continue;
            }
            let wn = g.node(we.node);
            let st = we.view.strides();
            let scale_ok = wn.dtype == DType::F32
                && wn.shape.len() == 1
                && wn.shape[0] == node.shape[r - 1]
                && !we.view.is_masked()
                && we.view.offset().is_zero()
                && st[r - 1].as_constant() == Some(1)
                && st[..r - 1].iter().all(|s| s.is_zero());
            if !scale_ok {
                continue;
            }
            if let Some(mut m) = Self::unscaled(g, ne.node) {
                m.weight = Some(we.clone());
                return Some(m);
            }
        }
        Self::unscaled(g, id)
    }

    /// `x · recip(sqrt(Σ x² · scale + eps))` at node `id`.
    fn unscaled(g: &GraphData, id: NodeId) -> Option<RmsNormMatch> {
        let node = g.node(id);
        if node.op != Op::Binary(BinaryOp::Mul) || node.dtype != DType::F32 {
            return None;
        }
        let r = node.shape.len();
        let f32_op = |e: &Edge, op: Op| {
            let n = g.node(e.node);
            (n.op == op && n.dtype == DType::F32).then_some(n)
        };
        let constant = |e: &Edge| match &g.node(e.node).op {
            Op::Constant {
                value: ConstValue::Float(v),
            } => Some(*v as f32),
            _ => None,
        };
        // One of the operands is the other op of a commutative pair that is a constant.
        let with_const = |n: &crate::graph::Node| -> Option<(Edge, f32)> {
            let (a, b) = (&n.inputs[0], &n.inputs[1]);
            match (constant(a), constant(b)) {
                (None, Some(c)) => Some((a.clone(), c)),
                (Some(c), None) => Some((b.clone(), c)),
                _ => None,
            }
        };
        for (xi, ri) in [(0, 1), (1, 0)] {
            let (xe, re) = (&node.inputs[xi], &node.inputs[ri]);
            if !flat_identity_edge(g, xe) {
                continue;
            }
            // The factor of row i is read by row i, broadcast along the last axis.
            let Some(recip) = f32_op(re, Op::Unary(UnaryOp::Recip)) else {
                continue;
            };
            let dims = re.view.dims();
            let per_row = broadcast_of(&re.view, &recip.shape)
                .is_some_and(|new| new[r - 1] && (0..r - 1).all(|j| !new[j] || is_one(&dims[j])));
            if !per_row || !flat_identity_edge(g, &recip.inputs[0]) {
                continue;
            }
            let Some(sqrt) = f32_op(&recip.inputs[0], Op::Unary(UnaryOp::Sqrt)) else {
                continue;
            };
            let Some(add) = f32_op(&sqrt.inputs[0], Op::Binary(BinaryOp::Add)) else {
                continue;
            };
            let Some((scaled, eps)) = with_const(add) else {
                continue;
            };
            let Some(mul) = f32_op(&scaled, Op::Binary(BinaryOp::Mul)) else {
                continue;
            };
            let Some((sum_edge, scale)) = with_const(mul) else {
                continue;
            };
            if !flat_identity_edge(g, &sqrt.inputs[0])
                || !flat_identity_edge(g, &scaled)
                || !flat_identity_edge(g, &sum_edge)
            {
                continue;
            }
            let sum = g.node(sum_edge.node);
            if sum.op
                != (Op::Reduce {
                    op: ReduceOp::Sum,
                    axis: r - 1,
                })
                || sum.dtype != DType::F32
            {
                continue;
            }
            let sq_edge = &sum.inputs[0];
            let Some(sq) = f32_op(sq_edge, Op::Binary(BinaryOp::Mul)) else {
                continue;
            };
            if !flat_identity_edge(g, sq_edge)
                || sq.shape != node.shape
                || sq.inputs.iter().any(|e| e != xe)
            {
                continue;
            }
            return Some(RmsNormMatch {
                x: xe.clone(),
                weight: None,
                scale,
                eps,
            });
        }
        None
    }
}
