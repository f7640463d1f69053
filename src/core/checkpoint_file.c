/* The file-system side of a checkpoint save: the temporary file beside the
 * target (its name, creation and lock), the clean-up of temporaries a killed
 * save left, and the check of the target. checkpoint.c writes and reads the
 * contents. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

/* The temporary file of a save: ".mtopt-" + the CRC-32 of the target's file
 * name in 8 hex digits + "-" + 6 random characters of [A-Za-z0-9], in the
 * target's directory. Fixed length (22), so it fits wherever the target's
 * name does; the tag lets a later save of the same target find temporaries
 * that a killed save left behind. */
static const char tmp_alnum[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

static int is_temp_of(const char *name, const char *tag_prefix) {
  if (strlen(name) != MTOPT__CKPT_TMP_LEN || strncmp(name, tag_prefix, MTOPT__CKPT_TMP_LEN - 6) != 0) return 0;
  for (int i = MTOPT__CKPT_TMP_LEN - 6; i < MTOPT__CKPT_TMP_LEN; i++)
    if (!memchr(tmp_alnum, name[i], sizeof tmp_alnum - 1)) return 0;
  return 1;
}

/* Creates the temporary (mode 0666 less the umask, as fopen would) and locks
 * it (flock) until the save ends, so another save's clean-up never takes it
 * for stale. A clean-up that got in between creation and lock has unlinked
 * it: take another name. Returns the fd, or -1 with errno and name "". */
int mtopt__ckpt_create_temp(int dfd, const char *tag_prefix, char name[MTOPT__CKPT_TMP_LEN + 1]) {
  static uint64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
  for (int attempt = 0; attempt < 100; attempt++) {
    x += 0x9E3779B97F4A7C15u * (1 + __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    uint64_t r = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9u;
    memcpy(name, tag_prefix, MTOPT__CKPT_TMP_LEN - 6);
    for (int i = MTOPT__CKPT_TMP_LEN - 6; i < MTOPT__CKPT_TMP_LEN; i++, r /= 62) name[i] = tmp_alnum[r % 62];
    name[MTOPT__CKPT_TMP_LEN] = '\0';
    const int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
    if (fd < 0) continue;
    struct stat st;
    /* A file system without flock: no lock, and no clean-up finds one free. */
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0 || st.st_nlink > 0) return fd;
    close(fd);
    errno = EEXIST;
  }
  name[0] = '\0'; /* not ours: the caller must not remove it */
  return -1;
}

/* After a successful save: removes the temporaries of this target that no
 * save holds locked (left by a save that was killed). Best effort. */
void mtopt__ckpt_remove_stale(int dfd, const char *tag_prefix) {
  const int dup_fd = dup(dfd);
  DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
  if (!d) {
    if (dup_fd >= 0) close(dup_fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!is_temp_of(e->d_name, tag_prefix)) continue;
    const int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) continue;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0)
      unlinkat(dfd, e->d_name, 0);
    close(fd);
  }
  closedir(d);
}

/* Opens the directory of path and finds its last component; refuses a target
 * that exists and is not a regular file (a symbolic link, a directory, a
 * device, a FIFO), which a rename would replace. */
mtopt_status_t mtopt__ckpt_open_target(mtopt_context_t *ctx, const char *fn, const char *path,
                                       int *dfd, const char **base) {
  const char *slash = strrchr(path, '/');
  *base = slash ? slash + 1 : path;
  if (!**base || !strcmp(*base, ".") || !strcmp(*base, ".."))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: '%s' names a directory", fn,
                        path);
  const size_t dlen = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
  char *dir = malloc(dlen + 1);
  if (!dir) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
  memcpy(dir, slash ? path : ".", dlen);
  dir[dlen] = '\0';
  *dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int err = errno;
  free(dir);
  if (*dfd < 0)
    return mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: cannot open the directory of '%s': %s",
                        fn, path, strerror(err));
  struct stat st;
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  if (fstatat(*dfd, *base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISREG(st.st_mode))
      st_ = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                         "%s: '%s' exists and is not a regular file (a symbolic link, "
                         "directory, device or FIFO): save replaces only regular files",
                         fn, path);
  } else if (errno != ENOENT) {
    st_ = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: cannot save as '%s': %s", fn, path,
                       strerror(errno));
  }
  if (st_ != MTOPT_STATUS_SUCCESS) close(*dfd);
  return st_;
}

