//! Tokenizers against independent references (see scripts/gen_tokenizer_fixtures.py):
//! transformers (+ llama.cpp when it was installed) for SmolLM2's GGUF tokenizer, the
//! `sentencepiece` library for a small SentencePiece GGUF, and the python `tokenizers` library
//! for tokenizer.json files. Plus streaming decoding and malformed metadata.

mod common;

use std::sync::OnceLock;

use common::{fixture_json, fixture_path, GgufBuilder};
use luminal_io::{GgufFile, IoError, TokenType, Tokenizer, TokenizerKind};
use serde_json::Value;

const SMOLLM2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
);

fn smollm2() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            if !std::path::Path::new(SMOLLM2).exists() {
                return None;
            }
            let gguf = GgufFile::open(SMOLLM2).expect("SmolLM2 GGUF opens");
            Some(Tokenizer::from_gguf(&gguf).expect("SmolLM2 tokenizer builds"))
        })
        .as_ref()
}

fn skip_without_smollm2() -> Option<&'static Tokenizer> {
    let tokenizer = smollm2();
    if tokenizer.is_none() {
        println!("skipped: {SMOLLM2} is absent (see scripts/fetch-models.sh)");
    }
    tokenizer
}

fn spm_gguf() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let gguf = GgufFile::open(fixture_path("tokenizer/spm_tiny.gguf")).expect("fixture");
        Tokenizer::from_gguf(&gguf).expect("SentencePiece tokenizer builds")
    })
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("list of ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

fn text<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key].as_str().expect("string")
}

fn cases(fixture: &Value) -> &[Value] {
    fixture["cases"].as_array().expect("cases")
}

/// Pushes `ids` one at a time; checks that the chunks add up to `decode`, that no chunk holds
/// a replacement character `decode` does not have (no character split), and returns how many
/// pushes returned nothing.
fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool, context: &str) -> usize {
    let want = tok.decode(ids, skip_special).unwrap();
    let mut stream = tok.stream_decoder(skip_special);
    let mut got = String::new();
    let mut held = 0;
    for &id in ids {
        match stream.push(id).unwrap() {
            Some(chunk) => {
                assert!(!chunk.is_empty(), "{context}: empty chunk");
                if !want.contains('\u{FFFD}') {
                    assert!(!chunk.contains('\u{FFFD}'), "{context}: split character");
                }
                got.push_str(&chunk);
            }
            None => held += 1,
        }
    }
    if let Some(rest) = stream.flush().unwrap() {
        got.push_str(&rest);
    }
    assert_eq!(got, want, "{context}: streamed text differs from decode");
    held
}

// ---------------------------------------------------------------------------------------------
// SmolLM2 (byte-level BPE from GGUF, pre-tokenizer "smollm")

#[test]
fn smollm2_gguf_matches_reference_ids() {
    let Some(tok) = skip_without_smollm2() else {
        return;
    };
    let fixture = fixture_json("tokenizer/smollm2.json");
    assert_eq!(tok.kind(), TokenizerKind::GgufBpe);
    assert_eq!(
        tok.vocab_size(),
        fixture["vocab_size"].as_u64().unwrap() as usize
    );
    let mut checked_llama_cpp = 0;
    for case in cases(&fixture) {
        let input = text(case, "text");
        assert_eq!(
            tok.encode(input, true).unwrap(),
            ids(&case["ids"]),
            "encode({input:?}, true)"
        );
        assert_eq!(
            tok.encode(input, false).unwrap(),
            ids(&case["ids_plain"]),
            "encode({input:?}, false)"
        );
        if let Some(reference) = case.get("llama_cpp_ids") {
            assert_eq!(
                tok.encode(input, true).unwrap(),
                ids(reference),
                "llama.cpp {input:?}"
            );
            assert_eq!(
                tok.encode(input, false).unwrap(),
                ids(&case["llama_cpp_ids_plain"]),
                "llama.cpp plain {input:?}"
            );
            checked_llama_cpp += 1;
        }
    }
    println!("checked {checked_llama_cpp} cases against llama.cpp too");
}

#[test]
fn smollm2_gguf_decodes_like_reference() {
    let Some(tok) = skip_without_smollm2() else {
        return;
    };
    let fixture = fixture_json("tokenizer/smollm2.json");
    for case in cases(&fixture) {
        let case_ids = ids(&case["ids"]);
        let input = text(case, "text");
        assert_eq!(
            tok.decode(&case_ids, false).unwrap(),
            text(case, "decoded"),
            "decode {input:?}"
        );
        assert_eq!(
            tok.decode(&case_ids, true).unwrap(),
            text(case, "decoded_skip"),
            "decode skip {input:?}"
        );
        check_stream(tok, &case_ids, false, input);
        check_stream(tok, &case_ids, true, input);
    }
}

#[test]
fn smollm2_special_tokens_and_metadata() {
    let Some(tok) = skip_without_smollm2() else {
        return;
    };
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.eot_id(), Some(2), "<|im_end|>");
    assert_eq!(tok.pad_id(), Some(2));
    assert!(!tok.add_bos(), "tokenizer.ggml.add_bos_token is false");
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.token_type(1), Some(TokenType::Control));
    assert_eq!(tok.token_type(100), Some(TokenType::Normal));
    assert_eq!(tok.id_to_token(49152), None);
    let stops = tok.stop_ids();
    assert_eq!(stops[0], 2);
    assert!(
        stops.contains(&0),
        "<|endoftext|> stops generation: {stops:?}"
    );
    let template = tok.chat_template().expect("SmolLM2 has a chat template");
    assert!(template.contains("<|im_start|>"));
    // Ids past the vocabulary are errors, not panics.
    assert!(matches!(
        tok.decode(&[5, 49152], false),
        Err(IoError::TokenIdOutOfRange {
            id: 49152,
            vocab_size: 49152
        })
    ));
}

#[test]
fn smollm2_stream_holds_back_split_emoji() {
    let Some(tok) = skip_without_smollm2() else {
        return;
    };
    for input in ["emoji 🙂👍🏽🚀", "日本語のテキストです。", "👨‍👩‍👧‍👦 family"]
    {
        let ids = tok.encode(input, false).unwrap();
        let held = check_stream(tok, &ids, false, input);
        assert!(
            held > 0,
            "{input:?}: some token must end inside a character"
        );
        assert_eq!(tok.decode(&ids, false).unwrap(), input);
    }
}

// ---------------------------------------------------------------------------------------------
// SentencePiece (GGUF "llama" and a Llama-2-style tokenizer.json of the same vocabulary)

#[test]
fn spm_gguf_matches_sentencepiece() {
    let tok = spm_gguf();
    let fixture = fixture_json("tokenizer/spm.json");
    assert_eq!(tok.kind(), TokenizerKind::GgufSentencePiece);
    assert_eq!(tok.vocab_size(), 1000);
    for case in cases(&fixture) {
        let input = text(case, "text");
        let case_ids = ids(&case["ids"]);
        assert_eq!(
            tok.encode(input, true).unwrap(),
            case_ids,
            "encode({input:?}, true)"
        );
        assert_eq!(
            tok.encode(input, false).unwrap(),
            ids(&case["ids_plain"]),
            "encode({input:?}, false)"
        );
        if let Some(reference) = case.get("llama_cpp_ids") {
            assert_eq!(case_ids, ids(reference), "llama.cpp {input:?}");
            assert_eq!(
                tok.encode(input, false).unwrap(),
                ids(&case["llama_cpp_ids_plain"]),
                "llama.cpp plain {input:?}"
            );
        }
        // sentencepiece spells <unk> as " ⁇ "; like transformers, decode drops it.
        if !case_ids.contains(&0) {
            assert_eq!(
                tok.decode(&case_ids, true).unwrap(),
                text(case, "decoded_skip"),
                "sentencepiece decode {input:?}"
            );
        }
        // Same vocabulary, so the tokenizer.json decodings apply too.
        let hf_ids = ids(&case["hf_ids"]);
        assert_eq!(
            tok.decode(&hf_ids, false).unwrap(),
            text(case, "hf_decoded"),
            "decode {input:?}"
        );
        assert_eq!(
            tok.decode(&hf_ids, true).unwrap(),
            text(case, "hf_decoded_skip"),
            "decode skip {input:?}"
        );
        check_stream(tok, &case_ids, true, input);
        check_stream(tok, &case_ids, false, input);
    }
}

#[test]
fn spm_gguf_metadata() {
    let tok = spm_gguf();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.unk_id(), Some(0));
    assert!(
        tok.add_bos(),
        "SentencePiece vocabularies add BOS by default"
    );
    assert_eq!(tok.encode("", true).unwrap(), [1]);
    assert_eq!(tok.encode("", false).unwrap(), Vec::<u32>::new());
    assert_eq!(tok.token_type(0), Some(TokenType::Unknown));
    assert_eq!(tok.token_type(3), Some(TokenType::Control));
    assert_eq!(tok.token_type(5), Some(TokenType::UserDefined));
    let newline = tok.token_to_id("<0x0A>").expect("byte token");
    assert_eq!(tok.token_type(newline), Some(TokenType::Byte));
    assert_eq!(tok.decode(&[newline], false).unwrap(), "\n");
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    assert_eq!(tok.stop_ids(), [2, 4], "</s> and <|im_end|>");
    // Characters absent from the vocabulary fall back to bytes and come back whole.
    let ids = tok.encode("日本 🙂", false).unwrap();
    assert!(ids
        .iter()
        .all(|&id| tok.token_type(id) != Some(TokenType::Unknown)));
    assert_eq!(tok.decode(&ids, true).unwrap(), "日本 🙂");
    assert!(check_stream(tok, &ids, true, "byte fallback") > 0);
}

#[test]
fn llama_style_tokenizer_json_matches_tokenizers_library() {
    let tok = Tokenizer::from_file(fixture_path("tokenizer/hf_llama_spm/tokenizer.json")).unwrap();
    let fixture = fixture_json("tokenizer/spm.json");
    assert_eq!(tok.kind(), TokenizerKind::HuggingFace);
    assert!(tok.add_bos(), "the <s> $A template adds BOS");
    assert_eq!(tok.bos_id(), Some(1));
    for case in cases(&fixture) {
        let input = text(case, "text");
        let hf_ids = ids(&case["hf_ids"]);
        assert_eq!(
            tok.encode(input, true).unwrap(),
            hf_ids,
            "encode({input:?}, true)"
        );
        assert_eq!(
            tok.encode(input, false).unwrap(),
            ids(&case["ids_plain"]),
            "encode({input:?}, false)"
        );
        assert_eq!(
            tok.decode(&hf_ids, false).unwrap(),
            text(case, "hf_decoded"),
            "decode {input:?}"
        );
        assert_eq!(
            tok.decode(&hf_ids, true).unwrap(),
            text(case, "hf_decoded_skip"),
            "decode skip {input:?}"
        );
        check_stream(&tok, &hf_ids, true, input);
        check_stream(&tok, &hf_ids, false, input);
    }
}

// ---------------------------------------------------------------------------------------------
// Byte-level tokenizer.json folder with tokenizer_config.json

#[test]
fn hf_dir_matches_tokenizers_library() {
    let tok = Tokenizer::from_hf_dir(fixture_path("tokenizer/hf_bytelevel")).unwrap();
    let fixture = fixture_json("tokenizer/hf_bytelevel.json");
    let bos = fixture["bos_id"].as_u64().unwrap() as u32;
    let eos = fixture["eos_id"].as_u64().unwrap() as u32;
    assert_eq!(tok.bos_id(), Some(bos));
    assert_eq!(tok.eos_id(), Some(eos));
    assert!(tok.add_bos(), "tokenizer_config.json sets add_bos_token");
    assert!(!tok.add_eos());
    assert_eq!(tok.chat_template(), fixture["chat_template"].as_str());
    assert_eq!(
        tok.vocab_size(),
        fixture["vocab_size"].as_u64().unwrap() as usize
    );
    assert_eq!(tok.eot_id(), Some(eos), "<|im_end|>");
    let stops = tok.stop_ids();
    assert_eq!(stops[0], eos);
    assert!(
        stops.contains(&0),
        "generation_config.json lists <|endoftext|>: {stops:?}"
    );
    for case in cases(&fixture) {
        let input = text(case, "text");
        let case_ids = ids(&case["ids"]);
        let mut with_bos = vec![bos];
        with_bos.extend_from_slice(&case_ids);
        assert_eq!(
            tok.encode(input, true).unwrap(),
            with_bos,
            "encode({input:?}, true)"
        );
        assert_eq!(
            tok.encode(input, false).unwrap(),
            ids(&case["ids_plain"]),
            "encode({input:?}, false)"
        );
        assert_eq!(tok.decode(&case_ids, false).unwrap(), text(case, "decoded"));
        assert_eq!(
            tok.decode(&case_ids, true).unwrap(),
            text(case, "decoded_skip")
        );
        check_stream(&tok, &case_ids, false, input);
        check_stream(&tok, &with_bos, true, input);
    }

    // The bare file has no config: no BOS, special tokens found by name.
    let bare = Tokenizer::from_file(fixture_path("tokenizer/hf_bytelevel/tokenizer.json")).unwrap();
    assert!(!bare.add_bos());
    assert_eq!(bare.chat_template(), None);
    for case in cases(&fixture) {
        let input = text(case, "text");
        assert_eq!(
            bare.encode(input, true).unwrap(),
            ids(&case["ids"]),
            "{input:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-built GGUF vocabularies and malformed metadata

const ARRAY: u32 = 9;
const STRING: u32 = 8;
const I32: u32 = 5;
const U32: u32 = 4;
const F32: u32 = 6;
const BOOL: u32 = 7;

fn string_array(items: &[&str]) -> Vec<u8> {
    let mut out = STRING.to_le_bytes().to_vec();
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for item in items {
        out.extend_from_slice(&common::gguf_string(item.as_bytes()));
    }
    out
}

fn number_array<const N: usize>(type_id: u32, items: &[[u8; N]]) -> Vec<u8> {
    let mut out = type_id.to_le_bytes().to_vec();
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

fn i32_array(items: &[i32]) -> Vec<u8> {
    number_array(
        I32,
        &items.iter().map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )
}

fn f32_array(items: &[f32]) -> Vec<u8> {
    number_array(
        F32,
        &items.iter().map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )
}

/// The 256 single-character tokens of the byte-level alphabet, in byte order.
fn byte_alphabet() -> Vec<String> {
    let mut chars = Vec::new();
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let self_spelled = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if self_spelled {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        chars.push(char::from_u32(c).unwrap().to_string());
    }
    chars
}

/// A byte-level BPE vocabulary: <|endoftext|> (control), the alphabet, "he", "ll", "hell",
/// "hello", "Ġw", and a user-defined "<think>".
fn gpt2_builder(merges: &[&str]) -> GgufBuilder {
    let mut tokens = vec!["<|endoftext|>".to_string()];
    tokens.extend(byte_alphabet());
    for t in ["he", "ll", "hell", "hello", "Ġw", "<think>"] {
        tokens.push(t.to_string());
    }
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    *types.last_mut().unwrap() = 4;
    GgufBuilder::default()
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv_str("tokenizer.ggml.pre", "gpt-2")
        .kv_raw(b"tokenizer.ggml.tokens", ARRAY, &string_array(&refs))
        .kv_raw(b"tokenizer.ggml.token_type", ARRAY, &i32_array(&types))
        .kv_raw(b"tokenizer.ggml.merges", ARRAY, &string_array(merges))
        .kv_u32("tokenizer.ggml.eos_token_id", 0)
}

const GOOD_MERGES: &[&str] = &["h e", "l l", "he ll", "hell o", "Ġ w"];

fn build(builder: &GgufBuilder) -> luminal_io::Result<Tokenizer> {
    let gguf = GgufFile::from_bytes(builder.build()).expect("valid GGUF container");
    Tokenizer::from_gguf(&gguf)
}

#[test]
fn handmade_gpt2_vocabulary() {
    let tok = build(&gpt2_builder(GOOD_MERGES)).unwrap();
    let hello = tok.token_to_id("hello").unwrap();
    let gw = tok.token_to_id("Ġw").unwrap();
    let think = tok.token_to_id("<think>").unwrap();
    let o = tok.token_to_id("o").unwrap();
    let r = tok.token_to_id("r").unwrap();
    // "hello world": "hello" merges whole; " world" → Ġw o r l d.
    let ids = tok.encode("hello world<think><|endoftext|>", true).unwrap();
    let l = tok.token_to_id("l").unwrap();
    let d = tok.token_to_id("d").unwrap();
    assert_eq!(ids, [hello, gw, o, r, l, d, think, 0]);
    // Without special parsing <|endoftext|> is text, the user-defined <think> still a token.
    let plain = tok.encode("<think><|endoftext|>", false).unwrap();
    assert_eq!(plain[0], think);
    assert!(!plain.contains(&0));
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "hello world<think><|endoftext|>"
    );
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello world<think>");
    assert!(!tok.add_bos(), "gpt2 vocabularies add no BOS by default");
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eot_id(), Some(0), "<|endoftext|> found by name");
    assert_eq!(tok.stop_ids(), [0]);
}

#[test]
fn add_bos_and_out_of_range_ids_from_metadata() {
    let tok = build(
        &gpt2_builder(GOOD_MERGES)
            .kv_u32("tokenizer.ggml.bos_token_id", 0)
            .kv_raw(b"tokenizer.ggml.add_bos_token", BOOL, &[1])
            .kv_u32("tokenizer.ggml.padding_token_id", 1_000_000),
    )
    .unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("he", true).unwrap()[0], 0);
    assert_eq!(
        tok.pad_id(),
        None,
        "out-of-range ids are ignored like llama.cpp does"
    );
}

fn root_of(result: luminal_io::Result<Tokenizer>) -> IoError {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(IoError::File { source, .. }) => *source,
        Err(e) => e,
    }
}

#[test]
fn malformed_metadata_gives_typed_errors() {
    let tokens = string_array(&["a", "b", "ab"]);

    // No tokenizer at all.
    let e = root_of(build(&GgufBuilder::default()));
    assert!(
        matches!(&e, IoError::MissingKey { key } if key == "tokenizer.ggml.model"),
        "{e}"
    );

    // Unknown model.
    let e = root_of(build(
        &GgufBuilder::default().kv_str("tokenizer.ggml.model", "bert"),
    ));
    assert!(
        matches!(&e, IoError::UnsupportedTokenizer { model } if model == "bert"),
        "{e}"
    );

    // Model of the wrong type.
    let e = root_of(build(
        &GgufBuilder::default().kv_u32("tokenizer.ggml.model", 3),
    ));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");

    // Missing tokens.
    let e = root_of(build(
        &GgufBuilder::default().kv_str("tokenizer.ggml.model", "llama"),
    ));
    assert!(
        matches!(&e, IoError::MissingKey { key } if key == "tokenizer.ggml.tokens"),
        "{e}"
    );

    // Tokens of the wrong type.
    let e = root_of(build(
        &GgufBuilder::default()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_raw(b"tokenizer.ggml.tokens", ARRAY, &i32_array(&[1, 2, 3])),
    ));
    assert!(
        matches!(&e, IoError::WrongMetadataType { key, .. } if key == "tokenizer.ggml.tokens"),
        "{e}"
    );
    let e = root_of(build(
        &GgufBuilder::default()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_str("tokenizer.ggml.tokens", "abc"),
    ));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");

    // Empty vocabulary.
    let e = root_of(build(
        &GgufBuilder::default()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_raw(b"tokenizer.ggml.tokens", ARRAY, &string_array(&[])),
    ));
    assert!(matches!(&e, IoError::BadTokenizerMetadata { .. }), "{e}");

    let spm = || {
        GgufBuilder::default()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_raw(b"tokenizer.ggml.tokens", ARRAY, &tokens)
    };
    // Scores and types of the wrong length or type.
    let e = root_of(build(&spm().kv_raw(
        b"tokenizer.ggml.scores",
        ARRAY,
        &f32_array(&[0.0, 1.0]),
    )));
    assert!(
        matches!(&e, IoError::BadTokenizerMetadata { key, .. } if key == "tokenizer.ggml.scores"),
        "{e}"
    );
    let e = root_of(build(&spm().kv_raw(
        b"tokenizer.ggml.scores",
        ARRAY,
        &string_array(&["x", "y", "z"]),
    )));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");
    let e = root_of(build(&spm().kv_raw(
        b"tokenizer.ggml.token_type",
        ARRAY,
        &i32_array(&[1]),
    )));
    assert!(
        matches!(&e, IoError::BadTokenizerMetadata { key, .. } if key == "tokenizer.ggml.token_type"),
        "{e}"
    );
    let e = root_of(build(&spm().kv_raw(
        b"tokenizer.ggml.token_type",
        ARRAY,
        &f32_array(&[1.0, 1.0, 1.0]),
    )));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");
    let e = root_of(build(&spm().kv_u32("tokenizer.ggml.add_bos_token", 1)));
    assert!(
        matches!(&e, IoError::WrongMetadataType { key, .. } if key == "tokenizer.ggml.add_bos_token"),
        "{e}"
    );
    let e = root_of(build(&spm().kv_u32("tokenizer.chat_template", 1)));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");
    let e = root_of(build(&spm().kv_str("tokenizer.ggml.bos_token_id", "one")));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");
    // A minimal valid SentencePiece vocabulary (no scores, no types) builds.
    let tok = build(&spm()).unwrap();
    assert_eq!(
        tok.encode("ab", false).unwrap().len(),
        2,
        "no ▁ token: 'a' 'b'"
    );

    // gpt2: merges missing, malformed, or naming unknown tokens.
    let gpt2 = || {
        GgufBuilder::default()
            .kv_str("tokenizer.ggml.model", "gpt2")
            .kv_raw(b"tokenizer.ggml.tokens", ARRAY, &tokens)
    };
    let e = root_of(build(&gpt2()));
    assert!(
        matches!(&e, IoError::MissingKey { key } if key == "tokenizer.ggml.merges"),
        "{e}"
    );
    for bad in [&["a b", "ab"][..], &["a c"], &["a b c"], &["b b"]] {
        let e = root_of(build(&gpt2().kv_raw(
            b"tokenizer.ggml.merges",
            ARRAY,
            &string_array(bad),
        )));
        assert!(
            matches!(&e, IoError::BadTokenizerMetadata { key, .. } if key == "tokenizer.ggml.merges"),
            "{bad:?}: {e}"
        );
    }
    let e = root_of(build(&gpt2().kv_raw(
        b"tokenizer.ggml.merges",
        ARRAY,
        &i32_array(&[1]),
    )));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");
    let e = root_of(build(&gpt2().kv_u32("tokenizer.ggml.pre", 7).kv_raw(
        b"tokenizer.ggml.merges",
        ARRAY,
        &string_array(&["a b"]),
    )));
    assert!(matches!(&e, IoError::WrongMetadataType { .. }), "{e}");
    // And a u32 token-type array is accepted like i32.
    let types = number_array(
        U32,
        &[1u32.to_le_bytes(), 1u32.to_le_bytes(), 3u32.to_le_bytes()],
    );
    let tok = build(
        &gpt2()
            .kv_raw(b"tokenizer.ggml.merges", ARRAY, &string_array(&["a b"]))
            .kv_raw(b"tokenizer.ggml.token_type", ARRAY, &types),
    )
    .unwrap();
    assert_eq!(tok.token_type(2), Some(TokenType::Control));
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = spm_gguf();
    assert!(matches!(
        tok.decode(&[1, 1000], true),
        Err(IoError::TokenIdOutOfRange { id: 1000, .. })
    ));
    let mut stream = tok.stream_decoder(false);
    assert!(stream.push(u32::MAX).is_err());
    assert_eq!(stream.push(1).unwrap().as_deref(), Some("<s>"));
    assert_eq!(tok.id_to_token(1000), None);
    assert_eq!(tok.token_type(1000), None);
}

#[test]
fn bad_files_give_typed_errors() {
    let dir = std::env::temp_dir().join(format!("luminal_io_tokenizer_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let missing = dir.join("missing.json");
    let e = Tokenizer::from_file(&missing).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e}");
    let e = Tokenizer::from_hf_dir(dir.join("nothing-here")).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e}");

    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, b"{\"model\": 17}").unwrap();
    let e = Tokenizer::from_file(&garbage).unwrap_err();
    assert!(matches!(e.root(), IoError::Tokenizer(_)), "{e}");

    // A folder whose tokenizer_config.json has a bos_token of the wrong type.
    let folder = dir.join("bad_config");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(
        fixture_path("tokenizer/hf_bytelevel/tokenizer.json"),
        folder.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(folder.join("tokenizer_config.json"), b"{\"bos_token\": 5}").unwrap();
    let e = Tokenizer::from_hf_dir(&folder).unwrap_err();
    assert!(matches!(e.root(), IoError::Tokenizer(_)), "{e}");
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
    std::fs::write(folder.join("tokenizer_config.json"), b"not json").unwrap();
    let e = Tokenizer::from_hf_dir(&folder).unwrap_err();
    assert!(matches!(e.root(), IoError::Tokenizer(_)), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
