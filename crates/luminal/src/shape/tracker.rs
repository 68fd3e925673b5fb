//! [`ShapeTracker`]: a (possibly symbolic) strided view over a flat buffer.
//!
//! A view has a logical shape (`dims`), per-dim `strides` and an `offset` into the
//! buffer, plus a per-dim validity window `[lo, hi)` in logical coordinates (created by
//! `slice` of a padded dim and by `pad`): logical elements outside it read as `0`.
//! Logical element `idx` reads buffer element `offset + sum(idx[i] * strides[i])`.
//! A stride of `0` marks an expanded (broadcast) dim.

use std::fmt;

use super::symbolic::Expression;

/// A strided, possibly masked view over a flat buffer (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShapeTracker {
    dims: Vec<Expression>,
    strides: Vec<Expression>,
    offset: Expression,
    /// Validity window per dim; `(0, dims[i])` means unmasked.
    mask: Vec<(Expression, Expression)>,
    /// Index-independent 0/1 validity factor (from squeezing / broadcasting a masked
    /// size-1 dim).
    valid: Expression,
}

fn is_one(e: &Expression) -> bool {
    e.as_constant() == Some(1)
}

/// Row-major (contiguous) strides for `dims`.
fn row_major(dims: &[Expression]) -> Vec<Expression> {
    let mut strides = vec![Expression::one(); dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = &strides[i + 1] * &dims[i + 1];
    }
    strides
}

/// Strides for viewing `(old_dims, old_strides)` as `new_dims` without a copy, if
/// possible (numpy's no-copy reshape rule, with symbolic dims compared canonically).
fn nocopy_strides(
    old_dims: &[Expression],
    old_strides: &[Expression],
    new_dims: &[Expression],
) -> Option<Vec<Expression>> {
    let old: Vec<(&Expression, &Expression)> = old_dims
        .iter()
        .zip(old_strides)
        .filter(|(d, _)| !is_one(d))
        .collect();
    let new_idx: Vec<usize> = (0..new_dims.len())
        .filter(|&i| !is_one(&new_dims[i]))
        .collect();
    let mut new_strides = vec![Expression::zero(); new_dims.len()];
    let (mut oi, mut ni) = (0, 0);
    while oi < old.len() && ni < new_idx.len() {
        let (mut oj, mut nj) = (oi + 1, ni + 1);
        let mut op = old[oi].0.clone();
        let mut np = new_dims[new_idx[ni]].clone();
        while op != np {
            let grow_new = match (np.as_constant(), op.as_constant()) {
                (Some(a), Some(b)) => a < b,
                _ if op.exact_div(&np).is_some() => true,
                _ if np.exact_div(&op).is_some() => false,
                _ => return None,
            };
            if grow_new {
                np *= &new_dims[*new_idx.get(nj)?];
                nj += 1;
            } else {
                op *= old.get(oj)?.0;
                oj += 1;
            }
        }
        // The merged old dims must be contiguous with respect to each other.
        for k in oi..oj - 1 {
            if *old[k].1 != old[k + 1].0 * old[k + 1].1 {
                return None;
            }
        }
        new_strides[new_idx[nj - 1]] = old[oj - 1].1.clone();
        for k in (ni + 1..nj).rev() {
            new_strides[new_idx[k - 1]] = &new_strides[new_idx[k]] * &new_dims[new_idx[k]];
        }
        oi = oj;
        ni = nj;
    }
    (oi == old.len() && ni == new_idx.len()).then_some(new_strides)
}

impl ShapeTracker {
    /// A contiguous row-major view of a buffer with logical shape `dims`.
    pub fn new(dims: Vec<Expression>) -> Self {
        ShapeTracker {
            strides: row_major(&dims),
            offset: Expression::zero(),
            mask: dims
                .iter()
                .map(|d| (Expression::zero(), d.clone()))
                .collect(),
            valid: Expression::one(),
            dims,
        }
    }

    /// Number of logical dims.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The logical shape.
    pub fn dims(&self) -> Vec<Expression> {
        self.dims.clone()
    }

    /// Per-dim strides in buffer elements (0 = expanded dim).
    pub fn strides(&self) -> Vec<Expression> {
        self.strides.clone()
    }

    /// Buffer index of logical element 0 (may be negative when padded).
    pub fn offset(&self) -> Expression {
        self.offset.clone()
    }

    /// Per-dim validity windows `[lo, hi)` in logical coordinates (`(0, dim)` = none).
    pub fn mask(&self) -> Vec<(Expression, Expression)> {
        self.mask.clone()
    }

    /// Index-independent 0/1 validity factor (not 1 after squeezing or broadcasting a
    /// masked size-1 dim).
    pub fn valid(&self) -> Expression {
        self.valid.clone()
    }

    /// Number of logical elements (1 for rank 0).
    pub fn n_elements(&self) -> Expression {
        self.dims.iter().product()
    }

    fn dim_masked(&self, i: usize) -> bool {
        let (lo, hi) = &self.mask[i];
        !(lo.is_zero() && *hi == self.dims[i])
    }

    /// Any slice/pad mask that could make elements invalid.
    pub fn is_masked(&self) -> bool {
        !self.valid.is_one() || (0..self.rank()).any(|i| self.dim_masked(i))
    }

    fn strides_row_major(&self) -> bool {
        let expected = row_major(&self.dims);
        (0..self.rank()).all(|i| is_one(&self.dims[i]) || self.strides[i] == expected[i])
    }

    /// Identity view: offset 0, row-major strides (ignoring size-1 dims), no mask.
    pub fn is_contiguous(&self) -> bool {
        self.offset.is_zero() && !self.is_masked() && self.strides_row_major()
    }

    fn check_axis(&self, op: &str, axis: usize) {
        assert!(
            axis < self.rank(),
            "ShapeTracker::{op}: axis {axis} out of range for shape {self}"
        );
    }

    /// Keep the window inside `[0, dim]` (`pad` relies on that); bounds that provably
    /// cut nothing become exactly `0` / `dim`.
    fn normalize_mask(&mut self, i: usize) {
        let dim = &self.dims[i];
        let (lo, hi) = &mut self.mask[i];
        if !lo.is_zero() {
            *lo = Expression::max(lo, 0);
        }
        if *hi != *dim {
            *hi = Expression::min(hi, dim);
        }
    }

    /// 0/1: whether logical index 0 of dim `i` is inside its window.
    fn valid_at_zero(&self, i: usize) -> Expression {
        let (lo, hi) = &self.mask[i];
        (lo - 1).lt(0) * Expression::zero().lt(hi)
    }

    /// Reorder dims: new dim `k` is old dim `axes[k]`. Panics on a bad permutation.
    pub fn permute(&mut self, axes: &[usize]) {
        let n = self.rank();
        let mut seen = vec![false; n];
        let ok = axes.len() == n
            && axes
                .iter()
                .all(|&a| a < n && !std::mem::replace(&mut seen[a], true));
        assert!(
            ok,
            "ShapeTracker::permute: {axes:?} is not a permutation of the axes of shape {self}"
        );
        self.dims = axes.iter().map(|&a| self.dims[a].clone()).collect();
        self.strides = axes.iter().map(|&a| self.strides[a].clone()).collect();
        self.mask = axes.iter().map(|&a| self.mask[a].clone()).collect();
    }

    /// Swap dims `a` and `b`.
    pub fn transpose(&mut self, a: usize, b: usize) {
        self.check_axis("transpose", a);
        self.check_axis("transpose", b);
        self.dims.swap(a, b);
        self.strides.swap(a, b);
        self.mask.swap(a, b);
    }

    /// Keep `[start, end)` of logical dim `axis`. Constant bounds are clamped to the dim.
    pub fn slice(&mut self, axis: usize, start: Expression, end: Expression) {
        self.check_axis("slice", axis);
        let dim = self.dims[axis].clone();
        let (mut start, mut end) = (start, end);
        if let (Some(e), Some(d)) = (end.as_constant(), dim.as_constant()) {
            end = Expression::constant(e.clamp(0, d));
        }
        if let Some(s) = start.as_constant() {
            let hi = end.as_constant().unwrap_or(i64::MAX);
            start = Expression::constant(s.clamp(0, hi.max(0)));
        }
        let new_dim = &end - &start;
        self.offset = &self.offset + &start * &self.strides[axis];
        let (lo, hi) = &self.mask[axis];
        let lo = if lo.is_zero() {
            Expression::zero()
        } else {
            lo - &start
        };
        let hi = if *hi == dim {
            new_dim.clone()
        } else {
            hi - &start
        };
        self.mask[axis] = (lo, hi);
        self.dims[axis] = new_dim;
        self.normalize_mask(axis);
    }

    /// Pad logical dim `axis` with `before` / `after` zero elements.
    pub fn pad(&mut self, axis: usize, before: Expression, after: Expression) {
        self.check_axis("pad", axis);
        self.offset = &self.offset - &before * &self.strides[axis];
        let (lo, hi) = &self.mask[axis];
        self.mask[axis] = (lo + &before, hi + &before);
        self.dims[axis] = &self.dims[axis] + &before + after;
        self.normalize_mask(axis);
    }

    /// This view with a new leading dim of `size` whose steps move `stride` elements (the
    /// three equal views q, k, v of one projection read as one `[3, ..]` view). `None` for
    /// a masked view.
    pub(crate) fn with_leading_dim(&self, size: Expression, stride: Expression) -> Option<Self> {
        if self.is_masked() {
            return None;
        }
        let mut v = self.clone();
        v.dims.insert(0, size.clone());
        v.strides.insert(0, stride);
        v.mask.insert(0, (Expression::zero(), size));
        Some(v)
    }

    /// Insert a new stride-0 dim of length `size` at position `axis` (`0..=rank`).
    pub fn expand(&mut self, axis: usize, size: Expression) {
        assert!(
            axis <= self.rank(),
            "ShapeTracker::expand: axis {axis} out of range for shape {self}"
        );
        self.dims.insert(axis, size.clone());
        self.strides.insert(axis, Expression::zero());
        self.mask.insert(axis, (Expression::zero(), size));
    }

    /// Turn the existing size-1 dim `axis` into a stride-0 dim of length `size`.
    pub fn broadcast_dim(&mut self, axis: usize, size: Expression) {
        self.check_axis("broadcast_dim", axis);
        assert!(
            is_one(&self.dims[axis]),
            "ShapeTracker::broadcast_dim: dim {axis} of shape {self} is not 1"
        );
        if self.dim_masked(axis) {
            self.valid = &self.valid * self.valid_at_zero(axis);
        }
        self.dims[axis] = size.clone();
        self.strides[axis] = Expression::zero();
        self.mask[axis] = (Expression::zero(), size);
    }

    /// Insert a size-1 dim at `axis` (`0..=rank`).
    pub fn unsqueeze(&mut self, axis: usize) {
        self.expand(axis, Expression::one());
    }

    /// Remove the size-1 dim `axis`.
    pub fn squeeze(&mut self, axis: usize) {
        self.check_axis("squeeze", axis);
        assert!(
            is_one(&self.dims[axis]),
            "ShapeTracker::squeeze: dim {axis} of shape {self} is not 1"
        );
        if self.dim_masked(axis) {
            self.valid = &self.valid * self.valid_at_zero(axis);
        }
        self.dims.remove(axis);
        self.strides.remove(axis);
        self.mask.remove(axis);
    }

    /// Reshape as a free view. Returns `false` (and leaves `self` unchanged) when that
    /// is impossible and the data needs a contiguous copy first.
    ///
    /// Panics if both element counts are constant and differ.
    pub fn reshape(&mut self, dims: Vec<Expression>) -> bool {
        let (old_n, new_n) = (self.n_elements(), dims.iter().product::<Expression>());
        if let (Some(a), Some(b)) = (old_n.as_constant(), new_n.as_constant()) {
            assert!(
                a == b,
                "ShapeTracker::reshape: cannot view {self} ({a} elements) as {dims:?} ({b} elements)"
            );
        }
        if (0..self.rank()).any(|i| self.dim_masked(i)) {
            return false;
        }
        let strides = if new_n.is_zero() || self.strides_row_major() {
            row_major(&dims)
        } else {
            match nocopy_strides(&self.dims, &self.strides, &dims) {
                Some(s) => s,
                None => return false,
            }
        };
        self.mask = dims
            .iter()
            .map(|d| (Expression::zero(), d.clone()))
            .collect();
        self.strides = strides;
        self.dims = dims;
        true
    }

    /// Merge dims `start..=end` into one (torch semantics) via [`ShapeTracker::reshape`].
    pub fn flatten(&mut self, start: usize, end: usize) -> bool {
        assert!(
            start <= end && end < self.rank(),
            "ShapeTracker::flatten: bad range {start}..={end} for shape {self}"
        );
        let mut dims = self.dims[..start].to_vec();
        dims.push(self.dims[start..=end].iter().product());
        dims.extend_from_slice(&self.dims[end + 1..]);
        self.reshape(dims)
    }

    /// `torch.Tensor.unfold` with dilation: dim `axis` (length `n`) becomes the window
    /// count `(n - dilation*(size-1) - 1)/step + 1` and a new last dim of length `size`
    /// walks inside each window. Returns `false` (unchanged) if the view is masked.
    pub fn unfold(
        &mut self,
        axis: usize,
        size: Expression,
        step: Expression,
        dilation: Expression,
    ) -> bool {
        self.check_axis("unfold", axis);
        if self.is_masked() {
            return false;
        }
        for (what, e) in [("size", &size), ("step", &step), ("dilation", &dilation)] {
            assert!(
                e.as_constant().is_none_or(|v| v >= 1),
                "ShapeTracker::unfold: {what} must be >= 1, got {e} (shape {self})"
            );
        }
        let span = &dilation * (&size - 1) + 1;
        if let (Some(n), Some(s)) = (self.dims[axis].as_constant(), span.as_constant()) {
            assert!(
                s <= n,
                "ShapeTracker::unfold: window span {s} exceeds dim {axis} of shape {self}"
            );
        }
        let windows = (&self.dims[axis] - &span) / &step + 1;
        let stride = self.strides[axis].clone();
        self.strides[axis] = &step * &stride;
        self.dims[axis] = windows.clone();
        self.mask[axis] = (Expression::zero(), windows);
        self.strides.push(dilation * stride);
        self.dims.push(size.clone());
        self.mask.push((Expression::zero(), size));
        true
    }

    /// Logical per-dim indices of the row-major flat logical index `z`
    /// (`z` is assumed to be in `[0, n_elements)`).
    fn logical_indices(&self, z: &Expression) -> Vec<Expression> {
        let mut out = vec![Expression::zero(); self.rank()];
        let mut acc = Expression::one();
        for i in (0..self.rank()).rev() {
            let q = z / &acc;
            out[i] = if i > 0 { q % &self.dims[i] } else { q };
            acc *= &self.dims[i];
        }
        out
    }

    /// Physical buffer index as a function of the variable `z`, the row-major flat
    /// logical index.
    pub fn index_expression(&self) -> Expression {
        if self.n_elements().is_zero() {
            return self.offset.clone();
        }
        self.index_expression_nd(&self.logical_indices(&Expression::var("z")))
    }

    /// `1` where logical element `z` reads real data, `0` where it reads padding.
    pub fn valid_expression(&self) -> Expression {
        if self.n_elements().is_zero() {
            return Expression::zero();
        }
        self.valid_expression_nd(&self.logical_indices(&Expression::var("z")))
    }

    /// Physical buffer index for the logical index `idx` (one expression per dim).
    pub fn index_expression_nd(&self, idx: &[Expression]) -> Expression {
        assert_eq!(
            idx.len(),
            self.rank(),
            "ShapeTracker::index_expression_nd: wrong number of indices for shape {self}"
        );
        idx.iter()
            .zip(&self.strides)
            .fold(self.offset.clone(), |acc, (i, s)| acc + i * s)
    }

    /// Validity (0/1) of the logical index `idx` (one expression per dim).
    pub fn valid_expression_nd(&self, idx: &[Expression]) -> Expression {
        assert_eq!(
            idx.len(),
            self.rank(),
            "ShapeTracker::valid_expression_nd: wrong number of indices for shape {self}"
        );
        let mut v = self.valid.clone();
        for (i, ix) in idx.iter().enumerate() {
            let (lo, hi) = &self.mask[i];
            if !lo.is_zero() {
                v *= (lo - 1).lt(ix);
            }
            if *hi != self.dims[i] {
                v *= ix.lt(hi);
            }
        }
        v
    }

    /// Substitute variables (e.g. bind dynamic dims) everywhere.
    pub fn substitute_all(&self, f: &dyn Fn(&str) -> Option<Expression>) -> ShapeTracker {
        let sub = |e: &Expression| e.substitute_all(f);
        let mut out = ShapeTracker {
            dims: self.dims.iter().map(sub).collect(),
            strides: self.strides.iter().map(sub).collect(),
            offset: sub(&self.offset),
            mask: self.mask.iter().map(|(l, h)| (sub(l), sub(h))).collect(),
            valid: sub(&self.valid),
        };
        for i in 0..out.rank() {
            out.normalize_mask(i);
        }
        out
    }
}

fn list(f: &mut fmt::Formatter<'_>, items: &[Expression]) -> fmt::Result {
    write!(f, "[")?;
    for (i, e) in items.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{e}")?;
    }
    write!(f, "]")
}

impl fmt::Display for ShapeTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        list(f, &self.dims)?;
        write!(f, " strides ")?;
        list(f, &self.strides)?;
        write!(f, " offset {}", self.offset)?;
        if (0..self.rank()).any(|i| self.dim_masked(i)) {
            write!(f, " mask [")?;
            for (i, (lo, hi)) in self.mask.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{lo}..{hi}")?;
            }
            write!(f, "]")?;
        }
        if !self.valid.is_one() {
            write!(f, " valid {}", self.valid)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(v: i64) -> Expression {
        Expression::constant(v)
    }
    fn v(n: &str) -> Expression {
        Expression::var(n)
    }
    fn st(dims: &[i64]) -> ShapeTracker {
        ShapeTracker::new(dims.iter().map(|&d| c(d)).collect())
    }
    fn consts(es: &[Expression]) -> Vec<i64> {
        es.iter()
            .map(|e| e.as_constant().expect("constant"))
            .collect()
    }
    /// (index, valid) of every logical element.
    fn read_all(t: &ShapeTracker) -> Vec<(i64, i64)> {
        let n = t.n_elements().as_constant().expect("constant shape");
        let (i, val) = (t.index_expression(), t.valid_expression());
        (0..n)
            .map(|z| {
                let f = |_: &str| Some(z);
                (i.eval_with(&f).unwrap(), val.eval_with(&f).unwrap())
            })
            .collect()
    }

    #[test]
    fn new_and_accessors() {
        let t = ShapeTracker::new(vec![c(3), v("seq")]);
        assert_eq!(t.rank(), 2);
        assert_eq!(t.strides(), vec![v("seq"), c(1)]);
        assert_eq!(t.offset(), c(0));
        assert_eq!(t.n_elements(), v("seq") * 3);
        assert!(t.is_contiguous() && !t.is_masked());
        assert_eq!(t.to_string(), "[3, seq] strides [seq, 1] offset 0");
        assert_eq!(ShapeTracker::new(vec![]).n_elements(), c(1));
        assert_eq!(ShapeTracker::new(vec![]).index_expression(), c(0));
        // Contiguous symbolic views index the identity.
        let t3 = ShapeTracker::new(vec![v("a"), v("b"), v("c")]);
        assert_eq!(t3.index_expression(), v("z"));
        assert_eq!(t3.valid_expression(), c(1));
        assert_eq!(st(&[2, 3, 4]).index_expression(), v("z"));
    }

    #[test]
    fn permute_and_transpose() {
        let mut t = st(&[2, 3]);
        t.permute(&[1, 0]);
        assert_eq!(consts(&t.dims()), vec![3, 2]);
        assert_eq!(consts(&t.strides()), vec![1, 3]);
        assert!(!t.is_contiguous());
        assert_eq!(t.index_expression(), v("z") / 2 + (v("z") % 2) * 3);
        t.transpose(0, 1);
        assert!(t.is_contiguous());
        assert_eq!(t, st(&[2, 3]));
    }

    #[test]
    #[should_panic(expected = "ShapeTracker::permute")]
    fn permute_rejects_bad_axes() {
        st(&[2, 3]).permute(&[0, 0]);
    }

    #[test]
    fn slice() {
        let mut t = st(&[4, 5]);
        t.slice(1, c(1), c(3));
        assert_eq!(consts(&t.dims()), vec![4, 2]);
        assert_eq!(t.offset(), c(1));
        assert!(!t.is_masked() && !t.is_contiguous());
        assert_eq!(t.index_expression(), (v("z") / 2) * 5 + v("z") % 2 + 1);
        // Constant ends are clamped to the dim.
        let mut t = st(&[4]);
        t.slice(0, c(2), c(10));
        assert_eq!(consts(&t.dims()), vec![2]);
        // Symbolic slice.
        let mut t = ShapeTracker::new(vec![v("n"), c(8)]);
        t.slice(0, v("s"), v("s") + 2);
        assert_eq!(t.dims(), vec![c(2), c(8)]);
        assert_eq!(t.offset(), v("s") * 8);
        assert!(!t.is_masked());
    }

    #[test]
    fn pad_and_mask() {
        let mut t = st(&[3]);
        t.pad(0, c(1), c(2));
        assert_eq!(consts(&t.dims()), vec![6]);
        assert_eq!(t.offset(), c(-1));
        assert!(t.is_masked());
        assert_eq!(t.valid_expression(), c(0).lt(v("z")) * v("z").lt(4));
        let vals: Vec<i64> = read_all(&t)
            .into_iter()
            .map(|(i, ok)| if ok == 1 { i } else { -1 })
            .collect();
        assert_eq!(vals, vec![-1, 0, 1, 2, -1, -1]);
        assert_eq!(t.to_string(), "[6] strides [1] offset -1 mask [1..4]");
        // Slicing the padding away restores a contiguous view.
        t.slice(0, c(1), c(4));
        assert!(!t.is_masked());
        assert!(t.is_contiguous());
        // Symbolic windows stay inside [0, dim], so padding after a slice still masks
        // the new elements.
        let mut t = ShapeTracker::new(vec![c(1)]);
        t.pad(0, v("p"), c(1));
        let end = t.dims()[0].clone();
        t.slice(0, v("s"), end);
        t.pad(0, c(1), c(0));
        let env = |n: &str| {
            Some(if n == "p" {
                1
            } else if n == "s" {
                2
            } else {
                0
            })
        };
        assert_eq!(t.valid_expression().eval_with(&env), Ok(0));
        // nd forms
        let mut t = st(&[2, 2]);
        t.pad(1, c(0), v("p"));
        let idx = [v("i"), v("j")];
        assert_eq!(t.index_expression_nd(&idx), v("i") * 2 + v("j"));
        assert_eq!(t.valid_expression_nd(&idx), v("j").lt(2));
    }

    #[test]
    fn expand_broadcast_unsqueeze_squeeze() {
        let mut t = st(&[3]);
        t.expand(0, c(4));
        assert_eq!(consts(&t.dims()), vec![4, 3]);
        assert_eq!(consts(&t.strides()), vec![0, 1]);
        assert_eq!(t.index_expression(), v("z") % 3);
        let mut t = st(&[1, 3]);
        t.broadcast_dim(0, v("b"));
        assert_eq!(t.dims(), vec![v("b"), c(3)]);
        assert_eq!(t.strides(), vec![c(0), c(1)]);
        let mut t = st(&[2, 3]);
        t.unsqueeze(1);
        assert_eq!(consts(&t.dims()), vec![2, 1, 3]);
        assert!(t.is_contiguous());
        t.squeeze(1);
        assert_eq!(t, st(&[2, 3]));
        // A masked unit dim keeps its validity through squeeze / broadcast.
        let mut t = st(&[2]);
        t.unsqueeze(0);
        t.pad(0, c(1), c(0)); // [2, 2]: row 0 is padding
        let mut row0 = t.clone();
        row0.slice(0, c(0), c(1));
        let mut b = row0.clone();
        b.broadcast_dim(0, c(3));
        assert!(read_all(&b).iter().all(|&(_, ok)| ok == 0));
        row0.squeeze(0);
        assert_eq!(row0.valid_expression(), c(0));
        assert!(row0.is_masked());
        t.slice(0, c(1), c(2));
        t.squeeze(0);
        assert!(t.is_contiguous());
    }

    #[test]
    #[should_panic(expected = "is not 1")]
    fn squeeze_rejects_non_unit() {
        st(&[2, 3]).squeeze(0);
    }

    #[test]
    fn reshape() {
        let mut t = st(&[2, 3, 4]);
        assert!(t.reshape(vec![c(6), c(4)]));
        assert!(t.is_contiguous());
        // Offset views stay free.
        let mut t = st(&[4, 3]);
        t.slice(0, c(1), c(3));
        assert!(t.reshape(vec![c(6)]));
        assert_eq!(t.offset(), c(3));
        // Transposed views can't be flattened for free...
        let mut t = st(&[2, 3]);
        t.transpose(0, 1);
        let before = t.clone();
        assert!(!t.reshape(vec![c(6)]));
        assert_eq!(t, before);
        // ...but untouched dims can be split / merged.
        let mut t = st(&[2, 3, 4]);
        t.permute(&[2, 0, 1]); // [4, 2, 3] strides [1, 12, 4]
        assert!(t.reshape(vec![c(2), c(2), c(6)]));
        assert_eq!(consts(&t.strides()), vec![2, 1, 4]);
        // Expanded dims merge and split with stride 0.
        let mut t = st(&[3]);
        t.expand(0, c(4));
        assert!(t.reshape(vec![c(2), c(2), c(3)]));
        assert_eq!(consts(&t.strides()), vec![0, 0, 1]);
        // Symbolic dims.
        let mut t = ShapeTracker::new(vec![v("seq"), c(4)]);
        t.transpose(0, 1); // [4, seq] strides [1, 4]
        assert!(t.reshape(vec![c(2), c(2), v("seq")]));
        assert_eq!(t.strides(), vec![c(2), c(1), c(4)]);
        // Masked views need a copy.
        let mut t = st(&[3]);
        t.pad(0, c(1), c(0));
        assert!(!t.reshape(vec![c(2), c(2)]));
    }

    #[test]
    #[should_panic(expected = "ShapeTracker::reshape")]
    fn reshape_rejects_wrong_count() {
        st(&[2, 3]).reshape(vec![c(5)]);
    }

    #[test]
    fn flatten() {
        let mut t = st(&[2, 3, 4]);
        assert!(t.flatten(1, 2));
        assert_eq!(consts(&t.dims()), vec![2, 12]);
        let mut t = st(&[2, 3, 4]);
        t.transpose(0, 2);
        assert!(!t.flatten(0, 1));
        let mut t = ShapeTracker::new(vec![v("a"), v("b")]);
        assert!(t.flatten(0, 1));
        assert_eq!(t.dims(), vec![v("a") * v("b")]);
    }

    #[test]
    fn unfold() {
        let mut t = st(&[10]);
        assert!(t.unfold(0, c(3), c(2), c(1)));
        assert_eq!(consts(&t.dims()), vec![4, 3]);
        assert_eq!(consts(&t.strides()), vec![2, 1]);
        assert_eq!(t.index_expression(), (v("z") / 3) * 2 + v("z") % 3);
        let mut t = st(&[2, 10]);
        assert!(t.unfold(1, c(3), c(2), c(2)));
        assert_eq!(consts(&t.dims()), vec![2, 3, 3]);
        assert_eq!(consts(&t.strides()), vec![10, 2, 2]);
        let mut t = ShapeTracker::new(vec![v("n")]);
        assert!(t.unfold(0, c(2), c(1), c(1)));
        assert_eq!(t.dims(), vec![v("n") - 1, c(2)]);
        let mut t = st(&[4]);
        t.pad(0, c(1), c(1));
        let before = t.clone();
        assert!(!t.unfold(0, c(2), c(1), c(1)));
        assert_eq!(t, before);
    }

    #[test]
    fn substitute_all() {
        let mut t = ShapeTracker::new(vec![v("seq"), c(4)]);
        t.pad(0, c(0), v("p"));
        let bound = t.substitute_all(&|n| match n {
            "seq" => Some(c(3)),
            "p" => Some(c(0)),
            _ => None,
        });
        assert_eq!(bound, st(&[3, 4]));
        assert!(t.is_masked());
    }
}
