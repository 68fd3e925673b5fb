//! The reference semantics of every primop, one output element at a time on exact `f64`
//! values rounded to the node's dtype. The reference runtime is built on it, and so is every
//! backend's generic (fallback) kernel: the meaning of an op is written once, here.
//!
//! A caller provides the operands through [`Operands`]: input elements read through the
//! edges' views, and the values of the symbolic expressions [`node_exprs`] lists for the
//! node (compiled however the backend compiles expressions).

use crate::dtype::DType;
use crate::error::{LuminalError, Result};
use crate::graph::Node;
use crate::op::{ConstValue, Op};
use crate::shape::Expression;

/// How [`eval_node`] reads its operands.
pub trait Operands {
    /// Logical element `z` of input `i`, read through the edge's view (0 where it pads).
    fn read(&mut self, i: usize, z: usize) -> Result<f64>;
    /// Value of expression `k` of [`node_exprs`] with the logical index variable `z` bound
    /// to `z` (the dims bound to the run's values).
    fn expr(&mut self, k: usize, z: usize) -> Result<i64>;
}

/// The symbolic expressions (over the dynamic dims and the index variable `z`) that
/// [`eval_node`] asks [`Operands::expr`] for, by position:
/// - `Iota`: its expression; a `Constant` with an expression value: that expression;
/// - `Reduce`: the reduced length, then the inner size (product of the later dims);
/// - `Gather`: the table's rows, then its width;
/// - `WriteSlice`: the written length, the destination's size along the axis, the start,
///   the inner size, then the source's element count.
pub fn node_exprs(node: &Node) -> Vec<Expression> {
    let product = |d: &[Expression]| d.iter().product::<Expression>();
    match &node.op {
        Op::Iota { expr } => vec![expr.clone()],
        Op::Constant {
            value: ConstValue::Expr(e),
        } => vec![e.clone()],
        Op::Reduce { axis, .. } => {
            let dims = node.inputs[0].view.dims();
            vec![dims[*axis].clone(), product(&dims[axis + 1..])]
        }
        Op::Gather => {
            let dims = node.inputs[0].view.dims();
            vec![dims[0].clone(), dims[1].clone()]
        }
        Op::WriteSlice { axis, start } => {
            let dims = node.inputs[1].view.dims();
            vec![
                dims[*axis].clone(),
                node.shape[*axis].clone(),
                start.clone(),
                product(&dims[axis + 1..]),
                product(&dims),
            ]
        }
        _ => vec![],
    }
}

/// Computes the `n` output elements of `node` (whose first input has dtype `in_dtype`),
/// handing each to `write(z, value)`; values are already rounded to the node's dtype.
/// A `WriteSlice` writes the whole updated destination (first the old values, then the
/// written slice over them).
pub fn eval_node(
    node: &Node,
    in_dtype: DType,
    n: usize,
    io: &mut dyn Operands,
    write: &mut dyn FnMut(usize, f64),
) -> Result<()> {
    let dt = node.dtype;
    let dim = |io: &mut dyn Operands, k: usize| io.expr(k, 0).map(|v| v.max(0) as usize);
    match &node.op {
        Op::Input { .. } => {}
        Op::Constant { value } => {
            let v = match value {
                ConstValue::Float(v) => *v,
                ConstValue::Expr(_) => io.expr(0, 0)? as f64,
            };
            for z in 0..n {
                write(z, dt.round(v));
            }
        }
        Op::Iota { .. } => {
            for z in 0..n {
                write(z, dt.round(io.expr(0, z)? as f64));
            }
        }
        Op::Unary(u) => {
            for z in 0..n {
                write(z, dt.round(u.apply(io.read(0, z)?)));
            }
        }
        Op::Binary(b) => {
            for z in 0..n {
                let (x, y) = (io.read(0, z)?, io.read(1, z)?);
                write(z, dt.round(b.apply(x, y, in_dtype)));
            }
        }
        Op::Cast(q) if q.is_quantized() => {
            // Each block of consecutive values is encoded from its own values, and the
            // stored values are what the blocks decode to.
            let bs = q.block_size();
            let (mut x, mut y) = (vec![0f32; bs], vec![0f32; bs]);
            let mut blk = vec![0u8; q.block_bytes()];
            for b in 0..n / bs {
                for (j, v) in x.iter_mut().enumerate() {
                    *v = io.read(0, b * bs + j)? as f32;
                }
                crate::quant::encode(*q, &x, &mut blk);
                crate::quant::decode(*q, &blk, &mut y);
                for (j, &v) in y.iter().enumerate() {
                    write(b * bs + j, v as f64);
                }
            }
        }
        Op::Contiguous | Op::Cast(_) => {
            for z in 0..n {
                write(z, dt.round(io.read(0, z)?));
            }
        }
        Op::Reduce { op, .. } => {
            let (len, inner) = (dim(io, 0)?, dim(io, 1)?.max(1));
            for o in 0..n {
                let (outer, inn) = (o / inner, o % inner);
                let mut acc = op.identity(dt);
                for k in 0..len {
                    acc = op.combine(acc, io.read(0, (outer * len + k) * inner + inn)?);
                }
                write(o, dt.round(acc));
            }
        }
        Op::Gather => {
            let rows = io.expr(0, 0)?;
            let width = dim(io, 1)?;
            for s in 0..n / width.max(1) {
                let id = io.read(1, s)? as i64;
                if id < 0 || id >= rows {
                    return Err(LuminalError::IndexOutOfRange {
                        op: "Gather".into(),
                        index: id,
                        size: rows,
                    });
                }
                for w in 0..width {
                    let v = io.read(0, id as usize * width + w)?;
                    write(s * width + w, v);
                }
            }
        }
        Op::WriteSlice { .. } => {
            let (len, size) = (dim(io, 0)?, io.expr(1, 0)?);
            let (start, inner, src_n) = (io.expr(2, 0)?, dim(io, 3)?, dim(io, 4)?);
            if start < 0 || start + len as i64 > size {
                return Err(LuminalError::IndexOutOfRange {
                    op: "WriteSlice".into(),
                    index: start + len as i64 - 1,
                    size,
                });
            }
            for z in 0..n {
                write(z, io.read(0, z)?);
            }
            let run = (len * inner).max(1);
            for z in 0..src_n {
                let (outer, rest) = (z / run, z % run);
                let at = (outer * size as usize + start as usize) * inner + rest;
                write(at, io.read(1, z)?);
            }
        }
    }
    Ok(())
}
