#!/usr/bin/env python3
"""Merges hk_bench_attention and bench/peers/attention_torch.py results: one JSON record
(<date>-attention-h200.json: date, GPU, commit, both raw result sets, per-shape ratios against the
faster PyTorch backend and the issue's targets) and the short table scripts/gpu-test prints last.

Targets (issue 11): forward and forward+backward >= 1.05x the faster of SDPA's flash and cuDNN
backends at every prefill shape; decode >= 80% of the copy bandwidth for the KV bytes read.

Usage: compare_attention.py --hk hk.json --torch torch.json --out-dir DIR --table FILE [--commit SHA]
"""
import argparse
import datetime
import json
import os


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hk", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--commit", default=os.environ.get("HK_COMMIT", "unknown"))
    a = p.parse_args()
    hk = json.load(open(a.hk))
    try:
        th = json.load(open(a.torch))
    except (OSError, ValueError):
        th = {"prefill": [], "decode": []}
    lines = ["attention (bf16, causal, D128)       hk TF/s   flash   cudnn   ratio  target",
             "-" * 82]
    ratios = []
    for row in hk["prefill"]:
        peers = [r for r in th["prefill"] if r.get("shape") == row["shape"] and "error" not in r]
        for kind in ("fwd", "fwdbwd"):
            by = {r["backend"]: r.get(f"{kind}_tflops") for r in peers}
            best = max([v for v in by.values() if v], default=None)
            mine = row[f"{kind}_tflops"]
            ratio = mine / best if best else None
            ok = ratio is not None and ratio >= 1.05
            ratios.append({"shape": row["shape"], "pass": kind, "hk_tflops": mine,
                           "torch_flash_tflops": by.get("flash"), "torch_cudnn_tflops": by.get("cudnn"),
                           "ratio_vs_best": ratio, "target": 1.05, "met": ok})
            fmt = lambda v: f"{v:7.1f}" if v else "    n/a"
            lines.append(f"{row['shape']:<26} {kind:<7} {mine:7.1f} {fmt(by.get('flash'))} "
                         f"{fmt(by.get('cudnn'))} {ratio if ratio else float('nan'):7.2f}  "
                         f"{'met' if ok else 'MISSED'}")
    lines.append("decode B1 16/8 D128                GB/s   %copy   flash   cudnn  target")
    for row in hk["decode"]:
        peers = {r["backend"]: r.get("gbps") for r in th["decode"] if r.get("T") == row["T"]}
        ok = row["pct_of_copy"] >= 80
        ratios.append({"shape": f"decode T{row['T']}", "hk_gbps": row["gbps"],
                       "pct_of_copy": row["pct_of_copy"], "torch_flash_gbps": peers.get("flash"),
                       "torch_cudnn_gbps": peers.get("cudnn"), "target_pct": 80, "met": ok})
        fmt = lambda v: f"{v:7.0f}" if v else "    n/a"
        lines.append(f"T{row['T']:<32} {row['gbps']:7.0f} {row['pct_of_copy']:6.1f}% "
                     f"{fmt(peers.get('flash'))} {fmt(peers.get('cudnn'))}  {'met' if ok else 'MISSED'}")
    date = datetime.date.today().isoformat()
    record = {"date": date, "gpu": hk.get("gpu"), "commit": a.commit, "torch": th.get("torch"),
              "copy_gbps": hk.get("copy_gbps"), "hk": hk, "torch_results": th, "comparison": ratios}
    gpu = "h200" if "H200" in (hk.get("gpu") or "") else "gpu"
    with open(os.path.join(a.out_dir, f"{date}-attention-{gpu}.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(a.table, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
