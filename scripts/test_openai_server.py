#!/usr/bin/env python3
"""`luminal serve` against the official `openai` Python client.

Starts the server on a free port with the real SmolLM2 model, then drives it with the
`openai` package the way an application would: list models, chat and text completions
(plain and streamed), logprobs, stop strings, seeds, usage counts, four clients at once,
and the client's typed errors for bad requests. Greedy answers are checked against
`luminal generate` run on its own (the single-client reference).

Usage (from the repository root, after `cargo build --release -p luminal_cli`):

    python3 -m venv target/openai-venv && target/openai-venv/bin/pip install openai
    target/openai-venv/bin/python scripts/test_openai_server.py

Exits 0 with a "skipping" message when the model file is absent.
"""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import threading

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_server(binary, model):
    proc = subprocess.Popen(
        [binary, "serve", "--model", model, "--port", "0", "--threads", "2"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    for line in proc.stderr:
        m = re.search(r"http://([0-9.]+):(\d+)", line)
        if m:
            # Keep draining stderr so that the server never blocks on it.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(2))
    raise RuntimeError("the server exited before printing its address")


def cli_greedy(binary, model, prompt, n):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--no-echo", "--threads", "2",
         "-n", str(n), "--prompt", prompt],
        check=True, capture_output=True, text=True,
    ).stdout
    assert out.endswith("\n")
    return out[:-1]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what.split(':')[0]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/luminal"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"skipping: {args.model} is absent (run scripts/fetch-models.sh)")
        return 0
    if not os.path.exists(args.bin):
        print(f"error: {args.bin} is absent (cargo build --release -p luminal_cli)", file=sys.stderr)
        return 1

    proc, port = start_server(args.bin, args.model)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        models = client.models.list().data
        check(len(models) == 1, f"models.list: {models}")
        name = models[0].id

        # Chat: plain and streamed give the same greedy answer and consistent usage.
        messages = [{"role": "system", "content": "You answer in one short sentence."},
                    {"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=32,
                                           temperature=0)
        answer = r.choices[0].message.content
        check(r.object == "chat.completion" and len(answer) > 0, f"chat completion: {r}")
        check(r.choices[0].finish_reason in ("stop", "length"), f"finish reason: {r}")
        u = r.usage
        check(u.prompt_tokens > 10 and 0 < u.completion_tokens <= 32
              and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage: {u}")
        stream = client.chat.completions.create(model=name, messages=messages, max_tokens=32,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        pieces, finish, usage = [], None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
                finish = c.finish_reason or finish
        check("".join(pieces) == answer, f"streamed chat equals plain: {pieces!r} vs {answer!r}")
        check(finish == r.choices[0].finish_reason and usage.completion_tokens == u.completion_tokens,
              f"streamed finish reason and usage: {finish} {usage}")

        # The next turn of the conversation (the server reuses its cached tokens).
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "And of Italy?"}]
        r2 = client.chat.completions.create(model=name, messages=messages, max_tokens=32,
                                            temperature=0)
        check(len(r2.choices[0].message.content) > 0 and r2.usage.prompt_tokens > u.total_tokens,
              f"second turn: {r2}")

        # Text completion: equal to `luminal generate` on its own; logprobs line up.
        prompt = "The three primary colors are"
        want = cli_greedy(args.bin, args.model, prompt, 12)
        c = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0,
                                      logprobs=3)
        check(c.choices[0].text == want, f"completion equals luminal generate: {c.choices[0].text!r} vs {want!r}")
        lp = c.choices[0].logprobs
        check(len(lp.token_logprobs) == c.usage.completion_tokens
              and all(x <= 0 for x in lp.token_logprobs)
              and all(len(t) == 3 for t in lp.top_logprobs)
              # Greedy: each token is its step's most likely one.
              and all(abs(max(t.values()) - x) < 1e-6 for t, x in zip(lp.top_logprobs, lp.token_logprobs)),
              f"completion logprobs: {lp}")

        # A stop string ends the text before it.
        s = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0,
                                      stop=[","])
        check(s.choices[0].finish_reason == "stop" and s.choices[0].text == want.split(",")[0]
              if "," in want else s.choices[0].text == want, f"stop string: {s}")

        # A seed makes sampling repeatable; another seed (almost surely) differs.
        def sampled(seed):
            return client.completions.create(model=name, prompt="Once upon a time", max_tokens=24,
                                             temperature=1.0, top_p=0.95, seed=seed).choices[0].text
        a, b = sampled(123), sampled(123)
        check(a == b, f"seeded sampling repeats: {a!r} vs {b!r}")

        # Four clients at once: each gets its own answer, as when alone.
        prompts = ["Water boils at", "The largest planet is", "Bees make", "A triangle has"]
        alone = [cli_greedy(args.bin, args.model, p, 10) for p in prompts]

        def ask(p):
            out = client.completions.create(model=name, prompt=p, max_tokens=10, temperature=0,
                                            stream=True)
            return "".join(ch.choices[0].text for ch in out if ch.choices)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, prompts))
        check(together == alone, f"four concurrent clients: {together} vs {alone}")

        # Errors arrive as the client's typed exceptions.
        try:
            client.chat.completions.create(model="no-such-model", messages=messages)
            check(False, "unknown model: no error")
        except openai.NotFoundError as e:
            check(e.status_code == 404 and "no-such-model" in str(e), f"unknown model: {e}")
        try:
            client.chat.completions.create(model=name, messages=[], max_tokens=4)
            check(False, "empty messages: no error")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and "messages" in str(e), f"empty messages: {e}")
        try:
            client.completions.create(model=name, prompt="x", temperature=7)
            check(False, "temperature out of range: no error")
        except openai.BadRequestError as e:
            check("temperature" in str(e), f"temperature out of range: {e}")
        check(proc.poll() is None, "server still running after the errors")
    finally:
        proc.terminate()
        proc.wait()
    print("all openai-client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
