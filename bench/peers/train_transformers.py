#!/usr/bin/env python3
"""bench/peers/train_transformers.py — the Transformers side of bench/training/bench_train.cc:
training steps of the same checkpoint (Qwen3-0.6B shape, random init, bf16, tied embeddings;
tools/fixtures/make_model_fixtures.py --qwen3-0.6b DIR writes it), batch 4 x 2048 random tokens,
AdamW (torch's fused AdamW, what Trainer's default optim adamw_torch_fused builds), lr 1e-5,
clip_grad_norm_ 1.0, no gradient checkpointing, attention "sdpa", timed the same way (device
synchronised after each step, median of the steps after the warm-up).

The step is Trainer.training_step written out (model(input_ids, labels, num_items_in_batch),
loss.backward(), clip, optimizer.step(), zero_grad()): no `accelerate` needed. Modes, each in its
own process (Liger patches Transformers' classes globally):
  eager           Transformers as loaded (SDPA attention)
  compile         + torch.compile(model) (what TrainingArguments(torch_compile=True) does)
  liger           + liger_kernel.transformers.apply_liger_kernel_to_qwen3 (Liger's defaults: rope,
                  rms_norm, swiglu, fused_linear_cross_entropy), as use_liger_kernel=True applies it
  liger-compile   liger + torch.compile
A mode whose package is missing (liger-kernel, a working Triton for compile) is recorded with the
reason instead of failing the run; liger-kernel (pure Python + Triton, version 0.8.5 was current
when this was written) is installed with `pip install --no-deps liger_kernel-*.whl`.
MFU uses the same FLOPs/token formula as the C++ benchmark (6·N + 12·L·Hq·D·S, N = matmul
weights incl. lm_head) and the same peak (989.4 TFLOP/s unless --peak-tflops). Peak memory =
torch.cuda.max_memory_allocated / max_memory_reserved over the run (weights included).

Usage: python3 bench/peers/train_transformers.py --model DIR [--modes eager,compile,liger]
           [--batch 4] [--seq 2048] [--steps 10] [--warmup 3] [--out FILE.json]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def flops_per_token(cfg, seq):
    h = cfg.hidden_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    i = cfg.intermediate_size
    layers = cfg.num_hidden_layers
    n = layers * (h * q + 2 * h * kv + q * h + 3 * h * i) + cfg.vocab_size * h
    return 6 * n + 12 * layers * q * seq


def run_mode(a):
    import torch
    from transformers import AutoModelForCausalLM

    result = {"mode": a.mode, "torch": torch.__version__}
    liger = a.mode.startswith("liger")
    if liger:
        try:
            import liger_kernel
            from liger_kernel.transformers import apply_liger_kernel_to_qwen3
        except ImportError as e:
            return {**result, "skipped": f"liger-kernel is not installed ({e})"}
        result["liger_kernel"] = getattr(liger_kernel, "__version__", "unknown")
        apply_liger_kernel_to_qwen3()  # Liger's defaults, before the model is built
    import transformers
    result["transformers"] = transformers.__version__
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").to(a.device)
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model.train()
    cfg = model.config
    decay = [p for n, p in model.named_parameters()
             if not any(k in n.lower() for k in ("bias", "norm"))]
    no_decay = [p for n, p in model.named_parameters()
                if any(k in n.lower() for k in ("bias", "norm"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-5, fused=True)
    step_model = torch.compile(model) if a.mode.endswith("compile") else model
    g = torch.Generator().manual_seed(1234)
    batches = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g).to(a.device)
               for _ in range(a.warmup + a.steps)]
    num_items = torch.tensor(a.batch * (a.seq - 1), device=a.device)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for ids in batches:
        t0 = time.perf_counter()
        out = step_model(input_ids=ids, labels=ids, num_items_in_batch=num_items)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1000.0)
        losses.append(float(out.loss))
    ms = statistics.median(times[a.warmup:])
    tok_s = a.batch * a.seq / (ms / 1000.0)
    tflops = flops_per_token(cfg, a.seq) * tok_s / 1e12
    return {**result, "step_ms": times, "step_ms_median": ms, "tokens_per_s": tok_s,
            "model_tflops": tflops, "mfu": tflops / a.peak_tflops,
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
            "loss_first": losses[0], "loss_last": losses[-1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--modes", default="eager,compile,liger,liger-compile")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # one mode, in a child process
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mode")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.mode:
        print(json.dumps(run_mode(a)))
        return
    results = []
    for mode in a.modes.split(","):
        cmd = [sys.executable, __file__, "--mode", mode, "--model", a.model, "--device", a.device,
               "--batch", str(a.batch),
               "--seq", str(a.seq), "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--peak-tflops", str(a.peak_tflops)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
            r = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                "mode": mode, "error": (p.stderr or p.stdout).strip()[-2000:]}
        except subprocess.TimeoutExpired:
            r = {"mode": mode, "error": f"timed out after {a.timeout} s"}
        results.append(r)
        if "tokens_per_s" in r:
            print(f"transformers {mode:14s} {r['step_ms_median']:7.1f} ms/step  "
                  f"{r['tokens_per_s']:8.0f} tok/s  {r['model_tflops']:6.1f} TFLOP/s  "
                  f"MFU {100 * r['mfu']:5.1f}%  peak {r['peak_allocated_gib']:.2f} GiB allocated / "
                  f"{r['peak_reserved_gib']:.2f} GiB reserved", flush=True)
        else:
            print(f"transformers {mode:14s} {r.get('skipped') or r.get('error', '')[-300:]}", flush=True)
    doc = {"runtime": "transformers", "model": a.model, "batch": a.batch, "seq": a.seq,
           "steps": a.steps, "warmup": a.warmup, "attn_implementation": "sdpa",
           "peak_tflops": a.peak_tflops, "results": results}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    else:
        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
