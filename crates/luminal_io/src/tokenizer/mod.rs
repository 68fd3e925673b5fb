//! Text tokenizers: Hugging Face `tokenizer.json` files and the tokenizers embedded in GGUF
//! metadata, behind one [`Tokenizer`] type.
//!
//! - [`Tokenizer::from_file`] loads a `tokenizer.json`; [`Tokenizer::from_hf_dir`] loads a
//!   Hugging Face model folder (`tokenizer.json` plus, when present, `tokenizer_config.json`
//!   for BOS/EOS/`add_bos_token`/the chat template and `generation_config.json` for extra stop
//!   ids).
//! - [`Tokenizer::from_gguf`] rebuilds the tokenizer a GGUF file describes, the way llama.cpp
//!   reads it: `tokenizer.ggml.model = "gpt2"` is byte-level BPE (tokens + merges, the
//!   pre-tokenizer regexes chosen by `tokenizer.ggml.pre` as in llama.cpp's `llama-vocab.cpp`),
//!   `"llama"` is SentencePiece BPE (tokens + scores + token types, `<0xNN>` byte fallback, `▁`
//!   for spaces, a dummy prefix space when `tokenizer.ggml.add_space_prefix` says so).
//!
//! Both are run by the `tokenizers` crate: the GGUF vocabulary is turned into a
//! `tokenizers::Tokenizer` (a BPE model, the split regexes, byte-level or `▁` normalisation)
//! the way `transformers`' GGUF converter does. Control, unknown and user-defined tokens are
//! matched whole in the input; control and unknown ones only when `encode(text, true)` asks to
//! parse special tokens, user-defined ones always (as llama.cpp does).
//!
//! Decoding is done token by token from a table of the bytes each token stands for (byte-level
//! BPE characters mapped back to bytes, `<0xNN>` to one byte, `▁` to a space), so that
//! [`StreamDecoder`] can hand out text as soon as it forms whole UTF-8 characters and the
//! concatenation of its chunks is exactly [`Tokenizer::decode`] of all ids. Invalid UTF-8 (a
//! sequence cut short by `decode` of a partial list) becomes U+FFFD, as in `transformers`.
//!
//! ```no_run
//! # fn main() -> Result<(), luminal_io::IoError> {
//! use luminal_io::{GgufFile, Tokenizer};
//! let gguf = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tok = Tokenizer::from_gguf(&gguf)?;
//! let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", true)?;
//! let mut stream = tok.stream_decoder(true);
//! for &id in &ids {
//!     if let Some(text) = stream.push(id)? {
//!         print!("{text}");
//!     }
//! }
//! if let Some(rest) = stream.flush()? {
//!     print!("{rest}");
//! }
//! # Ok(()) }
//! ```

mod byte_level;
mod decode;
mod gguf;
mod hf;

use std::path::Path;
use std::sync::OnceLock;

use crate::error::{IoError, Result};

use decode::PieceTable;
pub use decode::StreamDecoder;

/// What a token is, in llama.cpp's terms (the values of `tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenType {
    /// An ordinary piece of text.
    Normal,
    /// The unknown token (`<unk>`).
    Unknown,
    /// A control token (`<s>`, `<|im_start|>`, …): special, skipped by `decode(.., true)`.
    Control,
    /// A user-defined token: always matched whole in the input, decoded as its text.
    UserDefined,
    /// A reserved slot that never appears in encoded text.
    Unused,
    /// A byte-fallback token `<0xNN>`.
    Byte,
    /// Type id 0 or one outside the specification; handled like [`TokenType::Normal`].
    Undefined,
}

impl TokenType {
    /// The type of GGUF token-type id `id` (1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte; anything else undefined).
    pub fn from_gguf(id: i32) -> TokenType {
        match id {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Control and unknown tokens: the ones `decode(.., skip_special = true)` leaves out and
    /// `encode(.., add_special = false)` does not match in the input.
    pub fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// Where a tokenizer came from and which algorithm it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenizerKind {
    /// GGUF `tokenizer.ggml.model = "gpt2"`: byte-level BPE.
    GgufBpe,
    /// GGUF `tokenizer.ggml.model = "llama"`: SentencePiece BPE with byte fallback.
    GgufSentencePiece,
    /// A Hugging Face `tokenizer.json`.
    HuggingFace,
}

/// How ids become text.
#[derive(Debug, Clone)]
enum Decoding {
    /// Token-by-token from the bytes each token stands for (byte-exact, streamable).
    Pieces(PieceTable),
    /// The `tokenizers` library's decoder (a `tokenizer.json` whose decoder has no per-token
    /// byte form, e.g. WordPiece); streaming then works on decoded-prefix differences.
    Library,
}

/// A text tokenizer: `encode` text to token ids and `decode` them back.
///
/// Cheap to share by reference across threads (`Send + Sync`); `encode` and `decode` take
/// `&self`.
#[derive(Clone)]
pub struct Tokenizer {
    kind: TokenizerKind,
    /// Matches every added token (control, unknown, user-defined) in the input.
    inner: tokenizers::Tokenizer,
    /// `inner` with special tokens left unmatched (for `encode(.., false)`), built on first use.
    plain: OnceLock<tokenizers::Tokenizer>,
    decoding: Decoding,
    /// Type of every id in `0..vocab_size`.
    types: Vec<TokenType>,
    /// Text of every id in `0..vocab_size` (`None` for holes in a `tokenizer.json` vocabulary).
    texts: Vec<Option<String>>,
    /// Ids put before / after the text by `encode(.., true)` (BOS / EOS).
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    /// Further end-of-generation ids (EOM, `generation_config.json`'s `eos_token_id` list).
    extra_stops: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos())
            .finish_non_exhaustive()
    }
}

/// Token texts that end a turn or a document, in the order llama.cpp looks for an EOT token.
const END_TOKEN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
    "<|eom_id|>",
];

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    ///
    /// BOS/EOS handling comes from the file's post-processor (e.g. Llama 3's template adds
    /// `<|begin_of_text|>`); use [`Tokenizer::from_hf_dir`] to also honour
    /// `tokenizer_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        hf::from_file(path.as_ref())
    }

    /// Loads a Hugging Face model folder: `tokenizer.json`, plus `tokenizer_config.json`
    /// (`bos_token`, `eos_token`, `pad_token`, `add_bos_token`, `add_eos_token`,
    /// `chat_template`), `chat_template.jinja` and `generation_config.json` (`eos_token_id`)
    /// when present.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        hf::from_dir(dir.as_ref())
    }

    /// Builds the tokenizer described by a GGUF file's `tokenizer.*` metadata.
    ///
    /// Missing keys give [`IoError::MissingKey`], values of the wrong type
    /// [`IoError::WrongMetadataType`], inconsistent ones (array lengths that differ, merges of
    /// unknown tokens) [`IoError::BadTokenizerMetadata`], and a `tokenizer.ggml.model` other
    /// than `gpt2` or `llama` [`IoError::UnsupportedTokenizer`]. Special-token ids outside the
    /// vocabulary are ignored, as llama.cpp does.
    pub fn from_gguf(file: &crate::GgufFile) -> Result<Tokenizer> {
        gguf::from_metadata(file.metadata())
    }

    /// Which algorithm this tokenizer runs.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// Encodes `text` to token ids.
    ///
    /// With `add_special`, special tokens written in the text (`<|im_start|>`, `<s>`, …) become
    /// their ids and BOS is prepended when [`Tokenizer::add_bos`] says so (EOS appended when
    /// the model asks for it). Without, special-token text is tokenized as plain text and
    /// nothing is added. User-defined tokens are matched in both cases.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let tokenizer = if add_special {
            &self.inner
        } else {
            self.plain()
        };
        let encoding = tokenizer
            .encode_fast(text, false)
            .map_err(|e| IoError::Tokenizer(format!("cannot encode text: {e}")))?;
        let body = encoding.get_ids();
        let mut ids = Vec::with_capacity(body.len() + self.prefix.len() + self.suffix.len());
        if add_special {
            ids.extend_from_slice(&self.prefix);
        }
        ids.extend_from_slice(body);
        if add_special {
            ids.extend_from_slice(&self.suffix);
        }
        Ok(ids)
    }

    fn plain(&self) -> &tokenizers::Tokenizer {
        self.plain.get_or_init(|| {
            let mut plain = self.inner.clone();
            plain.set_encode_special_tokens(true);
            plain
        })
    }

    /// Decodes ids to text. With `skip_special`, control and unknown tokens (BOS, EOS,
    /// `<|im_end|>`, …) are left out. Bytes that do not form valid UTF-8 (a character whose
    /// tokens were cut off) become U+FFFD. Ids outside the vocabulary give
    /// [`IoError::TokenIdOutOfRange`].
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.check_ids(ids)?;
        match &self.decoding {
            Decoding::Pieces(table) => {
                let mut bytes = Vec::new();
                let mut strip = table.strip_leading_spaces();
                for &id in ids {
                    table.append(id, skip_special, &mut strip, &mut bytes);
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Decoding::Library => self.library_decode(ids, skip_special),
        }
    }

    fn library_decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| IoError::Tokenizer(format!("cannot decode ids: {e}")))
    }

    /// A decoder that turns ids pushed one at a time into text, never splitting a UTF-8
    /// character: see [`StreamDecoder`].
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    fn check_id(&self, id: u32) -> Result<()> {
        if (id as usize) < self.types.len() {
            Ok(())
        } else {
            Err(IoError::TokenIdOutOfRange {
                id,
                vocab_size: self.types.len(),
            })
        }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        ids.iter().try_for_each(|&id| self.check_id(id))
    }

    /// Number of token ids (the largest id plus one), added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.types.len()
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn id (`tokenizer.ggml.eot_token_id`, or a token such as `<|eot_id|>` /
    /// `<|im_end|>` found by its text, as llama.cpp does).
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// The padding id, if the model has one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// The unknown-token id, if the model has one.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// The ids `encode(text, true)` puts before the text (BOS, BERT's `[CLS]`).
    pub fn special_prefix(&self) -> &[u32] {
        &self.prefix
    }

    /// The ids `encode(text, true)` puts after the text (EOS, BERT's `[SEP]`).
    pub fn special_suffix(&self) -> &[u32] {
        &self.suffix
    }

    /// Whether `encode(text, true)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.bos.is_some() && self.prefix.first() == self.bos.as_ref()
    }

    /// Whether `encode(text, true)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.eos.is_some() && self.suffix.last() == self.eos.as_ref()
    }

    /// The id of a token given by its vocabulary text (`"<|im_end|>"`, `"Ġhello"`, `"▁the"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary text of a token (byte-level or `▁` spelling, as stored).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.texts.get(id as usize).and_then(Clone::clone)
    }

    /// The type of a token.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The chat template (`tokenizer.chat_template`, or `chat_template` of
    /// `tokenizer_config.json`), a Jinja string.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Ids that end generation: EOS, EOT, and every special token whose text is a known end
    /// marker (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>`, …), plus the
    /// `eos_token_id`s of `generation_config.json`. No duplicates; EOS first.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = Vec::new();
        let mut push = |id: u32| {
            if !ids.contains(&id) {
                ids.push(id);
            }
        };
        self.eos.into_iter().for_each(&mut push);
        self.eot.into_iter().for_each(&mut push);
        self.extra_stops.iter().copied().for_each(&mut push);
        for text in END_TOKEN_TEXTS {
            if let Some(id) = self.special_id(text) {
                push(id);
            }
        }
        ids
    }

    /// The id of `text` if it is a special (control or unknown) token.
    fn special_id(&self, text: &str) -> Option<u32> {
        let id = self.inner.token_to_id(text)?;
        self.token_type(id).filter(|t| t.is_special()).map(|_| id)
    }

    /// llama.cpp's EOT detection: the first special token whose text is a known end marker.
    fn detect_eot(&self) -> Option<u32> {
        END_TOKEN_TEXTS
            .iter()
            .filter(|t| **t != "<|eom_id|>")
            .find_map(|t| self.special_id(t))
    }
}

/// The byte of a byte-fallback token `<0xNN>`.
pub(crate) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(byte_token_value("<0x0A>"), Some(10));
        assert_eq!(byte_token_value("<0xff>"), Some(255));
        assert_eq!(byte_token_value("<0x100>"), None);
        assert_eq!(byte_token_value("0x41"), None);
        assert_eq!(byte_token_value("<0x+A>"), None);
    }

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
    }

    #[test]
    fn token_types_from_gguf_ids() {
        assert_eq!(TokenType::from_gguf(1), TokenType::Normal);
        assert_eq!(TokenType::from_gguf(3), TokenType::Control);
        assert_eq!(TokenType::from_gguf(6), TokenType::Byte);
        assert_eq!(TokenType::from_gguf(0), TokenType::Undefined);
        assert_eq!(TokenType::from_gguf(-7), TokenType::Undefined);
        assert!(TokenType::Control.is_special());
        assert!(!TokenType::UserDefined.is_special());
    }
}
