/* The CUDA backend's side stream (k3k_cuda_side_* in k3k_cuda_ops.h): a second stream onto
 * which a caller moves ops that are independent of the main stream's next ops, so two
 * bandwidth-starved phases of a decode step overlap (the MoE block's shared expert beside the
 * routed experts: at batch 1 the routed-expert kernels read at ~55 % of the copy bandwidth).
 *
 * What it is not: a scheduler. The caller says where the fork and the joins are; ops do not
 * know which stream they are on (they read cx->stream, cx->lt_ws and cx->scratch, which the
 * lane switch swaps).
 *
 * Invariants: the two lanes never share a cuBLASLt workspace or a scratch buffer; every side
 * ordering goes through an event recorded on one lane and waited on by the other, which is also
 * what a stream capture turns into graph edges (the side stream joins a capture by waiting on the
 * fork event recorded on the capturing main stream); the caller joins every mark it forks before
 * its capture ends (otherwise cudaStreamEndCapture fails: "unjoined"). */
#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "k3k_cuda_ops.h"

static void swap_lane(k3k_cuda_ctx *cx) {
  cudaStream_t s = cx->stream;
  void *ws = cx->lt_ws, *sc = cx->scratch;
  size_t sb = cx->scratch_bytes;
  cx->stream = cx->other.stream;
  cx->lt_ws = cx->other.lt_ws;
  cx->scratch = cx->other.scratch;
  cx->scratch_bytes = cx->other.scratch_bytes;
  cx->other.stream = s;
  cx->other.lt_ws = ws;
  cx->other.scratch = sc;
  cx->other.scratch_bytes = sb;
}

int k3k_cuda_side_init(k3k_cuda_ctx *cx) {
  if (cx->side_ready) return 0;
  K3K_CU(cudaSetDevice(cx->device));
  if (!cx->other.lt_ws && cudaMalloc(&cx->other.lt_ws, cx->lt_ws_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    cx->other.lt_ws = NULL;
    K3_ERROR("cuda: side stream's cuBLASLt workspace (%zu bytes) unavailable", cx->lt_ws_bytes);
    return K3_ENOMEM;
  }
  if (!cx->other.stream) K3K_CU(cudaStreamCreateWithFlags(&cx->other.stream, cudaStreamNonBlocking));
  for (int i = 0; i < 3; i++)
    if (!cx->side_ev[i]) K3K_CU(cudaEventCreateWithFlags(&cx->side_ev[i], cudaEventDisableTiming));
  cx->side_ready = 1;
  return 0;
}

int k3k_cuda_side_begin(k3k_cuda_ctx *cx) {
  if (!cx->side_ready || cx->on_side) return K3_EINVAL;
  K3K_CU(cudaEventRecord(cx->side_ev[0], cx->stream));
  K3K_CU(cudaStreamWaitEvent(cx->other.stream, cx->side_ev[0], 0));
  swap_lane(cx);
  cx->on_side = 1;
  return 0;
}

int k3k_cuda_side_mark(k3k_cuda_ctx *cx, int i) {
  if (!cx->on_side || i < 1 || i > 2) return K3_EINVAL;
  K3K_CU(cudaEventRecord(cx->side_ev[i], cx->stream));
  return 0;
}

int k3k_cuda_side_end(k3k_cuda_ctx *cx) {
  if (!cx->on_side) return K3_EINVAL;
  swap_lane(cx);
  cx->on_side = 0;
  return 0;
}

int k3k_cuda_side_wait(k3k_cuda_ctx *cx, int i) {
  if (!cx->side_ready || cx->on_side || i < 1 || i > 2) return K3_EINVAL;
  K3K_CU(cudaStreamWaitEvent(cx->stream, cx->side_ev[i], 0));
  return 0;
}

void k3k_cuda_side_destroy(k3k_cuda_ctx *cx) {
  if (cx->on_side) swap_lane(cx);
  cx->on_side = 0;
  if (cx->other.stream) {
    cudaStreamSynchronize(cx->other.stream);
    cudaStreamDestroy(cx->other.stream);
  }
  if (cx->other.lt_ws) cudaFree(cx->other.lt_ws);
  if (cx->other.scratch) cudaFree(cx->other.scratch);
  for (int i = 0; i < 3; i++)
    if (cx->side_ev[i]) cudaEventDestroy(cx->side_ev[i]);
  cx->other.stream = NULL;
  cx->other.lt_ws = cx->other.scratch = NULL;
  cx->other.scratch_bytes = 0;
  cx->side_ready = 0;
}
