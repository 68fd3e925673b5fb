//! `luminal chat`: an interactive conversation on the terminal.
//!
//! Each line read from stdin is a user message; the answer streams to stdout. The
//! conversation's KV cache is kept between turns (only the new turn is prefilled) and its
//! oldest turns are dropped when the context is full (the system message stays): see
//! `luminal_models::session::Chat`. `/clear` forgets the conversation, `/exit` (or end of
//! input) ends it. After each answer one line on stderr says why it stopped and how fast.

use crate::common::{load_model, CliResult, Device};
use crate::generate::describe_stop;
use clap::Args;
use luminal_models::generate::GenerateOptions;
use luminal_models::sampling::SamplerConfig;
use luminal_models::session::Chat;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// GGUF file or Hugging Face folder
    #[arg(short, long)]
    model: PathBuf,
    /// System message (kept when old turns are dropped)
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
    /// Sampling temperature; 0 = greedy
    #[arg(long, default_value_t = 0.7, allow_negative_numbers = true)]
    temperature: f32,
    /// Keep the K most likely tokens; 0 = off
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold; 1 = off
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// Repetition penalty; 1 = off
    #[arg(long, default_value_t = 1.1, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// Seed of the sampler
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// Context size in tokens (the whole conversation)
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
}

pub fn run(args: ChatArgs) -> CliResult {
    let sampler = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..Default::default()
    };
    sampler.validate()?;
    let (model, tok) = load_model(
        &args.model,
        args.device,
        args.threads,
        args.ctx,
        luminal_models::LoadOptions::default().cache_type,
    )?;
    let mut chat = Chat::new(model, tok)?;
    chat.set_system(args.system.clone());
    let opts = GenerateOptions {
        max_new_tokens: args.n_predict,
        sampler,
        ..Default::default()
    };
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chatting with {} (/clear forgets, /exit ends)",
            args.model.display()
        );
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            write!(out, "> ")?;
            out.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let message = line.trim();
        match message {
            "" => continue,
            "/exit" | "/quit" => break,
            "/clear" => {
                chat.clear();
                eprintln!("[conversation cleared]");
                continue;
            }
            _ => {}
        }
        let mut write_error: Option<std::io::Error> = None;
        let reply = chat.send(message, &opts, |piece| {
            if write_error.is_none() {
                if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                    write_error = Some(e);
                }
            }
        })?;
        if let Some(e) = write_error {
            return Err(e.into());
        }
        writeln!(out)?;
        out.flush()?;
        let g = &reply.generation;
        let mut note = format!(
            "[stopped: {} | {} tokens, {:.1} tok/s | prompt {} tokens, {} reused from the cache",
            describe_stop(&g.stats.stop_reason, &[]),
            g.stats.generated_tokens,
            g.stats.gen_tok_per_s(),
            reply.prompt_tokens,
            g.reused_tokens
        );
        if reply.dropped_messages > 0 {
            note += &format!(
                " | context full: dropped the {} oldest message(s)",
                reply.dropped_messages
            );
        }
        eprintln!("{note}]");
    }
    Ok(())
}
