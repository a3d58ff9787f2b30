// The credential ccCommInitFromEnv's ranks present to the bootstrap root: 16 bytes of a hash of CC_SECRET or, where
// that is unset, of the job's identity, so that two jobs given one CC_ROOT by mistake do not join each other's groups.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/bootstrap.h"

namespace ccoll {

// The sources, in order: CC_SECRET; CC_JOB_ID; the process launcher's id of its job (torchrun's TORCHELASTIC_RUN_ID
// unless it is torchrun's default "none"; PMIx's PMIX_NAMESPACE, which OpenMPI's mpirun and srun --mpi=pmix set;
// OpenMPI's OMPI_MCA_ess_base_jobid); then the allocation's (Slurm's SLURM_HET_JOB_ID, SLURM_PACK_JOB_ID or
// SLURM_JOB_ID). The process launcher's id comes first: ranks of one mpirun across nodes of a Slurm allocation share
// PMIX_NAMESPACE but not the Slurm step. Ranks of one job that find different sources (started by two launchers, or
// two launcher steps) must set CC_SECRET or CC_JOB_ID.
//
// Fills `secret` (zeros when there is no source) and returns the name of its source, "" for none. `env` gives a
// variable's value, "" when unset; the first form reads the environment (ccoll's registry for the CC_* ones).
std::string JobSecret(uint8_t (&secret)[kSecretBytes], const std::function<std::string(const char*)>& env);
std::string JobSecret(uint8_t (&secret)[kSecretBytes]);

// The sources' names, for messages: "CC_SECRET, CC_JOB_ID, TORCHELASTIC_RUN_ID, ...".
std::string JobSecretSources();

}  // namespace ccoll
