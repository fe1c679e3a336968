// `hk kernelize --model DIR [--mode inference|training[,capture]] [--kernel-config FILE.json]
//  [--attn-implementation NAME] [--allow-all-kernels] [--device cpu|cuda] [--dtype ..] --report
//  [--json] [--kernels-lock FILE] [--allow-unlocked-kernels] [--require-signed]`
// Loads the model, runs kernelize with the device-aware defaults (plus the config) and prints the
// decision for every layer: the kernel bound (repo:Entry, commit, variant) or why the built-in
// implementation stays. --json prints {"device", "mode", "layers": [{"path", "layer", "kernel" or
// null, "revision", "variant", "reason"}]}. It changes nothing on disk.
#include <iostream>

#include "commands.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"
#include "hk/models.h"
#include "kernel_policy.h"

namespace hk::cli {
namespace {

struct KernelizeArgs {
  std::string model, mode = "inference", kernel_config, attn_implementation, device = "cpu", dtype;
  bool report = false, json = false, allow_all_kernels = false;
  KernelPolicyFlags policy;
};

void run(const KernelizeArgs& a) {
  if (!a.report)
    throw InvalidArgument("hk kernelize only reports for now; pass --report (and --json for JSON)");
  const Mode mode = parse_mode(a.mode);
  LoadOptions load;
  load.device = a.device;
  if (!a.dtype.empty()) load.dtype = parse_dtype(a.dtype);
  CausalLM model = AutoModelForCausalLM::from_pretrained(a.model, load);
  KernelizeOptions options;
  options.device = model.device();
  options.dtype = model.dtype();
  if (!a.kernel_config.empty()) options.config = KernelConfig::from_file(a.kernel_config);
  options.attn_implementation = a.attn_implementation;
  options.allow_all_kernels = a.allow_all_kernels;
  // The lock and signature policy (docs/security.md); HK_KERNELS_LOCK etc. apply without flags.
  options.hub = std::make_shared<hub::Hub>(hub::HubConfig::from_environment(
      a.policy.kernels_lock, a.policy.allow_unlocked, a.policy.require_signed));
  KernelizeReport report = kernelize(model.module(), mode, options);
  std::cout << (a.json ? report.to_json() + "\n" : report.to_text());
}

void add(CLI::App& app) {
  auto args = std::make_shared<KernelizeArgs>();
  CLI::App* cmd = app.add_subcommand("kernelize", "Show which kernel each layer of a model gets");
  cmd->add_option("--model", args->model, "Model directory (config.json + safetensors)")
      ->required();
  cmd->add_option("--mode", args->mode, "inference|training, optionally ,capture");
  cmd->add_option("--kernel-config", args->kernel_config, "KernelConfig JSON file");
  cmd->add_option("--attn-implementation", args->attn_implementation,
                  "eager, sdpa, flash_attention_2|3|4 or a hub id org/repo[@rev][:fn]");
  cmd->add_flag("--allow-all-kernels", args->allow_all_kernels,
                "Trust kernel repos outside the trusted orgs (runs their code)");
  add_kernel_policy_flags(cmd, args->policy);
  cmd->add_option("--device", args->device, "cpu or cuda[:N]");
  cmd->add_option("--dtype", args->dtype, "f32, bf16 or f16 (default: the checkpoint's)");
  cmd->add_flag("--report", args->report, "Print the per-layer decisions");
  cmd->add_flag("--json", args->json, "Print the report as JSON");
  cmd->callback([args] { run(*args); });
}

}  // namespace
HK_REGISTER_COMMAND(kernelize, add);
}  // namespace hk::cli
