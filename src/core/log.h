// Logging: CC_DEBUG picks the level, CC_DEBUG_SUBSYS the subsystems, CC_DEBUG_FILE the destination.
// The first place that detects an error logs it at WARN with the values involved; callers only add context.
#pragma once

#include <cstdarg>

namespace ccoll {

enum class LogLevel { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kTrace = 4 };

enum LogSubsys : unsigned {
  kLogInit = 1u << 0,
  kLogBoot = 1u << 1,
  kLogColl = 1u << 2,
  kLogTransport = 1u << 3,
  kLogAll = ~0u
};

bool LogEnabled(LogLevel level, unsigned subsys);
void LogMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

}  // namespace ccoll

#define CC_WARN(...) ::ccoll::LogMessage(::ccoll::LogLevel::kWarn, ::ccoll::kLogAll, __FILE__, __LINE__, __VA_ARGS__)
#define CC_INFO(subsys, ...)                                                                   \
  do {                                                                                         \
    if (::ccoll::LogEnabled(::ccoll::LogLevel::kInfo, subsys))                                 \
      ::ccoll::LogMessage(::ccoll::LogLevel::kInfo, subsys, __FILE__, __LINE__, __VA_ARGS__);  \
  } while (0)
#define CC_TRACE(subsys, ...)                                                                  \
  do {                                                                                         \
    if (::ccoll::LogEnabled(::ccoll::LogLevel::kTrace, subsys))                                \
      ::ccoll::LogMessage(::ccoll::LogLevel::kTrace, subsys, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
