//! `luminal perplexity`: perplexity of a text file, `perplexity: X` as the last line.

use crate::common::{load_model, CliError, CliResult, Device};
use clap::Args;
use luminal_models::generate::{perplexity_llama_cpp, perplexity_with_progress};
use luminal_models::Model;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// GGUF file or Hugging Face folder
    #[arg(short, long)]
    model: PathBuf,
    /// Text file to score
    #[arg(short, long)]
    file: PathBuf,
    /// Window size in tokens (non-overlapping windows; each starts from an empty context)
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// Which tokens are scored: `luminal` = every token of each window after its first;
    /// `llama-cpp` = llama-perplexity's protocol (BOS prefix, whole chunks only, second half
    /// of each chunk scored), so that the numbers compare with llama.cpp's
    #[arg(long, value_enum, default_value_t = Protocol::Luminal)]
    protocol: Protocol,
    /// KV-cache element type: f16 (default), f32, or a quantized block type (q8_0, q5_1, q5_0, q4_1, q4_0)
    #[arg(long, default_value_t = luminal_models::LoadOptions::default().cache_type)]
    cache_type: luminal_models::CacheType,
}

/// The token-scoring protocol of `luminal perplexity`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Luminal,
    LlamaCpp,
}

pub fn run(args: PerplexityArgs) -> CliResult {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| CliError::msg(format!("cannot read {}: {e}", args.file.display())))?;
    if args.ctx < 2 {
        return Err(CliError::msg(format!(
            "--ctx must be at least 2, got {}",
            args.ctx
        )));
    }
    let (mut model, tok) = load_model(
        &args.model,
        args.device,
        args.threads,
        args.ctx,
        args.cache_type,
    )?;
    if args.ctx > model.max_ctx() {
        return Err(CliError::msg(format!(
            "--ctx {} exceeds the model's context length of {} tokens",
            args.ctx,
            model.max_ctx()
        )));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_error = None;
    let start = std::time::Instant::now();
    let progress = |w: usize, n: usize, ppl: f64| {
        if write_error.is_none() {
            if let Err(e) = writeln!(out, "[{w}/{n}] running perplexity {ppl:.4}") {
                write_error = Some(e);
            }
        }
    };
    let result = match args.protocol {
        Protocol::Luminal => perplexity_with_progress(&mut model, &tok, &text, args.ctx, progress)?,
        Protocol::LlamaCpp => perplexity_llama_cpp(&mut model, &tok, &text, args.ctx, progress)?,
    };
    if let Some(e) = write_error {
        return Err(e.into());
    }
    let secs = start.elapsed().as_secs_f64();
    writeln!(
        out,
        "tokens: {}, windows: {} of up to {} tokens, scored: {}, mean NLL: {:.6}, {:.1} tok/s",
        result.n_tokens,
        result.n_windows,
        args.ctx,
        result.n_scored,
        result.mean_nll,
        result.n_scored as f64 / secs.max(1e-9)
    )?;
    writeln!(out, "perplexity: {:.6}", result.ppl)?;
    out.flush()?;
    Ok(())
}
