#!/usr/bin/env python3
"""bench/peers/liger_torch.py — PyTorch eager and torch.compile at the shapes of
bench/kernels/liger_bench (Qwen3-0.6B training, bf16: 16384 tokens, hidden 1024, intermediate
3072, vocab 151936, 16 q / 8 kv heads of 128; linear + cross-entropy at 8192 tokens), timed the
same way: CUDA events around each call, warm-up first, median of the repeats, inputs rotated among
several buffer sets, bytes counted as in the C++ benchmark, the device copy bandwidth measured in
the same run. Peak memory of linear + cross-entropy is torch.cuda.max_memory_allocated above what
the inputs, weight and their gradients already hold.

Usage: python3 bench/peers/liger_torch.py [--out FILE.json] [--quick] [--no-compile]
Writes one JSON document (stdout, or --out). A variant that fails (e.g. torch.compile without a
working Triton) is recorded with its error instead of stopping the run.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def time_ms(fn, warm=3, reps=20):
    for i in range(warm):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(warm + i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def graph_ms(fn, per_graph=20, reps=20):
    """Median ms of one fn(i), as replays of a CUDA graph holding fn(0..per_graph-1) — the
    launch gaps (and Python/autograd overhead) removed, as bench/kernels/liger_bench's [graph]
    rows do for hk."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(per_graph):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        g.replay()
        ends[i].record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / per_graph
    del g
    return ms


RESULTS = []
COPY_GBS = [0.0]


def report(name, ms, nbytes=0.0, flops=0.0, **extra):
    r = {"name": name, "ms": ms}
    line = f"{name:44s} {ms:9.3f} ms"
    if nbytes:
        gbs = nbytes / ms / 1e6
        r.update(bytes=nbytes, gbs=gbs, copy_fraction=gbs / COPY_GBS[0] if COPY_GBS[0] else None)
        line += f"  {gbs:7.0f} GB/s"
        if COPY_GBS[0]:
            line += f"  {100 * gbs / COPY_GBS[0]:5.1f}% of copy"
    if flops:
        r["tflops"] = flops / ms / 1e9
        line += f"  {flops / ms / 1e9:6.0f} TFLOP/s"
    r.update(extra)
    for k, v in extra.items():
        line += f"  {k}={v}"
    print(line, file=sys.stderr)
    RESULTS.append(r)


def attempt(name, thunk):
    try:
        thunk()
    except Exception as e:  # keep going: one failing variant must not lose the others
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"{name:44s} FAILED {msg}", file=sys.stderr)
        RESULTS.append({"name": name, "error": msg})


def variants(fn, compile_too):
    out = [("eager", fn)]
    if compile_too:
        out.append(("compile", torch.compile(fn)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bf = torch.bfloat16
    T = 1638 if args.quick else 16384
    H, I, V, HQ, HKV, D = 1024, 3072, 151936, 16, 8, 128
    TF = 1024 if args.quick else 8192
    B, S = 4, T // 4
    comp = not args.no_compile
    torch.manual_seed(0)

    # copy bandwidth (bytes read + written)
    a = torch.empty(2 << 30, dtype=torch.uint8, device=dev).fill_(1)
    b = torch.empty_like(a)
    ms = time_ms(lambda i: b.copy_(a))
    COPY_GBS[0] = 2 * a.numel() / ms / 1e6
    report("copy_d2d_2GiB", ms, 2.0 * a.numel())
    del a, b
    a = torch.empty(T * H * 2, dtype=torch.uint8, device=dev).fill_(1)
    b = torch.empty_like(a)
    report("copy_d2d_32MiB", time_ms(lambda i: b.copy_(a)), 2.0 * a.numel(), note="per call")
    attempt("copy_d2d_32MiB[graph]", lambda: report("copy_d2d_32MiB[graph]", graph_ms(lambda i: b.copy_(a)), 2.0 * a.numel()))
    del a, b

    # RMSNorm: torch.nn.RMSNorm, and the Transformers (Qwen3RMSNorm) formula our kernel implements
    sets = 4
    xs = [torch.randn(T, H, device=dev, dtype=bf) * 2 for _ in range(sets)]
    dys = [torch.randn(T, H, device=dev, dtype=bf) for _ in range(sets)]
    norm = torch.nn.RMSNorm(H, eps=1e-6, device=dev, dtype=bf)
    w_hf = torch.nn.Parameter(torch.ones(H, device=dev, dtype=bf))

    def hf_rms(x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w_hf * h.to(x.dtype)

    fb = 2.0 * T * H * 2 + T * 4 + H * 2
    bb = 3.0 * T * H * 2 + T * 4 + H * 4
    for label, mod in (("torch.nn.RMSNorm", norm), ("hf_rmsnorm", hf_rms)):
        for mode, fn in variants(mod, comp):
            def fwd(i, fn=fn):
                with torch.no_grad():
                    fn(xs[i % sets])

            def fwd_bwd(i, fn=fn):
                x = xs[i % sets].detach().requires_grad_(True)
                fn(x).backward(dys[i % sets])

            attempt(f"rms_norm_fwd[{label},{mode}]",
                    lambda fwd=fwd, label=label, mode=mode: report(f"rms_norm_fwd[{label},{mode}]", time_ms(fwd), fb))
            attempt(f"rms_norm_fwd_bwd[{label},{mode}]",
                    lambda fb_=fwd_bwd, label=label, mode=mode: report(f"rms_norm_fwd_bwd[{label},{mode}]", time_ms(fb_), fb + bb))
            attempt(f"rms_norm_fwd[{label},{mode}][graph]",
                    lambda fwd=fwd, label=label, mode=mode: report(f"rms_norm_fwd[{label},{mode}][graph]", graph_ms(fwd), fb))
            attempt(f"rms_norm_fwd_bwd[{label},{mode}][graph]",
                    lambda fb_=fwd_bwd, label=label, mode=mode: report(f"rms_norm_fwd_bwd[{label},{mode}][graph]", graph_ms(fb_), fb + bb))
    del xs, dys

    # SwiGLU activation silu(g) * u
    sets = 2
    gs = [torch.randn(T, I, device=dev, dtype=bf) * 3 for _ in range(sets)]
    us = [torch.randn(T, I, device=dev, dtype=bf) for _ in range(sets)]
    ds = [torch.randn(T, I, device=dev, dtype=bf) for _ in range(sets)]

    def swiglu(g, u):
        return F.silu(g) * u

    for mode, fn in variants(swiglu, comp):
        def fwd(i, fn=fn):
            with torch.no_grad():
                fn(gs[i % sets], us[i % sets])

        def fwd_bwd(i, fn=fn):
            g = gs[i % sets].detach().requires_grad_(True)
            u = us[i % sets].detach().requires_grad_(True)
            fn(g, u).backward(ds[i % sets])

        attempt(f"swiglu_fwd[{mode}]", lambda fwd=fwd, mode=mode: report(f"swiglu_fwd[{mode}]", time_ms(fwd), 3.0 * T * I * 2))
        attempt(f"swiglu_fwd_bwd[{mode}]",
                lambda f=fwd_bwd, mode=mode: report(f"swiglu_fwd_bwd[{mode}]", time_ms(f), 8.0 * T * I * 2))
        attempt(f"swiglu_fwd_bwd[{mode}][graph]",
                lambda f=fwd_bwd, mode=mode: report(f"swiglu_fwd_bwd[{mode}][graph]", graph_ms(f), 8.0 * T * I * 2))
    del gs, us, ds

    # RoPE, Transformers layout: q [B, Hq, S, D], k [B, Hkv, S, D], cos/sin [1, S, D] unsqueezed
    sets = 3
    qs = [torch.randn(B, HQ, S, D, device=dev, dtype=bf) for _ in range(sets)]
    ks = [torch.randn(B, HKV, S, D, device=dev, dtype=bf) for _ in range(sets)]
    cos = torch.randn(1, S, D, device=dev, dtype=bf)
    sin = torch.randn(1, S, D, device=dev, dtype=bf)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(q, k):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    rb = 2.0 * T * (HQ + HKV) * D * 2 + 2.0 * S * D * 4
    for mode, fn in variants(rope, comp):
        def fwd(i, fn=fn):
            with torch.no_grad():
                fn(qs[i % sets], ks[i % sets])

        def fwd_bwd(i, fn=fn):
            q = qs[i % sets].detach().requires_grad_(True)
            k = ks[i % sets].detach().requires_grad_(True)
            qo, ko = fn(q, k)
            torch.autograd.backward([qo, ko], [qs[(i + 1) % sets], ks[(i + 1) % sets]])

        attempt(f"rope_qk_fwd[{mode}]", lambda fwd=fwd, mode=mode: report(f"rope_qk_fwd[{mode}]", time_ms(fwd), rb))
        attempt(f"rope_qk_fwd_bwd[{mode}]", lambda f=fwd_bwd, mode=mode: report(f"rope_qk_fwd_bwd[{mode}]", time_ms(f), 2 * rb))
        attempt(f"rope_qk_fwd_bwd[{mode}][graph]", lambda f=fwd_bwd, mode=mode: report(f"rope_qk_fwd_bwd[{mode}][graph]", graph_ms(f), 2 * rb))
    del qs, ks

    # cross-entropy on given logits [T, V] bf16 (and the Transformers float() upcast)
    logits = torch.randn(T, V, device=dev, dtype=bf) * 4
    labels = torch.randint(0, V, (T,), device=dev)
    labels[torch.rand(T, device=dev) < 0.05] = -100
    lb = 1.0 * T * V * 2

    def ce(x):
        return F.cross_entropy(x, labels, ignore_index=-100)

    def ce_up(x):
        return F.cross_entropy(x.float(), labels, ignore_index=-100)

    for label, f0 in (("bf16", ce), ("float_upcast", ce_up)):
        for mode, fn in variants(f0, comp):
            def fwd(i, fn=fn):
                with torch.no_grad():
                    fn(logits)

            def fwd_bwd(i, fn=fn):
                x = logits.detach().requires_grad_(True)
                fn(x).backward()

            attempt(f"cross_entropy_fwd[{label},{mode}]",
                    lambda fwd=fwd, label=label, mode=mode: report(f"cross_entropy_fwd[{label},{mode}]", time_ms(fwd, 2, 10), lb))
            attempt(f"cross_entropy_fwd_bwd[{label},{mode}]",
                    lambda f=fwd_bwd, label=label, mode=mode: report(f"cross_entropy_fwd_bwd[{label},{mode}]", time_ms(f, 2, 10), 3 * lb))
    del logits

    # linear + cross-entropy (logits materialised), fwd + bwd, peak memory
    x = (torch.randn(TF, H, device=dev, dtype=bf)).requires_grad_(True)
    w = (torch.randn(V, H, device=dev, dtype=bf) * 0.05).requires_grad_(True)
    lab = torch.randint(0, V, (TF,), device=dev)

    def lce(x, w):
        return F.cross_entropy((x @ w.t()).float(), lab)

    flops = 3 * 2.0 * TF * H * V
    for mode, fn in variants(lce, comp):
        def step(i, fn=fn):
            x.grad = None
            w.grad = None
            fn(x, w).backward()

        def run(fn=fn, step=step, mode=mode):
            step(0)  # allocate the grads once, so the baseline holds them
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step(1)
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - base
            report(f"linear_cross_entropy_fwd_bwd[{mode}]", time_ms(step, 2, 10), 0, flops,
                   extra_bytes=extra)

        attempt(f"linear_cross_entropy_fwd_bwd[{mode}]", run)

    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "copy_gbs": COPY_GBS[0], "tokens": T, "flce_tokens": TF, "results": RESULTS}
    text = json.dumps(doc, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
