//! Loading Hugging Face `tokenizer.json` files and model folders.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;
use tokenizers::Model;

use super::decode::{Piece, PieceTable};
use super::{byte_level, byte_token_value, Decoding, TokenType, Tokenizer, TokenizerKind};
use crate::error::{IoError, Result};
use crate::storage::os_error;

/// What `tokenizer_config.json` and friends say, all optional.
#[derive(Debug, Default)]
struct Config {
    bos: Option<String>,
    eos: Option<String>,
    pad: Option<String>,
    unk: Option<String>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    chat_template: Option<String>,
    /// `eos_token_id` of `generation_config.json` (one id or a list).
    generation_eos: Vec<u64>,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| os_error(path, e))
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = read(path)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| IoError::Tokenizer(format!("not valid JSON: {e}")).in_file(path))
}

fn parse_tokenizer_json(bytes: &[u8], path: &Path) -> Result<tokenizers::Tokenizer> {
    tokenizers::Tokenizer::from_bytes(bytes)
        .map_err(|e| IoError::Tokenizer(format!("not a valid tokenizer.json: {e}")).in_file(path))
}

pub(crate) fn from_file(path: &Path) -> Result<Tokenizer> {
    let inner = parse_tokenizer_json(&read(path)?, path)?;
    build(inner, Config::default()).map_err(|e| e.in_file(path))
}

pub(crate) fn from_dir(dir: &Path) -> Result<Tokenizer> {
    let tokenizer_path = dir.join("tokenizer.json");
    let inner = parse_tokenizer_json(&read(&tokenizer_path)?, &tokenizer_path)?;
    let mut config = Config::default();

    let config_path = dir.join("tokenizer_config.json");
    if config_path.is_file() {
        let json = read_json(&config_path)?;
        read_tokenizer_config(&json, &mut config).map_err(|e| e.in_file(&config_path))?;
    }
    // Older folders keep the special tokens in a separate file.
    let map_path = dir.join("special_tokens_map.json");
    if map_path.is_file() {
        let json = read_json(&map_path)?;
        let mut map = Config::default();
        read_tokenizer_config(&json, &mut map).map_err(|e| e.in_file(&map_path))?;
        config.bos = config.bos.or(map.bos);
        config.eos = config.eos.or(map.eos);
        config.pad = config.pad.or(map.pad);
        config.unk = config.unk.or(map.unk);
    }
    // transformers ≥ 4.43 saves the template beside the config.
    let jinja_path = dir.join("chat_template.jinja");
    if config.chat_template.is_none() && jinja_path.is_file() {
        let bytes = read(&jinja_path)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            IoError::InvalidUtf8 {
                what: "chat template".into(),
            }
            .in_file(&jinja_path)
        })?;
        config.chat_template = Some(text);
    }
    let template_json_path = dir.join("chat_template.json");
    if config.chat_template.is_none() && template_json_path.is_file() {
        let json = read_json(&template_json_path)?;
        config.chat_template =
            chat_template(json.get("chat_template")).map_err(|e| e.in_file(&template_json_path))?;
    }
    let generation_path = dir.join("generation_config.json");
    if generation_path.is_file() {
        let json = read_json(&generation_path)?;
        config.generation_eos = match json.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().into_iter().collect(),
            Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_u64).collect(),
            _ => Vec::new(),
        };
    }
    build(inner, config).map_err(|e| e.in_file(&tokenizer_path))
}

/// A special token of `tokenizer_config.json`: a string, or an AddedToken object with
/// `content`.
fn token_text(json: &Value, key: &str) -> Result<Option<String>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(object)) => match object.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(IoError::Tokenizer(format!(
                "{key} is an object without a string \"content\""
            ))),
        },
        Some(other) => Err(IoError::Tokenizer(format!(
            "{key} must be a string or an object with \"content\", found {other}"
        ))),
    }
}

fn optional_bool(json: &Value, key: &str) -> Result<Option<bool>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(IoError::Tokenizer(format!(
            "{key} must be true or false, found {other}"
        ))),
    }
}

/// A chat template: a string, or a list of `{name, template}` (the one named "default", else
/// the first).
fn chat_template(value: Option<&Value>) -> Result<Option<String>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(templates)) => {
            let named = |name: &str| {
                templates
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            };
            let chosen = named("default").or(templates.first());
            match chosen.and_then(|t| t.get("template")) {
                Some(Value::String(s)) => Ok(Some(s.clone())),
                None if templates.is_empty() => Ok(None),
                _ => Err(IoError::Tokenizer(
                    "chat_template list entries must have a string \"template\"".into(),
                )),
            }
        }
        Some(other) => Err(IoError::Tokenizer(format!(
            "chat_template must be a string or a list, found {other}"
        ))),
    }
}

fn read_tokenizer_config(json: &Value, config: &mut Config) -> Result<()> {
    if !json.is_object() {
        return Err(IoError::Tokenizer("expected a JSON object".into()));
    }
    config.bos = token_text(json, "bos_token")?;
    config.eos = token_text(json, "eos_token")?;
    config.pad = token_text(json, "pad_token")?;
    config.unk = token_text(json, "unk_token")?;
    config.add_bos = optional_bool(json, "add_bos_token")?;
    config.add_eos = optional_bool(json, "add_eos_token")?;
    config.chat_template = chat_template(json.get("chat_template"))?;
    Ok(())
}

/// How the tokens of a `tokenizer.json` decoder map to bytes, when they do one by one.
#[derive(Debug, Default, PartialEq)]
struct PieceStyle {
    byte_level: bool,
    /// `<0xNN>` tokens are bytes.
    byte_fallback: bool,
    /// Replace this text by that one in every token (`▁` → space).
    replace: Option<(String, String)>,
    /// Spaces dropped at the start of the text.
    strip: usize,
}

/// The per-token form of the decoder, or `None` when it has none (WordPiece, CTC, a regex
/// replace, no decoder at all: those go through the library's `decode`).
fn piece_style(decoder: &Value) -> Option<PieceStyle> {
    let mut style = PieceStyle::default();
    let steps: Vec<&Value> = match decoder.get("type").and_then(Value::as_str) {
        Some("Sequence") => decoder.get("decoders")?.as_array()?.iter().collect(),
        Some(_) => vec![decoder],
        None => return None,
    };
    let mut fused = false;
    for step in steps {
        match step.get("type").and_then(Value::as_str)? {
            "ByteLevel" => style.byte_level = true,
            "ByteFallback" => style.byte_fallback = true,
            "Fuse" => fused = true,
            "Replace" => {
                let from = step.get("pattern")?.get("String")?.as_str()?;
                let to = step.get("content")?.as_str()?;
                if style.replace.is_some() || from.is_empty() {
                    return None;
                }
                style.replace = Some((from.to_string(), to.to_string()));
            }
            "Strip" => {
                let single_leading_space =
                    step.get("content")?.as_str()? == " " && step.get("stop")?.as_u64()? == 0;
                // Only a strip of the fused text is a strip of the whole output.
                if !single_leading_space || !(fused || style.byte_level) {
                    return None;
                }
                style.strip += usize::try_from(step.get("start")?.as_u64()?).ok()?;
            }
            "Metaspace" => {
                let replacement = step.get("replacement")?.as_str()?;
                let prepends = match step.get("prepend_scheme").and_then(Value::as_str) {
                    Some(scheme) => scheme != "never",
                    None => step
                        .get("add_prefix_space")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                };
                if style.replace.is_some() {
                    return None;
                }
                style.replace = Some((replacement.to_string(), " ".to_string()));
                if prepends {
                    style.strip += 1;
                }
            }
            _ => return None,
        }
    }
    if style.byte_level && (style.replace.is_some() || style.byte_fallback) {
        return None;
    }
    Some(style)
}

fn normal_piece(text: &str, style: &PieceStyle) -> Piece {
    if style.byte_level {
        return Piece::new(
            byte_level::token_bytes(text).unwrap_or_else(|| text.as_bytes().to_vec()),
            false,
        );
    }
    if style.byte_fallback {
        if let Some(byte) = byte_token_value(text) {
            return Piece::new(vec![byte], false);
        }
    }
    match &style.replace {
        Some((from, to)) => Piece::new(text.replace(from.as_str(), to).into_bytes(), false),
        None => Piece::new(text.as_bytes().to_vec(), false),
    }
}

fn library(what: &str) -> impl Fn(tokenizers::Error) -> IoError + '_ {
    move |e| IoError::Tokenizer(format!("{what}: {e}"))
}

fn build(mut inner: tokenizers::Tokenizer, config: Config) -> Result<Tokenizer> {
    // Encodings are returned whole: no padding or truncation from the file.
    inner
        .with_truncation(None)
        .map_err(library("cannot disable truncation"))?;
    inner.with_padding(None);

    let model_vocab = inner.get_model().get_vocab();
    let added = inner.get_added_tokens_decoder();
    let n_ids = model_vocab
        .values()
        .chain(added.keys())
        .max()
        .map_or(0, |&m| m as usize + 1);
    if n_ids == 0 {
        return Err(IoError::Tokenizer("the vocabulary is empty".into()));
    }
    let mut texts: Vec<Option<String>> = vec![None; n_ids];
    let mut types = vec![TokenType::Unused; n_ids];
    for (text, &id) in &model_vocab {
        texts[id as usize] = Some(text.clone());
        types[id as usize] = TokenType::Normal;
    }
    for (&id, token) in &added {
        texts[id as usize] = Some(token.content.clone());
        types[id as usize] = if token.special {
            TokenType::Control
        } else {
            TokenType::UserDefined
        };
    }

    let decoder_json = match inner.get_decoder() {
        Some(decoder) => serde_json::to_value(decoder)
            .map_err(|e| IoError::Tokenizer(format!("cannot inspect the decoder: {e}")))?,
        None => Value::Null,
    };
    let decoding = match piece_style(&decoder_json) {
        Some(style) => {
            let pieces = (0..n_ids)
                .map(|id| match (&texts[id], types[id]) {
                    (None, _) => Piece::empty(),
                    (Some(text), TokenType::Control) => Piece::new(text.as_bytes().to_vec(), true),
                    (Some(text), TokenType::UserDefined) => {
                        Piece::new(text.as_bytes().to_vec(), false)
                    }
                    (Some(text), _) => normal_piece(text, &style),
                })
                .collect();
            if style.byte_fallback {
                for (id, text) in texts.iter().enumerate() {
                    if types[id] == TokenType::Normal
                        && text.as_deref().and_then(byte_token_value).is_some()
                    {
                        types[id] = TokenType::Byte;
                    }
                }
            }
            Decoding::Pieces(PieceTable::new(pieces, style.strip))
        }
        None => Decoding::Library,
    };

    // What the post-processor puts around a text (BOS/EOS, [CLS]/[SEP]).
    let plain = inner
        .encode_fast("a", false)
        .map_err(library("cannot encode a test text"))?
        .get_ids()
        .to_vec();
    let full = inner
        .encode_fast("a", true)
        .map_err(library("cannot encode a test text"))?
        .get_ids()
        .to_vec();
    let (mut prefix, mut suffix) = match full.windows(plain.len().max(1)).position(|w| w == plain) {
        Some(at) if !plain.is_empty() => (full[..at].to_vec(), full[at + plain.len()..].to_vec()),
        _ => (Vec::new(), Vec::new()),
    };

    let lookup = |text: &Option<String>| text.as_deref().and_then(|t| inner.token_to_id(t));
    let special_by_text = |candidates: &[&str]| {
        candidates.iter().find_map(|t| {
            let id = inner.token_to_id(t)?;
            (types.get(id as usize) == Some(&TokenType::Control)).then_some(id)
        })
    };
    let bos = lookup(&config.bos)
        .or_else(|| prefix.first().copied())
        .or_else(|| special_by_text(&["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"]));
    let eos = lookup(&config.eos)
        .or_else(|| suffix.last().copied())
        .or_else(|| special_by_text(&["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"]));
    let pad = lookup(&config.pad);
    let unk = lookup(&config.unk);

    // transformers rebuilds the post-processor from these flags when the config has them.
    if config.add_bos.is_some() || config.add_eos.is_some() {
        if let Some(add_bos) = config.add_bos {
            prefix = if add_bos {
                bos.into_iter().collect()
            } else {
                Vec::new()
            };
        }
        if let Some(add_eos) = config.add_eos {
            suffix = if add_eos {
                eos.into_iter().collect()
            } else {
                Vec::new()
            };
        }
    }

    let extra_stops = config
        .generation_eos
        .iter()
        .filter_map(|&id| u32::try_from(id).ok())
        .filter(|&id| (id as usize) < n_ids)
        .collect();

    let mut tokenizer = Tokenizer {
        kind: TokenizerKind::HuggingFace,
        inner,
        plain: OnceLock::new(),
        decoding,
        types,
        texts,
        prefix,
        suffix,
        bos,
        eos,
        eot: None,
        pad,
        unk,
        extra_stops,
        chat_template: config.chat_template,
    };
    tokenizer.eot = tokenizer.detect_eot();
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decoder_styles() {
        let llama = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]});
        assert_eq!(
            piece_style(&llama),
            Some(PieceStyle {
                byte_level: false,
                byte_fallback: true,
                replace: Some(("▁".into(), " ".into())),
                strip: 1
            })
        );
        let gpt2 = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        assert!(piece_style(&gpt2).unwrap().byte_level);
        let metaspace = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false});
        assert_eq!(piece_style(&metaspace).unwrap().strip, 1);
        let wordpiece = json!({"type": "WordPiece", "prefix": "##", "cleanup": true});
        assert_eq!(piece_style(&wordpiece), None);
        assert_eq!(piece_style(&Value::Null), None);
        let unfused_strip = json!({"type": "Sequence", "decoders": [
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]});
        assert_eq!(piece_style(&unfused_strip), None);
    }

    #[test]
    fn chat_template_forms() {
        assert_eq!(chat_template(Some(&json!("x"))).unwrap(), Some("x".into()));
        let list =
            json!([{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]);
        assert_eq!(chat_template(Some(&list)).unwrap(), Some("d".into()));
        assert!(chat_template(Some(&json!(3))).is_err());
        assert!(chat_template(Some(&json!([{"name": "default"}]))).is_err());
    }
}
