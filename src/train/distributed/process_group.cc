// init_process_group (hk/distributed.h): the backend for the device, the timeout from
// HK_DIST_TIMEOUT_S, and NVLink multicast kept off for NCCL.
#include <cstdlib>
#include <string>

#include "hk/distributed.h"
#include "hk/error.h"
#include "train/distributed/process_group_impl.h"

namespace hk::dist {

namespace {

void check_chunks(const char* what, const char* whole_name, const Tensor& whole,
                  const char* chunk_name, const Tensor& chunk, int world) {
  HK_CHECK(whole.numel() == chunk.numel() * world && whole.dtype() == chunk.dtype(),
           std::string(what) + ": the " + whole_name + " has " + std::to_string(whole.numel()) +
               " " + dtype_name(whole.dtype()) + " elements and the " + chunk_name + " " +
               std::to_string(chunk.numel()) + " " + dtype_name(chunk.dtype()) + "; the " +
               whole_name + " must hold world size (" + std::to_string(world) + ") chunks of the " +
               chunk_name + "'s size and dtype");
}

}  // namespace

void check_reduce_scatter(const Tensor& input, const Tensor& output, int world) {
  check_chunks("reduce_scatter", "input", input, "output", output, world);
}

void check_all_gather(const Tensor& input, const Tensor& output, int world) {
  check_chunks("all_gather", "output", output, "input", input, world);
}

bool nccl_available() {
#ifdef HK_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::shared_ptr<ProcessGroup> init_process_group(Device device, const RankEnvironment& env,
                                                 ProcessGroupOptions options) {
  if (const char* t = std::getenv("HK_DIST_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    const double s = std::strtod(t, &end);
    if (end == t || *end != '\0' || !(s > 0))
      throw InvalidArgument(std::string("HK_DIST_TIMEOUT_S='") + t +
                            "' is not a positive number of seconds");
    options.timeout = std::chrono::milliseconds(static_cast<long long>(s * 1000.0));
  }
  if (device.is_cpu()) return make_tcp_process_group(env, options);
  if (device.is_cuda()) {
#ifdef HK_HAVE_NCCL
    return make_nccl_process_group(device, env, options);
#else
    throw Unsupported(
        "data-parallel training on cuda needs NCCL, and this hk was built without it; run "
        "scripts/install-deps (NVIDIA's nvidia-nccl-cu13 wheel) and configure with -DHK_NCCL=ON");
#endif
  }
  throw Unsupported("data-parallel training has no process group for device " + device.str() +
                    " (cuda uses NCCL, cpu hk's TCP transport)");
}

}  // namespace hk::dist
