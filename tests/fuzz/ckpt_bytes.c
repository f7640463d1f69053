#include "ckpt_bytes.h"

#include <string.h>

uint32_t cb_crc32(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  while (n--) {
    c ^= *p++;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

void cb_reseal(unsigned char *b, size_t n) {
  const uint32_t c = cb_crc32(b, n - 4);
  memcpy(b + n - 4, &c, 4);
}

uint32_t cb_format(const unsigned char *b) {
  uint32_t f;
  memcpy(&f, b + CB_FORMAT, 4);
  return f;
}

size_t cb_downgrade(unsigned char *b, size_t n, uint32_t format) {
  if (cb_format(b) <= format) return n;
  memcpy(b + CB_FORMAT, &format, 4);
  memset(b + CB_FEATURES, 0, 4);
  if (format == 1) {
    int64_t nt;
    memcpy(&nt, b + CB_NT, 8);
    for (int64_t i = 0; i < nt; i++)
      memmove(b + CB_HDR + 8 * i, b + CB_HDR + CB_EXT + CB_REC * i, 8);
    const size_t old_prefix = CB_HDR + CB_EXT + CB_REC * (size_t)nt;
    const size_t new_prefix = CB_HDR + 8 * (size_t)nt;
    memmove(b + new_prefix, b + old_prefix, n - old_prefix);
    n -= old_prefix - new_prefix;
  }
  cb_reseal(b, n);
  return n;
}
