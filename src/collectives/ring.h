// Ring schedules, pipelined in slices of CC_SLICE_BYTES (the chains' slices shrink for smaller calls:
// ChainSliceElems). Rank r sends to r+1 and receives from r-1. Every chunk is reduced in a fixed order (starting at
// its owner's successor and walking the ring), so results are deterministic, and the all-gather half copies the
// owner's finished bytes, so every rank ends bitwise identical.
#pragma once

#include "collectives/coll_args.h"

struct ccComm;

namespace ccoll {

ccResult_t RingAllReduce(ccComm* comm, const CollArgs& args);
ccResult_t RingReduceScatter(ccComm* comm, const CollArgs& args);
ccResult_t RingAllGather(ccComm* comm, const CollArgs& args);
ccResult_t RingBroadcast(ccComm* comm, const CollArgs& args);
// A pipelined chain along the ring that ends at args.root: root + 1 sends its slices, every rank after it adds its
// own and forwards the partial sums, root adds its own last into recv. recv is written on root only.
ccResult_t RingReduce(ccComm* comm, const CollArgs& args);
// The slice, in elements, of the broadcast's and the reduce's chains: CC_SLICE_BYTES (`sliceBytes`); where some rank
// runs in another process (`acrossProcesses`), smaller for calls of fewer than 32 (n - 2) such slices, down to 64 KiB.
size_t ChainSliceElems(size_t sliceBytes, int nranks, bool acrossProcesses, size_t count, size_t eltSize);

}  // namespace ccoll
