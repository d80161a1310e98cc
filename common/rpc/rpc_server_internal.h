/* Private to common/rpc: the server and server-call structures, shared by server.c and
 * health.c. Everything here is loop-thread state (see rpc_internal.h for the bridge). */
#ifndef K3PD_RPC_SERVER_INTERNAL_H
#define K3PD_RPC_SERVER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/rpc.h"
#include "rpc_internal.h"

#define K3_RPC_MAX_METHODS 64

typedef struct {
  char *path;  /* owned */
  k3_rpc_kind_t kind;
  const ProtobufCMessageDescriptor *desc;
  k3_rpc_handler_fn fn;
  void *user;
  void *handle;  /* grpc_server_register_method result */
  int open;      /* served to any peer even when the server requires one (grpc.health.v1) */
} rpc_method_t;

struct k3_rpc_call {
  k3_rpc_server_t *srv;
  rpc_method_t *method;
  grpc_call *call;             /* ref released in destroy */
  gpr_timespec deadline;
  grpc_metadata_array md;      /* request metadata; slices owned by the call (P6) */
  grpc_call_details details_in; /* unregistered calls only: the method path asked for */
  int unregistered;
  grpc_byte_buffer *payload;   /* request bytes */
  ProtobufCMessage *req;       /* unpacked request; freed in destroy */
  rpc_tag_t t_request, t_close, t_send;
  int refs;
  int close_cancelled;         /* written by gRPC for RECV_CLOSE_ON_SERVER */
  unsigned dispatched : 1, closed : 1, cancelled : 1, finished : 1, send_failed : 1,
      send_in_flight : 1, initial_md_sent : 1, status_queued : 1, status_sent : 1,
      has_details : 1;
  k3_rpc_code_t status_code;
  grpc_slice details;          /* valid when has_details; unref in destroy */
  grpc_metadata out_md[1];     /* initial metadata we send (x-request-id echo) */
  size_t out_md_n;
  grpc_byte_buffer **q;        /* queued messages not yet handed to gRPC: q[q_head..+q_len) */
  size_t q_head, q_len, q_cap;
  grpc_byte_buffer *inflight_bb; /* the message of the outstanding send; freed on completion */
  char **md_copies;            /* strings returned by k3_rpc_call_metadata */
  size_t md_copies_n;
  char **peer;                 /* identity names of the verified client certificate (owned) */
  size_t n_peer;
  int peer_loaded;             /* peer[] was read from the auth context */
  k3_rpc_cancel_fn cancel_fn;
  void *cancel_arg;
  void *user;
  k3_rpc_call_t *prev, *next;  /* live list */
};

typedef struct rpc_health rpc_health_t;

struct k3_rpc_server {
  rpc_owner_t own;             /* first: on_detached casts back */
  uv_loop_t *loop;
  grpc_server *server;
  k3_rpc_server_opts_t opts;
  rpc_method_t *methods;       /* fixed array of K3_RPC_MAX_METHODS */
  rpc_method_t unknown;        /* stand-in method for calls to unregistered paths */
  size_t n_methods;
  k3_rpc_call_t *calls;        /* dispatched, not yet destroyed */
  size_t live_calls;
  size_t armed;                /* outstanding request_registered_call */
  int started, shutting_down, shutdown_notified;
  int n_ports;                 /* listening ports added */
  int peer_required;           /* non-open methods need a verified client certificate */
  char **peer_allowed;         /* and, when n_peer_allowed > 0, one covering one of these (owned) */
  size_t n_peer_allowed;
  rpc_tag_t t_shutdown;
  uv_timer_t grace_timer;
  int handles_open;
  k3_rpc_server_done_fn done;
  void *done_arg;
  rpc_health_t *health;
};

void srv_free(k3_rpc_server_t *srv);

/* peer.c: the server's peer rule for a call of a non-open method; 0 = allowed, else the call
 * was finished (UNAUTHENTICATED or PERMISSION_DENIED) and the caller must return. */
int rpc_check_peer(k3_rpc_call_t *c);

/* health.c */
int rpc_health_register(k3_rpc_server_t *srv);
void rpc_health_shutdown(k3_rpc_server_t *srv);
void rpc_health_free(k3_rpc_server_t *srv);

#endif
