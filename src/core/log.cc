#include "core/log.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "core/params.h"

namespace ccoll {
namespace {

struct LogState {
  LogLevel level = LogLevel::kWarn;
  unsigned subsys = kLogAll;
  FILE* out = stderr;
  std::mutex mutex;
  char host[64] = "";
};

// CC_DEBUG and CC_DEBUG_SUBSYS take any case, as NCCL's variables do.
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

unsigned SubsysBit(const std::string& name) {
  if (name == "INIT") return kLogInit;
  if (name == "BOOT" || name == "BOOTSTRAP") return kLogBoot;
  if (name == "COLL") return kLogColl;
  if (name == "TRANSPORT" || name == "NET") return kLogTransport;
  if (name == "ALL") return kLogAll;
  return 0;
}

// The mask of a CC_DEBUG_SUBSYS list, in any case; the names it does not know go to *unknown, as written. A list that
// names no subsystem it knows (empty, or only unknown names) is ALL, as if unset.
unsigned ParseSubsys(const std::string& spec, std::string* unknown) {
  bool exclude = !spec.empty() && spec[0] == '^';
  unsigned mask = 0;
  bool named = false;
  size_t start = exclude ? 1 : 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    const std::string name = spec.substr(start, comma - start);
    const unsigned bit = SubsysBit(Upper(name));
    if (bit == 0 && !name.empty()) *unknown += (unknown->empty() ? "" : ",") + name;
    named = named || bit != 0;
    mask |= bit;
    start = comma + 1;
  }
  if (!named) return kLogAll;
  return exclude ? ~mask : mask;
}

std::string ExpandFileName(const std::string& pattern, const char* host) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'h') {
        out += host;
        ++i;
        continue;
      }
      if (c == 'p') {
        out += std::to_string(getpid());
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

LogState& State() {
  static LogState* state = [] {
    auto* s = new LogState();  // Never destroyed: logging may happen from static destructors.
    gethostname(s->host, sizeof(s->host) - 1);
    const std::string level = Upper(ParamString("CC_DEBUG"));
    bool levelKnown = true;
    if (level == "NONE") s->level = LogLevel::kNone;
    else if (level == "VERSION") s->level = LogLevel::kVersion;
    else if (level == "INFO") s->level = LogLevel::kInfo;
    else if (level == "TRACE") s->level = LogLevel::kTrace;
    else if (level == "WARN" || level.empty()) s->level = LogLevel::kWarn;
    else levelKnown = false;  // (WARN)
    std::string unknownSubsys;
    s->subsys = ParseSubsys(ParamString("CC_DEBUG_SUBSYS"), &unknownSubsys);
    std::string file = ParamString("CC_DEBUG_FILE");
    std::string fileError;
    if (!file.empty()) {
      std::string path = ExpandFileName(file, s->host);
      FILE* f = std::fopen(path.c_str(), "a");
      const int openError = errno;
      if (f != nullptr) s->out = f;
      else fileError = path + ": " + std::strerror(openError);
    }
    // Settings that do not say what they seem to: a warning each (not through LogMessage, which needs this state).
    auto warn = [s](const std::string& what) {
      std::fprintf(s->out, "%s:%d ccoll WARN %s\n", s->host, getpid(), what.c_str());
    };
    if (!levelKnown) {
      warn("CC_DEBUG=" + ParamString("CC_DEBUG") + " is not a level (NONE, VERSION, WARN, INFO, TRACE): WARN");
    }
    if (s->level >= LogLevel::kWarn && !unknownSubsys.empty()) {
      warn("CC_DEBUG_SUBSYS: " + unknownSubsys + " not known (INIT, BOOT, COLL, TRANSPORT, ALL)" +
           (s->subsys == kLogAll ? ": ALL" : ""));
    }
    if (s->level >= LogLevel::kWarn && !fileError.empty()) {
      warn("CC_DEBUG_FILE: cannot open " + fileError + "; logging to stderr");
    }
    if (s->level == LogLevel::kVersion || s->level >= LogLevel::kInfo) {
      std::fprintf(s->out, "%s:%d ccoll INFO ccoll version %s\n", s->host, getpid(), CCOLL_VERSION_STRING);
    }
    std::fflush(s->out);
    return s;
  }();
  return *state;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    default: return "";
  }
}

}  // namespace

// CC_DEBUG_SUBSYS chooses among INFO and TRACE messages; warnings always print (at WARN and above).
bool LogEnabled(LogLevel level, unsigned subsys) {
  LogState& s = State();
  return level <= s.level && (level <= LogLevel::kWarn || (subsys & s.subsys) != 0);
}

void LogMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...) {
  if (!LogEnabled(level, subsys)) return;
  LogState& s = State();
  char body[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  const char* base = std::strrchr(file, '/');
  std::lock_guard<std::mutex> lock(s.mutex);
  if (level == LogLevel::kTrace) {
    std::fprintf(s.out, "%s:%d ccoll %s %s:%d %s\n", s.host, getpid(), LevelName(level), base ? base + 1 : file, line,
                 body);
  } else {
    std::fprintf(s.out, "%s:%d ccoll %s %s\n", s.host, getpid(), LevelName(level), body);
  }
  std::fflush(s.out);
}

}  // namespace ccoll
