// Internal: the backends behind hk::dist::init_process_group (process_group.cc picks one).
#pragma once

#include <memory>

#include "hk/distributed.h"

namespace hk::dist {

// The shape rules of reduce_scatter / all_gather (hk/distributed.h), the same for every backend:
// the large tensor holds `world` chunks of the small one's size and dtype.
void check_reduce_scatter(const Tensor& input, const Tensor& output, int world);
void check_all_gather(const Tensor& input, const Tensor& output, int world);

// tcp_process_group.cc: CPU ranks over hk's TCP transport.
std::shared_ptr<ProcessGroup> make_tcp_process_group(const RankEnvironment& env,
                                                     ProcessGroupOptions options);
#ifdef HK_HAVE_NCCL
// nccl_process_group.cc: one CUDA device per rank.
std::shared_ptr<ProcessGroup> make_nccl_process_group(Device device, const RankEnvironment& env,
                                                      ProcessGroupOptions options);
#endif

}  // namespace hk::dist
