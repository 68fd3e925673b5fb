//! Fine-tuning the last layers of a Llama-family GGUF model.
//!
//! [`LlamaFinetune::build`] adds the model's forward pass to a graph the caller owns, for a
//! fixed `[batch, seq]` window of tokens and without a KV cache (every position sees the
//! positions before it in its window): the last `train_last` transformer blocks and the
//! final norm are f32 inputs meant as trainable parameters; every other weight stays in the
//! file's storage (quantized or half, read in place) and is frozen. The caller adds a loss
//! and an optimizer (`luminal_training`), compiles with any backend, and hands the weights
//! to the runtime with [`LlamaFinetune::load_weights`].
//!
//! ```no_run
//! use luminal::prelude::*;
//! use luminal_models::finetune::LlamaFinetune;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cx = Graph::new();
//! let (ft, tokenizer) = LlamaFinetune::build(&cx, "model.gguf", 1, 64, 2)?;
//! // logits: [batch * seq, vocab]; ft.trainable: the parameters to optimise.
//! let mut rt = cx.compile(ReferenceBackend, CompileOptions::default())?;
//! ft.load_weights(&mut rt)?;
//! # let _ = tokenizer; Ok(()) }
//! ```

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::llama::{layer_matrix_names, WeightSource};
use luminal::prelude::*;
use luminal_io::{GgufFile, Tokenizer};
use luminal_nn::{Embedding, Linear, Module, RmsNorm, Rope, TransformerBlock};
use std::path::Path;

/// The graph input of Llama 3.1+ RoPE frequency factors (as in [`crate::LlamaModel`]).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// A Llama-family forward graph for fine-tuning its last blocks (see the module docs).
pub struct LlamaFinetune<'g> {
    /// The model's configuration, from the file.
    pub config: LlamaConfig,
    /// Token ids `[batch, seq]` (`I32`).
    pub tokens: GraphTensor<'g>,
    /// Logits `[batch * seq, vocab]`, row `b * seq + i` for position `i` of window `b`.
    pub logits: GraphTensor<'g>,
    /// The f32 parameters of the last `train_last` blocks and of the final norm.
    pub trainable: Vec<GraphTensor<'g>>,
    /// Every weight input, with its Hugging Face name.
    weights: Vec<(GraphTensor<'g>, String)>,
    file: GgufFile,
}

impl<'g> LlamaFinetune<'g> {
    /// Builds the forward graph of the GGUF model at `path` on `cx` for windows of
    /// `[batch, seq]` tokens, with the last `train_last` blocks trainable (0: only the final
    /// norm). Returns the file's tokenizer too.
    pub fn build(
        cx: &'g Graph,
        path: impl AsRef<Path>,
        batch: usize,
        seq: usize,
        train_last: usize,
    ) -> Result<(LlamaFinetune<'g>, Tokenizer)> {
        let file = GgufFile::load(path)?;
        let has_output = file.tensor_info("output.weight").is_ok();
        let has_rope_freqs = file.tensor_info(ROPE_FREQS).is_ok();
        let config = LlamaConfig::from_gguf(file.metadata(), has_output, has_rope_freqs)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let c = &config;
        if train_last > c.n_layers {
            return Err(ModelError::Other(format!(
                "cannot train the last {train_last} blocks of a {}-block model",
                c.n_layers
            )));
        }
        if batch == 0 || seq == 0 {
            return Err(ModelError::Other(format!(
                "a training window needs at least one token, got batch {batch} × seq {seq}"
            )));
        }
        if seq > c.context_length {
            return Err(ModelError::ContextFull {
                needed: seq,
                max: c.context_length,
            });
        }
        let first_trained = c.n_layers - train_last;
        // Frozen matrices keep the file's storage; trained ones are f32 inputs.
        let mut frozen = vec!["model.embed_tokens.weight".to_string()];
        if !c.tie_word_embeddings {
            frozen.push("lm_head.weight".into());
        }
        for i in 0..first_trained {
            frozen.extend(layer_matrix_names(i));
        }
        let source = WeightSource::Gguf(&file);
        for name in &frozen {
            if let Some(dtype) = source.storage_dtype(name) {
                cx.set_tensor_dtype(name, dtype);
            }
        }
        let mut rope = Rope {
            head_dim: c.head_dim,
            theta: c.rope_theta,
            layout: c.rope_layout,
            scaling: c.rope_scaling,
            freq_factors: None,
        };
        if c.rope_freq_factors {
            rope = rope.with_freq_factors(cx, ROPE_FREQS);
        }
        let embed = Embedding::new(cx, "model.embed_tokens", c.vocab_size, c.hidden_size);
        let layers: Vec<TransformerBlock> = (0..c.n_layers)
            .map(|i| {
                TransformerBlock::new(
                    cx,
                    &format!("model.layers.{i}"),
                    c.hidden_size,
                    c.intermediate_size,
                    c.n_heads,
                    c.n_kv_heads,
                    c.qkv_bias,
                    rope,
                    c.rms_norm_eps,
                )
                .with_sliding_window(c.sliding_window)
            })
            .collect();
        let norm = RmsNorm::new(cx, "model.norm", c.hidden_size, c.rms_norm_eps);
        let lm_head = if c.tie_word_embeddings {
            Linear {
                weight: embed.weight,
                bias: None,
            }
        } else {
            Linear::new(cx, "lm_head", c.hidden_size, c.vocab_size, false)
        };
        let tokens = cx.input("tokens", (batch, seq), DType::I32);
        let mut x = embed.forward(tokens); // [batch, seq, dim]
        for layer in &layers {
            x = layer.forward(x);
        }
        let logits = lm_head
            .forward(norm.forward(x))
            .reshape(vec![Expression::from(batch * seq), c.vocab_size.into()]);

        let mut all: Vec<GraphTensor> = embed.parameters();
        all.extend(rope.parameters());
        for l in &layers {
            all.extend(l.parameters());
        }
        all.extend(norm.parameters());
        if !c.tie_word_embeddings {
            all.extend(lm_head.parameters());
        }
        let mut trainable: Vec<GraphTensor> = layers[first_trained..]
            .iter()
            .flat_map(|l| l.parameters())
            .collect();
        trainable.extend(norm.parameters());
        let weights = all
            .into_iter()
            .map(|t| (t, luminal_nn::parameter_name(t)))
            .collect();
        Ok((
            LlamaFinetune {
                config,
                tokens,
                logits,
                trainable,
                weights,
                file,
            },
            tokenizer,
        ))
    }

    /// Hands every weight to `rt` (frozen ones in their storage dtype, trainable ones as
    /// f32), checking each tensor's shape against the file.
    pub fn load_weights<R: Runtime>(&self, rt: &mut R) -> Result<()> {
        let source = WeightSource::Gguf(&self.file);
        for (t, name) in &self.weights {
            let shape: Vec<usize> = t
                .shape()
                .iter()
                .map(|d| d.as_constant().unwrap_or(0) as usize)
                .collect();
            let data = match t.dtype() {
                DType::F32 => HostData::F32(source.read(name, &shape)?),
                dtype => source.data(name, &shape, dtype)?,
            };
            rt.set_data(*t, data)?;
        }
        Ok(())
    }
}
