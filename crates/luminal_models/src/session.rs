//! Generation that keeps the KV cache between calls: [`Session`] (prompt caching) and
//! [`Chat`] (a conversation under the model's chat template).
//!
//! A [`Session`] remembers which tokens its model's cache holds. Each call feeds only the
//! part of the new prompt that differs from them: the longest common prefix stays in the
//! cache ([`Model::truncate`] drops the rest; a model that cannot truncate is reset and
//! re-fed). A [`Chat`] renders the whole conversation with the template on every turn, so
//! the new turn is the only suffix that is prefilled; when the conversation no longer fits
//! in the context, its oldest turns are dropped (the system message is kept); the turns after
//! the system message then move to new positions, so they are prefilled again once (the
//! cache is not re-rotated in place).
//!
//! ```no_run
//! use luminal_models::generate::GenerateOptions;
//! use luminal_models::session::Chat;
//! use luminal_models::{LlamaModel, LoadOptions};
//! # fn main() -> luminal_models::Result<()> {
//! let backend = luminal::ReferenceBackend;
//! let (model, tok) = LlamaModel::load("model.gguf", backend, &LoadOptions::default(), |_, _| {})?;
//! let mut chat = Chat::new(model, tok)?;
//! chat.set_system(Some("You are terse.".into()));
//! let opts = GenerateOptions { max_new_tokens: 64, ..Default::default() };
//! let reply = chat.send("What is the capital of France?", &opts, |t| print!("{t}"))?;
//! eprintln!("\n[{}; {} tokens reused]", reply.generation.stats.stop_reason, reply.generation.reused_tokens);
//! let reply = chat.send("And of Italy?", &opts, |t| print!("{t}"))?; // prefills this turn only
//! # Ok(()) }
//! ```

use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::{ModelError, Result};
use crate::generate::{
    generate_core, generate_from_cache, start_ids, GenerateEvent, GenerateOptions, Generation,
    Start,
};
use crate::model::Model;
use luminal_io::Tokenizer;
use std::ops::ControlFlow;

/// Tokenizes a prompt the way the model expects: with its special prefix (BOS where the
/// model adds one). A text that already starts with the BOS text (as many chat templates
/// write it) does not get a second BOS.
pub fn encode_prompt(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(text, true)?;
    if let Some(bos) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

/// The text that ends a turn under `template` when it is not one of the model's tokens (so
/// that generation can only stop at it as a stop string); `None` when it is a token (the
/// tokenizer's stop ids catch it) or empty.
pub fn end_of_turn_text(template: &ChatTemplate, tok: &Tokenizer) -> Option<String> {
    let eot = template.eos_token();
    (!eot.is_empty() && tok.token_to_id(eot).is_none()).then(|| eot.to_string())
}

/// A model, its tokenizer, and the tokens its KV cache holds.
pub struct Session<M> {
    model: M,
    tok: Tokenizer,
    cached: Vec<u32>,
    /// The length of the last prompt and the logits its prefill gave: a repeat of that
    /// prompt starts from them, so it is computed exactly as the first time (same tokens,
    /// same seed, same answer) without feeding any token.
    prompt_logits: Option<(usize, Vec<f32>)>,
}

impl<M: Model> Session<M> {
    /// A session over `model` (its cache is reset).
    pub fn new(mut model: M, tok: Tokenizer) -> Self {
        model.reset();
        Session {
            model,
            tok,
            cached: Vec::new(),
            prompt_logits: None,
        }
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The tokens in the model's cache, in order.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Empties the cache.
    pub fn forget(&mut self) {
        self.model.reset();
        self.cached.clear();
        self.prompt_logits = None;
    }

    /// The model and the tokenizer.
    pub fn into_parts(self) -> (M, Tokenizer) {
        (self.model, self.tok)
    }

    /// Generates a continuation of `prompt_ids` exactly as [`crate::generate::generate`]
    /// would from an empty cache (same ids for the same options), but prefills only the
    /// tokens after the longest prefix of `prompt_ids` already in the cache
    /// ([`Generation::reused_tokens`] of them are reused; `stats.prompt_tokens` counts the
    /// ones fed). `on_event` is as in [`generate_from_cache`]. After an error the cache is
    /// emptied.
    pub fn generate(
        &mut self,
        prompt_ids: &[u32],
        opts: &GenerateOptions,
        on_event: impl FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let prompt = start_ids(&self.tok, prompt_ids)?;
        if prompt.len() > self.model.max_ctx() {
            return Err(ModelError::ContextFull {
                needed: prompt.len(),
                max: self.model.max_ctx(),
            });
        }
        if opts.max_new_tokens == 0 {
            return generate_from_cache(&mut self.model, &self.tok, &[], &[], opts, on_event);
        }
        // A repeat of the last prompt (still cached): start from its saved logits.
        if let Some((len, logits)) = &self.prompt_logits {
            let repeat = *len == prompt.len() && self.cached.get(..*len) == Some(&prompt[..]);
            if repeat && self.model.truncate(*len) {
                self.cached.truncate(*len);
                let start = Start::Logits(logits.clone());
                return self.finish(prompt, *len, start, opts, on_event);
            }
        }
        let mut keep = self
            .cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // The last prompt token is always fed: its logits pick the first new token.
        keep = keep.min(prompt.len() - 1);
        if keep < self.model.pos() && !self.model.truncate(keep) {
            self.model.reset();
            keep = 0;
        }
        self.cached.truncate(keep);
        self.finish(
            prompt.clone(),
            keep,
            Start::Feed(&prompt[keep..]),
            opts,
            on_event,
        )
    }

    /// Runs the generation after the first `keep` prompt tokens (already in the cache) and
    /// records what the cache now holds.
    fn finish(
        &mut self,
        prompt: Vec<u32>,
        keep: usize,
        start: Start<'_>,
        opts: &GenerateOptions,
        on_event: impl FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let result = generate_core(
            &mut self.model,
            &self.tok,
            start,
            &prompt[..keep],
            opts,
            on_event,
        );
        match result {
            Ok((mut g, first_logits)) => {
                g.reused_tokens = keep;
                // The cache holds the prompt and every generated token that was fed back.
                let fed = self.model.pos();
                self.cached = prompt.iter().chain(&g.ids).copied().take(fed).collect();
                self.prompt_logits = Some((prompt.len(), first_logits));
                Ok(g)
            }
            Err(e) => {
                self.forget();
                Err(e)
            }
        }
    }
}

/// What [`Chat::send`] returns.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatReply {
    /// The assistant's answer (as streamed; now the last message of the conversation).
    pub text: String,
    /// The generated ids, statistics (with the stop reason) and log-probabilities.
    pub generation: Generation,
    /// Tokens of the rendered conversation (the prompt of this turn).
    pub prompt_tokens: usize,
    /// Messages dropped from the start of the conversation (after the system message) to
    /// make room in the context before this turn.
    pub dropped_messages: usize,
}

/// A conversation with a model: applies its chat template, keeps the KV cache between turns
/// (only the new turn is prefilled), and shifts the context when it is full.
pub struct Chat<M> {
    session: Session<M>,
    template: ChatTemplate,
    /// The template's end-of-turn text when it is not a single token (caught as text).
    end_of_turn_text: Option<String>,
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl<M: Model> Chat<M> {
    /// A conversation under the tokenizer's chat template ([`ChatTemplate::for_tokenizer`]:
    /// ChatML when the model ships none).
    pub fn new(model: M, tok: Tokenizer) -> Result<Self> {
        let template = ChatTemplate::for_tokenizer(&tok)?;
        Ok(Self::with_template(model, tok, template))
    }

    /// A conversation under `template`.
    pub fn with_template(model: M, tok: Tokenizer, template: ChatTemplate) -> Self {
        let end_of_turn_text = end_of_turn_text(&template, &tok);
        Chat {
            session: Session::new(model, tok),
            template,
            end_of_turn_text,
            system: None,
            turns: Vec::new(),
        }
    }

    /// Sets (or removes) the system message; it is never dropped by a context shift.
    pub fn set_system(&mut self, system: Option<String>) {
        self.system = system;
    }

    /// The conversation: the system message (if any), then the turns still in context.
    pub fn messages(&self) -> Vec<ChatMessage> {
        self.system
            .iter()
            .map(ChatMessage::system)
            .chain(self.turns.iter().cloned())
            .collect()
    }

    /// Forgets the turns (the system message stays).
    pub fn clear(&mut self) {
        self.turns.clear();
    }

    /// The session (model, tokenizer, cached tokens).
    pub fn session(&self) -> &Session<M> {
        &self.session
    }

    /// The template in use.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The rendered prompt of `messages`, tokenized, ending with the assistant's header.
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self.template.apply(messages, true)?;
        encode_prompt(&self.session.tok, &text)
    }

    /// Adds the user's message, streams the assistant's answer through `on_text` and adds
    /// it to the conversation. Generation stops at the model's end of turn (or the
    /// template's end-of-turn text), at `opts.stop_strings`, after `opts.max_new_tokens`, or
    /// when the context is full; [`ChatReply::generation`] says which.
    ///
    /// Before the turn, the oldest messages are dropped while the conversation plus room
    /// for `min(max_new_tokens, max_ctx / 2)` new tokens exceeds the context. When the
    /// system message and this message alone do not fit, [`ModelError::ContextFull`] is
    /// returned and the conversation is left as it was (as after any error).
    pub fn send(
        &mut self,
        user: &str,
        opts: &GenerateOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<ChatReply> {
        let max_ctx = self.session.model.max_ctx();
        let room = opts.max_new_tokens.min(max_ctx / 2).max(1);
        let before = self.turns.clone();
        self.turns.push(ChatMessage::user(user));
        let mut dropped = 0;
        let prompt = loop {
            let ids = match self.prompt_ids(&self.messages()) {
                Ok(ids) => ids,
                Err(e) => {
                    self.turns = before;
                    return Err(e);
                }
            };
            if ids.len() + room <= max_ctx {
                break ids;
            }
            if self.turns.len() == 1 {
                // Only this message is left: it may still fit with less room to answer.
                if ids.len() < max_ctx {
                    break ids;
                }
                self.turns = before;
                return Err(ModelError::ContextFull {
                    needed: ids.len() + 1,
                    max: max_ctx,
                });
            }
            // Drop the oldest exchange: a message and the replies up to the next user turn
            // (a conversation should start with the user after the system message).
            self.turns.remove(0);
            dropped += 1;
            while self.turns.len() > 1 && self.turns[0].role != "user" {
                self.turns.remove(0);
                dropped += 1;
            }
        };
        let mut gen_opts = opts.clone();
        gen_opts.stop_strings.extend(self.end_of_turn_text.clone());
        let mut text = String::new();
        let result = self.session.generate(&prompt, &gen_opts, |event| {
            if let GenerateEvent::Text(t) = event {
                text.push_str(t);
                on_text(t);
            }
            ControlFlow::Continue(())
        });
        match result {
            Ok(mut generation) => {
                // The template's end-of-turn text is not one of the caller's stop strings.
                if let crate::generate::StopReason::StopString(i) = generation.stats.stop_reason {
                    if i >= opts.stop_strings.len() {
                        generation.stats.stop_reason = crate::generate::StopReason::EndOfTurn;
                    }
                }
                self.turns.push(ChatMessage::assistant(&text));
                Ok(ChatReply {
                    text,
                    generation,
                    prompt_tokens: prompt.len(),
                    dropped_messages: dropped,
                })
            }
            Err(e) => {
                self.turns = before;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, StopReason};
    use crate::llama::{LlamaModel, LoadOptions};
    use luminal::ReferenceRuntime;
    use std::path::PathBuf;

    type Tiny = LlamaModel<ReferenceRuntime>;

    /// The tiny random Llama of the model tests (transformers' config and tokenizer, with
    /// a ChatML template), on the reference backend.
    fn tiny(max_ctx: usize) -> (Tiny, Tokenizer) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../luminal_model_tests/tests/fixtures/tiny-llama");
        LlamaModel::load(
            dir,
            luminal::ReferenceBackend,
            &LoadOptions {
                max_ctx,
                ..Default::default()
            },
            |_, _| {},
        )
        .unwrap()
    }

    fn opts(n: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: n,
            ..Default::default()
        }
    }

    /// Counts the tokens fed to the model.
    struct Counting<M> {
        inner: M,
        fed: usize,
        truncates: bool,
    }

    impl<M: Model> Model for Counting<M> {
        fn pos(&self) -> usize {
            self.inner.pos()
        }
        fn max_ctx(&self) -> usize {
            self.inner.max_ctx()
        }
        fn vocab_size(&self) -> usize {
            self.inner.vocab_size()
        }
        fn reset(&mut self) {
            self.inner.reset()
        }
        fn truncate(&mut self, pos: usize) -> bool {
            self.truncates && self.inner.truncate(pos)
        }
        fn forward_into(&mut self, t: &[u32], n_out: usize, l: &mut Vec<f32>) -> Result<()> {
            self.fed += t.len();
            self.inner.forward_into(t, n_out, l)
        }
    }

    fn fresh(prompt: &[u32], n: usize) -> Vec<u32> {
        let (mut m, tok) = tiny(256);
        generate(&mut m, &tok, prompt, &opts(n), |_| {}).unwrap().0
    }

    #[test]
    fn session_reuses_the_cached_prefix_and_matches_a_fresh_generate() {
        for truncates in [true, false] {
            let (m, tok) = tiny(256);
            let counting = Counting {
                inner: m,
                fed: 0,
                truncates,
            };
            let mut s = Session::new(counting, tok.clone());
            let p1 = encode_prompt(&tok, "Hello there, how are you").unwrap();
            let g1 = s
                .generate(&p1, &opts(6), |_| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(g1.ids, fresh(&p1, 6));
            assert_eq!(g1.reused_tokens, 0);
            // max_new_tokens stops before the last id is fed back.
            assert_eq!(s.cached_tokens().len(), p1.len() + 5);
            assert_eq!(s.model().fed, p1.len() + 5);

            // The conversation goes on: only the new suffix is fed.
            let mut p2 = p1.clone();
            p2.extend(&g1.ids);
            p2.extend(encode_prompt(&tok, " fine").unwrap().iter().skip(1));
            let before = s.model().fed;
            let g2 = s
                .generate(&p2, &opts(5), |_| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(g2.ids, fresh(&p2, 5));
            assert_eq!(g2.reused_tokens, p1.len() + 5);
            assert_eq!(g2.stats.prompt_tokens, p2.len() - g2.reused_tokens);
            assert_eq!(s.model().fed - before, p2.len() - (p1.len() + 5) + 4);

            // A prompt that diverges early: the cache is cut (or reset) at the divergence.
            let p3 = encode_prompt(&tok, "Hello there, who").unwrap();
            let common = p1.iter().zip(&p3).take_while(|(a, b)| a == b).count();
            let g3 = s
                .generate(&p3, &opts(4), |_| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(g3.ids, fresh(&p3, 4));
            assert_eq!(g3.reused_tokens, if truncates { common } else { 0 });

            // The same prompt again starts from its saved logits: nothing of it is fed (a
            // model that cannot truncate its cache starts over).
            let before = s.model().fed;
            let g4 = s
                .generate(&p3, &opts(4), |_| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(g4.ids, g3.ids);
            assert_eq!(g4.reused_tokens, if truncates { p3.len() } else { 0 });
            let fed_prompt = if truncates { 0 } else { p3.len() };
            assert_eq!(s.model().fed - before, fed_prompt + 3);

            // So a seeded sampled answer repeats exactly.
            let sampled = GenerateOptions {
                sampler: crate::sampling::SamplerConfig {
                    temperature: 1.0,
                    seed: 11,
                    ..Default::default()
                },
                ..opts(8)
            };
            let go = |s: &mut Session<_>| {
                s.generate(&p3, &sampled, |_| ControlFlow::Continue(()))
                    .unwrap()
                    .ids
            };
            let first = go(&mut s);
            assert_eq!(go(&mut s), first);
        }
    }

    #[test]
    fn chat_turns_prefill_only_the_new_turn_and_match_a_fresh_generate() {
        let (m, tok) = tiny(256);
        let mut chat = Chat::new(m, tok.clone()).unwrap();
        chat.set_system(Some("Be brief.".into()));
        let mut streamed = String::new();
        let r1 = chat
            .send("Hello there", &opts(6), |t| streamed.push_str(t))
            .unwrap();
        assert_eq!(streamed, r1.text);
        let want1 = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n";
        let p1 = encode_prompt(&tok, want1).unwrap();
        assert_eq!(r1.prompt_tokens, p1.len());
        assert_eq!(r1.generation.ids, fresh(&p1, 6));
        assert_eq!(r1.text, tok.decode(&r1.generation.ids, true).unwrap());

        let r2 = chat.send("Again", &opts(6), |_| {}).unwrap();
        let msgs = chat.messages();
        assert_eq!(msgs.len(), 5);
        assert_eq!(msgs[2], ChatMessage::assistant(&r1.text));
        let p2 = chat.prompt_ids(&msgs[..4]).unwrap();
        assert_eq!(r2.generation.ids, fresh(&p2, 6));
        // Most of the first turn stayed in the cache.
        assert!(r2.generation.reused_tokens >= p1.len(), "{r2:?}");
        assert_eq!(r2.dropped_messages, 0);
    }

    #[test]
    fn a_full_context_drops_the_oldest_turns_and_keeps_the_system_message() {
        let (m, tok) = tiny(64);
        let mut chat = Chat::new(m, tok.clone()).unwrap();
        chat.set_system(Some("Sys".into()));
        let mut dropped = 0;
        for i in 0..6 {
            let r = chat
                .send(&format!("turn number {i}"), &opts(8), |_| {})
                .unwrap();
            dropped += r.dropped_messages;
            let msgs = chat.messages();
            assert_eq!(msgs[0], ChatMessage::system("Sys"));
            assert_eq!(msgs[1].role, "user");
            assert_eq!(msgs[msgs.len() - 2].content, format!("turn number {i}"));
            // The reply is what a fresh run on the kept conversation gives.
            let p = chat.prompt_ids(&msgs[..msgs.len() - 1]).unwrap();
            assert!(p.len() + 8 <= 64);
            assert_eq!(r.generation.ids, fresh(&p, 8));
        }
        assert!(dropped >= 2, "{dropped}");

        // A message that cannot fit even alone is refused, and not added.
        let before = chat.messages();
        let long = "word ".repeat(100);
        let err = chat.send(&long, &opts(8), |_| {}).unwrap_err();
        assert!(matches!(err, ModelError::ContextFull { .. }), "{err}");
        assert_eq!(chat.messages(), before);
    }

    /// A model whose logits turn NaN at the `at`-th forward call.
    struct NanAt<M> {
        inner: M,
        calls: usize,
        at: usize,
    }

    impl<M: Model> Model for NanAt<M> {
        fn pos(&self) -> usize {
            self.inner.pos()
        }
        fn max_ctx(&self) -> usize {
            self.inner.max_ctx()
        }
        fn vocab_size(&self) -> usize {
            self.inner.vocab_size()
        }
        fn reset(&mut self) {
            self.inner.reset()
        }
        fn forward_into(&mut self, t: &[u32], n_out: usize, l: &mut Vec<f32>) -> Result<()> {
            self.inner.forward_into(t, n_out, l)?;
            if self.calls == self.at {
                l[7] = f32::NAN;
            }
            self.calls += 1;
            Ok(())
        }
    }

    #[test]
    fn non_finite_logits_stop_generation_naming_the_step() {
        let (m, tok) = tiny(256);
        let prompt = encode_prompt(&tok, "Hello").unwrap();
        let mut bad = NanAt {
            inner: m,
            calls: 0,
            at: 3,
        };
        let err = generate(&mut bad, &tok, &prompt, &opts(10), |_| {}).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, ModelError::NonFiniteLogits { during, position, value }
                if during == "decode step 3" && *position == prompt.len() + 2 && value.is_nan()),
            "{msg}"
        );
        assert!(
            msg.contains("non-finite logits (NaN) during decode step 3"),
            "{msg}"
        );

        let (m, _) = tiny(256);
        let mut bad = NanAt {
            inner: m,
            calls: 0,
            at: 0,
        };
        let err = generate(&mut bad, &tok, &prompt, &opts(10), |_| {}).unwrap_err();
        assert!(err.to_string().contains("during the prompt"), "{err}");
    }

    #[test]
    fn stop_reasons_and_logprobs() {
        let (m, tok) = tiny(256);
        let mut s = Session::new(m, tok.clone());
        let prompt = encode_prompt(&tok, "Hello there").unwrap();
        let o = GenerateOptions {
            logprobs: Some(3),
            ..opts(5)
        };
        let mut tokens = Vec::new();
        let g = s
            .generate(&prompt, &o, |e| {
                if let GenerateEvent::Token { id, logprob } = e {
                    tokens.push((id, logprob.cloned()));
                }
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(g.stats.stop_reason, StopReason::MaxTokens);
        assert_eq!(g.logprobs.len(), 5);
        // Independent check: log-softmax of the logits of a fresh teacher-forced run.
        let (mut m2, _) = tiny(256);
        let all: Vec<u32> = prompt.iter().chain(&g.ids).copied().collect();
        let logits = m2.logits_all(&all).unwrap();
        let vocab = m2.vocab_size();
        for (k, lp) in g.logprobs.iter().enumerate() {
            let row = &logits[(prompt.len() - 1 + k) * vocab..][..vocab];
            let want = -crate::generate::token_nll(row, g.ids[k] as usize);
            assert!(
                (lp.logprob as f64 - want).abs() < 1e-3,
                "{k}: {lp:?} vs {want}"
            );
            assert_eq!(lp.id, g.ids[k]);
            // Greedy: the sampled token is the most likely one.
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, g.ids[k]);
            assert!(lp.top[0].1 >= lp.top[1].1 && lp.top[1].1 >= lp.top[2].1);
            assert_eq!(tokens[k], (g.ids[k], Some(lp.clone())));
        }

        // Cancelling from the callback after two tokens.
        let mut n = 0;
        let g = s
            .generate(&prompt, &opts(10), |e| {
                if let GenerateEvent::Token { .. } = e {
                    n += 1;
                }
                if n == 2 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
        assert_eq!(g.stats.stop_reason, StopReason::Cancelled);
        assert_eq!(g.ids.len(), 2);
        assert_eq!(g.stats.stop_reason.to_string(), "cancelled");
    }
}
