/* The host schedule of the dequant-once MoE path (kernels/cuda/moe_dq.cu): which experts are
 * dequantised together and how many rows each expert's GEMM computes.
 *
 * What it is for: moe_dq.cu runs its launches in this order; test_kernels (t_route.c) checks
 * the schedule's invariants on random plans, which is what makes the padded GEMMs safe.
 * What it is not: a device plan (that is k3k_cu_moe_plan) or a launch.
 * Invariants (for plan offsets off[0..E] non-decreasing from 0 to tk): one item per expert with
 * rows, in ascending expert order; items are cut into groups of at most `group` consecutive
 * items (group ids 0, 1, ...); an item's GEMM computes rows [row0, row0 + gemm_rows) with
 * gemm_rows = rows rounded up to a multiple of pad but never past tk, so the rows it computes
 * beyond its own belong to experts after it, whose own GEMMs run later and overwrite them. */
#ifndef K3K_MOE_DQ_PLAN_H
#define K3K_MOE_DQ_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t expert, group;
  int64_t row0, rows, gemm_rows;
} k3k_moe_dq_item;

/* Writes at most E items; returns how many (the active experts), or -1 when off is not
 * non-decreasing from 0, group < 1 or pad < 1. */
int32_t k3k_moe_dq_schedule(const int32_t *off, int32_t E, int32_t group, int32_t pad,
                            k3k_moe_dq_item *items);

#ifdef __cplusplus
}
#endif
#endif
