//! The error type of model loading and running.

use crate::chat::ChatError;
use crate::sampling::SamplingError;
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
        "context is full: {needed} tokens needed but the context holds {max} (load the model with a larger context: `LoadOptions::max_ctx`)"
    )]
    ContextFull { needed: usize, max: usize },
    /// An input is longer than the model reads (its position table or configured maximum).
    #[error("input {index} has {tokens} tokens, more than the model's maximum of {max} (shorten it, or set `EmbedOptions::truncate`)")]
    InputTooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    /// The model produced NaN or infinite logits: its weights are corrupt or its
    /// activations overflowed. `during` names the step (`"the prompt"`, `"decode step 3"`,
    /// `"window 2"`); `position` is the token position whose logits were bad.
    #[error("the model produced non-finite logits ({value}) during {during}, at position {position}: its weights are corrupt or its activations overflowed")]
    NonFiniteLogits {
        during: String,
        position: usize,
        value: f32,
    },
    /// A sampling option is out of range.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// A chat template failed to compile or render.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// An option (of generation, a chat or a session) is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    #[error("{0}")]
    Other(String),
}
