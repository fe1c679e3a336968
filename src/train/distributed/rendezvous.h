// Internal: the rendezvous every process group starts with. Rank 0 listens on
// MASTER_ADDR:MASTER_PORT; every other rank connects, sends who it is (rank, world size, backend),
// and receives rank 0's answer: an error sentence, or the payload rank 0 hands out (the
// ncclUniqueId for NCCL). The connections stay open afterwards (a star around rank 0): the TCP
// process group's collectives and every backend's barrier use them.
//
// It does not retry a failed rendezvous or let ranks join late: a missing rank is an error at the
// deadline, naming the ranks that did not join.
#pragma once

#include <string>
#include <vector>

#include "hk/distributed.h"
#include "train/distributed/tcp_socket.h"

namespace hk::dist {

struct Rendezvous {
  int rank = 0, world_size = 1;
  // Rank 0: peers[r] is rank r's connection (peers[0] unused). Others: peers[0] is rank 0.
  std::vector<tcp::Socket> peers;
  std::string payload;  // rank 0's payload, on every rank
};

// `payload` is used on rank 0 (ignored elsewhere). `backend` must be the same on every rank.
Rendezvous rendezvous(const RankEnvironment& env, const std::string& backend,
                      const std::string& payload, tcp::Deadline deadline);

// A host barrier over a rendezvous' connections: every rank tells rank 0, rank 0 answers all.
void star_barrier(Rendezvous& r, tcp::Deadline deadline, const char* what);

// Breaks every connection (the peers see them close), after an error.
void break_connections(Rendezvous& r);

}  // namespace hk::dist
