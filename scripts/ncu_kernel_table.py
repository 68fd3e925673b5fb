#!/usr/bin/env python3
"""Per-kernel device time of a run profiled by Nsight Compute in CSV form, as the
`profile` mode of scripts/cuda_device_suite.sh writes it (`ncu --csv --metrics
gpu__time_duration.sum,dram__bytes_read.sum ... > ncu_decode.csv`).

Groups the last N kernels (default 346: one Llama-3.2-1B-shaped decode step) by kernel name
and prints launches, total and mean microseconds and DRAM bytes read, largest first. Each
kernel runs with cold caches under ncu, so small kernels read high.

Usage: python3 scripts/ncu_kernel_table.py ncu_decode.csv [N]
"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 346
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    header, data = rows[0], rows[1:]
    col = {name: header.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    kernels = collections.OrderedDict()
    for r in data:
        k = kernels.setdefault(r[col["ID"]], {"name": r[col["Kernel Name"]]})
        k[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    chosen = list(kernels.values())[-last:]
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in chosen:
        g = groups[k["name"][:48]]
        g[0] += 1
        g[1] += k.get("gpu__time_duration.sum", 0.0) / 1e3
        g[2] += k.get("dram__bytes_read.sum", 0.0)
    total = sum(g[1] for g in groups.values())
    print(f"{len(chosen)} kernels, {total:.1f} us")
    print("| kernel | launches | us | us each | DRAM bytes read |")
    print("|---|---:|---:|---:|---:|")
    for name, (n, us, b) in sorted(groups.items(), key=lambda x: -x[1][1]):
        print(f"| {name} | {n} | {us:.1f} | {us / n:.2f} | {b:.0f} |")


if __name__ == "__main__":
    main()
