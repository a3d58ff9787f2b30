#include "collectives/algo.h"

#include "collectives/ring.h"
#include "collectives/tree.h"
#include "core/comm.h"
#include "core/log.h"

namespace ccoll {

ccAlgo_t ChooseAllReduceAlgo(const ccComm* comm, const CollArgs& a) {
  if (comm->config.algorithm != ccAlgoAuto) return comm->config.algorithm;
  if (comm->nranks <= 2) return ccAlgoRing;  // the same two messages either way
  return a.count * a.eltSize <= comm->config.treeThreshold ? ccAlgoTree : ccAlgoRing;
}

ccResult_t AllReduce(ccComm* comm, const CollArgs& a) {
  ccAlgo_t algo = ChooseAllReduceAlgo(comm, a);
  CC_TRACE(kLogColl, "rank %d allreduce count %zu algo %s", comm->rank, a.count, algo == ccAlgoTree ? "tree" : "ring");
  return algo == ccAlgoTree ? TreeAllReduce(comm, a) : RingAllReduce(comm, a);
}

}  // namespace ccoll
