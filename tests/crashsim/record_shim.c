/* record_shim.c — an LD_PRELOAD recorder of every file operation under one directory, for the
 * power-loss simulator (tests/crashsim): what a save did to the disk, in the order it did it.
 *
 * With $FASTCKPT_SIM_ROOT (an absolute directory) and $FASTCKPT_SIM_LOG (a file outside it)
 * set, every open/creat, write/pwrite/pwritev/writev, ftruncate, fallocate, fsync/fdatasync,
 * rename, unlink, mkdir and rmdir on a path under the root — the process's own and its native
 * writers' alike — is appended to the log, with the bytes written and the inode it touched.
 * The pages of such a file mapped shared are watched (the pool): a page whose bytes changed is
 * recorded at the first op after the stores, and msync records the range it made durable.
 * A call is made and numbered under one lock, so within a process the numbers follow the order
 * the calls completed in (across processes: see next_seq, and shared_lock for mkdir). A call not modelled (sendfile,
 * copy_file_range, link, symlink) under the root is logged as "unsupported", and the replay
 * refuses such a log rather than judge it. Opening $FASTCKPT_SIM_ROOT/.sim-mark-TEXT logs a
 * marker (TEXT) and creates nothing.
 *
 * A record (appended whole): u32 magic 'FCSR', u8 op, 3 pad, u64 seq, i64 ino, i64 ino2,
 * u64 off, u64 len, i32 flags, u32 path_len, u32 path2_len, u32 data_len, then path, path2, data.
 * Build: cc -shared -fPIC -O2 -o record_shim.so record_shim.c -ldl -lpthread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
  OP_OPEN = 1, OP_WRITE, OP_TRUNCATE, OP_FSYNC, OP_RENAME, OP_UNLINK, OP_MKDIR, OP_RMDIR, OP_MARK,
  OP_PAGE, OP_UNSUPPORTED
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t seq;  /* the number of the last op this process recorded */
static int log_fd = -1;

#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)
typedef ssize_t (*write_fn)(int, const void*, size_t);
typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);
typedef ssize_t (*vec_fn)(int, const struct iovec*, int);
typedef ssize_t (*pvec_fn)(int, const struct iovec*, int, off_t);
typedef int (*int_fd_fn)(int);
typedef int (*trunc_fn)(int, off_t);
typedef int (*falloc_fn)(int, off_t, off_t);
typedef int (*fallocate_fn)(int, int, off_t, off_t);
typedef int (*open_fn)(const char*, int, ...);
typedef int (*openat_fn)(int, const char*, int, ...);
typedef int (*creat_fn)(const char*, mode_t);
typedef int (*rename_fn)(const char*, const char*);
typedef int (*renameat_fn)(int, const char*, int, const char*);
typedef int (*renameat2_fn)(int, const char*, int, const char*, unsigned int);
typedef int (*path_fn)(const char*);
typedef int (*unlinkat_fn)(int, const char*, int);
typedef int (*mkdir_fn)(const char*, mode_t);
typedef int (*mkdirat_fn)(int, const char*, mode_t);
typedef void* (*mmap_fn)(void*, size_t, int, int, int, off_t);
typedef int (*munmap_fn)(void*, size_t);
typedef int (*msync_fn)(void*, size_t, int);
typedef ssize_t (*sendfile_fn)(int, int, off_t*, size_t);
typedef ssize_t (*cfr_fn)(int, off_t*, int, off_t*, size_t, unsigned int);
typedef int (*link_fn)(const char*, const char*);

static const char* root(void) {
  const char* r = getenv("FASTCKPT_SIM_ROOT");
  return (r != NULL && *r == '/' && getenv("FASTCKPT_SIM_LOG") != NULL) ? r : NULL;
}

static int under_root(const char* path) {
  const char* r = root();
  if (r == NULL || path == NULL) return 0;
  size_t n = strlen(r);
  return strncmp(path, r, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* The absolute path of name as seen from dirfd (AT_FDCWD: the working directory), without
 * resolving its last component (it may not exist yet, or be the link itself). */
static int full_path(int dirfd, const char* name, char* out, size_t size) {
  if (name == NULL) return -1;
  if (name[0] == '/') {
    snprintf(out, size, "%s", name);
    return 0;
  }
  char base[PATH_MAX];
  if (dirfd == AT_FDCWD) {
    if (getcwd(base, sizeof base) == NULL) return -1;
  } else {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t n = readlink(link, base, sizeof base - 1);
    if (n <= 0) return -1;
    base[n] = '\0';
  }
  int n = snprintf(out, size, "%s/%s", base, name);
  return (n < 0 || (size_t)n >= size) ? -1 : 0;
}

static int fd_path(int fd, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, size - 1);
  if (n <= 0) return -1;
  out[n] = '\0';
  return 0;
}

static int64_t fd_ino(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? (int64_t)st.st_ino : -1;
}

static int64_t path_ino(const char* path) {
  struct stat st;
  return lstat(path, &st) == 0 ? (int64_t)st.st_ino : -1;
}

/* A page every recorded process maps (a file beside the log): [0] the one sequence they share,
 * [8] a lock they share. */
static uint64_t* shared_page(void) {
  static uint64_t* shared;
  if (shared == NULL) {
    REAL(open, open_fn);
    REAL(mmap, mmap_fn);
    char name[PATH_MAX];
    snprintf(name, sizeof name, "%s.seq", getenv("FASTCKPT_SIM_LOG"));
    int fd = real_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, 4096) != 0) abort();
    void* m = real_mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) abort();
    shared = (uint64_t*)m;
  }
  return shared;
}

/* The next number of the one sequence every recorded process shares, so ops of several processes
 * (ranks) order by it: an op a process made before it told another one (a collective) numbers
 * below what that one does next. */
static uint64_t next_seq(void) { return __atomic_add_fetch(shared_page(), 1, __ATOMIC_SEQ_CST); }

/* Held by one recorded process at a time, across the call and its record: for a call whose effect
 * another process may rely on without a collective between them (two ranks making one folder:
 * the one whose mkdir fails with EEXIST goes on to write into it), so that its number is below
 * anything the other does after seeing it. A spin lock in the shared page (never held long). */
static void shared_lock(void) {
  uint64_t* word = shared_page() + 8;
  while (__atomic_exchange_n(word, 1, __ATOMIC_ACQUIRE)) sched_yield();
}
static void shared_unlock(void) { __atomic_store_n(shared_page() + 8, 0, __ATOMIC_RELEASE); }

static void observe(void);

/* Appends one record in one write (O_APPEND: whole, whoever else appends); called with the lock
 * held. data may be an iovec list. Any mapped page that changed since it was last observed is
 * recorded first (a PAGE record), so a page's bytes are known at every op. */
static void emit_record(int op, int64_t ino, int64_t ino2, uint64_t off, uint64_t len, int flags,
                        const char* path, const char* path2, const struct iovec* iov, int iovcnt, size_t data_len);
static int observing;
static void emit(int op, int64_t ino, int64_t ino2, uint64_t off, uint64_t len, int flags, const char* path,
                 const char* path2, const struct iovec* iov, int iovcnt, size_t data_len) {
  if (!observing && op != OP_PAGE) {
    observing = 1;
    observe();
    observing = 0;
  }
  emit_record(op, ino, ino2, off, len, flags, path, path2, iov, iovcnt, data_len);
}

static void emit_record(int op, int64_t ino, int64_t ino2, uint64_t off, uint64_t len, int flags, const char* path,
                 const char* path2, const struct iovec* iov, int iovcnt, size_t data_len) {
  REAL(write, write_fn);
  if (log_fd < 0) {
    REAL(open, open_fn);
    log_fd = real_open(getenv("FASTCKPT_SIM_LOG"), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) abort();
  }
  uint32_t pl = path ? (uint32_t)strlen(path) : 0, p2l = path2 ? (uint32_t)strlen(path2) : 0;
  size_t head_len = 4 + 4 + 8 * 5 + 4 * 4, total = head_len + pl + p2l + data_len;
  unsigned char* buf = malloc(total);
  if (buf == NULL) abort();
  unsigned char* h = buf;
  uint32_t magic = 0x52534346u; /* "FCSR" */
  memcpy(h, &magic, 4); h += 4;
  h[0] = (unsigned char)op; h[1] = h[2] = h[3] = 0; h += 4;
  seq = next_seq();
  memcpy(h, &seq, 8); h += 8;
  memcpy(h, &ino, 8); h += 8;
  memcpy(h, &ino2, 8); h += 8;
  memcpy(h, &off, 8); h += 8;
  memcpy(h, &len, 8); h += 8;
  int32_t f = flags;
  uint32_t dl = (uint32_t)data_len;
  memcpy(h, &f, 4); h += 4;
  memcpy(h, &pl, 4); h += 4;
  memcpy(h, &p2l, 4); h += 4;
  memcpy(h, &dl, 4); h += 4;
  if (pl) { memcpy(h, path, pl); h += pl; }
  if (p2l) { memcpy(h, path2, p2l); h += p2l; }
  size_t left = data_len;
  for (int i = 0; i < iovcnt && left > 0; i++) {
    size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;
    memcpy(h, iov[i].iov_base, n);
    h += n;
    left -= n;
  }
  ssize_t w;
  do {
    w = real_write(log_fd, buf, total);
  } while (w < 0 && errno == EINTR);
  if (w != (ssize_t)total) abort();  /* a log with a hole would be judged wrongly: stop instead */
  free(buf);
}

static int fd_under_root(int fd, char* path, size_t size) {
  return root() != NULL && fd_path(fd, path, size) == 0 && under_root(path);
}

/* -- data ----------------------------------------------------------------------------- */
static ssize_t logged_write(int fd, const struct iovec* iov, int cnt, off_t off, int positional,
                            ssize_t (*call)(int, const struct iovec*, int, off_t)) {
  char path[PATH_MAX];
  if (!fd_under_root(fd, path, sizeof path)) return call(fd, iov, cnt, off);
  pthread_mutex_lock(&lock);
  off_t at = positional ? off : lseek(fd, 0, SEEK_CUR);
  if (!positional && (fcntl(fd, F_GETFL) & O_APPEND)) at = lseek(fd, 0, SEEK_END);
  ssize_t r = call(fd, iov, cnt, off);
  int saved = errno;
  if (r > 0) emit(OP_WRITE, fd_ino(fd), 0, (uint64_t)at, (uint64_t)r, 0, path, NULL, iov, cnt, (size_t)r);
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}

static ssize_t call_write(int fd, const struct iovec* iov, int cnt, off_t off) {
  REAL(write, write_fn);
  (void)cnt; (void)off;
  return real_write(fd, iov[0].iov_base, iov[0].iov_len);
}
static ssize_t call_pwrite(int fd, const struct iovec* iov, int cnt, off_t off) {
  REAL(pwrite, pwrite_fn);
  (void)cnt;
  return real_pwrite(fd, iov[0].iov_base, iov[0].iov_len, off);
}
static ssize_t call_writev(int fd, const struct iovec* iov, int cnt, off_t off) {
  REAL(writev, vec_fn);
  (void)off;
  return real_writev(fd, iov, cnt);
}
static ssize_t call_pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  REAL(pwritev, pvec_fn);
  return real_pwritev(fd, iov, cnt, off);
}

ssize_t write(int fd, const void* buf, size_t n) {
  struct iovec v = {(void*)buf, n};
  return logged_write(fd, &v, 1, 0, 0, call_write);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  struct iovec v = {(void*)buf, n};
  return logged_write(fd, &v, 1, off, 1, call_pwrite);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
ssize_t writev(int fd, const struct iovec* iov, int cnt) { return logged_write(fd, iov, cnt, 0, 0, call_writev); }
ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  return logged_write(fd, iov, cnt, off, 1, call_pwritev);
}
ssize_t pwritev64(int fd, const struct iovec* iov, int cnt, off_t off) { return pwritev(fd, iov, cnt, off); }

static int logged_size(int fd, off_t size, int (*call)(int, off_t, off_t), off_t a, off_t b, int op_flags) {
  char path[PATH_MAX];
  if (!fd_under_root(fd, path, sizeof path)) return call(fd, a, b);
  pthread_mutex_lock(&lock);
  int r = call(fd, a, b);
  int saved = errno;
  struct stat st;
  /* the size the call left (fallocate may leave it as it was) */
  if (r == 0 && fstat(fd, &st) == 0) emit(OP_TRUNCATE, (int64_t)st.st_ino, 0, (uint64_t)st.st_size, 0,
                                          op_flags, path, NULL, NULL, 0, 0);
  (void)size;
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
static int call_ftruncate(int fd, off_t a, off_t b) { REAL(ftruncate, trunc_fn); (void)b; return real_ftruncate(fd, a); }
static int call_pfalloc(int fd, off_t a, off_t b) {
  REAL(posix_fallocate, falloc_fn);
  return real_posix_fallocate(fd, a, b);
}
int ftruncate(int fd, off_t size) { return logged_size(fd, size, call_ftruncate, size, 0, 0); }
int ftruncate64(int fd, off_t size) { return ftruncate(fd, size); }
int posix_fallocate(int fd, off_t off, off_t len) { return logged_size(fd, off + len, call_pfalloc, off, len, 1); }
int posix_fallocate64(int fd, off_t off, off_t len) { return posix_fallocate(fd, off, len); }
int fallocate(int fd, int mode, off_t off, off_t len) {
  REAL(fallocate, fallocate_fn);
  char path[PATH_MAX];
  if (!fd_under_root(fd, path, sizeof path)) return real_fallocate(fd, mode, off, len);
  pthread_mutex_lock(&lock);
  int r = real_fallocate(fd, mode, off, len);
  int saved = errno;
  struct stat st;
  if (r == 0 && fstat(fd, &st) == 0) {
    if (mode & ~FALLOC_FL_KEEP_SIZE) emit(OP_UNSUPPORTED, (int64_t)st.st_ino, 0, 0, 0, mode, path, "fallocate mode",
                                          NULL, 0, 0);
    else emit(OP_TRUNCATE, (int64_t)st.st_ino, 0, (uint64_t)st.st_size, 0, 1, path, NULL, NULL, 0, 0);
  }
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
int fallocate64(int fd, int mode, off_t off, off_t len) { return fallocate(fd, mode, off, len); }

static int logged_sync(int fd, int data_only) {
  REAL(fsync, int_fd_fn);
  REAL(fdatasync, int_fd_fn);
  char path[PATH_MAX];
  if (!fd_under_root(fd, path, sizeof path)) return data_only ? real_fdatasync(fd) : real_fsync(fd);
  pthread_mutex_lock(&lock);
  int r = data_only ? real_fdatasync(fd) : real_fsync(fd);
  int saved = errno;
  if (r == 0) emit(OP_FSYNC, fd_ino(fd), 0, 0, 0, data_only, path, NULL, NULL, 0, 0);
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
int fsync(int fd) { return logged_sync(fd, 0); }
int fdatasync(int fd) { return logged_sync(fd, 1); }

/* -- names ----------------------------------------------------------------------------- */
static int is_mark(const char* full) {
  const char* r = root();
  char want[PATH_MAX];
  snprintf(want, sizeof want, "%s/.sim-mark-", r ? r : "");
  return r != NULL && strncmp(full, want, strlen(want)) == 0;
}

static int logged_open(int dirfd, const char* name, int flags, mode_t mode, int at) {
  REAL(open, open_fn);
  REAL(openat, openat_fn);
  char full[PATH_MAX];
  if (root() == NULL || full_path(dirfd, name, full, sizeof full) != 0 || !under_root(full))
    return at ? real_openat(dirfd, name, flags, mode) : real_open(name, flags, mode);
  pthread_mutex_lock(&lock);
  if (is_mark(full)) {
    emit(OP_MARK, 0, 0, 0, 0, 0, full + strlen(root()) + strlen("/.sim-mark-"), NULL, NULL, 0, 0);
    pthread_mutex_unlock(&lock);
    errno = ENOENT;
    return -1;
  }
  int64_t before = path_ino(full);
  int r = at ? real_openat(dirfd, name, flags, mode) : real_open(name, flags, mode);
  int saved = errno;
  if (r >= 0) {
    int64_t ino = fd_ino(r);
    int created = before != ino;
    /* flags: the call's, with bit 30 set when this open created the file */
    emit(OP_OPEN, ino, 0, 0, 0, (flags & ~(1 << 30)) | (created ? 1 << 30 : 0), full, NULL, NULL, 0, 0);
  }
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}

#define OPEN_MODE(flags)                                            \
  mode_t mode = 0;                                                  \
  if ((flags) & (O_CREAT | __O_TMPFILE)) {                          \
    va_list ap;                                                     \
    va_start(ap, flags);                                            \
    mode = va_arg(ap, mode_t);                                      \
    va_end(ap);                                                     \
  }
int open(const char* path, int flags, ...) { OPEN_MODE(flags); return logged_open(AT_FDCWD, path, flags, mode, 0); }
int open64(const char* path, int flags, ...) { OPEN_MODE(flags); return logged_open(AT_FDCWD, path, flags, mode, 0); }
int openat(int dirfd, const char* path, int flags, ...) { OPEN_MODE(flags); return logged_open(dirfd, path, flags, mode, 1); }
int openat64(int dirfd, const char* path, int flags, ...) { OPEN_MODE(flags); return logged_open(dirfd, path, flags, mode, 1); }
int creat(const char* path, mode_t mode) { return logged_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }
int creat64(const char* path, mode_t mode) { return creat(path, mode); }

static int logged_rename(int olddir, const char* old, int newdir, const char* new_, unsigned int flags) {
  REAL(renameat2, renameat2_fn);
  char a[PATH_MAX], b[PATH_MAX];
  if (root() == NULL || full_path(olddir, old, a, sizeof a) != 0 || full_path(newdir, new_, b, sizeof b) != 0 ||
      (!under_root(a) && !under_root(b)))
    return real_renameat2(olddir, old, newdir, new_, flags);
  pthread_mutex_lock(&lock);
  int64_t ino = path_ino(a), replaced = path_ino(b);
  int r = real_renameat2(olddir, old, newdir, new_, flags);
  int saved = errno;
  if (r == 0) {
    if (under_root(a) && under_root(b)) emit(OP_RENAME, ino, replaced, 0, 0, (int)flags, a, b, NULL, 0, 0);
    else emit(OP_UNSUPPORTED, ino, replaced, 0, 0, 0, a, "rename across the root's edge", NULL, 0, 0);
  }
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
int rename(const char* old, const char* new_) { return logged_rename(AT_FDCWD, old, AT_FDCWD, new_, 0); }
int renameat(int od, const char* old, int nd, const char* new_) { return logged_rename(od, old, nd, new_, 0); }
int renameat2(int od, const char* old, int nd, const char* new_, unsigned int flags) {
  return logged_rename(od, old, nd, new_, flags);
}

static int logged_remove(int dirfd, const char* name, int is_dir) {
  REAL(unlinkat, unlinkat_fn);
  char full[PATH_MAX];
  if (root() == NULL || full_path(dirfd, name, full, sizeof full) != 0 || !under_root(full))
    return real_unlinkat(dirfd, name, is_dir ? AT_REMOVEDIR : 0);
  pthread_mutex_lock(&lock);
  int64_t ino = path_ino(full);
  int r = real_unlinkat(dirfd, name, is_dir ? AT_REMOVEDIR : 0);
  int saved = errno;
  if (r == 0) emit(is_dir ? OP_RMDIR : OP_UNLINK, ino, 0, 0, 0, 0, full, NULL, NULL, 0, 0);
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
int unlink(const char* path) { return logged_remove(AT_FDCWD, path, 0); }
int rmdir(const char* path) { return logged_remove(AT_FDCWD, path, 1); }
int unlinkat(int dirfd, const char* path, int flags) { return logged_remove(dirfd, path, (flags & AT_REMOVEDIR) != 0); }

static int logged_mkdir(int dirfd, const char* name, mode_t mode) {
  REAL(mkdirat, mkdirat_fn);
  char full[PATH_MAX];
  if (root() == NULL || full_path(dirfd, name, full, sizeof full) != 0 || !under_root(full))
    return real_mkdirat(dirfd, name, mode);
  pthread_mutex_lock(&lock);
  shared_lock();  /* another rank's mkdir of the same folder (EEXIST) returns only once this is numbered */
  int r = real_mkdirat(dirfd, name, mode);
  int saved = errno;
  if (r == 0) emit(OP_MKDIR, path_ino(full), 0, 0, 0, 0, full, NULL, NULL, 0, 0);
  shared_unlock();
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
int mkdir(const char* path, mode_t mode) { return logged_mkdir(AT_FDCWD, path, mode); }
int mkdirat(int dirfd, const char* path, mode_t mode) { return logged_mkdir(dirfd, path, mode); }

/* -- what the simulator does not model: logged so that the replay refuses the log -------- */
static void unsupported_fd(int fd, const char* what) {
  char path[PATH_MAX];
  if (!fd_under_root(fd, path, sizeof path)) return;
  pthread_mutex_lock(&lock);
  emit(OP_UNSUPPORTED, fd_ino(fd), 0, 0, 0, 0, path, what, NULL, 0, 0);
  pthread_mutex_unlock(&lock);
}
ssize_t sendfile(int out, int in, off_t* off, size_t n) {
  REAL(sendfile, sendfile_fn);
  unsupported_fd(out, "sendfile");
  return real_sendfile(out, in, off, n);
}
ssize_t copy_file_range(int in, off_t* ioff, int out, off_t* ooff, size_t n, unsigned int flags) {
  REAL(copy_file_range, cfr_fn);
  unsupported_fd(out, "copy_file_range");
  return real_copy_file_range(in, ioff, out, ooff, n, flags);
}
static void unsupported_path(const char* path, const char* what) {
  char full[PATH_MAX];
  if (root() == NULL || full_path(AT_FDCWD, path, full, sizeof full) != 0 || !under_root(full)) return;
  pthread_mutex_lock(&lock);
  emit(OP_UNSUPPORTED, 0, 0, 0, 0, 0, full, what, NULL, 0, 0);
  pthread_mutex_unlock(&lock);
}
int link(const char* a, const char* b) { REAL(link, link_fn); unsupported_path(b, "link"); return real_link(a, b); }
int symlink(const char* a, const char* b) {
  REAL(symlink, link_fn);
  unsupported_path(b, "symlink");
  return real_symlink(a, b);
}

/* -- mappings (the pool): what each page held when, and what msync made durable ------------ */
#define MAX_MAPS 64
struct mapping {
  char* addr;
  size_t len;
  off_t off;
  int64_t ino;
  char path[PATH_MAX];
  unsigned char* seen;   /* the bytes as last observed */
};
static struct mapping maps[MAX_MAPS];
static int n_maps;

/* Every page of every mapping whose bytes changed since last observed: a PAGE record (ino2: the
 * op this process recorded before it — the bytes were stored after that op and by this one,
 * perhaps written back to the disk already). Called with the lock held before each recorded op,
 * so every store is seen at the first op after it. */
static void observe(void) {
  uint64_t before = seq;
  for (int i = 0; i < MAX_MAPS && n_maps > 0; i++) {
    struct mapping* m = &maps[i];
    if (m->addr == NULL) continue;
    size_t pages = (m->len + 4095) / 4096;
    for (size_t p = 0; p < pages; p++) {
      size_t at = p * 4096, n = m->len - at < 4096 ? m->len - at : 4096;
      if (memcmp(m->seen + at, m->addr + at, n) == 0) continue;
      struct iovec v = {m->addr + at, n};
      emit(OP_PAGE, m->ino, (int64_t)before, (uint64_t)(m->off + at), n, 0, m->path, NULL, &v, 1, n);
      memcpy(m->seen + at, m->addr + at, n);
    }
  }
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  REAL(mmap, mmap_fn);
  char path[PATH_MAX];
  if (fd < 0 || !(flags & MAP_SHARED) || !(prot & PROT_WRITE) || !fd_under_root(fd, path, sizeof path))
    return real_mmap(addr, len, prot, flags, fd, off);
  pthread_mutex_lock(&lock);
  observe();
  void* r = real_mmap(addr, len, prot, flags, fd, off);
  if (r != MAP_FAILED) {
    int i = 0;
    while (i < MAX_MAPS && maps[i].addr != NULL) i++;
    if (i == MAX_MAPS) {
      emit(OP_UNSUPPORTED, fd_ino(fd), 0, 0, 0, 0, path, "more than 64 mappings", NULL, 0, 0);
    } else {
      struct mapping* m = &maps[i];
      m->seen = malloc(len);
      if (m->seen == NULL) abort();
      memcpy(m->seen, r, len);
      m->addr = (char*)r;
      m->len = len;
      m->off = off;
      m->ino = fd_ino(fd);
      snprintf(m->path, sizeof m->path, "%s", path);
      n_maps++;
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}
void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}

int munmap(void* addr, size_t len) {
  REAL(munmap, munmap_fn);
  pthread_mutex_lock(&lock);
  observe();  /* what it held is seen; unmapped, it reaches the disk some time later */
  for (int i = 0; i < MAX_MAPS; i++) {
    if (maps[i].addr == NULL || maps[i].addr != addr) continue;
    free(maps[i].seen);
    memset(&maps[i], 0, sizeof maps[i]);
    n_maps--;
  }
  int r = real_munmap(addr, len);
  pthread_mutex_unlock(&lock);
  return r;
}

/* What msync made durable: the pages of the range as observed now (an FSYNC record, flags 2:
 * a range), after the real msync succeeded. */
int msync(void* addr, size_t len, int flags) {
  REAL(msync, msync_fn);
  pthread_mutex_lock(&lock);
  observe();
  int r = real_msync(addr, len, flags);
  int saved = errno;
  if (r == 0 && (flags & MS_SYNC)) {
    for (int i = 0; i < MAX_MAPS; i++) {
      struct mapping* m = &maps[i];
      if (m->addr == NULL || (char*)addr < m->addr || (char*)addr >= m->addr + m->len) continue;
      size_t lo = (size_t)((char*)addr - m->addr), hi = lo + len > m->len ? m->len : lo + len;
      emit(OP_FSYNC, m->ino, 0, (uint64_t)(m->off + lo), hi - lo, 2, m->path, NULL, NULL, 0, 0);
    }
  }
  pthread_mutex_unlock(&lock);
  errno = saved;
  return r;
}
