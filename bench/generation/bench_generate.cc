// hk_bench_generate — prefill and decode throughput of a causal LM, against the memory-bandwidth
// limit of decode.
//
//   hk_bench_generate --model DIR [--device cuda] [--dtype bf16] [--prefill 8x2048]
//                     [--batches 1,8,32,64] [--contexts 16+128,2048+128] [--modes graph,device]
//                     [--eager-batches 1,8] [--reps 3] [--attn sdpa] [--use-kernels]
//                     [--out FILE.json]
//
// Attention: --attn (default sdpa, as Transformers' default and its peer here: flash kernels for
// prefill and their split-KV form for decode). Prefill: one forward of [batch, len] random ids
// (logits for the last position only, as generate does), median of 3 after a warm-up, tokens/s.
// Decode, for every batch × context P+N: `generate` of `batch` random P-token prompts for N new
// tokens with greedy search and no stop id, decode tok/s = decode steps × batch / decode seconds
// from generate's own (device-synchronised) timings, median of `reps` after one warm-up call (which
// also captures the CUDA graph of that batch and cache bucket). Modes: `graph` (the default: the
// device step replayed as a CUDA graph), `device` (the same step launched eagerly,
// --no-cuda-graphs), for the batches in
// --eager-batches only.
//
// The bandwidth limit of a decode step: the bytes it must read — every weight once (the tied
// embedding counts once, read by lm_head; an untied input embedding reads B rows only, not
// counted) plus the keys and values of every cached position of every row and layer — over the
// device-to-device copy bandwidth measured here (a 1 GiB copy, read + write bytes, median of 5).
// A step at context c reads KV bytes 2·layers·kv_heads·head_dim·elem·B·c; the decode of P+N goes
// through contexts P..P+N-1, so its limit uses the mean P + (N-1)/2. Mirrors
// bench/peers/generate_transformers.py (same shapes through Transformers). It is a benchmark:
// no pass/fail target is checked here (bench/generation/compare_generate.py reports them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hk/kernelize.h"
#include "hk/models.h"
#include "hk/stream.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

std::vector<std::string> word_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Device-to-device copy bandwidth (bytes read + written per second).
double copy_bandwidth(hk::Device device) {
  if (!device.is_cuda()) return 0.0;
  const int64_t n = int64_t(1) << 29;  // 1 GiB of bf16
  hk::Tensor a = hk::Tensor::zeros({n}, hk::DType::BF16, device);
  hk::Tensor b = hk::Tensor::empty({n}, hk::DType::BF16, device);
  std::vector<double> ms;
  for (int rep = 0; rep < 6; ++rep) {
    hk::Event start, stop;
    start.record();
    b.copy_from(a);
    stop.record();
    const double t = hk::Event::elapsed_ms(start, stop);
    if (rep > 0) ms.push_back(t);
  }
  return 2.0 * double(n) * 2.0 / (median(ms) / 1000.0);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, device = "cuda", dtype = "bf16", out, prefill = "8x2048", attn = "sdpa";
  std::string batches = "1,8,32,64", contexts = "16+128,2048+128", modes = "graph,device",
              eager_batches = "1,8";
  int reps = 3;
  bool use_kernels = false;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model"))
      model_dir = next("--model");
    else if (!std::strcmp(argv[i], "--device"))
      device = next("--device");
    else if (!std::strcmp(argv[i], "--dtype"))
      dtype = next("--dtype");
    else if (!std::strcmp(argv[i], "--prefill"))
      prefill = next("--prefill");
    else if (!std::strcmp(argv[i], "--batches"))
      batches = next("--batches");
    else if (!std::strcmp(argv[i], "--contexts"))
      contexts = next("--contexts");
    else if (!std::strcmp(argv[i], "--modes"))
      modes = next("--modes");
    else if (!std::strcmp(argv[i], "--eager-batches"))
      eager_batches = next("--eager-batches");
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::stoi(next("--reps"));
    else if (!std::strcmp(argv[i], "--use-kernels"))
      use_kernels = true;
    else if (!std::strcmp(argv[i], "--attn"))
      attn = next("--attn");
    else if (!std::strcmp(argv[i], "--out"))
      out = next("--out");
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
    load.use_kernels = use_kernels;
    load.kernelize_capture = use_kernels;
    load.attn_implementation = attn;
    const auto t0 = std::chrono::steady_clock::now();
    hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(model_dir, load);
    const double load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string kernel_summary = "built-in ops";
    if (const hk::KernelizeReport* report = model.kernelize_report())
      kernel_summary = std::to_string(report->num_kernels()) + " of " +
                       std::to_string(report->layers.size()) + " layers on hub kernels";
    const hk::ModelConfig& cfg = model.config();
    const int64_t vocab = cfg.vocab_size;
    std::mt19937_64 rng(1234);
    std::uniform_int_distribution<int64_t> token(0, vocab - 1);

    // Bytes of a decode step: weights (each storage once) and KV per cached position and row.
    size_t weight_bytes = 0;
    for (const auto& [name, p] : model.named_parameters()) weight_bytes += p->value.nbytes();
    if (!cfg.tie_word_embeddings)
      weight_bytes -= size_t(vocab) * cfg.hidden_size * hk::dtype_size(model.dtype());
    const double kv_bytes_per_position = 2.0 * cfg.num_hidden_layers * cfg.num_key_value_heads *
                                         cfg.head_dim * double(hk::dtype_size(model.dtype()));
    const double bandwidth = copy_bandwidth(model.device());
    std::printf("hk %s: load %.0f ms, %s; weights %.3f GB, copy bandwidth %.0f GB/s\n",
                model_dir.c_str(), load_ms, kernel_summary.c_str(), weight_bytes / 1e9,
                bandwidth / 1e9);

    // ---- prefill ----
    int64_t prefill_batch = 8, prefill_len = 2048;
    std::sscanf(prefill.c_str(), "%ldx%ld", &prefill_batch, &prefill_len);
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
    std::printf("prefill %ldx%ld: %.2f ms = %.0f tok/s\n", long(prefill_batch), long(prefill_len),
                prefill_med, prefill_tok_s);

    // ---- decode ----
    std::ostringstream rows;
    const std::vector<int64_t> eager = int_list(eager_batches);
    bool first_row = true;
    for (const std::string& ctx : word_list(contexts)) {
      int64_t P = 16, N = 128;
      std::sscanf(ctx.c_str(), "%ld+%ld", &P, &N);
      for (int64_t B : int_list(batches))
        for (const std::string& mode : word_list(modes)) {
          if (mode != "graph" && std::find(eager.begin(), eager.end(), B) == eager.end()) continue;
          std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(B));
          for (auto& p : prompts) {
            p.resize(static_cast<size_t>(P));
            for (auto& t : p) t = token(rng);
          }
          hk::GenerateOptions go;
          go.max_new_tokens = N;
          go.eos_token_ids = std::vector<int64_t>{};  // never stop: fixed work
          go.cuda_graphs = mode == "graph";
          std::vector<double> rates;
          std::string path, note;
          int64_t steps = 0;
          for (int rep = 0; rep <= reps; ++rep) {
            auto result = model.generate(prompts, go);
            if (rep > 0) rates.push_back(result.timings.decode_tok_s);
            path = result.timings.decode_path;
            note = result.timings.decode_note;
            steps = result.timings.decode_steps;
          }
          const double tok_s = median(rates);
          const double mean_context = double(P) + double(N - 1) / 2.0;
          const double step_bytes = double(weight_bytes) + kv_bytes_per_position * B * mean_context;
          const double limit = bandwidth > 0 ? B / (step_bytes / bandwidth) : 0.0;
          // which step ran when HK_DECODE_PERSISTENT asked for the one-launch step (the JSON
          // keeps the whole note)
          const char* persistent = note.find("one persistent launch") != std::string::npos
                                       ? ", persistent step"
                                   : note.find("persistent step not used") != std::string::npos
                                       ? ", persistent step refused"
                                       : "";
          std::printf("decode B=%-3ld %5ld+%-4ld %-6s %10.1f tok/s  limit %9.0f  %5.1f%%  (%s%s)\n",
                      long(B), long(P), long(N), mode.c_str(), tok_s, limit,
                      limit > 0 ? 100.0 * tok_s / limit : 0.0, path.c_str(), persistent);
          std::fflush(stdout);
          rows << (first_row ? "" : ",\n") << "  {\"batch\": " << B << ", \"prompt_len\": " << P
               << ", \"new_tokens\": " << N << ", \"mode\": " << json_string(mode)
               << ", \"decode_tok_s\": " << tok_s << ", \"decode_steps\": " << steps
               << ", \"step_bytes\": " << step_bytes << ", \"limit_tok_s\": " << limit
               << ", \"fraction_of_limit\": " << (limit > 0 ? tok_s / limit : 0.0)
               << ", \"decode_path\": " << json_string(path)
               << ", \"decode_note\": " << json_string(note) << "}";
          first_row = false;
        }
    }

    if (!out.empty()) {
      std::ofstream f(out);
      f << "{\"runtime\": \"hk\", \"model\": " << json_string(model_dir)
        << ", \"device\": " << json_string(model.device().str())
        << ", \"dtype\": " << json_string(dtype) << ", \"kernels\": " << json_string(kernel_summary)
        << ", \"attn\": " << json_string(attn) << ", \"load_ms\": " << load_ms
        << ", \"weight_bytes\": " << weight_bytes
        << ", \"kv_bytes_per_position\": " << kv_bytes_per_position
        << ", \"copy_bandwidth\": " << bandwidth << ", \"prefill_batch\": " << prefill_batch
        << ", \"prefill_len\": " << prefill_len << ", \"prefill_ms\": " << prefill_med
        << ", \"prefill_tok_s\": " << prefill_tok_s << ",\n \"decode\": [\n"
        << rows.str() << "\n]}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hk_bench_generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
