// The rendezvous (rendezvous.h): a fixed handshake over hk's TCP transport.
//
// Wire format (little-endian, as every supported host): hello = u32 magic 'HKRV', u32 protocol
// version, i32 rank, i32 world size, string backend; answer = u8 status (0 ok, 1 refused) then a
// string (the payload, or the reason). Strings are u32 length + bytes.
#include "train/distributed/rendezvous.h"

#include <algorithm>

#include "hk/error.h"

namespace hk::dist {
namespace {

constexpr uint32_t kMagic = 0x56524b48;  // "HKRV"
constexpr uint32_t kVersion = 1;

std::string address(const RankEnvironment& env) {
  return env.master_addr + ":" + std::to_string(env.master_port);
}

void refuse_all(std::vector<tcp::Socket>& peers, const std::string& reason) {
  const auto d = tcp::deadline_after(std::chrono::seconds(2));
  for (auto& p : peers) {
    if (!p.valid()) continue;
    try {
      p.send_value<uint8_t>(1, d, "rendezvous");
      p.send_string(reason, d, "rendezvous");
    } catch (const Error&) {
    }
    p.close();
  }
}

Rendezvous serve(const RankEnvironment& env, const std::string& backend, const std::string& payload,
                 tcp::Deadline deadline) {
  Rendezvous r;
  r.rank = 0;
  r.world_size = env.world_size;
  r.payload = payload;
  r.peers.resize(static_cast<size_t>(env.world_size));
  if (env.world_size == 1) return r;
  tcp::Listener listener(env.master_addr, env.master_port);
  int joined = 1;
  std::vector<tcp::Socket> strays;
  try {
    while (joined < env.world_size) {
      tcp::Socket s = listener.accept(deadline);
      if (!s.valid()) {
        std::string missing;
        for (int i = 1; i < env.world_size; ++i)
          if (!r.peers[static_cast<size_t>(i)].valid())
            missing += (missing.empty() ? "" : ", ") + std::to_string(i);
        throw RuntimeFailure(
            "rendezvous at " + address(env) + " timed out: " + std::to_string(joined) + " of " +
            std::to_string(env.world_size) + " ranks joined (missing: " + missing +
            "); start every rank with WORLD_SIZE=" + std::to_string(env.world_size) +
            " and the same MASTER_ADDR / MASTER_PORT");
      }
      // A hello must come quickly; anything else on the port is dropped, not fatal.
      const auto hello_deadline = std::min(deadline, tcp::deadline_after(std::chrono::seconds(30)));
      uint32_t magic = 0, version = 0;
      try {
        magic = s.recv_value<uint32_t>(hello_deadline, "rendezvous");
        version = s.recv_value<uint32_t>(hello_deadline, "rendezvous");
      } catch (const Error&) {
        continue;
      }
      if (magic != kMagic) continue;
      const int rank = s.recv_value<int32_t>(hello_deadline, "rendezvous");
      const int world = s.recv_value<int32_t>(hello_deadline, "rendezvous");
      const std::string their_backend = s.recv_string(hello_deadline, "rendezvous", 64);
      s.set_peer("rank " + std::to_string(rank) + " (" + s.peer() + ")");
      std::string problem;
      if (version != kVersion)
        problem = "rank " + std::to_string(rank) + " speaks rendezvous protocol " +
                  std::to_string(version) + ", rank 0 speaks " + std::to_string(kVersion) +
                  " (different hk versions in one job)";
      else if (world != env.world_size)
        problem = "rank " + std::to_string(rank) +
                  " was started with WORLD_SIZE=" + std::to_string(world) + ", rank 0 with " +
                  std::to_string(env.world_size) + "; every rank needs the same world size";
      else if (rank <= 0 || rank >= env.world_size)
        problem = "a process joined as rank " + std::to_string(rank) + " of " +
                  std::to_string(world) + "; ranks 1 to " + std::to_string(world - 1) +
                  " connect to rank 0";
      else if (r.peers[static_cast<size_t>(rank)].valid())
        problem = "two processes joined as rank " + std::to_string(rank) +
                  "; every rank needs its own RANK";
      else if (their_backend != backend)
        problem = "rank " + std::to_string(rank) + " uses the " + their_backend +
                  " backend, rank 0 the " + backend +
                  " one; start every rank on the same kind of device";
      if (!problem.empty()) {
        strays.push_back(std::move(s));
        throw RuntimeFailure("rendezvous at " + address(env) + ": " + problem);
      }
      r.peers[static_cast<size_t>(rank)] = std::move(s);
      ++joined;
    }
    for (int i = 1; i < env.world_size; ++i) {
      tcp::Socket& p = r.peers[static_cast<size_t>(i)];
      p.send_value<uint8_t>(0, deadline, "rendezvous");
      p.send_string(payload, deadline, "rendezvous");
    }
  } catch (const Error& e) {
    refuse_all(strays, e.what());
    refuse_all(r.peers, e.what());
    throw;
  }
  return r;
}

Rendezvous join(const RankEnvironment& env, const std::string& backend, tcp::Deadline deadline) {
  Rendezvous r;
  r.rank = env.rank;
  r.world_size = env.world_size;
  const std::string what = "rank " + std::to_string(env.rank) + ": rendezvous";
  tcp::Socket s = tcp::connect(env.master_addr, env.master_port, deadline, what);
  s.send_value<uint32_t>(kMagic, deadline, what.c_str());
  s.send_value<uint32_t>(kVersion, deadline, what.c_str());
  s.send_value<int32_t>(env.rank, deadline, what.c_str());
  s.send_value<int32_t>(env.world_size, deadline, what.c_str());
  s.send_string(backend, deadline, what.c_str());
  uint8_t status = 0;
  try {
    status = s.recv_value<uint8_t>(deadline, what.c_str());
  } catch (const RuntimeFailure& e) {
    throw RuntimeFailure(std::string(e.what()) +
                         "; rank 0 never answered (did every rank start, with WORLD_SIZE=" +
                         std::to_string(env.world_size) + "?)");
  }
  const std::string text = s.recv_string(deadline, what.c_str());
  if (status != 0) throw RuntimeFailure("rank 0 stopped the rendezvous: " + text);
  r.payload = text;
  r.peers.push_back(std::move(s));
  return r;
}

}  // namespace

Rendezvous rendezvous(const RankEnvironment& env, const std::string& backend,
                      const std::string& payload, tcp::Deadline deadline) {
  return env.rank == 0 ? serve(env, backend, payload, deadline) : join(env, backend, deadline);
}

void star_barrier(Rendezvous& r, tcp::Deadline deadline, const char* what) {
  if (r.world_size == 1) return;
  uint8_t token = 0xB7;
  if (r.rank == 0) {
    for (int i = 1; i < r.world_size; ++i) {
      const uint8_t t = r.peers[static_cast<size_t>(i)].recv_value<uint8_t>(deadline, what);
      if (t != token)
        throw RuntimeFailure(std::string(what) + ": rank " + std::to_string(i) +
                             " is out of step (it sent data where a barrier was expected: the "
                             "ranks ran different collectives)");
    }
    for (int i = 1; i < r.world_size; ++i)
      r.peers[static_cast<size_t>(i)].send_value(token, deadline, what);
  } else {
    r.peers[0].send_value(token, deadline, what);
    const uint8_t t = r.peers[0].recv_value<uint8_t>(deadline, what);
    if (t != token)
      throw RuntimeFailure(std::string(what) +
                           ": rank 0 is out of step (the ranks ran different collectives)");
  }
}

void break_connections(Rendezvous& r) {
  for (auto& p : r.peers) p.shutdown();
}

}  // namespace hk::dist
