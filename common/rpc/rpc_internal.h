/* Private to common/rpc: the completion-queue bridge shared by server and client, the tag
 * convention, and protobuf <-> grpc_byte_buffer helpers.
 *
 * Tag convention: every tag handed to gRPC points at an rpc_tag_t embedded in the object that
 * owns the batch; its cb runs on the loop thread with the batch's success bit. The object stays
 * alive until every tag it handed out has fired (refcounts in server.c / client.c).
 *
 * Bridge (C-STACK.md §3, "pattern A + hybrid"): ONE completion queue and ONE drain thread per
 * uv loop, shared by every server and client on that loop (each is an owner of the bridge). The
 * drain thread blocks in grpc_completion_queue_next() and appends completions to a
 * mutex-protected vector, then uv_async_send()s the loop (sends coalesce, so the loop drains the
 * whole vector per wakeup); it sends only for the first completion of an empty vector and not
 * while the loop is inside the bridge's callback, which looks at the vector again on its way
 * out. After dispatching, the loop thread itself polls the CQ with an already-past deadline, up
 * to a budget, so back-to-back completions are taken without a thread hop each (P7). When the
 * budget is used up, or completions were queued meanwhile, it re-arms the async so timers and
 * other handles still get their turn. One CQ per process instead of one per owner: a request that crosses the
 * router's two servers and its client costs one drain thread's hops, not three.
 *
 * Owners and shutdown: the bridge does not count tags. Each owner knows when none of its own
 * tags is outstanding (client: no live call; server: shutdown notified, no live call and no
 * armed request) and then calls rpc_bridge_detach(). Its on_detached runs later on the loop
 * thread (never inside detach), and for the last owner only after the CQ was shut down and
 * drained, the thread joined, the CQ destroyed and the async handle closed. The last detach
 * also takes the bridge out of the per-loop registry at once, so an owner created meanwhile
 * (workers create and close clients at any time) starts a fresh bridge.
 * Lock order: rpc_bridge_t.mu and the registry lock are never held together; no callback runs
 * under either. */
#ifndef K3PD_RPC_INTERNAL_H
#define K3PD_RPC_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <protobuf-c/protobuf-c.h>
#include <uv.h>

typedef struct rpc_tag {
  void (*cb)(struct rpc_tag *tag, int ok);
} rpc_tag_t;

typedef struct {
  rpc_tag_t *tag;
  int ok;
} rpc_ev_t;

typedef struct rpc_bridge rpc_bridge_t;
typedef struct rpc_owner rpc_owner_t;

/* A server or client attached to its loop's bridge; embedded in the owner. Loop thread only. */
struct rpc_owner {
  rpc_bridge_t *br;
  /* Loop thread, once, after rpc_bridge_detach (never inside it). The owner may free itself. */
  void (*on_detached)(rpc_owner_t *o);
  int detached;
  rpc_owner_t *next;  /* the bridge's list of detached owners still to be told */
};

struct rpc_bridge {
  uv_loop_t *loop;
  grpc_completion_queue *cq;
  uv_async_t async;
  pthread_t thread;
  pthread_mutex_t mu;
  rpc_ev_t *q;       /* guarded by mu */
  size_t q_len;      /* guarded by mu */
  size_t q_cap;      /* guarded by mu */
  int cq_drained;    /* guarded by mu: the drain thread saw GRPC_QUEUE_SHUTDOWN and exits */
  int async_ok;      /* guarded by mu: the async handle exists (set once init succeeded) */
  int in_cb;         /* guarded by mu: async_cb runs and will look at q again before it returns */
  int owners;        /* guarded by the registry lock: attached owners not yet detached */
  int cq_shutdown;   /* loop only: the last owner left; grpc_completion_queue_shutdown called */
  int finished;      /* loop only: the CQ is destroyed, async is closing */
  rpc_owner_t *gone, **gone_tail; /* loop only: detached owners whose on_detached is due */
  rpc_bridge_t *next; /* the per-loop registry (bridge.c) */
};

/* Attaches o to the bridge of `loop`, creating it (CQ, async handle, drain thread) when the
 * loop has none. The caller holds a grpc_init() reference. On error o is not attached. */
int rpc_bridge_attach(uv_loop_t *loop, rpc_owner_t *o, void (*on_detached)(rpc_owner_t *));
/* The owner has no tag outstanding and starts no more batches: it leaves the bridge, and
 * o->on_detached runs later on the loop thread. The last owner shuts the CQ down. Once. */
void rpc_bridge_detach(rpc_owner_t *o);
static inline grpc_completion_queue *rpc_owner_cq(const rpc_owner_t *o) { return o->br->cq; }

/* Packs a protobuf-c message into a new byte buffer (caller destroys it). NULL on OOM. */
grpc_byte_buffer *rpc_pack(const ProtobufCMessage *m);
/* Unpacks; NULL when bb is NULL or the bytes do not parse. Free with
 * protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb);
/* Server side: like rpc_unpack, but first refuses a message whose string field contains a NUL
 * byte (protobuf-c would cut the string there): returns NULL with `nul_path` set to the field's
 * path (e.g. "chat.messages[1].content"); NULL with nul_path "" when it does not parse. */
ProtobufCMessage *rpc_unpack_strict(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb, char *nul_path,
                                    size_t pathlen);
/* wirecheck.c: 1 when a string field of the encoded message holds a NUL byte (its path in
 * `path`), 0 otherwise (malformed input included: unpack rejects that). */
int rpc_wire_find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, char *path,
                      size_t pathlen);

/* Channel / server args carrying the message size limits (P5). `a` must have room for 2. */
void rpc_size_args(grpc_arg *a, grpc_channel_args *args, int max_bytes);

#endif
