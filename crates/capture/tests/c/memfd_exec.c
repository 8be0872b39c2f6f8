/* Runs a program from an anonymous memory file, as container runtimes (runc re-executes itself
 * from one), sandboxes and self-extracting tools do: copies the ELF file PROGRAM into a memfd and
 * executes it with fexecve, so its mappings name "/memfd:NAME (deleted)" and no path on disk.
 * Usage: memfd_exec PROGRAM [ARGS...] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: memfd_exec PROGRAM [ARGS...]\n");
        return 1;
    }
    int src = open(argv[1], O_RDONLY | O_CLOEXEC);
    int mem = memfd_create("program-in-memory", MFD_CLOEXEC);
    if (src < 0 || mem < 0) {
        perror("open");
        return 1;
    }
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(src, buf, sizeof buf)) > 0)
        if (write(mem, buf, (size_t)n) != n) {
            perror("write");
            return 1;
        }
    fexecve(mem, argv + 1, environ);
    perror("fexecve");
    return 1;
}
