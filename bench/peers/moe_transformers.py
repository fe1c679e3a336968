#!/usr/bin/env python3
"""bench/peers/moe_transformers.py — Transformers' Qwen3-MoE block (Qwen3MoeSparseMoeBlock) at the
shapes of bench/moe/hk_bench_moe (hidden 2048, 128 experts, top-8, expert intermediate 768, bf16;
4096 and 16384 tokens), forward and forward+backward, timed the same way (CUDA events, warm-up
first, median of the repeats), FLOPs counted on routed tokens (forward 2·T·k·3·H·I, backward 2×).

Variants: experts_implementation "eager" (Transformers' per-expert loop: the reference the targets
are set against), "grouped_mm" (what Transformers 5.x picks on cuda by default, torch._grouped_mm),
and with --compile torch.compile of the grouped_mm block. torch.matmul dense bf16 GEMMs of the same
FLOPs are timed too, as a cross-check of hk's cuBLAS rate.

Usage: python3 bench/peers/moe_transformers.py [--out FILE.json] [--tokens 4096,16384] [--compile]
A variant that fails is recorded with its error instead of stopping the run.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from liger_torch import time_ms as liger_time_ms  # noqa: E402 — one timing for every peer

H, E, K, I = 2048, 128, 8, 768


def time_ms(fn, reps, warm=2):
    """Median ms of fn() over `reps` calls after `warm` ones: the liger peers' timing."""
    return liger_time_ms(lambda _i: fn(), warm=warm, reps=reps)


def block(impl):
    config = Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K,
                            moe_intermediate_size=I, norm_topk_prob=True)
    config._experts_implementation = impl
    torch.manual_seed(0)
    b = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in b.parameters():
            p.normal_(0.0, 0.02)
    return b.to("cuda", torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    results = []

    def record(name, tokens, pass_, ms, flops, extra=None):
        r = {"name": name, "tokens": tokens, "pass": pass_, "ms": ms,
             "tflops": flops / (ms * 1e-3) / 1e12}
        r.update(extra or {})
        results.append(r)
        print(f"{name:<28} T={tokens:<6} {pass_:<17} {ms:9.3f} ms {r['tflops']:7.1f} TFLOP/s",
              flush=True)

    variants = [("transformers eager", "eager", False), ("transformers grouped_mm", "grouped_mm", False)]
    if args.compile:
        variants.append(("transformers grouped_mm compile", "grouped_mm", True))
    for tokens in [int(t) for t in args.tokens.split(",")]:
        fwd_flops = 2.0 * tokens * K * 3 * H * I
        x = torch.randn(1, tokens, H, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x) * 0.01
        for name, impl, compiled in variants:
            try:
                b = block(impl)
                f = torch.compile(b) if compiled else b
                reps = max(2, args.reps // 2) if impl == "eager" and tokens > 8192 else args.reps

                def forward():
                    with torch.no_grad():
                        f(x)

                def train():
                    xr = x.detach().requires_grad_(True)
                    f(xr).backward(dy)

                record(name, tokens, "forward", time_ms(forward, reps), fwd_flops)
                record(name, tokens, "forward+backward", time_ms(train, reps), 3 * fwd_flops)
                del b, f
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 — recorded, the run goes on
                results.append({"name": name, "tokens": tokens, "error": f"{type(e).__name__}: {e}"})
                print(f"{name} T={tokens}: FAILED {type(e).__name__}: {e}", file=sys.stderr)
        # Dense torch.matmul GEMMs of the same FLOPs (the experts' shapes at M = T·k).
        n = tokens * K
        a = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
        act = torch.randn(n, I, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(n, 2 * I, device="cuda", dtype=torch.bfloat16)
        wgu = torch.randn(2 * I, H, device="cuda", dtype=torch.bfloat16)
        wd = torch.randn(H, I, device="cuda", dtype=torch.bfloat16)

        def dense_forward():
            a @ wgu.T
            act @ wd.T

        def dense_train():
            dense_forward()
            a @ wd
            g @ wgu
            a.T @ act
            g.T @ a

        record("torch dense bf16", tokens, "forward", time_ms(dense_forward, args.reps), fwd_flops)
        record("torch dense bf16", tokens, "forward+backward", time_ms(dense_train, args.reps),
               3 * fwd_flops)
        del a, act, g, wgu, wd, x, dy
        torch.cuda.empty_cache()
    doc = {"benchmark": "moe", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "transformers": transformers.__version__,
           "shape": {"hidden": H, "experts": E, "top_k": K, "intermediate": I}, "results": results}
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
