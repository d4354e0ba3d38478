// A data-checked one-way stream over one RC connection, with start PSNs the
// caller may fix (ibv_rc_pingpong draws them at random), for the tests of
// packets that do not belong to the connection (forged ones from another
// user, stale ones from a connection of a process that died).
//
//   conn_peer server DEV TCP_PORT CONNS N PSN [DELAY_MS]
//     accepts CONNS connections one after the other; on each it sends N
//     SENDs of 64 bytes tagged with the connection's number and sequence
//     (paced: 16, then a 1 ms pause). An earlier connection's QP is kept
//     with whatever it had in flight when its peer went away. DELAY_MS:
//     each connection after the first waits that long before it sends.
//     Exit 0 once
//     every SEND of the last connection completed successfully.
//   conn_peer client DEV HOST TCP_PORT N PSN [DIE_AFTER]
//     receives N messages and checks each one: the server's tag for this
//     connection, sequence 0, 1, ..., N-1, the pattern. With DIE_AFTER it
//     posts only that many receives and dies (_exit, closing nothing) once
//     they are taken: the server's later SENDs stay in flight.
//
// PSN: the start PSN of both directions (-1: random). Each side prints
// "local QPN 0x... PSN 0x... port P" and "remote QPN 0x..." on stdout.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

namespace {

constexpr uint32_t kMsg = 64, kDepth = 256;
constexpr uint64_t kMagic = 0x434f4e4e50454552ull;

[[noreturn]] void die(const char *what) {
  fprintf(stderr, "conn_peer: %s: %s\n", what, errno ? strerror(errno) : "failed");
  exit(2);
}

struct Wire {   // what the two ends exchange over TCP
  uint32_t qpn, psn, tag;
  uint16_t lid;
  uint8_t gid[16];
};

struct Msg {
  uint64_t magic;
  uint32_t tag, seq;
  uint8_t pattern[kMsg - 16];
};
static_assert(sizeof(Msg) == kMsg);

void fill(Msg &m, uint32_t tag, uint32_t seq) {
  m.magic = kMagic;
  m.tag = tag;
  m.seq = seq;
  for (size_t i = 0; i < sizeof m.pattern; i++) m.pattern[i] = uint8_t(tag * 31 + seq * 7 + i);
}

struct Ctx {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_port_attr port{};
  ibv_gid gid{};
  explicit Ctx(const char *name) {
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    if (!list) die("ibv_get_device_list");
    for (int i = 0; i < n; i++)
      if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) die("ibv_open_device");
    if (!(pd = ibv_alloc_pd(ctx))) die("ibv_alloc_pd");
    if (ibv_query_port(ctx, 1, &port)) die("ibv_query_port");
    if (ibv_query_gid(ctx, 1, 0, &gid)) die("ibv_query_gid");
  }
};

struct Conn {
  ibv_cq *cq;
  ibv_qp *qp;
  ibv_mr *mr;
  std::vector<Msg> buf;
  Conn(Ctx &c) : buf(kDepth) {
    if (!(cq = ibv_create_cq(c.ctx, 2 * kDepth, nullptr, nullptr, 0))) die("ibv_create_cq");
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {kDepth, kDepth, 1, 1, 0};
    if (!(qp = ibv_create_qp(c.pd, &ia))) die("ibv_create_qp");
    if (!(mr = ibv_reg_mr(c.pd, buf.data(), buf.size() * kMsg, IBV_ACCESS_LOCAL_WRITE))) die("ibv_reg_mr");
  }
  void init() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      die("INIT");
  }
  void connect(Ctx &c, const Wire &me, const Wire &peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    a.ah_attr.dlid = peer.lid;
    if (c.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
      a.ah_attr.is_global = 1;
      memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
      a.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      die("RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = me.psn;
    a.timeout = 16;   // 268 ms: a peer that died is retried for about 2 s
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
      die("RTS");
  }
  void post_recv(uint32_t slot) {
    ibv_sge s{reinterpret_cast<uint64_t>(&buf[slot]), kMsg, mr->lkey};
    ibv_recv_wr w{}, *bad;
    w.wr_id = slot;
    w.sg_list = &s;
    w.num_sge = 1;
    if (ibv_post_recv(qp, &w, &bad)) die("ibv_post_recv");
  }
};

Wire local_wire(Ctx &c, Conn &k, uint32_t psn, uint32_t tag) {
  Wire w{};
  w.qpn = k.qp->qp_num;
  w.psn = psn;
  w.tag = tag;
  w.lid = c.port.lid;
  memcpy(w.gid, c.gid.raw, 16);
  return w;
}

void exchange(int fd, const Wire &me, Wire *peer) {
  if (write(fd, &me, sizeof me) != sizeof me) die("write");
  size_t got = 0;
  while (got < sizeof *peer) {
    ssize_t n = read(fd, reinterpret_cast<char *>(peer) + got, sizeof *peer - got);
    if (n <= 0) die("read");
    got += size_t(n);
  }
}

uint32_t start_psn(long psn) {
  if (psn >= 0) return uint32_t(psn) & 0xffffff;
  std::random_device rd;
  return rd() & 0xffffff;
}

void announce(const Wire &me, const Wire &peer) {
  printf("local QPN 0x%06x PSN 0x%06x\nremote QPN 0x%06x PSN 0x%06x\n", me.qpn, me.psn, peer.qpn, peer.psn);
  fflush(stdout);
}

int server(Ctx &c, int tcp_port, int conns, uint32_t n, long psn_arg, uint32_t delay_ms) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(tcp_port));
  if (bind(ls, reinterpret_cast<sockaddr *>(&a), sizeof a) || listen(ls, 4)) die("listen");
  std::vector<Conn *> old;
  for (int conn = 1; conn <= conns; conn++) {
    int fd = accept(ls, nullptr, nullptr);
    if (fd < 0) die("accept");
    Conn *k = new Conn(c);
    const uint32_t tag = uint32_t(conn);
    Wire me = local_wire(c, *k, start_psn(psn_arg), tag), peer;
    exchange(fd, me, &peer);
    k->init();
    k->connect(c, me, peer);
    announce(me, peer);
    char go;
    if (read(fd, &go, 1) != 1) die("read go");   // the client's receives are posted
    close(fd);
    // A server that starts its stream a moment later: the new connection
    // is then up while an old one may still be resending.
    if (conn > 1 && delay_ms) usleep(delay_ms * 1000);
    const bool last = conn == conns;
    uint32_t posted = 0, done = 0, bad = 0;
    while (done < n) {
      // 16 at a time (the queue permitting), then a pause.
      for (uint32_t b = 0; b < 16 && posted < n && posted - done < kDepth; b++, posted++) {
        Msg &m = k->buf[posted % kDepth];
        fill(m, tag, posted);
        ibv_sge s{reinterpret_cast<uint64_t>(&m), kMsg, k->mr->lkey};
        ibv_send_wr w{}, *badwr;
        w.wr_id = posted;
        w.sg_list = &s;
        w.num_sge = 1;
        w.opcode = IBV_WR_SEND;
        w.send_flags = IBV_SEND_SIGNALED;
        if (ibv_post_send(k->qp, &w, &badwr)) die("ibv_post_send");
      }
      if (!last && posted == n) break;   // left in flight
      usleep(1000);
      ibv_wc wc[32];
      int got;
      while ((got = ibv_poll_cq(k->cq, 32, wc)) > 0)
        for (int i = 0; i < got; i++) {
          done++;
          if (wc[i].status != IBV_WC_SUCCESS) {
            if (!bad++)
              fprintf(stderr, "conn %d: SEND %lu: %s\n", conn, (unsigned long)wc[i].wr_id,
                      ibv_wc_status_str(wc[i].status));
          }
        }
      if (got < 0) die("ibv_poll_cq");
    }
    if (last) {
      printf("conn %d: %u SENDs completed, %u with an error\n", conn, done, bad);
      return bad ? 1 : 0;
    }
    old.push_back(k);
  }
  return 0;
}

int client(Ctx &c, const char *host, int tcp_port, uint32_t n, long psn_arg, uint32_t die_after) {
  addrinfo hints{}, *res;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  char port[16];
  snprintf(port, sizeof port, "%d", tcp_port);
  if (getaddrinfo(host, port, &hints, &res)) die("getaddrinfo");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, res->ai_addr, res->ai_addrlen)) die("connect");
  freeaddrinfo(res);
  Conn k(c);
  Wire me = local_wire(c, k, start_psn(psn_arg), 0), peer;
  exchange(fd, me, &peer);
  k.init();   // (receives are posted before the QP takes packets)
  const uint32_t first = die_after ? std::min(die_after, kDepth) : kDepth;
  uint32_t posted = 0;
  for (; posted < first && posted < n; posted++) k.post_recv(posted);
  k.connect(c, me, peer);
  announce(me, peer);
  if (write(fd, "g", 1) != 1) die("write go");
  uint32_t seq = 0, errors = 0;
  // Bounded: a message that never comes ends the run (a failure) after
  // 30 s without any.
  time_t last = time(nullptr);
  while (seq < n) {
    ibv_wc wc[32];
    int got = ibv_poll_cq(k.cq, 32, wc);
    if (got < 0) die("ibv_poll_cq");
    if (got == 0) {
      if (time(nullptr) - last > 30) {
        printf("FAIL: message %u of %u never came\n", seq, n);
        return 1;
      }
      continue;
    }
    last = time(nullptr);
    for (int i = 0; i < got; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        printf("FAIL: receive %u: %s\n", seq, ibv_wc_status_str(wc[i].status));
        return 1;
      }
      const uint32_t slot = uint32_t(wc[i].wr_id);
      Msg want;
      fill(want, peer.tag, seq);
      const Msg &m = k.buf[slot];
      if (wc[i].byte_len != kMsg || memcmp(&m, &want, kMsg) != 0) {
        if (errors++ < 10)
          printf("FAIL: message %u: %u bytes, tag %u seq %u (expected tag %u seq %u)\n", seq, wc[i].byte_len,
                 wc[i].byte_len >= 16 ? m.tag : 0, wc[i].byte_len >= 16 ? m.seq : 0, peer.tag, seq);
      }
      seq++;
      if (die_after && seq == die_after) {
        printf("received %u, dying\n", seq);
        fflush(stdout);
        _exit(137);   // as if killed: nothing closed (SIGKILL would not end a pid namespace's init)
      }
      if (!die_after && posted < n) {
        k.post_recv(slot);
        posted++;
      }
    }
  }
  printf("received %u messages, %u wrong\n", seq, errors);
  return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 7 && strcmp(argv[1], "server") == 0) {
    Ctx c(argv[2]);
    return server(c, atoi(argv[3]), atoi(argv[4]), uint32_t(atol(argv[5])), atol(argv[6]),
                  argc > 7 ? uint32_t(atol(argv[7])) : 0);
  }
  if (argc >= 7 && strcmp(argv[1], "client") == 0) {
    Ctx c(argv[2]);
    return client(c, argv[3], atoi(argv[4]), uint32_t(atol(argv[5])), atol(argv[6]),
                  argc > 7 ? uint32_t(atol(argv[7])) : 0);
  }
  fprintf(stderr,
          "usage: conn_peer server DEV TCP_PORT CONNS N PSN [DELAY_MS]\n"
          "       conn_peer client DEV HOST TCP_PORT N PSN [DIE_AFTER]\n");
  return 2;
}
