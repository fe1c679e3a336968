// AutoModelForCausalLM (model_type registry, from_config, from_pretrained) and the CausalLM handle.
//
// from_pretrained: config.json → tree (unallocated) → checkpoint opened and validated by
// hk::Checkpoint → before_load: the user's hook, then hk::kernelize (Inference) when kernels or a
// non-built-in attention were asked for — on the unallocated tree, so kernel layouts re-declare
// their parameters — → load_state_dict through the key mapping and the layouts' conversions (all
// checks before any copy; each weight loaded once, in its final form).
#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include <iostream>

#include "decoder_lm.h"
#include "hk/attention_functions.h"
#include "hk/checkpoint.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/ops.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

std::map<std::string, ModelBuilder>& builders() {
  static std::map<std::string, ModelBuilder> b;
  return b;
}
std::map<std::string, CheckpointAdapter>& checkpoint_adapters() {
  static std::map<std::string, CheckpointAdapter> a;
  return a;
}

// The dim order (outermost first) in which `v` walks one dense block of memory, or nullopt when
// its elements are not such a block (e.g. a slice of a wider row).
std::optional<std::vector<int>> dense_permutation(const TensorView& v) {
  std::vector<int> order(static_cast<size_t>(v.ndim));
  for (int d = 0; d < v.ndim; ++d) order[static_cast<size_t>(d)] = d;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return v.strides[a] > v.strides[b]; });
  if (v.permute(order).is_contiguous()) return order;
  return std::nullopt;
}
Shape permuted_shape(const TensorView& v, const std::vector<int>& order) {
  Shape out;
  for (int d : order) out.push_back(v.shape[d]);
  return out;
}
std::vector<int> inverse(const std::vector<int>& order) {
  std::vector<int> inv(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    inv[static_cast<size_t>(order[i])] = static_cast<int>(i);
  return inv;
}

// hk::Checkpoint as a StateDictSource.
class CheckpointSource final : public nn::StateDictSource {
 public:
  explicit CheckpointSource(Checkpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}
  std::vector<std::string> keys() const override { return checkpoint_.names(); }
  Shape shape(const std::string& key) const override { return checkpoint_.info(key).shape; }
  Tensor load(const std::string& key, Device device, std::optional<DType> dtype,
              Stream stream) const override {
    const TensorInfo& info = checkpoint_.info(key);
    if (!info.dtype)
      throw Unsupported("tensor '" + key + "' in checkpoint " + checkpoint_.path() + " has dtype " +
                        info.dtype_name + ", which hk cannot compute with");
    if (!is_floating(*info.dtype)) dtype.reset();
    return checkpoint_.load(key, device, dtype, stream);
  }
  DType dtype_of(const std::string& key) const override {
    const TensorInfo& info = checkpoint_.info(key);
    if (!info.dtype)
      throw Unsupported("tensor '" + key + "' in checkpoint " + checkpoint_.path() + " has dtype " +
                        info.dtype_name + ", which hk cannot compute with");
    return *info.dtype;
  }
  // Straight from the mapping into the parameter's slice (a layout's concatenation or transpose):
  // a cpu parameter gets the converted values written in place; a cuda one gets one host-to-device
  // copy of the source when its slice is dense, so no device-side copy of the weights exists.
  void load_into(const std::string& key, const TensorView& dst, Stream stream) const override {
    const DType stored = dtype_of(key);
    if (stored != dst.dtype && (!is_floating(stored) || !is_floating(dst.dtype)))
      throw InvalidArgument("tensor '" + key + "' in checkpoint " + checkpoint_.path() + " is " +
                            dtype_name(stored) + " and cannot be loaded into a " +
                            dtype_name(dst.dtype) + " parameter");
    Tensor host;
    try {
      host = checkpoint_.file_of(key).tensor(key);  // zero-copy view of the mapping
    } catch (const Unsupported&) {
      host = checkpoint_.load(key);  // unaligned data: a host copy
    }
    if (dst.device.is_cpu()) {  // converted (or copied) straight into the slice
      ops::cast(host, dst);
      return;
    }
    if (stored != dst.dtype) {  // as SafetensorsFile::load: converted on the host first
      Tensor converted = Tensor::empty(host.sizes(), dst.dtype, Device::cpu());
      ops::cast(host, converted);
      host = converted;
    }
    if (dst.is_contiguous()) {
      copy_view(dst, host.view(), stream);
      return;
    }
    // A strided device slice (a transpose): order the host copy like the slice's memory, then one
    // dense host-to-device copy when the slice covers a dense block.
    if (const auto dense = dense_permutation(dst)) {
      Tensor staged = Tensor::empty(permuted_shape(dst, *dense), dst.dtype, Device::cpu());
      copy_view(staged.view().permute(inverse(*dense)), host.view());
      TensorView block = dst.permute(*dense);
      copy_view(block, staged.view(), stream);
      return;
    }
    copy_view(dst, host.view(), stream);  // staged through the device (one source's worth)
  }
  std::string describe() const override { return "checkpoint " + checkpoint_.path(); }
  const Checkpoint& checkpoint() const { return checkpoint_; }

 private:
  Checkpoint checkpoint_;
};

std::string supported_list() {
  std::string out;
  for (const auto& [name, b] : builders()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// An attention function to use as registered: the built-in ones and those a program registered
// under its own name. A hub id ("org/repo[:entry]") is always kernelize's, also once an earlier
// load registered its function, so every load verifies the kernel and reports the binding.
bool registered_locally(const std::string& name) {
  return name.find('/') == std::string::npos && nn::has_attention_function(name);
}

}  // namespace

bool register_model_type(const std::string& model_type, ModelBuilder builder,
                         CheckpointAdapter adapter) {
  builders()[model_type] = std::move(builder);
  if (adapter) checkpoint_adapters()[model_type] = std::move(adapter);
  return true;
}

std::vector<std::string> AutoModelForCausalLM::supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, b] : builders()) out.push_back(name);
  return out;
}

CausalLM AutoModelForCausalLM::from_config(const ModelConfig& config, const LoadOptions& options) {
  auto it = builders().find(config.model_type);
  if (it == builders().end())
    throw InvalidArgument("model_type '" + config.model_type +
                          "' is not supported; supported model types: " + supported_list());
  std::shared_ptr<DecoderLM> lm = it->second(config);
  lm->load_options = options;
  lm->device = Device::parse(options.device);
  lm->dtype = options.dtype.value_or(config.dtype.value_or(DType::F32));
  if (!is_floating(lm->dtype))
    throw InvalidArgument(std::string("dtype ") + dtype_name(lm->dtype) +
                          " cannot hold model weights; use f32, bf16 or f16");
  // Built-in attention functions are set here; hub ids and flash names are kernelize's.
  if (options.attn_implementation.empty() || registered_locally(options.attn_implementation))
    lm->set_attn_implementation(options.attn_implementation.empty() ? "eager"
                                                                    : options.attn_implementation);
  lm->eval();
  return CausalLM(lm);
}

CausalLM AutoModelForCausalLM::from_pretrained(const std::string& dir, const LoadOptions& options) {
  if (!fs::is_directory(dir))
    throw NotFound("model directory " + dir +
                   " does not exist (it should hold config.json and "
                   "model.safetensors)");
  ModelConfig config = ModelConfig::from_file(dir);
  if (!builders().count(config.model_type))
    throw InvalidArgument(dir + "/config.json: model_type '" + config.model_type +
                          "' is not supported; supported model types: " + supported_list());
  CheckpointSource source(Checkpoint::open(dir));

  LoadOptions resolved = options;
  if (!resolved.dtype) {
    resolved.dtype = config.dtype;
    if (!resolved.dtype) {  // "auto" without a config dtype: the checkpoint's floating dtype
      for (const auto& name : source.keys()) {
        const auto& d = source.checkpoint().info(name).dtype;
        if (d && is_floating(*d)) {
          resolved.dtype = *d;
          break;
        }
      }
    }
  }
  CausalLM model = from_config(config, resolved);
  DecoderLM& lm = model.impl();
  lm.load_options = options;
  lm.generation_config = GenerationConfig::from_dir(dir);

  if (options.before_load) options.before_load(lm);
  // kernelize runs on the still unallocated tree: stateful and fused kernels re-declare their
  // parameters in their layout's form, and the checkpoint then loads straight into it (one copy).
  const bool config_given =
      options.kernel_config.has_value() || !options.kernel_config_file.empty();
  const bool builtin_attention =
      options.attn_implementation.empty() || registered_locally(options.attn_implementation);
  if (options.use_kernels || config_given || !builtin_attention || options.allow_all_kernels) {
    if (config_given && !options.use_kernels)
      std::cerr << "hk: note: kernel_config implies use_kernels\n";
    KernelizeOptions k;
    k.device = lm.device;
    k.dtype = lm.dtype;
    k.use_kernels = options.use_kernels || config_given;
    if (options.kernel_config) k.config = *options.kernel_config;
    if (!options.kernel_config_file.empty())
      k.config = KernelConfig::from_file(options.kernel_config_file);
    k.attn_implementation = options.attn_implementation;
    k.allow_all_kernels = options.allow_all_kernels;
    // One Hub with the lock and signature policy, kept in kernelize_options so train()/eval()
    // re-apply them.
    if (!options.kernels_lock.empty() || options.allow_unlocked_kernels ||
        options.require_signed_kernels) {
      k.hub = std::make_shared<hub::Hub>(hub::HubConfig::from_environment(
          options.kernels_lock, options.allow_unlocked_kernels, options.require_signed_kernels));
    }
    lm.kernelize_report = kernelize(
        lm, options.kernelize_capture ? Mode::Inference | Mode::Capture : Mode::Inference, k);
    lm.kernelize_options = k;
  }
  nn::LoadStateOptions load;
  load.key_mapping = options.key_mapping;
  load.device = lm.device;
  load.dtype = lm.dtype;
  load.ignore_unexpected_suffixes = {"rotary_emb.inv_freq"};
  // A model type whose checkpoint keys differ from hk's tree (e.g. per-expert MoE weights) reads
  // through its adapter.
  std::unique_ptr<nn::StateDictSource> adapted;
  if (auto a = checkpoint_adapters().find(config.model_type); a != checkpoint_adapters().end())
    adapted = a->second(source);
  nn::load_state_dict(lm, adapted ? *adapted : static_cast<const nn::StateDictSource&>(source),
                      load);
  return model;
}

// ---- CausalLM --------------------------------------------------------------------------------

CausalLM::CausalLM(std::shared_ptr<DecoderLM> impl) : impl_(std::move(impl)) {}

namespace {
DecoderLM& need(const std::shared_ptr<DecoderLM>& impl) {
  if (!impl)
    throw InvalidArgument(
        "CausalLM is empty; create it with AutoModelForCausalLM::from_pretrained");
  return *impl;
}
}  // namespace

const ModelConfig& CausalLM::config() const {
  return need(impl_).config;
}
const GenerationConfig& CausalLM::generation_config() const {
  return need(impl_).generation_config;
}
const LoadOptions& CausalLM::load_options() const {
  return need(impl_).load_options;
}
nn::Module& CausalLM::module() const {
  return need(impl_);
}
Device CausalLM::device() const {
  return need(impl_).device;
}
DType CausalLM::dtype() const {
  return need(impl_).dtype;
}

CausalLMOutput CausalLM::forward(const Tensor& input_ids, const ForwardOptions& options) const {
  return need(impl_).forward(input_ids, options);
}

CausalLMOutput CausalLM::forward(const Tensor& input_ids, const Tensor& labels) const {
  ForwardOptions options;
  options.labels = labels;
  return need(impl_).forward(input_ids, options);
}

CausalLM& CausalLM::train(bool on) {
  DecoderLM& lm = need(impl_);
  lm.train(on);
  if (lm.kernelize_options) {
    const Mode capture = lm.load_options.kernelize_capture ? Mode::Capture : Mode::None;
    lm.kernelize_report =
        kernelize(lm, (on ? Mode::Training : Mode::Inference) | capture, *lm.kernelize_options);
  }
  return *this;
}

const KernelizeReport* CausalLM::kernelize_report() const {
  const DecoderLM& lm = need(impl_);
  return lm.kernelize_report ? &*lm.kernelize_report : nullptr;
}

bool CausalLM::is_training() const {
  return need(impl_).is_training();
}

std::vector<std::pair<std::string, nn::Parameter*>> CausalLM::named_parameters() const {
  // Module order is registration order (Transformers'); within a module torch registers
  // `weight` before `bias`, so weight comes first here too.
  std::vector<std::pair<std::string, nn::Parameter*>> out;
  for (auto& [path, module] : need(impl_).named_modules()) {
    std::vector<std::pair<std::string, nn::Parameter*>> local;
    for (auto& [name, p] : module->local_parameters()) {
      if (p.is_buffer || !p.tied_to.empty()) continue;
      local.emplace_back(path.empty() ? name : path + "." + name, &module->slot(name));
    }
    std::stable_partition(local.begin(), local.end(), [](const auto& e) {
      const std::string& n = e.first;
      return n == "weight" || (n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0);
    });
    out.insert(out.end(), local.begin(), local.end());
  }
  return out;
}

void CausalLM::zero_grad(bool set_to_none) {
  for (auto& [name, p] : named_parameters()) {
    if (!p->grad.defined()) continue;
    if (set_to_none)
      p->grad = Tensor();
    else
      ops::fill(p->grad, 0.0);
  }
}

void CausalLM::zero_grad_lazily() {
  for (auto& [name, p] : named_parameters())
    if (p->grad.defined()) p->grad_overwrite = true;
}

CausalLM& CausalLM::gradient_checkpointing_enable(bool on) {
  need(impl_).gradient_checkpointing = on;
  return *this;
}

bool CausalLM::is_gradient_checkpointing() const {
  return need(impl_).gradient_checkpointing;
}

CausalLM& CausalLM::to(Device device, std::optional<DType> dtype) {
  DecoderLM& lm = need(impl_);
  lm.Module::to(device, dtype);
  lm.device = device;
  if (dtype) lm.dtype = *dtype;
  return *this;
}

}  // namespace hk
