/* libFuzzer harness for every k3pd.v1 / grpc.health.v1 RPC message as a server or client
 * receives it: the first byte chooses the message type, the rest is its encoding. Each input goes
 * through what k3_rpc does with received bytes (common/rpc): the NUL-in-string walk
 * (rpc_wire_find_nul), protobuf-c unpacking, then the request's validator (k3_rpc_validate_*,
 * with and without model limits). A message that unpacks must re-pack to exactly its packed
 * size and unpack again. Any crash, sanitizer report, leak or broken invariant is a finding. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "k3pd/rpc_validate.h"
#include "rpc_internal.h"

typedef int (*validate_fn)(const ProtobufCMessage *m, const k3_rpc_limits_t *lim, char *msg, size_t cap);

static int v_generate(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  return k3_rpc_validate_generate_request((const void *)m, l, e, c);
}
static int v_register(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_register_request((const void *)m, e, c);
}
static int v_heartbeat(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_heartbeat_request((const void *)m, e, c);
}
static int v_deregister(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_deregister_request((const void *)m, e, c);
}
static int v_reserve(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_reserve_request((const void *)m, e, c);
}
static int v_release(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_release_request((const void *)m, e, c);
}
static int v_attach(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  return k3_rpc_validate_attach_request((const void *)m, l, e, c);
}
static int v_prefill(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  return k3_rpc_validate_prefill_request((const void *)m, l, e, c);
}
static int v_abort(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_abort_request((const void *)m, e, c);
}
static int v_prepare_resume(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_prepare_resume_request((const void *)m, e, c);
}
static int v_export(const ProtobufCMessage *m, const k3_rpc_limits_t *l, char *e, size_t c) {
  (void)l;
  return k3_rpc_validate_export_request((const void *)m, e, c);
}

/* The message table (fuzz_seeds.c writes one seed per row, with the same selector byte). */
static const struct {
  const ProtobufCMessageDescriptor *d;
  validate_fn v;
} MSGS[] = {
    {&k3pd__v1__generate_request__descriptor, v_generate},
    {&k3pd__v1__generate_response__descriptor, NULL},
    {&k3pd__v1__register_request__descriptor, v_register},
    {&k3pd__v1__register_response__descriptor, NULL},
    {&k3pd__v1__heartbeat_request__descriptor, v_heartbeat},
    {&k3pd__v1__heartbeat_response__descriptor, NULL},
    {&k3pd__v1__deregister_request__descriptor, v_deregister},
    {&k3pd__v1__deregister_response__descriptor, NULL},
    {&k3pd__v1__reserve_request__descriptor, v_reserve},
    {&k3pd__v1__reservation__descriptor, NULL},
    {&k3pd__v1__release_request__descriptor, v_release},
    {&k3pd__v1__release_response__descriptor, NULL},
    {&k3pd__v1__attach_request__descriptor, v_attach},
    {&k3pd__v1__attach_response__descriptor, NULL},
    {&k3pd__v1__stats_request__descriptor, NULL},
    {&k3pd__v1__stats_response__descriptor, NULL},
    {&k3pd__v1__prefill_request__descriptor, v_prefill},
    {&k3pd__v1__prefill_response__descriptor, NULL},
    {&k3pd__v1__abort_request__descriptor, v_abort},
    {&k3pd__v1__abort_response__descriptor, NULL},
    {&grpc__health__v1__health_check_request__descriptor, NULL},
    {&grpc__health__v1__health_check_response__descriptor, NULL},
    {&k3pd__v1__prepare_resume_request__descriptor, v_prepare_resume},
    {&k3pd__v1__prepare_resume_response__descriptor, NULL},
    {&k3pd__v1__export_request__descriptor, v_export},
    {&k3pd__v1__export_response__descriptor, NULL},
};
#define N_MSGS (sizeof MSGS / sizeof MSGS[0])

/* 1 when m or a message inside it kept unknown fields. */
static int has_unknown(const ProtobufCMessage *m) {
  if (!m) return 0;
  if (m->n_unknown_fields) return 1;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) { /* a union: only the selected member is there */
      uint32_t which;
      memcpy(&which, (const char *)m + f->quantifier_offset, sizeof which);
      if (which != f->id) continue;
    }
    const char *base = (const char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n;
      memcpy(&n, (const char *)m + f->quantifier_offset, sizeof n);
      ProtobufCMessage *const *v;
      memcpy(&v, base, sizeof v);
      for (size_t k = 0; k < n; k++)
        if (has_unknown(v[k])) return 1;
    } else {
      const ProtobufCMessage *sub;
      memcpy(&sub, base, sizeof sub);
      if (has_unknown(sub)) return 1;
    }
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t which = data[0] % N_MSGS;
  const ProtobufCMessageDescriptor *d = MSGS[which].d;
  data++;
  size--;
  char path[256];
  path[0] = 0;
  int nul = rpc_wire_find_nul(d, data, size, path, sizeof path);
  if (nul && !memchr(path, 0, sizeof path)) abort();
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size, data);
  if (!m) return 0;
  if (MSGS[which].v) {
    char msg[512];
    k3_rpc_limits_t lim = {.vocab_size = 4096, .max_new_tokens = 128, .max_prompt_tokens = 1024,
                           .max_prompt_bytes = 4096, .model_name = "tiny"};
    msg[0] = 1;
    if (MSGS[which].v(m, NULL, msg, sizeof msg) && !memchr(msg, 0, sizeof msg)) abort();
    if (MSGS[which].v(m, &lim, msg, sizeof msg) && !memchr(msg, 0, sizeof msg)) abort();
  }
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) abort();
  if (protobuf_c_message_pack(m, buf) != n) abort();
  /* What we pack must parse again. Not checked for messages carrying unknown fields: protobuf-c
   * keeps them, in nested messages too, and re-emits them imperfectly (a field number 0,
   * accepted when unpacking, is written back as a tag it then refuses); k3pd never re-sends a
   * message it received. */
  if (!has_unknown(m)) {
    ProtobufCMessage *again = protobuf_c_message_unpack(d, NULL, n, buf);
    if (!again || protobuf_c_message_get_packed_size(again) != n) abort();
    protobuf_c_message_free_unpacked(again, NULL);
  }
  free(buf);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
