// Double binary tree all-reduce: the buffer is split in two halves, one per tree. For each slice, every node adds
// its children's partial sums to its own (child 0 first, then child 1: a fixed order) and passes the result up;
// the root finishes it (avg) and the finished bytes come back down, so every rank ends bitwise identical. Up to
// CC_TREE_DEPTH slices travel up before a node waits for the first one to come back down.
#pragma once

#include "collectives/coll_args.h"

struct ccComm;

namespace ccoll {

ccResult_t TreeAllReduce(ccComm* comm, const CollArgs& args);

}  // namespace ccoll
