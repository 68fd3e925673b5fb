//! Whisper speech recognition: the audio front-end ([`audio`]: WAV samples → 16 kHz →
//! log-mel windows), the encoder–decoder from a Hugging Face folder ([`WhisperModel`]) and
//! greedy decoding without timestamps.

pub mod audio;
mod config;
mod model;

pub use config::{GenerationConfig, WhisperConfig};
pub use model::{TranscribeOptions, WhisperModel};
