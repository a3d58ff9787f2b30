// The side channel of one communicator made by ccCommSplit (allreduce_perf -M): the ranks of the parent group whose
// color (rank & mask) is this rank's, ranked by their parent rank, as the split ranks them. Every communicator runs
// the same benchmark loop at once, so the parent's ranks all reach the same exchanges: each one is the parent's, of
// which a rank keeps its own color's part. AllOk is the parent's, so one failing communicator stops all of them
// together instead of leaving the others in an exchange it no longer makes.
#pragma once

#include <vector>

#include "group.h"

namespace ccperf {

class SplitGroup : public Group {
 public:
  SplitGroup(Group& parent, unsigned mask);

  int rank() const override { return rank_; }
  int nranks() const override { return static_cast<int>(members_.size()); }
  void Barrier() override { parent_.Barrier(); }
  void AllGather(const void* mine, size_t bytes, void* all) override;
  bool AllOk(bool ok) override { return parent_.AllOk(ok); }

  unsigned color() const { return color_; }
  // How many communicators the split makes (colors that have a rank).
  int colors() const { return colors_; }

 private:
  Group& parent_;
  unsigned color_;
  std::vector<int> members_;  // parent ranks of this color, in order
  int rank_ = 0;
  int colors_ = 0;
};

}  // namespace ccperf
