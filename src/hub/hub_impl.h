// Hub's private state, shared by hub.cc (resolution) and hub_load.cc (loading). Not public API.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "hk/hub.h"
#include "hub/cache.h"
#include "hub/hub_source.h"

namespace hk::hub {

struct Hub::Impl {
  explicit Impl(HubConfig config);
  std::vector<VariantMetadata> collect_variants(const std::string& repo, const std::string& commit,
                                                std::vector<VariantDecision>& broken);
  Resolution resolve_local(const KernelSpec& spec, const std::string& path, const std::string& repo,
                           const Target& target);

  HubConfig config;
  KernelCache cache;
  std::unique_ptr<HubSource> source;
};

}  // namespace hk::hub
