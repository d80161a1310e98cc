/* Private: computes the derived fields of a validated k3_model_config_t (config_derive.c). */
#ifndef K3PD_CONFIG_INTERNAL_H
#define K3PD_CONFIG_INTERNAL_H

#include "k3pd/model_config.h"

/* Fills every "derived" field from the architecture fields. The config must have passed
 * validation (layer_kind[] set for 0..num_layers-1). */
void ck_config_derive(k3_model_config_t *c);

#endif
