/* The bench guest's virtio-net driver: one receive and one transmit queue, frames of the
 * local experimental ethertype 0x88b5. virtio_net sends frames as fast as the device takes
 * them (measured); net_check sends one frame, then echoes the host's frames back;
 * net_round_trip is case=snapshot's round (a frame out, the host's echo back). CPL3. */
#include "virtio.h"

#define VIRTIO_NET_F_MAC (1UL << 5)
#define NET_HDR 12
#define ETH_HDR 14
#define ETHERTYPE_EXITLESS 0x88b5
#define RX_BUFS 64
#define BUF_LEN 2048
#define MAX_TX_QD 32

static struct virtio_dev net;
static struct vring rxq, txq;
static u8 rx_bufs[RX_BUFS][BUF_LEN] __attribute__((aligned(4096)));
static u8 tx_bufs[MAX_TX_QD][BUF_LEN] __attribute__((aligned(4096)));
static u8 mac[6];
static int use_irq;
static u32 tx_qd = 1, frame_len = 64;
static u64 other_frames;
static int rx_mode;
static u64 rx_bytes;

static void rx_post(u16 i)
{
    rxq.desc[i] = (struct vring_desc){(u64)rx_bufs[i], BUF_LEN, VRING_DESC_F_WRITE, 0};
    vring_post(&rxq, i);
}

/* Fills tx slot s with a frame of `len` bytes (after the zeroed virtio-net header) to
 * `dst`, carrying `payload` (padded with zeros). */
static void tx_fill(u32 s, const u8 *dst, const u8 *payload, u32 payload_len, u32 len)
{
    u8 *b = tx_bufs[s];
    memset(b, 0, NET_HDR + len);
    u8 *f = b + NET_HDR;
    memcpy(f, dst, 6);
    memcpy(f + 6, mac, 6);
    f[12] = ETHERTYPE_EXITLESS >> 8;
    f[13] = ETHERTYPE_EXITLESS & 0xff;
    if (payload_len > len - ETH_HDR)
        payload_len = len - ETH_HDR;
    memcpy(f + ETH_HDR, payload, payload_len);
    txq.desc[s] = (struct vring_desc){(u64)b, NET_HDR + len, 0, 0};
}

const char *virtio_net_setup(const char *cmdline)
{
    int slot = pci_find(PCI_VENDOR_VIRTIO, PCI_DEVICE_VIRTIO_NET);
    if (slot < 0)
        return "no-virtio-net";
    const char *why = virtio_open(&net, (u8)slot);
    if (why)
        return why;
    u64 wanted = VIRTIO_NET_F_MAC;
    if (!arg_is(cmdline, "evidx=", "off"))
        wanted |= VIRTIO_RING_F_EVENT_IDX;
    if ((why = virtio_negotiate(&net, wanted)))
        return why;
    use_irq = !arg_is(cmdline, "irq=", "poll");
    if (use_irq) {
        virtio_msix(&net, 0, VEC_VIRTIO);
        virtio_msix(&net, 1, VEC_VIRTIO);
    }
    if ((why = virtio_queue(&net, &rxq, 0, use_irq ? 0 : VIRTIO_NO_VECTOR)))
        return why;
    if ((why = virtio_queue(&net, &txq, 1, use_irq ? 1 : VIRTIO_NO_VECTOR)))
        return why;
    if (!(net.features & VIRTIO_NET_F_MAC))
        return "no-mac";
    for (int i = 0; i < 6; i++)
        mac[i] = mmio_read8(net.device_cfg + (u64)i);
    for (u16 i = 0; i < RX_BUFS && i < rxq.size; i++)
        rx_post(i);
    virtio_driver_ok(&net);
    vring_kick(&rxq);
    u64 v = parse_u64(find_arg(cmdline, "qd="));
    tx_qd = v ? (u32)v : 1;
    if (tx_qd > MAX_TX_QD)
        tx_qd = MAX_TX_QD;
    if (tx_qd > txq.size)
        tx_qd = txq.size;
    v = parse_u64(find_arg(cmdline, "frame="));
    frame_len = v < 60 ? 60 : v > 1514 ? 1514 : (u32)v;
    rx_mode = arg_is(cmdline, "dir=", "rx");
    user_rflags = use_irq ? 0x202 : 0x2;
    return 0;
}

static const u8 broadcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

/* n frames received (the host floods the tap); buffers go back a batch at a time. */
static u64 loop_virtio_net_rx(u64 n)
{
    struct vring_used_elem e;
    for (u64 got = 0; got < n;) {
        vring_wait(&rxq, use_irq, &e, "virtio_net: no frame from the host within seconds");
        do {
            if (e.id >= RX_BUFS)
                virtio_fail("virtio_net: the device returned a buffer the driver never posted");
            rx_bytes += e.len - NET_HDR;
            rx_post((u16)e.id);
            got++;
        } while (got < n && vring_take(&rxq, &e));
        vring_kick(&rxq);
    }
    return 0;
}

/* n frames of frame_len bytes, at most tx_qd queued at once (or received, with dir=rx). */
u64 loop_virtio_net(u64 n)
{
    if (rx_mode)
        return loop_virtio_net_rx(n);
    static const u8 payload[] = "exitless bench frame";
    u32 free_slots[MAX_TX_QD], nfree = 0;
    for (u32 s = 0; s < tx_qd; s++) {
        tx_fill(s, broadcast, payload, sizeof(payload), frame_len);
        free_slots[nfree++] = s;
    }
    struct vring_used_elem e;
    for (u64 posted = 0, done = 0; done < n;) {
        while (posted < n && nfree) {
            vring_post(&txq, (u16)free_slots[--nfree]);
            posted++;
        }
        vring_kick(&txq);
        vring_wait(&txq, use_irq, &e, "virtio_net: no transmit completion within seconds");
        for (done++, free_slots[nfree++] = e.id; vring_take(&txq, &e); done++)
            free_slots[nfree++] = e.id;
    }
    return 0;
}

void report_virtio_net(void)
{
    if (rx_mode) {
        puts_(" dir=rx bytes=");
        put_u64(rx_bytes);
    }
    puts_(" qd=");
    put_u64(tx_qd);
    puts_(" frame=");
    put_u64(frame_len);
    puts_(" notifies=");
    put_u64(txq.notifies);
    puts_(" io_errors=0");
}

static void put_mac(const u8 *m)
{
    static const char hex[] = "0123456789abcdef";
    char s[18];
    for (int i = 0; i < 6; i++) {
        s[3 * i] = hex[m[i] >> 4];
        s[3 * i + 1] = hex[m[i] & 15];
        s[3 * i + 2] = i < 5 ? ':' : 0;
    }
    puts_(s);
}

static void send_one(const u8 *dst, const u8 *payload, u32 payload_len, u32 len)
{
    struct vring_used_elem e;
    tx_fill(0, dst, payload, payload_len, len);
    vring_post(&txq, 0);
    vring_kick(&txq);
    vring_wait(&txq, use_irq, &e, "virtio_net: the frame was never sent");
}

/* The next frame of ethertype 0x88b5 (others are counted and given back); its buffer. */
static u8 *recv_exitless(u32 *len, u16 *buf)
{
    struct vring_used_elem e;
    for (;;) {
        vring_wait(&rxq, use_irq, &e, "virtio_net: no frame from the host within seconds");
        if (e.id >= RX_BUFS)
            virtio_fail("virtio_net: the device returned a buffer the driver never posted");
        u8 *f = rx_bufs[e.id] + NET_HDR;
        if (e.len >= NET_HDR + ETH_HDR && f[12] == (ETHERTYPE_EXITLESS >> 8) &&
            f[13] == (ETHERTYPE_EXITLESS & 0xff)) {
            *len = e.len - NET_HDR;
            *buf = (u16)e.id;
            return f;
        }
        other_frames++;
        rx_post((u16)e.id);
        vring_kick(&rxq);
    }
}

/* Sends "exitless guest frame" to everyone, then echoes n frames back to their sender. */
u64 loop_net_check(u64 n)
{
    static const u8 hello[] = "exitless guest frame";
    puts_("EXITLESS NET mac=");
    put_mac(mac);
    puts_("\n");
    send_one(broadcast, hello, sizeof(hello) - 1, 60);
    puts_("EXITLESS NET sent bytes=60\n");
    for (u64 i = 0; i < n; i++) {
        u32 len;
        u16 buf;
        u8 *f = recv_exitless(&len, &buf);
        if (len > 1514)
            virtio_fail("virtio_net: a frame longer than 1514 bytes without offloads");
        u8 from[6];
        memcpy(from, f + 6, 6);
        send_one(from, f + ETH_HDR, len - ETH_HDR, len < 60 ? 60 : len);
        rx_post(buf);
        vring_kick(&rxq);
        puts_("EXITLESS NET echoed bytes=");
        put_u64(len);
        puts_(" to=");
        put_mac(from);
        puts_("\n");
    }
    puts_("EXITLESS NET other_frames=");
    put_u64(other_frames);
    puts_("\n");
    return 0;
}

/* Writes `v` in decimal at `p`; the digits' count. */
static u32 put_dec(u8 *p, u64 v)
{
    u8 d[20];
    u32 n = 0;
    do
        d[n++] = (u8)('0' + v % 10);
    while (v /= 10);
    for (u32 i = 0; i < n; i++)
        p[i] = d[n - 1 - i];
    return n;
}

static int same(const u8 *a, const u8 *b, u32 n)
{
    for (u32 i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

#define NET_TRY_CYCLES 2500000000UL /* about a second */
#define NET_TRIES 8

/* case=snapshot's round `n`: sends "exitless round <n> try <k>" to everyone and waits about a
 * second for the host's echo of that very payload; again, up to NET_TRIES times (a frame in
 * flight when the VM was snapshotted is lost). The tries it took, or 0. */
u64 net_round_trip(u64 n)
{
    static const u8 round[] = "exitless round ", try_[] = " try ";
    u8 payload[48];
    struct vring_used_elem e;
    for (u64 k = 1; k <= NET_TRIES; k++) {
        u32 len = sizeof(round) - 1;
        memcpy(payload, round, len);
        len += put_dec(payload + len, n);
        memcpy(payload + len, try_, sizeof(try_) - 1);
        len += sizeof(try_) - 1;
        len += put_dec(payload + len, k);
        send_one(broadcast, payload, len, 60);
        for (u64 start = rdtsc(); rdtsc() - start < NET_TRY_CYCLES;) {
            if (!vring_wait_until(&rxq, use_irq, &e, NET_TRY_CYCLES))
                break;
            if (e.id >= RX_BUFS)
                virtio_fail("virtio_net: the device returned a buffer the driver never posted");
            u8 *f = rx_bufs[e.id] + NET_HDR;
            int echo = e.len >= NET_HDR + ETH_HDR + len && f[12] == (ETHERTYPE_EXITLESS >> 8) &&
                       f[13] == (ETHERTYPE_EXITLESS & 0xff) && same(f + ETH_HDR, payload, len);
            other_frames += !echo;
            rx_post((u16)e.id);
            vring_kick(&rxq);
            if (echo)
                return k;
        }
    }
    return 0;
}
