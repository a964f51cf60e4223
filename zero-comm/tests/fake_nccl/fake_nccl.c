/*
 * A fake libnccl.so.2 with NCCL's non-blocking semantics, for testing zero-sys without a
 * GPU (see tests/nccl_nonblocking.rs). It implements the entry points zero-sys calls.
 *
 * What it models, from NCCL 2.28 (src/group.cc, src/init.cc):
 * - A communicator must be created non-blocking (config->blocking == 0).
 * - Init, every collective and ncclCommFinalize answer ncclInProgress and stay in progress
 *   for `polls` calls of ncclCommGetAsyncError, as NCCL's async job does.
 * - A call made while the previous one is in progress is refused with
 *   ncclInvalidArgument, which also becomes the communicator's async error
 *   (ncclCommEnsureReady). ncclCommDestroy in progress is refused the same way.
 * - A collective's output is written only when it completes, so a caller that reads the
 *   output before polling to completion sees whatever was there before.
 *
 * Ranks are threads of one process; "device addresses" are host pointers and streams are
 * ignored. Inputs are copied when a rank posts a collective; once every rank has posted,
 * the outputs are computed (ranks in order, f32), and each rank's output is written into
 * its buffer when its call completes. Only f32 reduces; gathers and broadcasts copy
 * bytes of any type.
 *
 * The scenario is read from the unique id, so tests running in parallel do not meet:
 *   bytes 0..8   "FAKENCCL"
 *   int32 at 8   polls each call stays in progress
 *   int32 at 12  op index that fails with ncclRemoteError (-1: none)
 *   int32 at 16  the rank it fails on
 *   int32 at 20  op index that never completes (-1: none)
 *   int32 at 24  the rank it hangs on
 *   int32 at 28  polls init stays in progress (-1: forever)
 * fakeNcclGroupStats(id, out, n) reports the group's counters (see enum stat).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
enum {
  ncclSuccess = 0,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7
};
enum { ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclMax = 2, ncclAvg = 4 };

typedef struct { char internal[128]; } ncclUniqueId;
/* The head of ncclConfig_t, which is all this reads. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ncclConfig_head;

enum stat {
  STAT_REFUSED,      /* calls refused because the previous one was in progress */
  STAT_COMPLETED,    /* collectives completed */
  STAT_ABORTS,
  STAT_DESTROYS,
  STAT_DESTROY_REFUSED,
  STAT_FINALIZES,
  STAT_BLOCKING_INIT, /* inits asked for a blocking communicator */
  STAT_COUNT
};

enum kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST };
#define MAX_RANKS 8

struct op {
  int kind, dtype, redop, root, posted;
  size_t count; /* per-rank input elements */
  unsigned char *input[MAX_RANKS];
  unsigned char *output[MAX_RANKS];
  size_t output_bytes;
};

struct group {
  char id[128];
  int nranks;
  int polls, fail_at, fail_rank, hang_at, hang_rank, init_polls;
  struct op **ops;
  size_t nops;
  long stats[STAT_COUNT];
  struct group *next;
};

enum pending { NONE, INIT, COLLECTIVE, FINALIZE };

struct ncclComm {
  struct group *g;
  int rank;
  ncclResult_t state;
  enum pending pending;
  int left;     /* polls left before the pending call may complete */
  long seq;     /* next collective's index */
  long op;      /* the pending collective */
  void *recv;
  int hang, fail;
};
typedef struct ncclComm *ncclComm_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct group *groups;
static unsigned nonce;

static int read_int(const char *id, int at) {
  int32_t v;
  memcpy(&v, id + at, 4);
  return v;
}

static struct group *find_group(const char *id) {
  for (struct group *g = groups; g; g = g->next)
    if (memcmp(g->id, id, 128) == 0) return g;
  return NULL;
}

static size_t type_size(int dtype) { return dtype == ncclFloat32 ? 4 : 2; }

ncclResult_t ncclGetVersion(int *version) {
  *version = 22809;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (fake NCCL: previous call still in progress?)";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, "FAKENCCL", 8);
  int32_t v[6] = {2, -1, 0, -1, 0, 2};
  memcpy(id->internal + 8, v, sizeof v);
  pthread_mutex_lock(&mu);
  unsigned n = ++nonce;
  pthread_mutex_unlock(&mu);
  memcpy(id->internal + 64, &n, sizeof n);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_head *config) {
  if (memcmp(id.internal, "FAKENCCL", 8) != 0 || nranks < 1 || nranks > MAX_RANKS ||
      rank < 0 || rank >= nranks)
    return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  struct group *g = find_group(id.internal);
  if (!g) {
    g = calloc(1, sizeof *g);
    memcpy(g->id, id.internal, 128);
    g->nranks = nranks;
    g->polls = read_int(id.internal, 8);
    g->fail_at = read_int(id.internal, 12);
    g->fail_rank = read_int(id.internal, 16);
    g->hang_at = read_int(id.internal, 20);
    g->hang_rank = read_int(id.internal, 24);
    g->init_polls = read_int(id.internal, 28);
    g->next = groups;
    groups = g;
  }
  if (!config || config->blocking != 0) {
    g->stats[STAT_BLOCKING_INIT]++;
    pthread_mutex_unlock(&mu);
    return ncclInvalidArgument;
  }
  struct ncclComm *c = calloc(1, sizeof *c);
  c->g = g;
  c->rank = rank;
  c->pending = INIT;
  c->left = g->init_polls;
  c->state = ncclInProgress;
  pthread_mutex_unlock(&mu);
  *out = c;
  return ncclInProgress;
}

static void compute(struct group *g, struct op *o) {
  size_t es = type_size(o->dtype), n = o->count;
  for (int r = 0; r < g->nranks; r++) {
    size_t out_elems = o->kind == REDUCE_SCATTER ? n / g->nranks
                     : o->kind == ALL_GATHER ? n * g->nranks
                     : n;
    o->output_bytes = out_elems * es;
    o->output[r] = malloc(o->output_bytes ? o->output_bytes : 1);
    if (o->kind == ALL_GATHER) {
      for (int s = 0; s < g->nranks; s++) memcpy(o->output[r] + s * n * es, o->input[s], n * es);
    } else if (o->kind == BROADCAST) {
      memcpy(o->output[r], o->input[o->root], n * es);
    } else {
      size_t base = o->kind == REDUCE_SCATTER ? r * out_elems : 0;
      float *dst = (float *)o->output[r];
      for (size_t i = 0; i < out_elems; i++) {
        float acc = ((float *)o->input[0])[base + i];
        for (int s = 1; s < g->nranks; s++) {
          float x = ((float *)o->input[s])[base + i];
          acc = o->redop == ncclMax ? (x > acc ? x : acc) : acc + x;
        }
        if (o->redop == ncclAvg) acc /= (float)g->nranks;
        dst[i] = acc;
      }
    }
  }
  for (int s = 0; s < g->nranks; s++) {
    free(o->input[s]);
    o->input[s] = NULL;
  }
}

static ncclResult_t refuse_if_busy(struct ncclComm *c) {
  if (c->state == ncclInProgress) {
    c->g->stats[STAT_REFUSED]++;
    c->state = ncclInvalidArgument;
    return ncclInvalidArgument;
  }
  return c->state; /* an earlier error, or success */
}

static ncclResult_t post(struct ncclComm *c, int kind, const void *send, void *recv,
                         size_t count, int dtype, int redop, int root) {
  if (dtype != ncclFloat32 && (kind == ALL_REDUCE || kind == REDUCE_SCATTER))
    return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  ncclResult_t busy = refuse_if_busy(c);
  if (busy != ncclSuccess) {
    pthread_mutex_unlock(&mu);
    return busy;
  }
  struct group *g = c->g;
  long k = c->seq++;
  if ((size_t)k >= g->nops) {
    size_t n = g->nops ? g->nops * 2 : 64;
    while ((size_t)k >= n) n *= 2;
    g->ops = realloc(g->ops, n * sizeof *g->ops);
    memset(g->ops + g->nops, 0, (n - g->nops) * sizeof *g->ops);
    g->nops = n;
  }
  if (!g->ops[k]) {
    g->ops[k] = calloc(1, sizeof(struct op));
    g->ops[k]->kind = kind;
    g->ops[k]->dtype = dtype;
    g->ops[k]->redop = redop;
    g->ops[k]->root = root;
    g->ops[k]->count = count;
  }
  struct op *o = g->ops[k];
  if (o->kind != kind || o->count != count || o->dtype != dtype) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  size_t bytes = count * type_size(dtype);
  o->input[c->rank] = malloc(bytes ? bytes : 1);
  memcpy(o->input[c->rank], send, bytes);
  if (++o->posted == g->nranks) compute(g, o);
  c->pending = COLLECTIVE;
  c->op = k;
  c->recv = recv;
  c->left = g->polls;
  c->hang = k == g->hang_at && c->rank == g->hang_rank;
  c->fail = k == g->fail_at && c->rank == g->fail_rank;
  c->state = ncclInProgress;
  pthread_mutex_unlock(&mu);
  return ncclInProgress;
}

/* Advances the pending call by one poll; called with mu held. */
static void progress(struct ncclComm *c) {
  if (c->state != ncclInProgress) return;
  if (c->left > 0) {
    c->left--;
    return;
  }
  switch (c->pending) {
    case INIT:
      if (c->left < 0) return; /* never */
      break;
    case COLLECTIVE: {
      if (c->hang) return;
      if (c->fail) {
        c->state = ncclRemoteError;
        c->pending = NONE;
        return;
      }
      struct op *o = c->g->ops[c->op];
      if (o->posted < c->g->nranks) return; /* waits for its peers */
      memcpy(c->recv, o->output[c->rank], o->output_bytes);
      free(o->output[c->rank]);
      o->output[c->rank] = NULL;
      c->g->stats[STAT_COMPLETED]++;
      break;
    }
    case FINALIZE:
    case NONE:
      break;
  }
  c->pending = NONE;
  c->state = ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
  pthread_mutex_lock(&mu);
  progress(c);
  *state = c->state;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op,
                           ncclComm_t c, void *stream) {
  (void)stream;
  return post(c, ALL_REDUCE, send, recv, count, dtype, op, 0);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dtype,
                               int op, ncclComm_t c, void *stream) {
  (void)stream;
  return post(c, REDUCE_SCATTER, send, recv, recvcount * c->g->nranks, dtype, op, 0);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int dtype,
                           ncclComm_t c, void *stream) {
  (void)stream;
  return post(c, ALL_GATHER, send, recv, sendcount, dtype, ncclSum, 0);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root,
                           ncclComm_t c, void *stream) {
  (void)stream;
  return post(c, BROADCAST, send, recv, count, dtype, ncclSum, root);
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
  pthread_mutex_lock(&mu);
  ncclResult_t busy = refuse_if_busy(c);
  if (busy == ncclSuccess) {
    c->g->stats[STAT_FINALIZES]++;
    c->pending = FINALIZE;
    c->left = c->g->polls;
    c->state = ncclInProgress;
    busy = ncclInProgress;
  }
  pthread_mutex_unlock(&mu);
  return busy;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  pthread_mutex_lock(&mu);
  if (c->state == ncclInProgress) {
    c->g->stats[STAT_DESTROY_REFUSED]++;
    pthread_mutex_unlock(&mu);
    return ncclInvalidArgument; /* and the communicator leaks, as in NCCL */
  }
  c->g->stats[STAT_DESTROYS]++;
  pthread_mutex_unlock(&mu);
  free(c);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  pthread_mutex_lock(&mu);
  c->g->stats[STAT_ABORTS]++;
  pthread_mutex_unlock(&mu);
  free(c);
  return ncclSuccess;
}

/* The group's counters (enum stat order); returns how many were written. */
int fakeNcclGroupStats(const char *id, long *out, int n) {
  pthread_mutex_lock(&mu);
  struct group *g = find_group(id);
  int k = 0;
  for (; g && k < n && k < STAT_COUNT; k++) out[k] = g->stats[k];
  pthread_mutex_unlock(&mu);
  return k;
}
