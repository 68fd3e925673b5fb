//! Whisper's audio front-end: the WAV reader (`luminal_io::read_wav`) on good and malformed
//! files, the resampler against the analytic signal, and the log-mel features against
//! transformers' `WhisperFeatureExtractor` (`scripts/gen_whisper_audio_fixtures.py`).

mod common;

use common::{fixture, json};
use luminal_io::{read_wav, wav_from_bytes, IoError};
use luminal_models::whisper::audio::{resample, LogMel, N_FRAMES};
use serde_json::Value;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn log_mel_matches_transformers() {
    let audio = read_wav(fixture("audio/tones.wav")).unwrap();
    let r = json(fixture("audio/tones.features.json"));
    assert_eq!(audio.sample_rate, 16_000);
    assert_eq!(audio.channels, 1);
    assert_eq!(audio.samples.len() as u64, r["samples"].as_u64().unwrap());
    for key in ["mel80", "mel128"] {
        let want = &r[key];
        let n_mels = want["n_mels"].as_u64().unwrap() as usize;
        let mel = LogMel::new(n_mels);
        let windows = mel.features(&audio.samples);
        assert_eq!(windows.len(), 1);
        let f = &windows[0];
        assert_eq!(f.len(), n_mels * N_FRAMES);
        let at = |m: usize, t: usize| f[m * N_FRAMES + t];
        let mut worst = 0f32;
        for (i, frame) in want["frames"].as_array().unwrap().iter().enumerate() {
            let t = frame.as_u64().unwrap() as usize;
            for (m, w) in floats(&want["frame_values"][i]).iter().enumerate() {
                let g = at(m, t);
                worst = worst.max((g - w).abs());
                assert!((g - w).abs() <= 1e-4, "{key} mel {m} frame {t}: {g} vs {w}");
            }
        }
        for (t, w) in floats(&want["frame_sums"]).iter().enumerate() {
            let s: f32 = (0..n_mels).map(|m| at(m, t)).sum();
            assert!(
                (s - w).abs() <= 1e-4 * n_mels as f32,
                "{key} frame {t} sum: {s} vs {w}"
            );
        }
        for (m, w) in floats(&want["mel_sums"]).iter().enumerate() {
            let s: f64 = (0..N_FRAMES).map(|t| at(m, t) as f64).sum();
            assert!(
                (s as f32 - w).abs() <= 1e-4 * N_FRAMES as f32,
                "{key} mel {m} sum: {s} vs {w}"
            );
        }
        let max = f.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert!((max - want["max"].as_f64().unwrap() as f32).abs() <= 1e-5);
        println!("{key}: max |error| over the full frames {worst:.2e}");
    }
}

/// Two channels are averaged; 22.05 kHz is resampled to 16 kHz: a 440 Hz sine of the mean
/// amplitude, in phase (no delay).
#[test]
fn stereo_22k_wav_resampled_to_16k() {
    let audio = read_wav(fixture("audio/tones_stereo_22k.wav")).unwrap();
    assert_eq!((audio.sample_rate, audio.channels), (22_050, 2));
    assert_eq!(audio.samples.len(), 22_050);
    let out = resample(&audio.samples, audio.sample_rate, 16_000);
    assert_eq!(out.len(), 16_000);
    let mut worst = 0f32;
    for (n, &y) in out.iter().enumerate().skip(100).take(16_000 - 200) {
        let want = 0.375 * (2.0 * std::f64::consts::PI * 440.0 * n as f64 / 16_000.0).sin();
        worst = worst.max((y - want as f32).abs());
    }
    println!("resampled sine: max |error| {worst:.2e}");
    assert!(worst < 2e-4, "max |error| {worst}");
    // A tone above the new Nyquist frequency (10 kHz at 22.05 kHz) is removed.
    let high: Vec<f32> = (0..22_050)
        .map(|n| (2.0 * std::f64::consts::PI * 10_000.0 * n as f64 / 22_050.0).sin() as f32)
        .collect();
    let out = resample(&high, 22_050, 16_000);
    let rms = (out[200..15_800].iter().map(|x| x * x).sum::<f32>() / 15_600.0).sqrt();
    assert!(rms < 1e-3, "aliased energy {rms}");
}

/// A copy of tones.wav with `edit` applied to its bytes (44-byte canonical header).
fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = std::fs::read(fixture("audio/tones.wav")).unwrap();
    assert_eq!(&bytes[36..40], b"data");
    edit(&mut bytes);
    bytes
}

#[test]
fn malformed_wavs_are_typed_errors() {
    // Cut inside the data chunk.
    let cut = edited(|b| b.truncate(44 + 1000));
    let err = wav_from_bytes(&cut).unwrap_err();
    assert!(
        matches!(
            err,
            IoError::TruncatedWav {
                expected: 32000,
                got: 500
            }
        ),
        "{err:?}"
    );
    // 32-bit float samples.
    let float = edited(|b| {
        b[20..22].copy_from_slice(&3u16.to_le_bytes());
        b[34..36].copy_from_slice(&32u16.to_le_bytes());
        b[32..34].copy_from_slice(&4u16.to_le_bytes());
        b[28..32].copy_from_slice(&64000u32.to_le_bytes());
    });
    let err = wav_from_bytes(&float).unwrap_err();
    assert!(matches!(err, IoError::UnsupportedWav { .. }), "{err:?}");
    // 8-bit integer samples.
    let eight = edited(|b| {
        b[34..36].copy_from_slice(&8u16.to_le_bytes());
        b[32..34].copy_from_slice(&1u16.to_le_bytes());
        b[28..32].copy_from_slice(&16000u32.to_le_bytes());
    });
    let err = wav_from_bytes(&eight).unwrap_err();
    assert!(matches!(err, IoError::UnsupportedWav { .. }), "{err:?}");
    assert!(err.to_string().contains("8-bit"), "{err}");
    // No samples.
    let empty = edited(|b| {
        b.truncate(44);
        b[40..44].copy_from_slice(&0u32.to_le_bytes());
        b[4..8].copy_from_slice(&36u32.to_le_bytes());
    });
    assert!(matches!(wav_from_bytes(&empty), Err(IoError::EmptyWav)));
    // Not a WAV file at all, and an empty file.
    for junk in [b"ID3\x03 this is an mp3".to_vec(), Vec::new()] {
        let err = wav_from_bytes(&junk).unwrap_err();
        assert!(matches!(err, IoError::MalformedWav { .. }), "{err:?}");
    }
    // A missing file names its path.
    match read_wav(fixture("audio/missing.wav")) {
        Err(IoError::NotFound { path }) => assert!(path.ends_with("missing.wav")),
        other => panic!("{other:?}"),
    }
}
