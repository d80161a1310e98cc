/* Private state of the model runner shared by its source files (not a public API).
 *
 * Weights are k3k tensor views straight onto the k3_weights_t memory (zero copy on host
 * backends; uploaded once on a device backend). Activations live in per-pass buffers from the
 * runner's workspace arena (workspace.c). Precision is expressed the k3k way: the activation dtype `act` is F32 in
 * fp32 mode and BF16 in bf16 mode, so every op output of dtype `act` is a spec §8 "stored bf16"
 * point in bf16 mode; fp32 islands (router logits, KDA gate/beta/l2norm, logits) use F32.
 *
 * Pools: per MLA layer one cache tensor [num_pages, page_tokens, cache_dim]; per KDA layer one
 * S tensor [num_slots, NH, DV, DK] fp32 and three conv tensors [num_slots, P, W-1] (q, k, v);
 * page/slot id i of a region lives at base + i*stride. Cache and conv dtype = state dtype
 * (F32 in fp32 mode, BF16 in bf16 mode). */
#ifndef K3_RUNNER_INTERNAL_H
#define K3_RUNNER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"

typedef struct {
  bool mx;                 /* MXFP4 (packed + scale) or a plain bf16 weight */
  k3k_tensor_t w, packed, scale;
} rn_expw_t;

typedef struct {
  k3_layer_kind_t kind;
  bool moe, boundary;
  k3k_tensor_t in_ln, post_ln;                   /* [H] */
  k3k_tensor_t sa_res_norm, sa_res_proj;         /* [H] (K3 only) */
  k3k_tensor_t mlp_res_norm, mlp_res_proj;
  /* KDA */
  k3k_tensor_t q, k, v, fa, fb, b, g, ga, gb, o; /* g (K3 full rank) or ga/gb (48B) */
  k3k_tensor_t conv[3];                          /* [P, W] */
  k3k_tensor_t a_log, dt_bias, o_norm;           /* [>=NH], [P], [DK] */
  /* MLA */
  k3k_tensor_t qa, qb, qp, kva, kvb, mo, mg;
  k3k_tensor_t qa_ln, kva_ln;
  /* FFN */
  k3k_tensor_t d_gate, d_up, d_down;
  k3k_tensor_t router, router_bias;
  k3k_tensor_t lat_down, lat_up, lat_norm;
  k3k_tensor_t sh_gate, sh_up, sh_down;
  rn_expw_t *w1, *w3, *w2;                       /* [E] */
  k3k_tensor_t etab; /* MOE_ROUTED's expert table (experts.c), data NULL = none */
} rn_layer_t;

/* Activation workspace (workspace.c): a per-runner arena of backend memory, bump-allocated
 * during a pass and released as a whole at its end; overflow of a pass comes from separate
 * allocations and grows the arena for the next pass. */
typedef struct {
  k3_runner_t *r;
  void *base;              /* arena (backend memory), cap bytes */
  size_t cap, used;        /* used: arena bytes live now (bump offset) */
  size_t cur;              /* bytes live now, arena + overflow */
  size_t need;             /* high-water mark of cur in this pass (the arena's next size) */
  void **extra;            /* overflow allocations live now (released ones are freed at once) */
  int n_extra, cap_extra;
  int extras_taken;        /* overflow allocations made in this pass, released or not (graph.c:
                            * a captured pass must have made none) */
  int rc;                  /* first allocation error of the pass */
  uint64_t gen;            /* bumped whenever `base` changes (graphs captured before are stale) */
} rn_ws_t;

/* Geometry of one pass: n_seq sequences packed back to back. */
typedef struct {
  int n_seq;
  int64_t n_tok;
  k3_seq_t **seq;          /* [n_seq] */
  int32_t *off;            /* host [n_seq+1] packed row offsets */
  int64_t *pos0;           /* host [n_seq] absolute position of the first row */
  const int32_t *tok;      /* host [n_tok] token ids */
  bool decode;             /* one token per sequence: KDA step, absorbed MLA decode */
  k3k_tensor_t cu, slots;  /* device I32 [n_seq+1], [n_seq] */
  /* Device decode (graph.c, ps->dev): every id tensor below was built and validated on the host
   * and uploaded in one copy before the pass; the pass then contains no host round trip (raw
   * gather and cache write, no lm_head row gather: logits of every row). */
  bool dev;
  k3k_tensor_t ids, smap, pt, lens; /* I32 [n], [n], [n, maxp], [n] */
  int32_t max_k;                    /* MLA_DECODE max_seqlen_k: the context bucket */
} rn_pass_t;

struct k3_runner {
  k3_model_config_t cfg;
  k3_runner_opts_t opts;
  char backend_name[16];
  const k3_weights_t *w;   /* NULL when the weights are generated on the device (syn) */
  const k3_tmap_t *tmap;   /* plan of the weights: w's, or syn's own */
  struct rn_syn *syn;      /* device generation (synth_dev.c), owns the plan; NULL with w */
  const k3_runner_t *src;  /* k3_runner_init_copy: the device-generated runner copied from */
  k3k_backend_t *be;
  k3k_dtype_t act;         /* activation dtype: F32 (fp32 mode) or BF16 */
  k3k_dtype_t sdt;         /* MLA latent / conv state dtype (same rule) */
  bool bf16;

  /* Bound weight tensors' device addresses in bind order (k3_runner_init_copy reads a source
   * runner's by index). Device backends: pointers into the weights arena (not owned); a host
   * copy of a device runner (r->src): separate backend allocations (owned, uploads_owned). */
  void **uploads;
  int n_uploads, cap_uploads;
  bool uploads_owned;
  /* Weights arena (device backends, runner.c bind): one allocation holding every bound tensor
   * at wl[i].off; from the backend (be_owned), or share.c's (shared weights: made here or
   * imported read-only, then nothing is generated or uploaded). */
  struct {
    bool on;               /* device backend: weights live in the arena */
    void *base;
    size_t bytes;
    bool be_owned;         /* base came from be->alloc (free it) */
    bool imported;         /* another process's weights, mapped read-only */
  } wa;
  struct rn_wl *wl;        /* layout: one entry per bound tensor, bind order */
  int n_wl, cap_wl;
  uint64_t wl_hash;        /* XXH3 of the layout (k3_runner_weights_arena) */
  struct rn_share *share;  /* share.c, NULL without shared weights */
  /* State arena (state.c): every pool tensor inside one allocation at 256-aligned offsets. */
  struct {
    void *base;            /* 256-byte aligned */
    size_t bytes;
    void *raw;             /* the backend's allocation (base rounded up from it), to free */
    struct k3k_vmm *vmm;   /* opts.state.vmm */
    bool user;             /* opts.state.alloc'd */
  } sa;
  k3k_tensor_t embed, lm_head, final_norm, out_res_norm, out_res_proj;
  rn_layer_t *layers;
  int n_kda, n_mla;

  /* pools */
  uint8_t *slot_used, *page_used;
  int free_slots, free_pages;
  k3k_tensor_t *kda_S;     /* [n_kda] */
  k3k_tensor_t (*kda_conv)[3];
  k3k_tensor_t *mla_cache; /* [n_mla] */

  rn_ws_t ws;              /* activation arena (workspace.c) */

  k3k_dtype_t exp_wdtype;  /* MOE_ROUTED's wdtype of the expert tables (experts.c) */
  struct rn_dev *dev;      /* device side lane + expert scale check (ffn_device.c), or NULL */
  struct rn_gd *gd;        /* device decode + CUDA graphs (graph.c), NULL = rn_forward only */
  bool kda_fused;          /* KDA decode in one launch per layer (kda_device.c) */
  bool graphs_off;         /* k3_runner_set_graphs(r, false) */
  k3_runner_stats_t stats;

  k3_manifest_t man;       /* adjusted to the precision (state.c) */
  struct { void *base; size_t stride, count; } *regmem; /* [man.n] */
};

/* Common error text helper (snprintf into err when not NULL). */
void rn_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One bound weight tensor of the weights arena (runner.c). */
typedef struct rn_wl {
  char *name;              /* short name (owned) */
  int dtype;               /* k3_dtype_t */
  int ndim;
  int64_t shape[4];
  uint64_t bytes, off;
} rn_wl_t;

/* share.c: shared weights (opts.share_weights_dir). rn_share_begin runs with the layout known
 * (r->wl, r->wl_hash, r->wa.bytes): creates DIR, takes DIR/.lock (bounded wait), looks for a
 * live holder; with a matching one imports its arena read-only (r->wa.base, r->wa.imported),
 * else allocates a k3k_vmm arena (r->wa.base); a holder with other weights is K3_EFINGERPRINT
 * naming both identities. The lock stays held until rn_share_publish (after the tensors are
 * filled), which starts this process's own server for the arena and releases the lock.
 * rn_share_free (runner teardown, or any error) stops the server (removing its socket), closes
 * every fd, unmaps and releases the lock if still held: no leak on any path. */
int rn_share_begin(k3_runner_t *r, const char *identity, char *err, size_t errlen);
int rn_share_publish(k3_runner_t *r, char *err, size_t errlen);
void rn_share_free(k3_runner_t *r);

/* bind.c: rn_bind_all binds every weight tensor (host views, or the weights arena on device
 * backends; `identity` names the weights for sharing); rn_free_weights undoes it (runner
 * teardown; also releases shared weights). */
int rn_bind_all(k3_runner_t *r, const char *identity, char *err, size_t errlen);
void rn_free_weights(k3_runner_t *r);

/* state.c: rn_state_check_opts validates opts.state against the backend before anything is
 * allocated; rn_state_init builds the manifest and the pools inside the state arena. */
int rn_state_check_opts(const k3_runner_t *r, char *err, size_t errlen);
int rn_state_init(k3_runner_t *r, char *err, size_t errlen);
void rn_state_free(k3_runner_t *r);

/* ws: per-pass device buffers from the runner's arena. rn_ws_begin starts a pass, rn_ws_end
 * releases every buffer of it (and resizes the arena); rn_ws_destroy frees the arena (runner
 * teardown). rn_buf returns a contiguous 2-D tensor (rows may be 0); on allocation failure
 * ws->rc is set and a tensor with NULL data is returned. */
rn_ws_t *rn_ws_begin(k3_runner_t *r);
void rn_ws_end(rn_ws_t *ws);
void rn_ws_destroy(k3_runner_t *r);
void *rn_ws_alloc(rn_ws_t *ws, size_t bytes);
/* Everything allocated after a mark is released (and its arena space reused) by
 * rn_ws_release(mark); buffers allocated before stay live. */
typedef struct {
  size_t used, cur;
  int n_extra;
} rn_ws_mark_t;
rn_ws_mark_t rn_ws_mark(const rn_ws_t *ws);
void rn_ws_release(rn_ws_t *ws, rn_ws_mark_t m);
k3k_tensor_t rn_buf(rn_ws_t *ws, k3k_dtype_t dt, int64_t rows, int64_t cols);
/* A device I32 tensor holding a copy of host values. */
k3k_tensor_t rn_i32(rn_ws_t *ws, const int32_t *host, int64_t n);

/* mixers.c / ffn.c: x [T,H] (normed input) -> out [T,H] (dtype act). Return 0 or K3_E*. */
int rn_kda_forward(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, int ki, const rn_pass_t *ps,
                   const k3k_tensor_t *x, const k3k_tensor_t *out);
int rn_mla_forward(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, int mi, const rn_pass_t *ps,
                   const k3k_tensor_t *x, const k3k_tensor_t *out);
int rn_ffn_forward(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, const k3k_tensor_t *x,
                   const k3k_tensor_t *out);

/* experts.c: the expert tables of MOE_ROUTED (every backend); none when some expert's layout
 * is not the op's (ffn.c then runs the chain of ops). */
int rn_experts_init(k3_runner_t *r, char *err, size_t errlen);
void rn_experts_free(k3_runner_t *r);

/* ffn_device.c (built only with the CUDA backend, K3_RUNNER_CUDA): rn_dev_init sets r->dev
 * when the backend is "cuda", the precision bf16 and the model has experts: it checks every
 * MXFP4 expert scale once (the device MOE_ROUTED path does not check per call) and prepares
 * the side lane (K3PD_CUDA_SIDE not 0). */
#ifdef K3_RUNNER_CUDA
int rn_dev_init(k3_runner_t *r, char *err, size_t errlen);
void rn_dev_free(k3_runner_t *r);
/* The side stream for a decode-shaped pass (T <= 256, the side lane ready): ffn.c queues the
 * MoE block's latent down-projection (mark 1, joined by MOE_ROUTED's x_mark) and shared expert
 * (mark 2) on it; rn_dev_side_gemms queues y[i] = x[i]·w[i]ᵀ there in order, marks 1 and
 * returns on the main stream (the MLA output gate's projection; KDA's small f_a → f_b and beta
 * projections). */
bool rn_dev_side_ok(const k3_runner_t *r, int64_t T);
int rn_dev_side_gemms(k3_runner_t *r, int n, const k3k_tensor_t *const *x,
                      const k3k_tensor_t *const *w, const k3k_tensor_t *const *y);
#else
static inline bool rn_dev_side_ok(const k3_runner_t *r, int64_t T) { return false; }
static inline int rn_dev_side_gemms(k3_runner_t *r, int n, const k3k_tensor_t *const *x,
                                    const k3k_tensor_t *const *w, const k3k_tensor_t *const *y) {
  return K3_ENOTSUP;
}
static inline int rn_dev_init(k3_runner_t *r, char *err, size_t errlen) { return 0; }
static inline void rn_dev_free(k3_runner_t *r) {}
#endif

/* The backend's side lane (k3k.h k3k_backend_side; no-ops on the CPU backends, which the runner
 * never sends there: rn_dev_side_ok is false without r->dev). */
static inline int rn_dev_side_begin(k3_runner_t *r) {
  return k3k_backend_side(r->be, K3K_SIDE_BEGIN, 0);
}
static inline int rn_dev_side_mark(k3_runner_t *r, int i) {
  return k3k_backend_side(r->be, K3K_SIDE_MARK, i);
}
static inline int rn_dev_side_end(k3_runner_t *r) { return k3k_backend_side(r->be, K3K_SIDE_END, 0); }
static inline int rn_dev_side_wait(k3_runner_t *r, int i) {
  return k3k_backend_side(r->be, K3K_SIDE_WAIT, i);
}

/* kda_device.c (CUDA builds): rn_dev_kda_init sets r->kda_fused when every KDA layer can take
 * the fused decode kernel (cuda backend, bf16, K3's lower-bound gate, 128-wide heads, conv
 * width 4, fp32 conv/A_log/dt_bias/o_norm; K3PD_CUDA_KDA_FUSED=0 keeps the op chain);
 * rn_dev_kda_decode then replaces CONV_STEP x3 → L2NORM x2 → KDA_GATE → SIGMOID → KDA_STEP →
 * GATED_RMSNORM of a decode pass with one launch, from the projections lin[3] (q, k, v before
 * the conv), graw (gate), braw (beta logits) and z (output gate), writing the gated-normed
 * output `on` [T,P]. Same rounding points as the chain (k3k-gpu-check kda_fused_decode). */
#ifdef K3_RUNNER_CUDA
void rn_dev_kda_init(k3_runner_t *r);
int rn_dev_kda_decode(k3_runner_t *r, const rn_layer_t *L, int ki, const rn_pass_t *ps,
                      const k3k_tensor_t *lin, const k3k_tensor_t *graw, const k3k_tensor_t *braw,
                      const k3k_tensor_t *z, const k3k_tensor_t *on);
#else
static inline void rn_dev_kda_init(k3_runner_t *r) {}
static inline int rn_dev_kda_decode(k3_runner_t *r, const rn_layer_t *L, int ki, const rn_pass_t *ps,
                                    const k3k_tensor_t *lin, const k3k_tensor_t *graw,
                                    const k3k_tensor_t *braw, const k3k_tensor_t *z,
                                    const k3k_tensor_t *on) {
  return K3_ENOTSUP; /* never called: r->kda_fused stays false without the CUDA backend */
}
#endif

/* graph.c (built only with the CUDA backend): rn_gd_init sets r->gd on a "cuda" backend in bf16
 * when every op of a decode step is capture-safe (MoE layers on the device path); rn_gd_decode
 * runs one decode pass from prebuilt metadata, replaying a CUDA graph per (batch size, context
 * bucket) when one is captured, eagerly otherwise; rn_trust turns the backend's trusted-ids mode
 * on/off around a runner pass; rn_dev_gather / rn_dev_cache_write are the unchecked device
 * copies of a ps->dev pass. */
#ifdef K3_RUNNER_CUDA
int rn_gd_init(k3_runner_t *r, char *err, size_t errlen);
void rn_gd_free(k3_runner_t *r);
void rn_gd_drop(k3_runner_t *r); /* destroys every captured graph */
/* sample_cfgs (n rows, or NULL): sample every row on the device with the k3k SAMPLE op into
 * sampled_ids (host) instead of copying the logits out (row_dst is then not used). */
int rn_gd_decode(k3_runner_t *r, rn_pass_t *ps, float *const *row_dst, const k3k_sample_cfg_t *sample_cfgs,
                 int32_t *sampled_ids, char *err, size_t errlen);
void rn_trust(k3_runner_t *r, bool on);
int rn_dev_gather(k3_runner_t *r, const k3k_tensor_t *table, const k3k_tensor_t *ids,
                  const k3k_tensor_t *y);
int rn_dev_cache_write(k3_runner_t *r, const k3k_tensor_t *cn, const k3k_tensor_t *krot,
                       const k3k_tensor_t *smap, const k3k_tensor_t *cache);
#else
static inline int rn_gd_init(k3_runner_t *r, char *err, size_t errlen) { return 0; }
static inline void rn_gd_free(k3_runner_t *r) {}
static inline void rn_gd_drop(k3_runner_t *r) {}
static inline int rn_gd_decode(k3_runner_t *r, rn_pass_t *ps, float *const *row_dst,
                               const k3k_sample_cfg_t *sample_cfgs, int32_t *sampled_ids, char *err,
                               size_t errlen) {
  return K3_ENOTSUP; /* never called: r->gd stays NULL without the CUDA backend */
}
static inline void rn_trust(k3_runner_t *r, bool on) {}
static inline int rn_dev_gather(k3_runner_t *r, const k3k_tensor_t *table, const k3k_tensor_t *ids,
                                const k3k_tensor_t *y) {
  return K3_ENOTSUP;
}
static inline int rn_dev_cache_write(k3_runner_t *r, const k3k_tensor_t *cn, const k3k_tensor_t *krot,
                                     const k3k_tensor_t *smap, const k3k_tensor_t *cache) {
  return K3_ENOTSUP;
}
#endif

/* synth_dev.c (CUDA builds): device-generated weights for k3_runner_init_synth. rn_syn_begin
 * plans the tensors (sets r->tmap), rn_syn_tensor generates one by short name into dst (its
 * slot of the weights arena, e->nbytes bytes) (exactly k3_synth_fill's bytes; verify_kib > 0 compares two slices of that many
 * KiB per tensor with the host generator, < 0 whole tensors), rn_syn_find looks an entry up,
 * rn_syn_end frees the generator state and the plan (runner teardown: r->tmap points into it). */
#ifdef K3_RUNNER_CUDA
int rn_syn_begin(k3_runner_t *r, uint64_t seed, int verify_kib, char *err, size_t errlen);
int rn_syn_tensor(k3_runner_t *r, const char *short_name, const k3_tmap_entry_t **e,
                  void *dst, char *err, size_t errlen);
const k3_tmap_entry_t *rn_syn_find(const k3_runner_t *r, const char *short_name);
void rn_syn_summary(const k3_runner_t *r, uint64_t *patched, uint64_t *verified);
void rn_syn_end(k3_runner_t *r);
#else
static inline int rn_syn_begin(k3_runner_t *r, uint64_t seed, int verify_kib, char *err,
                               size_t errlen) {
  rn_seterr(err, errlen, "runner: device-generated weights need the CUDA backend");
  return K3_ENOTSUP;
}
static inline int rn_syn_tensor(k3_runner_t *r, const char *short_name, const k3_tmap_entry_t **e,
                                void *dst, char *err, size_t errlen) {
  return K3_ENOTSUP;
}
static inline const k3_tmap_entry_t *rn_syn_find(const k3_runner_t *r, const char *short_name) {
  return NULL;
}
static inline void rn_syn_summary(const k3_runner_t *r, uint64_t *patched, uint64_t *verified) {
  *patched = *verified = 0;
}
static inline void rn_syn_end(k3_runner_t *r) {}
#endif

/* forward.c: the pass up to the logits, queued on the backend: embedding, every layer, and
 * (nw > 0) the final mix, norm and lm_head of the rows `rows` (host [nw]; a ps->dev pass takes
 * every row in order and gathers nothing) into *lg (F32 [nw, V] workspace buffer). Nothing is
 * synchronised unless the layer callback fires. ps->cu/slots (and the ps->dev tensors) must be
 * set. */
int rn_forward_enqueue(k3_runner_t *r, rn_ws_t *ws, rn_pass_t *ps, const int32_t *rows, int64_t nw,
                       k3_layer_done_fn cb, void *cb_ctx, bool fire_cb, k3k_tensor_t *lg,
                       char *err, size_t errlen);
/* The mixers' cache row of absolute position pos of sequence s. */
int32_t rn_cache_slot(const k3_runner_t *r, const k3_seq_t *s, int64_t pos);

/* forward.c: the whole stack over one pass (ps->cu/slots are filled by it). row_dst[t] (host,
 * may be NULL entirely) is where row t's fp32 logits go (vocab floats), NULL = not wanted. The
 * callback fires after each layer when `fire_cb`. */
int rn_forward(k3_runner_t *r, rn_pass_t *ps, float *const *row_dst, k3_layer_done_fn cb,
               void *cb_ctx, bool fire_cb, char *err, size_t errlen);

#endif
