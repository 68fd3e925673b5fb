//! Reductions and the normalisations built on them.

use crate::dtype::DType;
use crate::graph::{normalize_axes, normalize_axis, GraphTensor, IntoAxis, ToAxes};
use crate::op::ReduceOp;
use crate::shape::Expression;

impl<'g> GraphTensor<'g> {
    fn axes(&self, axes: impl ToAxes, op: &str) -> Vec<usize> {
        normalize_axes(axes, self.rank(), op, &self.shape())
    }
    /// Reduces each axis (highest first so lower indices stay valid).
    fn reduce_axes(self, op: ReduceOp, axes: &[usize]) -> GraphTensor<'g> {
        axes.iter().rev().fold(self, |t, &a| t.reduce_primop(op, a))
    }
    /// Puts size-1 dims back where `axes` were reduced.
    fn keep_dims(self, axes: &[usize]) -> GraphTensor<'g> {
        axes.iter().fold(self, |t, &a| t.unsqueeze(a))
    }
    /// Number of elements covered by `axes`, as a constant of this tensor's dtype.
    fn count(self, axes: &[usize]) -> GraphTensor<'g> {
        let shape = self.shape();
        let n: Expression = axes.iter().map(|&a| shape[a].clone()).product();
        self.graph.constant_expr(n, self.dtype())
    }

    pub fn sum(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "sum");
        self.reduce_axes(ReduceOp::Sum, &axes)
    }
    pub fn sum_keepdim(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "sum");
        self.reduce_axes(ReduceOp::Sum, &axes).keep_dims(&axes)
    }
    pub fn max(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "max");
        self.reduce_axes(ReduceOp::Max, &axes)
    }
    pub fn max_keepdim(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "max");
        self.reduce_axes(ReduceOp::Max, &axes).keep_dims(&axes)
    }
    pub fn min(self, axes: impl ToAxes) -> GraphTensor<'g> {
        -((-self).max(axes))
    }
    pub fn min_keepdim(self, axes: impl ToAxes) -> GraphTensor<'g> {
        -((-self).max_keepdim(axes))
    }
    pub fn mean(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "mean");
        self.float("mean").reduce_axes(ReduceOp::Sum, &axes) / self.count(&axes)
    }
    pub fn mean_keepdim(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "mean");
        self.mean(axes.clone()).keep_dims(&axes)
    }
    /// Product: exact products for short static axes, sign-corrected exp2(Σ log2|x|) otherwise.
    pub fn prod(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "prod");
        axes.iter().rev().fold(self, |t, &a| t.prod_axis(a))
    }
    pub fn prod_keepdim(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let axes = self.axes(axes, "prod");
        self.prod(axes.clone()).keep_dims(&axes)
    }
    fn prod_axis(self, axis: usize) -> GraphTensor<'g> {
        let dim = self.shape()[axis].as_constant();
        if let Some(n) = dim.filter(|&n| (1..=8).contains(&n)) {
            return (1..n)
                .fold(self.slice(axis as i64, 0, 1), |acc, i| {
                    acc * self.slice(axis as i64, i, i + 1)
                })
                .squeeze(axis as i64);
        }
        let x = self.float("prod");
        let d = x.dtype();
        let magnitude = x.abs().log2().reduce_primop(ReduceOp::Sum, axis).exp2();
        let negatives = x.lt(0.0).cast(d).reduce_primop(ReduceOp::Sum, axis);
        let sign = 1.0 - (negatives % 2.0) * 2.0;
        magnitude * sign
    }
    /// Variance with Bessel-style `correction` (1 = PyTorch's default unbiased estimate).
    pub fn var(self, axes: impl ToAxes, correction: usize) -> GraphTensor<'g> {
        let axes = self.axes(axes, "var");
        let x = self.float("var");
        let centered = x - x.mean_keepdim(axes.clone());
        let n: Expression = axes.iter().map(|&a| x.shape()[a].clone()).product();
        let denom = x
            .graph
            .constant_expr(Expression::max(&(n - correction as i64), 0), x.dtype());
        centered.square().reduce_axes(ReduceOp::Sum, &axes) / denom
    }
    pub fn var_keepdim(self, axes: impl ToAxes, correction: usize) -> GraphTensor<'g> {
        let axes = self.axes(axes, "var");
        self.var(axes.clone(), correction).keep_dims(&axes)
    }
    pub fn std(self, axes: impl ToAxes, correction: usize) -> GraphTensor<'g> {
        self.var(axes, correction).sqrt()
    }
    pub fn std_keepdim(self, axes: impl ToAxes, correction: usize) -> GraphTensor<'g> {
        self.var_keepdim(axes, correction).sqrt()
    }

    /// Index of the first maximum along `axis`, as `I32` (the axis is dropped).
    pub fn argmax(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "argmax", &self.shape());
        let is_max = self.eq(self.max_keepdim(axis));
        self.first_true(is_max, axis)
    }
    /// Index of the first minimum along `axis`, as `I32`.
    pub fn argmin(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "argmin", &self.shape());
        let is_min = self.eq(self.min_keepdim(axis));
        self.first_true(is_min, axis)
    }
    /// Smallest index along `axis` where `mask` holds.
    fn first_true(self, mask: GraphTensor<'g>, axis: usize) -> GraphTensor<'g> {
        let shape = self.shape();
        let n = shape[axis].clone();
        let idx = self.graph.iota(Expression::var("z"), n.clone());
        // Index along `axis`, broadcast over the other dims.
        let idx = (axis + 1..shape.len())
            .fold(idx, |t, _| t.unsqueeze(-1))
            .expand_to(shape.clone());
        let big = self.graph.constant_expr(n, DType::I32);
        let candidates = mask.select(idx, big.expand_to(shape));
        -((-candidates).reduce_primop(ReduceOp::Max, axis))
    }

    /// Softmax along `axis` (max-subtracted for stability). The subtracted max is
    /// detached: softmax does not change when a constant is subtracted from a row, so its
    /// gradient through the max is exactly zero (autograd would otherwise build that zero
    /// the long way, through the max's tie mask).
    pub fn softmax(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "softmax", &self.shape());
        let m = self.max(axis).detach().unsqueeze(axis);
        let e = (self - m).exp();
        e / e.sum_keepdim(axis)
    }
    /// log(softmax(x)) computed stably.
    pub fn log_softmax(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "log_softmax", &self.shape());
        // Detached max, as in `softmax`: the result does not depend on it.
        let shifted = self - self.max(axis).detach().unsqueeze(axis);
        shifted - shifted.exp().sum_keepdim(axis).log()
    }
    /// (x − mean) / sqrt(var + eps) over `axes` (population variance, no affine).
    pub fn layer_norm(self, axes: impl ToAxes, eps: f32) -> GraphTensor<'g> {
        let axes = self.axes(axes, "layer_norm");
        let centered = self - self.mean_keepdim(axes.clone());
        let var = centered.square().mean_keepdim(axes);
        centered * (var + eps).sqrt().recip()
    }
    /// The gradient of `xhat = x.layer_norm(-1, eps)` (`x` = `self`) for the output
    /// gradient `dy` (all three of one shape): `dx = (dy − mean(dy) − x̂·mean(dy·x̂))·rstd`
    /// over the last axis, with `rstd = 1/√(var + eps)` recomputed from `x` as `layer_norm`
    /// computes it. Autograd builds a recognised layer norm's gradient this way (see
    /// [`crate::patterns::LayerNormMatch`]): the backward reads the norm's output and `x`,
    /// never its intermediates, so the forward runs as one row kernel, and so does this
    /// (each per-row value it makes is read once).
    pub fn layer_norm_grad(
        self,
        xhat: GraphTensor<'g>,
        dy: GraphTensor<'g>,
        eps: f32,
    ) -> GraphTensor<'g> {
        assert!(
            self.shape() == dy.shape() && xhat.shape() == dy.shape(),
            "layer_norm_grad: x {:?}, xhat {:?} and dy {:?} differ in shape",
            self.shape(),
            xhat.shape(),
            dy.shape()
        );
        let centered = self - self.mean_keepdim(-1);
        let rstd = (centered.square().mean_keepdim(-1) + eps).sqrt().recip();
        let g1 = dy.mean_keepdim(-1);
        let g2 = (dy * xhat).mean_keepdim(-1);
        (dy - g1 - xhat * g2) * rstd
    }
    /// x / sqrt(mean(x²) + eps) over `axes` (no affine).
    pub fn rms_norm(self, axes: impl ToAxes, eps: f32) -> GraphTensor<'g> {
        let axes = self.axes(axes, "rms_norm");
        self * (self.square().mean_keepdim(axes) + eps).sqrt().recip()
    }

    fn float(self, op: &str) -> GraphTensor<'g> {
        assert!(
            self.dtype().is_float(),
            "{op}: needs a float tensor, got {} with shape {:?}",
            self.dtype(),
            self.shape()
        );
        self
    }
}
