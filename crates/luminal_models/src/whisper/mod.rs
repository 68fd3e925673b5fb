//! Whisper speech recognition: the audio front-end ([`audio`]: WAV samples → 16 kHz →
//! log-mel windows), the encoder–decoder from a Hugging Face folder ([`WhisperModel`]),
//! greedy decoding and beam search, optionally with timestamps (segments).
//!
//! ```no_run
//! use luminal::prelude::*;
//! use luminal_models::whisper::{audio, TranscribeOptions, WhisperModel};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let wav = luminal_io::read_wav("speech.wav")?;
//! let samples = audio::resample(&wav.samples, wav.sample_rate, audio::SAMPLE_RATE);
//! let (mut model, tok) = WhisperModel::load("models/whisper-tiny.en", ReferenceBackend)?;
//! println!("{}", model.transcribe(&tok, &samples, &TranscribeOptions::default())?);
//! # Ok(()) }
//! ```

pub mod audio;
mod config;
mod model;

pub use config::{GenerationConfig, WhisperConfig};
pub use model::{Segment, TranscribeOptions, WhisperModel};
