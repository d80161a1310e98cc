/* Internal to k3_worker: one worker's registration with one router (reglink.c). registrar.c
 * owns one link per router address and is the only caller; the contracts are those of
 * k3pd/registrar.h for a single router. Loop thread only. */
#ifndef K3PD_WORKER_REGLINK_H
#define K3PD_WORKER_REGLINK_H

#include <stdbool.h>

#include "k3pd/registrar.h"

typedef struct reg_link reg_link_t;

/* Starts registering with `router` (HOST:PORT, copied) at once; o->router is ignored. Returns 0
 * or K3_ENOMEM / K3_EINVAL. */
int reg_link_start(uv_loop_t *loop, k3_rpc_client_t *cli, const k3_registrar_opts_t *o, const char *router,
                   reg_link_t **out);
bool reg_link_registered(const reg_link_t *l);
void reg_link_set_draining(reg_link_t *l, bool draining);
void reg_link_kick(reg_link_t *l);
/* Stops the link (DeregisterWorker first when `deregister` and registered); `done` runs on the
 * loop once it is finished, and the link is freed after it returns. */
void reg_link_stop(reg_link_t *l, bool deregister, void (*done)(void *arg), void *arg);

#endif
