/* Private to common/rpc: the completion-queue bridge shared by server and client, the tag
 * convention, and protobuf <-> grpc_byte_buffer helpers.
 *
 * Tag convention: every tag handed to gRPC points at an rpc_tag_t embedded in the object that
 * owns the batch; its cb runs on the loop thread with the batch's success bit. The object stays
 * alive until every tag it handed out has fired (refcounts in server.c / client.c).
 *
 * Bridge (C-STACK.md §3, "pattern A + hybrid"): a drain thread blocks in
 * grpc_completion_queue_next() and appends completions to a mutex-protected vector, then
 * uv_async_send()s the loop (sends coalesce, so the loop drains the whole vector per wakeup).
 * After dispatching, the loop thread itself polls the CQ with an already-past deadline, up to a
 * budget, so back-to-back stream sends complete without a thread hop each (P7). When the
 * budget is used up it re-arms the async so timers and other handles still get their turn.
 * Lock order: only rpc_bridge_t.mu exists; no callback runs under it. */
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
  int cq_shutdown;   /* loop only: grpc_completion_queue_shutdown was called */
  int finished;      /* loop only: on_drained ran, async is closing */
  /* Loop thread, once, after the CQ is fully drained and the thread joined. The owner
   * destroys its grpc objects here; the CQ is destroyed by the bridge right after. */
  void (*on_drained)(rpc_bridge_t *b);
  /* Loop thread, once, after the async handle is closed: the owner may free the bridge. */
  void (*on_closed)(rpc_bridge_t *b);
  void *owner;
};

/* Creates the CQ, the async handle and the drain thread. On error nothing is left behind. */
int rpc_bridge_init(rpc_bridge_t *b, uv_loop_t *loop, void *owner,
                    void (*on_drained)(rpc_bridge_t *), void (*on_closed)(rpc_bridge_t *));
/* grpc_completion_queue_shutdown(); completions still in the queue are delivered, then
 * on_drained and on_closed run. Idempotent. */
void rpc_bridge_shutdown(rpc_bridge_t *b);

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
