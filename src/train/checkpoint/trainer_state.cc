// TrainerState <-> trainer_state.json (hk/train_checkpoint.h), with every field Transformers'
// TrainerState dataclass has, so TrainerState.load_from_json accepts the file.
#include <nlohmann/json.hpp>

#include "hk/error.h"
#include "hk/train_checkpoint.h"

namespace hk {

std::string TrainerState::to_json() const {
  nlohmann::json j;  // std::map-backed: keys sorted, as sort_keys=True writes them
  j["best_global_step"] = nullptr;
  j["best_metric"] = nullptr;
  j["best_model_checkpoint"] = nullptr;
  j["epoch"] = epoch;
  j["eval_steps"] = eval_steps;
  j["global_step"] = global_step;
  j["is_hyper_param_search"] = false;
  j["is_local_process_zero"] = true;
  j["is_world_process_zero"] = true;
  nlohmann::json history = nlohmann::json::array();
  for (const auto& e : log_history) {
    nlohmann::json h;
    h["epoch"] = e.epoch;
    if (e.grad_norm) h["grad_norm"] = *e.grad_norm;
    h["learning_rate"] = e.learning_rate;
    h["loss"] = e.loss;
    h["step"] = e.step;
    history.push_back(h);
  }
  j["log_history"] = history;
  j["logging_steps"] = logging_steps;
  j["max_steps"] = max_steps;
  j["num_input_tokens_seen"] = num_input_tokens_seen;
  j["num_train_epochs"] = num_train_epochs;
  j["save_steps"] = save_steps;
  j["stateful_callbacks"] = nullptr;
  j["total_flos"] = total_flos;
  j["train_batch_size"] = train_batch_size;
  j["trial_name"] = nullptr;
  j["trial_params"] = nullptr;
  return j.dump(2) + "\n";
}

TrainerState TrainerState::from_json(const std::string& text, const std::string& source) {
  TrainerState s;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) throw InvalidArgument(source + " is not a JSON object");
    s.epoch = j.at("epoch").get<double>();
    s.global_step = j.at("global_step").get<int64_t>();
    s.max_steps = j.value("max_steps", int64_t{0});
    s.logging_steps = j.value("logging_steps", int64_t{500});
    s.eval_steps = j.value("eval_steps", int64_t{500});
    s.save_steps = j.value("save_steps", int64_t{500});
    if (j.contains("train_batch_size") && !j["train_batch_size"].is_null())
      s.train_batch_size = j["train_batch_size"].get<int64_t>();
    s.num_train_epochs = j.value("num_train_epochs", int64_t{0});
    s.num_input_tokens_seen = j.value("num_input_tokens_seen", int64_t{0});
    s.total_flos = j.value("total_flos", 0.0);
    if (j.contains("log_history"))
      for (const auto& h : j.at("log_history")) {
        if (!h.contains("loss")) continue;  // evaluation / final summary entries
        TrainerLogEntry e;
        e.step = h.at("step").get<int64_t>();
        e.epoch = h.value("epoch", 0.0);
        e.loss = h.at("loss").get<double>();
        if (h.contains("grad_norm") && !h["grad_norm"].is_null())
          e.grad_norm = h["grad_norm"].get<double>();
        e.learning_rate = h.value("learning_rate", 0.0);
        s.log_history.push_back(e);
      }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(source + " is not a valid trainer_state.json: " + e.what());
  }
  return s;
}

}  // namespace hk
