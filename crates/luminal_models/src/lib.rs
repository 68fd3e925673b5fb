//! # luminal_models
//!
//! Real models on the Luminal graph: the Llama family (Llama 2/3/3.2, SmolLM/SmolLM2,
//! Mistral, Qwen2) loaded from a GGUF file or a Hugging Face folder, with sampling, chat
//! templates, and conversations that keep their KV cache between turns ([`session`]); BERT
//! encoders and sentence-transformers embedding models ([`bert`]); Whisper speech
//! recognition ([`whisper`]).

pub mod bert;
pub mod chat;
pub mod config;
pub mod error;
pub mod finetune;
pub mod generate;
pub mod llama;
pub mod model;
pub mod sampling;
pub mod session;
pub mod whisper;

pub use bert::{BertConfig, BertModel, EmbedOptions};
pub use config::LlamaConfig;
pub use error::{ModelError, Result};
pub use generate::{
    generate, perplexity, GenerateOptions, Generation, GenerationStats, PerplexityResult,
    StopReason,
};
pub use llama::{LlamaModel, LoadOptions};
pub use luminal_io::Tokenizer;
pub use luminal_nn::CacheType;
pub use model::Model;
pub use session::{Chat, ChatReply, Session};
