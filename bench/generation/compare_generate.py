"""Sets hk_bench_generate's JSON beside generate_transformers.py's (same run) and checks the decode
targets of issue 14. Writes <date>-generate-h200.json (both raw result sets, the per-row ratios and
targets) into --out-dir and the table (markdown) to --table.

Targets: batch-1 decode at 16+128 >= 70% of its bandwidth limit; batch-64 decode at 16+128 >=
40,000 tok/s and at 2048+128 >= 60% of its limit; prefill 8x2048 >= 2x Transformers SDPA.
Usage: python3 bench/generation/compare_generate.py --hk bench-hk.json --torch bench-torch.json
           [--commit SHA] [--out-dir DIR] [--table FILE]
"""
import argparse
import datetime
import json
import os
import subprocess


def gpu_name():
    try:
        return subprocess.check_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                       text=True).splitlines()[0].strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hk", required=True)
    ap.add_argument("--torch")
    ap.add_argument("--commit", default=os.environ.get("HK_COMMIT", "unknown"))
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--table")
    a = ap.parse_args()
    hk = json.load(open(a.hk))
    th = json.load(open(a.torch)) if a.torch and os.path.exists(a.torch) else {"decode": []}

    def hf(batch, p, n, mode):
        for r in th.get("decode", []):
            if r["batch"] == batch and r["prompt_len"] == p and r["new_tokens"] == n and \
                    r["mode"] == mode and "decode_tok_s" in r:
                return r["decode_tok_s"]
        return None

    rows, lines, checks = [], [], []
    lines.append(f"copy bandwidth {hk['copy_bandwidth'] / 1e9:.0f} GB/s; weights "
                 f"{hk['weight_bytes'] / 1e9:.3f} GB; {hk['kernels']}")
    lines.append("")
    lines.append("| batch | context | hk graph tok/s | % of limit | limit tok/s | hk no graph | "
                 "Transformers SDPA | static+compile | hk / SDPA |")
    lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    graph_rows = [r for r in hk["decode"] if r["mode"] == "graph"]
    for r in graph_rows:
        b, p, n = r["batch"], r["prompt_len"], r["new_tokens"]
        eager = next((e for e in hk["decode"] if e["mode"] == "device" and e["batch"] == b and
                      e["prompt_len"] == p and e["new_tokens"] == n), None)
        sdpa = hf(b, p, n, th.get("attn", "sdpa"))
        comp = hf(b, p, n, "static+compile")
        ratio = r["decode_tok_s"] / sdpa if sdpa else None
        row = dict(r, transformers_sdpa=sdpa, transformers_static_compile=comp,
                   hk_no_graph=eager["decode_tok_s"] if eager else None, x_sdpa=ratio)
        rows.append(row)
        fmt = lambda v, d=0: "—" if v is None else f"{v:,.{d}f}"  # noqa: E731
        lines.append(f"| {b} | {p}+{n} | {fmt(r['decode_tok_s'])} | "
                     f"{100 * r['fraction_of_limit']:.1f}% | {fmt(r['limit_tok_s'])} | "
                     f"{fmt(row['hk_no_graph'])} | {fmt(sdpa, 1)} | {fmt(comp, 1)} | "
                     f"{'—' if ratio is None else f'{ratio:.0f}x'} |")
        if b == 1 and p == 16:
            checks.append(("batch-1 decode 16+128 >= 70% of limit", r["fraction_of_limit"] >= 0.70,
                           f"{100 * r['fraction_of_limit']:.1f}%"))
        if b == 64 and p == 16:
            checks.append(("batch-64 decode 16+128 >= 40,000 tok/s", r["decode_tok_s"] >= 40000,
                           f"{r['decode_tok_s']:,.0f} tok/s"))
        if b == 64 and p == 2048:
            checks.append(("batch-64 decode 2048+128 >= 60% of limit",
                           r["fraction_of_limit"] >= 0.60, f"{100 * r['fraction_of_limit']:.1f}%"))
    pre_x = hk["prefill_tok_s"] / th["prefill_tok_s"] if th.get("prefill_tok_s") else None
    lines.append("")
    lines.append(f"prefill {hk['prefill_batch']}x{hk['prefill_len']}: hk {hk['prefill_ms']:.1f} ms "
                 f"= {hk['prefill_tok_s']:,.0f} tok/s; Transformers SDPA "
                 + (f"{th['prefill_ms']:.1f} ms = {th['prefill_tok_s']:,.0f} tok/s; "
                    f"hk {pre_x:.2f}x" if pre_x else "not run"))
    if pre_x is not None:
        checks.append(("prefill 8x2048 >= 2x Transformers SDPA", pre_x >= 2.0, f"{pre_x:.2f}x"))
    lines.append("")
    for name, ok, value in checks:
        lines.append(f"target {'PASS' if ok else 'MISS'}: {name} ({value})")
    table = "\n".join(lines) + "\n"
    date = datetime.date.today().isoformat()
    record = {"date": date, "gpu": gpu_name(), "commit": a.commit,
              "model": "random Qwen3-0.6B-shaped checkpoint, bf16 "
                       "(tools/fixtures/make_model_fixtures.py --qwen3-0.6b)",
              "same_run": {"hk": hk, "transformers": th}, "rows": rows,
              "targets": [{"target": n, "met": ok, "value": v} for n, ok, v in checks]}
    out = os.path.join(a.out_dir, f"{date}-generate-h200.json")
    json.dump(record, open(out, "w"), indent=1)
    if a.table:
        open(a.table, "w").write(table)
    print(table)


if __name__ == "__main__":
    main()
