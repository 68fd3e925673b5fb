//! Llama-family hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use crate::error::{ModelError, Result};
use luminal_io::gguf::Metadata;
use luminal_nn::{Llama3Scaling, RopeLayout, RopeScaling, YarnScaling};
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
    /// Llama 3 / linear / YaRN frequency scaling (`rope_scaling` in config.json,
    /// `{arch}.rope.scaling.*` in GGUF).
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
    /// Sliding attention window (Mistral: config.json `sliding_window`, GGUF
    /// `{arch}.attention.sliding_window`): each position attends to itself and the `w − 1`
    /// before it, in every layer. `None`: full causal attention.
    pub sliding_window: Option<usize>,
}

const ARCHS: [&str; 3] = ["llama", "qwen2", "mistral"];

pub(crate) fn cfg_err(msg: impl Into<String>) -> ModelError {
    ModelError::Config(msg.into())
}

/// Field `k` of a config.json object as a positive integer (a typed error when it is
/// missing or anything else).
pub(crate) fn positive_usize(v: &serde_json::Value, k: &str) -> Result<usize> {
    match &v[k] {
        serde_json::Value::Null => Err(cfg_err(format!("missing \"{k}\""))),
        x => x
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| cfg_err(format!("\"{k}\" must be a positive integer, got {x}"))),
    }
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
        let context_length = usize_of("context_length").unwrap_or(2048);
        let rope_scaling = gguf_rope_scaling(md, &arch, context_length)?;
        let sliding_window = match md.get(&key("attention.sliding_window")) {
            None => None,
            Some(v) => match v.as_u64() {
                Some(0) => None,
                Some(w) => Some(w as usize),
                None => {
                    return Err(cfg_err(format!(
                        "{} is not an integer",
                        key("attention.sliding_window")
                    )))
                }
            },
        };
        if sliding_window.is_some() && md.contains_key(&key("attention.sliding_window_pattern")) {
            return Err(ModelError::Unsupported(format!(
                "a sliding window on only some layers ({})",
                key("attention.sliding_window_pattern")
            )));
        }
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
            rope_scaling,
            rope_freq_factors: has_rope_freqs,
            qkv_bias: arch == "qwen2",
            tie_word_embeddings: !has_output,
            context_length,
            sliding_window,
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
        let context_length = int("max_position_embeddings").unwrap_or(2048);
        let rope_scaling = hf_rope_scaling(&v, rope_params, context_length)?;
        let sliding_window = hf_sliding_window(&v, &model_type, int("num_hidden_layers")?)?;
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
            context_length,
            sliding_window,
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
        if self.sliding_window == Some(0) {
            return Err(cfg_err("sliding window is 0"));
        }
        let factor_ok = |f: f32| f.is_finite() && f > 0.0;
        let scaling_ok = match self.rope_scaling {
            None => true,
            Some(RopeScaling::Linear { factor }) => factor_ok(factor),
            Some(RopeScaling::Llama3(s)) => {
                factor_ok(s.factor)
                    && factor_ok(s.original_max_position_embeddings)
                    && s.high_freq_factor != s.low_freq_factor
            }
            Some(RopeScaling::Yarn(y)) => {
                factor_ok(y.factor)
                    && y.original_max_position_embeddings >= 1.0
                    && factor_ok(y.beta_fast)
                    && factor_ok(y.beta_slow)
                    && y.attention_factor.is_finite()
            }
        };
        if !scaling_ok {
            return Err(cfg_err(format!(
                "bad RoPE scaling parameters: {:?}",
                self.rope_scaling
            )));
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

/// GGUF `{arch}.rope.scaling.*`, read as llama.cpp's `llama_model::load_hparams` does: the type
/// (default "linear") with `rope.scaling.factor` (or the older `rope.scale_linear`); type
/// "none", or linear with no factor (or 0, or 1) mean no scaling. YaRN reads
/// `rope.scaling.original_context_length` (default: the context length), the optional
/// `rope.scaling.yarn_beta_fast` / `yarn_beta_slow`, and `rope.scaling.attn_factor`, which
/// llama.cpp multiplies into YaRN's default attention factor `0.1·ln(factor) + 1`. Types
/// this crate does not build (longrope, …) and YaRN variants it does not model (an
/// extrapolation factor other than 1, DeepSeek's log multiplier) are typed errors.
fn gguf_rope_scaling(
    md: &Metadata,
    arch: &str,
    context_length: usize,
) -> Result<Option<RopeScaling>> {
    let key = |k: &str| format!("{arch}.{k}");
    let float = |k: &str| -> Result<Option<f32>> {
        match md.get(&key(k)) {
            None => Ok(None),
            Some(v) => v
                .as_f32()
                .map(Some)
                .ok_or_else(|| cfg_err(format!("{} is not a number", key(k)))),
        }
    };
    let kind = match md.get(&key("rope.scaling.type")) {
        None => "linear",
        Some(v) => v
            .as_str()
            .ok_or_else(|| cfg_err(format!("{} is not a string", key("rope.scaling.type"))))?,
    };
    let factor = match float("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => float("rope.scale_linear")?,
    };
    match kind {
        "none" => Ok(None),
        "linear" => {
            if float("rope.scaling.attn_factor")?.is_some_and(|a| a != 1.0) {
                return Err(ModelError::Unsupported(format!(
                    "linear RoPE scaling with {}",
                    key("rope.scaling.attn_factor")
                )));
            }
            Ok(factor
                .filter(|&f| f != 0.0 && f != 1.0)
                .map(|factor| RopeScaling::Linear { factor }))
        }
        "yarn" => {
            // llama.cpp: a negative extrapolation factor means "unset", i.e. 1 for YaRN.
            if let Some(ext) = float("rope.scaling.yarn_ext_factor")? {
                if ext >= 0.0 && ext != 1.0 {
                    return Err(ModelError::Unsupported(format!(
                        "YaRN with {} = {ext} (only 1 is supported)",
                        key("rope.scaling.yarn_ext_factor")
                    )));
                }
            }
            if float("rope.scaling.yarn_log_multiplier")?.is_some_and(|m| m != 0.0) {
                return Err(ModelError::Unsupported(format!(
                    "YaRN with {} (DeepSeek's mscale)",
                    key("rope.scaling.yarn_log_multiplier")
                )));
            }
            let original = match md.get(&key("rope.scaling.original_context_length")) {
                None => context_length as f32,
                Some(v) => v.as_u64().ok_or_else(|| {
                    cfg_err(format!(
                        "{} is not an integer",
                        key("rope.scaling.original_context_length")
                    ))
                })? as f32,
            };
            let factor = factor.filter(|&f| f != 0.0).unwrap_or(1.0);
            let mut yarn = YarnScaling::new(factor, original);
            if let Some(b) = float("rope.scaling.yarn_beta_fast")? {
                yarn.beta_fast = b;
            }
            if let Some(b) = float("rope.scaling.yarn_beta_slow")? {
                yarn.beta_slow = b;
            }
            if let Some(a) = float("rope.scaling.attn_factor")? {
                yarn.attention_factor *= a;
            }
            Ok(Some(RopeScaling::Yarn(yarn)))
        }
        other => Err(ModelError::Unsupported(format!(
            "RoPE scaling type '{other}' ({}; supported: none, linear, yarn)",
            key("rope.scaling.type")
        ))),
    }
}

/// config.json `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5), as
/// transformers' `ROPE_INIT_FUNCTIONS` read them: "default" (or none), "linear", "llama3",
/// "yarn". Other types ("dynamic", "longrope", …) are [`ModelError::Unsupported`].
fn hf_rope_scaling(
    v: &Value,
    params: &Value,
    max_position_embeddings: usize,
) -> Result<Option<RopeScaling>> {
    if params.is_null() {
        return Ok(None);
    }
    let kind = params["rope_type"]
        .as_str()
        .or(params["type"].as_str())
        .unwrap_or("default");
    let opt = |k: &str| -> Result<Option<f32>> {
        match &params[k] {
            Value::Null => Ok(None),
            x => x
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| cfg_err(format!("config.json: rope_scaling.{k} is not a number"))),
        }
    };
    let req = |k: &str| -> Result<f32> {
        opt(k)?.ok_or_else(|| cfg_err(format!("config.json: rope_scaling.{k} is missing")))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: req("factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3(Llama3Scaling {
            factor: req("factor")?,
            low_freq_factor: req("low_freq_factor")?,
            high_freq_factor: req("high_freq_factor")?,
            original_max_position_embeddings: req("original_max_position_embeddings")?,
        }))),
        "yarn" => {
            // transformers 5 moves a top-level `original_max_position_embeddings` (Phi-3
            // style) into the rope parameters, defaulting to `max_position_embeddings`.
            let top_level = match &v["original_max_position_embeddings"] {
                Value::Null => None,
                x => Some(x.as_f64().ok_or_else(|| {
                    cfg_err("config.json: 'original_max_position_embeddings' is not a number")
                })? as f32),
            };
            let original = opt("original_max_position_embeddings")?
                .or(top_level)
                .unwrap_or(max_position_embeddings as f32);
            // No factor: the ratio of the two context lengths (DeepSeek-V3's convention).
            let factor = match opt("factor")? {
                Some(f) => f,
                None => max_position_embeddings as f32 / original,
            };
            let mut yarn = YarnScaling::new(factor, original);
            // `or` in transformers: a 0 or null beta takes the default.
            if let Some(b) = opt("beta_fast")?.filter(|&b| b != 0.0) {
                yarn.beta_fast = b;
            }
            if let Some(b) = opt("beta_slow")?.filter(|&b| b != 0.0) {
                yarn.beta_slow = b;
            }
            if let Value::Bool(t) = params["truncate"] {
                yarn.truncate = t;
            }
            yarn.attention_factor = match (
                opt("attention_factor")?,
                opt("mscale")?,
                opt("mscale_all_dim")?,
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    YarnScaling::mscale(factor, m) / YarnScaling::mscale(factor, all)
                }
                _ => YarnScaling::default_attention_factor(factor),
            };
            Ok(Some(RopeScaling::Yarn(yarn)))
        }
        other => Err(ModelError::Unsupported(format!(
            "rope_scaling type '{other}' (supported: default, linear, llama3, yarn)"
        ))),
    }
}

/// The sliding window of a config.json, as transformers reads it: Mistral's
/// `sliding_window` (default 4096; `null`: none); Qwen2's only with `use_sliding_window`, on
/// the layers `layer_types` (or `max_window_layers`) marks as sliding. A window on only some
/// layers is [`ModelError::Unsupported`]. Llama configs have none.
fn hf_sliding_window(v: &Value, model_type: &str, n_layers: usize) -> Result<Option<usize>> {
    let window = |default: Option<u64>| -> Result<Option<usize>> {
        match &v["sliding_window"] {
            Value::Null if v.get("sliding_window").is_some() => Ok(None),
            Value::Null => Ok(default.map(|w| w as usize)),
            x => x
                .as_u64()
                .map(|w| Some(w as usize))
                .ok_or_else(|| cfg_err("config.json: 'sliding_window' is not an integer")),
        }
    };
    match model_type {
        "mistral" => window(Some(4096)),
        "qwen2" => {
            if v["use_sliding_window"].as_bool() != Some(true) {
                return Ok(None);
            }
            let Some(w) = window(Some(4096))? else {
                return Ok(None);
            };
            let sliding: Vec<bool> = match v["layer_types"].as_array() {
                Some(types) => types
                    .iter()
                    .map(|t| t.as_str() == Some("sliding_attention"))
                    .collect(),
                None => {
                    let first = v["max_window_layers"].as_u64().unwrap_or(28) as usize;
                    (0..n_layers).map(|i| i >= first).collect()
                }
            };
            if sliding.iter().all(|&s| !s) {
                Ok(None)
            } else if sliding.iter().all(|&s| s) {
                Ok(Some(w))
            } else {
                Err(ModelError::Unsupported(
                    "a sliding window on only some layers (Qwen2 max_window_layers)".into(),
                ))
            }
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use luminal_io::GgufFile;

    /// A metadata value of [`gguf_metadata`].
    #[derive(Clone, Copy)]
    enum Kv {
        U32(u32),
        F32(f32),
        Str(&'static str),
    }

    /// A GGUF with metadata only: the minimal Llama keys of `arch` plus `extra` (keys without
    /// the `{arch}.` prefix).
    fn gguf_metadata(arch: &'static str, extra: &[(&str, Kv)]) -> GgufFile {
        let mut kv: Vec<(String, Kv)> = vec![
            ("general.architecture".into(), Kv::Str(arch)),
            (format!("{arch}.embedding_length"), Kv::U32(32)),
            (format!("{arch}.attention.head_count"), Kv::U32(2)),
            (format!("{arch}.attention.head_count_kv"), Kv::U32(1)),
            (format!("{arch}.feed_forward_length"), Kv::U32(32)),
            (format!("{arch}.block_count"), Kv::U32(2)),
            (format!("{arch}.context_length"), Kv::U32(4096)),
            (format!("{arch}.vocab_size"), Kv::U32(64)),
            (
                format!("{arch}.attention.layer_norm_rms_epsilon"),
                Kv::F32(1e-5),
            ),
        ];
        kv.extend(extra.iter().map(|(k, v)| (format!("{arch}.{k}"), *v)));
        let string = |s: &str| {
            let mut b = (s.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(s.as_bytes());
            b
        };
        // GGUF v3: magic, version, tensor count, key count, then (key, type, value) triples.
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        bytes.extend((kv.len() as u64).to_le_bytes());
        for (k, v) in kv {
            bytes.extend(string(&k));
            match v {
                Kv::U32(x) => {
                    bytes.extend(4u32.to_le_bytes());
                    bytes.extend(x.to_le_bytes());
                }
                Kv::F32(x) => {
                    bytes.extend(6u32.to_le_bytes());
                    bytes.extend(x.to_le_bytes());
                }
                Kv::Str(x) => {
                    bytes.extend(8u32.to_le_bytes());
                    bytes.extend(string(x));
                }
            }
        }
        GgufFile::from_bytes(bytes).unwrap()
    }

    fn from_gguf(arch: &'static str, extra: &[(&str, Kv)]) -> Result<LlamaConfig> {
        LlamaConfig::from_gguf(gguf_metadata(arch, extra).metadata(), true, false)
    }

    #[test]
    fn gguf_rope_scaling_types() {
        assert_eq!(from_gguf("llama", &[]).unwrap().rope_scaling, None);
        let linear = from_gguf(
            "llama",
            &[
                ("rope.scaling.type", Kv::Str("linear")),
                ("rope.scaling.factor", Kv::F32(2.0)),
            ],
        )
        .unwrap();
        assert_eq!(
            linear.rope_scaling,
            Some(RopeScaling::Linear { factor: 2.0 })
        );
        // The older key, with the type left to its default ("linear").
        let legacy = from_gguf("llama", &[("rope.scale_linear", Kv::F32(4.0))]).unwrap();
        assert_eq!(
            legacy.rope_scaling,
            Some(RopeScaling::Linear { factor: 4.0 })
        );
        // "none" ignores a factor; a factor of 1 is no scaling.
        let none = from_gguf(
            "llama",
            &[
                ("rope.scaling.type", Kv::Str("none")),
                ("rope.scaling.factor", Kv::F32(2.0)),
            ],
        )
        .unwrap();
        assert_eq!(none.rope_scaling, None);
        let one = from_gguf("llama", &[("rope.scaling.factor", Kv::F32(1.0))]).unwrap();
        assert_eq!(one.rope_scaling, None);
    }

    #[test]
    fn gguf_yarn_keys_and_defaults() {
        let yarn = |extra: &[(&str, Kv)]| match from_gguf("llama", extra).unwrap().rope_scaling {
            Some(RopeScaling::Yarn(y)) => y,
            other => panic!("not yarn: {other:?}"),
        };
        // Defaults: original context = context length, betas 32/1, 0.1·ln(factor) + 1.
        let y = yarn(&[
            ("rope.scaling.type", Kv::Str("yarn")),
            ("rope.scaling.factor", Kv::F32(4.0)),
        ]);
        assert_eq!(y, YarnScaling::new(4.0, 4096.0));
        assert_eq!((y.beta_fast, y.beta_slow), (32.0, 1.0));
        assert!((y.attention_factor - 1.138_629_4).abs() < 1e-6);
        let y = yarn(&[
            ("rope.scaling.type", Kv::Str("yarn")),
            ("rope.scaling.factor", Kv::F32(8.0)),
            ("rope.scaling.original_context_length", Kv::U32(1024)),
            ("rope.scaling.yarn_beta_fast", Kv::F32(24.0)),
            ("rope.scaling.yarn_beta_slow", Kv::F32(2.0)),
            ("rope.scaling.attn_factor", Kv::F32(0.5)),
        ]);
        assert_eq!(y.original_max_position_embeddings, 1024.0);
        assert_eq!((y.factor, y.beta_fast, y.beta_slow), (8.0, 24.0, 2.0));
        assert!((y.attention_factor - 0.5 * (0.1 * 8f32.ln() + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn gguf_unknown_or_unmodelled_scaling_is_a_typed_error() {
        for extra in [
            vec![("rope.scaling.type", Kv::Str("longrope"))],
            vec![
                ("rope.scaling.type", Kv::Str("yarn")),
                ("rope.scaling.factor", Kv::F32(4.0)),
                ("rope.scaling.yarn_ext_factor", Kv::F32(0.5)),
            ],
            vec![
                ("rope.scaling.type", Kv::Str("yarn")),
                ("rope.scaling.factor", Kv::F32(4.0)),
                ("rope.scaling.yarn_log_multiplier", Kv::F32(0.1)),
            ],
        ] {
            let err = from_gguf("llama", &extra).unwrap_err();
            assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
        }
        let err = from_gguf("llama", &[("rope.scaling.type", Kv::U32(1))]).unwrap_err();
        assert!(matches!(err, ModelError::Config(_)), "{err}");
        let err = from_gguf(
            "llama",
            &[
                ("rope.scaling.type", Kv::Str("linear")),
                ("rope.scaling.factor", Kv::F32(-2.0)),
            ],
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::Config(_)), "{err}");
    }

    #[test]
    fn gguf_sliding_window() {
        let c = from_gguf("mistral", &[("attention.sliding_window", Kv::U32(4096))]).unwrap();
        assert_eq!(
            (c.architecture.as_str(), c.sliding_window),
            ("mistral", Some(4096))
        );
        assert_eq!(c.rope_layout, RopeLayout::Interleaved);
        assert_eq!(from_gguf("mistral", &[]).unwrap().sliding_window, None);
        let zero = from_gguf("llama", &[("attention.sliding_window", Kv::U32(0))]).unwrap();
        assert_eq!(zero.sliding_window, None);
        let err = from_gguf(
            "llama",
            &[
                ("attention.sliding_window", Kv::U32(128)),
                ("attention.sliding_window_pattern", Kv::U32(4)),
            ],
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
    }

    fn hf(model_type: &str, extra: &str) -> Result<LlamaConfig> {
        let sep = if extra.is_empty() { "" } else { "," };
        LlamaConfig::from_hf_json(&format!(
            r#"{{"model_type": "{model_type}", "vocab_size": 64, "hidden_size": 32,
                "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 8192{sep}{extra}}}"#
        ))
    }

    #[test]
    fn hf_rope_scaling_types() {
        assert_eq!(hf("llama", "").unwrap().rope_scaling, None);
        let c = hf(
            "llama",
            r#""rope_scaling": {"type": "linear", "factor": 2.0}"#,
        )
        .unwrap();
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        // transformers 5 layout.
        let c = hf(
            "llama",
            r#""rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 5e5}"#,
        )
        .unwrap();
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 3.0 }));
        assert_eq!(c.rope_theta, 5e5);
        let c = hf(
            "llama",
            r#""rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 2048}"#,
        )
        .unwrap();
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling::Yarn(YarnScaling::new(4.0, 2048.0)))
        );
        // Every YaRN option; the original context defaults to max_position_embeddings.
        let c = hf(
            "llama",
            r#""rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16,
                "beta_slow": 2, "attention_factor": 1.25, "truncate": false}"#,
        )
        .unwrap();
        let want = YarnScaling {
            beta_fast: 16.0,
            beta_slow: 2.0,
            attention_factor: 1.25,
            truncate: false,
            ..YarnScaling::new(8.0, 8192.0)
        };
        assert_eq!(c.rope_scaling, Some(RopeScaling::Yarn(want)));
        // DeepSeek's mscale pair: get_mscale(f, mscale) / get_mscale(f, mscale_all_dim).
        let c = hf(
            "llama",
            r#""rope_scaling": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                "mscale_all_dim": 0.5, "original_max_position_embeddings": 4096}"#,
        )
        .unwrap();
        let Some(RopeScaling::Yarn(y)) = c.rope_scaling else {
            panic!("not yarn")
        };
        let want = (0.1 * 40f32.ln() + 1.0) / (0.05 * 40f32.ln() + 1.0);
        assert!((y.attention_factor - want).abs() < 1e-6);
        for kind in ["dynamic", "longrope", "something"] {
            let err = hf(
                "llama",
                &format!(r#""rope_scaling": {{"rope_type": "{kind}", "factor": 2.0}}"#),
            )
            .unwrap_err();
            assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
        }
        let err = hf("llama", r#""rope_scaling": {"rope_type": "linear"}"#).unwrap_err();
        assert!(matches!(err, ModelError::Config(_)), "{err}");
    }

    #[test]
    fn hf_sliding_window() {
        // Mistral: an explicit window, null, and transformers' default of 4096.
        assert_eq!(
            hf("mistral", r#""sliding_window": 16"#)
                .unwrap()
                .sliding_window,
            Some(16)
        );
        assert_eq!(
            hf("mistral", r#""sliding_window": null"#)
                .unwrap()
                .sliding_window,
            None
        );
        assert_eq!(hf("mistral", "").unwrap().sliding_window, Some(4096));
        // Llama has none; Qwen2 only with use_sliding_window, and only on whole models.
        assert_eq!(
            hf("llama", r#""sliding_window": 16"#)
                .unwrap()
                .sliding_window,
            None
        );
        let qwen = |extra: &str| hf("qwen2", extra);
        assert_eq!(
            qwen(r#""sliding_window": 16, "use_sliding_window": false"#)
                .unwrap()
                .sliding_window,
            None
        );
        assert_eq!(
            qwen(r#""sliding_window": 16, "use_sliding_window": true, "max_window_layers": 0"#)
                .unwrap()
                .sliding_window,
            Some(16)
        );
        assert_eq!(
            qwen(r#""sliding_window": 16, "use_sliding_window": true, "max_window_layers": 28"#)
                .unwrap()
                .sliding_window,
            None
        );
        let err = qwen(
            r#""sliding_window": 16, "use_sliding_window": true,
               "layer_types": ["full_attention", "sliding_attention"]"#,
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
        let err = hf("mistral", r#""sliding_window": 0"#).unwrap_err();
        assert!(matches!(err, ModelError::Config(_)), "{err}");
    }
}
