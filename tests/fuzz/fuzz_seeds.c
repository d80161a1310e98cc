/* Seed corpora for fuzz_rpc and fuzz_xfer, made with the real encoders (so no binary seeds are
 * committed and they never drift from the code): `k3pd-fuzz-seeds rpc DIR` writes one valid
 * message of every RPC type (the selector byte first, in fuzz_rpc.c's table order), `k3pd-fuzz-
 * seeds xfer DIR` a DONE, LAYER, ACK, DATA header and a reservation descriptor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "k3pd/v1/cluster.pb-c.h"
#include "k3pd/v1/decode.pb-c.h"
#include "k3pd/v1/generation.pb-c.h"
#include "k3pd/v1/prefill.pb-c.h"
#include "k3pd/xfer_desc.h"
#include "wire.h"

static int put(const char *dir, int idx, const uint8_t *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/seed-%02d", dir, idx);
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  uint8_t sel = (uint8_t)idx;
  int bad = fwrite(&sel, 1, 1, f) != 1 || (len && fwrite(data, 1, len, f) != len);
  return fclose(f) || bad;
}

static int put_msg(const char *dir, int idx, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n ? n : 1);
  if (!b) return 1;
  protobuf_c_message_pack(m, b);
  int rc = put(dir, idx, b, n);
  free(b);
  return rc;
}

static int rpc_seeds(const char *dir) {
  int rc = 0, i = 0;
  K3pd__V1__SamplingParams sp = K3PD__V1__SAMPLING_PARAMS__INIT;
  sp.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
  sp.temperature = 0.7f;
  sp.top_k = 20;
  sp.seed_opt_case = K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
  sp.seed = 42;
  K3pd__V1__StopConditions st = K3PD__V1__STOP_CONDITIONS__INIT;
  char *stops[] = {"\n\n", "END"};
  uint32_t stop_ids[] = {2, 7};
  st.max_new_tokens = 16;
  st.stop_strings = stops;
  st.n_stop_strings = 2;
  st.stop_token_ids = stop_ids;
  st.n_stop_token_ids = 2;
  K3pd__V1__ChatMessage m1 = K3PD__V1__CHAT_MESSAGE__INIT, m2 = K3PD__V1__CHAT_MESSAGE__INIT;
  m1.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_SYSTEM;
  m1.content = "be terse";
  m2.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_USER;
  m2.content = "hello \xe4\xb8\xad";
  K3pd__V1__ChatMessage *msgs[] = {&m1, &m2};
  K3pd__V1__ChatInput chat = K3PD__V1__CHAT_INPUT__INIT;
  chat.messages = msgs;
  chat.n_messages = 2;
  chat.add_generation_prompt = 1;
  K3pd__V1__GenerateRequest g = K3PD__V1__GENERATE_REQUEST__INIT;
  g.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_CHAT;
  g.chat = &chat;
  g.sampling = &sp;
  g.stop = &st;
  g.request_id = "req-1";
  rc |= put_msg(dir, i++, &g.base);
  uint32_t toks[] = {17, 250, 3001};
  K3pd__V1__TokenLogprob lp = K3PD__V1__TOKEN_LOGPROB__INIT, *lps[] = {&lp};
  lp.token_id = 17;
  lp.logprob = -0.5f;
  K3pd__V1__Usage us = K3PD__V1__USAGE__INIT;
  us.prompt_tokens = 3;
  us.completion_tokens = 1;
  K3pd__V1__Timings tm = K3PD__V1__TIMINGS__INIT;
  tm.total_us = 1000;
  K3pd__V1__GenerateResponse gr = K3PD__V1__GENERATE_RESPONSE__INIT;
  gr.token_ids = toks;
  gr.n_token_ids = 1;
  gr.text = "hi";
  gr.logprobs = lps;
  gr.n_logprobs = 1;
  gr.finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH;
  gr.usage = &us;
  gr.timings = &tm;
  gr.request_id = "req-1";
  rc |= put_msg(dir, i++, &gr.base);
  K3pd__V1__WorkerCapacity cap = K3PD__V1__WORKER_CAPACITY__INIT;
  cap.kv_pages = 64;
  cap.page_tokens = 16;
  cap.kda_slots = 4;
  cap.max_batch = 8;
  cap.max_context_tokens = 1024;
  K3pd__V1__WorkerLoad load = K3PD__V1__WORKER_LOAD__INIT;
  load.used_kv_pages = 3;
  uint8_t ucx[] = {1, 2, 3, 4, 5, 6, 7, 8};
  K3pd__V1__RegisterRequest reg = K3PD__V1__REGISTER_REQUEST__INIT;
  reg.role = K3PD__V1__ROLE__ROLE_DECODE;
  reg.worker_id = "decode-0";
  reg.grpc_address = "127.0.0.1:7001";
  reg.ucx_worker_address.data = ucx;
  reg.ucx_worker_address.len = sizeof ucx;
  reg.capacity = &cap;
  reg.load = &load;
  reg.model_fingerprint = 0xabcdef;
  reg.model_name = "tiny";
  reg.protocol_version = 1;
  reg.replaces_epoch = 77;
  rc |= put_msg(dir, i++, &reg.base);
  K3pd__V1__RegisterResponse rr = K3PD__V1__REGISTER_RESPONSE__INIT;
  rr.registration_epoch = 0x1234567890abcdefull;
  rr.heartbeat_interval_ms = 500;
  rr.router_id = "k3pd-router";
  rc |= put_msg(dir, i++, &rr.base);
  K3pd__V1__HeartbeatRequest hb = K3PD__V1__HEARTBEAT_REQUEST__INIT;
  hb.worker_id = "decode-0";
  hb.registration_epoch = 99;
  hb.load = &load;
  hb.draining = 1;
  rc |= put_msg(dir, i++, &hb.base);
  K3pd__V1__HeartbeatResponse hr = K3PD__V1__HEARTBEAT_RESPONSE__INIT;
  hr.reregister = 1;
  rc |= put_msg(dir, i++, &hr.base);
  K3pd__V1__DeregisterRequest de = K3PD__V1__DEREGISTER_REQUEST__INIT;
  de.worker_id = "decode-0";
  de.registration_epoch = 99;
  de.reason = "shutdown";
  rc |= put_msg(dir, i++, &de.base);
  K3pd__V1__DeregisterResponse dr = K3PD__V1__DEREGISTER_RESPONSE__INIT;
  dr.found = 1;
  rc |= put_msg(dir, i++, &dr.base);
  K3pd__V1__ReserveRequest rs = K3PD__V1__RESERVE_REQUEST__INIT;
  rs.request_id = "req-1";
  rs.n_prompt_tokens = 3;
  rs.max_new_tokens = 16;
  rs.lease_ms = 1000;
  rc |= put_msg(dir, i++, &rs.base);
  K3pd__V1__Reservation res = K3PD__V1__RESERVATION__INIT;
  res.request_id = "req-1";
  res.epoch = 5;
  res.descriptor.data = ucx;
  res.descriptor.len = sizeof ucx;
  res.n_pages = 2;
  rc |= put_msg(dir, i++, &res.base);
  K3pd__V1__ReleaseRequest rl = K3PD__V1__RELEASE_REQUEST__INIT;
  rl.request_id = "req-1";
  rl.epoch = 5;
  rc |= put_msg(dir, i++, &rl.base);
  K3pd__V1__ReleaseResponse rlr = K3PD__V1__RELEASE_RESPONSE__INIT;
  rlr.released = 1;
  rc |= put_msg(dir, i++, &rlr.base);
  K3pd__V1__AttachRequest at = K3PD__V1__ATTACH_REQUEST__INIT;
  at.request_id = "req-1";
  at.epoch = 5;
  at.sampling = &sp;
  at.stop = &st;
  at.return_logprobs = 1;
  rc |= put_msg(dir, i++, &at.base);
  K3pd__V1__AttachResponse ar = K3PD__V1__ATTACH_RESPONSE__INIT;
  ar.token_ids = toks;
  ar.n_token_ids = 3;
  ar.logprobs = lps;
  ar.n_logprobs = 1;
  ar.first_index = 1;
  ar.timings = &tm;
  rc |= put_msg(dir, i++, &ar.base);
  K3pd__V1__StatsRequest sr = K3PD__V1__STATS_REQUEST__INIT;
  rc |= put_msg(dir, i++, &sr.base);
  K3pd__V1__StatsResponse ss = K3PD__V1__STATS_RESPONSE__INIT;
  ss.total_kv_pages = 64;
  ss.admitted = 3;
  rc |= put_msg(dir, i++, &ss.base);
  K3pd__V1__PrefillRequest pr = K3PD__V1__PREFILL_REQUEST__INIT;
  pr.request_id = "req-1";
  pr.epoch = 5;
  pr.token_ids = toks;
  pr.n_token_ids = 3;
  pr.sampling = &sp;
  pr.reservation.data = ucx;
  pr.reservation.len = sizeof ucx;
  pr.decode_ucx_address.data = ucx;
  pr.decode_ucx_address.len = sizeof ucx;
  pr.decode_worker_id = "decode-0";
  rc |= put_msg(dir, i++, &pr.base);
  K3pd__V1__PrefillResponse prr = K3PD__V1__PREFILL_RESPONSE__INIT;
  prr.first_token = 17;
  prr.timings = &tm;
  prr.seed = 42;
  rc |= put_msg(dir, i++, &prr.base);
  K3pd__V1__AbortRequest ab = K3PD__V1__ABORT_REQUEST__INIT;
  ab.request_id = "req-1";
  rc |= put_msg(dir, i++, &ab.base);
  K3pd__V1__AbortResponse abr = K3PD__V1__ABORT_RESPONSE__INIT;
  abr.found = 1;
  rc |= put_msg(dir, i++, &abr.base);
  Grpc__Health__V1__HealthCheckRequest hq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hq.service = "k3pd.v1.Decode";
  rc |= put_msg(dir, i++, &hq.base);
  Grpc__Health__V1__HealthCheckResponse hs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  hs.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  rc |= put_msg(dir, i++, &hs.base);
  static uint8_t rdesc[40]; /* stands for a receive descriptor (opaque here) */
  for (int k = 0; k < 40; k++) rdesc[k] = (uint8_t)(k * 3);
  K3pd__V1__PrepareResumeRequest prq = K3PD__V1__PREPARE_RESUME_REQUEST__INIT;
  prq.request_id = "req-1";
  prq.epoch = 9;
  prq.n_tokens = 960;
  prq.resume_tokens = 256;
  prq.lease_ms = 30000;
  prq.fingerprint = 0x1234abcdULL;
  rc |= put_msg(dir, i++, &prq.base);
  K3pd__V1__PrepareResumeResponse prs = K3PD__V1__PREPARE_RESUME_RESPONSE__INIT;
  prs.descriptor.data = rdesc;
  prs.descriptor.len = sizeof rdesc;
  prs.epoch = 11;
  rc |= put_msg(dir, i++, &prs.base);
  K3pd__V1__ExportRequest exq = K3PD__V1__EXPORT_REQUEST__INIT;
  exq.request_id = "req-1";
  exq.epoch = 9;
  exq.descriptor.data = rdesc;
  exq.descriptor.len = sizeof rdesc;
  rc |= put_msg(dir, i++, &exq.base);
  K3pd__V1__ExportResponse exs = K3PD__V1__EXPORT_RESPONSE__INIT;
  exs.bytes_transferred = 289792;
  exs.tokens = 256;
  rc |= put_msg(dir, i++, &exs.base);
  return rc;
}

static int xfer_seeds(const char *dir) {
  int rc = 0;
  uint8_t addr[40];
  for (int k = 0; k < 40; k++) addr[k] = (uint8_t)(k * 5);
  uint64_t dg[3] = {1, 2, 3};
  size_t n;
  xf_done_t d = {.request_id = 9, .epoch = 5, .fingerprint = 0xabc, .send_id = 1, .first_token = 17, .n_digests = 3,
                 .addr_len = sizeof addr, .addr = addr};
  uint8_t *b = xf_done_encode(&d, dg, &n);
  rc |= !b || put(dir, 0, b, n);
  free(b);
  xf_layer_t l = {.request_id = 9, .epoch = 5, .fingerprint = 0xabc, .send_id = 1, .layer = 2, .n_digests = 3,
                  .n_layers = 2};
  b = xf_layer_encode(&l, dg, &n);
  rc |= !b || put(dir, 1, b, n);
  free(b);
  xf_layer_t ld = {.request_id = 9, .epoch = 5, .fingerprint = 0xabc, .send_id = 1, .layer = 0, .n_digests = 0,
                   .n_layers = 93, .flags = XF_MSG_FLAG_LANDED};
  b = xf_layer_encode(&ld, NULL, &n);
  rc |= !b || put(dir, 8, b, n); /* selector 8 % 7 = 1: LAYER */
  free(b);
  xf_ack_t a = {.request_id = 9, .epoch = 5, .send_id = 1, .status = -22};
  b = xf_ack_encode(&a, &n);
  rc |= !b || put(dir, 2, b, n);
  free(b);
  uint8_t h[XF_DATA_HDR];
  xf_data_t dh = {.request_id = 9, .epoch = 5, .region = 2, .offset = 4096};
  xf_data_encode(&dh, h);
  rc |= put(dir, 3, h, sizeof h);
  /* a descriptor like a decode worker's: a page pool with an rkey, a slot pool with a blob */
  k3_xfer_desc_t *x = k3_xfer_desc_new();
  if (!x) return 1;
  x->request_id = 9;
  x->epoch = 5;
  x->lease_expiry_ms = 1700000000000;
  x->fingerprint = 0xabc;
  x->worker_addr_len = sizeof addr;
  x->worker_addr = malloc(sizeof addr);
  x->n_pools = 2;
  x->pools[0] = (k3_xfer_pool_desc_t){.base_addr = 0x7f0000000000ull, .size_bytes = 1000 * 2048, .rkey_len = 12,
                                      .rkey = malloc(12)};
  x->pools[1] = (k3_xfer_pool_desc_t){.base_addr = 0x7f1000000000ull, .size_bytes = 40 * 8960,
                                      .mem = K3_XFER_MEM_CUDA, .blob_len = 8, .blob = malloc(8)};
  x->n_lists = 2;
  x->lists[0].n = 3;
  x->lists[0].idx = malloc(3 * sizeof(uint32_t));
  x->lists[1].n = 1;
  x->lists[1].idx = malloc(sizeof(uint32_t));
  x->n_regions = 3;
  x->regions = calloc(3, sizeof *x->regions);
  if (!x->worker_addr || !x->pools[0].rkey || !x->pools[1].blob || !x->lists[0].idx || !x->lists[1].idx ||
      !x->regions) {
    k3_xfer_desc_free(x);
    return 1;
  }
  memcpy(x->worker_addr, addr, sizeof addr);
  memset(x->pools[0].rkey, 0xa0, 12);
  memcpy(x->pools[1].blob, "fd 7 360", 8);
  x->lists[0].idx[0] = 5;
  x->lists[0].idx[1] = 6;
  x->lists[0].idx[2] = 999;
  x->lists[1].idx[0] = 39;
  x->regions[0] = (k3_xfer_region_t){K3_XFER_KIND_MLA_KV, 0, 0, 0, 1024, 2048, 1024, 2 * 1024 + 64};
  x->regions[1] = (k3_xfer_region_t){K3_XFER_KIND_KDA_S, 1, 1, 0, 4480, 8960, 4096, 4096};
  x->regions[2] = (k3_xfer_region_t){K3_XFER_KIND_KDA_CONV, 1, 1, 1, 8576, 8960, 384, 384};
  char err[256];
  uint8_t *enc;
  if (k3_xfer_desc_validate(x, err, sizeof err) || k3_xfer_desc_encode(x, &enc, &n)) {
    fprintf(stderr, "fuzz seeds: descriptor: %s\n", err);
    rc = 1;
  } else {
    rc |= put(dir, 4, enc, n) || put(dir, 5, enc, n);
    /* SRC (cuda-pull): the same descriptor as the sender's sources */
    size_t sn;
    uint8_t *sb = xf_src_encode(1, enc, (uint32_t)n, &sn);
    rc |= !sb || put(dir, 6, sb, sn);
    free(sb);
    free(enc);
  }
  k3_xfer_desc_free(x);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "rpc") && strcmp(argv[1], "xfer"))) {
    fprintf(stderr, "usage: k3pd-fuzz-seeds rpc|xfer DIR\n");
    return 2;
  }
  int rc = strcmp(argv[1], "rpc") == 0 ? rpc_seeds(argv[2]) : xfer_seeds(argv[2]);
  if (rc) fprintf(stderr, "k3pd-fuzz-seeds: cannot write the %s seeds into %s\n", argv[1], argv[2]);
  return rc ? 1 : 0;
}
