//! The gradient rule of each primop (its reference semantics are in [`crate::op`]).
//!
//! A rule gets the gradient `g` of the node's output (the node's shape, row-major) and
//! returns, for each input, the gradient of the *view* that input is read through, as a list
//! of factors whose elementwise product is that gradient (kept lazy so that a broadcast dim
//! can be reduced as a matmul, see `view.rs`). `None` means no gradient flows there.
//!
//! | primop | gradient |
//! |---|---|
//! | `Log2(x)` | `g / (x ln 2)` |
//! | `Exp2(x) = y` | `g · y ln 2` |
//! | `Sin(x)` | `g · cos x` |
//! | `Sqrt(x) = y` | `g / (2y)` |
//! | `Recip(x) = y` | `-g · y²` |
//! | `Add(a, b)` | `g`, `g` |
//! | `Mul(a, b)` | `g · b`, `g · a` |
//! | `SumReduce(x, axis)` | `g` expanded along `axis` |
//! | `MaxReduce(x, axis) = y` | `g` shared equally by the elements equal to the max (PyTorch's `amax`; so `maximum(a, b)` splits ties like `torch.maximum`, and `relu`, built as `maximum(x, 0)`, has gradient 1/2 at exactly 0 where `torch.relu` has 0) |
//! | `Contiguous(x)` | `g` |
//! | `Cast(x)` float → float | `g` cast back |
//! | `Gather(table, ids)` | table: `g` scatter-added into the rows `ids` (one-hot matmul; for the gather `select` builds, `g` masked by the condition, elementwise) |
//! | `WriteSlice(dest, src)` | dest: `g` with the written window zeroed; src: `g` in the window |
//!
//! Not differentiable (no gradient, by definition rather than omission): `Mod` (piecewise
//! constant in its divisor, and excluded by convention), `LessThan` and everything built on
//! comparisons (eq, argmax, masks), `Iota`, integer / bool `Cast`s, the `ids` of a `Gather`.
//! `Input` and `Constant` are leaves.

use crate::dtype::DType;
use crate::graph::{GraphTensor, Node};
use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::shape::Expression;
use std::f64::consts::LN_2;

/// Gradient factors of one input's view (their product is the gradient), or `None`.
pub(crate) type InputGrad<'g> = Option<Vec<GraphTensor<'g>>>;

/// The gradients of `node`'s inputs. `out` is the node's output, `inputs` its inputs read
/// through their edges' views, `g` the gradient of the output, `wanted[i]` whether input
/// `i` needs one (others may be skipped).
pub(crate) fn input_grads<'g>(
    node: &Node,
    out: GraphTensor<'g>,
    inputs: &[GraphTensor<'g>],
    g: GraphTensor<'g>,
    wanted: &[bool],
) -> Vec<InputGrad<'g>> {
    let dtype = node.dtype;
    let cx = g.graph;
    let c = |v: f64| cx.constant_of(v, dtype);
    let mut grads: Vec<InputGrad<'g>> = vec![None; inputs.len()];
    let want = |i: usize| wanted.get(i).copied().unwrap_or(false);
    match &node.op {
        Op::Input { .. } | Op::Constant { .. } | Op::Iota { .. } => {}
        Op::Unary(u) => {
            let x = inputs[0];
            grads[0] = Some(match u {
                UnaryOp::Log2 => vec![g, (x * c(LN_2)).recip()],
                UnaryOp::Exp2 => vec![g, out * c(LN_2)],
                UnaryOp::Sin => vec![g, x.cos()],
                UnaryOp::Sqrt => vec![g, out.recip() * c(0.5)],
                UnaryOp::Recip => vec![g, -(out * out)],
            });
        }
        Op::Binary(b) => match b {
            BinaryOp::Add => {
                grads[0] = Some(vec![g]);
                grads[1] = Some(vec![g]);
            }
            BinaryOp::Mul => {
                if want(0) {
                    grads[0] = Some(vec![g, inputs[1]]);
                }
                if want(1) {
                    grads[1] = Some(vec![g, inputs[0]]);
                }
            }
            BinaryOp::Mod | BinaryOp::LessThan => {}
        },
        Op::Reduce { op, axis } => {
            let size = inputs[0].shape()[*axis].clone();
            let ge = g.expand(*axis, size.clone());
            grads[0] = Some(match op {
                ReduceOp::Sum => vec![ge],
                ReduceOp::Max => {
                    let x = inputs[0];
                    // x <= max everywhere, so "equal to the max" is "not below it": one
                    // comparison (NaN inputs make the max NaN, and the gradient with it).
                    let is_max = x.lt(out.expand(*axis, size.clone())).not().cast(dtype);
                    let count = match size.as_constant() {
                        // A short axis (elementwise `maximum` stacks a pair): add the slices,
                        // which fuses into one elementwise loop instead of a tiny reduction.
                        Some(n) if n <= 4 => (1..n)
                            .fold(is_max.slice(*axis, 0, 1), |acc, k| {
                                acc + is_max.slice(*axis, k, k + 1)
                            })
                            .expand_to(is_max.shape()),
                        _ => is_max.sum(*axis).expand(*axis, size),
                    };
                    vec![ge, is_max / count]
                }
            });
        }
        Op::Contiguous => grads[0] = Some(vec![g]),
        Op::Cast(_) => {
            let from = inputs[0].dtype();
            if from.is_float() && dtype.is_float() {
                grads[0] = Some(vec![g.cast(from)]);
            }
        }
        Op::Gather => {
            if want(0) {
                let table = inputs[0];
                let grad = match select_choice(inputs[1], &table.shape()[0]) {
                    Some(choice) => select_table_grad(choice, g),
                    None => gather_table_grad(table, inputs[1], g),
                };
                grads[0] = Some(vec![grad]);
            }
        }
        Op::WriteSlice { axis, start } => {
            let (axis, start) = (*axis, start.clone());
            let len = inputs[1].shape()[axis].clone();
            let size = node.shape[axis].clone();
            let end = &start + &len;
            if want(0) {
                let before = g.slice(axis, Expression::zero(), start.clone());
                let after = g.slice(axis, end.clone(), size.clone());
                let zero_window = before.pad_axis(axis, Expression::zero(), &size - &start)
                    + after.pad_axis(axis, end.clone(), Expression::zero());
                grads[0] = Some(vec![zero_window]);
            }
            if want(1) {
                grads[1] = Some(vec![g.slice(axis, start, end)]);
            }
        }
    }
    grads
}

/// `select(cond, a, b)` is a gather from the stacked column `[b; a]` (`2n` rows) at
/// `iota + cast(cond) · n`. When `ids` has exactly that form, returns the 0/1 choice (of the
/// gradient's dtype, shape `[n]`): the table's gradient is then elementwise (`O(n)`) instead of
/// the general one-hot product (`O(n²)`).
fn select_choice<'g>(ids: GraphTensor<'g>, rows: &Expression) -> Option<GraphTensor<'g>> {
    let cx = ids.graph;
    let n = ids.n_elements();
    if *rows != &n * 2 || !ids.view().is_contiguous() {
        return None;
    }
    let cond_edge = {
        let d = cx.data();
        let add = d.node(ids.node());
        if add.op != Op::Binary(BinaryOp::Add) || add.inputs.len() != 2 {
            return None;
        }
        let is_iota = |e: &crate::graph::Edge| {
            matches!(&d.node(e.node).op, Op::Iota { expr } if *expr == Expression::var("z"))
                && e.view.is_contiguous()
        };
        let other = match (is_iota(&add.inputs[0]), is_iota(&add.inputs[1])) {
            (true, false) => &add.inputs[1],
            (false, true) => &add.inputs[0],
            _ => return None,
        };
        let mul = d.node(other.node);
        if mul.op != Op::Binary(BinaryOp::Mul) || mul.inputs.len() != 2 {
            return None;
        }
        let is_n = |e: &crate::graph::Edge| match &d.node(e.node).op {
            Op::Constant { value } => match value {
                crate::op::ConstValue::Float(v) => n.as_constant() == Some(*v as i64),
                crate::op::ConstValue::Expr(x) => *x == n,
            },
            _ => false,
        };
        let cast = match (is_n(&mul.inputs[0]), is_n(&mul.inputs[1])) {
            (false, true) => &mul.inputs[0],
            (true, false) => &mul.inputs[1],
            _ => return None,
        };
        let cast_node = d.node(cast.node);
        if cast_node.op != Op::Cast(DType::I32) || !cast.view.is_contiguous() {
            return None;
        }
        let src = &cast_node.inputs[0];
        if d.node(src.node).dtype != DType::Bool {
            return None;
        }
        src.clone()
    };
    let label = format!("autograd#{}", cond_edge.node.0);
    let cond = cx.new_handle(crate::graph::TensorEntry {
        node: cond_edge.node,
        view: cond_edge.view,
        dtype: DType::Bool,
        label,
    });
    Some(cond.cast(DType::F32))
}

/// The gradient of the stacked `[on_false; on_true]` column of a `select`: `g` where the
/// choice picked each row, 0 elsewhere.
fn select_table_grad<'g>(choice: GraphTensor<'g>, g: GraphTensor<'g>) -> GraphTensor<'g> {
    let dtype = g.dtype();
    let c = choice.cast(dtype).unsqueeze(1);
    let on_false = g * (1.0 - c);
    let on_true = g * c;
    GraphTensor::concat(&[on_false, on_true], 0)
}

/// `table[rows, width]` receives `g[ids.., width]` summed into the rows the ids name:
/// `one_hot(ids)ᵀ · g` (a matmul, so the gradient of an embedding is one gemm).
fn gather_table_grad<'g>(
    table: GraphTensor<'g>,
    ids: GraphTensor<'g>,
    g: GraphTensor<'g>,
) -> GraphTensor<'g> {
    let (rows, width) = (table.shape()[0].clone(), table.shape()[1].clone());
    let n_ids = ids.n_elements();
    let shape = vec![n_ids.clone(), rows.clone()];
    // One-hot by a float comparison, `(id - class)² < 1/4` (ids are small integers, exact
    // in f32): one fused elementwise loop, where integer comparisons are not.
    let ids_f = ids
        .reshape(vec![n_ids.clone()])
        .cast(DType::F32)
        .unsqueeze(1)
        .expand_to(shape.clone());
    let classes = g.graph.arange(rows).unsqueeze(0).expand_to(shape);
    let d = ids_f - classes;
    let one_hot = (d * d).lt(0.25).cast(g.dtype());
    let g2 = g.reshape(vec![n_ids, width]);
    one_hot.permute(&[1, 0]).matmul(g2)
}
