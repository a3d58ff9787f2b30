// The one registry of every CC_* environment variable. Nothing else in ccoll calls getenv: code asks the registry
// by name, and `ccoll_info --params` prints the whole table. Values are read from the environment once, at first
// use, and cached. Precedence (API setter > env > default) is applied by the callers that have an API setter.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ccoll {

enum class ParamType { kInt, kString };

struct ParamDef {
  const char* name;
  ParamType type;
  const char* defaultValue;
  const char* doc;
};

// The table, for printing. Ends with a {nullptr} row.
const ParamDef* ParamTable();

// Value of a registered integer parameter: the environment when set (not empty) and valid, else the default. A set
// but malformed value is logged once (WARN) and the default is used. Unknown names are a programming error: abort.
int64_t ParamInt(const char* name);
// Value of a registered string parameter.
std::string ParamString(const char* name);
// The first integer parameter set in the environment to something that is not an integer (its text in *text), or
// nullptr: a communicator's init refuses to start on one (core/comm.h: ResolveConfig).
const char* MalformedIntParam(std::string* text);
// True when the variable is set in the environment (even to a malformed value).
bool ParamIsSet(const char* name);

// True when a variable that is not ccoll's (UCX_*, ...) is set: ccoll never overrides what the user set.
bool ForeignEnvIsSet(const char* name);
// The value of a variable that is not ccoll's (a launcher's job id, ...), "" when unset.
std::string ForeignEnv(const char* name);

// Prints every parameter with type, default, current value and doc.
void PrintParams(FILE* out);

// Parses "64K", "1M", "2G", "123" into bytes; false on malformed input.
bool ParseSize(const char* text, int64_t* value);

}  // namespace ccoll
