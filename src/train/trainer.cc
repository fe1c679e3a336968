// The Trainer (hk/trainer.h): set-up (precision recipe, kernelize, optimizer, schedule), the step
// loop of Transformers' Trainer._run_epoch, logging without per-step device syncs, and the
// resume side of checkpoints. Writing checkpoints is trainer_checkpoint.cc.
#include "hk/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "hk/checkpoint.h"
#include "hk/distributed.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/lr_scheduler.h"
#include "hk/ops.h"
#include "hk/optim.h"
#include "hk/safetensors.h"
#include "hk/train_checkpoint.h"
#include "train/distributed/gradient_reducer.h"
#include "train/distributed/zero_optimizer.h"
#include "train/loss_plot.h"
#include "train/trainer_impl.h"

namespace hk {

namespace fs = std::filesystem;
using train_detail::TrainerImpl;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound(path + " cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(path + " is not valid JSON: " + e.what());
  }
}

}  // namespace

// ---- set-up ------------------------------------------------------------------------------------

struct Trainer::Impl : TrainerImpl {
  using TrainerImpl::TrainerImpl;
};

Trainer::Trainer(CausalLM& model, TrainingArguments args, BlockDataset data, TrainerOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(args), std::move(data), std::move(options))) {}

Trainer::~Trainer() = default;

const KernelizeReport* Trainer::kernelize_report() const {
  return impl_->report ? &*impl_->report : nullptr;
}
const std::vector<std::string>& Trainer::liger_notes() const {
  return impl_->notes;
}
const TrainingArguments& Trainer::args() const {
  return impl_->args;
}
int64_t Trainer::max_steps() const {
  return impl_->max_steps;
}
int64_t Trainer::steps_in_epoch() const {
  return impl_->steps_in_epoch;
}

namespace train_detail {

TrainerImpl::TrainerImpl(CausalLM& m, TrainingArguments a, BlockDataset d, TrainerOptions o)
    : model(m), args(std::move(a)), data(std::move(d)), options(std::move(o)) {
  args.validate();
  const ModelConfig& config = model.config();
  HK_CHECK(data.num_blocks() > 0, "Trainer: the dataset has no blocks");
  if (data.block_size() > config.max_position_embeddings)
    throw InvalidArgument("--block-size " + std::to_string(data.block_size()) +
                          " is longer than the model's context (max_position_embeddings = " +
                          std::to_string(config.max_position_embeddings) + "); use --block-size " +
                          std::to_string(config.max_position_embeddings) + " or less");
  if (args.save_strategy != "no" && options.model_dir.empty())
    throw InvalidArgument(
        "Trainer: TrainerOptions::model_dir is needed to write checkpoints (config.json and "
        "tokenizer files are copied from it); set it or use save_strategy \"no\"");

  group = options.process_group;
  if (group) {
    rank = group->rank();
    world = group->size();
  }
  // Steps, as Trainer.set_initial_training_values computes them (per rank: its shard's
  // micro-batches; with the same global batch the count equals one process').
  const int64_t bs = args.per_device_train_batch_size, ga = args.gradient_accumulation_steps;
  const int64_t blocks_per_rank =
      group ? dist::shard_length(data.num_blocks(), world) : data.num_blocks();
  steps_in_epoch = (blocks_per_rank + bs - 1) / bs;
  updates_per_epoch = std::max<int64_t>(steps_in_epoch / ga + (steps_in_epoch % ga > 0), 1);
  if (args.max_steps > 0) {
    max_steps = args.max_steps;
    num_train_epochs = max_steps / updates_per_epoch + (max_steps % updates_per_epoch > 0);
  } else {
    max_steps = static_cast<int64_t>(std::ceil(args.num_train_epochs * updates_per_epoch));
    num_train_epochs = static_cast<int64_t>(std::ceil(args.num_train_epochs));
  }
  logging_steps = TrainingArguments::steps_from(args.logging_steps, max_steps);
  save_steps = TrainingArguments::steps_from(args.save_steps, max_steps);
  scheduler =
      LRScheduler(parse_scheduler_type(args.lr_scheduler_type), args.learning_rate,
                  resolve_warmup_steps(args.warmup_steps, args.warmup_ratio, max_steps), max_steps);

  // Training mode first: a model loaded with kernel options re-kernelizes here itself.
  model.train();
  model.gradient_checkpointing_enable(args.gradient_checkpointing);

  tensors = optim::trainable_parameters(model.module());
  HK_CHECK(!tensors.empty(), "Trainer: the model has no trainable parameters");
  model_fingerprint = parameter_fingerprint();

  // Precision: --bf16 over an f32 model keeps f32 masters (taken before the conversion).
  const DType loaded = model.dtype();
  master = args.bf16 && loaded == DType::F32;
  optim::AdamWOptions ao;
  ao.lr = args.learning_rate;
  ao.beta1 = args.adam_beta1;
  ao.beta2 = args.adam_beta2;
  ao.eps = args.adam_epsilon;
  ao.weight_decay = args.weight_decay;
  ao.master_weights = master;
  // Data parallel: the buckets are planned (and ZeRO's sharded AdamW built, its masters copied)
  // before the precision change, and attached once the model has its training dtypes.
  plan_data_parallel(master ? DType::F32 : loaded, master ? DType::BF16 : loaded, ao);
  if (!zero) optimizer = std::make_unique<optim::AdamW>(tensors, ao, options.stream);
  if (master) {
    model.to(model.device(), DType::BF16);
    // f32 gradients: backward accumulates into the tensors it finds (zero_grad keeps them).
    // Data parallel: the f32 bucket views attach_data_parallel() puts there.
    if (!reducer)
      for (auto& t : tensors)
        *t.grad = Tensor::zeros(t.value->sizes(), DType::F32, model.device(), options.stream);
  }
  kernelize_for_training();
  attach_data_parallel();
}

std::string TrainerImpl::parameter_fingerprint() const {
  std::ostringstream s;
  s << model.config().model_type;
  for (const auto& [name, p] : model.named_parameters())
    s << ";" << name << shape_str(p->value.defined() ? p->value.sizes() : p->shape);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s.str()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string TrainerImpl::model_summary() const {
  const ModelConfig& c = model.config();
  return c.model_type + ", " + std::to_string(c.num_hidden_layers) + " layers, hidden " +
         std::to_string(c.hidden_size) + ", vocab " + std::to_string(c.vocab_size);
}

void TrainerImpl::kernelize_for_training() {
  if (!args.use_liger_kernel && !options.use_kernels) return;
  std::vector<std::string> layers;
  for (auto& [path, module] : model.module().named_modules())
    if (!module->layer_interface().empty() &&
        std::find(layers.begin(), layers.end(), module->layer_interface()) == layers.end())
      layers.push_back(module->layer_interface());
  KernelizeOptions k;
  k.device = model.device();
  k.dtype = model.dtype();
  k.use_kernels = true;
  k.attn_implementation = model.load_options().attn_implementation;
  k.allow_all_kernels = model.load_options().allow_all_kernels;
  k.hub = options.hub;
  if (!k.hub) {  // the model's lock and signature policy (docs/security.md) apply here too
    const LoadOptions& lo = model.load_options();
    k.hub = std::make_shared<hub::Hub>(hub::HubConfig::from_environment(
        lo.kernels_lock, lo.allow_unlocked_kernels, lo.require_signed_kernels));
  }
  if (args.use_liger_kernel) {
    k.config = LigerKernelConfig::resolve(args.liger_kernel_config)
                   .kernel_config(layers, model.config().hidden_act, &notes);
  }
  k.config.inherit_mapping = options.use_kernels;  // --use-kernels: the default table underneath
  report = kernelize(model.module(), Mode::Training, k);
}

// ---- the step loop -----------------------------------------------------------------------------

void TrainerImpl::reset_window() {
  window_micro = 0;
  window_steps = 0;
  window_tokens = 0;
  window_reduced = 0;
  window_start = std::chrono::steady_clock::now();
}

Tensor TrainerImpl::micro_batch(const std::vector<int64_t>& order, int64_t micro_index) const {
  const int64_t bs = args.per_device_train_batch_size, block = data.block_size();
  const int64_t first = micro_index * bs;
  const int64_t rows = std::min(bs, static_cast<int64_t>(order.size()) - first);
  std::vector<int64_t> ids(static_cast<size_t>(rows * block));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* src = data.block(order[static_cast<size_t>(first + r)]);
    std::copy(src, src + block, ids.begin() + r * block);
  }
  Tensor t = Tensor::from_ints(ids, {rows, block}, DType::I64);
  return model.device().is_cpu() ? t : t.to(model.device(), options.stream);
}

// Reads the loss window (one device → host copy) and checks it; returns the logged loss.
double TrainerImpl::flush_window(int64_t step, bool* finite) {
  *finite = true;
  if (window_micro == 0) return std::numeric_limits<double>::quiet_NaN();
  if (group) {  // each rank's losses are its share of the global step's loss: sum them
    if (window_micro > window_reduced)
      group->all_reduce(loss_window.slice(0, window_reduced, window_micro), dist::ReduceOp::Sum,
                        options.stream);
    window_reduced = window_micro;
    group->synchronize(options.stream);  // a failed peer is an error here, not a hung copy
  }
  Tensor host = loss_window.slice(0, 0, window_micro).to(Device::cpu(), options.stream);
  const float* v = host.data_as<float>();
  float sum = 0.0f;  // f32, in order, as Trainer's tr_loss accumulates on the device
  for (int64_t i = 0; i < window_micro; ++i) {
    if (!std::isfinite(v[i])) {
      *finite = false;
      bad_loss_step = std::min(bad_loss_step, window_slot_step[static_cast<size_t>(i)]);
    }
    sum += v[i];
  }
  return static_cast<double>(sum) / static_cast<double>(std::max<int64_t>(1, window_steps));
}

[[noreturn]] void TrainerImpl::fail_non_finite(int64_t step) const {
  const int64_t bad = bad_loss_step == std::numeric_limits<int64_t>::max() ? step : bad_loss_step;
  std::string where = last_saved.empty() ? "no checkpoint was written"
                                         : "the last good checkpoint is " + last_saved;
  throw NonFiniteLossError("the loss became NaN or infinite at step " + std::to_string(bad) +
                               "; training stopped (" + where +
                               "). Lower --learning-rate, or check the data and the model",
                           bad);
}

TrainOutput TrainerImpl::train(const std::function<void(const TrainLog&)>& on_log,
                               const std::function<void(const TrainProgress&)>& on_step) {
  TrainOutput out;
  const Stream stream = options.stream;
  const Device device = model.device();
  if (is_main()) remove_stale_checkpoint_dirs(args.output_dir);

  int64_t start_epoch = 0, start_micro = 0;
  state = TrainerState{};
  if (!args.resume_from_checkpoint.empty()) {
    out.resumed_from = resume(&start_epoch, &start_micro);
  }
  state.max_steps = max_steps;
  state.logging_steps = logging_steps;
  state.save_steps = save_steps;
  state.train_batch_size = args.per_device_train_batch_size;
  state.num_train_epochs = num_train_epochs;

  const int64_t ga = args.gradient_accumulation_steps;
  // Between two logs at most logging_steps steps of at most ga micro-batches each.
  loss_window = Tensor::zeros({logging_steps * ga}, DType::F32, device, stream);
  window_slot_step.assign(static_cast<size_t>(logging_steps * ga), 0);
  reset_window();
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state.global_step;
  double last_logged_loss = std::numeric_limits<double>::quiet_NaN();
  double run_loss_sum = 0;
  int64_t run_steps_logged = 0;
  optim::GradNorm norm;

  for (int64_t epoch = start_epoch; epoch < num_train_epochs && state.global_step < max_steps;
       ++epoch) {
    const std::vector<int64_t> order = rank_order(epoch);
    int64_t micro = epoch == start_epoch ? start_micro : 0;
    while (micro < steps_in_epoch && state.global_step < max_steps) {
      const int64_t n = std::min(ga, steps_in_epoch - micro);
      // num_items_in_batch: non-ignored shifted labels of every micro-batch of this step (labels
      // are the input ids, none ignored: rows × (block − 1)), over all ranks (Transformers'
      // average_tokens_across_devices; every rank's shard has the same rows).
      int64_t num_items = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t rows = std::min(
            args.per_device_train_batch_size,
            static_cast<int64_t>(order.size()) - (micro + i) * args.per_device_train_batch_size);
        num_items += rows * (data.block_size() - 1);
      }
      num_items *= world;
      for (int64_t i = 0; i < n; ++i) {
        Tensor ids = micro_batch(order, micro + i);
        ForwardOptions fo;
        fo.labels = ids;
        fo.num_items_in_batch = num_items;
        fo.stream = stream;
        CausalLMOutput result = model.forward(ids, fo);
        if (reducer && i == n - 1)  // only the step's last backward communicates (no_sync)
          result.loss.backward(stream, reducer->on_gradients_ready());
        else
          result.loss.backward(stream);
        loss_window.slice(0, window_micro, window_micro + 1).copy_from(result.loss.view(), stream);
        window_slot_step[static_cast<size_t>(window_micro)] = state.global_step + 1;
        ++window_micro;
        window_tokens += ids.numel() * world;
        out.tokens += ids.numel() * world;
        state.num_input_tokens_seen += ids.numel() * world;
      }
      micro += n;
      if (reducer) reducer->finish(stream);
      norm = clip_gradients();
      const double lr = scheduler.lr(state.global_step);
      optimizer_step(lr, args.max_grad_norm > 0 ? &norm.clip_coef : nullptr);
      // The next step's first backward writes the gradients (zero_grad(false) without the fill).
      model.zero_grad_lazily();
      ++state.global_step;
      ++window_steps;
      state.epoch = static_cast<double>(epoch) +
                    static_cast<double>(micro) / static_cast<double>(steps_in_epoch);
      const int64_t step = state.global_step;

      const bool last = step >= max_steps;
      const bool log_now = step % logging_steps == 0 || (step == 1 && args.logging_first_step);
      const bool save_now = args.save_strategy == "steps" && (step % save_steps == 0 || last);
      if (log_now || save_now || last) {
        bool finite = true;
        const double loss = flush_window(step, &finite);  // the sync: the clock is read after it
        const double wall = seconds_since(window_start);
        if (!finite) fail_non_finite(step);
        if (log_now) {
          TrainLog log;
          log.step = step;
          log.epoch = state.epoch;
          log.loss = loss;
          log.grad_norm = norm.norm.to(Device::cpu(), stream).data_as<float>()[0];
          log.learning_rate = lr;
          log.tokens_per_s = wall > 0 ? static_cast<double>(window_tokens) / wall : 0.0;
          state.log_history.push_back(log);
          out.logs.push_back(log);
          last_logged_loss = loss;
          run_loss_sum += loss * static_cast<double>(window_steps);
          run_steps_logged += window_steps;
          if (on_log) on_log(log);
          reset_window();
        }  // else the window keeps accumulating until the next log (save only checked it)
        if (save_now) {
          last_saved = save_checkpoint(epoch, micro);
          out.last_checkpoint = last_saved;
          if (args.save_total_limit && is_main())
            rotate_checkpoints(args.output_dir, *args.save_total_limit, last_saved);
          barrier();  // rank 0 wrote it: nobody goes on (or exits) before it is complete
        }
        if (last && window_steps > 0) {  // the unlogged tail counts toward training_loss
          bool tail_finite = true;
          const double tail = flush_window(step, &tail_finite);
          if (!tail_finite) fail_non_finite(step);
          run_loss_sum += tail * static_cast<double>(window_steps);
          run_steps_logged += window_steps;
        }
      }
      if (on_step) {
        TrainProgress p;
        p.step = step;
        p.max_steps = max_steps;
        p.epoch = state.epoch;
        p.last_loss = last_logged_loss;
        p.learning_rate = lr;
        p.elapsed_s = seconds_since(run_start);
        p.tokens_per_s = p.elapsed_s > 0 ? static_cast<double>(out.tokens) / p.elapsed_s : 0;
        const int64_t done = step - first_step;
        p.eta_s = done > 0 ? p.elapsed_s / static_cast<double>(done) *
                                 static_cast<double>(max_steps - step)
                           : 0;
        on_step(p);
      }
    }
  }
  synchronize(device, stream);
  out.global_step = state.global_step;
  out.train_runtime_s = seconds_since(run_start);
  out.tokens_per_s =
      out.train_runtime_s > 0 ? static_cast<double>(out.tokens) / out.train_runtime_s : 0;
  out.training_loss = run_steps_logged > 0 ? run_loss_sum / static_cast<double>(run_steps_logged)
                                           : std::numeric_limits<double>::quiet_NaN();
  if (options.save_final_model) save_final_model();
  if (options.plot_loss && !state.log_history.empty() && is_main()) {
    fs::create_directories(args.output_dir);
    write_file_atomically(
        (fs::path(args.output_dir) / "loss_curve.svg").string(),
        loss_curve_svg(state.log_history, "training loss (" + model_summary() + ")"));
  }
  barrier();
  return out;
}

// ---- resume ------------------------------------------------------------------------------------

std::string TrainerImpl::resume(int64_t* start_epoch, int64_t* start_micro) {
  std::string dir = args.resume_from_checkpoint;
  if (dir == "latest") {
    auto found = last_checkpoint(args.output_dir);
    if (!found)
      throw NotFound("--resume-from-checkpoint latest: " + args.output_dir +
                     " has no complete checkpoint-N directory to resume from");
    dir = *found;
  }
  if (!fs::is_directory(dir))
    throw NotFound("--resume-from-checkpoint: " + dir + " is not a directory");
  const auto missing = missing_checkpoint_files(dir);
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw InvalidArgument("--resume-from-checkpoint: " + dir +
                          " is not a complete hk checkpoint (" + list +
                          " missing); resume from a checkpoint written by hk train");
  }
  const nlohmann::json meta = read_json((fs::path(dir) / "hk_checkpoint.json").string());
  if (meta.value("parameters_fingerprint", std::string()) != model_fingerprint)
    throw InvalidArgument("--resume-from-checkpoint: " + dir +
                          " was written for a different model (" +
                          meta.value("model", std::string("unknown")) + "); this model is " +
                          model_summary() + ". Resume with the model it was trained from");
  const nlohmann::json ds = read_json((fs::path(dir) / "data_state.json").string());
  if (ds.value("data_fingerprint", std::string()) != data.fingerprint())
    throw InvalidArgument("--resume-from-checkpoint: " + dir +
                          " was trained on different data (other file, tokenizer or --block-size); "
                          "resume with the same --data and --block-size");
  auto same = [&](const char* key, int64_t mine, const char* flag) {
    const int64_t theirs = ds.value(key, int64_t{-1});
    if (theirs != mine)
      throw InvalidArgument("--resume-from-checkpoint: " + dir + " was trained with " + flag + " " +
                            std::to_string(theirs) + ", this run has " + std::to_string(mine) +
                            "; the data position only continues with the same value");
  };
  {
    // The data position carries over to any world size with the same global micro-batch
    // (per-device batch × ranks): micro-batch k is then the same blocks.
    const int64_t their_bs = ds.value("per_device_train_batch_size", int64_t{-1});
    const int64_t their_world = ds.value("world_size", int64_t{1});
    const int64_t mine = args.per_device_train_batch_size * world;
    if (their_bs * their_world != mine) {
      std::string hint;
      if ((their_bs * their_world) % world == 0)
        hint = ": use --per-device-train-batch-size " +
               std::to_string(their_bs * their_world / world) + " with " + std::to_string(world) +
               " rank" + (world == 1 ? "" : "s");
      throw InvalidArgument(
          "--resume-from-checkpoint: " + dir + " was trained with a global " + "batch of " +
          std::to_string(their_bs * their_world) + " blocks (--per-device-train-batch-size " +
          std::to_string(their_bs) + " × " + std::to_string(their_world) + " rank" +
          (their_world == 1 ? "" : "s") + "), this run has " + std::to_string(mine) + " (" +
          std::to_string(args.per_device_train_batch_size) + " × " + std::to_string(world) +
          "); the data position only continues with the same global batch" + hint);
    }
  }
  same("gradient_accumulation_steps", args.gradient_accumulation_steps,
       "--gradient-accumulation-steps");
  if (ds.value("shuffle", true) != args.shuffle ||
      (args.shuffle && ds.value("seed", uint64_t{0}) != args.seed))
    throw InvalidArgument("--resume-from-checkpoint: " + dir +
                          " was trained with another data order (--seed / --no-shuffle); use the "
                          "same ones to continue it");
  const nlohmann::json oj = read_json((fs::path(dir) / "optimizer.json").string());
  if (oj.value("master_weights", false) != master)
    throw InvalidArgument(std::string("--resume-from-checkpoint: ") + dir + " was written " +
                          (oj.value("master_weights", false) ? "with" : "without") +
                          " --bf16 master weights; resume with the same precision flags");

  state = TrainerState::from_json(read_text((fs::path(dir) / "trainer_state.json").string()),
                                  (fs::path(dir) / "trainer_state.json").string());
  *start_epoch = ds.at("epoch").get<int64_t>();
  *start_micro = ds.at("micro_batches_done").get<int64_t>();
  if (*start_micro >= steps_in_epoch) {  // the checkpoint ended an epoch
    ++*start_epoch;
    *start_micro = 0;
  }

  // Weights: into the f32 masters (then the bf16 model is refreshed), or into the model itself.
  Checkpoint weights = Checkpoint::open(dir);
  std::vector<std::pair<std::string, Tensor>> opt_state;
  SafetensorsFile moments =
      SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
  for (const auto& info : moments.tensors())
    opt_state.emplace_back(info.name, moments.load(info.name));
  if (master) {
    for (const auto& t : tensors) {
      if (!weights.contains(t.name))
        throw InvalidArgument("--resume-from-checkpoint: " + dir + "/model.safetensors has no '" +
                              t.name + "'");
      opt_state.emplace_back("master." + t.name, weights.load(t.name));
    }
    load_optimizer_state(opt_state, oj.at("step").get<int64_t>());
    refresh_model_from_master();
  } else {
    std::map<std::string, Tensor> map;
    for (const auto& name : weights.names()) map.emplace(name, weights.load(name));
    nn::TensorMapSource source(std::move(map), "checkpoint " + dir);
    nn::LoadStateOptions lo;
    lo.device = model.device();
    lo.dtype = model.dtype();
    lo.stream = options.stream;
    lo.ignore_unexpected_suffixes = {"rotary_emb.inv_freq"};
    nn::load_state_dict(model.module(), source, lo);
    after_weights_loaded();
    load_optimizer_state(opt_state, oj.at("step").get<int64_t>());
  }
  const nlohmann::json sj = read_json((fs::path(dir) / "scheduler.json").string());
  // As torch's LambdaLR.load_state_dict: the saved base learning rate wins, the shape of the
  // schedule (warmup, total) is this run's.
  scheduler = LRScheduler(scheduler.type(), sj.value("base_lr", scheduler.base_lr()),
                          scheduler.warmup_steps(), scheduler.total_steps());
  last_saved = dir;
  return dir;
}

}  // namespace train_detail

TrainOutput Trainer::train() {
  return impl_->train(on_log, on_step);
}

}  // namespace hk
