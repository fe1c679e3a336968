// The flags every `hk` command that loads kernels takes (docs/security.md): the hk.lock every hub
// kernel must be pinned by, leave to load repos it does not pin, and refusing unsigned kernels.
// Commands turn them into LoadOptions fields or HubConfig::from_environment(lock, ...).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace hk::cli {

struct KernelPolicyFlags {
  std::string kernels_lock;
  bool allow_unlocked = false;
  bool require_signed = false;
};

inline void add_kernel_policy_flags(CLI::App* cmd, KernelPolicyFlags& flags) {
  cmd->add_option("--kernels-lock", flags.kernels_lock,
                  "hk.lock every hub kernel must be pinned by (default: HK_KERNELS_LOCK)");
  cmd->add_flag("--allow-unlocked-kernels", flags.allow_unlocked,
                "with a lock, also load repos it does not pin (HK_ALLOW_UNLOCKED_KERNELS=1)");
  cmd->add_flag("--require-signed", flags.require_signed,
                "refuse kernels not signed by a trusted publisher key (HK_REQUIRE_SIGNED=1)");
}

}  // namespace hk::cli
