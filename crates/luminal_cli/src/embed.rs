//! `luminal embed`: sentence embeddings from a BERT / sentence-transformers folder, one per
//! text in input order (plain text or JSON), and with two or more texts their cosine
//! similarity matrix.

use crate::common::{CliError, CliResult, Device, MatmulPrecisionArg};
use clap::Args;
use luminal_models::bert::{cosine_similarity, BertModel, EmbedOptions};
use std::io::Write;
use std::path::PathBuf;

/// How `luminal embed` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedFormat {
    /// One line per embedding, then the cosine-similarity matrix (two or more texts)
    Text,
    /// A JSON list of float lists, in input order
    Json,
}

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Hugging Face / sentence-transformers folder (config.json, model.safetensors,
    /// tokenizer.json, modules.json, …)
    #[arg(short, long)]
    model: PathBuf,
    /// A text to embed (repeat for several)
    #[arg(long = "text")]
    texts: Vec<String>,
    /// A file with one text per line (empty lines skipped), embedded after the --text ones
    #[arg(short, long)]
    file: Option<PathBuf>,
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = EmbedFormat::Text)]
    output: EmbedFormat,
    /// Texts per batch (each batch is padded to its longest text)
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Cut texts longer than the model's maximum (as sentence-transformers does) instead of
    /// failing
    #[arg(long)]
    truncate: bool,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// Precision of the CPU's f32 matrix products (PyTorch's float32 matmul precision)
    #[arg(long, value_enum, default_value_t = MatmulPrecisionArg::Highest)]
    matmul_precision: MatmulPrecisionArg,
}

pub fn run(args: EmbedArgs) -> CliResult {
    let mut texts = args.texts.clone();
    if let Some(path) = &args.file {
        let content = std::fs::read_to_string(path)
            .map_err(|e| CliError::msg(format!("cannot read {}: {e}", path.display())))?;
        texts.extend(
            content
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if texts.is_empty() {
        return Err(CliError::msg(
            "no text to embed: give --text \"…\" (repeatable) or --file F",
        ));
    }
    if args.batch_size == 0 {
        return Err(CliError::msg("--batch-size must be at least 1"));
    }
    if args.threads == Some(0) {
        return Err(CliError::msg("--threads must be at least 1"));
    }
    if !args.model.exists() {
        return Err(CliError::msg(format!(
            "model folder not found: {}",
            args.model.display()
        )));
    }
    if !args.model.is_dir() {
        return Err(CliError::msg(format!(
            "--model must be a folder (config.json, model.safetensors, tokenizer.json), got {}",
            args.model.display()
        )));
    }
    args.device.require_cpu("embed")?;
    let backend = crate::common::cpu_backend(args.threads, args.matmul_precision);
    let (mut model, tok) = BertModel::load(&args.model, backend)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let opts = EmbedOptions {
        batch_size: args.batch_size,
        truncate: args.truncate,
    };
    let embeddings = model.embed(&tok, &refs, &opts)?;

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.output {
        EmbedFormat::Json => {
            writeln!(out, "{}", serde_json::to_string(&embeddings)?)?;
        }
        EmbedFormat::Text => {
            for (i, (text, e)) in texts.iter().zip(&embeddings).enumerate() {
                writeln!(
                    out,
                    "embedding {i} ({} values) of {}:",
                    e.len(),
                    preview(text)
                )?;
                let values: Vec<String> = e.iter().map(|v| format!("{v:.6}")).collect();
                writeln!(out, "{}", values.join(" "))?;
            }
            if texts.len() >= 2 {
                writeln!(out, "cosine similarity:")?;
                write!(out, "{:>6}", "")?;
                for j in 0..texts.len() {
                    write!(out, " {:>7}", format!("[{j}]"))?;
                }
                writeln!(out)?;
                for (i, a) in embeddings.iter().enumerate() {
                    write!(out, "{:>6}", format!("[{i}]"))?;
                    for b in &embeddings {
                        write!(out, " {:>7.4}", cosine_similarity(a, b))?;
                    }
                    writeln!(out)?;
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// The text quoted, shortened to 60 characters.
fn preview(text: &str) -> String {
    let mut short: String = text.chars().take(60).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    format!("{short:?}")
}
