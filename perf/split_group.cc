#include "split_group.h"

#include <cstring>
#include <set>

namespace ccperf {

SplitGroup::SplitGroup(Group& parent, unsigned mask)
    : parent_(parent), color_(static_cast<unsigned>(parent.rank()) & mask) {
  std::set<unsigned> colors;
  for (int r = 0; r < parent.nranks(); ++r) {
    const unsigned c = static_cast<unsigned>(r) & mask;
    colors.insert(c);
    if (c != color_) continue;
    if (r == parent.rank()) rank_ = static_cast<int>(members_.size());
    members_.push_back(r);
  }
  colors_ = static_cast<int>(colors.size());
}

void SplitGroup::AllGather(const void* mine, size_t bytes, void* all) {
  std::vector<char> everyone(bytes * static_cast<size_t>(parent_.nranks()));
  parent_.AllGather(mine, bytes, everyone.data());
  for (size_t i = 0; i < members_.size(); ++i) {
    std::memcpy(static_cast<char*>(all) + i * bytes, everyone.data() + static_cast<size_t>(members_[i]) * bytes,
                bytes);
  }
}

}  // namespace ccperf
