/* host/idle.c */
#include "idle.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-login.h>
#include <time.h>

#include "util/time-util.h"

/* ---- settings ---------------------------------------------------------- */

void idle_settings_default(IdleSettings *ret) {
        *ret = (IdleSettings){
                .enabled = true,
                .max_other_cpu = 0.5,
                .max_pressure = 0.2,
                .busy_ms = 1000,
                .resume_ms = 60000,
                .run_on_battery = false,
                .use_logind = true,
                .max_duty = 1.0,
        };
}

int idle_settings_check(const IdleSettings *s, Diag *d) {
        if (!isfinite(s->max_other_cpu) || s->max_other_cpu < 0 || s->max_other_cpu > 4096)
                return diag_set(d, -EINVAL, "idle: max_other_cpu must be in [0, 4096] cores, got %g",
                                s->max_other_cpu);
        if (!isfinite(s->max_pressure) || s->max_pressure < 0 || s->max_pressure > 1)
                return diag_set(d, -EINVAL, "idle: max_pressure must be in [0, 1], got %g", s->max_pressure);
        if (!isfinite(s->max_duty) || s->max_duty <= 0 || s->max_duty > 1)
                return diag_set(d, -EINVAL, "idle: max_duty must be in (0, 1], got %g", s->max_duty);
        if (s->busy_ms > 3600000 || s->resume_ms > 86400000)
                return diag_set(d, -EINVAL, "idle: busy_ms must be at most 1 h and resume_ms at most 1 day");
        return 0;
}

int idle_monitor_init(IdleMonitor *m, const IdleSettings *s, const char *root, Diag *d) {
        int r = idle_settings_check(s, d);
        if (r < 0)
                return r;
        if (root && strlen(root) >= sizeof m->root - 64)
                return diag_set(d, -ENAMETOOLONG, "idle: root directory name too long");

        *m = (IdleMonitor){ .settings = *s, .paused = s->enabled };
        snprintf(m->root, sizeof m->root, "%s", root ?: "");
        m->clk_tck = sysconf(_SC_CLK_TCK);
        if (m->clk_tck <= 0)
                m->clk_tck = 100;
        snprintf(m->reason, sizeof m->reason, "%s",
                 s->enabled ? "waiting for the machine to become idle" : "idle detection is off");
        return 0;
}

void idle_monitor_done(IdleMonitor *m) {
        m->bus = sd_bus_flush_close_unref(m->bus);
}

uint64_t idle_process_cpu_ns(void) {
        struct timespec ts;
        if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) < 0)
                return 0;
        return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* ---- sampling ---------------------------------------------------------- */

/* The first size-1 bytes of root+path, NUL-terminated. */
static int read_small(const IdleMonitor *m, const char *path, char *buf, size_t size) {
        char full[PATH_MAX];
        _cleanup_(closep) int fd = -1;
        size_t len = 0;

        if ((size_t)snprintf(full, sizeof full, "%s%s", m->root, path) >= sizeof full)
                return -ENAMETOOLONG;
        fd = open(full, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        while (len < size - 1) {
                ssize_t n = read(fd, buf + len, size - 1 - len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                len += (size_t)n;
        }
        buf[len] = 0;
        return (int)len;
}

/* A decimal counter at *p; advances p. */
static int parse_counter(const char **p, uint64_t *ret) {
        char *end;
        unsigned long long v;

        while (**p == ' ' || **p == '\t')
                (*p)++;
        if (**p < '0' || **p > '9')
                return -EBADMSG;
        errno = 0;
        v = strtoull(*p, &end, 10);
        if (errno == ERANGE)
                return -EBADMSG;
        *p = end;
        *ret = v;
        return 0;
}

/* The first line of /proc/stat: "cpu  user nice system idle iowait irq
 * softirq steal guest guest_nice", in USER_HZ ticks summed over all CPUs
 * (proc(5)). Busy is user + nice + system + irq + softirq: guest time is
 * already inside user and nice, iowait is idle, and steal is the
 * hypervisor's, not this machine's owner's. */
static int read_cpu_busy(const IdleMonitor *m, uint64_t *ret) {
        char buf[512];
        uint64_t f[8] = {};
        const char *p = buf;
        int n = 0, r;

        r = read_small(m, "/proc/stat", buf, sizeof buf);
        if (r < 0)
                return r;
        if (strncmp(buf, "cpu ", 4) != 0)
                return -EBADMSG;
        p += 4;
        for (; n < (int)ELEMENTSOF(f); n++)
                if (parse_counter(&p, &f[n]) < 0)
                        break;
        if (n < 4) /* user nice system idle: every kernel has these */
                return -EBADMSG;
        /* Each counter is bounded so that the sum cannot overflow. */
        for (int i = 0; i < n; i++)
                if (f[i] > UINT64_MAX / 8)
                        return -EBADMSG;
        *ret = f[0] + f[1] + f[2] + f[5] + f[6];
        return 0;
}

/* "some avg10=… avg60=… avg300=… total=<µs>" of /proc/pressure/cpu
 * (Documentation/accounting/psi.rst): the time at least one task waited for a
 * CPU. */
static int read_cpu_stall(const IdleMonitor *m, uint64_t *ret) {
        char buf[256];
        const char *p;
        int r;

        r = read_small(m, "/proc/pressure/cpu", buf, sizeof buf);
        if (r < 0)
                return r;
        if (strncmp(buf, "some ", 5) != 0)
                return -EBADMSG;
        p = strstr(buf, " total=");
        if (!p || (strchr(buf, '\n') && p > strchr(buf, '\n')))
                return -EBADMSG;
        p += strlen(" total=");
        return parse_counter(&p, ret);
}

/* The first line of a sysfs attribute, without the newline; "" if missing. */
static void read_attr(const IdleMonitor *m, const char *dir, const char *name, char *buf, size_t size) {
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "/sys/class/power_supply/%s/%s", dir, name) >= sizeof path ||
            read_small(m, path, buf, size) < 0)
                buf[0] = 0;
        buf[strcspn(buf, "\n")] = 0;
}

/* On battery: a system battery is discharging, or one exists and none of the
 * mains supplies (AC adapters, USB-C chargers) is online. Batteries of
 * peripherals (scope "Device": mice, headsets) do not count. No
 * power_supply directory: a desktop or a server, on AC. */
static int read_on_battery(const IdleMonitor *m) {
        char path[PATH_MAX];
        bool battery = false, discharging = false, mains = false, online = false;
        DIR *dir;
        struct dirent *de;

        if ((size_t)snprintf(path, sizeof path, "%s/sys/class/power_supply", m->root) >= sizeof path)
                return 0;
        dir = opendir(path);
        if (!dir)
                return 0;
        while ((de = readdir(dir))) {
                char type[32], scope[32], value[32];
                if (de->d_name[0] == '.')
                        continue;
                read_attr(m, de->d_name, "type", type, sizeof type);
                read_attr(m, de->d_name, "scope", scope, sizeof scope);
                if (strcmp(scope, "Device") == 0)
                        continue;
                if (strcmp(type, "Battery") == 0) {
                        battery = true;
                        read_attr(m, de->d_name, "status", value, sizeof value);
                        if (strcmp(value, "Discharging") == 0)
                                discharging = true;
                } else if (strcmp(type, "Mains") == 0 || strncmp(type, "USB", 3) == 0) {
                        mains = true;
                        read_attr(m, de->d_name, "online", value, sizeof value);
                        if (strcmp(value, "1") == 0)
                                online = true;
                }
        }
        closedir(dir);
        return discharging || (battery && mains && !online);
}

int idle_logind_read(IdleMonitor *m) {
        sd_bus_error error = SD_BUS_ERROR_NULL;
        int idle = 0, r;

        r = sd_get_seats(NULL);
        if (r < 0)
                return r;
        if (r == 0)
                return -ENXIO;
        if (!m->bus) {
                r = sd_bus_open_system(&m->bus);
                if (r < 0)
                        return r;
                (void)sd_bus_set_method_call_timeout(m->bus, IDLE_LOGIND_TIMEOUT_USEC);
        }
        r = sd_bus_get_property_trivial(m->bus, "org.freedesktop.login1", "/org/freedesktop/login1",
                                        "org.freedesktop.login1.Manager", "IdleHint", &error, 'b', &idle);
        sd_bus_error_free(&error);
        if (r < 0) {
                /* Reconnect next time: the bus may have restarted. */
                m->bus = sd_bus_flush_close_unref(m->bus);
                return r;
        }
        return idle ? 1 : 0;
}

int idle_monitor_sample(IdleMonitor *m, uint64_t own_cpu_ns, uint64_t now, IdleSample *ret) {
        IdleSample s = { .other_cpu = -1, .pressure = -1, .logind_idle = -1 };
        uint64_t busy, stall = 0;
        bool have_stall;
        int r;

        r = read_cpu_busy(m, &busy);
        if (r < 0)
                return r;
        have_stall = read_cpu_stall(m, &stall) >= 0;
        s.on_battery = read_on_battery(m);
        if (m->settings.use_logind && !m->root[0]) {
                r = idle_logind_read(m);
                s.logind_idle = r < 0 ? -1 : r;
        }

        if (m->have_prev && now > m->prev_ns) {
                double wall = ns_to_sec(now - m->prev_ns);
                /* Counters that go backwards (CPU hotplug) count as no time. */
                double busy_s = busy > m->prev_busy_ticks
                                        ? (double)(busy - m->prev_busy_ticks) / (double)m->clk_tck : 0.0;
                double own_s = own_cpu_ns > m->prev_own_ns ? ns_to_sec(own_cpu_ns - m->prev_own_ns) : 0.0;

                s.other_cpu = MAX(0.0, (busy_s - own_s) / wall);
                if (have_stall && m->have_prev_stall) {
                        double stall_s = stall > m->prev_stall_us
                                                 ? (double)(stall - m->prev_stall_us) / (double)USEC_PER_SEC : 0.0;
                        s.pressure = MIN(1.0, stall_s / wall);
                }
        }

        m->have_prev = true;
        m->prev_busy_ticks = busy;
        m->prev_own_ns = own_cpu_ns;
        m->prev_ns = now;
        m->have_prev_stall = have_stall;
        m->prev_stall_us = stall;
        *ret = s;
        return 0;
}

/* ---- deciding ---------------------------------------------------------- */

/* Whether s says the owner needs the machine, and why. */
static bool sample_busy(const IdleSettings *st, const IdleSample *s, char *why, size_t len) {
        if (s->on_battery == 1 && !st->run_on_battery)
                snprintf(why, len, "on battery");
        else if (st->use_logind && s->logind_idle == 0)
                snprintf(why, len, "the seat's user is active");
        else if (s->other_cpu > st->max_other_cpu)
                snprintf(why, len, "other processes use %.1f CPU", s->other_cpu);
        else
                return false;
        return true;
}

/* Whether s is quiet enough to count towards resuming; if not, why. Called
 * only when s is not busy. */
static bool sample_calm(const IdleSettings *st, const IdleSample *s, char *why, size_t len) {
        double resume_cpu = IDLE_RESUME_FRACTION * st->max_other_cpu;

        if (s->other_cpu < 0)
                snprintf(why, len, "measuring the load");
        else if (s->other_cpu > resume_cpu)
                snprintf(why, len, "other processes use %.2f CPU, resuming at %.2f or less", s->other_cpu,
                         resume_cpu);
        else if (s->pressure > st->max_pressure)
                snprintf(why, len, "CPU pressure is %.0f%%, resuming at %.0f%% or less", 100 * s->pressure,
                         100 * st->max_pressure);
        else
                return true;
        return false;
}

static uint64_t since(uint64_t now, uint64_t then) {
        return now > then ? now - then : 0;
}

bool idle_update(IdleMonitor *m, const IdleSample *s, uint64_t now) {
        const IdleSettings *st = &m->settings;
        bool was = m->paused, busy, calm = false;
        /* A sample describes the interval since the previous one. */
        uint64_t start = m->have_last && m->last_ns < now ? m->last_ns : now;
        char why[sizeof m->reason];

        m->have_last = true;
        m->last_ns = now;

        if (!st->enabled) {
                m->paused = false;
                m->busy_timing = m->calm_timing = false;
                snprintf(m->reason, sizeof m->reason, "idle detection is off");
                return was;
        }

        busy = sample_busy(st, s, why, sizeof why);
        if (!busy)
                calm = sample_calm(st, s, why, sizeof why);

        if (!busy)
                m->busy_timing = false;
        else if (!m->busy_timing) {
                m->busy_timing = true;
                m->busy_since_ns = start;
        }
        if (!calm)
                m->calm_timing = false;
        else if (!m->calm_timing) {
                m->calm_timing = true;
                m->calm_since_ns = start;
        }

        if (!m->paused) {
                if (busy && since(now, m->busy_since_ns) >= (uint64_t)st->busy_ms * 1000000ULL)
                        m->paused = true;
                snprintf(m->reason, sizeof m->reason, "%s", busy ? why : "idle");
        } else if (calm) {
                uint64_t idle_ns = since(now, m->calm_since_ns), need = (uint64_t)st->resume_ms * 1000000ULL;
                /* Whole seconds, rounded down: "idle for 59 s, resuming after 60 s". */
                unsigned long long idle_s = idle_ns / NSEC_PER_SEC, need_s = st->resume_ms / 1000;
                if (idle_ns >= need) {
                        m->paused = false;
                        snprintf(m->reason, sizeof m->reason, "idle for %llu s", idle_s);
                } else
                        snprintf(m->reason, sizeof m->reason, "idle for %llu s, resuming after %llu s", idle_s,
                                 need_s);
        } else
                snprintf(m->reason, sizeof m->reason, "%s", why);

        return m->paused != was;
}

uint64_t idle_duty_sleep_ns(uint64_t busy_ns, double max_duty) {
        double d, sleep;

        if (!(max_duty < 1.0)) /* also NaN: no cap */
                return 0;
        d = MAX(max_duty, 0.01);
        sleep = (double)busy_ns * (1.0 - d) / d;
        return sleep >= 1.8e19 ? UINT64_MAX : (uint64_t)sleep;
}
