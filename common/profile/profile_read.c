/* k3pd-profile/1 reader (k3pd/profile_read.h). */
#include "k3pd/profile_read.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "k3pd/err.h"

void *k3_profile_open(const char *path, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
    return NULL;
  }
  const char *schema = json_string_value(json_object_get(root, "schema"));
  if (!json_is_object(root) || !schema || strcmp(schema, K3_PROFILE_SCHEMA) != 0) {
    snprintf(err, errlen, "%s: schema: want \"%s\", got %s", path, K3_PROFILE_SCHEMA, schema ? schema : "none");
    json_decref(root);
    return NULL;
  }
  return root;
}

void k3_profile_close(void *doc) { json_decref((json_t *)doc); }

const char *k3_profile_source(void *doc) { return json_string_value(json_object_get((json_t *)doc, "source")); }

int k3_profile_read_fields(void *doc, const char *path, const k3_pf_field_t *fields, size_t n, void *dst, char *err,
                           size_t errlen) {
  json_t *root = doc;
  for (size_t i = 0; i < n; i++) {
    const k3_pf_field_t *f = &fields[i];
    json_t *o = json_object_get(root, f->obj);
    if (o && !json_is_object(o)) {
      snprintf(err, errlen, "%s: %s: want an object", path, f->obj);
      return K3_EINVAL;
    }
    json_t *v = o ? json_object_get(o, f->key) : NULL;
    if (!v) continue;
    if (!json_is_number(v)) {
      snprintf(err, errlen, "%s: %s.%s: want a number", path, f->obj, f->key);
      return K3_EINVAL;
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < f->min) {
      snprintf(err, errlen, "%s: %s.%s: %g is below %g or not finite", path, f->obj, f->key, x, f->min);
      return K3_EINVAL;
    }
    char *p = (char *)dst + f->off;
    switch (f->kind) {
    case K3_PF_DOUBLE: *(double *)p = x; break;
    case K3_PF_I64: *(int64_t *)p = (int64_t)x; break;
    case K3_PF_INT: *(int *)p = (int)x; break;
    }
  }
  return 0;
}
