/* net/link-info.c — what the kernel measured on a link's traffic. Apart
 * from net.c: glibc's <netinet/tcp.h> lacks the delivery-rate fields of
 * struct tcp_info, and the two headers cannot be included together. */
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>

#include "net-internal.h"

int net_peer_link_info(const Net *n, uint32_t peer, double *ret_rtt, double *ret_rate, bool *ret_app_limited) {
        Link *l = net_link_find(n, peer);
        struct tcp_info ti = {};
        socklen_t len = sizeof ti;
        if (!l)
                return -ENOTCONN;
        if (getsockopt(l->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
                return -errno;
        *ret_rtt = (double)ti.tcpi_rtt * 1e-6;
        *ret_rate = len >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof ti.tcpi_delivery_rate
                            ? (double)ti.tcpi_delivery_rate
                            : 0;
        *ret_app_limited = ti.tcpi_delivery_rate_app_limited;
        return 0;
}
