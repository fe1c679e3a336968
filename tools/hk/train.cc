// `hk train --model DIR --data FILE --output-dir DIR [TrainingArguments as --dashed-flags]
//   [--use-liger-kernel] [--liger-kernel-config rope=true,...] [--use-kernels]
//   [--resume-from-checkpoint DIR|latest] [--device cpu|cuda] [--no-shuffle] [--json]
//   [--nproc-per-node N [--nnodes M --node-rank K --master-addr HOST --master-port P]]
//   [--zero-stage 0|1] [--ddp-bucket-cap-mb MB]`
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
// Data parallel: with --nproc-per-node this process is only the launcher (launcher.h): it starts
// N ranks of the same command (without the launcher flags), each with torchrun's environment, and
// exits with the first failure's status. A process started by a launcher (this one, torchrun,
// mpirun, srun: hk::dist::RankEnvironment) trains as its rank: --device cuda becomes cuda:<local
// rank>, the process group is NCCL (cuda) or TCP (cpu), and only rank 0 prints. The --json summary
// adds "world_size", "zero_stage", "backend" and "peak_memory_per_rank" (bytes of hk's allocator).
// Every user-facing failure (missing or empty data, a corpus shorter than one block, a block longer
// than the context, bad Liger keys, a checkpoint of another model, a NaN loss) is an hk::Error:
// exit status 1 and one sentence on stderr.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "hk/allocator.h"
#include "hk/distributed.h"
#include "hk/error.h"
#include "hk/models.h"
#include "hk/tokenizer.h"
#include "hk/trainer.h"
#include "train/distributed/launcher.h"
#include "train/distributed/tcp_socket.h"

namespace {

struct TrainCliArgs {
  hk::TrainingArguments t;
  std::string model, data, device = "cpu", dtype = "auto", attn_implementation;
  std::string liger_kernel_config;
  std::optional<int64_t> block_size;
  std::optional<int64_t> save_total_limit;
  bool no_shuffle = false, json = false, use_kernels = false;
  // Data parallel: launcher flags (torchrun's names) and the trainer's.
  std::optional<int> nproc_per_node, master_port;
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int zero_stage = 0;
  double ddp_bucket_cap_mb = 25;
};

// The launcher's own flags, left out of the ranks' command lines.
const char* const kLauncherFlags[] = {"--nproc-per-node", "--nnodes", "--node-rank",
                                      "--master-addr", "--master-port"};

// This process' command line (argv[1..]) without the launcher flags and their values.
std::vector<std::string> rank_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  std::string arg;
  while (std::getline(in, arg, '\0')) argv.push_back(arg);
  std::vector<std::string> out;
  for (size_t i = 1; i < argv.size(); ++i) {
    bool launcher_flag = false;
    for (const char* f : kLauncherFlags) {
      const std::string flag = f;
      if (argv[i] == flag) {
        launcher_flag = true;
        ++i;  // its value
        break;
      }
      if (argv[i].rfind(flag + "=", 0) == 0) {
        launcher_flag = true;
        break;
      }
    }
    if (!launcher_flag) out.push_back(argv[i]);
  }
  return out;
}

std::string this_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw hk::RuntimeFailure("cannot find the hk executable (/proc/self/exe): " + ec.message());
  return p.string();
}

// `hk train --nproc-per-node N ...`: start the ranks and wait for them; returns the exit status.
int launch_ranks(const TrainCliArgs& a) {
  const hk::dist::RankEnvironment env = hk::dist::RankEnvironment::from_environment();
  if (env.launched())
    throw hk::InvalidArgument("--nproc-per-node: this process was itself started by a launcher (" +
                              env.launcher + ", rank " + std::to_string(env.rank) + " of " +
                              std::to_string(env.world_size) +
                              "); use either hk's launcher or the other one, not both");
  hk::dist::LaunchOptions o;
  o.nproc_per_node = *a.nproc_per_node;
  o.nnodes = a.nnodes;
  o.node_rank = a.node_rank;
  o.master_addr = a.master_addr;
  // One node without --master-port: a free port (as torchrun --standalone), so that two jobs on
  // one machine do not collide; several nodes: torchrun's 29500.
  o.master_port = a.master_port.value_or(a.nnodes == 1 ? hk::dist::tcp::free_port() : 29500);
  hk::dist::validate(o);
  if (a.device.rfind("cuda", 0) == 0) {
    if (a.device != "cuda")
      throw hk::InvalidArgument(
          "--device " + a.device +
          " with --nproc-per-node: each rank takes the GPU of its local "
          "rank; use --device cuda (and CUDA_VISIBLE_DEVICES to choose GPUs)");
    const int gpus = hk::cuda_device_count();
    if (gpus < o.nproc_per_node)
      throw hk::InvalidArgument("--nproc-per-node " + std::to_string(o.nproc_per_node) +
                                " needs one GPU per rank, and " + std::to_string(gpus) + " GPU" +
                                (gpus == 1 ? " is" : "s are") + " visible");
  }
  return hk::dist::launch(o, this_executable(), rank_arguments(), std::cerr);
}

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

void train_this_rank(TrainCliArgs& a, const hk::dist::RankEnvironment& env);

void run_train(TrainCliArgs& a) {
  if (a.nproc_per_node) {
    const int status = launch_ranks(a);
    if (status != 0) {
      std::cout << std::flush;
      std::exit(status);
    }
    return;
  }
  const hk::dist::RankEnvironment env = hk::dist::RankEnvironment::from_environment();
  if (!env.launched()) return train_this_rank(a, env);
  try {
    train_this_rank(a, env);
  } catch (const std::exception& e) {
    // Other ranks' messages say which rank failed (the process group's already do).
    const std::string prefix = "rank " + std::to_string(env.rank) + ": ";
    if (env.rank == 0 || std::string(e.what()).rfind(prefix, 0) == 0) throw;
    throw hk::RuntimeFailure(prefix + e.what());
  }
}

void train_this_rank(TrainCliArgs& a, const hk::dist::RankEnvironment& env) {
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
  if (env.launched()) {
    if (a.device == "cuda") {
      load.device = "cuda:" + std::to_string(env.local_rank);
    } else if (a.device.rfind("cuda:", 0) == 0 && env.local_world_size > 1) {
      throw hk::InvalidArgument("--device " + a.device + " on " +
                                std::to_string(env.local_world_size) +
                                " ranks per node: each rank takes the GPU of its LOCAL_RANK; use "
                                "--device cuda");
    }
  }
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
  options.zero_stage = a.zero_stage;
  options.ddp_bucket_cap_mb = a.ddp_bucket_cap_mb;
  if (env.launched()) options.process_group = hk::dist::init_process_group(model.device(), env);
  hk::Trainer trainer(model, args, std::move(data), options);
  const std::shared_ptr<hk::dist::ProcessGroup>& group = options.process_group;
  const bool main_rank = env.rank == 0;  // the only one that prints

  const bool tty = main_rank && ::isatty(STDERR_FILENO) && !args.disable_tqdm;
  ProgressBar bar(tty);
  if (!a.json && main_rank) {
    std::string ranks;
    if (group)
      ranks = ", " + std::to_string(group->size()) + " rank" + (group->size() == 1 ? "" : "s") +
              " (data parallel over " + group->backend() + (a.zero_stage == 1 ? ", ZeRO-1" : "") +
              ")";
    std::cout << "hk train: " << model.config().model_type << " on " << model.device().str() << " ("
              << hk::dtype_name(model.dtype()) << (args.bf16 ? ", f32 master weights" : "") << ")"
              << ranks << ", " << num_blocks << " blocks of " << block_size << " tokens, "
              << trainer.max_steps() << " steps, " << trainer.steps_in_epoch()
              << " micro-batches per epoch" << (group ? " per rank" : "") << "\n";
    if (const hk::KernelizeReport* report = trainer.kernelize_report())
      std::cout << report->to_text();
    for (const auto& note : trainer.liger_notes())
      std::cout << "liger: not applied: " << note << "\n";
    std::cout << std::flush;
  }
  trainer.on_step = [&](const hk::TrainProgress& p) { bar.draw(p); };
  trainer.on_log = [&](const hk::TrainLog& log) {
    if (!main_rank) return;
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
  // Peak memory of hk's allocator on every rank (a collective), for the scaling benchmark.
  std::vector<int64_t> peaks = {
      static_cast<int64_t>(hk::memory_stats(model.device()).peak_allocated)};
  if (group) {
    hk::Tensor mine = hk::Tensor::from_ints(peaks, {1}, hk::DType::I64);
    if (!model.device().is_cpu()) mine = mine.to(model.device());
    hk::Tensor all = hk::Tensor::zeros({group->size()}, hk::DType::I64, model.device());
    group->all_gather(mine, all);
    group->synchronize();
    peaks = all.to(hk::Device::cpu()).to_int64s();
  }
  if (!main_rank) return;
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
        {"liger_notes", trainer.liger_notes()},
        {"world_size", group ? group->size() : 1},
        {"zero_stage", a.zero_stage},
        {"backend", group ? group->backend() : std::string("none")},
        {"peak_memory_per_rank", peaks}};
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
  cmd->add_option("--nproc-per-node", a->nproc_per_node,
                  "launch N ranks on this node (one per GPU), torchrun's environment");
  cmd->add_option("--nnodes", a->nnodes, "nodes in the job (default 1)");
  cmd->add_option("--node-rank", a->node_rank, "this node's index, 0 to --nnodes - 1");
  cmd->add_option("--master-addr", a->master_addr,
                  "host of rank 0 (default 127.0.0.1; the ranks' rendezvous)");
  cmd->add_option("--master-port", a->master_port,
                  "rendezvous port (default: a free port on one node, 29500 on several)");
  cmd->add_option("--zero-stage", a->zero_stage,
                  "1: shard the AdamW states across the ranks (ZeRO-1); default 0");
  cmd->add_option("--ddp-bucket-cap-mb", a->ddp_bucket_cap_mb,
                  "gradient bucket size of data-parallel training (default 25)");
  cmd->callback([a] { run_train(*a); });
}

}  // namespace

HK_REGISTER_COMMAND(train, add_train);
