/* Replays a corpus through the loader fuzz target where libFuzzer is not
 * available: every regular file of each directory argument (or each file
 * argument) is one input. Exits non-zero if a directory holds no input. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "fuzz_load.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  unsigned char *b = NULL;
  size_t n = 0, cap = 0, got;
  do {
    if (n == cap && !(b = realloc(b, cap = cap ? 2 * cap : 4096))) abort();
    got = fread(b + n, 1, cap - n, f);
    n += got;
  } while (got > 0);
  fclose(f);
  if (getenv("MTOPT_FUZZ_VERBOSE")) fprintf(stderr, "%s: ", path);
  LLVMFuzzerTestOneInput(b, n);
  free(b);
  return 1;
}

int main(int argc, char **argv) {
  int inputs = 0;
  for (int a = 1; a < argc; a++) {
    struct stat st;
    if (stat(argv[a], &st) != 0) {
      fprintf(stderr, "replay: cannot stat %s\n", argv[a]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      inputs += run_file(argv[a]);
      continue;
    }
    DIR *d = opendir(argv[a]);
    struct dirent *e;
    char path[4096];
    while (d && (e = readdir(d))) {
      snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
      if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) inputs += run_file(path);
    }
    if (d) closedir(d);
  }
  printf("replay: %d inputs, no finding\n", inputs);
  return inputs > 0 ? 0 : 1;
}
