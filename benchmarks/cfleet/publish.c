/* cfleet publish: the naive platform a broker without a fanout service needs, compiled.
 *
 * One connection; for each request r = 1..R and each vehicle: a QoS 1 PUBLISH on
 * agent/<VIN>/proxy/request/<request_prefix>-<r, 5 digits>, request after request, with at most --window
 * packet ids unacknowledged. An empty --request-prefix publishes on the VIN's topic itself (the --topic-prefix
 * with the VIN in it: one topic per vehicle, as a vehicle's responses have). The payload starts with the SDVt
 * send-time header (stamped once per refill, the moment the refill is written) so the fleet measures each delivery's latency. Each refill is
 * one write; PUBACKs free packet ids and trigger the next refill. Prints one JSON object at the end.
 */
#include "cfleet.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define RBUF 65536

static volatile sig_atomic_t got_stop;
static void on_stop(int sig) { got_stop = sig; }

static int connect_broker(const struct options *o, uint32_t addr_be) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->ports[0]), .sin_addr.s_addr = addr_be};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        die("connect %s:%d: %s", o->host, o->ports[0], strerror(errno));
    uint8_t buf[1024];
    size_t n = encode_connect(buf, o->client_id, 1, o->keepalive, o->username, o->password);
    if (send(fd, buf, n, MSG_NOSIGNAL) != (ssize_t)n)
        die("CONNECT: %s", strerror(errno));
    size_t got = 0;
    while (got < 4) {
        ssize_t r = recv(fd, buf + got, 4 - got, 0);
        if (r <= 0)
            die("no CONNACK from %s:%d: %s", o->host, o->ports[0], r == 0 ? "closed" : strerror(errno));
        got += (size_t)r;
    }
    if (buf[0] != (MQTT_CONNACK << 4) || buf[1] != 2 || buf[3] != 0)
        die("CONNACK refused (return code %d)", buf[3]);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
        die("non-blocking: %s", strerror(errno));
    return fd;
}

int run_publish(const struct options *o) {
    uint32_t addr_be;
    resolve_host(o->host, &addr_be);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    long n = o->vehicles;
    int with_rid = o->request_prefix[0] != '\0';
    /* topic = "<delivery prefix of the VIN>/<request id>": the prefixes once, the request id appended */
    size_t per = MAX_TOPIC;
    char *prefixes = malloc((size_t)n * per);
    uint16_t *prefix_len = malloc((size_t)n * sizeof *prefix_len);
    if (!prefixes || !prefix_len)
        die("out of memory for %ld vehicles", n);
    for (long i = 0; i < n; i++) {
        char vin[MAX_ID + 2];
        format_vin(vin, o, i);
        char *p = prefixes + (size_t)i * per;
        size_t pl = delivery_prefix(p, MAX_TOPIC - 32, o->topic_prefix, vin);
        if (with_rid)
            p[pl++] = '/';
        prefix_len[i] = (uint16_t)pl;
    }
    size_t payload_len = (size_t)o->payload;
    uint8_t *payload = malloc(payload_len + STAMP_SIZE);
    uint64_t rng = 0x2545F4914F6CDD1DULL ^ (uint64_t)getpid();
    for (size_t i = 0; i < payload_len; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        payload[i] = (uint8_t)rng;
    }
    int window = o->window;
    size_t pkt_max = 1 + 4 + 2 + MAX_TOPIC + 2 + payload_len;
    size_t ocap = (size_t)window * pkt_max;
    uint8_t *obuf = malloc(ocap), *rbuf = malloc(RBUF);
    uint8_t *inflight = calloc(65536, 1);
    int64_t *sent_us = calloc(65536, sizeof *sent_us);
    if (!payload || !obuf || !rbuf || !inflight || !sent_us)
        die("out of memory");

    int fd = connect_broker(o, addr_be);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);

    struct cpu cpu0 = cpu_self();
    int64_t t0 = mono_ns(), cap_ns = t0 + (int64_t)(o->time_cap * 1e9);
    uint64_t total = (uint64_t)n * (uint64_t)o->requests, sent = 0, acked = 0, bad = 0;
    int64_t first_us = 0, last_ack_us = 0;
    int outstanding = 0;
    unsigned next_pid = 1;
    size_t pending = 0, pending_off = 0; /* bytes of obuf not yet written */
    int epout = 0;
    struct hist ack_us = {0};
    size_t in_len = 0;
    const char *status = "done";
    char rid[64];
    long rid_for = -1;
    size_t rid_len = 0;
    while (acked < total) {
        if (got_stop) {
            status = "signal";
            break;
        }
        if (mono_ns() >= cap_ns) {
            status = "capped";
            break;
        }
        if (!pending && outstanding < window && sent < total) {
            int64_t now = real_us();
            if (!first_us)
                first_us = now;
            if (payload_len >= STAMP_SIZE)
                put_stamp(payload, now);
            size_t len = 0;
            while (outstanding < window && sent < total) {
                long r = (long)(sent / (uint64_t)n), i = (long)(sent % (uint64_t)n);
                if (r != rid_for && with_rid) {
                    rid_len = (size_t)snprintf(rid, sizeof rid, "%s-%05ld", o->request_prefix, r + 1);
                    rid_for = r;
                }
                while (inflight[next_pid])
                    next_pid = next_pid == 65535 ? 1 : next_pid + 1;
                char topic[MAX_TOPIC + 64];
                size_t tl = prefix_len[i];
                memcpy(topic, prefixes + (size_t)i * per, tl);
                memcpy(topic + tl, rid, rid_len);
                tl += rid_len;
                len += encode_publish_head(obuf + len, topic, tl, 1, next_pid, payload_len);
                memcpy(obuf + len, payload, payload_len);
                len += payload_len;
                inflight[next_pid] = 1;
                sent_us[next_pid] = now;
                next_pid = next_pid == 65535 ? 1 : next_pid + 1;
                outstanding++;
                sent++;
            }
            pending = len;
            pending_off = 0;
        }
        if (pending) {
            ssize_t w = send(fd, obuf + pending_off, pending, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                die("write: %s", strerror(errno));
            if (w > 0) {
                pending -= (size_t)w;
                pending_off += (size_t)w;
            }
            int want_out = pending > 0;
            if (want_out != epout) {
                ev.events = EPOLLIN | (want_out ? EPOLLOUT : 0);
                epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
                epout = want_out;
            }
        }
        struct epoll_event got[4];
        int k = epoll_wait(ep, got, 4, 20);
        if (k <= 0)
            continue;
        if (!(got[0].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
            continue;
        ssize_t r = recv(fd, rbuf + in_len, RBUF - in_len, 0);
        if (r == 0)
            die("the broker closed the connection after %llu PUBACKs", (unsigned long long)acked);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            die("read: %s", strerror(errno));
        }
        in_len += (size_t)r;
        int64_t now = real_us();
        size_t off = 0;
        while (in_len - off >= 2) {
            size_t rl;
            int hb = get_varint(rbuf + off + 1, in_len - off - 1, &rl);
            if (hb < 0)
                die("malformed packet from the broker");
            if (hb == 0 || in_len - off < 1 + (size_t)hb + rl)
                break;
            const uint8_t *b = rbuf + off + 1 + hb;
            if ((rbuf[off] >> 4) == MQTT_PUBACK && rl == 2) {
                unsigned pid = ((unsigned)b[0] << 8) | b[1];
                if (inflight[pid]) {
                    inflight[pid] = 0;
                    outstanding--;
                    acked++;
                    last_ack_us = now;
                    hist_add(&ack_us, (uint64_t)(now - sent_us[pid]));
                } else {
                    bad++;
                }
            }
            off += 1 + (size_t)hb + rl;
        }
        memmove(rbuf, rbuf + off, in_len - off);
        in_len -= off;
    }
    struct cpu used = cpu_sub(cpu_self(), cpu0);
    double cpu = cpu_total(used);
    static const uint8_t disconnect[2] = {MQTT_DISCONNECT << 4, 0};
    (void)!send(fd, disconnect, 2, MSG_NOSIGNAL);
    close(fd);
    printf("{\"mode\": \"publish\", \"status\": \"%s\", \"vehicles\": %ld, \"requests\": %ld, \"window\": %d, "
           "\"payload_bytes\": %zu, \"publishes\": %llu, \"pubacks\": %llu, \"unknown_pubacks\": %llu, ",
           status, n, o->requests, window, payload_len, (unsigned long long)sent, (unsigned long long)acked,
           (unsigned long long)bad);
    printf("\"first_publish_unix_us\": %lld, \"last_puback_unix_us\": %lld, ", (long long)first_us,
           (long long)last_ack_us);
    if (acked && last_ack_us > first_us)
        printf("\"seconds\": %.4f, \"publishes_per_s\": %.1f, ", (double)(last_ack_us - first_us) / 1e6,
               (double)acked * 1e6 / (double)(last_ack_us - first_us));
    else
        printf("\"seconds\": null, \"publishes_per_s\": null, ");
    json_hist("puback_latency_ms", &ack_us, 1);
    printf("\"cpu_s\": %.6f, \"cpu_user_s\": %.6f, \"cpu_sys_s\": %.6f, ", cpu, used.user, used.sys);
    if (acked)
        printf("\"cpu_us_per_publish\": %.2f, ", cpu * 1e6 / (double)acked);
    else
        printf("\"cpu_us_per_publish\": null, ");
    printf("\"wall_s\": %.3f}\n", (double)(mono_ns() - t0) / 1e9);
    fflush(stdout);
    return strcmp(status, "done") == 0 ? 0 : 1;
}
