/* Checkpoint saves that fail leave nothing behind (an interposed fdopen
 * failing, a write failing, a save killed mid-write and cleaned up later);
 * names as long as the system allows; the target's kind and the file's mode.
 * Part of the checkpoint suite. */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuzz/ckpt_bytes.h"
#include "test_util.h"
#include "checkpoint_rig.h"

/* ------------------------------------------------------------ save fails -- */

/* fdopen, interposed: fails while fail_fdopen is set (as on ENOMEM). */
static int fail_fdopen;

FILE *fdopen(int fd, const char *mode) {
  static FILE *(*real)(int, const char *);
  if (fail_fdopen) {
    errno = ENOMEM;
    return NULL;
  }
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "fdopen");
  return real(fd, mode);
}

/* The temporary name's tag for a target file name: ".mtopt-<crc32 hex>-". */
static void temp_name(char *out, size_t cap, const char *base, const char *suffix) {
  snprintf(out, cap, "%s/.mtopt-%08x-%s", dir,
           (unsigned)cb_crc32((const unsigned char *)base, strlen(base)), suffix);
}

/* Issue 12 item 5: a save that fails leaves no temporary (fdopen failing, a
 * write failing), and the old checkpoint as it was; a save killed mid-write
 * leaves one, which the next successful save of that target removes (not one
 * another save holds, nor one of another target). */
START_TEST(test_failed_save_leaves_nothing) {
  char path[600];
  path_in_dir(path, sizeof path, "ck.bin");
  model_t a;
  model_make(&a, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 0);
  fail_fdopen = 1;
  TU_FAILS(mtopt_optimizer_save(a.opt, path), MTOPT_STATUS_IO_ERROR);
  fail_fdopen = 0;
  ck_assert_int_eq(count_files(), 0);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  size_t n0, n1;
  unsigned char *before = file_read(path, &n0);
  model_steps(&a, 0, 1);
  /* a write past the file size limit fails (EFBIG, SIGXFSZ ignored); with
   * the signal's default action the save is killed mid-write. In children:
   * the limit would stop this process's test harness too. */
  for (int killed = 0; killed < 2; killed++) {
    const pid_t pid = fork();
    if (pid == 0) {
      struct rlimit core = {0, 0}, lim = {1000, 1000};
      setrlimit(RLIMIT_CORE, &core);
      signal(SIGXFSZ, killed ? SIG_DFL : SIG_IGN);
      setrlimit(RLIMIT_FSIZE, &lim);
      _exit(mtopt_optimizer_save(a.opt, path) == MTOPT_STATUS_IO_ERROR ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (killed)
      ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ, "status %d", status);
    else
      ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    if (!killed) ck_assert_int_eq(count_files(), 1);
  }
  unsigned char *after = file_read(path, &n1);
  ck_assert(n0 == n1 && memcmp(before, after, n0) == 0);
  free(before);
  free(after);
  ck_assert_int_eq(count_files(), 2); /* the checkpoint and the killed save's temporary */
  /* another save in progress (its temporary locked), a near miss of the
   * pattern, a temporary of another target */
  char busy[600], near[600], other[600];
  temp_name(busy, sizeof busy, "ck.bin", "Busy00");
  temp_name(near, sizeof near, "ck.bin", "abc");
  temp_name(other, sizeof other, "ck2.bin", "Other0");
  const int busy_fd = open(busy, O_CREAT | O_WRONLY, 0600);
  ck_assert_int_ge(busy_fd, 0);
  ck_assert_int_eq(flock(busy_fd, LOCK_EX), 0);
  close(open(near, O_CREAT | O_WRONLY, 0600));
  close(open(other, O_CREAT | O_WRONLY, 0600));
  TU_OK(mtopt_optimizer_save(a.opt, path));
  ck_assert_int_eq(count_files(), 4); /* the killed save's temporary is gone */
  ck_assert_int_eq(access(busy, F_OK), 0);
  ck_assert_int_eq(access(near, F_OK), 0);
  ck_assert_int_eq(access(other, F_OK), 0);
  close(busy_fd);
  model_free(&a);
}
END_TEST

/* Issue 12 item 6: names as long as the system allows save and load: a
 * 255-character file name, a path of 4,090 characters; a longer name is
 * refused with the system's reason. */
START_TEST(test_long_names_save) {
  model_t a, b;
  model_make(&a, MTOPT_OPTIMIZER_SGD, tu_seed(), 0);
  model_make(&b, MTOPT_OPTIMIZER_SGD, tu_seed() + 1, 0);
  model_steps(&a, 0, 2);
  char name[300], path[4200];
  memset(name, 'n', 255);
  name[255] = '\0';
  path_in_dir(path, sizeof path, name);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  TU_OK(mtopt_optimizer_load(b.opt, path));
  ck_assert_int_eq(count_files(), 1);
  remove(path);
  name[255] = 'n', name[256] = '\0';
  path_in_dir(path, sizeof path, name);
  TU_FAILS(mtopt_optimizer_save(a.opt, path), MTOPT_STATUS_IO_ERROR);
  ck_assert_int_eq(count_files(), 0);
  /* nested directories of 200 characters up to a 4,090-character path */
  size_t len = strlen(dir);
  memcpy(path, dir, len + 1);
  int depth = 0;
  while (len + 201 + 20 < 4090) {
    path[len++] = '/';
    memset(path + len, 'd', 200);
    len += 200;
    path[len] = '\0';
    ck_assert_int_eq(mkdir(path, 0700), 0);
    depth++;
  }
  path[len++] = '/';
  memset(path + len, 'f', 4090 - len);
  path[4090] = '\0';
  ck_assert_int_eq(strlen(path), 4090);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  model_steps(&a, 2, 1);
  TU_OK(mtopt_optimizer_load(a.opt, path));
  TU_OK(mtopt_optimizer_load(b.opt, path));
  remove(path);
  for (; depth > 0; depth--) {
    *strrchr(path, '/') = '\0';
    ck_assert_int_eq(rmdir(path), 0);
  }
  model_free(&a);
  model_free(&b);
}
END_TEST

/* Save replaces only a regular file or creates one: a symbolic link (to a
 * file or dangling), a FIFO, a directory are refused and left as they are.
 * The file's mode is 0666 less the umask, as fopen's. */
START_TEST(test_save_target_kinds) {
  model_t a;
  model_make(&a, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 0);
  char file[600], link[600], dangling[600], fifo[600], sub[600], slash[700];
  path_in_dir(file, sizeof file, "file.bin");
  path_in_dir(link, sizeof link, "link.bin");
  path_in_dir(dangling, sizeof dangling, "dangling.bin");
  path_in_dir(fifo, sizeof fifo, "fifo.bin");
  path_in_dir(sub, sizeof sub, "sub");
  snprintf(slash, sizeof slash, "%s/", file);
  file_write(file, (const unsigned char *)"keep", 4);
  ck_assert_int_eq(symlink(file, link), 0);
  ck_assert_int_eq(symlink("/nonexistent/target", dangling), 0);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(mkdir(sub, 0700), 0);
  const char *refused[] = {link, dangling, fifo, sub, slash};
  for (int i = 0; i < 5; i++)
    TU_FAILS(mtopt_optimizer_save(a.opt, refused[i]), MTOPT_STATUS_INVALID_ARGUMENT);
  struct stat st;
  ck_assert_int_eq(lstat(link, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(lstat(dangling, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(lstat(fifo, &st), 0);
  ck_assert(S_ISFIFO(st.st_mode));
  size_t n;
  unsigned char *keep = file_read(file, &n);
  ck_assert(n == 4 && memcmp(keep, "keep", 4) == 0);
  free(keep);
  ck_assert_int_eq(count_files(), 5);
  rmdir(sub);
  /* the mode: 0666 less the umask, for a new file and a replaced one */
  const mode_t masks[] = {022, 027, 0};
  for (int i = 0; i < 3; i++) {
    const mode_t old = umask(masks[i]);
    TU_OK(mtopt_optimizer_save(a.opt, file));
    umask(old);
    ck_assert_int_eq(stat(file, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0666 & ~masks[i]);
  }
  /* a relative name saves in the working directory */
  ck_assert_int_eq(chdir(dir), 0);
  TU_OK(mtopt_optimizer_save(a.opt, "relative.bin"));
  TU_OK(mtopt_optimizer_load(a.opt, "relative.bin"));
  ck_assert_int_eq(chdir("/"), 0);
  model_free(&a);
}
END_TEST


void checkpoint_add_save_tests(TCase *tc) {
  tcase_add_test(tc, test_failed_save_leaves_nothing);
  tcase_add_test(tc, test_long_names_save);
  tcase_add_test(tc, test_save_target_kinds);
}
