//! Text generation and perplexity on any loaded [`Model`].
//!
//! [`generate`] prefills a prompt, samples token by token and streams the decoded text,
//! stopping at an end-of-generation token, a stop string, a token budget, or a full context.
//! [`perplexity`] scores a text the way `luminal perplexity` (and
//! `scripts/gen_llama_fixtures.py`) does.
//!
//! ```no_run
//! use luminal_models::generate::{generate, GenerateOptions};
//! use luminal_models::{LlamaModel, LoadOptions};
//! # fn main() -> luminal_models::Result<()> {
//! // Any backend: here the reference one (a real program picks a fast backend).
//! let backend = luminal::ReferenceBackend;
//! let (mut model, tok) = LlamaModel::load("model.gguf", backend, &LoadOptions::default(), |_, _| {})?;
//! let prompt = tok.encode("Once upon a time", true)?;
//! let opts = GenerateOptions { max_new_tokens: 32, ..Default::default() };
//! let (ids, stats) = generate(&mut model, &tok, &prompt, &opts, |text| print!("{text}"))?;
//! eprintln!("{} tokens, {:.1} tok/s", ids.len(), stats.gen_tok_per_s());
//! # Ok(()) }
//! ```

use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::sampling::{Sampler, SamplerConfig};
use luminal_io::Tokenizer;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// What [`generate`] does.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// The most tokens to generate (the stop token, if any, is not counted).
    pub max_new_tokens: usize,
    /// How each token is picked (default: greedy).
    pub sampler: SamplerConfig,
    /// Generation ends when the text contains one of these; the stop string and anything
    /// after it are not emitted.
    pub stop_strings: Vec<String>,
    /// Record the log-probability of each generated token and of this many most likely
    /// alternatives ([`Generation::logprobs`]); `None` (the default) records nothing.
    pub logprobs: Option<usize>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 128,
            sampler: SamplerConfig::default(),
            stop_strings: Vec::new(),
            logprobs: None,
        }
    }
}

/// Why [`generate`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced this end-of-generation id (one of [`Tokenizer::stop_ids`]).
    StopToken(u32),
    /// The text reached the stop string with this index in
    /// [`GenerateOptions::stop_strings`].
    StopString(usize),
    /// `max_new_tokens` were generated.
    MaxTokens,
    /// The KV cache is full: no further token fits in the context.
    ContextFull,
    /// The caller's callback asked to stop ([`generate_from_cache`]).
    Cancelled,
    /// The chat template's end-of-turn text (when it is not a token) was reached
    /// ([`crate::session::Chat`]).
    EndOfTurn,
}

impl std::fmt::Display for StopReason {
    /// `end of text (token 2)`, `stop string 0`, `token limit`, `context full`, `cancelled`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::StopToken(id) => write!(f, "end of text (token {id})"),
            StopReason::StopString(i) => write!(f, "stop string {i}"),
            StopReason::MaxTokens => f.write_str("token limit"),
            StopReason::ContextFull => f.write_str("context full"),
            StopReason::Cancelled => f.write_str("cancelled"),
            StopReason::EndOfTurn => f.write_str("end of turn"),
        }
    }
}

/// Counts and timings of one [`generate`] call.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationStats {
    /// Tokens in the prompt (all prefilled in one forward pass).
    pub prompt_tokens: usize,
    /// Time of the prefill forward pass.
    pub prompt_time: Duration,
    /// Tokens generated (the ids returned; a stop token is not counted).
    pub generated_tokens: usize,
    /// Time from the end of the prefill to the end of generation: sampling plus one decode
    /// step per generated token that was fed back to the model.
    pub gen_time: Duration,
    /// Why generation ended.
    pub stop_reason: StopReason,
}

impl GenerationStats {
    /// Prefill speed in tokens per second (0 when nothing was timed).
    pub fn prompt_tok_per_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_time)
    }

    /// Generation speed in tokens per second (0 when nothing was timed).
    pub fn gen_tok_per_s(&self) -> f64 {
        rate(self.generated_tokens, self.gen_time)
    }
}

fn rate(tokens: usize, time: Duration) -> f64 {
    let s = time.as_secs_f64();
    if tokens == 0 || s <= 0.0 {
        0.0
    } else {
        tokens as f64 / s
    }
}

/// Holds back streamed text that could be the start of a stop string, so that a stop string
/// is never emitted, even when it arrives split over several tokens.
struct StopStringFilter<'a> {
    stops: &'a [String],
    pending: String,
}

impl<'a> StopStringFilter<'a> {
    fn new(stops: &'a [String]) -> Self {
        StopStringFilter {
            stops,
            pending: String::new(),
        }
    }

    /// Adds `text`; returns the text that is now safe to emit, and the index of the stop
    /// string when one has been reached (the text before it is returned; the rest dropped).
    fn push(&mut self, text: &str) -> (String, Option<usize>) {
        self.pending.push_str(text);
        // The earliest complete stop string wins (the longest one on a tie).
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, i, s.len())))
            .min_by_key(|&(at, _, len)| (at, std::cmp::Reverse(len)));
        if let Some((at, i, _)) = found {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, Some(i));
        }
        // Emit up to the earliest position whose suffix could still grow into a stop string.
        let hold_from = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let out = self.pending[..hold_from].to_string();
        self.pending.drain(..hold_from);
        (out, None)
    }

    /// The text still held back (no stop string followed it).
    fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Generates a continuation of `prompt_ids`, calling `on_text` with each piece of text as
/// soon as it is certain (whole UTF-8 characters, never part of a stop string).
///
/// The model's cache is reset and the whole prompt prefilled in one forward pass (an empty
/// prompt starts from BOS when the tokenizer has one). Each step samples a token from the
/// last logits with `opts.sampler` (history = prompt + generated ids, for the repetition
/// penalty). Generation stops:
/// - at any of [`Tokenizer::stop_ids`]: the stop token is neither emitted nor returned;
/// - when the text contains one of `opts.stop_strings`: the text before it is emitted, the
///   stop string is not; the returned ids include the token that completed it;
/// - after `opts.max_new_tokens` tokens;
/// - when the context is full (the prompt fitted but no further token does): not an error.
///
/// Special tokens are not printed (`stream_decoder(true)`). Returns the generated ids and
/// the statistics. A prompt longer than the context gives [`ModelError::ContextFull`];
/// NaN or infinite logits give [`ModelError::NonFiniteLogits`] naming the step.
/// [`crate::session::Session`] keeps the cache between calls instead.
pub fn generate<M: Model + ?Sized>(
    model: &mut M,
    tok: &Tokenizer,
    prompt_ids: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str),
) -> Result<(Vec<u32>, GenerationStats)> {
    model.reset();
    let prompt = start_ids(tok, prompt_ids)?;
    let g = generate_from_cache(model, tok, &prompt, &[], opts, |event| {
        if let GenerateEvent::Text(t) = event {
            on_text(t);
        }
        ControlFlow::Continue(())
    })?;
    Ok((g.ids, g.stats))
}

/// `prompt_ids`, or `[BOS]` when it is empty; an error when it is empty and there is no BOS.
pub(crate) fn start_ids(tok: &Tokenizer, prompt_ids: &[u32]) -> Result<Vec<u32>> {
    match (prompt_ids.is_empty(), tok.bos_id()) {
        (false, _) => Ok(prompt_ids.to_vec()),
        (true, Some(bos)) => Ok(vec![bos]),
        (true, None) => Err(ModelError::InvalidOption(
            "the prompt is empty and the tokenizer has no BOS token to start from".into(),
        )),
    }
}

/// What the callback of [`generate_from_cache`] receives, in order.
#[derive(Debug)]
pub enum GenerateEvent<'a> {
    /// A token was sampled (a stop token included), with its log-probability when
    /// [`GenerateOptions::logprobs`] asks for them.
    Token {
        id: u32,
        logprob: Option<&'a TokenLogprob>,
    },
    /// Text that is now certain (see [`generate`]).
    Text(&'a str),
}

/// The log-probability of a sampled token under the model's logits (log-softmax of the raw
/// logits, before temperature and filtering), and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The `n` most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// The result of [`generate_from_cache`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated ids (as [`generate`] returns them).
    pub ids: Vec<u32>,
    /// Counts, timings and the stop reason.
    pub stats: GenerationStats,
    /// One entry per generated id when [`GenerateOptions::logprobs`] is set, else empty.
    pub logprobs: Vec<TokenLogprob>,
    /// Prompt tokens that were already in the cache and not fed again
    /// ([`crate::session::Session`]; 0 otherwise).
    pub reused_tokens: usize,
}

/// Generates a continuation without resetting the model: `new_ids` are fed at positions
/// `model.pos()..` (after the `history` already in the cache, which the repetition penalty
/// sees), then tokens are sampled as in [`generate`]. `on_event` gets each sampled token and
/// each certain piece of text; returning [`ControlFlow::Break`] stops generation with
/// [`StopReason::Cancelled`]. `new_ids` must not be empty unless `max_new_tokens` is 0.
pub fn generate_from_cache<M: Model + ?Sized>(
    model: &mut M,
    tok: &Tokenizer,
    new_ids: &[u32],
    history: &[u32],
    opts: &GenerateOptions,
    on_event: impl FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
) -> Result<Generation> {
    generate_core(model, tok, Start::Feed(new_ids), history, opts, on_event).map(|(g, _)| g)
}

/// How [`generate_core`] gets the logits of its first step.
pub(crate) enum Start<'a> {
    /// Feed these ids (the prompt's uncached suffix).
    Feed(&'a [u32]),
    /// The cache already holds the whole prompt and these are its last logits.
    Logits(Vec<f32>),
}

/// [`generate_from_cache`], also returning the logits the first token was sampled from.
pub(crate) fn generate_core<M: Model + ?Sized>(
    model: &mut M,
    tok: &Tokenizer,
    start: Start<'_>,
    history: &[u32],
    opts: &GenerateOptions,
    mut on_event: impl FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
) -> Result<(Generation, Vec<f32>)> {
    let new_ids: &[u32] = match &start {
        Start::Feed(ids) => ids,
        Start::Logits(_) => &[],
    };
    opts.sampler.validate()?;
    let mut stats = GenerationStats {
        prompt_tokens: new_ids.len(),
        prompt_time: Duration::ZERO,
        generated_tokens: 0,
        gen_time: Duration::ZERO,
        stop_reason: StopReason::MaxTokens,
    };
    let done = |ids, stats| Generation {
        ids,
        stats,
        logprobs: Vec::new(),
        reused_tokens: 0,
    };
    if opts.max_new_tokens == 0 {
        return Ok((done(Vec::new(), stats), Vec::new()));
    }
    if new_ids.is_empty() && matches!(start, Start::Feed(_)) {
        return Err(ModelError::InvalidOption(
            "generation needs at least one new token to feed".into(),
        ));
    }
    if model.pos() + new_ids.len() > model.max_ctx() {
        return Err(ModelError::ContextFull {
            needed: model.pos() + new_ids.len(),
            max: model.max_ctx(),
        });
    }

    let prefill_start = Instant::now();
    let mut logits = match start {
        Start::Logits(logits) => logits,
        Start::Feed(ids) => {
            let mut logits = Vec::new();
            model.forward_into(ids, 1, &mut logits)?;
            check_finite(&logits, || "the prompt".to_string(), model.pos() - 1)?;
            logits
        }
    };
    let first_logits = logits.clone();
    stats.prompt_time = prefill_start.elapsed();

    let gen_start = Instant::now();
    let stop_ids = tok.stop_ids();
    let mut sampler = Sampler::new(opts.sampler);
    let mut decoder = tok.stream_decoder(true);
    let mut filter = StopStringFilter::new(&opts.stop_strings);
    let mut history: Vec<u32> = history.iter().chain(new_ids).copied().collect();
    let mut generated = Vec::new();
    let mut logprobs = Vec::new();
    let mut stop_reason = StopReason::MaxTokens;
    let mut stopped_early = false;
    loop {
        let next = sampler.sample(&logits, &history)?;
        let lp = opts.logprobs.map(|n| token_logprob(&logits, next, n));
        let flow = on_event(GenerateEvent::Token {
            id: next,
            logprob: lp.as_ref(),
        });
        if stop_ids.contains(&next) {
            stop_reason = StopReason::StopToken(next);
            break;
        }
        generated.push(next);
        history.push(next);
        logprobs.extend(lp);
        if flow.is_break() {
            stop_reason = StopReason::Cancelled;
            stopped_early = true;
            break;
        }
        if let Some(text) = decoder.push(next)? {
            let (out, hit) = filter.push(&text);
            if !out.is_empty() && on_event(GenerateEvent::Text(&out)).is_break() {
                stop_reason = StopReason::Cancelled;
                stopped_early = true;
                break;
            }
            if let Some(i) = hit {
                stop_reason = StopReason::StopString(i);
                stopped_early = true;
                break;
            }
        }
        if generated.len() >= opts.max_new_tokens {
            break;
        }
        if model.pos() >= model.max_ctx() {
            stop_reason = StopReason::ContextFull;
            break;
        }
        model.forward_into(&[next], 1, &mut logits)?;
        check_finite(
            &logits,
            || format!("decode step {}", generated.len()),
            model.pos() - 1,
        )?;
    }
    if !stopped_early {
        let mut rest = String::new();
        if let Some(text) = decoder.flush()? {
            let (out, hit) = filter.push(&text);
            rest.push_str(&out);
            if let Some(i) = hit {
                stop_reason = StopReason::StopString(i);
            } else {
                rest.push_str(&filter.finish());
            }
        } else {
            rest.push_str(&filter.finish());
        }
        if !rest.is_empty() {
            // The end of the text: a cancellation here changes nothing.
            let _ = on_event(GenerateEvent::Text(&rest));
        }
    }
    stats.gen_time = gen_start.elapsed();
    stats.generated_tokens = generated.len();
    stats.stop_reason = stop_reason;
    let g = Generation {
        ids: generated,
        stats,
        logprobs,
        reused_tokens: 0,
    };
    Ok((g, first_logits))
}

/// [`ModelError::NonFiniteLogits`] when a logit of `logits` is NaN or infinite.
fn check_finite(logits: &[f32], during: impl FnOnce() -> String, position: usize) -> Result<()> {
    match logits.iter().find(|x| !x.is_finite()) {
        None => Ok(()),
        Some(&value) => Err(ModelError::NonFiniteLogits {
            during: during(),
            position,
            value,
        }),
    }
}

/// The log-softmax of `logits` at `id`, and its `n` largest entries.
fn token_logprob(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let log_sum = max as f64
        + logits
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln();
    let lp = |x: f32| (x as f64 - log_sum) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if top.len() < n || x > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, y)| y >= x);
                top.insert(at, (i as u32, x));
                top.truncate(n);
            }
        }
    }
    TokenLogprob {
        id,
        logprob: lp(logits[id as usize]),
        top: top.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    }
}

/// The result of [`perplexity`].
#[derive(Clone, Debug, PartialEq)]
pub struct PerplexityResult {
    /// `exp(mean_nll)`.
    pub ppl: f64,
    /// Mean negative log-likelihood (nats) over the scored tokens.
    pub mean_nll: f64,
    /// Tokens in the text (tokenized without BOS).
    pub n_tokens: usize,
    /// Tokens scored (every token of a window but its first).
    pub n_scored: usize,
    /// Windows evaluated.
    pub n_windows: usize,
}

/// The perplexity of `text` with windows of `ctx` tokens: see [`perplexity_with_progress`].
pub fn perplexity<M: Model + ?Sized>(
    model: &mut M,
    tok: &Tokenizer,
    text: &str,
    ctx: usize,
) -> Result<PerplexityResult> {
    perplexity_with_progress(model, tok, text, ctx, |_, _, _| {})
}

/// The perplexity of `text`, by the protocol of `luminal perplexity`:
/// tokenize the whole text without BOS (`encode(text, false)`), split it into non-overlapping
/// windows of `ctx` tokens (a last partial window is kept if it has at least 2 tokens), run
/// each window from an empty cache and score every token after its first given the earlier
/// tokens of the window (log-softmax in f64); `ppl = exp(mean NLL)` over all scored tokens.
///
/// `progress(window, n_windows, running_ppl)` is called after each window (1-based).
/// Errors if `ctx < 2`, if `ctx` exceeds the model's context, or if nothing can be scored.
pub fn perplexity_with_progress<M: Model + ?Sized>(
    model: &mut M,
    tok: &Tokenizer,
    text: &str,
    ctx: usize,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<PerplexityResult> {
    check_ppl_ctx(model, ctx, 2, "perplexity")?;
    let ids = tok.encode(text, false)?;
    let windows: Vec<&[u32]> = ids.chunks(ctx).filter(|w| w.len() >= 2).collect();
    if windows.is_empty() {
        return Err(ModelError::InvalidOption(format!(
            "the text has {} token(s): at least 2 are needed to compute a perplexity",
            ids.len()
        )));
    }
    let (mut nll_sum, mut n_scored) = (0f64, 0usize);
    let mut logits = Vec::new();
    for (w, window) in windows.iter().enumerate() {
        // Logits of every position but the last predict the next token of the window.
        let n = window.len() - 1;
        nll_sum += score(model, &window[..n], n, &window[1..], &mut logits)?;
        n_scored += n;
        progress(w + 1, windows.len(), (nll_sum / n_scored as f64).exp());
    }
    model.reset();
    Ok(ppl_result(nll_sum, n_scored, ids.len(), windows.len()))
}

/// The context checks of the perplexity protocols: `ctx ≥ min` and within the model.
fn check_ppl_ctx<M: Model + ?Sized>(model: &M, ctx: usize, min: usize, what: &str) -> Result<()> {
    if ctx < min {
        return Err(ModelError::InvalidOption(format!(
            "{what} needs a context of at least {min} tokens, got {ctx}"
        )));
    }
    if ctx > model.max_ctx() {
        return Err(ModelError::ContextFull {
            needed: ctx,
            max: model.max_ctx(),
        });
    }
    Ok(())
}

/// Runs `input` from an empty cache and returns the summed NLL of `targets` under the
/// logits of its last `n_out` positions (row `i` predicts `targets[i]`).
fn score<M: Model + ?Sized>(
    model: &mut M,
    input: &[u32],
    n_out: usize,
    targets: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    model.reset();
    model.forward_into(input, n_out, logits)?;
    let vocab = model.vocab_size();
    if let Some(bad) = logits.iter().position(|x| !x.is_finite()) {
        return Err(ModelError::NonFiniteLogits {
            during: "scoring".into(),
            position: input.len() - n_out + bad / vocab,
            value: logits[bad],
        });
    }
    Ok(logits
        .chunks_exact(vocab)
        .zip(targets)
        .map(|(row, &t)| token_nll(row, t as usize))
        .sum())
}

fn ppl_result(
    nll_sum: f64,
    n_scored: usize,
    n_tokens: usize,
    n_windows: usize,
) -> PerplexityResult {
    let mean_nll = nll_sum / n_scored as f64;
    PerplexityResult {
        ppl: mean_nll.exp(),
        mean_nll,
        n_tokens,
        n_scored,
        n_windows,
    }
}

/// The perplexity of `text` by `llama-perplexity`'s protocol, so that the two programs'
/// numbers compare directly: tokenize the whole text with the model's special prefix
/// (`encode(text, true)`: BOS where the model adds one), cut it into `len / ctx` whole
/// chunks of `ctx` tokens (a last partial chunk is dropped), put BOS in place of each
/// chunk's first token when the model adds BOS, run each chunk from an empty cache and
/// score only its second half: the logits at positions `ctx/2 .. ctx-2` predict the tokens
/// after them. `ppl = exp(mean NLL)`. Errors if the text has fewer than `2·ctx` tokens (as
/// llama-perplexity does).
///
/// `progress(chunk, n_chunks, running_ppl)` is called after each chunk (1-based).
pub fn perplexity_llama_cpp<M: Model + ?Sized>(
    model: &mut M,
    tok: &Tokenizer,
    text: &str,
    ctx: usize,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<PerplexityResult> {
    check_ppl_ctx(model, ctx, 4, "the llama.cpp perplexity protocol")?;
    let ids = tok.encode(text, true)?;
    if ids.len() < 2 * ctx {
        return Err(ModelError::InvalidOption(format!(
            "the text has {} token(s): the llama.cpp protocol needs at least {} (2 × ctx)",
            ids.len(),
            2 * ctx
        )));
    }
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    let (n_chunks, first) = (ids.len() / ctx, ctx / 2);
    let (mut nll_sum, mut n_scored) = (0f64, 0usize);
    let mut chunk = Vec::with_capacity(ctx);
    let mut logits = Vec::new();
    for c in 0..n_chunks {
        chunk.clear();
        chunk.extend_from_slice(&ids[c * ctx..(c + 1) * ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        // Positions `first .. ctx - 2` predict tokens `first + 1 .. ctx - 1`.
        let n = ctx - 1 - first;
        nll_sum += score(
            model,
            &chunk[..ctx - 1],
            n,
            &chunk[first + 1..],
            &mut logits,
        )?;
        n_scored += n;
        progress(c + 1, n_chunks, (nll_sum / n_scored as f64).exp());
    }
    model.reset();
    Ok(ppl_result(nll_sum, n_scored, ids.len(), n_chunks))
}

/// `-log_softmax(row)[target]`, computed in f64.
pub fn token_nll(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - row[target] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, Option<usize>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopStringFilter::new(&stops);
        let mut out = String::new();
        for c in chunks {
            let (text, hit) = f.push(c);
            out.push_str(&text);
            if hit.is_some() {
                return (out, hit);
            }
        }
        out.push_str(&f.finish());
        (out, None)
    }

    #[test]
    fn stop_string_split_over_chunks_is_never_emitted() {
        assert_eq!(
            run(&["</s>"], &["ab<", "/", "s>cd"]),
            ("ab".into(), Some(0))
        );
        assert_eq!(run(&["STOP"], &["xST", "OP"]), ("x".into(), Some(0)));
        assert_eq!(run(&["STOP"], &["STOP"]), ("".into(), Some(0)));
    }

    #[test]
    fn held_back_prefix_is_released_when_it_does_not_match() {
        assert_eq!(run(&["</s>"], &["a<", "b"]), ("a<b".into(), None));
        assert_eq!(run(&["</s>"], &["a</"]), ("a</".into(), None));
    }

    #[test]
    fn held_back_text_is_emitted_as_soon_as_it_is_safe() {
        let stops = vec!["abc".to_string()];
        let mut f = StopStringFilter::new(&stops);
        assert_eq!(f.push("xxab"), ("xx".into(), None));
        assert_eq!(f.push("x"), ("abx".into(), None));
    }

    #[test]
    fn earliest_stop_string_wins_and_multibyte_text_is_not_split() {
        assert_eq!(
            run(&["world", "lo"], &["héllo world"]),
            ("hél".into(), Some(1))
        );
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".into(), None));
    }

    #[test]
    fn token_nll_is_log_softmax() {
        let row = [1.0f32, 2.0, 3.0];
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        assert!((token_nll(&row, 0) - (z.ln() - 1.0)).abs() < 1e-12);
    }
}
