// Algorithm choice for all-reduce: the configured algorithm, or with auto the tree for small messages (latency:
// 2 log2(n) steps) and the ring for large ones (bandwidth: 2 (n-1)/n of the data per rank).
#pragma once

#include "collectives/coll_args.h"

struct ccComm;

namespace ccoll {

ccAlgo_t ChooseAllReduceAlgo(const ccComm* comm, const CollArgs& args);
ccResult_t AllReduce(ccComm* comm, const CollArgs& args);

}  // namespace ccoll
