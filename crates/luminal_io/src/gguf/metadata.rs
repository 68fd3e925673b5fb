//! GGUF metadata: typed values, arrays stored compactly per element type, and an ordered map
//! with `get_u32("llama.block_count")`-style accessors that name the key in their errors.

use std::collections::HashMap;

use crate::error::{IoError, Result};

/// The value-type ids of the GGUF specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetadataType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetadataType {
    /// The type with id `id`, if the specification defines one.
    pub fn from_id(id: u32) -> Option<MetadataType> {
        use MetadataType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case name, as in the specification ("u32", "string", …).
    pub fn name(self) -> &'static str {
        use MetadataType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type occupies in a file (strings and arrays: their
    /// length prefix; arrays also their element type). Used to reject implausible counts
    /// before allocating.
    pub(crate) fn min_encoded_size(self) -> u64 {
        use MetadataType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value, stored as one vector of its element type (a tokenizer's 150k tokens are one
/// `Vec<String>`, not 150k enum values). Arrays of arrays nest.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetadataArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value's type.
    pub fn value_type(&self) -> MetadataType {
        use MetadataValue as V;
        match self {
            V::U8(_) => MetadataType::U8,
            V::I8(_) => MetadataType::I8,
            V::U16(_) => MetadataType::U16,
            V::I16(_) => MetadataType::I16,
            V::U32(_) => MetadataType::U32,
            V::I32(_) => MetadataType::I32,
            V::F32(_) => MetadataType::F32,
            V::Bool(_) => MetadataType::Bool,
            V::String(_) => MetadataType::String,
            V::Array(_) => MetadataType::Array,
            V::U64(_) => MetadataType::U64,
            V::I64(_) => MetadataType::I64,
            V::F64(_) => MetadataType::F64,
        }
    }

    /// A description of the type for error messages: "u32", "array of string", ….
    pub fn type_description(&self) -> String {
        match self {
            MetadataValue::Array(array) => array.type_description(),
            other => other.value_type().name().to_string(),
        }
    }

    /// Any integer value, widened to i128 (so that every GGUF integer type fits).
    fn as_integer(&self) -> Option<i128> {
        use MetadataValue as V;
        Some(match *self {
            V::U8(v) => v.into(),
            V::I8(v) => v.into(),
            V::U16(v) => v.into(),
            V::I16(v) => v.into(),
            V::U32(v) => v.into(),
            V::I32(v) => v.into(),
            V::U64(v) => v.into(),
            V::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer of any width whose value fits in u32 (files disagree on which integer type
    /// holds e.g. `llama.block_count`, so accessors accept any that fits).
    pub fn as_u32(&self) -> Option<u32> {
        self.as_integer().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer of any width whose value fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer of any width whose value fits in i32.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_integer().and_then(|v| i32::try_from(v).ok())
    }

    /// An integer of any width whose value fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// An f32, or an f64 rounded to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetadataValue::F32(v) => Some(v),
            MetadataValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An f64, or an f32 widened to f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(v) => Some(v),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            MetadataValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

impl MetadataArray {
    /// The element type.
    pub fn element_type(&self) -> MetadataType {
        use MetadataArray as A;
        match self {
            A::U8(_) => MetadataType::U8,
            A::I8(_) => MetadataType::I8,
            A::U16(_) => MetadataType::U16,
            A::I16(_) => MetadataType::I16,
            A::U32(_) => MetadataType::U32,
            A::I32(_) => MetadataType::I32,
            A::F32(_) => MetadataType::F32,
            A::Bool(_) => MetadataType::Bool,
            A::String(_) => MetadataType::String,
            A::Array(_) => MetadataType::Array,
            A::U64(_) => MetadataType::U64,
            A::I64(_) => MetadataType::I64,
            A::F64(_) => MetadataType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        use MetadataArray as A;
        match self {
            A::U8(v) => v.len(),
            A::I8(v) => v.len(),
            A::U16(v) => v.len(),
            A::I16(v) => v.len(),
            A::U32(v) => v.len(),
            A::I32(v) => v.len(),
            A::F32(v) => v.len(),
            A::Bool(v) => v.len(),
            A::String(v) => v.len(),
            A::Array(v) => v.len(),
            A::U64(v) => v.len(),
            A::I64(v) => v.len(),
            A::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// "array of u32", "array of array of string", ….
    pub fn type_description(&self) -> String {
        match self {
            MetadataArray::Array(inner) => match inner.first() {
                Some(first) => format!("array of {}", first.type_description()),
                None => "array of array".to_string(),
            },
            other => format!("array of {}", other.element_type().name()),
        }
    }

    /// Element `index` as a [`MetadataValue`] (strings and nested arrays are cloned).
    pub fn get(&self, index: usize) -> Option<MetadataValue> {
        use MetadataArray as A;
        use MetadataValue as V;
        Some(match self {
            A::U8(v) => V::U8(*v.get(index)?),
            A::I8(v) => V::I8(*v.get(index)?),
            A::U16(v) => V::U16(*v.get(index)?),
            A::I16(v) => V::I16(*v.get(index)?),
            A::U32(v) => V::U32(*v.get(index)?),
            A::I32(v) => V::I32(*v.get(index)?),
            A::F32(v) => V::F32(*v.get(index)?),
            A::Bool(v) => V::Bool(*v.get(index)?),
            A::String(v) => V::String(v.get(index)?.clone()),
            A::Array(v) => V::Array(v.get(index)?.clone()),
            A::U64(v) => V::U64(*v.get(index)?),
            A::I64(v) => V::I64(*v.get(index)?),
            A::F64(v) => V::F64(*v.get(index)?),
        })
    }

    /// All elements as [`MetadataValue`]s (copies; prefer the typed `as_*` slices for speed).
    pub fn to_values(&self) -> Vec<MetadataValue> {
        (0..self.len()).filter_map(|i| self.get(i)).collect()
    }

    /// The strings of an array of strings (a tokenizer's vocabulary, merges, …).
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetadataArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an array of f32 (token scores, …).
    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            MetadataArray::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an array of i32 (token types, …).
    pub fn as_i32s(&self) -> Option<&[i32]> {
        match self {
            MetadataArray::I32(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an array of u32.
    pub fn as_u32s(&self) -> Option<&[u32]> {
        match self {
            MetadataArray::U32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements of an array of arrays.
    pub fn as_arrays(&self) -> Option<&[MetadataArray]> {
        match self {
            MetadataArray::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// Metadata key–value pairs in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

macro_rules! typed_getter {
    ($(#[$doc:meta])* $name:ident, $as:ident, $ty:ty, $expected:literal) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<$ty> {
            let value = self.require(key)?;
            value.$as().ok_or_else(|| IoError::WrongMetadataType {
                key: key.to_string(),
                expected: $expected,
                found: value.type_description(),
            })
        }
    };
}

impl Metadata {
    /// Appends an entry; errors if the key is already present.
    pub(crate) fn insert(&mut self, key: String, value: MetadataValue) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(IoError::DuplicateKey { key });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The value of `key`, or [`IoError::MissingKey`] naming it.
    pub fn require(&self, key: &str) -> Result<&MetadataValue> {
        self.get(key).ok_or_else(|| IoError::MissingKey {
            key: key.to_string(),
        })
    }

    typed_getter!(
        /// `key` as u32 (any integer type whose value fits); errors name the key.
        get_u32, as_u32, u32, "an integer that fits in u32"
    );
    typed_getter!(
        /// `key` as u64 (any integer type whose value fits); errors name the key.
        get_u64, as_u64, u64, "an integer that fits in u64"
    );
    typed_getter!(
        /// `key` as i32 (any integer type whose value fits); errors name the key.
        get_i32, as_i32, i32, "an integer that fits in i32"
    );
    typed_getter!(
        /// `key` as i64 (any integer type whose value fits); errors name the key.
        get_i64, as_i64, i64, "an integer that fits in i64"
    );
    typed_getter!(
        /// `key` as f32 (an f32, or an f64 rounded); errors name the key.
        get_f32, as_f32, f32, "f32"
    );
    typed_getter!(
        /// `key` as f64 (an f64, or an f32 widened); errors name the key.
        get_f64, as_f64, f64, "f64"
    );
    typed_getter!(
        /// `key` as bool; errors name the key.
        get_bool, as_bool, bool, "bool"
    );
    typed_getter!(
        /// `key` as a string; errors name the key.
        get_str, as_str, &str, "string"
    );
    typed_getter!(
        /// `key` as an array; errors name the key.
        get_array, as_array, &MetadataArray, "array"
    );

    /// `key` as an array of strings (e.g. `tokenizer.ggml.tokens`); errors name the key.
    pub fn get_strings(&self, key: &str) -> Result<&[String]> {
        let value = self.require(key)?;
        value
            .as_array()
            .and_then(MetadataArray::as_strings)
            .ok_or_else(|| IoError::WrongMetadataType {
                key: key.to_string(),
                expected: "array of string",
                found: value.type_description(),
            })
    }
}
