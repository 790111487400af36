/* tests/lib/proc.h — a child process whose standard output and error the
 * test reads: start it, wait for a line, collect its exit status; and a
 * free port on loopback for it to listen on. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "net/identity.h"

typedef struct Proc {
        pid_t pid;
        int err; /* read end of the child's stderr and stdout */
        char out[65536];
        size_t len;
        char exe[256]; /* argv[0], for the backtrace of a crash */
} Proc;

/* setup, when not NULL, runs in the child before exec. */
void proc_start(Proc *p, char *const argv[], void (*setup)(void));
/* Read output until it contains what (or EOF, or timeout). */
bool proc_wait_for(Proc *p, const char *what, int timeout_ms);
/* Read output until what occurs want times in it (or timeout). */
bool proc_wait_for_count(Proc *p, const char *what, int want, int timeout_ms);
/* Read to the end and reap: the exit status, or 128 + the signal. Output
 * after 120 s (timeout_ms) is not read. A child that a signal ended has a
 * line saying which appended to out, and, where it dumped core (children
 * start with RLIMIT_CORE unlimited; core_pattern "core"), its threads'
 * backtraces from gdb on the test's stderr. */
int proc_exit(Proc *p);
int proc_exit_within(Proc *p, int timeout_ms);
/* A loopback port that was free a moment ago (bound to port 0, let go). */
unsigned short test_free_port(void);
/* The ravnestd at path, unconfigured (its configuration names a state
 * directory and a control socket only) in the new directory made from the
 * template dir ("/tmp/...-XXXXXX"); its socket's path in sock. Returns once
 * the node says it is unconfigured. */
void test_start_unconfigured(Proc *p, const char *path, char *dir, char sock[128]);
/* A TCP connection to 127.0.0.1:port (asserting), its descriptor. */
int test_connect_port(unsigned short port);
/* A process's peak resident memory (VmHWM), KiB; -1 if it is gone. */
long proc_peak_rss_kib(pid_t pid);
/* text into path (asserting), then chmod mode. */
void test_write_file(const char *path, const char *text, mode_t mode);
/* <dir>/state-<name>/identity created ahead, so configurations can name the
 * key, in hex. */
void test_make_identity(const char *dir, const char *name, char hex[IDENTITY_HEX_SIZE]);
/* rm -rf dir: a test's temporary directory. */
void test_remove_tree(const char *dir);
/* How many times what occurs in s. */
int test_count(const char *s, const char *what);
/* The number after the first "test accuracy " in out, or -1. */
double test_final_accuracy(const char *out);
