//! ggml tensor types: ids as stored in GGUF, block sizes and bytes per block.

/// A ggml tensor type, as stored in a GGUF tensor info.
///
/// Every type of the ggml type table is known here, so that a file with exotic tensors can still
/// be opened and inspected; [`GgmlType::can_dequantize`] says which ones
/// [`crate::quant::dequantize`] turns into f32.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, id, elements per block, bytes per block, name), from ggml's type traits table.
/// Ids 4, 5 (Q4_2, Q4_3), 31–33 and 36–38 were removed from ggml and are rejected.
const TABLE: &[(GgmlType, u32, u64, u64, &str)] = &[
    (GgmlType::F32, 0, 1, 4, "F32"),
    (GgmlType::F16, 1, 1, 2, "F16"),
    (GgmlType::Q4_0, 2, 32, 18, "Q4_0"),
    (GgmlType::Q4_1, 3, 32, 20, "Q4_1"),
    (GgmlType::Q5_0, 6, 32, 22, "Q5_0"),
    (GgmlType::Q5_1, 7, 32, 24, "Q5_1"),
    (GgmlType::Q8_0, 8, 32, 34, "Q8_0"),
    (GgmlType::Q8_1, 9, 32, 36, "Q8_1"),
    (GgmlType::Q2_K, 10, 256, 84, "Q2_K"),
    (GgmlType::Q3_K, 11, 256, 110, "Q3_K"),
    (GgmlType::Q4_K, 12, 256, 144, "Q4_K"),
    (GgmlType::Q5_K, 13, 256, 176, "Q5_K"),
    (GgmlType::Q6_K, 14, 256, 210, "Q6_K"),
    (GgmlType::Q8_K, 15, 256, 292, "Q8_K"),
    (GgmlType::IQ2_XXS, 16, 256, 66, "IQ2_XXS"),
    (GgmlType::IQ2_XS, 17, 256, 74, "IQ2_XS"),
    (GgmlType::IQ3_XXS, 18, 256, 98, "IQ3_XXS"),
    (GgmlType::IQ1_S, 19, 256, 50, "IQ1_S"),
    (GgmlType::IQ4_NL, 20, 32, 18, "IQ4_NL"),
    (GgmlType::IQ3_S, 21, 256, 110, "IQ3_S"),
    (GgmlType::IQ2_S, 22, 256, 82, "IQ2_S"),
    (GgmlType::IQ4_XS, 23, 256, 136, "IQ4_XS"),
    (GgmlType::I8, 24, 1, 1, "I8"),
    (GgmlType::I16, 25, 1, 2, "I16"),
    (GgmlType::I32, 26, 1, 4, "I32"),
    (GgmlType::I64, 27, 1, 8, "I64"),
    (GgmlType::F64, 28, 1, 8, "F64"),
    (GgmlType::IQ1_M, 29, 256, 56, "IQ1_M"),
    (GgmlType::BF16, 30, 1, 2, "BF16"),
    (GgmlType::TQ1_0, 34, 256, 54, "TQ1_0"),
    (GgmlType::TQ2_0, 35, 256, 66, "TQ2_0"),
    (GgmlType::MXFP4, 39, 32, 17, "MXFP4"),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, u64, u64, &'static str) {
        // The table lists every variant once, so the search always succeeds; the fallback
        // only keeps this function total.
        TABLE
            .iter()
            .find(|entry| entry.0 == self)
            .unwrap_or(&TABLE[0])
    }

    /// The type with GGUF id `id`, if ggml defines one.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|entry| entry.1 == id)
            .map(|entry| entry.0)
    }

    /// The id stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Number of elements in one block (1 for plain types like F32).
    pub fn block_size(self) -> u64 {
        self.entry().2
    }

    /// Number of bytes one block occupies in the file.
    pub fn type_size(self) -> u64 {
        self.entry().3
    }

    /// ggml's name of the type ("Q4_K", "F16", …).
    pub fn name(self) -> &'static str {
        self.entry().4
    }

    /// Whether the type stores blocks of several elements sharing scales.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Whether [`crate::quant::dequantize`] can turn this type into f32.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | F64
                | I8
                | I16
                | I32
                | Q8_0
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
        )
    }

    /// The Luminal dtype that stores this type's data as is (`None` for types a graph cannot
    /// hold: the IQ/TQ families, Q8_1/Q8_K, and the plain int/f64 types).
    pub fn dtype(self) -> Option<luminal::DType> {
        use luminal::DType as D;
        Some(match self {
            GgmlType::F32 => D::F32,
            GgmlType::F16 => D::F16,
            GgmlType::BF16 => D::BF16,
            GgmlType::Q4_0 => D::Q4_0,
            GgmlType::Q4_1 => D::Q4_1,
            GgmlType::Q5_0 => D::Q5_0,
            GgmlType::Q5_1 => D::Q5_1,
            GgmlType::Q8_0 => D::Q8_0,
            GgmlType::Q2_K => D::Q2_K,
            GgmlType::Q3_K => D::Q3_K,
            GgmlType::Q4_K => D::Q4_K,
            GgmlType::Q5_K => D::Q5_K,
            GgmlType::Q6_K => D::Q6_K,
            _ => return None,
        })
    }

    /// Bytes needed for `n_elements` elements, or `None` if `n_elements` is not a whole number
    /// of blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for &(ty, id, ..) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(ty));
            assert_eq!(ty.id(), id);
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn dtypes_share_the_block_layout() {
        for &(ty, ..) in TABLE {
            if let Some(dt) = ty.dtype() {
                assert_eq!(dt.block_size() as u64, ty.block_size(), "{ty}");
                assert_eq!(dt.block_bytes() as u64, ty.type_size(), "{ty}");
            }
        }
    }

    #[test]
    fn block_layouts_match_ggml() {
        assert_eq!(
            (GgmlType::Q4_1.block_size(), GgmlType::Q4_1.type_size()),
            (32, 20)
        );
        assert_eq!(
            (GgmlType::Q6_K.block_size(), GgmlType::Q6_K.type_size()),
            (256, 210)
        );
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
