// hk_bench_train — training throughput of a causal LM with hk::Trainer: tokens/s, MFU, peak GPU
// memory, and a per-layer time breakdown of one step.
//
//   hk_bench_train --model DIR [--device cuda] [--batch 4] [--seq 2048] [--steps 10] [--warmup 3]
//                  [--configs builtin,liger] [--attn-implementation sdpa]
//                  [--gradient-checkpointing] [--peak-tflops 989.4] [--no-breakdown]
//                  [--out FILE.json]
// Each config loads the model afresh (bf16 as the checkpoint is), trains `warmup + steps`
// optimizer steps on random token blocks (AdamW, lr 1e-5, clipping 1.0, no gradient
// accumulation) through hk::Trainer — what `hk train` runs — with the device synchronised after
// every step, and reports the median step time of the last `steps`:
//   builtin  the built-in layers         liger  --use-liger-kernel (Liger's defaults: RMSNorm,
//   kernels  --use-kernels (hub default)        RoPE, SwiGLU and the fused linear cross-entropy)
// MFU = model FLOPs per token × tokens/s / peak, with FLOPs/token = 6·N + 12·L·(Hq·D)·S (PaLM's
// formula; N = every matmul weight, lm_head included, embeddings' lookups not; attention counted
// without the causal half, as the Transformers peer counts it too); peak = the H100/H200 SXM dense
// bf16 rate unless --peak-tflops. Peak memory = hk's caching allocator high-water mark over the
// run (weights included), allocated and reserved. Breakdown: one more step, outside the timed
// ones, with every layer call bracketed by CUDA events (layer_timer.h); rows are exclusive times.
// Mirrors bench/peers/train_transformers.py. It is a benchmark: no pass/fail target is checked
// here; the targets of issue 10 are printed beside the numbers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hk/allocator.h"
#include "hk/models.h"
#include "hk/optim.h"
#include "hk/stream.h"
#include "hk/trainer.h"
#include "layer_timer.h"

namespace {

struct Args {
  std::string model, device = "cuda", attn = "sdpa", out;
  int64_t batch = 4, seq = 2048, steps = 10, warmup = 3;
  std::vector<std::string> configs = {"builtin", "liger"};
  bool gradient_checkpointing = false, breakdown = true;
  double peak_tflops = 989.4;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// FLOPs per token of one training step (forward + backward = 3× the forward's 2 FLOPs per
// weight per token, plus attention's score and value products).
double flops_per_token(const hk::ModelConfig& c, int64_t seq) {
  const double h = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double i = static_cast<double>(c.intermediate_size);
  const double l = static_cast<double>(c.num_hidden_layers);
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * i;
  const double n = l * per_layer + static_cast<double>(c.vocab_size) * h;
  return 6 * n + 12 * l * q * static_cast<double>(seq);
}

nlohmann::json run_config(const Args& a, const std::string& config) {
  using clock = std::chrono::steady_clock;
  hk::LoadOptions load;
  load.device = a.device;
  load.attn_implementation = a.attn;
  hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(a.model, load);
  const hk::Device device = model.device();
  const hk::ModelConfig& c = model.config();

  // Random blocks: one per micro-batch row of every step (plus the breakdown step's).
  const int64_t total_steps = a.warmup + a.steps;
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  std::vector<std::vector<int64_t>> docs(1);
  docs[0].resize(static_cast<size_t>((total_steps + 1) * a.batch * a.seq));
  for (auto& t : docs[0]) t = token(rng);
  hk::BlockDataset data =
      hk::BlockDataset::from_documents(docs, {.block_size = a.seq, .group_documents = 0});

  hk::TrainingArguments args;
  args.output_dir = "/tmp/hk-bench-train-unused";
  args.save_strategy = "no";
  args.per_device_train_batch_size = a.batch;
  args.learning_rate = 1e-5;
  args.lr_scheduler_type = "constant";
  args.max_steps = total_steps;
  args.logging_steps = static_cast<double>(total_steps);
  args.shuffle = false;
  args.disable_tqdm = true;
  args.gradient_checkpointing = a.gradient_checkpointing;
  args.use_liger_kernel = config == "liger";
  hk::TrainerOptions options;
  options.use_kernels = config == "kernels";
  options.save_final_model = false;
  options.plot_loss = false;

  nlohmann::json result;
  result["config"] = config;
  std::vector<double> step_ms;
  double last_loss = 0;
  std::string kernels = "built-in";
  {
    hk::synchronize_device(device);
    hk::reset_peak_memory_stats(device);
    hk::Trainer trainer(model, args, data, options);
    if (const hk::KernelizeReport* r = trainer.kernelize_report()) {
      std::map<std::string, int> count;
      for (const auto& d : r->layers)
        if (!d.kernel.empty()) ++count[d.layer + "=" + d.kernel];
      kernels = std::to_string(r->num_kernels()) + " of " + std::to_string(r->layers.size()) +
                " layers on hub kernels";
      nlohmann::json bound = nlohmann::json::object();
      for (auto& [k, n] : count) bound[k] = n;
      result["kernels_bound"] = bound;
    }
    auto last = clock::now();
    trainer.on_step = [&](const hk::TrainProgress&) {
      hk::synchronize_device(device);
      const auto now = clock::now();
      step_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
      last = now;
    };
    trainer.on_log = [&](const hk::TrainLog& l) { last_loss = l.loss; };
    trainer.train();
  }
  const hk::MemoryStats mem = hk::memory_stats(device);
  std::vector<double> timed(step_ms.begin() + std::min<int64_t>(a.warmup, step_ms.size()),
                            step_ms.end());
  const double ms = median(timed);
  const double tokens_per_s = static_cast<double>(a.batch * a.seq) / (ms / 1000.0);
  const double tflops = flops_per_token(c, a.seq) * tokens_per_s / 1e12;
  result["kernels"] = kernels;
  result["step_ms"] = step_ms;
  result["step_ms_median"] = ms;
  result["tokens_per_s"] = tokens_per_s;
  result["model_tflops"] = tflops;
  result["mfu"] = tflops / a.peak_tflops;
  result["peak_allocated_gib"] = static_cast<double>(mem.peak_allocated) / (1ull << 30);
  result["peak_reserved_gib"] = static_cast<double>(mem.peak_reserved) / (1ull << 30);
  result["loss_last_logged"] = last_loss;
  std::printf(
      "hk %-8s %7.1f ms/step  %8.0f tok/s  %6.1f TFLOP/s  MFU %5.1f%%  peak %.2f GiB "
      "allocated / %.2f GiB reserved  (%s)\n",
      config.c_str(), ms, tokens_per_s, tflops, 100 * tflops / a.peak_tflops,
      result["peak_allocated_gib"].get<double>(), result["peak_reserved_gib"].get<double>(),
      kernels.c_str());
  std::fflush(stdout);

  if (a.breakdown && !device.is_cuda())
    std::printf("  (no breakdown on %s: it is timed with CUDA events)\n", device.str().c_str());
  if (a.breakdown && device.is_cuda()) {
    // One step as the Trainer runs it, with every layer call timed: forward, backward, the
    // norm + AdamW update, zero_grad_lazily. The Trainer (and its optimizer) is gone, the kernels
    // it bound stay bound; a fresh AdamW on the same parameters does the update.
    std::vector<hk::optim::OptimTensor> tensors = hk::optim::trainable_parameters(model.module());
    hk::optim::AdamW optimizer(tensors, {.lr = 1e-5});
    std::vector<int64_t> ids(data.block(0), data.block(0) + a.batch * a.seq);
    hk::Tensor input = hk::Tensor::from_ints(ids, {a.batch, a.seq}).to(device);
    hk::bench::LayerTimer timer(hk::Stream{});
    auto one_step = [&](bool timed_step) {
      if (timed_step) timer.install(model.module());
      {
        std::optional<hk::bench::LayerTimer::Scope> step;
        if (timed_step) step.emplace(timer, "step (total)");
        hk::ForwardOptions fo;
        fo.labels = input;
        fo.num_items_in_batch = a.batch * (a.seq - 1);
        hk::CausalLMOutput out;
        {
          std::optional<hk::bench::LayerTimer::Scope> s;
          if (timed_step) s.emplace(timer, "forward (other: embedding glue, residuals, tables)");
          out = model.forward(input, fo);
        }
        {
          std::optional<hk::bench::LayerTimer::Scope> s;
          if (timed_step) s.emplace(timer, "backward (other: residual grads, glue)");
          out.loss.backward();
        }
        hk::optim::GradNorm norm;
        {
          std::optional<hk::bench::LayerTimer::Scope> s;
          if (timed_step) s.emplace(timer, "grad norm + clip coefficient");
          norm = optimizer.clip_grad_norm(1.0);
        }
        {
          std::optional<hk::bench::LayerTimer::Scope> s;
          if (timed_step) s.emplace(timer, "AdamW step (fused multi-tensor)");
          optimizer.step(1e-5, &norm.clip_coef);
        }
        {
          std::optional<hk::bench::LayerTimer::Scope> s;
          if (timed_step) s.emplace(timer, "zero_grad (lazily: the next backward writes)");
          model.zero_grad_lazily();  // as the Trainer does
        }
      }
      hk::synchronize_device(device);
      if (timed_step) timer.uninstall();
    };
    one_step(false);  // warm-up (optimizer state, allocator blocks)
    one_step(true);
    double total = 0;
    nlohmann::json rows = nlohmann::json::array();
    const auto timer_rows = timer.rows();
    for (const auto& r : timer_rows)
      if (r.label == "step (total)") total = r.inclusive_ms;
    std::printf("  breakdown of one step (%s), exclusive ms:\n", config.c_str());
    for (const auto& r : timer_rows) {
      if (r.label == "step (total)") continue;
      rows.push_back({{"label", r.label},
                      {"calls", r.calls},
                      {"ms", r.exclusive_ms},
                      {"percent", total > 0 ? 100 * r.exclusive_ms / total : 0}});
      std::printf("    %-58s %5lld calls %8.3f ms %5.1f%%\n", r.label.c_str(),
                  static_cast<long long>(r.calls), r.exclusive_ms,
                  total > 0 ? 100 * r.exclusive_ms / total : 0.0);
    }
    std::printf("    %-58s %17.3f ms (events add host time per call)\n", "step total", total);
    result["breakdown_step_ms"] = total;
    result["breakdown"] = rows;
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model"))
      a.model = next("--model");
    else if (!std::strcmp(argv[i], "--device"))
      a.device = next("--device");
    else if (!std::strcmp(argv[i], "--batch"))
      a.batch = std::stoll(next("--batch"));
    else if (!std::strcmp(argv[i], "--seq"))
      a.seq = std::stoll(next("--seq"));
    else if (!std::strcmp(argv[i], "--steps"))
      a.steps = std::stoll(next("--steps"));
    else if (!std::strcmp(argv[i], "--warmup"))
      a.warmup = std::stoll(next("--warmup"));
    else if (!std::strcmp(argv[i], "--configs"))
      a.configs = split(next("--configs"));
    else if (!std::strcmp(argv[i], "--attn-implementation"))
      a.attn = next("--attn-implementation");
    else if (!std::strcmp(argv[i], "--gradient-checkpointing"))
      a.gradient_checkpointing = true;
    else if (!std::strcmp(argv[i], "--peak-tflops"))
      a.peak_tflops = std::stod(next("--peak-tflops"));
    else if (!std::strcmp(argv[i], "--no-breakdown"))
      a.breakdown = false;
    else if (!std::strcmp(argv[i], "--out"))
      a.out = next("--out");
    else {
      std::fprintf(stderr, "unknown argument %s (see the header of bench_train.cc)\n", argv[i]);
      return 2;
    }
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "usage: hk_bench_train --model DIR [options]\n");
    return 2;
  }
  nlohmann::json out;
  out["runtime"] = "hk";
  out["model"] = a.model;
  out["batch"] = a.batch;
  out["seq"] = a.seq;
  out["steps"] = a.steps;
  out["warmup"] = a.warmup;
  out["attn_implementation"] = a.attn;
  out["gradient_checkpointing"] = a.gradient_checkpointing;
  out["peak_tflops"] = a.peak_tflops;
  out["flops_per_token"] = 0;
  out["targets"] =
      "issue 10: hk + liger tokens/s >= 1.25x Transformers + torch.compile; peak <= 13 GiB";
  out["results"] = nlohmann::json::array();
  int status = 0;
  for (const auto& config : a.configs) {
    try {
      out["results"].push_back(run_config(a, config));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hk_bench_train: %s: %s\n", config.c_str(), e.what());
      out["results"].push_back({{"config", config}, {"error", e.what()}});
      status = 1;
    }
  }
  try {
    out["flops_per_token"] = flops_per_token(hk::ModelConfig::from_file(a.model), a.seq);
  } catch (const std::exception&) {
  }
  if (!a.out.empty()) std::ofstream(a.out) << out.dump(1) << "\n";
  return status;
}
