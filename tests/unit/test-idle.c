/* Idle detection: the decision with its hysteresis, the duty-cycle cap,
 * sampling from fake /proc and /sys trees with exact numbers, and one loose
 * sanity check against the real /proc; a rest under the cap serves the
 * links. */
#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "host/idle.h"
#include "run/averaging.h"
#include "run/control.h"
#include "service/daemon.h"
#include "util/time-util.h"

#define MS 1000000ULL

static IdleSample sample(double other_cpu) {
        return (IdleSample){ .other_cpu = other_cpu, .pressure = 0.0, .on_battery = 0, .logind_idle = -1 };
}

static void monitor(IdleMonitor *m, const IdleSettings *st) {
        IdleSettings def;
        Diag d = {};
        idle_settings_default(&def);
        cr_assert_eq(idle_monitor_init(m, st ?: &def, NULL, &d), 0, "%s", d.text);
}

/* Feed s every 500 ms from *t (inclusive) to *t + ms (exclusive); count the
 * state changes. *t ends at the next sample's time. */
static int feed(IdleMonitor *m, IdleSample s, uint64_t *t, uint64_t ms) {
        int changes = 0;
        for (uint64_t end = *t + ms * MS; *t < end; *t += 500 * MS)
                changes += idle_update(m, &s, *t);
        return changes;
}

/* A monitor that has resumed, at *t. */
static void running(IdleMonitor *m, const IdleSettings *st, uint64_t *t) {
        monitor(m, st);
        feed(m, sample(0.0), t, m->settings.resume_ms + 500);
        cr_assert(!m->paused, "%s", m->reason);
}

/* ---- the decision ------------------------------------------------------ */

Test(idle, starts_paused_and_resumes_after_resume_ms) {
        IdleMonitor m;
        IdleSample s = sample(0.1);
        monitor(&m, NULL);
        cr_assert(m.paused);

        for (uint64_t t = 0; t < 60000 * MS; t += 500 * MS) {
                cr_assert(!idle_update(&m, &s, t));
                cr_assert(m.paused, "resumed at %llu ms", (unsigned long long)(t / MS));
        }
        cr_assert_str_eq(m.reason, "idle for 59 s, resuming after 60 s");
        cr_assert(idle_update(&m, &s, 60000 * MS));
        cr_assert(!m.paused);
        cr_assert_str_eq(m.reason, "idle for 60 s");
}

Test(idle, pauses_after_busy_ms_not_before) {
        IdleMonitor m;
        IdleSample hog = sample(1.0);
        uint64_t t = 0;
        running(&m, NULL, &t);

        /* The first busy sample covers the 500 ms before it; the second one
         * completes busy_ms: a hog is caught within 1.5 s of starting. */
        cr_assert(!idle_update(&m, &hog, t));
        cr_assert(!m.paused);
        cr_assert_str_eq(m.reason, "other processes use 1.0 CPU");
        cr_assert(idle_update(&m, &hog, t + 500 * MS));
        cr_assert(m.paused);
        cr_assert_str_eq(m.reason, "other processes use 1.0 CPU");

        /* Sampled faster, the pause still waits for busy_ms. */
        t = 0;
        running(&m, NULL, &t);
        cr_assert(!idle_update(&m, &(IdleSample){ .logind_idle = -1 }, t));
        for (int i = 1; i < 10; i++)
                cr_assert(!idle_update(&m, &hog, t + (uint64_t)i * 100 * MS));
        cr_assert(!m.paused);
        cr_assert(idle_update(&m, &hog, t + 1000 * MS)); /* busy from t */
}

Test(idle, a_short_burst_does_not_pause) {
        IdleMonitor m;
        IdleSample hog = sample(2.0), quiet = sample(0.0);
        uint64_t t = 0;
        running(&m, NULL, &t);

        for (int i = 0; i < 20; i++) {
                cr_assert(!idle_update(&m, &hog, t));
                cr_assert(!idle_update(&m, &quiet, t + 500 * MS));
                t += 1000 * MS;
        }
        cr_assert(!m.paused);
        cr_assert_str_eq(m.reason, "idle");
}

Test(idle, hysteresis_band_changes_nothing) {
        IdleMonitor m;
        IdleSample band = sample(0.4), calm = sample(0.25);
        uint64_t t = 0;

        /* Between resume (0.25) and pause (0.5): a running node keeps
         * running, a paused one stays paused. */
        running(&m, NULL, &t);
        cr_assert_eq(feed(&m, band, &t, 600000), 0);
        cr_assert(!m.paused);

        monitor(&m, NULL);
        t = 0;
        cr_assert_eq(feed(&m, band, &t, 600000), 0);
        cr_assert(m.paused);
        cr_assert_str_eq(m.reason, "other processes use 0.40 CPU, resuming at 0.25 or less");

        /* Calm must last resume_ms without a break: one sample in the band
         * starts the wait again. */
        cr_assert_eq(feed(&m, calm, &t, 50000), 0);
        cr_assert_eq(feed(&m, band, &t, 500), 0);
        cr_assert_eq(feed(&m, calm, &t, 59500), 0); /* counted from the band sample: 59.5 s */
        cr_assert(m.paused);
        cr_assert_eq(feed(&m, calm, &t, 500), 1);
        cr_assert(!m.paused);
}

Test(idle, pressure_only_guards_resuming) {
        IdleMonitor m;
        IdleSample s = sample(0.1);
        uint64_t t = 0;

        /* Running: the pressure may be the node's own threads. */
        s.pressure = 0.9;
        running(&m, NULL, &t);
        cr_assert_eq(feed(&m, s, &t, 600000), 0);
        cr_assert(!m.paused);

        /* Paused: it is the other processes', and holds the node back. */
        monitor(&m, NULL);
        t = 0;
        s.pressure = 0.5;
        cr_assert_eq(feed(&m, s, &t, 600000), 0);
        cr_assert(m.paused);
        cr_assert_str_eq(m.reason, "CPU pressure is 50%, resuming at 20% or less");

        /* No PSI: resuming goes by the CPU use alone. */
        s.pressure = -1;
        cr_assert_eq(feed(&m, s, &t, 60500), 1);
        cr_assert(!m.paused);
}

Test(idle, battery) {
        IdleMonitor m;
        IdleSettings st;
        IdleSample s = sample(0.0);
        uint64_t t = 0;

        s.on_battery = 1;
        running(&m, NULL, &t);
        cr_assert_eq(feed(&m, s, &t, 1500), 1);
        cr_assert(m.paused);
        cr_assert_str_eq(m.reason, "on battery");
        cr_assert_eq(feed(&m, s, &t, 600000), 0);

        s.on_battery = 0; /* plugged in */
        cr_assert_eq(feed(&m, s, &t, 60500), 1);
        cr_assert(!m.paused);

        idle_settings_default(&st);
        st.run_on_battery = true;
        s.on_battery = 1;
        t = 0;
        running(&m, &st, &t);
        cr_assert_eq(feed(&m, s, &t, 600000), 0);
        cr_assert(!m.paused);
}

Test(idle, logind) {
        IdleMonitor m;
        IdleSettings st;
        IdleSample s = sample(0.0);
        uint64_t t = 0;

        s.logind_idle = 0;
        running(&m, NULL, &t);
        cr_assert_eq(feed(&m, s, &t, 1500), 1);
        cr_assert(m.paused);
        cr_assert_str_eq(m.reason, "the seat's user is active");

        s.logind_idle = 1; /* the user went away */
        cr_assert_eq(feed(&m, s, &t, 60500), 1);
        s.logind_idle = -1; /* no seat, or logind did not answer */
        cr_assert_eq(feed(&m, s, &t, 600000), 0);
        cr_assert(!m.paused);

        idle_settings_default(&st);
        st.use_logind = false;
        s.logind_idle = 0;
        t = 0;
        running(&m, &st, &t);
        cr_assert_eq(feed(&m, s, &t, 600000), 0);
        cr_assert(!m.paused);
}

Test(idle, unknown_load_is_not_calm) {
        IdleMonitor m;
        uint64_t t = 0;
        monitor(&m, NULL);
        cr_assert_eq(feed(&m, sample(-1), &t, 600000), 0);
        cr_assert(m.paused);
        cr_assert_str_eq(m.reason, "measuring the load");
}

Test(idle, disabled_never_pauses) {
        IdleMonitor m;
        IdleSettings st;
        IdleSample s = { .other_cpu = 8.0, .pressure = 1.0, .on_battery = 1, .logind_idle = 0 };
        uint64_t t = 0;

        idle_settings_default(&st);
        st.enabled = false;
        monitor(&m, &st);
        cr_assert(!m.paused);
        cr_assert_eq(feed(&m, s, &t, 600000), 0);
        cr_assert(!m.paused);
        cr_assert_str_eq(m.reason, "idle detection is off");
}

Test(idle, settings_are_checked) {
        IdleSettings st;
        IdleMonitor m;
        Diag d = {};

        idle_settings_default(&st);
        cr_assert_eq(idle_settings_check(&st, &d), 0);
        st.max_duty = 0;
        cr_assert_eq(idle_monitor_init(&m, &st, NULL, &d), -EINVAL);
        cr_assert(strstr(d.text, "max_duty"), "%s", d.text);
        st.max_duty = 1.5;
        cr_assert_eq(idle_settings_check(&st, NULL), -EINVAL);
        idle_settings_default(&st);
        st.max_pressure = -0.1;
        cr_assert_eq(idle_settings_check(&st, &d), -EINVAL);
        cr_assert(strstr(d.text, "max_pressure"), "%s", d.text);
        idle_settings_default(&st);
        st.max_other_cpu = NAN;
        cr_assert_eq(idle_settings_check(&st, NULL), -EINVAL);
}

Test(idle, duty_sleep) {
        cr_assert_eq(idle_duty_sleep_ns(1000 * MS, 1.0), 0);
        cr_assert_eq(idle_duty_sleep_ns(1000 * MS, NAN), 0);
        cr_assert_eq(idle_duty_sleep_ns(1000 * MS, 0.5), 1000 * MS);
        cr_assert_eq(idle_duty_sleep_ns(100 * MS, 0.25), 300 * MS);
        /* 0.1 is not exact in binary: within a nanosecond. */
        cr_assert_leq(llabs((long long)idle_duty_sleep_ns(100 * MS, 0.1) - (long long)(900 * MS)), 1);
        cr_assert_leq(llabs((long long)idle_duty_sleep_ns(MS, 0.0) - (long long)(99 * MS)), 1); /* d >= 0.01 */
        cr_assert_eq(idle_duty_sleep_ns(0, 0.5), 0);
        cr_assert_eq(idle_duty_sleep_ns(UINT64_MAX, 0.01), UINT64_MAX);
}

/* ---- sampling fake files ----------------------------------------------- */

static char root[64];

static void put(const char *rel, const char *text) {
        char path[PATH_MAX];
        FILE *f;

        snprintf(path, sizeof path, "%s%s", root, rel);
        for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
                *p = 0;
                cr_assert(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
                *p = '/';
        }
        f = fopen(path, "we");
        cr_assert_not_null(f, "%s: %s", path, strerror(errno));
        fputs(text, f);
        fclose(f);
}

static void unput(const char *rel) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s%s", root, rel);
        cr_assert_eq(remove(path), 0, "%s: %s", path, strerror(errno));
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static void make_root(void) {
        snprintf(root, sizeof root, "/tmp/test-idle-XXXXXX");
        cr_assert_not_null(mkdtemp(root));
}

static void remove_root(void) {
        nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void monitor_at_root(IdleMonitor *m) {
        IdleSettings st;
        Diag d = {};
        idle_settings_default(&st);
        cr_assert_eq(idle_monitor_init(m, &st, root, &d), 0, "%s", d.text);
}

/* A /proc/stat whose busy ticks (user nice system irq softirq) sum to busy,
 * with idle, iowait, steal and guest that must not count. */
static void put_stat(long busy, long other) {
        char text[512];
        long user = busy - 30, nice = 10, system = 10, irq = 5, softirq = 5;
        snprintf(text, sizeof text,
                 "cpu  %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld\n"
                 "cpu0 1 2 3 4 5 6 7 8 9 10\n"
                 "intr 12345\n",
                 user, nice, system, 1000 + other, 50 + other, irq, softirq, 7 + other, 3 + other, 0L);
        put("/proc/stat", text);
}

static void put_pressure(unsigned long long some_us, unsigned long long full_us) {
        char text[256];
        snprintf(text, sizeof text,
                 "some avg10=1.00 avg60=0.50 avg300=0.10 total=%llu\n"
                 "full avg10=0.00 avg60=0.00 avg300=0.00 total=%llu\n",
                 some_us, full_us);
        put("/proc/pressure/cpu", text);
}

Test(idle, sample_cpu_and_pressure, .init = make_root, .fini = remove_root) {
        long hz = sysconf(_SC_CLK_TCK);
        IdleMonitor m;
        IdleSample s;

        monitor_at_root(&m);
        put_stat(1000, 0);
        put_pressure(1000000, 5000000);
        cr_assert_eq(idle_monitor_sample(&m, 500 * MS, 5000 * MS, &s), 0);
        cr_assert_lt(s.other_cpu, 0); /* only the baseline */
        cr_assert_lt(s.pressure, 0);
        cr_assert_eq(s.on_battery, 0); /* no power_supply directory */
        cr_assert_eq(s.logind_idle, -1); /* not asked with a root */

        /* One second: 2 s of busy CPU, half a second of it this process's;
         * 250 ms of stall. Idle, iowait, steal and guest grow by 300 ticks. */
        put_stat(1000 + 2 * hz, 300);
        put_pressure(1250000, 9000000);
        cr_assert_eq(idle_monitor_sample(&m, 1000 * MS, 6000 * MS, &s), 0);
        cr_assert_float_eq(s.other_cpu, 1.5, 1e-9);
        cr_assert_float_eq(s.pressure, 0.25, 1e-9);

        /* This process used more than the machine counted (tick rounding):
         * no negative load. Counters going backwards count as nothing. */
        cr_assert_eq(idle_monitor_sample(&m, 3000 * MS, 7000 * MS, &s), 0);
        cr_assert_float_eq(s.other_cpu, 0.0, 1e-12);
        cr_assert_float_eq(s.pressure, 0.0, 1e-12);
        put_stat(500, 0);
        put_pressure(1000, 0);
        cr_assert_eq(idle_monitor_sample(&m, 3000 * MS, 8000 * MS, &s), 0);
        cr_assert_float_eq(s.other_cpu, 0.0, 1e-12);
        cr_assert_float_eq(s.pressure, 0.0, 1e-12);

        /* Without PSI the load is still measured. */
        put_stat(500 + hz / 2, 0);
        unput("/proc/pressure/cpu");
        cr_assert_eq(idle_monitor_sample(&m, 3000 * MS, 9000 * MS, &s), 0);
        cr_assert_float_eq(s.other_cpu, 0.5, 1e-9);
        cr_assert_lt(s.pressure, 0);
        idle_monitor_done(&m);
}

Test(idle, sample_bad_proc_stat, .init = make_root, .fini = remove_root) {
        IdleMonitor m;
        IdleSample s = sample(0.7);

        monitor_at_root(&m);
        cr_assert_eq(idle_monitor_sample(&m, 0, 0, &s), -ENOENT);
        put("/proc/stat", "intr 1 2 3\n");
        cr_assert_eq(idle_monitor_sample(&m, 0, 0, &s), -EBADMSG);
        put("/proc/stat", "cpu  1 2 3\n");
        cr_assert_eq(idle_monitor_sample(&m, 0, 0, &s), -EBADMSG);
        put("/proc/stat", "cpu  1 2 3 99999999999999999999999\n");
        cr_assert_eq(idle_monitor_sample(&m, 0, 0, &s), -EBADMSG);
        cr_assert_float_eq(s.other_cpu, 0.7, 0); /* untouched on failure */
        put("/proc/stat", "cpu  1 2 3 4\n"); /* an old kernel: four fields */
        cr_assert_eq(idle_monitor_sample(&m, 0, 0, &s), 0);
}

/* Power supplies: each case a fresh tree. */
static int on_battery(const char *const *files) {
        IdleMonitor m;
        IdleSample s;
        remove_root();
        make_root();
        put_stat(100, 0);
        for (size_t i = 0; files[i]; i += 2)
                put(files[i], files[i + 1]);
        monitor_at_root(&m);
        cr_assert_eq(idle_monitor_sample(&m, 0, 0, &s), 0);
        return s.on_battery;
}

#define PS "/sys/class/power_supply/"

Test(idle, sample_power, .init = make_root, .fini = remove_root) {
        /* A laptop on AC, charging. */
        cr_assert_eq(on_battery((const char *const[]){ PS "AC/type", "Mains\n", PS "AC/online", "1\n",
                                                       PS "BAT0/type", "Battery\n", PS "BAT0/status", "Charging\n",
                                                       NULL }),
                     0);
        /* Unplugged. */
        cr_assert_eq(on_battery((const char *const[]){ PS "AC/type", "Mains\n", PS "AC/online", "0\n",
                                                       PS "BAT0/type", "Battery\n",
                                                       PS "BAT0/status", "Discharging\n", NULL }),
                     1);
        /* Unplugged, the battery full and not yet reporting discharge. */
        cr_assert_eq(on_battery((const char *const[]){ PS "AC/type", "Mains\n", PS "AC/online", "0\n",
                                                       PS "BAT0/type", "Battery\n", PS "BAT0/status", "Full\n",
                                                       NULL }),
                     1);
        /* Plugged into a charger too weak for the load. */
        cr_assert_eq(on_battery((const char *const[]){ PS "AC/type", "Mains\n", PS "AC/online", "1\n",
                                                       PS "BAT0/type", "Battery\n",
                                                       PS "BAT0/status", "Discharging\n", NULL }),
                     1);
        /* Charging over USB-C, the barrel connector unplugged. */
        cr_assert_eq(on_battery((const char *const[]){ PS "AC/type", "Mains\n", PS "AC/online", "0\n",
                                                       PS "ucsi-source-psy-USBC000:001/type", "USB\n",
                                                       PS "ucsi-source-psy-USBC000:001/online", "1\n",
                                                       PS "BAT0/type", "Battery\n", PS "BAT0/status", "Charging\n",
                                                       NULL }),
                     0);
        /* A desktop whose only battery is a wireless mouse's. */
        cr_assert_eq(on_battery((const char *const[]){ PS "hidpp_battery_0/type", "Battery\n",
                                                       PS "hidpp_battery_0/scope", "Device\n",
                                                       PS "hidpp_battery_0/status", "Discharging\n", NULL }),
                     0);
        /* A battery and no mains supply listed: its status decides. */
        cr_assert_eq(on_battery((const char *const[]){ PS "BAT0/type", "Battery\n", PS "BAT0/status", "Full\n",
                                                       NULL }),
                     0);
        cr_assert_eq(on_battery((const char *const[]){ PS "BAT0/type", "Battery\n",
                                                       PS "BAT0/status", "Discharging\n", NULL }),
                     1);
        /* A desktop with a mains supply only; an empty directory. */
        cr_assert_eq(on_battery((const char *const[]){ PS "AC/type", "Mains\n", PS "AC/online", "0\n", NULL }), 0);
        cr_assert_eq(on_battery((const char *const[]){ PS ".keep", "", NULL }), 0);
}

/* ---- the real machine -------------------------------------------------- */

Test(idle, real_proc_sees_a_busy_child) {
        IdleSettings st;
        IdleMonitor m;
        IdleSample s;
        Diag d = {};
        int status;
        pid_t pid;

        idle_settings_default(&st);
        st.use_logind = false;
        cr_assert_eq(idle_monitor_init(&m, &st, NULL, &d), 0, "%s", d.text);
        cr_assert_eq(idle_monitor_sample(&m, idle_process_cpu_ns(), now_ns(), &s), 0);

        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                volatile uint64_t spins = 0;
                for (uint64_t end = now_ns() + 300 * MS; now_ns() < end;)
                        spins++;
                _exit(0);
        }
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert_eq(idle_monitor_sample(&m, idle_process_cpu_ns(), now_ns(), &s), 0);

        /* A child spinning for the whole interval is another process using
         * about one core; the machine is shared, so only a loose bound. */
        cr_assert_gt(s.other_cpu, 0.3, "other processes used %.2f CPU", s.other_cpu);
        cr_assert(s.pressure < 0 || (s.pressure >= 0 && s.pressure <= 1), "pressure %g", s.pressure);
        cr_assert(s.on_battery == 0 || s.on_battery == 1);
        idle_monitor_done(&m);
}

Test(idle, logind_answers_or_is_unavailable) {
        IdleMonitor m;
        int r;

        monitor(&m, NULL);
        r = idle_logind_read(&m); /* no seat in a container: -ENXIO or another -errno */
        cr_assert(r == 0 || r == 1 || r < 0);
        idle_monitor_done(&m);
        idle_monitor_done(&m);
}

/* The compute thread resting under the duty-cycle cap keeps serving its
 * links (a coordinator wants heartbeats more often than a rest of seconds:
 * a member that rested 5 s in silence was dropped, and every member with
 * it after each new plan); a pause is served as a pause. */
typedef struct Served {
        int resting, paused;
} Served;

static void count_serves(void *ud, bool paused) {
        Served *s = ud;
        if (paused)
                s->paused++;
        else
                s->resting++;
}

Test(duty, a_rest_serves_the_links) {
        Control c;
        Served s = {};
        cr_assert_eq(control_init(&c), 0);
        control_set_max_duty(&c, 0.1);
        cr_assert_eq(control_gate(&c, count_serves, &s), 0); /* the first gate: no rest */
        struct timespec busy = { 0, 100 * 1000000L };
        nanosleep(&busy, NULL); /* 100 ms of work: 900 ms of rest at a tenth */
        cr_assert_eq(control_gate(&c, count_serves, &s), 0);
        cr_assert_gt(s.resting, 0, "a rest without serving the links");
        cr_assert_eq(s.paused, 0);
        control_done(&c);
}

/* Step is published as a counter: a report of fewer steps (a member handed
 * the swarm's count with a new plan) does not take it back. */
Test(duty, the_published_step_never_goes_back) {
        Control c;
        NodeStatus st;
        cr_assert_eq(control_init(&c), 0);
        control_report_training(&c, &(NodeTraining){ .step = 127000 });
        control_report_training(&c, &(NodeTraining){ .step = 65000, .epoch = 3 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.training.step, 127000);
        cr_assert_eq(st.training.epoch, 3, "the rest of the report is taken");
        control_done(&c);
}

/* A paused node publishes no throughput and no busy fraction, whatever
 * the run reports: the first window after the pause began holds a sliver
 * of work and no samples (CI saw Busy 9e-05 beside 0 samples/s, kept
 * because only a throughput above 0 cleared both); unknown stays unknown. */
Test(duty, a_paused_node_is_neither_busy_nor_training) {
        Control c;
        NodeStatus st;
        cr_assert_eq(control_init(&c), 0);
        control_set_state(&c, NODE_TRAINING);
        control_report_training(&c, &(NodeTraining){ .samples_per_sec = 900, .busy = 0.9 });
        control_set_state(&c, NODE_PAUSED);
        control_report_training(&c, &(NodeTraining){ .samples_per_sec = 0, .busy = 9.2e-5 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.training.samples_per_sec, 0);
        cr_assert_eq(st.training.busy, 0, "%g", st.training.busy);
        control_report_training(&c, &(NodeTraining){ .samples_per_sec = -1, .busy = -1 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert(st.training.samples_per_sec < 0 && st.training.busy < 0, "unknown published as known");
        control_done(&c);
}

/* The network's counters are a process's, not a run's: membership runs a
 * fresh stage per plan epoch, each counting from 0; what the runs before
 * counted is added, so AveragingRounds and the byte counts never go back
 * (Prometheus would take the fall for a restart). */
Test(duty, the_network_counters_go_on_across_runs) {
        Control c;
        NodeStatus st;
        cr_assert_eq(control_init(&c), 0);
        NodeNetwork first = { .peers = 2, .bytes_sent = 1000, .bytes_received = 900, .rounds_done = 22,
                              .rounds_failed = 1, .last_averaging_usec = 5000, .last_round_ns = 70,
                              .traffic = { 400, 300, 600, 600, 50 }, .io_backend = "io_uring" };
        control_report_network(&c, &first);
        control_report_run_end(&c);
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.peers, 0, "the run's links are gone");
        cr_assert_eq(st.network.rounds_done, 22);
        cr_assert_str_eq(st.network.io_backend, "io_uring");

        /* the next run's first report: nothing counted yet */
        control_report_network(&c, &(NodeNetwork){ .peers = 1, .io_backend = "io_uring" });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.rounds_done, 22);
        cr_assert_eq(st.network.bytes_sent, 1000);
        cr_assert_eq(st.network.last_averaging_usec, 5000, "the last round is still the earlier run's");
        cr_assert_eq(st.network.last_round_ns, 70);

        NodeNetwork second = { .peers = 1, .bytes_sent = 10, .bytes_received = 20, .rounds_done = 18,
                               .last_averaging_usec = 9000, .last_round_ns = 80, .traffic = { 1, 2, 3, 4, 5 } };
        control_report_network(&c, &second);
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.peers, 1);
        cr_assert_eq(st.network.rounds_done, 40);
        cr_assert_eq(st.network.rounds_failed, 1);
        cr_assert_eq(st.network.bytes_sent, 1010);
        cr_assert_eq(st.network.bytes_received, 920);
        cr_assert_eq(st.network.last_averaging_usec, 9000);
        cr_assert_eq(st.network.traffic.pipeline_sent, 401);
        cr_assert_eq(st.network.traffic.pipeline_received, 302);
        cr_assert_eq(st.network.traffic.averaging_sent, 603);
        cr_assert_eq(st.network.traffic.averaging_received, 604);
        cr_assert_eq(st.network.traffic.steps, 55);
        cr_assert_eq(st.network.traffic.peers_sent, 0);

        /* a run that ends without reporting (it failed to start) takes nothing away */
        control_report_run_end(&c);
        control_report_run_end(&c);
        control_report_network(&c, &(NodeNetwork){ .rounds_done = 1 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.rounds_done, 41);
        control_done(&c);
}

/* A node that coordinates and trains: its coordinator's links count in the
 * bytes and under purpose "network" beside the stage of each plan epoch,
 * between two stages too, and once: not again in what a run that ends
 * leaves for the next. */
Test(duty, the_coordinator_s_bytes_count_beside_the_runs) {
        Control c;
        NodeStatus st;
        cr_assert_eq(control_init(&c), 0);
        control_add_coordinator_bytes(&c, 100, 300); /* JOINs in, before any plan */
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.bytes_sent, 100);
        cr_assert_eq(st.network.bytes_received, 300);
        cr_assert_eq(st.network.traffic.peers_sent, 100);
        cr_assert_eq(st.network.traffic.peers_received, 300);

        /* a stage of plan epoch 1 */
        control_report_network(&c, &(NodeNetwork){ .peers = 2, .bytes_sent = 1000, .bytes_received = 2000,
                                                    .traffic = { .pipeline_sent = 1000, .pipeline_received = 2000 } });
        control_add_coordinator_bytes(&c, 10, 20); /* a heartbeat */
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.bytes_sent, 1110);
        cr_assert_eq(st.network.bytes_received, 2320);
        cr_assert_eq(st.network.traffic.pipeline_sent, 1000);
        cr_assert_eq(st.network.traffic.peers_sent, 110);
        cr_assert_eq(st.network.traffic.peers_received, 320);

        /* it ends; the coordinator collects the layers */
        control_report_run_end(&c);
        control_add_coordinator_bytes(&c, 5, 4000);
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.bytes_sent, 1115);
        cr_assert_eq(st.network.bytes_received, 6320);

        /* the stage of plan epoch 2: the coordinator's bytes are not the run's base */
        control_report_network(&c, &(NodeNetwork){ .peers = 1, .bytes_sent = 7, .bytes_received = 8,
                                                    .traffic = { .pipeline_sent = 7, .pipeline_received = 8 } });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.bytes_sent, 1122, "%llu", (unsigned long long)st.network.bytes_sent);
        cr_assert_eq(st.network.bytes_received, 6328, "%llu", (unsigned long long)st.network.bytes_received);
        cr_assert_eq(st.network.traffic.pipeline_sent, 1007);
        cr_assert_eq(st.network.traffic.peers_sent, 115);
        cr_assert_eq(st.network.traffic.peers_received, 4320);
        control_done(&c);
}

/* A round no other member took part in averaged nothing: it counts as
 * failed, and the last round (its time, length and members) stays the
 * last one that averaged with another member. */
Test(duty, an_averaging_round_alone_counts_as_failed) {
        Averaging a = { .seen = { .rounds_done = 30, .rounds_alone = 58, .rounds_failed = 2, .last_round_ns = 10,
                                  .last_participants = 1, .last_group = 2 } };
        a.seen.rounds_done += a.seen.rounds_alone;
        a.seen.averaged = (AveragerRound){ .realtime_us = 7000, .duration_ns = 90, .participants = 2, .group = 2 };
        NodeNetwork n = {};
        averaging_report_network(&a, &n);
        cr_assert_eq(n.rounds_done, 30);
        cr_assert_eq(n.rounds_failed, 60);
        cr_assert_eq(n.last_averaging_usec, 7000);
        cr_assert_eq(n.last_round_ns, 90);
        cr_assert_eq(n.last_participants, 2);
        cr_assert_eq(n.last_group, 2);

        /* the next run's last round is the earlier run's until it has one */
        Control c;
        NodeStatus st;
        cr_assert_eq(control_init(&c), 0);
        control_report_network(&c, &n);
        control_report_run_end(&c);
        control_report_network(&c, &(NodeNetwork){ .rounds_failed = 1 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.network.rounds_failed, 61);
        cr_assert_eq(st.network.last_averaging_usec, 7000);
        cr_assert_eq(st.network.last_participants, 2);
        cr_assert_eq(st.network.last_group, 2);
        control_done(&c);
}

/* STATUS= leaves out what the node does not know: no loss before the first
 * window (it said "loss -1.0000") nor where a stage does not compute it, no
 * epoch where it does not read the data; and says what a stage waits for. */
Test(duty, the_status_line_gives_only_known_figures) {
        NodeStatus st = { .training = { .job = "mlp", .epoch = 1, .epochs = 3, .loss = -1, .samples_per_sec = 0 } };
        char text[256];
        daemon_training_status(&st, text, sizeof text);
        cr_assert_str_eq(text, "Training mlp: epoch 1/3, step 0, 0 samples/s, 0 peers");
        st.training.loss = 0.412, st.training.step = 20, st.training.samples_per_sec = 5300, st.network.peers = 2;
        daemon_training_status(&st, text, sizeof text);
        cr_assert_str_eq(text, "Training mlp: epoch 1/3, step 20, loss 0.4120, 5300 samples/s, 2 peers");
        st.training.epoch = -1, st.training.loss = -1;
        snprintf(st.training.waiting_for, sizeof st.training.waiting_for, "stage 1: not connected");
        daemon_training_status(&st, text, sizeof text);
        cr_assert_str_eq(text, "Training mlp: step 20, 5300 samples/s, 2 peers, waiting for stage 1: not connected");
}

/* Under membership a stage's step is the swarm's count in the steps of the
 * plan held: a new plan may set it back (more clusters, each step more
 * samples). Step counts on from where it was by as much as the position
 * moves, and CheckpointStep is the Step at the checkpoint: it never goes
 * back either. */
Test(duty, the_checkpoint_step_is_in_step_s_units) {
        Control c;
        NodeStatus st;
        cr_assert_eq(control_init(&c), 0);
        control_report_training(&c, &(NodeTraining){ .step = 2300 }); /* plan epoch 1 */
        control_checkpoint_done(&c, 0, 2351);
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.checkpoint_step, 2351);
        control_report_training(&c, &(NodeTraining){ .step = 2351 });

        control_report_training(&c, &(NodeTraining){ .step = 2000 }); /* plan epoch 2: the swarm's count */
        control_report_training(&c, &(NodeTraining){ .step = 2100 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.training.step, 2451, "Step counts on by the 100 steps made");
        control_checkpoint_done(&c, 0, 2110); /* ahead of the last report by 10 */
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.checkpoint_step, 2461);

        control_checkpoint_done(&c, 0, 1200); /* plan epoch 3, before its first report */
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.checkpoint_step, 2461, "never back");
        control_report_training(&c, &(NodeTraining){ .step = 1200 });
        control_report_training(&c, &(NodeTraining){ .step = 1300 });
        control_checkpoint_done(&c, -EIO, 1300); /* failed: not a checkpoint */
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.checkpoint_step, 2461);
        control_report_checkpoint(&c, 1300); /* written, as a stage reports it */
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.training.step, 2551);
        cr_assert_eq(st.checkpoint_step, 2551);
        control_done(&c);

        /* a run that starts from its checkpoint: both at its step */
        cr_assert_eq(control_init(&c), 0);
        control_report_checkpoint(&c, 500);
        control_report_training(&c, &(NodeTraining){ .step = 500 });
        control_snapshot(&c, NULL, &st, NULL, NULL, NULL);
        cr_assert_eq(st.checkpoint_step, 500);
        cr_assert_eq(st.training.step, 500);
        control_done(&c);
}
