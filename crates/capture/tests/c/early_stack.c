// From its first instruction of `main` on, the main thread lowers its stack pointer 64 KiB below
// where it was (onto pages the process has never touched) and spins there without writing, over
// and over: the kernel cannot copy the stack for any of its samples, from the very first.
//
// Usage: early_stack ROUNDS   (each round spins about a millisecond)
#include <stdlib.h>

void hold(void);
__asm__(".text\n"
        ".globl hold\n"
        ".type hold, @function\n"
        "hold:\n"
        ".cfi_startproc\n"
        "  sub $0x10000, %rsp\n"
        ".cfi_adjust_cfa_offset 0x10000\n"
        "  mov $1000000, %ecx\n"
        "1:\n"
        "  dec %ecx\n"
        "  jnz 1b\n"
        "  add $0x10000, %rsp\n"
        ".cfi_adjust_cfa_offset -0x10000\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size hold, .-hold\n");

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 300;
	for (int i = 0; i < rounds; i++)
		hold();
	return 0;
}
