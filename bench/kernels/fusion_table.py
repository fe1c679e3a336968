#!/usr/bin/env python3
"""bench/kernels/fusion_table.py — merges bench/kernels/fusion_bench's JSON (hk: the fused
LigerRMSNormSwiGLUMLP and the unfused LigerRMSNorm + LigerSwiGLUMLP pair) with
bench/peers/fusion_torch.py's (PyTorch eager and torch.compile) into one document with ratios,
and prints the table. "train" is forward + backward (hk: the two timed passes added).

Usage: fusion_table.py --hk HK.json [--torch TORCH.json] [--table OUT.txt] [--merged OUT.json]
"""
import argparse
import datetime
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hk", required=True)
    ap.add_argument("--torch")
    ap.add_argument("--table")
    ap.add_argument("--merged")
    a = ap.parse_args()
    hk = json.load(open(a.hk))
    torch_ = json.load(open(a.torch)) if a.torch else {"cases": []}
    hk_ms = {}  # (rows, pass, mode) -> (fused, pair)
    for c in hk["cases"]:
        hk_ms[(c["rows"], c["pass"], c["mode"])] = (c["fused_ms"], c["unfused_pair_ms"])
    for (rows, p, mode), (f, u) in list(hk_ms.items()):
        if p == "backward" and (rows, "forward", mode) in hk_ms:
            ff, fu = hk_ms[(rows, "forward", mode)]
            hk_ms[(rows, "train", mode)] = (ff + f, fu + u)
    torch_ms = {(c["rows"], c["pass"], c["mode"], c["impl"]): c.get("ms") for c in torch_["cases"]}
    rows_out = []
    lines = [f"fused RMSNorm -> SwiGLU MLP, bf16, H {hk['hidden']}, I {hk['intermediate']}, "
             f"{hk['gpu']} (ms; x = time of the other / time of hk fused)",
             f"{'rows':>6} {'pass':8} {'mode':5} {'hk fused':>9} {'hk pair':>9} {'x':>6} "
             f"{'eager':>9} {'x':>6} {'compile':>9} {'x':>6}"]
    for (rows, p, mode) in sorted(hk_ms, key=lambda k: (k[1] != "forward", k[1], k[0], k[2])):
        if p == "backward":
            continue
        f, u = hk_ms[(rows, p, mode)]
        e = torch_ms.get((rows, p, mode, "eager"))
        c = torch_ms.get((rows, p, mode, "compile"))
        r = {"rows": rows, "pass": p, "mode": mode, "hk_fused_ms": f, "hk_pair_ms": u,
             "pair_over_fused": u / f, "eager_ms": e, "compile_ms": c,
             "eager_over_fused": e / f if e else None, "compile_over_fused": c / f if c else None}
        rows_out.append(r)
        fmt = lambda v: f"{v:9.4f}" if v else f"{'-':>9}"  # noqa: E731
        rat = lambda v: f"{v:6.2f}" if v else f"{'-':>6}"  # noqa: E731
        lines.append(f"{rows:>6} {p:8} {mode:5} {f:9.4f} {u:9.4f} {u / f:6.2f} {fmt(e)} "
                     f"{rat(r['eager_over_fused'])} {fmt(c)} {rat(r['compile_over_fused'])}")
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if a.table:
        open(a.table, "w").write(table)
    if a.merged:
        json.dump({"bench": "fusion", "date": datetime.date.today().isoformat(), "gpu": hk["gpu"],
                   "commit": hk.get("commit"), "torch": torch_.get("torch"), "hk": hk,
                   "torch_cases": torch_["cases"], "rows": rows_out}, open(a.merged, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
