/* k3k: the kernel library's one op API (tensors, backends, ops) for Kimi-K3 / Kimi-Linear-48B.
 *
 * What it is: a small ggml-style interface. A tensor is a strided view (dtype, shape, strides
 * in elements, data pointer, owning backend). A backend is a vtable (memory + `supports` +
 * `run`). Every op has a params struct and a fixed, documented tensor-slot order; the typed
 * wrappers at the end of this file (k3k_rmsnorm(), k3k_gemm(), ...) build the slot array and
 * call k3k_run(), which validates shapes/dtypes once for all backends and then dispatches.
 *
 * What it is not: a graph, an allocator of activations, or the model runner. Ops never allocate
 * device memory for their outputs; callers pass every output tensor.
 *
 * Numerics (spec/k3-model.md §8). Ops read F32 or BF16 inputs, compute in fp32, and write their
 * output in the OUTPUT tensor's dtype (round-to-nearest-even when it is BF16). So a BF16 output
 * tensor IS a "stored bf16" rounding point of §8, and the model runner chooses the rounding
 * points by choosing activation dtypes (fp32 mode: F32 everywhere; bf16 mode: BF16 where §8 says
 * "stored bf16"). Where §8 puts a rounding point INSIDE an op, the op has a `bf16_inner` flag
 * and the reference implements both forms exactly (documented per op below). No op uses float64.
 *
 * Metadata tensors (cu_seqlens, slots, page tables, slot mappings, expert indices) are I32
 * tensors owned by the same backend as the data, so a device backend reads them on the device;
 * host-side sizes needed to launch work (n_seqs, max lengths) are in the params structs.
 *
 * Invariants: on error an op returns a negative K3_E* code (k3pd/err.h), logs nothing, and has
 * written nothing (validation precedes all writes). Output tensors must not alias inputs unless
 * the op says so. A backend instance is used by one thread at a time (the caller serialises).
 */
#ifndef K3K_H
#define K3K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                      */

typedef enum {
  K3K_F32 = 0,  /* IEEE binary32 */
  K3K_BF16 = 1, /* bfloat16 stored as uint16_t, RNE on write (k3_f32_to_bf16) */
  K3K_U8 = 2,   /* bytes: packed MXFP4 codes (two per byte) or E8M0 scales */
  K3K_I32 = 3,  /* int32 indices and lengths */
  K3K_PTR = 4,  /* addresses in the backend's memory (8 bytes each): MOE_ROUTED's expert table */
} k3k_dtype_t;

#define K3K_MAX_DIMS 4

struct k3k_backend;

/* A strided view. Does not own `data`; `backend` names the backend whose memory `data` is in
 * (NULL is accepted as "host memory" by the CPU backends). stride[] is in ELEMENTS (bytes for
 * U8). Dimensions past ndim are ignored. A dimension of size 0 is allowed where an op says so. */
typedef struct k3k_tensor {
  k3k_dtype_t dtype;
  int32_t ndim;
  int64_t shape[K3K_MAX_DIMS];
  int64_t stride[K3K_MAX_DIMS];
  void *data;
  struct k3k_backend *backend;
} k3k_tensor_t;

/* Bytes per element (1 for U8). */
size_t k3k_dtype_size(k3k_dtype_t dt);
const char *k3k_dtype_name(k3k_dtype_t dt);
/* A contiguous row-major view of `data` (shape[ndim-1] fastest). ndim 1..4. */
k3k_tensor_t k3k_tensor_make(struct k3k_backend *be, k3k_dtype_t dt, void *data, int ndim,
                             const int64_t *shape);
/* Convenience for 1-D/2-D/3-D contiguous views. */
k3k_tensor_t k3k_tensor_1d(struct k3k_backend *be, k3k_dtype_t dt, void *data, int64_t n0);
k3k_tensor_t k3k_tensor_2d(struct k3k_backend *be, k3k_dtype_t dt, void *data, int64_t n0,
                           int64_t n1);
k3k_tensor_t k3k_tensor_3d(struct k3k_backend *be, k3k_dtype_t dt, void *data, int64_t n0,
                           int64_t n1, int64_t n2);
/* View of `t` restricted to [start, start+len) along `dim` (same strides, moved data pointer). */
k3k_tensor_t k3k_tensor_slice(const k3k_tensor_t *t, int dim, int64_t start, int64_t len);
int64_t k3k_tensor_numel(const k3k_tensor_t *t);
/* True when the strides are the row-major strides of the shape. */
bool k3k_tensor_is_contiguous(const k3k_tensor_t *t);
/* Bytes spanned by the view (from data to one past its last element); 0 when numel is 0. */
size_t k3k_tensor_span_bytes(const k3k_tensor_t *t);

/* ------------------------------------------------------------------------------------------ */
/* Ops                                                                                          */

/* One value per line of k3k_ops.def (the single op list every op table is generated from). */
typedef enum {
#define K3K_OP_X(ENUM, name, n_tensors) K3K_OP_##ENUM,
#include "k3k_ops.def"
#undef K3K_OP_X
  K3K_OP_COUNT
} k3k_op_t;

#define K3K_MAX_ARGS 20 /* KDA_DECODE takes 18 */

const char *k3k_op_name(k3k_op_t op);

/* ---- Per-op params and tensor slots. "t[i]" is the i-th tensor passed to k3k_run(). Shapes use
 * T = packed tokens, N = sequences (or rows), C = channels. Inputs are F32 or BF16 unless said
 * otherwise; outputs are F32 or BF16 (the rounding point) unless said otherwise. ---- */

/* COPY: t[0]=x [any], t[1]=y [same shape]. Any dtype pair among F32/BF16; I32→I32 and U8→U8
 * copy bits. params: NULL. */

/* ADD: t[0]=a [R,C], t[1]=b [R,C], t[2]=y [R,C]; y = fp32(a)+fp32(b). y may alias a or b
 * (elementwise). params: NULL. */

/* GET_ROWS: t[0]=table [V,D], t[1]=ids I32 [T], t[2]=y [T,D]; y[t] = table[ids[t]].
 * An id outside [0,V) is K3_ERANGE (checked on the CPU backends before any write; a device
 * backend may report it after the fact as K3_ERANGE too). Also used to gather token rows per
 * expert and the rows that reach the lm_head. params: NULL. */

/* RMSNORM: t[0]=x [R,D], t[1]=w [D], t[2]=y [R,D].
 *   rstd = 1/sqrt(mean_d(x²) + eps)                            (fp32)
 *   bf16_inner=0: y = x·rstd·w                                (fp32, then y's dtype)
 *   bf16_inner=1: y = fp32(w) · bf16(x·rstd)                  (spec §8: gain AFTER a downcast)
 * y may alias x. */
typedef struct {
  float eps;      /* 1e-5 (1e-6 for MLA q_a/kv_a layernorms) */
  int bf16_inner; /* apply the inner bf16 rounding of §8 */
} k3k_rmsnorm_params_t;

/* GATED_RMSNORM (KDA o_norm, §3.7): t[0]=x [R,NH*Dh], t[1]=z [R,NH*Dh], t[2]=w [Dh] (shared by
 * all heads), t[3]=y [R,NH*Dh].  Per row r, head h (channels c = h*Dh + d):
 *   rstd = 1/sqrt(mean_d(x[r][h*Dh+d]²) + eps);  y = x·rstd·w[d]·sigmoid(z)   (all fp32)
 * No inner rounding (fla FusedRMSNormGated is fully fp32). */
typedef struct {
  int32_t head_dim; /* Dh = 128 */
  float eps;        /* 1e-5 */
} k3k_gated_rmsnorm_params_t;

/* GEMM: t[0]=x [M,K], t[1]=W [N,K] (any strides: sliced weight views are fine), t[2]=y [M,N].
 *   y[m][n] = Σ_k fp32(x[m][k])·fp32(W[n][k]), accumulated in fp32 in increasing k order
 * (the reference order; "cpu-fast" keeps it, so the two are bit-identical). params: NULL. */

/* MXFP4_GEMM: t[0]=x [M,K], t[1]=packed U8 [N,K/2], t[2]=scale U8 [N,K/32], t[3]=y [M,N].
 * K % 32 == 0. Code of W[n][k] = low nibble of packed[n][k/2] when k is even, high nibble when
 * odd; W[n][k] = E2M1(code) · 2^(scale[n][k/32] − 127), E2M1 = {0,.5,1,1.5,2,3,4,6} with bit 3
 * the sign. Scale bytes 0xFF (NaN in OCP MX) are rejected with K3_EINVAL. Accumulation as GEMM.
 * One call = one expert (pass views of that expert's tensors). params: NULL. */
/* MXFP4_DEQUANT: t[0]=packed U8 [N,K/2], t[1]=scale U8 [N,K/32], t[2]=W [N,K] F32/BF16 (exact
 * for normal scales). params: NULL. */

/* CONV_PREFILL (§3.2): t[0]=x [T,C] (raw projections, packed sequences), t[1]=w [C,W]
 * (w[c][W-1] multiplies the current token), t[2]=cu_seqlens I32 [N+1], t[3]=slots I32 [N],
 * t[4]=state [S,C,W-1] (state pool; in/out), t[5]=y [T,C].
 *   y_t[c] = silu(Σ_j w[c][j]·x_{t-W+1+j}[c])   (activation=0: no silu), inputs before the
 *   sequence start come from the incoming state (state[slot][c][j] = x_{start-W+1+j}, oldest
 *   first) when read_state, else are zero.
 * After the outputs, the state slot is overwritten with the last W-1 raw inputs of the
 * sequence, oldest first, taken from the incoming state (or zeros) when the sequence is shorter
 * than W-1. Sequences of length 0 keep their state. State dtype F32 or BF16 (bf16 state rounds
 * the stored raw inputs, which are bf16 already in bf16 mode). */
typedef struct {
  int32_t n_seqs;     /* N */
  int32_t read_state; /* 1: continue from the slot's state; 0: start from zeros */
  int32_t activation; /* 1: SiLU (K3/48B); 0: none */
} k3k_conv_params_t;
/* CONV_STEP: t[0]=x [N,C] (one token per sequence), t[1]=w [C,W], t[2]=slots I32 [N],
 * t[3]=state [S,C,W-1] (in/out), t[4]=y [N,C]. y = silu(Σ_{j<W-1} w[j]·s[j] + w[W-1]·x);
 * new state = [s[1..W-2], x]. Uses n_seqs and activation from k3k_conv_params_t. */

/* L2NORM (§3.3): t[0]=x [R,NH*Dh], t[1]=y [R,NH*Dh].
 *   y = x / sqrt(Σ_d x² + eps) · scale     per row and head (eps inside the sqrt of the SUM). */
typedef struct {
  int32_t head_dim; /* Dh */
  float eps;        /* 1e-6 */
  float scale;      /* 1 for k; q is scaled inside the KDA ops instead, so 1 there too */
} k3k_l2norm_params_t;

/* KDA_GATE: t[0]=g_raw [T,NH*Dh], t[1]=A_log F32 [≥NH] (per head), t[2]=dt_bias [NH*Dh],
 * t[3]=g F32 [T,NH*Dh] (log-space decay per head & key channel). All fp32:
 *   LOWER_BOUND (K3 §3.4):  g = lower_bound · sigmoid(exp(A_log[h]) · (g_raw + dt_bias))
 *   SOFTPLUS (48B §3.3):    g = −exp(A_log[h]) · softplus(g_raw + dt_bias),
 *                           softplus(a) = a > 20 ? a : log1p(exp(a))   (torch threshold 20) */
typedef enum { K3K_GATE_LOWER_BOUND = 0, K3K_GATE_SOFTPLUS = 1 } k3k_gate_form_t;
typedef struct {
  k3k_gate_form_t form;
  int32_t head_dim;  /* Dh */
  float lower_bound; /* −5 for K3; unused by SOFTPLUS */
} k3k_kda_gate_params_t;

/* SIGMOID: t[0]=x [R,C], t[1]=y [R,C]; y = 1/(1+exp(−x)) (KDA beta). params: NULL. */

/* KDA_CHUNK (§3.8, chunked prefill): t[0]=q [T,NH*Dk] (L2-normed, NOT yet scaled),
 * t[1]=k [T,NH*Dk] (L2-normed), t[2]=v [T,NH*Dv], t[3]=g F32 [T,NH*Dk] (from KDA_GATE),
 * t[4]=beta F32 [T,NH], t[5]=cu_seqlens I32 [N+1], t[6]=slots I32 [N],
 * t[7]=state F32 [S,NH,Dv,Dk] (V-FIRST pool: state[slot][h][v][k] = S[h][k][v]; in/out),
 * t[8]=o [T,NH*Dv].
 * Per sequence and head, q is multiplied by `scale` (0 → Dk^-0.5) in fp32 on load; the chunk
 * grid restarts at each sequence start (chunk = 64 rows; the last chunk may be shorter); inside a
 * chunk the WY/UT equations of §3.8 are evaluated exactly, with exp(G_r[d]−G_s[d]) taken per
 * element for s ≤ r only (never exp(G_r)·exp(−G_s)). The incoming state is the slot's state when
 * read_state, else zero; the final state is written back to the slot. Sequences of length 0 keep
 * their state. */
typedef struct {
  int32_t n_seqs;     /* N */
  int32_t n_heads;    /* NH */
  int32_t read_state; /* 1: slot state is the incoming S; 0: S_0 = 0 */
  float scale;        /* q scale; 0 → Dk^-0.5 */
  int32_t chunk;      /* chunk length; 0 → 64 */
} k3k_kda_params_t;
/* KDA_STEP (§3.6, decode): t[0]=q [N,NH*Dk], t[1]=k, t[2]=v [N,NH*Dv], t[3]=g F32 [N,NH*Dk],
 * t[4]=beta F32 [N,NH], t[5]=slots I32 [N], t[6]=state F32 [S,NH,Dv,Dk] (in/out),
 * t[7]=o [N,NH*Dv]. One token per sequence; uses n_seqs, n_heads, read_state, scale:
 *   S ← diag(exp g)·S;  u = v − Sᵀk;  S ← S + β k uᵀ;  o = Sᵀ(q·scale)  (updated S). */

/* MLA_PREFILL (§4.1 non-absorbed, NoPE, varlen causal with a prefix):
 * t[0]=q [Tq,NH*(Dn+Dr)] (per head [q_nope | q_rot], q_b_proj/q_proj output),
 * t[1]=kv [Tk,NH*(Dn+Dv)] (per head [k_nope | v], kv_b_proj output on the context latents),
 * t[2]=k_rot [Tk,Dr] (shared by all heads, unrotated), t[3]=cu_q I32 [N+1], t[4]=cu_k I32 [N+1],
 * t[5]=o [Tq,NH*Dv].
 * Sequence i has queries cu_q[i]..cu_q[i+1] and keys cu_k[i]..cu_k[i+1] with
 * Lk_i ≥ Lq_i; the queries are the LAST Lq_i positions of the context (bottom-right causal):
 * query j (0-based within the sequence) sees keys 0 .. Lk_i − Lq_i + j. A chunked prefill
 * gathers the prefix latents from the paged cache (MLA_CACHE_GATHER), runs kv_b_proj over prefix
 * + chunk, and calls this op. score = (Q_h·K_h)·scale, K_h = [k_nope_h | k_rot]; fp32 softmax
 * (max-subtracted); o_h = Σ p·v_h in fp32. */
typedef struct {
  int32_t n_seqs;     /* N */
  int32_t n_heads;    /* NH */
  int32_t d_nope;     /* Dn = 128 */
  int32_t d_rope;     /* Dr = 64 */
  int32_t d_v;        /* Dv = 128 */
  int32_t kv_lora;    /* c = 512 (MLA_DECODE / cache ops) */
  int32_t max_seqlen_q; /* host hints for launch grids; the CPU ignores them */
  int32_t max_seqlen_k;
  float scale;        /* 0 → (Dn+Dr)^-0.5 */
} k3k_mla_params_t;
/* MLA_DECODE (§4.3 absorbed, paged): t[0]=q [N,NH*(Dn+Dr)], t[1]=w_kvb [NH*(Dn+Dv), c]
 * (kv_b_proj.weight; W_UK_h = rows h*(Dn+Dv) .. +Dn, W_UV_h = the next Dv rows),
 * t[2]=cache [P,page_size,c+Dr] (rows c_n | k_rot), t[3]=page_table I32 [N,max_pages],
 * t[4]=seq_lens I32 [N] (cached tokens INCLUDING the current one, already written),
 * t[5]=o [N,NH*Dv].  Token τ of sequence i is cache[page_table[i][τ/ps]][τ%ps].
 *   q_lat = W_UKᵀ q_nope (fp32); score(τ) = (q_lat·c_n(τ) + q_rot·k_rot(τ))·scale;
 *   p = softmax (fp32); o_lat = Σ p·c_n; o_h = W_UV o_lat (fp32). Uses n_seqs, n_heads, d_*,
 *   kv_lora, scale. A sequence with seq_len 0 gets o = 0. */
/* MLA_CACHE_WRITE: t[0]=c_n [T,c], t[1]=k_rot [T,Dr], t[2]=slot_mapping I32 [T],
 * t[3]=cache [P,page_size,c+Dr] (in/out). Row slot_mapping[t] = page*page_size + offset of the
 * flattened cache gets [c_n[t] | k_rot[t]] (converted to the cache dtype). A negative slot
 * skips the token. params: NULL. */
/* MLA_CACHE_GATHER: t[0]=cache [P,page_size,c+Dr], t[1]=slot_mapping I32 [T], t[2]=y [T,c+Dr].
 * params: NULL. */

/* SIGMOID_MUL (MLA output gate, §4.1): t[0]=x [R,C], t[1]=g [R,C], t[2]=y [R,C].
 *   bf16_inner=0: y = x·sigmoid(g) (fp32)
 *   bf16_inner=1: y = bf16( bf16(x) · bf16(sigmoid(g)) )  ("bf16 sigmoid + bf16 multiply") */
typedef struct {
  int bf16_inner;
} k3k_sigmoid_mul_params_t;

/* ROUTER (§5.3; 48B §5.3): t[0]=logits F32 [T,E] (a GEMM with an F32 output), t[1]=bias [E]
 * (e_score_correction_bias, F32/BF16), t[2]=idx I32 [T,k], t[3]=w F32 [T,k].
 *   s = sigmoid(logits); sc = s + bias (selection only)
 *   groups (n_groups > 1): E split into n_groups equal groups; group score = sum of the top-2 sc
 *     in the group; keep the topk_group best groups (ties: lower group index), others excluded
 *   idx = the k best sc among kept experts, ordered by sc descending, ties → lower index first
 *   w = s[idx] (or sc[idx] when use_biased_weights: the 48B hub quirk); if renormalize:
 *     w /= (Σw + 1e-20); w *= scaling.   All fp32. */
typedef struct {
  int32_t top_k;
  int32_t n_groups;   /* 1 → no group step */
  int32_t topk_group; /* groups kept */
  int32_t renormalize;
  int32_t use_biased_weights;
  float scaling; /* routed_scaling_factor */
} k3k_router_params_t;

/* SITU (§5.1): t[0]=gate [R,F], t[1]=up [R,F], t[2]=y [R,F] (gate/up may be column views of one
 * [R,2F] GEMM output). y = β·tanh(g/β)·sigmoid(g) · βl·tanh(u/βl), fp32, one output rounding. */
typedef struct {
  float beta;     /* 4.0 */
  float beta_lin; /* 25.0 */
} k3k_situ_params_t;
/* SILU_MUL: t[0]=gate, t[1]=up, t[2]=y, all [R,F]; y = g·sigmoid(g)·u in fp32. params: NULL. */

/* MOE_COMBINE: t[0]=rows [Rx,D] (expert outputs, grouped by expert in any order),
 * t[1]=row_idx I32 [T,k] (row of rows holding token t's i-th expert output; −1 = skip),
 * t[2]=w F32 [T,k], t[3]=y [T,D].  y[t] = Σ_{i<k} w[t][i]·fp32(rows[row_idx[t][i]]), summed in
 * increasing i in fp32, one rounding (by y's dtype). params: NULL. See k3k_moe_plan(). */

/* ATTN_RES_MIX (§2.2): t[0]=snaps [nb,T,D] (completed block snapshots, nb may be 0),
 * t[1]=p [T,D] (current prefix sum), t[2]=w_norm [D], t[3]=w_proj [D], t[4]=y [T,D].
 * Per token: values v_0..v_nb = [snaps[0..nb-1], p] upcast to fp32;
 *   r_j = 1/sqrt(mean(v_j²)+eps); s_j = Σ_d v_j[d]·r_j·w_norm[d]·w_proj[d];
 *   α = softmax_j(s);  y = Σ_j α_j·v_j  (fp32, one rounding). nb = 0 → y = p. */
typedef struct {
  float eps; /* 1e-5 */
} k3k_attn_res_params_t;

/* SAMPLE: t[0]=logits [N,V] (F32/BF16), t[1]=ids I32 [N]. params: k3k_sample_params_t with a
 * HOST array of N per-row configurations.
 *
 * The sampled token is a pure function of (logits row, config, seed, step): it does not depend
 * on the row's position in the batch, the backend, or threads. Algorithm, per row:
 *   1. greedy when temperature <= 0 or top_k == 1: the argmax, lowest index on ties. Done.
 *   2. z_i = fp32(logit_i) / temperature.
 *   3. order all i by z descending, ties by lower index (a total order).
 *   4. top-k: when top_k > 0 keep the first min(top_k, V) of that order.
 *   5. p_i = exp(z_i − z_max) over the kept ones (fp32); Z = Σ p_i in that order (fp32).
 *   6. top-p: when 0 < top_p < 1 keep the shortest prefix whose running sum (in order, fp32)
 *      reaches top_p·Z (at least one token); Z' = that prefix's sum.
 *   7. draw u = k3k_rng_uniform(seed, step) ∈ [0,1); target = u·Z'; walk the kept prefix
 *      accumulating p_i (fp32) and return the first i whose running sum exceeds target (the
 *      last kept one if rounding leaves none).
 * NaN logits count as −inf. Prefill samples step 0, decode continues with steps 1..n: same
 * seed+step → same token. */
typedef struct k3k_sample_cfg {
  float temperature; /* <= 0 → greedy */
  int32_t top_k;     /* <= 0 → no limit */
  float top_p;       /* >= 1 or <= 0 → no limit */
  uint64_t seed;
  uint64_t step; /* generated-token index: 0 for the token sampled after prefill */
} k3k_sample_cfg_t;
typedef struct {
  int32_t n_rows;
  const k3k_sample_cfg_t *rows; /* host memory, n_rows entries; borrowed for the call */
} k3k_sample_params_t;

/* ---- Fusions (issue 19). Each op below means EXACTLY the chain of ops its comment names, with
 * the intermediate dtypes it names: the CPU reference runs that chain (kernels/cpu/fused.c), so
 * it is the specification by construction, and a device backend may run one fused kernel
 * instead. A device backend's `supports` says which shapes its fused kernel takes; the caller
 * runs the chain itself where it says no (k3k_supports asks without logging). ---- */

/* RES_MIX_NORM (the residual glue between two sub-layers, §2.2/§2.3):
 * t[0]=a [T,D] or NULL, t[1]=P [T,D] (in/out), t[2]=snaps [nb,T,D] or NULL, t[3]=w_norm [D],
 * t[4]=w_proj [D], t[5]=h [T,D] (t[3..5] NULL exactly when snaps is NULL), t[6]=lnw [D],
 * t[7]=xn [T,D].
 *   a != NULL:     P = ADD(P, a)                              (P's dtype)
 *   snaps != NULL: h = ATTN_RES_MIX(snaps, P; w_norm, w_proj, eps_mix)
 *   xn = RMSNORM(snaps ? h : P; lnw, eps, bf16_inner)
 * No output may alias another slot (P is updated in place). */
typedef struct {
  float eps_mix;  /* ATTN_RES_MIX eps */
  float eps;      /* RMSNORM eps */
  int bf16_inner; /* RMSNORM's inner rounding */
} k3k_res_mix_norm_params_t;

/* GEMM_MULTI (grouped projections of one input): t[0]=x [M,K], t[1+j]=W_j [N_j,K],
 * t[5+j]=y_j [M,N_j] for j < n; slots j >= n are NULL. y_j = GEMM(x, W_j) for each j, in j
 * order; no y_j may alias x, a weight or another y. */
#define K3K_GEMM_MULTI_MAX 4
typedef struct {
  int32_t n; /* 1..K3K_GEMM_MULTI_MAX */
} k3k_gemm_multi_params_t;

/* KDA_DECODE (§3.9 minus the projections, one token per sequence):
 * t[0]=q_raw, t[1]=k_raw, t[2]=v_raw [N,NH*Dh] (q/k/v projections before the conv),
 * t[3]=g_raw [N,NH*Dh] (decay-gate projection), t[4]=b_raw [N,NH] (beta projection),
 * t[5]=z [N,NH*Dh] (output-gate projection), t[6..8]=conv weights of q, k, v [NH*Dh,W],
 * t[9..11]=conv states of q, k, v [S,NH*Dh,W-1] (in/out), t[12]=A_log F32 [>=NH],
 * t[13]=dt_bias [NH*Dh], t[14]=o_norm weight [Dh], t[15]=slots I32 [N],
 * t[16]=state F32 [S,NH,Dh,Dh] (V-first, in/out), t[17]=out [N,NH*Dh].  With D = out's dtype:
 *   c_j = CONV_STEP(x_j; w_j, slots, state_j), activation SiLU     (D, j = q, k, v)
 *   qn, kn = L2NORM(c_q), L2NORM(c_k); head_dim Dh, l2_eps, scale 1   (F32)
 *   g = KDA_GATE(g_raw; A_log, dt_bias; gate_form, lower_bound)     (F32)
 *   beta = SIGMOID(b_raw)                                            (F32)
 *   o = KDA_STEP(qn, kn, c_v, g, beta; slots, state; read_state 1, scale)   (D)
 *   out = GATED_RMSNORM(o, z; o_norm, Dh, rms_eps)
 * Dk = Dv = Dh. Slots are checked as KDA_STEP checks them on the CPU backends; a device backend
 * may skip out-of-range slots instead (its fused kernel trusts host-validated ids). */
typedef struct {
  int32_t n_seqs;            /* N */
  int32_t n_heads;           /* NH */
  int32_t head_dim;          /* Dh = Dk = Dv (128) */
  k3k_gate_form_t gate_form; /* KDA_GATE form */
  float lower_bound;         /* KDA_GATE lower bound (LOWER_BOUND form) */
  float l2_eps;              /* L2NORM eps */
  float rms_eps;             /* GATED_RMSNORM eps */
  float scale;               /* KDA_STEP q scale; 0 → Dh^-0.5 */
} k3k_kda_decode_params_t;

/* MOE_ROUTED (the routed experts of a MoE block, §5.2-§5.4, router to combine):
 * t[0]=logits F32 [T,E], t[1]=bias [E], t[2]=x [T,D] (the experts' input), t[3]=experts PTR
 * [6,E] (MXFP4 experts) or [3,E] (dense experts), t[4]=idx I32 [T,k] (out), t[5]=w F32 [T,k]
 * (out), t[6]=y [T,D] (out, x's dtype), t[7]=ws U8 [bytes] or NULL (k3k_workspace bytes; NULL
 * when that is 0).  With A = x's dtype and the grouping of k3k_moe_plan:
 *   idx, w = ROUTER(logits, bias; router)
 *   expert_off, gather_tok, row_idx = k3k_moe_plan(idx)       (host helper)
 *   xg = GET_ROWS(x, gather_tok)                               (A, [T*k, D])
 *   for each expert e with rows [b, b+n) of the plan, on those rows of xg:
 *     g = G(xg, gate_e), u = G(xg, up_e)                       (A, [n, F])
 *     a = SITU(g, u; situ) (act 0) or SILU_MUL(g, u) (act 1)   (A)
 *     r = G(a, down_e)                                         (A, [n, D])
 *   y = MOE_COMBINE(r, row_idx, w)
 * G is MXFP4_GEMM when wdtype is U8 and t[3] has 6 rows (row 0/1: gate packed U8 [F,D/2] / scale U8 [F,D/32],
 * row 2/3: up, row 4/5: down packed [D,F/2] / scale [D,F/32]; D and F multiples of 32), GEMM
 * with wdtype weights when wdtype is F32/BF16 and t[3] has 3 rows (gate [F,D], up [F,D], down
 * [D,F]). Each table entry is the address of a
 * contiguous row-major matrix of that shape in the backend's memory (its k3k_backend_t alloc);
 * the table is trusted like a tensor's data pointer. A device backend does not check MXFP4
 * scales per call (the reference refuses 0xFF with K3_EINVAL): validate them once when loading.
 * x_mark (1..2; 0 none): x may still be produced on the side lane: the op joins side mark
 * x_mark (k3k_backend_side WAIT) before its first read of x (the router may run before). */
typedef struct {
  k3k_router_params_t router;
  k3k_dtype_t wdtype;     /* K3K_U8: MXFP4 experts (t[3] [6,E]); F32/BF16: dense ([3,E]) */
  int32_t F;              /* expert width (intermediate size) */
  int32_t act;            /* 0 = SITU (K3), 1 = SILU_MUL (48B) */
  k3k_situ_params_t situ; /* act 0 */
  int32_t x_mark;         /* side-lane mark to join before x is read; 0 = none */
} k3k_moe_routed_params_t;

/* Counter-based RNG used by SAMPLE. With sm(z) = the SplitMix64 output for state z
 * (z += 0x9E3779B97F4A7C15; z = (z^(z>>30))·0xBF58476D1CE4E5B9; z = (z^(z>>27))·0x94D049BB133111EB;
 * z^(z>>31)): x = sm(seed ^ sm(step)); returns (x >> 40)·2^-24, a multiple of 2^-24 in [0,1),
 * exact in fp32. No state: the value depends only on (seed, step). */
float k3k_rng_uniform(uint64_t seed, uint64_t step);
/* Host implementation of SAMPLE for one row (the CPU backends use it; a device backend may copy
 * logits to the host and call it to stay bit-identical). Returns 0 or K3_EINVAL/K3_ENOMEM. */
int k3k_sample_row(const float *logits, int64_t V, const k3k_sample_cfg_t *cfg, int32_t *out);
/* log softmax(logits)[tok] of the raw logits (no temperature), computed in double; what the
 * workers report as a token's logprob. tok must be < V. */
double k3k_logprob_row(const float *logits, int64_t V, int32_t tok);

/* ------------------------------------------------------------------------------------------ */
/* MoE planning (host helper, not an op): groups the (token, choice) pairs of a router result by
 * expert so that each expert's GEMMs run on contiguous rows.
 *   idx: host [T*k] expert ids from ROUTER. Outputs (caller-allocated host arrays):
 *   expert_off [E+1]: rows of expert e are [expert_off[e], expert_off[e+1]) of the grouped buffer;
 *   gather_tok [T*k]: token index of each grouped row (feed GET_ROWS to build expert inputs);
 *   row_idx [T*k]: grouped row of (t, i) (feed MOE_COMBINE).
 * Grouped order: by expert, then by token, then by i (stable, deterministic).
 * Returns K3_ERANGE naming nothing when an id is outside [0,E); nothing written then. */
int k3k_moe_plan(const int32_t *idx, int32_t T, int32_t k, int32_t E, int32_t *expert_off,
                 int32_t *gather_tok, int32_t *row_idx);

/* ------------------------------------------------------------------------------------------ */
/* Backends                                                                                     */

typedef struct k3k_backend {
  const char *name; /* "cpu", "cpu-fast", "cuda" */
  void *ctx;        /* backend private state */
  bool host_memory; /* true when data pointers are ordinary host memory (CPU backends) */
  /* Memory. alloc returns 0 or K3_ENOMEM; memory is at least 64-byte aligned, uninitialised. */
  int (*alloc)(struct k3k_backend *be, size_t bytes, void **out);
  void (*free)(struct k3k_backend *be, void *p);
  int (*copy_from_host)(struct k3k_backend *be, void *dst, const void *src, size_t bytes);
  int (*copy_to_host)(struct k3k_backend *be, void *dst, const void *src, size_t bytes);
  int (*copy)(struct k3k_backend *be, void *dst, const void *src, size_t bytes);
  int (*memset)(struct k3k_backend *be, void *dst, int byte, size_t bytes);
  /* Waits for all queued work; returns 0 or K3_EDEVICE. */
  int (*synchronize)(struct k3k_backend *be);
  /* Whether this backend implements `op` for these params and tensor dtypes/shapes (the args
   * have already passed k3k_op_validate()). Must not fail or have side effects. */
  bool (*supports)(struct k3k_backend *be, k3k_op_t op, const void *params,
                   const k3k_tensor_t *const *t, int nt);
  /* Runs one validated op. May be asynchronous on device backends (ordered on one stream). */
  int (*run)(struct k3k_backend *be, k3k_op_t op, const void *params,
             const k3k_tensor_t *const *t, int nt);
  /* Optional (NULL = the k3k_backend_side / k3k_backend_graph defaults below). */
  int (*side)(struct k3k_backend *be, int what, int mark);
  int (*graph)(struct k3k_backend *be, int what, void **g);
  /* Optional: bytes of device scratch the op needs in its `ws` slot (NULL = 0 for every op). */
  size_t (*workspace)(struct k3k_backend *be, k3k_op_t op, const void *params,
                      const k3k_tensor_t *const *t, int nt);
} k3k_backend_t;

/* The side lane (k3k_backend_side): work that does not depend on what the main lane does next
 * may run concurrently with it (a device backend's second stream). The results never change:
 * the same ops on the same inputs. A backend that runs ops in issue order (the CPU backends)
 * implements every request as a no-op returning 0, which keeps the same meaning.
 *   INIT: prepare the lane once (not during a graph capture); 0, K3_ENOMEM or K3_EDEVICE.
 *   BEGIN: ops issued after it go to the side lane, ordered after everything issued so far.
 *   MARK (mark 1..2): on the side lane, marks the side work issued so far.
 *   END: back to the main lane (which does not wait for anything).
 *   WAIT (mark 1..2): on the main lane, later work waits for side mark `mark`.
 * K3_EINVAL for a request out of order (BEGIN twice, MARK on main, ...) on a device backend. */
enum { K3K_SIDE_INIT = 0, K3K_SIDE_BEGIN, K3K_SIDE_MARK, K3K_SIDE_END, K3K_SIDE_WAIT };
int k3k_backend_side(k3k_backend_t *be, int what, int mark);

/* Graph capture (k3k_backend_graph): record the ops issued between BEGIN and END into a
 * replayable graph, launch it later with the same buffers. *g is an opaque handle owned by the
 * caller until FREE.
 *   BEGIN: start recording (g unused). END: stop; *g = the instantiated graph, or K3_EDEVICE
 *   (nothing recorded, *g = NULL) when an op could not be recorded (it synchronised or
 *   allocated). LAUNCH: run *g. FREE: destroy *g (NULL is fine). A backend without graphs
 *   (the CPU backends) answers K3_ENOTSUP to every request: the caller runs its ops eagerly,
 *   which means the same. */
enum { K3K_GRAPH_BEGIN = 0, K3K_GRAPH_END, K3K_GRAPH_LAUNCH, K3K_GRAPH_FREE };
int k3k_backend_graph(k3k_backend_t *be, int what, void **g);

/* The registry. Names: "cpu" (reference, single thread, the specification), "cpu-fast"
 * (threaded, cache-blocked; same results as "cpu" — see docs/kernels.md for the ops that differ
 * at rounding level), "cuda" (present when the CUDA backend is compiled in and a device exists).
 * Backends are created on first use and live until k3k_backends_shutdown(). Returns NULL for an
 * unknown or unavailable name. Thread-safe. */
k3k_backend_t *k3k_backend_get(const char *name);
/* Names of the backends compiled in (NULL-terminated static array); a listed one may still be
 * unavailable at run time (no device). */
const char *const *k3k_backend_names(void);
/* Frees every created backend (thread pools, device contexts). For tests and clean exits. */
void k3k_backends_shutdown(void);

/* Thread count of "cpu-fast": K3PD_KERNEL_THREADS when set, else the online CPUs; this call
 * changes it (1..256) for backends created later and resizes an existing pool. */
int k3k_cpu_fast_set_threads(int n);
int k3k_cpu_fast_get_threads(void);

/* Hook for the CUDA backend (kernels/cuda/, target k3_kernels_cuda): when CMake finds it, it
 * defines K3K_HAVE_CUDA for the registry, which calls this once on the first
 * k3k_backend_get("cuda"). Returns 0 and a backend, or K3_EDEVICE when no device is usable. */
int k3k_cuda_backend_create(k3k_backend_t **out);
void k3k_cuda_backend_destroy(k3k_backend_t *be);

/* Checks op, params and tensors (count, dtypes, shapes, strides, index ranges of host-visible
 * metadata not included). Returns 0 or K3_EINVAL with a message naming the op and the tensor
 * slot/field in err (may be NULL). */
int k3k_op_validate(k3k_op_t op, const void *params, const k3k_tensor_t *const *t, int nt,
                    char *err, size_t errcap);

/* Whether be would run this op (validation and `supports`, nothing logged, nothing run). */
bool k3k_supports(k3k_backend_t *be, k3k_op_t op, const void *params, const k3k_tensor_t *const *t,
                  int nt);

/* Bytes the op needs in its `ws` slot on be (ops with a ws slot: MOE_ROUTED; 0 for the others
 * and on the CPU backends, which pass NULL there). Asks the backend; call after validation
 * would pass (the ws slot itself is ignored here). */
size_t k3k_workspace(k3k_backend_t *be, k3k_op_t op, const void *params,
                     const k3k_tensor_t *const *t, int nt);

/* Validates, asks `supports`, and runs. K3_EINVAL on bad args (message via K3_DEBUG only; use
 * k3k_op_validate for the text), K3_ENOTSUP when the backend lacks the op. */
int k3k_run(k3k_backend_t *be, k3k_op_t op, const void *params, const k3k_tensor_t *const *t,
            int nt);

/* ------------------------------------------------------------------------------------------ */
/* Typed wrappers (each = k3k_run with the slot order documented above).                       */

int k3k_copy(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *y);
int k3k_add(k3k_backend_t *be, const k3k_tensor_t *a, const k3k_tensor_t *b,
            const k3k_tensor_t *y);
int k3k_get_rows(k3k_backend_t *be, const k3k_tensor_t *table, const k3k_tensor_t *ids,
                 const k3k_tensor_t *y);
int k3k_rmsnorm(k3k_backend_t *be, const k3k_rmsnorm_params_t *p, const k3k_tensor_t *x,
                const k3k_tensor_t *w, const k3k_tensor_t *y);
int k3k_gated_rmsnorm(k3k_backend_t *be, const k3k_gated_rmsnorm_params_t *p,
                      const k3k_tensor_t *x, const k3k_tensor_t *z, const k3k_tensor_t *w,
                      const k3k_tensor_t *y);
int k3k_gemm(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *w,
             const k3k_tensor_t *y);
int k3k_mxfp4_gemm(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *packed,
                   const k3k_tensor_t *scale, const k3k_tensor_t *y);
int k3k_mxfp4_dequant(k3k_backend_t *be, const k3k_tensor_t *packed, const k3k_tensor_t *scale,
                      const k3k_tensor_t *w);
int k3k_conv_prefill(k3k_backend_t *be, const k3k_conv_params_t *p, const k3k_tensor_t *x,
                     const k3k_tensor_t *w, const k3k_tensor_t *cu_seqlens,
                     const k3k_tensor_t *slots, const k3k_tensor_t *state,
                     const k3k_tensor_t *y);
int k3k_conv_step(k3k_backend_t *be, const k3k_conv_params_t *p, const k3k_tensor_t *x,
                  const k3k_tensor_t *w, const k3k_tensor_t *slots, const k3k_tensor_t *state,
                  const k3k_tensor_t *y);
int k3k_l2norm(k3k_backend_t *be, const k3k_l2norm_params_t *p, const k3k_tensor_t *x,
               const k3k_tensor_t *y);
int k3k_kda_gate(k3k_backend_t *be, const k3k_kda_gate_params_t *p, const k3k_tensor_t *g_raw,
                 const k3k_tensor_t *a_log, const k3k_tensor_t *dt_bias, const k3k_tensor_t *g);
int k3k_sigmoid(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *y);
int k3k_kda_chunk(k3k_backend_t *be, const k3k_kda_params_t *p, const k3k_tensor_t *q,
                  const k3k_tensor_t *k, const k3k_tensor_t *v, const k3k_tensor_t *g,
                  const k3k_tensor_t *beta, const k3k_tensor_t *cu_seqlens,
                  const k3k_tensor_t *slots, const k3k_tensor_t *state, const k3k_tensor_t *o);
int k3k_kda_step(k3k_backend_t *be, const k3k_kda_params_t *p, const k3k_tensor_t *q,
                 const k3k_tensor_t *k, const k3k_tensor_t *v, const k3k_tensor_t *g,
                 const k3k_tensor_t *beta, const k3k_tensor_t *slots,
                 const k3k_tensor_t *state, const k3k_tensor_t *o);
int k3k_mla_prefill(k3k_backend_t *be, const k3k_mla_params_t *p, const k3k_tensor_t *q,
                    const k3k_tensor_t *kv, const k3k_tensor_t *k_rot, const k3k_tensor_t *cu_q,
                    const k3k_tensor_t *cu_k, const k3k_tensor_t *o);
int k3k_mla_decode(k3k_backend_t *be, const k3k_mla_params_t *p, const k3k_tensor_t *q,
                   const k3k_tensor_t *w_kvb, const k3k_tensor_t *cache,
                   const k3k_tensor_t *page_table, const k3k_tensor_t *seq_lens,
                   const k3k_tensor_t *o);
int k3k_mla_cache_write(k3k_backend_t *be, const k3k_tensor_t *c_n, const k3k_tensor_t *k_rot,
                        const k3k_tensor_t *slot_mapping, const k3k_tensor_t *cache);
int k3k_mla_cache_gather(k3k_backend_t *be, const k3k_tensor_t *cache,
                         const k3k_tensor_t *slot_mapping, const k3k_tensor_t *y);
int k3k_sigmoid_mul(k3k_backend_t *be, const k3k_sigmoid_mul_params_t *p, const k3k_tensor_t *x,
                    const k3k_tensor_t *g, const k3k_tensor_t *y);
int k3k_router(k3k_backend_t *be, const k3k_router_params_t *p, const k3k_tensor_t *logits,
               const k3k_tensor_t *bias, const k3k_tensor_t *idx, const k3k_tensor_t *w);
int k3k_situ(k3k_backend_t *be, const k3k_situ_params_t *p, const k3k_tensor_t *gate,
             const k3k_tensor_t *up, const k3k_tensor_t *y);
int k3k_silu_mul(k3k_backend_t *be, const k3k_tensor_t *gate, const k3k_tensor_t *up,
                 const k3k_tensor_t *y);
int k3k_moe_combine(k3k_backend_t *be, const k3k_tensor_t *rows, const k3k_tensor_t *row_idx,
                    const k3k_tensor_t *w, const k3k_tensor_t *y);
int k3k_attn_res_mix(k3k_backend_t *be, const k3k_attn_res_params_t *p,
                     const k3k_tensor_t *snaps, const k3k_tensor_t *p_cur,
                     const k3k_tensor_t *w_norm, const k3k_tensor_t *w_proj,
                     const k3k_tensor_t *y);
int k3k_sample(k3k_backend_t *be, const k3k_sample_params_t *p, const k3k_tensor_t *logits,
               const k3k_tensor_t *ids);
int k3k_res_mix_norm(k3k_backend_t *be, const k3k_res_mix_norm_params_t *p, const k3k_tensor_t *a,
                     const k3k_tensor_t *P, const k3k_tensor_t *snaps, const k3k_tensor_t *w_norm,
                     const k3k_tensor_t *w_proj, const k3k_tensor_t *h, const k3k_tensor_t *lnw,
                     const k3k_tensor_t *xn);
/* w[n], y[n]: n = p->n pointers each. */
int k3k_gemm_multi(k3k_backend_t *be, const k3k_gemm_multi_params_t *p, const k3k_tensor_t *x,
                   const k3k_tensor_t *const *w, const k3k_tensor_t *const *y);
/* t: the 8 slots of MOE_ROUTED in order. */
int k3k_moe_routed(k3k_backend_t *be, const k3k_moe_routed_params_t *p,
                   const k3k_tensor_t *const *t);
/* t: the 18 slots of KDA_DECODE in order. */
int k3k_kda_decode(k3k_backend_t *be, const k3k_kda_decode_params_t *p,
                   const k3k_tensor_t *const *t);

#ifdef __cplusplus
}
#endif
#endif
