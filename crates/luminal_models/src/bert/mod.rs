//! BERT encoders and their sentence-transformers variants (all-MiniLM-L6-v2, …): token
//! states and pooled sentence embeddings for batches of texts of different lengths.
//!
//! One graph, compiled once for the dynamic dims `batch` and `seq`, serves every batch:
//! inputs `input_ids` and `token_type_ids` (`I32 [batch, seq]`) and `attention_mask`
//! (`F32 [batch, seq]`, 1 for real tokens, 0 for padding); outputs the last hidden state
//! `[batch, seq, hidden]` and the sentence embedding `[batch, dim]` (pooling and L2
//! normalisation as the folder's `modules.json` configures them).
//!
//! ```no_run
//! use luminal::prelude::*;
//! use luminal_models::bert::{BertModel, EmbedOptions};
//! # fn main() -> luminal_models::Result<()> {
//! let (mut model, tok) = BertModel::load("models/all-MiniLM-L6-v2", ReferenceBackend)?;
//! let vectors = model.embed(&tok, &["A cat sits.", "Un chat est assis."], &EmbedOptions::default())?;
//! # Ok(()) }
//! ```

mod config;

pub(crate) use config::read_json;
pub use config::{BertConfig, Pooling, SentenceConfig};

use crate::error::{ModelError, Result};
use luminal::prelude::*;
use luminal_io::{IoError, SafetensorsModel, Tokenizer};
use luminal_nn::{
    Embedding, FeedForward, LayerNorm, Linear, Module, MultiHeadAttention, PositionEmbedding,
};
use std::path::Path;
use std::time::{Duration, Instant};

/// One BERT layer (post-norm): `x = LN(x + attn(x))`, `x = LN(x + ffn(x))`.
struct BertLayer<'g> {
    attention: MultiHeadAttention<'g>,
    attention_norm: LayerNorm<'g>,
    ffn: FeedForward<'g>,
    output_norm: LayerNorm<'g>,
}

impl<'g> BertLayer<'g> {
    fn new(cx: &'g Graph, prefix: &str, c: &BertConfig) -> Self {
        let d = c.hidden_size;
        let linear = |name: &str, i, o| Linear::new(cx, &format!("{prefix}.{name}"), i, o, true);
        BertLayer {
            attention: MultiHeadAttention::from_projections(
                linear("attention.self.query", d, d),
                linear("attention.self.key", d, d),
                linear("attention.self.value", d, d),
                linear("attention.output.dense", d, d),
                c.n_heads,
            ),
            attention_norm: LayerNorm::new(
                cx,
                &format!("{prefix}.attention.output.LayerNorm"),
                d,
                true,
                true,
                c.layer_norm_eps,
            ),
            ffn: FeedForward {
                fc1: linear("intermediate.dense", d, c.intermediate_size),
                fc2: linear("output.dense", c.intermediate_size, d),
                activation: c.hidden_act,
            },
            output_norm: LayerNorm::new(
                cx,
                &format!("{prefix}.output.LayerNorm"),
                d,
                true,
                true,
                c.layer_norm_eps,
            ),
        }
    }

    fn forward(&self, x: GraphTensor<'g>, mask: GraphTensor<'g>) -> GraphTensor<'g> {
        let x = self
            .attention_norm
            .forward(x + self.attention.forward_self(x, Some(mask)));
        self.output_norm.forward(x + self.ffn.forward(x))
    }

    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        let mut p = self.attention.parameters();
        p.extend(self.attention_norm.parameters());
        p.extend(self.ffn.parameters());
        p.extend(self.output_norm.parameters());
        p
    }
}

/// Sentence vectors from token states `x: [b, s, d]` and `mask: [b, s]`, as
/// sentence-transformers' `Pooling` (+ `Normalize`) computes them.
fn pool<'g>(
    x: GraphTensor<'g>,
    mask: GraphTensor<'g>,
    pooling: Pooling,
    normalize: bool,
) -> GraphTensor<'g> {
    let shape = x.shape();
    let m = mask.unsqueeze(2).expand_to(shape.clone()); // [b, s, d]
    let count = mask
        .sum(1)
        .unsqueeze(1)
        .expand_to(vec![shape[0].clone(), shape[2].clone()]);
    let mut parts = Vec::new();
    if pooling.cls {
        // Every sequence has at least one token, so the slice is one row: `[b, d]`.
        parts.push(
            x.slice(1, 0, 1)
                .reshape(vec![shape[0].clone(), shape[2].clone()]),
        );
    }
    if pooling.max {
        // Padded positions are set to -1e9 before the max, as sentence-transformers does.
        parts.push((x * m + (m - 1.0) * 1e9).max(1));
    }
    let sum = (x * m).sum(1);
    if pooling.mean {
        parts.push(sum / count.maximum(1e-9));
    }
    if pooling.mean_sqrt_len {
        parts.push(sum / count.sqrt());
    }
    let pooled = if parts.len() == 1 {
        parts[0]
    } else {
        GraphTensor::concat(&parts, 1)
    };
    if normalize {
        // torch.nn.functional.normalize: x / max(‖x‖₂, 1e-12).
        let dim = pooled.shape()[1].clone();
        let norm = pooled.square().sum(1).sqrt().maximum(1e-12);
        pooled / norm.unsqueeze(1).expand_to(vec![shape[0].clone(), dim])
    } else {
        pooled
    }
}

/// Load-time statistics.
#[derive(Clone, Debug, Default)]
pub struct BertLoadStats {
    pub load_time: Duration,
    pub parameters: usize,
}

/// How [`BertModel::embed`] batches and truncates.
#[derive(Clone, Debug)]
pub struct EmbedOptions {
    /// Texts per run (sorted by length first, so each batch pads little).
    pub batch_size: usize,
    /// Cut texts longer than [`BertModel::max_tokens`] (keeping the leading tokens and the
    /// closing special token, as sentence-transformers does) instead of failing with
    /// [`ModelError::InputTooLong`].
    pub truncate: bool,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            batch_size: 32,
            truncate: false,
        }
    }
}

/// The result of one padded batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BertOutput {
    pub batch: usize,
    /// The padded length (the longest input of the batch).
    pub seq: usize,
    /// Last hidden state, row-major `[batch, seq, hidden]` (padded rows included).
    pub hidden: Vec<f32>,
    /// Sentence embeddings, row-major `[batch, embedding_dim]`.
    pub embeddings: Vec<f32>,
}

/// A compiled BERT encoder with its sentence-transformers head, on any backend's runtime.
pub struct BertModel<R> {
    config: BertConfig,
    sentence: SentenceConfig,
    runtime: R,
    input_ids: TensorRef,
    token_type_ids: TensorRef,
    attention_mask: TensorRef,
    hidden: TensorRef,
    embeddings: TensorRef,
    pub stats: BertLoadStats,
}

impl<R> std::fmt::Debug for BertModel<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertModel")
            .field("config", &self.config)
            .field("sentence", &self.sentence)
            .finish_non_exhaustive()
    }
}

/// The files a BERT folder must have; a missing one is [`IoError::NotFound`].
fn check_folder(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Err(IoError::NotFound {
            path: dir.to_path_buf(),
        }
        .into());
    }
    let weights = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    for path in [dir.join("config.json"), dir.join("tokenizer.json")] {
        if !path.is_file() {
            return Err(IoError::NotFound { path }.into());
        }
    }
    if !weights.is_file() && !index.is_file() {
        return Err(IoError::NotFound { path: weights }.into());
    }
    Ok(())
}

impl<R: Runtime> BertModel<R> {
    /// Loads a Hugging Face BERT folder (config.json, model.safetensors, tokenizer.json,
    /// and the sentence-transformers files when present) and compiles it with `backend`.
    pub fn load<B: Backend<Runtime = R>>(
        dir: impl AsRef<Path>,
        backend: B,
    ) -> Result<(BertModel<R>, Tokenizer)> {
        let start = Instant::now();
        let dir = dir.as_ref();
        check_folder(dir)?;
        let cfg_path = dir.join("config.json");
        let config =
            BertConfig::from_value(&config::read_json(&cfg_path)?).map_err(|e| match e {
                ModelError::Config(msg) => {
                    ModelError::Config(format!("{}: {msg}", cfg_path.display()))
                }
                e => e,
            })?;
        let sentence = SentenceConfig::from_dir(dir)?;
        let tokenizer = Tokenizer::from_hf_dir(dir)?;
        let weights = SafetensorsModel::load(dir)?;
        let model = Self::build(config, sentence, &weights, backend, start)?;
        Ok((model, tokenizer))
    }

    /// Builds and compiles the graph and hands it the weights of `weights` (names with or
    /// without transformers' `bert.` prefix).
    pub fn build<B: Backend<Runtime = R>>(
        config: BertConfig,
        sentence: SentenceConfig,
        weights: &SafetensorsModel,
        backend: B,
        start: Instant,
    ) -> Result<BertModel<R>> {
        let c = &config;
        let prefix = if weights
            .tensor_info("embeddings.word_embeddings.weight")
            .is_ok()
        {
            ""
        } else if weights
            .tensor_info("bert.embeddings.word_embeddings.weight")
            .is_ok()
        {
            "bert."
        } else {
            return Err(ModelError::Weight {
                name: "embeddings.word_embeddings.weight".into(),
                what: "missing from the safetensors files (also as bert.…)".into(),
            });
        };
        let cx = Graph::new();
        let name = |n: &str| format!("{prefix}{n}");
        // Half-precision matrices stay half (read through `.dequantize()` by Linear and
        // Embedding); everything else is f32.
        let mut matrices = vec![name("embeddings.word_embeddings.weight")];
        for i in 0..c.n_layers {
            for m in [
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
                "attention.output.dense",
                "intermediate.dense",
                "output.dense",
            ] {
                matrices.push(name(&format!("encoder.layer.{i}.{m}.weight")));
            }
        }
        for m in &matrices {
            if let Ok(info) = weights.tensor_info(m) {
                match info.dtype() {
                    luminal_io::Dtype::F16 => cx.set_tensor_dtype(m, DType::F16),
                    luminal_io::Dtype::BF16 => cx.set_tensor_dtype(m, DType::BF16),
                    _ => {}
                }
            }
        }

        let d = c.hidden_size;
        let words = Embedding::new(&cx, &name("embeddings.word_embeddings"), c.vocab_size, d);
        let positions = PositionEmbedding::new(
            &cx,
            &name("embeddings.position_embeddings"),
            c.max_position_embeddings,
            d,
        );
        let types = Embedding::new(
            &cx,
            &name("embeddings.token_type_embeddings"),
            c.type_vocab_size,
            d,
        );
        let embed_norm = LayerNorm::new(
            &cx,
            &name("embeddings.LayerNorm"),
            d,
            true,
            true,
            c.layer_norm_eps,
        );
        let layers: Vec<BertLayer> = (0..c.n_layers)
            .map(|i| BertLayer::new(&cx, &name(&format!("encoder.layer.{i}")), c))
            .collect();

        let (batch, seq) = (Expression::var("batch"), Expression::var("seq"));
        let ids = cx.input("input_ids", (batch.clone(), seq.clone()), DType::I32);
        let type_ids = cx.input("token_type_ids", (batch.clone(), seq.clone()), DType::I32);
        let mask = cx.input("attention_mask", (batch.clone(), seq.clone()), DType::F32);
        let shape = vec![batch, seq.clone(), Expression::from(d)];
        let mut x = words.forward(ids)
            + positions.positions(0, seq).expand_to(shape)
            + types.forward(type_ids);
        x = embed_norm.forward(x);
        for layer in &layers {
            x = layer.forward(x, mask);
        }
        let hidden = x.output();
        let embeddings = pool(x, mask, sentence.pooling, sentence.normalize).output();

        let mut params = words.parameters();
        params.extend(positions.parameters());
        params.extend(types.parameters());
        params.extend(embed_norm.parameters());
        for l in &layers {
            params.extend(l.parameters());
        }
        let mut runtime = cx.compile(backend, CompileOptions::default())?;
        let mut parameters = 0;
        for p in &params {
            let pname = luminal_nn::parameter_name(*p);
            let want: Vec<usize> = p
                .shape()
                .iter()
                .map(|e| e.as_constant().unwrap() as usize)
                .collect();
            let weight_err = |what: String| ModelError::Weight {
                name: pname.clone(),
                what,
            };
            let info = weights
                .tensor_info(&pname)
                .map_err(|_| weight_err("missing from the safetensors files".into()))?;
            if info.shape() != want.as_slice() {
                return Err(weight_err(format!(
                    "has shape {:?}, expected {want:?}",
                    info.shape()
                )));
            }
            let data = match p.dtype() {
                DType::F32 => HostData::F32(weights.tensor_f32(&pname)?),
                _ => weights.tensor_data(&pname)?,
            };
            parameters += data.len();
            runtime.set_data(*p, data)?;
        }
        Ok(BertModel {
            config,
            sentence,
            runtime,
            input_ids: ids.handle(),
            token_type_ids: type_ids.handle(),
            attention_mask: mask.handle(),
            hidden: hidden.handle(),
            embeddings: embeddings.handle(),
            stats: BertLoadStats {
                load_time: start.elapsed(),
                parameters,
            },
        })
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }
    pub fn sentence_config(&self) -> &SentenceConfig {
        &self.sentence
    }
    /// The compiled runtime.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }
    /// Length of the sentence embedding (hidden size × pooling modes).
    pub fn embedding_dim(&self) -> usize {
        self.config.hidden_size * self.sentence.pooling.modes()
    }
    /// The longest input in tokens, specials included: the position table's size, or
    /// sentence-transformers' `max_seq_length` when smaller.
    pub fn max_tokens(&self) -> usize {
        let p = self.config.max_position_embeddings;
        self.sentence.max_seq_length.map_or(p, |m| m.min(p))
    }

    /// Runs one batch of token ids (each with its token type ids, or all zeros when
    /// `type_ids` is `None`), padded to the longest.
    ///
    /// Errors: an empty input list or sequence, a sequence longer than
    /// [`BertModel::max_tokens`] ([`ModelError::InputTooLong`]), ids outside the
    /// vocabulary or type vocabulary ([`ModelError::BadToken`]), type ids whose lengths
    /// differ from the ids'.
    pub fn forward(
        &mut self,
        ids: &[Vec<u32>],
        type_ids: Option<&[Vec<u32>]>,
    ) -> Result<BertOutput> {
        let batch = ids.len();
        if batch == 0 {
            return Err(ModelError::Other(
                "forward needs at least one sequence".into(),
            ));
        }
        let max = self.max_tokens();
        for (index, seq) in ids.iter().enumerate() {
            if seq.is_empty() {
                return Err(ModelError::Other(format!("sequence {index} is empty")));
            }
            if seq.len() > max {
                return Err(ModelError::InputTooLong {
                    index,
                    tokens: seq.len(),
                    max,
                });
            }
            let vocab = self.config.vocab_size;
            if let Some(&id) = seq.iter().find(|&&t| t as usize >= vocab) {
                return Err(ModelError::BadToken { id, vocab });
            }
        }
        if let Some(types) = type_ids {
            if types.len() != batch || types.iter().zip(ids).any(|(t, i)| t.len() != i.len()) {
                return Err(ModelError::Other(
                    "token type ids must have the shape of the token ids".into(),
                ));
            }
            let vocab = self.config.type_vocab_size;
            if let Some(&id) = types.iter().flatten().find(|&&t| t as usize >= vocab) {
                return Err(ModelError::BadToken { id, vocab });
            }
        }
        let seq = ids.iter().map(Vec::len).max().unwrap();
        let pad = self.config.pad_token_id as i32;
        let mut flat_ids = vec![pad; batch * seq];
        let mut flat_types = vec![0i32; batch * seq];
        let mut mask = vec![0f32; batch * seq];
        for (b, row) in ids.iter().enumerate() {
            for (i, &t) in row.iter().enumerate() {
                flat_ids[b * seq + i] = t as i32;
                mask[b * seq + i] = 1.0;
            }
            if let Some(types) = type_ids {
                for (i, &t) in types[b].iter().enumerate() {
                    flat_types[b * seq + i] = t as i32;
                }
            }
        }
        self.runtime.set_dim("batch", batch);
        self.runtime.set_dim("seq", seq);
        self.runtime.set(self.input_ids, &flat_ids)?;
        self.runtime.set(self.token_type_ids, &flat_types)?;
        self.runtime.set(self.attention_mask, &mask)?;
        self.runtime.run()?;
        Ok(BertOutput {
            batch,
            seq,
            hidden: self.runtime.get(self.hidden)?,
            embeddings: self.runtime.get(self.embeddings)?,
        })
    }

    /// Token ids of `text` as the model reads it ([CLS] … [SEP]), cut to
    /// [`BertModel::max_tokens`] when `truncate` (leading tokens kept, the closing special
    /// tokens kept), else [`ModelError::InputTooLong`] when longer.
    pub fn tokenize(
        &self,
        tok: &Tokenizer,
        text: &str,
        truncate: bool,
        index: usize,
    ) -> Result<Vec<u32>> {
        let mut ids = tok.encode(text, true)?;
        let max = self.max_tokens();
        if ids.len() > max {
            if !truncate {
                return Err(ModelError::InputTooLong {
                    index,
                    tokens: ids.len(),
                    max,
                });
            }
            let suffix = tok.special_suffix().len().min(max);
            let tail: Vec<u32> = ids[ids.len() - suffix..].to_vec();
            ids.truncate(max - suffix);
            ids.extend(tail);
        }
        Ok(ids)
    }

    /// One sentence embedding per text, in input order. Texts are sorted by token count
    /// and run `batch_size` at a time (each batch padded to its longest).
    pub fn embed(
        &mut self,
        tok: &Tokenizer,
        texts: &[&str],
        opts: &EmbedOptions,
    ) -> Result<Vec<Vec<f32>>> {
        let encoded = texts
            .iter()
            .enumerate()
            .map(|(i, t)| self.tokenize(tok, t, opts.truncate, i))
            .collect::<Result<Vec<_>>>()?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(encoded[i].len()));
        let dim = self.embedding_dim();
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(opts.batch_size.max(1)) {
            let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| encoded[i].clone()).collect();
            let result = self.forward(&batch, None).map_err(|e| match e {
                ModelError::InputTooLong { index, tokens, max } => ModelError::InputTooLong {
                    index: chunk[index],
                    tokens,
                    max,
                },
                e => e,
            })?;
            for (row, &i) in result.embeddings.chunks(dim).zip(chunk) {
                out[i] = row.to_vec();
            }
        }
        Ok(out)
    }
}

/// Cosine similarity of two vectors (0 when either is zero).
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += x as f64 * y as f64;
        na += x as f64 * x as f64;
        nb += y as f64 * y as f64;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        (dot / (na.sqrt() * nb.sqrt())) as f32
    }
}
