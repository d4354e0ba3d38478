// rxe_check: a data-checked RC conversation between two verbs devices, for
// interoperability tests (tests/interop/rxe_interop_test.sh: usrc against
// the kernel's rdma_rxe). Plain libibverbs, so the same binary runs on both
// sides.
//
//   server: rxe_check [-d DEV] [-i PORT] [-g GIDX] [-p TCP] [-m MTU] [-u TIMEOUT] [-S MAX] [-w SECS]
//   client: rxe_check [same options] SERVER_ADDR
//
// The two sides connect an RC QP over a TCP side channel (as
// ibv_rc_pingpong does; the smaller of the two sides' path MTUs (-m, default
// the port's active MTU) and largest transfers (-S) apply; -w bounds every
// wait, against hangs). Then each side in turn is the active one: it
// sends SENDs, RDMA WRITEs and RDMA READs of several sizes (1 byte to more
// than one MTU, several packets), and ATOMIC FETCH_ADD and CMP_SWAP, while
// the passive side posts receives, fills and checks its memory as the
// active side asks over TCP. Every byte is a pattern of its transfer, the
// bytes around it are checked untouched, the atomics' returned values and
// the words they leave are checked. Any mismatch, error completion or
// protocol error exits 1 with a message naming the operation and size.
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define FILLER_R 0x5a  // the passive side's target region before a WRITE
#define FILLER_L 0xa5  // the active side's sink before a READ

static const char *who = "rxe_check";
static int wait_secs = 120;  // a bound on every wait, against hangs only

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: FAIL: ", who);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

// The bytes of transfer `seed`: a xorshift stream, so that a packet
// delivered at the wrong offset or twice never looks right.
static uint8_t pat(uint32_t seed, size_t i) {
  uint32_t x = seed * 2654435761u ^ (uint32_t)(i / 4) * 40503u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return (uint8_t)(x >> ((i % 4) * 8));
}
static void fill(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = pat(seed, i);
}
// 0 if p[0..n) is transfer `seed` and the bytes just before and after are
// `filler`; else a message in `err`.
static int check(const uint8_t *p, size_t n, uint32_t seed, int filler, char *err,
                 size_t errlen) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pat(seed, i)) {
      snprintf(err, errlen, "byte %zu of %zu is 0x%02x, expected 0x%02x", i, n, p[i],
               pat(seed, i));
      return -1;
    }
  if (p[-1] != filler || p[n] != filler) {
    snprintf(err, errlen, "a byte next to the %zu transferred was changed (0x%02x 0x%02x)",
             n, p[-1], p[n]);
    return -1;
  }
  return 0;
}

// ---- the side channel: one text line each way per step

static FILE *tin, *tout;
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(tout, fmt, ap);
  va_end(ap);
  fputc('\n', tout);
  if (fflush(tout)) die("side channel write: %s", strerror(errno));
}
static void hear(char *line, size_t len) {
  if (!fgets(line, (int)len, tin)) die("side channel closed by the peer");
  line[strcspn(line, "\n")] = 0;
}

static int tcp_connect(const char *host, const char *port, int server) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
                           .ai_flags = server ? AI_PASSIVE : 0};
  struct addrinfo *res;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc) die("getaddrinfo %s:%s: %s", host ? host : "*", port, gai_strerror(rc));
  int fd = socket(res->ai_family, res->ai_socktype, 0);
  if (fd < 0) die("socket: %s", strerror(errno));
  if (server) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 1))
      die("listen on port %s: %s", port, strerror(errno));
    int c = accept(fd, NULL, NULL);
    if (c < 0) die("accept: %s", strerror(errno));
    close(fd);
    fd = c;
  } else if (connect(fd, res->ai_addr, res->ai_addrlen)) {
    die("connect to %s:%s: %s", host, port, strerror(errno));
  }
  freeaddrinfo(res);
  struct timeval tv = {.tv_sec = wait_secs};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// ---- verbs

struct side {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  uint8_t *buf;
  size_t max;       // largest transfer
  uint8_t *r;       // the region the peer writes, reads and sends into
  uint8_t *l;       // our source and sink
  uint64_t *atom;   // the peer's atomics' target
  uint64_t *fetch;  // where our atomics' old values land
  uint64_t raddr;   // the peer's r
  uint64_t ratom;   // the peer's atom
  uint32_t rkey;
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

// One completion of `what` (its opcode checked), or exit.
static void complete(struct side *s, enum ibv_wc_opcode op, const char *what, size_t size,
                     struct ibv_wc *out) {
  struct ibv_wc wc;
  const double deadline = now() + wait_secs;
  for (;;) {
    int n = ibv_poll_cq(s->cq, 1, &wc);
    if (n < 0) die("%s %zu B: ibv_poll_cq failed", what, size);
    if (n == 1) break;
    if (now() > deadline) die("%s %zu B: no completion after %d s", what, size, wait_secs);
  }
  if (wc.status != IBV_WC_SUCCESS)
    die("%s %zu B: completion status %s (%d), vendor error 0x%x", what, size,
        ibv_wc_status_str(wc.status), wc.status, wc.vendor_err);
  if (wc.opcode != op) die("%s %zu B: completion opcode %d, expected %d", what, size, wc.opcode, op);
  if (out) *out = wc;
}

static void post_send(struct side *s, struct ibv_send_wr *wr, const char *what, size_t size) {
  struct ibv_send_wr *bad;
  wr->send_flags |= IBV_SEND_SIGNALED;
  int rc = ibv_post_send(s->qp, wr, &bad);
  if (rc) die("%s %zu B: ibv_post_send: %s", what, size, strerror(rc));
}

static void post_recv(struct side *s) {
  struct ibv_sge sge = {.addr = (uintptr_t)s->r, .length = (uint32_t)s->max, .lkey = s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
  int rc = ibv_post_recv(s->qp, &wr, &bad);
  if (rc) die("ibv_post_recv: %s", strerror(rc));
}

// ---- the passive side: does what the active one asks, answers OK or ERR

static void passive(struct side *s) {
  char line[256], err[200];
  unsigned long off, n, seed;
  uint64_t v;
  for (;;) {
    hear(line, sizeof line);
    err[0] = 0;
    if (!strcmp(line, "END")) {
      say("OK");
      return;
    } else if (!strcmp(line, "RECV")) {  // a SEND is coming
      memset(s->r - 1, FILLER_R, s->max + 2);
      post_recv(s);
    } else if (sscanf(line, "GOTSEND %lu %lu", &n, &seed) == 2) {
      struct ibv_wc wc;
      complete(s, IBV_WC_RECV, "receive of SEND", n, &wc);
      if (wc.byte_len != n)
        snprintf(err, sizeof err, "SEND %lu B arrived as %u B", n, wc.byte_len);
      else
        check(s->r, n, (uint32_t)seed, FILLER_R, err, sizeof err);
    } else if (!strcmp(line, "CLEAR")) {  // before a WRITE
      memset(s->r - 1, FILLER_R, s->max + 2);
    } else if (sscanf(line, "WROTE %lu %lu %lu", &off, &n, &seed) == 3) {
      check(s->r + off, n, (uint32_t)seed, FILLER_R, err, sizeof err);
    } else if (sscanf(line, "FILL %lu %lu %lu", &off, &n, &seed) == 3) {  // before a READ
      memset(s->r - 1, FILLER_R, s->max + 2);
      fill(s->r + off, n, (uint32_t)seed);
    } else if (sscanf(line, "SETATOM %" SCNx64, &v) == 1) {
      *(volatile uint64_t *)s->atom = v;
    } else if (sscanf(line, "ATOM %" SCNx64, &v) == 1) {
      uint64_t got = *(volatile uint64_t *)s->atom;
      if (got != v)
        snprintf(err, sizeof err, "atomic target is 0x%" PRIx64 ", expected 0x%" PRIx64, got, v);
    } else {
      snprintf(err, sizeof err, "unknown request '%.100s'", line);
    }
    if (err[0]) {
      say("ERR %s", err);
      die("as passive side: %s", err);
    }
    say("OK");
  }
}

static void ask(const char *fmt, ...) {
  char line[256], req[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req, sizeof req, fmt, ap);
  va_end(ap);
  say("%s", req);
  hear(line, sizeof line);
  if (strcmp(line, "OK")) die("the peer answered '%s' to '%s'", line, req);
}

// ---- the active side

static unsigned checks;

static void do_send(struct side *s, size_t n, uint32_t seed) {
  ask("RECV");
  fill(s->l, n, seed);
  struct ibv_sge sge = {.addr = (uintptr_t)s->l, .length = (uint32_t)n, .lkey = s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
  post_send(s, &wr, "SEND", n);
  complete(s, IBV_WC_SEND, "SEND", n, NULL);
  ask("GOTSEND %zu %u", n, seed);
  checks++;
}

// An RDMA WRITE or READ (op) of n bytes between the local buffer and the
// peer's at off, posted and completed.
static void post_rdma(struct side *s, enum ibv_wr_opcode op, size_t off, size_t n) {
  const int is_write = op == IBV_WR_RDMA_WRITE;
  const char *what = is_write ? "RDMA WRITE" : "RDMA READ";
  struct ibv_sge sge = {.addr = (uintptr_t)s->l, .length = (uint32_t)n, .lkey = s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = is_write ? 3 : 4, .sg_list = &sge, .num_sge = 1, .opcode = op};
  wr.wr.rdma.remote_addr = s->raddr + off;
  wr.wr.rdma.rkey = s->rkey;
  post_send(s, &wr, what, n);
  complete(s, is_write ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ, what, n, NULL);
}

static void do_write(struct side *s, size_t off, size_t n, uint32_t seed) {
  ask("CLEAR");
  fill(s->l, n, seed);
  post_rdma(s, IBV_WR_RDMA_WRITE, off, n);
  ask("WROTE %zu %zu %u", off, n, seed);
  checks++;
}

static void do_read(struct side *s, size_t off, size_t n, uint32_t seed) {
  char err[160];
  ask("FILL %zu %zu %u", off, n, seed);
  memset(s->l - 1, FILLER_L, s->max + 2);
  post_rdma(s, IBV_WR_RDMA_READ, off, n);
  if (check(s->l, n, seed, FILLER_L, err, sizeof err)) die("RDMA READ %zu B: %s", n, err);
  checks++;
}

// One atomic on the peer's word, which holds `before`: the fetched value
// must be `before` and the word then `after`.
static void do_atomic(struct side *s, int cas, uint64_t before, uint64_t a, uint64_t b,
                      uint64_t after) {
  const char *what = cas ? "ATOMIC CMP_SWAP" : "ATOMIC FETCH_ADD";
  ask("SETATOM %" PRIx64, before);
  *(volatile uint64_t *)s->fetch = ~before;
  struct ibv_sge sge = {.addr = (uintptr_t)s->fetch, .length = 8, .lkey = s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1,
                           .opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD};
  wr.wr.atomic.remote_addr = s->ratom;
  wr.wr.atomic.rkey = s->rkey;
  wr.wr.atomic.compare_add = a;
  wr.wr.atomic.swap = b;
  post_send(s, &wr, what, 8);
  complete(s, cas ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD, what, 8, NULL);
  uint64_t got = *(volatile uint64_t *)s->fetch;
  if (got != before)
    die("%s: returned 0x%" PRIx64 ", expected 0x%" PRIx64, what, got, before);
  ask("ATOM %" PRIx64, after);
  checks++;
}

static void active(struct side *s, uint32_t base, int mtu) {
  // Around each packet boundary of the path MTU, and several packets.
  size_t sizes[] = {1, 2, 63, 255, (size_t)mtu - 1, (size_t)mtu, (size_t)mtu + 1,
                    2 * (size_t)mtu, 3 * (size_t)mtu + 5, 4095, 4097, 8193, s->max};
  uint32_t seed = base;
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    if (n == 0 || n > s->max) continue;
    size_t off = k % 8;  // unaligned offsets too
    if (off + n > s->max) off = 0;
    do_send(s, n, ++seed);
    do_write(s, off, n, ++seed);
    do_read(s, off, n, ++seed);
  }
  const uint64_t v = 0x0123456789abcdefull ^ base;
  do_atomic(s, 0, v, 1, 0, v + 1);
  do_atomic(s, 0, 0x00000000ffffffffull, 1, 0, 0x0000000100000000ull);  // carry
  do_atomic(s, 0, ~0ull, 2, 0, 1);                                       // wraps
  do_atomic(s, 1, v, v, 0xfeedfacecafebeefull, 0xfeedfacecafebeefull);   // swaps
  do_atomic(s, 1, v, v + 1, 0xfeedfacecafebeefull, v);                   // does not
  ask("END");
}

// ---- setup

static enum ibv_mtu mtu_enum(int m) {
  switch (m) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
  }
  die("-m %d: not an IB MTU (256 ... 4096)", m);
  return 0;
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *to) {
  int rc = ibv_modify_qp(qp, a, mask);
  if (rc) die("ibv_modify_qp to %s: %s", to, strerror(rc));
}

static void usage(void) {
  fprintf(stderr,
          "usage: rxe_check [-d DEV] [-i IBPORT] [-g GIDX] [-p TCPPORT] [-m MTU] [-u TIMEOUT]\n"
          "                 [-S MAXSIZE] [-w WAITSECS] [SERVER]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *dev = NULL, *tcp = "18515";
  int ibport = 1, gidx = -1, mtu = 0, timeout = 18, opt;
  size_t max = 3 * 4096 + 100;
  while ((opt = getopt(argc, argv, "d:i:g:p:m:u:S:w:h")) != -1) {
    switch (opt) {
      case 'd': dev = optarg; break;
      case 'i': ibport = atoi(optarg); break;
      case 'g': gidx = atoi(optarg); break;
      case 'p': tcp = optarg; break;
      case 'm': mtu = atoi(optarg); break;
      case 'u': timeout = atoi(optarg); break;
      case 'S': max = strtoul(optarg, NULL, 0); break;
      case 'w': wait_secs = atoi(optarg); break;
      default: usage();
    }
  }
  if (optind < argc - 1 || max < 1 || max > (64u << 20)) usage();
  const char *peer = optind < argc ? argv[optind] : NULL;  // given: we are the client
  who = peer ? "rxe_check client" : "rxe_check server";
  setvbuf(stdout, NULL, _IOLBF, 0);

  int ndev;
  struct ibv_device **list = ibv_get_device_list(&ndev);
  if (!list || ndev == 0) die("no RDMA device");
  struct ibv_device *d = list[0];
  for (int i = 0; dev && i < ndev; i++)
    if (!strcmp(ibv_get_device_name(list[i]), dev)) d = list[i];
  if (dev && strcmp(ibv_get_device_name(d), dev)) die("device %s not found", dev);

  struct side s = {.max = max};
  s.ctx = ibv_open_device(d);
  if (!s.ctx) die("ibv_open_device %s: %s", ibv_get_device_name(d), strerror(errno));
  struct ibv_port_attr pa;
  if (ibv_query_port(s.ctx, ibport, &pa)) die("ibv_query_port %d", ibport);
  if (!mtu) mtu = 128 << pa.active_mtu;
  union ibv_gid gid = {0};
  if (gidx >= 0 && ibv_query_gid(s.ctx, ibport, gidx, &gid)) die("ibv_query_gid %d", gidx);

  // r (max + guard bytes), l (the same), then the two atomic words.
  const size_t rsz = (max + 2 + 63) & ~(size_t)63;
  if (posix_memalign((void **)&s.buf, 4096, 2 * rsz + 64)) die("out of memory");
  memset(s.buf, 0, 2 * rsz + 64);
  s.r = s.buf + 1;
  s.l = s.buf + rsz + 1;
  s.atom = (uint64_t *)(s.buf + 2 * rsz);
  s.fetch = s.atom + 1;
  s.pd = ibv_alloc_pd(s.ctx);
  if (!s.pd) die("ibv_alloc_pd");
  s.mr = ibv_reg_mr(s.pd, s.buf, 2 * rsz + 64,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC);
  if (!s.mr) die("ibv_reg_mr: %s", strerror(errno));
  s.cq = ibv_create_cq(s.ctx, 16, NULL, NULL, 0);
  if (!s.cq) die("ibv_create_cq: %s", strerror(errno));
  struct ibv_qp_init_attr qia = {.send_cq = s.cq, .recv_cq = s.cq, .qp_type = IBV_QPT_RC,
                                 .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                         .max_send_sge = 1, .max_recv_sge = 1}};
  s.qp = ibv_create_qp(s.pd, &qia);
  if (!s.qp) die("ibv_create_qp: %s", strerror(errno));
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = (uint8_t)ibport,
                          .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                             IBV_ACCESS_REMOTE_ATOMIC};
  modify(s.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");

  srand48(getpid() ^ time(NULL));
  const uint32_t psn = lrand48() & 0xffffff;
  int fd = tcp_connect(peer, tcp, !peer);
  tin = fdopen(fd, "r");
  tout = fdopen(dup(fd), "w");
  if (!tin || !tout) die("fdopen");
  char gs[40], line[256];
  for (int i = 0; i < 16; i++) sprintf(gs + 2 * i, "%02x", gid.raw[i]);
  say("%04x %06x %06x %08x %016" PRIx64 " %016" PRIx64 " %d %zu %s", pa.lid, s.qp->qp_num, psn,
      s.mr->rkey, (uint64_t)(uintptr_t)s.r, (uint64_t)(uintptr_t)s.atom, mtu, max, gs);
  hear(line, sizeof line);
  unsigned rlid, rqpn, rpsn, rkey;
  int rmtu;
  size_t rmax;
  char rgs[40];
  if (sscanf(line, "%x %x %x %x %" SCNx64 " %" SCNx64 " %d %zu %39s", &rlid, &rqpn, &rpsn,
             &rkey, &s.raddr, &s.ratom, &rmtu, &rmax, rgs) != 9 || strlen(rgs) != 32)
    die("bad connection message from the peer: '%s'", line);
  s.rkey = rkey;
  if (rmtu < mtu) mtu = rmtu;     // the smaller path MTU of the two
  if (rmax < s.max) s.max = rmax;  // and the smaller largest transfer
  union ibv_gid rgid;
  for (int i = 0; i < 16; i++) sscanf(rgs + 2 * i, "%2hhx", &rgid.raw[i]);

  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu_enum(mtu);
  a.dest_qp_num = rqpn;
  a.rq_psn = rpsn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = (uint16_t)rlid;
  a.ah_attr.port_num = (uint8_t)ibport;
  if (gidx >= 0) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = rgid;
    a.ah_attr.grh.sgid_index = (uint8_t)gidx;
    a.ah_attr.grh.hop_limit = 64;
  }
  modify(s.qp, &a,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
         "RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = psn;
  a.timeout = (uint8_t)timeout;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  modify(s.qp, &a,
         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
             IBV_QP_MAX_QP_RD_ATOMIC,
         "RTS");
  // Both QPs ready before anything is sent.
  say("READY");
  hear(line, sizeof line);
  if (strcmp(line, "READY")) die("expected READY from the peer, got '%s'", line);

  printf("%s: %s qpn 0x%06x <-> 0x%06x, path MTU %d, sizes 1 to %zu B\n", who,
         ibv_get_device_name(d), s.qp->qp_num, rqpn, mtu, s.max);
  // The client is active first, then the server.
  if (peer) {
    active(&s, 1000, mtu);
    passive(&s);
  } else {
    passive(&s);
    active(&s, 2000, mtu);
  }
  printf("%s: PASS: %u checked transfers as the active side, and the peer's checked\n", who,
         checks);
  ibv_destroy_qp(s.qp);
  ibv_dereg_mr(s.mr);
  ibv_destroy_cq(s.cq);
  ibv_dealloc_pd(s.pd);
  ibv_close_device(s.ctx);
  ibv_free_device_list(list);
  return 0;
}
