//! Matrix products as broadcast-multiply + sum-reduce (the pattern backends recognise).

use crate::graph::{Edge, GraphTensor};
use crate::op::ReduceOp;
use crate::shape::Expression;

/// The operands `(a, b)` of the broadcast multiply [`GraphTensor::matmul`] builds, from the
/// multiply's two input edges over its `[.., M, N, K]` dims: `a` is the one broadcast along
/// N (`[.., M, K]`), `b` the one broadcast along M (`[.., N, K]`), in whichever order they
/// come; `None` when the edges are not such a pair (or are masked). What a backend checks
/// before running a multiply + last-axis sum as a matrix product.
pub fn product_operands<'e>(
    inputs: &'e [Edge],
    dims: &[Expression],
) -> Option<(&'e Edge, &'e Edge)> {
    let r = dims.len();
    if r < 3 || inputs.len() != 2 {
        return None;
    }
    let is_one = |d: &Expression| d.as_constant() == Some(1);
    let broadcast = |x: &Edge, dim: usize| {
        !x.view.is_masked() && (x.view.strides()[dim].is_zero() || is_one(&dims[dim]))
    };
    let (x, y) = (&inputs[0], &inputs[1]);
    if broadcast(x, r - 2) && broadcast(y, r - 3) {
        Some((x, y))
    } else if broadcast(y, r - 2) && broadcast(x, r - 3) {
        Some((y, x))
    } else {
        None
    }
}

impl<'g> GraphTensor<'g> {
    /// `torch.matmul` semantics for ranks 1 to 5: 1-D operands are promoted (and the added
    /// dim removed afterwards), batch dims broadcast.
    pub fn matmul(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self.same_graph(&rhs, "matmul");
        let (ra, rb) = (self.rank(), rhs.rank());
        assert!(
            (1..=5).contains(&ra) && (1..=5).contains(&rb),
            "matmul: ranks 1 to 5 are supported, got shapes {:?} and {:?}",
            self.shape(),
            rhs.shape()
        );
        assert_eq!(
            self.dtype(),
            rhs.dtype(),
            "matmul: dtypes differ: {} with shape {:?} and {} with shape {:?}",
            self.dtype(),
            self.shape(),
            rhs.dtype(),
            rhs.shape()
        );
        if ra == 1 && rb == 1 {
            return self.dot(rhs);
        }
        let a = if ra == 1 { self.unsqueeze(0) } else { self };
        let b = if rb == 1 { rhs.unsqueeze(1) } else { rhs };
        let (sa, sb) = (a.shape(), b.shape());
        let (k1, k2) = (&sa[sa.len() - 1], &sb[sb.len() - 2]);
        assert_eq!(
            k1,
            k2,
            "matmul: inner dims differ for shapes {:?} and {:?}",
            self.shape(),
            rhs.shape()
        );
        let (m, n) = (sa[sa.len() - 2].clone(), sb[sb.len() - 1].clone());
        // a: [..., m, k] -> [..., m, n, k];  b: [..., k, n] -> [..., n, k] -> [..., m, n, k]
        let a3 = a.expand(-2, n);
        let b3 = b.transpose(-1, -2).expand(-3, m);
        let prod = a3 * b3; // broadcasting aligns the batch dims
        let last = prod.rank() - 1;
        let mut out = prod.reduce_primop(ReduceOp::Sum, last);
        if rb == 1 {
            out = out.squeeze(-1);
        }
        if ra == 1 {
            out = out.squeeze(-2);
        }
        out
    }

    /// Inner product of two 1-D tensors (rank-0 result).
    pub fn dot(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        assert!(
            self.rank() == 1 && rhs.rank() == 1 && self.shape() == rhs.shape(),
            "dot: needs two 1-D tensors of equal length, got shapes {:?} and {:?}",
            self.shape(),
            rhs.shape()
        );
        (self * rhs).reduce_primop(ReduceOp::Sum, 0)
    }
}
