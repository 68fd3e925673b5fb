//! `luminal bench-embed`: encoder throughput (sentences/s) of a BERT / sentence-transformers
//! folder on a synthetic batch of `--batch` sequences of exactly `--tokens` tokens.

use crate::common::{effective_threads, CliError, CliResult, Device, MatmulPrecisionArg};
use clap::Args;
use luminal_models::bert::BertModel;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchEmbedArgs {
    /// Hugging Face / sentence-transformers folder
    #[arg(short, long)]
    model: PathBuf,
    /// Sequences per run
    #[arg(short, long, default_value_t = 32)]
    batch: usize,
    /// Tokens per sequence ([CLS] and [SEP] included)
    #[arg(short = 'n', long, default_value_t = 128)]
    tokens: usize,
    /// Timed runs (after one warm-up run)
    #[arg(short, long, default_value_t = 5)]
    repetitions: usize,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// Precision of the CPU's f32 matrix products (PyTorch's float32 matmul precision)
    #[arg(long, value_enum, default_value_t = MatmulPrecisionArg::Highest)]
    matmul_precision: MatmulPrecisionArg,
    /// Print one JSON object instead of a line of text
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchEmbedArgs) -> CliResult {
    if args.batch == 0 || args.tokens < 2 || args.repetitions == 0 {
        return Err(CliError::msg(
            "--batch and --repetitions must be at least 1, --tokens at least 2",
        ));
    }
    if args.threads == Some(0) {
        return Err(CliError::msg("--threads must be at least 1"));
    }
    args.device.require_cpu("bench-embed")?;
    let backend = crate::common::cpu_backend(args.threads, args.matmul_precision);
    let (mut model, tok) = BertModel::load(&args.model, backend)?;
    // [CLS] w … w [SEP] with ordinary word ids spread over the vocabulary (deterministic).
    let vocab = model.config().vocab_size as u32;
    let (cls, sep) = (
        tok.special_prefix().first().copied().unwrap_or(0),
        tok.special_suffix().last().copied().unwrap_or(0),
    );
    let ids: Vec<Vec<u32>> = (0..args.batch as u32)
        .map(|b| {
            let mut row = vec![cls];
            row.extend(
                (1..args.tokens as u32 - 1)
                    .map(|j| 1000 + (b * 7919 + j * 104_729) % (vocab - 1000).max(1)),
            );
            row.push(sep);
            row
        })
        .collect();
    model.forward(&ids, None)?; // warm-up
    let mut times = Vec::with_capacity(args.repetitions);
    for _ in 0..args.repetitions {
        let start = Instant::now();
        model.forward(&ids, None)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let threads = effective_threads(args.threads);
    let per_s = |t: f64| args.batch as f64 / t;
    if args.json {
        println!(
            "{}",
            json!({
                "batch": args.batch, "tokens": args.tokens, "threads": threads,
                "repetitions": args.repetitions, "best_s": best, "mean_s": mean,
                "sentences_per_s_best": per_s(best), "sentences_per_s_mean": per_s(mean),
            })
        );
    } else {
        println!(
            "batch {} x {} tokens, {threads} threads: best {:.3} s ({:.1} sentences/s), mean {:.3} s ({:.1} sentences/s) over {} runs",
            args.batch, args.tokens, best, per_s(best), mean, per_s(mean), args.repetitions
        );
    }
    Ok(())
}
