/* Parallel drivers of the "cpu-fast" backend for everything except the GEMMs. They never
 * re-implement math: row-wise ops run the REFERENCE function on row (or channel) slices of the
 * tensors, and the attention/recurrence ops run the reference per-(sequence, head) functions as
 * independent tasks. Each output element is therefore computed by the same code in the same
 * order as in "cpu": results are bit-identical. Metadata (ids, slots, lengths) is checked once
 * for the whole op before any task writes, so bad input still changes nothing. */
#include <stdlib.h>
#include <string.h>

#include "fast/fast.h"

/* ---- slice driver ---- */

/* Slice dimension per slot (−1: pass the tensor whole) and the slot/dim that counts rows. */
typedef struct {
  int8_t dim[K3K_MAX_ARGS];
  int8_t count_slot, count_dim;
} slicing_t;

static bool slicing_of(k3k_op_t op, const k3k_tensor_t *const *t, slicing_t *s) {
  memset(s->dim, -1, sizeof s->dim);
  s->count_slot = 0;
  s->count_dim = 0;
  switch (op) {
    case K3K_OP_COPY: s->dim[0] = s->dim[1] = 0; return true;
    case K3K_OP_ADD: case K3K_OP_SITU: case K3K_OP_SILU_MUL: case K3K_OP_SIGMOID_MUL:
      s->dim[0] = s->dim[1] = s->dim[2] = 0; return true;
    case K3K_OP_SIGMOID: case K3K_OP_L2NORM: s->dim[0] = s->dim[1] = 0; return true;
    case K3K_OP_GET_ROWS: s->dim[1] = s->dim[2] = 0; s->count_slot = 1; return true;
    case K3K_OP_RMSNORM: s->dim[0] = s->dim[2] = 0; return true;
    case K3K_OP_GATED_RMSNORM: s->dim[0] = s->dim[1] = s->dim[3] = 0; return true;
    case K3K_OP_KDA_GATE: s->dim[0] = s->dim[3] = 0; return true;
    case K3K_OP_ROUTER: s->dim[0] = s->dim[2] = s->dim[3] = 0; return true;
    case K3K_OP_MOE_COMBINE: s->dim[1] = s->dim[2] = s->dim[3] = 0; s->count_slot = 1; return true;
    case K3K_OP_ATTN_RES_MIX: s->dim[0] = 1; s->dim[1] = s->dim[4] = 0; s->count_slot = 1; return true;
    /* Depthwise conv: channels are independent, slice them. */
    case K3K_OP_CONV_PREFILL:
      s->dim[0] = 1; s->dim[1] = 0; s->dim[4] = 1; s->dim[5] = 1; s->count_dim = 1; return true;
    case K3K_OP_CONV_STEP:
      s->dim[0] = 1; s->dim[1] = 0; s->dim[3] = 1; s->dim[4] = 1; s->count_dim = 1; return true;
    default: return false;
  }
}

typedef struct {
  k3k_cpu_fn fn;
  const void *params;
  const k3k_tensor_t *const *t;
  int nt;
  slicing_t sl;
  int64_t rows, per_task;
  _Atomic int rc;
} slice_ctx_t;

static void slice_task(void *ctx, int64_t task, int worker) {
  slice_ctx_t *c = ctx;
  int64_t r0 = task * c->per_task, n = c->rows - r0 < c->per_task ? c->rows - r0 : c->per_task;
  if (n <= 0) return;
  k3k_tensor_t v[K3K_MAX_ARGS];
  const k3k_tensor_t *pv[K3K_MAX_ARGS];
  for (int i = 0; i < c->nt; i++) {
    v[i] = *c->t[i];
    if (c->sl.dim[i] >= 0) v[i] = k3k_tensor_slice(c->t[i], c->sl.dim[i], r0, n);
    pv[i] = &v[i];
  }
  int rc = c->fn(c->params, pv);
  if (rc) c->rc = rc;
}

/* Whole-op metadata checks for the sliced ops that index other tensors. */
static int precheck(k3k_op_t op, const void *params, const k3k_tensor_t *const *t) {
  switch (op) {
    case K3K_OP_GET_ROWS:
      for (int64_t i = 0; i < t[1]->shape[0]; i++) {
        int32_t id = k3k_ldi(t[1], i * t[1]->stride[0]);
        if (id < 0 || id >= t[0]->shape[0]) return K3_ERANGE;
      }
      return 0;
    case K3K_OP_MOE_COMBINE:
      for (int64_t i = 0; i < t[1]->shape[0]; i++)
        for (int64_t j = 0; j < t[1]->shape[1]; j++) {
          int32_t r = k3k_ldi(t[1], k3k_off2(t[1], i, j));
          if (r < -1 || r >= t[0]->shape[0]) return K3_ERANGE;
        }
      return 0;
    case K3K_OP_CONV_PREFILL: {
      const k3k_conv_params_t *p = params;
      int rc = k3k_cpu_check_seqs(t[2], p->n_seqs, t[0]->shape[0], "cu_seqlens");
      return rc ? rc : k3k_cpu_check_slots(t[3], p->n_seqs, t[4]->shape[0]);
    }
    case K3K_OP_CONV_STEP: {
      const k3k_conv_params_t *p = params;
      return k3k_cpu_check_slots(t[2], p->n_seqs, t[3]->shape[0]);
    }
    default: return 0;
  }
}

static int run_sliced(k3k_pool_t *pool, k3k_op_t op, const void *params,
                      const k3k_tensor_t *const *t, int nt, const slicing_t *sl) {
  int rc = precheck(op, params, t);
  if (rc) return rc;
  slice_ctx_t c = {.fn = k3k_cpu_ref_fn(op), .params = params, .t = t, .nt = nt, .sl = *sl};
  c.rows = t[sl->count_slot]->ndim > sl->count_dim ? t[sl->count_slot]->shape[sl->count_dim] : 1;
  if (op == K3K_OP_COPY && t[0]->ndim == 0) return c.fn(params, t);
  /* A small op runs whole on the caller: the reference computes each element the same way
   * whether it sees a slice or the whole tensor. work = the largest sliced tensor. */
  int64_t work = 0;
  for (int i = 0; i < nt; i++)
    if (sl->dim[i] >= 0 && t[i] && k3k_tensor_numel(t[i]) > work) work = k3k_tensor_numel(t[i]);
  if (work < k3k_pool_min_work(pool)) return c.fn(params, t);
  int64_t want = (int64_t)k3k_pool_threads(pool) * 4;
  c.per_task = (c.rows + want - 1) / (want ? want : 1);
  if (c.per_task < 1) c.per_task = 1;
  k3k_pool_run(pool, (c.rows + c.per_task - 1) / c.per_task, slice_task, &c);
  return c.rc;
}

/* ---- (sequence, head) tasks ---- */

typedef struct {
  k3k_op_t op;
  const void *params;
  const k3k_tensor_t *const *t;
  int32_t heads;
  float *scratch;
  size_t scratch_floats;
} sh_ctx_t;

static void sh_task(void *ctx, int64_t task, int worker) {
  const sh_ctx_t *c = ctx;
  int32_t i = (int32_t)(task / c->heads), h = (int32_t)(task % c->heads);
  float *s = c->scratch + (size_t)worker * c->scratch_floats;
  switch (c->op) {
    case K3K_OP_KDA_CHUNK: k3k_cpu_kda_chunk_seq(c->params, c->t, i, h, h + 1, s); break;
    case K3K_OP_KDA_STEP: k3k_cpu_kda_step_head(c->params, c->t, i, h); break;
    case K3K_OP_MLA_PREFILL: k3k_cpu_mla_prefill_head(c->params, c->t, i, h, s); break;
    case K3K_OP_MLA_DECODE: k3k_cpu_mla_decode_head(c->params, c->t, i, h, s); break;
    default: break;
  }
}

static int run_seq_head(k3k_pool_t *pool, k3k_op_t op, const void *params,
                        const k3k_tensor_t *const *t) {
  sh_ctx_t c = {.op = op, .params = params, .t = t};
  int32_t n = 0;
  int rc = 0;
  int64_t work = INT64_MAX; /* prefill-shaped ops: always worth the pool */
  switch (op) {
    case K3K_OP_KDA_CHUNK: {
      const k3k_kda_params_t *p = params;
      if ((rc = k3k_cpu_check_seqs(t[5], p->n_seqs, t[0]->shape[0], "cu_seqlens")) ||
          (rc = k3k_cpu_check_slots(t[6], p->n_seqs, t[7]->shape[0])))
        return rc;
      n = p->n_seqs, c.heads = p->n_heads;
      c.scratch_floats = k3k_cpu_kda_chunk_scratch_floats(t, p);
      break;
    }
    case K3K_OP_KDA_STEP: {
      const k3k_kda_params_t *p = params;
      if ((rc = k3k_cpu_check_slots(t[5], p->n_seqs, t[6]->shape[0]))) return rc;
      n = p->n_seqs, c.heads = p->n_heads, c.scratch_floats = 1;
      work = k3k_tensor_numel(t[6]) / (t[6]->shape[0] > 0 ? t[6]->shape[0] : 1) * n * 4; /* S of n slots */
      break;
    }
    case K3K_OP_MLA_PREFILL: {
      const k3k_mla_params_t *p = params;
      if ((rc = k3k_cpu_check_mla_prefill(p, t))) return rc;
      n = p->n_seqs, c.heads = p->n_heads;
      c.scratch_floats = (size_t)t[1]->shape[0] + 1;
      break;
    }
    case K3K_OP_MLA_DECODE: {
      const k3k_mla_params_t *p = params;
      if ((rc = k3k_cpu_check_mla_decode(p, t))) return rc;
      int64_t maxlen = 0;
      for (int32_t i = 0; i < p->n_seqs; i++) {
        int64_t l = k3k_ldi(t[4], i * t[4]->stride[0]);
        maxlen = l > maxlen ? l : maxlen;
      }
      n = p->n_seqs, c.heads = p->n_heads;
      c.scratch_floats = (size_t)(2 * p->kv_lora + maxlen + 1);
      work = (int64_t)n * p->n_heads * maxlen * (p->kv_lora + p->d_rope);
      break;
    }
    default: return K3_ENOTSUP;
  }
  c.scratch = malloc((size_t)k3k_pool_threads(pool) * c.scratch_floats * sizeof(float));
  if (!c.scratch) return K3_ENOMEM;
  k3k_pool_run_work(pool, (int64_t)n * c.heads, work, sh_task, &c);
  free(c.scratch);
  return 0;
}

/* ---- sampling: rows in parallel into a private buffer, copied out only on success ---- */

typedef struct {
  const k3k_sample_params_t *p;
  const k3k_tensor_t *L;
  int32_t *ids;
  _Atomic int rc;
} smp_ctx_t;

static void sample_task(void *ctx, int64_t r, int worker) {
  smp_ctx_t *c = ctx;
  int64_t V = c->L->shape[1];
  float *row = malloc((size_t)V * sizeof *row);
  if (!row) {
    c->rc = K3_ENOMEM;
    return;
  }
  for (int64_t i = 0; i < V; i++) row[i] = k3k_ld(c->L, r * c->L->stride[0] + i);
  int rc = k3k_sample_row(row, V, &c->p->rows[r], &c->ids[r]);
  if (rc) c->rc = rc;
  free(row);
}

static int run_sample(k3k_pool_t *pool, const k3k_sample_params_t *p,
                      const k3k_tensor_t *const *t) {
  int64_t N = t[0]->shape[0];
  smp_ctx_t c = {.p = p, .L = t[0], .ids = malloc((size_t)(N + 1) * sizeof(int32_t))};
  if (!c.ids) return K3_ENOMEM;
  k3k_pool_run(pool, N, sample_task, &c);
  if (!c.rc)
    for (int64_t r = 0; r < N; r++) ((int32_t *)t[1]->data)[r * t[1]->stride[0]] = c.ids[r];
  free(c.ids);
  return c.rc;
}

int k3k_fast_op(k3k_pool_t *pool, k3k_op_t op, const void *params, const k3k_tensor_t *const *t,
                int nt) {
  slicing_t sl;
  if (slicing_of(op, t, &sl)) return run_sliced(pool, op, params, t, nt, &sl);
  switch (op) {
    case K3K_OP_KDA_CHUNK: case K3K_OP_KDA_STEP: case K3K_OP_MLA_PREFILL: case K3K_OP_MLA_DECODE:
      return run_seq_head(pool, op, params, t);
    case K3K_OP_SAMPLE: return run_sample(pool, params, t);
    default: return K3_ENOTSUP;
  }
}
