/* fileio: regular-file opens, mappings, atomic writes, private files and directories; see fileio.h. */
#include "base/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/path.h"

const char *file_type_name(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "of an unknown file type";
}

/* fd blocking again (it was opened O_NONBLOCK, so that a FIFO could not block the open);
 * closed on failure. */
static int clear_nonblock(int fd, const char *path, errbuf *err) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return errf(err, "%s: fcntl: %s", path, strerror(e));
    }
    return fd;
}

/* fd (from an open with O_NONBLOCK) checked to be a regular file, then blocking again; closed
 * on failure. */
static int keep_if_regular(int fd, const char *path, errbuf *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return errf(err, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return errf(err, "%s: is %s, not a regular file", path, file_type_name(st.st_mode));
    }
    return clear_nonblock(fd, path, err);
}

int file_open_regular(const char *path, errbuf *err) {
    /* O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errf(err, "%s: open: %s", path, strerror(errno));
    return keep_if_regular(fd, path, err);
}

int file_open_append(const char *path, errbuf *err) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return errf(err, "%s: is %s, not a regular file", path, file_type_name(st.st_mode));
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0) return errf(err, "%s: open: %s", path, strerror(errno));
    return keep_if_regular(fd, path, err);
}

int file_map_readonly(const char *path, void **map, size_t *len, errbuf *err) {
    *map = NULL;
    *len = 0;
    int fd = file_open_regular(path, err);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return errf(err, "%s: fstat: %s", path, strerror(e));
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return errf(err, "%s: mmap: %s", path, strerror(e));
        }
        *map = p;
        *len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

/* Reads fd (closed here) to its end: at most max bytes, NUL-terminated. */
static int read_fd_all(int fd, const char *path, size_t max, char **out, size_t *len, errbuf *err) {
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return errf(err, "%s: fdopen: %s", path, strerror(e));
    }
    char *buf = malloc(max + 1);
    if (!buf) {
        fclose(f);
        return errf(err, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, max + 1, f);
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return errf(err, "%s: read error", path);
    }
    if (n > max) {
        free(buf);
        return errf(err, "%s: larger than %zu bytes", path, max);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return 0;
}

int file_read_all(const char *path, size_t max, char **out, size_t *len, errbuf *err) {
    *out = NULL;
    int fd = file_open_regular(path, err);
    if (fd < 0) return -1;
    return read_fd_all(fd, path, max, out, len, err);
}

int file_read_private(const char *path, size_t max, char **out, size_t *len, errbuf *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) return 1;
    if (fd < 0 && errno == ELOOP) return errf(err, "%s: is a symbolic link, not a file this user wrote", path);
    if (fd < 0) return errf(err, "%s: open: %s", path, strerror(errno));
    struct stat st = {0};
    const char *why = NULL;
    if (fstat(fd, &st) != 0) why = strerror(errno);
    else if (!S_ISREG(st.st_mode)) why = file_type_name(st.st_mode);
    else if (st.st_uid != geteuid()) why = "owned by another user";
    else if ((st.st_mode & 07777) != 0600) why = "readable or writable by others";
    if (why) {
        close(fd);
        return errf(err, "%s: not trusted: %s (owner uid %u, mode %04o; it must be a regular file of uid %u "
                    "with mode 0600)", path, why, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                    (unsigned)geteuid());
    }
    if (clear_nonblock(fd, path, err) < 0) return -1;
    return read_fd_all(fd, path, max, out, len, err);
}

int file_write_full(int fd, const void *data, size_t len, const char *path, errbuf *err) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errf(err, "%s: write: %s", path, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int file_pwrite_full(int fd, const void *data, size_t len, off_t off, const char *path,
                     errbuf *err) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = pwrite(fd, p, len > (1u << 30) ? (1u << 30) : len, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errf(err, "%s: write: %s", path, strerror(errno));
        }
        p += w;
        off += w;
        len -= (size_t)w;
    }
    return 0;
}

int file_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path, errbuf *err) {
    char *p = buf;
    while (len > 0) {
        ssize_t r = pread(fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errf(err, "%s: read: %s", path, strerror(errno));
        if (r == 0)
            return errf(err, "%s: truncated (ends before byte %llu)", path, (unsigned long long)off);
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

int file_fsync_dir(const char *path, int is_dir, errbuf *err) {
    char *copy = strdup(path);
    if (!copy) return errf(err, "%s: out of memory", path);
    const char *dir = is_dir ? copy : dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (fd < 0) {
        rc = errf(err, "%s: %s", dir, strerror(errno));
    } else {
        if (fsync(fd) != 0 && errno != EINVAL) rc = errf(err, "%s: fsync: %s", dir, strerror(errno));
        close(fd);
    }
    free(copy);
    return rc;
}

int file_write_atomic(const char *path, const file_chunk *chunks, size_t n, errbuf *err) {
    return file_write_atomic_mode(path, chunks, n, 0644, err);
}

int file_write_atomic_mode(const char *path, const file_chunk *chunks, size_t n, mode_t mode, errbuf *err) {
    char tmp[PATH_BYTES];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return errf(err, "%s: path too long", path);
    unlink(tmp); /* O_EXCL below: the mode is the one asked for, never an older file's */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return errf(err, "%s: %s", tmp, strerror(errno));
    for (size_t i = 0; i < n; i++) {
        if (chunks[i].len && file_write_full(fd, chunks[i].data, chunks[i].len, tmp, err) != 0)
            goto fail;
    }
    if (fsync(fd) != 0) {
        errf(err, "%s: fsync: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        errf(err, "%s: close: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        errf(err, "%s: rename: %s", path, strerror(errno));
        goto fail;
    }
    return file_fsync_dir(path, 0, err);
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    return -1;
}

int file_private_dir(const char *path, int create, errbuf *err) {
    if (create && mkdir(path, 0700) != 0 && errno != EEXIST) return errf(err, "%s: mkdir: %s", path, strerror(errno));
    struct stat st;
    if (lstat(path, &st) != 0)
        return errf(err, "%s: %s", path, errno == ENOENT ? "does not exist (no job of yours made it here)" : strerror(errno));
    const char *why = !S_ISDIR(st.st_mode)                        ? file_type_name(st.st_mode)
                      : st.st_uid != geteuid() && st.st_uid != 0 ? "owned by another user"
                      : (st.st_mode & 077)                        ? "open to other users"
                                                                  : NULL;
    if (why)
        return errf(err, "%s: not a private directory: %s (owner uid %u, mode %04o; it must be a directory of uid %u "
                    "with mode 0700)", path, why, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                    (unsigned)geteuid());
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

int file_remove_tree(const char *path, errbuf *err) {
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT) return 0;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return errf(err, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

int file_mkdir(const char *path, errbuf *err) {
    if (mkdir(path, 0755) == 0) return 0;
    struct stat st;
    if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    return errf(err, "%s: mkdir: %s", path, strerror(errno));
}

int file_mkdir_p(const char *path, errbuf *err) {
    char *buf = strdup(path);
    if (!buf) return errf(err, "%s: out of memory", path);
    int rc = 0;
    for (char *p = buf + 1; *p && rc == 0; p++) {
        if (*p != '/') continue;
        *p = '\0';
        rc = file_mkdir(buf, err);
        *p = '/';
    }
    if (rc == 0) rc = file_mkdir(buf, err);
    free(buf);
    return rc;
}

#define FILE_COPY_BUFFER (1u << 20)

/* Copies src to dst (created); 1 when src does not exist.  src must be a regular file (a FIFO
 * in the source model directory is refused, not waited on). */
int file_copy(const char *src, const char *dst, errbuf *err) {
    struct stat st;
    if (stat(src, &st) != 0 && errno == ENOENT) return 1;
    int in = file_open_regular(src, err);
    if (in < 0) return -1;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    char *buf = malloc(FILE_COPY_BUFFER);
    int rc = out < 0 ? errf(err, "%s: %s", dst, strerror(errno)) : !buf ? errf(err, "%s: out of memory", dst) : 0;
    for (ssize_t r = 1; rc == 0 && r > 0;) {
        r = read(in, buf, FILE_COPY_BUFFER);
        if (r < 0 && errno != EINTR) rc = errf(err, "%s: read: %s", src, strerror(errno));
        else if (r > 0) rc = file_write_full(out, buf, (size_t)r, dst, err);
    }
    if (rc == 0 && fsync(out) != 0) rc = errf(err, "%s: fsync: %s", dst, strerror(errno));
    if (out >= 0 && close(out) != 0 && rc == 0) rc = errf(err, "%s: close: %s", dst, strerror(errno));
    close(in);
    free(buf);
    return rc;
}
