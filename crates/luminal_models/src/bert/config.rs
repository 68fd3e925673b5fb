//! BERT hyper-parameters (`config.json`) and the sentence-transformers pipeline around the
//! encoder (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`).

use crate::config::{cfg_err, positive_usize};
use crate::error::{ModelError, Result};
use luminal_io::IoError;
use luminal_nn::Activation;
use serde_json::Value;
use std::path::Path;

/// Reads a JSON file of a model folder: a missing file is [`IoError::NotFound`], unreadable
/// or invalid JSON a [`ModelError::Config`] naming the file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ModelError::Io(IoError::NotFound {
                path: path.to_path_buf(),
            })
        } else {
            cfg_err(format!("cannot read {}: {e}", path.display()))
        }
    })?;
    serde_json::from_str(&text)
        .map_err(|e| cfg_err(format!("{} is not valid JSON: {e}", path.display())))
}

/// What builds a BERT encoder (transformers' `BertConfig` names).
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    /// Longest input in tokens (the rows of the position table).
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) table.
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
    /// The id batches are padded with (masked out, so its value does not change results).
    pub pad_token_id: u32,
}

impl BertConfig {
    /// From a Hugging Face `config.json` of `model_type` `bert` (absolute positions).
    pub fn from_hf_json(text: &str) -> Result<BertConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| cfg_err(format!("config.json is not valid JSON: {e}")))?;
        Self::from_value(&v)
    }

    pub(crate) fn from_value(v: &Value) -> Result<BertConfig> {
        if !v.is_object() {
            return Err(cfg_err("config.json must be a JSON object"));
        }
        let model_type = v["model_type"].as_str().unwrap_or("");
        if model_type != "bert" {
            return Err(ModelError::Unsupported(format!(
                "model_type '{model_type}' (the BERT loader reads model_type 'bert')"
            )));
        }
        let usize_of = |k: &str| positive_usize(v, k);
        let act_name = v["hidden_act"].as_str().unwrap_or("gelu");
        let hidden_act = Activation::from_hf_name(act_name)
            .ok_or_else(|| ModelError::Unsupported(format!("hidden_act '{act_name}'")))?;
        match v["position_embedding_type"].as_str() {
            None | Some("absolute") => {}
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "position_embedding_type '{other}' (only 'absolute')"
                )))
            }
        }
        let layer_norm_eps = match &v["layer_norm_eps"] {
            Value::Null => 1e-12,
            x => x
                .as_f64()
                .filter(|e| e.is_finite() && *e >= 0.0)
                .ok_or_else(|| {
                    cfg_err(format!("\"layer_norm_eps\" must be a number ≥ 0, got {x}"))
                })? as f32,
        };
        let c = BertConfig {
            vocab_size: usize_of("vocab_size")?,
            hidden_size: usize_of("hidden_size")?,
            n_layers: usize_of("num_hidden_layers")?,
            n_heads: usize_of("num_attention_heads")?,
            intermediate_size: usize_of("intermediate_size")?,
            hidden_act,
            max_position_embeddings: usize_of("max_position_embeddings")?,
            type_vocab_size: match v["type_vocab_size"] {
                Value::Null => 2,
                _ => usize_of("type_vocab_size")?,
            },
            layer_norm_eps,
            pad_token_id: v["pad_token_id"].as_u64().unwrap_or(0) as u32,
        };
        if !c.hidden_size.is_multiple_of(c.n_heads) {
            return Err(cfg_err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                c.hidden_size, c.n_heads
            )));
        }
        Ok(c)
    }
}

/// How token states become one sentence vector (sentence-transformers' `Pooling`). With
/// several modes the vectors are concatenated in sentence-transformers' order: CLS, max,
/// mean, mean·√len.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pooling {
    pub cls: bool,
    pub max: bool,
    pub mean: bool,
    pub mean_sqrt_len: bool,
}

impl Pooling {
    /// Mean over the real (unpadded) tokens: sentence-transformers' default.
    pub const MEAN: Pooling = Pooling {
        cls: false,
        max: false,
        mean: true,
        mean_sqrt_len: false,
    };

    /// From `1_Pooling/config.json`: the `pooling_mode_*_tokens` flags (sentence-transformers
    /// 2–5) or the `pooling_mode` name or list of names (6+). Modes this crate does not
    /// compute (weighted mean, last token) are [`ModelError::Unsupported`].
    pub fn from_json(v: &Value) -> Result<Pooling> {
        let mut p = Pooling {
            cls: false,
            max: false,
            mean: false,
            mean_sqrt_len: false,
        };
        let mut set = |mode: &str| -> Result<()> {
            match mode {
                "cls" | "cls_token" => p.cls = true,
                "max" | "max_tokens" => p.max = true,
                "mean" | "mean_tokens" => p.mean = true,
                "mean_sqrt_len_tokens" | "mean_sqrt_len" => p.mean_sqrt_len = true,
                other => {
                    return Err(ModelError::Unsupported(format!(
                        "sentence-transformers pooling mode '{other}'"
                    )))
                }
            }
            Ok(())
        };
        match &v["pooling_mode"] {
            Value::Null => {}
            Value::String(mode) => set(mode)?,
            Value::Array(modes) => {
                for m in modes {
                    let m = m.as_str().ok_or_else(|| {
                        cfg_err(format!("pooling_mode entries must be strings, got {m}"))
                    })?;
                    set(m)?;
                }
            }
            other => {
                return Err(cfg_err(format!(
                    "pooling_mode must be a string or a list of strings, got {other}"
                )))
            }
        }
        if let Some(flags) = v.as_object() {
            for (key, value) in flags {
                if let Some(mode) = key.strip_prefix("pooling_mode_") {
                    if value.as_bool() == Some(true) {
                        set(mode)?;
                    }
                }
            }
        }
        if p.modes() == 0 {
            return Err(cfg_err("the pooling config enables no pooling mode"));
        }
        Ok(p)
    }

    /// How many vectors are concatenated.
    pub fn modes(&self) -> usize {
        [self.cls, self.max, self.mean, self.mean_sqrt_len]
            .iter()
            .filter(|&&b| b)
            .count()
    }
}

/// The sentence-transformers pipeline of a folder: pooling, L2 normalisation, and the
/// maximum input length. A plain BERT folder (no `modules.json`) gets mean pooling without
/// normalisation, as sentence-transformers gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SentenceConfig {
    pub pooling: Pooling,
    /// A `Normalize` module follows the pooling (unit-length embeddings).
    pub normalize: bool,
    /// The longest input in tokens, specials included: `sentence_bert_config.json`'s
    /// `max_seq_length` (sentence-transformers ≤ 5), else `tokenizer_config.json`'s
    /// `model_max_length` (where sentence-transformers 6 keeps it).
    pub max_seq_length: Option<usize>,
}

impl SentenceConfig {
    pub fn from_dir(dir: &Path) -> Result<SentenceConfig> {
        let mut config = SentenceConfig {
            pooling: Pooling::MEAN,
            normalize: false,
            max_seq_length: None,
        };
        let modules_path = dir.join("modules.json");
        if modules_path.is_file() {
            let modules = read_json(&modules_path)?;
            let list = modules.as_array().ok_or_else(|| {
                cfg_err(format!("{} must be a JSON list", modules_path.display()))
            })?;
            for m in list {
                let kind = m["type"].as_str().unwrap_or("");
                let sub = dir.join(m["path"].as_str().unwrap_or(""));
                match kind.rsplit('.').next().unwrap_or("") {
                    "Transformer" => {}
                    "Pooling" => {
                        config.pooling = Pooling::from_json(&read_json(&sub.join("config.json"))?)
                            .map_err(|e| match e {
                                ModelError::Config(msg) => {
                                    cfg_err(format!("{}: {msg}", sub.join("config.json").display()))
                                }
                                e => e,
                            })?;
                    }
                    "Normalize" => config.normalize = true,
                    _ => {
                        return Err(ModelError::Unsupported(format!(
                            "sentence-transformers module '{kind}' in {}",
                            modules_path.display()
                        )))
                    }
                }
            }
        }
        let length = |path: &Path, key: &str| -> Result<Option<usize>> {
            if !path.is_file() {
                return Ok(None);
            }
            match &read_json(path)?[key] {
                Value::Null => Ok(None),
                x => match x.as_u64().or_else(|| x.as_f64().map(|f| f as u64)) {
                    // transformers writes a huge number for "no limit".
                    Some(n) if n >= 1 << 40 => Ok(None),
                    Some(n) if n >= 2 => Ok(Some(n as usize)),
                    _ => Err(cfg_err(format!(
                        "{}: {key} must be an integer ≥ 2, got {x}",
                        path.display()
                    ))),
                },
            }
        };
        config.max_seq_length =
            match length(&dir.join("sentence_bert_config.json"), "max_seq_length")? {
                Some(n) => Some(n),
                None if modules_path.is_file() => {
                    length(&dir.join("tokenizer_config.json"), "model_max_length")?
                }
                None => None,
            };
        Ok(config)
    }
}
