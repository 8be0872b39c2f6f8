// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// rootline's in-kernel user-stack walk. Attached to the sampling perf events, it walks the
// sampled thread's user stack while the thread is still stopped, with per-binary rules user
// space compiled from `.eh_frame`/`.debug_frame` (crates/unwind/src/kernel_rows.rs), and sends
// every stack word it read past the sample's stack copy to user space, with its address. User
// space unwinds the sample with its own exact analysis and reads those words instead of live
// memory: the frames they give were read at the sample's instant and need no liveness proof.
//
// `bpf_loop` runs one frame per iteration, up to `config.max_frames` (user space sets it so the
// sampling interrupt stays short), and words go out in chunks. Why a walk ended travels in its
// last chunk. A walk that reaches `max_frames` in a sample that interrupted user code goes on in
// the thread's own context, as task work the kernel runs before the thread returns to user
// space (`bpf_task_work_schedule_resume`): its user stack is still as it was at the sample, and
// the walk has no bound there but the stack's end. A sample taken while such a walk is still to
// run (or running) has the same user stack, and says so instead of walking (`STOP_SAME`).
// A sample whose stack copy reaches its thread's outermost frame, where user space last found
// it (`thread_tops`), is not walked at all: user space unwinds it from the copy (`STOP_IN_COPY`).
//
// Build (the object is committed; `crates/capture/tests/bpf_object.rs` checks it matches; every
// object in this directory is built the same way):
//   clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -fdebug-compilation-dir=. \
//     -I/usr/include/x86_64-linux-gnu -c stack_walk.bpf.c -o stack_walk.bpf.o &&
//   llvm-strip -g stack_walk.bpf.o

#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// The few kernel fields read, relocated by CO-RE against the running kernel's BTF.
// (The `___kernel` suffix keeps it apart from the user-space header's `struct pt_regs`; CO-RE
// matches it to the kernel's `struct pt_regs`.)
struct pt_regs___kernel {
	unsigned long bp;
	unsigned long sp;
	unsigned long ip;
} __attribute__((preserve_access_index));

// The stack's memory region, for where a dump ends.
struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
} __attribute__((preserve_access_index));

#define MAX_MAPPINGS 512
// Steps of the binary search among a process's mappings: log2(MAX_MAPPINGS) + 1.
#define MAPPING_SEARCH_STEPS 10
#define CHUNK_WORDS 256

// The kernel's task-work slot in a map value (the verifier knows it by this name).
struct bpf_task_work {
	__u64 __opaque;
};
struct bpf_map;
// The sampled thread's process, for whether its parent's stacks are walked.
// Its exec counts tell whether it still runs the image it was forked with.
struct task_struct {
	struct task_struct *real_parent;
	int tgid;
	__u64 self_exec_id;
	__u64 parent_exec_id;
} __attribute__((preserve_access_index));
// `bpf_task_work_schedule_resume_impl`, a kfunc. Declared as a helper with an id no helper has,
// clang emits `call 0x7ffff001`; user space rewrites that instruction before loading into a call
// of the running kernel's kfunc (found by name in its BTF). On a kernel without it the program
// that calls it (`continue_walk_at_limit`) is not loaded, and walks end at `max_frames`.
static long (*schedule_task_work)(struct task_struct *task, struct bpf_task_work *tw,
				  void *map, int (*callback)(struct bpf_map *, void *, void *),
				  void *aux) = (void *)0x7ffff001;

// How a row finds its frame's CFA (canonical frame address); the return address is at CFA-8.
enum row_kind {
	ROW_NONE = 0, // no rule: frame pointers are followed
	ROW_RSP = 1, // CFA = rsp + cfa
	ROW_RBP = 2, // CFA = rbp + cfa
	ROW_PLT = 3, // CFA = rsp + 8, + 8 more when (ip & 15) >= arg (a lazy-binding PLT entry)
	ROW_ROOT = 4, // the return address is undefined: the thread's outermost frame
	ROW_STOP = 5, // a rule the walk does not evaluate (other registers, signal frames)
	ROW_FP = 6, // frame-pointer frame: CFA = rbp + 16, rbp saved at CFA-16
	ROW_PENDING = 7, // (mappings only) rows being prepared: the walk ends and sends the stack
};

// One row, for addresses from `pc` (relative to its mapping's `base`) to the next row.
struct row {
	__u32 pc;
	__s32 cfa;
	__s16 rbp; // where rbp is saved, relative to the CFA; 0 = rbp unchanged
	__u8 kind;
	__u8 arg;
	__u32 pad; // array elements are 8-byte aligned anyway
};

// An executable mapping of a tracked process.
struct mapping {
	__u64 start;
	__u64 end;
	__u64 bias; // runtime address minus link-time address
	__u64 base; // link-time address rows are relative to
	__u32 row_start; // first row in `rows`
	__u32 row_count;
	__u32 kind; // ROW_NONE (no table), ROW_FP (frame pointers throughout), ROW_RSP (table) or
		    // ROW_PENDING (its binary is still being read)
	__u32 flags; // MAPPING_CODE_MOVES
	// The rows' page index, in the `rows` slots right after the rows, four entries a slot:
	// entry p is the first row at or past address p << page_shift (relative to `base`), so a
	// search looks only among the rows of its address's page. 0 entries: no index.
	__u32 page_count;
	__u32 page_shift;
};

// A mapping whose code may change after the sample (JIT code: the runtime moves and replaces
// it): the 8 code bytes before each return address into it are sent, read at the sample's
// instant, since by the time user space checks that the address follows a call they may be
// another function's.
#define MAPPING_CODE_MOVES 1
// Marks a sent word as those code bytes (at the address without the mark), not a stack word.
#define CODE_WORD (1ULL << 63)

struct proc {
	__u32 count;
	__u32 generation; // differs at every write of any entry; 0 only with the memo off: `row_memos`
	struct mapping m[MAX_MAPPINGS];
};

struct config {
	__u32 copy_bytes; // the user stack bytes each sample copies
	__u32 max_frames; // frames walked per sample at most (the interrupt's time is bounded)
	__u32 dump_bytes; // stack bytes sent from a frame in a ROW_PENDING mapping (0: none)
	__u32 dump_rate; // KiB a second each CPU may dump, after a burst of two seconds' worth
};

// Each CPU's allowance for dumps (a token bucket).
struct dump_budget {
	__u64 tokens;
	__u64 last_ns;
};

// Why a walk ended.
enum stop {
	STOP_ROOT = 1,
	STOP_UNMAPPED = 2,
	STOP_NO_RULE = 3,
	STOP_UNSUPPORTED = 4,
	STOP_READ = 5,
	STOP_NOT_OUTWARD = 6,
	STOP_LIMIT = 7,
	STOP_LOST = 8,
	STOP_PENDING = 9,
	STOP_CONTINUES = 10, // (not last) the walk goes on before the thread returns to user space
	STOP_SAME = 11, // the thread's walk in task context is still to finish: the same stack
	STOP_IN_COPY = 12, // not walked: the copy reaches the thread's outermost frame
};

struct chunk_header {
	__u64 time;
	__u32 pid;
	__u32 tid;
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 seq; // chunk number within the walk, from 0
	__u16 words; // (address, value) pairs in this chunk
	__u8 last; // the walk's last chunk
	__u8 stop; // with `last`: enum stop
	__u32 frames; // with `last`: frames walked
	__u32 span; // 1: `words` are values of consecutive stack words from `end_sp` (a dump)
	__u64 end_ip; // with `last`: the address the walk stopped at
	__u64 end_sp; // with `last`: the stack pointer there
};

struct chunk {
	struct chunk_header h;
	__u64 words[CHUNK_WORDS * 2];
};

struct stats {
	__u64 walks;
	__u64 frames;
	__u64 chunks;
	__u64 lost_chunks;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct row);
	__uint(max_entries, 1); // set at load time
	__uint(map_flags, BPF_F_MMAPABLE); // user space writes rows in place
} rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct proc);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct config);
	__uint(max_entries, 1);
} config SEC(".maps");

// Each thread's outermost stack address its whole stacks reached (the stack pointer of its
// root frame), as user space last unwound it; user space removes threads that exit.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); // thread id
	__type(value, __u64);
	__uint(max_entries, 4096);
} thread_tops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct chunk);
	__uint(max_entries, 1);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct stats);
	__uint(max_entries, 1);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct dump_budget);
	__uint(max_entries, 1);
} dump_budgets SEC(".maps");

// Each CPU's rows last found by searching the table, by lookup address: a direct-mapped memo.
// A search reads a few rows' cache lines in a table of tens of megabytes, in the sampled
// thread's time, for every frame; the same call sites recur sample after sample. An entry holds
// for one process entry as written (`struct proc`'s `generation`): new mappings, or rows placed or
// let go, come with a new `generation`, and a pid used again never has an old one. Only interrupt
// walks use it (a task-context walk may be interrupted by a sample on its CPU mid-write).
#define ROW_MEMO 512
struct row_memo_entry {
	__u64 lookup;
	__u32 pid;
	__u32 generation;
	struct row row;
};

struct row_memo {
	struct row_memo_entry e[ROW_MEMO];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct row_memo);
	__uint(max_entries, 1);
} row_memos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24); // set at load time
} chunks SEC(".maps");

struct walk {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u64 copy_end;
	__u32 pid;
	__u32 tid;
	__u32 generation; // the process entry's `generation` when the walk began
	__u32 in_task; // running as task work: chunks are built in the thread's `task_walk`
	__u32 frames;
	__u32 words;
	__u32 seq;
	__u8 stop;
	__u8 leaf;
	__u8 dump_in_vma; // 1: `dump_end` is the end of the stack's region (pages it cannot read
			  // below it are holes, passed over)
	__u64 dump_at; // the next stack address a dump sends
	__u64 dump_end;
	// The mapping and row of the last lookup (recursion repeats them).
	__u8 have_mapping;
	__u8 have_row;
	struct mapping map;
	__u64 row_from; // runtime address range the cached row covers
	__u64 row_to;
	struct row row;
};

// A thread's walk going on in its own context: the walk's state, and its chunk (a task's walk
// builds its chunks here, not in the per-CPU scratch that interrupts on this CPU use).
struct task_walk {
	struct bpf_task_work work;
	__u32 busy; // 1 from the sample that scheduled the work until the work's last chunk
	__u32 pad;
	struct walk w;
	struct chunk c;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); // thread id
	__type(value, struct task_walk);
	__uint(max_entries, 1024); // set at load time; user space removes threads that exit
} task_walks SEC(".maps");

// A walk at its frame limit, handed to `continue_walk_at_limit` by tail call (one per CPU: the
// same interrupt).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct walk);
	__uint(max_entries, 1);
} handoff SEC(".maps");

// The program a walk at its frame limit goes on in: set by user space where the kernel has BPF
// task work, empty elsewhere (the tail call falls through and the walk ends at the limit). A
// program of its own, so that a kernel without the kfunc never verifies a call of it.
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} continuation SEC(".maps");

// A zeroed `task_walk` to create a thread's entry from (too large for the BPF stack), as bytes:
// a per-CPU map may not hold the kernel's task-work slot.
struct task_walk_bytes {
	__u8 b[sizeof(struct task_walk)];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct task_walk_bytes);
	__uint(max_entries, 1);
} task_walk_zero SEC(".maps");

static const __u32 zero = 0;

// Writes `size` bytes of the scratch chunk to the ring; counts a chunk the full ring lost.
// The reader drains the ring every round (10 ms) anyway; it is woken early only once the ring
// is an eighth full, not for every chunk (a wake-up a sample cost it a context switch each),
// or for an `urgent` chunk: a walk that ended where user space has to act soon (a mapping it
// has not sent yet, a binary it is still reading), so that the process's next samples are
// walked, and those that read live memory meanwhile are proven, as early as can be.
static __always_inline int send(struct chunk *c, __u64 size, int urgent)
{
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (urgent || (bpf_ringbuf_query(&chunks, BPF_RB_AVAIL_DATA) + size) * 8 >
			      bpf_ringbuf_query(&chunks, BPF_RB_RING_SIZE))
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&chunks, c, size, flags) != 0) {
		struct stats *s = bpf_map_lookup_elem(&counters, &zero);
		if (s)
			s->lost_chunks++;
		return -1;
	}
	return 0;
}

// Sends the scratch chunk; `last` marks the walk's end.
static __always_inline int flush(struct walk *w, struct chunk *c, __u8 last)
{
	c->h.seq = w->seq++;
	c->h.words = w->words;
	c->h.last = last;
	c->h.stop = w->stop;
	c->h.frames = w->frames;
	c->h.end_ip = w->ip;
	c->h.end_sp = w->sp;
	c->h.span = 0;
	__u64 size = sizeof(struct chunk_header) + (__u64)w->words * 16;
	if (size > sizeof(struct chunk))
		size = sizeof(struct chunk);
	w->words = 0;
	return send(c, size, last && (w->stop == STOP_UNMAPPED || w->stop == STOP_PENDING));
}

// The chunk `w` builds: this CPU's scratch in an interrupt, the thread's own in task work.
static __always_inline struct chunk *chunk_of(struct walk *w)
{
	if (w->in_task) {
		struct task_walk *t = bpf_map_lookup_elem(&task_walks, &w->tid);
		if (!t)
			return 0;
		// Keeps clang from moving the offset above the null check (the verifier refuses
		// arithmetic on a pointer that may be null).
		asm volatile("" : "+r"(t));
		return &t->c;
	}
	return bpf_map_lookup_elem(&scratch, &zero);
}

// Records one stack word read past the copy. (Global functions are verified once each, not at
// every call: without them the verifier's path count explodes.)
__attribute__((noinline)) int emit(struct walk *w, __u64 addr, __u64 value)
{
	if (!w)
		return -1;
	if (addr < w->copy_end)
		return 0;
	struct chunk *c = chunk_of(w);
	if (!c)
		return -1;
	__u32 n = w->words;
	if (n >= CHUNK_WORDS) {
		if (flush(w, c, 0) != 0)
			return -1;
		n = 0;
	}
	c->words[(n & (CHUNK_WORDS - 1)) * 2] = addr;
	c->words[(n & (CHUNK_WORDS - 1)) * 2 + 1] = value;
	w->words = n + 1;
	return 0;
}

// A binary search's state: the first index whose key is above `key`, in [lo, hi).
struct search {
	__u64 key;
	__u32 lo;
	__u32 hi;
	__u32 row_start;
};

// The same among a process's mappings, which are looked up once for the whole search.
struct mapping_search {
	__u64 key;
	__u32 lo;
	__u32 hi;
	struct proc *p;
};

// One step of the search for the last mapping starting at or below `key`.
static long mapping_step(__u32 i, void *ctx)
{
	struct mapping_search *s = ctx;
	if (s->lo >= s->hi)
		return 1;
	struct proc *p = s->p;
	if (!p)
		return 1;
	__u32 mid = (s->lo + s->hi) / 2;
	if (s->key < p->m[mid & (MAX_MAPPINGS - 1)].start)
		s->hi = mid;
	else
		s->lo = mid + 1;
	return 0;
}

// One step of the search for the last row at or below `key` (relative to the table's base).
static long row_step(__u32 i, void *ctx)
{
	struct search *s = ctx;
	if (s->lo >= s->hi)
		return 1;
	__u32 mid = (s->lo + s->hi) / 2;
	__u32 idx = s->row_start + mid;
	struct row *r = bpf_map_lookup_elem(&rows, &idx);
	if (!r)
		return 1;
	if ((__u64)r->pc <= s->key)
		s->lo = mid + 1;
	else
		s->hi = mid;
	return 0;
}

// Most words of a frame-pointer frame's body sent besides its return address and saved rbp.
#define BODY_WORDS 256

// Sends the words of a frame-pointer frame's body, `from` to `to` (at most BODY_WORDS, the
// highest ones): code without CFI is unwound in user space from its instructions, which may read
// any slot of its frame (a .NET On-Stack-Replacement frame's return-address slot, for one).
__attribute__((noinline)) int emit_body(struct walk *w, __u64 from, __u64 to)
{
	if (!w)
		return -1;
	if (from < w->copy_end)
		from = w->copy_end;
	if (to > from + BODY_WORDS * 8)
		from = to - BODY_WORDS * 8;
	for (int k = 0; k < BODY_WORDS; k++) {
		__u64 addr = from + (__u64)k * 8;
		if (addr + 8 > to)
			break;
		__u64 v = 0;
		if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
			return 0;
		if (emit(w, addr, v) != 0)
			return -1;
	}
	return 0;
}

// Finds the mapping holding `addr` in the walk's process; false when none.
__attribute__((noinline)) int find_mapping(struct walk *w, __u64 addr)
{
	if (!w)
		return 0;
	if (w->have_mapping && addr >= w->map.start && addr < w->map.end)
		return 1;
	struct proc *p = bpf_map_lookup_elem(&procs, &w->pid);
	if (!p)
		return 0;
	// The last mapping starting at or below `addr` (the process's mappings are looked up
	// once, not at each step).
	struct mapping_search ms = { .key = addr, .lo = 0, .hi = p->count, .p = p };
	if (ms.hi > MAX_MAPPINGS)
		ms.hi = MAX_MAPPINGS;
	bpf_loop(MAPPING_SEARCH_STEPS, mapping_step, &ms, 0);
	__u32 lo = ms.lo;
	if (lo == 0 || lo > MAX_MAPPINGS)
		return 0;
	struct mapping *m = &p->m[(lo - 1) & (MAX_MAPPINGS - 1)];
	if (addr < m->start || addr >= m->end)
		return 0;
	w->map = *m;
	w->have_mapping = 1;
	w->have_row = 0;
	return 1;
}

// Entry `e` of mapping `m`'s page index (see `struct mapping`) into `out`; false when unread.
static __always_inline int page_entry(struct mapping *m, __u64 e, __u32 *out)
{
	__u32 idx = m->row_start + m->row_count + (__u32)(e >> 2);
	struct row *r = bpf_map_lookup_elem(&rows, &idx);
	if (!r)
		return 0;
	__u32 *entries = (__u32 *)r;
	*out = entries[e & 3];
	return 1;
}

// Narrows the search for `rel` to the rows of its page: the rows before the page's first are at
// or below `rel`, the rows from the next page's first on are above it.
static __always_inline void narrow_to_page(struct mapping *m, __u64 rel, struct search *s)
{
	if (m->page_count == 0)
		return;
	__u64 page = rel >> (m->page_shift & 63);
	if (page >= m->page_count) {
		// Past the last row's page: the last row is the one.
		s->lo = m->row_count;
		return;
	}
	__u32 lo = 0, hi = m->row_count;
	if (!page_entry(m, page, &lo))
		return;
	if (page + 1 < m->page_count && !page_entry(m, page + 1, &hi))
		return;
	if (lo <= hi && hi <= m->row_count) {
		s->lo = lo;
		s->hi = hi;
	}
}

// Finds the row for `lookup` in the cached mapping; false when its table has none.
__attribute__((noinline)) int find_row(struct walk *w, __u64 lookup)
{
	if (!w)
		return 0;
	if (w->have_row && lookup >= w->row_from && lookup < w->row_to)
		return 1;
	struct mapping *m = &w->map;
	if (m->kind == ROW_FP) {
		w->row.kind = ROW_FP;
		w->row.cfa = 16;
		w->row.rbp = -16;
		w->row_from = m->start;
		w->row_to = m->end;
		w->have_row = 1;
		return 1;
	}
	if (m->kind != ROW_RSP || m->row_count == 0)
		goto frame_pointers;
	__u64 rel = lookup - m->bias - m->base;
	if (rel > 0xffffffffULL)
		return 0;
	// The last row whose pc <= rel, searched among the rows of rel's page.
	struct search s = { .key = rel, .lo = 0, .hi = m->row_count, .row_start = m->row_start };
	narrow_to_page(m, rel, &s);
	bpf_loop(33, row_step, &s, 0);
	__u32 lo = s.lo;
	if (lo == 0)
		goto frame_pointers;
	__u32 idx = m->row_start + lo - 1;
	struct row *r = bpf_map_lookup_elem(&rows, &idx);
	if (!r)
		return 0;
	if (r->kind == ROW_NONE)
		goto frame_pointers;
	w->row = *r;
	w->row_from = m->bias + m->base + r->pc;
	w->row_to = m->end;
	if (lo < m->row_count) {
		__u32 next_idx = idx + 1;
		struct row *next = bpf_map_lookup_elem(&rows, &next_idx);
		if (next)
			w->row_to = m->bias + m->base + next->pc;
	}
	w->have_row = 1;
	return 1;
frame_pointers:
	// Code without rules (no CFI, or its binary's rows not placed yet): follow the frame
	// pointers. The words this reads are what memory held; user space uses only those its own
	// analysis asks for, so a wrong guess here costs nothing but the reads.
	w->row.kind = ROW_FP;
	w->row.cfa = 16;
	w->row.rbp = -16;
	w->row_from = lookup;
	w->row_to = lookup + 1;
	w->have_row = 1;
	return 1;
}

// `lookup`'s slot in a row memo.
static __always_inline __u32 memo_slot(__u64 lookup)
{
	return (__u32)(lookup ^ (lookup >> 9) ^ (lookup >> 18)) & (ROW_MEMO - 1);
}

// The row for `lookup` from this CPU's memo, made the walk's row; false when not there.
static __always_inline int memo_row(struct walk *w, struct row_memo *rm, __u64 lookup)
{
	if (!rm)
		return 0;
	struct row_memo_entry *e = &rm->e[memo_slot(lookup)];
	if (e->lookup != lookup || e->pid != w->pid || e->generation != w->generation)
		return 0;
	w->row = e->row;
	w->row_from = lookup;
	w->row_to = lookup + 1;
	w->have_row = 1;
	return 1;
}

// Keeps the walk's row for `lookup` in this CPU's memo when it came from a binary's table
// (not a frame-pointer guess, not code that moves).
static __always_inline void memo_keep(struct walk *w, struct row_memo *rm, __u64 lookup)
{
	if (!rm || w->map.kind != ROW_RSP || w->map.flags != 0 || w->row.kind == ROW_FP)
		return;
	struct row_memo_entry *e = &rm->e[memo_slot(lookup)];
	e->lookup = lookup;
	e->pid = w->pid;
	e->generation = w->generation;
	e->row = w->row;
}

// One frame: from (ip, sp, bp) to the caller's; nonzero when the walk ends.
__attribute__((noinline)) int step_frame(struct walk *w)
{
	if (!w)
		return 1;
	__u64 lookup = w->leaf ? w->ip : w->ip - 1;
	struct row_memo *rm = 0;
	if (!w->in_task && w->generation != 0)
		rm = bpf_map_lookup_elem(&row_memos, &zero);
	if (memo_row(w, rm, lookup))
		goto have_row;
	if (!find_mapping(w, lookup)) {
		w->stop = STOP_UNMAPPED;
		return 1;
	}
	if (w->map.kind == ROW_PENDING) {
		w->stop = STOP_PENDING;
		return 1;
	}
	if (!w->leaf && (w->map.flags & MAPPING_CODE_MOVES)) {
		__u64 code = 0;
		if (bpf_probe_read_user(&code, sizeof(code), (void *)(w->ip - 8)) == 0 &&
		    emit(w, (w->ip - 8) | CODE_WORD, code) != 0) {
			w->stop = STOP_LOST;
			return 1;
		}
	}
	if (!find_row(w, lookup)) {
		w->stop = STOP_NO_RULE;
		return 1;
	}
	memo_keep(w, rm, lookup);
have_row:;
	__u64 cfa;
	switch (w->row.kind) {
	case ROW_RSP:
		cfa = w->sp + (__s64)w->row.cfa;
		break;
	case ROW_RBP:
	case ROW_FP:
		cfa = w->bp + (__s64)w->row.cfa;
		break;
	case ROW_PLT:
		cfa = w->sp + 8 + (((w->ip & 15) >= w->row.arg) ? 8 : 0);
		break;
	case ROW_ROOT:
		w->stop = STOP_ROOT;
		return 1;
	case ROW_STOP:
		w->stop = STOP_UNSUPPORTED;
		return 1;
	default:
		w->stop = STOP_NO_RULE;
		return 1;
	}
	if (cfa <= w->sp) {
		w->stop = STOP_NOT_OUTWARD;
		return 1;
	}
	__u64 ra = 0;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)) != 0) {
		w->stop = STOP_READ;
		return 1;
	}
	// The frame's words go out in address order (body, saved rbp, return address), so that a
	// walk's words arrive sorted.
	if (w->row.kind == ROW_FP && cfa >= 16 && emit_body(w, w->sp, cfa - 16) != 0) {
		w->stop = STOP_LOST;
		return 1;
	}
	if (w->row.rbp != 0) {
		__u64 slot = cfa + (__s64)w->row.rbp;
		__u64 bp = 0;
		if (bpf_probe_read_user(&bp, sizeof(bp), (void *)slot) != 0) {
			w->stop = STOP_READ;
			return 1;
		}
		if (emit(w, slot, bp) != 0) {
			w->stop = STOP_LOST;
			return 1;
		}
		w->bp = bp;
	}
	if (emit(w, cfa - 8, ra) != 0) {
		w->stop = STOP_LOST;
		return 1;
	}
	w->frames++;
	w->sp = cfa;
	w->ip = ra;
	w->leaf = 0;
	if (ra == 0) {
		w->stop = STOP_ROOT;
		return 1;
	}
	return 0;
}

static long step(__u32 i, void *ctx)
{
	return step_frame(ctx) ? 1 : 0;
}

// Whether the ring has room for another page of a stack dump: dumps fill at most a quarter of
// it, so that walks keep theirs.
static __always_inline int ring_has_room_for_dump(void)
{
	return bpf_ringbuf_query(&chunks, BPF_RB_AVAIL_DATA) + 4096 + sizeof(struct chunk_header) <=
	       bpf_ringbuf_query(&chunks, BPF_RB_RING_SIZE) / 4;
}

// Sends the stack from `dump_at` up to the next page boundary (or `dump_end`) as one span
// chunk; nonzero when the dump ends (its end, an unreadable page: the top of the stack, or a
// full ring).
__attribute__((noinline)) int dump_page(struct walk *w)
{
	if (!w)
		return 1;
	__u64 at = w->dump_at;
	if (at >= w->dump_end)
		return 1;
	struct chunk *c = bpf_map_lookup_elem(&scratch, &zero);
	if (!c)
		return 1;
	__u64 next = (at | 4095) + 1;
	if (next > w->dump_end)
		next = w->dump_end;
	__u64 len = next - at;
	if (len == 0 || len > 4096)
		return 1;
	if (!ring_has_room_for_dump())
		return 1;
	if (bpf_probe_read_user(c->words, len, (void *)at) != 0) {
		// Below the end of the stack's region, a page the thread never touched (the unused
		// part of a large frame, or a leaf's frame on a fresh page): the frames above it
		// are still to come. Otherwise the stack's end.
		if (!w->dump_in_vma)
			return 1;
		w->dump_at = next;
		return 0;
	}
	c->h.seq = w->seq++;
	c->h.words = len / 8;
	c->h.last = 0;
	c->h.span = 1;
	c->h.end_sp = at;
	if (send(c, sizeof(struct chunk_header) + len, 0) != 0) {
		w->stop = STOP_LOST;
		return 1;
	}
	w->dump_at = next;
	return 0;
}

// `bpf_find_vma`'s callback: the end of the region holding the stack pointer.
static long stack_region_end(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	*(__u64 *)ctx = BPF_CORE_READ(vma, vm_end);
	return 0;
}

static long dump_step(__u32 i, void *ctx)
{
	return dump_page(ctx) ? 1 : 0;
}

// This CPU's dump allowance, refilled for the time since it was last looked at; None when
// the map is missing.
static __always_inline struct dump_budget *dump_budget(struct config *cfg)
{
	struct dump_budget *b = bpf_map_lookup_elem(&dump_budgets, &zero);
	if (!b)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 rate = (__u64)cfg->dump_rate * 1024; // bytes a second
	__u64 cap = rate * 2;
	if (b->last_ns == 0 || now < b->last_ns)
		b->tokens = cap;
	else
		b->tokens += (now - b->last_ns) / 1000 * rate / 1000000;
	if (b->tokens > cap)
		b->tokens = cap;
	b->last_ns = now;
	return b;
}

// The rest of a walk, as task work in the sampled thread before it returns to user space.
static int continue_walk(struct bpf_map *map, void *key, void *value)
{
	struct task_walk *t = value;
	struct walk w = t->w;
	__u32 before = w.frames;
	w.in_task = 1;
	bpf_loop(1 << 23, step, &w, 0);
	if (w.stop == 0)
		w.stop = STOP_LIMIT;
	struct stats *s = bpf_map_lookup_elem(&counters, &zero);
	if (s)
		s->frames += w.frames - before;
	t = bpf_map_lookup_elem(&task_walks, &w.tid);
	if (!t)
		return 0;
	if (s)
		s->chunks += 1;
	flush(&w, &t->c, 1);
	t->busy = 0;
	return 0;
}

// A walk that reached `max_frames`: sends what it has and goes on as task work, which runs
// before the thread next returns to user space (at once for a sample of user code; after the
// system call or fault for a sample in the kernel). False when it cannot (a ring half full, no
// room for the thread, a kernel without task work).
static __always_inline int continue_in_task(struct walk *w, struct chunk *c)
{
	// A deep walk sends hundreds of KiB: not while the ring is half full (the reader is behind;
	// the walk would be lost, and crowd out others).
	if (bpf_ringbuf_query(&chunks, BPF_RB_AVAIL_DATA) * 2 > bpf_ringbuf_query(&chunks, BPF_RB_RING_SIZE))
		return 0;
	struct task_walk *t = bpf_map_lookup_elem(&task_walks, &w->tid);
	if (!t) {
		struct task_walk_bytes *z = bpf_map_lookup_elem(&task_walk_zero, &zero);
		if (!z)
			return 0;
		bpf_map_update_elem(&task_walks, &w->tid, z, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&task_walks, &w->tid);
		if (!t)
			return 0;
	}
	// Only this thread's samples and its task work touch its entry, and a sample interrupting
	// the task work sees `busy` and stops at the start: no other writer can come between.
	if (t->busy)
		return 0;
	t->busy = 1;
	w->stop = STOP_CONTINUES;
	if (flush(w, c, 0) != 0) {
		t->busy = 0;
		return 1; // the ring is full: the walk is broken either way
	}
	w->stop = 0;
	t->w = *w;
	t->c.h = c->h;
	if (schedule_task_work(bpf_get_current_task_btf(), &t->work, &task_walks, continue_walk, 0) !=
	    0) {
		t->busy = 0;
		w->stop = STOP_LIMIT;
		flush(w, c, 1);
		return 1;
	}
	return 1;
}

// Where the sample's copy of the stack will end. The kernel copies from the stack pointer up to
// `copy_bytes`, but only up to the first page it cannot read without faulting: a page the thread
// has not touched yet (a frame that lowered the stack pointer onto a fresh page and has not
// written there), where the copy is empty. The walk sends every word it reads past that point,
// so the frames the copy should have held still arrive.
static __always_inline __u64 copy_end(__u64 sp, __u32 copy_bytes)
{
	__u64 end = sp + copy_bytes;
	__u64 page = sp;
	// The copy is at most 64 KiB (a sample's size is 16 bits): 17 pages at most.
	for (int k = 0; k < 17; k++) {
		if (page >= end)
			break;
		__u8 b;
		if (bpf_probe_read_user(&b, 1, (void *)page) != 0)
			return page;
		page = (page & ~4095ULL) + 4096;
	}
	return end;
}

// The process entry a process user space has not installed yet (forked or exec'd a moment ago,
// its records still on their way) is walked by, if any: its parent's, when the parent is walked
// and neither has exec'd since the fork. A fork copies its parent's mappings, so the parent's
// rows describe the child's code (a mapping either changed since then is met as in any walk
// whose entry is a moment old: user space unwinds by its own rules with the words read, and
// reads none it was not sent). `*parent_walked` says whether the parent is walked at all.
static __always_inline __u32 forked_from(int *parent_walked)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 parent = BPF_CORE_READ(task, real_parent, tgid);
	*parent_walked = bpf_map_lookup_elem(&procs, &parent) != 0;
	if (!*parent_walked)
		return 0;
	// `exec` counts up the task's `self_exec_id`; a fork sets the child's `parent_exec_id` to
	// its parent's count then (a thread's, to its process's).
	__u64 own = BPF_CORE_READ(task, self_exec_id);
	__u64 at_fork = BPF_CORE_READ(task, parent_exec_id);
	__u64 parents = BPF_CORE_READ(task, real_parent, self_exec_id);
	return own == at_fork && parents == at_fork ? parent : 0;
}

SEC("perf_event")
int walk_user_stack(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 walk_pid = pid;
	struct proc *proc = bpf_map_lookup_elem(&procs, &pid);
	if (!proc) {
		int parent_walked = 0;
		walk_pid = forked_from(&parent_walked);
		if (!parent_walked)
			return 1;
		proc = walk_pid ? bpf_map_lookup_elem(&procs, &walk_pid) : 0;
	}
	int known = proc != 0;
	__u32 generation = proc ? proc->generation : 0;
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	struct chunk *c = bpf_map_lookup_elem(&scratch, &zero);
	struct stats *s = bpf_map_lookup_elem(&counters, &zero);
	if (!cfg || !c || !s)
		return 1;
	struct pt_regs___kernel *regs = (struct pt_regs___kernel *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (!regs)
		return 1;
	struct walk w = {};
	w.ip = BPF_CORE_READ(regs, ip);
	w.sp = BPF_CORE_READ(regs, sp);
	w.bp = BPF_CORE_READ(regs, bp);
	w.copy_end = copy_end(w.sp, cfg->copy_bytes);
	w.pid = walk_pid; // whose entry the walk looks mappings up in
	w.tid = (__u32)id;
	w.generation = generation;
	w.leaf = 1;
	c->h.time = bpf_ktime_get_ns();
	c->h.pid = pid;
	c->h.tid = (__u32)id;
	c->h.ip = w.ip;
	c->h.sp = w.sp;
	c->h.bp = w.bp;
	struct task_walk *pending = bpf_map_lookup_elem(&task_walks, &w.tid);
	if (pending && pending->busy) {
		// The thread has not returned to user space since the sample whose walk goes on.
		w.stop = STOP_SAME;
		flush(&w, c, 1);
		return 1;
	}
	__u64 *top = bpf_map_lookup_elem(&thread_tops, &w.tid);
	if (top && w.sp < *top && *top <= w.copy_end) {
		// Every frame lies in the sample's copy: nothing to read here.
		w.stop = STOP_IN_COPY;
		flush(&w, c, 1);
		return 1;
	}
	long n = 0;
	if (known) {
		__u32 max_frames = cfg->max_frames;
		if (max_frames == 0 || max_frames > (1 << 23))
			max_frames = 1 << 23;
		n = bpf_loop(max_frames, step, &w, 0);
		s->walks++;
		s->frames += w.frames;
	} else {
		// Nothing to walk by yet (an exec'd image): the stack is sent as for a binary still
		// being read.
		w.stop = STOP_PENDING;
	}
	if (w.stop == 0) {
		struct walk *h = bpf_map_lookup_elem(&handoff, &zero);
		if (h) {
			*h = w;
			bpf_tail_call(ctx, &continuation, 0);
		}
		w.stop = STOP_LIMIT;
	}
	c = bpf_map_lookup_elem(&scratch, &zero);
	if (!c)
		return 1;
	__u32 dump = cfg->dump_bytes;
	struct dump_budget *budget = 0;
	// A walk that could not take its first step (a leaf the rows do not describe as user space
	// can: a thread inside `clone3`, a rule on other registers) read nothing past the copy:
	// its stack is sent the same way, for user space's own unwind.
	int stuck_at_leaf = w.frames == 0 && (w.stop == STOP_NOT_OUTWARD ||
					      w.stop == STOP_UNSUPPORTED || w.stop == STOP_NO_RULE);
	if ((w.stop == STOP_PENDING || stuck_at_leaf) && dump != 0 && dump <= (64 << 20))
		budget = dump_budget(cfg);
	if (budget && budget->tokens >= 4096 && ring_has_room_for_dump()) {
		// The frame's binary has no rows yet (it was mapped a moment ago), or the walk could
		// not start: send its stack as it is, for user space to unwind (once it has read the
		// binary). Only within this
		// CPU's allowance (a start-up's burst, not a steady stream: the reader has other
		// work) and, page by page, while the ring is mostly empty (the other walks keep
		// their room; most stacks are a few pages, far below `dump`).
		if (w.words != 0 && flush(&w, c, 0) != 0)
			return 1;
		if (dump > budget->tokens)
			dump = budget->tokens;
		w.dump_at = (w.sp > w.copy_end ? w.sp : w.copy_end) & ~7ULL;
		w.dump_end = w.dump_at + dump;
		// Bounded by the stack's region where the kernel can say (it may not, in an
		// interrupt that came while the address space was locked): then unreadable pages
		// inside it are passed over.
		__u64 region_end = 0;
		if (bpf_find_vma(bpf_get_current_task_btf(), w.sp, stack_region_end, &region_end,
				 0) == 0 &&
		    region_end > w.dump_at) {
			w.dump_in_vma = 1;
			if (region_end < w.dump_end)
				w.dump_end = region_end;
		}
		__u64 from = w.dump_at;
		bpf_loop(dump / 4096 + 2, dump_step, &w, 0);
		__u64 sent = w.dump_at - from;
		budget->tokens = budget->tokens > sent ? budget->tokens - sent : 0;
		c = bpf_map_lookup_elem(&scratch, &zero);
		if (!c)
			return 1;
	}
	__u64 nominal_end = w.sp + cfg->copy_bytes;
	if (w.copy_end < nominal_end && w.stop != STOP_ROOT && w.dump_at == 0) {
		// The kernel's copy stops short (at a page the thread never touched) and the walk
		// did not reach the root: what the copy would have held is sent, pages that cannot
		// be read passed over, for user space's own unwind of the first frames (a leaf whose
		// rule the walk does not evaluate, on a fresh page, had nothing to unwind by).
		if (w.words != 0 && flush(&w, c, 0) != 0)
			return 1;
		w.dump_at = w.copy_end;
		w.dump_end = nominal_end;
		w.dump_in_vma = 1;
		bpf_loop(18, dump_step, &w, 0);
		c = bpf_map_lookup_elem(&scratch, &zero);
		if (!c)
			return 1;
	}
	s->chunks += w.seq + 1;
	flush(&w, c, 1);
	(void)n;
	return 1;
}

// The walk `walk_user_stack` handed over at its frame limit: goes on as task work, or ends there.
SEC("perf_event")
int continue_walk_at_limit(struct bpf_perf_event_data *ctx)
{
	struct walk *h = bpf_map_lookup_elem(&handoff, &zero);
	struct chunk *c = bpf_map_lookup_elem(&scratch, &zero);
	struct stats *s = bpf_map_lookup_elem(&counters, &zero);
	if (!h || !c || !s)
		return 1;
	struct walk w = *h;
	if (continue_in_task(&w, c)) {
		s->chunks += w.seq;
		return 1;
	}
	w.stop = STOP_LIMIT;
	s->chunks += w.seq + 1;
	flush(&w, c, 1);
	return 1;
}
