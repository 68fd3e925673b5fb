//! The attention terms the `attention` rule file derives, built back into primops.
//!
//! `x` is a score tensor `[.., s, t]` and `ve` the values read as the product `P·V` reads
//! them, `[.., s, d, t]` (stride 0 along `s`). Every term below has the value
//! `Σ_t softmax_t(x)·ve`, `[.., s, d]`; they differ in how the reduction over the key axis is
//! organised, and their primop forms say exactly that, so the reference runtime checks each
//! rewrite:
//!
//! - [`folded`] (`AttnV`): `(Σ_t e·v) / Σ_t e` with `e = exp(x − max_t x)`: the division is
//!   moved after the product with `v` (one per output instead of one per score);
//! - [`online`] (`OnlineAttnV`): the same state `(m, l, o)` (running max, sum of
//!   exponentials, weighted sum of values) computed over two tiles of keys and merged by the
//!   online-softmax recurrence `m = max(m₁, m₂)`, `l = l₁·e^{m₁−m} + l₂·e^{m₂−m}`,
//!   `o = o₁·e^{m₁−m} + o₂·e^{m₂−m}`; a backend that runs the term streams it over tiles of
//!   keys (the CPU kernel: 256 at a time);
//! - [`scores`] + [`folded`] (`Flash`, `FlashNoMask`): the scores `q·kᵀ·scale (+ bias)`
//!   computed inside the term, which is then run as one kernel that never materialises
//!   `[s, t]` ([`luminal::FusedTerm`] `"online_attention"`).

use luminal::graph::{Edge, GraphData, Node, NodeId};
use luminal::op::{BinaryOp, ConstValue, Op, ReduceOp, UnaryOp};
use luminal::{DType, Expression, ShapeTracker};

fn add(g: &mut GraphData, op: Op, inputs: Vec<Edge>, shape: Vec<Expression>) -> NodeId {
    g.add_node(Node {
        op,
        inputs,
        dtype: DType::F32,
        shape,
    })
}

fn whole(g: &GraphData, n: NodeId) -> Edge {
    Edge {
        node: n,
        view: ShapeTracker::new(g.node(n).shape.clone()),
    }
}

/// Node `n` of shape `dims` without its last entry, broadcast along the last of `dims`.
fn along_last(n: NodeId, dims: &[Expression]) -> Edge {
    let r = dims.len();
    let mut view = ShapeTracker::new(dims[..r - 1].to_vec());
    view.expand(r - 1, dims[r - 1].clone());
    Edge { node: n, view }
}

/// An f32 constant broadcast over `dims`.
fn constant(g: &mut GraphData, v: f64, dims: &[Expression]) -> Edge {
    let c = add(
        g,
        Op::Constant {
            value: ConstValue::Float(v),
        },
        vec![],
        vec![],
    );
    let mut view = ShapeTracker::new(vec![]);
    for (i, d) in dims.iter().enumerate() {
        view.expand(i, d.clone());
    }
    Edge { node: c, view }
}

/// The edge's values as f32: itself, or a widening of an f16/bf16 edge (the fused kernel
/// reads the half values in place; this is its semantics).
fn widen(g: &mut GraphData, e: Edge) -> Edge {
    if g.node(e.node).dtype == DType::F32 {
        return e;
    }
    let dims = e.view.dims();
    let c = add(g, Op::Cast(DType::F32), vec![e], dims);
    whole(g, c)
}

fn bin(g: &mut GraphData, op: BinaryOp, a: Edge, b: Edge) -> NodeId {
    let shape = a.view.dims();
    add(g, Op::Binary(op), vec![a, b], shape)
}

fn last_reduce(g: &mut GraphData, op: ReduceOp, e: Edge) -> NodeId {
    let mut shape = e.view.dims();
    let axis = shape.len() - 1;
    shape.pop();
    add(g, Op::Reduce { op, axis }, vec![e], shape)
}

/// `exp(a − b)` as the core builds `exp`: `exp2((a + b·(−1))·log2 e)`.
fn exp_diff(g: &mut GraphData, a: Edge, b: Edge) -> NodeId {
    let dims = a.view.dims();
    let m1 = constant(g, -1.0, &dims);
    let nb = bin(g, BinaryOp::Mul, b, m1);
    let nb = whole(g, nb);
    let d = bin(g, BinaryOp::Add, a, nb);
    let d = whole(g, d);
    let l2e = constant(g, std::f32::consts::LOG2_E as f64, &dims);
    let y = bin(g, BinaryOp::Mul, d, l2e);
    let y = whole(g, y);
    add(g, Op::Unary(UnaryOp::Exp2), vec![y], dims)
}

/// The softmax state of scores `x` `[.., s, t']` against values `ve` `[.., s, d, t']`:
/// `(m, l, o)` = (row max `[.., s]`, `Σ e` `[.., s]`, `Σ e·v` `[.., s, d]`). With `finite`
/// the max is at least `f32::MIN`, so a tile of keys a mask hides from a row entirely gives
/// `l = 0, o = 0` for it instead of `exp(−∞ + ∞)` (what an online kernel does too).
fn state(g: &mut GraphData, x: Edge, ve: Edge, finite: bool) -> (NodeId, NodeId, NodeId) {
    let xd = x.view.dims();
    let mut m = last_reduce(g, ReduceOp::Max, x.clone());
    if finite {
        let md = g.node(m).shape.clone();
        let floor = constant(g, f32::MIN as f64, &md);
        m = maximum(g, whole(g, m), floor);
    }
    let e = exp_diff(g, x, along_last(m, &xd));
    let l = last_reduce(g, ReduceOp::Sum, whole(g, e));
    let vd = ve.view.dims(); // [.., s, d, t']
    let ve = widen(g, ve);
    let r = vd.len();
    let mut ev = ShapeTracker::new(xd);
    ev.expand(r - 2, vd[r - 2].clone());
    let p = bin(g, BinaryOp::Mul, Edge { node: e, view: ev }, ve);
    let o = last_reduce(g, ReduceOp::Sum, whole(g, p));
    (m, l, o)
}

/// `o / l` with `l` broadcast over `d`.
fn normalise(g: &mut GraphData, l: NodeId, o: NodeId) -> NodeId {
    let od = g.node(o).shape.clone();
    let ld = g.node(l).shape.clone();
    let rl = add(g, Op::Unary(UnaryOp::Recip), vec![whole(g, l)], ld);
    bin(g, BinaryOp::Mul, whole(g, o), along_last(rl, &od))
}

/// `AttnV`: `(Σ_t e·v) / Σ_t e`, `e = exp(x − max_t x)`.
pub fn folded(g: &mut GraphData, x: Edge, ve: Edge) -> NodeId {
    let (_, l, o) = state(g, x, ve, false);
    normalise(g, l, o)
}

/// Keys `[lo, hi)` of an edge whose last axis is the key axis.
fn keys(e: &Edge, lo: Expression, hi: Expression) -> Edge {
    let mut view = e.view.clone();
    let last = view.rank() - 1;
    view.slice(last, lo, hi);
    Edge { node: e.node, view }
}

/// The elementwise maximum of two edges of the same dims (the core's `maximum`: a max over
/// a padded pair).
fn maximum(g: &mut GraphData, a: Edge, b: Edge) -> NodeId {
    let last = a.view.rank();
    let slot = |e: Edge, before: i64| {
        let mut view = e.view;
        view.unsqueeze(last);
        view.pad(
            last,
            Expression::constant(before),
            Expression::constant(1 - before),
        );
        Edge { node: e.node, view }
    };
    let pair = bin(g, BinaryOp::Add, slot(a, 0), slot(b, 1));
    last_reduce(g, ReduceOp::Max, whole(g, pair))
}

/// `OnlineAttnV`: the softmax state of two tiles of keys, merged by the online recurrence.
/// `None` when the key axis is too short to split.
pub fn online(g: &mut GraphData, x: Edge, ve: Edge) -> Option<NodeId> {
    let xd = x.view.dims();
    let t = xd.last()?.clone();
    if t.as_constant().is_some_and(|t| t < 2) {
        return None;
    }
    let h = (t.clone() + 1) / 2;
    let zero = Expression::zero();
    let (x1, v1) = (
        keys(&x, zero.clone(), h.clone()),
        keys(&ve, zero, h.clone()),
    );
    let (m1, l1, o1) = state(g, x1, v1, true);
    let (m2, l2, o2) = state(g, keys(&x, h.clone(), t.clone()), keys(&ve, h, t), true);
    let m = maximum(g, whole(g, m1), whole(g, m2));
    let c1 = exp_diff(g, whole(g, m1), whole(g, m));
    let c2 = exp_diff(g, whole(g, m2), whole(g, m));
    let od = g.node(o1).shape.clone();
    let scaled = |g: &mut GraphData, x: NodeId, c: NodeId, bcast: bool| {
        let ce = if bcast {
            along_last(c, &od)
        } else {
            whole(g, c)
        };
        let xe = whole(g, x);
        bin(g, BinaryOp::Mul, xe, ce)
    };
    let (a, b) = (scaled(g, l1, c1, false), scaled(g, l2, c2, false));
    let l = bin(g, BinaryOp::Add, whole(g, a), whole(g, b));
    let (a, b) = (scaled(g, o1, c1, true), scaled(g, o2, c2, true));
    let o = bin(g, BinaryOp::Add, whole(g, a), whole(g, b));
    Some(normalise(g, l, o))
}

/// The scores `Σ_d q·k · scale (+ bias)` `[.., s, t]` from the product's operand views
/// (`[.., s, t, d]` each) and the edges of the scale and the bias (`[.., s, t]`).
pub fn scores(g: &mut GraphData, q: Edge, k: Edge, scale: Edge, bias: Option<Edge>) -> Edge {
    let k = widen(g, k);
    let p = bin(g, BinaryOp::Mul, q, k);
    let s = last_reduce(g, ReduceOp::Sum, whole(g, p));
    let x = bin(g, BinaryOp::Mul, whole(g, s), scale);
    let x = match bias {
        Some(b) => bin(g, BinaryOp::Add, whole(g, x), b),
        None => x,
    };
    whole(g, x)
}

/// The value of an edge that reads one f32 constant everywhere.
pub fn constant_value(g: &GraphData, e: &Edge) -> Option<f64> {
    match g.node(e.node).op {
        Op::Constant {
            value: ConstValue::Float(v),
        } if !e.view.is_masked() => Some(v),
        _ => None,
    }
}
