/* Private UTF-8 status helper of k3_tok (see tok_utf8.c). */
#ifndef K3_TOK_UTF8_H
#define K3_TOK_UTF8_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  K3_UTF8_OK = 0,        /* s[0..n) is one well-formed code point */
  K3_UTF8_INVALID = 1,   /* s[0..n) is a maximal ill-formed subpart: replace by one U+FFFD */
  K3_UTF8_TRUNCATED = 2, /* s[0..len) is a well-formed prefix cut short by the end of input */
} k3_utf8_status_t;

/* Classifies the sequence starting at s[0] (len >= 1). */
k3_utf8_status_t k3_tok_utf8_check(const uint8_t *s, size_t len, size_t *n);

#endif
