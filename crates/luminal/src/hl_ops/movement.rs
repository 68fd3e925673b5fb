//! Views (free: they only change the edge's ShapeTracker) and ops built from them:
//! pad, concat, split, stack, unfold.

use crate::dtype::DType;
use crate::graph::{normalize_axis, GraphTensor, IntoAxis, ToAxes, ToShape};
use crate::shape::Expression;

impl<'g> GraphTensor<'g> {
    fn axis(&self, axis: impl IntoAxis, op: &str) -> usize {
        normalize_axis(axis.into_axis(), self.rank(), op, &self.shape())
    }

    /// Reorders dimensions: output dim `i` is input dim `axes[i]`. Axes may be negative
    /// (counted from the end, as in PyTorch): `x.permute(&[0, -1, 1])`.
    pub fn permute(self, axes: impl ToAxes) -> GraphTensor<'g> {
        let given = axes.to_axes();
        let rank = self.rank() as i64;
        let axes: Vec<usize> = given
            .iter()
            .map(|&a| if a < 0 { a + rank } else { a })
            .filter(|a| (0..rank).contains(a))
            .map(|a| a as usize)
            .collect();
        let mut seen = vec![false; self.rank()];
        let ok = given.len() == self.rank()
            && axes.len() == given.len()
            && axes.iter().all(|&a| !std::mem::replace(&mut seen[a], true));
        assert!(
            ok,
            "permute: {given:?} is not a permutation of the dims of shape {:?}",
            self.shape()
        );
        let mut v = self.view();
        v.permute(&axes);
        self.with_view(v)
    }
    /// Swaps two dimensions.
    pub fn transpose(self, a: impl IntoAxis, b: impl IntoAxis) -> GraphTensor<'g> {
        let (a, b) = (self.axis(a, "transpose"), self.axis(b, "transpose"));
        let mut v = self.view();
        v.transpose(a, b);
        self.with_view(v)
    }
    /// Same elements, new shape (free when the view allows, else a contiguous copy first).
    pub fn reshape(self, shape: impl ToShape) -> GraphTensor<'g> {
        let dims = shape.to_shape();
        let (n_old, n_new) = (
            self.n_elements(),
            dims.iter().cloned().product::<Expression>(),
        );
        if let (Some(a), Some(b)) = (n_old.as_constant(), n_new.as_constant()) {
            assert_eq!(
                a,
                b,
                "reshape: cannot reshape shape {:?} ({a} elements) to {dims:?} ({b} elements)",
                self.shape()
            );
        }
        let mut v = self.view();
        if v.reshape(dims.clone()) {
            return self.with_view(v);
        }
        let c = self.contiguous();
        let mut v = c.view();
        assert!(
            v.reshape(dims.clone()),
            "reshape: contiguous view of {:?} refused {dims:?}",
            c.shape()
        );
        c.with_view(v)
    }
    /// Elements `start..end` of `axis` (negative constants count from the end).
    pub fn slice(
        self,
        axis: impl IntoAxis,
        start: impl Into<Expression>,
        end: impl Into<Expression>,
    ) -> GraphTensor<'g> {
        let axis = self.axis(axis, "slice");
        let dim = self.shape()[axis].clone();
        let fix = |e: Expression| match e.as_constant() {
            Some(c) if c < 0 => dim.clone() + c,
            _ => e,
        };
        let (start, end) = (fix(start.into()), fix(end.into()));
        if let (Some(s), Some(e), Some(d)) =
            (start.as_constant(), end.as_constant(), dim.as_constant())
        {
            assert!(
                s <= e.min(d),
                "slice: range {s}..{e} is empty or out of range for axis {axis} of shape {:?}",
                self.shape()
            );
        }
        let mut v = self.view();
        v.slice(axis, start, Expression::min(&end, &dim));
        self.with_view(v)
    }
    /// Inserts a new broadcast dimension of `size` at `axis` (free).
    pub fn expand(self, axis: impl IntoAxis, size: impl Into<Expression>) -> GraphTensor<'g> {
        let axis = self.insert_axis(axis, "expand");
        let mut v = self.view();
        v.expand(axis, size.into());
        self.with_view(v)
    }
    fn insert_axis(&self, axis: impl IntoAxis, op: &str) -> usize {
        let (a, r) = (axis.into_axis(), self.rank() as i64 + 1);
        let n = if a < 0 { a + r } else { a };
        assert!(
            (0..r).contains(&n),
            "{op}: axis {a} out of range for shape {:?}",
            self.shape()
        );
        n as usize
    }
    /// Inserts a size-1 dimension at `axis` (negative counts from the end, like PyTorch).
    pub fn unsqueeze(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = self.insert_axis(axis, "unsqueeze");
        let mut v = self.view();
        v.unsqueeze(axis);
        self.with_view(v)
    }
    /// Removes a size-1 dimension.
    pub fn squeeze(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = self.axis(axis, "squeeze");
        assert!(
            self.shape()[axis].as_constant() == Some(1),
            "squeeze: axis {axis} of shape {:?} is not 1",
            self.shape()
        );
        let mut v = self.view();
        v.squeeze(axis);
        self.with_view(v)
    }
    /// Merges dims `start..=end` into one (PyTorch semantics).
    pub fn flatten(self, start: impl IntoAxis, end: impl IntoAxis) -> GraphTensor<'g> {
        if self.rank() == 0 {
            return self.reshape([1usize]);
        }
        let (s, e) = (self.axis(start, "flatten"), self.axis(end, "flatten"));
        assert!(
            s <= e,
            "flatten: start {s} is after end {e} for shape {:?}",
            self.shape()
        );
        let dims = self.shape();
        let mut new: Vec<Expression> = dims[..s].to_vec();
        new.push(dims[s..=e].iter().cloned().product());
        new.extend_from_slice(&dims[e + 1..]);
        self.reshape(new)
    }

    /// Pads one axis with zeros (a free masked view): `before` elements in front, `after`
    /// behind. The axis may be negative (`-1` is the last). The per-axis form cannot be
    /// misread; prefer it to [`pad`](Self::pad) when porting `F.pad` calls.
    pub fn pad_axis(
        self,
        axis: impl IntoAxis,
        before: impl Into<Expression>,
        after: impl Into<Expression>,
    ) -> GraphTensor<'g> {
        let axis = self.axis(axis, "pad_axis");
        let mut v = self.view();
        v.pad(axis, before.into(), after.into());
        self.with_view(v)
    }

    /// Pads every dimension with `value`: `padding[i] = (before, after)` for dim `i`,
    /// **listed first dim to last, one pair per dim**.
    ///
    /// **This is the reverse of PyTorch's `F.pad`**, whose flat list starts at the *last*
    /// dim: `F.pad(x, (1, 2))` on a 2-D `x` pads the last dim, which here is
    /// `x.pad(&[(0, 0), (1, 2)], 0.0)`, or `x.pad_axis(-1, 1, 2)`.
    pub fn pad<P: Into<Expression> + Clone>(
        self,
        padding: &[(P, P)],
        value: f32,
    ) -> GraphTensor<'g> {
        assert_eq!(
            padding.len(),
            self.rank(),
            "pad: {} (before, after) pairs given for shape {:?}",
            padding.len(),
            self.shape()
        );
        let pad_all = |t: GraphTensor<'g>| {
            padding
                .iter()
                .enumerate()
                .fold(t, |t, (i, (b, a))| t.pad_axis(i, b.clone(), a.clone()))
        };
        let padded = pad_all(self);
        if value == 0.0 {
            return padded;
        }
        let dtype = self.dtype();
        assert!(
            dtype != DType::Bool,
            "pad: bool tensors pad with false only (shape {:?})",
            self.shape()
        );
        // 1 inside, 0 in the padding: a padded broadcast of one constant.
        let inside = pad_all(self.graph.constant_of(1.0, dtype).expand_to(self.shape()));
        if value.is_infinite() {
            let m = inside.log2(); // 0 inside, -inf outside: exact, no 0·inf
            padded + if value < 0.0 { m } else { -m }
        } else {
            padded + (1.0 - inside) * value
        }
    }

    /// Sliding windows (PyTorch `Tensor.unfold`): `axis` becomes the window count and a new
    /// last dim of `size` holds each window.
    pub fn unfold(
        self,
        axis: impl IntoAxis,
        size: impl Into<Expression>,
        step: impl Into<Expression>,
    ) -> GraphTensor<'g> {
        let axis = self.axis(axis, "unfold");
        self.unfold_dilated(axis, size.into(), step.into(), Expression::from(1))
    }

    pub(crate) fn unfold_dilated(
        self,
        axis: usize,
        size: Expression,
        step: Expression,
        dilation: Expression,
    ) -> GraphTensor<'g> {
        if let (Some(n), Some(k), Some(d)) = (
            self.shape()[axis].as_constant(),
            size.as_constant(),
            dilation.as_constant(),
        ) {
            assert!(
                d * (k - 1) < n,
                "unfold: window {k} (dilation {d}) does not fit axis {axis} of shape {:?}",
                self.shape()
            );
        }
        let mut v = self.view();
        if v.unfold(axis, size.clone(), step.clone(), dilation.clone()) {
            return self.with_view(v);
        }
        let c = self.contiguous();
        let mut v = c.view();
        assert!(
            v.unfold(axis, size, step, dilation),
            "unfold: refused on a contiguous view"
        );
        c.with_view(v)
    }

    /// Concatenates tensors along `axis` (all other dims must match).
    pub fn concat(tensors: &[GraphTensor<'g>], axis: impl IntoAxis) -> GraphTensor<'g> {
        assert!(!tensors.is_empty(), "concat: no tensors given");
        let first = tensors[0];
        let axis = first.axis(axis, "concat");
        let shapes: Vec<_> = tensors.iter().map(|t| t.shape()).collect();
        for (t, s) in tensors.iter().zip(&shapes) {
            first.same_graph(t, "concat");
            let ok = s.len() == shapes[0].len()
                && t.dtype() == first.dtype()
                && s.iter()
                    .zip(&shapes[0])
                    .enumerate()
                    .all(|(i, (a, b))| i == axis || a == b);
            assert!(
                ok,
                "concat: shapes {:?} and {:?} ({} and {}) do not match outside axis {axis}",
                shapes[0],
                s,
                first.dtype(),
                t.dtype()
            );
        }
        if tensors.len() == 1 {
            return first;
        }
        let total: Expression = shapes.iter().map(|s| s[axis].clone()).sum();
        let mut offset = Expression::from(0);
        let mut acc: Option<GraphTensor<'g>> = None;
        for (t, s) in tensors.iter().zip(&shapes) {
            let after = total.clone() - offset.clone() - s[axis].clone();
            let p = t.pad_axis(axis, offset.clone(), after);
            offset = offset + s[axis].clone();
            // Padding reads as exact zeros, so adding the padded pieces places each one.
            acc = Some(match acc {
                None => p,
                Some(a) => a.binary_primop(p, crate::op::BinaryOp::Add),
            });
        }
        acc.unwrap()
    }
    /// `concat(&[self, other], axis)`.
    pub fn concat_along(self, other: GraphTensor<'g>, axis: impl IntoAxis) -> GraphTensor<'g> {
        GraphTensor::concat(&[self, other], axis)
    }
    /// Stacks same-shaped tensors along a new axis.
    pub fn stack(tensors: &[GraphTensor<'g>], axis: impl IntoAxis) -> GraphTensor<'g> {
        assert!(!tensors.is_empty(), "stack: no tensors given");
        let axis = tensors[0].insert_axis(axis, "stack");
        let parts: Vec<_> = tensors.iter().map(|t| t.unsqueeze(axis)).collect();
        GraphTensor::concat(&parts, axis)
    }
    /// Splits `axis` into consecutive pieces of the given sizes (they must add up).
    pub fn split(self, sizes: &[usize], axis: impl IntoAxis) -> Vec<GraphTensor<'g>> {
        let axis = self.axis(axis, "split");
        let total: usize = sizes.iter().sum();
        if let Some(d) = self.shape()[axis].as_constant() {
            assert_eq!(
                total as i64,
                d,
                "split: sizes {sizes:?} do not add up to axis {axis} of shape {:?}",
                self.shape()
            );
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&n| {
                let t = self.slice(axis as i64, start, start + n);
                start += n;
                t
            })
            .collect()
    }
    /// Splits `axis` into `n` pieces of ceil(len / n) (the last may be smaller), like PyTorch.
    pub fn chunk(self, n: usize, axis: impl IntoAxis) -> Vec<GraphTensor<'g>> {
        let axis = self.axis(axis, "chunk");
        let len = self.static_dims("chunk")[axis];
        assert!(n > 0, "chunk: n must be positive");
        let size = len.div_ceil(n).max(1);
        let mut sizes = vec![];
        let mut left = len;
        while left > 0 {
            sizes.push(size.min(left));
            left -= size.min(left);
        }
        self.split(&sizes, axis)
    }
}
