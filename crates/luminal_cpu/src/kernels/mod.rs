//! Kernels by family. Each is built by a lowering rule (`lower/`) and launched by the
//! runtime (`exec/`).

pub(crate) mod attention;
pub(crate) mod encode;
pub(crate) mod fallback;
pub(crate) mod fused;
pub(crate) mod half;
pub(crate) mod matmul;
pub(crate) mod movement;
pub(crate) mod norm;
pub(crate) mod quant;
