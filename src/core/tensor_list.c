/* Tensor lists: the user's description of the parameters to optimise. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

_Static_assert(MTOPT__DT_F32 == MTOPT_DTYPE_F32 && MTOPT__DT_F16 == MTOPT_DTYPE_F16 &&
                   MTOPT__DT_BF16 == MTOPT_DTYPE_BF16,
               "dtype");

#define DESC_MIN_SIZE (offsetof(mtopt_tensor_desc_t, name) + sizeof(const char *))

mtopt_status_t mtopt_tensor_list_create(mtopt_context_t *ctx, mtopt_tensor_list_t **out) {
  if (!ctx || !out)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_tensor_list_create: %s is NULL", ctx ? "out" : "ctx");
  mtopt_tensor_list_t *list = calloc(1, sizeof *list);
  if (!list)
    return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "mtopt_tensor_list_create: calloc failed");
  list->ctx = ctx;
  for (int i = 0; i < MTOPT_MAX_GROUPS; i++) {
    list->groups[i].lr_mult = 1.0f;
    list->groups[i].wd_mult = 1.0f;
  }
  ctx->live_objects++;
  *out = list;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_tensor_list_destroy(mtopt_tensor_list_t *list) {
  if (!list) return MTOPT_STATUS_SUCCESS;
  if (list->users > 0)
    return mtopt__error(list->ctx, MTOPT_STATUS_INVALID_USAGE,
                        "mtopt_tensor_list_destroy: %lld optimizers built from this "
                        "list are alive; destroy them first",
                        (long long)list->users);
  for (int64_t i = 0; i < list->count; i++) free(list->items[i].name);
  free(list->items);
  list->ctx->live_objects--;
  free(list);
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t check_frozen(mtopt_tensor_list_t *list, const char *fn) {
  if (list->users > 0)
    return mtopt__error(list->ctx, MTOPT_STATUS_INVALID_USAGE,
                        "%s: the list is frozen: an optimizer was built from it "
                        "(make a new list for a new optimizer)",
                        fn);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_tensor_list_add(mtopt_tensor_list_t *list,
                                     const mtopt_tensor_desc_t *desc,
                                     int64_t *index_out) {
  static const char fn[] = "mtopt_tensor_list_add";
  if (!list)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: list is NULL", fn);
  mtopt_context_t *ctx = list->ctx;
  if (!desc)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: desc is NULL", fn);
  CHECK(check_frozen(list, fn));
  const int64_t idx = list->count;
  if (desc->struct_size < DESC_MIN_SIZE || desc->struct_size > 4096)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld: desc.struct_size %zu is not a known size "
                        "(initialise with MTOPT_TENSOR_DESC_INIT)",
                        fn, (long long)idx, desc->struct_size);
  const char *nm = desc->name ? desc->name : "";
  if (desc->numel < 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': numel %lld is negative", fn,
                        (long long)idx, nm, (long long)desc->numel);
  /* Byte sizes must fit in int64 and size_t with room for alignment padding. */
  if (desc->numel > (INT64_MAX / 8) || (uint64_t)desc->numel > SIZE_MAX / 8)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': numel %lld overflows a byte size", fn,
                        (long long)idx, nm, (long long)desc->numel);
  if (desc->numel > 0 && !desc->param)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': param is NULL", fn, (long long)idx, nm);
  if ((unsigned)desc->param_dtype > MTOPT_DTYPE_BF16 ||
      (unsigned)desc->grad_dtype > MTOPT_DTYPE_BF16)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': unknown dtype (param %d, grad %d; F32, F16 "
                        "and BF16 are 0, 1, 2)",
                        fn, (long long)idx, nm, (int)desc->param_dtype, (int)desc->grad_dtype);
  const size_t pe = (size_t)mtopt__dt_size(desc->param_dtype);
  const size_t ge = (size_t)mtopt__dt_size(desc->grad_dtype);
  if ((uintptr_t)desc->param % pe != 0 || (uintptr_t)desc->grad % ge != 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': the %s is not %zu-byte aligned (its dtype's "
                        "size)",
                        fn, (long long)idx, nm, (uintptr_t)desc->param % pe ? "param" : "grad",
                        (uintptr_t)desc->param % pe ? pe : ge);
  if (desc->flags & ~(uint32_t)MTOPT_TENSOR_NO_WEIGHT_DECAY)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': unknown flags 0x%x", fn, (long long)idx,
                        nm, desc->flags);
  if (desc->group < 0 || desc->group >= MTOPT_MAX_GROUPS)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld '%s': group %d out of range [0, %d)", fn,
                        (long long)idx, nm, desc->group, MTOPT_MAX_GROUPS);
  if (list->count == INT32_MAX)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: more than %d tensors", fn, INT32_MAX);
  if (list->count == list->capacity) {
    int64_t cap = list->capacity ? list->capacity * 2 : 64;
    void *p = realloc(list->items, (size_t)cap * sizeof *list->items);
    if (!p)
      return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: realloc failed", fn);
    list->items = p;
    list->capacity = cap;
  }
  mtopt__tensor_entry_t e;
  memset(&e, 0, sizeof e);
  memcpy(&e.desc, desc, desc->struct_size < sizeof e.desc ? desc->struct_size : sizeof e.desc);
  e.desc.struct_size = sizeof e.desc;
  if (desc->name) {
    e.name = strdup(desc->name);
    if (!e.name)
      return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: strdup failed", fn);
  }
  e.desc.name = e.name;
  list->items[list->count++] = e;
  if (index_out) *index_out = idx;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_tensor_list_add_f32(mtopt_tensor_list_t *list, float *param,
                                         float *grad, int64_t numel, uint32_t flags,
                                         int64_t *index_out) {
  mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
  d.param = param;
  d.grad = grad;
  d.numel = numel;
  d.flags = flags;
  return mtopt_tensor_list_add(list, &d, index_out);
}

mtopt_status_t mtopt__check_group(mtopt_context_t *ctx, const char *fn, int32_t group,
                                  float lr_mult, float wd_mult) {
  if (group < 0 || group >= MTOPT_MAX_GROUPS)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: group %d out of range [0, %d)",
                        fn, group, MTOPT_MAX_GROUPS);
  if (!(lr_mult >= 0.0f && lr_mult <= 1e30f) || !(wd_mult >= 0.0f && wd_mult <= 1e30f))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: group %d: multipliers must be finite and >= 0 (lr_mult %g, "
                        "weight_decay_mult %g)",
                        fn, group, (double)lr_mult, (double)wd_mult);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_tensor_list_set_group(mtopt_tensor_list_t *list, int32_t group,
                                           float lr_mult, float weight_decay_mult) {
  static const char fn[] = "mtopt_tensor_list_set_group";
  if (!list)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: list is NULL", fn);
  CHECK(check_frozen(list, fn));
  CHECK(mtopt__check_group(list->ctx, fn, group, lr_mult, weight_decay_mult));
  list->groups[group].lr_mult = lr_mult;
  list->groups[group].wd_mult = weight_decay_mult;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_tensor_list_count(const mtopt_tensor_list_t *list, int64_t *count) {
  if (!list || !count)
    return mtopt__error(list ? list->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_tensor_list_count: %s is NULL", list ? "count" : "list");
  *count = list->count;
  return MTOPT_STATUS_SUCCESS;
}

/* ---- internal_api.h ---- */

mtopt_context_t *mtopt__tensor_list_context(const mtopt_tensor_list_t *list) {
  return list->ctx;
}
int64_t mtopt__tensor_list_size(const mtopt_tensor_list_t *list) { return list->count; }
const mtopt_tensor_desc_t *mtopt__tensor_list_desc(const mtopt_tensor_list_t *list, int64_t i) {
  return &list->items[i].desc;
}
int mtopt__tensor_list_in_use(const mtopt_tensor_list_t *list) { return list->users > 0; }
void mtopt__tensor_list_freeze(mtopt_tensor_list_t *list) { list->users++; }
void mtopt__tensor_list_unfreeze(mtopt_tensor_list_t *list) { list->users--; }
void mtopt__tensor_list_copy_groups(mtopt_tensor_list_t *dst, const mtopt_tensor_list_t *src) {
  memcpy(dst->groups, src->groups, sizeof dst->groups);
}
