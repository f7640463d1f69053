/* Every bad input of the public API (issue 2 item 6): the status, a message
 * that names the problem (in mtopt_last_error and in the context's last
 * error), and a failed call that changed nothing. This file: status names,
 * versions, contexts and tensor lists; bad_input_optimizer.c: optimizers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bad_input.h"

/* --------------------------------------------------- status and version -- */

START_TEST(test_status_names) {
  static const struct {
    mtopt_status_t s;
    const char *name;
  } all[] = {
#define X(name, code, text) {MTOPT_STATUS_##name, "MTOPT_STATUS_" #name},
      MTOPT_STATUS_LIST(X)
#undef X
  };
  const int n = (int)(sizeof all / sizeof *all);
  ck_assert_int_eq(n, 9);
  for (int i = 0; i < n; i++) {
    ck_assert_int_eq(all[i].s, i);
    ck_assert_str_eq(mtopt_status_name(all[i].s), all[i].name);
    const char *t = mtopt_status_string(all[i].s);
    ck_assert_ptr_nonnull(t);
    ck_assert(t[0] != '\0');
    for (int j = 0; j < i; j++) ck_assert_str_ne(t, mtopt_status_string(all[j].s));
  }
  ck_assert_str_eq(mtopt_status_name(MTOPT_STATUS_SUCCESS), "MTOPT_STATUS_SUCCESS");
  const mtopt_status_t unknown[] = {(mtopt_status_t)9, (mtopt_status_t)-1,
                                    (mtopt_status_t)12345};
  for (int i = 0; i < 3; i++) {
    ck_assert_str_eq(mtopt_status_name(unknown[i]), "MTOPT_STATUS_UNKNOWN");
    ck_assert_ptr_nonnull(mtopt_status_string(unknown[i]));
    ck_assert(mtopt_status_string(unknown[i])[0] != '\0');
  }
}
END_TEST

START_TEST(test_version) {
  ck_assert_int_eq(mtopt_version(), MTOPT_VERSION_CODE);
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", MTOPT_VERSION_MAJOR, MTOPT_VERSION_MINOR,
           MTOPT_VERSION_PATCH);
  ck_assert_ptr_nonnull(mtopt_version_string());
  ck_assert(strncmp(mtopt_version_string(), want, strlen(want)) == 0);
}
END_TEST

/* -------------------------------------------------------------- context -- */

START_TEST(test_context_create) {
  mtopt_context_t *const sentinel = (mtopt_context_t *)(uintptr_t)0x1234;
  mtopt_context_t *out = sentinel;
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  FAILS(BAD, "config", NULL, mtopt_context_create(NULL, &out));
  FAILS(BAD, "out", NULL, mtopt_context_create(&cc, NULL));
  cc.struct_size = 0;
  FAILS(BAD, "struct_size", NULL, mtopt_context_create(&cc, &out));
  cc.struct_size = 8;
  FAILS(BAD, "struct_size", NULL, mtopt_context_create(&cc, &out));
  cc.struct_size = (size_t)1 << 40;
  FAILS(BAD, "struct_size", NULL, mtopt_context_create(&cc, &out));
  cc.struct_size = sizeof cc;
  /* A config made for a newer major version is refused; an older one is read. */
  cc.api_version = (MTOPT_VERSION_MAJOR + 1) * 10000u;
  FAILS(MTOPT_STATUS_NOT_SUPPORTED, "api_version", NULL, mtopt_context_create(&cc, &out));
  cc.api_version = MTOPT_VERSION_CODE;
  cc.backend = (mtopt_backend_t)7;
  FAILS(BAD, "backend", NULL, mtopt_context_create(&cc, &out));
  cc.backend = MTOPT_BACKEND_CPU;
  cc.num_threads = -1;
  FAILS(BAD, "num_threads", NULL, mtopt_context_create(&cc, &out));
  cc.num_threads = 100000;
  FAILS(BAD, "num_threads", NULL, mtopt_context_create(&cc, &out));
  cc.num_threads = 0;
  cc.backend = MTOPT_BACKEND_CUDA;
  cc.device = -1;
  FAILS(BAD, "device", NULL, mtopt_context_create(&cc, &out));
  ck_assert_ptr_eq(out, sentinel);
  ck_assert_int_eq(mtopt_backend_available((mtopt_backend_t)99), 0);
  ck_assert_int_eq(mtopt_backend_available(MTOPT_BACKEND_CPU), 1);
}
END_TEST

/* The CUDA backend where it cannot be used: NOT_SUPPORTED in a build without
 * CUDA, CUDA_ERROR with CUDA but no usable device (or no such device). */
START_TEST(test_context_cuda_unavailable) {
  mtopt_context_t *out = NULL;
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = MTOPT_BACKEND_CUDA;
#ifndef MTOPT_HAVE_CUDA
  ck_assert_int_eq(mtopt_backend_available(MTOPT_BACKEND_CUDA), 0);
  FAILS(MTOPT_STATUS_NOT_SUPPORTED, "CUDA", NULL, mtopt_context_create(&cc, &out));
#else
  if (!mtopt_backend_available(MTOPT_BACKEND_CUDA)) {
    FAILS(MTOPT_STATUS_CUDA_ERROR, "CUDA_ERROR", NULL, mtopt_context_create(&cc, &out));
  } else {
    cc.device = 1 << 20; /* no machine has this many GPUs */
    FAILS(MTOPT_STATUS_CUDA_ERROR, "CUDA_ERROR", NULL, mtopt_context_create(&cc, &out));
  }
#endif
  ck_assert_ptr_null(out);
}
END_TEST

START_TEST(test_context_misuse) {
  ck_assert_int_eq(mtopt_context_destroy(NULL), MTOPT_STATUS_SUCCESS);
  FAILS(BAD, "ctx", NULL, mtopt_context_synchronize(NULL));
  mtopt_backend_t b = (mtopt_backend_t)42;
  FAILS(BAD, "ctx", NULL, mtopt_context_get_backend(NULL, &b));
  FAILS(BAD, "out", NULL, mtopt_context_get_backend(ctx, NULL));
  ck_assert_int_eq(b, 42);
  TU_OK(mtopt_context_get_backend(ctx, &b));
  ck_assert_int_eq(b, MTOPT_BACKEND_CPU);
  ck_assert_ptr_eq(mtopt_context_last_error(NULL), mtopt_last_error());

  /* Destroying a context with live objects: refused, and the context and its
   * objects still work. */
  mtopt_tensor_list_t *l = good_list();
  FAILS(USAGE, "alive", ctx, mtopt_context_destroy(ctx));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &opt));
  FAILS(USAGE, "alive", ctx, mtopt_context_destroy(ctx));
  TU_OK(mtopt_optimizer_step(opt));
  TU_OK(mtopt_optimizer_destroy(opt));
  FAILS(USAGE, "alive", ctx, mtopt_context_destroy(ctx));
  TU_OK(mtopt_tensor_list_destroy(l));
  /* teardown destroys ctx: now it must succeed. */
}
END_TEST

/* ---------------------------------------------------------- tensor list -- */

START_TEST(test_list_create) {
  mtopt_tensor_list_t *l = (mtopt_tensor_list_t *)(uintptr_t)0x99;
  FAILS(BAD, "ctx", NULL, mtopt_tensor_list_create(NULL, &l));
  FAILS(BAD, "out", ctx, mtopt_tensor_list_create(ctx, NULL));
  ck_assert_ptr_eq(l, (void *)(uintptr_t)0x99);
  ck_assert_int_eq(ctx->live_objects, 0);
  ck_assert_int_eq(mtopt_tensor_list_destroy(NULL), MTOPT_STATUS_SUCCESS);
  int64_t n = 5;
  FAILS(BAD, "list", NULL, mtopt_tensor_list_count(NULL, &n));
  l = good_list();
  FAILS(BAD, "count", ctx, mtopt_tensor_list_count(l, NULL));
  ck_assert_int_eq(n, 5);
  TU_OK(mtopt_tensor_list_destroy(l));
}
END_TEST

START_TEST(test_list_add) {
  mtopt_tensor_list_t *l = good_list();
  int64_t idx = -42;
  mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
  d.param = w[0];
  d.grad = g[0];
  d.numel = NE;
  d.name = "layer.weight";
  FAILS(BAD, "list", NULL, mtopt_tensor_list_add(NULL, &d, &idx));
  FAILS(BAD, "desc", ctx, mtopt_tensor_list_add(l, NULL, &idx));

  mtopt_tensor_desc_t b = d;
  b.struct_size = 3;
  FAILS(BAD, "struct_size", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.numel = -1;
  FAILS(BAD, "numel", ctx, mtopt_tensor_list_add(l, &b, &idx));
  /* The name the user gave shows in the message. */
  ck_assert(strstr(mtopt_last_error(), "layer.weight") != NULL);
  FAILS(BAD, "numel", ctx, mtopt_tensor_list_add_f32(l, w[0], NULL, INT64_MIN, 0, &idx));
  b.numel = INT64_MAX;
  FAILS(BAD, "overflows", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b.numel = INT64_MAX / 4 + 1; /* numel * 4 bytes overflows int64 */
  FAILS(BAD, "overflows", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.param = NULL;
  FAILS(BAD, "param", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.param = (char *)w[0] + 1;
  FAILS(BAD, "aligned", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.grad = (char *)g[0] + 2;
  FAILS(BAD, "aligned", ctx, mtopt_tensor_list_add(l, &b, &idx));
  /* 16-bit dtypes need 2-byte alignment; raw words are no parameter dtype. */
  b = d;
  b.param_dtype = MTOPT_DTYPE_F16;
  b.param = (char *)w[0] + 1;
  FAILS(BAD, "2-byte aligned", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.grad_dtype = MTOPT_DTYPE_BF16;
  b.grad = (char *)g[0] + 3;
  FAILS(BAD, "2-byte aligned", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.param_dtype = MTOPT_DTYPE_U16;
  FAILS(BAD, "unknown", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.param_dtype = (mtopt_dtype_t)17;
  FAILS(BAD, "unknown", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.grad_dtype = (mtopt_dtype_t)-3;
  FAILS(BAD, "unknown", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.flags = 0x2u;
  FAILS(BAD, "flags", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b.flags = 0x80000001u;
  FAILS(BAD, "flags", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b = d;
  b.group = -1;
  FAILS(BAD, "group", ctx, mtopt_tensor_list_add(l, &b, &idx));
  b.group = MTOPT_MAX_GROUPS;
  FAILS(BAD, "group", ctx, mtopt_tensor_list_add(l, &b, &idx));
  FAILS(BAD, "numel", ctx, mtopt_tensor_list_add_f32(l, w[0], g[0], -5, 0, &idx));
  FAILS(BAD, "flags", ctx, mtopt_tensor_list_add_f32(l, w[0], g[0], NE, 4u, &idx));

  /* Nothing was added, the index was not written. */
  ck_assert_int_eq(count_of(l), NT);
  ck_assert_int_eq(idx, -42);
  /* A good add still works and gets the next index; a NULL param is fine for
   * an empty tensor. */
  b = d;
  b.param = NULL;
  b.grad = NULL;
  b.numel = 0;
  TU_OK(mtopt_tensor_list_add(l, &b, &idx));
  ck_assert_int_eq(idx, NT);
  TU_OK(mtopt_tensor_list_destroy(l));
}
END_TEST

START_TEST(test_list_set_group) {
  mtopt_tensor_list_t *l = good_list();
  FAILS(BAD, "list", NULL, mtopt_tensor_list_set_group(NULL, 1, 1.0f, 1.0f));
  FAILS(BAD, "group", ctx, mtopt_tensor_list_set_group(l, -1, 1.0f, 1.0f));
  FAILS(BAD, "group", ctx, mtopt_tensor_list_set_group(l, MTOPT_MAX_GROUPS, 1.0f, 1.0f));
  TU_OK(mtopt_tensor_list_set_group(l, 3, 0.5f, 2.0f));
  const float bad[] = {NAN, -1.0f, INFINITY, -INFINITY};
  for (int i = 0; i < 4; i++) {
    FAILS(BAD, "lr_mult", ctx, mtopt_tensor_list_set_group(l, 3, bad[i], 1.0f));
    FAILS(BAD, "weight_decay_mult", ctx, mtopt_tensor_list_set_group(l, 3, 1.0f, bad[i]));
  }
  ck_assert(l->groups[3].lr_mult == 0.5f && l->groups[3].wd_mult == 2.0f);
  TU_OK(mtopt_tensor_list_destroy(l));
}
END_TEST

/* A list in use: frozen for adds and group changes, not destroyable; both
 * become possible again once the optimizer is gone. */
START_TEST(test_list_in_use) {
  mtopt_tensor_list_t *l = good_list();
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &opt));
  float extra[4] = {1, 2, 3, 4};
  int64_t idx = -1;
  FAILS(USAGE, "frozen", ctx, mtopt_tensor_list_add_f32(l, extra, NULL, 4, 0, &idx));
  FAILS(USAGE, "frozen", ctx, mtopt_tensor_list_set_group(l, 1, 2.0f, 2.0f));
  FAILS(USAGE, "destroy them first", ctx, mtopt_tensor_list_destroy(l));
  ck_assert_int_eq(count_of(l), NT);
  ck_assert_int_eq(idx, -1);
  ck_assert(l->groups[1].lr_mult == 1.0f);
  TU_OK(mtopt_optimizer_step(opt)); /* still usable */
  /* A second optimizer over the same weights would step them twice. */
  mtopt_optimizer_t *const sentinel = (mtopt_optimizer_t *)(uintptr_t)0x77;
  mtopt_optimizer_t *second = sentinel;
  FAILS(USAGE, "already used by an optimizer", ctx, mtopt_optimizer_create(ctx, l, &c, &second));
  ck_assert_ptr_eq(second, sentinel);
  ck_assert_int_eq(l->users, 1);
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_add_f32(l, extra, NULL, 4, 0, &idx));
  ck_assert_int_eq(idx, NT);
  TU_OK(mtopt_tensor_list_destroy(l));
}
END_TEST

Suite *bad_input_suite(void) {
  Suite *s = suite_create("bad_input");
  TCase *basic = tcase_create("basic");
  tcase_set_timeout(basic, 20);
  tcase_add_test(basic, test_status_names);
  tcase_add_test(basic, test_version);
  suite_add_tcase(s, basic);
  TCase *tc = tcase_create("api");
  tcase_set_timeout(tc, 30);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_context_create);
  tcase_add_test(tc, test_context_cuda_unavailable);
  tcase_add_test(tc, test_context_misuse);
  tcase_add_test(tc, test_list_create);
  tcase_add_test(tc, test_list_add);
  tcase_add_test(tc, test_list_set_group);
  tcase_add_test(tc, test_list_in_use);
  bad_input_add_optimizer_tests(tc);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(bad_input_suite(), 0); }
