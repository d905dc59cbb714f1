/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio_describe_system: what this build and this machine offer, for `ckptio doctor` and logs. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "ckptio_config.h"
#include "common/common.h"
#include "io/engine.h"

#if CKPTIO_HAVE_IO_URING
#include <liburing.h>
#endif

/* An snprintf-style appender: `need` counts every byte asked for, even past the buffer, so the
 * caller learns the size to retry with. */
typedef struct out {
    char *buf;
    size_t len;
    size_t need;
} out;

__attribute__((format(printf, 2, 3))) static void put(out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = o->need < o->len ? o->buf + o->need : NULL;
    size_t room = o->need < o->len ? o->len - o->need : 0;
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->need += (size_t)n;
}

static const char *errno_name(int e)
{
    return ckptio_errname(-e);
}

static void human_bytes(char *b, size_t n, uint64_t v)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)v;
    unsigned u = 0;
    while (x >= 1024.0 && u + 1 < sizeof unit / sizeof unit[0])
        x /= 1024.0, u++;
    if (u == 0)
        snprintf(b, n, "%llu B", (unsigned long long)v);
    else
        snprintf(b, n, "%.1f %s", x, unit[u]);
}

/* statfs f_type values from linux/magic.h and the file systems' own headers (some, like
 * Lustre and GPFS, are not in the kernel tree), so the report reads "xfs", not a number. */
static const char *fs_name(unsigned long magic)
{
    static const struct {
        unsigned long magic;
        const char *name;
    } names[] = {
        {0xEF53, "ext4/ext3/ext2"}, {0x58465342, "xfs"},      {0x9123683E, "btrfs"},
        {0x01021994, "tmpfs"},      {0x858458F6, "ramfs"},    {0x6969, "nfs"},
        {0x794C7630, "overlay"},    {0x65735546, "fuse"},     {0x2FC12FC1, "zfs"},
        {0xF2F52010, "f2fs"},       {0xFF534D42, "cifs"},     {0xFE534D42, "smb2"},
        {0x0BD00BD0, "lustre"},     {0x47504653, "gpfs"},     {0x01021997, "9p"},
        {0x00C36400, "ceph"},       {0x5346414F, "afs"},      {0x73717368, "squashfs"},
        {0x4D44, "vfat"},           {0x2011BAB0, "exfat"},    {0x5346544E, "ntfs"},
        {0x62656572, "sysfs"},      {0x9FA0, "proc"},         {0x19830326, "beegfs"},
        {0xA501FCF5, "vxfs"},       {0xCA451A4E, "bcachefs"}, {0x6E667364, "nfsd"},
        {0x7461636F, "ocfs2"},      {0x01161970, "gfs2"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].magic == magic) return names[i].name;
    return NULL;
}

static void describe_io_uring(out *o)
{
#if CKPTIO_HAVE_IO_URING
    if (ckptio__io_uring_available()) {
        put(o, "io_uring: available\n");
        return;
    }
    /* The engine's probe only says no; probe again here to say why. */
    struct io_uring ring;
    int rc = io_uring_queue_init(16, &ring, 0);
    if (rc == 0) {
        io_uring_queue_exit(&ring);
        put(o, "io_uring: unavailable (the engine's probe failed, a second probe worked: "
               "resource limits may be tight)\n");
    } else {
        put(o, "io_uring: unavailable (io_uring_setup: %s, %s)\n", errno_name(-rc),
            ckptio_strerror(rc));
    }
    FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "r");
    int disabled = 0;
    if (f) {
        if (fscanf(f, "%d", &disabled) != 1) disabled = 0;
        fclose(f);
    }
    if (disabled)
        put(o, "  kernel.io_uring_disabled = %d: the administrator turned io_uring off%s\n",
            disabled, disabled == 1 ? " for processes outside the io_uring_group" : "");
    else if (rc == -EPERM)
        put(o, "  a seccomp filter (containers often install one) blocks io_uring_setup\n");
    else if (rc == -ENOMEM)
        put(o, "  raise the locked-memory limit (ulimit -l) for io_uring's rings\n");
    else if (rc == -ENOSYS)
        put(o, "  this kernel was built without io_uring (or is older than 5.1)\n");
#else
    put(o, "io_uring: not built (liburing was not found when ckptio was compiled)\n");
#endif
}

/* The mount that holds `path`: the longest mount point in mountinfo that prefixes it. */
static void describe_mount(out *o, const char *path, dev_t *dev_out, char *type, size_t tlen)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return;
    char line[4096], best_line[4096] = "";
    size_t best = 0;
    while (fgets(line, sizeof line, f)) {
        char mnt[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1) continue;
        size_t n = strlen(mnt);
        bool prefix = !strncmp(path, mnt, n) && (path[n] == '/' || path[n] == 0 || n == 1);
        if (prefix && n >= best) {
            best = n;
            memcpy(best_line, line, sizeof line);
        }
    }
    fclose(f);
    if (!best) return;
    unsigned maj = 0, min = 0;
    char mnt[PATH_MAX], opts[1024], fstype[256] = "?", source[PATH_MAX] = "?";
    if (sscanf(best_line, "%*s %*s %u:%u %*s %4095s %1023s", &maj, &min, mnt, opts) != 4) return;
    const char *dash = strstr(best_line, " - ");
    if (dash && sscanf(dash + 3, "%255s %4095s", fstype, source) < 1) fstype[0] = 0;
    put(o, "  mount: %s on %s type %s (%s)\n", source, mnt, fstype, opts);
    snprintf(type, tlen, "%s", fstype);
    *dev_out = makedev(maj, min);
}

static bool read_sys(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok) {
        size_t n2 = strcspn(buf, "\n");
        while (n2 > 0 && buf[n2 - 1] == ' ')
            n2--;
        buf[n2] = 0;
    }
    return ok;
}

/* Queue limits of the block device under the mount (a partition's live in its parent). */
static void describe_block(out *o, dev_t dev)
{
    char base[128], p[256], rot[32], lbs[32], maxkb[32], sched[128] = "";
    snprintf(base, sizeof base, "/sys/dev/block/%u:%u", major(dev), minor(dev));
    snprintf(p, sizeof p, "%s/queue/rotational", base);
    if (!read_sys(p, rot, sizeof rot)) {
        snprintf(base, sizeof base, "/sys/dev/block/%u:%u/..", major(dev), minor(dev));
        snprintf(p, sizeof p, "%s/queue/rotational", base);
        if (!read_sys(p, rot, sizeof rot)) return;
    }
    snprintf(p, sizeof p, "%s/queue/logical_block_size", base);
    if (!read_sys(p, lbs, sizeof lbs)) strcpy(lbs, "?");
    snprintf(p, sizeof p, "%s/queue/max_sectors_kb", base);
    if (!read_sys(p, maxkb, sizeof maxkb)) strcpy(maxkb, "?");
    snprintf(p, sizeof p, "%s/queue/scheduler", base);
    read_sys(p, sched, sizeof sched);
    put(o, "  block device %u:%u: %s, logical block %s B, largest request %s KiB%s%s\n", major(dev),
        minor(dev), rot[0] == '1' ? "rotational" : "non-rotational", lbs, maxkb,
        sched[0] ? ", scheduler " : "", sched);
}

/* Create a scratch file in `dir` the way the writer does, write one aligned block through it,
 * and report whether O_DIRECT held and which alignment the file system asks for. */
static void describe_direct(out *o, const char *dir)
{
    int dfd = open(dir, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (dfd < 0) {
        put(o, "  O_DIRECT: unknown (cannot open %s: %s)\n", dir, strerror(errno));
        return;
    }
    char name[64];
    snprintf(name, sizeof name, ".ckptio-doctor-%ld", (long)getpid());
    int fd = -1, direct = 0;
    int rc = ckptio__file_open(dfd, name, CKPTIO__F_WRITE, CKPTIO_AUTO, &fd, &direct);
    if (rc < 0) {
        put(o,
            "  O_DIRECT: unknown (cannot create a test file %s/%s: %s; check that the "
            "directory is writable)\n",
            dir, name, ckptio_strerror(rc));
        close(dfd);
        return;
    }
    uint32_t mem_align = 0, off_align = 0;
    ckptio__file_dio_align(fd, &mem_align, &off_align);
    size_t blk = CKPTIO__MAX((size_t)4096, CKPTIO__MAX(mem_align, off_align));
    unsigned char *buf = ckptio__map(blk);
    ssize_t n = -1;
    int werr = ENOMEM;
    if (buf) {
        for (size_t i = 0; i < blk; i++)
            buf[i] = (unsigned char)(i * 131u + 7u);
        n = pwrite(fd, buf, blk, 0);
        werr = n < 0 ? errno : 0;
        if (n == (ssize_t)blk && fdatasync(fd) < 0) werr = errno, n = -1;
    }
    if (direct && n == (ssize_t)blk) {
        put(o, "  O_DIRECT: works (an aligned %zu-byte O_DIRECT write succeeded)\n", blk);
    } else if (direct) {
        put(o,
            "  O_DIRECT: the file system accepted O_DIRECT but an aligned %zu-byte write "
            "failed (%s); force buffered I/O with CKPTIO_IO=buffered\n",
            blk, n < 0 ? errno_name(werr) : "short write");
    } else {
        /* AUTO dropped O_DIRECT silently; ask for it outright to learn the refusal's errno. */
        char name2[80];
        snprintf(name2, sizeof name2, "%s.on", name);
        int fd2 = -1, d2 = 0;
        int rc2 = ckptio__file_open(dfd, name2, CKPTIO__F_WRITE, CKPTIO_ON, &fd2, &d2);
        if (rc2 >= 0) {
            close(fd2);
            unlinkat(dfd, name2, 0);
        }
        put(o,
            "  O_DIRECT: refused by this file system (%s); ckptio uses buffered I/O plus "
            "fsync here\n",
            rc2 < 0 ? ckptio_errname(rc2) : "dropped");
        if (n != (ssize_t)blk) put(o, "  buffered test write failed too: %s\n", strerror(werr));
    }
    put(o, "  direct-I/O alignment: memory %u B, file offset %u B\n", mem_align, off_align);
    if (buf) ckptio__unmap(buf, blk);
    close(fd);
    unlinkat(dfd, name, 0);
    close(dfd);
}

static void describe_dir(out *o, const char *dir)
{
    char abs[PATH_MAX];
    const char *shown = realpath(dir, abs) ? abs : dir;
    put(o, "directory: %s\n", shown);
    struct stat st;
    if (stat(dir, &st) < 0) {
        put(o, "  cannot inspect it: %s\n", strerror(errno));
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        put(o, "  not a directory\n");
        return;
    }
    /* Render the mount line into a scratch buffer first: its type (ext4 rather than the
     * ext2/3/4 magic they share) names the file system, which is printed before it. */
    char mount_line[1024] = "", mtype[64] = "";
    out mo = {mount_line, sizeof mount_line, 0};
    dev_t dev = 0;
    describe_mount(&mo, shown, &dev, mtype, sizeof mtype);
    struct statfs sfs;
    if (statfs(dir, &sfs) == 0) {
        const char *fs = fs_name((unsigned long)sfs.f_type);
        if (mtype[0] && fs && !strstr(fs, mtype))
            put(o, "  file system: %s (statfs: %s)\n", mtype, fs);
        else if (mtype[0] || fs)
            put(o, "  file system: %s\n", mtype[0] ? mtype : fs);
        else
            put(o, "  file system: unknown (statfs magic 0x%lx)\n", (unsigned long)sfs.f_type);
    }
    put(o, "%s", mount_line);
    if (dev && major(dev) != 0) describe_block(o, dev);
    describe_direct(o, dir);
    struct statvfs sv;
    if (statvfs(dir, &sv) == 0) {
        char fb[32], tb[32];
        human_bytes(fb, sizeof fb, (uint64_t)sv.f_bavail * sv.f_frsize);
        human_bytes(tb, sizeof tb, (uint64_t)sv.f_blocks * sv.f_frsize);
        put(o, "  free space: %s of %s\n", fb, tb);
    }
}

int ckptio_describe_system(const char *dir, char *buf, size_t len)
{
    out o = {buf, buf ? len : 0, 0};
    put(&o, "ckptio %s (format version %u, %s build)\n", ckptio_version_string(),
        ckptio_format_version(), CKPTIO_BUILD_TYPE);
    struct utsname u;
    if (uname(&u) == 0) put(&o, "kernel: %s %s %s\n", u.sysname, u.release, u.machine);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    char mem[32] = "?";
    if (pages > 0 && psz > 0) human_bytes(mem, sizeof mem, (uint64_t)pages * (uint64_t)psz);
    put(&o, "cpus: %ld, memory: %s\n", cpus, mem);

    put(&o, "backends built: %spsync, buffered\n", CKPTIO_HAVE_IO_URING ? "io_uring, " : "");
    describe_io_uring(&o);
    const char *env = getenv("CKPTIO_IO");
    int be = ckptio__backend_from_env(CKPTIO_BACKEND_AUTO);
    const char *be_name = be == CKPTIO_BACKEND_IO_URING   ? "io_uring"
                          : be == CKPTIO_BACKEND_PSYNC    ? "psync"
                          : be == CKPTIO_BACKEND_BUFFERED ? "buffered"
                                                          : NULL;
    if (be == CKPTIO_BACKEND_AUTO || !be_name)
        be_name = (CKPTIO_HAVE_IO_URING && ckptio__io_uring_available()) ? "io_uring" : "psync";
    if (env && *env) {
        if (be < 0)
            put(&o,
                "CKPTIO_IO=%s: not a backend (use io_uring, psync or buffered); opening a "
                "writer or reader will fail\n",
                env);
        else if (be == CKPTIO_BACKEND_AUTO)
            put(&o, "CKPTIO_IO=%s: AUTO picks %s\n", env, be_name);
        else if (be == CKPTIO_BACKEND_IO_URING &&
                 !(CKPTIO_HAVE_IO_URING && ckptio__io_uring_available()))
            /* The engine does not fall back when io_uring is asked for by name. */
            put(&o,
                "CKPTIO_IO=%s: asks for io_uring, which is unavailable here: every save and "
                "every read will fail (CKPTIO_E_UNSUPPORTED, no fallback); unset CKPTIO_IO or "
                "set it to psync\n",
                env);
        else
            put(&o, "CKPTIO_IO=%s: forces the %s backend\n", env, be_name);
    } else {
        put(&o, "CKPTIO_IO: not set; AUTO picks %s\n", be_name);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            put(&o, "locked-memory limit: unlimited\n");
        else
            put(&o, "locked-memory limit: %llu KiB\n", (unsigned long long)rl.rlim_cur / 1024);
    }

    describe_dir(&o, dir && *dir ? dir : ".");

    /* GPU buffers: which path would run (CKPTIO_GPU, driver, cuFile, this file system). */
    char gwhy[768];
    int gp = ckptio_gpu_probe(dir && *dir ? dir : ".", NULL, gwhy, sizeof gwhy);
    const char *genv = getenv("CKPTIO_GPU");
    put(&o, "gpu: %s (CKPTIO_GPU=%s): %s\n",
        gp == CKPTIO_GPU_GDS      ? "GPUDirect Storage (cuFile)"
        : gp == CKPTIO_GPU_STAGED ? "staged through pinned memory"
                                  : "GPU buffers refused",
        genv && *genv ? genv : "auto", gwhy);

    if (buf && len) buf[o.need < len ? o.need : len - 1] = 0;
    return o.need > INT_MAX ? INT_MAX : (int)o.need;
}
