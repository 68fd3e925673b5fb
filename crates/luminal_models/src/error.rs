//! The error type of model loading and running.

use luminal::LuminalError;
use luminal_io::IoError;

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Reading the model file, its metadata or its tokenizer failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// Compiling or running the graph failed.
    #[error(transparent)]
    Graph(#[from] LuminalError),
    /// The file describes a model this crate does not build.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The configuration (GGUF metadata or config.json) is missing a value or is inconsistent.
    #[error("bad model configuration: {0}")]
    Config(String),
    /// A weight is missing or has the wrong shape.
    #[error("weight {name}: {what}")]
    Weight { name: String, what: String },
    /// The tokens would not fit in the context the model was loaded with.
    #[error(
        "context is full: {needed} tokens needed but the context holds {max} (use a larger --ctx)"
    )]
    ContextFull { needed: usize, max: usize },
    /// An input is longer than the model reads (its position table or configured maximum).
    #[error("input {index} has {tokens} tokens, more than the model's maximum of {max} (truncate it, e.g. `--truncate`)")]
    InputTooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("{0}")]
    Other(String),
}
