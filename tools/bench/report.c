/* k3pd-bench report: turns the per-request records into percentiles, prints the human table and
 * appends the machine-readable JSON line.
 *
 * Not here: collecting anything. Only measured requests count; a request is "ok" when its
 * stream ended OK with a final chunk (finish reason set).
 *
 * Router decomposition (per ok request, from the final chunk's Timings, all µs):
 *   queue    = arrival → Reserve answered (a router→decode round trip plus decode's work)
 *   prefill  = the Prefill RPC as the router saw it (prefill queue + compute + state push +
 *              DONE; the handoff happens inside it, so it is not subtracted again: the final
 *              chunk's handoff_us is decode's reserve→ready interval, which overlaps prefill)
 *   decode   = first token relayed → final chunk
 *   internal = total − queue − prefill − decode: router time between Reserve and Prefill
 *              start plus the gap between the Prefill reply and the first token reaching the
 *              router (negative when the first token overtakes the Prefill reply); the
 *              latter is mostly the decode worker emitting the first token between
 *              engine steps, not router CPU (docs/perf-cluster.md, finding 1)
 *   edge     = client-observed end-to-end − total: the client→router hop, the router's intake
 *              before its clock starts (unpack, validate, tokenise) and the final chunk's return
 *   overhead = internal + edge: an upper bound of the latency the router adds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/rpc.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bn_percentile(double *v, size_t n, double p) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, cmp_double);
  double pos = p / 100.0 * (double)(n - 1);
  size_t i = (size_t)pos;
  if (i + 1 >= n) return v[n - 1];
  double f = pos - (double)i;
  return v[i] + (v[i + 1] - v[i]) * f;
}

typedef struct {
  size_t n;
  double p50, p90, p99, mean, max;
} summ_t;

static summ_t summarize(double *v, size_t n) {
  summ_t s = {.n = n, .p50 = NAN, .p90 = NAN, .p99 = NAN, .mean = NAN, .max = NAN};
  if (!n) return s;
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  s.mean = sum / (double)n;
  s.p50 = bn_percentile(v, n, 50);
  s.p90 = bn_percentile(v, n, 90);
  s.p99 = bn_percentile(v, n, 99);
  s.max = v[n - 1];
  return s;
}

enum { S_TTFT, S_ITL, S_TPOT, S_E2E, S_OVERHEAD, S_INTERNAL, S_EDGE, S_QUEUE, S_PREFILL, S_HANDOFF, S_DECODE, S_N };
static const char *const s_names[S_N] = {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "router_overhead_us",
                                         "router_internal_us", "router_edge_us", "queue_us", "prefill_us",
                                         "handoff_us", "decode_us"};

typedef struct {
  size_t sent, ok;
  uint64_t errors[18]; /* by gRPC code 0..16; [17] = never started */
  uint64_t incomplete; /* OK without a final chunk */
  double wall_s;
  uint64_t out_tokens, prompt_tokens, decode_tokens;
  double prefill_s_sum, decode_s_sum;
  summ_t s[S_N];
} agg_t;

static int aggregate(const bn_run_t *run, agg_t *a) {
  memset(a, 0, sizeof *a);
  size_t n = run->n_res;
  double *buf[S_N] = {0};
  size_t cnt[S_N] = {0};
  for (int k = 0; k < S_N; k++) {
    if (k == S_ITL) continue;
    buf[k] = malloc((n ? n : 1) * sizeof(double));
    if (!buf[k]) {
      for (int j = 0; j < k; j++) free(buf[j]);
      return K3_ENOMEM;
    }
  }
  a->sent = n;
  a->wall_s = (double)(run->t_end - run->t_begin) / 1e9;
  for (size_t i = 0; i < n; i++) {
    const bn_result_t *x = &run->res[i];
    if (x->code < 0) {
      a->errors[17]++;
      continue;
    }
    if (x->code != K3_RPC_OK) {
      a->errors[x->code <= 16 ? x->code : K3_RPC_UNKNOWN]++;
      continue;
    }
    if (!x->complete) {
      a->incomplete++;
      continue;
    }
    a->ok++;
    a->out_tokens += x->n_tokens;
    a->prompt_tokens += x->prompt_tokens;
    double e2e_us = (double)(x->t_end - x->t_start) / 1e3;
    buf[S_E2E][cnt[S_E2E]++] = e2e_us / 1e3;
    if (x->t_first) buf[S_TTFT][cnt[S_TTFT]++] = (double)(x->t_first - x->t_start) / 1e6;
    if (x->t_first && x->n_tokens > 1)
      buf[S_TPOT][cnt[S_TPOT]++] = (double)(x->t_end - x->t_first) / 1e6 / (double)(x->n_tokens - 1);
    if (x->have_timings) {
      double internal = (double)x->total_us - (double)x->queue_us - (double)x->prefill_us - (double)x->decode_us;
      double edge = e2e_us - (double)x->total_us;
      buf[S_INTERNAL][cnt[S_INTERNAL]++] = internal;
      buf[S_EDGE][cnt[S_EDGE]++] = edge;
      buf[S_OVERHEAD][cnt[S_OVERHEAD]++] = internal + edge;
      buf[S_QUEUE][cnt[S_QUEUE]++] = (double)x->queue_us;
      buf[S_PREFILL][cnt[S_PREFILL]++] = (double)x->prefill_us;
      buf[S_HANDOFF][cnt[S_HANDOFF]++] = (double)x->handoff_us;
      buf[S_DECODE][cnt[S_DECODE]++] = (double)x->decode_us;
      a->prefill_s_sum += (double)x->prefill_us / 1e6;
      if (x->n_tokens > 1) {
        a->decode_s_sum += (double)x->decode_us / 1e6;
        a->decode_tokens += x->n_tokens - 1;
      }
    }
  }
  for (int k = 0; k < S_N; k++) {
    if (k == S_ITL) {
      double *v = malloc((run->itl_ms.n ? run->itl_ms.n : 1) * sizeof *v);
      if (!v) {
        for (int j = 0; j < S_N; j++) free(buf[j]);
        return K3_ENOMEM;
      }
      memcpy(v, run->itl_ms.v, run->itl_ms.n * sizeof *v);
      a->s[k] = summarize(v, run->itl_ms.n);
      free(v);
    } else {
      a->s[k] = summarize(buf[k], cnt[k]);
      free(buf[k]);
    }
  }
  return 0;
}

static double per_s(double x, double s) { return s > 0 ? x / s : NAN; }

static void print_row(const char *name, const summ_t *s, double scale) {
  if (!s->n) {
    printf("  %-26s %10s\n", name, "-");
    return;
  }
  printf("  %-26s %10.3f %10.3f %10.3f %10.3f %10.3f %7zu\n", name, s->p50 * scale, s->p90 * scale,
         s->p99 * scale, s->mean * scale, s->max * scale, s->n);
}

void bn_report_print(const bn_report_in_t *in, const bn_run_t *run) {
  agg_t a;
  if (aggregate(run, &a)) {
    fprintf(stderr, "k3pd-bench: out of memory building the report\n");
    return;
  }
  const bn_load_opts_t *o = in->load;
  printf("k3pd-bench%s%s: router %s, %s", in->label ? " " : "", in->label ? in->label : "", o->router,
         o->rate > 0 ? "open loop" : "closed loop");
  if (o->rate > 0) printf(" %.2f req/s (Poisson)", o->rate);
  else printf(" concurrency %d", o->concurrency);
  printf(", prompt %s%s, output %s, %s", in->w->n_texts ? "text from file" : in->prompt_len_spec,
         in->w->n_texts ? "" : " tokens", in->output_len_spec,
         in->w->temperature > 0 ? "sampled" : "greedy");
  printf(", warm-up %llu\n", (unsigned long long)o->warmup);
  printf("  requests: %zu sent, %zu ok", a.sent, a.ok);
  for (int c = 1; c <= 16; c++)
    if (a.errors[c]) printf(", %llu %s", (unsigned long long)a.errors[c], k3_rpc_code_name(c));
  if (a.errors[17]) printf(", %llu not started", (unsigned long long)a.errors[17]);
  if (a.incomplete) printf(", %llu without final chunk", (unsigned long long)a.incomplete);
  if (run->dropped) printf(", %llu dropped (max in flight)", (unsigned long long)run->dropped);
  printf(" in %.3f s\n", a.wall_s);
  printf("  throughput: %.2f req/s, %.1f output tokens/s, %.1f prompt tokens/s\n", per_s((double)a.ok, a.wall_s),
         per_s((double)a.out_tokens, a.wall_s), per_s((double)a.prompt_tokens, a.wall_s));
  printf("  %-26s %10s %10s %10s %10s %10s %7s\n", "latency", "p50", "p90", "p99", "mean", "max", "n");
  print_row("TTFT (ms)", &a.s[S_TTFT], 1);
  print_row("inter-token (ms)", &a.s[S_ITL], 1);
  print_row("time per output tok (ms)", &a.s[S_TPOT], 1);
  print_row("end-to-end (ms)", &a.s[S_E2E], 1);
  print_row("router overhead (us)", &a.s[S_OVERHEAD], 1);
  print_row("  internal (us)", &a.s[S_INTERNAL], 1);
  print_row("  edge (us)", &a.s[S_EDGE], 1);
  print_row("queue/reserve (us)", &a.s[S_QUEUE], 1);
  print_row("prefill rpc (us)", &a.s[S_PREFILL], 1);
  print_row("decode (us)", &a.s[S_DECODE], 1);
  printf("  cluster per-request rates: prefill %.1f tokens/s, decode %.1f tokens/s per sequence\n",
         per_s((double)a.prompt_tokens, a.prefill_s_sum), per_s((double)a.decode_tokens, a.decode_s_sum));
  const bn_monoperf_t *mp = in->mono_perf;
  if (mp) {
    int b = 0;
    double step = o->rate > 0 ? 0 : bn_monoperf_step(mp, o->concurrency, &b);
    printf("  vs monolithic (k3pd-generate --perf on the same device):\n");
    if (mp->prefill_ms > 0 && a.s[S_TTFT].n)
      printf("    TTFT p50 %.3f ms vs its prefill of %lld tokens %.3f ms = %.3fx\n", a.s[S_TTFT].p50,
             mp->prefill_tokens, mp->prefill_ms, a.s[S_TTFT].p50 / mp->prefill_ms);
    if (step > 0 && a.s[S_ITL].n)
      printf("    inter-token p50 %.3f ms vs its decode step at batch %d %.3f ms = %.3fx (mean %.3f ms = %.3fx)\n",
             a.s[S_ITL].p50, b, step, a.s[S_ITL].p50 / step, a.s[S_ITL].mean, a.s[S_ITL].mean / step);
    else if (a.s[S_ITL].n)
      printf("    inter-token: no monolithic decode figure at this concurrency\n");
  }
  const bn_mono_t *m = in->mono;
  if (m) {
    printf("  monolithic k3pd-generate (sequential, %llu runs, %llu failed): prefill %.1f tokens/s, decode %.1f "
           "tokens/s, %.1f output tokens/s excluding model load (%.1f including process start)\n",
           (unsigned long long)m->runs, (unsigned long long)m->failures,
           per_s((double)m->prompt_tokens, (double)m->prefill_ns / 1e9),
           per_s((double)m->decode_steps, (double)m->decode_ns / 1e9),
           per_s((double)m->completion_tokens, (double)(m->prefill_ns + m->decode_ns) / 1e9),
           per_s((double)m->completion_tokens, (double)m->wall_ns / 1e9));
    if (in->verified)
      printf("  verify: %llu of %llu requests identical to k3pd-generate%s%s\n",
             (unsigned long long)(m->checked - m->mismatches), (unsigned long long)m->checked,
             m->mismatches ? "; first mismatch: " : "", m->mismatches ? m->first_mismatch : "");
  }
}

static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *jsumm(const summ_t *s) {
  return json_pack("{s:I,s:o,s:o,s:o,s:o,s:o}", "n", (json_int_t)s->n, "p50", jnum(s->p50), "p90", jnum(s->p90),
                   "p99", jnum(s->p99), "mean", jnum(s->mean), "max", jnum(s->max));
}

int bn_report_json(const bn_report_in_t *in, const bn_run_t *run, const char *path, char *err, size_t errlen) {
  agg_t a;
  int rc = aggregate(run, &a);
  if (rc) {
    snprintf(err, errlen, "--json: out of memory");
    return rc;
  }
  const bn_load_opts_t *o = in->load;
  const bn_workload_t *w = in->w;
  json_t *cfg = json_pack("{s:s,s:s,s:i,s:o,s:I,s:o,s:I,s:s,s:s,s:b,s:f,s:f,s:i,s:I,s:I,s:b}", "router", o->router,
                          "mode", o->rate > 0 ? "open" : "closed", "concurrency", o->concurrency, "rate",
                          jnum(o->rate), "requests", (json_int_t)o->requests, "duration_s", jnum(o->duration_s),
                          "warmup", (json_int_t)o->warmup, "prompt_len", w->n_texts ? "text" : in->prompt_len_spec,
                          "output_len", in->output_len_spec, "greedy", w->temperature <= 0, "temperature",
                          w->temperature, "top_p", w->top_p, "top_k", w->top_k, "seed", (json_int_t)w->seed,
                          "sample_seed", (json_int_t)w->sample_seed, "ignore_eos", w->ignore_eos);
  json_t *errs = json_object();
  for (int c = 1; c <= 16; c++)
    if (a.errors[c]) json_object_set_new(errs, k3_rpc_code_name(c), json_integer((json_int_t)a.errors[c]));
  if (a.errors[17]) json_object_set_new(errs, "NOT_STARTED", json_integer((json_int_t)a.errors[17]));
  if (a.incomplete) json_object_set_new(errs, "NO_FINAL_CHUNK", json_integer((json_int_t)a.incomplete));
  if (run->dropped) json_object_set_new(errs, "DROPPED", json_integer((json_int_t)run->dropped));
  json_t *root = json_object();
  json_object_set_new(root, "tool", json_string("k3pd-bench"));
  if (in->label) json_object_set_new(root, "label", json_string(in->label));
  json_object_set_new(root, "config", cfg);
  json_object_set_new(root, "sent", json_integer((json_int_t)a.sent));
  json_object_set_new(root, "ok", json_integer((json_int_t)a.ok));
  json_object_set_new(root, "errors", errs);
  json_object_set_new(root, "wall_s", jnum(a.wall_s));
  json_object_set_new(root, "requests_per_s", jnum(per_s((double)a.ok, a.wall_s)));
  json_object_set_new(root, "output_tokens", json_integer((json_int_t)a.out_tokens));
  json_object_set_new(root, "prompt_tokens", json_integer((json_int_t)a.prompt_tokens));
  json_object_set_new(root, "output_tokens_per_s", jnum(per_s((double)a.out_tokens, a.wall_s)));
  json_object_set_new(root, "prompt_tokens_per_s", jnum(per_s((double)a.prompt_tokens, a.wall_s)));
  if (in->mono_perf) {
    const bn_monoperf_t *mp = in->mono_perf;
    int b = 0;
    double step = o->rate > 0 ? 0 : bn_monoperf_step(mp, o->concurrency, &b);
    json_t *v = json_object();
    json_object_set_new(v, "prefill_tokens", json_integer(mp->prefill_tokens));
    json_object_set_new(v, "prefill_ms", jnum(mp->prefill_ms));
    json_object_set_new(v, "ttft_p50_ratio", jnum(mp->prefill_ms > 0 && a.s[S_TTFT].n ? a.s[S_TTFT].p50 / mp->prefill_ms : NAN));
    json_object_set_new(v, "decode_batch", json_integer(b));
    json_object_set_new(v, "step_ms", jnum(step > 0 ? step : NAN));
    json_object_set_new(v, "itl_p50_ratio", jnum(step > 0 && a.s[S_ITL].n ? a.s[S_ITL].p50 / step : NAN));
    json_object_set_new(root, "vs_monolithic", v);
  }
  json_object_set_new(root, "cluster_prefill_tokens_per_s", jnum(per_s((double)a.prompt_tokens, a.prefill_s_sum)));
  json_object_set_new(root, "cluster_decode_tokens_per_s_per_seq",
                      jnum(per_s((double)a.decode_tokens, a.decode_s_sum)));
  for (int k = 0; k < S_N; k++) json_object_set_new(root, s_names[k], jsumm(&a.s[k]));
  if (in->mono) {
    const bn_mono_t *m = in->mono;
    json_t *mj = json_object();
    json_object_set_new(mj, "runs", json_integer((json_int_t)m->runs));
    json_object_set_new(mj, "failures", json_integer((json_int_t)m->failures));
    json_object_set_new(mj, "prefill_tokens_per_s", jnum(per_s((double)m->prompt_tokens, (double)m->prefill_ns / 1e9)));
    json_object_set_new(mj, "decode_tokens_per_s", jnum(per_s((double)m->decode_steps, (double)m->decode_ns / 1e9)));
    json_object_set_new(mj, "output_tokens_per_s",
                        jnum(per_s((double)m->completion_tokens, (double)(m->prefill_ns + m->decode_ns) / 1e9)));
    json_object_set_new(mj, "wall_s", jnum((double)m->wall_ns / 1e9));
    if (in->verified) {
      json_object_set_new(mj, "verified", json_integer((json_int_t)m->checked));
      json_object_set_new(mj, "mismatches", json_integer((json_int_t)m->mismatches));
    }
    json_object_set_new(root, "monolithic", mj);
  }
  char *line = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!line) {
    snprintf(err, errlen, "--json: cannot serialise the report");
    return K3_ENOMEM;
  }
  FILE *fp = fopen(path, "a");
  if (!fp) {
    snprintf(err, errlen, "--json: cannot open %s for appending", path);
    free(line);
    return K3_EIO;
  }
  bool ok = fprintf(fp, "%s\n", line) > 0;
  ok = fclose(fp) == 0 && ok;
  free(line);
  if (!ok) {
    snprintf(err, errlen, "--json: write to %s failed", path);
    return K3_EIO;
  }
  return 0;
}

int bn_report_ids(const bn_workload_t *w, const bn_run_t *run, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "--ids-out: cannot write %s", path);
    return K3_EIO;
  }
  int rc = 0;
  for (size_t i = 0; i < run->n_res && !rc; i++) {
    const bn_result_t *r = &run->res[i];
    if (!r->complete || !r->ids) continue;
    bn_req_spec_t s;
    if ((rc = bn_spec_make(w, r->index, &s))) break;
    if (r->prompt) { /* a chat turn: the prompt that was sent */
      free(s.ids);
      s.ids = malloc((r->n_prompt ? r->n_prompt : 1) * sizeof *s.ids);
      if (!s.ids) {
        rc = K3_ENOMEM;
        break;
      }
      memcpy(s.ids, r->prompt, r->n_prompt * sizeof *s.ids);
      s.n_ids = r->n_prompt;
    }
    if (!s.ids) { /* text mode: the prompt's ids are the router's business */
      bn_spec_free(&s);
      continue;
    }
    for (size_t k = 0; k < s.n_ids; k++) fprintf(f, "%s%u", k ? "," : "", s.ids[k]);
    fputc('\t', f);
    for (uint32_t k = 0; k < r->n_tokens; k++) fprintf(f, "%s%u", k ? "," : "", r->ids[k]);
    fprintf(f, "\t%u\t%llu\n", r->n_tokens, (unsigned long long)s.seed);
    bn_spec_free(&s);
  }
  if (fclose(f) && !rc) rc = K3_EIO;
  if (rc) snprintf(err, errlen, "--ids-out: writing %s failed: %s", path, k3_strerror(rc));
  return rc;
}

int bn_report_requests(const bn_run_t *run, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "--requests-out: cannot write %s", path);
    return K3_EIO;
  }
  for (size_t i = 0; i < run->n_res; i++) {
    const bn_result_t *r = &run->res[i];
    double t0 = r->t_start >= run->t_begin ? (double)(r->t_start - run->t_begin) / 1e6 : 0;
    double ttft = r->t_first ? (double)(r->t_first - r->t_start) / 1e6 : -1;
    double e2e = r->t_end > r->t_start ? (double)(r->t_end - r->t_start) / 1e6 : -1;
    fprintf(f,
            "{\"index\":%llu,\"ok\":%s,\"send_ms\":%.3f,\"prompt\":%u,\"tokens\":%u,\"ttft_ms\":%.3f,"
            "\"e2e_ms\":%.3f,\"gap_max_ms\":%.3f,\"gap1_ms\":%.3f,\"queue_ms\":%.3f,\"prefill_ms\":%.3f,\"handoff_ms\":%.3f,"
            "\"decode_ms\":%.3f}\n",
            (unsigned long long)r->index, r->complete ? "true" : "false", t0, r->prompt_tokens, r->n_tokens, ttft, e2e,
            r->gap_max_ms, r->gap1_ms, (double)r->queue_us / 1e3, (double)r->prefill_us / 1e3, (double)r->handoff_us / 1e3,
            (double)r->decode_us / 1e3);
  }
  int bad = ferror(f);
  if (fclose(f) || bad) {
    snprintf(err, errlen, "--requests-out: write error on %s", path);
    return K3_EIO;
  }
  return 0;
}
