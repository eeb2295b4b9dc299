/* eio_shim.c — an LD_PRELOAD fault injector for the reliability campaign (EIO) and the
 * write path's deadline tests (a slow device).
 *
 * Files whose path contains $FASTCKPT_FAULT_PATH accept $FASTCKPT_FAULT_AFTER bytes of
 * writes in all; from then on every write, pwrite and fsync/fdatasync on them fails with
 * EIO, as a failing device does, $FASTCKPT_FAULT_COUNT times (default: for ever). With
 * $FASTCKPT_FAULT_SLOW_US set instead, each of those calls sleeps that many microseconds
 * and then succeeds (a slow but working device). With $FASTCKPT_FAULT_NO_DIRECT set instead,
 * opening such a path with O_DIRECT fails with EINVAL, as on a filesystem without O_DIRECT
 * (tmpfs before Linux 6.6, many FUSE and network filesystems), and nothing else fails. With
 * $FASTCKPT_FAULT_HOLD set to a file's path, every such call waits until that file exists (a
 * write held in flight for exactly as long as a test needs, whatever the machine's speed).
 * Nothing else is touched.
 * Build: cc -shared -fPIC -O2 -o eio_shim.so eio_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static atomic_llong written;
static atomic_llong failures;

static int matches(int fd) {
  const char* want = getenv("FASTCKPT_FAULT_PATH");
  if (want == NULL || *want == '\0') return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return strstr(path, want) != NULL;
}

/* 1 when this call on fd must fail (and count it), 0 to let it through. */
static int must_fail(int fd, size_t bytes) {
  const char* no_direct = getenv("FASTCKPT_FAULT_NO_DIRECT");
  if (no_direct != NULL && *no_direct != '\0') return 0;
  if (!matches(fd)) return 0;
  const char* hold = getenv("FASTCKPT_FAULT_HOLD");
  if (hold != NULL && *hold != '\0') {
    while (access(hold, F_OK) != 0) usleep(5000);
    return 0;
  }
  const char* slow = getenv("FASTCKPT_FAULT_SLOW_US");
  if (slow != NULL && *slow != '\0') {
    usleep((useconds_t)atol(slow));
    return 0;
  }
  const char* after = getenv("FASTCKPT_FAULT_AFTER");
  const char* count = getenv("FASTCKPT_FAULT_COUNT");
  long long limit = after ? atoll(after) : 0;
  long long most = count ? atoll(count) : -1;
  if (atomic_load(&written) + (long long)bytes <= limit) {
    atomic_fetch_add(&written, (long long)bytes);
    return 0;
  }
  if (most >= 0 && atomic_fetch_add(&failures, 1) >= most) return 0;
  errno = EIO;
  return 1;
}

typedef ssize_t (*write_fn)(int, const void*, size_t);
typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);
typedef ssize_t (*pwritev_fn)(int, const struct iovec*, int, off_t);
typedef int (*sync_fn)(int);
#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void* buf, size_t n) {
  REAL(write, write_fn);
  if (must_fail(fd, n)) return -1;
  return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite, pwrite_fn);
  if (must_fail(fd, n)) return -1;
  return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite64, pwrite_fn);
  if (must_fail(fd, n)) return -1;
  return real_pwrite64(fd, buf, n, off);
}

ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  REAL(pwritev, pwritev_fn);
  size_t n = 0;
  for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
  if (must_fail(fd, n)) return -1;
  return real_pwritev(fd, iov, cnt, off);
}

int fsync(int fd) {
  REAL(fsync, sync_fn);
  if (must_fail(fd, 0)) return -1;
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync, sync_fn);
  if (must_fail(fd, 0)) return -1;
  return real_fdatasync(fd);
}

/* 1 when opening path with these flags must fail as a filesystem without O_DIRECT does. */
static int refuses_direct(const char* path, int flags) {
  const char* no_direct = getenv("FASTCKPT_FAULT_NO_DIRECT");
  const char* want = getenv("FASTCKPT_FAULT_PATH");
  if (no_direct == NULL || *no_direct == '\0' || want == NULL || *want == '\0') return 0;
  return (flags & O_DIRECT) && path != NULL && strstr(path, want) != NULL;
}

typedef int (*open_fn)(const char*, int, ...);
#define OPEN_SHIM(name)                                            \
  int name(const char* path, int flags, ...) {                     \
    mode_t mode = 0;                                               \
    if (flags & (O_CREAT | __O_TMPFILE)) {                         \
      va_list ap;                                                  \
      va_start(ap, flags);                                         \
      mode = va_arg(ap, mode_t);                                   \
      va_end(ap);                                                  \
    }                                                              \
    if (refuses_direct(path, flags)) {                             \
      errno = EINVAL;                                              \
      return -1;                                                   \
    }                                                              \
    REAL(name, open_fn);                                           \
    return real_##name(path, flags, mode);                         \
  }
OPEN_SHIM(open)
OPEN_SHIM(open64)
