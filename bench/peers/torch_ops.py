#!/usr/bin/env python3
"""PyTorch side of bench/ops: the same ops, shapes and dtypes as hk_bench_ops, timed the same way.

Each op runs in PyTorch eager (the formulas of Transformers' eager Llama/Qwen3 code where one
exists: RMSNorm, rotary, SwiGLU, eager attention, the causal-LM loss on float logits) and, unless
--no-compile, through torch.compile of that same function. Timing: 3 warm-ups, then each launch
between two torch.cuda.Event records on the current stream, reps sized to ~300 ms (5..100), the
median reported. Bytes and FLOPs are counted exactly as hk_bench_ops counts them (what the op must
move / compute), so GB/s and TFLOP/s compare like for like. Output: JSON (--out).

Not here: hk itself (bench/ops), the merge and table (bench/compare.py).

Usage: python3 bench/peers/torch_ops.py [--out bench-torch.json] [--quick] [--no-compile]
       [--compile-budget SECONDS] [--filter SUBSTRING] [--device cpu --tiny]  (local smoke test)
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-torch.json")
    p.add_argument("--quick", action="store_true", help="smaller shapes (must match hk --quick)")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--compile-budget", type=float, default=150.0,
                   help="seconds of torch.compile work before the remaining compiles are skipped")
    p.add_argument("--filter", default="")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes for a CPU smoke test")
    return p.parse_args()


ARGS = None
DEV = None


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, quick):
    for _ in range(3):
        fn()
    sync()
    if DEV.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    first = a.elapsed_time(b)
    reps = int(min(100, max(5, (60.0 if quick else 300.0) / max(first, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        stops[i].record()
    stops[-1].synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops))


def rand(shape, dtype):
    return (torch.rand(shape, device=DEV, dtype=torch.float32) * 2 - 1).to(dtype)


# ---- the eager formulas (Transformers' Llama/Qwen3 modelling code) ------------------------------
def hf_rms_norm(x, w, eps=1e-6):
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rotary(x, cos, sin):  # x [B, S, H, D], cos/sin [1, S, D] f32 -> unsqueeze at the head dim
    cos = cos.to(x.dtype).unsqueeze(2)
    sin = sin.to(x.dtype).unsqueeze(2)
    return (x * cos) + (rotate_half(x) * sin)


def hf_eager_attention(q, k, v, mask):  # [B, S, H, D] in, [B, S, H, D] out
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5)
    scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


def hf_loss(logits, labels):
    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="mean")


# ---- cases: (op, shape, dtype, bytes, flops, fn, compilable fn or None) --------------------------
def make_cases(quick, tiny):
    R, H = (64, 256) if tiny else ((8192, 4096) if quick else (32768, 4096))
    n = R * H
    cases = []

    src = rand((R, H), torch.bfloat16)
    dst = torch.empty_like(src)
    cases.append(("copy", [R, H], "bf16", 2 * n * 2, 0, lambda: dst.copy_(src), None))

    M = 128 if tiny else (4096 if quick else 8192)
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        a, b = rand((M, M), dt), rand((M, M), dt)
        c = torch.empty((M, M), device=DEV, dtype=dt)
        cases.append(("matmul", [M, M, M], name, 0, 2.0 * M ** 3,
                      (lambda a=a, b=b, c=c: torch.mm(a, b, out=c)), None))
    Ml, Nl, Kl = (64, 128, 64) if tiny else ((4096 if quick else 16384), 14336, 4096)
    x, w = rand((Ml, Kl), torch.bfloat16), rand((Nl, Kl), torch.bfloat16)
    cases.append(("linear", [Ml, Nl, Kl], "bf16", 0, 2.0 * Ml * Nl * Kl,
                  (lambda x=x, w=w: F.linear(x, w)), None))

    for dt, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        es = torch.tensor([], dtype=dt).element_size()
        a, b = rand((R, H), dt), rand((R, H), dt)
        o = torch.empty_like(a)
        cases.append(("add", [R, H], name, 3 * n * es, 0,
                      (lambda a=a, b=b, o=o: torch.add(a, b, out=o)), lambda a=a, b=b: a + b))
        cases.append(("mul", [R, H], name, 3 * n * es, 0,
                      (lambda a=a, b=b, o=o: torch.mul(a, b, out=o)), lambda a=a, b=b: a * b))
        cases.append(("silu", [R, H], name, 2 * n * es, 0, (lambda a=a: F.silu(a)),
                      lambda a=a: F.silu(a)))
        cases.append(("act_mul_silu", [R, H], name, 3 * n * es, 0,
                      (lambda a=a, b=b: F.silu(a) * b), lambda a=a, b=b: F.silu(a) * b))
    xb = rand((R, H), torch.bfloat16)
    xf = rand((R, H), torch.float32)
    cases.append(("cast_bf16_to_f32", [R, H], "bf16", n * 6, 0, lambda: xb.to(torch.float32),
                  lambda: xb.to(torch.float32)))
    cases.append(("cast_f32_to_bf16", [R, H], "f32", n * 6, 0, lambda: xf.to(torch.bfloat16),
                  lambda: xf.to(torch.bfloat16)))

    for dt, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        es = torch.tensor([], dtype=dt).element_size()
        x, w = rand((R, H), dt), rand((H,), dt)
        cases.append(("rms_norm", [R, H], name, 2 * n * es + H * es, 0,
                      (lambda x=x, w=w: hf_rms_norm(x, w)), lambda x=x, w=w: hf_rms_norm(x, w)))

    B, S, Hh, D = (1, 16, 4, 32) if tiny else ((2 if quick else 8), 4096, 32, 128)
    x = rand((B, S, Hh, D), torch.bfloat16)
    cos, sin = rand((1, S, D), torch.float32), rand((1, S, D), torch.float32)
    cases.append(("rotary", [B, S, Hh, D], "bf16", 2 * B * S * Hh * D * 2 + 2 * S * D * 4, 0,
                  lambda: hf_rotary(x, cos, sin), lambda: hf_rotary(x, cos, sin)))

    attn = [(1, 16, 4, 2, 32)] if tiny else [(1, 1024 if quick else 2048, 32, 8, 128), (4, 1024, 16, 16, 64)]
    for (B, S, Hq, Hkv, D) in attn:
        q = rand((B, S, Hq, D), torch.bfloat16)
        k, v = rand((B, S, Hkv, D), torch.bfloat16), rand((B, S, Hkv, D), torch.bfloat16)
        mask = torch.full((S, S), float("-inf"), device=DEV, dtype=torch.bfloat16).triu(1)
        flops = 4.0 * B * Hq * S * S * D
        cases.append(("attention_causal", [B, S, Hq, Hkv, D], "bf16", 0, flops,
                      (lambda q=q, k=k, v=v, m=mask: hf_eager_attention(q, k, v, m)),
                      lambda q=q, k=k, v=v, m=mask: hf_eager_attention(q, k, v, m)))
        if DEV.type == "cuda":
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            cases.append(("attention_causal_sdpa", [B, S, Hq, Hkv, D], "bf16", 0, flops,
                          (lambda qt=qt, kt=kt, vt=vt: F.scaled_dot_product_attention(
                              qt, kt, vt, is_causal=True, enable_gqa=True)), None))

    ce = [(16, 1000)] if tiny else [(1024 if quick else 4096, 151936), (8192, 32000)]
    for (N, V) in ce:
        logits = rand((N, V), torch.bfloat16).requires_grad_(True)
        labels = torch.randint(0, V, (N,), device=DEV)
        lb = N * V * 2
        cases.append(("cross_entropy", [N, V], "bf16", lb, 0,
                      (lambda lg=logits, lb_=labels: hf_loss(lg.detach(), lb_)),
                      lambda lg=logits, lb_=labels: hf_loss(lg.detach(), lb_)))
        loss = hf_loss(logits, labels)
        cases.append(("cross_entropy_backward", [N, V], "bf16", 2 * lb, 0,
                      (lambda loss=loss, lg=logits: torch.autograd.grad(loss, lg, retain_graph=True)),
                      None))
    return cases


def main():
    global ARGS, DEV
    ARGS = parse_args()
    DEV = torch.device(ARGS.device)
    if DEV.type == "cuda" and not torch.cuda.is_available():
        print("torch_ops: CUDA is not available to torch", file=sys.stderr)
        return 1
    out = {
        "tool": "torch_ops",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if DEV.type == "cuda" else "cpu",
        "method": "median of per-launch torch.cuda.Event times after 3 warm-ups; random inputs",
        "results": [],
    }
    cases = make_cases(ARGS.quick, ARGS.tiny)
    copy_gbps = 0.0
    compile_spent = 0.0
    print(f"{'op':24s} {'shape':28s} {'dtype':5s} {'mode':8s} {'ms':>10s} {'GB/s':>10s} {'TFLOP/s':>10s}")
    for (op, shape, dtype, nbytes, flops, fn, compilable) in cases:
        if ARGS.filter and ARGS.filter not in op and op != "copy":
            continue
        modes = [("eager", fn)]
        if compilable is not None and not ARGS.no_compile:
            modes.append(("compile", compilable))
        for mode, f in modes:
            rec = {"op": op, "shape": shape, "dtype": dtype, "mode": mode}
            try:
                if mode == "compile":
                    if compile_spent > ARGS.compile_budget:
                        rec["skipped"] = f"compile budget of {ARGS.compile_budget:.0f} s spent"
                        out["results"].append(rec)
                        continue
                    t0 = time.time()
                    f = torch.compile(f, dynamic=False)
                    f()
                    sync()
                    compile_spent += time.time() - t0
                ms = time_ms(f, ARGS.quick)
                rec["ms"] = ms
                gbps = nbytes / (ms * 1e-3) / 1e9 if nbytes else 0.0
                tflops = flops / (ms * 1e-3) / 1e12 if flops else 0.0
                if nbytes:
                    rec["bytes"] = nbytes
                    rec["gbps"] = gbps
                    if op == "copy":
                        copy_gbps = gbps
                    if copy_gbps:
                        rec["pct_of_copy"] = 100.0 * gbps / copy_gbps
                if flops:
                    rec["flops"] = flops
                    rec["tflops"] = tflops
                print(f"{op:24s} {str(shape):28s} {dtype:5s} {mode:8s} {ms:10.4f} {gbps:10.1f} {tflops:10.1f}",
                      flush=True)
            except Exception as e:  # a failing peer must not stop the others
                rec["error"] = f"{type(e).__name__}: {e}"
                print(f"{op:24s} {str(shape):28s} {dtype:5s} {mode:8s} FAILED: {rec['error']}", flush=True)
            out["results"].append(rec)
    out["copy_gbps"] = copy_gbps
    with open(ARGS.out, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"wrote {ARGS.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
