#!/usr/bin/env python3
"""Whisper tiny.en speed: `luminal transcribe` against faster-whisper (CTranslate2) and
transformers on CPU, same 16 kHz clip, same threads, greedy without timestamps, float32.

    apt-get install espeak-ng; pip install faster-whisper transformers torch
    cargo build --release -p luminal_cli && ./scripts/fetch-models.sh whisper-tiny-en
    python3 scripts/bench_whisper.py [--threads 2] [--reps 3] [--rounds 2]

The clip is the first ~450 characters of crates/luminal_model_tests/tests/fixtures/ppl.txt
spoken by espeak-ng (one 30-second window, so every implementation decodes the same single
window), resampled to 16 kHz. Times exclude model loading; each side keeps its best of
`reps`; rounds alternate the three. Real-time factor = time / audio duration (lower is faster).
"""
import argparse
import os
import re
import subprocess
import tempfile
import time
import wave

import numpy as np
import torch
from faster_whisper import WhisperModel, decode_audio
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=3)
p.add_argument("--rounds", type=int, default=2)
a = p.parse_args()
torch.set_num_threads(a.threads)

text = open(os.path.join(ROOT, "crates/luminal_model_tests/tests/fixtures/ppl.txt")).read()[:450]
text = text[: text.rfind(".") + 1]
tmp = tempfile.mkdtemp()
raw, clip = os.path.join(tmp, "raw.wav"), os.path.join(tmp, "clip16k.wav")
subprocess.run(["espeak-ng", "-v", "en-us", "-s", "170", "-w", raw, text], check=True)
audio = decode_audio(raw, sampling_rate=16000)
pcm = np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2")
with wave.open(clip, "wb") as w:
    w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm.tobytes())
samples = pcm.astype(np.float32) / 32768
duration = len(samples) / 16000
assert duration <= 30, duration

hf_dir = os.path.join(ROOT, "models", "whisper-tiny.en")
ct2_dir = os.path.join(ROOT, "models", "whisper-tiny.en.ct2")
fw = WhisperModel(ct2_dir, device="cpu", compute_type="float32", cpu_threads=a.threads)
hf = WhisperForConditionalGeneration.from_pretrained(hf_dir).float().eval()
fe = WhisperFeatureExtractor(feature_size=80)


def best(f):
    f()
    times = []
    for _ in range(a.reps):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return min(times), out


def run_fw():
    segs, _ = fw.transcribe(samples, language="en", beam_size=1, best_of=1, temperature=0.0,
                            without_timestamps=True, condition_on_previous_text=False, vad_filter=False)
    return "".join(s.text for s in segs).strip()


def run_hf():
    with torch.inference_mode():
        feats = fe(samples, sampling_rate=16000, return_tensors="pt").input_features
        ids = hf.generate(feats, num_beams=1, do_sample=False, return_timestamps=False, max_new_tokens=224)
    return ids.shape[1]


def run_ours():
    exe = os.path.join(ROOT, "target", "release", "luminal")
    times = []
    for _ in range(a.reps):
        err = subprocess.run([exe, "transcribe", "--model", hf_dir, clip, "-t", str(a.threads), "--timings"],
                             check=True, capture_output=True, text=True).stderr
        times.append(float(re.search(r"transcription ([0-9.]+) s", err).group(1)))
    return min(times)


print(f"audio {duration:.2f} s, {a.threads} threads, best of {a.reps}, torch {torch.__version__}")
print("| round | luminal RTF | faster-whisper RTF | transformers RTF | vs faster-whisper | vs transformers |")
print("|---|---|---|---|---|---|")
for r in range(a.rounds):
    ours = run_ours()
    t_fw, _ = best(run_fw)
    t_hf, _ = best(run_hf)
    print(f"| {r + 1} | {ours / duration:.4f} | {t_fw / duration:.4f} | {t_hf / duration:.4f} | "
          f"{t_fw / ours:.2f}x | {t_hf / ours:.2f}x |")
