/* web/web.c */
#include "web.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int reserve(WebBuf *b, size_t more) {
        size_t max = b->max ?: WEB_BUF_MAX;
        if (b->len + more + 1 > max)
                return -ENOBUFS;
        if (b->len + more + 1 <= b->cap)
                return 0;
        size_t cap = MAX(b->cap * 2, (size_t)4096);
        while (cap < b->len + more + 1)
                cap *= 2;
        cap = MIN(cap, max);
        char *p = realloc(b->data, cap);
        if (!p)
                return -ENOMEM;
        b->data = p;
        b->cap = cap;
        return 0;
}

int web_buf_printf(WebBuf *b, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (n < 0)
                return -EINVAL;
        int r = reserve(b, (size_t)n);
        if (r < 0)
                return r;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
        b->len += (size_t)n;
        return n;
}

int web_buf_put(WebBuf *b, const char *s) {
        size_t n = strlen(s);
        int r = reserve(b, n);
        if (r < 0)
                return r;
        memcpy(b->data + b->len, s, n + 1);
        b->len += n;
        return (int)n;
}

int web_buf_put_html(WebBuf *b, const char *s) {
        int r = 0;
        for (; *s && r >= 0; s++)
                switch (*s) {
                case '&': r = web_buf_put(b, "&amp;"); break;
                case '<': r = web_buf_put(b, "&lt;"); break;
                case '>': r = web_buf_put(b, "&gt;"); break;
                case '"': r = web_buf_put(b, "&quot;"); break;
                case '\'': r = web_buf_put(b, "&#39;"); break;
                default: r = web_buf_printf(b, "%c", *s);
                }
        return r < 0 ? r : 0;
}

void web_buf_free(WebBuf *b) {
        free(b->data);
        *b = (WebBuf){ .max = b->max };
}

/* /proc/self/stat: utime (14), stime (15), starttime (22) in clock ticks,
 * rss (24) in pages (proc(5)); the fields after the command, which may hold
 * spaces and parentheses, so from the last ')'. /proc/stat's btime is when
 * the machine booted. */
int web_process_read(WebProcess *ret) {
        char text[1024];
        unsigned long long utime, stime, start, btime = 0;
        long long rss;
        FILE *f = fopen("/proc/self/stat", "re");
        if (!f)
                return -errno;
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        const char *p = strrchr(text, ')');
        if (!p || sscanf(p + 2, "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu %*s %*s %*s %*s %*s %*s %llu %*s %lld",
                         &utime, &stime, &start, &rss) != 4)
                return -EIO;
        f = fopen("/proc/stat", "re");
        if (f) {
                char line[256];
                while (fgets(line, sizeof line, f))
                        if (sscanf(line, "btime %llu", &btime) == 1)
                                break;
                fclose(f);
        }
        double tick = (double)sysconf(_SC_CLK_TCK);
        *ret = (WebProcess){
                .resident_bytes = rss > 0 ? (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE) : 0,
                .cpu_seconds = (double)(utime + stime) / tick,
                .start_time_seconds = (double)btime + (double)start / tick,
        };
        return 0;
}

int web_history_push(WebHistory *h, const NodeTraining *t) {
        if (t->step == 0)
                return 0;
        if (h->n > 0 && h->step[web_history_at(h, h->n - 1)] == t->step)
                return 0;
        unsigned i;
        if (h->n < WEB_HISTORY_MAX)
                i = web_history_at(h, h->n++);
        else {
                i = h->first;
                h->first = (h->first + 1) % WEB_HISTORY_MAX;
        }
        h->loss[i] = t->loss >= 0 ? (float)t->loss : NAN;
        h->samples_per_sec[i] = (float)t->samples_per_sec;
        h->step[i] = t->step;
        return 1;
}
