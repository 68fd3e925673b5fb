//! Llama-family hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use crate::error::{ModelError, Result};
use luminal_io::gguf::Metadata;
use luminal_nn::{RopeLayout, RopeScaling};
use serde_json::Value;

/// Everything needed to build the graph of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `llama`, `qwen2`, `mistral`, … (as in the file).
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_layout: RopeLayout,
    pub rope_scaling: Option<RopeScaling>,
    /// The GGUF carries `rope_freqs.weight`: per-frequency divisors `[head_dim / 2]` of the
    /// inverse frequencies (how llama.cpp stores Llama 3.1+ RoPE scaling).
    pub rope_freq_factors: bool,
    /// Qwen2 has biases on the q/k/v projections.
    pub qkv_bias: bool,
    /// The output projection is the token embedding (no `lm_head` weight).
    pub tie_word_embeddings: bool,
    /// Longest context the model was trained for.
    pub context_length: usize,
}

const ARCHS: [&str; 3] = ["llama", "qwen2", "mistral"];

fn cfg_err(msg: impl Into<String>) -> ModelError {
    ModelError::Config(msg.into())
}

impl LlamaConfig {
    /// From GGUF metadata (`{arch}.embedding_length` etc.). `has_output` tells whether the
    /// file has a separate `output.weight` (otherwise the embedding is tied);
    /// `has_rope_freqs` whether it has `rope_freqs.weight` (Llama 3.1+ RoPE factors).
    pub fn from_gguf(md: &Metadata, has_output: bool, has_rope_freqs: bool) -> Result<LlamaConfig> {
        let arch = md.get_str("general.architecture")?.to_string();
        if !ARCHS.contains(&arch.as_str()) {
            return Err(ModelError::Unsupported(format!(
                "architecture '{arch}' (supported: {})",
                ARCHS.join(", ")
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let usize_of = |k: &str| -> Result<usize> { Ok(md.get_u64(&key(k))? as usize) };
        let hidden_size = usize_of("embedding_length")?;
        let n_heads = usize_of("attention.head_count")?;
        let n_kv_heads = if md.contains_key(&key("attention.head_count_kv")) {
            usize_of("attention.head_count_kv")?
        } else {
            n_heads
        };
        let vocab_size = match md.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
            Some(v) => v as usize,
            None => md.get_strings("tokenizer.ggml.tokens")?.len(),
        };
        let head_dim = if md.contains_key(&key("rope.dimension_count")) {
            usize_of("rope.dimension_count")?
        } else {
            hidden_size / n_heads.max(1)
        };
        let rope_theta = match md.get(&key("rope.freq_base")) {
            Some(v) => v
                .as_f32()
                .ok_or_else(|| cfg_err(format!("{} is not a number", key("rope.freq_base"))))?,
            None => 10000.0,
        };
        let cfg = LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size: usize_of("feed_forward_length")?,
            n_layers: usize_of("block_count")?,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: md.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            // llama.cpp's converter permutes q/k of Llama/Mistral so adjacent channels pair
            // up; Qwen2 keeps the rotate-half (NeoX) layout.
            rope_layout: if arch == "qwen2" {
                RopeLayout::NeoX
            } else {
                RopeLayout::Interleaved
            },
            rope_scaling: None,
            rope_freq_factors: has_rope_freqs,
            qkv_bias: arch == "qwen2",
            tie_word_embeddings: !has_output,
            context_length: usize_of("context_length").unwrap_or(2048),
            architecture: arch,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// From a Hugging Face `config.json` (LlamaForCausalLM, MistralForCausalLM,
    /// Qwen2ForCausalLM).
    pub fn from_hf_json(text: &str) -> Result<LlamaConfig> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| cfg_err(format!("config.json: {e}")))?;
        let model_type = v["model_type"].as_str().unwrap_or("llama").to_string();
        if !ARCHS.contains(&model_type.as_str()) {
            return Err(ModelError::Unsupported(format!(
                "model_type '{model_type}' (supported: {})",
                ARCHS.join(", ")
            )));
        }
        let int = |k: &str| -> Result<usize> {
            v[k].as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| cfg_err(format!("config.json: '{k}' is missing or not an integer")))
        };
        let float = |k: &str, default: f64| -> Result<f32> {
            match &v[k] {
                Value::Null => Ok(default as f32),
                x => x
                    .as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| cfg_err(format!("config.json: '{k}' is not a number"))),
            }
        };
        let hidden_size = int("hidden_size")?;
        let n_heads = int("num_attention_heads")?;
        let n_kv_heads = int("num_key_value_heads").unwrap_or(n_heads);
        let head_dim = match &v["head_dim"] {
            Value::Null => hidden_size / n_heads.max(1),
            _ => int("head_dim")?,
        };
        // transformers 4 writes `rope_theta` and `rope_scaling`; transformers 5 puts both in
        // `rope_parameters`.
        let rope_params = match (&v["rope_scaling"], &v["rope_parameters"]) {
            (Value::Null, p) => p,
            (s, _) => s,
        };
        let rope_theta = match (&v["rope_theta"], &v["rope_parameters"]["rope_theta"]) {
            (Value::Null, Value::Null) => 10000.0,
            (Value::Null, t) | (t, _) => t
                .as_f64()
                .ok_or_else(|| cfg_err("config.json: 'rope_theta' is not a number"))?
                as f32,
        };
        let rope_scaling = match rope_params {
            Value::Null => None,
            s if matches!(
                s["rope_type"].as_str().or(s["type"].as_str()),
                Some("default") | None
            ) =>
            {
                None
            }
            s => {
                let kind = s["rope_type"].as_str().or(s["type"].as_str()).unwrap_or("");
                if kind != "llama3" {
                    return Err(ModelError::Unsupported(format!(
                        "rope_scaling type '{kind}' (supported: llama3)"
                    )));
                }
                let f = |k: &str| {
                    s[k].as_f64()
                        .map(|x| x as f32)
                        .ok_or_else(|| cfg_err(format!("config.json: rope_scaling.{k} is missing")))
                };
                Some(RopeScaling {
                    factor: f("factor")?,
                    low_freq_factor: f("low_freq_factor")?,
                    high_freq_factor: f("high_freq_factor")?,
                    original_max_position_embeddings: f("original_max_position_embeddings")?,
                })
            }
        };
        let cfg = LlamaConfig {
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: int("intermediate_size")?,
            n_layers: int("num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: float("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_layout: RopeLayout::NeoX,
            rope_scaling,
            rope_freq_factors: false,
            qkv_bias: model_type == "qwen2" || v["attention_bias"].as_bool() == Some(true),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            context_length: int("max_position_embeddings").unwrap_or(2048),
            architecture: model_type,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab size", self.vocab_size),
            ("hidden size", self.hidden_size),
            ("intermediate size", self.intermediate_size),
            ("layer count", self.n_layers),
            ("head count", self.n_heads),
            ("kv head count", self.n_kv_heads),
            ("head dim", self.head_dim),
        ];
        if let Some((what, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(cfg_err(format!("{what} is 0")));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(cfg_err(format!(
                "{} heads is not a multiple of {} kv heads",
                self.n_heads, self.n_kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(cfg_err(format!("head dim {} is odd", self.head_dim)));
        }
        // Guard against absurd headers before allocating caches and weights.
        if self.vocab_size > 1 << 24 || self.hidden_size > 1 << 16 || self.n_layers > 1024 {
            return Err(cfg_err(format!(
                "implausible sizes: vocab {}, hidden {}, layers {}",
                self.vocab_size, self.hidden_size, self.n_layers
            )));
        }
        Ok(())
    }

    /// Parameter count (tied embeddings counted once).
    pub fn parameter_count(&self) -> usize {
        let (d, h) = (self.hidden_size, self.intermediate_size);
        let q = self.n_heads * self.head_dim;
        let kv = self.n_kv_heads * self.head_dim;
        let bias = if self.qkv_bias { q + 2 * kv } else { 0 };
        let layer = d * (q + 2 * kv) + bias + q * d + 3 * d * h + 2 * d;
        let embed = self.vocab_size * d;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + d + self.n_layers * layer
    }
}
