#include "core/job_secret.h"

#include <cstring>

#include "core/fnv.h"
#include "core/params.h"

namespace ccoll {
namespace {

// After CC_SECRET and CC_JOB_ID (ccoll's own, from the registry).
constexpr const char* kLauncherIds[] = {"TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                                        "SLURM_HET_JOB_ID", "SLURM_PACK_JOB_ID", "SLURM_JOB_ID"};

// Whether a launcher's value names a job: torchrun sets "none" where --rdzv-id is not given (every such job alike).
bool NamesAJob(const char* name, const std::string& value) {
  return !value.empty() && !(std::strcmp(name, "TORCHELASTIC_RUN_ID") == 0 && value == "none");
}

}  // namespace

std::string JobSecret(uint8_t (&secret)[kSecretBytes], const std::function<std::string(const char*)>& env) {
  std::string source, value;
  if (!(value = env("CC_SECRET")).empty()) {
    source = "CC_SECRET";
  } else if (!(value = env("CC_JOB_ID")).empty()) {
    source = "CC_JOB_ID";
  } else {
    for (const char* name : kLauncherIds) {
      value = env(name);
      if (NamesAJob(name, value)) {
        source = name;
        break;
      }
    }
  }
  std::memset(secret, 0, sizeof(secret));
  if (source.empty()) return source;
  const std::string keyed = source + "=" + value;
  const uint64_t halves[2] = {Fnv1a(keyed), Fnv1a("ccoll secret\n" + keyed)};
  static_assert(sizeof(halves) == sizeof(secret), "16 bytes");
  std::memcpy(secret, halves, sizeof(secret));
  return source;
}

std::string JobSecret(uint8_t (&secret)[kSecretBytes]) {
  return JobSecret(secret, [](const char* name) {
    return std::strncmp(name, "CC_", 3) == 0 ? ParamString(name) : ForeignEnv(name);
  });
}

std::string JobSecretSources() {
  std::string list = "CC_SECRET, CC_JOB_ID";
  for (const char* name : kLauncherIds) list += std::string(", ") + name;
  return list;
}

}  // namespace ccoll
