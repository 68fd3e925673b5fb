//! Symbolic shapes: [`Expression`] (symbolic integers) and [`ShapeTracker`] (views).

mod bounds;
mod codegen;
mod rules;
mod simplify;
pub mod symbolic;
pub mod tracker;

pub use symbolic::*;
pub use tracker::*;
