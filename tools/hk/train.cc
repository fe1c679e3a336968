// `hk train --model DIR --data FILE --output-dir DIR [TrainingArguments as --dashed-flags]
//   [--use-liger-kernel] [--liger-kernel-config rope=true,...] [--use-kernels]
//   [--resume-from-checkpoint DIR|latest] [--device cpu|cuda] [--no-shuffle] [--json]`
//
// A thin CLI over hk::Trainer (hk/trainer.h): loads the model (AutoModelForCausalLM, the
// checkpoint's dtype unless --dtype), reads --data (.txt: a document per line, .jsonl: a "text"
// field) into blocks of --block-size (default min(1024, max_position_embeddings), as run_clm.py),
// trains, writes checkpoint-N/ every --save-steps and at the end, the final model and
// loss_curve.svg into --output-dir.
//
// Text output: what trains on what (the kernelize report when kernels were asked for), one line
// per logged step, a summary; on a terminal a progress bar on stderr (step, loss, lr, tok/s, ETA).
// --json output (stable; extra keys may be added): one object per logged step
//   {"step", "epoch", "loss", "grad_norm", "learning_rate", "tokens_per_s"}
// then one final object
//   {"train_runtime", "train_loss", "global_step", "tokens", "tokens_per_s", "output_dir",
//    "last_checkpoint", "resumed_from", "kernelize": {report} | null, "liger_notes": [..]}.
// Every user-facing failure (missing or empty data, a corpus shorter than one block, a block longer
// than the context, bad Liger keys, a checkpoint of another model, a NaN loss) is an hk::Error:
// exit status 1 and one sentence on stderr.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "hk/error.h"
#include "hk/models.h"
#include "hk/tokenizer.h"
#include "hk/trainer.h"

namespace {

struct TrainCliArgs {
  hk::TrainingArguments t;
  std::string model, data, device = "cpu", dtype = "auto", attn_implementation;
  std::string liger_kernel_config;
  std::optional<int64_t> block_size;
  std::optional<int64_t> save_total_limit;
  bool no_shuffle = false, json = false, use_kernels = false;
};

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long total = static_cast<long>(s + 0.5);
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", total / 60, total % 60);
  return buf;
}

// The terminal progress bar (stderr): redrawn in place, cleared before other output.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void draw(const hk::TrainProgress& p) {
    if (!enabled_) return;
    const int width = 24;
    const double frac = p.max_steps > 0 ? static_cast<double>(p.step) / p.max_steps : 0;
    std::string bar(static_cast<size_t>(frac * width), '#');
    bar.resize(width, '.');
    char line[256];
    char loss[32];
    if (std::isfinite(p.last_loss))
      std::snprintf(loss, sizeof loss, "%.4f", p.last_loss);
    else
      std::snprintf(loss, sizeof loss, "-");
    std::snprintf(line, sizeof line, "\r[%s] step %lld/%lld  loss %s  lr %.3g  %.0f tok/s  ETA %s ",
                  bar.c_str(), static_cast<long long>(p.step), static_cast<long long>(p.max_steps),
                  loss, p.learning_rate, p.tokens_per_s, format_duration(p.eta_s).c_str());
    std::cerr << line << std::flush;
    drawn_ = true;
  }
  void clear() {
    if (enabled_ && drawn_) std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
};

void run_train(TrainCliArgs& a) {
  if (a.model.empty()) throw hk::InvalidArgument("--model DIR is required");
  if (a.data.empty()) throw hk::InvalidArgument("--data FILE is required (.txt or .jsonl)");
  hk::TrainingArguments& args = a.t;
  args.shuffle = !a.no_shuffle;
  args.save_total_limit = a.save_total_limit;
  if (!a.liger_kernel_config.empty()) {
    args.liger_kernel_config = hk::LigerKernelConfig::parse(a.liger_kernel_config);
    if (!args.use_liger_kernel)
      std::cerr << "hk: note: --liger-kernel-config implies --use-liger-kernel\n";
    args.use_liger_kernel = true;
  }
  args.validate();  // flag errors before the model loads

  hk::LoadOptions load;
  load.device = a.device;
  if (a.dtype != "auto") load.dtype = hk::parse_dtype(a.dtype);
  load.attn_implementation = a.attn_implementation;
  hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(a.model, load);
  const hk::Tokenizer tokenizer = hk::Tokenizer::from_pretrained(a.model);
  const int64_t block_size =
      a.block_size.value_or(std::min<int64_t>(1024, model.config().max_position_embeddings));
  if (block_size <= 0) throw hk::InvalidArgument("--block-size must be > 0");
  if (block_size > model.config().max_position_embeddings)
    throw hk::InvalidArgument("--block-size " + std::to_string(block_size) +
                              " is longer than the model's context (max_position_embeddings = " +
                              std::to_string(model.config().max_position_embeddings) + ")");
  hk::BlockDataset data =
      hk::BlockDataset::from_file(a.data, tokenizer, {.block_size = block_size});

  const int64_t num_blocks = data.num_blocks();
  hk::TrainerOptions options;
  options.model_dir = a.model;
  options.use_kernels = a.use_kernels;
  hk::Trainer trainer(model, args, std::move(data), options);

  const bool tty = ::isatty(STDERR_FILENO) && !args.disable_tqdm;
  ProgressBar bar(tty);
  if (!a.json) {
    std::cout << "hk train: " << model.config().model_type << " on " << model.device().str() << " ("
              << hk::dtype_name(model.dtype()) << (args.bf16 ? ", f32 master weights" : "") << "), "
              << num_blocks << " blocks of " << block_size << " tokens, " << trainer.max_steps()
              << " steps, " << trainer.steps_in_epoch() << " micro-batches per epoch\n";
    if (const hk::KernelizeReport* report = trainer.kernelize_report())
      std::cout << report->to_text();
    for (const auto& note : trainer.liger_notes())
      std::cout << "liger: not applied: " << note << "\n";
    std::cout << std::flush;
  }
  trainer.on_step = [&](const hk::TrainProgress& p) { bar.draw(p); };
  trainer.on_log = [&](const hk::TrainLog& log) {
    bar.clear();
    if (a.json) {
      nlohmann::json j = {{"step", log.step},
                          {"epoch", log.epoch},
                          {"loss", log.loss},
                          {"grad_norm", log.grad_norm.value_or(0.0)},
                          {"learning_rate", log.learning_rate},
                          {"tokens_per_s", log.tokens_per_s}};
      std::cout << j.dump() << std::endl;
    } else {
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %lld  epoch %.3f  loss %.4f  grad_norm %.4f  lr %.4g  %.0f tok/s",
                    static_cast<long long>(log.step), log.epoch, log.loss,
                    log.grad_norm.value_or(0.0), log.learning_rate, log.tokens_per_s);
      std::cout << line << std::endl;
    }
  };
  hk::TrainOutput out;
  try {
    out = trainer.train();
  } catch (...) {
    bar.clear();
    throw;
  }
  bar.clear();
  if (a.json) {
    const hk::KernelizeReport* report = trainer.kernelize_report();
    nlohmann::json j = {
        {"train_runtime", out.train_runtime_s},
        {"train_loss", out.training_loss},
        {"global_step", out.global_step},
        {"tokens", out.tokens},
        {"tokens_per_s", out.tokens_per_s},
        {"output_dir", args.output_dir},
        {"last_checkpoint", out.last_checkpoint},
        {"resumed_from", out.resumed_from},
        {"kernelize", report ? nlohmann::json::parse(report->to_json()) : nlohmann::json(nullptr)},
        {"liger_notes", trainer.liger_notes()}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else {
    char line[256];
    std::snprintf(line, sizeof line, "done: %lld steps in %.1f s, train_loss %.4f, %.0f tok/s",
                  static_cast<long long>(out.global_step), out.train_runtime_s, out.training_loss,
                  out.tokens_per_s);
    std::cout << line << "\n";
    if (!out.last_checkpoint.empty())
      std::cout << "last checkpoint: " << out.last_checkpoint << "\n";
    std::cout << "model and loss_curve.svg: " << args.output_dir << std::endl;
  }
}

void add_train(CLI::App& app) {
  auto a = std::make_shared<TrainCliArgs>();
  hk::TrainingArguments& t = a->t;
  auto* cmd = app.add_subcommand("train", "Train a Qwen3/Llama model on a text corpus (causal LM)");
  cmd->add_option("--model", a->model, "model directory (config.json, safetensors, tokenizer)")
      ->required();
  cmd->add_option("--data", a->data, ".txt (one document per line) or .jsonl (\"text\" field)")
      ->required();
  cmd->add_option("--output-dir", t.output_dir, "where checkpoints and the final model go")
      ->required();
  cmd->add_option("--block-size", a->block_size,
                  "tokens per block (default min(1024, max_position_embeddings))");
  cmd->add_option("--per-device-train-batch-size", t.per_device_train_batch_size, "default 8");
  cmd->add_option("--gradient-accumulation-steps", t.gradient_accumulation_steps, "default 1");
  cmd->add_option("--learning-rate", t.learning_rate, "default 5e-5");
  cmd->add_option("--weight-decay", t.weight_decay, "default 0");
  cmd->add_option("--adam-beta1", t.adam_beta1, "default 0.9");
  cmd->add_option("--adam-beta2", t.adam_beta2, "default 0.999");
  cmd->add_option("--adam-epsilon", t.adam_epsilon, "default 1e-8");
  cmd->add_option("--max-grad-norm", t.max_grad_norm, "global L2 clipping, 0 = off (default 1)");
  cmd->add_option("--num-train-epochs", t.num_train_epochs, "default 3");
  cmd->add_option("--max-steps", t.max_steps, "> 0 overrides --num-train-epochs (default -1)");
  cmd->add_option("--lr-scheduler-type", t.lr_scheduler_type,
                  "constant, constant_with_warmup, linear (default) or cosine");
  cmd->add_option("--warmup-steps", t.warmup_steps, "steps, or a ratio of the total below 1");
  cmd->add_option("--warmup-ratio", t.warmup_ratio, "ratio of the total (Transformers 4 name)");
  cmd->add_option("--logging-steps", t.logging_steps, "log every N steps (default 500)");
  cmd->add_flag("--logging-first-step", t.logging_first_step, "also log step 1");
  cmd->add_option("--save-strategy", t.save_strategy, "steps (default) or no");
  cmd->add_option("--save-steps", t.save_steps, "checkpoint every N steps (default 500)");
  cmd->add_option("--save-total-limit", a->save_total_limit, "keep at most N checkpoints");
  cmd->add_option("--seed", t.seed, "shuffling seed (default 42)");
  cmd->add_flag("--bf16", t.bf16, "f32 model: f32 master weights, bf16 compute");
  cmd->add_flag("--gradient-checkpointing", t.gradient_checkpointing,
                "recompute each decoder layer in backward");
  cmd->add_flag("--use-liger-kernel", t.use_liger_kernel,
                "train on kernels-community/liger-kernels (Mode::Training)");
  cmd->add_option("--liger-kernel-config", a->liger_kernel_config,
                  "rope=true,swiglu=false,... (keys: rope, swiglu, geglu, cross_entropy, "
                  "fused_linear_cross_entropy, rms_norm, layer_norm)");
  cmd->add_flag("--use-kernels", a->use_kernels, "hub kernels from the default mapping (training)");
  cmd->add_option("--resume-from-checkpoint", t.resume_from_checkpoint,
                  "a checkpoint-N directory, or 'latest' in --output-dir");
  cmd->add_option("--device", a->device, "cpu, cuda or cuda:N (default cpu)");
  cmd->add_option("--dtype", a->dtype, "auto (checkpoint's), f32 or bf16 (default auto)");
  cmd->add_option("--attn-implementation", a->attn_implementation, "eager (default) or sdpa");
  cmd->add_flag("--no-shuffle", a->no_shuffle, "visit blocks in file order");
  cmd->add_flag("--disable-tqdm", t.disable_tqdm, "no progress bar");
  cmd->add_flag("--json", a->json, "one JSON object per logged step, then a summary");
  cmd->callback([a] { run_train(*a); });
}

}  // namespace

HK_REGISTER_COMMAND(train, add_train);
