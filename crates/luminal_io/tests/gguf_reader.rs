//! End-to-end GGUF reading: tiny.gguf written by gguf-py's GGUFWriter, checked against the
//! metadata it was given and the values gguf-py decodes; plus the real SmolLM2 model when
//! `models/` has it.

mod common;

use common::{assert_same_f32, f32s, fixture_bytes, fixture_json, fixture_path, hex, value_json};
use luminal_io::{GgmlType, GgufFile, IoError, MetadataArray, MetadataType, MetadataValue};

fn tiny() -> GgufFile {
    GgufFile::open(fixture_path("tiny.gguf")).expect("tiny.gguf parses")
}

#[test]
fn header_and_layout_match_gguf_py() {
    let file = tiny();
    let want = fixture_json("tiny.expected.json");
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), want["alignment"].as_u64().unwrap());
    assert_eq!(file.data_offset(), want["data_offset"].as_u64().unwrap());
    assert_eq!(file.file_len(), want["file_len"].as_u64().unwrap());
    assert_eq!(file.path(), Some(fixture_path("tiny.gguf").as_path()));
}

#[test]
fn metadata_matches_what_was_written_in_order() {
    let file = tiny();
    let want = fixture_json("tiny.expected.json");
    let want = want["metadata"].as_array().unwrap();
    let got: Vec<_> = file.metadata().iter().collect();
    assert_eq!(got.len(), want.len());
    for ((key, value), expected) in got.iter().zip(want) {
        assert_eq!(*key, expected[0].as_str().unwrap(), "key order");
        assert_eq!(value_json(value), expected[1], "value of {key}");
    }
}

#[test]
fn metadata_accessors() {
    let file = tiny();
    let m = file.metadata();
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u64("test.u64").unwrap(), 18_000_000_000_000_000_000);
    assert_eq!(m.get_i64("test.i64").unwrap(), -9_000_000_000_000_000_000);
    assert_eq!(m.get_i32("test.i8").unwrap(), -100);
    assert_eq!(m.get_u32("test.u8").unwrap(), 200);
    assert_eq!(m.get_f32("test.f32").unwrap(), 0.1);
    assert_eq!(m.get_f64("test.f64").unwrap(), std::f64::consts::PI);
    assert!(m.get_bool("test.bool").unwrap());
    assert!(!m.get_bool("test.bool_false").unwrap());
    assert_eq!(m.get_strings("test.array.string").unwrap()[1], "héllo");
    let array = m.get_array("test.array.u32").unwrap();
    assert_eq!(array.element_type(), MetadataType::U32);
    assert_eq!(array.as_u32s(), Some(&[1, 2, 3, 4_000_000_000][..]));
    assert_eq!(array.get(3), Some(MetadataValue::U32(4_000_000_000)));
    let nested = m.get_array("test.array.nested_i32").unwrap();
    assert_eq!(nested.type_description(), "array of array of i32");
    let inner = nested.as_arrays().unwrap();
    assert_eq!(inner[2], MetadataArray::I32(vec![4, 5, 6]));
    assert_eq!(
        m.get("test.string").and_then(|v| v.as_str()),
        Some("héllo wörld ✓ 🚀")
    );
    assert_eq!(m.keys().next(), Some("general.architecture"));
    assert!(m.contains_key("test.f64") && !m.is_empty());
}

#[test]
fn metadata_errors_name_the_key() {
    let file = tiny();
    let m = file.metadata();
    let err = m.get_u32("llama.context_length").unwrap_err();
    assert!(matches!(err, IoError::MissingKey { ref key } if key == "llama.context_length"));
    assert_eq!(
        err.to_string(),
        "metadata key llama.context_length is missing"
    );
    let err = m.get_u32("test.string").unwrap_err();
    assert!(matches!(err, IoError::WrongMetadataType { .. }), "{err}");
    assert!(err.to_string().contains("test.string") && err.to_string().contains("string"));
    // Integers convert only when the value fits.
    assert!(m.get_u32("test.i8").is_err());
    assert!(m.get_u32("test.u64").is_err());
    assert!(m.get_strings("test.array.u32").is_err());
    let err = m.get_f32("test.array.f32").unwrap_err();
    assert!(err.to_string().contains("array of f32"), "{err}");
}

#[test]
fn tensor_infos_match_gguf_py() {
    let file = tiny();
    let want = fixture_json("tiny.expected.json");
    let want = want["tensors"].as_array().unwrap();
    assert_eq!(file.tensors().len(), want.len());
    for (info, expected) in file.tensors().iter().zip(want) {
        let name = expected["name"].as_str().unwrap();
        assert_eq!(info.name(), name);
        assert_eq!(
            info.ggml_type().name(),
            expected["ggml_type"].as_str().unwrap()
        );
        let dims: Vec<u64> = serde_json::from_value(expected["dims"].clone()).unwrap();
        let shape: Vec<usize> = serde_json::from_value(expected["shape"].clone()).unwrap();
        assert_eq!(info.dims(), dims, "{name}");
        assert_eq!(info.shape(), shape, "{name}");
        assert_eq!(
            info.offset(),
            expected["offset"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            info.n_bytes(),
            expected["n_bytes"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(info.offset() % file.alignment(), 0);
        assert_eq!(
            file.tensor_bytes(name).unwrap().len() as u64,
            info.n_bytes()
        );
    }
}

#[test]
fn tensor_values_match_gguf_py() {
    let file = tiny();
    let want = fixture_json("tiny.expected.json");
    for expected in want["tensors"].as_array().unwrap() {
        let name = expected["name"].as_str().unwrap();
        let values = f32s(&expected["values"]);
        assert_same_f32(&file.tensor_f32(name).unwrap(), &values, name);
        let mut into = vec![0f32; values.len()];
        file.tensor_f32_into(name, &mut into).unwrap();
        assert_same_f32(&into, &values, name);
        let shape = file.tensor_info(name).unwrap().shape();
        assert_eq!(
            file.tensor_f32_with_shape(name, &shape).unwrap().len(),
            values.len()
        );
    }
}

#[test]
fn tensor_lookup_errors() {
    let file = tiny();
    let err = file.tensor_f32("no.such.tensor").unwrap_err();
    assert!(matches!(err, IoError::TensorNotFound { ref name } if name == "no.such.tensor"));
    let err = file.tensor_bytes("no.such.tensor").unwrap_err();
    assert!(matches!(err, IoError::TensorNotFound { .. }));
    let err = file
        .tensor_f32_into("output_norm.weight", &mut [0f32; 6])
        .unwrap_err();
    assert!(
        matches!(
            err,
            IoError::LengthMismatch {
                expected: 7,
                found: 6,
                ..
            }
        ),
        "{err}"
    );
    let err = file
        .tensor_f32_with_shape("conv.weight", &[4, 3, 2])
        .unwrap_err();
    assert!(matches!(err, IoError::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("conv.weight"));
}

#[test]
fn from_bytes_equals_open_and_v2_reads_the_same() {
    let bytes = fixture_bytes("tiny.gguf");
    let opened = tiny();
    let in_memory = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(in_memory.path(), None);
    assert_eq!(in_memory.tensors(), opened.tensors());
    // v2 and v3 share the little-endian layout.
    let mut v2 = bytes;
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    let v2 = GgufFile::from_bytes(v2).unwrap();
    assert_eq!(v2.version(), 2);
    assert_eq!(v2.tensors(), opened.tensors());
    assert_eq!(v2.metadata().len(), opened.metadata().len());
    assert_eq!(
        v2.tensor_f32("blk.0.ffn_up.weight").unwrap(),
        opened.tensor_f32("blk.0.ffn_up.weight").unwrap()
    );
}

#[test]
fn missing_file_is_not_found() {
    let err = GgufFile::open("/definitely/not/here.gguf").unwrap_err();
    assert!(matches!(err, IoError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("/definitely/not/here.gguf"));
}

#[test]
fn open_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("luminal_io_gguf_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.gguf");
    let bytes = fixture_bytes("tiny.gguf");
    // The last tensor ends before the writer's final padding; cut one byte into its data.
    let last = tiny().tensor_info("conv.weight").unwrap().clone();
    let end = (tiny().data_offset() + last.offset() + last.n_bytes()) as usize;
    std::fs::write(&path, &bytes[..end - 1]).unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err.root(), IoError::Truncated { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: model file is truncated: tensor conv.weight ends at {} but the file has {} bytes",
            path.display(),
            end,
            end - 1
        )
    );
    std::fs::write(&path, b"").unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err.root(), IoError::Truncated { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The real SmolLM2-135M-Instruct Q4_1 model, if present under models/ (it is not checked in;
/// a fetch script puts it there). Checks the header against gguf-py's reading and a few
/// tensors' first rows against gguf-py's dequantisation.
#[test]
fn real_smollm2_model_when_available() {
    let sample = fixture_json("smollm2_sample.json");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap();
    let path = root.join("models").join(sample["file"].as_str().unwrap());
    if !path.exists() {
        eprintln!(
            "note: {} not found; skipping the real-model test",
            path.display()
        );
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.file_len(), sample["file_len"].as_u64().unwrap());
    assert_eq!(file.version() as u64, sample["version"].as_u64().unwrap());
    assert_eq!(
        file.tensors().len() as u64,
        sample["n_tensors"].as_u64().unwrap()
    );
    assert_eq!(
        file.metadata().len() as u64,
        sample["n_kv"].as_u64().unwrap()
    );
    assert_eq!(file.data_offset(), sample["data_offset"].as_u64().unwrap());
    let m = file.metadata();
    assert_eq!(
        m.get_u32("llama.block_count").unwrap() as u64,
        sample["block_count"].as_u64().unwrap()
    );
    assert_eq!(
        m.get_u32("llama.embedding_length").unwrap() as u64,
        sample["embedding_length"].as_u64().unwrap()
    );
    assert_eq!(
        m.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() as f64,
        sample["rms_eps"].as_f64().unwrap()
    );
    let tokens = m.get_strings("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, sample["n_tokens"].as_u64().unwrap());
    for (i, token) in sample["first_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(tokens[i], token.as_str().unwrap());
    }
    for s in sample["samples"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let info = file.tensor_info(name).unwrap();
        let dims: Vec<u64> = serde_json::from_value(s["dims"].clone()).unwrap();
        assert_eq!(info.dims(), dims);
        assert_eq!(info.offset(), s["offset"].as_u64().unwrap());
        let raw = hex(s["data"].as_str().unwrap());
        assert_eq!(
            &file.tensor_bytes(name).unwrap()[..raw.len()],
            &raw[..],
            "{name}"
        );
        let values = f32s(&s["values"]);
        let all = file.tensor_f32(name).unwrap();
        assert_same_f32(&all[..values.len()], &values, name);
    }
    // Every tensor of the model decodes (Q4_1, Q8_0, F32).
    for info in file.tensors() {
        assert!(info.ggml_type() == GgmlType::F32 || info.ggml_type().is_quantized());
        let values = file.tensor_f32(info.name()).unwrap();
        assert!(values.iter().all(|v| v.is_finite()), "{}", info.name());
    }
}
