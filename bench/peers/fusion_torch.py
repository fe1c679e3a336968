#!/usr/bin/env python3
"""bench/peers/fusion_torch.py — PyTorch at the shapes of bench/kernels/fusion_bench: Qwen3's
post_attention_layernorm followed by its SwiGLU MLP (Transformers' Qwen3RMSNorm and Qwen3MLP
formulas, bf16, hidden 1024, intermediate 3072), eager and torch.compile, timed the same way (CUDA
events around each call, warm-up first, median of the repeats, inputs and weights rotated among
four sets), per call and as CUDA-graph replays. "forward" is the inference forward (no autograd);
"train" is one forward + backward with autograd (weights and input require grad), at the training
row counts only.

Usage: python3 bench/peers/fusion_torch.py [--out FILE.json] [--quick] [--no-compile]
A variant that fails (e.g. torch.compile without a working Triton) is recorded with its error.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from liger_torch import graph_ms, time_ms  # noqa: E402 — the same timing as the liger peers

H, I, EPS = 1024, 3072, 1e-6


def norm_mlp(x, w, gate, up, down):
    # Qwen3RMSNorm: f32 variance, normalised rows back in the input dtype, then · weight
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w
    # Qwen3MLP: down(act(gate(n)) * up(n))
    return F.linear(F.silu(F.linear(n, gate)) * F.linear(n, up), down)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    rows_list = [1, 128, 2048] if args.quick else [1, 8, 64, 512, 2048, 8192, 16384]
    reps = 10 if args.quick else 30
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.rand(*shape, device=dev, generator=gen, dtype=torch.float32) - 0.5).mul_(
            scale).to(dt)

    sets = [dict(x=rnd(rows_list[-1], H, scale=4), w=rnd(H, scale=0.5), gate=rnd(I, H, scale=0.1),
                 up=rnd(I, H, scale=0.1), down=rnd(H, I, scale=0.1), dy=rnd(rows_list[-1], H))
            for _ in range(4)]
    variants = [("eager", norm_mlp)]
    if not args.no_compile:
        variants.append(("compile", torch.compile(norm_mlp)))
    cases = []
    for rows in rows_list:
        for name, f in variants:
            for train in (False, True):
                if train and rows < 512:
                    continue
                for graph in (False, True):
                    # torch.compile under graph capture: its own CUDA graphs are not used here
                    def call(i, f=f, rows=rows, train=train):
                        s = sets[i % 4]
                        if not train:
                            with torch.no_grad():
                                return f(s["x"][:rows], s["w"], s["gate"], s["up"], s["down"])
                        ps = [s["x"][:rows].detach().requires_grad_()] + [
                            s[k].detach().requires_grad_() for k in ("w", "gate", "up", "down")]
                        f(*ps).backward(s["dy"][:rows])
                    case = {"rows": rows, "impl": name, "pass": "train" if train else "forward",
                            "mode": "graph" if graph else "call"}
                    try:
                        case["ms"] = (graph_ms(call, per_graph=10, reps=reps) if graph
                                      else time_ms(call, reps=reps))
                    except Exception as e:  # noqa: BLE001 — recorded, the run goes on
                        case["error"] = f"{type(e).__name__}: {e}"[:300]
                    cases.append(case)
                    print(json.dumps(case), flush=True)
    doc = {"bench": "fusion-torch", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "hidden": H, "intermediate": I, "dtype": "bf16", "cases": cases}
    text = json.dumps(doc, indent=1)
    if args.out:
        open(args.out, "w").write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
