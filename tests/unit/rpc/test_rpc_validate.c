/* k3_rpc_validate_*: every rule answers K3_EINVAL with a message that starts with the field
 * path; valid requests pass. Also the UTF-8 checker and protobuf round trips through the
 * generated k3_proto code (unknown enum values survive unpack, so validation must catch them). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/xfer_desc.h"

static char msg[256];

#define EXPECT_BAD(call, prefix)                                                  \
  do {                                                                            \
    msg[0] = 0;                                                                   \
    ck_assert_int_eq((call), K3_EINVAL);                                          \
    ck_assert_msg(strncmp(msg, prefix, strlen(prefix)) == 0, "got \"%s\", want prefix \"%s\"", msg, prefix); \
  } while (0)

START_TEST(test_utf8) {
  ck_assert(k3_rpc_utf8_valid("hello", 5));
  ck_assert(k3_rpc_utf8_valid("h\xc3\xa9llo \xe4\xb8\xad \xf0\x9f\x98\x80", 15));
  ck_assert(!k3_rpc_utf8_valid("\xc3", 1));              /* truncated */
  ck_assert(!k3_rpc_utf8_valid("\xe4\xb8", 2));          /* truncated */
  ck_assert(!k3_rpc_utf8_valid("\xc0\xaf", 2));          /* overlong */
  ck_assert(!k3_rpc_utf8_valid("\xed\xa0\x80", 3));      /* surrogate */
  ck_assert(!k3_rpc_utf8_valid("\xf4\x90\x80\x80", 4));  /* > U+10FFFF */
  ck_assert(!k3_rpc_utf8_valid("\xff", 1));
  ck_assert(!k3_rpc_utf8_valid("a\x80", 2));
}
END_TEST

START_TEST(test_generate) {
  K3pd__V1__GenerateRequest r = K3PD__V1__GENERATE_REQUEST__INIT;
  K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
  K3pd__V1__SamplingParams sp = K3PD__V1__SAMPLING_PARAMS__INIT;
  k3_rpc_limits_t lim = {.vocab_size = 1000, .max_new_tokens = 4096, .max_prompt_tokens = 8,
                         .max_prompt_bytes = 64, .model_name = "tiny"};
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "input: one of");
  r.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TEXT;
  r.text = "";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "text: must not be empty");
  r.text = "bad \xff utf8";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "text: invalid UTF-8");
  r.text = "Hello there";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "stop: required");
  r.stop = &stop;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "stop.max_new_tokens: must be >= 1");
  stop.max_new_tokens = 100000;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "stop.max_new_tokens: 100000 exceeds");
  stop.max_new_tokens = 16;
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), 0);
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), 0);

  r.sampling = &sp;
  sp.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
  sp.temperature = -0.5f;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "sampling.temperature:");
  sp.temperature = 0.0f; /* greedy is valid */
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), 0);
  sp.top_p_opt_case = K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P;
  sp.top_p = 0.0f;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "sampling.top_p:");
  sp.top_p = 0.9f;
  sp.top_k = -1;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "sampling.top_k:");
  sp.top_k = 40;
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), 0);

  char *stops[] = {"END", ""};
  stop.stop_strings = stops;
  stop.n_stop_strings = 2;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "stop.stop_strings[1]: must not be empty");
  stop.n_stop_strings = 1;
  uint32_t sids[] = {5, 1000};
  stop.stop_token_ids = sids;
  stop.n_stop_token_ids = 2;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "stop.stop_token_ids[1]:");
  stop.n_stop_token_ids = 1;

  r.request_id = "has space";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "request_id:");
  r.request_id = "ok-1";
  r.model = "other";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "model: unknown model");
  r.model = "tiny";
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), 0);

  /* token ids */
  K3pd__V1__TokenIds ids = K3PD__V1__TOKEN_IDS__INIT;
  uint32_t v[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  r.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
  r.token_ids = &ids;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "token_ids.ids: must not be empty");
  ids.ids = v;
  ids.n_ids = 9;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "token_ids.ids: 9 tokens exceed");
  ids.n_ids = 3;
  v[2] = 5000;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), "token_ids.ids[2]: token id 5000");
  v[2] = 3;
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, &lim, msg, sizeof msg), 0);
}
END_TEST

START_TEST(test_chat) {
  K3pd__V1__GenerateRequest r = K3PD__V1__GENERATE_REQUEST__INIT;
  K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
  K3pd__V1__ChatInput chat = K3PD__V1__CHAT_INPUT__INIT;
  K3pd__V1__ChatMessage m0 = K3PD__V1__CHAT_MESSAGE__INIT, m1 = K3PD__V1__CHAT_MESSAGE__INIT;
  K3pd__V1__ChatMessage *ms[] = {&m0, &m1};
  stop.max_new_tokens = 4;
  r.stop = &stop;
  r.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_CHAT;
  r.chat = &chat;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), "chat.messages: must not be empty");
  chat.messages = ms;
  chat.n_messages = 2;
  m0.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_SYSTEM;
  m0.content = "be brief";
  m1.role = 7; /* what protobuf-c leaves for an unknown wire value */
  m1.content = "hi";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), "chat.messages[1].role: unknown enum value 7");
  m1.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_UNSPECIFIED;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), "chat.messages[1].role: required");
  m1.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_TOOL;
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), "chat.messages[1].tool_call_id: required");
  m1.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_USER;
  m1.content = "\xc3";
  EXPECT_BAD(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), "chat.messages[1].content: invalid UTF-8");
  m1.content = "hi";
  ck_assert_int_eq(k3_rpc_validate_generate_request(&r, NULL, msg, sizeof msg), 0);

  /* An unknown enum value survives a real pack/unpack round trip, so validation must see it. */
  size_t n = protobuf_c_message_get_packed_size(&r.base);
  uint8_t *buf = malloc(n);
  ck_assert_ptr_nonnull(buf);
  m1.role = 9;
  n = protobuf_c_message_get_packed_size(&r.base);
  buf = realloc(buf, n);
  protobuf_c_message_pack(&r.base, buf);
  K3pd__V1__GenerateRequest *u = k3pd__v1__generate_request__unpack(NULL, n, buf);
  ck_assert_ptr_nonnull(u);
  EXPECT_BAD(k3_rpc_validate_generate_request(u, NULL, msg, sizeof msg), "chat.messages[1].role: unknown enum value 9");
  k3pd__v1__generate_request__free_unpacked(u, NULL);
  free(buf);
}
END_TEST

START_TEST(test_cluster_decode_prefill) {
  K3pd__V1__RegisterRequest reg = K3PD__V1__REGISTER_REQUEST__INIT;
  K3pd__V1__WorkerCapacity cap = K3PD__V1__WORKER_CAPACITY__INIT;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "role: required");
  reg.role = 5;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "role: unknown enum value 5");
  reg.role = K3PD__V1__ROLE__ROLE_DECODE;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "worker_id: required");
  reg.worker_id = "decode-0";
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "grpc_address: required");
  reg.grpc_address = "127.0.0.1:7001";
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "model_fingerprint: required");
  reg.grpc_address = "127.0.0.1:70 01";
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "grpc_address: byte 12 is not printable");
  reg.grpc_address = "127.0.0.1:7001";
  reg.model_fingerprint = 0x1234;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "protocol_version:");
  reg.protocol_version = 1;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity: required");
  reg.capacity = &cap;
  cap.max_batch = 8;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.kv_pages:");
  cap.kv_pages = 64;
  cap.page_tokens = 16;
  cap.kda_slots = 4;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.max_context_tokens: must be >= 1");
  cap.max_context_tokens = 64 * 16 + 1; /* more than the pool holds */
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.max_context_tokens: 1025 exceeds");
  cap.max_context_tokens = 64 * 16;
  /* claimed capacities are bounded (the fake worker claimed 10^6 pages of a huge context) */
  cap.kv_pages = K3_RPC_MAX_KV_PAGES + 1;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.kv_pages: 16777217 exceeds the limit");
  cap.kv_pages = 64;
  cap.kda_slots = K3_RPC_MAX_KDA_SLOTS + 1;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.kda_slots:");
  cap.kda_slots = 4;
  cap.max_batch = K3_RPC_MAX_BATCH + 1;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.max_batch:");
  cap.max_batch = 8;
  cap.page_tokens = K3_RPC_MAX_PAGE_TOKENS + 1;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "capacity.page_tokens:");
  cap.page_tokens = 16;
  EXPECT_BAD(k3_rpc_validate_register_request(&reg, msg, sizeof msg), "ucx_worker_address: required");
  uint8_t addr[4] = {1, 2, 3, 4};
  reg.ucx_worker_address.data = addr;
  reg.ucx_worker_address.len = 4;
  ck_assert_int_eq(k3_rpc_validate_register_request(&reg, msg, sizeof msg), 0);

  K3pd__V1__HeartbeatRequest hb = K3PD__V1__HEARTBEAT_REQUEST__INIT;
  hb.worker_id = "decode-0";
  EXPECT_BAD(k3_rpc_validate_heartbeat_request(&hb, msg, sizeof msg), "load: required");

  K3pd__V1__ReserveRequest rs = K3PD__V1__RESERVE_REQUEST__INIT;
  rs.request_id = "r1";
  rs.n_prompt_tokens = 3;
  rs.max_new_tokens = 2;
  EXPECT_BAD(k3_rpc_validate_reserve_request(&rs, msg, sizeof msg), "lease_ms: must be >= 1");
  rs.lease_ms = 500;
  ck_assert_int_eq(k3_rpc_validate_reserve_request(&rs, msg, sizeof msg), 0);

  K3pd__V1__AttachRequest at = K3PD__V1__ATTACH_REQUEST__INIT;
  at.request_id = "r1";
  EXPECT_BAD(k3_rpc_validate_attach_request(&at, NULL, msg, sizeof msg), "stop: required");

  K3pd__V1__PrefillRequest pf = K3PD__V1__PREFILL_REQUEST__INIT;
  uint32_t toks[] = {1, 2};
  pf.request_id = "r1";
  EXPECT_BAD(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), "token_ids: must not be empty");
  pf.token_ids = toks;
  pf.n_token_ids = 2;
  EXPECT_BAD(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), "reservation: required");
  pf.reservation.data = addr;
  pf.reservation.len = 4;
  ck_assert_int_eq(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), 0); /* address optional */
  pf.decode_ucx_address.data = addr;
  pf.decode_ucx_address.len = K3_XFER_MAX_ADDR_BYTES + 1;
  EXPECT_BAD(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), "decode_ucx_address: longer than");
  pf.decode_ucx_address.len = 4;
  ck_assert_int_eq(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), 0);
  pf.resume_tokens = 2;
  EXPECT_BAD(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), "resume_tokens: must be < the number");
  pf.resume_tokens = 0;
  pf.resumed = 1;
  EXPECT_BAD(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), "resumed: set without resume_tokens");
  pf.resume_tokens = 1;
  ck_assert_int_eq(k3_rpc_validate_prefill_request(&pf, NULL, msg, sizeof msg), 0);

  K3pd__V1__PrepareResumeRequest pr = K3PD__V1__PREPARE_RESUME_REQUEST__INIT;
  pr.request_id = "r1";
  EXPECT_BAD(k3_rpc_validate_prepare_resume_request(&pr, msg, sizeof msg), "n_tokens: must be >= 1");
  pr.n_tokens = 128;
  pr.resume_tokens = 128;
  EXPECT_BAD(k3_rpc_validate_prepare_resume_request(&pr, msg, sizeof msg), "resume_tokens: must be >= 1 and <");
  pr.resume_tokens = 64;
  EXPECT_BAD(k3_rpc_validate_prepare_resume_request(&pr, msg, sizeof msg), "lease_ms: must be >= 1");
  pr.lease_ms = 1000;
  EXPECT_BAD(k3_rpc_validate_prepare_resume_request(&pr, msg, sizeof msg), "fingerprint: required");
  pr.fingerprint = 0x1234;
  ck_assert_int_eq(k3_rpc_validate_prepare_resume_request(&pr, msg, sizeof msg), 0);

  K3pd__V1__ExportRequest ex = K3PD__V1__EXPORT_REQUEST__INIT;
  ex.request_id = "r1";
  EXPECT_BAD(k3_rpc_validate_export_request(&ex, msg, sizeof msg), "epoch: required");
  ex.epoch = 7;
  EXPECT_BAD(k3_rpc_validate_export_request(&ex, msg, sizeof msg), "descriptor: required");
  ex.descriptor.data = addr;
  ex.descriptor.len = 4;
  ck_assert_int_eq(k3_rpc_validate_export_request(&ex, msg, sizeof msg), 0);

  K3pd__V1__AbortRequest ab = K3PD__V1__ABORT_REQUEST__INIT;
  EXPECT_BAD(k3_rpc_validate_abort_request(&ab, msg, sizeof msg), "request_id: required");
  K3pd__V1__ReleaseRequest rl = K3PD__V1__RELEASE_REQUEST__INIT;
  rl.request_id = "r1";
  ck_assert_int_eq(k3_rpc_validate_release_request(&rl, msg, sizeof msg), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_validate");
  TCase *tc = tcase_create("validate");
  tcase_add_test(tc, test_utf8);
  tcase_add_test(tc, test_generate);
  tcase_add_test(tc, test_chat);
  tcase_add_test(tc, test_cluster_decode_prefill);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
