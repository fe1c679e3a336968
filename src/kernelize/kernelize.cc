// kernelize(): walk the module tree, decide each layer (mapping → hub → entry checks), bind an
// adapter or fall back to the built-in implementation, and record why. See hk/kernelize.h.
//
// Resolution and loading are memoised per (spec, options) within one call, so a model with 28
// RMSNorm layers resolves and verifies the library once. Errors are split on purpose: anything
// that makes a kernel unusable *here* (no variant for this device, wrong ABI, digest mismatch,
// untrusted repo in a mapping, entry lacking backward for training, ...) is a recorded fallback;
// a request the user made explicitly that cannot be met as written (a pinned version, revision
// or range that does not exist, a layer name the model does not register, an attention repo
// that needs allow_all_kernels) is an exception, because silently running something else is
// what "never load a kernel you did not mean to" forbids.
#include "hk/kernelize.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>

#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hk/layers.h"
#include "hk/module.h"
#include "kernelize/activation_binding.h"
#include "kernelize/adapters.h"
#include "kernelize/attention_binding.h"
#include "kernelize/fusion.h"
#include "kernelize/layouts.h"
#include "kernelize/mapping.h"

namespace hk {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

uint32_t mode_bits(Mode mode) {
  uint32_t bits = 0;
  if (has(mode, Mode::Inference)) bits |= kKernelModeInference;
  if (has(mode, Mode::Training)) bits |= kKernelModeTraining;
  if (has(mode, Mode::Capture)) bits |= kKernelModeCapture;
  return bits;
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

bool serves(const KernelEntryInfo& entry, const std::string& layer) {
  return kernel_binding::entry_serves(entry, layer);
}

// Whether an entry is the one to take for `layer` when the spec names none: one of the layer's own
// interface (an activation@1 for activation layers), not a stand-in such as the fused linear
// cross-entropy that can serve ForCausalLMLoss only when named.
bool default_entry_for(const KernelEntryInfo& entry, const std::string& layer) {
  const InterfaceInfo* info = find_interface(entry.interface, entry.interface_version);
  return (info && layer == info->layer) ||
         (entry.interface == "activation" && kernel_binding::is_activation_layer(layer));
}

// What metadata.json says of a variant's entries, in the loader's form: enough to choose an entry
// without loading the library (simulated selection).
std::vector<KernelEntryInfo> entries_from_metadata(const hub::VariantMetadata& metadata) {
  std::vector<KernelEntryInfo> out;
  for (const hub::EntryMetadata& m : metadata.entries) {
    KernelEntryInfo e;
    e.name = m.name;
    e.interface = m.interface;
    e.interface_version = static_cast<uint32_t>(m.interface_version);
    e.device = m.device;
    e.min_capability = m.min_capability;
    e.max_capability = m.max_capability;
    e.has_backward = m.backward;
    for (const std::string& mode : m.modes)
      e.modes |= mode == "inference"  ? kKernelModeInference
                 : mode == "training" ? kKernelModeTraining
                 : mode == "capture"  ? kKernelModeCapture
                                      : 0u;
    for (const std::string& dtype : m.dtypes) {
      try {
        e.dtypes |= HK_DTYPE_BIT(static_cast<uint32_t>(parse_dtype(dtype)));
      } catch (const Error&) {
        // a dtype this hk does not know: the entry cannot compute in it anyway
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

// The result of resolving + loading one (spec, options) pair.
struct LoadOutcome {
  std::shared_ptr<const KernelLibrary> library;
  hub::Resolution resolution;
  std::string failure;  // non-empty: why it cannot be used (the fallback reason)
  // Simulated selection: the chosen variant's entries from metadata.json (nothing loaded).
  std::vector<KernelEntryInfo> simulated_entries;
  bool usable() const { return library || !simulated_entries.empty(); }
  const std::vector<KernelEntryInfo>& entries() const {
    return library ? library->entries() : simulated_entries;
  }
  std::string version() const { return library ? library->version() : resolution.metadata.version; }
};

class Binder {
 public:
  Binder(Mode mode, const KernelizeOptions& options)
      : mode_(mode), options_(options), device_type_(mapping_device_type(options.device)) {
    Device target_device = options.device;
    if (device_type_ == "rocm") target_device.type = DeviceType::ROCM;
    target_ = hub::Target::for_device(target_device);
    if (options.simulate && options.simulated_cuda_runtime > 0)
      target_.cuda_runtime_version = options.simulated_cuda_runtime;
  }

  const std::string& device_type() const { return device_type_; }

  hub::Hub& hub() {
    if (!hub_) hub_ = options_.hub ? options_.hub : std::make_shared<hub::Hub>();
    return *hub_;
  }

  // Resolves and loads a spec (memoised). Throws only for explicit requests that cannot be met.
  const LoadOutcome& load(const MappedKernel& kernel, bool explicit_request, bool allow_untrusted) {
    const auto& o = kernel.options;
    const std::string key = kernel.spec + "|" + (o.version ? std::to_string(*o.version) : "") +
                            "|" + o.revision.value_or("") + "|" +
                            (o.trust_remote_code || allow_untrusted ? "t" : "");
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    LoadOutcome outcome;
    const hub::KernelSpec parsed = hub::KernelSpec::parse(kernel.spec);  // bad text: throws
    hub::ResolveOptions ro;
    ro.version = o.version;
    ro.revision = o.revision;
    ro.trust_remote_code = o.trust_remote_code || allow_untrusted;
    const bool pinned = o.version || o.revision || parsed.revision || parsed.version_range;
    if (parsed.kind == hub::KernelSpec::Kind::Hub && !hub_kernels_enabled()) {
      outcome.failure = "USE_HUB_KERNELS disables hub kernels";
    } else {
      // A kernel the lockfile does not pin is an error, not a fallback: falling back would hide
      // that the lock and the mapping disagree (docs/security.md).
      if (parsed.kind == hub::KernelSpec::Kind::Hub &&
          !hub().config().local_kernels.count(parsed.repo()))
        hub().check_locked(parsed.repo());
      // A pinned version that does not exist is an error, not a fallback: resolve it outside
      // the try so its NotFound (listing the versions that exist) reaches the caller.
      if (parsed.kind == hub::KernelSpec::Kind::Hub && explicit_request && pinned &&
          hub_kernels_enabled()) {
        hub::ResolveOptions pin = ro;
        if (parsed.revision) pin.revision = parsed.revision;
        hub().resolve_commit(parsed.repo(), pin, parsed.version_range);
      }
      try {
        if (options_.simulate) {
          // Choose as resolve() would, without fetching or loading anything.
          outcome.resolution = hub().explain(kernel.spec, target_, ro);
          if (outcome.resolution.variant.empty()) {
            outcome.failure =
                "no variant of " + outcome.resolution.repo + " fits " + target_.str() + ":";
            for (const auto& d : outcome.resolution.decisions)
              outcome.failure += " " + d.variant + ": " + d.reason + ";";
            outcome.failure.pop_back();
          } else {
            outcome.simulated_entries = entries_from_metadata(outcome.resolution.metadata);
          }
        } else {
          outcome.resolution = hub().resolve(kernel.spec, target_, ro);
          outcome.library = hub().load(outcome.resolution);
        }
      } catch (const Error& e) {
        outcome.failure = e.what();
      }
    }
    return memo_.emplace(key, std::move(outcome)).first->second;
  }

  // Picks and checks the entry of `outcome` for a module answering to `names` (its layer name
  // first); returns it, or sets `why`. Without a wanted entry, one whose name is one of the
  // module's names (case-insensitive) is preferred — an activation@1 entry computes one fixed
  // function, so for activation layers only a named match is taken.
  const KernelEntryInfo* pick_entry(const LoadOutcome& outcome, const std::string& wanted,
                                    const std::vector<std::string>& names, std::string& why) const {
    const std::string& layer = names.front();
    const std::string repo = outcome.library ? outcome.library->repo() : outcome.resolution.repo;
    const KernelEntryInfo* entry = nullptr;
    if (!wanted.empty()) {
      for (const auto& e : outcome.entries())
        if (e.name == wanted) entry = &e;
      if (!entry) {
        std::vector<std::string> all;
        for (const auto& e : outcome.entries()) all.push_back(e.name);
        why = repo + " " + outcome.version() + " has no entry " + wanted +
              " (entries: " + join(all) + ")";
        return nullptr;
      }
    } else {
      for (const auto& e : outcome.entries())
        for (const std::string& n : names)
          if (!entry && lower(e.name) == lower(n) && default_entry_for(e, layer) &&
              e.device == device_type_)
            entry = &e;
      for (const auto& e : outcome.entries())
        if (!entry && default_entry_for(e, layer) && e.device == device_type_ &&
            !kernel_binding::is_activation_layer(layer))
          entry = &e;
      if (!entry) {
        why = repo + " " + outcome.version() + " has no entry for layer " + layer + " on " +
              device_type_;
        return nullptr;
      }
    }
    if (!serves(*entry, layer)) {
      why =
          "entry " + entry->name + " implements " + entry->interface_id() + ", not layer " + layer;
      return nullptr;
    }
    if (entry->device != device_type_) {
      why = "entry " + entry->name + " runs on " + entry->device + ", not " + device_type_;
      return nullptr;
    }
    if (!entry->supports_capability(options_.device.capability)) {
      why = "entry " + entry->name + " does not support capability " +
            std::to_string(options_.device.capability);
      return nullptr;
    }
    if (!entry->supports_dtype(options_.dtype)) {
      why = "entry " + entry->name + " does not compute in " + dtype_name(options_.dtype) +
            " (it supports " + join(kernel_dtype_names(entry->dtypes)) + ")";
      return nullptr;
    }
    const uint32_t need = mode_bits(mode_);
    if (has(mode_, Mode::Training) && !entry->has_backward) {
      why = "entry " + entry->name + " has no backward, which training mode needs";
      return nullptr;
    }
    if (!entry->supports_mode(need)) {
      why = "entry " + entry->name + " supports modes " + join(kernel_mode_names(entry->modes)) +
            ", not " + mode_name(mode_);
      return nullptr;
    }
    return entry;
  }

  // An activation entry named for another function than the module computes (e.g. QuickGELU on
  // a GeLU layer): refused here rather than by the kernel at call time.
  bool activation_mismatch(const KernelEntryInfo& entry, const nn::Module& module,
                           std::string& why) const {
    const auto* act = dynamic_cast<const nn::Activation*>(&module);
    if (!act || entry.interface != "activation") return false;
    const auto kind = kernel_binding::activation_entry_kind(entry.name);
    if (!kind || *kind == kernel_binding::activation_code(act->kind())) return false;
    why = "entry " + entry.name + " computes another activation than " + module.type_name() + " (" +
          module.layer_interface() + ")";
    return true;
  }

  const hub::Target& target() const { return target_; }

 private:
  Mode mode_;
  const KernelizeOptions& options_;
  std::string device_type_;
  hub::Target target_;
  std::shared_ptr<hub::Hub> hub_;
  std::map<std::string, LoadOutcome> memo_;
};

// "org/repo:Entry"; a local kernel as the user named it ("/abs/path:Entry"), a LOCAL_KERNELS repo
// by its variant directory.
std::string display_name(const hub::Resolution& res, const KernelEntryInfo& entry) {
  if (res.local) {
    const hub::KernelSpec spec = hub::KernelSpec::parse(res.spec);
    if (spec.kind == hub::KernelSpec::Kind::Local) return spec.local_path + ":" + entry.name;
  }
  return (res.local ? res.dir.string() : res.repo) + ":" + entry.name;
}

// attn_implementation: built-in names, flash_attention_N → hub repos, or a hub id.
//
// Every name here is the user's explicit request, so: an untrusted repo without
// allow_all_kernels, a repo or pinned version the hub does not have, or a bad spec is an error;
// a kernel that exists but cannot serve this device, dtype or mode (no variant for the CUDA /
// capability, no entry for the layer, no backward for training) falls back to the built-in
// fused attention ("sdpa"), with the reason in the report and a warning on stderr. A bound hub
// entry also serves packed sequences when its library has an attention_varlen@1 entry, and gets
// a training form (hk/attention_functions.h) when it has a backward.
void bind_attention(nn::Module& root, Mode mode, const KernelizeOptions& options, Binder& binder,
                    KernelizeReport& report) {
  std::vector<std::pair<std::string, nn::Attention*>> layers;
  for (auto& [path, module] : root.named_modules())
    if (auto* attn = dynamic_cast<nn::Attention*>(module)) layers.emplace_back(path, attn);
  if (layers.empty()) return;

  std::string name = options.attn_implementation.empty() ? "eager" : options.attn_implementation;
  std::string reason;
  std::string kernel, revision, variant;
  auto fall_back = [&](const std::string& why) {
    reason = "attn_implementation=" + name + " cannot be used on " + report.device + ": " + why +
             "; using the built-in fused attention (sdpa)";
    std::cerr << "hk: warning: " << reason << "\n";
    name = "sdpa";
  };
  if (name == "eager") {
    reason = "attn_implementation=eager: built-in attention";
  } else if (name == "sdpa") {
    reason = std::string("attn_implementation=sdpa: built-in fused attention (") +
             (options.device.is_cuda() ? "hk's flash kernels" : "blocked online softmax") + ")";
  } else {
    std::string spec = name;
    if (name == "flash_attention_2" || name == "flash_attention_3" || name == "flash_attention_4") {
      // hk has no flash attention outside its hub repos: use the hub kernel, as Transformers
      // does when the compiled package is absent.
      spec = "kernels-community/flash-attn" + name.substr(name.size() - 1);
    }
    const hub::KernelSpec parsed = hub::KernelSpec::parse(spec);
    const bool from_hub = parsed.kind == hub::KernelSpec::Kind::Hub;
    if (from_hub && !binder.hub().is_trusted(parsed.repo()) && !options.allow_all_kernels)
      throw InvalidArgument("attn_implementation " + name + ": repo " + parsed.repo() +
                            " is outside the trusted orgs, and loading a kernel runs its code on "
                            "this machine; pass allow_all_kernels=true (--allow-all-kernels) if "
                            "you trust it");
    if (from_hub && !hub_kernels_enabled()) {
      fall_back("USE_HUB_KERNELS disables hub kernels");
    } else {
      if (from_hub && !binder.hub().config().local_kernels.count(parsed.repo())) {
        // the repo and any pinned version must exist (NotFound lists what does)
        hub::ResolveOptions pin;
        pin.revision = parsed.revision;
        pin.trust_remote_code = options.allow_all_kernels;
        binder.hub().resolve_commit(parsed.repo(), pin, parsed.version_range);
      }
      MappedKernel mk{spec, {}};
      const LoadOutcome& outcome =
          binder.load(mk, /*explicit_request=*/true, options.allow_all_kernels);
      std::string why = outcome.failure;
      const KernelEntryInfo* entry =
          outcome.usable() ? binder.pick_entry(outcome, parsed.entry, {"attention"}, why) : nullptr;
      if (!entry && options.simulate) {
        reason = "simulated for " + binder.target().str() + ": attn_implementation " + name +
                 " cannot be used: " + why;
        name = "sdpa";
      } else if (!entry) {
        fall_back(why);
      } else if (options.simulate) {
        kernel = display_name(outcome.resolution, *entry);
        revision = outcome.resolution.commit;
        variant = outcome.resolution.variant;
        reason = "simulated for " + binder.target().str() + ": would use " + kernel +
                 ", attn_implementation=" + name + " (" + outcome.resolution.revision +
                 "); nothing loaded";
      } else {
        kernel = display_name(outcome.resolution, *entry);
        revision = outcome.resolution.commit;
        variant = outcome.resolution.variant;
        kernel_binding::AttentionKernels fns;
        fns.attention = outcome.library->function(entry->name);
        for (const auto& e : outcome.library->entries())
          if (e.interface == "attention_varlen" && e.device == entry->device) {
            fns.varlen = outcome.library->function(e.name);
            break;
          }
        nn::register_attention_function(spec, kernel_binding::make_attention_function(fns));
        if (entry->has_backward)
          nn::register_attention_training(spec, kernel_binding::make_attention_training(fns));
        reason = "attn_implementation=" + name + " (" + outcome.resolution.revision + ", version " +
                 outcome.library->version() + (fns.varlen.valid() ? ", with varlen" : "") + ", " +
                 mode_name(mode) + ")";
        name = spec;
      }
    }
  }
  for (auto& [path, attn] : layers) {
    if (!options.simulate) attn->set_attn_implementation(name);
    report.layers.push_back({path, "attention", kernel, revision, variant, reason});
  }
}

// A stateful or fused kernel's layout, chosen for one binding (nothing applied yet).
struct LayoutChoice {
  kernel_binding::LayoutSpec spec;
  nn::Module* scope = nullptr;
  std::string scope_path;
  std::vector<nn::Module*> members;
  std::string key;
};

std::vector<std::string> paths_of(const std::vector<std::string>& member_paths,
                                  const std::string& scope_path) {
  std::vector<std::string> rel;
  for (const std::string& m : member_paths)
    rel.push_back(scope_path.empty() ? m : m.substr(std::min(m.size(), scope_path.size() + 1)));
  return rel;
}

// The layout of `entry` over `members` at `scope`, or nullopt with why it cannot be used. A
// member holding another layout gets its original parameters back first (the one it held is not
// what this binding wants); one holding this very layout is already in place.
std::optional<LayoutChoice> choose_layout(const KernelEntryInfo& entry, nn::Module& root,
                                          nn::Module& scope, const std::string& scope_path,
                                          const std::vector<nn::Module*>& members,
                                          const std::vector<std::string>& member_paths,
                                          std::string& why) {
  std::optional<kernel_binding::LayoutSpec> spec =
      kernel_binding::read_layout(*entry.raw->layout, why);
  if (!spec) {
    why = "entry " + entry.name + ": " + why;
    return std::nullopt;
  }
  LayoutChoice choice{
      *spec, &scope, scope_path, members,
      kernel_binding::layout_key(*spec, scope_path, paths_of(member_paths, scope_path))};
  bool in_place = true;
  for (nn::Module* m : members) {
    const std::string held = kernel_binding::applied_layout_key(*m);
    if (held != choice.key) in_place = false;
    if (!held.empty() && held != choice.key) kernel_binding::revert_layout(*m);
  }
  if (in_place) return choice;
  why = kernel_binding::check_layout(choice.spec, root, scope, members);
  if (!why.empty()) return std::nullopt;
  return choice;
}

// What the apply step binds: one layer's adapter or one fusion group.
struct Pending {
  std::shared_ptr<const KernelLibrary> library;
  const KernelEntryInfo* entry = nullptr;
  std::string display;
  std::optional<LayoutChoice> layout;
  std::vector<size_t> rows;  // report.layers rows to complete
  // a layer
  nn::Module* module = nullptr;
  std::string layer;
  // a fusion
  bool fusion = false;
  kernel_binding::FusionKind kind = kernel_binding::FusionKind::RmsNormMlp;
  kernel_binding::FusionGroup group;
};

std::string layout_note(const LayoutChoice& layout, const kernel_binding::AppliedLayout& applied) {
  const std::string name = "layout " + layout.spec.name;
  if (!applied.changed) return name + " (already in place)";
  if (applied.converted) return name + ", converted in place from the loaded parameters";
  return name +
         ", declared before the checkpoint loads (its conversion_mapping applied as the "
         "tensors load)";
}

// Decides every KernelConfig fusion (the groups, the kernel, its layout); returns the paths it
// covers. Bindings go to `pending`; fallbacks are recorded in the report right away.
std::set<std::string> decide_fusions(nn::Module& root, const KernelizeOptions& options,
                                     Binder& binder, KernelizeReport& report,
                                     std::vector<Pending>& pending) {
  std::set<std::string> fused;
  if (!options.use_kernels) return fused;
  const auto modules = root.named_modules();
  for (size_t f = 0; f < options.config.fusions.size(); ++f) {
    const FusionRule& rule = options.config.fusions[f];
    const std::string where = "fusion " + std::to_string(f) + " (" + rule.kernel.spec + ")";
    std::vector<kernel_binding::FusionGroup> groups =
        kernel_binding::match_fusion(rule, where, modules);
    for (const auto& g : groups)
      for (const std::string& p : g.member_paths)
        if (!p.empty() && fused.count(p))
          throw InvalidArgument(where + ": " + p + " is already fused by an earlier fusion");
    // Every complete group must be a fusion hk runs (an explicit request that cannot be met).
    std::optional<kernel_binding::FusionKind> kind;
    for (const auto& g : groups)
      if (g.complete()) {
        const kernel_binding::FusionKind k = kernel_binding::fusion_kind(g, where);
        if (kind && *kind != k)
          throw InvalidArgument(where + ": its groups are of different kinds");
        kind = k;
      }
    if (rule.kernel.spec.size() && rule.kernel.spec[0] == '/' && !options.config.use_local_kernel)
      throw InvalidArgument(where + ": a local path needs use_local_kernel=true");
    const hub::KernelSpec parsed = hub::KernelSpec::parse(rule.kernel.spec);
    const LoadOutcome& outcome =
        binder.load(rule.kernel, /*explicit_request=*/true, options.allow_all_kernels);
    std::string why;
    const KernelEntryInfo* entry =
        outcome.usable() && kind
            ? binder.pick_entry(outcome, parsed.entry, {kernel_binding::fusion_layer(*kind)}, why)
            : nullptr;
    if (outcome.library && entry && !entry->has_layout)
      throw InvalidArgument(where + ": kernel entry " + entry->name + " has no " + entry->name +
                            "Layout; a fusion needs the kernel's layout "
                            "to know the fused parameters");
    for (auto& g : groups) {
      auto record = [&](const std::string& kernel, const std::string& reason) {
        std::vector<size_t> rows;
        for (size_t i = 0; i < g.members.size(); ++i) {
          if (!g.members[i]) continue;
          rows.push_back(report.layers.size());
          report.layers.push_back({g.member_paths[i], g.members[i]->layer_interface(), kernel,
                                   kernel.empty() ? "" : outcome.resolution.commit,
                                   kernel.empty() ? "" : outcome.resolution.variant, reason});
          fused.insert(g.member_paths[i]);
        }
        return rows;
      };
      if (!g.complete()) {
        record("", where + ": no complete group under " + g.parent_path + ": built-in");
        continue;
      }
      if (!entry) {
        record("",
               where + " unusable: " + (outcome.usable() ? why : outcome.failure) + "; built-in");
        continue;
      }
      const std::string name = display_name(outcome.resolution, *entry);
      if (options.simulate) {
        record(name, "simulated: " + where + " would fuse these modules (" + entry->interface_id() +
                         "); nothing loaded");
        continue;
      }
      std::string layout_why;
      std::optional<LayoutChoice> layout = choose_layout(*entry, root, *g.parent, g.parent_path,
                                                         g.members, g.member_paths, layout_why);
      if (!layout) {
        record("", where + " unusable: " + layout_why + "; built-in");
        continue;
      }
      Pending p;
      p.library = outcome.library;
      p.entry = entry;
      p.display = name;
      p.layout = std::move(layout);
      p.fusion = true;
      p.kind = *kind;
      p.rows = record(name, "fused by kernel_config fusion " + std::to_string(f) + " (" +
                                entry->interface_id() + ")");
      p.group = std::move(g);
      pending.push_back(std::move(p));
    }
  }
  return fused;
}

// Applies what the decisions chose: layouts no binding wants are reverted, the others applied
// (re-declared on an unloaded tree, converted on a loaded one), then the implementations bound.
void apply_bindings(nn::Module& root, std::vector<Pending>& pending, KernelizeReport& report) {
  std::map<const nn::Module*, std::string> wanted;
  for (const Pending& p : pending)
    if (p.layout)
      for (const nn::Module* m : p.layout->members) wanted[m] = p.layout->key;
  for (auto& [path, module] : root.named_modules()) {
    const std::string held = kernel_binding::applied_layout_key(*module);
    if (held.empty()) continue;
    auto it = wanted.find(module);
    if (it == wanted.end() || it->second != held) kernel_binding::revert_layout(*module);
  }
  for (Pending& p : pending) {
    std::optional<kernel_binding::ParamRefs> params;
    std::string note;
    if (p.layout) {
      const kernel_binding::AppliedLayout applied = kernel_binding::apply_layout(
          p.layout->spec, *p.layout->scope, p.layout->scope_path, p.layout->members, p.layout->key);
      params = applied.parameters;
      note = "; " + layout_note(*p.layout, applied);
    }
    const KernelFunction fn = p.library->function(p.entry->name);
    if (p.fusion) {
      kernel_binding::FusedImpls impls =
          kernel_binding::make_fusion(p.kind, p.group, fn, p.display, *params);
      for (size_t i = 0; i < p.group.members.size(); ++i)
        p.group.members[i]->set_impl(impls.members[i]);
    } else {
      p.module->set_impl(
          kernel_binding::make_adapter(*p.module, p.layer, fn, p.display, std::move(params)));
    }
    for (size_t row : p.rows) report.layers[row].reason += note;
  }
}

// Every layout in the tree back to the original parameters and every layer to its built-in
// implementation: the state a failed kernelize leaves.
void restore_builtin(nn::Module& root) {
  for (auto& [path, module] : root.named_modules()) {
    kernel_binding::revert_layout(*module);
    if (!module->layer_interface().empty() && module->layer_interface() != "attention")
      module->reset_impl();
  }
}

}  // namespace

bool hub_kernels_enabled() {
  const char* v = std::getenv("USE_HUB_KERNELS");
  if (!v) return true;
  const std::string s = lower(v);
  return !(s == "0" || s == "off" || s == "no" || s == "false");
}

std::string mapping_device_type(const Device& device) {
  if (device.type == DeviceType::CUDA) {
    const char* backend = std::getenv("HK_DEVICE_BACKEND");
    if (backend && lower(backend) == "rocm") return "rocm";
  }
  return device_type_name(device.type);
}

// One line per explicit request that fell back (kernel_config value or fusion), the layers it
// concerned counted: the report has the details, stderr gets the sentence.
void warn_explicit_fallbacks(const KernelizeReport& report,
                             const std::vector<std::pair<std::string, std::string>>& fallbacks) {
  std::map<std::string, std::vector<std::string>> by_reason;  // reason → layers
  std::vector<std::string> order;
  for (const auto& [path, reason] : fallbacks) {
    if (!by_reason.count(reason)) order.push_back(reason);
    by_reason[reason].push_back(path);
  }
  for (const std::string& reason : order) {
    const auto& paths = by_reason[reason];
    std::string one_line;  // hub messages list variants on lines of their own
    for (size_t i = 0; i < reason.size(); ++i) {
      if (reason[i] != '\n') {
        one_line += reason[i];
        continue;
      }
      while (i + 1 < reason.size() && reason[i + 1] == ' ') ++i;
      if (!one_line.empty() && one_line.back() != ':') one_line += ";";
      one_line += " ";
    }
    std::cerr << "hk: warning: an explicitly requested kernel falls back to the built-in on "
              << report.device << " for " << paths.front()
              << (paths.size() > 1 ? " and " + std::to_string(paths.size() - 1) + " more" : "")
              << ": " << one_line << "\n";
  }
}

namespace {

KernelizeReport kernelize_impl(nn::Module& root, Mode mode, const KernelizeOptions& options) {
  Binder binder(mode, options);
  KernelizeReport report;
  report.device = binder.device_type() == "rocm" ? "rocm:" + std::to_string(options.device.index)
                                                 : options.device.str();
  report.mode = mode;
  if (options.simulate) report.simulated_target = binder.target().str();

  auto modules = root.named_modules();
  std::set<std::string> registered;
  for (auto& [path, module] : modules)
    if (!module->layer_interface().empty())
      for (const std::string& name : kernel_binding::mapping_names(*module))
        registered.insert(name);
  for (const auto& [layer, value] : options.config.kernel_mapping) {
    (void)value;
    if (!registered.count(layer))
      throw InvalidArgument("kernel_config maps layer '" + layer +
                            "', which this model does not register; registered layers: " +
                            join(std::vector<std::string>(registered.begin(), registered.end())));
  }

  if (!options.simulate)
    for (auto& [path, module] : modules)
      if (!module->layer_interface().empty() && module->layer_interface() != "attention")
        module->reset_impl();
  std::vector<Pending> pending;
  const size_t first_fused = report.layers.size();
  const std::set<std::string> fused = decide_fusions(root, options, binder, report, pending);
  std::vector<std::pair<std::string, std::string>> explicit_fallbacks;
  for (size_t i = first_fused; i < report.layers.size(); ++i)
    if (report.layers[i].kernel.empty())
      explicit_fallbacks.emplace_back(report.layers[i].path, report.layers[i].reason);

  const auto rules = kernel_binding::effective_rules(options.config);
  for (auto& [path, module] : modules) {
    const std::string& layer = module->layer_interface();
    if (layer.empty() || layer == "attention" || fused.count(path)) continue;
    LayerDecision d{path, layer, "", "", "", ""};
    const std::vector<std::string> names = kernel_binding::mapping_names(*module);
    auto choice = kernel_binding::choose_rule(rules, names, binder.device_type(),
                                              options.device.capability, mode);
    const bool explicit_request = choice && choice->rule.source == "kernel_config";
    if (!options.use_kernels) {
      d.reason = "use_kernels is off: built-in";
    } else if (!choice) {
      d.reason = "no kernel mapped for " + layer + " on " + binder.device_type() + " in " +
                 mode_name(mode) + " mode: built-in";
    } else if (choice->rule.kernel.disabled()) {
      d.reason = explicit_request ? "disabled by kernel_config (empty value): built-in"
                                  : "the default table keeps the built-in " + choice->rule.layer +
                                        " on " + binder.device_type() + " in " +
                                        mode_name(choice->matched_mode) + " mode";
    } else if (!kernel_binding::has_adapter(layer)) {
      d.reason = "hk has no kernel adapter for layer " + layer + ": built-in";
    } else {
      const MappedKernel& mk = choice->rule.kernel;
      if (mk.spec[0] == '/' && !options.config.use_local_kernel)
        throw InvalidArgument("kernel_config maps " + layer + " to the local path " + mk.spec +
                              "; set use_local_kernel=true to load kernels from local paths");
      const LoadOutcome& outcome = binder.load(mk, explicit_request, options.allow_all_kernels);
      std::string why;
      const KernelEntryInfo* entry =
          outcome.usable()
              ? binder.pick_entry(outcome, hub::KernelSpec::parse(mk.spec).entry, names, why)
              : nullptr;
      if (entry && binder.activation_mismatch(*entry, *module, why)) entry = nullptr;
      if (entry) why = kernel_binding::adapter_refusal(*module, layer, *entry, mode);
      if (entry && !why.empty()) entry = nullptr;
      // A stateful kernel: its layout must fit this module (its parameters, shapes, no ties).
      std::optional<LayoutChoice> layout;
      if (entry && entry->has_layout && !options.simulate) {
        layout = choose_layout(*entry, root, *module, path, {module}, {path}, why);
        if (!layout) entry = nullptr;
      }
      const std::string mapped =
          choice->rule.layer == layer ? "" : " (as " + choice->rule.layer + ")";
      if (!outcome.usable()) {
        d.reason = mk.spec + mapped + " unusable: " + outcome.failure + "; built-in";
      } else if (!entry) {
        d.reason = mk.spec + mapped + " unusable: " + why + "; built-in";
      } else {
        d.kernel = display_name(outcome.resolution, *entry);
        d.revision = outcome.resolution.commit;
        d.variant = outcome.resolution.variant;
        d.reason = "mapped by " + choice->rule.source + mapped + " (" +
                   mode_name(choice->matched_mode) + " entry); " + outcome.resolution.repo + "@" +
                   outcome.resolution.revision + ", version " + outcome.version();
        if (options.simulate) {
          d.reason = "simulated for " + binder.target().str() + ": would bind; " + d.reason +
                     "; nothing loaded";
        } else {
          Pending p;
          p.library = outcome.library;
          p.entry = entry;
          p.display = d.kernel;
          p.layout = std::move(layout);
          p.module = module;
          p.layer = layer;
          p.rows.push_back(report.layers.size());
          pending.push_back(std::move(p));
        }
      }
      if (d.kernel.empty() && explicit_request) explicit_fallbacks.emplace_back(path, d.reason);
    }
    report.layers.push_back(std::move(d));
  }
  if (!options.simulate) apply_bindings(root, pending, report);
  bind_attention(root, mode, options, binder, report);
  if (options.warn_on_fallback && !options.simulate)
    warn_explicit_fallbacks(report, explicit_fallbacks);
  return report;
}

}  // namespace

KernelizeReport kernelize(nn::Module& root, Mode mode, const KernelizeOptions& options) {
  validate_mode(mode);
  if (options.simulate) return kernelize_impl(root, mode, options);
  try {
    return kernelize_impl(root, mode, options);
  } catch (...) {
    // A request that cannot be met leaves the model as the built-in one, never half-converted.
    restore_builtin(root);
    throw;
  }
}

}  // namespace hk
