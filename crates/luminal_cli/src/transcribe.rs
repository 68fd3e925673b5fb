//! `luminal transcribe`: speech to text with a Whisper model (Hugging Face folder), greedy
//! decoding or beam search over 30-second windows; with `--timestamps`, one line per
//! segment, `[start --> end] text`.

use crate::common::{CliError, CliResult, Device, MatmulPrecisionArg};
use clap::Args;
use luminal_io::read_wav;
use luminal_models::whisper::audio::{resample, SAMPLE_RATE};
use luminal_models::whisper::{TranscribeOptions, WhisperModel};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TranscribeArgs {
    /// Whisper folder in the Hugging Face layout (config.json, model.safetensors,
    /// tokenizer.json, generation_config.json)
    #[arg(short, long)]
    model: PathBuf,
    /// WAV file (16-bit PCM, any sample rate, mono or multi-channel)
    audio: PathBuf,
    /// Language code of multilingual models (en, de, fr, …)
    #[arg(long, default_value = "en")]
    language: String,
    /// Translate to English instead of transcribing (multilingual models)
    #[arg(long)]
    translate: bool,
    /// Most tokens per 30-second window
    #[arg(long, default_value_t = 224)]
    max_tokens: usize,
    /// Beams (1: greedy decoding; more: beam search, patience 1, length penalty 1)
    #[arg(long, default_value_t = 1)]
    beam_size: usize,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// Precision of the CPU's f32 matrix products (PyTorch's float32 matmul precision)
    #[arg(long, value_enum, default_value_t = MatmulPrecisionArg::Highest)]
    matmul_precision: MatmulPrecisionArg,
    /// Predict timestamps: one line per segment, `[start --> end] text` (seconds)
    #[arg(long)]
    timestamps: bool,
    /// Print load and transcription times and the real-time factor on stderr
    #[arg(long)]
    timings: bool,
}

pub fn run(args: TranscribeArgs) -> CliResult {
    if args.threads == Some(0) {
        return Err(CliError::msg("--threads must be at least 1"));
    }
    if !args.model.is_dir() {
        return Err(CliError::msg(format!(
            "model folder not found: {}",
            args.model.display()
        )));
    }
    let audio = read_wav(&args.audio)?;
    let samples = resample(&audio.samples, audio.sample_rate, SAMPLE_RATE);
    args.device.require_cpu("transcribe")?;
    let backend = crate::common::cpu_backend(args.threads, args.matmul_precision);
    let load_start = std::time::Instant::now();
    let (mut model, tok) = WhisperModel::load(&args.model, backend)?;
    let load = load_start.elapsed().as_secs_f64();
    let opts = TranscribeOptions {
        language: args.language.clone(),
        task: if args.translate {
            "translate".into()
        } else {
            "transcribe".into()
        },
        max_new_tokens: args.max_tokens,
        beam_size: args.beam_size.max(1),
        timestamps: args.timestamps,
    };
    let start = std::time::Instant::now();
    let text = if args.timestamps {
        model
            .transcribe_segments(&tok, &samples, &opts)?
            .iter()
            .map(|s| format!("[{:.2} --> {:.2}] {}", s.start, s.end, s.text))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        model.transcribe(&tok, &samples, &opts)?
    };
    let secs = start.elapsed().as_secs_f64();
    if args.timings {
        let duration = audio.duration();
        eprintln!(
            "load {load:.3} s, audio {duration:.2} s, transcription {secs:.3} s, real-time factor {:.4}",
            secs / duration
        );
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}
