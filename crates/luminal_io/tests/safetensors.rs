//! safetensors: files written by the `safetensors` Python package (single and 2-shard index),
//! and malformed headers.

mod common;

use common::{assert_same_f32, f32s, fixture_bytes, fixture_json, fixture_path};
use luminal_io::{Dtype, IoError, SafetensorsFile, SafetensorsModel};

fn dtype_name(dtype: Dtype) -> String {
    dtype.to_string()
}

#[test]
fn single_file_lists_and_reads_tensors() {
    let file = SafetensorsFile::open(fixture_path("tiny.safetensors")).unwrap();
    let want = fixture_json("safetensors.expected.json");
    let want = want["single"].as_object().unwrap();
    assert_eq!(file.tensors().len(), want.len());
    assert_eq!(
        file.metadata().get("format").map(String::as_str),
        Some("pt")
    );
    for (name, expected) in want {
        let info = file.tensor_info(name).unwrap();
        assert_eq!(
            dtype_name(info.dtype()),
            expected["dtype"].as_str().unwrap(),
            "{name}"
        );
        let shape: Vec<usize> = serde_json::from_value(expected["shape"].clone()).unwrap();
        assert_eq!(info.shape(), shape, "{name}");
        if expected["values"].is_null() {
            let e = file.tensor_f32(name).unwrap_err();
            assert!(
                matches!(e, IoError::UnsupportedDtype { ref dtype, .. } if dtype == "I64"),
                "{e}"
            );
            assert_eq!(file.tensor_bytes(name).unwrap().len(), 24);
            continue;
        }
        let values = f32s(&expected["values"]);
        assert_same_f32(&file.tensor_f32(name).unwrap(), &values, name);
        assert_same_f32(
            &file.tensor_f32_with_shape(name, &shape).unwrap(),
            &values,
            name,
        );
        let mut into = vec![0f32; values.len()];
        file.tensor_f32_into(name, &mut into).unwrap();
        assert_same_f32(&into, &values, name);
    }
    assert_eq!(file.tensor_info("scalar").unwrap().n_elements(), 1);
}

#[test]
fn lookup_and_shape_errors() {
    let file = SafetensorsFile::open(fixture_path("tiny.safetensors")).unwrap();
    let e = file.tensor_f32("missing").unwrap_err();
    assert!(
        matches!(e, IoError::TensorNotFound { ref name } if name == "missing"),
        "{e}"
    );
    let e = file.tensor_f32_with_shape("f32", &[3, 2]).unwrap_err();
    assert!(matches!(e, IoError::ShapeMismatch { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "tensor f32: shape is [2, 3], expected [3, 2]"
    );
    let e = file.tensor_f32_into("f32", &mut [0.0; 5]).unwrap_err();
    assert!(
        matches!(
            e,
            IoError::LengthMismatch {
                expected: 6,
                found: 5,
                ..
            }
        ),
        "{e}"
    );
    let e = SafetensorsFile::open(fixture_path("nope.safetensors")).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e}");
}

#[test]
fn sharded_model_through_index() {
    let want = fixture_json("safetensors.expected.json");
    let want = want["sharded"].as_object().unwrap();
    for path in [
        fixture_path("sharded"),
        fixture_path("sharded/model.safetensors.index.json"),
    ] {
        let model = SafetensorsModel::open(&path).unwrap();
        assert_eq!(model.shards().len(), 2, "each shard opened once");
        assert_eq!(
            model.names(),
            ["model.a.weight", "model.b.bias", "model.c.weight"]
        );
        for (name, expected) in want {
            let info = model.tensor_info(name).unwrap();
            assert_eq!(
                dtype_name(info.dtype()),
                expected["dtype"].as_str().unwrap()
            );
            let values = f32s(&expected["values"]);
            assert_same_f32(&model.tensor_f32(name).unwrap(), &values, name);
        }
        let shard = model.shard_for("model.c.weight").unwrap();
        assert!(shard
            .path()
            .unwrap()
            .ends_with("model-00002-of-00002.safetensors"));
        assert_eq!(model.shard_paths().len(), 2);
        let e = model.tensor_f32("model.z").unwrap_err();
        assert!(matches!(e, IoError::TensorNotFound { .. }), "{e}");
    }
    // A single file opens as a one-shard model too.
    let single = SafetensorsModel::open(fixture_path("tiny.safetensors")).unwrap();
    assert_eq!(single.shards().len(), 1);
    assert_eq!(single.names().len(), 5);
    assert_eq!(single.tensor_f32("scalar").unwrap(), vec![1.5]);
}

#[test]
fn bad_indexes() {
    let dir = fixture_path("sharded");
    let index = |text: &str| SafetensorsModel::from_index_json(text, &dir).unwrap_err();
    assert!(matches!(index("not json"), IoError::BadIndex { .. }));
    assert!(matches!(index("{}"), IoError::BadIndex { .. }));
    assert!(matches!(
        index(r#"{"weight_map": {"a": 3}}"#),
        IoError::BadIndex { .. }
    ));
    let e = index(r#"{"weight_map": {"a": "../../../etc/passwd"}}"#);
    assert!(matches!(e, IoError::BadIndex { .. }), "{e}");
    let e = index(r#"{"weight_map": {"a": "/etc/passwd"}}"#);
    assert!(matches!(e, IoError::BadIndex { .. }), "{e}");
    let e = index(r#"{"weight_map": {"a": "missing-shard.safetensors"}}"#);
    assert!(matches!(e, IoError::NotFound { .. }), "{e}");
    // A tensor mapped to a shard that lacks it.
    let e = index(r#"{"weight_map": {"model.c.weight": "model-00001-of-00002.safetensors"}}"#);
    assert!(matches!(e, IoError::BadIndex { .. }), "{e}");
    assert!(e.to_string().contains("model.c.weight"), "{e}");
    let e = SafetensorsModel::open(fixture_path("no-such-dir/model.safetensors.index.json"))
        .unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e}");
}

/// A safetensors file from a header string and a data section.
fn build(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn err(bytes: Vec<u8>) -> IoError {
    match SafetensorsFile::from_bytes(bytes) {
        Ok(_) => panic!("malformed safetensors parsed"),
        Err(e) => e,
    }
}

#[test]
fn malformed_headers() {
    let ok = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let file = SafetensorsFile::from_bytes(build(ok, &[0; 8])).unwrap();
    assert_eq!(file.tensor_f32("w").unwrap(), vec![0.0, 0.0]);

    // Header length past the end / absurd / shorter than 8 bytes of file.
    let mut bytes = build(ok, &[0; 8]);
    bytes[0..8].copy_from_slice(&10_000u64.to_le_bytes());
    assert!(matches!(err(bytes), IoError::Truncated { end: 10_008, .. }));
    let mut bytes = build(ok, &[0; 8]);
    bytes[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(err(bytes), IoError::BadHeader { .. }));
    assert!(matches!(
        err(vec![1, 2, 3]),
        IoError::Truncated { end: 8, .. }
    ));
    // Garbage, non-object and non-UTF-8 headers.
    assert!(matches!(
        err(build("{not json", &[])),
        IoError::BadHeader { .. }
    ));
    assert!(matches!(
        err(build("[1, 2]", &[])),
        IoError::BadHeader { .. }
    ));
    let mut bytes = build("{}", &[]);
    bytes[8] = 0xFF;
    assert!(matches!(err(bytes), IoError::BadHeader { .. }));
    // Entries with missing or mistyped fields.
    for header in [
        r#"{"w":{"shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#,
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
        r#"{"w":7}"#,
        r#"{"__metadata__":{"a":1}}"#,
    ] {
        let e = err(build(header, &[0; 8]));
        assert!(matches!(e, IoError::BadHeader { .. }), "{header}: {e}");
    }
    // Unknown dtype names the tensor and the dtype.
    let e = err(build(
        r#"{"w":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(
        matches!(e, IoError::UnknownDtype { ref tensor, ref dtype } if tensor == "w" && dtype == "F17"),
        "{e}"
    );
    // Offsets past the end of the file, also near u64::MAX.
    let e = err(build(
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        &[0; 4],
    ));
    assert!(matches!(e, IoError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("tensor w ends at"), "{e}");
    let huge = r#"{"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}}"#;
    assert!(matches!(
        err(build(huge, &[0; 8])),
        IoError::Overflow { .. }
    ));
    let big = r#"{"w":{"dtype":"U8","shape":[1099511627776],"data_offsets":[0,1099511627776]}}"#;
    assert!(matches!(
        err(build(big, &[0; 8])),
        IoError::Truncated { .. }
    ));
    // Shape and length disagree; shape product overflows.
    let e = err(build(
        r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(
        matches!(
            e,
            IoError::LengthMismatch {
                expected: 12,
                found: 8,
                ..
            }
        ),
        "{e}"
    );
    let e = err(build(
        r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(matches!(e, IoError::Overflow { .. }), "{e}");
    // Gaps, overlaps and trailing bytes are caught by the safetensors crate's validation.
    let gap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#;
    assert!(matches!(
        err(build(gap, &[0; 6])),
        IoError::BadHeader { .. }
    ));
    assert!(matches!(err(build(ok, &[0; 9])), IoError::BadHeader { .. }));
}

#[test]
fn truncation_at_every_offset() {
    let bytes = fixture_bytes("tiny.safetensors");
    for cut in 0..bytes.len() {
        let e = err(bytes[..cut].to_vec());
        assert!(
            matches!(e, IoError::Truncated { .. } | IoError::BadHeader { .. }),
            "cut at {cut}: {e}"
        );
    }
}
