/* The bench guest's virtio-vsock driver: stream sockets, one connection at a time, with the
 * spec's credit flow control. vsock_check connects to a host port and echoes through it,
 * then accepts a host program's connection and echoes its data back; virtio_vsock measures
 * 64-byte round trips (mode=rr) or a 4 KiB-packet stream to the host (mode=stream);
 * vsock_round is case=snapshot's round. A transport reset on the event queue (the device was
 * restored from a snapshot) ends the connection waited on and the CID is read again. CPL3. */
#include "virtio.h"

#define HDR 44
#define RX_BUFS 32
#define RX_BUF (HDR + 4096)
#define TX_SLOTS 16
#define TX_DATA 4096
#define BUF_ALLOC (64 * 1024)
#define HOST_CID 2
#define OP_REQUEST 1
#define OP_RESPONSE 2
#define OP_RST 3
#define OP_SHUTDOWN 4
#define OP_RW 5
#define OP_CREDIT_UPDATE 6
#define OP_CREDIT_REQUEST 7
#define EVENT_BUFS 4
#define EVENT_TRANSPORT_RESET 0
/* How often a wait for a packet looks at the event queue. */
#define EVENT_POLL_CYCLES 1000000000UL

struct vsock_hdr {
    u64 src_cid, dst_cid;
    u32 src_port, dst_port, len;
    u16 type, op;
    u32 flags, buf_alloc, fwd_cnt;
} __attribute__((packed));

struct conn {
    u32 local, peer;
    u32 fwd_cnt, tx_cnt;           /* bytes we took from the host, bytes we sent */
    u32 peer_buf_alloc, peer_fwd_cnt;
    int open, peer_shut, reset;
};

static struct virtio_dev vs;
static struct vring vrx, vtx, vev;
static u8 rx_bufs[RX_BUFS][RX_BUF] __attribute__((aligned(4096)));
static u8 ev_bufs[EVENT_BUFS][8] __attribute__((aligned(64)));
static u64 transport_resets;
static u8 tx_bufs[TX_SLOTS][HDR + TX_DATA] __attribute__((aligned(4096)));
static u32 tx_free[TX_SLOTS], tx_nfree;
static u64 guest_cid;
static int use_irq, stream_mode;
static u32 host_port = 1234, next_local = 4000;
static struct conn bench_conn;
static const char *cmdline_seen = "";
/* A connection request that came while another connection was served (a backlog of one). */
static struct vsock_hdr backlog;
static int backlog_full;

static int differs(const u8 *a, const u8 *b, u32 n)
{
    for (u32 i = 0; i < n; i++)
        if (a[i] != b[i])
            return 1;
    return 0;
}

static void rx_post(u16 i)
{
    vrx.desc[i] = (struct vring_desc){(u64)rx_bufs[i], RX_BUF, VRING_DESC_F_WRITE, 0};
    vring_post(&vrx, i);
}

static void ev_post(u16 i)
{
    vev.desc[i] = (struct vring_desc){(u64)ev_bufs[i], sizeof(ev_bufs[i]), VRING_DESC_F_WRITE, 0};
    vring_post(&vev, i);
}

/* Takes the device's events; how many were transport resets (every connection is gone, the
 * CID may have changed: read again). */
static int take_events(void)
{
    struct vring_used_elem e;
    int resets = 0;
    while (vring_take(&vev, &e)) {
        if (e.id >= EVENT_BUFS)
            virtio_fail("virtio_vsock: an event buffer the driver never posted");
        resets += e.len >= 4 && *(volatile u32 *)ev_bufs[e.id] == EVENT_TRANSPORT_RESET;
        ev_post((u16)e.id);
    }
    if (resets) {
        transport_resets += resets;
        guest_cid = (u64)mmio_read32(vs.device_cfg) | (u64)mmio_read32(vs.device_cfg + 4) << 32;
        vring_kick(&vev);
    }
    return resets;
}

static void tx_reap(void)
{
    struct vring_used_elem e;
    while (vring_take(&vtx, &e))
        tx_free[tx_nfree++] = e.id;
}

/* Queues one packet (waiting for a free slot); kicked by the caller or the next wait. */
static void send_pkt(struct conn *c, u16 op, u32 flags, const u8 *data, u32 len)
{
    struct vring_used_elem e;
    tx_reap();
    if (!tx_nfree) {
        vring_kick(&vtx);
        vring_wait(&vtx, use_irq, &e, "virtio_vsock: no transmit completion within seconds");
        tx_free[tx_nfree++] = e.id;
    }
    u32 s = tx_free[--tx_nfree];
    struct vsock_hdr *h = (struct vsock_hdr *)tx_bufs[s];
    *h = (struct vsock_hdr){guest_cid, HOST_CID, c->local, c->peer, len, 1, op, flags, BUF_ALLOC, c->fwd_cnt};
    if (len)
        memcpy(tx_bufs[s] + HDR, data, len);
    vtx.desc[s] = (struct vring_desc){(u64)tx_bufs[s], HDR + len, 0, 0};
    vring_post(&vtx, (u16)s);
    if (op == OP_RW)
        c->tx_cnt += len;
}

static u32 credit(struct conn *c)
{
    u32 in_flight = c->tx_cnt - c->peer_fwd_cnt;
    return in_flight >= c->peer_buf_alloc ? 0 : c->peer_buf_alloc - in_flight;
}

/* Waits for the next packet for `c` (a REQUEST too while `c` is not open); copies a RW
 * payload into `out` (up to `max`); returns the packet's op. Others' packets are dropped. */
static u16 recv_pkt(struct conn *c, u8 *out, u32 max, u32 *got)
{
    struct vring_used_elem e;
    for (;;) {
        vring_kick(&vtx);
        for (u64 start = rdtsc(); !vring_wait_until(&vrx, use_irq, &e, EVENT_POLL_CYCLES);) {
            if (take_events()) {
                c->reset = 1;
                return OP_RST;
            }
            if (rdtsc() - start > VIRTIO_WAIT_CYCLES)
                virtio_fail("virtio_vsock: no packet from the host within seconds");
        }
        if (e.id >= RX_BUFS || e.len < HDR)
            virtio_fail("virtio_vsock: a receive buffer the driver never posted or too short");
        struct vsock_hdr *h = (struct vsock_hdr *)rx_bufs[e.id];
        u16 op = h->op;
        int mine = h->dst_port == c->local && (!c->open || h->src_port == c->peer);
        if (mine) {
            if (!c->open)
                c->peer = h->src_port;
            c->peer_buf_alloc = h->buf_alloc;
            c->peer_fwd_cnt = h->fwd_cnt;
            *got = 0;
            if (op == OP_RW) {
                u32 n = h->len < max ? h->len : max;
                memcpy(out, rx_bufs[e.id] + HDR, n);
                c->fwd_cnt += h->len;
                *got = n;
            }
        }
        if (!mine && op == OP_REQUEST && !backlog_full) {
            backlog = *h;
            backlog_full = 1;
        }
        rx_post((u16)e.id);
        vring_kick(&vrx);
        if (!mine)
            continue;
        if (op == OP_CREDIT_REQUEST) {
            send_pkt(c, OP_CREDIT_UPDATE, 0, 0, 0);
            continue;
        }
        return op;
    }
}

const char *virtio_vsock_setup(const char *cmdline)
{
    cmdline_seen = cmdline;
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_VSOCK);
    if (slot < 0)
        return "no-virtio-vsock";
    const char *why = virtio_open(&vs, (u8)slot);
    if (why)
        return why;
    if ((why = virtio_negotiate(&vs, arg_is(cmdline, "evidx=", "off") ? 0 : VIRTIO_RING_F_EVENT_IDX)))
        return why;
    use_irq = !arg_is(cmdline, "irq=", "poll");
    for (u16 i = 0; use_irq && i < 3; i++)
        virtio_msix(&vs, i, VEC_VIRTIO);
    for (u16 i = 0; i < 3; i++) {
        struct vring *q = i == 0 ? &vrx : i == 1 ? &vtx : &vev;
        if ((why = virtio_queue(&vs, q, i, use_irq ? i : VIRTIO_NO_VECTOR)))
            return why;
    }
    guest_cid = (u64)mmio_read32(vs.device_cfg) | (u64)mmio_read32(vs.device_cfg + 4) << 32;
    for (u16 i = 0; i < RX_BUFS && i < vrx.size; i++)
        rx_post(i);
    for (tx_nfree = 0; tx_nfree < TX_SLOTS && tx_nfree < vtx.size; tx_nfree++)
        tx_free[tx_nfree] = tx_nfree;
    for (u16 i = 0; i < EVENT_BUFS && i < vev.size; i++)
        ev_post(i);
    virtio_driver_ok(&vs);
    vring_kick(&vrx);
    vring_kick(&vev);
    u64 p = parse_u64(find_arg(cmdline, "port="));
    if (p)
        host_port = (u32)p;
    stream_mode = arg_is(cmdline, "mode=", "stream");
    user_rflags = use_irq ? 0x202 : 0x2;
    return 0;
}

/* Opens a connection from a new local port to host port `port`; 0 or why not. */
static const char *vsock_connect(struct conn *c, u32 port)
{
    u32 got;
    *c = (struct conn){.local = next_local++, .peer = port};
    send_pkt(c, OP_REQUEST, 0, 0, 0);
    c->open = 1;
    u16 op = recv_pkt(c, 0, 0, &got);
    if (op != OP_RESPONSE) {
        c->open = 0;
        return op == OP_RST ? "refused" : "unexpected-answer";
    }
    return 0;
}

/* Sends `len` bytes, waiting for credit as needed. */
static void vsock_send(struct conn *c, const u8 *data, u32 len)
{
    u32 got;
    while (len) {
        while (!credit(c)) {
            u16 op = recv_pkt(c, 0, 0, &got);
            if (op == OP_RST || op == OP_SHUTDOWN)
                virtio_fail("virtio_vsock: the host ended the connection while the guest sent");
        }
        u32 n = len < TX_DATA ? len : TX_DATA;
        if (n > credit(c))
            n = credit(c);
        send_pkt(c, OP_RW, 0, data, n);
        data += n;
        len -= n;
    }
    vring_kick(&vtx);
}

/* Receives exactly `len` bytes. */
static void vsock_recv(struct conn *c, u8 *out, u32 len)
{
    u32 got;
    while (len) {
        u16 op = recv_pkt(c, out, len, &got);
        if (op == OP_RST || op == OP_SHUTDOWN)
            virtio_fail("virtio_vsock: the host ended the connection early");
        out += got;
        len -= got;
    }
}

static void vsock_close(struct conn *c)
{
    u32 got;
    send_pkt(c, OP_SHUTDOWN, 3, 0, 0);
    for (u16 op = 0; op != OP_RST;)
        op = recv_pkt(c, 0, 0, &got);
    c->open = 0;
}

u64 loop_virtio_vsock(u64 n)
{
    static u8 data[TX_DATA], back[64];
    struct conn *c = &bench_conn;
    if (!c->open) {
        const char *why = vsock_connect(c, host_port);
        if (why)
            virtio_fail(why);
    }
    if (stream_mode) {
        u32 got;
        for (u64 i = 0; i < n; i++)
            vsock_send(c, data, TX_DATA);
        /* Done when the host has taken every byte. */
        while (c->peer_fwd_cnt != c->tx_cnt) {
            send_pkt(c, OP_CREDIT_REQUEST, 0, 0, 0);
            recv_pkt(c, 0, 0, &got);
        }
        return 0;
    }
    for (u64 i = 0; i < n; i++) {
        vsock_send(c, data, 64);
        vsock_recv(c, back, 64);
    }
    return 0;
}

void report_virtio_vsock(void)
{
    puts_(stream_mode ? " mode=stream bytes=" : " mode=rr bytes=");
    put_u64(bench_conn.tx_cnt);
    puts_(" notifies=");
    put_u64(vtx.notifies);
    puts_(" io_errors=0");
}

/* Connects to host port `port=`, sends a line, reads its echo; then accepts a connection
 * on guest port `listen=` and echoes `n` messages back. */
u64 loop_vsock_check(u64 n)
{
    static u8 buf[256];
    static const u8 hello[] = "hello from the guest";
    struct conn c;
    puts_("EXITLESS VSOCK cid=");
    put_u64(guest_cid);
    puts_("\n");
    const char *why = vsock_connect(&c, host_port);
    if (why)
        virtio_fail(why);
    vsock_send(&c, hello, sizeof(hello) - 1);
    vsock_recv(&c, buf, sizeof(hello) - 1);
    if (differs(buf, hello, sizeof(hello) - 1))
        virtio_fail("virtio_vsock: the echo differs");
    vsock_close(&c);
    puts_("EXITLESS VSOCK connected port=");
    put_u64(host_port);
    puts_(" echoed bytes=");
    put_u64(sizeof(hello) - 1);
    puts_("\n");
    u64 port = parse_u64(find_arg(cmdline_seen, "listen="));
    struct conn l = {.local = port ? (u32)port : 52};
    puts_("EXITLESS VSOCK listening port=");
    put_u64(l.local);
    puts_("\n");
    u32 got;
    if (backlog_full && backlog.dst_port == l.local) {
        backlog_full = 0;
        l.peer = backlog.src_port;
        l.peer_buf_alloc = backlog.buf_alloc;
        l.peer_fwd_cnt = backlog.fwd_cnt;
    } else {
        while (recv_pkt(&l, 0, 0, &got) != OP_REQUEST)
            ;
    }
    l.open = 1;
    send_pkt(&l, OP_RESPONSE, 0, 0, 0);
    vring_kick(&vtx);
    u64 total = 0;
    for (u64 i = 0; i < n; i++) {
        u16 op;
        while ((op = recv_pkt(&l, buf, sizeof(buf), &got)) != OP_RW || !got)
            if (op == OP_RST || op == OP_SHUTDOWN)
                virtio_fail("virtio_vsock: the host program left early");
        vsock_send(&l, buf, got);
        total += got;
    }
    puts_("EXITLESS VSOCK accepted port=");
    put_u64(l.local);
    puts_(" echoed bytes=");
    put_u64(total);
    puts_("\n");
    vsock_close(&l);
    return 0;
}

int vsock_round(u32 port, const u8 *msg, u32 len)
{
    static u8 back[64];
    struct conn c;
    u32 got;
    if (len > sizeof(back))
        len = sizeof(back);
    take_events();
    const char *why = vsock_connect(&c, port);
    if (why && !c.reset)
        virtio_fail(why);
    if (why)
        return 0;
    send_pkt(&c, OP_RW, 0, msg, len);
    vring_kick(&vtx);
    for (u32 have = 0; have < len; have += got) {
        u16 op = recv_pkt(&c, back + have, len - have, &got);
        if (op == OP_RST || op == OP_SHUTDOWN)
            return 0;
    }
    if (differs(back, msg, len))
        virtio_fail("virtio_vsock: the echo differs");
    vsock_close(&c);
    return 1;
}

u64 vsock_guest_cid(void) { return guest_cid; }

u64 vsock_transport_resets(void) { return transport_resets; }
