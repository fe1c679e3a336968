// `hk kernelize --model DIR [--mode inference|training[,capture]] [--kernel-config FILE.json]
//  [--attn-implementation NAME] [--allow-all-kernels] [--device cpu|cuda[:N]|rocm|xpu|mps|npu]
//  [--capability N] [--cuda-runtime X.Y] [--simulate] [--dtype ..] --report [--json]
//  [--kernels-lock FILE] [--allow-unlocked-kernels] [--require-signed]`
// Loads the model, runs kernelize with the device-aware defaults (plus the config) and prints the
// decision for every layer: the kernel bound (repo:Entry, commit, variant) or why the built-in
// implementation stays. --json prints {"device", "mode", "layers": [{"path", "layer", "kernel" or
// null, "revision", "variant", "reason"}]}. It changes nothing on disk.
//
// Simulated selection: with --capability, --cuda-runtime or --simulate, or for a device this
// machine cannot run (rocm, xpu, mps, npu, or cuda without a GPU), the model is loaded on the cpu
// and the selection is made for the named device as for a real run — mapping, versions, variants,
// entries — but nothing is fetched or loaded; the report says so ("simulated": true, "target").
#include <iostream>

#include "commands.h"
#include "hk/device.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"
#include "hk/models.h"
#include "kernel_policy.h"

namespace hk::cli {
namespace {

struct KernelizeArgs {
  std::string model, mode = "inference", kernel_config, attn_implementation, device = "cpu", dtype;
  std::string cuda_runtime;
  int capability = 0;
  bool report = false, json = false, allow_all_kernels = false, simulate = false;
  KernelPolicyFlags policy;
};

// "13.0" → 13000 (cudaRuntimeGetVersion's encoding).
int parse_cuda_runtime(const std::string& text) {
  size_t dot = text.find('.');
  try {
    size_t used = 0;
    const int major = std::stoi(text.substr(0, dot), &used);
    if (used != (dot == std::string::npos ? text.size() : dot) || major <= 0) throw 0;
    int minor = 0;
    if (dot != std::string::npos) {
      minor = std::stoi(text.substr(dot + 1), &used);
      if (used != text.size() - dot - 1 || minor < 0 || minor > 99) throw 0;
    }
    return major * 1000 + minor * 10;
  } catch (...) {
    throw InvalidArgument("--cuda-runtime must look like 13.0 (major.minor), got '" + text + "'");
  }
}

// The device to select for, without touching a runtime (it may not exist here).
Device simulated_device(const std::string& text, int capability) {
  const size_t colon = text.find(':');
  const std::string type = text.substr(0, colon);
  Device d;
  static const std::pair<const char*, DeviceType> kTypes[] = {
      {"cpu", DeviceType::CPU}, {"cuda", DeviceType::CUDA}, {"rocm", DeviceType::ROCM},
      {"xpu", DeviceType::XPU}, {"mps", DeviceType::MPS},   {"npu", DeviceType::NPU}};
  bool known = false;
  for (const auto& [name, t] : kTypes)
    if (type == name) d.type = t, known = true;
  if (!known)
    throw InvalidArgument("--device must be cpu, cuda[:N], rocm, xpu, mps or npu, got '" + text +
                          "'");
  if (colon != std::string::npos) {
    try {
      d.index = std::stoi(text.substr(colon + 1));
    } catch (...) {
      throw InvalidArgument("--device " + text + ": the index after ':' must be a number");
    }
  }
  d.capability = capability;
  return d;
}

void run(const KernelizeArgs& a) {
  if (!a.report)
    throw InvalidArgument("hk kernelize only reports for now; pass --report (and --json for JSON)");
  const Mode mode = parse_mode(a.mode);
  const std::string type = a.device.substr(0, a.device.find(':'));
  const bool runnable = type == "cpu" || (type == "cuda" && cuda_available());
  const bool simulate = a.simulate || a.capability > 0 || !a.cuda_runtime.empty() || !runnable;
  if (a.capability < 0) throw InvalidArgument("--capability must be positive (e.g. 90 for sm_90)");
  if ((a.capability > 0 || !a.cuda_runtime.empty()) && type != "cuda" && type != "rocm")
    throw InvalidArgument(
        "--capability and --cuda-runtime describe a cuda (or rocm) device; "
        "pass --device cuda");

  LoadOptions load;
  load.device = simulate ? "cpu" : a.device;
  if (!a.dtype.empty()) load.dtype = parse_dtype(a.dtype);
  CausalLM model = AutoModelForCausalLM::from_pretrained(a.model, load);
  KernelizeOptions options;
  options.device = simulate ? simulated_device(a.device, a.capability) : model.device();
  options.dtype = model.dtype();
  options.simulate = simulate;
  if (!a.cuda_runtime.empty()) options.simulated_cuda_runtime = parse_cuda_runtime(a.cuda_runtime);
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
  cmd->add_option("--device", args->device, "cpu, cuda[:N], rocm, xpu, mps or npu");
  cmd->add_option("--capability", args->capability,
                  "Simulate a device of this compute capability (90 = sm_90)");
  cmd->add_option("--cuda-runtime", args->cuda_runtime, "Simulate this CUDA runtime (13.0)");
  cmd->add_flag("--simulate", args->simulate,
                "Only show the selection for --device: fetch and load nothing");
  cmd->add_option("--dtype", args->dtype, "f32, bf16 or f16 (default: the checkpoint's)");
  cmd->add_flag("--report", args->report, "Print the per-layer decisions");
  cmd->add_flag("--json", args->json, "Print the report as JSON");
  cmd->callback([args] { run(*args); });
}

}  // namespace
HK_REGISTER_COMMAND(kernelize, add);
}  // namespace hk::cli
