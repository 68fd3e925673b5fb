//! # luminal_io
//!
//! Readers for model files, memory-mapped and validated before use:
//!
//! - [`SafetensorsFile`] / [`SafetensorsModel`]: safetensors files, single or sharded through a
//!   `model.safetensors.index.json`; tensors listed with dtype and shape, read as f32 from
//!   F32/F16/BF16.
//! - [`GgufFile`]: GGUF v2/v3 (llama.cpp's format): typed metadata with `get_u32(key)`-style
//!   accessors, tensor infos, raw tensor bytes, and tensors decoded to f32 from F32, F16, BF16
//!   and the block-quantized types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K…Q6_K, Q8_K
//!   (decoders in [`quant`]).
//! - [`read_wav`]: 16-bit PCM WAV audio, mixed to mono (for speech models).
//! - [`Tokenizer`]: Hugging Face `tokenizer.json` files and folders, and the byte-level BPE /
//!   SentencePiece tokenizers embedded in GGUF metadata; `encode`, `decode`, and a
//!   [`StreamDecoder`] that never splits a UTF-8 character (see [`tokenizer`]).
//!
//! Every reader returns a typed [`IoError`] on malformed, truncated or hostile input — it never
//! panics and never allocates what a header claims before checking it against the file's size.
//! `from_bytes` constructors share the code path of `open`, which is what the fuzz targets in
//! `fuzz/` exercise.
//!
//! ```no_run
//! use luminal_io::{GgufFile, SafetensorsModel};
//! # fn main() -> Result<(), luminal_io::IoError> {
//! let gguf = GgufFile::open("models/model.gguf")?;
//! let layers = gguf.metadata().get_u32("llama.block_count")?;
//! for info in gguf.tensors() {
//!     println!("{} {:?} {}", info.name(), info.shape(), info.ggml_type());
//! }
//! let wq: Vec<f32> = gguf.tensor_f32("blk.0.attn_q.weight")?;
//!
//! let st = SafetensorsModel::open("models/my-hf-checkpoint/")?; // index.json or model.safetensors
//! let embed = st.tensor_f32("model.embed_tokens.weight")?;
//! # Ok(()) }
//! ```

pub mod audio;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod quant;
pub mod safetensors;
mod storage;
pub mod tokenizer;

pub use audio::{read_wav, wav_from_bytes, Audio};
pub use error::{IoError, Result};
pub use ggml_type::GgmlType;
pub use gguf::{GgufFile, Metadata, MetadataArray, MetadataType, MetadataValue, TensorInfo};
pub use safetensors::{Dtype, SafetensorInfo, SafetensorsFile, SafetensorsModel};
pub use tokenizer::{StreamDecoder, TokenType, Tokenizer, TokenizerKind};
