//! Whisper's audio front-end: resampling to 16 kHz and the log-mel spectrogram, as
//! openai-whisper and transformers' `WhisperFeatureExtractor` compute it.
//!
//! Features of one 30-second window: the samples padded with zeros (or cut) to 480 000,
//! a short-time Fourier transform (400-point periodic Hann window, hop 160, reflect
//! padding of 200 at both ends, FFT by `rustfft`), the power spectrum through a Slaney mel
//! filter bank (0–8 kHz, 80 or 128 filters), `log10(max(mel, 1e-10))`, clamped to 8 below
//! the window's maximum and mapped by `(x + 4) / 4`: `[n_mels, 3000]`, the last STFT frame
//! dropped.

use rustfft::num_complex::Complex;
use rustfft::FftPlanner;

/// Whisper's sample rate.
pub const SAMPLE_RATE: u32 = 16_000;
/// FFT size (25 ms).
pub const N_FFT: usize = 400;
/// Hop between frames (10 ms).
pub const HOP_LENGTH: usize = 160;
/// Samples in one 30-second window.
pub const N_SAMPLES: usize = 30 * SAMPLE_RATE as usize;
/// Frames in one window.
pub const N_FRAMES: usize = N_SAMPLES / HOP_LENGTH;

/// Slaney's mel scale: linear below 1 kHz, logarithmic above.
fn hz_to_mel(f: f64) -> f64 {
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// Triangular Slaney-normalised mel filters, `[n_mels][N_FFT / 2 + 1]` (librosa's
/// `filters.mel(sr=16000, n_fft=400, n_mels, fmin=0, fmax=8000)`).
pub fn mel_filters(n_mels: usize) -> Vec<Vec<f32>> {
    assert!(n_mels > 0, "mel_filters: n_mels must be positive");
    let n_bins = N_FFT / 2 + 1;
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE as f64 / 2.0));
    let points: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let fft_freq = |k: usize| k as f64 * (SAMPLE_RATE as f64 / 2.0) / (n_bins - 1) as f64;
    (0..n_mels)
        .map(|m| {
            let (left, center, right) = (points[m], points[m + 1], points[m + 2]);
            let norm = 2.0 / (right - left);
            (0..n_bins)
                .map(|k| {
                    let f = fft_freq(k);
                    let down = (f - left) / (center - left);
                    let up = (right - f) / (right - center);
                    (down.min(up).max(0.0) * norm) as f32
                })
                .collect()
        })
        .collect()
}

/// Computes log-mel features of 30-second windows (filters and FFT plan made once).
pub struct LogMel {
    n_mels: usize,
    filters: Vec<Vec<f32>>,
    window: Vec<f32>,
    fft: std::sync::Arc<dyn rustfft::Fft<f32>>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel")
            .field("n_mels", &self.n_mels)
            .finish_non_exhaustive()
    }
}

impl LogMel {
    /// 80 mel bins (Whisper tiny … large-v2) or 128 (large-v3).
    pub fn new(n_mels: usize) -> LogMel {
        let window = (0..N_FFT)
            .map(|n| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos()) as f32
            })
            .collect();
        LogMel {
            n_mels,
            filters: mel_filters(n_mels),
            window,
            fft: FftPlanner::new().plan_fft_forward(N_FFT),
        }
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// Features of one window, row-major `[n_mels, N_FRAMES]`, from 16 kHz samples (padded
    /// with zeros to 30 s, or cut there).
    pub fn window_features(&self, samples: &[f32]) -> Vec<f32> {
        let mut padded = vec![0f32; N_SAMPLES];
        let n = samples.len().min(N_SAMPLES);
        padded[..n].copy_from_slice(&samples[..n]);
        // Reflect padding of N_FFT / 2 at both ends (numpy's "reflect": the edge sample is
        // not repeated).
        let half = N_FFT / 2;
        let mut x = Vec::with_capacity(N_SAMPLES + N_FFT);
        x.extend((1..=half).rev().map(|i| padded[i]));
        x.extend_from_slice(&padded);
        x.extend((1..=half).map(|i| padded[N_SAMPLES - 1 - i]));
        let n_bins = N_FFT / 2 + 1;
        let mut mel = vec![0f32; self.n_mels * N_FRAMES];
        let mut buf = vec![Complex::new(0f32, 0f32); N_FFT];
        let mut scratch = vec![Complex::new(0f32, 0f32); self.fft.get_inplace_scratch_len()];
        let mut power = vec![0f32; n_bins];
        for frame in 0..N_FRAMES {
            let start = frame * HOP_LENGTH;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = Complex::new(x[start + i] * self.window[i], 0.0);
            }
            self.fft.process_with_scratch(&mut buf, &mut scratch);
            for (p, c) in power.iter_mut().zip(&buf[..n_bins]) {
                *p = c.norm_sqr();
            }
            for (m, filter) in self.filters.iter().enumerate() {
                let e: f32 = filter.iter().zip(&power).map(|(f, p)| f * p).sum();
                mel[m * N_FRAMES + frame] = e.max(1e-10).log10();
            }
        }
        let max = mel.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        for v in &mut mel {
            *v = (v.max(max - 8.0) + 4.0) / 4.0;
        }
        mel
    }

    /// Features of every 30-second window of `samples` (16 kHz): one `[n_mels, N_FRAMES]`
    /// block per window, the last one zero-padded. Empty input gives one silent window.
    pub fn features(&self, samples: &[f32]) -> Vec<Vec<f32>> {
        if samples.is_empty() {
            return vec![self.window_features(&[])];
        }
        samples
            .chunks(N_SAMPLES)
            .map(|w| self.window_features(w))
            .collect()
    }
}

/// Resamples `samples` from `from` Hz to `to` Hz with a windowed-sinc (Blackman-windowed,
/// 32 zero crossings each side) low-pass at the lower Nyquist frequency; output sample `n`
/// is at time `n / to` (no delay). Returns the input when the rates are equal.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Vec<f32> {
    assert!(from > 0 && to > 0, "resample: rates must be positive");
    if from == to || samples.is_empty() {
        return samples.to_vec();
    }
    let ratio = to as f64 / from as f64;
    let cutoff = ratio.min(1.0); // relative to the input's Nyquist frequency
    const ZEROS: f64 = 32.0;
    let half_width = ZEROS / cutoff; // in input samples
    let n_out = ((samples.len() as f64) * ratio).round() as usize;
    (0..n_out)
        .map(|n| {
            let t = n as f64 / ratio; // position in input samples
            let first = (t - half_width).ceil().max(0.0) as usize;
            let last = ((t + half_width).floor() as usize).min(samples.len() - 1);
            let mut acc = 0f64;
            for (k, &s) in samples.iter().enumerate().take(last + 1).skip(first) {
                let x = k as f64 - t;
                let arg = x * cutoff;
                let sinc = if arg.abs() < 1e-12 {
                    1.0
                } else {
                    (std::f64::consts::PI * arg).sin() / (std::f64::consts::PI * arg)
                };
                // Blackman window over [-half_width, half_width].
                let w = 0.42
                    + 0.5 * (std::f64::consts::PI * x / half_width).cos()
                    + 0.08 * (2.0 * std::f64::consts::PI * x / half_width).cos();
                acc += s as f64 * sinc * cutoff * w;
            }
            acc as f32
        })
        .collect()
}
