// The compressor object behind ccCompressor_t: a kind, its parameters, and one bucket's persistent state (error
// feedback, call counter, wire scratch). Parameters are described by one table (name in spec strings, bounds,
// default, which kinds take it), used by the setters, the spec parser and the spec printer alike.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "core/handle_quarantine.h"

namespace ccoll {

class DeviceCodecState;  // compress/device_codec.h (CUDA builds)

struct CompressorParamInfo {
  ccCompressorParam_t param;
  const char* name;       // in spec strings
  int64_t lo, hi;
  unsigned kinds;         // bit set of KindBit()
};

// Kinds and parameters are looked up by their raw integer values, so invalid ones are found, not undefined.
unsigned KindBit(int kind);
const char* KindName(int kind);
const CompressorParamInfo* FindParam(int param);
const CompressorParamInfo* FindParamByName(const std::string& name);
// Every parameter row; ends with a row whose name is nullptr.
const CompressorParamInfo* ParamInfoTable();
int64_t DefaultParamValue(ccCompressorKind_t kind, ccCompressorParam_t param);

// Symbolic spellings of a parameter's values (first one canonical), or nullptr for plain numbers.
struct ParamWord {
  const char* text;
  int64_t value;
};
const ParamWord* ParamWords(ccCompressorParam_t param);
// Parameters written as numbers in spec strings but stored as integers: value = llround(number * scale) (density
// and clip in parts per million, eps in units of 1e-12). 0 for every other parameter.
double ParamTextScale(ccCompressorParam_t param);
// Parses one spec-string value of a parameter (without range checks).
bool ParseParamValue(const CompressorParamInfo& info, const std::string& text, int64_t* out);
// Why `value` cannot be the parameter's value for a compressor of `kind` ("out of range", "not a power of two", "not a
// wire type of topk"), or "" where it can.
std::string ParamValueProblem(int kind, const CompressorParamInfo& info, int64_t value);
// What a spec string may give as the value of a parameter for a compressor of `kind`, in words: its spellings, or
// its range in the string's units ("a number from 1e-06 to 1, in steps of 1e-06", "an integer from 1 to 8").
std::string ParamValueForms(int kind, const CompressorParamInfo& info);

// One tensor of a PowerSGD bucket: a row-major rows x cols matrix (cols = 1: a vector).
struct TensorShape {
  int64_t rows = 0, cols = 1;
};

// Parses a spec string's shapes=... value ("64x32+64+10x10"); false if malformed.
bool ParseShapes(const std::string& text, std::vector<TensorShape>* shapes);

}  // namespace ccoll

struct ccCompressor {
  CC_QUARANTINED_HANDLE  // a destroyed compressor's address is not reused at once (core/handle_quarantine.h)

  ccCompressorKind_t kind = ccCompressCast16;
  std::map<ccCompressorParam_t, int64_t> values;  // every parameter that applies to `kind`
  std::vector<ccoll::TensorShape> shapes;         // powersgd: the bucket's tensors (empty: rows/cols)

  // State of the bucket, reset when a parameter changes.
  uint64_t calls = 0;
  uint64_t resets = 0;  // ResetState's calls: a device call's shape includes it (its device state is made anew)
  std::atomic<size_t> boundCount{0};  // element count of the bucket (0: not bound yet)
  // Device calls queued with this compressor and not yet run (core/device_proxy.h): destroying it, changing a
  // parameter or resetting it waits for them.
  std::atomic<int> inFlight{0};
  // Where the error-feedback memory is (collectives.cc's MemoryOf): set by the first call after a reset.
  enum { kMemoryNone = 0, kMemoryHost = 1, kMemoryDevice = 2 };
  std::atomic<int> memory{kMemoryNone};
  std::vector<float> errorFeedback;   // sparsifiers and powersgd with ef=1, host calls: what was not sent yet
  std::vector<char> wire;             // wire scratch: a few slices' worth of messages
  std::vector<float> staging;         // sparsifiers: the chosen chunks, packed; powersgd: P (and exact parts)
  std::vector<float> sentRounding;    // sparsifiers with ef=1, host calls: what 16-bit roundings took, packed
  std::vector<float> widened;         // 16-bit data, host calls: the float32 working copy (compress/widen.h)
  std::vector<float> lowRankQ;        // powersgd: every tensor's Q (cols x r), kept for the warm start
  std::vector<float> lowRankOut;      // powersgd: Q's all-reduce buffer
  std::vector<double> lowRankScratch; // powersgd: Gram-Schmidt's working copy
  // Device calls with a device codec: stream, scratch, the error feedback in device memory.
  std::shared_ptr<ccoll::DeviceCodecState> device;
  // powersgd: the 256-byte offsets (of M, of the result) for which the products ran once on the device before a call
  // (collectives/device_compressed.h: PrimeDeviceCodec). Only the threads making calls read and write it, never the
  // proxy, so a call reads it while the one before is queued. Cleared with `device`.
  std::set<std::pair<size_t, size_t>> devicePrimed;

  // The calls using it now, all of one communicator (collectives.cc: CompressorUse): a compressor is one bucket's
  // state on one rank, so another communicator's call (another rank's) meanwhile is refused. It may serve several
  // communicators of one rank, one after the other.
  std::mutex useMutex;
  std::condition_variable useFreed;  // uses dropped to 0
  const ccComm* user = nullptr;
  int uses = 0;
  int queuedUses = 0;  // of them, device calls queued on the communicator's proxy
  int taking = 0;      // calls found live and not yet done taking a use (PinLiveCompressor)
  bool changing = false;  // ccCompressorSetParam or ccCompressorSetShapes at work (ChangeCompressor): calls refused

  int64_t Get(ccCompressorParam_t p) const { return values.at(p); }
  // Waits until no queued device call uses this compressor any more.
  void WaitIdle() const {
    while (inFlight.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // The same for at most `ms` milliseconds: false when a queued call still uses it then.
  bool WaitIdleFor(int ms) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (inFlight.load() > 0) {
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
  }
  void ResetState() {
    WaitIdle();
    calls = 0;
    ++resets;
    boundCount = 0;
    errorFeedback.clear();
    errorFeedback.shrink_to_fit();
    lowRankQ.clear();
    lowRankQ.shrink_to_fit();
    memory = kMemoryNone;
    device.reset();  // nothing queued uses it any more (WaitIdle)
    devicePrimed.clear();
  }
};

namespace ccoll {

// True while c is a compressor made by ccCompressorCreate* and not destroyed yet.
bool IsLiveCompressor(ccCompressor* c);

// IsLiveCompressor, and when true also raises c->taking, in one step under the live set's lock: ccCompressorDestroy
// then refuses c (in use) until the caller, holding c->useMutex, lowers it again.
bool PinLiveCompressor(ccCompressor* c);

// Runs `change` (new parameters or shapes, and the reset of the state they bring) on the live compressor c once no
// queued device call uses it. Refused (ccInvalidUsage, naming `fn`) while a call on another thread holds c or is
// taking it, or another change runs: a change under a call freed the state it was reading (a crash) or changed its
// parameters on one rank in mid-call (ranks that differ). While it runs, calls and ccCompressorDestroy are refused.
ccResult_t ChangeCompressor(ccCompressor* c, const char* fn, const std::function<void()>& change);

// False, with the reason in *why, when c's parameters cannot run together: rounding=correlated outside the
// homomorphic mode. (Each parameter on its own is checked when it is set.)
bool CompressorCombinationValid(const ccCompressor& c, std::string* why);

// Canonical spec string of a compressor.
std::string CompressorSpec(const ccCompressor& c);

}  // namespace ccoll
