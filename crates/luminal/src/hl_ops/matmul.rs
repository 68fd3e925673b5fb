//! Matrix products as broadcast-multiply + sum-reduce (the pattern backends recognise).

use crate::graph::GraphTensor;
use crate::op::ReduceOp;

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
