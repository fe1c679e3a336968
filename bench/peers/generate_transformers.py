"""Transformers side of the generation benchmark (bench/generation/bench_generate.cc).

Same shapes and method: prefill = one forward of [batch, len] random ids with logits_to_keep=1
(median of 3 after a warm-up); decode = greedy `generate` of a batch-1 random prompt for N new
tokens with no stop id, decode tok/s = N / (generate time - prefill time of that prompt), median
of 3. Writes JSON with --out. Usage:
  python3 bench/peers/generate_transformers.py --model DIR [--prefill-batch 8] [--prefill-len 2048]
      [--decode-tokens 128] [--prompt-len 16] [--attn eager|sdpa] [--out FILE.json]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefill-batch", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--out")
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation=a.attn).cuda().eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (a.prefill_batch, a.prefill_len), generator=g).cuda()
    with torch.no_grad():
        pre = [timed(lambda: model(ids, logits_to_keep=1)) for _ in range(4)][1:]
        prefill_ms = sorted(pre)[len(pre) // 2]
        prompt = torch.randint(0, vocab, (1, a.prompt_len), generator=g).cuda()
        gen_kwargs = dict(max_new_tokens=a.decode_tokens, min_new_tokens=a.decode_tokens,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
        rates = []
        for rep in range(4):
            first = timed(lambda: model(prompt, logits_to_keep=1))
            total = timed(lambda: model.generate(prompt, **gen_kwargs))
            if rep > 0:
                rates.append((a.decode_tokens - 1) / ((total - first) / 1000.0))
        decode = sorted(rates)[len(rates) // 2]
    res = {"runtime": "transformers", "attn": a.attn, "torch": torch.__version__,
           "prefill_batch": a.prefill_batch, "prefill_len": a.prefill_len, "prefill_ms": prefill_ms,
           "prefill_tok_s": a.prefill_batch * a.prefill_len / (prefill_ms / 1000.0),
           "decode_tokens": a.decode_tokens, "decode_tok_s": decode}
    print(f"transformers ({a.attn}): prefill {a.prefill_batch}x{a.prefill_len}: {prefill_ms:.1f} ms "
          f"= {res['prefill_tok_s']:.0f} tok/s; decode batch 1: {decode:.1f} tok/s")
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
