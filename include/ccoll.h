/*
 * ccoll.h -- the public C API of ccoll, a collective communication library whose all-reduce can compress the data
 * it moves.
 *
 * The API follows NCCL's shape and argument order, so a port from NCCL is mostly a rename (nccl -> cc). It is
 * C99-clean: a C compiler with no CUDA headers can include it.
 *
 * Units: every count is in elements of the given datatype, never in bytes.
 * Thread safety: a communicator is used by one thread at a time. Different communicators may be used from different
 * threads at once (that is how ranks that are threads of one process work).
 */
#ifndef CCOLL_H_
#define CCOLL_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define CC_API
#else
/** Marks a symbol exported from libccoll; everything else is hidden. */
#define CC_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Major version of this header. */
#define CC_MAJOR 0
/** Minor version of this header. */
#define CC_MINOR 1
/** Patch version of this header. */
#define CC_PATCH 0
/** Packs a version triple into one integer, comparable with `<`: CC_VERSION(0,1,0) == 100. */
#define CC_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
/** The version of this header as one integer (see CC_VERSION). */
#define CC_VERSION_CODE CC_VERSION(CC_MAJOR, CC_MINOR, CC_PATCH)

/** Opaque handle to a communicator: one rank's view of a group of ranks. */
typedef struct ccComm* ccComm_t;
/** Opaque handle to a compressor: a codec description plus one gradient bucket's persistent state. */
typedef struct ccCompressor* ccCompressor_t;
/**
 * A CUDA stream. Binary compatible with `cudaStream_t`, so CUDA users pass their stream without a cast. Host
 * (CPU) buffers take NULL.
 */
typedef struct CUstream_st* ccStream_t;

/** Size in bytes of a ccUniqueId. */
#define CC_UNIQUE_ID_BYTES 128
/**
 * Identifies one group of ranks while it forms. Made by ccGetUniqueId on one rank and handed to every other rank
 * by any means (MPI_Bcast, a file, a key-value store). It holds the bootstrap root's address and a random secret:
 * treat it as a credential. Plain bytes: copy it with memcpy.
 */
typedef struct {
  char internal[CC_UNIQUE_ID_BYTES]; /**< Opaque; do not interpret. */
} ccUniqueId;

/**
 * Result codes. Values are explicit and never renumbered; new codes are added at the end.
 */
typedef enum {
  ccSuccess = 0,            /**< The call did what it was asked. */
  ccUnhandledCudaError = 1, /**< A CUDA runtime call failed. */
  ccSystemError = 2,        /**< An operating-system call failed (socket, memory, thread). */
  ccInternalError = 3,      /**< A bug in ccoll: please report it with the ccGetLastError sentence. */
  ccInvalidArgument = 4,    /**< An argument has a bad value (NULL pointer, unknown datatype, ...). */
  ccInvalidUsage = 5,       /**< The arguments are valid alone but not together, or not in this state. */
  ccRemoteError = 6,        /**< Another rank failed, aborted or sent something malformed. */
  ccInProgress = 7,         /**< A non-blocking operation has not finished yet. */
  ccTimeout = 8,            /**< A peer did not answer within the configured timeout. */
  ccNumResults = 9          /**< Number of result codes; not a result. */
} ccResult_t;

/**
 * Datatypes. Values match NCCL's ncclDataType_t; the ones not listed are reserved and rejected.
 * Integer sums and products wrap around (modulo 2^bits, as unsigned arithmetic does); ccAvg of integers is the
 * wrapped sum divided by the number of ranks, rounded toward zero.
 * 16-bit floats are reduced in float32 and rounded back to nearest even; a NaN result is written as the one quiet NaN
 * of the type (ccBfloat16 0x7fc0, ccFloat16 0x7e00), its sign and payload dropped, so that CPUs and GPUs write the
 * same bits (a GPU's arithmetic NaN is 0x7fffffff).
 */
typedef enum {
  ccInt8 = 0,     /**< 8-bit two's complement integer. */
  ccUint8 = 1,    /**< 8-bit unsigned integer. */
  ccInt32 = 2,    /**< 32-bit two's complement integer. */
  ccUint32 = 3,   /**< 32-bit unsigned integer. */
  ccInt64 = 4,    /**< 64-bit two's complement integer. */
  ccUint64 = 5,   /**< 64-bit unsigned integer. */
  ccFloat16 = 6,  /**< IEEE 754 binary16. */
  ccFloat32 = 7,  /**< IEEE 754 binary32. */
  ccFloat64 = 8,  /**< IEEE 754 binary64. */
  ccBfloat16 = 9, /**< bfloat16: the upper half of a binary32. */
  ccChar = ccInt8,       /**< Alias of ccInt8. */
  ccInt = ccInt32,       /**< Alias of ccInt32. */
  ccFloat = ccFloat32,   /**< Alias of ccFloat32. */
  ccHalf = ccFloat16,    /**< Alias of ccFloat16. */
  ccDouble = ccFloat64   /**< Alias of ccFloat64. */
} ccDataType_t;

/** A datatype that no call takes, for a caller that refuses a call after checks of its own (a language binding): a
 *  collective, ccSend or ccRecv given it fails with ccInvalidArgument on this rank, saying the caller refused it. A
 *  refused collective's peers, with the call check (CC_CHECK_CALLS=1, the default), fail at once with ccInvalidUsage
 *  naming this rank instead of waiting for it until the timeout; sends and receives have no call check, so a refused
 *  ccSend's or ccRecv's peer waits for it until its timeout, as in NCCL. The Python binding refuses calls so. */
#define CC_DATATYPE_REFUSED ((ccDataType_t)-1)

/**
 * Reduction operations. Values match NCCL's ncclRedOp_t.
 * ccAvg: of ccFloat16, as NCCL's ncclAvg, the sum of every rank's input multiplied by 1/nranks (the factor rounded to
 * float16; each product rounded to float16 or added to the partial sum in float), so that an average whose sum would
 * pass float16's 65504 stays finite; of ccBfloat16, ccFloat32 and ccFloat64 the sum divided by the number of ranks
 * (their range is float32's or more; one rounding fewer, and no bias from a rounded 1/nranks, where NCCL
 * premultiplies these too); of integer types, the sum divided by the number of ranks, rounded toward zero. Exact
 * device calls over transport nccl take ncclAvg itself.
 */
typedef enum {
  ccSum = 0,  /**< Sum. */
  ccProd = 1, /**< Product. */
  ccMax = 2,  /**< Maximum. On floats IEEE 754-2019's maximum: NaN if any rank's value is NaN (the type's one quiet
                   NaN, 0x7fc00000 for float32), +0 above -0; so the bytes do not depend on the algorithm or the
                   number of ranks. (With CC_TRANSPORT=nccl, exact device calls are NCCL's own, with NCCL's rule.) */
  ccMin = 3,  /**< Minimum. On floats IEEE 754-2019's minimum: NaN as ccMax, -0 below +0. */
  ccAvg = 4   /**< Average over the ranks (see above). */
} ccRedOp_t;

/** Transports between ranks. ccTransportAuto picks local within a process and the network otherwise. */
typedef enum {
  ccTransportAuto = 0,  /**< Local between ranks of one process, UCX between processes. */
  ccTransportLocal = 1, /**< In-process only: every rank must be a thread of the same process. */
  ccTransportUcx = 2,   /**< UCX for every pair of ranks. */
  ccTransportNccl = 3   /**< Device buffers through a private NCCL communicator, queued on the caller's stream
                             (capturable into CUDA graphs); host buffers keep local/UCX. Needs a build with NCCL. */
} ccTransport_t;

/** Collective algorithms. */
typedef enum {
  ccAlgoAuto = 0, /**< Tree for small messages, ring for large (threshold: CC_TREE_THRESHOLD). */
  ccAlgoRing = 1, /**< Ring: reduce-scatter then all-gather, pipelined in slices. Bandwidth optimal. */
  ccAlgoTree = 2  /**< Double binary tree: pipelined reduce to the roots, then broadcast. Latency optimal. */
} ccAlgo_t;

/** Marks an integer field of ccConfig_t as "not set": the environment variable or the default applies. */
#define CC_CONFIG_UNDEF_INT (-2147483647 - 1)
/** Magic value of ccConfig_t.magic. */
#define CC_CONFIG_MAGIC 0xcc0c0f16u

/**
 * Communicator configuration for ccCommInitRankConfig. Always start from CC_CONFIG_INITIALIZER and set only the
 * fields you want; unset fields take the matching environment variable, then the default. The library copies in
 * min(size, sizeof(ccConfig_t)) bytes, so a program built against an older, shorter ccConfig_t keeps working.
 */
typedef struct {
  size_t size;        /**< sizeof(ccConfig_t) as the caller was compiled. */
  unsigned int magic; /**< Must be CC_CONFIG_MAGIC. */
  unsigned int version; /**< CC_VERSION_CODE the caller was compiled with. */
  int transport;      /**< A ccTransport_t; env CC_TRANSPORT. */
  int algorithm;      /**< A ccAlgo_t for ccAllReduce; env CC_ALGO. */
  int timeoutMs;      /**< How long a rank waits for a peer before failing with ccTimeout, in ms (> 0);
                           env CC_TIMEOUT_MS; default 300000 (5 minutes). A call that times out fails the
                           communicator, on every rank (NCCL waits without limit): raise it where a rank may
                           be that late on purpose (a long evaluation or checkpoint on one rank). */
  int blocking;       /**< 1: ccCommInitRankConfig returns when the communicator is ready. 0: it returns
                           ccInProgress at once and ccCommGetAsyncError reports when init ends. Env CC_BLOCKING. */
  int cudaDev;        /**< CUDA device the communicator is bound to (>= 0); default the current device. A number
                           the process does not see (cudaGetDeviceCount) is ccInvalidArgument at init, in a
                           build with CUDA; where no device can be counted (no driver), init accepts it and the
                           first device call on the communicator fails instead (host buffers are unaffected). */
} ccConfig_t;

/** Initial value of every ccConfig_t: all fields "not set". */
#define CC_CONFIG_INITIALIZER                                                                              \
  {                                                                                                        \
    sizeof(ccConfig_t), CC_CONFIG_MAGIC, CC_VERSION_CODE, CC_CONFIG_UNDEF_INT, CC_CONFIG_UNDEF_INT,        \
        CC_CONFIG_UNDEF_INT, CC_CONFIG_UNDEF_INT, CC_CONFIG_UNDEF_INT                                      \
  }

/**
 * Traffic counters of one communicator, for logging compression ratios. Fill `size` with sizeof(ccCommStats_t)
 * before the call; the library writes min(size, its own size) bytes.
 */
typedef struct {
  size_t size;             /**< sizeof(ccCommStats_t) as the caller was compiled. */
  uint64_t bytesSent;      /**< Payload bytes sent to peers since init (24-byte message headers not counted). */
  uint64_t bytesReceived;  /**< Payload bytes this rank has received from peers since init. */
  uint64_t collectives;    /**< Collectives this rank has completed since init. */
  /** Of bytesSent: the call check's messages (CC_CHECK_CALLS), ceil(log2 n) per call; of a small collective that
   *  rides in them (CC_CHECK_INLINE_BYTES), only their records (the data they carry is the call's). */
  uint64_t callCheckBytesSent;
  uint64_t nominalBytesSent;   /**< Of bytesSent: computed, not counted: what is handed to NCCL (transport nccl):
                                    the exact calls, the sends, and the parts of compressed calls that are exact
                                    all-reduces (the sparsifiers' chunks, PowerSGD's factors, scales and norms),
                                    counted as ring schedules would send them whatever algorithm NCCL chose: 2(n-1)/n
                                    of the buffer for an all-reduce, (n-1)/n for a broadcast or a reduce, n-1 blocks
                                    for a reduce-scatter or an all-gather, the buffer for a send. */
} ccCommStats_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Version and errors                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */

/**
 * Writes the library's version code (see CC_VERSION) to *version.
 * @return ccInvalidArgument if version is NULL.
 */
CC_API ccResult_t ccGetVersion(int* version);

/**
 * A short, static description of a result code ("invalid argument"). Never NULL; unknown codes give
 * "unknown result code".
 */
CC_API const char* ccGetErrorString(ccResult_t result);

/**
 * The last error sentence recorded on the calling thread, naming what failed and the values involved (for
 * example "ccAllReduce: recvbuff is NULL but count is 7 on rank 2"). If the calling thread has recorded none and
 * comm is not NULL, the last error recorded for comm by any thread (for example by a non-blocking init).
 * Returns "" when there is nothing to report. The string stays valid until the next ccoll call on this thread.
 * comm may be NULL.
 */
CC_API const char* ccGetLastError(ccComm_t comm);

/* ------------------------------------------------------------------------------------------------------------ */
/* Communicators                                                                                                */
/* ------------------------------------------------------------------------------------------------------------ */

/**
 * Creates a unique id for a new group and starts its bootstrap root: a TCP listener in this process that lives
 * until every rank has joined or the timeout (CC_TIMEOUT_MS) passes. Call it on one rank only and share the id.
 * The listener binds to the interface named by CC_SOCKET_IFNAME (default: loopback, which only works within one
 * host; set CC_SOCKET_IFNAME for multi-host jobs).
 * @return ccInvalidArgument if uniqueId is NULL, ccSystemError if no socket could be opened.
 */
CC_API ccResult_t ccGetUniqueId(ccUniqueId* uniqueId);

/**
 * Creates this rank's communicator of a group of nranks ranks. Collective over the group: every rank calls it with
 * the same id and nranks and a distinct rank in [0, nranks); it returns when all have joined (with CC_BLOCKING=0 in
 * the environment it returns ccInProgress at once, as ccCommInitRankConfig with a non-blocking config does). Ranks
 * that are threads of one process call it from different threads, or from one thread between ccGroupStart and
 * ccGroupEnd (as with NCCL: each call returns ccSuccess at once, with its init running; ccGroupEnd returns once they
 * end, with the first failure, whose communicator is left for ccCommDestroy; it does not wait for inits of
 * non-blocking configs, and returns ccInProgress while one runs), or use ccCommInitAll.
 * @param comm      out: the new communicator; set to NULL on failure.
 * @param nranks    number of ranks (>= 1).
 * @param commId    the id from ccGetUniqueId.
 * @param rank      this rank, in [0, nranks).
 */
CC_API ccResult_t ccCommInitRank(ccComm_t* comm, int nranks, ccUniqueId commId, int rank);

/**
 * ccCommInitRank with a configuration. config may be NULL (all defaults). With config->blocking == 0 the call returns
 * ccInProgress at once (ccSuccess inside a group, see ccCommInitRank) and *comm is valid for ccCommGetAsyncError,
 * ccCommAbort and ccCommDestroy only, until ccCommGetAsyncError reports ccSuccess (a collective or point-to-point call
 * before that is ccInvalidUsage; NCCL says ncclInvalidArgument).
 */
CC_API ccResult_t ccCommInitRankConfig(ccComm_t* comm, int nranks, ccUniqueId commId, int rank,
                                       ccConfig_t* config);

/**
 * Creates this rank's communicator from the environment, for launchers without MPI (torchrun-like): CC_RANK (this
 * rank), CC_NRANKS (the group size) and CC_ROOT=host:port (an address every rank can reach: IPv4, [IPv6], or a host
 * name, whose first IPv4 address is taken, else its first IPv6 one). CC_ROOT's form is checked before the call returns
 * (ccInvalidArgument). A name is looked up as init's first step, within the timeout and before the bootstrap's own
 * timeout starts (with a non-blocking config, after the call returns; ccCommAbort stops the wait): ccTimeout when the
 * lookup takes longer, ccInvalidArgument for a name that does not exist, ccSystemError when the resolver gives up first
 * (no DNS server answered). Rank 0 opens the bootstrap listener on CC_ROOT; the others connect to it, retrying until
 * the timeout. An abort or destroy of rank 0's communicator while ranks have still to join closes the listener (the
 * ranks that joined fail with ccRemoteError), so a retry can open it again. A joining rank presents a hash of CC_SECRET
 * (the same string on every rank) or, where that is unset, of the job's identity (CC_JOB_ID, or the launcher's:
 * TORCHELASTIC_RUN_ID but torchrun's default "none", PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, then SLURM_HET_JOB_ID,
 * SLURM_PACK_JOB_ID, SLURM_JOB_ID); a rank whose secret differs (another job given the same CC_ROOT, or a rank started
 * by another launcher: give those CC_SECRET or CC_JOB_ID) is turned away with ccInvalidUsage. With none of these set,
 * any process that can reach CC_ROOT could join (rank 0 warns). Collective over the group, like ccCommInitRank. config
 * may be NULL.
 */
CC_API ccResult_t ccCommInitFromEnv(ccComm_t* comm, ccConfig_t* config);

/**
 * Creates ndev communicators of one group inside this process, one per rank, like ncclCommInitAll: comms[i] is
 * rank i. Ranks use the in-process transport. devlist may be NULL (host ranks, or all on the current device);
 * else devlist[i] is rank i's CUDA device (>= 0, as ccConfig_t.cudaDev).
 * On failure no communicator is left alive and every comms[i] is NULL.
 */
CC_API ccResult_t ccCommInitAll(ccComm_t* comms, int ndev, const int* devlist);

/**
 * Frees a communicator after its last collective has completed. Not collective: each rank frees its own. comm
 * must not be used afterwards; a later call with it returns ccInvalidArgument (the addresses of the last 4096
 * destroyed communicators are not reused, so a stale handle cannot name a new one). On a non-blocking
 * communicator whose init is still in progress, the init gives up first, as with ccCommAbort. NULL is accepted
 * and ignored.
 */
CC_API ccResult_t ccCommDestroy(ccComm_t comm);

/**
 * Aborts a communicator: every call pending on it, on this rank and on the ranks waiting for it, returns an
 * error, then the communicator is freed. The peers get ccRemoteError at once where their transport learns of the
 * abort: thread ranks of one process, and UCX endpoints with peer failure handling (between hosts, or
 * CC_UCX_ERR_MODE=peer); elsewhere (UCX within one host by default) the abort looks like a silent peer, and their
 * waiting calls return ccTimeout within their timeout. Safe to call from another thread while a collective on comm
 * is blocked, or while another thread destroys or aborts comm: one of them frees it, and the other returns
 * ccInvalidArgument. An abort of a non-blocking init in progress: the init gives up, or, where it finishes anyway,
 * its peers are told as above. NULL is accepted and ignored.
 */
CC_API ccResult_t ccCommAbort(ccComm_t comm);

/** The color of a rank that takes no part in the communicators ccCommSplit makes (it gets NULL). */
#define CC_SPLIT_NOCOLOR (-1)

/**
 * Splits comm into disjoint communicators, like ncclCommSplit: ranks that pass the same color form one new
 * communicator, ranked by key (ties by their rank in comm). Collective over comm: every rank of comm calls it, in
 * the same order as its other calls on comm. The new communicators are independent of comm (destroy them
 * separately, in any order) and work like any other; comm stays usable.
 * @param comm     the parent; used once (two small exact all-gathers, counted in its ccCommGetStats).
 * @param color    >= 0, or CC_SPLIT_NOCOLOR: this rank joins no new communicator and *newcomm is set to NULL.
 * @param key      orders the ranks of one color: the smallest key is rank 0.
 * @param newcomm  out: this rank's new communicator (NULL with CC_SPLIT_NOCOLOR, and on failure).
 * @param config   may be NULL: the new communicator takes comm's transport, algorithm, timeout, blocking mode and
 *                 CUDA device. Fields of config left CC_CONFIG_UNDEF_INT take comm's too. With blocking == 0 the call
 *                 returns ccInProgress once the ranks have agreed, as ccCommInitRankConfig does.
 * The rank of smallest key of each color opens the new group's bootstrap root, as ccGetUniqueId does
 * (CC_SOCKET_IFNAME). A bad color, a NULL newcomm or a config the new communicator would refuse on any rank (a bad
 * value, transport nccl without NCCL or a device) makes the call fail on every rank (that rank with its own error,
 * the others with ccInvalidArgument and a sentence naming it), and no communicator is made. Once the ranks have
 * agreed, each new communicator forms on its own, as with ccCommInitRankConfig: ccCommAbort(comm) does not stop that
 * part. Between ccGroupStart and ccGroupEnd it is ccInvalidUsage, and ccGroupEnd then returns that too.
 */
CC_API ccResult_t ccCommSplit(ccComm_t comm, int color, int key, ccComm_t* newcomm, ccConfig_t* config);

/** Writes the number of ranks of comm to *count. */
CC_API ccResult_t ccCommCount(const ccComm_t comm, int* count);

/** Writes this rank's index in comm to *rank. */
CC_API ccResult_t ccCommUserRank(const ccComm_t comm, int* rank);

/**
 * Writes the CUDA device comm is bound to (ccConfig_t.cudaDev, or the device current at init) to *device, like
 * ncclCommCuDevice; -1 where it has none (a build without CUDA, or no device current at init): its calls then take
 * host buffers only.
 */
CC_API ccResult_t ccCommCuDevice(const ccComm_t comm, int* device);

/**
 * Writes the communicator's asynchronous state to *asyncError: ccInProgress while a non-blocking init runs, the
 * error that ended a failed init or an aborted communicator, else ccSuccess.
 */
CC_API ccResult_t ccCommGetAsyncError(ccComm_t comm, ccResult_t* asyncError);

/**
 * Copies comm's traffic counters into *stats (see ccCommStats_t). stats->size must be set by the caller.
 */
CC_API ccResult_t ccCommGetStats(ccComm_t comm, ccCommStats_t* stats);

/* ------------------------------------------------------------------------------------------------------------ */
/* Collectives                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */
/*
 * Common rules:
 * - Every rank of comm calls the collective, in the same order, with the same count, datatype and op. A call with
 *   count 0 is a call too, which every rank makes (NCCL discards it locally): a rank that skips it puts the next
 *   call out of step.
 * - Host buffers take stream == NULL; the call blocks until this rank's part is done and recvbuff holds the
 *   result (like MPI_Allreduce).
 * - Device buffers (a build with CUDA; both buffers on the communicator's device, see ccConfig_t.cudaDev) take a
 *   stream of that device: the call returns once the work is queued on it, reads what was queued before it, and
 *   work queued after it sees the result (like NCCL). Calls on one communicator run in call order. An error found
 *   after the call returned becomes the communicator's async error (ccCommGetAsyncError) and the stream is released
 *   without a result: recvbuff is then undefined (as after a failure during communication, below), and a sendbuff
 *   that is another buffer is never written. A stream being captured into a CUDA graph is refused (ccInvalidUsage),
 *   except with transport nccl (ccTransportNccl), whose calls are captured; there a compressed call must have run
 *   once outside the capture (it sizes its scratch then), and a replay repeats the captured call's randomness. A
 *   captured call uses the
 *   communicator's and the compressor's device memory at every replay: destroy the graph (after its launches end)
 *   before ccCommDestroy, ccCommAbort, ccCompressorDestroy, ccCompressorSetParam or ccCompressorSetShapes of that
 *   compressor (which reset its state), and replay it on the stream the compressor's other calls use. Thread ranks
 *   sharing a device need a stream each, not the legacy default stream (a call with it is ccInvalidUsage there).
 *   A stream of another device than the communicator's is ccInvalidUsage (with CUDA 12.8 runtimes and later, which
 *   tell a stream's device; with older ones the call's CUDA work fails, ccUnhandledCudaError).
 * - Buffers may be NULL only when count is 0, or where they are not read (ccBroadcast's sendbuff and ccReduce's
 *   recvbuff off the root).
 * - Results are deterministic: the same inputs give the same bits on every run, and every rank ends with
 *   bitwise-identical output (floating-point sums are always added in the same order; ccReduce's output is the
 *   root's alone). Exact calls over transport nccl are NCCL's collectives: identical on every rank, reproducible as
 *   far as NCCL's algorithm choice is.
 * - On error nothing is written to recvbuff when the error is found before communication starts (argument
 *   checks); a failure during communication (timeout, dead peer) leaves recvbuff undefined.
 */

/**
 * All-reduce: recvbuff[i] = op over ranks of sendbuff[i], for i in [0, count), on every rank.
 * In place when sendbuff == recvbuff.
 * @param compressor NULL for the exact all-reduce. Otherwise the compressor that owns this bucket's state (see
 *                   the compression API); compressed all-reduce takes ccSum or ccAvg on floating-point data.
 */
CC_API ccResult_t ccAllReduce(const void* sendbuff, void* recvbuff, size_t count, ccDataType_t datatype,
                              ccRedOp_t op, ccCompressor_t compressor, ccComm_t comm, ccStream_t stream);

/**
 * Reduce-scatter: sendbuff holds nranks * recvcount elements; rank r receives in recvbuff the reduction of block r
 * (elements [r * recvcount, (r + 1) * recvcount)) over all ranks. In place when recvbuff == sendbuff +
 * rank * recvcount (in elements).
 */
CC_API ccResult_t ccReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ccDataType_t datatype,
                                  ccRedOp_t op, ccComm_t comm, ccStream_t stream);

/**
 * All-gather: each rank contributes sendcount elements; recvbuff (nranks * sendcount elements) receives rank r's
 * contribution at offset r * sendcount on every rank. In place when sendbuff == recvbuff + rank * sendcount.
 */
CC_API ccResult_t ccAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ccDataType_t datatype,
                              ccComm_t comm, ccStream_t stream);

/**
 * Broadcast: count elements of root's sendbuff are copied to recvbuff on every rank. sendbuff is read on root
 * only (other ranks may pass NULL). In place when sendbuff == recvbuff.
 */
CC_API ccResult_t ccBroadcast(const void* sendbuff, void* recvbuff, size_t count, ccDataType_t datatype, int root,
                              ccComm_t comm, ccStream_t stream);

/**
 * Reduce: on root, recvbuff[i] = op over ranks of sendbuff[i], for i in [0, count), like ncclReduce. recvbuff is
 * written on root only; the other ranks may pass NULL. In place on root when sendbuff == recvbuff. Exact (it takes no
 * compressor): a pipelined chain along the ring that ends at root, each link carrying the buffer once.
 */
CC_API ccResult_t ccReduce(const void* sendbuff, void* recvbuff, size_t count, ccDataType_t datatype, ccRedOp_t op,
                           int root, ccComm_t comm, ccStream_t stream);

/* ------------------------------------------------------------------------------------------------------------ */
/* Point-to-point and groups                                                                                    */
/* ------------------------------------------------------------------------------------------------------------ */

/**
 * Point-to-point, like ncclSend and ncclRecv: count elements from this rank's sendbuff to rank peer, which receives
 * them with a matching ccRecv. The k-th ccSend from rank a to rank b matches the k-th ccRecv at b from a (a call of
 * count 0 is a message too), and the two must have the same byte count (count times the datatype's size). Nothing is
 * reduced and nothing is compressed; the call is not checked across ranks (point-to-point calls are not collective).
 * - A size mismatch is ccInvalidUsage on the receiving rank and fails its communicator, as any failure during
 *   communication does. Between thread ranks the sender gets it too; over UCX a send completes once its data has
 *   left, so the sender learns of the failure only in a later call that needs the receiver (ccTimeout, as with a
 *   dead peer). Over transport nccl, matching sizes is NCCL's, as for ncclSend and ncclRecv.
 * - Host buffers: the call blocks until sendbuff may be reused (ccSend) or recvbuff holds the data (ccRecv). A send
 *   may wait for its receive to be posted, so two ranks that exchange data must put their send and receive in one
 *   group (ccGroupStart / ccGroupEnd), as with NCCL.
 * - Device buffers: stream-ordered, as the collectives are. Over transport nccl they are ncclSend and ncclRecv, and
 *   host buffers are refused there (NCCL orders its messages apart from the host transports); otherwise they are
 *   staged through host memory by the communicator's proxy thread, and may meet host buffers on the peer.
 * - A send to this rank itself (peer == rank) must be in a group with its receive; it is a copy. The calls of a group
 *   run at once: a buffer that one of them writes must not overlap another's.
 * - Bad arguments (a NULL buffer with count > 0, a peer out of range, an unknown datatype, host buffers with a
 *   stream) return ccInvalidArgument or ccInvalidUsage before anything moves.
 */
CC_API ccResult_t ccSend(const void* sendbuff, size_t count, ccDataType_t datatype, int peer, ccComm_t comm,
                         ccStream_t stream);
CC_API ccResult_t ccRecv(void* recvbuff, size_t count, ccDataType_t datatype, int peer, ccComm_t comm,
                         ccStream_t stream);

/**
 * Groups, like ncclGroupStart and ncclGroupEnd. Between them, this thread's ccSend, ccRecv and collective calls are
 * only recorded; ccGroupEnd issues them and returns when they are done (host buffers) or queued (device buffers).
 * - The sends and receives of one communicator progress together: posted at once, then waited for, so their order
 *   inside the group does not matter. Then its collectives run, in call order.
 * - Calls on several communicators (one thread driving the ranks of ccCommInitAll) run side by side, one thread per
 *   communicator, so that they do not wait for one another.
 * - Groups nest; only the outermost ccGroupEnd issues the calls.
 * - Inits (ccCommInitRank, ccCommInitRankConfig, ccCommInitFromEnv) inside a group start at once, each on a thread
 *   of its own; ccGroupEnd waits for them (see ccCommInitRank) before it issues the group's calls, whose checks on a
 *   communicator made in the group wait for ccGroupEnd too. An init that fails, or any call of the group that fails
 *   its checks, makes the group's other inits give up (their communicators left for ccCommDestroy).
 * - A ccSend or ccRecv that fails its argument checks inside a group returns its error at once (on a communicator
 *   the group makes: at ccGroupEnd, where its checks run) and makes ccGroupEnd return it too, without issuing any
 *   call of the group. So does what ccGroupEnd refuses before anything moves (a communicator destroyed or failed
 *   since, mixed buffers or streams, a send to this rank without its receive). The group's collectives are then
 *   refused in the call check: a rank whose calls of them reach their call check fails them at once (ccInvalidUsage,
 *   naming this rank) and stays in step. A rank that first waits for a send or receive of the refused group fails
 *   when its timeout or this rank's ends (this rank's ccGroupEnd waits for that rank's call check until then, and
 *   its timeout aborts the communicator); before, ccGroupEnd returned at once, and the other ranks' collectives
 *   paired with this rank's next calls. A
 *   collective's arguments are checked when ccGroupEnd makes it (a refusal reaches the other ranks through the call
 *   check, as outside a group). ccCommSplit inside a group is ccInvalidUsage. ccGroupEnd returns the first
 *   failure of the group's calls (with its sentence in ccGetLastError(NULL)); each communicator's failures are
 *   recorded on it as outside a group. ccGroupEnd without ccGroupStart is ccInvalidUsage.
 * - Sends and receives of one communicator in one group take either host buffers or device buffers on one stream.
 */
CC_API ccResult_t ccGroupStart(void);
CC_API ccResult_t ccGroupEnd(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Compressors                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */

/** Compressor kinds. Explicit, gapped values: new kinds never renumber old ones. */
typedef enum {
  ccCompressCast16 = 10,    /**< 16-bit (bf16/fp16) wire, fp32 accumulation: the 16-bit baseline. */
  ccCompressQuant = 20,     /**< Randomized-Hadamard rotation + b-bit quantization. */
  ccCompressTopkChunk = 30, /**< Agreed top chunks by all-reduced norms, error feedback. */
  ccCompressRandk = 40,     /**< Shared-seed random chunks, error feedback. */
  ccCompressPowerSGD = 50   /**< Rank-r power iteration (low rank), error feedback. */
} ccCompressorKind_t;

/**
 * Compressor parameters, set with ccCompressorSetParam (or by name in a spec string, given in brackets). Explicit,
 * gapped values; ccCompressorGetParamBounds gives the bounds of a parameter's range, within which some values are
 * still refused: a rotation block must be a power of two, and [dtype] takes only the types its kind names below. A
 * parameter that does not apply to a kind is rejected with ccInvalidArgument. In a spec string, integers are decimal
 * (or hexadecimal after 0x), each name appears once, and a fraction too small for the parameter's unit (a clip below
 * 1e-6, an eps below 1e-12) is refused rather than rounded to 0. Parameters with named values take the names in a
 * spec string, not their numbers: mode=homomorphic|requant, rotation=none|rht, scale=fp32|bf16|fp16,
 * rounding=nearest|stochastic|correlated, gather=exact|requant, dtype=bf16|fp16|f32.
 */
typedef enum {
  ccParamBits = 100,           /**< [bits] quant: bits per element, 1..8. Default 4. */
  ccParamMode = 110,           /**< [mode] quant: ccQuantHomomorphic or ccQuantRequant. Default requant. */
  ccParamRotation = 120,       /**< [rotation] quant: 0 none, 1 randomized Hadamard (rht). Default rht.
                                    Range: a group's grid spans [-s, s] around its largest magnitude s. In requant
                                    mode s is a partial sum's, rounded up to the scale format, and a group whose s
                                    is not finite there (above 3.39e38 with bf16 scales, FLT_MAX with fp32, 65504
                                    with fp16) decodes to non-finite values on every rank, rotated or not; in
                                    homomorphic mode s is the largest rank's (agreed in float), and the same holds
                                    where nranks s exceeds FLT_MAX. A rotated value can reach sqrt(block) times its
                                    block's largest magnitude (where the block's signs line up with the random
                                    ones; random data stays near its own magnitude), so inputs whose partial sums
                                    stay below that limit over sqrt(block) (1.06e37 at 1024 with bf16 scales;
                                    homomorphic: FLT_MAX over nranks sqrt(block) per rank) are safe. The inverse
                                    rotation does not overflow where its result fits in float. */
  ccParamRotationBlock = 121,  /**< [block] quant: rotation block, a power of two in 2^6..2^14. Default 1024. */
  ccParamGroupSize = 130,      /**< [group] quant: elements per scale, 1..2^20; 0 = auto (requant 32,
                                    homomorphic the rotation block). */
  ccParamScaleFormat = 131,    /**< [scale] quant: scale storage, 0 fp32, 1 bf16, 2 fp16. Default bf16. fp16 has
                                    fp16's range: a group whose largest magnitude (in requant mode, a partial sum's
                                    on the ring) exceeds 65504 decodes to non-finite values on every rank, as an
                                    fp16 sum overflows; and a group whose largest magnitude is below fp16's normal
                                    range (6.1e-5) gets a coarser grid (its scale rounds up to a subnormal, down to
                                    6e-8): 4-bit vNMSE 0.04 on data of standard deviation 1e-7, 0.11 at 1e-8, 15 at
                                    1e-9 (bf16 scales: 0.033 throughout). */
  ccParamClipPpm = 140,        /**< [clip] quant: target clip probability in parts per million (the spec string
                                    takes a probability, e.g. clip=0.001); 0 = no clipping. Default 0. */
  ccParamRounding = 150,       /**< [rounding] quant: 0 nearest, 1 stochastic, 2 correlated (stratified across
                                    ranks; homomorphic mode only: with requant a call is ccInvalidUsage, a spec
                                    string ccInvalidArgument). Default stochastic. */
  ccParamGatherPayload = 160,  /**< [gather] quant homomorphic: all-gather 0 the exact integer sums or 1 the sums
                                    requantized to `bits`. Default exact. */
  ccParamDensityPpm = 200,     /**< [density] topk/randk: fraction of chunks sent, in parts per million (the spec
                                    string takes a fraction, e.g. density=0.1). Default 100000. */
  ccParamChunkSize = 210,      /**< [chunk] topk/randk: elements per chunk, 1..2^24. Default 1024. A bucket
                                    is at most 2^31 - 1 chunks (ccInvalidUsage beyond: use a larger chunk). */
  ccParamErrorFeedback = 220,  /**< [ef] topk/randk/powersgd: 1 keeps what was not sent (the input minus its
                                    compressed average) and adds it to the next call. Default 1. topk/randk with
                                    dtype=bf16 also keep what the bf16 sums of the sent chunks round away (each
                                    rank what its own hops rounded): with every chunk sent, the running sum of
                                    their outputs stays within about one call's rounding of the running sum of
                                    averages (without that, as with the bf16 all-reduce, every call's rounding
                                    adds to the drift: up to 2^-9 of the values per call). With 16-bit data,
                                    topk/randk/powersgd also keep each rank's share of what the output's own
                                    rounding to 16 bits takes (see the README). */
  ccParamValueType = 230,      /**< [dtype] cast16: ccBfloat16 or ccFloat16 on the wire (default bf16; fp16 has
                                    fp16's range: a partial sum past 65504 is +inf, as in an fp16 all-reduce, and a
                                    ccAvg divides each rank's input by nranks first, as NCCL's fp16 average does, so
                                    an average that fits stays finite); topk/randk:
                                    ccFloat32 or ccBfloat16 for the sent values; powersgd: for P and Q (default
                                    f32). powersgd with bf16 factors where the ranks' gradients differ the same way
                                    call after call (non-iid data): each rank's error-feedback memory drifts from
                                    the others' by the sum of those differences, so its share of P and Q grows
                                    while their sum does not, and the bf16 rounding of each share (2^-9 of it)
                                    swamps the sum; the power iteration then misses the average's directions and the
                                    running sum of outputs strays from the running sum of averages. 2 ranks, each
                                    its own 64x64 rank-2 matrix every call, rank=2: 5.8 times one call's average
                                    after 3200 calls, 14.5 after 12800 (f32 factors: 0.94 and 1.07; one matrix on
                                    every rank, bf16: 0.003), with or without warm start (perf/powersgd_drift). The
                                    per-rank memories are PowerSGD's own (PyTorch's hook keeps them too); with fresh
                                    inputs each call their difference is a random walk instead of a line. */
  ccParamUnbiased = 240,       /**< [unbiased] randk: 1 scales sent values by 1/density (unbiased, higher
                                    variance); needs ef=0 (a call with ef=1 is ccInvalidUsage, a spec string
                                    ccInvalidArgument). Default 0. */
  ccParamRank = 300,           /**< [rank] powersgd: rank r of the approximation, 1..64 (a matrix with
                                    min(rows, cols) < r uses min(rows, cols)). Default 4. */
  ccParamRows = 310,           /**< [rows] powersgd: rows of the bucket seen as one row-major matrix; 0 = auto.
                                    With cols = 0, cols = count / rows (which must divide). Default 0. */
  ccParamCols = 311,           /**< [cols] powersgd: columns (see rows). Both 0 (auto): rows = floor(sqrt(count)),
                                    cols = count / rows, the remainder (< rows elements) sent exactly. Default 0.
                                    ccCompressorSetShapes (or shapes=... in a spec) gives a list of tensors instead. */
  ccParamWarmStart = 320,      /**< [warm] powersgd: 1 starts each call's power iteration from the previous Q.
                                    Default 1. */
  ccParamStartIter = 330,      /**< [start] powersgd: calls before compression starts; they are exact float32
                                    all-reduces (no error feedback). Default 0. */
  ccParamOrthoEpsilon = 340,   /**< [eps] powersgd: Gram-Schmidt divides by norm + eps; stored in units of 1e-12
                                    (the spec string takes a number, e.g. eps=1e-8). Default 0. */
  ccParamSeed = 900            /**< [seed] seed of the counter-based generator (rotation signs, dithers, random
                                    chunks, PowerSGD's initial Q): the same on every rank. Default 0x5eed. */
} ccCompressorParam_t;

/** Values of ccParamMode. */
typedef enum {
  ccQuantHomomorphic = 0, /**< Agreed scales; integer codes are summed exactly in packed lanes (THC-style). */
  ccQuantRequant = 1      /**< Each hop decodes, adds, and re-encodes with fresh scales (DynamiQ-style). */
} ccQuantMode_t;

/**
 * Creates a compressor of the given kind with default parameters. A compressor is one gradient bucket's state on
 * one rank: its error-feedback memory and call counter. Use one compressor per bucket per rank (ranks that are
 * threads of one process need one each), with the same parameters on every rank, and pass it to every
 * ccAllReduce of that bucket; it binds to the bucket's element count at its first use. One call at a time: a call
 * of another communicator (another rank's) while one is using it is ccInvalidUsage; the communicators of one rank
 * may use it one after the other (on the nccl transport a call waits on the device for the compressor's previous
 * one, whatever its stream). Two ranks sharing one compressor are found by the call check; with CC_CHECK_CALLS=0
 * they are not, and their calls mix its state or, on the nccl transport, wait for each other until the timeout.
 * A PowerSGD compressor also owns the bucket's Q (warm start); it needs a BLAS in the build (ccInvalidUsage
 * otherwise).
 */
CC_API ccResult_t ccCompressorCreate(ccCompressor_t* comp, ccCompressorKind_t kind);

/**
 * Creates a compressor from a spec string "kind[:name=value,...]", for example "quant:bits=4,mode=requant",
 * "cast16:dtype=bf16", "topk:density=0.1,chunk=1024", "randk:density=0.05,unbiased=1,ef=0" or
 * "powersgd:rank=4,rows=4096,cols=4096". Kinds: cast16, quant, topk, randk, powersgd. Names are those in brackets
 * in ccCompressorParam_t, plus shapes=... for powersgd: the bucket's tensors in order, '+'-separated, each ROWSxCOLS
 * or a length N (a vector), e.g. "powersgd:rank=8,shapes=1024x512+512+10x512+10". A malformed spec is
 * ccInvalidArgument with a sentence naming the offending part.
 */
CC_API ccResult_t ccCompressorCreateFromString(ccCompressor_t* comp, const char* spec);

/** Sets one parameter. Out-of-range values and parameters that do not apply to the kind are ccInvalidArgument.
    Changing a parameter after the first ccAllReduce resets the compressor's state (error feedback, counter). While a
    call on another thread uses the compressor, this (as ccCompressorSetShapes and ccCompressorDestroy) is
    ccInvalidUsage and changes nothing; a call that comes while a change runs is refused the same way. */
CC_API ccResult_t ccCompressorSetParam(ccCompressor_t comp, ccCompressorParam_t param, int64_t value);

/**
 * powersgd: describes the bucket as `ntensors` tensors laid out one after the other, tensor i a row-major
 * rows[i] x cols[i] matrix (cols[i] = 1 for a vector). Vectors, and matrices that rank r would not shrink at least
 * 2x (2 r (rows + cols) >= rows * cols, r capped at min(rows, cols); as PyTorch's hook), are all-reduced exactly;
 * the others through rank-r power iteration. The sum of
 * rows[i] * cols[i] must equal the count of every ccAllReduce with this compressor (ccInvalidUsage otherwise).
 * ntensors = 0 clears the list (back to rows/cols). Resets the compressor's state.
 */
CC_API ccResult_t ccCompressorSetShapes(ccCompressor_t comp, int ntensors, const int64_t* rows, const int64_t* cols);

/** Reads one parameter's current value. */
CC_API ccResult_t ccCompressorGetParam(ccCompressor_t comp, ccCompressorParam_t param, int64_t* value);

/** Writes the inclusive bounds of a parameter. */
CC_API ccResult_t ccCompressorGetParamBounds(ccCompressorParam_t param, int64_t* lo, int64_t* hi);

/** Writes the compressor's spec string (every parameter, canonical form) into buf (size bytes, NUL-terminated).
    Useful to log what ran. */
CC_API ccResult_t ccCompressorGetSpec(ccCompressor_t comp, char* buf, size_t size);

/** Frees a compressor and its state. Device calls queued with it run first (this waits for them); a call running
    with it on another thread makes this ccInvalidUsage, and the compressor stays. A later call with a destroyed
    compressor returns ccInvalidArgument (the addresses of the last 4096 are not reused). NULL is accepted and
    ignored. */
CC_API ccResult_t ccCompressorDestroy(ccCompressor_t comp);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CCOLL_H_ */
