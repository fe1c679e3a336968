// Trust policy: which repos may run their code in this process.
//
// Loading a kernel runs its code on the host, so repos outside the trusted orgs (default
// kernels-community) need an explicit trust_remote_code. Local directories are trusted: the user
// named them. This file only decides; it does not know where the repo comes from.
#pragma once

#include <string>
#include <vector>

namespace hk::hub {

bool is_trusted_org(const std::string& repo, const std::vector<std::string>& trusted_orgs);
// Throws InvalidArgument with a sentence saying how to allow the repo.
void check_trust(const std::string& repo, const std::vector<std::string>& trusted_orgs,
                 bool trust_remote_code);

}  // namespace hk::hub
