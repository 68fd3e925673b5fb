//! Block decoders against gguf-py's dequantisation (fixtures from scripts/gen_gguf_fixtures.py).

mod common;

use common::{assert_same_f32, f32s, fixture_json, hex};
use luminal_io::quant;
use luminal_io::GgmlType;

/// Runs every case of `type_name` from quant_blocks.json through `decode`.
fn check_type(type_name: &str, decode: fn(&[u8], &mut [f32])) {
    let fixture = fixture_json("quant_blocks.json");
    let entry = &fixture[type_name];
    let ty = GgmlType::from_id(entry["type_id"].as_u64().unwrap() as u32).unwrap();
    assert_eq!(ty.name(), type_name);
    assert_eq!(ty.block_size(), entry["block_size"].as_u64().unwrap());
    assert_eq!(ty.type_size(), entry["type_size"].as_u64().unwrap());
    let cases = entry["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let context = format!("{type_name} ({})", case["how"].as_str().unwrap());
        let data = hex(case["data"].as_str().unwrap());
        let want = f32s(&case["values"]);
        // The per-type function…
        let mut got = vec![f32::NAN; want.len()];
        decode(&data, &mut got);
        assert_same_f32(&got, &want, &context);
        // …and the checked dispatcher, serial and parallel.
        let mut got = vec![f32::NAN; want.len()];
        quant::dequantize(ty, &data, &mut got).unwrap();
        assert_same_f32(&got, &want, &context);
        let mut got = vec![f32::NAN; want.len()];
        quant::dequantize_parallel(ty, &data, &mut got).unwrap();
        assert_same_f32(&got, &want, &context);
    }
}

#[test]
fn f16_matches_gguf_py() {
    check_type("F16", quant::convert_f16);
}

#[test]
fn bf16_matches_gguf_py() {
    check_type("BF16", quant::convert_bf16);
}

#[test]
fn q4_0_matches_gguf_py() {
    check_type("Q4_0", quant::dequantize_q4_0);
}

#[test]
fn q4_1_matches_gguf_py() {
    check_type("Q4_1", quant::dequantize_q4_1);
}

#[test]
fn q5_0_matches_gguf_py() {
    check_type("Q5_0", quant::dequantize_q5_0);
}

#[test]
fn q5_1_matches_gguf_py() {
    check_type("Q5_1", quant::dequantize_q5_1);
}

#[test]
fn q8_0_matches_gguf_py() {
    check_type("Q8_0", quant::dequantize_q8_0);
}

#[test]
fn q2_k_matches_gguf_py() {
    check_type("Q2_K", quant::dequantize_q2_k);
}

#[test]
fn q3_k_matches_gguf_py() {
    check_type("Q3_K", quant::dequantize_q3_k);
}

#[test]
fn q4_k_matches_gguf_py() {
    check_type("Q4_K", quant::dequantize_q4_k);
}

#[test]
fn q5_k_matches_gguf_py() {
    check_type("Q5_K", quant::dequantize_q5_k);
}

#[test]
fn q6_k_matches_gguf_py() {
    check_type("Q6_K", quant::dequantize_q6_k);
}

#[test]
fn q8_k_matches_numpy() {
    check_type("Q8_K", quant::dequantize_q8_k);
}

/// The first rows of a few SmolLM2-135M tensors (Q8_0, Q4_1, F32), as gguf-py decodes them:
/// the decoders on real weights, without needing the model file.
#[test]
fn real_model_rows_match_gguf_py() {
    let sample = fixture_json("smollm2_sample.json");
    for tensor in sample["samples"].as_array().unwrap() {
        let name = tensor["name"].as_str().unwrap();
        let ty = match tensor["ggml_type"].as_str().unwrap() {
            "Q8_0" => GgmlType::Q8_0,
            "Q4_1" => GgmlType::Q4_1,
            "F32" => GgmlType::F32,
            other => panic!("sample type {other} not covered here"),
        };
        let data = hex(tensor["data"].as_str().unwrap());
        let want = f32s(&tensor["values"]);
        let mut got = vec![0f32; want.len()];
        quant::dequantize(ty, &data, &mut got).unwrap();
        assert_same_f32(&got, &want, name);
    }
}

#[test]
#[should_panic(expected = "not a whole number of 20-byte blocks")]
fn per_type_decoder_panics_on_mismatched_buffers() {
    // A programming error (the checked dispatcher returns an error instead, see unit tests).
    quant::dequantize_q4_1(&[0u8; 21], &mut [0f32; 32]);
}
