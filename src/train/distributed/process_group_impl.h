// Internal: the backends behind hk::dist::init_process_group (process_group.cc picks one).
#pragma once

#include <memory>

#include "hk/distributed.h"

namespace hk::dist {

// tcp_process_group.cc: CPU ranks over hk's TCP transport.
std::shared_ptr<ProcessGroup> make_tcp_process_group(const RankEnvironment& env,
                                                     ProcessGroupOptions options);
#ifdef HK_HAVE_NCCL
// nccl_process_group.cc: one CUDA device per rank.
std::shared_ptr<ProcessGroup> make_nccl_process_group(Device device, const RankEnvironment& env,
                                                      ProcessGroupOptions options);
#endif

}  // namespace hk::dist
