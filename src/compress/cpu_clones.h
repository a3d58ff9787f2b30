// CC_HOT: a CPU driver compiled twice, for x86-64-v3 (AVX2, FMA not used: -ffp-contract=off) and for the baseline,
// the clone chosen at run time (GCC target_clones), so the library still runs on any x86-64. Off with clang and in
// ASan and TSan builds, which compile the baseline code only.
// CC_FLATTEN: every call inside the function is inlined into it (and so into each clone): for drivers whose loops are
// in templates or lambdas that a clone would otherwise call in their baseline form.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define CC_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CC_HOT
#endif

#if defined(__GNUC__)
#define CC_FLATTEN __attribute__((flatten))
#else
#define CC_FLATTEN
#endif
