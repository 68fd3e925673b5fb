//! Malformed, truncated and hostile GGUF files: each must give a typed error (never a panic,
//! never a huge allocation), and the message must name what is wrong.

mod common;

use common::*;
use luminal_io::{GgufFile, IoError};

fn parse(bytes: Vec<u8>) -> Result<GgufFile, IoError> {
    GgufFile::from_bytes(bytes)
}

fn err(bytes: Vec<u8>) -> IoError {
    match parse(bytes) {
        Ok(_) => panic!("malformed file parsed"),
        Err(e) => e,
    }
}

/// A small valid file made by the builder: two metadata entries, one F32 tensor.
fn valid() -> GgufBuilder {
    GgufBuilder::default()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 1)
        .tensor_f32("w", &[2, 2], &[1.0, 2.0, 3.0, 4.0])
}

#[test]
fn builder_baseline_is_valid() {
    let file = parse(valid().build()).unwrap();
    assert_eq!(file.tensor_f32("w").unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset() % 32, 0);
    // No tensors and no metadata is a valid (empty) file too.
    let empty = parse(GgufBuilder::default().build()).unwrap();
    assert!(empty.tensors().is_empty() && empty.metadata().is_empty());
}

#[test]
fn truncation_at_every_header_offset_and_sampled_data_offsets() {
    let bytes = fixture_bytes("tiny.gguf");
    let full = parse(bytes.clone()).unwrap();
    let data_end = full
        .tensors()
        .iter()
        .map(|t| full.data_offset() + t.offset() + t.n_bytes())
        .max()
        .unwrap() as usize;
    let header_end = full.data_offset() as usize;
    let cuts = (0..header_end).chain((header_end..data_end).step_by(7));
    let mut n = 0;
    for cut in cuts {
        let e = err(bytes[..cut].to_vec());
        assert!(
            matches!(
                e,
                IoError::Truncated { .. } | IoError::ImplausibleCount { .. }
            ),
            "cut at {cut}: unexpected error {e}"
        );
        assert!(!e.to_string().is_empty());
        n += 1;
    }
    assert!(n > header_end);
    // Cutting only the writer's trailing padding leaves a valid file.
    parse(bytes[..data_end].to_vec()).unwrap();
}

#[test]
fn truncated_tensor_data_names_tensor_and_numbers() {
    let bytes = valid().build();
    let e = err(bytes[..bytes.len() - 20].to_vec());
    let len = bytes.len() - 20;
    assert_eq!(
        e.to_string(),
        format!(
            "model file is truncated: tensor w ends at {} but the file has {len} bytes",
            bytes.len() - 16
        )
    );
}

#[test]
fn bad_magic() {
    let mut bytes = valid().build();
    bytes[0..4].copy_from_slice(b"GGML");
    let e = err(bytes);
    assert!(
        matches!(e, IoError::BadMagic { found } if &found == b"GGML"),
        "{e}"
    );
    assert!(matches!(
        err(b"PK\x03\x04 zip file".to_vec()),
        IoError::BadMagic { .. }
    ));
    assert!(matches!(err(Vec::new()), IoError::Truncated { .. }));
    assert!(matches!(err(b"GGUF".to_vec()), IoError::Truncated { .. }));
}

#[test]
fn unsupported_versions() {
    for (version, fragment) in [
        (1u32, "v1"),
        (0, "only versions 2 and 3"),
        (4, "only versions 2 and 3"),
        (u32::MAX, "only versions 2 and 3"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut b = valid();
        b.version = version;
        let e = err(b.build());
        assert!(
            matches!(e, IoError::UnsupportedVersion { .. }),
            "{version}: {e}"
        );
        assert!(e.to_string().contains(fragment), "{version}: {e}");
    }
    let mut b = valid();
    b.version = 2;
    assert_eq!(parse(b.build()).unwrap().version(), 2);
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    for huge in [u64::MAX, 1 << 62, 1 << 40, 1_000_000] {
        let mut b = valid();
        b.n_tensors_override = Some(huge);
        let e = err(b.build());
        assert!(
            matches!(e, IoError::ImplausibleCount { count, .. } if count == huge),
            "{e}"
        );
        assert!(e.to_string().contains("tensor count"), "{e}");
        let mut b = valid();
        b.n_kv_override = Some(huge);
        let e = err(b.build());
        assert!(
            matches!(e, IoError::ImplausibleCount { count, .. } if count == huge),
            "{e}"
        );
    }
    // One more entry claimed than present: the parser runs off the end instead.
    let mut b = valid();
    b.n_kv_override = Some(3);
    assert!(matches!(
        err(b.build()),
        IoError::UnknownMetadataType { .. }
            | IoError::Truncated { .. }
            | IoError::ImplausibleCount { .. }
    ));
}

#[test]
fn huge_string_lengths() {
    for len in [u64::MAX, u64::MAX - 10, 1 << 40] {
        // A key length…
        let mut bytes = GgufBuilder::default().build();
        bytes.truncate(24); // drop the padding after the (empty) header
        bytes[16..24].copy_from_slice(&1u64.to_le_bytes()); // n_kv = 1
        bytes.extend(len.to_le_bytes());
        bytes.extend(b"key and some more bytes to look plausible");
        let e = err(bytes);
        assert!(
            matches!(
                e,
                IoError::Truncated { .. } | IoError::ImplausibleCount { .. }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("metadata key #0"), "{e}");
        // …and a string value length.
        let mut value = len.to_le_bytes().to_vec();
        value.extend(b"abc");
        let e = err(GgufBuilder::default()
            .kv_raw(b"k", T_STRING, &value)
            .build());
        assert!(e.to_string().contains("value of metadata key k"), "{e}");
    }
}

#[test]
fn huge_and_hostile_arrays() {
    // Array length far beyond the file.
    for (elem, len) in [
        (T_U8, u64::MAX),
        (T_U32, 1 << 61),
        (T_STRING, 1 << 40),
        (T_ARRAY, 1 << 30),
    ] {
        let mut value = elem.to_le_bytes().to_vec();
        value.extend(len.to_le_bytes());
        value.extend([0u8; 64]);
        let e = err(GgufBuilder::default()
            .kv_raw(b"tokens", T_ARRAY, &value)
            .build());
        assert!(
            matches!(e, IoError::ImplausibleCount { count, .. } if count == len),
            "{e}"
        );
        assert!(e.to_string().contains("tokens"), "{e}");
    }
    // Unknown element type.
    let mut value = 99u32.to_le_bytes().to_vec();
    value.extend(1u64.to_le_bytes());
    let e = err(GgufBuilder::default()
        .kv_raw(b"arr", T_ARRAY, &value)
        .build());
    assert!(
        matches!(e, IoError::UnknownMetadataType { type_id: 99, .. }),
        "{e}"
    );
    // Arrays nested deeper than allowed (each level: type ARRAY, length 1).
    let mut value = Vec::new();
    for _ in 0..100 {
        value.extend(T_ARRAY.to_le_bytes());
        value.extend(1u64.to_le_bytes());
    }
    value.extend(T_U8.to_le_bytes());
    value.extend(0u64.to_le_bytes());
    let e = err(GgufBuilder::default()
        .kv_raw(b"deep", T_ARRAY, &value)
        .build());
    assert!(matches!(e, IoError::NestingTooDeep { .. }), "{e}");
    // Empty arrays (which gguf-py cannot write) are fine, also nested.
    let mut value = T_ARRAY.to_le_bytes().to_vec();
    value.extend(1u64.to_le_bytes());
    value.extend(T_STRING.to_le_bytes());
    value.extend(0u64.to_le_bytes());
    let file = parse(GgufBuilder::default().kv_raw(b"e", T_ARRAY, &value).build()).unwrap();
    let outer = file.metadata().get_array("e").unwrap();
    assert_eq!(outer.as_arrays().unwrap()[0].len(), 0);
}

#[test]
fn bad_metadata_values() {
    let e = err(GgufBuilder::default().kv_raw(b"k", 13, &[0; 8]).build());
    assert!(
        matches!(e, IoError::UnknownMetadataType { type_id: 13, .. }),
        "{e}"
    );
    let e = err(GgufBuilder::default()
        .kv_raw(b"k", u32::MAX, &[0; 8])
        .build());
    assert!(matches!(e, IoError::UnknownMetadataType { .. }), "{e}");
    let e = err(GgufBuilder::default().kv_raw(b"flag", T_BOOL, &[2]).build());
    assert!(matches!(e, IoError::InvalidBool { value: 2, .. }), "{e}");
    let mut value = T_BOOL.to_le_bytes().to_vec();
    value.extend(2u64.to_le_bytes());
    value.extend([1, 7]);
    let e = err(GgufBuilder::default()
        .kv_raw(b"flags", T_ARRAY, &value)
        .build());
    assert!(matches!(e, IoError::InvalidBool { value: 7, .. }), "{e}");
    let e = err(GgufBuilder::default().kv_u32("a", 1).kv_u32("a", 2).build());
    assert!(
        matches!(e, IoError::DuplicateKey { ref key } if key == "a"),
        "{e}"
    );
    let e = err(GgufBuilder::default()
        .kv_raw(b"bad\xff\xfekey", T_U8, &[0])
        .build());
    assert!(matches!(e, IoError::InvalidUtf8 { .. }), "{e}");
    // Invalid UTF-8 inside a string *value* is tolerated (replaced), as token lists need.
    let file = parse(
        GgufBuilder::default()
            .kv_raw(b"s", T_STRING, &gguf_string(b"ok\xff"))
            .build(),
    )
    .unwrap();
    assert_eq!(file.metadata().get_str("s").unwrap(), "ok\u{fffd}");
}

#[test]
fn bad_alignment() {
    for (type_id, value) in [
        (T_U32, 0u32.to_le_bytes().to_vec()),
        (T_U32, 3u32.to_le_bytes().to_vec()),
        (T_U32, 48u32.to_le_bytes().to_vec()),
        (T_U8, vec![32]),
        (T_STRING, gguf_string(b"32")),
    ] {
        let e = err(GgufBuilder::default()
            .kv_raw(b"general.alignment", type_id, &value)
            .build());
        assert!(matches!(e, IoError::BadAlignment { .. }), "{e}");
    }
    let mut b = GgufBuilder::default();
    b.alignment = 128;
    b = b.kv_u32("general.alignment", 128);
    b = b
        .tensor_f32("x", &[3], &[1.0, 2.0, 3.0])
        .tensor_f32("y", &[1], &[4.0]);
    let file = parse(b.build()).unwrap();
    assert_eq!(file.alignment(), 128);
    assert_eq!(file.tensor_info("y").unwrap().offset(), 128);
    assert_eq!(file.tensor_f32("y").unwrap(), vec![4.0]);
}

#[test]
fn bad_tensor_infos() {
    let data = [0u8; 64];
    let with = |name: &[u8], dims: &[u64], ty: u32, offset: u64| {
        GgufBuilder::default()
            .tensor_raw(name, dims, ty, offset)
            .data(&data)
            .build()
    };
    let e = err(with(b"t", &[1, 1, 1, 1, 1], GGML_F32, 0));
    assert!(matches!(e, IoError::TooManyDims { n_dims: 5, .. }), "{e}");
    // n_dims = u32::MAX must not allocate 4 G dims.
    let mut bytes = with(b"t", &[], GGML_F32, 0);
    let at = 24 + 8 + 1; // header, name length, name
    bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = err(bytes);
    assert!(matches!(e, IoError::TooManyDims { .. }), "{e}");

    for ty in [4, 5, 31, 1000, u32::MAX] {
        let e = err(with(b"t", &[32], ty, 0));
        assert!(
            matches!(e, IoError::UnknownGgmlType { ref tensor, .. } if tensor == "t"),
            "{e}"
        );
    }
    let e = err(with(b"blk.0.w", &[33, 2], GGML_Q4_0, 0));
    assert!(
        matches!(
            e,
            IoError::BlockSizeMismatch {
                row_len: 33,
                block_size: 32,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("blk.0.w"), "{e}");
    let e = err(with(b"t", &[4], GGML_F32, 8));
    assert!(
        matches!(
            e,
            IoError::MisalignedOffset {
                offset: 8,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    let e = err(with(b"t", &[4], GGML_F32, 1 << 40));
    assert!(matches!(e, IoError::Truncated { .. }), "{e}");
    let e = err(with(b"t", &[4], GGML_F32, !31u64));
    assert!(matches!(e, IoError::Overflow { .. }), "{e}");
    let e = err(with(b"t", &[1 << 32, 1 << 32, 1 << 32], GGML_F32, 0));
    assert!(matches!(e, IoError::Overflow { .. }), "{e}");
    let e = err(with(b"t", &[1 << 62, 1], GGML_F32, 0));
    assert!(matches!(e, IoError::Overflow { .. }), "{e}");
    let e = err(with(b"t", &[1 << 40, 1 << 20], GGML_Q8_0, 0));
    assert!(
        matches!(e, IoError::Truncated { .. } | IoError::Overflow { .. }),
        "{e}"
    );
    let e = err(with(b"t\xff", &[4], GGML_F32, 0));
    assert!(matches!(e, IoError::InvalidUtf8 { .. }), "{e}");
    let e = err(GgufBuilder::default()
        .tensor_raw(b"dup", &[4], GGML_F32, 0)
        .tensor_raw(b"dup", &[4], GGML_F32, 32)
        .data(&data)
        .build());
    assert!(
        matches!(e, IoError::DuplicateTensor { ref name } if name == "dup"),
        "{e}"
    );
}

#[test]
fn valid_edge_cases() {
    let data = [0u8; 128];
    // A zero-sized tensor, a scalar (n_dims = 0), and a type without a decoder.
    let file = parse(
        GgufBuilder::default()
            .tensor_raw(b"empty", &[0, 4], GGML_F32, 0)
            .tensor_raw(b"scalar", &[], GGML_F32, 0)
            .tensor_raw(b"iq", &[256], GGML_IQ2_XXS, 0)
            .data(&data)
            .build(),
    )
    .unwrap();
    assert!(file.tensor_f32("empty").unwrap().is_empty());
    assert_eq!(file.tensor_f32("scalar").unwrap(), vec![0.0]);
    assert_eq!(
        file.tensor_info("scalar").unwrap().shape(),
        Vec::<usize>::new()
    );
    let e = file.tensor_f32("iq").unwrap_err();
    assert!(
        matches!(e, IoError::UnsupportedDtype { ref dtype, .. } if dtype == "IQ2_XXS"),
        "{e}"
    );
    assert_eq!(file.tensor_bytes("iq").unwrap().len(), 66);
}

#[test]
fn corrupted_counts_in_the_real_fixture() {
    // Overwrite each u64 count / length field position of tiny.gguf's fixed header with
    // hostile values; and every 4-byte window of the tensor-info region with 0xFFFFFFFF.
    let bytes = fixture_bytes("tiny.gguf");
    let file = parse(bytes.clone()).unwrap();
    for at in [8usize, 16] {
        for v in [u64::MAX, 1 << 63, 1 << 33] {
            let mut b = bytes.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            assert!(parse(b).is_err(), "count at {at} = {v}");
        }
    }
    for at in (24..file.data_offset() as usize - 4).step_by(3) {
        let mut b = bytes.clone();
        b[at..at + 4].copy_from_slice(&[0xFF; 4]);
        // Either an error or (if the window only hit string content) a valid file.
        if let Ok(f) = parse(b) {
            for t in f.tensors() {
                let _ = f.tensor_f32(t.name());
            }
        }
    }
}
