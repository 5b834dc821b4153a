/* cfleet fleet: N vehicles over K forked processes, each process one epoll loop.
 *
 * Strategy:
 * - The supervisor (the process started) forks K vehicle processes, each owning a contiguous range of
 *   vehicles, so that no process needs more descriptors than RLIMIT_NOFILE allows. Statistics live in a
 *   MAP_SHARED block (one struct pstats per process, written by that process only); the supervisor
 *   polls it every 10 ms for the goal, the progress lines and the ready line, and sets `stop`.
 * - A vehicle: non-blocking connect, then CONNECT + SUBSCRIBE agent/<VIN>/proxy/request/+ (QoS 1) in
 *   one write (MQTT-3.1.4: a client may send before CONNACK), written at once when the loopback
 *   handshake has already completed (it usually has when connect() returns), else on EPOLLOUT. SUBACK
 *   -> PUBLISH ecp/<VIN>/online QoS 0. Every QoS 1 PUBLISH is PUBACKed (DUP or not); all PUBACKs one
 *   read produced leave in one write.
 * - Level-triggered epoll and one read per event: a read that does not fill the buffer drained the
 *   socket, so no extra read to collect EAGAIN. Bytes of an incomplete packet are kept per vehicle
 *   (allocated only then); complete packets are parsed straight from the shared read buffer.
 * - Unique deliveries: a process-wide open-addressing set of 64-bit keys (FNV-1a of the topic mixed
 *   with the vehicle index): duplicates are receipts of a (vehicle, topic) already seen.
 * - Connects are paced by a token bucket (--connect-rate over the fleet, split evenly) and bounded by
 *   --concurrency handshakes in flight per process; failures retry with a jittered exponential backoff.
 * - Source addresses: a fleet of more than --per-address (5,000) vehicles binds vehicle i to
 *   127.2.<k / 254>.<1 + k % 254>, k = i / per-address (IP_BIND_ADDRESS_NO_PORT: the port is still picked
 *   at connect time). Linux gives connect() the even half of the ephemeral range first (~14,000 ports
 *   here); past that many connections from one address to one destination, every connect() scans that
 *   half: 19,000 vehicles against Mosquitto cost 404 us of fleet CPU per connect and ran at 1,825/s
 *   from 127.0.0.1, 33 us and 10,933/s from 127.2.0.1-4. Binding costs ~1.8 us per connect.
 * - CPU (getrusage of the process): until all its vehicles were subscribed once (connect phase), from
 *   then to the stop (run phase: deliveries, heartbeats, keepalive), then the teardown (DISCONNECT).
 */
#include "cfleet.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#define RBUF 65536
#define FD_MARGIN 64            /* descriptors a vehicle process needs besides its sockets */
#define MAX_PACKET (16u << 20)
#define SUB_PACKET_ID 1

enum { V_IDLE, V_TCP, V_CONNACK, V_SUBACK, V_SUBSCRIBED, V_CLOSING };

struct vehicle {
    int fd;
    uint8_t state;
    uint8_t attempts;
    uint8_t ever;       /* reached SUBSCRIBED once */
    uint8_t epout;      /* EPOLLOUT registered */
    uint16_t vin_len;
    uint16_t prefix_len; /* delivery prefix including the trailing '/' */
    uint32_t inlen, incap, outlen, outcap;
    uint8_t *in, *out;
    const char *vin;
    const char *prefix;
    int64_t start_ns, start_us;
    int64_t last_tx_ns;
};

struct retry {
    int64_t due_ns;
    uint32_t idx;
};

struct fleet {
    const struct options *o;
    struct pstats *st;
    volatile int *stop;
    long first, n;
    struct vehicle *v;
    int ep;
    uint32_t addr_be;
    int use_src;
    /* connects */
    long cursor;
    long inflight;
    double rate, tokens;
    int64_t tokens_ns;
    struct retry *heap;
    long heap_len, heap_cap;
    /* heartbeats */
    double hb_tokens;
    int64_t hb_ns;
    long hb_cursor;
    /* unique set */
    uint64_t *set;
    size_t set_cap, set_len;
    /* buffers */
    uint8_t *rbuf;
    uint8_t *obuf;
    size_t ocap, olen;
    int64_t now_us; /* wall clock of the current read */
    uint64_t rng;
    struct cpu cpu_at_connect_done;
};

/* ---------------------------------------------------------------- small helpers */

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q && n)
        die("out of memory (%zu bytes)", n);
    return q;
}

static void ensure(uint8_t **buf, uint32_t *cap, size_t need) {
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    *buf = xrealloc(*buf, c);
    *cap = (uint32_t)c;
}

static void note_error(struct fleet *f, const char *what, const struct vehicle *v, int err) {
    if (f->st->first_error[0])
        return;
    snprintf(f->st->first_error, sizeof f->st->first_error, "%s (%s)%s%s", what, v->vin, err ? ": " : "",
             err ? strerror(err) : "");
}

/* ---------------------------------------------------------------- unique set */

static uint64_t topic_key(const uint8_t *t, size_t n, long idx) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ t[i]) * 0x100000001b3ULL;
    h ^= (uint64_t)(idx + 1) * 0x9E3779B97F4A7C15ULL;
    return h ? h : 1;
}

static void set_grow(struct fleet *f);

/* Returns 1 when the key is new (inserted), 0 when it was there. */
static int set_insert(struct fleet *f, uint64_t key) {
    if ((f->set_len + 1) * 10 > f->set_cap * 7)
        set_grow(f);
    size_t mask = f->set_cap - 1, i = (size_t)((key * 0xff51afd7ed558ccdULL) >> 17) & mask;
    while (f->set[i]) {
        if (f->set[i] == key)
            return 0;
        i = (i + 1) & mask;
    }
    f->set[i] = key;
    f->set_len++;
    return 1;
}

static void set_grow(struct fleet *f) {
    uint64_t *old = f->set;
    size_t old_cap = f->set_cap;
    f->set_cap = old_cap ? old_cap * 2 : 1024;
    f->set = calloc(f->set_cap, sizeof *f->set);
    if (!f->set)
        die("out of memory (unique set of %zu)", f->set_cap);
    f->set_len = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            set_insert(f, old[i]);
    free(old);
}

/* ---------------------------------------------------------------- retry heap */

static void heap_push(struct fleet *f, int64_t due, uint32_t idx) {
    if (f->heap_len == f->heap_cap) {
        f->heap_cap = f->heap_cap ? f->heap_cap * 2 : 256;
        f->heap = xrealloc(f->heap, (size_t)f->heap_cap * sizeof *f->heap);
    }
    long i = f->heap_len++;
    while (i > 0 && f->heap[(i - 1) / 2].due_ns > due) {
        f->heap[i] = f->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    f->heap[i] = (struct retry){due, idx};
}

static uint32_t heap_pop(struct fleet *f) {
    uint32_t top = f->heap[0].idx;
    struct retry last = f->heap[--f->heap_len];
    long i = 0;
    for (;;) {
        long c = 2 * i + 1;
        if (c >= f->heap_len)
            break;
        if (c + 1 < f->heap_len && f->heap[c + 1].due_ns < f->heap[c].due_ns)
            c++;
        if (f->heap[c].due_ns >= last.due_ns)
            break;
        f->heap[i] = f->heap[c];
        i = c;
    }
    if (f->heap_len)
        f->heap[i] = last;
    return top;
}

/* ---------------------------------------------------------------- connection state */

static void set_events(struct fleet *f, struct vehicle *v, int out) {
    if (v->epout == out)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.u32 = (uint32_t)(v - f->v)};
    epoll_ctl(f->ep, EPOLL_CTL_MOD, v->fd, &ev);
    v->epout = (uint8_t)out;
}

static int64_t backoff_ns(struct fleet *f, int attempts) {
    int e = attempts < 7 ? attempts : 7;
    double base = 0.1 * (double)(1 << (e > 0 ? e - 1 : 0));
    if (base > 5.0)
        base = 5.0;
    double jitter = 0.5 + 0.5 * (double)(xorshift(&f->rng) >> 11) / (double)(1ULL << 53);
    return (int64_t)(base * jitter * 1e9);
}

/* The connection of v ended (error, server close, timeout): count it by phase and schedule a retry. */
static void lose(struct fleet *f, struct vehicle *v, const char *why, int err) {
    struct pstats *st = f->st;
    if (v->fd >= 0) {
        close(v->fd); /* also leaves the epoll set */
        v->fd = -1;
    }
    switch (v->state) {
    case V_TCP:
    case V_CONNACK:
        f->inflight--;
        BUMP(st->connect_errors, 1);
        if (err == ECONNREFUSED)
            BUMP(st->refused, 1);
        else if (err == ECONNRESET || err == EPIPE)
            BUMP(st->resets, 1);
        note_error(f, why, v, err);
        break;
    case V_SUBACK:
        f->inflight--;
        BUMP(st->connect_errors, 1);
        BUMP(st->connected_now, (uint64_t)-1);
        note_error(f, why, v, err);
        break;
    case V_SUBSCRIBED:
        BUMP(st->connected_now, (uint64_t)-1);
        BUMP(st->subscribed_now, (uint64_t)-1);
        BUMP(st->losses, 1);
        note_error(f, why, v, err);
        break;
    default:
        break;
    }
    v->state = V_IDLE;
    v->inlen = v->outlen = 0;
    v->epout = 0;
    if (v->attempts < 255)
        v->attempts++;
    if (!*f->stop)
        heap_push(f, mono_ns() + backoff_ns(f, v->attempts), (uint32_t)(v - f->v));
}

/* Write (or queue behind what is already queued). Returns -1 when the connection was lost. */
static int conn_write(struct fleet *f, struct vehicle *v, const uint8_t *data, size_t len) {
    if (v->outlen) {
        ensure(&v->out, &v->outcap, v->outlen + len);
        memcpy(v->out + v->outlen, data, len);
        v->outlen += (uint32_t)len;
        return 0;
    }
    ssize_t n = send(v->fd, data, len, MSG_NOSIGNAL);
    if (n == (ssize_t)len) {
        v->last_tx_ns = mono_ns();
        return 0;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            lose(f, v, "write failed", errno);
            return -1;
        }
        n = 0;
    }
    ensure(&v->out, &v->outcap, len - (size_t)n);
    memcpy(v->out, data + n, len - (size_t)n);
    v->outlen = (uint32_t)(len - (size_t)n);
    set_events(f, v, 1);
    return 0;
}

/* CONNECT + SUBSCRIBE in one write, once the TCP connection is up. */
static void send_handshake(struct fleet *f, struct vehicle *v) {
    uint8_t buf[512 + 2 * MAX_TOPIC];
    size_t n = encode_connect(buf, v->vin, f->o->clean, f->o->keepalive, f->o->username, f->o->password);
    char filter[MAX_TOPIC + 2];
    memcpy(filter, v->prefix, v->prefix_len);
    filter[v->prefix_len] = '+';
    n += encode_subscribe(buf + n, SUB_PACKET_ID, filter, v->prefix_len + 1u, 1);
    ssize_t w = send(v->fd, buf, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTCONN)) {
        set_events(f, v, 1); /* not connected yet: EPOLLOUT says when */
        return;
    }
    if (w < 0) {
        lose(f, v, "connect failed", errno);
        return;
    }
    v->state = V_CONNACK;
    v->last_tx_ns = mono_ns();
    if ((size_t)w < n) {
        ensure(&v->out, &v->outcap, n - (size_t)w);
        memcpy(v->out, buf + w, n - (size_t)w);
        v->outlen = (uint32_t)(n - (size_t)w);
        set_events(f, v, 1);
    } else {
        set_events(f, v, 0);
    }
}

static void start_connect(struct fleet *f, uint32_t idx) {
    struct vehicle *v = &f->v[idx];
    const struct options *o = f->o;
    long g = f->first + idx;
    v->start_ns = mono_ns();
    v->start_us = real_us();
    if (!f->st->first_connect_us)
        STORE(f->st->first_connect_us, v->start_us);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    v->state = V_TCP;
    f->inflight++;
    if (fd < 0) {
        lose(f, v, "socket() failed", errno);
        return;
    }
    v->fd = fd;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (f->use_src) {
        long k = g / o->per_address;
        struct sockaddr_in src = {.sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl((127u << 24) | (2u << 16) |
                                                           (uint32_t)((k / 254) << 8) | (uint32_t)(1 + k % 254))};
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
            lose(f, v, "bind failed", errno);
            return;
        }
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->ports[g % o->nports]),
                             .sin_addr.s_addr = f->addr_be};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        lose(f, v, "connect failed", errno);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = idx};
    if (epoll_ctl(f->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        lose(f, v, "epoll_ctl failed", errno);
        return;
    }
    v->epout = 0;
    send_handshake(f, v);
}

static void start_connects(struct fleet *f, int64_t now) {
    if (*f->stop)
        return;
    if (f->rate > 0) {
        f->tokens += (double)(now - f->tokens_ns) * f->rate / 1e9;
        double burst = f->rate * 0.01 > 1.0 ? f->rate * 0.01 : 1.0;
        if (f->tokens > burst)
            f->tokens = burst;
        f->tokens_ns = now;
    }
    for (int started = 0; started < 4096 && f->inflight < f->o->concurrency; started++) {
        if (f->rate > 0 && f->tokens < 1.0)
            break;
        uint32_t idx;
        if (f->heap_len && f->heap[0].due_ns <= now)
            idx = heap_pop(f);
        else if (f->cursor < f->n)
            idx = (uint32_t)f->cursor++;
        else
            break;
        if (f->rate > 0)
            f->tokens -= 1.0;
        start_connect(f, idx);
    }
}

/* ---------------------------------------------------------------- packets */

static void append(struct fleet *f, const uint8_t *p, size_t n) {
    memcpy(f->obuf + f->olen, p, n);
    f->olen += n;
}

static void publish_status(struct fleet *f, struct vehicle *v, const char *kind, int queue) {
    char topic[MAX_TOPIC];
    int tl = snprintf(topic, sizeof topic, "ecp/%s/%s", v->vin, kind);
    uint8_t pkt[MAX_TOPIC + 16];
    size_t n = encode_publish_head(pkt, topic, (size_t)tl, 0, 0, 0);
    if (queue)
        append(f, pkt, n);
    else
        conn_write(f, v, pkt, n);
}

static void connect_phase_check(struct fleet *f) {
    if (!f->st->connect_phase_done && LOAD(f->st->ever_subscribed) == (uint64_t)f->n) {
        f->cpu_at_connect_done = cpu_self();
        f->st->cpu_connect = f->cpu_at_connect_done;
        STORE(f->st->connect_phase_done, 1);
    }
}

/* Returns -1 when the packet closed the connection. */
static int on_publish(struct fleet *f, struct vehicle *v, uint8_t h, const uint8_t *b, size_t rl) {
    struct pstats *st = f->st;
    int qos = (h >> 1) & 3;
    if (qos == 3 || rl < 2)
        goto bad;
    size_t tlen = ((size_t)b[0] << 8) | b[1];
    size_t head = 2 + tlen + (qos ? 2 : 0);
    if (head > rl)
        goto bad;
    const uint8_t *topic = b + 2;
    BUMP(st->deliveries, 1);
    if (h & 0x08)
        BUMP(st->dup_flag, 1);
    if (!(tlen > v->prefix_len && memcmp(topic, v->prefix, v->prefix_len) == 0 &&
          memchr(topic + v->prefix_len, '/', tlen - v->prefix_len) == NULL))
        BUMP(st->wrong_topic, 1);
    if (set_insert(f, topic_key(topic, tlen, v - f->v))) {
        BUMP(st->unique, 1);
        if (!st->first_delivery_us)
            STORE(st->first_delivery_us, f->now_us);
        STORE(st->last_delivery_us, f->now_us);
        int64_t sent = stamp_time_us(b + head, rl - head);
        if (sent >= 0)
            hist_add(&st->delivery_us, (uint64_t)(f->now_us > sent ? f->now_us - sent : 0));
    } else {
        BUMP(st->duplicates, 1);
    }
    if (qos) {
        uint8_t ack[4] = {(uint8_t)((qos == 1 ? MQTT_PUBACK : MQTT_PUBREC) << 4), 2, b[2 + tlen], b[3 + tlen]};
        append(f, ack, 4);
        if (qos == 1)
            BUMP(st->pubacks, 1);
        else
            BUMP(st->qos2, 1);
    }
    return 0;
bad:
    BUMP(st->protocol_errors, 1);
    lose(f, v, "malformed PUBLISH", 0);
    return -1;
}

/* Parse the complete packets in data; returns the bytes consumed, -1 when the connection was closed. */
static long parse(struct fleet *f, struct vehicle *v, const uint8_t *data, size_t len) {
    struct pstats *st = f->st;
    size_t off = 0;
    while (len - off >= 2) {
        uint8_t h = data[off];
        size_t rl;
        int hb = get_varint(data + off + 1, len - off - 1, &rl);
        if (hb == 0)
            break;
        if (hb < 0 || rl > MAX_PACKET) {
            BUMP(st->protocol_errors, 1);
            lose(f, v, "malformed remaining length", 0);
            return -1;
        }
        size_t total = 1 + (size_t)hb + rl;
        if (len - off < total)
            break;
        const uint8_t *b = data + off + 1 + hb;
        switch (h >> 4) {
        case MQTT_PUBLISH:
            if (on_publish(f, v, h, b, rl) < 0)
                return -1;
            break;
        case MQTT_CONNACK:
            if (rl != 2 || v->state != V_CONNACK) {
                BUMP(st->protocol_errors, 1);
                lose(f, v, "unexpected CONNACK", 0);
                return -1;
            }
            if (b[1] != 0) {
                BUMP(st->connack_refused, 1);
                lose(f, v, "CONNACK refused", 0);
                return -1;
            }
            v->state = V_SUBACK;
            BUMP(st->connects, 1);
            BUMP(st->connected_now, 1);
            STORE(st->last_connack_us, f->now_us);
            hist_add(&st->connack_us, (uint64_t)(f->now_us - v->start_us));
            break;
        case MQTT_SUBACK:
            if (rl < 3 || v->state != V_SUBACK || (((unsigned)b[0] << 8) | b[1]) != SUB_PACKET_ID) {
                BUMP(st->protocol_errors, 1);
                lose(f, v, "unexpected SUBACK", 0);
                return -1;
            }
            if (b[2] == 0x80) {
                BUMP(st->subscribe_errors, 1);
                note_error(f, "SUBACK refused the delivery filter", v, 0);
            }
            v->state = V_SUBSCRIBED;
            v->attempts = 0;
            f->inflight--;
            BUMP(st->subscribed_now, 1);
            STORE(st->last_suback_us, f->now_us);
            hist_add(&st->suback_us, (uint64_t)(f->now_us - v->start_us));
            if (!v->ever) {
                v->ever = 1;
                BUMP(st->ever_subscribed, 1);
            }
            if (!f->o->no_online) {
                publish_status(f, v, "online", 1);
                BUMP(st->onlines, 1);
            }
            connect_phase_check(f);
            break;
        case MQTT_PINGRESP:
            BUMP(st->pongs, 1);
            break;
        case MQTT_PUBACK:
            break;
        case MQTT_PUBREL: {
            uint8_t comp[4] = {MQTT_PUBCOMP << 4, 2, rl >= 2 ? b[0] : 0, rl >= 2 ? b[1] : 0};
            append(f, comp, 4);
            break;
        }
        default:
            BUMP(st->protocol_errors, 1);
            lose(f, v, "unexpected packet type", 0);
            return -1;
        }
        off += total;
    }
    return (long)off;
}

static void on_readable(struct fleet *f, struct vehicle *v) {
    for (;;) {
        uint8_t *buf = v->inlen ? (ensure(&v->in, &v->incap, v->inlen + RBUF), v->in + v->inlen) : f->rbuf;
        ssize_t n = recv(v->fd, buf, RBUF, 0);
        if (n == 0) {
            lose(f, v, "closed by the broker", 0);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                lose(f, v, "read failed", errno);
            return;
        }
        const uint8_t *data = buf;
        size_t len = (size_t)n;
        if (v->inlen) {
            v->inlen += (uint32_t)n;
            data = v->in;
            len = v->inlen;
        }
        if (f->ocap < len + 512) {
            f->ocap = len + 512;
            f->obuf = xrealloc(f->obuf, f->ocap);
        }
        f->olen = 0;
        f->now_us = real_us();
        long used = parse(f, v, data, len);
        if (used < 0)
            return;
        size_t rest = len - (size_t)used;
        if (rest) {
            if (data == v->in) {
                memmove(v->in, v->in + used, rest);
            } else {
                ensure(&v->in, &v->incap, rest);
                memcpy(v->in, data + used, rest);
            }
        }
        v->inlen = (uint32_t)rest;
        if (f->olen && conn_write(f, v, f->obuf, f->olen) < 0)
            return;
        if (n < RBUF)
            return; /* drained; level-triggered epoll reports any later bytes */
    }
}

static void on_writable(struct fleet *f, struct vehicle *v) {
    if (v->state == V_TCP) {
        send_handshake(f, v);
        return;
    }
    if (!v->outlen) {
        set_events(f, v, 0);
        return;
    }
    ssize_t n = send(v->fd, v->out, v->outlen, MSG_NOSIGNAL);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            lose(f, v, "write failed", errno);
        return;
    }
    v->last_tx_ns = mono_ns();
    memmove(v->out, v->out + n, v->outlen - (size_t)n);
    v->outlen -= (uint32_t)n;
    if (!v->outlen)
        set_events(f, v, 0);
}

/* ---------------------------------------------------------------- timers */

static void heartbeats(struct fleet *f, int64_t now) {
    double interval = f->o->heartbeat_interval;
    uint64_t subscribed = LOAD(f->st->subscribed_now);
    if (interval <= 0 || !subscribed) {
        f->hb_ns = now;
        f->hb_tokens = 0;
        return;
    }
    f->hb_tokens += (double)(now - f->hb_ns) / 1e9 * (double)subscribed / interval;
    f->hb_ns = now;
    if (f->hb_tokens > (double)subscribed)
        f->hb_tokens = (double)subscribed; /* after a stall, do not send a vehicle two at once */
    while (f->hb_tokens >= 1.0) {
        struct vehicle *v = NULL;
        for (long scanned = 0; scanned < f->n; scanned++) {
            struct vehicle *c = &f->v[f->hb_cursor];
            f->hb_cursor = f->hb_cursor + 1 == f->n ? 0 : f->hb_cursor + 1;
            if (c->state == V_SUBSCRIBED) {
                v = c;
                break;
            }
        }
        if (!v)
            break;
        f->hb_tokens -= 1.0;
        BUMP(f->st->heartbeats, 1);
        publish_status(f, v, "heartbeat", 0);
    }
}

/* Once a second: handshake timeouts, and a PINGREQ from every vehicle silent for keepalive/2. */
static void sweep(struct fleet *f, int64_t now) {
    static const uint8_t pingreq[2] = {MQTT_PINGREQ << 4, 0};
    int64_t timeout = (int64_t)(f->o->connect_timeout * 1e9);
    int64_t quiet = (int64_t)f->o->keepalive * 500000000LL;
    for (long i = 0; i < f->n; i++) {
        struct vehicle *v = &f->v[i];
        if (v->state == V_SUBSCRIBED) {
            if (quiet && now - v->last_tx_ns >= quiet) {
                BUMP(f->st->pings, 1);
                conn_write(f, v, pingreq, 2);
            }
        } else if (v->state != V_IDLE && now - v->start_ns > timeout) {
            BUMP(f->st->timeouts, 1);
            lose(f, v, v->state == V_SUBACK ? "SUBACK timeout" : "CONNACK timeout", 0);
        }
    }
}

static int wait_ms(struct fleet *f, int64_t now) {
    int64_t ms = 20; /* the stop flag is looked at this often when nothing happens */
    if (!*f->stop && f->inflight < f->o->concurrency) {
        if (f->cursor < f->n) {
            if (f->rate > 0)
                ms = (int64_t)ceil((1.0 - f->tokens) * 1000.0 / f->rate);
            else
                ms = 0;
        } else if (f->heap_len) {
            int64_t d = (f->heap[0].due_ns - now) / 1000000 + 1;
            if (d < ms)
                ms = d;
        }
    }
    uint64_t subscribed = LOAD(f->st->subscribed_now);
    if (f->o->heartbeat_interval > 0 && subscribed) {
        int64_t d = (int64_t)ceil(f->o->heartbeat_interval * 1000.0 / (double)subscribed);
        if (d < ms)
            ms = d;
    }
    return ms < 0 ? 0 : ms > 20 ? 20 : (int)ms;
}

/* ---------------------------------------------------------------- one vehicle process */

/* DISCONNECT every connected vehicle and wait (at most 3 s) for the broker to close first: the
 * TIME_WAIT state then stays on the broker's side and never holds this machine's ephemeral ports
 * against the next run. Whatever arrives meanwhile is discarded. */
static void teardown(struct fleet *f) {
    static const uint8_t disconnect[2] = {MQTT_DISCONNECT << 4, 0};
    long open = 0;
    for (long i = 0; i < f->n; i++) {
        struct vehicle *v = &f->v[i];
        if (v->fd < 0)
            continue;
        if (v->state >= V_SUBACK && !v->outlen && send(v->fd, disconnect, 2, MSG_NOSIGNAL) == 2) {
            v->state = V_CLOSING;
            set_events(f, v, 0);
            open++;
        } else {
            close(v->fd);
            v->fd = -1;
        }
    }
    struct epoll_event evs[1024];
    int64_t deadline = mono_ns() + 3000000000LL;
    while (open > 0 && mono_ns() < deadline) {
        int k = epoll_wait(f->ep, evs, 1024, 50);
        for (int i = 0; i < k; i++) {
            struct vehicle *v = &f->v[evs[i].data.u32];
            if (v->fd < 0)
                continue;
            ssize_t r = recv(v->fd, f->rbuf, RBUF, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                close(v->fd);
                v->fd = -1;
                open--;
            }
        }
    }
    for (long i = 0; i < f->n; i++)
        if (f->v[i].fd >= 0) {
            close(f->v[i].fd);
            f->v[i].fd = -1;
        }
}

static void vehicle_process(const struct options *o, struct pstats *st, volatile int *stop, long first, long n) {
    struct fleet f = {.o = o, .st = st, .stop = stop, .first = first, .n = n};
    raise_nofile(n + FD_MARGIN);
    if (resolve_host(o->host, &f.addr_be) != 0)
        die("--host %s does not resolve", o->host);
    f.use_src = o->vehicles > o->per_address;
    f.rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)getpid() << 16) ^ (uint64_t)first;
    f.rate = o->connect_rate / o->processes;
    f.tokens_ns = f.hb_ns = mono_ns();
    f.rbuf = xrealloc(NULL, RBUF);
    f.v = calloc((size_t)n, sizeof *f.v);
    /* VINs and delivery prefixes ("agent/<VIN>/proxy/request/"), one arena */
    size_t per = MAX_ID + 1 + MAX_TOPIC;
    char *arena = malloc((size_t)n * per);
    if (!f.v || !arena)
        die("out of memory for %ld vehicles", n);
    for (long i = 0; i < n; i++) {
        struct vehicle *v = &f.v[i];
        char *vin = arena + (size_t)i * per, *prefix = vin + MAX_ID + 1;
        format_vin(vin, o, first + i);
        size_t pl = delivery_prefix(prefix, MAX_TOPIC - 1, o->topic_prefix, vin);
        prefix[pl++] = '/';
        prefix[pl] = 0;
        v->fd = -1;
        v->vin = vin;
        v->vin_len = (uint16_t)strlen(vin);
        v->prefix = prefix;
        v->prefix_len = (uint16_t)pl;
    }
    size_t expect = (size_t)n * (size_t)(o->requests > 0 ? o->requests : 1) * 2;
    f.set_cap = 1024;
    while (f.set_cap < expect)
        f.set_cap *= 2;
    f.set = calloc(f.set_cap, sizeof *f.set);
    f.ep = epoll_create1(EPOLL_CLOEXEC);
    if (f.ep < 0 || !f.set)
        die("epoll_create1/set: %s", strerror(errno));
    struct epoll_event evs[1024];
    int64_t next_sweep = mono_ns() + 1000000000LL;
    while (!*stop) {
        int64_t now = mono_ns();
        start_connects(&f, now);
        heartbeats(&f, now);
        if (now >= next_sweep) {
            sweep(&f, now);
            next_sweep = now + 1000000000LL;
        }
        int k = epoll_wait(f.ep, evs, 1024, wait_ms(&f, mono_ns()));
        if (k > 0) {
            BUMP(st->wakeups, 1);
            BUMP(st->events, (uint64_t)k);
        }
        for (int i = 0; i < k; i++) {
            struct vehicle *v = &f.v[evs[i].data.u32];
            if (v->fd < 0)
                continue; /* lost earlier in this batch */
            uint32_t e = evs[i].events;
            if (e & EPOLLOUT)
                on_writable(&f, v);
            if (v->fd >= 0 && (e & (EPOLLIN | EPOLLERR | EPOLLHUP)))
                on_readable(&f, v);
        }
        if (o->coalesce_us && k > 0 && k < 64) {
            struct timespec nap = {0, (long)o->coalesce_us * 1000};
            nanosleep(&nap, NULL);
        }
    }
    struct cpu cpu_stop = cpu_self();
    if (st->connect_phase_done)
        st->cpu_run = cpu_sub(cpu_stop, f.cpu_at_connect_done);
    else
        st->cpu_connect = cpu_stop;
    teardown(&f);
    st->cpu_teardown = cpu_sub(cpu_self(), cpu_stop);
    STORE(st->finished, 1);
}

/* ---------------------------------------------------------------- supervisor */

static volatile sig_atomic_t got_stop, got_usr1;

static void on_stop(int sig) { got_stop = sig; }
static void on_usr1(int sig) { (void)sig; got_usr1 = 1; }

struct totals {
    uint64_t connects, connected_now, subscribed_now, ever, errors, losses, deliveries, unique, duplicates, dup_flag,
        pubacks, heartbeats, onlines, pings, pongs, wrong_topic, protocol_errors, subscribe_errors, qos2, refused,
        timeouts, resets, connack_refused;
    int64_t first_connect_us, last_connack_us, last_suback_us, first_delivery_us, last_delivery_us;
    uint64_t wakeups, events;
    struct cpu cpu_connect, cpu_run, cpu_teardown;
};

static void min_set(int64_t *into, int64_t v) {
    if (v && (!*into || v < *into))
        *into = v;
}

static void max_set(int64_t *into, int64_t v) {
    if (v > *into)
        *into = v;
}

static struct totals sum(const struct shared *sh) {
    struct totals t = {0};
    for (int k = 0; k < sh->nprocs; k++) {
        const struct pstats *p = &sh->procs[k];
        t.connects += LOAD(p->connects);
        t.connected_now += LOAD(p->connected_now);
        t.subscribed_now += LOAD(p->subscribed_now);
        t.ever += LOAD(p->ever_subscribed);
        t.errors += LOAD(p->connect_errors);
        t.losses += LOAD(p->losses);
        t.deliveries += LOAD(p->deliveries);
        t.unique += LOAD(p->unique);
        t.duplicates += LOAD(p->duplicates);
        t.dup_flag += LOAD(p->dup_flag);
        t.pubacks += LOAD(p->pubacks);
        t.heartbeats += LOAD(p->heartbeats);
        t.onlines += LOAD(p->onlines);
        t.pings += LOAD(p->pings);
        t.pongs += LOAD(p->pongs);
        t.wrong_topic += LOAD(p->wrong_topic);
        t.protocol_errors += LOAD(p->protocol_errors);
        t.subscribe_errors += LOAD(p->subscribe_errors);
        t.qos2 += LOAD(p->qos2);
        t.refused += LOAD(p->refused);
        t.timeouts += LOAD(p->timeouts);
        t.resets += LOAD(p->resets);
        t.connack_refused += LOAD(p->connack_refused);
        min_set(&t.first_connect_us, LOAD(p->first_connect_us));
        max_set(&t.last_connack_us, LOAD(p->last_connack_us));
        max_set(&t.last_suback_us, LOAD(p->last_suback_us));
        min_set(&t.first_delivery_us, LOAD(p->first_delivery_us));
        max_set(&t.last_delivery_us, LOAD(p->last_delivery_us));
        t.wakeups += LOAD(p->wakeups);
        t.events += LOAD(p->events);
        t.cpu_connect = cpu_add(t.cpu_connect, p->cpu_connect);
        t.cpu_run = cpu_add(t.cpu_run, p->cpu_run);
        t.cpu_teardown = cpu_add(t.cpu_teardown, p->cpu_teardown);
    }
    return t;
}

static void progress_line(const struct totals *t, double elapsed) {
    fprintf(stderr,
            "cfleet progress t=%.3f connects=%llu connected=%llu subscribed=%llu ever_subscribed=%llu "
            "connect_errors=%llu losses=%llu deliveries=%llu unique=%llu duplicates=%llu pubacks=%llu "
            "heartbeats=%llu pings=%llu\n",
            elapsed, (unsigned long long)t->connects, (unsigned long long)t->connected_now,
            (unsigned long long)t->subscribed_now, (unsigned long long)t->ever, (unsigned long long)t->errors,
            (unsigned long long)t->losses, (unsigned long long)t->deliveries, (unsigned long long)t->unique,
            (unsigned long long)t->duplicates, (unsigned long long)t->pubacks, (unsigned long long)t->heartbeats,
            (unsigned long long)t->pings);
}

static void json_rate(const char *key, uint64_t count, int64_t from_us, int64_t to_us) {
    if (count && from_us && to_us > from_us)
        printf("\"%s\": %.1f, ", key, (double)count * 1e6 / (double)(to_us - from_us));
    else
        printf("\"%s\": null, ", key);
}

static void json_per(const char *key, double cpu_s, uint64_t count) {
    if (count)
        printf("\"%s\": %.2f, ", key, cpu_s * 1e6 / (double)count);
    else
        printf("\"%s\": null, ", key);
}

static void json_cpu(const char *key, struct cpu c) {
    printf("\"%s_s\": %.6f, \"%s_user_s\": %.6f, \"%s_sys_s\": %.6f, ", key, cpu_total(c), key, c.user, key, c.sys);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        putchar((unsigned char)*s < 0x20 ? ' ' : *s);
    }
    putchar('"');
}

/* A vehicle process that ended, without waiting (its slot in pids cleared), or 0 / -1 as waitpid. */
static pid_t reap(pid_t *pids, int K, int *wst) {
    pid_t done = waitpid(-1, wst, WNOHANG);
    for (int k = 0; done > 0 && k < K; k++)
        if (pids[k] == done)
            pids[k] = 0;
    return done;
}

int run_fleet(const struct options *o0) {
    struct options o = *o0;
    long hard = hard_nofile();
    long per_proc = hard - FD_MARGIN;
    if (per_proc < 1)
        die("RLIMIT_NOFILE hard limit %ld leaves no descriptor for vehicles", hard);
    int needed = (int)((o.vehicles + per_proc - 1) / per_proc);
    if (!o.processes)
        o.processes = needed;
    if (o.processes > o.vehicles)
        o.processes = (int)o.vehicles;
    if (o.processes < needed)
        die("%ld vehicles in %d processes need %ld descriptors each; the hard limit is %ld (use --processes %d)",
            o.vehicles, o.processes, (o.vehicles + o.processes - 1) / o.processes + FD_MARGIN, hard, needed);
    int K = o.processes;
    size_t size = sizeof(struct shared) + (size_t)K * sizeof(struct pstats);
    struct shared *sh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    sh->nprocs = K;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    fflush(NULL);
    int64_t t0 = mono_ns();
    pid_t parent = getpid();
    pid_t *pids = calloc((size_t)K, sizeof *pids);
    for (int k = 0; k < K; k++) {
        long first = o.vehicles * k / K, last = o.vehicles * (k + 1) / K;
        pid_t pid = fork();
        if (pid < 0)
            die("fork: %s", strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(3);
            signal(SIGTERM, SIG_IGN); /* the supervisor stops the vehicles through sh->stop */
            signal(SIGINT, SIG_IGN);
            signal(SIGUSR1, SIG_IGN);
            vehicle_process(&o, &sh->procs[k], &sh->stop, first, last - first);
            _exit(0);
        }
        pids[k] = pid;
    }
    const char *status = NULL;
    int ready = 0, alive = K;
    double ready_s = -1;
    int64_t goal_ns = 0, next_progress = t0 + (int64_t)(o.progress * 1e9);
    uint64_t expected = (uint64_t)o.vehicles * (uint64_t)o.requests;
    struct timespec tick = {0, 10000000};
    while (!status) {
        nanosleep(&tick, NULL);
        int64_t now = mono_ns();
        double elapsed = (double)(now - t0) / 1e9;
        struct totals t = sum(sh);
        if (!ready && t.subscribed_now == (uint64_t)o.vehicles) {
            ready = 1;
            ready_s = elapsed;
            fprintf(stderr, "cfleet ready t=%.3f subscribed=%llu\n", elapsed, (unsigned long long)t.subscribed_now);
        }
        if (got_usr1 || (o.progress > 0 && now >= next_progress)) {
            got_usr1 = 0;
            progress_line(&t, elapsed);
            if (o.progress > 0)
                next_progress = now + (int64_t)(o.progress * 1e9);
        }
        int wst;
        pid_t done = reap(pids, K, &wst);
        if (done > 0) {
            alive--;
            status = "failed";
            fprintf(stderr, "cfleet: vehicle process %d ended early (status %d)\n", (int)done, wst);
        } else if (got_stop) {
            status = "signal";
        } else if (elapsed >= o.time_cap) {
            status = "capped";
        } else if (!o.until_signal && t.ever == (uint64_t)o.vehicles && t.unique >= expected) {
            if (!goal_ns)
                goal_ns = now;
            if ((double)(now - goal_ns) / 1e9 >= o.settle)
                status = "done";
        }
    }
    sh->stop = 1;
    struct totals at_stop = sum(sh);
    int64_t deadline = mono_ns() + 30000000000LL;
    while (alive > 0) {
        int wst;
        pid_t done = reap(pids, K, &wst);
        if (done > 0) {
            alive--;
            continue;
        }
        if (done < 0 && errno == ECHILD)
            break;
        if (mono_ns() > deadline) {
            for (int k = 0; k < K; k++)
                if (pids[k])
                    kill(pids[k], SIGKILL);
            deadline = mono_ns() + 10000000000LL;
        }
        nanosleep(&tick, NULL);
    }
    double wall = (double)(mono_ns() - t0) / 1e9;
    struct totals t = sum(sh);
    struct cpu children = cpu_children(), supervisor = cpu_self();
    struct hist connack = {0}, suback = {0}, delivery = {0};
    const char *first_error = "";
    for (int k = 0; k < K; k++) {
        hist_merge(&connack, &sh->procs[k].connack_us);
        hist_merge(&suback, &sh->procs[k].suback_us);
        hist_merge(&delivery, &sh->procs[k].delivery_us);
        if (!*first_error && sh->procs[k].first_error[0])
            first_error = sh->procs[k].first_error;
    }
    printf("{\"mode\": \"fleet\", \"status\": \"%s\", \"vehicles\": %ld, \"processes\": %d, ", status, o.vehicles, K);
    printf("\"requests_per_vehicle\": %ld, \"expected_unique\": %llu, ", o.requests, (unsigned long long)expected);
    printf("\"connect_rate\": %.1f, \"concurrency\": %d, \"heartbeat_interval_s\": %.3f, ", o.connect_rate,
           o.concurrency, o.heartbeat_interval);
    printf("\"ready_s\": ");
    if (ready_s >= 0)
        printf("%.3f, ", ready_s);
    else
        printf("null, ");
    printf("\"connects\": %llu, \"ever_subscribed\": %llu, \"connected_at_stop\": %llu, "
           "\"subscribed_at_stop\": %llu, \"connect_errors\": %llu, ",
           (unsigned long long)t.connects, (unsigned long long)t.ever, (unsigned long long)at_stop.connected_now,
           (unsigned long long)at_stop.subscribed_now, (unsigned long long)t.errors);
    printf("\"connect_error_kinds\": {\"refused\": %llu, \"timeout\": %llu, \"reset\": %llu, "
           "\"connack_refused\": %llu}, \"first_error\": ",
           (unsigned long long)t.refused, (unsigned long long)t.timeouts, (unsigned long long)t.resets,
           (unsigned long long)t.connack_refused);
    json_str(first_error);
    printf(", \"losses\": %llu, \"subscribe_errors\": %llu, ", (unsigned long long)t.losses,
           (unsigned long long)t.subscribe_errors);
    printf("\"first_connect_unix_us\": %lld, \"last_connack_unix_us\": %lld, \"last_suback_unix_us\": %lld, ",
           (long long)t.first_connect_us, (long long)t.last_connack_us, (long long)t.last_suback_us);
    json_rate("connects_per_s", t.connects, t.first_connect_us, t.last_connack_us);
    json_rate("subscribes_per_s", t.ever, t.first_connect_us, t.last_suback_us);
    json_hist("connect_latency_ms", &connack, 1);
    json_hist("subscribe_latency_ms", &suback, 1);
    printf("\"deliveries\": %llu, \"unique\": %llu, \"duplicates\": %llu, \"dup_flag\": %llu, \"pubacks\": %llu, "
           "\"wrong_topic\": %llu, \"qos2\": %llu, \"protocol_errors\": %llu, ",
           (unsigned long long)t.deliveries, (unsigned long long)t.unique, (unsigned long long)t.duplicates,
           (unsigned long long)t.dup_flag, (unsigned long long)t.pubacks, (unsigned long long)t.wrong_topic,
           (unsigned long long)t.qos2, (unsigned long long)t.protocol_errors);
    printf("\"first_delivery_unix_us\": %lld, \"last_delivery_unix_us\": %lld, ", (long long)t.first_delivery_us,
           (long long)t.last_delivery_us);
    json_rate("deliveries_per_s", t.unique, t.first_delivery_us, t.last_delivery_us);
    json_hist("delivery_latency_ms", &delivery, 1);
    printf("\"heartbeats\": %llu, \"onlines\": %llu, \"pings\": %llu, \"pongs\": %llu, ",
           (unsigned long long)t.heartbeats, (unsigned long long)t.onlines, (unsigned long long)t.pings,
           (unsigned long long)t.pongs);
    printf("\"wakeups\": %llu, \"events_per_wakeup\": %.2f, ", (unsigned long long)t.wakeups,
           t.wakeups ? (double)t.events / (double)t.wakeups : 0.0);
    struct cpu all = cpu_add(children, supervisor);
    printf("\"cpu_s\": %.6f, \"cpu_user_s\": %.6f, \"cpu_sys_s\": %.6f, \"cpu_supervisor_s\": %.6f, ", cpu_total(all),
           all.user, all.sys, cpu_total(supervisor));
    json_cpu("cpu_connect", t.cpu_connect);
    json_cpu("cpu_run", t.cpu_run);
    json_cpu("cpu_teardown", t.cpu_teardown);
    json_per("cpu_us_per_connect", cpu_total(t.cpu_connect), t.connects);
    json_per("cpu_user_us_per_connect", t.cpu_connect.user, t.connects);
    json_per("cpu_us_per_delivery", cpu_total(t.cpu_run), t.deliveries);
    json_per("cpu_user_us_per_delivery", t.cpu_run.user, t.deliveries);
    printf("\"wall_s\": %.3f}\n", wall);
    fflush(stdout);
    return strcmp(status, "failed") == 0 ? 1 : 0;
}
