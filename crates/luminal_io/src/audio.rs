//! WAV audio (16-bit integer PCM, any rate and channel count) read with the `hound` crate,
//! mixed down to mono `f32` samples in `[-1, 1)`.
//!
//! Every malformed input is a typed [`IoError`]: a format other than 16-bit PCM
//! ([`IoError::UnsupportedWav`]), a broken header ([`IoError::MalformedWav`]), a data chunk
//! shorter than announced ([`IoError::TruncatedWav`]), no samples ([`IoError::EmptyWav`]).

use crate::error::{IoError, Result};
use crate::storage::os_error;
use std::io::Cursor;
use std::path::Path;

/// Decoded audio: mono samples (channels averaged) and their rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Audio {
    /// Mono samples, `i16 / 32768`.
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// Channels in the file (mixed into `samples`).
    pub channels: u16,
}

impl Audio {
    /// Duration in seconds.
    pub fn duration(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }
}

/// Reads a WAV file (see the module doc for the errors).
pub fn read_wav(path: impl AsRef<Path>) -> Result<Audio> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| os_error(path, e))?;
    wav_from_bytes(&bytes).map_err(|e| e.in_file(path))
}

fn hound_error(e: hound::Error) -> IoError {
    match e {
        hound::Error::Unsupported => IoError::UnsupportedWav {
            reason: "a WAV variant hound does not read".into(),
        },
        hound::Error::FormatError(what) => IoError::MalformedWav {
            reason: what.to_string(),
        },
        other => IoError::MalformedWav {
            reason: other.to_string(),
        },
    }
}

/// Decodes a WAV file held in memory.
pub fn wav_from_bytes(bytes: &[u8]) -> Result<Audio> {
    let mut reader = hound::WavReader::new(Cursor::new(bytes)).map_err(hound_error)?;
    let spec = reader.spec();
    if spec.sample_format != hound::SampleFormat::Int || spec.bits_per_sample != 16 {
        let kind = match spec.sample_format {
            hound::SampleFormat::Int => "integer",
            hound::SampleFormat::Float => "float",
        };
        return Err(IoError::UnsupportedWav {
            reason: format!(
                "{}-bit {kind} samples; only 16-bit integer PCM is read",
                spec.bits_per_sample
            ),
        });
    }
    if spec.channels == 0 || spec.sample_rate == 0 {
        return Err(IoError::MalformedWav {
            reason: format!("{} channels at {} Hz", spec.channels, spec.sample_rate),
        });
    }
    let expected = reader.len() as u64; // samples over all channels, from the header
    let mut interleaved = Vec::with_capacity(expected.min(bytes.len() as u64 / 2) as usize);
    for s in reader.samples::<i16>() {
        match s {
            Ok(v) => interleaved.push(v),
            // Reading from memory, an I/O error can only be the data running out.
            Err(hound::Error::IoError(_)) => break,
            Err(e) => return Err(hound_error(e)),
        }
    }
    let got = interleaved.len() as u64;
    if got < expected {
        return Err(IoError::TruncatedWav { expected, got });
    }
    if interleaved.is_empty() {
        return Err(IoError::EmptyWav);
    }
    let channels = spec.channels as usize;
    let scale = 1.0 / (32768.0 * channels as f32);
    let samples = interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().map(|&v| v as f32).sum::<f32>() * scale)
        .collect();
    Ok(Audio {
        samples,
        sample_rate: spec.sample_rate,
        channels: spec.channels,
    })
}
