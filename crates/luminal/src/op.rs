//! The primitive ops. Each is defined once here: its reference semantics (on exact `f64`
//! values, rounded to the output dtype by the caller) and its display name. Its gradient
//! rule sits in [`crate::autograd::rules`] (one match arm per primop, same order).
//!
//! Everything else (`hl_ops`) is composed from these, so a backend that implements them runs
//! every model; it may then replace patterns with faster kernels.

use crate::dtype::DType;
use crate::shape::Expression;
use std::fmt;
use std::hash::{Hash, Hasher};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    Log2,
    Exp2,
    Sin,
    Sqrt,
    Recip,
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Log2 => "Log2",
            UnaryOp::Exp2 => "Exp2",
            UnaryOp::Sin => "Sin",
            UnaryOp::Sqrt => "Sqrt",
            UnaryOp::Recip => "Recip",
        }
    }
    /// Reference semantics (IEEE: log2(0) = -inf, sqrt(-1) = NaN, 1/0 = inf).
    pub fn apply(self, x: f64) -> f64 {
        match self {
            UnaryOp::Log2 => x.log2(),
            UnaryOp::Exp2 => x.exp2(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    Add,
    Mul,
    /// Remainder with the sign of the dividend (C `fmod`, numpy `fmod`).
    Mod,
    /// `a < b`, producing `Bool`.
    LessThan,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "Add",
            BinaryOp::Mul => "Mul",
            BinaryOp::Mod => "Mod",
            BinaryOp::LessThan => "LessThan",
        }
    }
    /// Reference semantics for inputs of `dtype`; the result is exact or correctly rounded
    /// to the output dtype by the caller. Integers use wrapping i32 arithmetic; `x % 0` is 0
    /// for integers (numpy's convention). For `Bool`, Add is OR and Mul is AND (via rounding).
    pub fn apply(self, a: f64, b: f64, dtype: DType) -> f64 {
        if dtype == DType::I32 {
            let (a, b) = (a as i32, b as i32);
            return match self {
                BinaryOp::Add => a.wrapping_add(b) as f64,
                BinaryOp::Mul => a.wrapping_mul(b) as f64,
                BinaryOp::Mod => a.checked_rem(b).unwrap_or(0) as f64,
                BinaryOp::LessThan => (a < b) as u8 as f64,
            };
        }
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
            BinaryOp::Mod => a % b,
            BinaryOp::LessThan => (a < b) as u8 as f64,
        }
    }
    pub fn output_dtype(self, input: DType) -> DType {
        match self {
            BinaryOp::LessThan => DType::Bool,
            _ => input,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    Sum,
    /// Maximum; NaN propagates (like PyTorch).
    Max,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SumReduce",
            ReduceOp::Max => "MaxReduce",
        }
    }
    pub fn identity(self, dtype: DType) -> f64 {
        match self {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => dtype.lowest(),
        }
    }
    pub fn combine(self, acc: f64, x: f64) -> f64 {
        match self {
            ReduceOp::Sum => acc + x,
            ReduceOp::Max => {
                if acc.is_nan() || x.is_nan() {
                    f64::NAN
                } else {
                    acc.max(x)
                }
            }
        }
    }
}

/// The value of a `Constant` node: a number, or a symbolic expression over dynamic dims
/// (e.g. the element count `seq * 64` that a mean divides by).
#[derive(Clone, Debug)]
pub enum ConstValue {
    Float(f64),
    Expr(Expression),
}

impl PartialEq for ConstValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (ConstValue::Float(a), ConstValue::Float(b)) => a.to_bits() == b.to_bits(),
            (ConstValue::Expr(a), ConstValue::Expr(b)) => a == b,
            _ => false,
        }
    }
}
impl Eq for ConstValue {}
impl Hash for ConstValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            ConstValue::Float(v) => (0u8, v.to_bits()).hash(state),
            ConstValue::Expr(e) => (1u8, e).hash(state),
        }
    }
}

impl ConstValue {
    pub fn as_float(&self) -> Option<f64> {
        match self {
            ConstValue::Float(v) => Some(*v),
            ConstValue::Expr(e) => e.as_constant().map(|c| c as f64),
        }
    }
}

impl fmt::Display for ConstValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstValue::Float(v) => write!(f, "{v}"),
            ConstValue::Expr(e) => write!(f, "{e}"),
        }
    }
}

/// A node's operation. Shapes and dtypes live on the node; views live on the input edges.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Data set by the user at run time (weights, activations).
    Input {
        name: String,
    },
    /// Every element equals `value` (rounded to the node dtype).
    Constant {
        value: ConstValue,
    },
    /// 1-D `I32` tensor whose element `z` is `expr` evaluated at `z`.
    Iota {
        expr: Expression,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Reduces dimension `axis` of the (single) input view; the output drops that dimension.
    Reduce {
        op: ReduceOp,
        axis: usize,
    },
    /// Materialises the input view into a fresh row-major buffer.
    Contiguous,
    /// Inputs `[table, indices]`: table is a rank-2 view `[rows, width]`, indices an `I32`
    /// tensor of shape `S`; the output `[S..., width]` holds `table[indices[s], w]`.
    Gather,
    /// Converts to another dtype (floats → ints truncate toward zero; → Bool is `!= 0`).
    Cast(DType),
    /// Inputs `[dest, src]`: `src` (with `dest`'s shape except `len` along `axis`) written
    /// into `dest` at `start..start + len` along `axis`. `dest` is an `Input` that holds state
    /// across runs (a KV cache, optimizer state): the output is the updated tensor, and after
    /// the run the input holds it too. Other readers of `dest` in the same run see its value
    /// from before the run (an optimizer reads a weight, then writes its update). Backends
    /// write in place, so only `src`'s elements move.
    WriteSlice {
        axis: usize,
        start: Expression,
    },
}

impl Op {
    /// Display name of the op (as in `to_dot`).
    pub fn name(&self) -> String {
        match self {
            Op::Input { name } => format!("Input({name})"),
            Op::Constant { value } => format!("Constant({value})"),
            Op::Iota { expr } => format!("Iota({expr})"),
            Op::Unary(u) => u.name().to_string(),
            Op::Binary(b) => b.name().to_string(),
            Op::Reduce { op, axis } => format!("{}({axis})", op.name()),
            Op::Contiguous => "Contiguous".to_string(),
            Op::Gather => "Gather".to_string(),
            Op::Cast(d) => format!("Cast({d})"),
            Op::WriteSlice { axis, start } => format!("WriteSlice({axis}, {start})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics_wrap_and_truncate() {
        assert_eq!(
            BinaryOp::Add.apply(i32::MAX as f64, 1.0, DType::I32),
            i32::MIN as f64
        );
        assert_eq!(BinaryOp::Mod.apply(-7.0, 3.0, DType::I32), -1.0);
        assert_eq!(BinaryOp::Mod.apply(7.0, 0.0, DType::I32), 0.0);
        assert_eq!(BinaryOp::Mod.apply(-7.5, 2.0, DType::F32), -1.5);
    }

    #[test]
    fn max_reduce_propagates_nan() {
        let r = ReduceOp::Max;
        assert!(r.combine(r.combine(1.0, f64::NAN), 5.0).is_nan());
        assert_eq!(r.identity(DType::F32), f64::NEG_INFINITY);
    }
}
