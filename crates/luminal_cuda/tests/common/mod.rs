//! Checks shared by the emulator and GPU test binaries.
#![allow(dead_code)]

pub mod matmul;
pub mod quant;
