"""Transformers side of the generation benchmark (bench/generation/bench_generate.cc).

Same shapes and method: prefill = one forward of [batch, len] random ids with logits_to_keep=1
(median of 3 after a warm-up); decode, for every batch x context P+N = greedy `generate` of
`batch` random P-token prompts (no padding) for N new tokens with no stop id, decode tok/s =
(N - 1) x batch / (generate time - prefill time of those prompts), median of `reps` after one
warm-up. Modes: "sdpa" (the default dynamic cache, attn_implementation=sdpa), and with --compile
"static+compile" (cache_implementation="static" and model.forward through
torch.compile(mode="reduce-overhead"), compile time excluded by the warm-up) for the batches in
--compile-batches. Transformers decode is host-bound (a few ms of Python and launches per step),
so fewer new tokens (--decode-tokens) give the same rate at lower cost; the JSON records N.
Usage:
  python3 bench/peers/generate_transformers.py --model DIR [--prefill 8x2048]
      [--batches 1,8,32,64] [--contexts 16+128,2048+128] [--decode-tokens N] [--reps 1]
      [--compile] [--compile-batches 1] [--attn sdpa] [--out FILE.json]
"""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t) * 1000.0


def ints(text):
    return [int(x) for x in text.split(",") if x]


def decode_rate(model, prompt, new_tokens, reps, **extra):
    gen_kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                      eos_token_id=None, pad_token_id=0, **extra)
    mask = torch.ones_like(prompt)
    rates = []
    for rep in range(reps + 1):
        first = timed(lambda: model(prompt, attention_mask=mask, logits_to_keep=1))
        total = timed(lambda: model.generate(prompt, attention_mask=mask, **gen_kwargs))
        if rep > 0:
            rates.append((new_tokens - 1) * prompt.shape[0] / ((total - first) / 1000.0))
    return sorted(rates)[len(rates) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefill", default="8x2048")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--contexts", default="16+128,2048+128")
    ap.add_argument("--decode-tokens", type=int, default=0,
                    help="new tokens per decode run (0: the N of each context)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-batches", default="1")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = a.device
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation=a.attn).to(dev).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1234)
    pb, pl = (int(x) for x in a.prefill.split("x"))
    res = {"runtime": "transformers", "attn": a.attn, "torch": torch.__version__,
           "transformers": transformers.__version__, "decode": []}
    with torch.no_grad():
        ids = torch.randint(0, vocab, (pb, pl), generator=g).to(dev)
        pre = [timed(lambda: model(ids, logits_to_keep=1)) for _ in range(4)][1:]
        prefill_ms = sorted(pre)[len(pre) // 2]
        del ids
        res.update(prefill_batch=pb, prefill_len=pl, prefill_ms=prefill_ms,
                   prefill_tok_s=pb * pl / (prefill_ms / 1000.0))
        print(f"transformers ({a.attn}): prefill {pb}x{pl}: {prefill_ms:.1f} ms = "
              f"{res['prefill_tok_s']:.0f} tok/s", flush=True)
        for ctx in a.contexts.split(","):
            p, n = (int(x) for x in ctx.split("+"))
            n_run = a.decode_tokens or n
            for b in ints(a.batches):
                prompt = torch.randint(0, vocab, (b, p), generator=g).to(dev)
                rate = decode_rate(model, prompt, n_run, a.reps)
                res["decode"].append({"batch": b, "prompt_len": p, "new_tokens": n,
                                      "new_tokens_run": n_run, "mode": a.attn,
                                      "decode_tok_s": rate})
                print(f"transformers decode B={b} {p}+{n} ({n_run} run) {a.attn}: "
                      f"{rate:.1f} tok/s", flush=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if a.compile:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            for ctx in a.contexts.split(","):
                p, n = (int(x) for x in ctx.split("+"))
                n_run = a.decode_tokens or n
                for b in ints(a.compile_batches):
                    prompt = torch.randint(0, vocab, (b, p), generator=g).to(dev)
                    try:
                        rate = decode_rate(model, prompt, n_run, a.reps,
                                           cache_implementation="static")
                    except Exception as e:  # noqa: BLE001 — record why it did not run
                        res["decode"].append({"batch": b, "prompt_len": p, "new_tokens": n,
                                              "mode": "static+compile", "error": str(e)[:300]})
                        print(f"static+compile B={b} {p}+{n}: failed: {e}", flush=True)
                        continue
                    res["decode"].append({"batch": b, "prompt_len": p, "new_tokens": n,
                                          "new_tokens_run": n_run, "mode": "static+compile",
                                          "decode_tok_s": rate})
                    print(f"transformers decode B={b} {p}+{n} static+compile: {rate:.1f} tok/s",
                          flush=True)
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
