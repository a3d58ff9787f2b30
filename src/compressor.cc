// C API entry points of compressors: creation from a kind or a spec string, parameters with bounds, destruction.
// The parameter table lives with the codecs (compress/compressor.h); this floor validates and reports.
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "api_guard.h"
#include "ccoll.h"
#include "compress/compressor.h"
#include "core/error.h"
#include "raw_enum.h"

using ccoll::Fail;
using ccoll::Guarded;

namespace ccoll {

// Live compressors, so a destroyed or foreign pointer is an error instead of undefined behaviour.
std::mutex gLiveMutex;
std::unordered_set<ccCompressor*>& Live() {
  static auto* live = new std::unordered_set<ccCompressor*>();
  return *live;
}

bool IsLiveCompressor(ccCompressor* c) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  return Live().count(c) != 0;
}

bool PinLiveCompressor(ccCompressor* c) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  if (Live().count(c) == 0) return false;
  std::lock_guard<std::mutex> use(c->useMutex);
  ++c->taking;
  return true;
}

ccResult_t ChangeCompressor(ccCompressor* c, const char* fn, const std::function<void()>& change) {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    if (Live().count(c) == 0) {
      return Fail(ccInvalidArgument, "%s: comp %p is not a live compressor", fn, static_cast<void*>(c));
    }
    std::lock_guard<std::mutex> use(c->useMutex);
    if (c->uses > c->queuedUses || c->taking > 0 || c->changing) {
      return Fail(ccInvalidUsage,
                  "%s: compressor %p is in use by a call running on another thread (or being changed "
                  "by one); change it once that call has returned",
                  fn, static_cast<void*>(c));
    }
    c->changing = true;
  }
  c->WaitIdle();  // device calls queued with it read its parameters and state until they have run
  change();
  std::lock_guard<std::mutex> use(c->useMutex);
  c->changing = false;
  return ccSuccess;
}

ccResult_t NewCompressor(int kind, ccCompressor** out) {
  unsigned bit = KindBit(kind);
  if (bit == 0) {
    return Fail(ccInvalidArgument, "ccCompressorCreate: compressor kind %d is not a ccCompressorKind_t (cast16 %d, "
                "quant %d, topk %d, "
                "randk %d, powersgd %d)", kind, ccCompressCast16, ccCompressQuant, ccCompressTopkChunk,
                ccCompressRandk, ccCompressPowerSGD);
  }
#ifndef CCOLL_HAVE_LOWRANK
  if (kind == ccCompressPowerSGD) {
    return Fail(ccInvalidUsage, "compressor kind powersgd needs a BLAS (a CPU BLAS for host buffers, cuBLAS for "
                "device buffers), and this build of ccoll has neither (configure with libopenblas-dev installed)");
  }
#endif
  auto c = std::make_unique<ccCompressor>();
  c->kind = static_cast<ccCompressorKind_t>(kind);
  for (const CompressorParamInfo* p = ParamInfoTable(); p->name; ++p) {
    if (p->kinds & bit) c->values[p->param] = DefaultParamValue(c->kind, p->param);
  }
  *out = c.release();
  return ccSuccess;
}

ccResult_t SetCompressorParam(ccCompressor* c, int param, int64_t value, const char* fn, bool live) {
  const CompressorParamInfo* info = FindParam(param);
  if (info == nullptr) {
    return Fail(ccInvalidArgument, "%s: parameter %d is not a ccCompressorParam_t", fn, param);
  }
  if (!(info->kinds & KindBit(c->kind))) {
    return Fail(ccInvalidArgument, "%s: parameter %s does not apply to a %s compressor", fn, info->name,
                KindName(c->kind));
  }
  if (value < info->lo || value > info->hi) {
    if (const double scale = ParamTextScale(info->param); scale != 0.0) {  // units the spec string does not show
      return Fail(ccInvalidArgument, "%s: %s %lld (%.12g in a spec string) is out of range %lld..%lld (%.12g..%.12g)",
                  fn, info->name, static_cast<long long>(value), static_cast<double>(value) / scale,
                  static_cast<long long>(info->lo), static_cast<long long>(info->hi),
                  static_cast<double>(info->lo) / scale, static_cast<double>(info->hi) / scale);
    }
    return Fail(ccInvalidArgument, "%s: %s %lld is out of range %lld..%lld", fn, info->name,
                static_cast<long long>(value), static_cast<long long>(info->lo), static_cast<long long>(info->hi));
  }
  const std::string problem = ParamValueProblem(c->kind, *info, value);
  if (!problem.empty()) {
    return Fail(ccInvalidArgument, "%s: %s %lld is %s (%s)", fn, info->name, static_cast<long long>(value),
                problem.c_str(), ParamValueForms(c->kind, *info).c_str());
  }
  auto change = [&] {
    if (c->values[info->param] == value) return;  // unchanged: the state stays (ranks stay in step)
    c->values[info->param] = value;
    c->ResetState();
  };
  if (live) {
    {
      std::lock_guard<std::mutex> use(c->useMutex);
      if (!c->changing && c->values.at(info->param) == value) return ccSuccess;  // unchanged, even while in use
    }
    return ChangeCompressor(c, fn, change);
  }
  change();  // a compressor being made, which no other thread knows yet
  return ccSuccess;
}

ccResult_t ParseCompressorSpec(const char* spec, ccCompressor** out) {
  const char* fn = "ccCompressorCreateFromString";
  std::string s(spec);
  std::string kindName = s.substr(0, s.find(':'));
  ccCompressorKind_t kind;
  if (kindName == "cast16") kind = ccCompressCast16;
  else if (kindName == "quant") kind = ccCompressQuant;
  else if (kindName == "topk") kind = ccCompressTopkChunk;
  else if (kindName == "randk") kind = ccCompressRandk;
  else if (kindName == "powersgd") kind = ccCompressPowerSGD;
  else {
    return Fail(ccInvalidArgument, "%s: \"%s\": unknown compressor kind \"%s\" (cast16, quant, topk, randk, powersgd)",
                fn, spec,
                kindName.c_str());
  }
  ccCompressor* c = nullptr;
  CC_CHECK(NewCompressor(kind, &c));
  std::unique_ptr<ccCompressor> owned(c);
  size_t pos = kindName.size();
  std::set<std::string> seen;  // each name once: a second one would quietly win
  if (pos < s.size()) {
    ++pos;  // the ':'
    if (pos >= s.size()) return Fail(ccInvalidArgument, "%s: \"%s\": nothing after ':'", fn, spec);
    while (pos <= s.size()) {
      size_t comma = s.find(',', pos);
      if (comma == std::string::npos) comma = s.size();
      std::string item = s.substr(pos, comma - pos);
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
        return Fail(ccInvalidArgument, "%s: \"%s\": \"%s\" is not name=value", fn, spec, item.c_str());
      }
      std::string name = item.substr(0, eq), text = item.substr(eq + 1);
      if (!seen.insert(name).second) {
        return Fail(ccInvalidArgument, "%s: \"%s\": %s is given twice", fn, spec, name.c_str());
      }
      if (name == "shapes" && kind == ccCompressPowerSGD) {
        if (!ParseShapes(text, &c->shapes)) {
          return Fail(ccInvalidArgument, "%s: \"%s\": shapes \"%s\" is not a '+'-separated list of ROWSxCOLS or N "
                      "(positive integers)", fn, spec, text.c_str());
        }
        pos = comma + 1;
        continue;
      }
      const CompressorParamInfo* info = FindParamByName(name);
      if (info == nullptr || !(info->kinds & KindBit(kind))) {
        return Fail(ccInvalidArgument, "%s: \"%s\": %s has no parameter \"%s\"", fn, spec, kindName.c_str(),
                    name.c_str());
      }
      int64_t value = 0;
      if (!ParseParamValue(*info, text, &value)) {
        return Fail(ccInvalidArgument, "%s: \"%s\": \"%s\" is not a valid value of %s (%s)", fn, spec, text.c_str(),
                    name.c_str(), ParamValueForms(kind, *info).c_str());
      }
      const std::string problem = ParamValueProblem(kind, *info, value);
      if (!problem.empty()) {  // in the string's terms (SetCompressorParam's message has the C API's units)
        return Fail(ccInvalidArgument, "%s: \"%s\": %s=%s is %s (%s)", fn, spec, name.c_str(), text.c_str(),
                    problem.c_str(), ParamValueForms(kind, *info).c_str());
      }
      const std::string where = std::string(fn) + ": \"" + spec + "\"";
      CC_CHECK(SetCompressorParam(c, info->param, value, where.c_str(), false));
      pos = comma + 1;
    }
  }
  std::string why;
  if (!CompressorCombinationValid(*c, &why)) return Fail(ccInvalidArgument, "%s: \"%s\": %s", fn, spec, why.c_str());
  *out = owned.release();
  return ccSuccess;
}

}  // namespace ccoll

namespace {

ccResult_t Publish(ccCompressor* c, ccCompressor_t* out) {
  std::lock_guard<std::mutex> lock(ccoll::gLiveMutex);
  ccoll::Live().insert(c);
  *out = c;
  return ccSuccess;
}

}  // namespace

extern "C" {

CC_API ccResult_t ccCompressorCreate(ccCompressor_t* comp, ccCompressorKind_t kind) {
  return Guarded("ccCompressorCreate", [&]() -> ccResult_t {
    if (comp == nullptr) return Fail(ccInvalidArgument, "ccCompressorCreate: comp (the output pointer) is NULL");
    *comp = nullptr;
    ccCompressor* c = nullptr;
    CC_CHECK(ccoll::NewCompressor(ccoll::RawEnum(kind), &c));
    return Publish(c, comp);
  });
}

CC_API ccResult_t ccCompressorCreateFromString(ccCompressor_t* comp, const char* spec) {
  return Guarded("ccCompressorCreateFromString", [&]() -> ccResult_t {
    if (comp == nullptr) {
      return Fail(ccInvalidArgument, "ccCompressorCreateFromString: comp (the output pointer) is NULL");
    }
    *comp = nullptr;
    if (spec == nullptr) return Fail(ccInvalidArgument, "ccCompressorCreateFromString: spec is NULL");
    ccCompressor* c = nullptr;
    CC_CHECK(ccoll::ParseCompressorSpec(spec, &c));
    return Publish(c, comp);
  });
}

CC_API ccResult_t ccCompressorSetParam(ccCompressor_t comp, ccCompressorParam_t param, int64_t value) {
  return Guarded("ccCompressorSetParam", [&]() -> ccResult_t {
    if (comp == nullptr || !ccoll::IsLiveCompressor(comp)) {
      return Fail(ccInvalidArgument, "ccCompressorSetParam: comp %p is not a live compressor",
                  static_cast<void*>(comp));
    }
    return ccoll::SetCompressorParam(comp, ccoll::RawEnum(param), value, "ccCompressorSetParam", true);
  });
}

CC_API ccResult_t ccCompressorSetShapes(ccCompressor_t comp, int ntensors, const int64_t* rows, const int64_t* cols) {
  return Guarded("ccCompressorSetShapes", [&]() -> ccResult_t {
    if (comp == nullptr || !ccoll::IsLiveCompressor(comp)) {
      return Fail(ccInvalidArgument, "ccCompressorSetShapes: comp %p is not a live compressor",
                  static_cast<void*>(comp));
    }
    if (comp->kind != ccCompressPowerSGD) {
      return Fail(ccInvalidArgument, "ccCompressorSetShapes: a %s compressor has no shapes (powersgd only)",
                  ccoll::KindName(comp->kind));
    }
    if (ntensors < 0) return Fail(ccInvalidArgument, "ccCompressorSetShapes: ntensors is %d", ntensors);
    if (ntensors > 0 && (rows == nullptr || cols == nullptr)) {
      return Fail(ccInvalidArgument, "ccCompressorSetShapes: rows or cols is NULL but ntensors is %d", ntensors);
    }
    std::vector<ccoll::TensorShape> shapes(static_cast<size_t>(ntensors));
    for (int i = 0; i < ntensors; ++i) {
      if (rows[i] <= 0 || cols[i] <= 0 || rows[i] > (int64_t{1} << 40) || cols[i] > (int64_t{1} << 40)) {
        return Fail(ccInvalidArgument, "ccCompressorSetShapes: tensor %d is %lld x %lld (each side 1..2^40)", i,
                    static_cast<long long>(rows[i]), static_cast<long long>(cols[i]));
      }
      shapes[i].rows = rows[i];
      shapes[i].cols = cols[i];
    }
    return ccoll::ChangeCompressor(comp, "ccCompressorSetShapes", [&] {
      comp->shapes = std::move(shapes);
      comp->ResetState();
    });
  });
}

CC_API ccResult_t ccCompressorGetParam(ccCompressor_t comp, ccCompressorParam_t param, int64_t* value) {
  return Guarded("ccCompressorGetParam", [&]() -> ccResult_t {
    if (comp == nullptr || !ccoll::IsLiveCompressor(comp)) {
      return Fail(ccInvalidArgument, "ccCompressorGetParam: comp %p is not a live compressor",
                  static_cast<void*>(comp));
    }
    if (value == nullptr) return Fail(ccInvalidArgument, "ccCompressorGetParam: value is NULL");
    const int raw = ccoll::RawEnum(param);
    const ccoll::CompressorParamInfo* info = ccoll::FindParam(raw);
    auto it = info ? comp->values.find(info->param) : comp->values.end();
    if (it == comp->values.end()) {
      return Fail(ccInvalidArgument, "ccCompressorGetParam: parameter %s (%d) does not apply to a %s compressor",
                  info ? info->name : "unknown", raw, ccoll::KindName(comp->kind));
    }
    *value = it->second;
    return ccSuccess;
  });
}

CC_API ccResult_t ccCompressorGetParamBounds(ccCompressorParam_t param, int64_t* lo, int64_t* hi) {
  return Guarded("ccCompressorGetParamBounds", [&]() -> ccResult_t {
    const ccoll::CompressorParamInfo* info = ccoll::FindParam(ccoll::RawEnum(param));
    if (info == nullptr) {
      return Fail(ccInvalidArgument, "ccCompressorGetParamBounds: parameter %d is not a ccCompressorParam_t",
                  ccoll::RawEnum(param));
    }
    if (lo == nullptr || hi == nullptr) return Fail(ccInvalidArgument, "ccCompressorGetParamBounds: lo or hi is NULL");
    *lo = info->lo;
    *hi = info->hi;
    return ccSuccess;
  });
}

CC_API ccResult_t ccCompressorGetSpec(ccCompressor_t comp, char* buf, size_t size) {
  return Guarded("ccCompressorGetSpec", [&]() -> ccResult_t {
    if (comp == nullptr || !ccoll::IsLiveCompressor(comp)) {
      return Fail(ccInvalidArgument, "ccCompressorGetSpec: comp %p is not a live compressor", static_cast<void*>(comp));
    }
    std::string spec = ccoll::CompressorSpec(*comp);
    if (buf == nullptr || size < spec.size() + 1) {
      return Fail(ccInvalidArgument, "ccCompressorGetSpec: the spec needs %zu bytes, buf has %zu", spec.size() + 1,
                  buf == nullptr ? size_t{0} : size);
    }
    std::memcpy(buf, spec.c_str(), spec.size() + 1);
    return ccSuccess;
  });
}

CC_API ccResult_t ccCompressorDestroy(ccCompressor_t comp) {
  return Guarded("ccCompressorDestroy", [&]() -> ccResult_t {
    if (comp == nullptr) return ccSuccess;
    {
      std::lock_guard<std::mutex> lock(ccoll::gLiveMutex);
      if (ccoll::Live().count(comp) == 0) {
        return Fail(ccInvalidArgument, "ccCompressorDestroy: %p is not a live compressor (destroyed twice?)",
                    static_cast<void*>(comp));
      }
      {
        // A call running with it (on another thread) keeps it: freeing it under the call would corrupt that call.
        // Only device calls queued on a proxy may hold it; those are waited for below.
        std::lock_guard<std::mutex> use(comp->useMutex);
        if (comp->uses > comp->queuedUses || comp->taking > 0 || comp->changing) {
          return Fail(ccInvalidUsage, "ccCompressorDestroy: compressor %p is in use by a call running on another "
                      "thread; destroy it once that call has returned", static_cast<void*>(comp));
        }
      }
      ccoll::Live().erase(comp);
    }
    comp->WaitIdle();  // device calls queued with it still run
    delete comp;
    return ccSuccess;
  });
}

}  // extern "C"
