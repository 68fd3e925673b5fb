//! Whisper (speech recognition): the audio front-end ([`audio`]). The encoder–decoder
//! model is not built yet.

pub mod audio;
