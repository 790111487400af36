/* net/net-internal.h — what the core, the links and the two backends share.
 * Not for use outside net/. */
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include "bufpool.h"
#include "handshake.h"
#include "net.h"
#include "relay.h"

typedef enum LinkState {
        LINK_HANDSHAKE,
        LINK_WAIT_WELCOME, /* initiator: keys derived, the responder's confirmation due */
        LINK_OPEN,
        LINK_CLOSING,      /* I/O being cancelled; freed when nothing is in flight */
} LinkState;

typedef enum RxPhase {
        RX_HEADER,
        RX_PAYLOAD,
        RX_TAG,
} RxPhase;

/* A link of several lanes (connections): the primary's Bundle, which its
 * other lanes point to. Items (tensors, PLAN and CONTROL frames) are
 * numbered in the order the application queued them. A tensor's chunks go
 * to whichever lane is ready to send first (each takes the next chunk when
 * its previous one is out, so a fast lane carries more), a lane's chunks
 * after a TENSOR frame of its own; the receiver delivers items in their
 * order once all their bytes are in. A
 * sender keeps at most NET_LANE_WINDOW items ahead of what its peer said
 * it delivered (ACK), so a receiver holds at most that many. */
#define NET_MAX_LANES NET_LANES_MAX
#define NET_LANE_WINDOW 64

typedef struct LaneSlot {
        bool used, complete;
        uint8_t type;         /* FRAME_TENSOR, FRAME_PLAN, FRAME_CONTROL */
        uint32_t stream;
        TensorDesc desc;      /* tensor */
        uint32_t stripe;      /* tensor: bytes per chunk, as its TENSOR frames said */
        uint64_t got;         /* tensor: bytes in */
        uint64_t begun_ns;    /* tensor: its first TENSOR frame came */
        bool uncounted;       /* tensor: the link is closing; no longer in Net.rx_bytes */
        uint8_t *chunks;      /* tensor: a bit per chunk, set once a DATA frame announced it */
        uint8_t *data;        /* tensor bytes (pool or malloc), or the payload */
        size_t len;           /* PLAN, CONTROL: payload bytes */
} LaneSlot;

typedef struct Bundle {
        unsigned refs;        /* links pointing here */
        unsigned k, attached; /* lanes, and lanes open (and, responder, joined) */
        bool announced;       /* connected() told the application */
        bool ending;          /* a lane said BYE: each other lane ends with its own */
        uint32_t lane[NET_MAX_LANES]; /* link ids; lane[0] the primary */
        uint8_t nonce[HANDSHAKE_NONCE_SIZE]; /* the primary's HELLO nonce: other lanes name it */
        uint8_t peer_id[IDENTITY_PK_SIZE];
        uint64_t tx_seq, tx_acked; /* numbers given; delivered by the peer */
        uint64_t rx_next, rx_acked; /* next to deliver; last number acknowledged */
        LaneSlot slot[NET_LANE_WINDOW];
} Bundle;

/* A tensor sent in parts over several lanes: sent() once all are out. */
typedef struct TxShared {
        uint64_t cookie;
        uint32_t peer;   /* the primary's id, the one the application knows */
        unsigned left;   /* lanes whose item is still queued */
        uint64_t cursor; /* the next chunk no lane has taken */
} TxShared;

/* Something queued to send. */
typedef struct TxItem {
        struct TxItem *next;
        uint8_t type;
        uint32_t stream;
        /* FRAME_TENSOR: the application's data, sent as one TENSOR frame and
         * then DATA frames of at most config.chunk bytes */
        TensorDesc desc;
        const uint8_t *data;
        uint64_t offset; /* of the next DATA chunk */
        bool desc_sent;
        uint64_t cookie;
        /* on a link of several lanes: the item's number (TENSOR, PLAN,
         * CONTROL), and for a tensor this lane's part: chunks of stripe
         * bytes taken from the shared cursor, offset the one being sent */
        bool numbered;
        uint64_t seq;
        uint32_t stripe;
        TxShared *shared;
        uint64_t share;  /* of the bytes counted in the lane's queued, what this item still holds */
        bool claimed;    /* it took a chunk: its TENSOR frame goes */
        /* everything else: the payload, copied */
        size_t len;
        uint8_t payload[];
} TxItem;

typedef struct Link {
        Net *net;
        uint32_t id;
        int fd;
        LinkState state;
        bool initiator, loopback;
        uint8_t addr[16]; /* the peer's IP (v4 mapped into v6), for per-address limits */
        char address[64]; /* the same with its port, as text, for the application's logs */
        Handshake hs;
        Seal seal;
        bool keyed; /* seal is set up: frames from now on are protected */
        uint8_t peer_id[IDENTITY_PK_SIZE];
        int close_reason;
        NetTimeout timeout;   /* which deadline, when close_reason is -ETIMEDOUT */
        uint8_t peer_version; /* the version byte, when it is -EPROTONOSUPPORT */
        bool opened;          /* the handshake finished */
        bool dialing;         /* net_connect()'s TCP connection still on its way: not in the backend yet */
        bool reached;         /* the TCP connection was made (false: dialing failed) */
        bool bye_pending;     /* net_free(): BYE goes out next */
        bool bye_sending;     /* l->iov holds that BYE */
        bool bye_sent;        /* BYE is out and our side shut (net_link_bye_sent()) */
        bool relay_waiting;   /* a connection waiting at the relay: no deadline until its first byte */
        uint8_t relay_op;     /* the relay's preamble to go through first (dialing): WAIT or CONNECT */
        uint8_t relay_got;    /* of relay_in: the relay's hello, then its answer */
        uint8_t relay_in[RELAY_HELLO_SIZE + 1];
        uint8_t relay_key[IDENTITY_PK_SIZE]; /* whom the request names */
        Bundle *bundle;       /* a link of several lanes: shared by them */
        unsigned lane;        /* this connection's index in it */
        bool extra;           /* a lane but the first: never seen by the application */
        bool lane_pending;    /* responder: an extra lane whose LANE frame is due */

        /* receiving */
        RxPhase phase;
        uint8_t hdr[FRAME_HEADER_SIZE];
        FrameHeader h;
        uint8_t *rx_dst; /* where the current piece goes */
        size_t rx_want, rx_have;
        uint8_t tag[FRAME_TAG_SIZE];
        uint8_t *ctl;    /* payloads of non-DATA frames */
        bool rx_records; /* the DATA frame coming is opened as it arrives (seal_open_begin) */
        bool rx_active;  /* a tensor is being received */
        uint8_t rx_small; /* small DATA frames in a row (at most 2): read ahead at 2 */
        uint8_t *ahead;  /* bytes read ahead (link.c: RX_AHEAD), once small frames came */
        size_t ahead_at, ahead_len; /* of them, handled and read */
        bool rx_told;    /* a frame reached the application */
        NetTensor rx;
        uint64_t rx_got;
        uint64_t rx_begun_ns; /* the tensor being received: its TENSOR frame came */
        bool rx_uncounted;    /* the link is closing: its tensor is no longer in Net.rx_bytes */
        LaneSlot *rx_slot; /* a lane's part of a tensor: the slot that owns rx.data */
        uint64_t last_frame_ns, last_bytes_ns, deadline_ns;
        uint64_t last_sent_ns;   /* a whole frame last went out (for heartbeats) */
        uint64_t rx_progress_ns; /* the tensor being received last grew */

        /* sending */
        TxItem *tx_head, *tx_tail;
        TxItem *tx_out, *tx_out_tail; /* built, their callbacks due when the send is out */
        uint64_t queued;
        uint8_t *stage;  /* frames: header, payload (when copied or encrypted), tag */
        size_t stage_cap;
        struct iovec iov[2];
        int iovcnt;
        size_t tx_total, tx_done;
        const uint8_t *tx_src; /* the rest of a frame sealed in records (seal.tx_left bytes) */
        bool tx_ready;   /* iov holds frames (or a record of one) not yet fully sent */
        bool tx_ref;     /* the head item moves on once the send is out, not when built */
        unsigned tx_frames; /* frames in the send */
        bool tx_busy;    /* a send is in flight in the backend */
        unsigned tx_zc_pending; /* zero-copy sends whose buffer the kernel still holds */
        struct msghdr msg;      /* for SENDMSG: the kernel reads it at submission */

        unsigned inflight; /* backend operations outstanding */
        uint32_t slot;
} Link;

typedef struct NetBackend {
        const char *name;
        int (*init)(Net *n);
        void (*fini)(Net *n);
        int (*add_listener)(Net *n, int fd);
        int (*add_link)(Net *n, Link *l);
        void (*kick_send)(Net *n, Link *l);
        /* Stop the link's I/O; net_link_released() once nothing is in flight. */
        void (*close_link)(Net *n, Link *l);
        /* Accepting again after net_accept_pause(). */
        int (*resume_accept)(Net *n);
        int (*wait)(Net *n, int timeout_ms);
} NetBackend;

extern const NetBackend net_backend_uring;
extern const NetBackend net_backend_epoll;

struct Net {
        NetConfig cfg;
        Identity identity;
        uint8_t secret[HANDSHAKE_SECRET_SIZE];
        uint8_t (*allowed)[IDENTITY_PK_SIZE];
        NetCallbacks cb;
        void *userdata;
        const NetBackend *backend;
        void *backend_data;
        BufPool *pool;
        Link **links; /* cfg.max_links slots */
        unsigned n_links;
        uint32_t next_id;
        int listen_fd;
        uint64_t rx_bytes; /* tensors being received, all links */
        unsigned n_dialing; /* links with dialing set */
        uint64_t accept_paused_until; /* ns; 0: accepting */
        /* the link a closed() callback is reporting (id 0: none) */
        uint32_t closing_id;
        NetPeerInfo closing;
        NetStats stats;
        uint32_t relay_waiter;     /* the link waiting at the relay; 0: none */
        uint64_t relay_retry_ns;   /* when to open one again */
        unsigned relay_failures;   /* WAITs in a row that failed: the next waits longer */
        bool relay_tried;          /* a WAIT was tried (opened or not) ... */
        bool relay_registered;     /* ... and got through the relay's preamble */
        /* net_run() visits every slot only now and then, not on every
         * wake-up: with a thousand links that is a scan per message */
        uint64_t timers_ns;        /* deadlines last checked */
        bool closed_pending;       /* a link was closed outside the backend: release it */
};

/* core (net.c), called by the backends */
void net_accept_fd(Net *n, int fd, const struct sockaddr_storage *sa);
/* The open link with that id, or NULL. */
Link *net_link_find(const Net *n, uint32_t id);
/* accept() failed for lack of resources: stop accepting for a while. */
void net_accept_pause(Net *n);
void net_link_close(Link *l, int reason);
void net_link_bye_sent(Link *l);
void net_link_released(Link *l);
uint64_t net_now_ns(void);

/* the protocol of one link (link.c) */
/* hello_flags: HANDSHAKE_LANE* bits for the initiator's HELLO. */
/* An address as 16 bytes (IPv4 mapped into IPv6), and whether two are the
 * same host for connection limits: the same IPv4 address, or the same
 * IPv6 /64 (one host usually holds a whole /64). The relay counts with
 * them too. */
void net_addr_key(const struct sockaddr_storage *sa, uint8_t out[16]);
/* TCP keepalive on fd: a connection that carries nothing for 30 s is
 * probed, and one whose other end is gone without a word (a host switched
 * off, a NAT mapping lost) ends within a minute. */
void net_keepalive(int fd);
bool net_addr_near(const uint8_t a[16], const uint8_t b[16]);

int link_init(Link *l, Net *n, int fd, bool initiator, bool loopback, uint32_t hello_flags);
void link_destroy(Link *l);
/* The tensor being received leaves Net.rx_bytes (the link is closing);
 * its buffer stays until link_destroy(), the backend may still fill it. */
void link_rx_uncount(Link *l);
/* Room for a tensor of need bytes under max_receive_bytes (net.c): 0, or
 * -ENOBUFS. */
int net_rx_room(Net *n, const Link *asker, uint64_t need);
int link_start(Link *l);
/* Where the next received bytes go, and how many are wanted. */
void link_rx_target(Link *l, uint8_t **ret_ptr, size_t *ret_len);
/* n bytes arrived at the target; < 0: close the link with that reason.
 * Bytes read ahead may be left for link_rx_more(), once what the
 * application queued in answer to a frame is on its way. */
int link_rx_done(Link *l, size_t n);
bool link_rx_pending(const Link *l);
int link_rx_more(Link *l);
/* Build the next send into l->iov (a frame, or several small ones), if
 * there is one and none is pending. Returns true when l->iov holds bytes
 * to send. */
bool link_tx_prepare(Link *l);
/* n bytes of the frame went out. */
void link_tx_done(Link *l, size_t n);
int link_queue_control(Link *l, uint8_t type, const void *payload, size_t len);
/* What the application may know of the link. */
void link_describe(const Link *l, NetPeerInfo *ret);
/* Queue a tensor by reference: data stays the application's until sent(). */
int link_queue_tensor(Link *l, uint32_t stream, const TensorDesc *desc, const void *data, uint64_t cookie);
/* Queue an item made elsewhere (a lane's part), bytes counted as queued. */
void link_queue_item(Link *l, TxItem *i, uint64_t bytes);
/* Tell the application about an open link (its connected()). */
void link_announce(Link *l);

/* links of several lanes (lanes.c) */
Bundle *lanes_new(Link *primary, unsigned k, const uint8_t nonce[HANDSHAKE_NONCE_SIZE]);
void lanes_join(Link *l, Bundle *b, unsigned index);
void lanes_unref(Link *l);
void lanes_close(Link *l, int reason);
/* The bundle's tensors being received leave Net.rx_bytes (it is closing). */
void lanes_rx_uncount(Net *n, Bundle *b);
/* Bytes of tensors a bundle is receiving: held, still to come, and when
 * the oldest began. */
void lanes_rx_held(const Bundle *b, uint64_t *ret_held, uint64_t *ret_left, uint64_t *ret_begun_ns);
void lanes_opened(Link *l);
int lanes_accept(Link *l, uint32_t offered, const uint8_t nonce[HANDSHAKE_NONCE_SIZE]);
int lanes_rx_lane(Link *l, const uint8_t *p, size_t len);
int lanes_rx_ack(Link *l, const uint8_t *p, size_t len);
int lanes_rx_item(Link *l, const FrameHeader *h, const uint8_t *payload);
int lanes_rx_part(Link *l, const FrameHeader *h, const uint8_t *p, size_t len);
size_t lanes_rx_chunk(Link *l, const FrameHeader *h);
int lanes_rx_chunk_done(Link *l, const FrameHeader *h);
void lanes_slot_done(Net *n, Bundle *b, LaneSlot *s);
void lanes_deliver(Net *n, Bundle *b);
uint64_t lanes_queued(const Net *n, const Link *l);
int lanes_send_tensor(Net *n, Link *primary, uint32_t stream, const TensorDesc *desc, const void *data,
                      uint64_t cookie);
void lanes_number(Bundle *b, TxItem *i);
bool lanes_may_start(const Link *l, const TxItem *i);
void lanes_part_sent(Net *n, Link *l, TxItem *i);
bool lanes_claim(TxItem *i);
void lanes_chunk_sent(Link *l, TxItem *i, uint64_t len);
