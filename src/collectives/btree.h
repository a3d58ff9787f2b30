// Double binary tree topology (as NCCL's): two balanced binary trees over the ranks, each carrying half of the
// data, laid out so that ranks that are leaves in one tree tend to be inner nodes in the other, which balances the
// send and receive load of the tree all-reduce.
#pragma once

namespace ccoll {

struct TreeNode {
  int parent = -1;           // -1 at the root
  int children[2] = {-1, -1};  // -1 where absent
  int depth = 0;             // distance from the root
};

// This rank's place in tree 0 and tree 1 of an nranks-rank double binary tree.
void DoubleBinaryTree(int nranks, int rank, TreeNode trees[2]);

}  // namespace ccoll
