#!/usr/bin/env python3
"""bench/moe/moe_table.py — the MoE benchmark table: hk_bench_moe's JSON (megablocks, built-in,
cuBLAS dense of the same FLOPs) beside bench/peers/moe_transformers.py's (Transformers eager and
grouped_mm, torch dense), with the ratios the targets are stated in, at 16384 tokens,
forward+backward: ≥ 10× Transformers eager, ≥ 60 % of the dense bf16 GEMM rate measured in the run.

Usage: moe_table.py --hk moe-hk.json --torch moe-torch.json [--table OUT.txt] [--merged OUT.json]
Prints the table (and writes it to --table); --merged writes both documents in one JSON (for
bench/results/<date>-moe-h200.json). Exit 0 even when a target is missed: targets are reported,
not enforced.
"""
import argparse
import datetime
import json


def index(doc):
    return {(r["name"], r["tokens"], r["pass"]): r for r in doc.get("results", []) if "ms" in r}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hk", required=True)
    ap.add_argument("--torch")
    ap.add_argument("--table")
    ap.add_argument("--merged")
    args = ap.parse_args()
    hk = json.load(open(args.hk))
    torch_doc = json.load(open(args.torch)) if args.torch else {"results": []}
    rows = {**index(hk), **index(torch_doc)}
    # megablocks' expert-GEMM kernel sets (hk_bench_moe rows) and their column label
    kernel_sets = {"hk megablocks": "128x128", "hk megablocks 128x256": "128x256",
                   "hk megablocks wgmma": "wgmma", "hk megablocks tma": "tma"}
    tokens = sorted({k[1] for k in rows})
    lines = [f"MoE block at Qwen3-30B-A3B shapes (H 2048, 128 experts, top-8, I 768), bf16, "
             f"{hk.get('gpu', '?')}; TFLOP/s on routed tokens",
             f"{'kernels':>7} {'tokens':>6} {'pass':<17} {'hk ms':>8} {'graph':>8} {'TF/s':>6} {'dense':>6} "
             f"{'%dense':>6} {'eager ms':>9} {'x eager':>8} {'gmm ms':>8} {'x gmm':>6}"]
    verdicts = []
    for t in tokens:
        for name, p in [(n, p) for p in ("forward", "forward+backward")
                        for n in kernel_sets]:
            mb = rows.get((name, t, p))
            if not mb:
                continue
            dense = rows.get(("cuBLAS dense bf16", t, p))
            eager = rows.get(("transformers eager", t, p))
            gmm = rows.get(("transformers grouped_mm", t, p))
            tf = mb["tflops"]
            frac = tf / dense["tflops"] if dense else None
            xe = eager["ms"] / mb["ms"] if eager else None
            xg = gmm["ms"] / mb["ms"] if gmm else None
            fmt = lambda v, f: (f % v) if v is not None else "-"  # noqa: E731
            tiles = kernel_sets[name]
            lines.append(f"{tiles:>7} {t:>6} {p:<17} {mb['ms']:8.3f} {fmt(mb.get('graph_ms'), '%8.3f'):>8} "
                         f"{tf:6.0f} {fmt(dense and dense['tflops'], '%6.0f'):>6} "
                         f"{fmt(frac and 100 * frac, '%5.0f%%'):>6} "
                         f"{fmt(eager and eager['ms'], '%9.2f'):>9} {fmt(xe, '%7.1fx'):>8} "
                         f"{fmt(gmm and gmm['ms'], '%8.2f'):>8} {fmt(xg, '%5.1fx'):>6}")
            if t == 16384 and p == "forward+backward":
                verdicts.append((f"{tiles} forward+backward >= 10x Transformers eager", xe,
                                 xe is not None and xe >= 10))
                verdicts.append((f"{tiles} forward+backward >= 60% of dense bf16 GEMM", frac,
                                 frac is not None and frac >= 0.6))
    for name, value, ok in verdicts:
        v = "-" if value is None else (f"{value:.1f}x" if "eager" in name else f"{100 * value:.0f}%")
        verdict = "NOT MEASURED (no peer run)" if value is None else ("MET" if ok else "MISSED")
        lines.append(f"target (16384 tokens) {name}: {verdict} ({v})")
    text = "\n".join(lines)
    print(text)
    if args.table:
        with open(args.table, "w") as fh:
            fh.write(text + "\n")
    if args.merged:
        merged = {"date": datetime.date.today().isoformat(), "benchmark": "moe", "hk": hk,
                  "torch": torch_doc, "table": lines}
        with open(args.merged, "w") as fh:
            json.dump(merged, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
