/* Reading a k3pd-profile/1 cost profile (the file `k3pd-bench --profile` writes; schema in
 * docs/plan.md). One reader for every consumer: k3pd-plan (tools/plan/profile.c) and the decode
 * worker's local-prefill threshold (decode_worker/localcost.c). Each consumer describes the
 * numbers it takes as a table of fields into its own struct. */
#ifndef K3PD_PROFILE_READ_H
#define K3PD_PROFILE_READ_H

#include <stddef.h>

#define K3_PROFILE_SCHEMA "k3pd-profile/1"

typedef enum { K3_PF_DOUBLE, K3_PF_I64, K3_PF_INT } k3_pf_kind_t;

typedef struct {
  const char *obj, *key; /* the number at doc[obj][key] */
  k3_pf_kind_t kind;     /* the C type at off */
  size_t off;            /* offset of the destination in the consumer's struct */
  double min;            /* smallest valid value */
} k3_pf_field_t;

/* Loads PATH and checks its schema. Returns the document (a jansson json_t *, released with
 * k3_profile_close) or NULL with the reason in err (path, line, or the schema found). */
void *k3_profile_open(const char *path, char *err, size_t errlen);
void k3_profile_close(void *doc);

/* Copies every field present in doc into dst (fields absent from the file leave dst as it was).
 * Returns 0, or K3_EINVAL with err naming path and obj.key: a non-object section, a non-number,
 * a value below its minimum, NaN or infinite. On error dst may be partly written: read into a
 * copy. */
int k3_profile_read_fields(void *doc, const char *path, const k3_pf_field_t *fields, size_t n, void *dst, char *err,
                           size_t errlen);

/* The document's "source" string, or NULL. Valid until k3_profile_close. */
const char *k3_profile_source(void *doc);

#endif
