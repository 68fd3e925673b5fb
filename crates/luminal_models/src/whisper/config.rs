//! Whisper hyper-parameters (`config.json`) and decoding settings (`generation_config.json`).

use crate::bert::read_json;
use crate::config::{cfg_err, positive_usize};
use crate::error::{ModelError, Result};
use luminal_nn::Activation;
use serde_json::Value;
use std::path::Path;

/// What builds a Whisper encoder–decoder (transformers' `WhisperConfig` names).
#[derive(Clone, Debug, PartialEq)]
pub struct WhisperConfig {
    pub vocab_size: usize,
    pub n_mels: usize,
    pub d_model: usize,
    pub encoder_layers: usize,
    pub encoder_heads: usize,
    pub encoder_ffn: usize,
    pub decoder_layers: usize,
    pub decoder_heads: usize,
    pub decoder_ffn: usize,
    /// Encoder positions (1500: 30 s after the stride-2 convolution).
    pub max_source_positions: usize,
    /// Decoder positions (448): prompt and generated tokens together.
    pub max_target_positions: usize,
    pub activation: Activation,
    /// Token embeddings times √d_model (false in every released Whisper).
    pub scale_embedding: bool,
}

impl WhisperConfig {
    pub fn from_hf_json(text: &str) -> Result<WhisperConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| cfg_err(format!("config.json is not valid JSON: {e}")))?;
        Self::from_value(&v)
    }

    pub(crate) fn from_value(v: &Value) -> Result<WhisperConfig> {
        let model_type = v["model_type"].as_str().unwrap_or("");
        if model_type != "whisper" {
            return Err(ModelError::Unsupported(format!(
                "model_type '{model_type}' (the Whisper loader reads model_type 'whisper')"
            )));
        }
        let usize_of = |k: &str| positive_usize(v, k);
        let act_name = v["activation_function"].as_str().unwrap_or("gelu");
        let activation = Activation::from_hf_name(act_name)
            .ok_or_else(|| ModelError::Unsupported(format!("activation_function '{act_name}'")))?;
        let c = WhisperConfig {
            vocab_size: usize_of("vocab_size")?,
            n_mels: usize_of("num_mel_bins")?,
            d_model: usize_of("d_model")?,
            encoder_layers: usize_of("encoder_layers")?,
            encoder_heads: usize_of("encoder_attention_heads")?,
            encoder_ffn: usize_of("encoder_ffn_dim")?,
            decoder_layers: usize_of("decoder_layers")?,
            decoder_heads: usize_of("decoder_attention_heads")?,
            decoder_ffn: usize_of("decoder_ffn_dim")?,
            max_source_positions: usize_of("max_source_positions")?,
            max_target_positions: usize_of("max_target_positions")?,
            activation,
            scale_embedding: v["scale_embedding"].as_bool().unwrap_or(false),
        };
        for (what, heads) in [("encoder", c.encoder_heads), ("decoder", c.decoder_heads)] {
            if !c.d_model.is_multiple_of(heads) {
                return Err(cfg_err(format!(
                    "d_model {} is not a multiple of the {what}'s {heads} attention heads",
                    c.d_model
                )));
            }
        }
        if c.max_source_positions * 2 != super::audio::N_FRAMES {
            return Err(ModelError::Unsupported(format!(
                "max_source_positions {} (30-second windows need 1500)",
                c.max_source_positions
            )));
        }
        Ok(c)
    }
}

/// The decoding settings of `generation_config.json` that greedy decoding honours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenerationConfig {
    /// Never generated.
    pub suppress_tokens: Vec<u32>,
    /// Not generated as the first token.
    pub begin_suppress_tokens: Vec<u32>,
    /// `is_multilingual` (absent: decided by the tokenizer's language tokens).
    pub is_multilingual: Option<bool>,
    /// `max_initial_timestamp_index`: with timestamps, the first one is at most this many
    /// 20 ms steps (absent: 50, i.e. 1.00 s, OpenAI's default).
    pub max_initial_timestamp_index: Option<usize>,
}

impl GenerationConfig {
    /// From the folder's `generation_config.json`; defaults when the file is absent.
    pub fn from_dir(dir: &Path) -> Result<GenerationConfig> {
        let path = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(GenerationConfig::default());
        }
        let v = read_json(&path)?;
        let ids = |k: &str| -> Result<Vec<u32>> {
            match &v[k] {
                Value::Null => Ok(Vec::new()),
                Value::Array(a) => a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| {
                                cfg_err(format!(
                                    "{}: {k} must hold token ids, got {x}",
                                    path.display()
                                ))
                            })
                    })
                    .collect(),
                other => Err(cfg_err(format!(
                    "{}: {k} must be a list of token ids, got {other}",
                    path.display()
                ))),
            }
        };
        Ok(GenerationConfig {
            suppress_tokens: ids("suppress_tokens")?,
            begin_suppress_tokens: ids("begin_suppress_tokens")?,
            is_multilingual: v["is_multilingual"].as_bool(),
            max_initial_timestamp_index: v["max_initial_timestamp_index"]
                .as_u64()
                .map(|n| n as usize),
        })
    }
}
