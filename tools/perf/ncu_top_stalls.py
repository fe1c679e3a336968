#!/usr/bin/env python3
"""ncu_top_stalls.py — the hottest SASS instructions of one kernel from an ncu source-page CSV.

Reads what `ncu --section WarpStateStats --section SourceCounters --page source --print-source sass
--csv` printed for ONE profiled kernel launch, and prints (1) the kernel's warp-stall samples summed
per stall reason, (2) the N instructions with the most samples, each with its top reasons. It does
not run ncu, and it does not guess at columns: sample columns are those whose header names a stall
reason or "Warp Stall Sampling"; a CSV without them is an error.

Usage: ncu_top_stalls.py FILE.csv [--top N]
"""
import csv
import sys


def main() -> int:
    args = sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    top = 40
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    with open(args[0], newline="") as f:
        lines = [l for l in f if not l.startswith("==")]
    rows = list(csv.reader(lines))
    header_at = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
    if header_at is None:
        print(f"{args[0]}: no header row with a 'Source' column (is it ncu --page source --csv?)",
              file=sys.stderr)
        return 1
    header = rows[header_at]
    body = [r for r in rows[header_at + 1 :] if len(r) == len(header)]
    src = header.index("Source")
    total_col = next((i for i, h in enumerate(header) if "Warp Stall Sampling (All" in h), None)
    # the "(Not Issued)" columns are a subset of the same reason's samples: left out, so a
    # reason is counted once
    reason_cols = [i for i, h in enumerate(header)
                   if (h.startswith("stall_") or "smsp__pcsamp_warps_issue_stalled" in h)
                   and "(Not Issued)" not in h]
    if total_col is None:
        print(f"{args[0]}: no 'Warp Stall Sampling (All Samples)' column; columns: {header}",
              file=sys.stderr)
        return 1

    def num(s: str) -> float:
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[total_col]) for r in body)
    print(f"{len(body)} instructions, {total:.0f} samples")
    if reason_cols:
        sums = sorted(((sum(num(r[c]) for r in body), header[c]) for c in reason_cols), reverse=True)
        for v, name in sums[:14]:
            print(f"  {100 * v / max(total, 1):5.1f}%  {name}")
    ranked = sorted(body, key=lambda r: num(r[total_col]), reverse=True)[:top]
    for r in ranked:
        reasons = sorted(((num(r[c]), header[c]) for c in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{n.replace('smsp__pcsamp_warps_issue_stalled_', '')} {v:.0f}"
                        for v, n in reasons if v > 0)
        addr = r[0] if header[0] != "Source" else ""
        print(f"{100 * num(r[total_col]) / max(total, 1):5.1f}%  {addr:>8} {r[src].strip()[:60]:60}  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
