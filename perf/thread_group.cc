#include "thread_group.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace ccperf {

void ThreadBarrier::ArriveAndWait() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t gen = generation_;
  if (++arrived_ == count_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

void ThreadGroup::AllGather(const void* mine, size_t bytes, void* all) {
  auto& slot = shared_->slots_[static_cast<size_t>(rank_)];
  slot.assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
  Barrier();  // every slot is written
  for (int r = 0; r < nranks(); ++r) {
    std::memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes, shared_->slots_[static_cast<size_t>(r)].data(),
                bytes);
  }
  Barrier();  // every slot is read before the next all-gather overwrites it
}

int RunThreadRanks(int nranks, const std::function<int(Group&)>& body) {
  ThreadShared shared(nranks);
  std::vector<int> codes(static_cast<size_t>(nranks), 0);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      ThreadGroup group(&shared, r);
      codes[static_cast<size_t>(r)] = body(group);
    });
  }
  for (auto& t : threads) t.join();
  return *std::max_element(codes.begin(), codes.end());
}

}  // namespace ccperf
