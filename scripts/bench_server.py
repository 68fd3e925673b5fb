#!/usr/bin/env python3
"""Throughput and time to first token of `luminal serve` with 1 and N concurrent streaming
clients (standard library only).

Starts the server on a free port, warms it up, then for each client count sends
`--requests` streamed `/v1/completions` requests per client (greedy, `--max-tokens`
tokens, `ignore`-free: a prompt that ends early is counted by its usage), every prompt
distinct so that no request reuses another's cached tokens. Prints a Markdown table:
aggregate generated tokens/s over the wall time, and the mean and worst time to first
token (queueing included: requests run one at a time).

    cargo build --release -p luminal_cli
    python3 scripts/bench_server.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import http.client
import json
import os
import re
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBJECTS = ["rivers", "volcanoes", "bread", "comets", "violins", "glaciers", "bees", "trains",
            "deserts", "clocks", "whales", "bridges", "tea", "storms", "forests", "maps"]


def start_server(binary, model, threads):
    cmd = [binary, "serve", "--model", model, "--port", "0"]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        m = re.search(r"http://([0-9.]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(2))
    raise RuntimeError("the server exited before printing its address")


def stream_one(port, model, prompt, max_tokens):
    """Returns (time to first text, total time, completion tokens)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    ttft, tokens = None, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
            ttft = time.perf_counter() - t0
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    conn.close()
    return ttft, time.perf_counter() - t0, tokens


def run(port, model, clients, requests, max_tokens, offset):
    results = []
    lock = threading.Lock()

    def client(c):
        for r in range(requests):
            i = offset + c * requests + r
            prompt = f"{SUBJECTS[i % len(SUBJECTS)].capitalize()} are interesting because (note {i})"
            res = stream_one(port, model, prompt, max_tokens)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[2] for r in results)
    ttfts = [r[0] for r in results if r[0] is not None]
    return tokens / wall, sum(ttfts) / len(ttfts), max(ttfts), tokens, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/luminal"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    proc, port = start_server(args.bin, args.model, args.threads)
    try:
        name = os.path.splitext(os.path.basename(args.model))[0]
        stream_one(port, name, "Warm up", 8)
        print("| clients | requests | generated tokens | wall s | tok/s (all clients) | TTFT mean ms | TTFT max ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        offset = 0
        for c in [int(x) for x in args.clients.split(",")]:
            tps, ttft, ttft_max, tokens, wall = run(port, name, c, args.requests, args.max_tokens, offset)
            offset += c * args.requests
            print(f"| {c} | {c * args.requests} | {tokens} | {wall:.2f} | {tps:.1f} | {ttft * 1e3:.0f} | {ttft_max * 1e3:.0f} |")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
