//! Broadcasting, arithmetic operators, comparisons, select, elementwise min/max.

use crate::dtype::DType;
use crate::graph::{GraphTensor, ToShape};
use crate::op::BinaryOp;
use crate::shape::Expression;
use std::ops::{Add, Div, Mul, Neg, Rem, Sub};

/// A right-hand side of an elementwise op: a tensor, or a scalar that becomes a constant of
/// the other operand's dtype.
pub trait Operand<'g> {
    fn into_tensor(self, like: GraphTensor<'g>) -> GraphTensor<'g>;
    /// The value, when this is a plain scalar.
    fn scalar(&self) -> Option<f64> {
        None
    }
}
impl<'g> Operand<'g> for GraphTensor<'g> {
    fn into_tensor(self, _: GraphTensor<'g>) -> GraphTensor<'g> {
        self
    }
}
macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl<'g> Operand<'g> for $t {
            fn into_tensor(self, like: GraphTensor<'g>) -> GraphTensor<'g> {
                like.graph.constant_of(self as f64, like.dtype())
            }
            fn scalar(&self) -> Option<f64> {
                Some(*self as f64)
            }
        }
    )*};
}
scalar_operand!(f32, f64, i32);

impl<'g> GraphTensor<'g> {
    /// Broadcasts this tensor to `shape` (numpy rules: align right, size-1 dims stretch,
    /// missing leading dims are added). Free: a stride-0 view.
    pub fn expand_to(self, shape: impl ToShape) -> GraphTensor<'g> {
        let target = shape.to_shape();
        let mut view = self.view();
        let dims = view.dims();
        let fail = || panic!("expand_to: cannot broadcast shape {dims:?} to {target:?}");
        if dims.len() > target.len() {
            fail();
        }
        let lead = target.len() - dims.len();
        for (i, d) in dims.iter().enumerate() {
            let t = &target[lead + i];
            if d != t {
                if d.as_constant() == Some(1) {
                    view.broadcast_dim(i, t.clone());
                } else {
                    fail();
                }
            }
        }
        for (i, t) in target[..lead].iter().enumerate() {
            view.expand(i, t.clone());
        }
        self.with_view(view)
    }

    /// Broadcasts two tensors to their common shape.
    pub(crate) fn broadcast_with(
        self,
        rhs: GraphTensor<'g>,
        op: &str,
    ) -> (GraphTensor<'g>, GraphTensor<'g>) {
        let (a, b) = (self.shape(), rhs.shape());
        if a == b {
            return (self, rhs);
        }
        let out = broadcast_shapes(&a, &b, op);
        (self.expand_to(out.clone()), rhs.expand_to(out))
    }

    /// Elementwise maximum (NaN propagates; exact, also for infinities).
    pub fn maximum(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        let (a, b) = self.broadcast_with(rhs, "maximum");
        // Stack both on a new last axis (padding with exact zeros) and max-reduce it.
        let last = a.rank();
        let pair = a.unsqueeze(last as i64).pad_axis(last, 0, 1)
            + b.unsqueeze(last as i64).pad_axis(last, 1, 0);
        pair.reduce_primop(crate::op::ReduceOp::Max, last)
    }
    /// Elementwise minimum.
    pub fn minimum(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        -((-self).maximum(-rhs))
    }
    /// Clamps every element into `[min, max]`.
    pub fn clamp(self, min: f32, max: f32) -> GraphTensor<'g> {
        self.maximum(min).minimum(max)
    }

    /// `self < rhs` as a Bool tensor (primop).
    pub fn lt(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        self.binary_primop(rhs, BinaryOp::LessThan)
    }
    /// `self > rhs`.
    pub fn gt(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        rhs.lt(self)
    }
    /// `self == rhs` (false where either side is NaN).
    pub fn eq(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        let ordered = self.lt(rhs).not().and(rhs.lt(self).not());
        if self.dtype().is_float() {
            ordered.and(self.not_nan()).and(rhs.not_nan())
        } else {
            ordered
        }
    }
    /// `self != rhs`.
    pub fn ne(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        self.eq(rhs).not()
    }
    /// `self <= rhs`.
    pub fn le(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        self.lt(rhs).or(self.eq(rhs))
    }
    /// `self >= rhs`.
    pub fn ge(self, rhs: impl Operand<'g>) -> GraphTensor<'g> {
        let rhs = rhs.into_tensor(self);
        rhs.le(self)
    }
    /// True where the element is not NaN.
    pub fn not_nan(self) -> GraphTensor<'g> {
        self.lt(f64::INFINITY).or(self.gt(f64::NEG_INFINITY))
    }

    fn as_bool(self, op: &str) -> GraphTensor<'g> {
        assert_eq!(
            self.dtype(),
            DType::Bool,
            "{op}: needs a bool tensor, got {} with shape {:?}",
            self.dtype(),
            self.shape()
        );
        self
    }
    /// Logical not of a Bool tensor.
    pub fn not(self) -> GraphTensor<'g> {
        let t = self.as_bool("not");
        t.lt(t.graph.constant_of(1.0, DType::Bool))
    }
    /// Logical and of Bool tensors.
    pub fn and(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self.as_bool("and")
            .binary_primop(rhs.as_bool("and"), BinaryOp::Mul)
    }
    /// Logical or of Bool tensors.
    pub fn or(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self.as_bool("or")
            .binary_primop(rhs.as_bool("or"), BinaryOp::Add)
    }

    /// `torch.where(self, on_true, on_false)` on a Bool condition, broadcasting all three.
    ///
    /// Exact for every value (infinities and NaN in the branch not taken do not leak):
    /// both branches are stacked into one table `[on_false…, on_true…]` and the Gather
    /// primop picks element `z + n·cond[z]`. Backends may pattern-match this into a select.
    pub fn select(self, on_true: impl Operand<'g>, on_false: impl Operand<'g>) -> GraphTensor<'g> {
        let cond = self.as_bool("select");
        let (ts, fs) = (on_true.scalar(), on_false.scalar());
        let a = if ts.is_none() {
            Some(on_true.into_tensor(cond))
        } else {
            None
        };
        let b = if fs.is_none() {
            Some(on_false.into_tensor(cond))
        } else {
            None
        };
        // The value dtype comes from a tensor branch; two scalars give f32.
        let dtype = a.or(b).map(|t| t.dtype()).unwrap_or(DType::F32);
        let a = a.unwrap_or_else(|| cond.graph.constant_of(ts.unwrap(), dtype));
        let b = b.unwrap_or_else(|| cond.graph.constant_of(fs.unwrap(), dtype));
        assert_eq!(
            a.dtype(),
            b.dtype(),
            "select: branch dtypes differ: {} with shape {:?} and {} with shape {:?}",
            a.dtype(),
            a.shape(),
            b.dtype(),
            b.shape()
        );
        let shape = broadcast_shapes(
            &broadcast_shapes(&cond.shape(), &a.shape(), "select"),
            &b.shape(),
            "select",
        );
        let n: Expression = shape.iter().cloned().product();
        let column = |t: GraphTensor<'g>| {
            t.expand_to(shape.clone())
                .reshape(vec![n.clone(), Expression::from(1)])
        };
        let table = GraphTensor::concat(&[column(b), column(a)], 0);
        let cx = cond.graph;
        let picks = cx.iota(Expression::var("z"), n.clone())
            + cond
                .expand_to(shape.clone())
                .reshape(vec![n.clone()])
                .cast(DType::I32)
                * cx.constant_expr(n, DType::I32);
        table.embedding(picks).reshape(shape)
    }

    /// `x^p` with a scalar or a tensor exponent (broadcast like PyTorch's `torch.pow`).
    ///
    /// A scalar `p`: exact repeated products for small integer `p`, `exp2(p·log2 x)`
    /// otherwise (NaN for negative bases, like PyTorch with a fractional exponent). A
    /// tensor `p`: see [`pow_tensor`](Self::pow_tensor).
    pub fn pow(self, p: impl Operand<'g>) -> GraphTensor<'g> {
        match p.scalar() {
            Some(v) => self.pow_scalar(v as f32),
            None => self.pow_tensor(p.into_tensor(self)),
        }
    }

    /// `x^p` elementwise with a tensor exponent (broadcast): `|x|^p` through `exp2(p·log2|x|)`,
    /// with PyTorch's special cases: `x^0 = 1` (also for `x` 0 or NaN), a negative base
    /// gives `±|x|^p` for an integer `p` (sign by parity) and NaN otherwise, `0^p` is 0 for
    /// `p > 0` and inf for `p < 0`.
    pub fn pow_tensor(self, p: GraphTensor<'g>) -> GraphTensor<'g> {
        let (x, p) = self.broadcast_with(p, "pow");
        let x = x.float_for("pow");
        let p = if p.dtype() == x.dtype() {
            p
        } else {
            p.cast(x.dtype())
        };
        let magnitude = (x.abs().log2() * p).exp2();
        let integer = p.eq(p.floor());
        let odd = (p.abs() % 2.0).eq(1.0);
        // Negative base: ±magnitude for an integer exponent, NaN otherwise.
        let signed = odd.select(-magnitude, magnitude);
        let negative = x.lt(0.0);
        let nan = self.graph.constant_of(f64::NAN, x.dtype());
        let neg_result = integer.select(signed, nan.expand_to(x.shape()));
        let result = negative.select(neg_result, magnitude);
        p.eq(0.0).select(
            self.graph.constant_of(1.0, x.dtype()).expand_to(x.shape()),
            result,
        )
    }

    /// 1 / sqrt(x) (PyTorch's `rsqrt`).
    pub fn rsqrt(self) -> GraphTensor<'g> {
        self.sqrt().recip()
    }

    fn float_for(self, op: &str) -> GraphTensor<'g> {
        assert!(
            self.dtype().is_float(),
            "{op}: needs a float tensor, got {} with shape {:?}",
            self.dtype(),
            self.shape()
        );
        self
    }

    fn pow_scalar(self, p: f32) -> GraphTensor<'g> {
        if p == 0.5 {
            return self.sqrt();
        }
        if p.fract() == 0.0 && p.abs() <= 16.0 {
            let n = p.abs() as u32;
            if n == 0 {
                return self
                    .graph
                    .constant_of(1.0, self.dtype())
                    .expand_to(self.shape());
            }
            // Square-and-multiply.
            let (mut result, mut base, mut k) = (None::<GraphTensor<'g>>, self, n);
            while k > 0 {
                if k & 1 == 1 {
                    result = Some(match result {
                        Some(r) => r * base,
                        None => base,
                    });
                }
                k >>= 1;
                if k > 0 {
                    base = base * base;
                }
            }
            let r = result.unwrap();
            return if p < 0.0 { r.recip() } else { r };
        }
        (self.log2() * p).exp2()
    }
}

fn scalar_like<'g>(like: GraphTensor<'g>, v: f64) -> GraphTensor<'g> {
    like.graph.constant_of(v, like.dtype())
}

impl<'g> Add for GraphTensor<'g> {
    type Output = GraphTensor<'g>;
    fn add(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self.binary_primop(rhs, BinaryOp::Add)
    }
}
impl<'g> Mul for GraphTensor<'g> {
    type Output = GraphTensor<'g>;
    fn mul(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self.binary_primop(rhs, BinaryOp::Mul)
    }
}
impl<'g> Rem for GraphTensor<'g> {
    type Output = GraphTensor<'g>;
    /// C `fmod`: the remainder has the sign of the dividend (primop).
    fn rem(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self.binary_primop(rhs, BinaryOp::Mod)
    }
}
impl<'g> Neg for GraphTensor<'g> {
    type Output = GraphTensor<'g>;
    fn neg(self) -> GraphTensor<'g> {
        assert!(
            self.dtype() != DType::Bool,
            "neg: not defined for bool tensors (shape {:?})",
            self.shape()
        );
        self * scalar_like(self, -1.0)
    }
}
impl<'g> Sub for GraphTensor<'g> {
    type Output = GraphTensor<'g>;
    fn sub(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        self + (-rhs)
    }
}
impl<'g> Div for GraphTensor<'g> {
    type Output = GraphTensor<'g>;
    /// True division; integer operands give an `f32` result (like PyTorch).
    fn div(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> {
        if self.dtype().is_float() {
            self * rhs.recip()
        } else {
            self.cast(DType::F32) * rhs.cast(DType::F32).recip()
        }
    }
}

macro_rules! scalar_ops {
    ($($t:ty),*) => {$(
        impl<'g> Add<$t> for GraphTensor<'g> {
            type Output = GraphTensor<'g>;
            fn add(self, rhs: $t) -> GraphTensor<'g> { self + scalar_like(self, rhs as f64) }
        }
        impl<'g> Sub<$t> for GraphTensor<'g> {
            type Output = GraphTensor<'g>;
            fn sub(self, rhs: $t) -> GraphTensor<'g> { self + scalar_like(self, -(rhs as f64)) }
        }
        impl<'g> Mul<$t> for GraphTensor<'g> {
            type Output = GraphTensor<'g>;
            fn mul(self, rhs: $t) -> GraphTensor<'g> { self * scalar_like(self, rhs as f64) }
        }
        impl<'g> Div<$t> for GraphTensor<'g> {
            type Output = GraphTensor<'g>;
            fn div(self, rhs: $t) -> GraphTensor<'g> {
                if self.dtype().is_float() { self * scalar_like(self, 1.0 / rhs as f64) }
                else { self.cast(DType::F32) / (rhs as f64 as f32) }
            }
        }
        impl<'g> Rem<$t> for GraphTensor<'g> {
            type Output = GraphTensor<'g>;
            fn rem(self, rhs: $t) -> GraphTensor<'g> { self % scalar_like(self, rhs as f64) }
        }
        impl<'g> Add<GraphTensor<'g>> for $t {
            type Output = GraphTensor<'g>;
            fn add(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> { scalar_like(rhs, self as f64) + rhs }
        }
        impl<'g> Sub<GraphTensor<'g>> for $t {
            type Output = GraphTensor<'g>;
            fn sub(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> { scalar_like(rhs, self as f64) - rhs }
        }
        impl<'g> Mul<GraphTensor<'g>> for $t {
            type Output = GraphTensor<'g>;
            fn mul(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> { scalar_like(rhs, self as f64) * rhs }
        }
        impl<'g> Div<GraphTensor<'g>> for $t {
            type Output = GraphTensor<'g>;
            fn div(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> { scalar_like(rhs, self as f64) / rhs }
        }
        impl<'g> Rem<GraphTensor<'g>> for $t {
            type Output = GraphTensor<'g>;
            fn rem(self, rhs: GraphTensor<'g>) -> GraphTensor<'g> { scalar_like(rhs, self as f64) % rhs }
        }
    )*};
}
scalar_ops!(f32, i32);

/// The numpy broadcast of two shapes, panicking with `op` when they do not broadcast.
pub(crate) fn broadcast_shapes(a: &[Expression], b: &[Expression], op: &str) -> Vec<Expression> {
    let rank = a.len().max(b.len());
    let one = Expression::from(1);
    (0..rank)
        .map(|i| {
            let da = if i + a.len() >= rank {
                &a[i + a.len() - rank]
            } else {
                &one
            };
            let db = if i + b.len() >= rank {
                &b[i + b.len() - rank]
            } else {
                &one
            };
            if da == db || *db == one {
                da.clone()
            } else if *da == one {
                db.clone()
            } else {
                panic!("{op}: cannot broadcast shapes {a:?} and {b:?}")
            }
        })
        .collect()
}
