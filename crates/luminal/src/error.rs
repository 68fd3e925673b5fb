//! Typed errors for everything that touches data at run time.

use crate::dtype::DType;
use thiserror::Error;

/// Which way data moved when an error was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataAccess {
    /// `Runtime::set`: host data into an input.
    Set,
    /// `Runtime::get`: an output read back as a host type.
    Get,
}

fn wrong_dtype_message(tensor: &str, expected: DType, got: DType, access: DataAccess) -> String {
    match access {
        DataAccess::Set => format!("tensor {tensor}: dtype is {expected}, but the data is {got}"),
        DataAccess::Get => format!(
            "tensor {tensor} holds {expected}, but was read as {got} \
             (read it as its own dtype, or with get_f32 for any float or integer dtype)"
        ),
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum LuminalError {
    #[error("tensor {tensor}: expected {expected} elements, got {got}")]
    WrongLength {
        tensor: String,
        expected: usize,
        got: usize,
    },
    /// `set` was given data of another dtype than the input's, or `get` asked for another
    /// dtype than the output's. `expected` is the tensor's dtype, `got` the data's (set) or
    /// the requested one (get).
    #[error("{}", wrong_dtype_message(tensor, *expected, *got, *access))]
    WrongDType {
        tensor: String,
        expected: DType,
        got: DType,
        access: DataAccess,
    },
    #[error("tensor #{0} does not belong to the compiled graph (made by another graph or after compile)")]
    UnknownTensor(usize),
    #[error("tensor {0} is not an input; only tensors made with Graph::tensor/input can be set")]
    NotAnInput(String),
    #[error("tensor {0} was not marked with .output() before compiling")]
    NotAnOutput(String),
    #[error("output {0} has not been computed yet: call run() first")]
    NotComputed(String),
    #[error("input {0} has no data: call set() before run()")]
    MissingInput(String),
    #[error("dynamic dimension '{0}' is not bound: call set_dim(\"{0}\", n) before run()")]
    UnboundDim(String),
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange { op: String, index: i64, size: i64 },
    #[error("shape expression error: {0}")]
    Expression(String),
    #[error("bad data: {0}")]
    BadData(String),
    #[error("backend error: {0}")]
    Backend(String),
}

pub type Result<T, E = LuminalError> = std::result::Result<T, E>;
