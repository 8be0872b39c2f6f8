/*
 * rootline's allocation sampler for launched commands, loaded with LD_PRELOAD.
 *
 * It interposes the C allocation functions and counts the bytes each thread asks for. The
 * sampling is by bytes, a Poisson process as in tcmalloc and Go: each thread draws the distance
 * to its next sample point from an exponential distribution whose mean is the sampling rate
 * (ROOTLINE_ALLOC_RATE bytes, 512 KiB by default), and an allocation that crosses it is sampled.
 * A sampled allocation of `size` bytes stands for size / (1 - exp(-size / rate)) bytes, the
 * unbiased estimate. Only sampled calls reach rootline_alloc_sampled(), on which rootline places a
 * uprobe: the unsampled ones cost a subtraction, never a trap.
 *
 * Anonymous mappings the program makes with mmap (mmap64 is the same function) count toward the
 * same bytes when at least ROOTLINE_ALLOC_MMAP_MIN bytes long (64 KiB by default): a program's
 * own arenas and pools, which malloc never sees. File mappings, reservations of address space
 * (PROT_NONE: a runtime's heap reserved before it is used) and failed calls do not count, and
 * neither do the mappings malloc makes for large blocks: glibc calls its internal __mmap for those,
 * never this interposer, so such a block counts once, as the malloc it is.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))

/* The entry point of a sampled allocation, as rootline names it (rdx of the marker call). */
enum kind {
    KIND_MALLOC = 1,
    KIND_CALLOC = 2,
    KIND_REALLOC = 3,
    KIND_POSIX_MEMALIGN = 4,
    KIND_ALIGNED_ALLOC = 5,
    KIND_MEMALIGN = 6,
    KIND_VALLOC = 7,
    KIND_PVALLOC = 8,
    KIND_MMAP = 9,
};

#define DEFAULT_RATE 524288.0
/* Below glibc's default mmap threshold (128 KiB), so a program that maps its own arenas of that
 * order is seen; smaller anonymous mappings (guard pages, a few pages of runtime metadata) are
 * left out. */
#define DEFAULT_MMAP_MIN 65536
/* mmap_min before it is read from the environment. */
#define MMAP_MIN_UNREAD ((size_t)-1)

/* glibc's own entry points: used while dlsym itself allocates, before the next ones are known. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);
static void *(*next_valloc)(size_t);
static void *(*next_pvalloc)(size_t);
static void *(*next_mmap)(void *, size_t, int, int, int, off_t);
static volatile int resolved;
static TLS int resolving;

/* Mean bytes between samples; 0 until read from the environment. */
static double rate;
/* The smallest anonymous mapping counted, in bytes. */
static size_t mmap_min = MMAP_MIN_UNREAD;

/* Bytes this thread may still allocate before its next sample point. */
static TLS int64_t until_sample;
/* Whether until_sample was drawn (the first allocation of a thread draws it). */
static TLS int drawn;
static TLS uint64_t rng;

/*
 * The uprobe target: rootline reads size, weight and kind from the registers at its entry
 * (rdi, rsi, edx). It begins with a 5-byte NOP, the instruction on which the kernel (6.17 on, x86-64)
 * replaces the uprobe's breakpoint trap by a call into its uprobe trampoline after the first hit,
 * which makes each sampled call several times cheaper; older kernels trap as usual.
 */
EXPORT void rootline_alloc_sampled(size_t size, size_t weight_bytes, int kind);
__asm__(".text\n"
        ".globl rootline_alloc_sampled\n"
        ".type rootline_alloc_sampled, @function\n"
        ".p2align 4\n"
        "rootline_alloc_sampled:\n"
        ".cfi_startproc\n"
        ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n" /* nopl 0x0(%rax,%rax,1) */
        "ret\n"
        ".cfi_endproc\n"
        ".size rootline_alloc_sampled, .-rootline_alloc_sampled\n");

static void resolve(void)
{
    resolving = 1;
    next_malloc = dlsym(RTLD_NEXT, "malloc");
    next_calloc = dlsym(RTLD_NEXT, "calloc");
    next_realloc = dlsym(RTLD_NEXT, "realloc");
    next_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    next_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    next_memalign = dlsym(RTLD_NEXT, "memalign");
    next_valloc = dlsym(RTLD_NEXT, "valloc");
    next_pvalloc = dlsym(RTLD_NEXT, "pvalloc");
    next_mmap = dlsym(RTLD_NEXT, "mmap");
    resolving = 0;
    resolved = next_malloc && next_calloc && next_realloc && next_posix_memalign &&
               next_aligned_alloc && next_memalign && next_valloc && next_pvalloc && next_mmap;
}

/* Whether the next functions are known (false only while dlsym runs on this thread). */
static inline int ready(void)
{
    if (__builtin_expect(resolved, 1))
        return 1;
    if (resolving)
        return 0;
    resolve();
    return resolved;
}

static double read_rate(void)
{
    const char *text = getenv("ROOTLINE_ALLOC_RATE");
    double r = text ? strtod(text, NULL) : 0.0;
    return r >= 1.0 ? r : DEFAULT_RATE;
}

/* ROOTLINE_ALLOC_MMAP_MIN: a whole number of bytes, or the default when absent or not one. */
static size_t read_mmap_min(void)
{
    const char *text = getenv("ROOTLINE_ALLOC_MMAP_MIN");
    if (!text || *text < '0' || *text > '9')
        return DEFAULT_MMAP_MIN;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v >= MMAP_MIN_UNREAD)
        return DEFAULT_MMAP_MIN;
    return (size_t)v;
}

/* A uniform draw in (0, 1] from this thread's xorshift64* generator. */
static double uniform(void)
{
    if (rng == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rng = ((uint64_t)syscall(SYS_gettid) << 32) ^ (uint64_t)ts.tv_nsec ^
              ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)&rng;
        if (rng == 0)
            rng = 0x9e3779b97f4a7c15ull;
    }
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t x = rng * 0x2545f4914f6cdd1dull;
    return ((double)(x >> 11) + 1.0) / 9007199254740992.0;
}

/* Bytes to the next sample point: exponential with mean `rate`. */
static int64_t draw(void)
{
    double d = -log(uniform()) * rate;
    return d < 1.0 ? 1 : (d > 9e18 ? INT64_MAX : (int64_t)d);
}

static __attribute__((noinline, cold)) void slow(size_t size, int kind)
{
    if (rate == 0.0)
        rate = read_rate();
    if (!drawn) {
        drawn = 1;
        until_sample = draw();
        if (until_sample > (int64_t)size) {
            until_sample -= (int64_t)size;
            return;
        }
    }
    until_sample = draw();
    double s = (double)size;
    double weight = s / -expm1(-s / rate);
    rootline_alloc_sampled(size, (size_t)(weight + 0.5), kind);
}

/* Counts `size` bytes against this thread's sample point; samples the call that crosses it. */
static inline void account(size_t size, int kind)
{
    if (size == 0)
        return;
    int64_t left = until_sample - (int64_t)size;
    if (__builtin_expect(left > 0 && size < (size_t)INT64_MAX, 1)) {
        until_sample = left;
        return;
    }
    slow(size, kind);
}

EXPORT void *malloc(size_t size)
{
    if (!ready())
        return __libc_malloc(size);
    account(size, KIND_MALLOC);
    return next_malloc(size);
}

EXPORT void *calloc(size_t n, size_t size)
{
    if (!ready())
        return __libc_calloc(n, size);
    size_t total;
    if (!__builtin_mul_overflow(n, size, &total))
        account(total, KIND_CALLOC);
    return next_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t size)
{
    if (!ready())
        return __libc_realloc(p, size);
    account(size, KIND_REALLOC);
    return next_realloc(p, size);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
    if (!ready()) {
        void *p = __libc_memalign(align, size);
        if (!p)
            return ENOMEM;
        *out = p;
        return 0;
    }
    account(size, KIND_POSIX_MEMALIGN);
    return next_posix_memalign(out, align, size);
}

EXPORT void *aligned_alloc(size_t align, size_t size)
{
    if (!ready())
        return __libc_memalign(align, size);
    account(size, KIND_ALIGNED_ALLOC);
    return next_aligned_alloc(align, size);
}

EXPORT void *memalign(size_t align, size_t size)
{
    if (!ready())
        return __libc_memalign(align, size);
    account(size, KIND_MEMALIGN);
    return next_memalign(align, size);
}

EXPORT void *valloc(size_t size)
{
    if (!ready())
        return __libc_valloc(size);
    account(size, KIND_VALLOC);
    return next_valloc(size);
}

EXPORT void *pvalloc(size_t size)
{
    if (!ready())
        return __libc_pvalloc(size);
    account(size, KIND_PVALLOC);
    return next_pvalloc(size);
}

/* mmap and mmap64: maps, then counts a successful anonymous mapping of mmap_min bytes or more
 * that can be accessed. */
static inline void *map(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    if (!ready())
        return (void *)syscall(SYS_mmap, addr, length, prot, flags, fd, offset);
    void *p = next_mmap(addr, length, prot, flags, fd, offset);
    if (!(flags & MAP_ANONYMOUS) || prot == PROT_NONE || p == MAP_FAILED)
        return p;
    size_t min = mmap_min;
    if (__builtin_expect(min == MMAP_MIN_UNREAD, 0))
        min = mmap_min = read_mmap_min();
    if (length >= min)
        account(length, KIND_MMAP);
    return p;
}

EXPORT void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    return map(addr, length, prot, flags, fd, offset);
}

/* The same function under its large-file name (an alias of mmap in glibc's x86-64 libc). */
EXPORT void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    return map(addr, length, prot, flags, fd, offset);
}
