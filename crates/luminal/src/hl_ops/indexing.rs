//! Gather-based indexing, one-hot, triangular masks and cumulative ops.

use crate::dtype::DType;
use crate::graph::{normalize_axis, GraphTensor, IntoAxis};
use crate::op::Op;
use crate::shape::Expression;

impl<'g> GraphTensor<'g> {
    fn ids(self, op: &str) -> GraphTensor<'g> {
        assert_eq!(
            self.dtype(),
            DType::I32,
            "{op}: indices must be i32, got {} with shape {:?}",
            self.dtype(),
            self.shape()
        );
        self
    }

    /// Rows of a `[rows, width]` table picked by `I32` ids of any shape: `[ids..., width]`
    /// (the Gather primop). Out-of-range ids are a run-time error.
    pub fn embedding(self, ids: GraphTensor<'g>) -> GraphTensor<'g> {
        self.same_graph(&ids, "embedding");
        let ids = ids.ids("embedding");
        assert_eq!(
            self.rank(),
            2,
            "embedding: table must be [rows, width], got shape {:?} (ids {:?})",
            self.shape(),
            ids.shape()
        );
        let mut shape = ids.shape();
        shape.push(self.shape()[1].clone());
        self.graph.add_op(
            Op::Gather,
            vec![self.edge(), ids.edge()],
            self.dtype(),
            shape,
        )
    }

    /// `torch.index_select`: picks entries of `axis` by a 1-D `I32` index.
    pub fn index_select(self, axis: impl IntoAxis, index: GraphTensor<'g>) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "index_select", &self.shape());
        let index = index.ids("index_select");
        assert_eq!(
            index.rank(),
            1,
            "index_select: index must be 1-D, got shape {:?}",
            index.shape()
        );
        let rank = self.rank();
        let mut perm = vec![axis];
        perm.extend((0..rank).filter(|&d| d != axis));
        let moved = self.permute(&perm);
        let shape = moved.shape();
        let width: Expression = shape[1..].iter().cloned().product();
        let rows = moved
            .reshape(vec![shape[0].clone(), width])
            .embedding(index);
        let mut out_shape = vec![index.shape()[0].clone()];
        out_shape.extend_from_slice(&shape[1..]);
        let mut inverse = vec![0; rank];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        rows.reshape(out_shape).permute(&inverse)
    }

    /// `torch.gather`: `out[i][j][k] = self[i][index[i][j][k]][k]` for `axis = 1`, etc.
    pub fn gather(self, axis: impl IntoAxis, index: GraphTensor<'g>) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "gather", &self.shape());
        let index = index.ids("gather");
        assert_eq!(
            index.rank(),
            self.rank(),
            "gather: index shape {:?} must have the rank of input shape {:?}",
            index.shape(),
            self.shape()
        );
        let in_shape = self.shape();
        let idx_shape = index.shape();
        // Row-major strides of the input, then the flat position of every picked element.
        let mut strides = vec![Expression::from(1); in_shape.len()];
        for d in (0..in_shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1].clone() * in_shape[d + 1].clone();
        }
        let cx = self.graph;
        let mut flat = index * cx.constant_expr(strides[axis].clone(), DType::I32);
        for d in (0..idx_shape.len()).filter(|&d| d != axis) {
            let coord = cx.iota(
                Expression::var("z") * strides[d].clone(),
                idx_shape[d].clone(),
            );
            let coord = (d + 1..idx_shape.len()).fold(coord, |t, _| t.unsqueeze(-1));
            flat = flat + coord.expand_to(idx_shape.clone());
        }
        let n: Expression = in_shape.iter().cloned().product();
        self.reshape(vec![n, Expression::from(1)])
            .embedding(flat)
            .squeeze(-1)
    }

    /// One-hot encoding of `I32` ids as `f32`: `[ids..., num_classes]`.
    pub fn one_hot(self, num_classes: usize) -> GraphTensor<'g> {
        let ids = self.ids("one_hot");
        let classes = self.graph.iota(Expression::var("z"), num_classes);
        let mut shape = ids.shape();
        shape.push(Expression::from(num_classes));
        ids.unsqueeze(-1)
            .expand_to(shape.clone())
            .eq(classes.expand_to(shape))
            .cast(DType::F32)
    }

    /// `I32` tensor `[rows, cols]` holding `col - row`.
    fn diagonal_offsets(self, op: &str) -> GraphTensor<'g> {
        assert!(
            self.rank() >= 2,
            "{op}: needs at least 2 dims, got shape {:?}",
            self.shape()
        );
        let s = self.shape();
        let (r, c) = (s[s.len() - 2].clone(), s[s.len() - 1].clone());
        let z = Expression::var("z");
        let expr = z.clone() % c.clone() - z / c.clone();
        self.graph
            .iota(expr, r.clone() * c.clone())
            .reshape(vec![r, c])
    }
    /// Keeps the lower triangle (`col - row <= diagonal`) of the last two dims, zeroes the rest.
    pub fn tril(self, diagonal: i64) -> GraphTensor<'g> {
        let keep = self.diagonal_offsets("tril").lt(diagonal as i32 + 1);
        keep.expand_to(self.shape()).select(self, 0.0)
    }
    /// Keeps the upper triangle (`col - row >= diagonal`) of the last two dims.
    pub fn triu(self, diagonal: i64) -> GraphTensor<'g> {
        let keep = self.diagonal_offsets("triu").lt(diagonal as i32).not();
        keep.expand_to(self.shape()).select(self, 0.0)
    }

    /// Windows `[.., n, n]` ending at each position of `axis` (moved last), padded with `fill`.
    fn prefix_windows(self, axis: usize, fill: f32) -> GraphTensor<'g> {
        let last = self.rank() - 1;
        let moved = self.transpose(axis, last);
        let n = moved.shape()[last].clone();
        let mut padding = vec![(Expression::from(0), Expression::from(0)); self.rank()];
        padding[last].0 = n.clone() - 1;
        moved.pad(&padding, fill).unfold(last, n, 1)
    }
    /// Running sum along `axis`.
    pub fn cumsum(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "cumsum", &self.shape());
        let last = self.rank() - 1;
        self.prefix_windows(axis, 0.0).sum(-1).transpose(axis, last)
    }
    /// Running product along `axis`.
    pub fn cumprod(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "cumprod", &self.shape());
        let last = self.rank() - 1;
        self.prefix_windows(axis, 1.0)
            .prod(-1)
            .transpose(axis, last)
    }
    /// Running maximum along `axis` (values).
    pub fn cummax(self, axis: impl IntoAxis) -> GraphTensor<'g> {
        let axis = normalize_axis(axis.into_axis(), self.rank(), "cummax", &self.shape());
        let last = self.rank() - 1;
        self.prefix_windows(axis, f32::NEG_INFINITY)
            .max(-1)
            .transpose(axis, last)
    }
}
