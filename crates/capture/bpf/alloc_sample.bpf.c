// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// rootline's allocation sampler for running processes (`record --alloc -p`), attached to the
// uprobe perf events on the target's libc allocation functions. It keeps each thread's Poisson
// countdown of bytes (the distance to its next sample point, drawn from an exponential
// distribution whose mean is the sampling rate) and returns nonzero only for the call that
// crosses it: the kernel then emits the sample (registers and user stack), and drops the others
// before any stack is copied. The weight of a sample needs only its size and the rate, so user
// space computes it from the sampled registers.
//
// The draws come from `draws`, a table of exponential quantiles (bytes) that user space fills
// for the rate. A hit runs every program attached to the events of its process, one per
// recorded thread and CPU: each acts only for the thread and CPU its attach cookie names
// (`cpu << 32 | tid`), the one whose event emits the sample.
//
// mmap counts only anonymous mappings of at least `mmap_min[0]` bytes, not PROT_NONE (address
// space reserved, not memory), that the program asked for itself: a call whose return address (at [rsp] on entry) lies in its process's libc code,
// `libc_text[tgid]`, is libc's own (malloc mapping a large block, which counts as that malloc).
// Reading it takes bpf_probe_read_user, which the kernel offers GPL-compatible programs only:
// this one is dual-licensed, as stack_walk.bpf.c is.
//
// Build (the object is committed; `crates/capture/tests/bpf_object.rs` checks it matches; every
// object in this directory is built the same way):
//   clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -fdebug-compilation-dir=. \
//     -I/usr/include/x86_64-linux-gnu -c alloc_sample.bpf.c -o alloc_sample.bpf.o &&
//   llvm-strip -g alloc_sample.bpf.o
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define DRAWS 1024
// MAP_ANONYMOUS (include/uapi/asm-generic/mman-common.h).
#define MAP_ANONYMOUS 0x20

// A map definition in the legacy `maps` section layout (no BTF needed).
struct map_def {
    unsigned int type;
    unsigned int key_size;
    unsigned int value_size;
    unsigned int max_entries;
    unsigned int map_flags;
};

struct map_def SEC("maps") draws = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(__u32),
    .value_size = sizeof(__u64),
    .max_entries = DRAWS,
};

struct map_def SEC("maps") countdowns = {
    .type = BPF_MAP_TYPE_LRU_HASH,
    .key_size = sizeof(__u32),
    .value_size = sizeof(__s64),
    .max_entries = 65536,
};

struct map_def SEC("maps") mmap_min = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(__u32),
    .value_size = sizeof(__u64),
    .max_entries = 1,
};

// The executable range of each probed process's libc: [start, end).
struct text_range {
    __u64 start;
    __u64 end;
};

struct map_def SEC("maps") libc_text = {
    .type = BPF_MAP_TYPE_HASH,
    .key_size = sizeof(__u32),
    .value_size = sizeof(struct text_range),
    .max_entries = 4096,
};

static __always_inline __s64 draw(void)
{
    __u32 i = bpf_get_prandom_u32() % DRAWS;
    __u64 *d = bpf_map_lookup_elem(&draws, &i);
    return d && *d > 0 ? (__s64)*d : 1;
}

// Whether this program is the one for the current thread and CPU (see the attach cookie).
static __always_inline int mine(struct pt_regs *ctx)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    return bpf_get_attach_cookie(ctx) == ((__u64)bpf_get_smp_processor_id() << 32 | tid);
}

static __always_inline int decide(struct pt_regs *ctx, __u64 size)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    if (!mine(ctx) || size == 0 || (__s64)size < 0)
        return 0;
    __s64 *left = bpf_map_lookup_elem(&countdowns, &tid);
    if (!left) {
        __s64 first = draw();
        int crosses = (__s64)size >= first;
        __s64 next = crosses ? draw() : first - (__s64)size;
        bpf_map_update_elem(&countdowns, &tid, &next, BPF_ANY);
        return crosses;
    }
    if ((__s64)size < *left) {
        *left -= (__s64)size;
        return 0;
    }
    *left = draw();
    return 1;
}

// malloc, valloc, pvalloc: the size is the first argument.
SEC("uprobe")
int size_arg1(struct pt_regs *ctx)
{
    return decide(ctx, PT_REGS_PARM1(ctx));
}

// realloc, aligned_alloc, memalign: the second.
SEC("uprobe")
int size_arg2(struct pt_regs *ctx)
{
    return decide(ctx, PT_REGS_PARM2(ctx));
}

// posix_memalign: the third.
SEC("uprobe")
int size_arg3(struct pt_regs *ctx)
{
    return decide(ctx, PT_REGS_PARM3(ctx));
}

// calloc: the product of the first two.
SEC("uprobe")
int size_product(struct pt_regs *ctx)
{
    __u64 n = PT_REGS_PARM1(ctx), size = PT_REGS_PARM2(ctx);
    // 4 Gi elements or 4 GiB each: no real calloc; the product stays in 64 bits below.
    if ((n >> 32) || (size >> 32))
        return 0;
    return decide(ctx, n * size);
}

// mmap: the length (second argument) of an anonymous mapping (flags, the fourth, in rcx) that
// can be accessed (prot, the third, not PROT_NONE) of at least mmap_min bytes, called from outside
// libc.
SEC("uprobe")
int mmap_anon(struct pt_regs *ctx)
{
    if (!mine(ctx) || !(PT_REGS_PARM4(ctx) & MAP_ANONYMOUS) || PT_REGS_PARM3(ctx) == 0)
        return 0;
    __u64 length = PT_REGS_PARM2(ctx);
    __u32 zero = 0;
    __u64 *min = bpf_map_lookup_elem(&mmap_min, &zero);
    if (!min || length < *min)
        return 0;
    __u32 tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
    struct text_range *libc = bpf_map_lookup_elem(&libc_text, &tgid);
    __u64 ret = 0;
    if (!libc || bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx)) != 0)
        return 0;
    if (ret >= libc->start && ret < libc->end)
        return 0;
    return decide(ctx, length);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
