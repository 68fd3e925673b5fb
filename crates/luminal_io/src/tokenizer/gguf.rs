//! Building a [`Tokenizer`] from GGUF `tokenizer.*` metadata, following llama.cpp's
//! `llama-vocab.cpp` (what the file means) and `transformers`' GGUF converter (how to express
//! it as a `tokenizers::Tokenizer`).

use std::sync::OnceLock;

use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::decode::{Piece, PieceTable};
use super::{byte_level, byte_token_value, Decoding, TokenType, Tokenizer, TokenizerKind};
use crate::error::{IoError, Result};
use crate::gguf::{Metadata, MetadataArray, MetadataValue};

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const SCORES: &str = "tokenizer.ggml.scores";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const MERGES: &str = "tokenizer.ggml.merges";
const BOS: &str = "tokenizer.ggml.bos_token_id";
const EOS: &str = "tokenizer.ggml.eos_token_id";
const EOT: &str = "tokenizer.ggml.eot_token_id";
const EOM: &str = "tokenizer.ggml.eom_token_id";
const UNK: &str = "tokenizer.ggml.unknown_token_id";
const PAD: &str = "tokenizer.ggml.padding_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// The space marker of SentencePiece vocabularies.
const SPM_SPACE: &str = "\u{2581}";

// Pre-tokenizer regexes, as in llama.cpp's `llm_tokenizer_bpe` (llama-vocab.cpp).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// The tokenizer.json originals of the two patterns llama.cpp rewrites for its own engine.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How llama.cpp pre-tokenizes a byte-level BPE vocabulary of a given `tokenizer.ggml.pre`.
struct PreTokenizerSpec {
    /// Applied in order; each splits every piece into matches and the text between them.
    regexes: &'static [&'static str],
    /// A word that is itself a token is not merged further (Llama 3's tokenizer.json flag).
    ignore_merges: bool,
    /// The `add_bos` default when the file has no `tokenizer.ggml.add_bos_token`.
    add_bos: bool,
}

fn pre_tokenizer_spec(pre: &str) -> PreTokenizerSpec {
    let spec = |regexes, ignore_merges, add_bos| PreTokenizerSpec {
        regexes,
        ignore_merges,
        add_bos,
    };
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => spec(&[LLAMA3], true, true),
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => spec(&[LLAMA3], false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => {
            spec(&[QWEN2], false, false)
        }
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            spec(&[r"\p{N}", GPT2], false, false)
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo"
        | "jais" | "trillion" | "granite-docling" | "exaone4" => spec(&[GPT2], false, false),
        "gpt-4o" | "llama4" | "minimax-m2" => spec(&[GPT4O], false, false),
        "tekken" => spec(&[TEKKEN], true, true),
        "falcon" => spec(
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "deepseek-coder" => spec(
            &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            false,
            false,
        ),
        // "default", a missing key, and names llama.cpp does not know either.
        _ => spec(
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
    }
}

fn bad(key: &str, reason: impl Into<String>) -> IoError {
    IoError::BadTokenizerMetadata {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn wrong_type(key: &str, expected: &'static str, value: &MetadataValue) -> IoError {
    IoError::WrongMetadataType {
        key: key.to_string(),
        expected,
        found: value.type_description(),
    }
}

fn library_error(key: &str, error: tokenizers::Error) -> IoError {
    bad(key, error.to_string())
}

/// An optional token id. Negative values mean "none"; ids outside the vocabulary are ignored,
/// as llama.cpp does (it warns and keeps its default).
fn optional_id(metadata: &Metadata, key: &str, n_tokens: usize) -> Result<Option<u32>> {
    let Some(value) = metadata.get(key) else {
        return Ok(None);
    };
    if let Some(id) = value.as_i64() {
        return Ok(u32::try_from(id)
            .ok()
            .filter(|&id| (id as usize) < n_tokens));
    }
    if value.as_u64().is_some() {
        return Ok(None); // Larger than i64::MAX: certainly out of range.
    }
    Err(wrong_type(key, "an integer token id", value))
}

fn optional_bool(metadata: &Metadata, key: &str) -> Result<Option<bool>> {
    metadata
        .get(key)
        .map(|_| metadata.get_bool(key))
        .transpose()
}

/// An array of integers of any width, as i32 (values that do not fit become i32::MIN, an
/// undefined token type).
fn optional_i32s(metadata: &Metadata, key: &str) -> Result<Option<Vec<i32>>> {
    let Some(value) = metadata.get(key) else {
        return Ok(None);
    };
    let array = value
        .as_array()
        .ok_or_else(|| wrong_type(key, "array of integers", value))?;
    if let Some(values) = array.as_i32s() {
        return Ok(Some(values.to_vec()));
    }
    let integer_array = matches!(
        array,
        MetadataArray::U8(_)
            | MetadataArray::I8(_)
            | MetadataArray::U16(_)
            | MetadataArray::I16(_)
            | MetadataArray::U32(_)
            | MetadataArray::U64(_)
            | MetadataArray::I64(_)
    );
    if !integer_array {
        return Err(wrong_type(key, "array of integers", value));
    }
    let values = (0..array.len())
        .map(|i| array.get(i).and_then(|v| v.as_i32()).unwrap_or(i32::MIN))
        .collect();
    Ok(Some(values))
}

fn optional_f32s(metadata: &Metadata, key: &str) -> Result<Option<Vec<f32>>> {
    let Some(value) = metadata.get(key) else {
        return Ok(None);
    };
    match value.as_array() {
        Some(MetadataArray::F32(values)) => Ok(Some(values.clone())),
        Some(MetadataArray::F64(values)) => Ok(Some(values.iter().map(|&v| v as f32).collect())),
        _ => Err(wrong_type(key, "array of f32", value)),
    }
}

fn check_len(key: &str, len: usize, n_tokens: usize) -> Result<()> {
    if len == n_tokens {
        Ok(())
    } else {
        Err(bad(
            key,
            format!("has {len} entries but {TOKENS} has {n_tokens}"),
        ))
    }
}

pub(crate) fn from_metadata(metadata: &Metadata) -> Result<Tokenizer> {
    let model = metadata.get_str(MODEL)?;
    let kind = match model {
        "gpt2" => TokenizerKind::GgufBpe,
        "llama" => TokenizerKind::GgufSentencePiece,
        other => {
            return Err(IoError::UnsupportedTokenizer {
                model: other.to_string(),
            })
        }
    };
    let spm = kind == TokenizerKind::GgufSentencePiece;

    // Vocabulary. Empty strings are renamed like llama.cpp does, so that every id has a text.
    let raw_tokens = metadata.get_strings(TOKENS)?;
    let n_tokens = raw_tokens.len();
    if n_tokens == 0 {
        return Err(bad(TOKENS, "the vocabulary is empty"));
    }
    if u32::try_from(n_tokens).is_err() {
        return Err(bad(TOKENS, format!("{n_tokens} tokens do not fit u32 ids")));
    }
    let tokens: Vec<String> = raw_tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            }
        })
        .collect();
    let types: Vec<TokenType> = match optional_i32s(metadata, TOKEN_TYPE)? {
        Some(ids) => {
            check_len(TOKEN_TYPE, ids.len(), n_tokens)?;
            ids.into_iter().map(TokenType::from_gguf).collect()
        }
        None => vec![TokenType::Normal; n_tokens],
    };
    let scores = optional_f32s(metadata, SCORES)?;
    if let Some(scores) = &scores {
        check_len(SCORES, scores.len(), n_tokens)?;
    }
    // Later duplicates win, as in llama.cpp's token_to_id and a Python dict.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();

    // Special ids. llama.cpp's defaults for SentencePiece vocabularies: <unk>=0, <s>=1, </s>=2.
    let id = |key: &str, spm_default: Option<u32>| -> Result<Option<u32>> {
        if metadata.contains_key(key) {
            optional_id(metadata, key, n_tokens)
        } else if spm {
            Ok(spm_default.filter(|&d| (d as usize) < n_tokens))
        } else {
            Ok(None)
        }
    };
    let bos = id(BOS, Some(1))?;
    let eos = id(EOS, Some(2))?;
    let unk = id(UNK, Some(0))?;
    let pad = id(PAD, None)?;
    let eot = id(EOT, None)?;
    let eom = id(EOM, None)?;

    let pre = match metadata.get(PRE) {
        Some(value) => Some(
            value
                .as_str()
                .ok_or_else(|| wrong_type(PRE, "string", value))?,
        ),
        None => None,
    };
    let pre_spec = pre_tokenizer_spec(pre.unwrap_or("default"));

    let add_bos =
        optional_bool(metadata, ADD_BOS)?.unwrap_or(if spm { true } else { pre_spec.add_bos });
    let add_eos = optional_bool(metadata, ADD_EOS)?.unwrap_or(false);
    let add_space_prefix = spm && optional_bool(metadata, ADD_SPACE_PREFIX)?.unwrap_or(true);

    let chat_template = match metadata.get(CHAT_TEMPLATE) {
        Some(value) => Some(
            value
                .as_str()
                .ok_or_else(|| wrong_type(CHAT_TEMPLATE, "string", value))?
                .to_string(),
        ),
        None => None,
    };

    let mut inner = if spm {
        let merges = spm_merges(&tokens, scores.as_deref(), &types, &vocab);
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = unk {
            builder = builder.unk_token(tokens[unk as usize].clone());
        }
        let model = builder.build().map_err(|e| library_error(TOKENS, e))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        let replace = Replace::new(" ", SPM_SPACE).map_err(|e| library_error(TOKENS, e))?;
        let normalizer: NormalizerWrapper = if add_space_prefix {
            tokenizers::normalizers::Sequence::new(vec![
                Prepend::new(SPM_SPACE.to_string()).into(),
                replace.into(),
            ])
            .into()
        } else {
            replace.into()
        };
        inner.with_normalizer(Some(normalizer));
        inner
    } else {
        let merges = bpe_merges(metadata.get_strings(MERGES)?, &vocab)?;
        let model = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre_spec.ignore_merges)
            .build()
            .map_err(|e| library_error(MERGES, e))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for regex in pre_spec.regexes {
            let split = Split::new(
                SplitPattern::Regex((*regex).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| library_error(PRE, e))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        inner.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::sequence::Sequence::new(
            steps,
        )));
        inner
    };

    // Tokens matched whole in the input: control and unknown ones as special (only when
    // special tokens are parsed), user-defined ones always.
    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (text, ty) in tokens.iter().zip(&types) {
        match ty {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(text.clone(), true).normalized(false))
            }
            TokenType::UserDefined => {
                user_defined.push(AddedToken::from(text.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    inner.add_special_tokens(&special);
    inner.add_tokens(&user_defined);

    let pieces = tokens
        .iter()
        .zip(&types)
        .map(|(text, ty)| piece(text, *ty, spm))
        .collect();
    let decoding = Decoding::Pieces(PieceTable::new(pieces, usize::from(add_space_prefix)));

    let mut tokenizer = Tokenizer {
        kind,
        inner,
        plain: OnceLock::new(),
        decoding,
        types,
        texts: tokens.into_iter().map(Some).collect(),
        prefix: if add_bos {
            bos.into_iter().collect()
        } else {
            Vec::new()
        },
        suffix: if add_eos {
            eos.into_iter().collect()
        } else {
            Vec::new()
        },
        bos,
        eos,
        eot,
        pad,
        unk,
        extra_stops: eom.into_iter().collect(),
        chat_template,
    };
    if tokenizer.eot.is_none() {
        tokenizer.eot = tokenizer.detect_eot();
    }
    Ok(tokenizer)
}

/// What a token decodes to, as llama.cpp's `token_to_piece`.
fn piece(text: &str, ty: TokenType, spm: bool) -> Piece {
    match ty {
        TokenType::Control | TokenType::Unknown => Piece::new(text.as_bytes().to_vec(), true),
        TokenType::UserDefined => Piece::new(text.as_bytes().to_vec(), false),
        TokenType::Unused => Piece::empty(),
        TokenType::Byte if byte_token_value(text).is_some() => Piece::new(
            byte_token_value(text).into_iter().collect::<Vec<_>>(),
            false,
        ),
        _ if spm => Piece::new(text.replace(SPM_SPACE, " ").into_bytes(), false),
        _ => Piece::new(
            byte_level::token_bytes(text).unwrap_or_else(|| text.as_bytes().to_vec()),
            false,
        ),
    }
}

/// Parses `tokenizer.ggml.merges` ("left right", split at the first space after the first
/// character, as llama.cpp does) and checks that every part and result is a token.
fn bpe_merges(merges: &[String], vocab: &Vocab) -> Result<Merges> {
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            let split = merge
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(at, _)| at);
            let Some(at) = split else {
                return Err(bad(
                    MERGES,
                    format!("merge {i} ({merge:?}) is not two tokens separated by a space"),
                ));
            };
            let (left, right) = (&merge[..at], &merge[at + 1..]);
            for part in [left, right, &format!("{left}{right}")] {
                if !vocab.contains_key(part) {
                    return Err(bad(
                        MERGES,
                        format!("merge {i} ({merge:?}) uses {part:?}, which is not a token"),
                    ));
                }
            }
            Ok((left.to_string(), right.to_string()))
        })
        .collect()
}

/// Merges implied by a SentencePiece vocabulary: every split of a token into two tokens,
/// best score first (SentencePiece's BPE merges the adjacent pair whose union scores
/// highest), ordered as `transformers` derives them.
fn spm_merges(
    tokens: &[String],
    scores: Option<&[f32]>,
    types: &[TokenType],
    vocab: &Vocab,
) -> Merges {
    // (score, characters left, characters right, merged id, left id, right id)
    let mut ranked: Vec<(f32, usize, usize, u32, u32, u32)> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        let id = id as u32;
        // Only the winner of duplicate texts, and only pieces BPE can form.
        if vocab.get(token) != Some(&id)
            || !matches!(
                types[id as usize],
                TokenType::Normal | TokenType::UserDefined | TokenType::Undefined
            )
        {
            continue;
        }
        let score = scores.map_or(0.0, |s| s[id as usize]);
        let n_chars = token.chars().count();
        for (i, (at, _)) in token.char_indices().enumerate().skip(1) {
            let (left, right) = token.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                ranked.push((score, i, n_chars - i, id, l, r));
            }
        }
    }
    // transformers' `generate_merges` order: score, then longer left part, then longer right
    // part, all descending; then vocabulary order.
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then(b.2.cmp(&a.2))
            .then(a.3.cmp(&b.3))
            .then(a.4.cmp(&b.4))
            .then(a.5.cmp(&b.5))
    });
    ranked
        .into_iter()
        .map(|(.., l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regex_compiles() {
        for pre in [
            "default",
            "llama-bpe",
            "dbrx",
            "qwen2",
            "smollm",
            "gpt-2",
            "gpt-4o",
            "tekken",
            "falcon",
            "deepseek-coder",
        ] {
            for regex in pre_tokenizer_spec(pre).regexes {
                Split::new(
                    SplitPattern::Regex((*regex).to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{pre}: {regex}: {e}"));
            }
        }
    }
}
