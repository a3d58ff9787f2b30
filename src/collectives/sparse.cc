#include "collectives/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "collectives/compressed.h"
#include "compress/compressor.h"
#include "compress/rng.h"
#include "compress/sparse.h"
#include "compress/widen.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {
namespace {

// Elements per piece of the work done while the ring waits: 64 KiB of float32, tens of microseconds.
constexpr size_t kPiece = size_t{1} << 14;

// The element ranges [begin, end) of the chunks not in `chosen` (increasing), adjacent chunks merged.
std::vector<std::pair<size_t, size_t>> UnchosenRanges(size_t count, size_t chunk, const std::vector<uint32_t>& chosen) {
  std::vector<std::pair<size_t, size_t>> ranges;
  size_t at = 0;
  ForEachChosen(count, chunk, chosen, [&](size_t begin, size_t n, size_t) {
    if (begin > at) ranges.emplace_back(at, begin);
    at = begin + n;
  });
  if (at < count) ranges.emplace_back(at, count);
  return ranges;
}

// randk's pass over the chunks it does not send, done while its ring waits for the network (core/comm.h's
// IdleScope), piece by piece: the add of the input into the memory there (with error feedback), or the check that the
// input is finite there (without). Finish does what is left once the ring is done. (The result's zeros are not written
// here: a store loop in pieces costs the CPU a read of every line it writes, which one large fill does not.)
class UnsentChunks : public IdleWork {
 public:
  UnsentChunks(const CollArgs& a, std::vector<std::pair<size_t, size_t>> ranges, float* memory)
      : a_(a), ranges_(std::move(ranges)), memory_(memory) {
    if (!ranges_.empty()) at_ = ranges_[0].first;
  }

  bool RunPiece() override {
    if (next_ == ranges_.size()) return false;
    const size_t end = ranges_[next_].second, len = std::min(kPiece, end - at_);
    const char* in = static_cast<const char*>(a_.send) + at_ * a_.eltSize;
    if (memory_ != nullptr) {
      const AddReport r = AddChecked(a_.dtype, in, len, memory_ + at_);
      seen_.inputFinite = seen_.inputFinite && r.inputFinite;
      seen_.sumsFinite = seen_.sumsFinite && r.sumsFinite;
    } else if (seen_.inputFinite) {
      seen_.inputFinite = AllFinite(a_.dtype, in, len);
    }
    at_ += len;
    if (at_ == end && ++next_ < ranges_.size()) at_ = ranges_[next_].first;
    return next_ < ranges_.size();
  }

  void Finish() {
    while (RunPiece()) {
    }
  }
  const AddReport& seen() const { return seen_; }

 private:
  const CollArgs& a_;
  const std::vector<std::pair<size_t, size_t>> ranges_;
  float* const memory_;
  size_t next_ = 0, at_ = 0;  // the range and the element the next piece starts at
  AddReport seen_;
};

}  // namespace

// 16-bit data: the bytes of the float32 call on the widened values, narrowed (compress/widen.h), but for what error
// feedback keeps of that narrowing; with error feedback the input is widened as it is added into the memory.
ccResult_t SparseAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c, const CodecCall& call) {
  const size_t count = a.count;
  const size_t chunk = static_cast<size_t>(c->Get(ccParamChunkSize));
  const bool ef = c->Get(ccParamErrorFeedback) != 0;
  const bool half = a.dtype != ccFloat32;
  const bool randk = c->kind == ccCompressRandk;
  float* e = nullptr;
  if (ef) {
    c->errorFeedback.resize(count, 0.0f);  // the bucket's memory: zero at the first call
    e = c->errorFeedback.data();
  }
  const size_t chunks = ChunkCount(count, chunk);
  const size_t keep = KeptChunks(chunks, c->Get(ccParamDensityPpm));
  std::vector<uint32_t> chosen;
  std::vector<float>& staging = c->staging;  // the chosen values, packed; grows to the packed size once
  AddReport seen;  // over what this rank has read so far: whether its input was finite, and the memory's sums
  // randk over a network: only the chunks it sends before they travel, the rest while they do. Otherwise M (the memory
  // plus the input, or the input) over the whole bucket first, in one pass (topk's with its chunk norms, block by
  // block): topk needs M for its norms, and between thread ranks there is no network time to hide a pass behind.
  const bool deferRest = randk && WaitsRunIdleWork(*comm);
  const float* x = nullptr;
  std::vector<float> norms;  // topk's
  if (!deferRest) {
    x = static_cast<const float*>(a.send);
    if (ef && !randk) {
      // topk: each block of chunks' norms right after its sums, while the block is in cache (one pass, not two).
      norms.assign(chunks, 0.0f);
      const size_t block = std::max<size_t>(1, (size_t{16} << 10) / chunk);  // chunks of at least 16K elements
      for (size_t c0 = 0; c0 < chunks; c0 += block) {
        const size_t c1 = std::min(chunks, c0 + block), begin = c0 * chunk, end = std::min(count, c1 * chunk);
        const AddReport r =
            AddChecked(a.dtype, static_cast<const char*>(a.send) + begin * a.eltSize, end - begin, e + begin);
        seen.inputFinite = seen.inputFinite && r.inputFinite;
        seen.sumsFinite = seen.sumsFinite && r.sumsFinite;
        ChunkNormsOf(e, count, chunk, c0, c1, norms.data());
      }
      x = e;
    } else if (ef) {
      seen = AddChecked(a.dtype, a.send, count, e);
      x = e;
    } else {
      if (randk) seen.inputFinite = AllFinite(a.dtype, a.send, count);
      if (half) {
        c->widened.resize(count);  // grows to the bucket once, then is reused
        Widen(a.dtype, a.send, count, c->widened.data());
        x = c->widened.data();
      }
    }
  }
  if (randk) {
    RandomChunks(chunks, keep, StreamKey(call.seed, call.call, ~0u, kPurposeChunks), &chosen);
  } else {
    if (!ef) ChunkNorms(x, count, chunk, &norms);  // (with error feedback: made with the sums above)
    CC_CHECK(AgreeMeta(comm, &norms, ccSum));
    TopChunks(norms, keep, &chosen);
  }
  staging.resize(PackedCount(count, chunk, chosen));
  if (!deferRest) {
    GatherChunks(x, count, chunk, chosen, staging.data());
  } else {
    ForEachChosen(count, chunk, chosen, [&](size_t begin, size_t len, size_t k) {
      const char* in = static_cast<const char*>(a.send) + begin * a.eltSize;
      if (ef) {
        seen.inputFinite = AddChecked(a.dtype, in, len, e + begin).inputFinite && seen.inputFinite;
        std::memcpy(staging.data() + k, e + begin, len * sizeof(float));
      } else {
        if (half) {
          Widen(a.dtype, in, len, staging.data() + k);
        } else {
          std::memcpy(staging.data() + k, in, len * sizeof(float));
        }
        seen.inputFinite = seen.inputFinite && AllFinite(ccFloat32, staging.data() + k, len);
      }
    });
  }
  // With error feedback and 16-bit values: this rank's share of what the sums round away.
  float* lost = nullptr;
  const ccDataType_t resultType = half ? a.dtype : a.narrowedTo;
  if (SparseKeepsRounding(*c, resultType)) {
    c->sentRounding.resize(staging.size());
    lost = c->sentRounding.data();
  }
  if (deferRest) {
    UnsentChunks rest(a, UnchosenRanges(count, chunk, chosen), e);
    {
      IdleScope whileWaiting(comm, &rest);
      CC_CHECK(SumChosenChunks(comm, c, call, staging.data(), staging.size(), chunks, keep, a.op, resultType, lost));
    }
    rest.Finish();
    seen.inputFinite = seen.inputFinite && rest.seen().inputFinite;
    seen.sumsFinite = seen.sumsFinite && rest.seen().sumsFinite;
  } else {
    CC_CHECK(SumChosenChunks(comm, c, call, staging.data(), staging.size(), chunks, keep, a.op, resultType, lost));
  }
  if (ef) {
    // What was sent leaves the memory, but for what its 16-bit sums rounded away (dropped where not finite); what
    // was not sent stays for the next call.
    ForEachChosen(count, chunk, chosen, [&](size_t begin, size_t n, size_t at) {
      if (lost == nullptr) {
        std::fill(e + begin, e + begin + n, 0.0f);
        return;
      }
      for (size_t i = 0; i < n; ++i) e[begin + i] = std::isfinite(lost[at + i]) ? lost[at + i] : 0.0f;
    });
  }
  bool poisoned = false;
  if (randk) CC_CHECK(AgreeNonFinite(comm, !seen.inputFinite, &poisoned));
  if (poisoned) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (half) {
      FillNarrowed(a.dtype, nan, count, a.recv);
    } else {
      std::fill(static_cast<float*>(a.recv), static_cast<float*>(a.recv) + count, nan);
    }
  } else {
    // Zeros (+0 is all zero bits in every float type: one memset, whose large-size stores skip the cache), then the
    // chosen chunks.
    std::memset(a.recv, 0, count * a.eltSize);
    if (half) {
      ScatterChunksNarrowed(a.dtype, staging.data(), count, chunk, chosen, a.recv);
    } else {
      ScatterChunks(staging.data(), count, chunk, chosen, static_cast<float*>(a.recv));
    }
  }
  if (ef && !seen.sumsFinite) {
    // Non-finite leftovers are dropped so one bad gradient cannot poison every later call. (With every sum finite
    // there are none: no pass for them.)
    for (size_t i = 0; i < count; ++i) {
      if (!std::isfinite(e[i])) e[i] = 0.0f;
    }
  }
  return ccSuccess;
}

ccResult_t SumChosenChunks(ccComm* comm, ccCompressor* c, const CodecCall& call, float* values, size_t packed,
                           size_t chunks, size_t keep, ccRedOp_t op, ccDataType_t resultType, float* rounding) {
  const ccDataType_t valueType = static_cast<ccDataType_t>(c->Get(ccParamValueType));
  auto codec = MakeCast16Codec(valueType, call, rounding);
  CC_CHECK(RunCodec(comm, c, *codec, values, packed));
  float scale = 1.0f;
  if (c->kind == ccCompressRandk && c->Get(ccParamUnbiased) != 0) {
    scale = static_cast<float>(static_cast<double>(chunks) / static_cast<double>(keep));
  }
  if (op == ccAvg) scale /= static_cast<float>(comm->nranks);
  if (scale != 1.0f) {
    for (size_t i = 0; i < packed; ++i) values[i] *= scale;
  }
  if (rounding != nullptr && resultType != ccFloat32) {
    // The result's own rounding to 16 bits (the same on every rank): each rank keeps its share, so that the memories
    // together send it again; added to what the 16-bit sums rounded away, or alone after float32 sums, which lose
    // nothing (the codec left `rounding` alone). The device drivers compute the same with the cast codec's kernels.
    NarrowingLoss(resultType, values, packed, OutputRoundingShare(*c, chunks, keep, op == ccAvg, comm->nranks),
                  valueType != ccFloat32, rounding);
  }
  return ccSuccess;
}

bool SparseKeepsRounding(const ccCompressor& c, ccDataType_t resultType) {
  return c.Get(ccParamErrorFeedback) != 0 && (c.Get(ccParamValueType) != ccFloat32 || resultType != ccFloat32);
}

float OutputRoundingShare(const ccCompressor& c, size_t chunks, size_t keep, bool average, int nranks) {
  double share = 1.0;
  if (c.kind == ccCompressRandk && c.Get(ccParamUnbiased) != 0) {  // (no error feedback today: for completeness)
    share = static_cast<double>(keep) / static_cast<double>(chunks);
  }
  if (!average) share /= static_cast<double>(nranks);
  return static_cast<float>(share);
}

ccResult_t AgreeNonFinite(ccComm* comm, bool sawNonFinite, bool* anyRank) {
  std::vector<float> flag = {sawNonFinite ? std::numeric_limits<float>::quiet_NaN() : 0.0f};
  CC_CHECK(AgreeMeta(comm, &flag, ccSum));
  *anyRank = !std::isfinite(flag[0]);
  return ccSuccess;
}

}  // namespace ccoll
