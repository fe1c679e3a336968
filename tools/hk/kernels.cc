// `hk kernels list | info | versions | download | lock | verify | explain | sign | keygen` — the
// hub from the shell.
//
// Every subcommand works through hk::hub::Hub configured from the environment (HK_ENDPOINT,
// HK_HUB_DIR, HK_KERNELS_CACHE, HF_HUB_OFFLINE, HK_KERNELS_LOCK, HK_PUBLISHER_KEYS, ...); without
// HK_HUB_DIR the hub directory is <exe dir>/../hub, the embedded hub a build writes. `verify`
// takes --kernels-lock / --allow-unlocked-kernels / --require-signed like every command that
// loads kernels. `sign` and `keygen` are the publisher's side of signed kernels
// (hk/hub_signing.h). Output is for people unless --json is given; errors are hk::Error
// sentences (exit 1).
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "commands.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/hub_lockfile.h"
#include "hk/hub_signing.h"
#include "hk/kernel_loader.h"
#include "kernel_policy.h"

namespace fs = std::filesystem;

namespace hk::cli {
namespace {

using hub::Hub;
using hub::HubConfig;

struct TargetFlags {
  std::string device = "cpu";
  int capability = -1;       // override (simulate another GPU)
  std::string cuda_runtime;  // override, "13.0"
  bool trust_remote_code = false;
};

void add_target_flags(CLI::App* cmd, TargetFlags& flags) {
  cmd->add_option("--device", flags.device, "cpu, cuda, cuda:1, rocm, xpu (default cpu)");
  cmd->add_option("--capability", flags.capability, "override the device capability (e.g. 90)");
  cmd->add_option("--cuda-runtime", flags.cuda_runtime, "override the CUDA runtime version (13.0)");
  cmd->add_flag("--trust-remote-code", flags.trust_remote_code,
                "allow repos outside the trusted orgs (their code runs in this process)");
}

hub::Target make_target(const TargetFlags& flags) {
  Device device;
  try {
    device = Device::parse(flags.device);
  } catch (const Unsupported&) {
    // No runtime for this device type here: explain still works for a simulated device.
    std::string type = flags.device.substr(0, flags.device.find(':'));
    device = Device::parse("cpu");
    static const std::pair<const char*, DeviceType> kTypes[] = {{"cuda", DeviceType::CUDA},
                                                                {"rocm", DeviceType::ROCM},
                                                                {"xpu", DeviceType::XPU},
                                                                {"mps", DeviceType::MPS},
                                                                {"npu", DeviceType::NPU}};
    for (auto [name, t] : kTypes)
      if (type == name) device.type = t;
    if (device.is_cpu()) throw;
  }
  hub::Target target = hub::Target::for_device(device);
  if (flags.capability >= 0) target.device.capability = flags.capability;
  if (!flags.cuda_runtime.empty()) {
    hub::SemVer v = hub::SemVer::parse(flags.cuda_runtime);
    target.cuda_runtime_version = v.major * 1000 + v.minor * 10;
  }
  return target;
}

// The library's lookup (hub::default_hub_dir: next to libhk.so, or the installed share/hk/hub), so
// the CLI and programs linking libhk find the same embedded hub.
HubConfig config_from_environment(const KernelPolicyFlags& policy = {}) {
  return HubConfig::from_environment(policy.kernels_lock, policy.allow_unlocked,
                                     policy.require_signed);
}

std::string short_commit(const std::string& c) {
  return c.substr(0, 12);
}

void cmd_list(bool json) {
  Hub hub(config_from_environment());
  auto repos = hub.list_repos();
  if (json) {
    std::cout << nlohmann::json{{"repos", repos}}.dump(2) << "\n";
    return;
  }
  if (repos.empty())
    std::cerr << "no kernel repos in the "
              << "hub\n";
  for (const auto& r : repos) std::cout << r << "\n";
}

void cmd_versions(const std::string& repo) {
  Hub hub(config_from_environment());
  hub::RefTable refs = hub.refs(repo);
  for (const auto& v : hub.versions(repo)) {
    std::string tag = "v" + v.str();
    auto it = refs.tags.find(tag);
    std::cout << v.str() << "  " << (it == refs.tags.end() ? "" : short_commit(it->second)) << "\n";
  }
  for (const auto& [branch, commit] : refs.branches)
    std::cout << "branch " << branch << "  " << short_commit(commit) << "\n";
}

nlohmann::json variant_json(const hub::VariantMetadata& m) {
  nlohmann::json v{{"name", m.variant},
                   {"backend", m.backend.type},
                   {"entries", m.entry_names()},
                   {"version", m.version},
                   {"abi", m.abi_major}};
  if (!m.backend.version.empty()) v["backend_version"] = m.backend.version;
  if (!m.backend.archs.empty()) v["archs"] = m.backend.archs;
  return v;
}

void print_variants(const std::vector<hub::VariantMetadata>& variants, const char* indent) {
  for (const auto& m : variants) {
    std::cout << indent << m.variant << "  backend " << m.backend.type;
    if (!m.backend.version.empty()) std::cout << " " << m.backend.version;
    std::cout << "  entries:";
    for (const auto& e : m.entry_names()) std::cout << " " << e;
    std::cout << "\n";
  }
}

// What the publisher says a build is (metadata.json provenance.description), if anything.
std::string description_of(const std::vector<hub::VariantMetadata>& variants) {
  for (const auto& m : variants) {
    const auto p = nlohmann::json::parse(m.provenance_json, nullptr, false);
    if (p.is_object() && p.contains("description") && p["description"].is_string())
      return p["description"].get<std::string>();
  }
  return {};
}

// `hk kernels info REPO` with no version, revision or range: every release (vX.Y.Z tag) with its
// commit, the branches on it and its variants; "revision" is the default version's (branch v1)
// commit when there is one, else the newest release's.
void cmd_info_all(Hub& hub, const std::string& repo, bool json) {
  const hub::RefTable refs = hub.refs(repo);
  std::vector<std::string> versions;
  nlohmann::json releases = nlohmann::json::array();
  std::string default_commit, default_ref;
  std::vector<hub::VariantMetadata> default_variants;
  std::set<std::string> covered;  // commits listed as a release
  auto add_release = [&](const std::string& label, const std::string& tag,
                         const std::string& commit) {
    nlohmann::json r{{"version", label}, {"tag", tag}, {"commit", commit}};
    nlohmann::json branches = nlohmann::json::array();
    for (const auto& [branch, c] : refs.branches)
      if (c == commit) branches.push_back(branch);
    r["branches"] = branches;
    std::vector<hub::VariantMetadata> variants;
    try {
      variants = hub.variants(repo, commit);
    } catch (const Error& e) {
      r["error"] = e.what();
    }
    r["variants"] = nlohmann::json::array();
    for (const auto& m : variants) r["variants"].push_back(variant_json(m));
    const std::string description = description_of(variants);
    if (!description.empty()) r["description"] = description;
    covered.insert(commit);
    if (json) {
      releases.push_back(r);
      return;
    }
    std::cout << "  " << label << "  commit " << short_commit(commit);
    for (const auto& b : branches) std::cout << "  branch " << b.get<std::string>();
    std::cout << "\n";
    if (!description.empty()) std::cout << "      " << description << "\n";
    if (r.contains("error")) std::cout << "      " << r["error"].get<std::string>() << "\n";
    print_variants(variants, "      ");
  };
  if (!json) {
    std::cout << repo << "  "
              << (hub.is_trusted(repo) ? "trusted org"
                                       : "untrusted org (needs --trust-remote-code)")
              << "\n";
    std::cout << "releases (name one with @vX.Y.Z, @vN or --version N; a config without a version "
                 "gets branch v1):\n";
  }
  for (const auto& v : hub.versions(repo)) {
    versions.push_back(v.str());
    const std::string tag = "v" + v.str();
    add_release(v.str(), tag, refs.tags.at(tag));
  }
  for (const auto& [branch, commit] : refs.branches)
    if (!covered.count(commit)) add_release("branch " + branch, "", commit);
  auto v1 = refs.branches.find("v1");
  if (v1 != refs.branches.end()) {
    default_commit = v1->second, default_ref = "v1";
  } else if (!versions.empty()) {
    default_ref = "v" + versions.back();
    default_commit = refs.tags.at(default_ref);
  }
  if (!json) {
    if (versions.empty() && refs.branches.empty()) std::cout << "  (none)\n";
    return;
  }
  nlohmann::json out{{"repo", repo},
                     {"revision", default_commit},
                     {"ref", default_ref},
                     {"versions", versions},
                     {"trusted", hub.is_trusted(repo)},
                     {"variants", nlohmann::json::array()},
                     {"releases", releases}};
  for (const auto& r : releases)
    if (r["commit"] == default_commit) out["variants"] = r["variants"];
  std::cout << out.dump(2) << "\n";
}

void cmd_info(const std::string& spec_text, const std::string& revision, int version, bool json) {
  Hub hub(config_from_environment());
  hub::KernelSpec spec = hub::KernelSpec::parse(spec_text);
  if (spec.kind != hub::KernelSpec::Kind::Hub)
    throw InvalidArgument("hk kernels info takes org/repo[@revision], not a local path");
  if (!spec.revision && !spec.version_range && revision.empty() && version < 0)
    return cmd_info_all(hub, spec.repo(), json);
  hub::ResolveOptions options;
  if (spec.revision)
    options.revision = spec.revision;
  else if (!revision.empty())
    options.revision = revision;
  if (version >= 0) options.version = version;
  std::string pinned;
  std::string commit = hub.resolve_commit(spec.repo(), options, spec.version_range, &pinned);
  std::vector<std::string> versions;
  for (const auto& v : hub.versions(spec.repo())) versions.push_back(v.str());
  auto variants = hub.variants(spec.repo(), commit);
  nlohmann::json out{{"repo", spec.repo()},
                     {"revision", commit},
                     {"ref", pinned},
                     {"versions", versions},
                     {"trusted", hub.is_trusted(spec.repo())},
                     {"variants", nlohmann::json::array()}};
  for (const auto& m : variants) out["variants"].push_back(variant_json(m));
  const std::string description = description_of(variants);
  if (!description.empty()) out["description"] = description;
  if (json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::cout << spec.repo() << " at " << pinned << " = " << commit << "\n";
  if (!description.empty()) std::cout << description << "\n";
  std::cout << "versions: ";
  for (size_t i = 0; i < versions.size(); ++i) std::cout << (i ? ", " : "") << versions[i];
  std::cout << "\n"
            << (hub.is_trusted(spec.repo()) ? "trusted org"
                                            : "untrusted org (needs --trust-remote-code)")
            << "\n";
  print_variants(variants, "  ");
}

void cmd_explain(const std::string& spec, const std::string& revision, int version,
                 const TargetFlags& flags) {
  Hub hub(config_from_environment());
  hub::Target target = make_target(flags);
  hub::ResolveOptions options;
  if (!revision.empty()) options.revision = revision;
  if (version >= 0) options.version = version;
  options.trust_remote_code = flags.trust_remote_code;
  hub::Resolution res = hub.explain(spec, target, options);
  std::cout << "kernel  " << res.spec << "\n";
  std::cout << "source  " << res.source << "\n";
  if (!res.local) std::cout << "commit  " << res.commit << " (" << res.revision << ")\n";
  std::cout << "target  " << target.str() << "\n";
  std::cout << "variants:\n";
  for (const auto& d : res.decisions) {
    const char* verdict = !d.accepted                ? "rejected"
                          : d.variant == res.variant ? "chosen  "
                                                     : "accepted";
    std::cout << "  " << verdict << "  " << d.variant << ": " << d.reason << "\n";
  }
  if (res.decisions.empty()) std::cout << "  (none)\n";
  if (res.variant.empty()) {
    std::cout << "result  no variant fits; the layer would use the built-in implementation\n";
  } else {
    std::cout << "result  " << res.variant << "\n";
  }
}

void cmd_verify(const std::string& spec, const TargetFlags& flags, const KernelPolicyFlags& policy,
                bool load) {
  Hub hub(config_from_environment(policy));
  hub::ResolveOptions options;
  options.trust_remote_code = flags.trust_remote_code;
  hub::Resolution res = hub.resolve(spec, make_target(flags), options);
  const std::string signature = hub.verify(res);  // throws IntegrityError → exit 1
  std::cout << "ok  " << res.repo << " " << res.variant << " (" << res.metadata.sha256.size()
            << " files verified) in " << res.dir.string() << "\n";
  std::cout << "signature  " << signature << "\n";
  if (load) {
    // Also dlopen it: ABI major, interfaces and symbols are checked by the loader.
    auto library = hub.load(res);
    std::cout << "loaded  " << library->entries().size() << " entries, ABI " << library->abi_major()
              << "." << library->abi_minor() << "\n";
  }
}

void cmd_lock(const fs::path& dir) {
  HubConfig config = config_from_environment();
  config.lock.reset();  // locking re-resolves from the branches
  Hub hub(std::move(config));
  fs::path project = dir / "hk-kernels.json";
  std::string text;
  {
    std::ifstream in(project, std::ios::binary);
    if (!in)
      throw NotFound(project.string() + " does not exist; write {\"org/repo\": 1, ...} there");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  hub::Lockfile lock;
  for (const auto& [repo, version] : hub::parse_project_kernels(text, project.string())) {
    hub::ResolveOptions options;
    options.version = version;
    hub::LockedRepo locked;
    locked.repo = repo;
    locked.version = version;
    locked.commit = hub.resolve_commit(repo, options);
    for (const auto& m : hub.variants(repo, locked.commit)) locked.variants[m.variant] = m.sha256;
    if (locked.variants.empty())
      throw NotFound("kernel repo " + repo + " has no usable variants at " + locked.commit);
    std::cout << "locked  " << repo << " v" << version << " = " << locked.commit << " ("
              << locked.variants.size() << " variants)\n";
    lock.repos.push_back(std::move(locked));
  }
  fs::path out = dir / "hk.lock";
  hub::save_lockfile(out, lock);  // a planted hk.lock.tmp or symlink is never written through
  std::cout << "wrote " << out.string() << "\n";
}

void cmd_download(const fs::path& dir) {
  HubConfig config = config_from_environment();
  config.lock = hub::load_lockfile(dir / "hk.lock");
  hub::Lockfile lock = *config.lock;
  Hub hub(std::move(config));
  for (const auto& locked : lock.repos) {
    hub::ResolveOptions options;
    std::string commit = hub.resolve_commit(locked.repo, options);
    auto variants = hub.variants(locked.repo, commit);
    for (const auto& [variant, files] : locked.variants) {
      const hub::VariantMetadata* meta = nullptr;
      for (const auto& m : variants)
        if (m.variant == variant) meta = &m;
      if (!meta)
        throw NotFound("hk.lock pins variant " + variant + " of " + locked.repo + " at " + commit +
                       ", which the hub does not have");
      if (meta->sha256 != files)
        throw IntegrityError("the hub's metadata for " + locked.repo + " " + variant +
                             " lists other digests than hk.lock; refusing to download it");
      hub::Resolution res;
      res.repo = locked.repo;
      res.commit = commit;
      res.variant = variant;
      res.metadata = *meta;
      res.dir = hub.fetch_variant(locked.repo, commit, *meta);
      hub.verify(res);
      std::cout << "ok  " << locked.repo << " " << variant << " -> " << res.dir.string() << "\n";
    }
  }
}

// The metadata.json files a sign PATH names: the file itself, a variant directory, or every
// build/<variant>/metadata.json of a repo commit directory.
std::vector<fs::path> metadata_files(const fs::path& path) {
  if (path.filename() == "metadata.json" && fs::is_regular_file(path)) return {path};
  if (fs::is_regular_file(path / "metadata.json")) return {path / "metadata.json"};
  std::vector<fs::path> out;
  std::error_code ec;
  if (fs::is_directory(path / "build", ec))
    for (const auto& v : fs::directory_iterator(path / "build", ec))
      if (fs::is_regular_file(v.path() / "metadata.json"))
        out.push_back(v.path() / "metadata.json");
  std::sort(out.begin(), out.end());
  if (out.empty())
    throw NotFound(path.string() +
                   " holds no metadata.json (give a metadata.json, a variant directory or a "
                   "commit directory with build/<variant>/metadata.json)");
  return out;
}

void cmd_sign(const fs::path& key, const std::vector<std::string>& paths, bool json) {
  nlohmann::json signed_files = nlohmann::json::array();
  std::string public_key;
  for (const auto& p : paths) {
    for (const fs::path& meta : metadata_files(p)) {
      std::ifstream in(meta, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // Only sign what parses: a signature vouches for a kernel, not for arbitrary bytes.
      hub::VariantMetadata m = hub::parse_variant_metadata(text, meta.string());
      hub::MetadataSignature sig = hub::sign_metadata(text, key);
      public_key = sig.public_key;
      fs::path out = meta.parent_path() / hub::kSignatureFileName;
      // Written atomically beside metadata.json (rename over any previous signature).
      hub::save_signature(out, sig);
      signed_files.push_back({{"metadata", meta.string()},
                              {"signature", out.string()},
                              {"repo", m.repo},
                              {"commit", m.id},
                              {"variant", m.variant}});
      if (!json)
        std::cout << "signed  " << m.repo << " " << m.id.substr(0, 12) << " " << m.variant << " -> "
                  << out.string() << "\n";
    }
  }
  if (json) {
    std::cout << nlohmann::json{{"public_key", public_key}, {"signed", signed_files}}.dump(2)
              << "\n";
  } else {
    std::cout << "key  " << public_key << "\n";
  }
}

void cmd_keygen(const fs::path& out, bool json) {
  const std::string public_key = hub::generate_signing_key(out);
  if (json) {
    std::cout << nlohmann::json{{"private_key", out.string()}, {"public_key", public_key}}.dump(2)
              << "\n";
    return;
  }
  std::cout << "wrote private key " << out.string() << " (keep it secret)\n"
            << "public key  " << public_key << "\n"
            << "trust it with HK_PUBLISHER_KEYS=FILE, FILE = {\"<org>\": [\"" << public_key
            << "\"]}\n";
}

void add_kernels(CLI::App& app) {
  auto* kernels =
      app.add_subcommand("kernels", "list, inspect, lock, download and verify hub kernels");
  kernels->require_subcommand(1);

  auto* list = kernels->add_subcommand("list", "repos in the hub");
  static bool list_json = false;
  list->add_flag("--json", list_json, "JSON output");
  list->callback([] { cmd_list(list_json); });

  static std::string repo, revision;
  static int version = -1;
  static bool json = false;
  auto* info = kernels->add_subcommand("info", "a repo's versions and variants");
  info->add_option("REPO", repo, "org/repo[@revision]")->required();
  info->add_option("--revision", revision, "tag, branch or commit");
  info->add_option("--version", version, "major version N (branch vN)");
  info->add_flag("--json", json, "JSON output");
  info->callback([] { cmd_info(repo, revision, version, json); });

  auto* versions = kernels->add_subcommand("versions", "a repo's vX.Y.Z tags and branches");
  versions->add_option("REPO", repo, "org/repo")->required();
  versions->callback([] { cmd_versions(repo); });

  static TargetFlags flags;
  auto* explain = kernels->add_subcommand("explain", "why each variant is accepted or rejected");
  explain->add_option("REPO", repo, "org/repo[@revision][:Entry] or /abs/path[:Entry]")->required();
  explain->add_option("--revision", revision, "tag, branch or commit");
  explain->add_option("--version", version, "major version N (branch vN)");
  add_target_flags(explain, flags);
  explain->callback([] { cmd_explain(repo, revision, version, flags); });

  auto* verify = kernels->add_subcommand("verify", "check the sha256 of every file of a kernel");
  verify->add_option("REPO", repo, "org/repo[@revision][:Entry] or /abs/path[:Entry]")->required();
  add_target_flags(verify, flags);
  static bool load = false;
  static KernelPolicyFlags policy;
  verify->add_flag("--load", load, "also load the library (checks ABI, interfaces, symbols)");
  add_kernel_policy_flags(verify, policy);
  verify->callback([] { cmd_verify(repo, flags, policy, load); });

  static std::string dir;
  auto* lock = kernels->add_subcommand("lock", "write DIR/hk.lock from DIR/hk-kernels.json");
  lock->add_option("DIR", dir, "project directory")->required();
  lock->callback([] { cmd_lock(dir); });

  auto* download =
      kernels->add_subcommand("download", "fetch what DIR/hk.lock pins into the cache");
  download->add_option("DIR", dir, "project directory")->required();
  download->callback([] { cmd_download(dir); });

  static std::string key;
  static std::vector<std::string> sign_paths;
  static bool sign_json = false;
  auto* sign = kernels->add_subcommand(
      "sign", "sign metadata.json files with an Ed25519 publisher key (writes metadata.json.sig)");
  sign->add_option("--key", key, "private key (PEM), made by `hk kernels keygen`")->required();
  sign->add_option("PATH", sign_paths, "metadata.json, a variant dir or a commit dir")->required();
  sign->add_flag("--json", sign_json, "JSON output");
  sign->callback([] { cmd_sign(key, sign_paths, sign_json); });

  static std::string key_out;
  static bool keygen_json = false;
  auto* keygen = kernels->add_subcommand("keygen", "create an Ed25519 publisher key");
  keygen->add_option("FILE", key_out, "where to write the private key (never overwritten)")
      ->required();
  keygen->add_flag("--json", keygen_json, "JSON output");
  keygen->callback([] { cmd_keygen(key_out, keygen_json); });
}

}  // namespace
}  // namespace hk::cli

HK_REGISTER_COMMAND(kernels, hk::cli::add_kernels);
