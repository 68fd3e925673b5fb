//! `luminal generate`: stream a completion to stdout, statistics to stderr.

use crate::common::{load_model, CliError, CliResult, Device};
use clap::Args;
use luminal_models::chat::{ChatMessage, ChatTemplate};
use luminal_models::generate::{generate, GenerateOptions};
use luminal_models::sampling::SamplerConfig;
use luminal_models::Model;
use luminal_models::Tokenizer;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// GGUF file or Hugging Face folder (config.json + safetensors + tokenizer.json)
    #[arg(short, long)]
    model: PathBuf,
    /// The prompt (with --chat, the user message)
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
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
    let (mut model, tok) = load_model(&args.model, args.device, args.threads, args.ctx)?;

    let mut stop_strings = args.stop.clone();
    let text = if args.chat {
        let (template, eos_text) = chat_template(&tok)?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::system(system));
        }
        messages.push(ChatMessage::user(&args.prompt));
        // A template's end-of-turn text that is not one of the model's tokens can only be
        // caught as text.
        if !eos_text.is_empty() && tok.token_to_id(&eos_text).is_none() {
            stop_strings.push(eos_text);
        }
        template.apply(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let prompt_ids = encode_prompt(&tok, &text)?;
    if prompt_ids.len() > model.max_ctx() {
        return Err(luminal_models::ModelError::ContextFull {
            needed: prompt_ids.len(),
            max: model.max_ctx(),
        }
        .into());
    }

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if !args.chat && !args.no_echo {
        out.write_all(args.prompt.as_bytes())?;
        out.flush()?;
    }
    let opts = GenerateOptions {
        max_new_tokens: args.n_predict,
        sampler,
        stop_strings,
    };
    let mut write_error: Option<std::io::Error> = None;
    let (ids, stats) = generate(&mut model, &tok, &prompt_ids, &opts, |piece| {
        if write_error.is_none() {
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                write_error = Some(e);
            }
        }
    })?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    out.write_all(b"\n")?;
    out.flush()?;

    if args.print_ids {
        eprintln!("generated ids: {ids:?}");
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | load: {:.2} s",
        stats.prompt_tokens,
        stats.prompt_tok_per_s(),
        stats.generated_tokens,
        stats.gen_tok_per_s(),
        model.stats.load_time.as_secs_f64()
    );
    Ok(())
}

/// The tokenizer's chat template (ChatML when it has none) and the end-of-turn text the
/// template writes.
fn chat_template(tok: &Tokenizer) -> CliResult<(ChatTemplate, String)> {
    let token_text = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id)).unwrap_or_default();
    match tok.chat_template() {
        Some(src) => {
            let eos = token_text(tok.eos_id());
            let template = ChatTemplate::new(src, &token_text(tok.bos_id()), &eos)?;
            Ok((template, eos))
        }
        None => {
            let template = ChatTemplate::chatml();
            let eos = template.eos_token().to_string();
            Ok((template, eos))
        }
    }
}

/// Tokenizes the prompt with special tokens (BOS as the model asks); a template that writes
/// the BOS text itself does not get a second BOS.
fn encode_prompt(tok: &Tokenizer, text: &str) -> CliResult<Vec<u32>> {
    let mut ids = tok.encode(text, true)?;
    if let Some(bos) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    if ids.is_empty() && tok.bos_id().is_none() {
        return Err(CliError::msg(
            "the prompt is empty (and the model has no BOS token to start from)",
        ));
    }
    Ok(ids)
}
