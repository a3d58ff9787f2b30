#include "collectives/lowrank.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/algo.h"
#include "collectives/compressed.h"
#include "compress/compressor.h"
#include "compress/lowrank.h"
#include "compress/rng.h"
#include "compress/widen.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {

namespace {

// Rows of a matrix that the fused steps of LowRankAllReduce take at a time: about 256 KiB of float32, so that what one
// step writes is still in cache for the next. The same on every rank (the BLAS may round a product of another shape
// differently).
int64_t BlockRows(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / cols); }

}  // namespace

ccResult_t LowRankSum(ccComm* comm, ccCompressor* c, const CodecCall& call, float* data, size_t count,
                      ccDataType_t wire) {
  if (count == 0) return ccSuccess;
  auto codec = MakeCast16Codec(wire, call);
  return RunCodec(comm, c, *codec, data, count);
}

void LowRankStartQ(ccCompressor* c, const LowRankPlan& plan, const CodecCall& call) {
  const double eps = static_cast<double>(c->Get(ccParamOrthoEpsilon)) * 1e-12;
  const bool warm = c->Get(ccParamWarmStart) != 0 && c->lowRankQ.size() == plan.qElems;
  c->lowRankQ.resize(plan.qElems);
  for (size_t t = 0; t < plan.matrices.size(); ++t) {
    const LowRankMatrix& mt = plan.matrices[t];
    float* q = c->lowRankQ.data() + mt.qOffset;
    if (warm) Orthogonalize(q, mt.cols, mt.rank, eps, &c->lowRankScratch);
    if (!warm || !UsableQ(q, mt.cols, mt.rank)) {
      const uint32_t key = StreamKey(call.seed, call.call, ~0u, kPurposeLowRank + static_cast<uint32_t>(t << 8));
      RandomQ(q, mt.cols, mt.rank, key, &c->lowRankScratch);
    }
  }
}

bool LowRankKeepsRounding(const ccCompressor& c, uint64_t call, int nranks, size_t count) {
  return c.kind == ccCompressPowerSGD && c.Get(ccParamErrorFeedback) != 0 && nranks > 1 && count > 0 &&
         call >= static_cast<uint64_t>(c.Get(ccParamStartIter));
}

float LowRankRoundingShare(bool average, int nranks) {
  return average ? 1.0f : static_cast<float>(1.0 / static_cast<double>(nranks));
}

bool LowRankShapesFit(const ccCompressor& c, size_t count, std::string* why) {
  LowRankPlan plan;
  return PlanLowRank(c, count, &plan, why);
}

// M = G + E; Q orthonormalized; P = M Q; all-reduce P (sum); orthogonalize P; Q = M^T P; all-reduce Q; Q /= n;
// G^ = P Q^T (the average; n times that for sum); E = M - G^. Vectors and small matrices ride along with P, exactly.
// 16-bit data: the bytes of the float32 call on the widened values, narrowed (compress/widen.h), without a widened
// copy of the input when there is error feedback (it is added into the memory as it is widened); the memory then
// also keeps this rank's share of what the narrowing rounds away (NarrowKeeping).
ccResult_t LowRankAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c, const CodecCall& call) {
#ifndef CCOLL_HAVE_BLAS
  return Fail(ccInvalidUsage, "rank %d: powersgd on host buffers needs a CPU BLAS, and this build of ccoll has none",
              comm->rank);
#else
  const size_t count = a.count;
  LowRankPlan plan;
  std::string why;
  if (!PlanLowRank(*c, count, &plan, &why)) return Fail(ccInvalidUsage, "powersgd: %s", why.c_str());
  const bool half = a.dtype != ccFloat32;
  if (call.call < static_cast<uint64_t>(c->Get(ccParamStartIter))) {  // not started yet: exact
    if (!half) return AllReduce(comm, a);
    c->widened.resize(count);
    Widen(a.dtype, a.send, count, c->widened.data());
    CollArgs w = a;
    w.send = w.recv = c->widened.data();
    w.dtype = ccFloat32;
    w.eltSize = sizeof(float);
    CC_CHECK(AllReduce(comm, w));
    Narrow(a.dtype, c->widened.data(), count, a.recv);
    return ccSuccess;
  }

  const float n = static_cast<float>(comm->nranks);
  const bool ef = c->Get(ccParamErrorFeedback) != 0;
  if (ef) c->errorFeedback.resize(count, 0.0f);  // the bucket's memory: zero at the first call
  if (half) c->widened.resize(count);
  float* e = ef ? c->errorFeedback.data() : nullptr;
  // M: the memory (E + G), the input, or (16-bit data without error feedback) the input widened. makeM makes it over
  // [begin, begin + len), a block just before the block's product reads it (float32 input without error feedback is
  // M already).
  const float* m = ef ? e : half ? c->widened.data() : static_cast<const float*>(a.send);
  auto makeM = [&](size_t begin, size_t len) {
    const char* in = static_cast<const char*>(a.send) + begin * a.eltSize;
    if (ef) {
      AddChecked(a.dtype, in, len, e + begin);  // (the update below drops non-finite leftovers itself)
    } else if (half) {
      Widen(a.dtype, in, len, c->widened.data() + begin);
    }
  };
  // The float32 result: the output, or (16-bit data) the widened copy, narrowed into the output block by block. M is
  // not read after Q = M^T P except by the error feedback (which then keeps M in its memory), so the result may
  // overwrite the input or the copy that holds M.
  float* out = half ? c->widened.data() : static_cast<float*>(a.recv);

  // Q: the previous call's (warm start), orthonormalized again, when it is usable; else a fresh random one. The
  // same on every rank.
  LowRankStartQ(c, plan, call);
  const double eps = static_cast<double>(c->Get(ccParamOrthoEpsilon)) * 1e-12;

  // Round 1: every P, a block of rows at a time right after the block of M is made, then the exact parts.
  std::vector<float>& pBuf = c->staging;
  pBuf.resize(plan.pElems + plan.exactElems);
  for (const LowRankMatrix& mt : plan.matrices) {
    const int64_t step = BlockRows(mt.cols);
    for (int64_t r0 = 0; r0 < mt.rows; r0 += step) {
      const int64_t rows = std::min(step, mt.rows - r0);
      const size_t begin = mt.offset + static_cast<size_t>(r0 * mt.cols);
      makeM(begin, static_cast<size_t>(rows * mt.cols));
      ProductMQ(m + begin, rows, mt.cols, c->lowRankQ.data() + mt.qOffset, mt.rank,
                pBuf.data() + mt.pOffset + static_cast<size_t>(r0) * static_cast<size_t>(mt.rank));
    }
  }
  float* exactPart = pBuf.data() + plan.pElems;
  for (const auto& [offset, length] : plan.exact) {
    makeM(offset, length);
    std::memcpy(exactPart, m + offset, length * sizeof(float));
    exactPart += length;
  }
  // P in the wire type of the factors; the exact parts in float32 (one all-reduce when those are the same).
  const ccDataType_t wire = static_cast<ccDataType_t>(c->Get(ccParamValueType));
  if (wire == ccFloat32) {
    CC_CHECK(LowRankSum(comm, c, call, pBuf.data(), pBuf.size(), ccFloat32));
  } else {
    CC_CHECK(LowRankSum(comm, c, call, pBuf.data(), plan.pElems, wire));
    CC_CHECK(LowRankSum(comm, c, call, pBuf.data() + plan.pElems, plan.exactElems, ccFloat32));
  }
  for (const LowRankMatrix& mt : plan.matrices) {
    Orthogonalize(pBuf.data() + mt.pOffset, mt.rows, mt.rank, eps, &c->lowRankScratch);
  }

  // Round 2: Q = M^T P.
  std::vector<float>& qBuf = c->lowRankOut;
  qBuf.resize(plan.qElems);
  for (const LowRankMatrix& mt : plan.matrices) {
    ProductMtP(m + mt.offset, mt.rows, mt.cols, pBuf.data() + mt.pOffset, mt.rank, qBuf.data() + mt.qOffset);
  }
  CC_CHECK(LowRankSum(comm, c, call, qBuf.data(), qBuf.size(), wire));
  for (size_t i = 0; i < plan.qElems; ++i) c->lowRankQ[i] = qBuf[i] / n;  // the average; kept for the warm start

  // The result, a block of rows at a time, each finished while it is in cache: what the average did not carry stays
  // for the next call (E = M - G^; non-finite leftovers are dropped so one bad gradient cannot poison every later
  // call), then G^ times n for a sum, then (16-bit data) narrowed into the output, the memory keeping this rank's
  // share of what that rounds away (NarrowKeeping).
  const bool keep = half && LowRankKeepsRounding(*c, call.call, comm->nranks, count);
  const float share = LowRankRoundingShare(a.op == ccAvg, comm->nranks);
  auto narrow = [&](size_t begin, size_t len) {
    void* to = static_cast<uint16_t*>(a.recv) + begin;
    if (keep) {
      NarrowKeeping(a.dtype, out + begin, len, share, e + begin, to);
    } else {
      Narrow(a.dtype, out + begin, len, to);
    }
  };
  for (const LowRankMatrix& mt : plan.matrices) {
    const int64_t step = BlockRows(mt.cols);
    for (int64_t r0 = 0; r0 < mt.rows; r0 += step) {
      const int64_t rows = std::min(step, mt.rows - r0);
      const size_t begin = mt.offset + static_cast<size_t>(r0 * mt.cols), len = static_cast<size_t>(rows * mt.cols);
      float* g = out + begin;
      ProductPQt(pBuf.data() + mt.pOffset + static_cast<size_t>(r0) * static_cast<size_t>(mt.rank),
                 c->lowRankQ.data() + mt.qOffset, rows, mt.cols, mt.rank, g);
      if (ef) {
        float* em = e + begin;
        for (size_t i = 0; i < len; ++i) {
          const float left = em[i] - g[i];
          em[i] = std::isfinite(left) ? left : 0.0f;
        }
      }
      if (a.op == ccSum) {
        for (size_t i = 0; i < len; ++i) g[i] *= n;
      }
      if (half) narrow(begin, len);
    }
  }
  // The exact parts lost nothing but the narrowing: their memory is zero (or what that rounds away), their result the
  // sum (or average) of the ranks' values.
  exactPart = pBuf.data() + plan.pElems;
  for (const auto& [offset, length] : plan.exact) {
    if (ef) std::fill(e + offset, e + offset + length, 0.0f);
    for (size_t i = 0; i < length; ++i) out[offset + i] = a.op == ccSum ? exactPart[i] : exactPart[i] / n;
    if (half) narrow(offset, length);
    exactPart += length;
  }
  return ccSuccess;
#endif
}

}  // namespace ccoll
