// The quarantine of destroyed handles' memory (handle_quarantine.h).
#include "core/handle_quarantine.h"

#include <deque>
#include <mutex>
#include <new>

namespace ccoll {

void QuarantineHandle(void* memory) {
  // Never destroyed: handles may be destroyed during exit.
  static auto* mutex = new std::mutex();
  static auto* held = new std::deque<void*>();
  void* oldest = nullptr;
  {
    std::lock_guard<std::mutex> lock(*mutex);
    held->push_back(memory);
    if (held->size() <= kQuarantinedHandles) return;
    oldest = held->front();
    held->pop_front();
  }
  ::operator delete(oldest);
}

}  // namespace ccoll
