//! # Luminal training
//!
//! Training is compilation too: [`luminal::autograd`] adds the backward graph (each primop's
//! gradient rule lives in the core next to its semantics), an [`Optimizer`] adds the update
//! graph, and the runtime keeps parameters and optimizer state from one run to the next.
//!
//! ```
//! use luminal::prelude::*;
//! use luminal_training::{loss, Sgd, TrainOptions, TrainStep, Trainer};
//! let cx = Graph::new();
//! let (x, y) = (cx.tensor("x", (4, 1)), cx.tensor("y", (4, 1)));
//! let w = cx.tensor("w", (1, 1));
//! let l = loss::mse(x.matmul(w), y, loss::Reduction::Mean);
//! let step = TrainStep::build(&[w], l, &Sgd::default(), TrainOptions::default());
//! let rt = cx.compile(ReferenceBackend, CompileOptions::default()).unwrap();
//! let mut t = Trainer::new(rt, step).unwrap();
//! t.runtime.set(x, &[1f32, 2., 3., 4.]).unwrap();
//! t.runtime.set(y, &[2f32, 4., 6., 8.]).unwrap();
//! t.runtime.set(w, &[0f32]).unwrap();
//! for _ in 0..50 {
//!     t.step(0.05).unwrap();
//! }
//! assert!((t.state_value(w).unwrap()[0] - 2.0).abs() < 1e-3);
//! ```

pub mod data;
pub mod digits;
pub mod init;
pub mod loss;
pub mod optim;
pub mod schedule;
mod train;

pub use loss::{CrossEntropy, KlReduction, Reduction};
pub use optim::{
    clip_grad_norm, Adam, Lion, Optimizer, OptimizerInputs, RmsProp, Sgd, StateUpdate,
};
pub use schedule::{Constant, Cosine, OneCycle, Schedule, StepDecay, WarmupCosine};
pub use train::{LossScale, StateMode, TrainOptions, TrainStep, Trainer};

/// Errors of the training driver (runtime, checkpoint files).
#[derive(Debug, thiserror::Error)]
pub enum TrainingError {
    #[error(transparent)]
    Runtime(#[from] luminal::LuminalError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("checkpoint format: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("the tensor is not a parameter or optimizer state of this training step")]
    NotState,
    #[error("data set: {0}")]
    Data(String),
    #[error("no step has run yet: the state lives in the runtime only after a step")]
    NoStepYet,
}
