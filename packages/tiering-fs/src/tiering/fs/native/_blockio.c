/*
 * tiering-fs native batch I/O: store and load a whole share of a job (N blocks) in one call.
 *
 * A plain shared library (no Python C API), loaded with ctypes by tiering/fs/native/__init__.py;
 * ctypes releases the GIL for the whole call, so one call moves N blocks with no Python work per block.
 * The files it writes and reads are byte for byte those of the pure-Python path
 * (tiering/fs/blocks.py, tiering/fs/io/local.py, tiering/core/format.py):
 *
 *   <namespace dir>/<ab>/<key hex>.kvb = payload (block_bytes) + 4096-byte trailer page,
 *   trailer = 128-byte header (format.py) + zeros, ab = low byte of XXH3-64(key) in hex.
 *
 * Same rules as the Python path: a temporary name <final><prefix><counter hex> created with O_EXCL |
 * O_NOFOLLOW, written with pwritev, optionally fsynced, renamed into place (no partial file ever
 * visible; removed on any failure); shard directories made on demand and their descriptors kept in
 * the caller's 256-slot table; no symlink followed (O_NOFOLLOW on the file, O_DIRECTORY | O_NOFOLLOW
 * on the shard directory); O_DIRECT when asked, redone buffered when the filesystem refuses it
 * (EINVAL / EOPNOTSUPP), reported to the caller so it stops asking; every loaded block verified
 * (size, header checksum, magic, version, namespace digest, key, length, payload checksum).
 * A block file is opened with O_NONBLOCK (a FIFO's open would wait for a writer, holding the calling
 * I/O thread for good) and refused unless fstat says it is a regular file.
 *
 * Result codes per block: 0 done, > 0 an errno, < 0 one of the TKVB_* codes below.
 * Build: cc -O2 -shared -fPIC -o libblockio.so _blockio.c (see packages/tiering-fs/hatch_build.py).
 * XXH3 from the vendored xxhash.h and xxh_x86dispatch.c (BSD-2-Clause, LICENSE-xxhash; the copies
 * python-xxhash 4.1.0 ships), so checksums equal python-xxhash's xxh3_64.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
/* Runtime dispatch to the AVX2 / AVX-512 kernels where the CPU has them (as python-xxhash does):
 * about 3x the speed of the SSE2 baseline a plain -O2 build gets. Includes xxhash.h (XXH_INLINE_ALL). */
#include "xxh_x86dispatch.c"
#define XXH3_HASH XXH3_64bits_dispatch
#else
#define XXH_INLINE_ALL
#include "xxhash.h"
#define XXH3_HASH XXH3_64bits
#endif

#define TKVB_ABI_VERSION 2

#define TKVB_TRUNCATED (-1) /* size differs from header + payload */
#define TKVB_CHECKSUM (-2)  /* header or payload checksum, magic or header size wrong */
#define TKVB_FOREIGN (-3)   /* another format version, namespace, key or length */
#define TKVB_BAD_SLOT (-4)  /* block id outside the primary buffer */
#define TKVB_NOT_REGULAR (-5) /* a FIFO, socket, device node or directory in a block file's place: never read */

#define TKVB_DIRECT 1
#define TKVB_FSYNC 2

#define HEADER_SIZE 128
#define TRAILER_BYTES 4096
#define DIRECT_ALIGN 4096
#define MAX_KEY_BYTES 64
#define DIGEST_BYTES 16
#define CHECKED_END 106 /* bytes covered by the header checksum */
#define NAME_MAX_BYTES 512
#define FORMAT_VERSION 1

#ifndef O_DIRECT
#define O_DIRECT 0
#endif

static uint64_t temp_counter = (uint64_t)1 << 40; /* distinct from the Python TempNamer's counter range */

int tkvb_abi_version(void) { return TKVB_ABI_VERSION; }

uint64_t tkvb_xxh3_64(const void *data, size_t len) { return XXH3_HASH(data, len); }

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int direct_unsupported(int err) { return err == EINVAL || err == EOPNOTSUPP || err == ENOTSUP; }

/* The kept descriptor of shard directory `shard` (made when `create`); -errno on failure. */
static int shard_fd(int ns_fd, int32_t *fds, unsigned shard, int create) {
    int32_t fd = __atomic_load_n(&fds[shard], __ATOMIC_ACQUIRE);
    if (fd >= 0) return fd;
    char name[3];
    static const char hex[] = "0123456789abcdef";
    name[0] = hex[shard >> 4];
    name[1] = hex[shard & 15];
    name[2] = 0;
    if (create && mkdirat(ns_fd, name, 0777) != 0 && errno != EEXIST) return -errno;
    int opened = openat(ns_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (opened < 0) return -errno;
    int32_t expected = -1;
    if (!__atomic_compare_exchange_n(&fds[shard], &expected, opened, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        close(opened); /* another thread kept one first; ours was never shared */
        return expected;
    }
    return opened;
}

static size_t hex_name(char *out, const uint8_t *key, unsigned key_len) {
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    for (unsigned i = 0; i < key_len; i++) {
        out[n++] = hex[key[i] >> 4];
        out[n++] = hex[key[i] & 15];
    }
    memcpy(out + n, ".kvb", 5);
    return n + 4;
}

static void encode_header(uint8_t *h, const uint8_t *digest, const uint8_t *key, unsigned key_len,
                          uint64_t payload_len, uint64_t payload_sum) {
    memset(h, 0, HEADER_SIZE);
    memcpy(h, "TKVB", 4);
    put_le(h + 4, FORMAT_VERSION, 2);
    put_le(h + 6, HEADER_SIZE, 2);
    memcpy(h + 8, digest, DIGEST_BYTES);
    put_le(h + 24, payload_len, 8);
    put_le(h + 32, payload_sum, 8);
    put_le(h + 40, key_len, 2);
    memcpy(h + 42, key, key_len);
    put_le(h + CHECKED_END, XXH3_64bits(h, CHECKED_END), 8);
}

static int verify(const uint8_t *h, const uint8_t *payload, uint64_t payload_len, const uint8_t *digest,
                  const uint8_t *key, unsigned key_len) {
    if (XXH3_64bits(h, CHECKED_END) != get_le(h + CHECKED_END, 8)) return TKVB_CHECKSUM;
    if (memcmp(h, "TKVB", 4) != 0 || get_le(h + 6, 2) != HEADER_SIZE) return TKVB_CHECKSUM;
    unsigned stored_len = (unsigned)get_le(h + 40, 2);
    if (get_le(h + 4, 2) != FORMAT_VERSION) return TKVB_FOREIGN;
    if (memcmp(h + 8, digest, DIGEST_BYTES) != 0) return TKVB_FOREIGN;
    /* Python compares key[:key_len] of the stored 64-byte field, so a length over 64 reads as the 64 bytes. */
    unsigned cmp_len = stored_len > MAX_KEY_BYTES ? MAX_KEY_BYTES : stored_len;
    if (cmp_len != key_len || memcmp(h + 42, key, key_len) != 0) return TKVB_FOREIGN;
    if (get_le(h + 24, 8) != payload_len) return TKVB_FOREIGN;
    if (XXH3_HASH(payload, payload_len) != get_le(h + 32, 8)) return TKVB_CHECKSUM;
    return 0;
}

/* Advance the iovec list *iov (*cnt entries) past n bytes done. */
static void consume(struct iovec **iov, int *cnt, size_t n) {
    while (*cnt > 0 && n >= (*iov)->iov_len) {
        n -= (*iov)->iov_len;
        (*iov)++;
        (*cnt)--;
    }
    if (*cnt > 0 && n > 0) {
        (*iov)->iov_base = (uint8_t *)(*iov)->iov_base + n;
        (*iov)->iov_len -= n;
    }
}

/* pwritev every byte of iov (2 entries) at offset 0; 0 or errno. */
static int pwritev_all(int fd, struct iovec *iov, int cnt) {
    off_t off = 0;
    while (cnt > 0) {
        ssize_t n = pwritev(fd, iov, cnt, off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO;
        off += n;
        consume(&iov, &cnt, (size_t)n);
    }
    return 0;
}

/* preadv into iov until full or end of file; bytes read, or -errno. */
static ssize_t preadv_all(int fd, struct iovec *iov, int cnt, int direct) {
    off_t off = 0;
    while (cnt > 0) {
        ssize_t n = preadv(fd, iov, cnt, off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) break;
        off += n;
        if (direct && off % DIRECT_ALIGN) break; /* a short, unaligned read: the end of a truncated file */
        consume(&iov, &cnt, (size_t)n);
    }
    return off;
}

/* Write tmp, rename to final (same directory); tmp removed on failure. 0 or errno. */
static int publish(int dfd, const char *tmp, const char *final, uint8_t *payload, uint64_t block_bytes,
                   uint8_t *trailer, int direct, int do_fsync) {
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0) return errno;
    struct iovec iov[2] = {{payload, block_bytes}, {trailer, TRAILER_BYTES}};
    int err = pwritev_all(fd, iov, 2);
    if (!err && do_fsync && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && renameat(dfd, tmp, dfd, final) != 0) err = errno;
    if (err) {
        unlinkat(dfd, tmp, 0);
        return err;
    }
    if (do_fsync && fsync(dfd) != 0) return errno;
    return 0;
}

/*
 * Store n blocks. keys: n * 64 bytes (zero padded), key_lens: n bytes; block i's payload is
 * base + block_ids[i] * block_bytes (0 <= block_ids[i] < num_blocks). temp_prefix: the part of a
 * temporary name after the final name and before the counter (".tmp.<host>.<pid>.<nonce>.").
 * results[i]: 0 or errno (TKVB_BAD_SLOT for an id out of range).
 * Returns 0, the errno with which O_DIRECT was refused (the call went on buffered; the caller stops
 * asking for it), or -ENOMEM when no trailer buffer could be allocated (nothing was attempted).
 */
int tkvb_store(int ns_fd, int32_t *shard_fds, const char *temp_prefix, const uint8_t *digest, const uint8_t *keys,
               const uint8_t *key_lens, int n, uint8_t *base, const int64_t *block_ids, int64_t num_blocks,
               uint64_t block_bytes, int flags, int32_t *results) {
    uint8_t *trailer = NULL;
    if (posix_memalign((void **)&trailer, DIRECT_ALIGN, TRAILER_BYTES) != 0) return -ENOMEM;
    memset(trailer, 0, TRAILER_BYTES);
    int direct = (flags & TKVB_DIRECT) != 0, lost = 0;
    size_t prefix_len = strlen(temp_prefix);
    for (int i = 0; i < n; i++) {
        const uint8_t *key = keys + (size_t)i * MAX_KEY_BYTES;
        unsigned key_len = key_lens[i];
        if (block_ids[i] < 0 || block_ids[i] >= num_blocks) {
            results[i] = TKVB_BAD_SLOT;
            continue;
        }
        uint8_t *payload = base + (uint64_t)block_ids[i] * block_bytes;
        int dfd = shard_fd(ns_fd, shard_fds, (unsigned)(XXH3_64bits(key, key_len) & 0xFF), 1);
        if (dfd < 0) {
            results[i] = -dfd;
            continue;
        }
        encode_header(trailer, digest, key, key_len, block_bytes, XXH3_HASH(payload, block_bytes));
        char final[NAME_MAX_BYTES], tmp[NAME_MAX_BYTES];
        size_t len = hex_name(final, key, key_len);
        memcpy(tmp, final, len);
        memcpy(tmp + len, temp_prefix, prefix_len);
        uint64_t count = __atomic_fetch_add(&temp_counter, 1, __ATOMIC_RELAXED);
        int written = snprintf(tmp + len + prefix_len, NAME_MAX_BYTES - len - prefix_len, "%llx",
                               (unsigned long long)count);
        if (written < 0 || (size_t)written >= NAME_MAX_BYTES - len - prefix_len) {
            results[i] = ENAMETOOLONG;
            continue;
        }
        int err = publish(dfd, tmp, final, payload, block_bytes, trailer, direct, flags & TKVB_FSYNC);
        if (err && direct && direct_unsupported(err)) {
            direct = 0; /* refused at run time: this block and the rest buffered, the caller stops asking */
            lost = err;
            err = publish(dfd, tmp, final, payload, block_bytes, trailer, 0, flags & TKVB_FSYNC);
        }
        results[i] = err;
    }
    free(trailer);
    return lost;
}

static int read_one(int dfd, const char *name, uint8_t *payload, uint64_t block_bytes, uint8_t *trailer, int direct) {
    int fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) return errno == ENXIO ? TKVB_NOT_REGULAR : errno; /* ENXIO: a socket, or a device without driver */
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = errno;
    } else if (!S_ISREG(st.st_mode)) {
        rc = TKVB_NOT_REGULAR;
    } else if ((uint64_t)st.st_size != block_bytes + TRAILER_BYTES) {
        rc = TKVB_TRUNCATED;
    } else {
        struct iovec iov[2] = {{payload, block_bytes}, {trailer, TRAILER_BYTES}};
        ssize_t got = preadv_all(fd, iov, 2, direct);
        if (got < 0)
            rc = (int)-got;
        else if (got != st.st_size)
            rc = TKVB_TRUNCATED; /* shrank under us: torn */
    }
    close(fd);
    return rc;
}

/*
 * Load n blocks into their primary slots (same arguments as tkvb_store) and verify each.
 * results[i]: 0, an errno (ENOENT: no such file), TKVB_TRUNCATED / TKVB_CHECKSUM / TKVB_FOREIGN,
 * TKVB_NOT_REGULAR or TKVB_BAD_SLOT; every block is attempted, also after a failure. Returns as tkvb_store.
 */
int tkvb_load(int ns_fd, int32_t *shard_fds, const uint8_t *digest, const uint8_t *keys, const uint8_t *key_lens,
              int n, uint8_t *base, const int64_t *block_ids, int64_t num_blocks, uint64_t block_bytes, int flags,
              int32_t *results) {
    uint8_t *trailer = NULL;
    if (posix_memalign((void **)&trailer, DIRECT_ALIGN, TRAILER_BYTES) != 0) return -ENOMEM;
    int direct = (flags & TKVB_DIRECT) != 0, lost = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *key = keys + (size_t)i * MAX_KEY_BYTES;
        unsigned key_len = key_lens[i];
        int rc;
        if (block_ids[i] < 0 || block_ids[i] >= num_blocks) {
            rc = TKVB_BAD_SLOT;
        } else {
            uint8_t *payload = base + (uint64_t)block_ids[i] * block_bytes;
            int dfd = shard_fd(ns_fd, shard_fds, (unsigned)(XXH3_64bits(key, key_len) & 0xFF), 0);
            if (dfd < 0) {
                rc = -dfd;
            } else {
                char name[NAME_MAX_BYTES];
                hex_name(name, key, key_len);
                rc = read_one(dfd, name, payload, block_bytes, trailer, direct);
                if (rc > 0 && direct && direct_unsupported(rc)) {
                    struct stat st;
                    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
                        rc = TKVB_NOT_REGULAR; /* the file's type refused O_DIRECT, not the filesystem */
                    } else {
                        direct = 0;
                        lost = rc;
                        rc = read_one(dfd, name, payload, block_bytes, trailer, 0);
                    }
                }
                if (rc == 0) rc = verify(trailer, payload, block_bytes, digest, key, key_len);
            }
        }
        results[i] = rc;
    }
    free(trailer);
    return lost;
}
