//! The one error type of this crate.
//!
//! Every reader returns [`IoError`] on malformed, truncated or hostile input; none panics.
//! Messages name the tensor or key involved and the numbers that did not fit, so that a user
//! holding a broken download can tell what is wrong without a hex editor.

use std::path::PathBuf;

/// Result alias used throughout `luminal_io`.
pub type Result<T, E = IoError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading a model file.
///
/// Errors raised while opening a file on disk are wrapped once in [`IoError::File`] so that the
/// message names the file; use [`IoError::root`] to match on the underlying kind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The error below happened while reading `path`.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: Box<IoError>,
    },

    /// The file (or a shard named by an index) does not exist.
    #[error("model file not found: {}", path.display())]
    NotFound { path: PathBuf },

    /// Any other operating-system error while opening, reading or mapping a file.
    #[error("cannot read {}: {source}", path.display())]
    Os {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A structure (header field, string, tensor data, …) extends past the end of the file.
    #[error("model file is truncated: {what} ends at {end} but the file has {file_len} bytes")]
    Truncated {
        what: String,
        end: u64,
        file_len: u64,
    },

    /// The file does not start with the GGUF magic bytes.
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: [u8; 4] },

    /// A GGUF version (or byte order) this reader does not handle.
    #[error("unsupported GGUF file: version {version} ({reason})")]
    UnsupportedVersion { version: u32, reason: &'static str },

    /// A count or length in the header cannot possibly fit in the rest of the file.
    #[error(
        "implausible {what}: the header claims {count}, which needs at least {needed} bytes, \
         but only {remaining} bytes remain in the file"
    )]
    ImplausibleCount {
        what: String,
        count: u64,
        needed: u128,
        remaining: u64,
    },

    /// Arrays nested deeper than the reader accepts (guards the stack against hostile files).
    #[error("metadata key {key}: arrays nested more than {max_depth} levels deep")]
    NestingTooDeep { key: String, max_depth: usize },

    /// A metadata value-type id outside the GGUF specification.
    #[error("metadata key {key}: unknown value type id {type_id}")]
    UnknownMetadataType { key: String, type_id: u32 },

    /// A bool metadata value that is neither 0 nor 1.
    #[error("metadata key {key}: bool value is {value}, must be 0 or 1")]
    InvalidBool { key: String, value: u8 },

    /// A key or tensor name that is not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },

    /// The same metadata key appears twice.
    #[error("duplicate metadata key {key}")]
    DuplicateKey { key: String },

    /// A required metadata key is absent.
    #[error("metadata key {key} is missing")]
    MissingKey { key: String },

    /// A metadata key holds a value of another type than the caller asked for.
    #[error("metadata key {key} has type {found}, expected {expected}")]
    WrongMetadataType {
        key: String,
        expected: &'static str,
        found: String,
    },

    /// `general.alignment` is zero, not a power of two, or not a u32.
    #[error("invalid general.alignment: {reason}")]
    BadAlignment { reason: String },

    /// A tensor with more dimensions than ggml supports.
    #[error("tensor {tensor}: {n_dims} dimensions, at most {max} are supported")]
    TooManyDims {
        tensor: String,
        n_dims: u32,
        max: u32,
    },

    /// A ggml type id that this crate does not know.
    #[error("tensor {tensor}: unknown ggml type id {type_id}")]
    UnknownGgmlType { tensor: String, type_id: u32 },

    /// A tensor whose rows are not a whole number of quantization blocks.
    #[error(
        "tensor {tensor}: first dimension {row_len} ({n_elements} elements in all) is not a \
         multiple of the {ggml_type} block size {block_size}"
    )]
    BlockSizeMismatch {
        tensor: String,
        ggml_type: &'static str,
        row_len: u64,
        n_elements: u64,
        block_size: u64,
    },

    /// A tensor data offset that is not a multiple of the file's alignment.
    #[error(
        "tensor {tensor}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    /// Size arithmetic (element counts, byte sizes, offsets) overflowed 64 bits.
    #[error("{what} overflows 64-bit arithmetic")]
    Overflow { what: String },

    /// Two tensors with the same name.
    #[error("duplicate tensor name {name}")]
    DuplicateTensor { name: String },

    /// No tensor of this name in the file (or in any shard).
    #[error("tensor {name} not found")]
    TensorNotFound { name: String },

    /// The tensor's dtype is known but cannot be converted by the requested method.
    #[error("tensor {tensor}: cannot convert dtype {dtype} to f32")]
    UnsupportedDtype { tensor: String, dtype: String },

    /// The header names a dtype this crate has never heard of.
    #[error("tensor {tensor}: unknown dtype {dtype:?}")]
    UnknownDtype { tensor: String, dtype: String },

    /// A safetensors header that is not the JSON object the format requires.
    #[error("bad safetensors header: {reason}")]
    BadHeader { reason: String },

    /// A `model.safetensors.index.json` that cannot be used.
    #[error("bad safetensors index: {reason}")]
    BadIndex { reason: String },

    /// The tensor has another shape than the caller expected.
    #[error("tensor {tensor}: shape is {found:?}, expected {expected:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// A byte length or output length that does not match what the shape and dtype require.
    #[error("tensor {tensor}: {what} has length {found}, expected {expected}")]
    LengthMismatch {
        tensor: String,
        what: String,
        expected: u64,
        found: u64,
    },

    /// A value that does not fit in this platform's `usize`.
    #[error("{what} = {value} does not fit in this platform's address space")]
    TooLargeForPlatform { what: String, value: u64 },

    /// A tokenizer could not be built or run: a malformed `tokenizer.json` or
    /// `tokenizer_config.json`, or an error reported by the `tokenizers` library.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Tokenizer metadata that is present with the right type but inconsistent: arrays of
    /// different lengths, a merge naming a token that is not in the vocabulary, ….
    #[error("tokenizer metadata {key}: {reason}")]
    BadTokenizerMetadata { key: String, reason: String },

    /// `tokenizer.ggml.model` names a tokenizer this crate cannot build.
    #[error(
        "unsupported tokenizer model {model:?} in tokenizer.ggml.model (supported: \"gpt2\", \"llama\")"
    )]
    UnsupportedTokenizer { model: String },

    /// A WAV file in a format this crate does not read (only 16-bit integer PCM is).
    #[error("unsupported WAV: {reason}")]
    UnsupportedWav { reason: String },

    /// A WAV file whose structure is broken (no RIFF/WAVE header, a bad chunk, …).
    #[error("malformed WAV: {reason}")]
    MalformedWav { reason: String },

    /// A WAV file whose data chunk ends before the samples its header announces.
    #[error("WAV file is truncated: {got} of {expected} samples present")]
    TruncatedWav { expected: u64, got: u64 },

    /// A WAV file with no samples.
    #[error("WAV file has no audio samples")]
    EmptyWav,

    /// A token id outside the vocabulary (e.g. passed to `decode`).
    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    TokenIdOutOfRange { id: u32, vocab_size: usize },
}

impl IoError {
    /// The error beneath any [`IoError::File`] wrappers: match on this to test the kind.
    pub fn root(&self) -> &IoError {
        let mut error = self;
        while let IoError::File { source, .. } = error {
            error = source;
        }
        error
    }

    /// Wraps `self` with the path of the file it came from (once: an error that already names
    /// a file, or a not-found/OS error that names its path, is returned as is).
    pub(crate) fn in_file(self, path: &std::path::Path) -> IoError {
        match self {
            e @ (IoError::File { .. } | IoError::NotFound { .. } | IoError::Os { .. }) => e,
            e => IoError::File {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }
}
