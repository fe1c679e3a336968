// Trust policy (see trust.h).
#include "hub/trust.h"

#include <algorithm>

#include "hk/error.h"

namespace hk::hub {

bool is_trusted_org(const std::string& repo, const std::vector<std::string>& trusted_orgs) {
  std::string org = repo.substr(0, repo.find('/'));
  return std::find(trusted_orgs.begin(), trusted_orgs.end(), org) != trusted_orgs.end();
}

void check_trust(const std::string& repo, const std::vector<std::string>& trusted_orgs,
                 bool trust_remote_code) {
  if (trust_remote_code || is_trusted_org(repo, trusted_orgs)) return;
  std::string orgs;
  for (const auto& o : trusted_orgs) orgs += (orgs.empty() ? "" : ", ") + o;
  throw InvalidArgument("kernel repo " + repo + " is not from a trusted org (" + orgs +
                        ") and loading it would run its code in this process; pass "
                        "trust_remote_code=true (allow_all_kernels / --allow-all-kernels / "
                        "--trust-remote-code) or add its org to HK_TRUSTED_ORGS to allow it");
}

}  // namespace hk::hub
