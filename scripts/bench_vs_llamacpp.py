"""Report for scripts/bench-vs-llamacpp.sh: reads one run folder, prints markdown.

Usage (the shell script calls it):
  python3 scripts/bench_vs_llamacpp.py report --run DIR --models-dir DIR --threads "1 2" \
      --pp 128 --tg 64 --files A.gguf B.gguf ...
  python3 scripts/bench_vs_llamacpp.py weight-bytes FILE.gguf   # bytes read per decode token

Both benchmark outputs are parsed by llama-bench's JSON field names (`-o json`: an array of
records; `-o jsonl` lines also accepted): a record is the prefill test when `n_prompt > 0` and
`n_gen == 0`, the decode test when `n_gen > 0` and `n_prompt == 0` (falling back to a `test`
field like "pp128"/"tg64"); its speed is `avg_ts` ± `stddev_ts` (falling back to the mean of
`samples_ts`, or to tokens / `avg_ns`). Text before or after the JSON is ignored.
Peak RSS comes from `/usr/bin/time -v` ("Maximum resident set size").
Needs: python3; `pip install gguf numpy` for the roofline column (else the file size is used).
"""
import argparse
import json
import math
import os
import re
import statistics
import sys


# ----------------------------------------------------------------------------- parsing
def load_records(path):
    """The list of JSON records in a benchmark's stdout ([] when none can be parsed)."""
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return []
    dec = json.JSONDecoder()
    out = []
    i = 0
    while i < len(text):
        j = min([k for k in (text.find("[", i), text.find("{", i)) if k >= 0], default=-1)
        if j < 0:
            break
        try:
            val, end = dec.raw_decode(text, j)
        except json.JSONDecodeError:
            i = j + 1
            continue
        if isinstance(val, list):
            out.extend(v for v in val if isinstance(v, dict))
        elif isinstance(val, dict):
            out.append(val)
        i = end
    return out


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def classify(rec):
    """'pp', 'tg' or None."""
    n_prompt, n_gen = _int(rec.get("n_prompt")), _int(rec.get("n_gen"))
    if n_prompt is None and n_gen is None:
        m = re.fullmatch(r"(pp|tg)(\d+)", str(rec.get("test", "")))
        if not m:
            return None
        return m.group(1)
    n_prompt, n_gen = n_prompt or 0, n_gen or 0
    if n_prompt > 0 and n_gen == 0:
        return "pp"
    if n_gen > 0 and n_prompt == 0:
        return "tg"
    return None


def speed(rec):
    """(mean tok/s, stddev tok/s or None)."""
    if rec.get("avg_ts") is not None:
        return float(rec["avg_ts"]), _float(rec.get("stddev_ts"))
    ts = rec.get("samples_ts")
    if ts:
        ts = [float(x) for x in ts]
        return statistics.mean(ts), (statistics.stdev(ts) if len(ts) > 1 else 0.0)
    n = (_int(rec.get("n_prompt")) or 0) + (_int(rec.get("n_gen")) or 0)
    if rec.get("avg_ns") and n:
        return n * 1e9 / float(rec["avg_ns"]), None
    return None, None


def _float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def peak_rss_mib(time_path):
    try:
        for line in open(time_path, errors="replace"):
            if "Maximum resident set size" in line:
                return int(line.rsplit(":", 1)[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return None


def wall_s(time_path):
    try:
        for line in open(time_path, errors="replace"):
            if "Elapsed (wall clock)" in line:
                parts = [float(p) for p in line.rsplit(" ", 1)[1].strip().split(":")]
                s = 0.0
                for p in parts:
                    s = s * 60 + p
                return s
    except (OSError, ValueError):
        pass
    return None


def cpu_seconds(time_path):
    """User + system CPU seconds of the command, from /usr/bin/time -v."""
    tot, seen = 0.0, False
    try:
        for line in open(time_path, errors="replace"):
            if "User time (seconds)" in line or "System time (seconds)" in line:
                tot += float(line.rsplit(":", 1)[1])
                seen = True
    except (OSError, ValueError):
        return None
    return tot if seen else None


def other_load(stem, clk_tck):
    """Mean number of cores other processes kept busy while the command ran (machine busy time
    from /proc/stat minus the command's own CPU time, over its wall time), plus steal."""
    try:
        lines = open(stem + ".stat").read().split("\n")
        a = [int(x) for x in lines[0].split()[1:]]
        b = [int(x) for x in lines[1].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    d = [y - x for x, y in zip(a, b)]
    busy = (d[0] + d[1] + d[2] + d[5] + d[6]) / clk_tck  # user nice system irq softirq
    steal = (d[7] if len(d) > 7 else 0) / clk_tck
    own, wall = cpu_seconds(stem + ".time"), wall_s(stem + ".time")
    if own is None or not wall:
        return None
    return max(0.0, busy - own) / wall + steal / wall


def rc_of(stem):
    try:
        return int(open(stem + ".rc").read().strip())
    except (OSError, ValueError):
        return None


def weight_bytes_per_token(path):
    """Bytes of weights a decode step reads: every tensor once, except the embedding table
    when a separate output.weight exists (then only one embedding row is gathered; with tied
    embeddings the output projection reads the whole table)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return os.path.getsize(path), "file size (gguf not installed)"
    r = GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        total -= sizes["token_embd.weight"]
        return total, "untied"
    return total, "tied"


# ----------------------------------------------------------------------------- report
def fmt_ts(vals):
    """vals: list of (mean, std) over rounds."""
    vals = [v for v in vals if v[0] is not None]
    if not vals:
        return None, "–"
    if len(vals) == 1:
        m, s = vals[0]
        return m, f"{m:.1f}" + (f" ± {s:.1f}" if s is not None else "")
    means = [v[0] for v in vals]
    med = statistics.median(means)
    return med, f"{med:.1f} ({min(means):.1f}–{max(means):.1f})"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def failure(stem):
    rc = rc_of(stem)
    if rc is None:
        return "not run"
    if rc == 124:
        return "timeout"
    if rc != 0:
        return f"exit {rc}"
    return "no JSON"


def report(args):
    run = args.run
    meta = {}
    if os.path.exists(os.path.join(run, "meta.txt")):
        for line in open(os.path.join(run, "meta.txt")):
            k, _, v = line.rstrip("\n").partition("=")
            meta[k] = v
    threads = args.threads.split()
    bw = {}
    for t in threads:
        try:
            m = re.search(r"GB/s ([\d.]+)", open(os.path.join(run, f"bw.t{t}.txt")).read())
            bw[t] = float(m.group(1))
        except (OSError, AttributeError):
            bw[t] = None

    p = print
    p(f"Date: {meta.get('date', '?')}. CPU: {meta.get('cpu', '?')} ({meta.get('nproc', '?')} cores; "
      f"{meta.get('isa', '').strip()}).")
    llama_commit = None
    p(f"llama.cpp: {meta.get('llama_build', '?')}; build variant `{meta.get('variant', '?')}`"
      + (f"; ours with `{meta['ours_env']}`" if meta.get("ours_env") else "") + ".")
    p(f"Ours: `{meta.get('ours', '?')}`. Settings: {meta.get('settings', '?')}.")
    p("Read bandwidth (1 GiB buffer, best of 12 passes): "
      + ", ".join(f"{t} thread{'s' if t != '1' else ''} {bw[t]:.1f} GB/s" if bw[t] else f"{t}: ?" for t in threads)
      + ".")
    p()
    pp, tg = args.pp, args.tg
    p(f"| file | threads | ours pp{pp} | llama.cpp pp{pp} | ratio | ours tg{tg} | llama.cpp tg{tg} | ratio "
      f"| roofline tg tok/s | ours peak RSS | llama.cpp peak RSS | other load, cores (ours / llama.cpp) |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|")
    wbytes = {}
    rows = []
    max_other = 0.0
    clk_tck = int(meta.get("clk_tck") or 100)
    for f in args.files:
        path = os.path.join(args.models_dir, f)
        try:
            wbytes[f] = weight_bytes_per_token(path)
        except Exception as e:  # noqa: BLE001 - report, don't die
            wbytes[f] = (None, f"error: {e}")
        for t in threads:
            res = {}
            for eng in ("ours", "llama"):
                stems = sorted(
                    os.path.join(run, x[: -len(".rc")])
                    for x in os.listdir(run)
                    if x.startswith(f"bench.{f}.t{t}.r") and x.endswith(f".{eng}.rc")
                )
                pps, tgs, rss, loads = [], [], [], []
                for stem in stems:
                    for rec in load_records(stem + ".out"):
                        kind = classify(rec)
                        if kind == "pp":
                            pps.append(speed(rec))
                        elif kind == "tg":
                            tgs.append(speed(rec))
                        if eng == "llama" and rec.get("build_commit"):
                            llama_commit = rec["build_commit"]
                    r = peak_rss_mib(stem + ".time")
                    if r is not None:
                        rss.append(r)
                    ld = other_load(stem, clk_tck)
                    if ld is not None:
                        loads.append(ld)
                why = failure(stems[-1]) if stems else "not run"
                pm, ps = fmt_ts(pps)
                tm, ts = fmt_ts(tgs)
                res[eng] = dict(
                    pp=pm, pps=ps if pps else why, tg=tm, tgs=ts if tgs else why,
                    rss=f"{max(rss):.0f} MiB" if rss else "–",
                    load=max(loads) if loads else None,
                )
                if loads:
                    max_other = max(max_other, max(loads))
            wb = wbytes[f][0]
            roof = f"{bw[t] * 1e9 / wb:.1f}" if (wb and bw.get(t)) else "–"
            o, l = res["ours"], res["llama"]
            ld = " / ".join("–" if x["load"] is None else f"{x['load']:.2f}" for x in (o, l))
            rows.append(f"| {f} | {t} | {o['pps']} | {l['pps']} | {ratio(o['pp'], l['pp'])} | {o['tgs']} | {l['tgs']} "
                        f"| {ratio(o['tg'], l['tg'])} | {roof} | {o['rss']} | {l['rss']} | {ld} |")
    for row in rows:
        p(row)
    p()
    p("Ratio = ours / llama.cpp (> 1: ours faster). Roofline = read bandwidth at that thread count ÷ weight "
      "bytes a decode step reads (every tensor once; the embedding table is read whole by the tied output "
      "projection, or only one row when the file has its own output.weight; KV cache and activations ignored). "
      "Peak RSS: `/usr/bin/time -v`, whole process (includes the mapped file). Other load: mean cores kept "
      "busy by other processes (plus hypervisor steal) during the run, worst run of the row; well above 0 "
      "means the row is contaminated (llama.cpp's spinning thread barriers suffer most at 2 threads).")
    if max_other > 0.25:
        p()
        p(f"**Warning:** other processes used up to {max_other:.2f} cores during some runs "
          f"(load average {meta.get('load_start', '?')} at the start, {meta.get('load_end', '?')} at the end): "
          "rerun those rows on an idle machine.")
    p()
    p("Weight bytes per decode token: "
      + "; ".join(f"{f} {wb / 1e6:.1f} MB ({how})" if wb else f"{f} ? ({how})" for f, (wb, how) in wbytes.items())
      + ".")
    if llama_commit:
        p(f"llama-bench build_commit: {llama_commit}.")

    # Perplexity
    ppl_rows = []
    for f in args.files:
        for t in threads:
            stem = os.path.join(run, f"ppl.{f}.t{t}")
            if not os.path.exists(stem + ".llama.rc") and not os.path.exists(stem + ".ours.rc"):
                continue
            lt = open(stem + ".llama.out", errors="replace").read() + open(stem + ".llama.err", errors="replace").read()
            m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", lt)
            lp = f"{float(m.group(1)):.4f} ± {float(m.group(2)):.4f}" if m else failure(stem + ".llama")
            ot = open(stem + ".ours.out", errors="replace").read()
            ms = re.findall(r"^perplexity: ([\d.]+)", ot, re.M)
            op = f"{float(ms[-1]):.4f}" if ms else failure(stem + ".ours")
            mt = re.search(r"tokens: (\d+), windows: (\d+)", ot)
            lw, ow = wall_s(stem + ".llama.time"), wall_s(stem + ".ours.time")
            rel = "–"
            if ms and m:
                rel = f"{float(ms[-1]) / float(m.group(1)) - 1:+.2%}"
            ppl_rows.append((f, t, op, lp, rel, ow, lw, mt.group(1) if mt else "?"))
    if ppl_rows:
        text = "?"
        try:
            text = open(os.path.join(run, "ppl-text-path")).read().strip()
        except OSError:
            pass
        p()
        p(f"Perplexity of `{text}`, window {args.ppl_ctx}:")
        p()
        p("| file | threads | ours ppl | llama.cpp ppl | ours vs llama.cpp | ours wall s | llama.cpp wall s |")
        p("|---|---|---|---|---|---|---|")
        for f, t, op, lp, rel, ow, lw, ntok in ppl_rows:
            p(f"| {f} | {t} | {op} | {lp} | {rel} | {ow if ow is not None else '–'} | {lw if lw is not None else '–'} |")
        p()
        p("Same protocol on both sides: `luminal perplexity --protocol llama-cpp` scores what "
          "`llama-perplexity` scores (BOS where the model adds one, whole windows only, the second half "
          "of each window). Wall time includes loading.")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("--run", required=True)
    r.add_argument("--models-dir", required=True)
    r.add_argument("--threads", default="1 2")
    r.add_argument("--pp", type=int, default=128)
    r.add_argument("--tg", type=int, default=64)
    r.add_argument("--ppl-ctx", type=int, default=512)
    r.add_argument("--files", nargs="+", required=True)
    w = sub.add_parser("weight-bytes")
    w.add_argument("file")
    args = ap.parse_args()
    if args.cmd == "report":
        report(args)
    else:
        b, how = weight_bytes_per_token(args.file)
        print(b, how)


if __name__ == "__main__":
    main()
