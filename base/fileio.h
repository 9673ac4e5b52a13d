/* fileio: the file operations every on-disk format shares — read-only mappings and
 * atomic writes (SQLite-style: write a temporary file, fsync it, rename it over the
 * target, fsync the directory), so a crash leaves either the old file or the new one. */
#ifndef FSDP_FILEIO_H
#define FSDP_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/errbuf.h"

typedef struct file_chunk {
    const void *data;
    size_t len;
} file_chunk;

/* What a file of this st_mode is, for messages: "a regular file", "a FIFO", "a directory"... */
const char *file_type_name(mode_t mode);
/* Opens a regular file for reading; anything else (a FIFO, a directory, a device) is refused
 * with a message naming the path and what it is, without blocking: a FIFO with no writer
 * would block open() and read() forever.  Returns the fd (blocking again), or -1. */
int file_open_regular(const char *path, errbuf *err);
/* Opens a regular file for appending (created with mode 0644 when missing); anything else is
 * refused as file_open_regular does, without blocking.  Returns the fd (blocking), or -1. */
int file_open_append(const char *path, errbuf *err);
/* Maps a whole regular file read-only.  An empty file gives *map = NULL, *len = 0. */
int file_map_readonly(const char *path, void **map, size_t *len, errbuf *err);
/* Reads a whole (small) regular file into a NUL-terminated malloc'd buffer of at most max bytes. */
int file_read_all(const char *path, size_t max, char **out, size_t *len, errbuf *err);
/* The same for a file only this user can have written (a secret another uid must not plant):
 * a regular file, not a symbolic link, owned by the effective uid, mode 0600.  Returns 1 when
 * it does not exist; -1 naming the file, why, its owner and mode when it is not such a file. */
int file_read_private(const char *path, size_t max, char **out, size_t *len, errbuf *err);
/* Writes the chunks back to back into path atomically (path.tmp.PID, fsync, rename, fsync dir). */
int file_write_atomic(const char *path, const file_chunk *chunks, size_t n, errbuf *err);
/* The same with the file created with `mode` (0600 for a secret), not 0644. */
int file_write_atomic_mode(const char *path, const file_chunk *chunks, size_t n, mode_t mode, errbuf *err);
/* write()/pwrite() every byte, retrying on EINTR and short writes. */
int file_write_full(int fd, const void *data, size_t len, const char *path, errbuf *err);
int file_pwrite_full(int fd, const void *data, size_t len, off_t off, const char *path,
                     errbuf *err);
/* pread() exactly len bytes at off, retrying on EINTR and short reads; the end of the file
 * first is the error "truncated". */
int file_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path, errbuf *err);
/* fsync the directory holding path (or the directory itself when is_dir). */
int file_fsync_dir(const char *path, int is_dir, errbuf *err);
/* A directory only this user can write and list (the status sockets'): with create, made with
 * mode 0700 when missing.  It must be a directory, not a symbolic link, owned by the effective
 * uid (or root), with no group or other permissions; else an error naming its owner and mode
 * (another user made it first).  A missing one (without create) is an error saying so. */
int file_private_dir(const char *path, int create, errbuf *err);
/* rm -rf (symbolic links removed, never followed); a missing path is fine. */
int file_remove_tree(const char *path, errbuf *err);
/* mkdir that accepts an existing directory. */
int file_mkdir(const char *path, errbuf *err);
/* mkdir -p: the directory and any missing parents. */
int file_mkdir_p(const char *path, errbuf *err);
/* Copies src to dst (created, O_EXCL; fsynced); 1 when src does not exist.  src must be a
 * regular file (a FIFO is refused, not waited on). */
int file_copy(const char *src, const char *dst, errbuf *err);

#endif
