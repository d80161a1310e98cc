/* Deterministic synthetic weights (spec k3-model.md §11.1, kimi-linear-48b.md §10).
 *
 * Every value is a pure function of (full tensor name, seed, element index): a counter-based
 * generator (splitmix64 over xxhash64(name, seed) + index; Box-Muller for normals), so any
 * tensor, or any slice of it, can be generated independently, in parallel, or later on a GPU,
 * and the in-memory generator (weights.h) and k3pd-mkckpt agree bit for bit.
 * Distributions (by tmap role):
 *   linears, router, embed, lm_head, attn-res proj, bf16 experts:  N(0, 0.02^2), bf16-rounded
 *   norm gains (all RMSNorm weights incl. o_norm):                 1 + N(0, 0.1^2)
 *   A_log[:H] = log U(1,16), tail 0 (K3 pad); 48B [1,1,H,1] all used
 *   dt_bias: U(-7,-2) (K3) / U(-4,1) (48B)    conv: N(0, 0.3^2)    e_score_correction_bias: N(0, 0.01^2)
 *   MXFP4 experts: bf16 masters N(0, 0.02^2) of the logical weight, quantized per 32-group with
 *   mxfp4.h; packed and scale entries are derived from the SAME masters (keyed by the logical
 *   name "...experts.E.wN.weight"), and the dequantized values are the ground truth.
 * The same distributions are used for every preset (tiny and real-shape medium).
 * Values are rounded to the entry's dtype (bf16 RNE, or fp32). libm's log/cos are used, so
 * another libm may differ in the last fp32 ulp before rounding (rarely visible in bf16). */
#ifndef K3PD_SYNTH_H
#define K3PD_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/model_config.h"
#include "k3pd/tmap.h"

/* Fills dst with bytes [byte_begin, byte_begin + nbytes) of entry e's data. For BF16/F32 entries
 * the range must be element-aligned; for MXFP4 (U8) entries any byte range works (each touched
 * 32-group is regenerated). Returns 0 or K3_EINVAL (range, alignment or unsupported dtype). */
int k3_synth_fill(const k3_model_config_t *cfg, const k3_tmap_entry_t *e, uint64_t seed,
                  uint64_t byte_begin, size_t nbytes, void *dst);

/* Fills entries[i] completely into dst[i] (entries[i].nbytes bytes each; any alignment) with
 * `threads` workers: 0 = online CPUs, capped at K3_SYNTH_MAX_THREADS (weights.h's
 * K3_WEIGHTS_SYNTH_MAX_THREADS), 1 = the calling thread only. Tensors are cut into 4 MiB slices
 * handed out from a shared counter, so a few huge tensors spread over all workers too; each slice
 * is one k3_synth_fill, so the bytes are identical for any thread count (and to k3pd-mkckpt).
 * The caller works too; every thread is joined before return. progress: a stderr line roughly
 * every GiB when the total is at least 1 GiB. Returns 0, K3_EINVAL (threads < 0), K3_ENOMEM or
 * the first k3_synth_fill error, then with *failed (if not NULL) = the failing entry's index and
 * dst's contents unspecified. */
#define K3_SYNTH_MAX_THREADS 64
int k3_synth_fill_many(const k3_model_config_t *cfg, const k3_tmap_entry_t *entries, size_t n,
                       uint64_t seed, uint8_t *const *dst, int threads, bool progress, size_t *failed);

/* The value of element idx of entry e before rounding to its dtype. For MXFP4 entries: the
 * bf16-rounded master of the logical [N, K] weight (idx < logical_rows*logical_cols), i.e. the
 * quantizer's input. For tests and kernels. */
float k3_synth_value(const k3_model_config_t *cfg, const k3_tmap_entry_t *e, uint64_t seed,
                     uint64_t idx);

/* The counter-based primitives, exposed for GPU ports and tests. */
uint64_t k3_synth_key(const char *name, uint64_t seed);
uint64_t k3_synth_u64(uint64_t key, uint64_t ctr);  /* splitmix64(key + ctr * golden) */
double k3_synth_uniform(uint64_t key, uint64_t ctr); /* in (0, 1) */
double k3_synth_normal(uint64_t key, uint64_t idx);  /* N(0,1): Box-Muller on counters 2idx, 2idx+1 */

#endif
