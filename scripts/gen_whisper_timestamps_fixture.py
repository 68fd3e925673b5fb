#!/usr/bin/env python3
"""transformers' Whisper tiny.en greedy transcripts *with timestamps*, for
crates/luminal_model_tests/tests/whisper_tiny_en.rs.

    pip install torch transformers numpy
    ./scripts/fetch-models.sh whisper-tiny-en          # the converted HF folder
    python3 scripts/gen_whisper_timestamps_fixture.py [models/whisper-tiny.en]

For each clip of fixtures/audio/speech_*.wav (16-bit, 16 kHz; made by
scripts/gen_whisper_tiny_en_fixtures.py), and for the three in a row each followed by one
second of zeros ("wavs" + "gap_samples"): WhisperFeatureExtractor's log-mel features (the
samples padded with silence to 30 s), then `WhisperForConditionalGeneration.generate(...,
return_timestamps=True, num_beams=1)`, float32, with the generation config's timestamp fields
set the way OpenAI's tiny.en config has them (`no_timestamps_token_id` = the id of
<|notimestamps|> (50362), timestamps from the next id on, `max_initial_timestamp_index` 50:
the first timestamp is at most 1.00 s). The converted folder's generation_config.json lacks
those fields (CTranslate2 does not keep them). Writes the generated ids (prompt excluded,
final <|endoftext|> excluded) and the segments (start, end, text) to
fixtures/whisper_tiny_en.timestamps.json. Nothing here runs luminal.
"""
import json
import os
import sys
import wave

import numpy as np
import torch
import transformers
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizerFast

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "crates", "luminal_model_tests", "tests", "fixtures")
model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "whisper-tiny.en")

model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
fe = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
tok = WhisperTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))
gc = model.generation_config
NO_TS = 50362
gc.no_timestamps_token_id = NO_TS
gc.max_initial_timestamp_index = 50
gc.is_multilingual = False
TS_BEGIN = NO_TS + 1
EOT = 50256

def read(name):
    with wave.open(os.path.join(FIX, "audio", f"{name}.wav")) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2 and w.getnchannels() == 1
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


GAP = 16000  # one second of silence between the clips of the "all" case
CLIPS = ("speech_fox", "speech_weather", "speech_numbers")
cases = []
for name in CLIPS + ("all",):
    if name == "all":
        # The three clips in order, each followed by GAP zero samples: several segments.
        samples = np.concatenate([np.concatenate([read(c), np.zeros(GAP, np.float32)]) for c in CLIPS])
    else:
        samples = read(name)
    feats = fe(samples, sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        out = model.generate(feats, return_timestamps=True, num_beams=1, max_new_tokens=224)
    seq = out.tolist()[0] if hasattr(out, "tolist") else out["sequences"].tolist()[0]
    # Drop the prompt (<|startoftranscript|>; transformers 5 already leaves it out) and the
    # final <|endoftext|>.
    if seq and seq[0] == 50257:
        seq = seq[1:]
    ids = [t for t in seq if t != EOT]
    segments, start, text_ids = [], None, []
    for t in ids:
        if t >= TS_BEGIN:
            time = round((t - TS_BEGIN) * 0.02, 2)
            if start is None:
                start = time
            else:
                segments.append({"start": start, "end": time, "text": tok.decode(text_ids).strip()})
                start, text_ids = None, []
        else:
            text_ids.append(t)
    print(name, segments)
    wavs = [f"audio/{c}.wav" for c in (CLIPS if name == "all" else (name,))]
    cases.append({"wavs": wavs, "gap_samples": GAP if name == "all" else 0, "ids": ids, "segments": segments})

with open(os.path.join(FIX, "whisper_tiny_en.timestamps.json"), "w") as f:
    json.dump(
        {
            "generator": "scripts/gen_whisper_timestamps_fixture.py",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "no_timestamps_token_id": NO_TS,
            "max_initial_timestamp_index": 50,
            "cases": cases,
        },
        f,
        indent=1,
    )
