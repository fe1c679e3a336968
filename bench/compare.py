#!/usr/bin/env python3
"""Merges hk_bench_ops and bench/peers/torch_ops.py results into one record and prints a table.

Writes <out-dir>/<YYYY-MM-DD>-ops-<gpu>.json (e.g. 2026-11-30-ops-h200.json) holding the date, the
GPU, the hk commit, both raw result sets and one row per case: hk, torch eager and torch.compile
times, the speed ratios (torch ms / hk ms: above 1 means hk is faster) and the issue-2 targets
(bf16/f16 matmul and linear ≥ 90% of torch eager TFLOP/s; elementwise/copy-like ops ≥ 80% of the
device copy bandwidth measured in the same run). Prints the table (also to --table FILE).

Usage: python3 bench/compare.py --hk bench-hk.json --torch bench-torch.json [--out-dir bench/results]
       [--commit SHA] [--table FILE]
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

MEMORY_BOUND = {"add", "mul", "silu", "act_mul_silu", "cast_bf16_to_f32", "cast_f32_to_bf16",
                "rms_norm", "rotary"}
MATRIX = {"matmul", "linear"}


def key(rec):
    shape = rec["shape"]
    if isinstance(shape, list):
        shape = "[" + ",".join(str(s) for s in shape) + "]"
    return (rec["op"], re.sub(r"\s+", "", shape), rec["dtype"])


def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        print(f"compare: cannot read {path}: {e}", file=sys.stderr)
        return None


def commit_id(arg):
    if arg:
        return arg
    if os.environ.get("HK_COMMIT"):
        return os.environ["HK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt(v, spec):
    if isinstance(v, (int, float)):
        return format(v, spec)
    width = re.match(r"\d*", spec).group(0)
    return "-".rjust(int(width) if width else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hk", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--out-dir", default="bench/results")
    p.add_argument("--commit", default="")
    p.add_argument("--table", default="")
    args = p.parse_args()

    hk = load(args.hk)
    if hk is None:
        return 1
    torch_res = load(args.torch) or {"results": [], "note": "torch results missing"}
    peers = {}
    for r in torch_res.get("results", []):
        peers.setdefault(key(r), {})[r.get("mode", "eager")] = r

    rows = []
    for r in hk.get("results", []):
        k = key(r)
        eager = peers.get(k, {}).get("eager", {})
        comp = peers.get(k, {}).get("compile", {})
        row = {"op": r["op"], "shape": r["shape"], "dtype": r["dtype"], "hk_ms": r.get("ms"),
               "torch_eager_ms": eager.get("ms"), "torch_compile_ms": comp.get("ms"),
               "hk_gbps": r.get("gbps"), "hk_tflops": r.get("tflops"),
               "hk_pct_of_copy": r.get("pct_of_copy"), "torch_eager_tflops": eager.get("tflops")}
        if "error" in r:
            row["hk_error"] = r["error"]
        if row["hk_ms"] and row["torch_eager_ms"]:
            row["speedup_vs_eager"] = row["torch_eager_ms"] / row["hk_ms"]
        if row["hk_ms"] and row["torch_compile_ms"]:
            row["speedup_vs_compile"] = row["torch_compile_ms"] / row["hk_ms"]
        if r["op"] in MATRIX and r["dtype"] in ("bf16", "f16") and row["hk_tflops"] and row["torch_eager_tflops"]:
            row["target"] = "tflops >= 90% of torch"
            row["target_value"] = 100.0 * row["hk_tflops"] / row["torch_eager_tflops"]
            row["target_met"] = row["target_value"] >= 90.0
        elif r["op"] in MEMORY_BOUND and row["hk_pct_of_copy"] is not None:
            row["target"] = "GB/s >= 80% of copy"
            row["target_value"] = row["hk_pct_of_copy"]
            row["target_met"] = row["hk_pct_of_copy"] >= 80.0
        rows.append(row)

    gpu = hk.get("gpu", "unknown")
    tag = "h200" if "H200" in gpu.upper() else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    merged = {"date": date, "gpu": gpu, "commit": commit_id(args.commit),
              "torch": torch_res.get("torch"), "copy_gbps": hk.get("copy_gbps"),
              "torch_copy_gbps": torch_res.get("copy_gbps"), "rows": rows,
              "hk_raw": hk, "torch_raw": torch_res}
    os.makedirs(args.out_dir, exist_ok=True)
    out_path = os.path.join(args.out_dir, f"{date}-ops-{tag}.json")
    with open(out_path, "w") as fh:
        json.dump(merged, fh, indent=2)

    lines = [f"hk vs PyTorch {merged['torch']} on {gpu}, {date}, commit {merged['commit'][:12]}; "
             f"copy {fmt(hk.get('copy_gbps'), '.0f')} GB/s (hk) / {fmt(torch_res.get('copy_gbps'), '.0f')} GB/s (torch)",
             f"{'op':24s} {'shape':24s} {'dt':4s} {'hk ms':>9s} {'eager':>9s} {'compile':>9s} "
             f"{'x eager':>7s} {'x comp':>7s} {'GB/s|TF':>8s} {'target':>14s}"]
    for row in rows:
        metric = row["hk_tflops"] if row["hk_tflops"] else row["hk_gbps"]
        if "target_met" in row:
            target = f"{row['target_value']:.0f}% {'ok' if row['target_met'] else 'MISS'}"
        else:
            target = "-"
        if "hk_error" in row:
            target = "hk FAILED"
        lines.append(f"{row['op']:24s} {str(row['shape']).replace(' ', ''):24s} {row['dtype']:4s} "
                     f"{fmt(row['hk_ms'], '9.3f')} {fmt(row['torch_eager_ms'], '9.3f')} "
                     f"{fmt(row['torch_compile_ms'], '9.3f')} {fmt(row.get('speedup_vs_eager'), '7.2f')} "
                     f"{fmt(row.get('speedup_vs_compile'), '7.2f')} {fmt(metric, '8.1f')} {target:>14s}")
    met = [r for r in rows if "target_met" in r]
    lines.append(f"targets met: {sum(r['target_met'] for r in met)}/{len(met)}; merged record: {out_path}")
    table = "\n".join(lines)
    print(table)
    if args.table:
        with open(args.table, "w") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
