/* The model runner: builds the Kimi-K3 (`kimi_k3`) and Kimi-Linear-48B (`kimi_linear`) forward
 * pass out of the k3k op API (k3k.h), and owns the per-sequence decode state pools.
 *
 * What it is for:
 *   - prefill: a packed batch of sequences of different lengths, each continuing from whatever
 *     state its sequence already holds (len 0 = fresh), internally chunked for long prompts;
 *     returns logits of the last position of every sequence (or of every position on request);
 *   - decode_step: one token for each sequence of a batch, sequences at different positions;
 *   - state: an MLA latent cache in fixed-size pages (page size chosen at init) with a per-
 *     sequence page table, and one KDA slot per sequence (recurrent S fp32 V-first [H,V,K] plus
 *     the conv states of q/k/v); both pools are sized at init;
 *   - export/import of one sequence's state region by region (the regions of the state
 *     manifest), so a prefill worker can hand a sequence to a decode worker.
 * What it is not: a scheduler. It never decides which sequences run; the caller (decode
 * worker, prefill worker, k3pd-generate) allocates pages and slots through the pool API below
 * and passes fully described sequences in. No backend-specific code lives here: every numeric
 * step goes through the k3k op API of the backend chosen at init.
 *
 * Precision (chosen at init, part of the state fingerprint):
 *   K3_RUNNER_FP32 - every activation and accumulation fp32; weights read from bf16/MXFP4
 *                    exactly; MLA latents and KDA conv states are STORED fp32 (storing them bf16
 *                    would make prefill(T) differ from prefill(T-k) + k decode steps).
 *   K3_RUNNER_BF16 - the rounding points of spec k3-model.md §8 (production engines); MLA
 *                    latents and conv states are stored bf16 (spec §10.2).
 *
 * Invariants:
 *   - a sequence's result never depends on the other sequences of the batch (bit-identical);
 *   - prefill(A) then prefill(B) == prefill(A|B) for any split (chunk grid restarts per call);
 *   - export -> import into a fresh slot/pages -> continue == never exported, bit for bit.
 * Threading: one runner is used by one thread at a time (the backend may use its own worker
 * threads inside an op). Errors: 0 or negative K3_E*; on error the sequences' states are
 * unspecified only where a forward pass already started (documented per function). */
#ifndef K3_RUNNER_H
#define K3_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/manifest.h"
#include "k3pd/model_config.h"
#include "k3pd/weights.h"

typedef enum { K3_RUNNER_FP32 = 0, K3_RUNNER_BF16 = 1 } k3_runner_precision_t;

/* Where the state arena comes from (k3_runner_opts_t.state). Zero-initialised = the backend's
 * own allocator. At most one of alloc / vmm:
 *   alloc/free/ud - host backends only: the caller's memory (e.g. UCX-allocated, so a
 *                   same-host sender can map it). alloc(ud, bytes) is called ONCE at init and
 *                   must return 256-byte-aligned memory or NULL (K3_ENOMEM); free(ud, p) once
 *                   at k3_runner_free (or when init fails after the call). The runner zeroes it.
 *   vmm           - backend "cuda" only: the arena is one k3k_vmm allocation (k3k_xdev.h),
 *                   exportable as a file descriptor (k3_runner_state_vmm). */
typedef struct {
  void *(*alloc)(void *ud, size_t bytes);
  void (*free)(void *ud, void *p);
  void *ud;
  bool vmm;
} k3_runner_arena_opts_t;

typedef struct {
  k3_runner_precision_t precision;
  const char *backend;      /* "cpu" (reference), "cpu-fast" or "cuda" (bf16 only); NULL = "cpu" */
  int threads;              /* worker threads of the backend (cpu-fast); <= 0 = 1 */
  int page_tokens;          /* tokens per MLA latent page (e.g. 16 or 64); > 0 */
  int num_pages;            /* page pool size (shared by all MLA layers: page p exists in each) */
  int num_slots;            /* KDA slot pool size (one slot per live sequence) */
  int max_batch_seqs;       /* most sequences in one prefill / decode_step call */
  int prefill_chunk_tokens; /* per-sequence tokens per forward pass inside prefill; rounded up
                               to a multiple of 64 (KDA chunk); <= 0 = 256 */
  k3_runner_arena_opts_t state; /* the state arena's memory (see above); zero = backend alloc */
  /* Shared weights (docs/gpu-cluster.md §4; device backends): NULL = this runner's own copy.
   * Else the directory through which processes on this host share ONE read-only copy of the
   * weights (created 0700 when missing): the first process generates/uploads them into a
   * k3k_vmm allocation and serves it on DIR/<pid>-<tag>.sock; later ones import it. Waiting for
   * DIR/.lock is bounded by share_wait_ms (<= 0: 600000). A holder with other weights is an
   * error naming both identities (never a silent second copy). */
  const char *share_weights_dir;
  int share_wait_ms;
  /* Names where the weights come from, for the shared weights' identity (with the config's
   * canonical text): e.g. "synthetic seed=1" or "checkpoint <hash of its safetensors headers and
   * file sizes>". NULL: "synthetic seed=N" for k3_runner_init_synth; k3_runner_init with
   * share_weights_dir needs it (K3_EINVAL). The loader (k3_load.h) sets it. */
  const char *weights_source;
} k3_runner_opts_t;

/* Defaults: fp32, "cpu", 1 thread, 64-token pages, 64 pages, 4 slots, 8 seqs, 256 tokens, state
 * arena from the backend, own weights. */
void k3_runner_opts_default(k3_runner_opts_t *o);

typedef struct k3_runner k3_runner_t;

/* Builds a runner over `w` (file-backed or synthetic; NOT owned, must outlive the runner) and
 * allocates the pools. Errors: K3_EINVAL (bad option, named in err), K3_ENOTSUP (unknown
 * backend / model feature), K3_ENOENT/K3_EFORMAT (a tensor missing or malformed, named),
 * K3_ENOMEM; with shared weights also K3_EFINGERPRINT (a holder with other weights, both
 * identities named), K3_ETIMEDOUT (share_wait_ms), K3_EIO. On error *out is untouched and
 * everything allocated (fds, mappings, the caller's state memory) was handed back. The strings
 * of opts (backend, share_weights_dir, weights_source) are read during init only
 * (k3_runner_opts returns the two sharing strings as NULL). */
int k3_runner_init(const k3_weights_t *w, const k3_runner_opts_t *opts, k3_runner_t **out,
                   char *err, size_t errlen);
/* Same over weights generated directly in device memory: every tensor of cfg's plan with the
 * bytes k3_synth_fill(cfg, entry, seed) gives (the generator and seed k3pd-mkckpt and
 * k3_weights_synth use), computed on the GPU (values the device's libm might round differently
 * are recomputed on the host), so no host copy of the model exists (the medium preset: 91.6
 * GB). Backend "cuda" only (else K3_ENOTSUP). verify_kib > 0 compares two slices of that many
 * KiB of every tensor with the host generator, < 0 every byte (slow), 0 none; a mismatch is
 * K3_EINTERNAL naming the tensor. Progress lines on stderr every 8 GiB and a summary. */
int k3_runner_init_synth(const k3_model_config_t *cfg, uint64_t seed, int verify_kib,
                         const k3_runner_opts_t *opts, k3_runner_t **out, char *err, size_t errlen);
/* A runner on a host backend ("cpu", "cpu-fast") over a host copy of the weights of `src` (made
 * by k3_runner_init_synth; copied tensor by tensor, D2H): the CPU reference for device-generated
 * weights without a second generation (medium: 85.3 GiB of host memory, seconds instead of
 * ~20 min on 16 cores). src must outlive the copy (the plan is shared). K3_EINVAL for another
 * src, K3_ENOTSUP for a device backend. */
int k3_runner_init_copy(const k3_runner_t *src, const k3_runner_opts_t *opts, k3_runner_t **out,
                        char *err, size_t errlen);
void k3_runner_free(k3_runner_t *r);

const k3_model_config_t *k3_runner_config(const k3_runner_t *r);
const k3_runner_opts_t *k3_runner_opts(const k3_runner_t *r);
/* The backend the runner computes on (its device for k3k_xdev / k3k_vmm / k3k_dev_copy, which
 * other threads may use; the backend's own ops stay the runner thread's). */
struct k3k_backend *k3_runner_backend(const k3_runner_t *r);
int64_t k3_runner_vocab(const k3_runner_t *r);

/* ---- sequences and pools ------------------------------------------------------------------
 * A sequence is described by the caller. `pages` is a caller-owned array of `cap_pages` page
 * ids of which the first `n_pages` are in use (page i holds tokens [i*page_tokens,
 * (i+1)*page_tokens)). `len` counts the tokens whose state is already in the pages/slot.
 * Before a call that adds T tokens, n_pages must cover len+T tokens (see k3_runner_seq_reserve);
 * a model without KDA layers ignores `slot`, one without MLA layers ignores the pages. */
typedef struct {
  int slot;         /* KDA slot id, or -1 */
  int64_t len;      /* tokens already processed into the state */
  int32_t *pages;   /* page table (caller-owned storage) */
  int n_pages;      /* pages in use */
  int cap_pages;    /* capacity of `pages` */
} k3_seq_t;

/* Pool API. Alloc returns K3_ECAPACITY (nothing allocated) when not enough are free. Slots and
 * pages come back zeroed (a fresh slot is the zero KDA state). Freeing an id that is not
 * allocated is K3_EINVAL. */
int k3_runner_slot_alloc(k3_runner_t *r, int *slot);
int k3_runner_slot_free(k3_runner_t *r, int slot);
int k3_runner_pages_alloc(k3_runner_t *r, int n, int32_t *pages);
int k3_runner_pages_free(k3_runner_t *r, int n, const int32_t *pages);
int k3_runner_free_slots(const k3_runner_t *r);
int k3_runner_free_pages(const k3_runner_t *r);
/* Pages needed to hold `tokens` tokens. */
int k3_runner_pages_for(const k3_runner_t *r, int64_t tokens);

/* Monolithic convenience: makes `seq` able to hold `total_tokens` (allocating its slot on
 * first use and any missing pages). On K3_ECAPACITY nothing changed. */
int k3_runner_seq_reserve(k3_runner_t *r, k3_seq_t *seq, int64_t total_tokens);
/* Adopts ids chosen by someone else (a decode worker allocates page/slot ids for a reservation
 * on its control thread and hands the sequence to the runner's thread): marks seq->slot and
 * seq->pages[0..n_pages) as allocated WITHOUT zeroing them (their contents are about to be
 * imported). K3_EINVAL when an id is out of range, repeated or already allocated; on error
 * nothing changed. Release with k3_runner_seq_release. */
int k3_runner_seq_claim(k3_runner_t *r, const k3_seq_t *seq);
/* Copies KDA slot `src` (recurrent S and the three conv states of every KDA layer) into slot
 * `dst`, both allocated and distinct (K3_EINVAL otherwise), on the backend (device to device on
 * cuda). A prefix cache takes a checkpoint of a sequence's recurrent state this way, and a hit
 * starts a new sequence from one: the copy is the exact state, bit for bit. */
int k3_runner_slot_copy(k3_runner_t *r, int dst, int src);
/* Marks every page and slot allocated, for a caller that bookkeeps ids itself and shares pages
 * between sequences (the decode worker's free lists and prefix cache): the forward passes'
 * id checks then accept any in-range id, and k3_runner_seq_claim/seq_release must no longer
 * be used. A sequence with len 0 still starts from the zero KDA state (prefill zeroes it). */
int k3_runner_claim_all(k3_runner_t *r);
/* Returns the sequence's slot and pages to the pools and resets it (len 0, slot -1). */
void k3_runner_seq_release(k3_runner_t *r, k3_seq_t *seq);

/* ---- forward -------------------------------------------------------------------------------*/

typedef struct {
  k3_seq_t *seq;          /* state in/out; seq->len advances by n_tokens on success */
  const int32_t *tokens;  /* n_tokens new token ids (< vocab) */
  int64_t n_tokens;       /* >= 1 */
  float *logits;          /* out: vocab floats (last position), or n_tokens*vocab when
                             all_logits, row-major; NULL = no logits wanted */
  bool all_logits;
} k3_prefill_item_t;

/* Fired when layer `layer`'s per-sequence state (pages of an MLA layer / the slot region of a
 * KDA layer) is final for EVERY sequence of the call, while later layers still compute. The
 * callback may read (export) that layer's regions; it must not call forward functions.
 * A non-zero return aborts the prefill with that code. */
typedef int (*k3_layer_done_fn)(int layer, void *ctx);

/* Runs n items (n <= max_batch_seqs). A sequence with len 0 starts from the zero state
 * (its slot is zeroed first); otherwise it continues from its state. Errors before any compute
 * (K3_EINVAL bad item/token, K3_ECAPACITY pages missing) change nothing; an error from the
 * callback leaves the sequences' states unspecified (release them). */
int k3_runner_prefill(k3_runner_t *r, k3_prefill_item_t *items, int n, k3_layer_done_fn on_layer_done,
                      void *cb_ctx, char *err, size_t errlen);

typedef struct {
  k3_seq_t *seq;   /* seq->len >= 1 (a decode step continues a prefilled sequence) */
  int32_t token;   /* the token to feed (the previously sampled one) */
  float *logits;   /* out: vocab floats; NULL = none */
  /* Optional: sample the next token inside the step with this configuration (seed and step as
   * the caller would give k3k_sample_row) into *sampled. When EVERY item of a call sets it and
   * none wants logits, a device backend samples on the device (greedy rows never leave it:
   * n ids come back instead of n x vocab floats; k3k.h SAMPLE is the same pure function as
   * k3k_sample_row, so the token is the one host sampling would pick); otherwise the runner
   * samples the rows on the host from their logits. NULL = not sampled here. */
  const struct k3k_sample_cfg *sample;
  int32_t *sampled;
} k3_decode_item_t;

/* One decode step for each of n sequences (recurrent KDA step, absorbed paged MLA decode).
 * Same error contract as prefill (no callback). */
int k3_runner_decode_step(k3_runner_t *r, k3_decode_item_t *items, int n, char *err,
                          size_t errlen);

/* ---- CUDA decode: trusted ids and graphs ---------------------------------------------------
 * On the "cuda" backend (bf16, MoE experts on the grouped device path) a decode step builds all
 * of its metadata (token ids, slots, cache rows, page tables, lengths) on the host, validates it
 * there, uploads it in ONE copy into a fixed device buffer, and runs with the backend's id checks
 * off (they would synchronise per op). The step is captured into a CUDA graph per (batch size,
 * context bucket) and replayed on later steps of the same key: the context bucket is the
 * smallest power of two >= the longest sequence (at least page_tokens), which is also the
 * MLA_DECODE max_seqlen_k hint of eager steps, so replay and eager execution launch identical
 * kernels and give bit-identical logits. Steps run eagerly until a key has been seen once with
 * the workspace already large enough (first step of a key: eager, second: capture + launch,
 * then replay); graphs are recaptured when the workspace arena or the backend's scratch memory
 * was reallocated since (e.g. after a longer prefill). At most 16 graphs are kept (LRU). Every
 * row's logits are computed on this path (a NULL logits pointer only skips the copy). */
typedef struct {
  uint64_t eager_steps;      /* device decode steps run op by op */
  uint64_t graph_captures;   /* graphs captured (each also ran its step once) */
  uint64_t graph_replays;    /* steps run by replaying a captured graph */
  uint64_t capture_failures; /* captures abandoned (the step then ran eagerly; logged once) */
} k3_runner_stats_t;
void k3_runner_get_stats(const k3_runner_t *r, k3_runner_stats_t *out);
/* Graphs on (default) or off (every step eager; captured graphs are dropped). No effect on
 * backends without the device decode path. */
void k3_runner_set_graphs(k3_runner_t *r, bool on);

/* ---- roofline figures (for benchmarks) ------------------------------------------------------
 * Bytes one decode step of `batch` sequences must move at least: every stored weight except the
 * embedding table (one row per sequence) and the routed experts, of which the expected number
 * of DISTINCT experts per MoE layer under uniform routing, E·(1 − (1 − k/E)^batch) (= k at batch
 * 1), as stored (MXFP4 packed + scales); plus each sequence's KDA state read and written
 * (manifest kda_bytes_per_slot, twice). MLA cache reads are not counted (small at short
 * contexts). */
double k3_runner_decode_bytes(const k3_runner_t *r, int batch);
/* FLOPs a prefill of one T-token sequence must do at least: 2·T·(active parameters per token:
 * every weight except embedding and lm_head, routed experts k/E of theirs) + 2·(lm_head) for the
 * last row + MLA causal attention 2·T(T+1)/2·heads·(d_qk + d_v) per MLA layer + KDA chunked
 * core ~12·Dk·Dv per token and head per KDA layer (state/intra-chunk products: ~155 GFLOP for
 * 8K tokens x 96 heads, issue 8's figure). */
double k3_runner_prefill_flops(const k3_runner_t *r, int64_t T);

/* ---- state manifest and export/import ------------------------------------------------------
 * The regions of one sequence are those of the runner's manifest (k3pd/manifest.h, built by
 * k3_manifest_build for the runner's page size), in manifest order: per MLA layer ONE region
 * (the sequence's pages of that layer, in page order, whole pages of page_tokens x cache_dim
 * elements), per KDA layer FOUR (S fp32 [H,V,K] V-first, conv q, conv k, conv v [P, W-1]
 * oldest first). The runner adjusts the manifest to its precision: in fp32 mode the MLA
 * latents and conv states are F32 (ckpt's builder assumes bf16), their byte counts follow, and
 * the fingerprint is re-derived from ckpt's fingerprint plus the precision and the adjusted
 * regions, so fp32 and bf16 runners never share a fingerprint. */
const k3_manifest_t *k3_runner_manifest(const k3_runner_t *r);
/* Bytes of region i for a sequence of `len` tokens (MLA: pages_for(len) x bytes per page). */
uint64_t k3_runner_region_bytes(const k3_runner_t *r, int i, int64_t len);
uint64_t k3_runner_fingerprint(const k3_runner_t *r);

/* Copies region i of `seq` into dst (cap bytes, at least region_bytes(i, seq->len)).
 * K3_ERANGE when too small; K3_EINVAL for a bad region/sequence. */
int k3_runner_export_region(const k3_runner_t *r, const k3_seq_t *seq, int i, void *dst,
                            size_t cap);
/* Writes region i of `seq` from src (exactly region_bytes(i, seq->len) bytes); seq must
 * already hold its slot and enough pages for seq->len tokens (the importer sets seq->len to
 * the exporter's length first). */
int k3_runner_import_region(k3_runner_t *r, k3_seq_t *seq, int i, const void *src, size_t len);

/* Raw pool memory of manifest region i for zero-copy transfer (UCX registration): the slot
 * (KDA) or page (MLA) with id `id` of that region lives at base + id*stride_bytes and is
 * manifest->regions[i].bytes long; count = pool size. K3_EINVAL for a bad i. */
int k3_runner_pool_mem(const k3_runner_t *r, int i, void **base, size_t *stride_bytes,
                       size_t *count);

/* ---- memory layout (docs/gpu-cluster.md §2, §4) ----------------------------------------------
 * State arena: every state pool tensor (per KDA layer S and conv q/k/v, per MLA layer the page
 * pool) lives in ONE allocation, each at its own 256-byte-aligned offset with the layout
 * documented above ([num_slots|num_pages, ...]), so every k3_runner_pool_mem base lies inside
 * [base, base + bytes). Backend memory (device addresses on cuda). */
void k3_runner_state_arena(const k3_runner_t *r, void **base, size_t *bytes);
/* The state arena as a k3k_vmm allocation (opts.state.vmm), NULL otherwise. Owned by the
 * runner (export it with k3k_vmm_export; do not free). */
struct k3k_vmm *k3_runner_state_vmm(const k3_runner_t *r);
/* Weights arena (device backends): every weight tensor bound inside one allocation, at bump
 * offsets in bind order, 256-byte aligned; *bytes 0 and *base NULL on host backends (their
 * weights are views onto the checkpoint's mapping). `layout_hash`: XXH3 over (name, dtype, shape,
 * bytes, offset) of every bound tensor (the same for the same config on any process). Any
 * pointer may be NULL. */
void k3_runner_weights_arena(const k3_runner_t *r, void **base, size_t *bytes, uint64_t *layout_hash);
/* Where this runner's weights came from with shared weights: 0 own copy (no sharing), 1 made
 * here and served to others, 2 imported read-only from another process (nothing generated). */
int k3_runner_weights_shared(const k3_runner_t *r);

#endif
