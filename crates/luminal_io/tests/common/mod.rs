//! Shared helpers of the integration tests: fixture loading, a byte-level GGUF builder for
//! hostile files, and conversion of metadata to the JSON form of the fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

use luminal_io::{MetadataArray, MetadataValue};
use serde_json::{json, Value};

pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
}

pub fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).expect("fixture present")
}

pub fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&fixture_bytes(name)).expect("fixture is JSON")
}

pub fn hex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2), "odd hex length");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// Reads a JSON list of numbers as f32 (each number is an exact f32 written as an f64).
pub fn f32s(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .expect("list")
        .iter()
        .map(|v| v.as_f64().expect("number") as f32)
        .collect()
}

/// Asserts bit-identical values (decoders reproduce ggml's f32 arithmetic exactly).
pub fn assert_same_f32(got: &[f32], want: &[f32], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (*g == 0.0 && *w == 0.0),
            "{context}: value {i} is {g:e}, gguf-py says {w:e}"
        );
    }
}

/// A metadata value in the fixture's JSON form: {"t": type, "v": value} and, for arrays,
/// {"t": "array", "elem": element type, "v": [...]}.
pub fn value_json(value: &MetadataValue) -> Value {
    use MetadataValue as V;
    match value {
        V::U8(v) => json!({"t": "u8", "v": v}),
        V::I8(v) => json!({"t": "i8", "v": v}),
        V::U16(v) => json!({"t": "u16", "v": v}),
        V::I16(v) => json!({"t": "i16", "v": v}),
        V::U32(v) => json!({"t": "u32", "v": v}),
        V::I32(v) => json!({"t": "i32", "v": v}),
        V::F32(v) => json!({"t": "f32", "v": *v as f64}),
        V::Bool(v) => json!({"t": "bool", "v": v}),
        V::String(v) => json!({"t": "string", "v": v}),
        V::U64(v) => json!({"t": "u64", "v": v}),
        V::I64(v) => json!({"t": "i64", "v": v}),
        V::F64(v) => json!({"t": "f64", "v": v}),
        V::Array(a) => array_json(a),
    }
}

fn array_json(array: &MetadataArray) -> Value {
    let elem = array.element_type().name();
    let values: Vec<Value> = match array {
        MetadataArray::Array(inner) => inner.iter().map(array_json).collect(),
        other => other
            .to_values()
            .iter()
            .map(|v| value_json(v)["v"].clone())
            .collect(),
    };
    json!({"t": "array", "elem": elem, "v": values})
}

/// Writes GGUF files byte by byte, including ones no honest writer would produce.
#[derive(Clone)]
pub struct GgufBuilder {
    pub version: u32,
    /// Overrides the tensor / metadata counts written in the header.
    pub n_tensors_override: Option<u64>,
    pub n_kv_override: Option<u64>,
    pub alignment: u64,
    n_kv: u64,
    kv: Vec<u8>,
    n_tensors: u64,
    infos: Vec<u8>,
    data: Vec<u8>,
}

pub const T_U8: u32 = 0;
pub const T_U32: u32 = 4;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const GGML_F32: u32 = 0;
pub const GGML_Q4_0: u32 = 2;
pub const GGML_Q8_0: u32 = 8;
pub const GGML_IQ2_XXS: u32 = 16;

pub fn gguf_string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder {
            version: 3,
            n_tensors_override: None,
            n_kv_override: None,
            alignment: 32,
            n_kv: 0,
            kv: Vec::new(),
            n_tensors: 0,
            infos: Vec::new(),
            data: Vec::new(),
        }
    }
}

impl GgufBuilder {
    /// A metadata entry with a raw key, type id and value bytes.
    pub fn kv_raw(mut self, key: &[u8], type_id: u32, value: &[u8]) -> Self {
        self.kv.extend(gguf_string(key));
        self.kv.extend(type_id.to_le_bytes());
        self.kv.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv_raw(key.as_bytes(), T_U32, &v.to_le_bytes())
    }

    pub fn kv_str(self, key: &str, v: &str) -> Self {
        self.kv_raw(key.as_bytes(), T_STRING, &gguf_string(v.as_bytes()))
    }

    /// A tensor info with raw fields (dims in ggml order).
    pub fn tensor_raw(mut self, name: &[u8], dims: &[u64], ggml_type: u32, offset: u64) -> Self {
        self.infos.extend(gguf_string(name));
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ggml_type.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// An F32 tensor with its data appended (aligned) to the data section.
    pub fn tensor_f32(self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        let offset = self.data.len() as u64;
        let mut this = self.tensor_raw(name.as_bytes(), dims, GGML_F32, offset);
        for v in values {
            this.data.extend(v.to_le_bytes());
        }
        this.pad_data();
        this
    }

    /// Appends raw bytes to the data section (then pads to the alignment).
    pub fn data(mut self, bytes: &[u8]) -> Self {
        self.data.extend_from_slice(bytes);
        self.pad_data();
        self
    }

    fn pad_data(&mut self) {
        while !(self.data.len() as u64).is_multiple_of(self.alignment) {
            self.data.push(0);
        }
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(
            self.n_tensors_override
                .unwrap_or(self.n_tensors)
                .to_le_bytes(),
        );
        out.extend(self.n_kv_override.unwrap_or(self.n_kv).to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        while !(out.len() as u64).is_multiple_of(self.alignment) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

/// A tiny deterministic generator (xorshift64*), so the "fuzz" tests need no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}
