// A thread whose leaf lowers its stack pointer onto a page the thread has never touched and
// spins there without writing to it: the kernel cannot copy the stack for those samples (it
// copies from the stack pointer and stops at the first page it cannot read without faulting),
// though the frames above, on pages in use, are all there.
//
// Usage: fresh_page SECONDS [rbx|deep]   (`rbx`: the leaf is `hold_rbx`; `deep`: `hold_in_place`
// under 40 frames of `deep`)
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

// Lowers the stack pointer by 6 KiB (below the caller's page: onto pages never touched), spins
// about a millisecond touching no memory, and returns. Its CFI describes each step.
void hold(void);
__asm__(".text\n"
        ".globl hold\n"
        ".type hold, @function\n"
        "hold:\n"
        ".cfi_startproc\n"
        "  sub $0x1800, %rsp\n"
        ".cfi_adjust_cfa_offset 0x1800\n"
        "  mov $1000000, %ecx\n"
        "1:\n"
        "  dec %ecx\n"
        "  jnz 1b\n"
        "  add $0x1800, %rsp\n"
        ".cfi_adjust_cfa_offset -0x1800\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size hold, .-hold\n");

// A leaf whose frame is found through rbx (`CFA = rbx + 16`): a rule the in-kernel walk does not
// evaluate, so the walk stops at the leaf and user space unwinds it from the stack words. It
// lowers the stack pointer by `LOWER` bytes (onto untouched pages when nonzero) and spins about a
// millisecond touching no memory.
#define HOLD_THROUGH_RBX(NAME, LOWER)                                                              \
	void NAME(void);                                                                           \
	__asm__(".text\n"                                                                          \
		".globl " #NAME "\n"                                                                \
		".type " #NAME ", @function\n" #NAME ":\n"                                          \
		".cfi_startproc\n"                                                                 \
		"  push %rbx\n"                                                                    \
		".cfi_adjust_cfa_offset 8\n"                                                       \
		".cfi_rel_offset %rbx, 0\n"                                                        \
		"  mov %rsp, %rbx\n"                                                               \
		".cfi_def_cfa_register %rbx\n"                                                     \
		"  sub $" #LOWER ", %rsp\n"                                                        \
		"  mov $1000000, %ecx\n"                                                           \
		"1:\n"                                                                             \
		"  dec %ecx\n"                                                                     \
		"  jnz 1b\n"                                                                       \
		"  mov %rbx, %rsp\n"                                                               \
		".cfi_def_cfa_register %rsp\n"                                                     \
		"  pop %rbx\n"                                                                     \
		".cfi_adjust_cfa_offset -8\n"                                                      \
		".cfi_restore %rbx\n"                                                              \
		"  ret\n"                                                                          \
		".cfi_endproc\n"                                                                   \
		".size " #NAME ", .-" #NAME "\n");

// Onto a fresh page, as `hold`.
HOLD_THROUGH_RBX(hold_rbx, 0x1800)
// In place (the copy is whole), called under `deep`: the walk still cannot take its first step,
// and the stack reaches past the copy.
HOLD_THROUGH_RBX(hold_in_place, 0)

static volatile int stop;
static int through_rbx;
static int in_place;

// 40 frames of 1 KiB above `hold_in_place`: past the 16 KiB a sample copies.
__attribute__((noinline)) static int deep(int n)
{
	volatile char pad[1024];
	pad[0] = (char)n;
	pad[1023] = 1;
	if (n == 0)
		hold_in_place();
	else
		deep(n - 1);
	return pad[0] + pad[1023];
}

__attribute__((noinline)) static void cycle(void)
{
	while (!stop) {
		if (in_place)
			deep(40);
		else if (through_rbx)
			hold_rbx();
		else
			hold();
		__asm__ volatile("" ::: "memory");
	}
}

static void *second(void *arg)
{
	(void)arg;
	cycle();
	return 0;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 5;
	through_rbx = argc > 2;
	in_place = argc > 2 && argv[2][0] == 'd';
	// The thread's own stack, without huge pages: only the pages it touches are present.
	size_t size = 1 << 20;
	void *stack = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1,
			   0);
	if (stack == MAP_FAILED)
		return 1;
	madvise(stack, size, MADV_NOHUGEPAGE);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstack(&attr, stack, size);
	pthread_t t;
	if (pthread_create(&t, &attr, second, 0) != 0)
		return 1;
	sleep(seconds);
	stop = 1;
	pthread_join(t, 0);
	return 0;
}
