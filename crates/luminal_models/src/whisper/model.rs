//! The Whisper encoder–decoder on the Luminal graph, from a Hugging Face folder.
//!
//! Two graphs, each compiled once: the **encoder** (`input_features [1, n_mels, 3000]` →
//! conv1d + GELU ×2 → positions → pre-norm transformer → the cross-attention keys and values
//! of every decoder layer, `[1, heads, 1500, head_dim]`), run once per 30-second window; the
//! **decoder** (tokens `[s]` at positions `p..p + s` → learned positions → pre-norm layers of
//! causal self-attention with a KV cache written in place, cross-attention to the window's
//! keys/values, feed-forward → logits of the last `n_out` tokens, tied to the token
//! embedding), run once per generated token.

use super::audio::{LogMel, N_FRAMES};
use super::config::{GenerationConfig, WhisperConfig};
use crate::error::{ModelError, Result};
use luminal::prelude::*;
use luminal_io::{IoError, SafetensorsModel, Tokenizer};
use luminal_nn::{
    attention, causal_attention, Conv1d, Conv1dOptions, Embedding, FeedForward, KvCache, LayerNorm,
    Linear, Module, MultiHeadAttention, PositionEmbedding,
};
use std::path::Path;

const EPS: f32 = 1e-5;

fn layer_norm<'g>(cx: &'g Graph, name: &str, d: usize) -> LayerNorm<'g> {
    LayerNorm::new(cx, name, d, true, true, EPS)
}

/// q/k/v/out projections with Whisper's biases (none on `k_proj`).
fn projections<'g>(cx: &'g Graph, prefix: &str, d: usize, heads: usize) -> MultiHeadAttention<'g> {
    let lin = |n: &str, bias| Linear::new(cx, &format!("{prefix}.{n}"), d, d, bias);
    MultiHeadAttention::from_projections(
        lin("q_proj", true),
        lin("k_proj", false),
        lin("v_proj", true),
        lin("out_proj", true),
        heads,
    )
}

fn feed_forward<'g>(
    cx: &'g Graph,
    prefix: &str,
    d: usize,
    ffn: usize,
    act: luminal_nn::Activation,
) -> FeedForward<'g> {
    FeedForward {
        fc1: Linear::new(cx, &format!("{prefix}.fc1"), d, ffn, true),
        fc2: Linear::new(cx, &format!("{prefix}.fc2"), ffn, d, true),
        activation: act,
    }
}

/// `[b, s, h·d]` → `[b, h, s, d]`.
fn split_heads<'g>(x: GraphTensor<'g>, heads: usize) -> GraphTensor<'g> {
    let s = x.shape();
    let d = s[2].as_constant().unwrap() as usize / heads;
    x.reshape(vec![
        s[0].clone(),
        s[1].clone(),
        Expression::from(heads),
        Expression::from(d),
    ])
    .permute(&[0, 2, 1, 3])
}

/// `[b, h, s, d]` → `[b, s, h·d]`.
fn merge_heads<'g>(x: GraphTensor<'g>) -> GraphTensor<'g> {
    let s = x.shape();
    let hd = s[1].as_constant().unwrap() * s[3].as_constant().unwrap();
    x.permute(&[0, 2, 1, 3])
        .reshape(vec![s[0].clone(), s[2].clone(), Expression::from(hd)])
}

/// Hands every parameter its tensor from the safetensors files (f32), checking shapes.
fn load_weights<R: Runtime>(
    rt: &mut R,
    params: &[GraphTensor],
    st: &SafetensorsModel,
) -> Result<usize> {
    let mut n = 0;
    for p in params {
        let name = luminal_nn::parameter_name(*p);
        let want: Vec<usize> = p
            .shape()
            .iter()
            .map(|e| e.as_constant().unwrap() as usize)
            .collect();
        let err = |what: String| ModelError::Weight {
            name: name.clone(),
            what,
        };
        let info = st
            .tensor_info(&name)
            .map_err(|_| err("missing from the safetensors files".into()))?;
        if info.shape() != want.as_slice() {
            return Err(err(format!(
                "has shape {:?}, expected {want:?}",
                info.shape()
            )));
        }
        let data = match p.dtype() {
            DType::F32 => HostData::F32(st.tensor_f32(&name)?),
            _ => st.tensor_data(&name)?,
        };
        if data.dtype() != p.dtype() {
            return Err(err(format!("is {}, expected {}", data.dtype(), p.dtype())));
        }
        n += data.len();
        rt.set_data(*p, data)?;
    }
    Ok(n)
}

/// The first index of the largest value (as `torch.argmax`); NaN never wins.
fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || x[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Makes the decoder's 2-D weight matrices that the file stores in f16/bf16 graph inputs of
/// that dtype (read in place through `.dequantize()`: half the memory traffic of the
/// per-token matrix-vector products, the tied output projection above all).
fn keep_half_matrices(cx: &Graph, st: &SafetensorsModel, c: &WhisperConfig) {
    let mut names = vec!["model.decoder.embed_tokens.weight".to_string()];
    for i in 0..c.decoder_layers {
        for m in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "encoder_attn.q_proj",
            "encoder_attn.out_proj",
            "fc1",
            "fc2",
        ] {
            names.push(format!("model.decoder.layers.{i}.{m}.weight"));
        }
    }
    for name in names {
        if let Ok(info) = st.tensor_info(&name) {
            match info.dtype() {
                luminal_io::Dtype::F16 => cx.set_tensor_dtype(&name, DType::F16),
                luminal_io::Dtype::BF16 => cx.set_tensor_dtype(&name, DType::BF16),
                _ => {}
            }
        }
    }
}

/// Options of [`WhisperModel::transcribe`].
#[derive(Clone, Debug)]
pub struct TranscribeOptions {
    /// Language token text without the brackets (`"en"`), for multilingual models.
    pub language: String,
    /// `"transcribe"` or `"translate"` (multilingual models).
    pub task: String,
    /// Most tokens generated per 30-second window.
    pub max_new_tokens: usize,
    /// 1: greedy; more: beam search with this many beams (patience 1, length penalty 1).
    pub beam_size: usize,
    /// Predict timestamps (segments with start and end times, see
    /// [`WhisperModel::transcribe_segments`]); off by default (`<|notimestamps|>`).
    pub timestamps: bool,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        TranscribeOptions {
            language: "en".into(),
            task: "transcribe".into(),
            max_new_tokens: 224,
            beam_size: 1,
            timestamps: false,
        }
    }
}

/// A stretch of transcribed speech (with [`TranscribeOptions::timestamps`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// Start time in seconds from the start of the audio.
    pub start: f32,
    /// End time in seconds.
    pub end: f32,
    /// The segment's text (surrounding spaces trimmed).
    pub text: String,
}

/// Seconds per timestamp token.
const TIMESTAMP_STEP: f32 = 0.02;
/// Seconds of audio per window.
const WINDOW_SECONDS: f32 = 30.0;

/// The timestamp rules of OpenAI's decoder (transformers' `WhisperTimeStampLogitsProcessor`),
/// applied after the suppression rules: `<|notimestamps|>` never; the first token is a
/// timestamp of at most `max_initial` steps; timestamps come in pairs (after a lone one,
/// no text; after a pair, no timestamp) except right before the end; they never decrease
/// (and a closed pair's time is not repeated); and when the timestamps together are more
/// likely than the likeliest text token, a timestamp it is.
#[derive(Clone, Copy, Debug)]
struct TimestampRules {
    no_timestamps: u32,
    /// The id of `<|0.00|>` (the one after `<|notimestamps|>`); every later id is one.
    begin: u32,
    eos: u32,
    max_initial: usize,
}

impl TimestampRules {
    fn apply(&self, logits: &mut [f32], generated: &[u32]) {
        let begin = self.begin as usize;
        let n = logits.len();
        if let Some(l) = logits.get_mut(self.no_timestamps as usize) {
            *l = f32::NEG_INFINITY;
        }
        let is_ts = |t: u32| t >= self.begin;
        let last = generated.last().is_some_and(|&t| is_ts(t));
        let penultimate = generated.len() < 2 || is_ts(generated[generated.len() - 2]);
        if last {
            if penultimate {
                logits[begin.min(n)..].fill(f32::NEG_INFINITY);
            } else {
                logits[..(self.eos as usize).min(n)].fill(f32::NEG_INFINITY);
            }
        }
        if let Some(&latest) = generated.iter().rev().find(|&&t| is_ts(t)) {
            let floor = if last && !penultimate {
                latest
            } else {
                latest + 1
            };
            logits[begin.min(n)..(floor as usize).min(n)].fill(f32::NEG_INFINITY);
        }
        if generated.is_empty() {
            logits[..begin.min(n)].fill(f32::NEG_INFINITY);
            logits[(begin + self.max_initial + 1).min(n)..].fill(f32::NEG_INFINITY);
        }
        // Total probability of the timestamps against the likeliest text token.
        let log_sum_exp = |xs: &[f32]| {
            let max = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                return f64::NEG_INFINITY;
            }
            max as f64
                + xs.iter()
                    .map(|&x| (x as f64 - max as f64).exp())
                    .sum::<f64>()
                    .ln()
        };
        let ts = log_sum_exp(&logits[begin.min(n)..]);
        let text_max = logits[..begin.min(n)]
            .iter()
            .cloned()
            .fold(f32::NEG_INFINITY, f32::max) as f64;
        // Both sides share log_softmax's normaliser, so it cancels.
        if ts > text_max {
            logits[..begin.min(n)].fill(f32::NEG_INFINITY);
        }
    }

    /// `ids` (one window's generated tokens) as segments, times offset by `offset` seconds;
    /// text outside a pair (a window cut mid-segment) ends at the window's end.
    fn segments(&self, tok: &Tokenizer, ids: &[u32], offset: f32) -> Result<Vec<Segment>> {
        let mut out = Vec::new();
        let mut start: Option<f32> = None;
        let mut text: Vec<u32> = Vec::new();
        for &t in ids {
            if t >= self.begin {
                let time = offset + (t - self.begin) as f32 * TIMESTAMP_STEP;
                match start.take() {
                    None => start = Some(time),
                    Some(s) => {
                        out.push(Segment {
                            start: s,
                            end: time,
                            text: tok.decode(&text, true)?.trim().to_string(),
                        });
                        text.clear();
                    }
                }
            } else {
                text.push(t);
            }
        }
        if !text.is_empty() {
            out.push(Segment {
                start: start.unwrap_or(offset),
                end: offset + WINDOW_SECONDS,
                text: tok.decode(&text, true)?.trim().to_string(),
            });
        }
        Ok(out)
    }
}

/// A compiled Whisper model on any backend's runtimes.
pub struct WhisperModel<R> {
    config: WhisperConfig,
    generation: GenerationConfig,
    mel: LogMel,
    encoder: R,
    decoder: R,
    features: TensorRef,
    /// The encoder's last hidden state `[1, 1500, d_model]`.
    states: TensorRef,
    /// Per decoder layer: the encoder-side outputs and the decoder-side inputs of the
    /// cross-attention keys and values.
    cross_out: Vec<(TensorRef, TensorRef)>,
    cross_in: Vec<(TensorRef, TensorRef)>,
    tokens: TensorRef,
    logits: TensorRef,
    caches: Vec<TensorRef>,
    pos: usize,
    /// The tokens whose keys/values the cache holds at positions `0..pos`.
    cached: Vec<u32>,
    pub parameters: usize,
}

impl<R> std::fmt::Debug for WhisperModel<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhisperModel")
            .field("config", &self.config)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> WhisperModel<R> {
    /// Loads a Hugging Face Whisper folder (config.json, model.safetensors, tokenizer.json,
    /// generation_config.json when present) and compiles its two graphs with `backend`.
    pub fn load<B: Backend<Runtime = R> + Clone>(
        dir: impl AsRef<Path>,
        backend: B,
    ) -> Result<(WhisperModel<R>, Tokenizer)> {
        let dir = dir.as_ref();
        for path in [dir.join("config.json"), dir.join("tokenizer.json")] {
            if !path.is_file() {
                return Err(IoError::NotFound { path }.into());
            }
        }
        let cfg_path = dir.join("config.json");
        let config = WhisperConfig::from_value(&crate::bert::read_json(&cfg_path)?)?;
        let generation = GenerationConfig::from_dir(dir)?;
        let tokenizer = Tokenizer::from_hf_dir(dir)?;
        let st = SafetensorsModel::load(dir)?;
        let model = Self::build(config, generation, &st, backend)?;
        Ok((model, tokenizer))
    }

    fn build<B: Backend<Runtime = R> + Clone>(
        config: WhisperConfig,
        generation: GenerationConfig,
        st: &SafetensorsModel,
        backend: B,
    ) -> Result<WhisperModel<R>> {
        let c = &config;
        let d = c.d_model;
        // ---- encoder ----
        let cx = Graph::new();
        let conv = |name: &str, cin, stride| {
            let o = Conv1dOptions {
                stride,
                padding: 1,
                ..Default::default()
            };
            Conv1d::new(&cx, &format!("model.encoder.{name}"), cin, d, 3, o)
        };
        let (conv1, conv2) = (conv("conv1", c.n_mels, 1), conv("conv2", d, 2));
        let enc_pos = PositionEmbedding::new(
            &cx,
            "model.encoder.embed_positions",
            c.max_source_positions,
            d,
        );
        let features = cx.input("input_features", (1, c.n_mels, N_FRAMES), DType::F32);
        let act = c.activation;
        let mut x = act.apply(conv2.forward(act.apply(conv1.forward(features))));
        x = x.permute(&[0, 2, 1]); // [1, 1500, d]
        x = enc_pos.forward(x);
        let mut params = conv1.parameters();
        params.extend(conv2.parameters());
        params.extend(enc_pos.parameters());
        for i in 0..c.encoder_layers {
            let p = format!("model.encoder.layers.{i}");
            let attn = projections(&cx, &format!("{p}.self_attn"), d, c.encoder_heads);
            let ln1 = layer_norm(&cx, &format!("{p}.self_attn_layer_norm"), d);
            let ffn = feed_forward(&cx, &p, d, c.encoder_ffn, act);
            let ln2 = layer_norm(&cx, &format!("{p}.final_layer_norm"), d);
            x = x + attn.forward_self(ln1.forward(x), None);
            x = x + ffn.forward(ln2.forward(x));
            params.extend(attn.parameters());
            params.extend(ln1.parameters());
            params.extend(ffn.parameters());
            params.extend(ln2.parameters());
        }
        let enc_norm = layer_norm(&cx, "model.encoder.layer_norm", d);
        let memory = enc_norm.forward(x);
        let states = memory.output();
        params.extend(enc_norm.parameters());
        let mut cross_out = Vec::new();
        for i in 0..c.decoder_layers {
            let p = format!("model.decoder.layers.{i}.encoder_attn");
            let k = Linear::new(&cx, &format!("{p}.k_proj"), d, d, false);
            let v = Linear::new(&cx, &format!("{p}.v_proj"), d, d, true);
            let ck = split_heads(k.forward(memory), c.decoder_heads).output();
            let cv = split_heads(v.forward(memory), c.decoder_heads).output();
            params.extend(k.parameters());
            params.extend(v.parameters());
            cross_out.push((ck.handle(), cv.handle()));
        }
        let mut encoder = cx.compile(backend.clone(), CompileOptions::default())?;
        let mut parameters = load_weights(&mut encoder, &params, st)?;
        let features = features.handle();

        // ---- decoder ----
        let cx = Graph::new();
        keep_half_matrices(&cx, st, c);
        let heads = c.decoder_heads;
        let head_dim = d / heads;
        let max_ctx = c.max_target_positions;
        let embed = Embedding::new(&cx, "model.decoder.embed_tokens", c.vocab_size, d);
        let dec_pos = PositionEmbedding::new(&cx, "model.decoder.embed_positions", max_ctx, d);
        let tokens = cx.input("tokens", ("s",), DType::I32);
        let (s, past) = (Expression::var("s"), Expression::var("p"));
        let mut h = embed.forward(tokens);
        if c.scale_embedding {
            h = h * (d as f32).sqrt();
        }
        let mut x = (h + dec_pos.positions(past.clone(), s.clone())).unsqueeze(0); // [1, s, d]
        let mut params = embed.parameters();
        params.extend(dec_pos.parameters());
        let mut cross_in = Vec::new();
        let mut caches = Vec::new();
        let cross_shape = (1, heads, c.max_source_positions, head_dim);
        for i in 0..c.decoder_layers {
            let p = format!("model.decoder.layers.{i}");
            let sa = projections(&cx, &format!("{p}.self_attn"), d, heads);
            let ln_sa = layer_norm(&cx, &format!("{p}.self_attn_layer_norm"), d);
            let cache = KvCache::new(&cx, &format!("{p}.self_attn"), heads, max_ctx, head_dim);
            let hs = ln_sa.forward(x);
            let q = split_heads(sa.q_proj.forward(hs), heads);
            let k = split_heads(sa.k_proj.forward(hs), heads);
            let v = split_heads(sa.v_proj.forward(hs), heads);
            let (k, v) = cache.append(k, v, past.clone());
            x = x + sa.out_proj.forward(merge_heads(causal_attention(q, k, v)));

            let ln_ca = layer_norm(&cx, &format!("{p}.encoder_attn_layer_norm"), d);
            let q_ca = Linear::new(&cx, &format!("{p}.encoder_attn.q_proj"), d, d, true);
            let o_ca = Linear::new(&cx, &format!("{p}.encoder_attn.out_proj"), d, d, true);
            let ck = cx.tensor(&format!("{p}.encoder_attn.cross_k"), cross_shape);
            let cv = cx.tensor(&format!("{p}.encoder_attn.cross_v"), cross_shape);
            let qc = split_heads(q_ca.forward(ln_ca.forward(x)), heads);
            x = x + o_ca.forward(merge_heads(attention(qc, ck, cv, None)));

            let ln_ff = layer_norm(&cx, &format!("{p}.final_layer_norm"), d);
            let ffn = feed_forward(&cx, &p, d, c.decoder_ffn, act);
            x = x + ffn.forward(ln_ff.forward(x));

            params.extend(sa.parameters());
            params.extend(ln_sa.parameters());
            params.extend(ln_ca.parameters());
            params.extend(q_ca.parameters());
            params.extend(o_ca.parameters());
            params.extend(ln_ff.parameters());
            params.extend(ffn.parameters());
            cross_in.push((ck.handle(), cv.handle()));
            caches.extend([cache.k.handle(), cache.v.handle()]);
        }
        let dec_norm = layer_norm(&cx, "model.decoder.layer_norm", d);
        params.extend(dec_norm.parameters());
        let last = x.slice(1, s.clone() - Expression::var("n_out"), s);
        let head = Linear {
            weight: embed.weight,
            bias: None,
        };
        let logits = head.forward(dec_norm.forward(last)).squeeze(0).output(); // [n_out, vocab]
        let mut decoder = cx.compile(backend, CompileOptions::default())?;
        parameters += load_weights(&mut decoder, &params, st)?;
        let mut model = WhisperModel {
            mel: LogMel::new(c.n_mels),
            config,
            generation,
            encoder,
            decoder,
            features,
            states: states.handle(),
            cross_out,
            cross_in,
            tokens: tokens.handle(),
            logits: logits.handle(),
            caches,
            pos: 0,
            cached: Vec::new(),
            parameters,
        };
        let zeros = heads * max_ctx * head_dim;
        for &r in &model.caches {
            model.decoder.set_data(r, HostData::F32(vec![0.0; zeros]))?;
        }
        Ok(model)
    }

    pub fn config(&self) -> &WhisperConfig {
        &self.config
    }
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }
    /// The log-mel front-end of this model (80 or 128 bins).
    pub fn log_mel(&self) -> &LogMel {
        &self.mel
    }

    /// Runs the encoder on one window of features (`[n_mels, 3000]`, row-major) and hands
    /// the cross-attention keys/values to the decoder; the decoder's cache is reset.
    pub fn encode(&mut self, features: &[f32]) -> Result<()> {
        let want = self.config.n_mels * N_FRAMES;
        if features.len() != want {
            return Err(ModelError::Other(format!(
                "features hold {} values, expected {} ({} mel bins × {N_FRAMES} frames)",
                features.len(),
                want,
                self.config.n_mels
            )));
        }
        self.encoder.set(self.features, features)?;
        self.encoder.run()?;
        for (&(ko, vo), &(ki, vi)) in self.cross_out.iter().zip(&self.cross_in) {
            self.decoder.set_data(ki, self.encoder.get_data(ko)?)?;
            self.decoder.set_data(vi, self.encoder.get_data(vo)?)?;
        }
        self.pos = 0;
        self.cached.clear();
        Ok(())
    }

    /// The encoder's last hidden state of the last [`WhisperModel::encode`], row-major
    /// `[max_source_positions, d_model]`.
    pub fn encoder_states(&self) -> Result<Vec<f32>> {
        Ok(self.encoder.get(self.states)?)
    }

    /// Tokens in the decoder's cache.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Feeds `tokens` at positions `pos..pos + len` (after [`WhisperModel::encode`]) and
    /// returns the logits of the last `n_out`, row-major `[n_out, vocab]`.
    pub fn decode(&mut self, tokens: &[u32], n_out: usize) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(ModelError::Other("decode needs at least one token".into()));
        }
        let vocab = self.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { id, vocab });
        }
        let needed = self.pos + tokens.len();
        let max = self.config.max_target_positions;
        if needed > max {
            return Err(ModelError::ContextFull { needed, max });
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let n_out = n_out.clamp(1, tokens.len());
        self.decoder.set_dim("s", tokens.len());
        self.decoder.set_dim("p", self.pos);
        self.decoder.set_dim("n_out", n_out);
        self.decoder.set(self.tokens, &ids)?;
        self.decoder.run()?;
        self.cached.truncate(self.pos);
        self.cached.extend_from_slice(tokens);
        self.pos = needed;
        Ok(self.decoder.get(self.logits)?)
    }

    /// Logits after the whole sequence `seq` (from position 0), reusing the cached keys and
    /// values of its longest prefix already in the cache (rows past it are overwritten; the
    /// attention never reads past the current position).
    pub fn decode_sequence(&mut self, seq: &[u32]) -> Result<Vec<f32>> {
        let shared = self
            .cached
            .iter()
            .zip(seq)
            .take_while(|(a, b)| a == b)
            .count()
            .min(seq.len().saturating_sub(1));
        self.pos = shared;
        self.cached.truncate(shared);
        self.decode(&seq[shared..], 1)
    }

    /// The decoder prompt: `<|startoftranscript|>`, then for multilingual models the
    /// language and task tokens, then `<|notimestamps|>` unless `opts.timestamps`.
    pub fn prompt(&self, tok: &Tokenizer, opts: &TranscribeOptions) -> Result<Vec<u32>> {
        let id = |text: &str| {
            tok.token_to_id(text)
                .ok_or_else(|| ModelError::Config(format!("the tokenizer has no {text} token")))
        };
        let mut prompt = vec![id("<|startoftranscript|>")?];
        let lang = format!("<|{}|>", opts.language);
        let multilingual = self
            .generation
            .is_multilingual
            .unwrap_or_else(|| tok.token_to_id("<|en|>").is_some());
        if multilingual {
            prompt.push(tok.token_to_id(&lang).ok_or_else(|| {
                ModelError::Unsupported(format!("language {lang}: not in the tokenizer"))
            })?);
            prompt.push(id(&format!("<|{}|>", opts.task))?);
        }
        if !opts.timestamps {
            prompt.push(id("<|notimestamps|>")?);
        }
        Ok(prompt)
    }

    /// Greedy decoding of the current window from `prompt`: the generated ids (the final
    /// `<|endoftext|>` excluded), with `suppress_tokens` masked at every step and
    /// `begin_suppress_tokens` at the first.
    pub fn greedy(&mut self, prompt: &[u32], eos: u32, max_new_tokens: usize) -> Result<Vec<u32>> {
        self.greedy_with(prompt, eos, max_new_tokens, None)
    }

    fn greedy_with(
        &mut self,
        prompt: &[u32],
        eos: u32,
        max_new_tokens: usize,
        ts: Option<TimestampRules>,
    ) -> Result<Vec<u32>> {
        let max_new = max_new_tokens.min(
            self.config
                .max_target_positions
                .saturating_sub(prompt.len()),
        );
        let mut logits = self.decode(prompt, 1)?;
        let mut out = Vec::new();
        while out.len() < max_new {
            self.suppress(&mut logits, out.is_empty());
            if let Some(r) = ts {
                r.apply(&mut logits, &out);
            }
            let next = argmax(&logits);
            if next == eos {
                break;
            }
            out.push(next);
            if out.len() == max_new {
                break;
            }
            logits = self.decode(&[next], 1)?;
        }
        Ok(out)
    }

    /// Logits after the decoder's suppression rules: `suppress_tokens` always, and
    /// `begin_suppress_tokens` for the first generated token.
    fn suppress(&self, logits: &mut [f32], first: bool) {
        let g = &self.generation;
        let begin: &[u32] = if first { &g.begin_suppress_tokens } else { &[] };
        for &t in g.suppress_tokens.iter().chain(begin) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Beam search over the current window from `prompt` (CTranslate2's / faster-whisper's
    /// rules): each step extends every live beam by its log-softmax (after the suppression
    /// rules) and keeps the `2 · beam_size` best candidates; among the first `beam_size`, one
    /// ending in `eos` becomes a finished hypothesis and its beam is taken over by the next
    /// candidate that does not end there. Decoding stops once `round(beam_size · patience)`
    /// hypotheses have finished (or at `max_new_tokens`, which finishes every beam); the
    /// result is the finished hypothesis with the best `log p / length^length_penalty`
    /// (length without `eos`). The KV cache holds one sequence: each beam's step re-runs only
    /// the tokens after the prefix it shares with the cache ([`WhisperModel::decode_sequence`]).
    pub fn beam_search(
        &mut self,
        prompt: &[u32],
        eos: u32,
        beam_size: usize,
        patience: f32,
        length_penalty: f32,
        max_new_tokens: usize,
    ) -> Result<Vec<u32>> {
        let opts = (beam_size, patience, length_penalty, max_new_tokens);
        self.beam_search_with(prompt, eos, opts, None)
    }

    fn beam_search_with(
        &mut self,
        prompt: &[u32],
        eos: u32,
        (beam_size, patience, length_penalty, max_new_tokens): (usize, f32, f32, usize),
        ts: Option<TimestampRules>,
    ) -> Result<Vec<u32>> {
        let beam_size = beam_size.max(1);
        let max_new = max_new_tokens.min(
            self.config
                .max_target_positions
                .saturating_sub(prompt.len()),
        );
        if max_new == 0 {
            return Ok(Vec::new());
        }
        let max_finished = ((beam_size as f32 * patience).round() as usize).max(1);
        let mut beams: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0)];
        let mut finished: Vec<(Vec<u32>, f64)> = Vec::new();
        for step in 0..max_new {
            let last_step = step + 1 == max_new;
            // (cumulative log-probability, beam, token), all live beams.
            let mut candidates: Vec<(f64, usize, u32)> = Vec::new();
            for (b, (tokens, score)) in beams.iter().enumerate() {
                let mut seq = prompt.to_vec();
                seq.extend_from_slice(tokens);
                let mut logits = self.decode_sequence(&seq)?;
                self.suppress(&mut logits, step == 0);
                if let Some(r) = ts {
                    r.apply(&mut logits, tokens);
                }
                let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                let lse = max
                    + logits
                        .iter()
                        .map(|&l| (l as f64 - max).exp())
                        .sum::<f64>()
                        .ln();
                candidates.extend(
                    logits
                        .iter()
                        .enumerate()
                        .filter(|(_, l)| l.is_finite())
                        .map(|(t, &l)| (score + l as f64 - lse, b, t as u32)),
                );
            }
            // Best first; equal scores keep the lower (beam, token) first.
            candidates.sort_by(|x, y| {
                y.0.partial_cmp(&x.0)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then((x.1, x.2).cmp(&(y.1, y.2)))
            });
            candidates.truncate(2 * beam_size);
            let mut next = Vec::with_capacity(beam_size);
            let mut secondary = beam_size;
            for k in 0..beam_size.min(candidates.len()) {
                let (score, b, t) = candidates[k];
                let mut keep = Some(k);
                if t == eos || last_step {
                    let mut tokens = beams[b].0.clone();
                    if t != eos {
                        tokens.push(t);
                    }
                    finished.push((tokens, score));
                    keep = None;
                    while secondary < candidates.len() {
                        let j = secondary;
                        secondary += 1;
                        if candidates[j].2 != eos {
                            keep = Some(j);
                            break;
                        }
                    }
                }
                if let Some(j) = keep {
                    let (score, b, t) = candidates[j];
                    let mut tokens = beams[b].0.clone();
                    tokens.push(t);
                    next.push((tokens, score));
                }
            }
            if last_step || finished.len() >= max_finished || next.is_empty() {
                break;
            }
            beams = next;
        }
        let normalized = |(tokens, score): &(Vec<u32>, f64)| {
            score / (tokens.len().max(1) as f64).powf(length_penalty as f64)
        };
        // The best normalised score; on a tie the hypothesis that finished first.
        let mut best: Option<(&Vec<u32>, f64)> = None;
        for h in &finished {
            let score = normalized(h);
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((&h.0, score));
            }
        }
        Ok(best.map(|(t, _)| t.clone()).unwrap_or_default())
    }

    /// Transcribes 16 kHz mono samples: greedy decoding (or beam search, `opts.beam_size`)
    /// of each 30-second window, the windows' texts joined.
    pub fn transcribe(
        &mut self,
        tok: &Tokenizer,
        samples: &[f32],
        opts: &TranscribeOptions,
    ) -> Result<String> {
        let texts: Vec<String> = self
            .decode_windows(tok, samples, opts)?
            .into_iter()
            .map(|s| s.text)
            .collect();
        let joined = if opts.timestamps {
            texts.join(" ")
        } else {
            texts.concat()
        };
        Ok(joined.trim().to_string())
    }

    /// Transcribes with timestamps (whatever `opts.timestamps` says): the segments of each
    /// 30-second window in order, their times from the start of the audio (a window's
    /// timestamps count from its own start). Decoding follows OpenAI's timestamp rules
    /// (transformers' `return_timestamps=True`).
    pub fn transcribe_segments(
        &mut self,
        tok: &Tokenizer,
        samples: &[f32],
        opts: &TranscribeOptions,
    ) -> Result<Vec<Segment>> {
        let opts = TranscribeOptions {
            timestamps: true,
            ..opts.clone()
        };
        self.decode_windows(tok, samples, &opts)
    }

    /// Each window's decoded text: one segment per window without timestamps (times are
    /// the window's bounds), the predicted segments with them.
    fn decode_windows(
        &mut self,
        tok: &Tokenizer,
        samples: &[f32],
        opts: &TranscribeOptions,
    ) -> Result<Vec<Segment>> {
        let prompt = self.prompt(tok, opts)?;
        let id = |text: &str| {
            tok.token_to_id(text)
                .ok_or_else(|| ModelError::Config(format!("the tokenizer has no {text} token")))
        };
        let eos = id("<|endoftext|>")?;
        let rules = if opts.timestamps {
            let no_timestamps = id("<|notimestamps|>")?;
            if no_timestamps as usize + 1 >= self.config.vocab_size {
                return Err(ModelError::Unsupported(
                    "this model has no timestamp tokens after <|notimestamps|>".into(),
                ));
            }
            Some(TimestampRules {
                no_timestamps,
                begin: no_timestamps + 1,
                eos,
                max_initial: self.generation.max_initial_timestamp_index.unwrap_or(50),
            })
        } else {
            None
        };
        let mut out = Vec::new();
        for (w, window) in self.mel.features(samples).into_iter().enumerate() {
            self.encode(&window)?;
            let ids = if opts.beam_size > 1 {
                let beam = (opts.beam_size, 1.0, 1.0, opts.max_new_tokens);
                self.beam_search_with(&prompt, eos, beam, rules)?
            } else {
                self.greedy_with(&prompt, eos, opts.max_new_tokens, rules)?
            };
            let offset = w as f32 * WINDOW_SECONDS;
            match rules {
                Some(r) => out.extend(r.segments(tok, &ids, offset)?),
                None => out.push(Segment {
                    start: offset,
                    end: offset + WINDOW_SECONDS,
                    text: tok.decode(&ids, true)?,
                }),
            }
        }
        Ok(out)
    }
}
