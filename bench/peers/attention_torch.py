#!/usr/bin/env python3
"""PyTorch side of hk_bench_attention: SDPA's flash and cuDNN backends on the same shapes.

Prefill (bf16, causal, head dim 128): B8xH16(kv8)xS2048, B2xH16xS8192, B1xH32(kv8)xS16384, the
training step's B4xH16(kv8)xS2048, and B8xH16(kv8)xS2048 at head dim 64; forward and forward+backward, each backend forced with torch.nn.attention.sdpa_kernel. Tensors are in
SDPA's native [B, H, S, D] layout. GQA goes through enable_gqa=True; a backend that refuses it gets
k/v repeated to the query heads beforehand (outside the timing; the JSON says so). Decode: batch 1,
16 q / 8 kv heads, one query over caches of 4096 and 32768 keys, per call in CUDA-graph replay
(20 calls per graph over rotated caches, as hk does). Timing as hk's: 3 warm-ups, each call between
torch.cuda.Event records, repetitions sized to ~300 ms, the median. TFLOP/s with causal FLOPs = half
of 4*B*H*S*T*D forward, 3.5x that for forward+backward. The SM clock right after each prefill
timing (sm_clock_mhz_after_*: clock64 over %globaltimer across a ~100 us spin, the probe
hk_bench_flash_kernels runs; null where the jiterator cannot build it): the long shapes run at the
GPU's power cap, where a figure follows the clock.

Usage: python3 bench/peers/attention_torch.py [--out attention-torch.json] [--quick] [--prefill-only]
"""
import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
QUICK = False


def warm_up_ms(fn):
    """3 warm-up calls, then one timed call: its milliseconds (sizes the repetitions)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); fn(); b.record(); b.synchronize()
    return max(a.elapsed_time(b), 1e-3)


def time_ms(fn):
    first = warm_up_ms(fn)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = int(min(max((60.0 if QUICK else 300.0) / first, 5), 50 if QUICK else 200))
    ts = []
    for _ in range(reps):
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


_CLOCK_PROBE_CODE = r'''
template <typename T> T sm_clock_probe(T x) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < 100000ull);
  const long long c1 = clock64();
  return x + T(double(c1 - c0) * 1000.0 / double(t1 - t0));
}
'''
_clock_probe = None


def sm_clock_mhz():
    """The SM clock now (MHz), measured on the device as hk's benchmark does; None if unavailable."""
    global _clock_probe
    if _clock_probe is False:
        return None
    try:
        if _clock_probe is None:  # built (NVRTC, ~1 s) by main's first call, before any timing
            _clock_probe = torch.cuda.jiterator._create_jit_fn(_CLOCK_PROBE_CODE)
        return round(float(_clock_probe(torch.zeros(1, device="cuda")).item()))
    except Exception:  # no NVRTC, or a jiterator that refuses inline PTX: report nothing
        _clock_probe = False
        return None


def sdpa_call(backend, q, k, v, causal):
    """A callable running SDPA on one backend, and whether k/v had to be repeated for GQA."""
    def run(kk, vv, gqa):
        with sdpa_kernel([BACKENDS[backend]]):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)
    gqa = k.shape[1] != q.shape[1]
    try:
        run(k, v, gqa)
        return (lambda: run(k, v, gqa)), False
    except RuntimeError:
        if not gqa:
            raise
        rep = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(rep, 1).contiguous(), v.repeat_interleave(rep, 1).contiguous()
        run(kr, vr, False)
        return (lambda: run(kr, vr, False)), True


def prefill(B, Hq, Hkv, S, D=128):
    dev, dt = "cuda", torch.bfloat16
    flops = 0.5 * 4.0 * B * Hq * S * S * D
    rows = []
    for backend in BACKENDS:
        q = torch.rand(B, Hq, S, D, device=dev, dtype=dt) * 2 - 1
        k = torch.rand(B, Hkv, S, D, device=dev, dtype=dt) * 2 - 1
        v = torch.rand(B, Hkv, S, D, device=dev, dtype=dt) * 2 - 1
        name = f"B{B}xH{Hq}(kv{Hkv})xS{S}" + ("" if D == 128 else f" D{D}")
        row = {"backend": backend, "shape": name, "B": B, "Hq": Hq,
               "Hkv": Hkv, "S": S, "D": D}
        try:
            fwd, repeated = sdpa_call(backend, q, k, v, True)
            row["kv_repeated_for_gqa"] = repeated
            t = time_ms(fwd)
            row.update(fwd_ms=t, fwd_tflops=flops / (t * 1e-3) / 1e12,
                       sm_clock_mhz_after_fwd=sm_clock_mhz())
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            fb_call, _ = sdpa_call(backend, qg, kg, vg, True)
            dout = torch.rand_like(q) * 2 - 1

            def fwd_bwd():
                out = fb_call()
                out.backward(dout)
                qg.grad = kg.grad = vg.grad = None
            t = time_ms(fwd_bwd)
            row.update(fwdbwd_ms=t, fwdbwd_tflops=3.5 * flops / (t * 1e-3) / 1e12,
                       sm_clock_mhz_after_fwdbwd=sm_clock_mhz())
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0][:200]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def decode(T, Hq=16, Hkv=8, D=128):
    dev, dt = "cuda", torch.bfloat16
    kv_bytes = 2.0 * T * Hkv * D * 2
    copies = max(2, math.ceil(256e6 / kv_bytes))
    rows = []
    for backend in BACKENDS:
        row = {"backend": backend, "T": T, "Hq": Hq, "Hkv": Hkv, "D": D, "kv_bytes": kv_bytes}
        try:
            q = torch.rand(1, Hq, 1, D, device=dev, dtype=dt)
            ks = [torch.rand(1, Hkv, T, D, device=dev, dtype=dt) for _ in range(copies)]
            vs = [torch.rand(1, Hkv, T, D, device=dev, dtype=dt) for _ in range(copies)]
            calls = [sdpa_call(backend, q, ks[i], vs[i], False) for i in range(copies)]
            row["kv_repeated_for_gqa"] = calls[0][1]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for c, _ in calls:
                    c()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(20):
                    calls[i % copies][0]()
            t = time_ms(g.replay) / 20
            row.update(graph_us=t * 1e3, gbps=kv_bytes / (t * 1e-3) / 1e9)
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0][:200]
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def main():
    global QUICK
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="attention-torch.json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--prefill-only", action="store_true", help="skip the decode shapes")
    p.add_argument("--decode-only", action="store_true", help="skip the prefill shapes")
    args = p.parse_args()
    QUICK = args.quick
    result = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name(0), "prefill": [], "decode": [],
              "sm_clock_mhz_idle": sm_clock_mhz()}
    # issue 11's shapes, then the training step's (Qwen3-0.6B, 4 x 2048) and head dim 64
    for B, Hq, Hkv, S, D in [(8, 16, 8, 2048, 128), (2, 16, 16, 8192, 128), (1, 32, 8, 16384, 128),
                             (4, 16, 8, 2048, 128), (8, 16, 8, 2048, 64)]:
        if not args.decode_only:
            result["prefill"] += prefill(B, Hq, Hkv, S, D)
    if not args.prefill_only:
        for T in (4096, 32768):
            result["decode"] += decode(T)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
