/* host/idle.h — does the machine's owner need it? Training runs only while
 * they do not: it pauses within about a second of the machine becoming busy
 * and resumes once the machine has been idle for a while (a minute by
 * default).
 *
 * The signals are the CPU time of other processes (/proc/stat minus this
 * daemon's own), CPU pressure (/proc/pressure/cpu), AC power
 * (/sys/class/power_supply) and, where a seat exists, logind's IdleHint.
 * Sampling (idle_monitor_sample) is kept apart from deciding (idle_update), which
 * does no I/O and takes the time as an argument, so the decision is tested
 * without a real machine. The control thread owns the monitor; it is not
 * thread-safe.
 *
 *     IdleSettings s;
 *     IdleMonitor m;
 *     Diag d = {};
 *     idle_settings_default(&s);             // or from ravnestd.conf
 *     r = idle_monitor_init(&m, &s, NULL, &d);  // NULL: the real /proc and /sys
 *     if (r < 0)
 *             return log_error_errno(r, "%s", d.text);
 *     for (;;) {                             // control thread, every ~500 ms
 *             IdleSample smp;
 *             uint64_t t = now_ns();
 *             r = idle_monitor_sample(&m, idle_process_cpu_ns(), t, &smp);
 *             if (r >= 0 && idle_update(&m, &smp, t))
 *                     log_info("%s training: %s", m.paused ? "Pausing" : "Resuming", m.reason);
 *             ...
 *     }
 *     idle_monitor_done(&m);
 *
 *     // compute thread, after a step that kept it busy for busy_ns:
 *     uint64_t pause = idle_duty_sleep_ns(busy_ns, s.max_duty);
 *
 * Hysteresis: a sample is *busy* when other processes use more than
 * max_other_cpu cores, the machine runs on battery (unless run_on_battery) or
 * the seat's user is active; training pauses once samples have been busy for
 * busy_ms. It is *calm* when other processes use at most half of
 * max_other_cpu, CPU pressure is at most max_pressure and neither battery nor
 * user object; training resumes once samples have been calm for resume_ms
 * without a break. Between the two (say 0.3 cores) nothing changes, so a load
 * near the threshold does not make training flap.
 *
 * Why pressure only guards resuming: while training runs, its own threads
 * waiting for a CPU count as pressure too, and the kernel cannot tell whose
 * stall it was. While paused, the pressure is the other processes' own.
 */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/diag.h"

struct sd_bus;

/* Resuming needs other processes at or below this share of max_other_cpu. */
#define IDLE_RESUME_FRACTION 0.5
/* The longest a logind query may block the control thread. */
#define IDLE_LOGIND_TIMEOUT_USEC 250000ULL

typedef struct IdleSettings {
        bool enabled;          /* false: never pause (default true) */
        double max_other_cpu;  /* cores other processes may use, default 0.5 */
        double max_pressure;   /* CPU "some" stall fraction to resume at or below, default 0.2 */
        unsigned busy_ms;      /* busy this long before pausing, default 1000 */
        unsigned resume_ms;    /* calm this long before resuming, default 60000 */
        bool run_on_battery;   /* default false */
        bool use_logind;       /* ask logind's IdleHint where a seat exists, default true */
        double max_duty;       /* share of time the compute threads may work, 0 < d <= 1, default 1 */
} IdleSettings;

/* One sample, describing the interval since the previous one. */
typedef struct IdleSample {
        double other_cpu;  /* cores used by other processes; < 0: not known yet (first sample) */
        double pressure;   /* fraction of the interval some task waited for a CPU; < 0: no PSI */
        int on_battery;    /* 1: running on battery, 0: on AC or no battery */
        int logind_idle;   /* 1: the seat's user is idle, 0: active, -1: not asked or no seat */
} IdleSample;

typedef struct IdleMonitor {
        IdleSettings settings;  /* may be changed between updates (a reload) */

        /* The decision, read by the caller after idle_update(). */
        bool paused;
        char reason[128];       /* why, in words: "other processes use 1.0 CPU" */

        /* Decision state. Busy and calm time count from the start of the
         * interval the first busy (calm) sample describes. */
        bool have_last;
        uint64_t last_ns;
        bool busy_timing, calm_timing;
        uint64_t busy_since_ns, calm_since_ns;

        /* Sampling state: the counters of the previous sample. */
        char root[PATH_MAX];    /* prefix for /proc and /sys, "" for the real ones */
        long clk_tck;           /* /proc/stat's unit, USER_HZ */
        bool have_prev, have_prev_stall;
        uint64_t prev_busy_ticks, prev_stall_us, prev_own_ns, prev_ns;
        struct sd_bus *bus;     /* system bus for logind, opened on first use */
} IdleMonitor;

void idle_settings_default(IdleSettings *ret);
/* -EINVAL with the setting named in d when a value is out of range. */
int idle_settings_check(const IdleSettings *s, Diag *d);

/* Start paused (unless s->enabled is false): training begins only after the
 * machine has been calm for resume_ms. root is a directory standing in for
 * "/" when reading /proc and /sys (tests), NULL for the real system; with a
 * root, logind is not asked. Errors: -EINVAL (d says why), -ENAMETOOLONG. */
int idle_monitor_init(IdleMonitor *m, const IdleSettings *s, const char *root, Diag *d);
/* Close the bus connection. Safe to call twice. */
void idle_monitor_done(IdleMonitor *m);

/* CPU time of this whole process (all its threads), the own_cpu_ns that
 * idle_monitor_sample() subtracts from the machine's busy time. */
uint64_t idle_process_cpu_ns(void);

/* Read /proc/stat, /proc/pressure/cpu, the power supplies and (when
 * use_logind) logind, and describe the interval since the previous call.
 * own_cpu_ns is this process's CPU time (idle_process_cpu_ns()), now the
 * monotonic time in ns. The first call after init only sets the baseline
 * (other_cpu and pressure < 0). A missing PSI file, power_supply directory or
 * seat makes that signal unavailable, not an error. Returns -errno when
 * /proc/stat cannot be read or parsed (then the baseline is kept). */
int idle_monitor_sample(IdleMonitor *m, uint64_t own_cpu_ns, uint64_t now, IdleSample *ret);

/* logind's IdleHint: 1 idle, 0 the user is active; -ENXIO when there is no
 * seat, another -errno when logind cannot be asked. Blocks for at most
 * IDLE_LOGIND_TIMEOUT_USEC; keeps the bus connection in m. */
int idle_logind_read(IdleMonitor *m);

/* Feed one sample taken at now (monotonic ns). Sets m->paused and m->reason;
 * returns true when this call paused or resumed training. No I/O. */
bool idle_update(IdleMonitor *m, const IdleSample *s, uint64_t now);

/* How long the compute thread should sleep after working busy_ns so that its
 * share of time stays at max_duty: busy·(1−d)/d. 0 when d >= 1; d is taken
 * as at least 0.01. */
uint64_t idle_duty_sleep_ns(uint64_t busy_ns, double max_duty);
