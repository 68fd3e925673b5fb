//! # Luminal core
//!
//! Build a lazy, static graph of a dozen primitive ops; compile it with a backend; run it.
//!
//! ```
//! use luminal::prelude::*;
//! let cx = Graph::new();
//! let a = cx.tensor("a", (3, 1));
//! let b = cx.tensor("b", (1, 4));
//! let c = a.matmul(b).output();
//! let mut rt = cx.compile(ReferenceBackend, CompileOptions::default()).unwrap();
//! rt.set(a, &[1., 2., 3.]).unwrap();
//! rt.set(b, &[1., 2., 3., 4.]).unwrap();
//! rt.run().unwrap();
//! let out: Vec<f32> = rt.get(c).unwrap();
//! assert_eq!(out, vec![1., 2., 3., 4., 2., 4., 6., 8., 3., 6., 9., 12.]);
//! ```

pub mod autograd;
pub mod backend;
pub mod display;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod hl_ops;
pub mod op;
pub mod passes;
pub mod patterns;
pub mod quant;
pub mod reference;
pub mod semantics;
pub mod shape;
#[cfg(feature = "testing")]
pub mod testing;

pub use half;

/// Hands the allocator's free heap pages back to the OS (glibc's `malloc_trim(0)`; a no-op
/// elsewhere). Building and compiling a model's graph peaks at tens of MB of short-lived
/// heap (SmolLM2: ~60 MB), which glibc keeps resident after it is freed; loaders and
/// runtimes call this before their large allocations so those reuse the pages instead of
/// adding to them.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::os::raw::c_int;
        }
        // SAFETY: glibc's malloc_trim takes no pointers and is thread-safe; it only returns
        // unused heap pages to the kernel.
        unsafe {
            malloc_trim(0);
        }
    }
}

pub use backend::{Backend, CompileOptions, FusedTerm, Runtime, SearchBudget, Tunable};
pub use dtype::{ByteData, DType, Element, HostData};
pub use error::{DataAccess, LuminalError, Result};
pub use graph::{Graph, GraphData, GraphTensor, NodeId, TensorId, TensorRef, ToAxes, ToShape};
pub use quant::SharedBytes;
pub use reference::{ReferenceBackend, ReferenceRuntime};
pub use shape::{Expression, ShapeTracker};

pub mod prelude {
    pub use crate::backend::{Backend, CompileOptions, Runtime, SearchBudget};
    pub use crate::dtype::{DType, Element, HostData};
    pub use crate::error::{LuminalError, Result};
    pub use crate::graph::{Graph, GraphTensor, TensorRef, ToAxes, ToShape};
    pub use crate::hl_ops::{ConvOptions, Operand, PoolOptions};
    pub use crate::quant::SharedBytes;
    pub use crate::reference::{ReferenceBackend, ReferenceRuntime};
    pub use crate::shape::{Expression, ShapeTracker};
    pub use half::{bf16, f16};
}
