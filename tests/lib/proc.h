/* tests/lib/proc.h — a child process whose standard output and error the
 * test reads: start it, wait for a line, collect its exit status; and a
 * free port on loopback for it to listen on. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct Proc {
        pid_t pid;
        int err; /* read end of the child's stderr and stdout */
        char out[65536];
        size_t len;
} Proc;

/* setup, when not NULL, runs in the child before exec. */
void proc_start(Proc *p, char *const argv[], void (*setup)(void));
/* Read output until it contains what (or EOF, or timeout). */
bool proc_wait_for(Proc *p, const char *what, int timeout_ms);
/* Read to the end and reap: the exit status, or 128 + the signal. */
int proc_exit(Proc *p);
/* A loopback port that was free a moment ago (bound to port 0, let go). */
unsigned short test_free_port(void);
