// Writing the Trainer's checkpoints (hk/train_checkpoint.h has the layout) and the final model.
//
// Test hook: with HK_TRAIN_TEST_PAUSE_IN_SAVE=<step> set, the save of that step prints
// "hk: test: pausing inside checkpoint save <staging dir>" to stderr after model.safetensors is
// written and sleeps for a minute, so the kill -9 test can kill the process mid-save
// deterministically. It changes nothing else.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hk/error.h"
#include "hk/safetensors.h"
#include "hk/version.h"
#include "train/trainer_impl.h"

namespace hk::train_detail {
namespace {

namespace fs = std::filesystem;

const char* const kModelFiles[] = {"config.json",
                                   "generation_config.json",
                                   "tokenizer.json",
                                   "tokenizer_config.json",
                                   "special_tokens_map.json",
                                   "vocab.json",
                                   "merges.txt",
                                   "added_tokens.json",
                                   "chat_template.jinja"};

nlohmann::json args_json(const TrainingArguments& a) {
  nlohmann::json j;
  j["output_dir"] = a.output_dir;
  j["per_device_train_batch_size"] = a.per_device_train_batch_size;
  j["gradient_accumulation_steps"] = a.gradient_accumulation_steps;
  j["learning_rate"] = a.learning_rate;
  j["weight_decay"] = a.weight_decay;
  j["adam_beta1"] = a.adam_beta1;
  j["adam_beta2"] = a.adam_beta2;
  j["adam_epsilon"] = a.adam_epsilon;
  j["max_grad_norm"] = a.max_grad_norm;
  j["num_train_epochs"] = a.num_train_epochs;
  j["max_steps"] = a.max_steps;
  j["lr_scheduler_type"] = a.lr_scheduler_type;
  j["warmup_steps"] = a.warmup_steps;
  j["warmup_ratio"] = a.warmup_ratio;
  j["logging_steps"] = a.logging_steps;
  j["logging_first_step"] = a.logging_first_step;
  j["save_strategy"] = a.save_strategy;
  j["save_steps"] = a.save_steps;
  j["save_total_limit"] =
      a.save_total_limit ? nlohmann::json(*a.save_total_limit) : nlohmann::json(nullptr);
  j["seed"] = a.seed;
  j["bf16"] = a.bf16;
  j["gradient_checkpointing"] = a.gradient_checkpointing;
  j["use_liger_kernel"] = a.use_liger_kernel;
  j["liger_kernel_config"] = a.liger_kernel_config;
  j["optim"] = "adamw_torch";
  j["shuffle"] = a.shuffle;
  return j;
}

void pause_for_test(const std::string& staging, int64_t step) {
  const char* v = std::getenv("HK_TRAIN_TEST_PAUSE_IN_SAVE");
  if (!v || !*v || std::atoll(v) != step) return;
  std::cerr << "hk: test: pausing inside checkpoint save " << staging << std::endl;
  ::sleep(60);
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> TrainerImpl::model_weights() const {
  std::map<std::string, Tensor> masters;
  if (master)
    for (auto& [name, t] : optimizer->state())
      if (name.rfind("master.", 0) == 0) masters[name.substr(7)] = t;
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : model.named_parameters()) {
    if (p->is_buffer || !p->tied_to.empty() || !p->value.defined()) continue;
    auto it = masters.find(name);
    out.emplace_back(name, it != masters.end() ? it->second : p->value);
  }
  return out;
}

void TrainerImpl::copy_model_files(CheckpointWriter* writer, const std::string& dir) const {
  for (const char* f : kModelFiles) {
    const fs::path src = fs::path(options.model_dir) / f;
    if (!fs::is_regular_file(src)) continue;
    if (writer) {
      writer->copy_file(src.string(), f);
    } else {
      std::ifstream in(src, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      write_file_atomically((fs::path(dir) / f).string(), text);
    }
  }
}

std::string TrainerImpl::save_checkpoint(int64_t epoch, int64_t micro_batches_done) {
  const Stream stream = options.stream;
  CheckpointWriter writer(args.output_dir, state.global_step);

  auto weights = model_weights();
  std::vector<std::pair<std::string, TensorView>> views;
  for (auto& [n, t] : weights) views.emplace_back(n, t.view());
  writer.write_tensors("model.safetensors", views, {{"format", "pt"}});
  pause_for_test(writer.staging_dir(), state.global_step);
  copy_model_files(&writer, "");

  // Optimizer: moments only (masters are model.safetensors).
  std::vector<std::pair<std::string, Tensor>> moments;
  for (auto& [n, t] : optimizer->state())
    if (n.rfind("master.", 0) != 0) moments.emplace_back(n, t);
  std::vector<std::pair<std::string, TensorView>> moment_views;
  for (auto& [n, t] : moments) moment_views.emplace_back(n, t.view());
  writer.write_tensors("optimizer.safetensors", moment_views,
                       {{"format", "hk-adamw"}, {"step", std::to_string(optimizer->steps())}});
  nlohmann::json oj;
  oj["format"] = "hk-adamw";
  oj["version"] = 1;
  oj["step"] = optimizer->steps();
  oj["lr"] = args.learning_rate;
  oj["betas"] = {args.adam_beta1, args.adam_beta2};
  oj["eps"] = args.adam_epsilon;
  oj["master_weights"] = master;
  nlohmann::json decay = nlohmann::json::array(), no_decay = nlohmann::json::array();
  for (const auto& t : tensors) (t.weight_decay ? decay : no_decay).push_back(t.name);
  oj["param_groups"] = {{{"weight_decay", args.weight_decay}, {"params", decay}},
                        {{"weight_decay", 0.0}, {"params", no_decay}}};
  writer.write_text("optimizer.json", oj.dump(2) + "\n");

  nlohmann::json sj;
  sj["type"] = scheduler_type_name(scheduler.type());
  sj["base_lr"] = scheduler.base_lr();
  sj["warmup_steps"] = scheduler.warmup_steps();
  sj["total_steps"] = scheduler.total_steps();
  sj["last_epoch"] = state.global_step;  // torch LambdaLR's counter
  sj["last_lr"] = scheduler.lr(state.global_step);
  writer.write_text("scheduler.json", sj.dump(2) + "\n");

  nlohmann::json rj;
  rj["generator"] = "splitmix64 Fisher-Yates over (seed, epoch); see hk/train_data.h";
  rj["seed"] = args.seed;
  rj["epoch"] = epoch;
  rj["shuffle"] = args.shuffle;
  writer.write_text("rng_state.json", rj.dump(2) + "\n");

  nlohmann::json dj;
  dj["epoch"] = epoch;
  dj["micro_batches_done"] = micro_batches_done;
  dj["steps_in_epoch"] = steps_in_epoch;
  dj["num_blocks"] = data.num_blocks();
  dj["block_size"] = data.block_size();
  dj["data_fingerprint"] = data.fingerprint();
  dj["data_source"] = data.source();
  dj["per_device_train_batch_size"] = args.per_device_train_batch_size;
  dj["gradient_accumulation_steps"] = args.gradient_accumulation_steps;
  dj["shuffle"] = args.shuffle;
  dj["seed"] = args.seed;
  writer.write_text("data_state.json", dj.dump(2) + "\n");

  writer.write_text("training_args.json", args_json(args).dump(2) + "\n");
  writer.write_text("trainer_state.json", state.to_json());

  nlohmann::json hj;
  hj["format"] = "hk-trainer-checkpoint";
  hj["version"] = 1;
  hj["hk_version"] = version_string();
  hj["model"] = model_summary();
  hj["model_type"] = model.config().model_type;
  hj["parameters_fingerprint"] = model_fingerprint;
  hj["dtype"] = dtype_name(master ? DType::F32 : model.dtype());
  hj["master_weights"] = master;
  writer.write_text("hk_checkpoint.json", hj.dump(2) + "\n");
  (void)stream;
  return writer.commit();
}

void TrainerImpl::save_final_model() {
  if (options.model_dir.empty()) return;
  fs::create_directories(args.output_dir);
  auto weights = model_weights();
  std::vector<std::pair<std::string, TensorView>> views;
  for (auto& [n, t] : weights) views.emplace_back(n, t.view());
  save_safetensors((fs::path(args.output_dir) / "model.safetensors").string(), views,
                   {{"format", "pt"}});
  copy_model_files(nullptr, args.output_dir);
}

}  // namespace hk::train_detail
