#include "collectives/btree.h"

#include <vector>

namespace ccoll {
namespace {

// Balanced in-order tree over positions [lo, hi): the middle position is the root of the range. Writes the node
// of position `want` into *out.
void Build(int lo, int hi, int parentPos, int depth, int want, const std::vector<int>& rankAt, TreeNode* out) {
  if (lo >= hi) return;
  int mid = lo + (hi - lo) / 2;
  if (mid == want) {
    out->parent = parentPos < 0 ? -1 : rankAt[parentPos];
    out->depth = depth;
    int left = lo + (mid - lo) / 2;
    int right = mid + 1 + (hi - mid - 1) / 2;
    out->children[0] = lo < mid ? rankAt[left] : -1;
    out->children[1] = mid + 1 < hi ? rankAt[right] : -1;
    return;
  }
  if (want < mid) {
    Build(lo, mid, mid, depth + 1, want, rankAt, out);
  } else {
    Build(mid + 1, hi, mid, depth + 1, want, rankAt, out);
  }
}

}  // namespace

void DoubleBinaryTree(int nranks, int rank, TreeNode trees[2]) {
  std::vector<int> rankAt(nranks);
  // Tree 0: rank r at position r. In-order trees put inner nodes at odd positions and leaves at even ones.
  for (int p = 0; p < nranks; ++p) rankAt[p] = p;
  trees[0] = TreeNode();
  Build(0, nranks, -1, 0, rank, rankAt, &trees[0]);
  // Tree 1: shifted by one position, so the even (leaf) ranks of tree 0 land on inner positions.
  for (int p = 0; p < nranks; ++p) rankAt[p] = (p + 1) % nranks;
  trees[1] = TreeNode();
  Build(0, nranks, -1, 0, (rank + nranks - 1) % nranks, rankAt, &trees[1]);
}

}  // namespace ccoll
