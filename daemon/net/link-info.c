/* net/link-info.c — what the kernel measured on a link's traffic. Apart
 * from net.c: glibc's <netinet/tcp.h> lacks the delivery-rate fields of
 * struct tcp_info, and the two headers cannot be included together. */
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>

#include "net-internal.h"

static int lane_info(const Link *l, double *ret_rtt, double *ret_rate, bool *ret_app_limited) {
        struct tcp_info ti = {};
        socklen_t len = sizeof ti;
        if (getsockopt(l->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
                return -errno;
        *ret_rtt = (double)ti.tcpi_rtt * 1e-6;
        *ret_rate = len >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof ti.tcpi_delivery_rate
                            ? (double)ti.tcpi_delivery_rate
                            : 0;
        *ret_app_limited = ti.tcpi_delivery_rate_app_limited;
        return 0;
}

/* A link of several connections: the slowest round trip, the rates summed
 * (app-limited if any lane was). */
int net_peer_link_info(const Net *n, uint32_t peer, double *ret_rtt, double *ret_rate, bool *ret_app_limited) {
        Link *l = net_link_find(n, peer);
        if (!l)
                return -ENOTCONN;
        int r = lane_info(l, ret_rtt, ret_rate, ret_app_limited);
        for (unsigned i = 1; r >= 0 && l->bundle && l->lane == 0 && i < l->bundle->k; i++) {
                Link *o = net_link_find(n, l->bundle->lane[i]);
                double rtt, rate;
                bool limited;
                if (!o || lane_info(o, &rtt, &rate, &limited) < 0)
                        continue;
                *ret_rtt = rtt > *ret_rtt ? rtt : *ret_rtt;
                *ret_rate += rate;
                *ret_app_limited |= limited;
        }
        return r;
}
