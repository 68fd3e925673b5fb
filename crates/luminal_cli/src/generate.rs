//! `luminal generate`: stream a completion to stdout, statistics to stderr.

use crate::common::{load_model, CliError, CliResult, Device};
use clap::Args;
use luminal_models::generate::{generate, GenerateOptions, StopReason};
use luminal_models::sampling::SamplerConfig;
use luminal_models::session::{encode_prompt, Chat};
use luminal_models::Model;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// GGUF file or Hugging Face folder (config.json + safetensors + tokenizer.json)
    #[arg(short, long)]
    model: PathBuf,
    /// The prompt (with --chat, the user message); `-` reads it from stdin
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// Read the prompt from this file (instead of --prompt)
    #[arg(short, long, conflicts_with = "prompt")]
    file: Option<PathBuf>,
    /// Most tokens to generate
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature; 0 = greedy
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Keep the K most likely tokens; 0 = off
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling threshold; 1 = off
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Drop tokens below min-p × the top probability; 0 = off
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_p: f32,
    /// Repetition penalty; 1 = off
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Seed of the sampler
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Apply the model's chat template (ChatML if it has none) to the prompt as the user
    /// message, and answer as the assistant
    #[arg(long)]
    chat: bool,
    /// System message for --chat
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Stop when the text contains this string (may be repeated)
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// KV-cache element type: f16 (default), f32, or a quantized block type (q8_0, q5_1, q5_0, q4_1, q4_0)
    #[arg(long, default_value_t = luminal_models::LoadOptions::default().cache_type)]
    cache_type: luminal_models::CacheType,
    /// Context size in tokens (prompt + generation)
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
    /// Do not print the prompt before the completion (the prompt is never printed with --chat)
    #[arg(long)]
    no_echo: bool,
    /// Print the generated token ids on stderr at the end
    #[arg(long)]
    print_ids: bool,
}

pub fn run(args: GenerateArgs) -> CliResult {
    let sampler = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed: args.seed,
    };
    sampler.validate()?;
    let prompt = read_prompt(&args.prompt, args.file.as_deref())?;
    let (model, tok) = load_model(
        &args.model,
        args.device,
        args.threads,
        args.ctx,
        args.cache_type,
    )?;
    let opts = GenerateOptions {
        max_new_tokens: args.n_predict,
        sampler,
        stop_strings: args.stop.clone(),
        logprobs: None,
    };

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_error: Option<std::io::Error> = None;
    let mut write = |piece: &str| {
        if write_error.is_none() {
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                write_error = Some(e);
            }
        }
    };
    let load_time = model.stats().load_time;
    let (ids, stats) = if args.chat {
        // The library applies the template, BOS and the end-of-turn stop.
        let mut chat = Chat::new(model, tok)?;
        chat.set_system(args.system.clone());
        let reply = chat.send(&prompt, &opts, &mut write)?;
        // The process ends next: the OS takes the model's memory back at once, where
        // dropping it (graph, kernels, tokenizer: ~10⁵ allocations) takes ~15 ms.
        std::mem::forget(chat);
        (reply.generation.ids, reply.generation.stats)
    } else {
        let mut model = model;
        let prompt_ids = encode_prompt(&tok, &prompt)?;
        if prompt_ids.len() > model.max_ctx() {
            return Err(luminal_models::ModelError::ContextFull {
                needed: prompt_ids.len(),
                max: model.max_ctx(),
            }
            .into());
        }
        if !args.no_echo {
            write(&prompt);
        }
        let generated = generate(&mut model, &tok, &prompt_ids, &opts, &mut write)?;
        // As above: the OS frees the model and tokenizer faster than their destructors.
        std::mem::forget((model, tok));
        generated
    };
    write("\n");
    if let Some(e) = write_error {
        return Err(e.into());
    }

    if args.print_ids {
        eprintln!("generated ids: {ids:?}");
    }
    eprintln!("stopped: {}", describe_stop(&stats.stop_reason, &args.stop));
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | load: {:.2} s",
        stats.prompt_tokens,
        stats.prompt_tok_per_s(),
        stats.generated_tokens,
        stats.gen_tok_per_s(),
        load_time.as_secs_f64()
    );
    Ok(())
}

/// Why generation stopped, for people: `end of text (token 2)`, `stop string "###"`,
/// `token limit (-n 128)`, `context full (--ctx)`.
pub fn describe_stop(reason: &StopReason, stops: &[String]) -> String {
    match reason {
        StopReason::StopString(i) => match stops.get(*i) {
            Some(s) => format!("stop string {s:?}"),
            None => reason.to_string(),
        },
        StopReason::MaxTokens => "token limit (-n)".into(),
        StopReason::ContextFull => "context full (raise --ctx)".into(),
        other => other.to_string(),
    }
}

/// The prompt: `--file PATH`, or `--prompt -` for stdin, else the `--prompt` text.
pub fn read_prompt(prompt: &str, file: Option<&Path>) -> CliResult<String> {
    if let Some(path) = file {
        return std::fs::read_to_string(path)
            .map_err(|e| CliError::msg(format!("cannot read {}: {e}", path.display())));
    }
    if prompt == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::msg(format!("cannot read the prompt from stdin: {e}")))?;
        return Ok(text);
    }
    Ok(prompt.to_string())
}
