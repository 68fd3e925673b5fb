//! Symbolic shapes: [`Expression`] (symbolic integers) and [`ShapeTracker`] (views).

mod bounds;
mod codegen;
mod rules;
mod simplify;
pub mod symbolic;
pub mod tracker;

pub use symbolic::*;
pub use tracker::*;

/// `e` under the run-time dims `dims`: an unbound name is [`crate::LuminalError::UnboundDim`]
/// (the user forgot `set_dim`), anything else an expression error. What runtimes use to
/// size buffers and launches.
pub fn eval_bound(
    e: &Expression,
    dims: &std::collections::HashMap<String, i64>,
) -> crate::Result<i64> {
    e.eval_with(&|name| dims.get(name).copied())
        .map_err(|err| match err {
            ExprError::UnboundVariable(v) => crate::LuminalError::UnboundDim(v),
            other => crate::LuminalError::Expression(other.to_string()),
        })
}

/// The element count of `shape` under `dims` (negative dims count as 0), see [`eval_bound`].
pub fn numel_bound(
    shape: &[Expression],
    dims: &std::collections::HashMap<String, i64>,
) -> crate::Result<usize> {
    shape.iter().try_fold(1usize, |acc, d| {
        Ok(acc * eval_bound(d, dims)?.max(0) as usize)
    })
}
