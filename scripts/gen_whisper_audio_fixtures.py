#!/usr/bin/env python3
"""Reference log-mel features for the Whisper front-end (crates/luminal_model_tests/tests/whisper_audio.rs).

    pip install numpy transformers
    python3 scripts/gen_whisper_audio_fixtures.py

Writes crates/luminal_model_tests/tests/fixtures/audio/:
- tones.wav: 2.0 s, 16 kHz, mono, 16-bit PCM: a chirp, two tones and a little noise, then
  silence (deterministic);
- tones_stereo_22k.wav: 1.0 s of a 440 Hz sine at 22.05 kHz, stereo (left 0.5, right 0.25
  amplitude), for the reader's channel mixing and the resampler;
- tones.features.json: transformers' WhisperFeatureExtractor (80 mel bins, the numpy path
  `_np_extract_fbank_features` on the WAV's samples / 32768 padded to 30 s) — 13 frames in
  full, the sum of every frame and of every mel bin, the global max — and the same for 128
  mel bins (large-v3's front-end).
"""
import json
import os
import wave

import numpy as np
from transformers import WhisperFeatureExtractor

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "luminal_model_tests", "tests",
                   "fixtures", "audio")
rng = np.random.default_rng(1500)


def write_wav(path, rate, channels):
    data = np.stack(channels, axis=1) if len(channels) > 1 else channels[0][:, None]
    pcm = np.clip(np.round(data * 32767), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(data.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return pcm


sr = 16000
t = np.arange(int(2.0 * sr)) / sr
sig = 0.3 * np.sin(2 * np.pi * (200 * t + 900 * t * t))  # chirp 200 -> 3800 Hz
sig += 0.2 * np.sin(2 * np.pi * 1000 * t) * (t < 1.2)
sig += 0.1 * np.sin(2 * np.pi * 5200 * t) * (t > 0.6)
sig += 0.01 * rng.standard_normal(len(t))
sig[t > 1.6] = 0.0
pcm = write_wav(os.path.join(OUT, "tones.wav"), sr, [sig])
samples = pcm[:, 0].astype(np.float64) / 32768.0

t22 = np.arange(22050) / 22050
sine = np.sin(2 * np.pi * 440 * t22)
write_wav(os.path.join(OUT, "tones_stereo_22k.wav"), 22050, [0.5 * sine, 0.25 * sine])


def features(n_mels):
    fe = WhisperFeatureExtractor(feature_size=n_mels)
    padded = np.zeros(fe.n_samples)
    padded[: len(samples)] = samples
    f = fe._np_extract_fbank_features(padded[None, :], "cpu")[0]  # [n_mels, 3000]
    frames = [0, 1, 2, 37, 50, 99, 100, 130, 150, 160, 161, 200, 2999]
    r = lambda xs: [float(f"{v:.9g}") for v in xs]
    return {
        "n_mels": n_mels,
        "shape": list(f.shape),
        "frames": frames,
        "frame_values": [r(f[:, i]) for i in frames],
        "frame_sums": r(f.sum(axis=0)),
        "mel_sums": r(f.sum(axis=1)),
        "max": float(f.max()),
    }


ref = {"samples": len(samples), "sample_rate": sr, "mel80": features(80), "mel128": features(128)}
with open(os.path.join(OUT, "tones.features.json"), "w") as fh:
    json.dump(ref, fh, separators=(",", ":"))
print("wrote tones.wav, tones_stereo_22k.wav, tones.features.json")
