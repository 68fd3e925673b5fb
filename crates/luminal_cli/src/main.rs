//! `luminal`: run Llama-family models (GGUF files or Hugging Face folders) and BERT /
//! sentence-transformers embedding models from the command line.
//!
//! - `luminal generate`: stream a completion (or a chat answer with `--chat`);
//! - `luminal chat`: an interactive conversation (the KV cache is kept between turns);
//! - `luminal serve`: an OpenAI-compatible HTTP server (`/v1/completions`,
//!   `/v1/chat/completions`, `/v1/models`, with streaming);
//! - `luminal embed`: sentence embeddings (and their cosine similarities);
//! - `luminal transcribe`: speech to text with Whisper;
//! - `luminal perplexity`: perplexity of a text file over non-overlapping windows;
//! - `luminal bench`: prefill / decode speed, like llama-bench;
//! - `luminal bench-embed`: embedding throughput (sentences/s) of a BERT folder;
//! - `luminal inspect`: metadata, tensors and parameter count of a model file.
//!
//! Errors print one line, `error: <message>`, on stderr and exit with code 1; command-line
//! mistakes are reported by clap (exit code 2).

mod api;
mod bench;
mod bench_embed;
mod chat;
mod common;
mod embed;
mod generate;
mod inspect;
mod perplexity;
mod serve;
mod transcribe;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "luminal",
    version,
    about = "Run Llama-family models (GGUF or Hugging Face folders) BERT embedding and Whisper speech models on the Luminal CPU backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout
    Generate(generate::GenerateArgs),
    /// Chat with a model on the terminal (one line per message; the answer streams)
    Chat(chat::ChatArgs),
    /// Serve a model over an OpenAI-compatible HTTP API
    Serve(serve::ServeArgs),
    /// Speech to text with a Whisper model (greedy, no timestamps)
    Transcribe(transcribe::TranscribeArgs),
    /// Sentence embeddings from a BERT / sentence-transformers folder
    Embed(embed::EmbedArgs),
    /// Perplexity of a text file (non-overlapping windows of --ctx tokens)
    Perplexity(perplexity::PerplexityArgs),
    /// Prefill (pp) and decode (tg) speed, like llama-bench
    Bench(bench::BenchArgs),
    /// Encoder throughput (sentences/s) of an embedding model on a synthetic batch
    BenchEmbed(bench_embed::BenchEmbedArgs),
    /// Print a model file's metadata, tensors and parameter count
    Inspect(inspect::InspectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Transcribe(args) => transcribe::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchEmbed(args) => bench_embed::run(args),
        Command::Inspect(args) => inspect::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.one_line());
            ExitCode::FAILURE
        }
    }
}
