#include "core/params.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/log.h"

namespace ccoll {
namespace {

const ParamDef kParams[] = {
    {"CC_DEBUG", ParamType::kString, "WARN",
     "Log level, in any case: NONE, VERSION, WARN, INFO or TRACE (another value: WARN, with a warning)."},
    {"CC_DEBUG_SUBSYS", ParamType::kString, "ALL",
     "Comma-separated subsystems whose INFO and TRACE messages are logged, in any case: INIT, BOOT, COLL, TRANSPORT, "
     "ALL; a leading ^ excludes. Warnings always print."},
    {"CC_DEBUG_FILE", ParamType::kString, "",
     "Write the log to this file instead of stderr; %h is replaced by the host name, %p by the pid."},
    {"CC_TRANSPORT", ParamType::kString, "auto", "Transport between ranks: auto, local, ucx or nccl."},
    {"CC_ALGO", ParamType::kString, "auto",
     "All-reduce algorithm: auto, ring or tree. Every rank needs the same one (ccConfig_t.algorithm wins)."},
    {"CC_TIMEOUT_MS", ParamType::kInt, "300000",
     "Milliseconds a rank waits for a peer (bootstrap and collectives) before failing with ccTimeout."},
    {"CC_BLOCKING", ParamType::kInt, "1", "1: communicator init blocks; 0: it returns ccInProgress."},
    {"CC_SLICE_BYTES", ParamType::kInt, "262144",
     "Pipelining unit of ring and tree, in bytes (rounded down to whole elements), and the slice of a longer "
     "point-to-point message over a network. Each communicator's scratch is two slices, and a compressed call's "
     "wire buffers 8 or more (4 per ring lane). Every rank needs the same value."},
    {"CC_TREE_DEPTH", ParamType::kInt, "4",
     "Slices in flight per tree before a rank waits for the broadcast. Every rank needs the same value."},
    {"CC_CHECK_CALLS", ParamType::kInt, "1",
     "1: before any data moves, all ranks agree on their calls (collective, count, datatype, op, root, compressor) "
     "in ceil(log2 n) exchanges of a 264-byte record; a mismatch is ccInvalidUsage on "
     "every rank, nothing is written and the communicator stays usable. 0: no check."},
    {"CC_CHECK_INLINE_BYTES", ParamType::kInt, "16384",
     "With CC_CHECK_CALLS=1 and a power-of-two number of ranks: an exact collective whose data is at most this many "
     "bytes (an all-reduce's or a reduce's count, a broadcast's, the nranks blocks of a reduce-scatter or an "
     "all-gather; an all-reduce only with CC_ALGO=auto), on host buffers or staged through them, travels in the call "
     "check's messages, combined at each of its ceil(log2 n) exchanges (recursive doubling; halving for a "
     "reduce-scatter), instead of running a schedule after the check. A larger call's check messages carry its "
     "records alone. 0 turns it off; at most 65536. Every rank needs the same value."},
    {"CC_CHECKSUM", ParamType::kInt, "0",
     "1: every message carries the CRC32C of its payload and receivers verify it; a corrupted message is "
     "ccRemoteError naming the sender, never a wrong result. Costs a pass over each message on both sides."},
    {"CC_RING_DEPTH", ParamType::kInt, "4",
     "Slices a compressed ring keeps in flight: codec work on one overlaps the transfers of the others. Every rank "
     "needs the same value."},
    {"CC_DEVICE_KERNELS", ParamType::kInt, "1",
     "Device buffers: 1 runs the compressed all-reduce's codecs on the GPU (only compressed messages cross to the "
     "host), and the exact collectives of thread ranks on the device buffers (device copies between the ranks, "
     "reduction kernels); 0 stages every device call through host memory and runs the CPU code (for comparison)."},
    {"CC_MEMORY_POOLS", ParamType::kInt, "1",
     "Device calls: 1 takes ccoll's device and pinned host scratch from CUDA memory pools of its own where the device "
     "has them (stream-ordered: no allocation or free synchronizes the device); 0 takes it from cudaMalloc and "
     "cudaHostAlloc, keeps what it frees for reuse, and returns from the first device call of each shape only once "
     "it has run, as on a device without pools. Read once per process."},
    {"CC_CPU_BASELINE", ParamType::kInt, "0",
     "1: the codecs' scalar CPU code instead of the AVX2 kernels (the same bytes; for testing and comparison). "
     "Read once per process."},
    {"CC_TREE_THRESHOLD", ParamType::kInt, "65536",
     "With CC_ALGO=auto, all-reduces of at most this many bytes use the tree, larger ones the ring. Every rank needs "
     "the same value."},
    {"CC_RANK", ParamType::kInt, "-1", "This rank, for ccCommInitFromEnv (launchers without MPI)."},
    {"CC_NRANKS", ParamType::kInt, "-1", "Number of ranks, for ccCommInitFromEnv."},
    {"CC_ROOT", ParamType::kString, "",
     "host:port of the bootstrap root for ccCommInitFromEnv; rank 0 listens there, the others connect."},
    {"CC_SECRET", ParamType::kString, "",
     "Shared secret that ccCommInitFromEnv ranks present to the root (hashed to 16 bytes); unset: the job's id "
     "(CC_JOB_ID, else the launcher's: core/job_secret.h), so that two jobs given one CC_ROOT stay apart."},
    {"CC_JOB_ID", ParamType::kString, "",
     "This job's identity, the same on every rank, for a launcher that sets none of its own (see CC_SECRET)."},
    {"CC_UCX_ERR_MODE", ParamType::kString, "auto",
     "UCX endpoint error handling: peer (a dead peer is detected by UCX; excludes shared memory), none (timeout "
     "only), auto (peer between hosts, none within a host so shared memory can carry the data)."},
    {"CC_UCX_RNDV_THRESH", ParamType::kString, "slice",
     "UCX rendezvous threshold ccoll asks for when UCX_RNDV_THRESH is unset. slice: a slice and its header go "
     "eagerly (ring slices: about 2x over TCP), larger messages by rendezvous (unsliced point-to-point messages over "
     "shared memory: up to 5x), at most 1m; a UCX size asks for that size; empty keeps UCX's own default. A "
     "UCX_RNDV_THRESH the user set always wins."},
    {"CC_SOCKET_IFNAME", ParamType::kString, "",
     "Network interface for the bootstrap (prefix match; ^ excludes). Empty: loopback, one host only."},
    {nullptr, ParamType::kInt, nullptr, nullptr}};

const ParamDef* Find(const char* name) {
  for (const ParamDef* p = kParams; p->name; ++p) {
    if (std::strcmp(p->name, name) == 0) return p;
  }
  std::fprintf(stderr, "ccoll internal error: parameter %s is not registered\n", name);
  std::abort();
}

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, int64_t> ints;
  std::unordered_map<std::string, std::string> strings;
};

Cache& TheCache() {
  static Cache* cache = new Cache();  // Never destroyed: parameters are read from atexit paths too.
  return *cache;
}

}  // namespace

const ParamDef* ParamTable() { return kParams; }

bool ParseSize(const char* text, int64_t* value) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || v < 0) return false;
  int64_t mult = 1;
  if (*end == 'K' || *end == 'k') {
    mult = 1LL << 10;
    ++end;
  } else if (*end == 'M' || *end == 'm') {
    mult = 1LL << 20;
    ++end;
  } else if (*end == 'G' || *end == 'g') {
    mult = 1LL << 30;
    ++end;
  }
  if (*end != '\0') return false;
  if (v > INT64_MAX / mult) return false;
  *value = v * mult;
  return true;
}

bool ForeignEnvIsSet(const char* name) { return std::getenv(name) != nullptr; }

std::string ForeignEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

bool ParamIsSet(const char* name) {
  Find(name);
  return std::getenv(name) != nullptr;
}

namespace {

// An integer parameter's text: a plain integer (maybe negative) or a size ("64K"); false when it is neither (no
// blank, no '+').
bool ParseIntParam(const char* text, int64_t* value) {
  const char* digits = text[0] == '-' ? text + 1 : text;
  if (!std::isdigit(static_cast<unsigned char>(digits[0]))) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (errno == 0 && end != text && *end == '\0') {
    *value = v;
    return true;
  }
  return ParseSize(text, value);
}

}  // namespace

int64_t ParamInt(const char* name) {
  const ParamDef* def = Find(name);
  Cache& cache = TheCache();
  int64_t value = std::strtoll(def->defaultValue, nullptr, 10);  // defaults are plain integers, maybe negative
  const char* env = std::getenv(name);
  if (env != nullptr && *env == '\0') env = nullptr;  // set but empty, as launchers export them: not set
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.ints.find(name);
    if (it != cache.ints.end()) return it->second;
    if (env == nullptr || ParseIntParam(env, &value)) {
      cache.ints[name] = value;
      return value;
    }
    cache.ints[name] = value;
  }
  // Logged after the lock is released: the first message sets up logging, which reads CC_DEBUG through this cache.
  CC_WARN("%s=\"%s\" is not an integer; using the default %s", name, env, def->defaultValue);
  return value;
}

const char* MalformedIntParam(std::string* text) {
  for (const ParamDef* p = kParams; p->name != nullptr; ++p) {
    const char* env = p->type == ParamType::kInt ? std::getenv(p->name) : nullptr;
    int64_t ignored = 0;
    if (env != nullptr && *env != '\0' && !ParseIntParam(env, &ignored)) {
      *text = env;
      return p->name;
    }
  }
  return nullptr;
}

std::string ParamString(const char* name) {
  const ParamDef* def = Find(name);
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.strings.find(name);
  if (it != cache.strings.end()) return it->second;
  const char* env = std::getenv(name);
  std::string value = env != nullptr ? env : def->defaultValue;
  cache.strings[name] = value;
  return value;
}

void PrintParams(FILE* out) {
  std::fprintf(out, "%-21s %-7s %-10s %-10s %s\n", "name", "type", "default", "value", "doc");
  for (const ParamDef* p = kParams; p->name; ++p) {
    const char* env = std::getenv(p->name);
    std::fprintf(out, "%-21s %-7s %-10s %-10s %s\n", p->name, p->type == ParamType::kInt ? "int" : "string",
                 *p->defaultValue ? p->defaultValue : "\"\"", env ? env : "(default)", p->doc);
  }
}

}  // namespace ccoll
