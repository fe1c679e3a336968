#!/usr/bin/env python3
"""hk's flash attention and PyTorch SDPA (cuDNN) timed alternately in one process, issue 11's shapes.

Why: the long shapes run at the H200's 700 W power cap, where a timing follows the clock the power
manager settles on in that second; hk_bench_flash_kernels and attention_torch.py, run one after
the other, saw the peer's figures move up to 18 % between device calls. Here both sides run in the
same process and alternate (rounds in the order hk, peer, then peer, hk, ...), so each ratio is
taken between neighbouring timings at the same clocks, and the spread over rounds shows how much
is left to noise.

hk: libhk_bench_flash_peer.so (bench/attention/flash_peer_abi.cc) through ctypes — the dispatcher's
forward (with lse) and backward (flash.h) on contiguous [B, S, H, D] tensors, on torch's current
stream, workspace allocated once beforehand. PyTorch: F.scaled_dot_product_attention forced onto a
backend (cuDNN by default) in SDPA's native [B, H, S, D] layout, forward alone (inputs without grad) and
forward+backward through autograd, as bench/peers/attention_torch.py calls it. Timing: the GPU
kept busy — after 3 warm-ups, windows of back-to-back calls (~4 ms of work each, behind one call
that is not counted) between two CUDA events, the window's time over its calls, windows repeated
to ~300 ms (~60 ms with --quick), the median. Timed a call at a time (as attention_torch.py and
hk_bench_flash_kernels do), each call also carries the host's time to issue it — Python and
ctypes here, tens of microseconds, up to 7 % of a 0.3 ms forward, and not the same for both
sides — which windows hide as they would in a training step's stream. bf16, causal, head dim 128;
TFLOP/s with causal FLOPs = half of 4*B*H*S*T*D forward, 3.5x that for forward+backward. The SM
clock is probed after every timing (attention_torch's probe).

--hk-variant LABEL:NAME=VALUE[,NAME=VALUE...] (repeatable) adds a side "hk_LABEL": hk's dispatcher
with those environment variables set while it is timed (the flash kernels read their HK_FLASH_*
switches at each call), so kernel forms are compared beside each other and beside the peer at the
same clocks; each round alternates every side (hk, the variants, the peer, then the reverse).

Usage: python3 bench/peers/attention_interleaved.py --lib build/bench/attention/libhk_bench_flash_peer.so
         [--out attention-interleaved.json] [--quick] [--rounds N] [--backend cudnn|flash]
         [--training-shape] [--hk-variant LABEL:NAME=VALUE[,NAME=VALUE...]]... [--seqlen S]...

--seqlen S (repeatable) keeps only the shapes of that sequence length, so an A/B of several variants
at the one shape it concerns fits a device call.
"""
import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_torch  # noqa: E402  (its timing, backends and clock probe)

SHAPES = [(8, 16, 8, 2048), (2, 16, 16, 8192), (1, 32, 8, 16384)]  # B, Hq, Hkv, S (issue 11)
TRAINING_SHAPE = (4, 16, 8, 2048)  # the training step's (Qwen3-0.6B, 4 x 2048)


class HkFlash:
    """hk's forward and backward at one shape, through the C interface."""

    def __init__(self, lib, B, Hq, Hkv, S, D, dtype):
        self.lib, self.dims = lib, (B, S, S, Hq, Hkv, D, 1 if dtype == torch.float16 else 0, 1)
        dev = "cuda"
        self.q = torch.rand(B, S, Hq, D, device=dev, dtype=dtype) * 2 - 1
        self.k = torch.rand(B, S, Hkv, D, device=dev, dtype=dtype) * 2 - 1
        self.v = torch.rand(B, S, Hkv, D, device=dev, dtype=dtype) * 2 - 1
        self.dout = torch.rand_like(self.q) * 2 - 1
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(B, Hq, S, device=dev, dtype=torch.float32)
        self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (self.q, self.k, self.v))
        ws = lib.hkb_flash_backward_workspace(*self.dims)
        self.ws = torch.empty(max(ws, 1), device=dev, dtype=torch.uint8)
        self.ws_bytes = ws

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"hk {what}: {self.lib.hkb_flash_last_error().decode()}")

    def forward(self):
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.lib.hkb_flash_forward(
            self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.out.data_ptr(),
            self.lse.data_ptr(), *self.dims, s), "forward")

    def backward(self):
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.lib.hkb_flash_backward(
            self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.out.data_ptr(),
            self.lse.data_ptr(), self.dout.data_ptr(), self.dq.data_ptr(), self.dk.data_ptr(),
            self.dv.data_ptr(), self.ws.data_ptr(), ctypes.c_size_t(self.ws_bytes), *self.dims, s),
            "backward")

    def forward_backward(self):
        self.forward()
        self.backward()


def time_saturated_ms(fn):
    """Milliseconds a call with the GPU kept busy: the median over windows of back-to-back calls."""
    first = attention_torch.warm_up_ms(fn)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = int(min(max(4.0 / first, 2), 200))
    windows = int(min(max((60.0 if attention_torch.QUICK else 300.0) / (first * calls), 3), 50))
    ts = []
    for _ in range(windows):
        fn()  # queued ahead, so the window starts with the GPU already busy
        a.record()
        for _ in range(calls):
            fn()
        b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / calls)
    return statistics.median(ts)


def load_lib(path):
    lib = ctypes.CDLL(path)
    ints = [ctypes.c_int] * 8  # b, s, t, hq, hkv, d, f16, causal
    p = ctypes.c_void_p
    lib.hkb_flash_last_error.restype = ctypes.c_char_p
    lib.hkb_flash_forward.argtypes = [p] * 5 + ints + [p]
    lib.hkb_flash_forward.restype = ctypes.c_int
    lib.hkb_flash_backward_workspace.argtypes = ints
    lib.hkb_flash_backward_workspace.restype = ctypes.c_size_t
    lib.hkb_flash_backward.argtypes = [p] * 10 + [ctypes.c_size_t] + ints + [p]
    lib.hkb_flash_backward.restype = ctypes.c_int
    return lib


def peer_calls(backend, B, Hq, Hkv, S, D, dtype):
    """SDPA's forward and forward+backward callables, as attention_torch.py times them."""
    dev = "cuda"
    q = torch.rand(B, Hq, S, D, device=dev, dtype=dtype) * 2 - 1
    k = torch.rand(B, Hkv, S, D, device=dev, dtype=dtype) * 2 - 1
    v = torch.rand(B, Hkv, S, D, device=dev, dtype=dtype) * 2 - 1
    fwd, repeated = attention_torch.sdpa_call(backend, q, k, v, True)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    fb_call, _ = attention_torch.sdpa_call(backend, qg, kg, vg, True)
    dout = torch.rand_like(q) * 2 - 1

    def fwd_bwd():
        out = fb_call()
        out.backward(dout)
        qg.grad = kg.grad = vg.grad = None
    return fwd, fwd_bwd, repeated


def parse_variant(text):
    """'LABEL:NAME=VALUE,NAME=VALUE' -> (LABEL, {NAME: VALUE}); a bad form is refused."""
    label, sep, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if "=" in a)
    if not sep or not label.isidentifier() or not env or len(env) != len(assignments.split(",")):
        raise ValueError(f"--hk-variant {text!r}: expected LABEL:NAME=VALUE[,NAME=VALUE...]")
    return label, env


def ratio_key(side, pass_name):
    """The key of a side's ratio to the peer: the default side keeps the records' unprefixed key."""
    return f"{pass_name}_ratio" if side == "hk" else f"{side}_{pass_name}_ratio"


def hk_side_names(variants):
    return ["hk"] + ["hk_" + label for label, _ in variants]


@contextlib.contextmanager
def environment(env):
    """The variables of `env` set (os.environ, so the library's getenv sees them), then restored."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shape_rows(lib, backend, rounds, B, Hq, Hkv, S, variants=(), D=128, dtype=torch.bfloat16):
    flops = 0.5 * 4.0 * B * Hq * S * S * D
    hk = HkFlash(lib, B, Hq, Hkv, S, D, dtype)
    peer_fwd, peer_fb, repeated = peer_calls(backend, B, Hq, Hkv, S, D, dtype)
    sides = {"hk": {"fwd": hk.forward, "fwdbwd": hk.forward_backward},
             backend: {"fwd": peer_fwd, "fwdbwd": peer_fb}}
    envs = {"hk": {}, backend: {}}
    for label, env in variants:
        sides["hk_" + label], envs["hk_" + label] = sides["hk"], env
    hk_sides = hk_side_names(variants)
    row = {"shape": f"B{B}xH{Hq}(kv{Hkv})xS{S}", "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D,
           "peer": backend, "kv_repeated_for_gqa": repeated, "rounds": []}
    for r in range(rounds):
        order = hk_sides + [backend] if r % 2 == 0 else [backend] + hk_sides[::-1]
        entry = {"order": order}
        for pass_name, mult in (("fwd", 1.0), ("fwdbwd", 3.5)):
            for side in order:
                with environment(envs[side]):
                    t = time_saturated_ms(sides[side][pass_name])
                entry[f"{side}_{pass_name}_ms"] = t
                entry[f"{side}_{pass_name}_tflops"] = mult * flops / (t * 1e-3) / 1e12
                entry[f"{side}_{pass_name}_sm_clock_mhz"] = attention_torch.sm_clock_mhz()
            for side in hk_sides:
                entry[ratio_key(side, pass_name)] = (entry[f"{backend}_{pass_name}_ms"] /
                                                     entry[f"{side}_{pass_name}_ms"])
        row["rounds"].append(entry)
        print(json.dumps({"shape": row["shape"], "round": r, **entry}), flush=True)
    for pass_name in ("fwd", "fwdbwd"):
        for side in hk_sides + [backend]:
            row[f"{side}_{pass_name}_tflops_median"] = statistics.median(
                e[f"{side}_{pass_name}_tflops"] for e in row["rounds"])
        for side in hk_sides:
            key = ratio_key(side, pass_name)
            ratios = [e[key] for e in row["rounds"]]
            row[f"{key}_median"] = statistics.median(ratios)
            row[f"{key}_min"], row[f"{key}_max"] = min(ratios), max(ratios)
    del hk
    torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="path of libhk_bench_flash_peer.so")
    p.add_argument("--out", default="attention-interleaved.json")
    p.add_argument("--quick", action="store_true", help="~60 ms a timing instead of ~300")
    p.add_argument("--rounds", type=int, default=4, help="alternations per shape (default 4)")
    p.add_argument("--backend", default="cudnn", choices=sorted(attention_torch.BACKENDS))
    p.add_argument("--training-shape", action="store_true",
                   help="also the training step's B4xH16(kv8)xS2048")
    p.add_argument("--hk-variant", action="append", default=[], metavar="LABEL:NAME=VALUE,...",
                   help="also hk with these environment variables set, as side hk_LABEL")
    p.add_argument("--seqlen", type=int, action="append", default=[], metavar="S",
                   help="only the shapes of this sequence length (repeatable; default all)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    try:
        variants = [parse_variant(v) for v in args.hk_variant]
    except ValueError as e:
        p.error(str(e))
    if len({label for label, _ in variants}) != len(variants):
        p.error("--hk-variant labels must differ")
    if not os.path.isfile(args.lib):
        p.error(f"{args.lib} does not exist: build the target hk_bench_flash_peer "
                "(cmake -DHK_BUILD_BENCHMARKS=ON, CUDA on)")
    attention_torch.QUICK = args.quick
    lib = load_lib(args.lib)
    result = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name(0), "peer": args.backend,
              "sm_clock_mhz_idle": attention_torch.sm_clock_mhz(),
              "hk_variants": {label: env for label, env in variants}, "shapes": []}
    shapes = SHAPES + ([TRAINING_SHAPE] if args.training_shape else [])
    if args.seqlen:
        shapes = [shape for shape in shapes if shape[3] in args.seqlen]
        if not shapes:
            p.error(f"--seqlen {args.seqlen}: no shape of that length (the shapes' S: "
                    f"{sorted({shape[3] for shape in SHAPES + [TRAINING_SHAPE]})})")
    for B, Hq, Hkv, S in shapes:
        result["shapes"].append(shape_rows(lib, args.backend, args.rounds, B, Hq, Hkv, S, variants))
    print(f"\nhk / {args.backend}, same process, alternating ({args.rounds} rounds; median "
          "[min, max] of the rounds' ratios)")
    for row in result["shapes"]:
        for side in hk_side_names(variants):
            line = f"{row['shape']:24s} {side:10s}"
            for pass_name, title in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
                key = ratio_key(side, pass_name)
                line += (f" {title} {row[key + '_median']:.3f} "
                         f"[{row[key + '_min']:.3f}, {row[key + '_max']:.3f}]  "
                         f"({side} {row[f'{side}_{pass_name}_tflops_median']:.0f} / "
                         f"{row[f'{args.backend}_{pass_name}_tflops_median']:.0f} TF/s) ")
            print(line.rstrip())
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
