/* nfq-delay — delay every packet of a netfilter queue by a fixed time.
 *
 * This kernel has no netem; the fault tests make latency with this
 * instead: an iptables rule sends a namespace's incoming packets to queue
 * N (-j NFQUEUE --queue-num N --queue-bypass) and this program lets each
 * one go DELAY_MS after it arrived, in arrival order. Delay the receiving
 * side: holding a sender's own packets throttles TCP far more than a real
 * path would. With --queue-bypass, packets pass undelayed once it exits.
 *
 *     ip netns exec NS iptables -t mangle -A PREROUTING -p tcp -j NFQUEUE --queue-num 0 --queue-bypass
 *     ip netns exec NS nfq-delay 0 20 &
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING (1u << 20) /* packets held at once */

static struct {
        uint32_t id;
        uint64_t due_ns;
} ring[RING];
static size_t head, tail; /* held: [head, tail) */
static uint64_t delay_ns, dropped;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data) {
        struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
        (void)msg, (void)data;
        if (!ph)
                return 0;
        uint32_t id = ntohl(ph->packet_id);
        if (tail - head == RING) { /* full: let it go at once rather than lose it */
                dropped++;
                return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
        }
        ring[tail % RING].id = id;
        ring[tail % RING].due_ns = now_ns() + delay_ns;
        tail++;
        return 0;
}

static void release_due(struct nfq_q_handle *qh) {
        uint64_t now = now_ns();
        while (head < tail && ring[head % RING].due_ns <= now) {
                nfq_set_verdict(qh, ring[head % RING].id, NF_ACCEPT, 0, NULL);
                head++;
        }
}

static void on_stop(int sig) {
        (void)sig;
        stop = 1;
}

int main(int argc, char *argv[]) {
        if (argc != 3 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
                fprintf(argc == 2 ? stdout : stderr, "Usage: nfq-delay QUEUE DELAY_MS\n"
                        "Delay every packet of netfilter queue QUEUE by DELAY_MS milliseconds.\n");
                return argc == 2 ? 0 : 64;
        }
        int queue = atoi(argv[1]);
        double ms = atof(argv[2]);
        if (queue < 0 || queue > 65535 || !(ms >= 0 && ms <= 10000)) {
                fprintf(stderr, "nfq-delay: QUEUE is 0..65535, DELAY_MS 0..10000\n");
                return 64;
        }
        delay_ns = (uint64_t)(ms * 1e6);
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);

        struct nfq_handle *h = nfq_open();
        if (!h) {
                perror("nfq-delay: nfq_open");
                return 1;
        }
        nfq_unbind_pf(h, AF_INET);
        struct nfq_q_handle *qh = NULL;
        if (nfq_bind_pf(h, AF_INET) < 0 || !(qh = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL)) ||
            nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
                perror("nfq-delay: queue");
                return 1;
        }
        nfq_set_queue_maxlen(qh, 65536);
        int fd = nfq_fd(h), big = 8 << 20;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
        static char buf[65536] __attribute__((aligned));
        while (!stop) {
                int timeout = -1;
                if (head < tail) {
                        uint64_t now = now_ns(), due = ring[head % RING].due_ns;
                        timeout = due > now ? (int)((due - now + 999999) / 1000000) : 0;
                }
                struct pollfd p = { .fd = fd, .events = POLLIN };
                if (poll(&p, 1, timeout) > 0) {
                        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                        if (n > 0)
                                nfq_handle_packet(h, buf, (int)n);
                        else if (n < 0 && errno == ENOBUFS)
                                dropped++; /* the kernel's queue overflowed: those packets were dropped */
                }
                release_due(qh);
        }
        /* let everything held go before the queue disappears */
        for (; head < tail; head++)
                nfq_set_verdict(qh, ring[head % RING].id, NF_ACCEPT, 0, NULL);
        nfq_destroy_queue(qh);
        nfq_close(h);
        if (dropped)
                fprintf(stderr, "nfq-delay: %llu packets not delayed (the queue was full)\n", (unsigned long long)dropped);
        return 0;
}
