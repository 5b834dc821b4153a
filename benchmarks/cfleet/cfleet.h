/* cfleet: a compiled MQTT 3.1.1 load generator (vehicle fleet and naive platform) for the benchmarks.
 *
 * Shared pieces of the three sources: the options, the per-process statistics block that lives in
 * shared memory (the supervisor reads it while the vehicle processes run), the latency histogram,
 * clocks, and the few MQTT 3.1.1 packet encoders the fleet and the publisher need.
 *
 * Everything is libc + Linux (epoll, getrusage, mmap); nothing here allocates on the hot path.
 */
#ifndef CFLEET_H
#define CFLEET_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MAX_PORTS 16
#define MAX_ID 64          /* client ids (VINs) up to 64 characters, as the broker's vehicle id rule */
#define MAX_TOPIC 256

struct options {
    const char *mode;             /* "fleet" or "publish" */
    const char *host;
    int ports[MAX_PORTS];
    int nports;
    const char *prefix;           /* VIN = prefix + zero-padded index */
    int digits;
    long start;
    long vehicles;
    const char *topic_prefix;     /* delivery topic prefix, "{VIN}" replaced: agent/{VIN}/proxy/request */
    int processes;                /* fleet: vehicle processes (0 = as many as the descriptor limit needs) */
    double connect_rate;          /* fleet: connects per second over the whole fleet, 0 = as fast as possible */
    int concurrency;              /* fleet: handshakes in flight per process */
    long requests;                /* fleet: unique deliveries expected per vehicle; publish: requests to send */
    double heartbeat_interval;    /* fleet: seconds between heartbeats of one vehicle, 0 = none */
    int keepalive;                /* seconds, in CONNECT; a PINGREQ goes out after keepalive/2 of silence */
    double settle;                /* fleet: seconds to stay connected once the goal is reached */
    double time_cap;              /* seconds: the run stops by itself after this long */
    double connect_timeout;       /* fleet: CONNACK + SUBACK within this long, else retry */
    int until_signal;             /* fleet: ignore the goal, run until SIGTERM/SIGINT or the cap */
    int clean;                    /* clean session flag in CONNECT */
    int no_online;                /* fleet: do not publish ecp/<VIN>/online after SUBACK */
    const char *username;
    const char *password;
    int window;                   /* publish: unacknowledged PUBLISHes at most */
    int payload;                  /* publish: payload bytes (>= 12: the SDVt send-time header) */
    const char *request_prefix;   /* publish: request id = <request_prefix>-<index zero-padded to 5> */
    const char *client_id;        /* publish: the platform's client id */
    double progress;              /* fleet: seconds between progress lines on stderr, 0 = none */
    int coalesce_us;              /* fleet: after a wakeup with few events, sleep this long so that the
                                     next epoll_wait returns more of them (fewer context switches) */
    long per_address;             /* fleet: more vehicles than this bind to 127.2.x.y, this many per address */
};

/* ---------------------------------------------------------------- clocks */

static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t real_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* CPU time, seconds, split as getrusage reports it: user (this program's code) and system (the kernel
 * on its behalf: on loopback a send also runs the receiving side's TCP input, a connect the whole
 * three-way handshake including the listener's part). */
struct cpu {
    double user, sys;
};
struct cpu cpu_self(void);     /* RUSAGE_SELF */
struct cpu cpu_children(void); /* RUSAGE_CHILDREN: of the reaped children */
static inline struct cpu cpu_sub(struct cpu a, struct cpu b) { return (struct cpu){a.user - b.user, a.sys - b.sys}; }
static inline struct cpu cpu_add(struct cpu a, struct cpu b) { return (struct cpu){a.user + b.user, a.sys + b.sys}; }
static inline double cpu_total(struct cpu c) { return c.user + c.sys; }

/* ---------------------------------------------------------------- histogram (microseconds)
 * Log-linear: exact below 64 us, then 32 sub-buckets per power of two (<= 3.2% error). */

#define HIST_SUB_BITS 5
#define HIST_BUCKETS (64 + 40 * 32)

struct hist {
    uint64_t count;
    uint64_t max;
    uint32_t buckets[HIST_BUCKETS];
};

static inline int hist_index(uint64_t v) {
    if (v < 64)
        return (int)v;
    int e = 63 - __builtin_clzll(v); /* >= 6 */
    int idx = 64 + (e - 6) * 32 + (int)((v >> (e - HIST_SUB_BITS)) & 31);
    return idx < HIST_BUCKETS ? idx : HIST_BUCKETS - 1;
}

static inline void hist_add(struct hist *h, uint64_t v) {
    h->buckets[hist_index(v)]++;
    h->count++;
    if (v > h->max)
        h->max = v;
}

void hist_merge(struct hist *into, const struct hist *from);
double hist_quantile_ms(const struct hist *h, double q); /* nearest rank; -1 when empty */

/* ---------------------------------------------------------------- statistics of one vehicle process
 * Written by that process only; the supervisor reads the live counters for progress and the goal
 * (aligned 64-bit stores and loads are atomic on the machines this runs on; relaxed atomics say so). */

struct pstats {
    /* live */
    uint64_t connects;          /* CONNACK 0 received */
    uint64_t connected_now;
    uint64_t subscribed_now;
    uint64_t ever_subscribed;   /* vehicles of this process that reached SUBACK at least once */
    uint64_t connect_errors;
    uint64_t losses;            /* connections lost after CONNACK (not by us) */
    uint64_t deliveries;        /* PUBLISH packets received */
    uint64_t unique;            /* distinct (vehicle, topic) */
    uint64_t duplicates;        /* PUBLISH of a (vehicle, topic) already received */
    uint64_t dup_flag;          /* PUBLISH with DUP=1 */
    uint64_t pubacks;
    uint64_t heartbeats;
    uint64_t onlines;
    uint64_t pings;
    uint64_t pongs;
    uint64_t wrong_topic;       /* a PUBLISH outside the vehicle's own delivery prefix */
    uint64_t protocol_errors;
    uint64_t subscribe_errors;  /* SUBACK 0x80 */
    uint64_t qos2;              /* QoS 2 PUBLISH received (answered with PUBREC) */
    /* timestamps, wall clock microseconds (0 = none yet) */
    int64_t first_connect_us;   /* first TCP connect started */
    int64_t last_connack_us;
    int64_t last_suback_us;
    int64_t first_delivery_us;  /* first unique delivery */
    int64_t last_delivery_us;   /* last unique delivery */
    /* CPU of this process, seconds: until its vehicles were all subscribed, from then to stop, teardown */
    struct cpu cpu_connect;
    struct cpu cpu_run;
    struct cpu cpu_teardown;
    uint64_t wakeups;           /* epoll_wait calls that returned events */
    uint64_t events;            /* events they returned */
    int connect_phase_done;
    int finished;
    uint64_t refused, timeouts, resets, connack_refused; /* connect error kinds */
    char first_error[120];
    struct hist connack_us;     /* connect start -> CONNACK */
    struct hist suback_us;      /* connect start -> SUBACK */
    struct hist delivery_us;    /* payload send time (SDVt header) -> receipt, unique deliveries only */
};

struct shared {
    volatile int stop;          /* set by the supervisor: disconnect and finish */
    int nprocs;
    struct pstats procs[];
};

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define BUMP(x, n) STORE(x, (x) + (n))

/* ---------------------------------------------------------------- MQTT 3.1.1 encoding */

enum {
    MQTT_CONNECT = 1, MQTT_CONNACK = 2, MQTT_PUBLISH = 3, MQTT_PUBACK = 4, MQTT_PUBREC = 5, MQTT_PUBREL = 6,
    MQTT_PUBCOMP = 7, MQTT_SUBSCRIBE = 8, MQTT_SUBACK = 9, MQTT_PINGREQ = 12, MQTT_PINGRESP = 13,
    MQTT_DISCONNECT = 14,
};

/* Remaining Length (MQTT-2.2.3): 1-4 bytes, 7 bits each. Returns bytes written. */
static inline size_t put_varint(uint8_t *p, size_t v) {
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[n++] = b | (v ? 0x80 : 0);
    } while (v);
    return n;
}

static inline size_t put_u16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
    return 2;
}

static inline size_t put_str(uint8_t *p, const char *s, size_t len) {
    put_u16(p, (unsigned)len);
    memcpy(p + 2, s, len);
    return 2 + len;
}

/* Decode a Remaining Length at p (avail bytes). Returns header bytes used after the first byte,
 * 0 when incomplete, -1 when malformed (more than 4 bytes). */
static inline int get_varint(const uint8_t *p, size_t avail, size_t *value) {
    size_t v = 0;
    for (int i = 0; i < 4; i++) {
        if ((size_t)i >= avail)
            return 0;
        v |= (size_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *value = v;
            return i + 1;
        }
    }
    return -1;
}

size_t encode_connect(uint8_t *out, const char *client_id, int clean, int keepalive, const char *username,
                      const char *password);
size_t encode_subscribe(uint8_t *out, unsigned packet_id, const char *filter, size_t filter_len, int qos);
/* PUBLISH header + topic (+ packet id for QoS > 0); the caller appends payload_len payload bytes. */
size_t encode_publish_head(uint8_t *out, const char *topic, size_t topic_len, int qos, unsigned packet_id,
                           size_t payload_len);

/* The delivery topic prefix with {VIN} substituted: writes "<before><vin><after>" and returns its length. */
size_t delivery_prefix(char *out, size_t cap, const char *topic_prefix, const char *vin);

/* Wall-clock send time carried by a stamped payload (scripts/fleet/payload.py: b"SDVt" + u64 BE us). */
#define STAMP_SIZE 12
static inline int64_t stamp_time_us(const uint8_t *payload, size_t len) {
    if (len < STAMP_SIZE || memcmp(payload, "SDVt", 4) != 0)
        return -1;
    uint64_t t = 0;
    for (int i = 4; i < 12; i++)
        t = (t << 8) | payload[i];
    return (int64_t)t;
}

static inline void put_stamp(uint8_t *p, int64_t us) {
    memcpy(p, "SDVt", 4);
    for (int i = 11; i >= 4; i--) {
        p[i] = (uint8_t)us;
        us >>= 8;
    }
}

/* modes */
int run_fleet(const struct options *o);
int run_publish(const struct options *o);

/* helpers shared by the modes */
int raise_nofile(long want);         /* soft RLIMIT_NOFILE up to the hard one; returns the soft limit now */
long hard_nofile(void);
void format_vin(char *out, const struct options *o, long index); /* index 0-based within the fleet */
int resolve_host(const char *host, uint32_t *addr_be);
void json_hist(const char *key, const struct hist *h, int comma);
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#endif
