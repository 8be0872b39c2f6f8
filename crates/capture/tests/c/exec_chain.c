// A command that execs while recorded: each image spins in `before_exec` for ARGV[1] ms, then
// execs itself with one exec fewer left (ARGV[2], 20 at first); the last image spins in
// `after_exec` as long. Samples taken in an image shortly before its exec are read together
// with the exec's records.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) static void spin(double ms) {
	volatile unsigned long x = 0;
	double end = now_ms() + ms;
	while (now_ms() < end)
		x++;
}

__attribute__((noinline)) void before_exec(double ms) {
	spin(ms);
	__asm__ volatile("");
}

__attribute__((noinline)) void after_exec(double ms) {
	spin(ms);
	__asm__ volatile("");
}

int main(int argc, char **argv) {
	const char *ms_arg = argc > 1 ? argv[1] : "20";
	double ms = atof(ms_arg);
	int left = argc > 2 ? atoi(argv[2]) : 20;
	if (left <= 0) {
		after_exec(ms);
		return 0;
	}
	before_exec(ms);
	char count[16];
	snprintf(count, sizeof count, "%d", left - 1);
	char *next[] = {argv[0], (char *)ms_arg, count, NULL};
	execv("/proc/self/exe", next);
	perror("execv");
	return 1;
}
