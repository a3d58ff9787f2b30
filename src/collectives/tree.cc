#include "collectives/tree.h"

#include <algorithm>
#include <vector>

#include "collectives/average.h"
#include "collectives/btree.h"
#include "collectives/buffers.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {
namespace {

// One tree's share of the buffer and its in-flight state.
struct TreeState {
  TreeNode node;
  size_t offset = 0;  // first element of this tree's half
  size_t count = 0;   // elements of this tree's half
  size_t slices = 0;
  std::vector<Request*> upSends;  // by slice, until the slice comes back down
};

}  // namespace

ccResult_t TreeAllReduce(ccComm* comm, const CollArgs& args) {
  const int n = comm->nranks;
  const size_t es = args.eltSize;
  CallBuffers mem(comm, args);
  if (n == 1) return OneRankReduction(mem, args, args.count);
  CollArgs a = args;
  AverageInput average(mem.get());
  CC_CHECK(average.Prepare(&a, a.count, true, n));  // a premultiplied average: the input scaled into recv
  CC_CHECK(mem->Copy(a.recv, a.send, a.count * es));
  const uint64_t seq = comm->NextSeq();
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / es);
  TreeNode nodes[2];
  DoubleBinaryTree(n, comm->rank, nodes);
  TreeState trees[2];
  size_t maxSlices = 0;
  for (int t = 0; t < 2; ++t) {
    trees[t].node = nodes[t];
    trees[t].offset = PartOffset(a.count, 2, t);
    trees[t].count = PartSize(a.count, 2, t);
    trees[t].slices = (trees[t].count + sliceElems - 1) / sliceElems;
    trees[t].upSends.assign(trees[t].slices, nullptr);
    maxSlices = std::max(maxSlices, trees[t].slices);
  }
  Inflight io(comm);
  // Message index: (slice, tree, direction) -> unique, the same on both ends of every edge.
  auto tag = [&](size_t slice, int t, int down) { return Tag(seq, slice * 4 + t * 2 + down); };
  auto range = [&](const TreeState& ts, size_t k, size_t* off, size_t* cnt) {
    *off = ts.offset + k * sliceElems;
    *cnt = std::min(sliceElems, ts.count - k * sliceElems);
  };

  auto up = [&](int t, size_t k) -> ccResult_t {
    TreeState& ts = trees[t];
    size_t off, cnt;
    range(ts, k, &off, &cnt);
    char* mine = At(a.recv, off, es);
    Request* recv[2] = {nullptr, nullptr};
    for (int c = 0; c < 2; ++c) {
      if (ts.node.children[c] < 0) continue;
      CC_CHECK(io.Recv(ts.node.children[c], mem->Scratch(c), cnt * es, tag(k, t, 0), &recv[c]));
    }
    for (int c = 0; c < 2; ++c) {
      if (ts.node.children[c] < 0) continue;
      CC_CHECK(io.Wait(&recv[c]));
      CC_CHECK(mem->Reduce(mine, mine, mem->Scratch(c), cnt, a.dtype, a.op));
    }
    if (ts.node.parent < 0) {
      if (a.op == ccAvg) CC_CHECK(mem->FinishAvg(mine, cnt, a.dtype, n));
      return ccSuccess;
    }
    return io.Send(ts.node.parent, mine, cnt * es, tag(k, t, 0), &ts.upSends[k]);
  };

  auto down = [&](int t, size_t k) -> ccResult_t {
    TreeState& ts = trees[t];
    size_t off, cnt;
    range(ts, k, &off, &cnt);
    char* mine = At(a.recv, off, es);
    if (ts.node.parent >= 0) {
      // The parent has consumed our partial sum before it can send the finished slice, so this wait is short.
      CC_CHECK(io.Wait(&ts.upSends[k]));
      Request* recv = nullptr;
      CC_CHECK(io.Recv(ts.node.parent, mine, cnt * es, tag(k, t, 1), &recv));
      CC_CHECK(io.Wait(&recv));
    }
    for (int c = 0; c < 2; ++c) {
      if (ts.node.children[c] < 0) continue;
      Request* send = nullptr;  // waited for in WaitAll: nothing writes this slice again
      CC_CHECK(io.Send(ts.node.children[c], mine, cnt * es, tag(k, t, 1), &send));
    }
    return ccSuccess;
  };

  // Every rank runs the same sequence of (slice, tree, direction) steps, and a step waits only for the same step on
  // its tree neighbours, so the schedule cannot deadlock.
  const size_t depth = static_cast<size_t>(comm->config.treeDepth);
  for (size_t k = 0; k < maxSlices + depth; ++k) {
    for (int t = 0; t < 2; ++t) {
      if (k < trees[t].slices) CC_CHECK(up(t, k));
    }
    if (k >= depth) {
      for (int t = 0; t < 2; ++t) {
        if (k - depth < trees[t].slices) CC_CHECK(down(t, k - depth));
      }
    }
  }
  return io.WaitAll();
}

}  // namespace ccoll
