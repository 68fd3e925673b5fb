//! High-level ops, all composed from the primops in [`crate::op`].
//!
//! This file holds the thin primop builders (one node each) and the creation ops; the
//! other files compose them.

mod binary;
mod conv;
mod indexing;
mod matmul;
pub use matmul::product_operands;
mod movement;
mod reduction;
mod state;
mod unary;

pub use binary::Operand;
pub use conv::{ConvOptions, PoolOptions};
pub use unary::{gelu_constants, gelu_tanh_constants, gelu_tanh_grad_constants, ERF_A};

use crate::dtype::DType;
use crate::graph::{Graph, GraphTensor, IntoDim, ToShape};
use crate::op::{BinaryOp, ConstValue, Op, ReduceOp, UnaryOp};
use crate::shape::Expression;

impl<'g> GraphTensor<'g> {
    fn unary_primop(self, op: UnaryOp) -> GraphTensor<'g> {
        assert!(
            self.dtype().is_float(),
            "{}: needs a float tensor, got {} with shape {:?}",
            op.name(),
            self.dtype(),
            self.shape()
        );
        self.graph
            .add_op(Op::Unary(op), vec![self.edge()], self.dtype(), self.shape())
    }

    /// Base-2 logarithm (primop).
    pub fn log2(self) -> GraphTensor<'g> {
        self.unary_primop(UnaryOp::Log2)
    }
    /// 2^x (primop).
    pub fn exp2(self) -> GraphTensor<'g> {
        self.unary_primop(UnaryOp::Exp2)
    }
    /// Sine (primop).
    pub fn sin(self) -> GraphTensor<'g> {
        self.unary_primop(UnaryOp::Sin)
    }
    /// Square root (primop).
    pub fn sqrt(self) -> GraphTensor<'g> {
        self.unary_primop(UnaryOp::Sqrt)
    }
    /// 1/x (primop).
    pub fn recip(self) -> GraphTensor<'g> {
        self.unary_primop(UnaryOp::Recip)
    }

    /// A binary primop on two tensors of one dtype, broadcasting them first.
    pub(crate) fn binary_primop(self, rhs: GraphTensor<'g>, op: BinaryOp) -> GraphTensor<'g> {
        self.same_graph(&rhs, op.name());
        assert_eq!(
            self.dtype(),
            rhs.dtype(),
            "{}: dtypes differ: {} with shape {:?} and {} with shape {:?}",
            op.name(),
            self.dtype(),
            self.shape(),
            rhs.dtype(),
            rhs.shape()
        );
        let (a, b) = self.broadcast_with(rhs, op.name());
        let shape = a.shape();
        self.graph.add_op(
            Op::Binary(op),
            vec![a.edge(), b.edge()],
            op.output_dtype(self.dtype()),
            shape,
        )
    }

    /// Reduces one (already normalised) axis with a primop reduction.
    pub(crate) fn reduce_primop(self, op: ReduceOp, axis: usize) -> GraphTensor<'g> {
        let mut shape = self.shape();
        assert!(
            axis < shape.len(),
            "{}: axis {axis} out of range for shape {shape:?}",
            op.name()
        );
        shape.remove(axis);
        self.graph.add_op(
            Op::Reduce { op, axis },
            vec![self.edge()],
            self.dtype(),
            shape,
        )
    }

    /// Materialises the view into a fresh row-major buffer (a no-op when it already is one).
    /// The same values, with no gradient: autograd treats the result as a constant
    /// (PyTorch's `detach`). A copy node of its own (backends fuse it away), so other uses of
    /// `self` keep their gradients.
    ///
    /// ```
    /// use luminal::prelude::*;
    /// use luminal::autograd::Autograd;
    /// let cx = Graph::new();
    /// let x = cx.tensor("x", 3);
    /// // d/dx of x * detach(x) is detach(x) (= x), not 2x.
    /// let loss = (x * x.detach()).sum(0);
    /// let dx = Autograd::new(&[x], loss).grad(x).output();
    /// # let _ = dx;
    /// ```
    pub fn detach(self) -> GraphTensor<'g> {
        let t = self.graph.add_op(
            Op::Contiguous,
            vec![self.edge()],
            self.dtype(),
            self.shape(),
        );
        let id = t.node();
        self.graph.data_mut().no_grad.insert(id);
        t
    }

    pub fn contiguous(self) -> GraphTensor<'g> {
        let e = self.entry();
        let node_shape = self.graph.data().node(e.node).shape.clone();
        if e.view.is_contiguous() && e.view.dims() == node_shape {
            return self;
        }
        self.graph.add_op(
            Op::Contiguous,
            vec![self.edge()],
            self.dtype(),
            self.shape(),
        )
    }

    /// The f32 values of a quantized (or half) tensor: a cast to f32, which is the reference
    /// dequantization; fast backends fold it into the matmul or gather that reads it and
    /// read the blocks in place. A no-op on f32 tensors.
    pub fn dequantize(self) -> GraphTensor<'g> {
        self.cast(DType::F32)
    }

    /// Converts to `dtype` (floats → ints truncate toward zero; → Bool is `!= 0`).
    ///
    /// A float tensor can also be cast to a block-quantized type that has an encoder
    /// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; see [`crate::quant::encoder`]): each block of 32
    /// consecutive values along the last axis is encoded from its own values (ggml's
    /// reference quantizer). Such a tensor is only stored (`write_slice` into a quantized
    /// state, as a q8_0 KV cache) and read back through `.dequantize()`.
    ///
    /// # Panics
    /// Casting to a quantized type without an encoder, from a non-float type, or when the
    /// last dim is not a constant multiple of the block size.
    pub fn cast(self, dtype: DType) -> GraphTensor<'g> {
        if self.dtype() == dtype {
            return self;
        }
        if dtype.is_quantized() {
            let shape = self.shape();
            let last = shape.last().and_then(|d| d.as_constant());
            assert!(
                crate::quant::encoder(dtype).is_some()
                    && self.dtype().is_float()
                    && last.is_some_and(|n| n > 0 && n as usize % dtype.block_size() == 0),
                "cast: cannot cast {} {shape:?} to {dtype} (a float tensor whose last dim is a \
                 constant multiple of {} can be cast to q4_0, q4_1, q5_0, q5_1 or q8_0)",
                self.dtype(),
                dtype.block_size()
            );
        }
        self.graph
            .add_op(Op::Cast(dtype), vec![self.edge()], dtype, self.shape())
    }
}

impl Graph {
    /// A rank-0 `f32` constant.
    pub fn constant(&self, value: f32) -> GraphTensor<'_> {
        self.constant_of(value as f64, DType::F32)
    }
    /// A rank-0 constant of any dtype (`value` is rounded to it).
    pub fn constant_of(&self, value: f64, dtype: DType) -> GraphTensor<'_> {
        let value = ConstValue::Float(dtype.round(value));
        self.add_op(Op::Constant { value }, vec![], dtype, vec![])
    }
    /// A rank-0 constant whose value is a symbolic expression over dynamic dims.
    pub fn constant_expr(&self, value: impl Into<Expression>, dtype: DType) -> GraphTensor<'_> {
        let e: Expression = value.into();
        let value = match e.as_constant() {
            Some(c) => ConstValue::Float(dtype.round(c as f64)),
            None => ConstValue::Expr(e),
        };
        self.add_op(Op::Constant { value }, vec![], dtype, vec![])
    }
    /// A tensor of `shape` filled with `value` (`f32`; a broadcast view of one constant).
    pub fn full(&self, shape: impl ToShape, value: f32) -> GraphTensor<'_> {
        self.constant(value).expand_to(shape)
    }
    pub fn zeros(&self, shape: impl ToShape) -> GraphTensor<'_> {
        self.full(shape, 0.0)
    }
    pub fn ones(&self, shape: impl ToShape) -> GraphTensor<'_> {
        self.full(shape, 1.0)
    }
    /// `[0, 1, …, n-1]` as `f32`.
    pub fn arange(&self, n: impl IntoDim) -> GraphTensor<'_> {
        self.iota(Expression::var("z"), n).cast(DType::F32)
    }
    /// A 1-D `I32` tensor of length `len` whose element `z` is `expr(z)` (primop).
    pub fn iota(&self, expr: impl Into<Expression>, len: impl IntoDim) -> GraphTensor<'_> {
        self.add_op(
            Op::Iota { expr: expr.into() },
            vec![],
            DType::I32,
            vec![len.into_dim()],
        )
    }
}
