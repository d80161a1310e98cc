/* Wire-level check of a request before protobuf-c unpacks it: protobuf-c hands string fields
 * to C as NUL-terminated char *, so a string holding U+0000 (valid UTF-8, legal protobuf) would
 * silently end at the NUL ("ab\0cd" served as "ab"). This walks the encoded message against its
 * descriptor and reports the first string field that contains a NUL byte, by its path
 * ("chat.messages[1].content"), so the server can refuse the call with INVALID_ARGUMENT.
 *
 * What it is not: a validator of the rest of the encoding. Anything malformed (bad varint,
 * length past the end, groups, nesting deeper than RPC_WIRE_DEPTH) ends the walk with "no NUL
 * found"; protobuf_c_message_unpack then rejects the message as before. Unknown fields and
 * packed scalars are skipped. */
#include <stdio.h>
#include <string.h>

#include "rpc_internal.h"

#define RPC_WIRE_DEPTH 32
#define RPC_WIRE_MAX_FIELDS 64 /* repeated-field indices are counted for the first 64 fields */

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

/* 1 when a NUL was found (path written), 0 otherwise (also on malformed input). */
static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth,
                char *path, size_t pathlen) {
  if (depth > RPC_WIRE_DEPTH) return 0;
  unsigned seen[RPC_WIRE_MAX_FIELDS] = {0};
  size_t base = strlen(path);
  while (p < end) {
    uint64_t key, len;
    if (read_varint(&p, end, &key)) return 0;
    unsigned wt = (unsigned)(key & 7);
    const ProtobufCFieldDescriptor *f =
        key >> 3 <= 0x1fffffff ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
    switch (wt) {
      case 0: if (read_varint(&p, end, &len)) return 0; continue;
      case 1: if (end - p < 8) return 0; p += 8; continue;
      case 5: if (end - p < 4) return 0; p += 4; continue;
      case 2: break;
      default: return 0; /* groups (3/4) and invalid wire types: left to unpack */
    }
    if (read_varint(&p, end, &len) || len > (uint64_t)(end - p)) return 0;
    const uint8_t *v = p;
    p += len;
    if (!f || (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)) continue;
    size_t fi = (size_t)(f - d->fields);
    unsigned idx = fi < RPC_WIRE_MAX_FIELDS ? seen[fi]++ : 0;
    path[base] = '\0';
    if (f->label == PROTOBUF_C_LABEL_REPEATED)
      snprintf(path + base, pathlen - base, "%s%s[%u]", base ? "." : "", f->name, idx);
    else
      snprintf(path + base, pathlen - base, "%s%s", base ? "." : "", f->name);
    if (f->type == PROTOBUF_C_TYPE_STRING) {
      if (memchr(v, 0, (size_t)len)) return 1;
    } else if (walk((const ProtobufCMessageDescriptor *)f->descriptor, v, v + len, depth + 1, path, pathlen)) {
      return 1;
    }
  }
  path[base] = '\0';
  return 0;
}

int rpc_wire_find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, char *path,
                      size_t pathlen) {
  if (!d || !path || pathlen == 0) return 0;
  path[0] = '\0';
  return walk(d, data, data + len, 0, path, pathlen);
}
