/* Structural validation of k3pd.v1 requests, shared by every server that receives them.
 *
 * Each k3_rpc_validate_* returns 0, or K3_EINVAL with a one-line message in `msg` (cap bytes,
 * always NUL-terminated) that starts with the offending field path, e.g.
 *   "stop.max_new_tokens: must be >= 1"
 *   "chat.messages[2].role: unknown enum value 7"
 * The caller answers INVALID_ARGUMENT with that message (k3_rpc_call_finish).
 *
 * What is checked: required fields present, enum values known to this protocol version (protobuf-c
 * keeps unknown proto3 enum values as raw ints), numeric ranges that do not depend on the model,
 * UTF-8 validity of text fields, oneof selection. What is NOT checked: limits that depend on the
 * served model (vocabulary size, context length); pass those in k3_rpc_limits_t when known. */
#ifndef K3PD_RPC_VALIDATE_H
#define K3PD_RPC_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/v1/cluster.pb-c.h"
#include "k3pd/v1/decode.pb-c.h"
#include "k3pd/v1/generation.pb-c.h"
#include "k3pd/v1/prefill.pb-c.h"

/* Model-dependent limits; a zero field means "not checked". */
typedef struct {
  uint32_t vocab_size;          /* token ids must be < this */
  uint32_t max_new_tokens;      /* stop.max_new_tokens must be <= this */
  uint32_t max_prompt_tokens;   /* token_ids input length must be <= this */
  uint32_t max_prompt_bytes;    /* text / total chat content bytes must be <= this */
  const char *model_name;       /* GenerateRequest.model, when non-empty, must equal this */
} k3_rpc_limits_t;

/* Bounds on what a worker may claim at registration (capacity.*; larger values are
 * INVALID_ARGUMENT naming the field). Far above any real worker (K3 on an 8-GPU node: ~10^5
 * pages of 64 tokens), far below what would let one worker attract every request. */
#define K3_RPC_MAX_KV_PAGES (1u << 24)
#define K3_RPC_MAX_PAGE_TOKENS 65536u
#define K3_RPC_MAX_KDA_SLOTS 65536u
#define K3_RPC_MAX_BATCH 65536u
#define K3_RPC_MAX_CONTEXT (1u << 24) /* tokens: prompt + completion of one sequence */

/* 1 when s[0..len) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int k3_rpc_utf8_valid(const char *s, size_t len);

int k3_rpc_validate_sampling(const K3pd__V1__SamplingParams *s, const char *path, char *msg, size_t cap);
int k3_rpc_validate_stop(const K3pd__V1__StopConditions *s, const k3_rpc_limits_t *lim,
                         const char *path, char *msg, size_t cap);

int k3_rpc_validate_generate_request(const K3pd__V1__GenerateRequest *r, const k3_rpc_limits_t *lim,
                                     char *msg, size_t cap);
int k3_rpc_validate_register_request(const K3pd__V1__RegisterRequest *r, char *msg, size_t cap);
int k3_rpc_validate_heartbeat_request(const K3pd__V1__HeartbeatRequest *r, char *msg, size_t cap);
int k3_rpc_validate_deregister_request(const K3pd__V1__DeregisterRequest *r, char *msg, size_t cap);
int k3_rpc_validate_reserve_request(const K3pd__V1__ReserveRequest *r, char *msg, size_t cap);
int k3_rpc_validate_release_request(const K3pd__V1__ReleaseRequest *r, char *msg, size_t cap);
int k3_rpc_validate_attach_request(const K3pd__V1__AttachRequest *r, const k3_rpc_limits_t *lim,
                                   char *msg, size_t cap);
int k3_rpc_validate_prefill_request(const K3pd__V1__PrefillRequest *r, const k3_rpc_limits_t *lim,
                                    char *msg, size_t cap);
int k3_rpc_validate_abort_request(const K3pd__V1__AbortRequest *r, char *msg, size_t cap);
int k3_rpc_validate_prepare_resume_request(const K3pd__V1__PrepareResumeRequest *r, char *msg, size_t cap);
int k3_rpc_validate_export_request(const K3pd__V1__ExportRequest *r, char *msg, size_t cap);

#endif
