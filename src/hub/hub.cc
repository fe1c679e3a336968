// Hub: spec → commit → variant → directory, through one source (HTTP hub, hub directory, or the
// cache when offline), with trust, LOCAL_KERNELS and the lockfile applied on the way.
//
// Loading (digest checks + dlopen) is in hub_load.cc; variant rules in variant_selection.cc; the
// cache layout in cache.cc. This file only orchestrates and writes the error sentences that list
// what exists when a request cannot be met.
#include <algorithm>
#include <chrono>
#include <mutex>

#include "hk/error.h"
#include "hk/hub.h"
#include "hub/cache.h"
#include "hub/hub_impl.h"
#include "hub/hub_source.h"
#include "hub/trust.h"

namespace fs = std::filesystem;

namespace hk::hub {
namespace {

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : sep) + i;
  return s;
}

std::string list_refs(const RefTable& refs) {
  std::vector<std::string> branches, tags;
  for (const auto& [name, _] : refs.branches) branches.push_back(name);
  for (const auto& [name, _] : refs.tags) tags.push_back(name);
  return "branches: " + (branches.empty() ? "none" : join(branches)) +
         "; tags: " + (tags.empty() ? "none" : join(tags));
}

std::string describe_decisions(const std::vector<VariantDecision>& decisions) {
  std::string s;
  for (const auto& d : decisions) s += "\n  " + d.variant + ": " + d.reason;
  return s;
}

}  // namespace

Hub::Impl::Impl(HubConfig c)
    : config(std::move(c)), cache(config.cache_dir, config.lock_timeout_s) {
  std::vector<fs::path> hub_dirs{config.hub_dir};
  hub_dirs.insert(hub_dirs.end(), config.extra_hub_dirs.begin(), config.extra_hub_dirs.end());
  if (config.offline) {
    if (config.endpoint.empty())
      source = make_directory_source(hub_dirs);  // local already: offline changes nothing
    else
      source = make_cache_source(cache);
  } else if (!config.endpoint.empty()) {
    HttpOptions http;
    http.token = config.token;
    http.connect_timeout_s = config.connect_timeout_s;
    http.timeout_s = config.timeout_s;
    http.stall_timeout_s = config.stall_timeout_s;
    http.min_speed_bytes_s = config.min_speed_bytes_s;
    http.max_body_bytes = config.max_body_bytes;
    http.progress = config.progress;
    source = make_http_source(config.endpoint, http);
  } else {
    source = make_directory_source(hub_dirs);
  }
}

Hub::Hub(HubConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Hub::~Hub() = default;

const HubConfig& Hub::config() const {
  return impl_->config;
}

bool Hub::is_trusted(const std::string& repo) const {
  return is_trusted_org(repo, impl_->config.trusted_orgs);
}

std::vector<std::string> Hub::list_repos() {
  return impl_->source->list_repos();
}

RefTable Hub::refs(const std::string& repo) {
  parse_repo_name(repo);
  RefTable refs = impl_->source->refs(repo);
  // Remember what the remote said so offline mode can resolve the same names later.
  // Best effort: an unwritable cache must not break an online resolution.
  if (impl_->source->is_remote()) {
    try {
      impl_->cache.save_refs(repo, refs);
    } catch (const Error&) {
    }
  }
  return refs;
}

std::vector<SemVer> Hub::versions(const std::string& repo) {
  std::vector<SemVer> out;
  for (const auto& [tag, _] : refs(repo).tags)
    if (tag.front() == 'v')
      if (auto v = SemVer::try_parse(tag)) out.push_back(*v);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string Hub::resolve_commit(const std::string& repo, const ResolveOptions& options,
                                const std::optional<VersionRange>& range,
                                std::string* revision_out) {
  std::string revision_name;
  std::string commit;
  const LockedRepo* locked = impl_->config.lock ? impl_->config.lock->find(repo) : nullptr;
  if (locked && !options.revision && !range) {
    // The lock pins the commit; the source only has to have it.
    revision_name = "hk.lock";
    commit = locked->commit;
  } else {
    RefTable table = refs(repo);
    if (options.revision) {
      const std::string& rev = *options.revision;
      check_revision_name(rev);
      revision_name = rev;
      if (auto b = table.branches.find(rev); b != table.branches.end()) {
        commit = b->second;
      } else if (auto t = table.tags.find(rev); t != table.tags.end()) {
        commit = t->second;
      } else if (is_commit_id(rev)) {
        commit = rev;
      } else {
        throw NotFound("kernel repo " + repo + " has no branch, tag or commit '" + rev + "' (" +
                       list_refs(table) + ")");
      }
    } else if (range) {
      revision_name = range->str();
      std::optional<SemVer> best;
      std::string best_tag;
      std::vector<std::string> existing;
      for (const auto& [tag, id] : table.tags) {
        if (tag.front() != 'v') continue;
        auto v = SemVer::try_parse(tag);
        if (!v) continue;
        existing.push_back(v->str());
        if (range->matches(*v) && (!best || *v > *best)) {
          best = v;
          best_tag = tag;
        }
      }
      if (!best) {
        std::sort(existing.begin(), existing.end(), [](const std::string& a, const std::string& b) {
          return SemVer::parse(a) < SemVer::parse(b);
        });
        throw NotFound("no version of kernel repo " + repo + " matches " + range->str() +
                       " (versions: " + (existing.empty() ? "none" : join(existing)) + ")");
      }
      commit = table.tags.at(best_tag);
      revision_name = best_tag + " (" + range->str() + ")";
    } else {
      int version = options.version.value_or(1);
      if (version < 0) throw InvalidArgument("kernel version must be >= 0");
      std::string branch = "v" + std::to_string(version);
      auto b = table.branches.find(branch);
      if (b == table.branches.end())
        throw NotFound("kernel repo " + repo + " has no version " + std::to_string(version) +
                       " (branch " + branch + "; " + list_refs(table) + ")");
      revision_name = branch;
      commit = b->second;
    }
    if (locked && commit != locked->commit)
      throw IntegrityError("hk.lock pins " + repo + " to commit " + locked->commit + " but " +
                           revision_name + " resolves to " + commit +
                           "; run `hk kernels lock DIR` again to move the pin");
  }
  if (revision_out) *revision_out = revision_name;
  return commit;
}

std::vector<VariantMetadata> Hub::variants(const std::string& repo, const std::string& commit) {
  std::vector<VariantDecision> broken;
  return impl_->collect_variants(repo, commit, broken);
}

std::vector<VariantMetadata> Hub::Impl::collect_variants(const std::string& repo,
                                                         const std::string& commit,
                                                         std::vector<VariantDecision>& broken) {
  std::vector<VariantMetadata> out;
  for (const auto& name : source->variant_names(repo, commit)) {
    std::string origin =
        source->describe() + ": " + repo + "/" + commit + "/build/" + name + "/metadata.json";
    try {
      VariantMetadata m = parse_variant_metadata(source->read_metadata(repo, commit, name), origin);
      if (m.repo != repo || m.id != commit || m.variant != name)
        throw InvalidArgument("bad kernel metadata " + origin + ": it describes " + m.repo + "@" +
                              m.id + "/" + m.variant + ", not this directory");
      out.push_back(std::move(m));
    } catch (const InvalidArgument& e) {
      broken.push_back({name, false, e.what()});
    }
  }
  return out;
}

fs::path Hub::fetch_variant(const std::string& repo, const std::string& commit,
                            const VariantMetadata& metadata) {
  HubSource& source = *impl_->source;
  if (!source.is_remote()) return source.variant_dir(repo, commit, metadata.variant);
  if (impl_->cache.has_variant(repo, commit, metadata.variant))
    return impl_->cache.variant_dir(repo, commit, metadata.variant);
  // One deadline for the whole variant: metadata, signature and every file.
  const Deadline deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(impl_->config.timeout_s);
  std::string text = source.read_metadata(repo, commit, metadata.variant);
  // The cached metadata must be the one selection used: re-parse, compare what it describes and
  // its digests, so a hub cannot answer the second request with another variant.
  VariantMetadata again =
      parse_variant_metadata(text, repo + "/" + commit + "/" + metadata.variant);
  if (again.repo != repo || again.id != commit || again.variant != metadata.variant)
    throw IntegrityError("the hub answered the metadata of " + repo + "@" + commit + "/" +
                         metadata.variant + " with the metadata of " + again.repo + "@" + again.id +
                         "/" + again.variant + "; refusing to install it");
  if (again.sha256 != metadata.sha256 || again.library != metadata.library)
    throw IntegrityError("the metadata of " + repo + "@" + commit + "/" + metadata.variant +
                         " changed on the hub while it was being fetched; try again");
  // Signed kernels: refuse before downloading any code (load checks it again from the cache).
  std::optional<std::string> signature = source.read_signature(repo, commit, metadata.variant);
  check_metadata_signature(repo, text, signature, impl_->config.publisher_keys,
                           impl_->config.require_signed);
  return impl_->cache.install_variant(repo, again, text, signature, impl_->config.max_file_bytes,
                                      [&](const std::string& file, int fd, uint64_t max_bytes) {
                                        source.download(repo, commit, metadata.variant, file, fd,
                                                        max_bytes, deadline);
                                      });
}

Resolution Hub::Impl::resolve_local(const KernelSpec& spec, const std::string& path,
                                    const std::string& repo, const Target& target) {
  Resolution res;
  res.local = true;
  res.repo = repo;
  res.entry = spec.entry;
  res.revision = "local";
  res.source = "local directory " + path;
  fs::path dir(path);
  std::vector<std::pair<VariantMetadata, fs::path>> found;
  std::vector<VariantDecision> broken;
  auto add = [&](const fs::path& variant_dir) {
    fs::path meta = variant_dir / "metadata.json";
    try {
      found.emplace_back(parse_variant_metadata(read_text_file(meta, 1 << 20), meta.string()),
                         variant_dir);
    } catch (const InvalidArgument& e) {
      broken.push_back({variant_dir.filename().string(), false, e.what()});
    }
  };
  if (fs::is_regular_file(dir / "metadata.json")) {
    add(dir);
  } else {
    for (const auto& name : list_variant_dirs(dir)) add(dir / "build" / name);
    if (found.empty() && broken.empty())
      throw NotFound("local kernel directory " + path +
                     " holds neither metadata.json nor build/<variant>/metadata.json");
  }
  std::vector<VariantMetadata> metas;
  for (const auto& [m, _] : found) metas.push_back(m);
  res.decisions = select_variants(metas, target, spec.entry);
  res.decisions.insert(res.decisions.end(), broken.begin(), broken.end());
  if (res.decisions.empty() || !res.decisions.front().accepted)
    throw NotFound("no variant in local kernel directory " + path + " fits " + target.str() + ":" +
                   describe_decisions(res.decisions));
  for (const auto& [m, variant_dir] : found)
    if (m.variant == res.decisions.front().variant) {
      res.metadata = m;
      res.dir = variant_dir;
    }
  res.variant = res.metadata.variant;
  res.commit = res.metadata.id;
  if (res.repo.empty()) res.repo = res.metadata.repo;
  return res;
}

Resolution Hub::explain(std::string_view spec_text, const Target& target,
                        const ResolveOptions& options) {
  KernelSpec spec = KernelSpec::parse(spec_text);
  std::optional<std::string> local_path;
  std::string repo;
  if (spec.kind == KernelSpec::Kind::Local) {
    local_path = spec.local_path;
  } else if (auto it = impl_->config.local_kernels.find(spec.repo());
             it != impl_->config.local_kernels.end()) {
    local_path = it->second;
    repo = spec.repo();
  }
  if (local_path) {
    Resolution res = impl_->resolve_local(spec, *local_path, repo, target);
    res.spec = std::string(spec_text);
    if (!repo.empty()) res.source = "LOCAL_KERNELS " + repo + "=" + *local_path;
    return res;
  }
  repo = spec.repo();
  check_trust(repo, impl_->config.trusted_orgs, options.trust_remote_code);
  check_locked(repo);

  ResolveOptions effective = options;
  if (spec.revision) effective.revision = spec.revision;
  Resolution res;
  res.spec = std::string(spec_text);
  res.repo = repo;
  res.entry = spec.entry;
  res.source = impl_->source->describe();
  res.commit = resolve_commit(repo, effective, spec.version_range, &res.revision);

  std::vector<VariantDecision> broken;
  std::vector<VariantMetadata> metas = impl_->collect_variants(repo, res.commit, broken);
  res.decisions = select_variants(metas, target, spec.entry);
  const LockedRepo* locked = impl_->config.lock ? impl_->config.lock->find(repo) : nullptr;
  if (locked) {
    // Only variants the lock pins may be used; demote the others with the reason.
    for (auto& d : res.decisions)
      if (d.accepted && !locked->variants.count(d.variant)) {
        d.accepted = false;
        d.reason = "not pinned by hk.lock (run `hk kernels lock DIR` to add it)";
      }
    std::stable_partition(res.decisions.begin(), res.decisions.end(),
                          [](const VariantDecision& d) { return d.accepted; });
  }
  res.decisions.insert(res.decisions.end(), broken.begin(), broken.end());
  if (!res.decisions.empty() && res.decisions.front().accepted) {
    for (const auto& m : metas)
      if (m.variant == res.decisions.front().variant) res.metadata = m;
    res.variant = res.metadata.variant;
  }
  return res;
}

Resolution Hub::resolve(std::string_view spec_text, const Target& target,
                        const ResolveOptions& options) {
  Resolution res = explain(spec_text, target, options);
  if (res.local) return res;  // resolve_local already threw when nothing fits
  if (res.decisions.empty())
    throw NotFound("kernel repo " + res.repo + " has no variants at commit " + res.commit + " (" +
                   res.revision + ") on the " + res.source);
  if (res.variant.empty())
    throw NotFound("no variant of " + res.repo + " (" + res.revision + ", commit " +
                   res.commit.substr(0, 12) + ") fits " + target.str() + ":" +
                   describe_decisions(res.decisions));
  if (options.fetch) res.dir = fetch_variant(res.repo, res.commit, res.metadata);
  return res;
}

}  // namespace hk::hub
