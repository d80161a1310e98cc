/* The host schedule of the dequant-once MoE path (kernels/cuda/moe_dq.cu): which experts are
 * dequantised and multiplied together, and where each expert's rows sit in the path's padded
 * row space.
 *
 * What it is for: moe_dq.cu gathers every expert's plan rows into a padded layout where the
 * experts of one group sit at one fixed distance (the group's cap), so one strided-batched GEMM
 * runs a whole group (more tiles per launch than one expert's GEMM: one expert of 512 rows is
 * less than one wave of the H200's 132 SMs). test_kernels (t_route.c) checks the invariants on
 * random plans.
 * What it is not: a device plan (that is k3k_cu_moe_plan) or a launch.
 * Invariants (for plan offsets off[0..E] non-decreasing from 0 to tk): one item per expert with
 * rows, ordered by rows descending (ties: lower expert first); items cut into groups (ids 0, 1,
 * ...) of at most `group` consecutive items; a group's cap is its first item's rows rounded up
 * to a multiple of pad, and every other member has rows · 8 >= cap · 7 (so padding wastes at
 * most a seventh of the rows plus pad per expert); item i of a group has the padded rows
 * [prow0, prow0 + cap) with prow0 = the group's base + i · cap; groups follow each other without
 * gaps from 0, and the total is at most k3k_moe_dq_pad_rows_max(tk, E, pad). */
#ifndef K3K_MOE_DQ_PLAN_H
#define K3K_MOE_DQ_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t expert, group;
  int64_t row0, rows; /* the expert's plan rows [row0, row0 + rows) */
  int64_t prow0, cap; /* its padded rows [prow0, prow0 + cap); cap is the group's */
} k3k_moe_dq_item;

/* The most padded rows a schedule of tk plan rows over E experts can use:
 * tk + ceil(tk / 7) + pad · min(E, tk). */
int64_t k3k_moe_dq_pad_rows_max(int64_t tk, int32_t E, int32_t pad);

/* Writes at most E items; returns how many (the active experts) and the padded rows in all
 * (*pad_rows), or -1 when off is not non-decreasing from 0, group < 1 or pad < 1. */
int32_t k3k_moe_dq_schedule(const int32_t *off, int32_t E, int32_t group, int32_t pad,
                            k3k_moe_dq_item *items, int64_t *pad_rows);

#ifdef __cplusplus
}
#endif
#endif
