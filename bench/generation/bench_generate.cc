// hk_bench_generate — prefill and decode throughput of a causal LM with hk's built-in ops.
//
//   hk_bench_generate --model DIR [--device cuda] [--dtype bf16] [--prefill-batch 8]
//                     [--prefill-len 2048] [--decode-tokens 128] [--prompt-len 16]
//                     [--use-kernels] [--out FILE.json]
// Prefill: one forward of [batch, len] random ids (logits for the last position only, as
// generate does), median of 3 after a warm-up, reported as tokens/s. Decode: `generate` of a
// batch-1 random prompt with greedy search and no stop id, `decode_tok_s` from its own timings
// (device-synchronised), median of 3. Mirrors bench/peers/generate_transformers.py, which runs
// the same shapes through Transformers. It is a benchmark: no pass/fail target is checked here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hk/kernelize.h"
#include "hk/models.h"
#include "hk/stream.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, device = "cuda", dtype = "bf16", out;
  int64_t prefill_batch = 8, prefill_len = 2048, decode_tokens = 128, prompt_len = 16;
  bool use_kernels = false;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model")) model_dir = next("--model");
    else if (!std::strcmp(argv[i], "--device")) device = next("--device");
    else if (!std::strcmp(argv[i], "--dtype")) dtype = next("--dtype");
    else if (!std::strcmp(argv[i], "--prefill-batch")) prefill_batch = std::stoll(next("--prefill-batch"));
    else if (!std::strcmp(argv[i], "--prefill-len")) prefill_len = std::stoll(next("--prefill-len"));
    else if (!std::strcmp(argv[i], "--decode-tokens")) decode_tokens = std::stoll(next("--decode-tokens"));
    else if (!std::strcmp(argv[i], "--prompt-len")) prompt_len = std::stoll(next("--prompt-len"));
    else if (!std::strcmp(argv[i], "--use-kernels")) use_kernels = true;
    else if (!std::strcmp(argv[i], "--out")) out = next("--out");
    else {
      std::fprintf(stderr, "unknown argument %s (see the header of bench_generate.cc)\n", argv[i]);
      return 2;
    }
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "usage: hk_bench_generate --model DIR [options]\n");
    return 2;
  }
  try {
    hk::LoadOptions load;
    load.device = device;
    load.dtype = hk::parse_dtype(dtype);
    const auto t0 = std::chrono::steady_clock::now();
    hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(model_dir, load);
    const double load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string kernel_summary = "built-in ops";
    if (use_kernels) {
      hk::KernelizeOptions ko;
      ko.device = model.device();
      ko.dtype = model.dtype();
      auto report = hk::kernelize(model.module(), hk::Mode::Inference, ko);
      kernel_summary = std::to_string(report.num_kernels()) + " of " +
                       std::to_string(report.layers.size()) + " layers on hub kernels";
    }
    const int64_t vocab = model.config().vocab_size;
    std::mt19937_64 rng(1234);
    std::uniform_int_distribution<int64_t> token(0, vocab - 1);

    // ---- prefill ----
    std::vector<int64_t> ids(static_cast<size_t>(prefill_batch * prefill_len));
    for (auto& t : ids) t = token(rng);
    hk::Tensor input = hk::Tensor::from_ints(ids, {prefill_batch, prefill_len}).to(model.device());
    hk::ForwardOptions fo;
    fo.logits_to_keep = 1;
    std::vector<double> prefill_ms;
    for (int rep = 0; rep < 4; ++rep) {
      hk::synchronize_device(model.device());
      const auto s = std::chrono::steady_clock::now();
      auto result = model.forward(input, fo);
      hk::synchronize_device(model.device());
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
      if (rep > 0) prefill_ms.push_back(ms);  // rep 0 warms up (allocator, cuBLASLt plans)
    }
    const double prefill_med = median(prefill_ms);
    const double prefill_tok_s = prefill_batch * prefill_len / (prefill_med / 1000.0);

    // ---- decode ----
    std::vector<int64_t> prompt(static_cast<size_t>(prompt_len));
    for (auto& t : prompt) t = token(rng);
    hk::GenerateOptions go;
    go.max_new_tokens = decode_tokens;
    go.eos_token_ids = std::vector<int64_t>{};  // never stop: fixed work
    std::vector<double> decode_tok_s;
    for (int rep = 0; rep < 4; ++rep) {
      auto result = model.generate(prompt, go);
      if (rep > 0) decode_tok_s.push_back(result.timings.decode_tok_s);
    }
    const double decode_med = median(decode_tok_s);

    std::printf("hk %s: load %.0f ms; prefill %lldx%lld: %.1f ms = %.0f tok/s; decode batch 1, %lld "
                "tokens: %.1f tok/s (%s)\n",
                model_dir.c_str(), load_ms, static_cast<long long>(prefill_batch),
                static_cast<long long>(prefill_len), prefill_med, prefill_tok_s,
                static_cast<long long>(decode_tokens), decode_med, kernel_summary.c_str());
    if (!out.empty()) {
      std::ofstream f(out);
      f << "{\"runtime\": \"hk\", \"model\": \"" << model_dir << "\", \"device\": \""
        << model.device().str() << "\", \"dtype\": \"" << dtype << "\", \"kernels\": \""
        << kernel_summary << "\", \"load_ms\": " << load_ms << ", \"prefill_batch\": "
        << prefill_batch << ", \"prefill_len\": " << prefill_len << ", \"prefill_ms\": "
        << prefill_med << ", \"prefill_tok_s\": " << prefill_tok_s
        << ", \"decode_tokens\": " << decode_tokens << ", \"decode_tok_s\": " << decode_med
        << "}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hk_bench_generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
